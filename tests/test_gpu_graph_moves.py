"""CUDA graphs keyed by shapes and strides only (symgpu/gpu/exec/graph_segment.py): one capture
serves calls whose GPU inputs move (a state updated into a fresh buffer each call, the
output of a plain node such as a convolution), results the caller keeps are never
overwritten, a failed call changes nothing, and a collected graph never consumes a pending
device check.  Driven by the fake context, pool and driver of tests/graph_fakes.py.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import MEM, FakeKernelOp, add1, call, gvec, mul2, read, upload
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import graph_instance
from gpu_helpers import requires_gpu


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


linked = fakes.linked


class FreshPlain(Op):
    """A plain (not capturable) node whose output is a fresh buffer at a new address every
    call, as a cuDNN convolution's or an RNG's new state: it keeps its last outputs alive so
    the pool cannot hand the same block back.  Adds ``shift`` to its input."""

    __props__ = ("shift",)

    def __init__(self, shift=0.0):
        self.shift = shift
        self.kept = []

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        from symgpu.gpu.ops.elemwise import new_array
        x = inputs[0]
        a = new_array(fakes.CTX_OBJ, x.shape, np.dtype("float32"))
        MEM[a.ptr][: a.size] = MEM[x.ptr][: x.size] + self.shift
        self.kept = (self.kept + [a])[-3:]
        out[0][0] = a


class Failing(Op):
    """A plain node after the segment that raises when ``fail`` is set (a bad label...)."""

    __props__ = ()
    fail = False

    def make_node(self, x):
        from symgpu.tensor.type import TensorType
        return Apply(self, [x], [TensorType("float32", (False,))()])

    def perform(self, node, inputs, out):
        if Failing.fail:
            raise ValueError("bad input")
        out[0][0] = read(inputs[0])


def test_one_capture_serves_every_call_whose_input_moves():
    """The plain node's output (also returned, so a new buffer each call) moves each call: the
    first graph read it in place, finds it moved, and the segment stages it (copies it into a
    static buffer of the graph): one more capture, then every call replays."""
    ctx = fakes.CTX_OBJ
    x = gvec()
    fresh = FreshPlain(1.0)
    f = fresh(x)
    y = FakeKernelOp("sq", lambda a: a * a)(add1()(f))
    xv = upload(ctx, [0, 1, 2])
    vm, fg = linked([x], [y, f], [xv])
    assert [type(st).__name__ for st in vm.runner.steps] == ["_PlainStep", "Segment"]
    seg = vm.runner.segments[0]
    ptrs = set()
    for i in range(20):
        MEM[xv.ptr][:3] = [i, i + 1, i + 2]
        (r, fv) = call(vm, [y, f])
        np.testing.assert_array_equal(read(r), (np.array([i, i + 1, i + 2]) + 2.0) ** 2)
        ptrs.add(fv.ptr)
        del r, fv
    assert len(ptrs) >= 3                          # the input really moved
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 2 and st["replays"] == 17, st
    assert st["graphs"] == 1 and seg.staged and not any(seg.by_pointer)


def _shared_gvec(value):
    """A GPU shared variable on the fake context (an input the caller does not pass per
    call: read in place until it moves)."""
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.type import GpuArraySharedVariable, GpuArrayType
    t = GpuArrayType("float32", (False,), fakes.CTX)
    return GpuArraySharedVariable(t, value, name="x", container=Container(t, value, "x"))


def _staged_copies(vm):
    """Copies a replay of the segment's graphs makes before launching (staged inputs)."""
    seg = vm.runner.segments[0]
    return [j for gs in seg.graphs.values() for g in gs for j, _ in g.staged]


def test_a_staged_input_that_settles_is_read_in_place_again():
    """A shared value staged after it moved (set_value) that then arrives from one place for
    SETTLE_REPLAYS replays is captured again reading it there: no copy before each replay
    from then on.  Its values are right all along, and when it moves again it is staged
    again.  (An input the caller passes per call stays staged: test_gpu_graph_params.)"""
    from symgpu.gpu.exec import graphs
    ctx = fakes.CTX_OBJ
    first = upload(ctx, [0, 1, 2])
    x = _shared_gvec(first)
    y = FakeKernelOp("sq", lambda a: a * a)(add1()(x))
    vm, fg = linked([x], [y], [first])
    cell = vm.storage_map[x]
    seg = vm.runner.segments[0]

    def run(arr, want_base):
        cell[0] = arr
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (np.asarray(want_base) + 1.0) ** 2)

    for _ in range(4):                                   # plain, capture, replays
        run(first, [0, 1, 2])
    second = upload(ctx, [5, 6, 7])                     # the value moved (set_value)
    run(second, [5, 6, 7])
    assert _staged_copies(vm) == [0] and 0 in seg.staged
    captures = vm.runner.stats()["captures"]
    for i in range(graphs.SETTLE_REPLAYS):
        MEM[second.ptr][:3] = [i, i, i]                  # read afresh on every call
        run(second, [i, i, i])
    assert vm.runner.stats()["captures"] == captures + 1   # re-pinned: read in place
    assert _staged_copies(vm) == [] and 0 not in seg.staged and seg.repins == {0: 1}
    replays = vm.runner.stats()["replays"]
    for i in range(3):
        MEM[second.ptr][:3] = [i, 2 * i, 3 * i]
        run(second, [i, 2 * i, 3 * i])
    assert vm.runner.stats()["replays"] == replays + 3
    third = upload(ctx, [1, 1, 1])                        # moves again: staged again
    run(third, [1, 1, 1])
    assert _staged_copies(vm) == [0]


def test_inputs_that_keep_moving_stay_staged_and_repins_are_bounded():
    """A shared value that moves on every call (results dropped, so one graph serves) never
    settles: its graph copies it before each replay.  One that settles, moves, settles...
    is re-pinned at most MAX_REPINS times, then stays staged."""
    from symgpu.gpu.exec import graphs
    ctx = fakes.CTX_OBJ
    arrays = [upload(ctx, [k, k, k]) for k in range(2)]
    x = _shared_gvec(arrays[0])
    y = add1()(x)
    vm, fg = linked([x], [y], [arrays[0]])
    cell = vm.storage_map[x]

    def run(k):
        cell[0] = arrays[k]
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [k + 1] * 3)

    for i in range(4 * graphs.SETTLE_REPLAYS):
        run(i % 2)
    seg = vm.runner.segments[0]
    assert _staged_copies(vm) == [0] and vm.runner.stats()["captures"] == 2
    assert seg.repins == {}
    for phase in range(6):                                  # settle, move, settle, ...
        for _ in range(graphs.SETTLE_REPLAYS + 2):
            run(phase % 2)
    assert seg.repins == {0: graphs.MAX_REPINS}
    assert _staged_copies(vm) == [0]


class PlacedPlain(Op):
    """A plain node that writes ``x + 1`` into the buffer ``where`` names (a test moves it)."""

    __props__ = ()
    where: list = []

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        x, a = inputs[0], PlacedPlain.where[0]
        MEM[a.ptr][: a.size] = MEM[x.ptr][: x.size] + 1.0
        out[0][0] = a


def test_an_input_the_call_computes_is_never_re_pinned():
    """A plain node's output that moved (another function's calls took its block) is staged,
    and stays staged when it then arrives from one place again: such a value moves whenever
    the pool's blocks change hands, and each re-pin would cost a capture (and the new
    capture of a key already checked is not checked again)."""
    from symgpu.gpu.exec import graphs
    ctx = fakes.CTX_OBJ
    x = gvec()
    f = PlacedPlain()(x)
    y = mul2()(add1()(f))
    vm, fg = linked([x], [y], [upload(ctx, [1, 2, 3])])
    seg = vm.runner.segments[0]
    assert seg.computed == {0}
    PlacedPlain.where = [upload(ctx, [0, 0, 0])]
    for i in range(4 + 3 * graphs.SETTLE_REPLAYS):
        if i == 4:                      # elsewhere from now on, and there to stay
            PlacedPlain.where = [upload(ctx, [0, 0, 0])]
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [6, 8, 10])
        del r
    assert _staged_copies(vm) == [0] and 0 in seg.staged and seg.repins == {}
    assert vm.runner.stats()["captures"] == 2, vm.runner.stats()
    # the key's graph was checked against plain launches once: captured again where its
    # input now is, it is not checked again
    assert seg.verified == 1


def test_a_plain_node_feeding_a_segment_computes_into_a_block_it_owns():
    """A plain node whose output never leaves the call (an upload, a convolution) owns one
    block and computes into it every call (graphs._OwnedPlainStep): the segment reads it in
    place, with no staging copy and one capture; the node's output never moves."""
    ctx = fakes.CTX_OBJ
    x = gvec()
    fresh = FreshPlain(1.0)
    y = FakeKernelOp("sq", lambda a: a * a)(add1()(fresh(x)))
    xv = upload(ctx, [0, 1, 2])
    vm, fg = linked([x], [y], [xv])
    assert [type(st).__name__ for st in vm.runner.steps] == ["_OwnedPlainStep", "Segment"]
    seg = vm.runner.segments[0]
    ptrs = set()
    for i in range(12):
        MEM[xv.ptr][:3] = [i, i + 1, i + 2]
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (np.array([i, i + 1, i + 2]) + 2.0) ** 2)
        ptrs.add(fresh.kept[-1].ptr)
        del r
    assert len(ptrs) == 1 and not seg.staged
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 1 and st["replays"] == 10, st


def test_results_kept_while_inputs_move_are_never_overwritten():
    ctx = fakes.CTX_OBJ
    x = gvec()
    f = FreshPlain()(x)
    y = add1()(f)
    xv = upload(ctx, [0, 0])
    vm, fg = linked([x], [y, f], [xv])
    kept = []
    for i in range(20):
        MEM[xv.ptr][:2] = i
        (r, _) = call(vm, [y, f])
        kept.append(r)
        if len(kept) > 2:
            kept.pop(0)                             # the caller holds its last two results
        for k, r in enumerate(kept):                # each still what its call returned
            np.testing.assert_array_equal(read(r), [i + k - len(kept) + 2] * 2)
        del r
    st = vm.runner.stats()
    assert st["graphs"] <= 4 and st["replays"] >= 12, st


def test_a_state_updated_outside_the_segment_is_staged_and_replays():
    """An RNG-like state: its update comes from a plain node (a fresh buffer each call), so it
    is never copied back; the segment reads it from a static buffer once it has moved."""
    ctx = fakes.CTX_OBJ
    s, x = gvec(), gvec()
    s_new = FreshPlain(1.0)(s)                       # the state's update, plain
    y = FakeKernelOp("mix", lambda a, b: a + b)(s, x)
    sv, xv = upload(ctx, [0, 0]), upload(ctx, [10, 20])
    vm, fg = linked([s, x], [y, s_new], [sv, xv], updates={1: 0})
    state = 0.0
    for i in range(12):
        (r, new) = call(vm, [y, s_new])
        np.testing.assert_array_equal(read(r), [10 + state, 20 + state])
        vm.storage_map[s][0] = new                   # Function's update
        state += 1
        del r, new
    st = vm.runner.stats()
    assert st["captures"] <= 2 and st["replays"] >= 9, st


def test_an_update_target_that_moves_runs_plainly_then_is_recaptured_where_it_is():
    """set_value gives an updated variable a new buffer: the graph that wrote the old one is
    dropped, the next call runs plainly (copying the update back into the new buffer) and
    the one after captures there; nothing is written into the old buffer."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    vm, fg = linked([b], [b2], [upload(ctx, [0, 0])], updates={0: 0})
    cell = vm.storage_map[b]

    def step(n):
        for _ in range(n):
            vm()
            cell[0] = vm.storage_map[b2][0]
            vm.storage_map[b2][0] = None
    step(5)
    old = cell[0]
    cell[0] = upload(ctx, [100, 100])                # set_value(..., borrow=True)-like
    step(5)
    np.testing.assert_array_equal(read(old), [5, 5])
    np.testing.assert_array_equal(read(cell[0]), [105, 105])
    st = vm.runner.stats()
    assert st["captures"] == 2 and st["graphs"] == 1 and st["replays"] >= 6, st


def test_an_update_target_that_keeps_moving_is_keyed_by_pointer():
    """A target that moves every call (say a caller swaps buffers) is not recaptured per call:
    after two moves its pointer joins the key, as it was before graphs had static buffers."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    bufs = [upload(ctx, [0]), upload(ctx, [0])]
    vm, fg = linked([b], [b2], [bufs[0]], updates={0: 0})
    cell = vm.storage_map[b]
    for i in range(16):
        cell[0] = bufs[i % 2]
        vm()
        vm.storage_map[b2][0] = None
    seg = vm.runner.segments[0]
    assert seg.by_pointer == [True]
    np.testing.assert_array_equal([read(bufs[0])[0], read(bufs[1])[0]], [8, 8])
    st = vm.runner.stats()
    assert st["captures"] == 4 and st["replays"] == 7, st   # then one graph per buffer


def test_a_failed_call_changes_nothing():
    """A node after the segment fails: the update is not copied back inside the graph (the
    runner knows something that can fail follows), so the variable's buffer keeps its value
    and the function does not apply the update."""
    ctx = fakes.CTX_OBJ
    w, x = gvec(), gvec()
    w2 = FakeKernelOp("axpy", lambda a, b: a + b)(w, FreshPlain()(x))
    h = Failing()(w2)
    wv = upload(ctx, [1, 1])
    vm, fg = linked([w, x], [h, w2], [wv, upload(ctx, [1, 1])], updates={1: 0})
    assert "_OwnedPlainStep" in [type(st).__name__ for st in vm.runner.steps]
    cell = vm.storage_map[w]
    Failing.fail = False
    try:
        for _ in range(6):
            vm()
            cell[0] = vm.storage_map[w2][0]
            vm.storage_map[w2][0] = vm.storage_map[h][0] = None
        before, arr = read(cell[0]), cell[0]
        Failing.fail = True
        with pytest.raises(ValueError, match="bad input"):
            vm()
        assert cell[0] is arr
        np.testing.assert_array_equal(read(arr), before)
    finally:
        Failing.fail = False
    st = vm.runner.stats()
    assert st["graphs"] == 2 and st["replays"] >= 2, st   # w is held: two graphs alternate


def test_a_collected_graph_never_reads_the_device_checks():
    """Destroying a graph needs no synchronisation (cuGraphExecDestroy frees a running graph
    once it completes); a synchronize() there would raise a pending check of the call in
    progress into the collector's ``except`` and clear it, letting that call's guarded update
    copy land (the order-dependent failure of test_device_checks' graph test)."""
    ctx = fakes.CTX_OBJ
    syncs = []
    ctx.synchronize = lambda: syncs.append(1)
    x = gvec()
    y = add1()(x)
    vm, fg = linked([x], [y], [upload(ctx, [1])])
    for _ in range(3):
        call(vm, [y])
    seg = vm.runner.segments[0]
    assert seg.n_graphs == 1
    seg.release()
    gc.collect()
    assert not syncs and not graph_instance._GRAVEYARD


@requires_gpu
def test_gpu_a_shared_input_that_moves_every_call_replays_one_graph(cuda, monkeypatch):
    """On the GPU: a read-only shared variable given a new buffer before every call (as a
    state updated elsewhere) is staged after its first move; one more update, copied back
    into its own buffer, never moves.  Results match NumPy on every call."""
    from symgpu import function, shared
    from symgpu.gpu.exec import graphs
    from symgpu.gpu.runtime.array import to_gpu
    import symgpu.tensor as T
    monkeypatch.setattr(graphs, "_driver", None)           # the real driver
    rng = np.random.default_rng(0)
    x = shared(np.zeros((64, 32), "float32"), name="x")
    w = shared(np.ones(32, "float32"), name="w")
    f = function([], T.sum(T.tanh(x) * w, axis=0), updates=[(w, w * 0.5 + 1.0)])
    want_w = np.ones(32, "float32")
    ptrs = set()
    kept = []
    for i in range(12):
        xv = rng.standard_normal((64, 32)).astype("float32")
        kept.append(to_gpu(xv, cuda))                       # a new buffer every call
        x.set_value(kept[-1], borrow=True)
        ptrs.add(kept[-1].ptr)
        got = f()
        np.testing.assert_allclose(np.asarray(got), (np.tanh(xv) * want_w).sum(0),
                                   rtol=1e-4, atol=1e-4)
        want_w = want_w * 0.5 + 1.0
    np.testing.assert_allclose(w.get_value(), want_w, rtol=1e-6)
    st = f.vm.runner.stats()
    assert len(ptrs) > 2 and st["replays"] >= 8 and st["captures"] <= 3, st


@requires_gpu
def test_gpu_a_data_set_given_once_with_set_value_is_read_in_place_again(cuda, monkeypatch):
    """On the GPU: a shared data set given a new value once (set_value of a host array, the
    tutorials' loading step) is staged by the next calls, then read in place again once it
    has stayed there: no copy before each replay.  Results match NumPy on every call."""
    from symgpu import function, shared
    from symgpu.gpu.exec import graphs
    import symgpu.tensor as T
    monkeypatch.setattr(graphs, "_driver", None)           # the real driver
    rng = np.random.default_rng(1)
    data = rng.standard_normal((256, 64)).astype("float32")
    x = shared(data, name="x")
    w = shared(np.ones(64, "float32"), name="w")
    f = function([], T.dot(x, w), updates=[(w, w * 0.5 + 0.25)])
    want_w = np.ones(64, "float32")

    def step():
        nonlocal want_w
        np.testing.assert_allclose(np.asarray(f()), data @ want_w, rtol=1e-4, atol=1e-3)
        want_w = want_w * 0.5 + 0.25

    for _ in range(4):
        step()
    data = rng.standard_normal((256, 64)).astype("float32")
    x.set_value(data)                                        # a new buffer, once
    for _ in range(graphs.SETTLE_REPLAYS + 6):
        step()
    (seg,) = f.vm.runner.segments
    assert seg.repins and not [j for gs in seg.graphs.values() for g in gs for j, _ in g.staged]
    np.testing.assert_allclose(w.get_value(), want_w, rtol=1e-6)
