"""A new shape every call (issue 32: a new sequence length per training step) must cost no
capture per call: the function-level segments of the CUDA-graph runner
(symgpu/gpu/exec/graph_segment.py) and the loops run as chunks (scan_graph.py), on the fake
context, pool and driver of tests/graph_fakes.py (a capture records Python "kernels", a
replay runs them), so counts and results are checked without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import add1, call, gvec, mul2, read, upload
from symgpu.config import config
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.exec import graphs
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.link.vm import link


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def linked(inputs, outputs, values):
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = {}
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage, allow_gc=True)
    return vm


def step(vm, x, y, n):
    """One call with an input of length ``n``; checks the result, returns the counts."""
    ctx = fakes.CTX_OBJ
    vals = np.arange(n, dtype="float32") + n
    vm.storage_map[x][0] = upload(ctx, vals)
    (r,) = call(vm, [y])
    np.testing.assert_array_equal(read(r), (vals + 1) * 2)
    return vm.runner.stats()


def test_a_new_length_every_call_stops_paying_captures_once_lengths_keep_changing():
    """Up to VARIED_AFTER distinct lengths a length is captured at its second sight; past
    them only at its VARIED_REPEATS-th: a length coming back once or twice among many runs
    plainly (no checked capture for a graph that would seldom replay)."""
    x = gvec()
    y = mul2()(add1()(x))
    vm = linked([x], [y], [upload(fakes.CTX_OBJ, [0])])
    seg = vm.runner.segments[0]
    for n in range(1, graphs.VARIED_AFTER + 2):    # VARIED_AFTER + 1 distinct lengths
        st = step(vm, x, y, n)
    assert st["captures"] == 0 and seg.keys_met == graphs.VARIED_AFTER + 1
    for k in range(2, graphs.VARIED_REPEATS):       # length 3 met 2 .. VARIED_REPEATS - 1 times
        st = step(vm, x, y, 3)
        assert st["captures"] == 0, (k, st)
    st = step(vm, x, y, 3)                          # its VARIED_REPEATS-th sight: captured
    assert st["captures"] == 1
    st = step(vm, x, y, 3)
    assert st["replays"] == 1 and st["captures"] == 1


def test_many_lengths_cost_a_bounded_number_of_captures_and_stay_exact():
    """120 calls of lengths drawn uniformly from 10..90 (the benchmark's row): every result
    exact, and captures stay few: none at all once the lengths are seen to vary, until one
    length has come back VARIED_REPEATS times; never more than MAX_GRAPHS."""
    x = gvec()
    y = mul2()(add1()(x))
    vm = linked([x], [y], [upload(fakes.CTX_OBJ, [0])])
    rng = np.random.RandomState(1234)
    lengths = rng.randint(10, 91, size=120)
    counts: dict[int, int] = {}
    first_varied = None
    for i, n in enumerate(lengths):
        counts[int(n)] = counts.get(int(n), 0) + 1
        if first_varied is None and len(counts) > graphs.VARIED_AFTER:
            first_varied = i
        st = step(vm, x, y, int(n))
    # capturing every length at its second sight (the rule before, up to MAX_GRAPHS) took
    # MAX_GRAPHS checked captures here: 37 lengths come back, 3 of them 4 times or more
    may = sum(1 for c in counts.values() if c >= graphs.VARIED_REPEATS)
    assert may < graphs.MAX_GRAPHS - 1
    assert 1 <= st["captures"] <= may + 1, (st, may)
    assert st["graphs"] == st["captures"]
    assert st["plain"] + st["captures"] + st["replays"] == len(lengths)
    assert first_varied is not None


def test_lengths_padded_to_a_few_buckets_are_captured_once_their_keys_repeat():
    """Six lengths that keep coming back (a bucket's: whatever pads to it) are past
    VARIED_AFTER, but once half of them have been met again the segment captures as one
    with few keys: each by its third sight, then replays; none is left to run plainly."""
    x = gvec()
    y = mul2()(add1()(x))
    vm = linked([x], [y], [upload(fakes.CTX_OBJ, [0])])
    buckets = [16, 32, 48, 64, 80, 96]
    assert graphs.VARIED_AFTER < len(buckets) <= graphs.MAX_GRAPHS
    rng = np.random.RandomState(7)
    for r in range(5):
        for n in rng.permutation(buckets):
            st = step(vm, x, y, int(n))
        if r == 2:
            assert st["captures"] == len(buckets) and st["plain"] == 8, st
    assert st["captures"] == st["graphs"] == len(buckets), st
    assert st["plain"] == 8 and st["replays"] == 5 * len(buckets) - 14, st


def test_a_fixed_length_still_replays_one_graph():
    x = gvec()
    y = mul2()(add1()(x))
    vm = linked([x], [y], [upload(fakes.CTX_OBJ, [0])])
    for _ in range(20):
        st = step(vm, x, y, 50)
    assert st["plain"] == 1 and st["captures"] == 1 and st["replays"] == 18, st
    assert st["graphs"] == 1


def test_the_garbage_collector_is_paused_while_a_stream_is_captured():
    """A collection inside a capture runs other libraries' finalizers on the capturing
    thread (XLA unloading a module: a call a capture forbids, which invalidated symgpu's loop
    captures with JAX in the process): begin pauses the collector, end resumes it, also when
    the end fails, and a failed begin leaves it as it was."""
    import gc
    from symgpu.gpu.exec.graph_driver import CudaGraphDriver
    from symgpu.gpu.runtime import gc_pause
    from symgpu.gpu.runtime.libcuda import DriverError

    seen = []

    class Lib:
        fail_begin = False

        def cuStreamBeginCapture_v2(self, stream, mode):
            seen.append(("begin", gc.isenabled()))
            return 1 if self.fail_begin else 0

        def cuStreamEndCapture(self, stream, graph):
            seen.append(("end", gc.isenabled()))
            return 0

        def cuGraphDestroy(self, graph):
            pass
    drv = object.__new__(CudaGraphDriver)
    drv.lib = Lib()
    drv.error = lambda status: f"error {status}"

    def check(status, what):
        if status:
            raise DriverError(f"{what} failed", status)
    drv.check = check
    was = gc.isenabled()
    gc.enable()
    try:
        drv.begin(7)
        assert not gc.isenabled()
        graph, err = drv.end(7)
        assert gc.isenabled() and err is None
        assert seen == [("begin", False), ("end", False)]
        drv.lib.fail_begin = True
        with pytest.raises(DriverError):
            drv.begin(7)
        assert gc.isenabled()
        with gc_pause.gc_paused():          # nested pauses: the outermost resumes
            gc_pause.pause_gc()
            gc_pause.resume_gc()
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            gc_pause.resume_gc()
        gc.disable()                        # a collector the program turned off stays off
        with gc_pause.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


class _HostCheck(Op):
    """s -> s, a check of a host input that the runner overlaps with the launches that do
    not need it (``overlaps_launches``, as scan_to_dnn_rnn's PrefixGuard)."""

    __props__ = ()
    overlaps_launches = True

    def make_node(self, s):
        return Apply(self, [s], [s.type()])

    def perform(self, node, inputs, out):
        out[0][0] = np.float32(inputs[0])


def test_a_segment_reads_the_segment_before_it_in_place_whatever_the_shapes():
    """A masked cuDNN step's plan: a first segment (the forward), a host check, a second
    segment reading the first's outputs. With a new shape every call (two buckets), the
    second's graphs read those outputs where the first's graph for that shape put them:
    pinned, no copy before a replay, one capture per shape each."""
    from graph_fakes import FakeHostScale
    from symgpu.tensor.type import TensorType
    ctx = fakes.CTX_OBJ
    x, s = gvec(), TensorType("float32", ())()
    a = mul2()(add1()(x))                          # the first segment
    y = add1()(FakeHostScale()(a, _HostCheck()(s)))   # the second, after the check
    fg = FunctionGraph([x, s], [y], clone=False)
    fg.update_mapping = {}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(ctx, [0])], s: [np.float32(3)]}, allow_gc=True)
    first, second = vm.runner.segments
    for n in [4, 7] * 6:
        vals = np.arange(n, dtype="float32")
        vm.storage_map[x][0] = upload(ctx, vals)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (vals + 1) * 2 * 3 + 1)
        del r
    assert second.computed == second.steady and not second.staged and not second.moves
    assert [j for gs in second.graphs.values() for g in gs for j, _ in g.staged] == []
    st = vm.runner.stats()
    assert st["captures"] == st["graphs"] == 4, st


def test_two_shapes_stage_what_the_call_computes_from_the_first_capture():
    """Once a segment has met a second key (two sequence lengths, a training and a
    validation batch), what the call computes before it moves with the shapes: its graphs
    read it from static buffers from their capture on, not pinned and dropped at the first
    move (a capture each); with one key it stays pinned until it moves."""
    from test_gpu_graph_moves import FreshPlain
    ctx = fakes.CTX_OBJ
    x = gvec()
    f = FreshPlain(1.0)(x)
    y = mul2()(add1()(f))
    vm = linked([x], [y], [upload(ctx, [0])])
    seg = vm.runner.segments[0]
    for n in [4, 7] * 8:
        vals = np.arange(n, dtype="float32")
        vm.storage_map[x][0] = upload(ctx, vals)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (vals + 2) * 2)
        del r
    st = vm.runner.stats()
    assert st["captures"] == st["graphs"] == 2 and not seg.moves, (st, seg.moves)
    assert seg.computed <= seg.staged


def test_a_varied_segment_stages_what_the_call_computes_from_its_first_capture():
    """A segment past VARIED_AFTER keys reads the outputs of plain nodes before it (here a
    new buffer every call; a padded input of a new bucket's shape) from static buffers of
    its graph from its first capture on: they move with the keys, and pinned, every move
    would drop the graph and cost a capture; every result exact."""
    from test_gpu_graph_moves import FreshPlain
    ctx = fakes.CTX_OBJ
    x = gvec()
    f = FreshPlain(1.0)(x)
    y = mul2()(add1()(f))
    vm = linked([x], [y, f], [upload(ctx, [0])])   # f returned too: a new buffer each call
    seg = vm.runner.segments[0]

    def go(n):
        vals = np.arange(n, dtype="float32") * 0.5
        vm.storage_map[x][0] = upload(ctx, vals)
        (r, _) = call(vm, [y, f])
        np.testing.assert_array_equal(read(r), (vals + 2) * 2)
        return vm.runner.stats()
    for n in range(1, graphs.VARIED_AFTER + 2):
        go(n)
    for _ in range(graphs.VARIED_REPEATS - 1):
        st = go(3)
    assert st["captures"] == 1 and st["graphs"] == 1    # the VARIED_REPEATS-th sight
    assert seg.computed and seg.computed <= seg.staged
    for _ in range(5):
        st = go(3)                                      # f elsewhere each call: replays
    assert st["replays"] == 5 and st["captures"] == 1 and not seg.moves, st
