"""The GPU loop runner (GpuScan's step loop and symgpu/gpu/exec/scan_graph.py) on a fake device.

A fake context whose pool hands out offsets into one host array (``HEAP``: views of device
buffers are plain pointer offsets, as on a GPU) and a fake graph driver whose copies and
"kernels" are closures over that array (a capture records them, a launch replays them). So
the loop's buffers, views, taps, windows, per-step outputs, the plain-first / capture /
replay sequence, the staging copies, output-pointer reuse and the fallbacks are checked
against NumPy without a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes
import symgpu.tensor as T
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs, scan_graph
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.pool import DevicePool
from symgpu.gpu.ops.scan_op import GpuScan
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scan.op import ScanError, ScanInfo

CTX = "fake-scan"
BASE = 1 << 20
HEAP = np.zeros(1 << 22, dtype="float32")


def heap(ptr: int, n: int) -> np.ndarray:
    i = (ptr - BASE) // 4
    return HEAP[i:i + n]


def heap_bytes(ptr: int, n: int) -> np.ndarray:
    i = ptr - BASE
    return HEAP.view(np.uint8)[i:i + n]


class _Alloc:
    def __init__(self, ptr):
        self.ptr = ptr

    def __int__(self):
        return self.ptr

    def free(self):
        pass


class HeapPool(DevicePool):
    def _device_alloc(self, nbytes):
        ptr = self.next_ptr
        self.next_ptr += (nbytes + 255) // 256 * 256
        assert self.next_ptr - BASE < HEAP.nbytes, "the fake heap is full"
        self.n_device_allocs += 1
        return _Alloc(ptr)


class FakeCtx(graph_fakes.FakeCtx):
    """graph_fakes' context, named for this module, allocating from this module's heap."""

    name = CTX

    def __init__(self):
        super().__init__()
        self.pool = HeapPool(self, 0.0)
        self.pool.next_ptr = BASE


class FakeDriver(graph_fakes.FakeDriver):
    """graph_fakes' recording driver, copying and reading through this module's heap."""

    def copy(self, dst, src):
        assert dst.shape == src.shape and dst.is_c_contiguous and src.is_c_contiguous
        d, s, n = dst.ptr, src.ptr, src.size

        def k():
            heap(d, n)[:] = heap(s, n)
        if n:
            self.launch_kernel(k)

    def to_host(self, arrays):
        return [read(a) for a in arrays]

    def upload(self, ptr, data, stream):
        """A chunk's copy table (scan_graph.TABLE_COPIES): never while capturing."""
        assert not self.capturing
        self.uploads += 1
        heap_bytes(ptr, len(data))[:] = np.frombuffer(data, np.uint8)

    def prepare_table(self, ctx):
        assert not self.capturing

    def copy_table(self, ctx, table_ptr, entries, max_bytes):
        """graph_params.table_copy: the entries are read from the heap when the launch runs."""
        def k():
            table = heap_bytes(table_ptr, 24 * entries).view(np.int64).reshape(entries, 3)
            for dst, src, n in table.tolist():
                if n:
                    heap_bytes(dst, n)[:] = heap_bytes(src, n)
        self.launch_kernel(k)


def read(a) -> np.ndarray:
    return heap(a.ptr, a.size).reshape(a.shape).copy()


def upload(ctx, values) -> GpuArray:
    values = np.asarray(values, dtype="float32")
    a = GpuArray(values.shape, "float32", ctx)
    heap(a.ptr, a.size)[:] = values.reshape(-1)
    return a


class GpuFakeKernel(Op):
    """out = fn(inputs) on the fake heap: a launch through the fake driver."""

    __props__ = ("name", "capturable_")

    def __init__(self, name, fn, capturable_=True):
        self.name, self.fn, self.capturable_ = name, fn, capturable_

    def make_node(self, *xs):
        return Apply(self, list(xs), [xs[0].type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        fn = self.fn

        def thunk():
            xs = [c[0] for c in ins]
            o = GpuArray(xs[0].shape, "float32", CTX_OBJ)
            ptrs, n, optr = [x.ptr for x in xs], xs[0].size, o.ptr

            def k():
                heap(optr, n)[:] = fn(*[heap(p, n) for p in ptrs])
            DRV.launch_kernel(k)
            out[0] = o
        thunk.capturable = self.capturable_
        thunk.launches = True
        return thunk


CTX_OBJ: FakeCtx = None  # type: ignore[assignment]
DRV: FakeDriver = None   # type: ignore[assignment]


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    global CTX_OBJ, DRV
    from symgpu.gpu.runtime import context as gctx
    CTX_OBJ, DRV = FakeCtx(), FakeDriver()
    gctx.register_context(CTX, CTX_OBJ)
    monkeypatch.setattr(graphs, "_driver", DRV)
    scan_graph.STATS.clear()
    yield CTX_OBJ
    gctx.unregister_context(CTX)


def gtype(ndim):
    return GpuArrayType("float32", (False,) * ndim, CTX)


def accumulate_loop(capturable=True):
    """h[t] = h[t-1] + x[t] (kept), y[t] = 2 * (h[t-1] + x[t]) (per step)."""
    xt, h = gtype(1)("x_t"), gtype(1)("h")
    new_h = GpuFakeKernel("add", lambda a, b: a + b, capturable)(h, xt)
    y = GpuFakeKernel("twice", lambda a: 2 * a, capturable)(new_h)
    op = GpuScan([xt, h], [new_h, y], ScanInfo(1, ((-1,),), (True,), 1, 0), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("X"), gtype(2)("H0"))
    return op, node


def run(op, node, *values):
    storage = [[None] for _ in node.outputs]
    op.perform(node, list(values), storage)
    return [c[0] for c in storage]


def want_accumulate(x, h0):
    hs = np.concatenate([h0, h0 + np.cumsum(x, axis=0)])
    return hs, 2 * hs[1:]


def rand(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype("float32")


def check(got, want, tol=1e-6):
    for g, w in zip(got, want):
        np.testing.assert_allclose(read(g), w, rtol=tol, atol=tol)


def test_plain_first_then_capture_then_replay_with_new_values():
    op, node = accumulate_loop()
    for call in range(5):
        x, h0 = rand(6, 3, seed=call), rand(1, 3, seed=10 + call)
        got = run(op, node, np.int64(6), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
        check(got, want_accumulate(x, h0))
    assert scan_graph.STATS["plain"] == 1 and scan_graph.STATS["captures"] == 1
    assert scan_graph.STATS["replays"] == 3
    assert DRV.launches == 1 + 3   # the check of the new graph (its call's results), replays
    # the graph holds the whole unrolled loop: 1 init copy + 6 x (2 kernels + 2 copies)
    assert scan_graph.STATS["graph nodes (scan)"] == 1 + 6 * 4


def test_a_new_layout_gets_its_own_graph():
    op, node = accumulate_loop()
    for n in (4, 4, 5, 5, 4):
        x, h0 = rand(n, 2, seed=n), rand(1, 2)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    assert scan_graph.STATS["captures"] == 2 and scan_graph.STATS["replays"] == 1


def test_outputs_reuse_their_blocks_only_once_dropped():
    op, node = accumulate_loop()
    x, h0 = rand(5, 3), rand(1, 3)
    args = (np.int64(5), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    run(op, node, *args), run(op, node, *args)   # plain, capture
    first = run(op, node, *args)
    ptrs = [a.ptr for a in first]
    del first
    second = run(op, node, *args)
    assert [a.ptr for a in second] == ptrs   # stable pointers from call to call
    held = second[0][2:4]                     # a view keeps its block busy
    del second
    x2 = rand(5, 3, seed=7)
    third = run(op, node, np.int64(5), upload(CTX_OBJ, x2), args[2])
    assert third[0].ptr != ptrs[0] and third[1].ptr == ptrs[1]
    hs, _ = want_accumulate(x, h0)
    np.testing.assert_allclose(read(held), hs[2:4], rtol=1e-6)   # not overwritten
    check(third, want_accumulate(x2, h0))


def test_an_output_held_over_many_calls_is_never_overwritten_and_recycled_after():
    """Ownership by leases (no reference counts): an array handed out stays the caller's
    while it (or a view of it) lives, however many calls follow; its block is reused by the
    first call after it is dropped; and only SPARE_OUTPUTS blocks per result are recycled."""
    import gc
    from symgpu.gpu.exec.graph_instance import Lease
    op, node = accumulate_loop()
    h0 = rand(1, 3)
    x = rand(4, 3, seed=1)

    def call(x):
        return run(op, node, np.int64(4), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    call(x), call(x)   # plain, capture
    kept = call(x)
    assert all(type(a.base) is Lease for a in kept)
    view = kept[1][1:3]
    assert view.base is kept[1].base
    kept_ptrs = [a.ptr for a in kept]
    want = want_accumulate(x, h0)
    others = []
    for seed in range(2, 2 + 2 * scan_graph.SPARE_OUTPUTS):
        xs = rand(4, 3, seed=seed)
        got = call(xs)
        assert not {a.ptr for a in got} & set(kept_ptrs)
        check(got, want_accumulate(xs, h0))
        others.append(got)   # the caller holds these too
    check(kept, want)
    np.testing.assert_allclose(read(view), want[1][1:3], rtol=1e-6)
    # every spare block is held: new ones come from the pool, the spares stay SPARE_OUTPUTS
    g = next(iter(op.loop_graphs.graphs.values()))
    assert [len(s) for s in g.spare] == [scan_graph.SPARE_OUTPUTS] * 2
    del kept, others
    gc.collect()
    np.testing.assert_allclose(read(view), want[1][1:3], rtol=1e-6)   # the view keeps it
    got = call(rand(4, 3, seed=50))
    assert got[0].ptr == kept_ptrs[0] and got[1].ptr != kept_ptrs[1]   # only result 0 free
    del view, got
    gc.collect()
    x9 = rand(4, 3, seed=9)
    got = call(x9)
    assert [a.ptr for a in got] == kept_ptrs
    check(got, want_accumulate(x9, h0))


def test_body_that_cannot_be_captured_runs_step_by_step():
    op, node = accumulate_loop(capturable=False)
    for s in range(3):
        x, h0 = rand(4, 2, seed=s), rand(1, 2, seed=s + 5)
        check(run(op, node, np.int64(4), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    assert DRV.launches == 0 and scan_graph.STATS["captures"] == 0


def test_window_states_and_two_taps():
    """f[t] = f[t-2] + f[t-1] keeping only the last two values (keep=False)."""
    a, b = gtype(1)("a"), gtype(1)("b")
    new = GpuFakeKernel("add", lambda u, v: u + v)(a, b)
    op = GpuScan([a, b], [new], ScanInfo(0, ((-2, -1),), (False,), 0, 0), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("F0"))
    f0 = np.array([[1, 2], [1, 3]], "float32")
    fib = [f0[0], f0[1]]
    for _ in range(7):
        fib.append(fib[-2] + fib[-1])
    for _ in range(3):
        (got,) = run(op, node, np.int64(7), upload(CTX_OBJ, f0))
        np.testing.assert_allclose(read(got), np.array(fib[-2:]))
    assert scan_graph.STATS["replays"] == 1


def test_too_big_graphs_are_not_kept(monkeypatch):
    monkeypatch.setattr(scan_graph, "MEMORY_LIMIT", 16)
    op, node = accumulate_loop()
    x, h0 = rand(3, 2), rand(1, 2)
    for _ in range(4):
        check(run(op, node, np.int64(3), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    assert scan_graph.STATS["too_big"] == 1 and scan_graph.STATS["replays"] == 0


def test_a_refused_capture_warns_once_and_runs_plainly():
    op, node = accumulate_loop()
    x, h0 = rand(3, 2), rand(1, 2)
    args = (np.int64(3), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    run(op, node, *args)
    DRV.fail_next_capture = True
    with pytest.warns(scan_graph.LoopGraphWarning, match="step by step"):
        check(run(op, node, *args), want_accumulate(x, h0))
    check(run(op, node, *args), want_accumulate(x, h0))
    assert op.loop_graphs.disabled and scan_graph.STATS["captures"] == 0


def test_graphs_off_by_flag_and_errors_keep_their_context():
    from symgpu import config
    op, node = accumulate_loop()
    x, h0 = rand(3, 2), rand(1, 2)
    with config.change_flags(**{"gpuarray.cuda_graphs": False}):
        for _ in range(3):
            check(run(op, node, np.int64(3), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
                  want_accumulate(x, h0))
    assert DRV.launches == 0
    with pytest.raises(ScanError, match="sequence 0 .* 3 entries but the loop runs 4 steps"):
        run(op, node, np.int64(4), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))


# ----------------------------------------------------------------- states updated in place

class GpuFakeAddInplace(Op):
    """a += b on the fake heap, in place (destroy_map), like GpuGemm{inplace} on an
    accumulator."""

    __props__ = ()
    destroy_map = {0: [0]}

    def make_node(self, a, b):
        return Apply(self, [a, b], [a.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]

        def thunk():
            a, b = ins[0][0], ins[1][0]
            pa, pb, n = a.ptr, b.ptr, a.size

            def k():
                heap(pa, n)[:] += heap(pb, n)
            DRV.launch_kernel(k)
            out[0] = a
        thunk.capturable = True
        thunk.launches = True
        return thunk


def inplace_loop(scratch: bool, body: str = "accumulate"):
    """A keep=False state overwritten in place by its step; `body`: 'accumulate' (acc +=
    x_t) or 'alias' (the state's next value is x_t itself, and a per-step output adds into
    the tap in place: the tap must not be the sequence's memory)."""
    from symgpu.gpu.ops.scan_op import gpu_inner_graph, scratch_states, _tap_position
    info = ScanInfo(1, ((-1,),), (False,), 1 if body == "alias" else 0, 0)
    xt, h = T.fvector("x_t"), T.fvector("h")
    js = scratch_states(info) if scratch else ()
    ins, _ = gpu_inner_graph([xt, h], [], [True, True], [], CTX,
                             [_tap_position(info, j) for j in js])
    gx, gh = ins
    if body == "accumulate":
        outs = [GpuFakeAddInplace()(gh, gx)]
    else:
        outs = [gx, GpuFakeAddInplace()(gh, gx)]
    op = GpuScan([gx, gh], outs, info, context_name=CTX, scratch=js)
    node = op.make_node(T.lscalar("n"), gtype(2)("X"), gtype(2)("H0"))
    return op, node


def test_an_owned_state_is_overwritten_in_place_and_inputs_stay_intact():
    op, node = inplace_loop(scratch=True)
    assert getattr(op.inner_inputs[1].tag, "loop_scratch", False)
    for call in range(4):   # plain, capture (+ check), replays
        x, h0 = rand(5, 3, seed=call), rand(1, 3, seed=20 + call)
        X, H0 = upload(CTX_OBJ, x), upload(CTX_OBJ, h0)
        (got,) = run(op, node, np.int64(5), X, H0)
        np.testing.assert_allclose(read(got), h0 + x.sum(0, keepdims=True), rtol=1e-5)
        np.testing.assert_array_equal(read(X), x)     # the sequence untouched
        np.testing.assert_array_equal(read(H0), h0)   # the caller's initial value too
    assert scan_graph.STATS["captures"] == 1 and scan_graph.STATS["replays"] == 2
    # 1 copy of the initial value, 5 in-place adds, 1 copy of the last value out: no copy
    # of the accumulator per step
    assert scan_graph.STATS["graph nodes (scan)"] == 1 + 5 + 1


def test_the_destroy_handler_lets_only_scratch_inputs_be_overwritten():
    from symgpu.graph.rewriting import why_not_destroyable
    for scratch, want in ((True, None), (False, "an input of the function (explicit or shared)")):
        op, _ = inplace_loop(scratch=scratch)
        fg = op.inner.fgraph
        (node,) = [n for n in fg.toposort() if isinstance(n.op, GpuFakeAddInplace)]
        assert why_not_destroyable(fg, node.inputs[0], node) == want
        # the sequence's step view is never scratch, tagged or not
        assert why_not_destroyable(fg, node.inputs[1], node) is not None


def test_a_state_whose_value_is_a_view_of_a_sequence_is_copied_before_it_is_overwritten():
    op, node = inplace_loop(scratch=True, body="alias")
    for call in range(3):
        x, h0 = rand(4, 3, seed=call), rand(1, 3, seed=30 + call)
        X, H0 = upload(CTX_OBJ, x), upload(CTX_OBJ, h0)
        last, ys = run(op, node, np.int64(4), X, H0)
        prev = np.concatenate([h0, x[:-1]])
        np.testing.assert_allclose(read(ys), prev + x, rtol=1e-5)
        np.testing.assert_allclose(read(last), x[-1:], rtol=1e-6)
        np.testing.assert_array_equal(read(X), x)
        np.testing.assert_array_equal(read(H0), h0)
    assert op._scratch_copy == frozenset({0})


@pytest.mark.parametrize("call", ["begin", "instantiate"])
def test_a_driver_error_starting_a_capture_runs_the_loop_plainly(monkeypatch, call):
    from symgpu.gpu.runtime.libcuda import DriverError
    op, node = accumulate_loop()
    x, h0 = rand(3, 2), rand(1, 2)
    args = (np.int64(3), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    run(op, node, *args)

    def refuse(*a):
        raise DriverError(f"cu{call} failed: out of memory", 2)
    monkeypatch.setattr(DRV, call, refuse)
    with pytest.warns(scan_graph.LoopGraphWarning, match="out of memory"):
        check(run(op, node, *args), want_accumulate(x, h0))
    assert op.loop_graphs.disabled and scan_graph.STATS["captures"] == 0


def test_a_bug_starting_a_capture_is_not_taken_for_a_driver_error(monkeypatch):
    op, node = accumulate_loop()
    x, h0 = rand(3, 2), rand(1, 2)
    args = (np.int64(3), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    run(op, node, *args)

    def bug(*a):
        raise AttributeError("'NoneType' object has no attribute 'handle'")
    monkeypatch.setattr(DRV, "begin", bug)
    with pytest.raises(AttributeError, match="handle"):
        run(op, node, *args)


def test_graph_statistics_the_driver_cannot_give_are_skipped(monkeypatch):
    from symgpu.gpu.runtime.libcuda import DriverError

    def refuse(graph):
        raise DriverError("cuGraphGetNodes failed: not supported", 801)
    monkeypatch.setattr(DRV, "node_count", refuse)
    op, node = accumulate_loop()
    x, h0 = rand(4, 2), rand(1, 2)
    for _ in range(3):
        check(run(op, node, np.int64(4), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    assert scan_graph.STATS["captures"] == 1 and "graph nodes (scan)" not in scan_graph.STATS


# ============================================================================ changing lengths

def test_chunk_lengths_cover_every_length_with_few_loops():
    for n in range(1, 200):
        parts = scan_graph.chunk_lengths(n)
        assert sum(parts) == n and parts == sorted(parts, reverse=True)
        assert len(parts) <= n // 64 + 6
    assert scan_graph.chunk_lengths(50) == [32, 16, 2]


def test_a_new_length_every_call_replays_chunk_graphs_without_new_captures():
    """Variable-length minibatches: once the loop has met more lengths than it keeps whole
    graphs for, every call runs as power-of-two chunks whose graphs are captured once; after
    they exist, lengths never seen before cost no capture (issue 32: the length is a
    parameter, not a key), and every result equals the plain loop's."""
    op, node = accumulate_loop()
    lengths = [int(n) for n in np.random.RandomState(3).randint(1, 40, size=40)]
    captures_after = {}
    for call, n in enumerate(lengths):
        x, h0 = rand(n, 3, seed=call), rand(1, 3, seed=100 + call)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0), 1e-5)
        captures_after[call] = scan_graph.STATS["captures"]
    assert op.loop_graphs.chunking and scan_graph.STATS["chunks"] > len(lengths)
    assert scan_graph.STATS["replays"] > len(lengths)      # chunks replayed, not run plainly
    # chunk lengths 32..1 (6 graphs) plus the whole-loop graphs of the first few lengths
    assert captures_after[len(lengths) - 1] <= len(scan_graph.CHUNKS) + scan_graph.MAX_GRAPHS
    new = [n for n in (37, 23, 13) if n not in lengths]
    before = scan_graph.STATS["captures"]
    for n in new:
        x, h0 = rand(n, 3, seed=n), rand(1, 3)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0), 1e-5)
    assert scan_graph.STATS["captures"] == before


def test_chunks_carry_windows_of_several_taps_and_last_values_only_states():
    """f[t] = f[t-2] + f[t-1] (keep=False: only the last two values) and the same kept whole:
    each chunk starts from the last two values of the one before."""
    for keep in (False, True):
        a, b = gtype(1)("a"), gtype(1)("b")
        new = GpuFakeKernel("add", lambda u, v: u + v)(a, b)
        op = GpuScan([a, b], [new], ScanInfo(0, ((-2, -1),), (keep,), 0, 0), context_name=CTX)
        node = op.make_node(T.lscalar("n"), gtype(2)("F0"))
        f0 = np.array([[1, 2], [1, 3]], "float32") / 8
        for n in (3, 7, 5, 9, 11, 6, 13, 10, 19, 12, 17):
            fib = [f0[0], f0[1]]
            for _ in range(n):
                fib.append(fib[-2] + fib[-1])
            (got,) = run(op, node, np.int64(n), upload(CTX_OBJ, f0))
            want = np.array(fib) if keep else np.array(fib[-2:])
            np.testing.assert_allclose(read(got), want, rtol=1e-6)
        assert op.loop_graphs.chunking


def test_only_a_loops_first_graph_is_checked_against_plain_launches():
    """The check (a plain run, a synchronisation, a comparison) runs once per loop body: its
    graphs of other lengths unroll the same body."""
    op, node = accumulate_loop()
    for n in (4, 4, 5, 5, 6, 6):
        x, h0 = rand(n, 2, seed=n), rand(1, 2)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    assert scan_graph.STATS["captures"] == 3 and scan_graph.STATS["checks"] == 1


@pytest.mark.parametrize("tables", [True, False])
def test_chunks_copy_results_straight_into_the_calls_arrays(monkeypatch, tables):
    """A chunk's results are copied from the graph's memory into the call's arrays, not
    first into arrays of their own (issue 32).  With copy tables, the graph does every copy
    from one upload of pointers: per call, only the initial state's copy into the history
    runs from the host, and one upload and one launch per chunk; without, per chunk, one copy
    per input staged and one per kept state or per-step output."""
    monkeypatch.setattr(scan_graph, "TABLE_COPIES", tables)
    op, node = accumulate_loop()
    for call, n in enumerate((3, 5, 9, 17, 33, 2, 6, 50, 50)):   # every chunk length captured
        x, h0 = rand(n, 3, seed=call), rand(1, 3, seed=100 + call)
        run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
    assert op.loop_graphs.chunking
    copies = []
    real = DRV.copy

    def counting(dst, src):
        copies.append(dst.shape)
        real(dst, src)
    DRV.copy = counting
    before, uploads, launches = dict(scan_graph.STATS), DRV.uploads, DRV.launches
    x, h0 = rand(50, 3, seed=7), rand(1, 3, seed=8)
    check(run(op, node, np.int64(50), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
          want_accumulate(x, h0), 1e-5)
    chunks = len(scan_graph.chunk_lengths(50))
    assert scan_graph.STATS["replays"] - before.get("replays", 0) == chunks
    assert DRV.launches - launches == chunks
    assert scan_graph.STATS["captures"] == before["captures"]
    if tables:
        assert len(copies) == 1 and DRV.uploads - uploads == chunks, copies
        assert all(g.table is not None for g in op.loop_graphs.graphs.values()
                   if g is not None and g.results[0].shape[0] - 1 in scan_graph.CHUNKS)
    else:
        assert len(copies) == 1 + chunks * (2 + 2) and DRV.uploads == uploads, copies


def test_a_last_values_state_returned_from_chunks_is_the_callers_own():
    """A keep=False state's final value comes out of the last chunk's graph memory: the
    caller gets a copy, which the next calls' replays leave untouched."""
    a, b = gtype(1)("a"), gtype(1)("b")
    new = GpuFakeKernel("add", lambda u, v: u + v)(a, b)
    op = GpuScan([a, b], [new], ScanInfo(0, ((-2, -1),), (False,), 0, 0), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("F0"))
    held = []
    for n in (3, 7, 5, 9, 11, 6, 13, 10, 19, 12, 17, 3, 7, 5, 9, 11, 3, 7):
        f0 = np.array([[1, 2], [n, 3]], "float32") / 8
        fib = [f0[0], f0[1]]
        for _ in range(n):
            fib.append(fib[-2] + fib[-1])
        (got,) = run(op, node, np.int64(n), upload(CTX_OBJ, f0))
        held.append((got, np.array(fib[-2:])))
    assert op.loop_graphs.chunking and scan_graph.STATS["replays"] > 0
    for got, want in held:
        np.testing.assert_allclose(read(got), want, rtol=1e-6)


def test_chunks_with_copy_tables_copy_non_sequences_in_so_a_moved_one_costs_nothing():
    """With copy tables a chunk graph copies the non-sequences in itself (no pins): a w
    elsewhere every call is read where it is, with no plain run and no new capture."""
    xt, h, w = gtype(1)("x_t"), gtype(1)("h"), gtype(1)("w")
    xw = GpuFakeKernel("mul", lambda a, b: a * b)(xt, w)
    new_h = GpuFakeKernel("add", lambda a, b: a + b)(h, xw)
    op = GpuScan([xt, h, w], [new_h], ScanInfo(1, ((-1,),), (True,), 0, 1), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("X"), gtype(2)("H0"), gtype(1)("W"))
    captures = plain = None
    for call, n in enumerate((3, 5, 9, 17, 33, 2, 6, 50, 50, 7, 50, 21, 44)):
        wv = upload(CTX_OBJ, np.array([0.5, -1.0, 2.0]) + call)   # a new w, elsewhere
        x, h0 = rand(n, 3, seed=call), rand(1, 3, seed=call + 1)
        (got,) = run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0), wv)
        want = np.concatenate([h0, h0 + np.cumsum(x * read(wv), axis=0)])
        np.testing.assert_allclose(read(got), want, rtol=1e-5, atol=1e-6)
        if call == 9:
            captures, plain = scan_graph.STATS["captures"], scan_graph.STATS["plain"]
    assert op.loop_graphs.chunking
    assert not any(g.pinned for g in op.loop_graphs.graphs.values() if g is not None)
    assert scan_graph.STATS["captures"] == captures and scan_graph.STATS["plain"] == plain


def test_chunks_read_non_sequences_in_place_until_one_moves(monkeypatch):
    """Without copy tables: h[t] = h[t-1] + x[t] * w: the chunk graphs read w where it is
    (no staging copy per chunk); a new w elsewhere is never read through an old graph: that
    chunk runs plainly, and from then on the non-sequences are staged (copied once per
    chunk)."""
    monkeypatch.setattr(scan_graph, "TABLE_COPIES", False)
    xt, h, w = gtype(1)("x_t"), gtype(1)("h"), gtype(1)("w")
    xw = GpuFakeKernel("mul", lambda a, b: a * b)(xt, w)
    new_h = GpuFakeKernel("add", lambda a, b: a + b)(h, xw)
    op = GpuScan([xt, h, w], [new_h], ScanInfo(1, ((-1,),), (True,), 0, 1), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("X"), gtype(2)("H0"), gtype(1)("W"))

    def go(n, wv, seed):
        x, h0 = rand(n, 3, seed=seed), rand(1, 3, seed=seed + 1)
        (got,) = run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0), wv)
        want = np.concatenate([h0, h0 + np.cumsum(x * read(wv), axis=0)])
        np.testing.assert_allclose(read(got), want, rtol=1e-5, atol=1e-6)
    w1 = upload(CTX_OBJ, [0.5, -1.0, 2.0])
    for call, n in enumerate((3, 5, 9, 17, 33, 2, 6, 50, 50, 7)):   # chunk graphs captured
        go(n, w1, call)
    lg = op.loop_graphs
    assert lg.chunking and lg.pin_rest
    kept = [g for g in lg.graphs.values() if g is not None]
    assert any(g.pinned == ((3, w1.ptr),) for g in kept)
    assert all(g.pinned in ((), ((3, w1.ptr),)) for g in kept)
    copies = []
    real = DRV.copy

    def counting(dst, src):
        copies.append(src.ptr)
        real(dst, src)
    DRV.copy = counting
    go(50, w1, 99)
    assert w1.ptr not in copies and len(copies) == 1 + 3 * (2 + 1), copies
    DRV.copy = real
    w2 = upload(CTX_OBJ, [1.0, 0.25, -0.5])        # w elsewhere: never read at w1's address
    heap(w1.ptr, 3)[:] = np.nan
    go(50, w2, 100)
    assert not lg.pin_rest
    for call, n in enumerate((50, 50, 13)):
        go(n, w2, 200 + call)
    chunk_graphs = [lg.graphs[k] for k in lg.graphs if k[0] in (32, 16, 8, 4, 2, 1)]
    assert chunk_graphs and not any(g.pinned for g in chunk_graphs if g is not None)


def test_the_first_chunked_call_captures_every_chunk_length_up_to_the_longest_met():
    """Issue 32: once a loop runs as chunks, its first chunked call captures the graph of
    every chunk length up to the longest length met (one warm-up call); from then on a new
    length each call (any length up to twice that) costs no capture and no plain step, each
    chunk graph serving every length that contains it, and the results are the plain loop's
    exactly.  Captures stay bounded by the chunk lengths and the whole-loop graphs."""
    op, node = accumulate_loop()
    first = (5, 9, 30, 7)          # the 4th distinct length starts chunking (CHUNK_AFTER 3)
    for call, n in enumerate(first):
        x, h0 = rand(n, 3, seed=call), rand(1, 3, seed=100 + call)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0), 1e-5)
    lg = op.loop_graphs
    assert lg.chunking and not lg.warm_pending
    chunk_keys = {k[0] for k, g in lg.graphs.items() if g is not None}
    assert chunk_keys == {16, 8, 4, 2, 1}          # 7 = 4 + 2 + 1, and up to 30: 16, 8
    captures, plain = scan_graph.STATS["captures"], scan_graph.STATS["plain"]
    assert captures == len(chunk_keys) and scan_graph.STATS["checks"] == 1
    launches = DRV.launches
    lengths = [int(n) for n in np.random.RandomState(5).randint(1, 32, size=25)]
    for call, n in enumerate(lengths):
        x, h0 = rand(n, 3, seed=200 + call), rand(1, 3, seed=300 + call)
        got = run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0))
        check(got, want_accumulate(x, h0), 1e-5)
    assert scan_graph.STATS["captures"] == captures          # one capture serves many lengths
    assert scan_graph.STATS["plain"] == plain
    assert DRV.launches - launches == sum(len(scan_graph.chunk_lengths(n)) for n in lengths)


def test_warm_chunks_off_captures_only_the_lengths_a_call_runs(monkeypatch):
    """scan_graph.WARM_CHUNKS off: the first chunked call captures only its own chunks'
    lengths (the others wait for their first sight)."""
    monkeypatch.setattr(scan_graph, "WARM_CHUNKS", False)
    op, node = accumulate_loop()
    for call, n in enumerate((5, 9, 30, 7)):
        x, h0 = rand(n, 3, seed=call), rand(1, 3, seed=100 + call)
        check(run(op, node, np.int64(n), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0), 1e-5)
    assert {k[0] for k, g in op.loop_graphs.graphs.items() if g is not None} == {4, 2, 1}


class GpuFakeKernelInto(GpuFakeKernel):
    """GpuFakeKernel whose thunk computes into an array it is given (``write_into``, as
    GpuElemwise's): the loop's buffers then take each step's result with no copy."""

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        fn, into = self.fn, [None]

        def thunk():
            xs = [c[0] for c in ins]
            target = into[0]
            o = target if target is not None and target.shape == xs[0].shape else \
                GpuArray(xs[0].shape, "float32", CTX_OBJ)
            ptrs, n, optr = [x.ptr for x in xs], xs[0].size, o.ptr

            def k():
                heap(optr, n)[:] = fn(*[heap(p, n) for p in ptrs])
            DRV.launch_kernel(k)
            out[0] = o
        thunk.capturable = thunk.launches = True
        thunk.write_into = into
        return thunk


@pytest.mark.parametrize("direct", [True, False])
def test_step_results_are_computed_into_the_loops_buffers(monkeypatch, direct):
    """A body whose kernels can write into a given array computes the kept state and the
    per-step output straight into their slots: the captured loop holds the kernels and no
    per-step copies (the per-step output's first step is still copied: its buffer is made
    once its shape is known)."""
    from symgpu.gpu.ops import scan_op
    monkeypatch.setattr(scan_op, "DIRECT_OUTPUTS", direct)
    xt, h = gtype(1)("x_t"), gtype(1)("h")
    new_h = GpuFakeKernelInto("add", lambda a, b: a + b)(h, xt)
    y = GpuFakeKernelInto("twice", lambda a: 2 * a)(new_h)
    op = GpuScan([xt, h], [new_h, y], ScanInfo(1, ((-1,),), (True,), 1, 0), context_name=CTX)
    node = op.make_node(T.lscalar("n"), gtype(2)("X"), gtype(2)("H0"))
    for call in range(4):
        x, h0 = rand(6, 3, seed=call), rand(1, 3, seed=10 + call)
        check(run(op, node, np.int64(6), upload(CTX_OBJ, x), upload(CTX_OBJ, h0)),
              want_accumulate(x, h0))
    copies = 1 + (6 * 2 if not direct else 1)      # the initial state, then the steps'
    assert scan_graph.STATS["graph nodes (scan)"] == copies + 6 * 2
