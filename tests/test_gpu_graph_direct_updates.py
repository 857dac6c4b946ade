"""Updates written straight into their shared variables' buffers under capture
(graph_segment.DIRECT_UPDATES: Segment._capture_items, graphs.Runner._direct_update,
graph_plan.updates_last): the graph records no copy back for an eligible update, results
equal plain runs call after call, and every case the rules refuse keeps the copy back.
Driven by the fake context, pool and driver of tests/graph_fakes.py (FakeElemwise speaks
GpuElemwise's ``write_into`` protocol); the last test runs an MLP step on the GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeElemwise, FakeReverse, FakeToHost, gvec, read, upload
from gpu_helpers import requires_gpu
from symgpu.config import config
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.exec import graph_plan, graph_segment
from symgpu.gpu.placement.basic_ops import HostFromGpu as _RealHostFromGpu
from symgpu.gpu.runtime.pool import lend
from symgpu.link.vm import link


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


class HostFromGpu(FakeToHost, _RealHostFromGpu):
    """A fake copy to the host of the real one's type (only such copies may follow a segment
    whose updates are written into shared variables)."""


def linked(inputs, outputs, values, updates):
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = dict(updates)
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage)
    return vm, fg


def sgd(w, g):
    return FakeElemwise("sgd", lambda a, b: a - 0.5 * b)(w, g)


def steps(vm, fg, n, feed=None):
    """``n`` calls as Function makes them: feed per-call inputs, swap each update's new value
    into its variable's cell, empty the output cells; the host outputs of each call."""
    mapping = fg.update_mapping
    got = []
    for i in range(n):
        if feed is not None:
            feed(i)
        vm()
        outs = [vm.storage_map[v][0] for v in fg.outputs]
        for o, inp in mapping.items():
            vm.storage_map[fg.inputs[inp]][0] = outs[o]
        for v in fg.outputs:
            vm.storage_map[v][0] = None
        got.append([o for k, o in enumerate(outs) if k not in mapping])
    return got


def mlp_like(ctx, direct=True):
    """w is read by a forward node, by a node after its update in the graph's order (the
    ``d @ W.T`` of a backward pass) and updated; x is passed per call."""
    w, x = gvec(), gvec()
    gw = FakeElemwise("grad", lambda a, b: a * b)(w, x)
    w_new = sgd(w, gw)
    back = FakeElemwise("back", lambda a, b, c: a * 0 + b + c)(gw, w, x)
    h = HostFromGpu()(back)
    vm, fg = linked([w, x], [w_new, h], [upload(ctx, [1, 2, 3]), upload(ctx, [1, 1, 1])],
                    {0: 0})
    return vm, fg, w, x


def reference_mlp_like(n):
    w = np.array([1, 2, 3], "float32")
    hs = []
    for i in range(n):
        x = np.full(3, 1 + 0.1 * i, "float32")
        gw = w * x
        hs.append(w + x)
        w = w - 0.5 * gw
    return w, hs


def run_mlp_like(vm, fg, w, x, n):
    ctx = fakes.CTX_OBJ

    def feed(i):
        vm.storage_map[x][0] = upload(ctx, np.full(3, 1 + 0.1 * i))
    return steps(vm, fg, n, feed)


def recorded_copies(monkeypatch):
    """Count the device copies recorded into graphs (update copies back among them)."""
    counts = {"captured": 0}
    drv = fakes.DRV
    orig = drv.copy

    def copy(dst, src):
        if drv.capturing:
            counts["captured"] += 1
        orig(dst, src)
    monkeypatch.setattr(drv, "copy", copy)
    return counts


# ============================================================================ planning

def test_an_update_node_moves_after_the_readers_of_its_variable():
    vm, fg, w, x = mlp_like(fakes.CTX_OBJ)
    seg = vm.runner.segments[0]
    names = [str(vm.nodes[i].op) for i, _, _ in seg.items]
    assert names.index("FakeElemwise{sgd}") > names.index("FakeElemwise{back}"), names
    assert list(seg.direct) == [len(seg.items) - 1], seg.direct


def test_an_update_node_without_write_into_is_not_moved():
    """Moving it would gain nothing and keep its inputs alive longer."""
    from graph_fakes import FakeKernelOp
    ctx = fakes.CTX_OBJ
    w, x = gvec(), gvec()
    gw = FakeElemwise("grad", lambda a, b: a * b)(w, x)
    w_new = FakeKernelOp("upd", lambda a, b: a - b)(w, gw)
    back = HostFromGpu()(FakeElemwise("back", lambda a, b: a + b)(gw, w))
    vm, fg = linked([w, x], [w_new, back], [upload(ctx, [1]), upload(ctx, [1])], {0: 0})
    seg = vm.runner.segments[0]
    names = [str(vm.nodes[i].op) for i, _, _ in seg.items]
    assert names.index("Fakeupd") < names.index("FakeElemwise{back}"), names
    assert seg.copy_back and seg.direct == {}


def test_updates_last_moves_only_sinks_and_keeps_the_order_topological():
    w, x = gvec(), gvec()
    gw = FakeElemwise("grad", lambda a, b: a * b)(w, x)
    w_new = sgd(w, gw)
    back = FakeElemwise("back", lambda a, b: a + b)(gw, w)
    fg = FunctionGraph([w, x], [back, w_new], clone=False)
    nodes = [gw.owner, w_new.owner, back.owner]
    assert graph_plan.read_later(nodes, [0, 1, 2], 1, w)
    assert graph_plan.updates_last(nodes, [0, 1, 2], [(w_new, w)]) == [0, 2, 1]
    assert not graph_plan.read_later(nodes, [0, 2, 1], 2, w)
    # a non-sink update (its new value is read by another node) stays where it is
    used = FakeElemwise("use", lambda a, b: a + b)(w_new, w)
    nodes2 = nodes + [used.owner]
    assert graph_plan.updates_last(nodes2, [0, 1, 2, 3], [(w_new, w)]) == [0, 1, 2, 3]
    del fg


# ============================================================================ direct writes

@pytest.mark.parametrize("direct", [True, False])
def test_values_equal_plain_runs_over_many_replays(monkeypatch, direct):
    monkeypatch.setattr(graph_segment, "DIRECT_UPDATES", direct)
    copies = recorded_copies(monkeypatch)
    vm, fg, w, x = mlp_like(fakes.CTX_OBJ)
    ptr = vm.storage_map[w][0].ptr
    got = run_mlp_like(vm, fg, w, x, 24)
    want_w, want_h = reference_mlp_like(24)
    for (h,), wh in zip(got, want_h):
        np.testing.assert_allclose(h, wh, rtol=1e-6)
    np.testing.assert_allclose(read(vm.storage_map[w][0]), want_w, rtol=1e-6)
    assert vm.storage_map[w][0].ptr == ptr            # the variable never moved
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 22, st
    seg = vm.runner.segments[0]
    (g,) = [g for gs in seg.graphs.values() for g in gs]
    assert g.backs == (0,) and g.direct == ((0,) if direct else ())
    # x is staged from the start (one copy in before each launch, outside the graph); the
    # update's copy back is recorded only without direct updates
    assert copies["captured"] == (0 if direct else 1), copies
    assert st["nodes_captured"] == (3 if direct else 4), st


def test_no_copy_recorded_for_a_plain_sgd_update(monkeypatch):
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    w_new = sgd(w, g)
    vm, fg = linked([w, g], [w_new], [upload(ctx, [4, 4]), upload(ctx, [1, 2])], {0: 0})
    first = vm.storage_map[w][0]
    steps(vm, fg, 10)
    assert vm.storage_map[w][0] is first              # the graph writes into it
    np.testing.assert_allclose(read(first), [4 - 5.0, 4 - 10.0])
    assert copies["captured"] == 0 and vm.runner.stats()["replays"] == 8


def test_set_value_between_calls_recaptures_and_keeps_the_old_buffer(monkeypatch):
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    vm, fg = linked([w, g], [sgd(w, g)], [upload(ctx, [0, 0]), upload(ctx, [2, 2])], {0: 0})
    steps(vm, fg, 5)
    old = vm.storage_map[w][0]
    vm.storage_map[w][0] = upload(ctx, [100, 100])    # set_value(..., borrow=False)-like
    steps(vm, fg, 5)
    np.testing.assert_allclose(read(old), [-5, -5])
    np.testing.assert_allclose(read(vm.storage_map[w][0]), [95, 95])
    st = vm.runner.stats()
    assert st["captures"] == 2 and st["graphs"] == 1 and st["replays"] >= 6, st
    assert copies["captured"] == 0


# ============================================================================ refusals

def test_a_device_checked_function_keeps_the_guarded_copy(monkeypatch):
    """With ops whose checks report at the next sync, a failing call must leave the variable
    untouched: only the guarded copy back can ensure it."""
    ctx = fakes.CTX_OBJ
    guarded = fakes.FakeGuardedCopies().install(monkeypatch, ctx)
    w, g = gvec(), gvec()
    checked = FakeElemwise("idx", lambda a: a * 1, device_checked=True)(g)
    vm, fg = linked([w, g], [sgd(w, checked)], [upload(ctx, [0]), upload(ctx, [1])], {0: 0})
    assert vm.runner.device_checked and not vm.runner.direct_updates
    assert vm.runner.segments[0].direct == {}
    w_ptr = vm.storage_map[w][0].ptr
    steps(vm, fg, 6)
    np.testing.assert_allclose(read(vm.storage_map[w][0]), [-3])
    captured = [c for name, capturing, c in guarded.launches if name == "copy" and capturing]
    assert captured and captured[0][0][0] == w_ptr    # a guarded copy in the graph, into w


def test_a_later_reader_of_the_variable_keeps_the_copy_back(monkeypatch):
    """The update's new value is read by a node that also reads the old value: the update
    cannot move after it (not a sink), so it is copied back at the end of the graph."""
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    w_new = sgd(w, g)
    both = HostFromGpu()(FakeElemwise("both", lambda a, b: a + 10 * b)(w_new, w))
    vm, fg = linked([w, g], [both, w_new], [upload(ctx, [1]), upload(ctx, [2])], {1: 0})
    seg = vm.runner.segments[0]
    assert seg.copy_back and seg.direct == {}
    got = steps(vm, fg, 8)
    want = 1.0
    for (h,) in got:
        np.testing.assert_allclose(h, [(want - 1) + 10 * want])
        want -= 1
    np.testing.assert_allclose(read(vm.storage_map[w][0]), [want])
    assert copies["captured"] == 1


def test_a_returned_update_is_neither_written_directly_nor_copied_back():
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    w_new = sgd(w, g)
    vm, fg = linked([w, g], [w_new, w_new], [upload(ctx, [0]), upload(ctx, [2])], {1: 0})
    seg = vm.runner.segments[0]
    assert seg.copy_back == [] and seg.direct == {}
    kept = []
    for i in range(6):
        vm()
        r = vm.storage_map[w_new][0]
        vm.storage_map[w_new][0] = None
        vm.storage_map[w][0] = r
        kept.append(r)
    for i, r in enumerate(kept):
        np.testing.assert_allclose(read(r), [-(i + 1)])


def test_a_lent_variable_is_never_written(monkeypatch):
    """get_value(borrow=True, return_internal_type=True) lends the buffer (pool.lend): no
    graph writes into it, directly or by a copy; the update goes into fresh memory."""
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    vm, fg = linked([w, g], [sgd(w, g)], [upload(ctx, [5, 5]), upload(ctx, [2, 2])], {0: 0})
    steps(vm, fg, 4)                                   # captured, replaying into w's buffer
    assert copies["captured"] == 0 and vm.runner.stats()["replays"] == 2
    borrowed = lend(vm.storage_map[w][0])
    steps(vm, fg, 3)
    np.testing.assert_allclose(read(borrowed), [1, 1])
    np.testing.assert_allclose(read(vm.storage_map[w][0]), [-2, -2])
    assert vm.storage_map[w][0] is not borrowed


def test_an_update_reading_its_variable_with_another_layout_is_copied_back(monkeypatch):
    """w_new = w + reversed(w): computed into w's own buffer, the kernel would read elements
    it already overwrote; the layout check refuses and the update is copied back."""
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w = gvec()
    w_new = FakeElemwise("mix", lambda a, r: a + 2 * r)(w, FakeReverse()(w))
    vm, fg = linked([w], [w_new], [upload(ctx, [1, 2, 3])], {0: 0})
    assert vm.runner.segments[0].direct
    want = np.array([1, 2, 3], "float32")
    steps(vm, fg, 8)
    for _ in range(8):
        want = want + 2 * want[::-1]
    np.testing.assert_allclose(read(vm.storage_map[w][0]), want, rtol=1e-6)
    st = vm.runner.stats()
    assert st["replays"] == 6 and copies["captured"] == 1, st
    (g,) = [g for gs in vm.runner.segments[0].graphs.values() for g in gs]
    assert g.backs == (0,) and g.direct == ()


def test_a_segment_followed_by_a_node_that_can_fail_writes_nothing_directly():
    """Something that can fail runs after the segment: no update is written into the variable
    inside the graph (neither directly nor by a copy back), so a failing call leaves it as it
    was."""
    from symgpu.graph.basic import Apply
    from symgpu.graph.op import Op
    from symgpu.tensor.type import TensorType

    class Failing(Op):
        __props__ = ()
        fail = False

        def make_node(self, x):
            return Apply(self, [x], [TensorType("float32", (False,))()])

        def perform(self, node, inputs, out):
            if Failing.fail:
                raise ValueError("bad input")
            out[0][0] = read(inputs[0])
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    w_new = sgd(w, g)
    h = Failing()(w_new)
    vm, fg = linked([w, g], [h, w_new], [upload(ctx, [8, 8]), upload(ctx, [2, 2])], {1: 0})
    seg = vm.runner.segments[0]
    assert seg.copy_back == [] and seg.direct == {}
    steps(vm, fg, 6)
    before, arr = read(vm.storage_map[w][0]), vm.storage_map[w][0]
    Failing.fail = True
    with pytest.raises(ValueError, match="bad input"):
        vm()
    assert vm.storage_map[w][0] is arr
    np.testing.assert_allclose(read(arr), before)


def test_the_flag_off_keeps_the_copy_back(monkeypatch):
    monkeypatch.setattr(graph_segment, "DIRECT_UPDATES", False)
    copies = recorded_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    w, g = gvec(), gvec()
    vm, fg = linked([w, g], [sgd(w, g)], [upload(ctx, [0]), upload(ctx, [2])], {0: 0})
    assert not vm.runner.direct_updates and vm.runner.segments[0].direct == {}
    steps(vm, fg, 6)
    np.testing.assert_allclose(read(vm.storage_map[w][0]), [-6])
    assert copies["captured"] == 1


# ============================================================================ on the GPU

def _mlp_weights(direct, monkeypatch, n_steps=20):
    import symgpu.tensor as T
    from symgpu import function, grad, shared
    monkeypatch.setattr(graph_segment, "DIRECT_UPDATES", direct)
    rng = np.random.default_rng(0)
    sizes = [(64, 48), (48, 48), (48, 10)]
    ws = [shared((rng.standard_normal(s) * 0.1).astype("float32"), name=f"W{k}")
          for k, s in enumerate(sizes)]
    bs = [shared(np.zeros(s[1], "float32"), name=f"b{k}") for k, s in enumerate(sizes)]
    x, y = T.matrix("x"), T.matrix("y")
    h = x
    for k, (w, b) in enumerate(zip(ws, bs)):
        h = T.dot(h, w) + b
        if k < len(ws) - 1:
            h = T.tanh(h)
    loss = T.mean((h - y) ** 2)
    params = ws + bs
    gs = grad(loss, params)
    f = function([x, y], loss, updates=[(p, p - 0.1 * g_) for p, g_ in zip(params, gs)])
    xv = rng.standard_normal((32, 64)).astype("float32")
    yv = rng.standard_normal((32, 10)).astype("float32")
    for _ in range(n_steps):
        f(xv, yv)
    return f, [p.get_value() for p in params]


@requires_gpu
def test_gpu_mlp_sgd_with_and_without_direct_updates_gives_equal_weights(cuda, monkeypatch):
    from symgpu.gpu.exec import graphs
    monkeypatch.setattr(graphs, "_driver", None)        # the real driver
    f_on, on = _mlp_weights(True, monkeypatch)
    f_off, off = _mlp_weights(False, monkeypatch)
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    stats = [f.vm.runner.stats() for f in (f_on, f_off)]
    assert all(st["replays"] >= 15 for st in stats), stats   # the GPU ran graphs
    # every update written by its node: three GpuGemm{no_inplace} (W - lr * h.T @ d: no
    # copy of W into a fresh buffer, none back) and three GpuElemwise (b - lr * sum(d))
    direct = [len(g.direct) for s in f_on.vm.runner.segments
              for gs in s.graphs.values() for g in gs]
    assert direct and max(direct) == 6, direct
    assert all(not g.direct for s in f_off.vm.runner.segments
               for gs in s.graphs.values() for g in gs)
    assert stats[1]["nodes_captured"] - stats[0]["nodes_captured"] >= 6, stats


# ============================================================================ the thunks

def elemwise_thunk(monkeypatch, scalar_op, n_inputs, inplace=None):
    """The real GpuElemwise thunk over the fake context, its kernels replaced by recorders of
    their launches: (thunk, storage cells of the inputs, output cell, launches)."""
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.runtime.codegen import launch
    launches = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def fast_launcher(self):
            return lambda grid, block, *args: launches.append((self.name, args))
    def load_kernels(ctx, key, src, formats, options=()):
        return {n: Kernel(n) for n in formats}
    monkeypatch.setattr(launch, "load_kernels", load_kernels)
    xs = [gvec() for _ in range(n_inputs)]
    node = GpuElemwise(scalar_op, inplace)(*xs).owner
    sm = {v: [None] for v in list(node.inputs) + list(node.outputs)}
    thunk = node.op.make_thunk(node, sm, {}, [])
    return thunk, [sm[v] for v in node.inputs], sm[node.outputs[0]], launches


def test_gpu_elemwise_thunk_computes_into_its_write_into_target(monkeypatch):
    from symgpu.scalar.basic import SCALAR_OPS
    ctx = fakes.CTX_OBJ
    thunk, ins, out, launches = elemwise_thunk(monkeypatch, SCALAR_OPS["sub"], 2)
    w, g = upload(ctx, [1, 2, 3, 4]), upload(ctx, [1, 1, 1, 1])
    ins[0][0], ins[1][0] = w, g
    thunk()
    fresh = out[0]
    assert fresh.ptr not in (w.ptr, g.ptr) and launches[-1][1][-1] == fresh.ptr
    thunk.write_into[0] = w
    thunk()
    assert out[0] is w and launches[-1][1][-3:] == (w.ptr, g.ptr, w.ptr)
    # a target of another shape (or layout) is declined: a fresh output
    thunk.write_into[0] = upload(ctx, [0, 0])
    thunk()
    assert out[0].shape == (4,) and out[0].ptr != w.ptr and launches[-1][1][-1] == out[0].ptr
    thunk.write_into[0] = w._view(w.ptr, (4,), (-4,))
    thunk()
    assert launches[-1][1][-1] == out[0].ptr and out[0].ptr != w.ptr


def test_gpu_elemwise_thunk_write_into_takes_precedence_over_in_place(monkeypatch):
    from symgpu.scalar.basic import SCALAR_OPS
    ctx = fakes.CTX_OBJ
    thunk, ins, out, launches = elemwise_thunk(monkeypatch, SCALAR_OPS["sub"], 2, {0: 1})
    w, g = upload(ctx, [1, 2, 3, 4]), upload(ctx, [1, 1, 1, 1])
    ins[0][0], ins[1][0] = w, g
    thunk()
    assert out[0] is g                                  # in place on g
    thunk.write_into[0] = w
    thunk()
    assert out[0] is w and launches[-1][1][-1] == w.ptr
    # a strided plan writes an in-place output with its input's strides: declined
    ins[1][0] = rev = g._view(g.ptr + 12, (4,), (-4,))
    thunk()
    assert out[0] is rev and launches[-1][1][-1] == rev.ptr


def test_gpu_elemwise_unary_thunk_computes_into_its_write_into_target(monkeypatch):
    from symgpu.scalar.basic import SCALAR_OPS
    ctx = fakes.CTX_OBJ
    thunk, ins, out, launches = elemwise_thunk(monkeypatch, SCALAR_OPS["exp"], 1)
    x, t = upload(ctx, [1, 2]), upload(ctx, [0, 0])
    ins[0][0] = x
    thunk()
    assert out[0].ptr not in (x.ptr, t.ptr)
    thunk.write_into[0] = t
    thunk()
    assert out[0] is t and launches[-1][1][-2:] == (x.ptr, t.ptr)
    thunk.write_into[0] = None
    thunk()
    assert out[0] is not t


def gemm_thunk(monkeypatch, beta):
    """The real GpuGemm thunk over the fake context, cuBLAS replaced by a recorder of the
    output pointer of each gemm: (thunk, cells of z, x, y, output cell, output pointers)."""
    from symgpu.gpu.ops import blas
    from symgpu.gpu.ops.blas import GpuGemm
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.tensor.type import constant
    c_ptrs = []

    class Cublas:
        def handle(self, ctx):
            return None

        def math_mode(self, handle, mode):
            pass

        def check(self, status, what):
            assert status == 0, what

        gemm = {"float32": lambda h, ta, tb, n, m, k, al, y, lda, x, ldb, be, c, ldc:
                c_ptrs.append(c.value) or 0}
    monkeypatch.setattr(blas, "_cublas", Cublas())
    from symgpu.gpu.ops import thin_gemm
    monkeypatch.setattr(thin_gemm, "ENABLED", False)    # these small products: cuBLAS's path
    mat = GpuArrayType("float32", (False, False), fakes.CTX)
    z, x, y = mat(), mat(), mat()
    node = GpuGemm(False)(z, constant(np.float32(-0.5)), x, y,
                          constant(np.float32(beta))).owner
    sm = {v: [None] for v in list(node.inputs) + list(node.outputs)}
    for v in node.inputs[1::3]:
        sm[v][0] = v.data
    thunk = node.op.make_thunk(node, sm, {}, [])
    return thunk, sm[z], sm[x], sm[y], sm[node.outputs[0]], c_ptrs


def test_gpu_gemm_thunk_accumulates_into_its_write_into_target(monkeypatch):
    """GpuGemm{no_inplace}(W, -lr, x, d, 1), the fused SGD update of a weight matrix: told to
    write into W's buffer, it accumulates there (no copy of W into a fresh buffer, none back);
    a target that is not z itself, or a factor in the target's memory, is declined."""
    ctx = fakes.CTX_OBJ
    thunk, zc, xc, yc, out, c_ptrs = gemm_thunk(monkeypatch, 0.0)   # beta 0: no copy of z
    w = upload(ctx, np.ones((2, 2)))
    zc[0], xc[0], yc[0] = w, upload(ctx, np.ones((2, 3))), upload(ctx, np.ones((3, 2)))
    thunk()
    assert out[0].ptr != w.ptr and c_ptrs[-1] == out[0].ptr
    thunk.write_into[0] = w
    thunk()
    assert out[0] is w and c_ptrs[-1] == w.ptr
    thunk.write_into[0] = upload(ctx, np.ones((2, 2)))             # not z: declined
    thunk()
    assert out[0].ptr not in (w.ptr, thunk.write_into[0].ptr)
    thunk.write_into[0] = w
    xc[0] = w                                                       # W @ y into W: declined
    yc[0] = upload(ctx, np.ones((2, 2)))
    thunk()
    assert out[0] is not w and c_ptrs[-1] != w.ptr
