"""Collectives on a communication stream of their own (issue 35): the order the VM runs
nodes in (symgpu/link/order.py), the joins the rewrite inserts (symgpu/gpu/ops/comm_join.py)
on a virtual GPU, the forks and joins of the runtime (symgpu/gpu/runtime/comm_stream.py)
against a fake context, graph driver, stream driver and NCCL (tests/graph_fakes.py): the NCCL
call on the communication stream, events recorded and waited in order, a capture that forks
and joins; results equal to the one-stream step.  On one GPU (``-m gpu``) a data-parallel
step through real NCCL equals the one-stream step, captured and replayed."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
import symgpu.distributed as dist
import symgpu.tensor as T
from graph_fakes import MEM, FakeElemwise, add1, call, gvec, mul2, read, upload
from symgpu import function, shared
from symgpu.config import config
from symgpu.gpu.exec import graphs
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.link.order import hinted_order
from symgpu.link.vm import link
from symgpu.tensor.type import TensorType

COMPUTE, COMM = 7, 9       # the fake context's stream handle (graph_fakes.FakeCtx), ours


# ----------------------------------------------------------------------------- the order

class _Hinted(Op):
    __props__ = ("name", "schedule_hint")

    def __init__(self, name, schedule_hint=None):
        self.name, self.schedule_hint = name, schedule_hint

    def __str__(self):
        return self.name

    def make_node(self, *xs):
        return Apply(self, list(xs), [TensorType("float64", ())()])


def _names(nodes):
    return [str(n.op) for n in nodes]


def test_early_nodes_run_after_their_ancestors_and_late_nodes_before_their_readers():
    a, b = T.dscalar("a"), T.dscalar("b")
    f1 = _Hinted("f1")(a)
    g1 = _Hinted("g1")(b)
    g2 = _Hinted("g2")(g1)
    c1 = _Hinted("c1", "early")(g2)              # needs the g chain
    c0 = _Hinted("c0", "early")(f1)              # needs f1 only: goes first
    j0 = _Hinted("j0", "late")(c0)
    j1 = _Hinted("j1", "late")(c1)
    out = _Hinted("out")(_Hinted("u0")(j0), _Hinted("u1")(j1), _Hinted("h")(g2))
    fg = FunctionGraph([a, b], [out], clone=False)
    topo = fg.toposort()
    assert _names(topo) == ["f1", "c0", "j0", "u0", "g1", "g2", "c1", "j1", "u1", "h", "out"]
    order = hinted_order(topo)
    assert _names(order) == ["f1", "c0", "g1", "g2", "c1", "j0", "u0", "j1", "u1", "h", "out"]
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[v.owner] < pos[n] for n in order for v in n.inputs if v.owner)


def test_a_join_read_only_by_an_output_runs_last_and_no_hint_keeps_the_order():
    a = T.dscalar("a")
    c = _Hinted("c", "early")(_Hinted("x")(a))
    j = _Hinted("j", "late")(c)
    other = _Hinted("y")(_Hinted("w")(a))
    fg = FunctionGraph([a], [j, other], clone=False)
    assert _names(hinted_order(fg.toposort())) == ["x", "c", "w", "y", "j"]
    plain = FunctionGraph([a], [_Hinted("p")(_Hinted("q")(a))], clone=False)
    assert hinted_order(plain.toposort()) == plain.toposort()


# ----------------------------------------------------------------------------- the rewrite

def _mlp_step(group="self", bucket_bytes=100, **flags):
    rng = np.random.RandomState(0)
    W1 = shared(rng.randn(5, 8).astype("float32"), name="W1")
    b1 = shared(np.zeros(8, "float32"), name="b1")
    W2 = shared(rng.randn(8, 3).astype("float32"), name="W2")
    b2 = shared(np.zeros(3, "float32"), name="b2")
    x, y = T.fmatrix("x"), T.fmatrix("y")
    cost = ((T.dot(T.tanh(T.dot(x, W1) + b1), W2) + b2 - y) ** 2).mean()
    params = [W1, b1, W2, b2]
    grads = T.grad(cost, params)
    ups = dist.data_parallel([(p, p - 0.1 * g) for p, g in zip(params, grads)], grads=grads,
                             params=params, bucket_bytes=bucket_bytes, group=group)
    with config.change_flags(**flags):
        f = function([x, y], cost, updates=ups)
    return f, params


def test_every_gpu_collective_is_read_through_a_join_placed_before_its_first_reader(vgpu):
    from symgpu.gpu.ops.collectives import GpuAllReduce
    from symgpu.gpu.ops.comm_join import GpuCommJoin
    f, _ = _mlp_step()
    fg = f.maker.fgraph
    colls = [n for n in fg.apply_nodes if isinstance(n.op, GpuAllReduce)]
    joins = [n for n in fg.apply_nodes if isinstance(n.op, GpuCommJoin)]
    assert len(colls) == 4 and len(joins) == 4          # one bucket per gradient here
    for c in colls:
        (client, i), = fg.clients[c.outputs[0]]          # the join is its only reader
        assert isinstance(client.op, GpuCommJoin) and i == 0
        assert client.inputs[1] is c.inputs[0]           # and keeps its input alive
        assert client.op.view_map == {0: [0]}
    nodes = f.vm.nodes
    pos = {n: i for i, n in enumerate(nodes)}
    assert max(pos[c] for c in colls) < min(pos[j] for j in joins)
    for j in joins:                                      # right before its first reader
        readers = [pos[c] for c, _ in fg.clients[j.outputs[0]] if c != "output"]
        assert readers and min(readers) == pos[j] + 1
    # each collective right after the last node it needs: nothing unrelated in between
    for c in colls:
        assert pos[c] == max(pos[v.owner] for v in c.inputs if v.owner) + 1


def test_no_join_with_the_flag_off_or_checks_read_at_once(vgpu):
    from symgpu.gpu.ops.comm_join import GpuCommJoin
    for flags in ({"distributed.comm_stream": False}, {"gpuarray.sync_checks": True}):
        f, _ = _mlp_step(**flags)
        assert not any(isinstance(n.op, GpuCommJoin) for n in f.maker.fgraph.apply_nodes)


def test_a_join_needs_a_gpu_collectives_result(vgpu):
    from symgpu.gpu.ops.comm_join import GpuCommJoin
    from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
    x = as_gpuarray_variable(T.fvector("x"), None)
    with pytest.raises(TypeError, match="GpuCommJoin: the first input must be a GPU "
                                        "collective's result, got .* computed by GpuFromHost"):
        GpuCommJoin()(x)


# ----------------------------------------------------------------------------- fakes

class FakeStream:
    handle = COMM


class FakeCommDriver:
    """comm_stream.CommDriver's interface: logs records and waits, with the fake graph
    driver's capture state."""

    def __init__(self, log):
        self.log, self.next = log, 100

    def new_stream(self, ctx):
        self.log.append(("new_stream",))
        return FakeStream(), COMM

    def event(self):
        self.next += 1
        return self.next

    def destroy_event(self, event):
        pass

    def record(self, event, stream):
        self.log.append(("record", event, stream, fakes.DRV.capturing))

    def wait(self, stream, event):
        self.log.append(("wait", stream, event, fakes.DRV.capturing))


class FakeBinding:
    """nccl_lib.Nccl's all_reduce in a world of one (the result is the input), its copy a
    fake kernel (recorded by a capture, run by a replay)."""

    def __init__(self, log):
        self.log = log

    def all_reduce(self, x, out, n, dtype, op, comm, stream):
        self.log.append(("ncclAllReduce", stream, fakes.DRV.capturing))

        def k():
            MEM[out][:n] = MEM[x][:n]
        fakes.DRV.launch_kernel(k)
        return 0


class FakeNcclComm(dist.SelfCommunicator):
    supports_device = True
    backend = "nccl"

    def __init__(self, log):
        super().__init__(timeout=5.0)
        self.log, self.handle, self.nccl = log, "COMM", FakeBinding(log)

    def launch(self, node, ctx, call, stream=None):
        self.log.append(("launch", getattr(stream, "handle", COMPUTE)))
        call()


@pytest.fixture
def fake_world(monkeypatch):
    from symgpu.gpu.runtime import comm_stream
    gen = fakes.use_fake_gpu(monkeypatch)
    ctx = next(gen)
    log: list = []
    monkeypatch.setattr(comm_stream, "_driver", FakeCommDriver(log))
    drv = fakes.DRV
    for name in ("launch_kernel", "begin", "end"):
        real = getattr(drv, name)

        def logged(*a, _real=real, _name=name):
            log.append((_name, drv.capturing) if _name != "launch_kernel" else ("kernel",))
            return _real(*a)
        setattr(drv, name, logged)
    comm = FakeNcclComm(log)
    with dist.use_communicator(comm):
        yield ctx, log
    for _ in gen:
        pass


def _step(comm_stream=True):
    """z = all_reduce(x) + (w + 1) * 2 on the fake context, linked as function() would,
    with the join pass applied (or not)."""
    from symgpu.gpu.ops.collectives import GpuAllReduce
    from symgpu.gpu.ops.comm_join import gpu_comm_joins
    ctx = fakes.CTX_OBJ
    x, w = gvec(), gvec()
    y = GpuAllReduce("sum", "world")(x)
    z = FakeElemwise("add", np.add)(y, mul2()(add1()(w)))
    fg = FunctionGraph([x, w], [z], clone=False)
    fg.update_mapping = {}
    with config.change_flags(**{"distributed.comm_stream": comm_stream}):
        assert gpu_comm_joins(fg) == int(comm_stream)
    xv, wv = upload(ctx, np.arange(6.0)), upload(ctx, np.full(6, 3.0))
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [xv], w: [wv]}, allow_gc=True)
    return vm, fg.outputs[0]


def _kinds(log):
    return [e[0] for e in log if e[0] in ("record", "wait", "ncclAllReduce", "kernel",
                                          "begin", "end", "launch")]


def test_the_nccl_call_is_queued_on_the_communication_stream_between_fork_and_join(
        fake_world):
    ctx, log = fake_world
    vm, z = _step()
    assert _names(vm.nodes) == ["GpuAllReduce{sum, world}", "Fakeadd1", "Fakemul2",
                                "GpuCommJoin", "FakeElemwise{add}"]
    assert log == [("new_stream",)] and ctx.comm.handle == COMM   # made when linked
    del log[:]
    (r,) = call(vm, [z])                                 # the first call: plain
    np.testing.assert_array_equal(read(r), np.arange(6.0) + 8)
    started, done = 101, 102
    assert [e for e in log if e[0] in ("record", "wait")] == [
        ("record", started, COMPUTE, False),     # fork: after x (and the output's block)
        ("wait", COMM, started, False),
        ("record", done, COMM, False),           # behind NCCL and the watchdog's kernels
        ("wait", COMPUTE, done, False)]          # join
    assert _kinds(log) == ["record", "wait", "launch", "ncclAllReduce", "kernel", "record",
                           "kernel", "kernel",   # w + 1, * 2: beside the all-reduce
                           "wait", "kernel"]     # the join, then the sum that reads it
    assert ("launch", COMM) in log and ("ncclAllReduce", COMM, False) in log
    assert ctx.comm.pending == []


def test_a_capture_forks_and_joins_inside_it_and_replays_without_either(fake_world):
    ctx, log = fake_world
    vm, z = _step()
    want = np.arange(6.0) + 8
    call(vm, [z])
    del log[:]
    (r,) = call(vm, [z])                                 # the repeat: checked plainly, captured
    np.testing.assert_array_equal(read(r), want)
    assert vm.runner.stats()["captures"] == 1
    begin = log.index(("begin", False))
    end = log.index(("end", True))
    inside = [e for e in log[begin:end] if e[0] in ("record", "wait", "ncclAllReduce")]
    assert inside == [("record", 101, COMPUTE, True), ("wait", COMM, 101, True),
                      ("ncclAllReduce", COMM, True), ("record", 102, COMM, True),
                      ("wait", COMPUTE, 102, True)]   # joined back before the capture ends
    assert ctx.comm.pending == []
    del log[:], r
    for _ in range(3):        # each result let go before the next call: one graph serves
        np.testing.assert_array_equal(read(call(vm, [z])[0]), want)
    assert vm.runner.stats()["replays"] >= 3 and vm.runner.stats()["captures"] == 1
    assert not [e for e in log if e[0] in ("record", "wait", "ncclAllReduce")]


def test_teardown_destroys_the_graphs_holding_collectives_and_they_capture_again(fake_world):
    from symgpu.gpu.runtime.comm_stream import before_communicator_teardown
    ctx, log = fake_world
    vm, z = _step()
    want = np.arange(6.0) + 8
    for _ in range(3):
        np.testing.assert_array_equal(read(call(vm, [z])[0]), want)
    assert vm.runner.stats()["graphs"] == 1
    (seg,) = [s for s in vm.runner.segments if s.graphs]
    assert seg in graphs._COMMUNICATING
    destroyed = fakes.DRV.destroyed
    before_communicator_teardown(type("Other", (), {"device": "cuda9"})())
    assert vm.runner.stats()["graphs"] == 1            # another device's teardown: kept
    before_communicator_teardown(ctx)   # what NcclCommunicator.close runs before NCCL's teardown
    assert vm.runner.stats()["graphs"] == 0 and fakes.DRV.destroyed == destroyed + 1
    for _ in range(3):                 # a later call (a new communicator) captures again
        np.testing.assert_array_equal(read(call(vm, [z])[0]), want)
    assert vm.runner.stats()["graphs"] == 1 and vm.runner.stats()["captures"] == 2


def test_segments_without_a_collective_are_not_released(fake_world):
    ctx, _ = fake_world
    x = gvec()
    fg = FunctionGraph([x], [mul2()(add1()(x))], clone=False)
    fg.update_mapping = {}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(ctx, np.arange(6.0))]}, allow_gc=True)
    for _ in range(3):
        call(vm, fg.outputs)
    assert vm.runner.stats()["graphs"] == 1
    assert not set(vm.runner.segments) & set(graphs._COMMUNICATING)
    graphs.release_communicating_graphs()
    assert vm.runner.stats()["graphs"] == 1


def test_results_equal_the_one_stream_step(fake_world):
    ctx, log = fake_world
    got = {}
    for on in (True, False):
        vm, z = _step(comm_stream=on)
        del log[:]
        got[on] = [read(call(vm, [z])[0]) for _ in range(4)]
        if not on:   # one stream: no fork, NCCL on the compute stream
            assert not [e for e in log if e[0] in ("record", "wait")]
            assert ("ncclAllReduce", COMPUTE, False) in log
    np.testing.assert_array_equal(np.array(got[True]), np.array(got[False]))


def test_a_fork_left_pending_is_joined_before_a_capture_and_before_it_forks_again(fake_world):
    from symgpu.gpu.runtime.comm_stream import Fork, comm_stream_of, join_pending
    ctx, log = fake_world
    comm = comm_stream_of(ctx)
    assert comm_stream_of(ctx) is comm
    fork = Fork(comm)
    keep = upload(ctx, np.ones(3))
    fork.begin()                      # a call that failed before its end and its join
    assert comm.pending == [fork]
    assert join_pending(ctx) == 1 and comm.pending == [] and not fork.pending
    s, d = fork.started, fork.done
    assert [e[:3] for e in log[-4:]] == [("record", s, COMPUTE), ("wait", COMM, s),
                                         ("record", d, COMM), ("wait", COMPUTE, d)]
    fork.begin()
    fork.end(keep)
    assert fork.keep == (keep,)
    fork.begin()                      # forked again while pending: joined first
    assert [e[:3] for e in log[-3:]] == [("wait", COMPUTE, d), ("record", s, COMPUTE),
                                         ("wait", COMM, s)]
    assert fork.keep == () and comm.pending == [fork]
    fork.join()
    fork.join()                       # joined: nothing more
    assert comm.pending == [] and log[-1][:3] == ("wait", COMPUTE, d)
    assert join_pending(type("NoComm", (), {})()) == 0


# ----------------------------------------------------------------------------- one GPU

@pytest.mark.gpu
def test_a_data_parallel_step_through_real_nccl_equals_the_one_stream_step(cuda, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    from symgpu.distributed.env import LaunchInfo
    from symgpu.gpu.ops.collectives import GpuAllReduce, NcclCommunicator
    from symgpu.gpu.ops.comm_join import GpuCommJoin
    comm = NcclCommunicator(LaunchInfo(), dist.SelfCommunicator(), 60.0, ctx=cuda)
    streams = []
    real_launch = comm.launch

    def launch(node, ctx, call, stream=None):
        streams.append(None if stream is None else int(stream.handle))
        return real_launch(node, ctx, call, stream)
    comm.launch = launch
    rng = np.random.RandomState(3)
    xs = rng.randn(6, 64, 5).astype("float32")
    ys = rng.randn(6, 64, 3).astype("float32")
    try:
        with dist.use_communicator(comm):
            results = {}
            for on in (True, False):
                streams.clear()
                f, params = _mlp_step(group="world", bucket_bytes=64,
                                      **{"distributed.comm_stream": on,
                                         "gpuarray.cuda_graphs": True})
                kinds = {type(n.op) for n in f.maker.fgraph.apply_nodes}
                assert GpuAllReduce in kinds and (GpuCommJoin in kinds) == on
                assert all(type(p.get_value(borrow=True, return_internal_type=True)).__name__
                           == "GpuArray" for p in params)
                costs = [float(f(x, y)) for x, y in zip(xs, ys)]  # plain, capture, replays
                st = f.vm.runner.stats()
                assert st["captures"] >= 1 and st["replays"] >= 1, st
                results[on] = (costs, [p.get_value() for p in params])
                comm_handle = cuda.comm.handle if on else None
                assert streams and set(streams) == {comm_handle}, streams
            if cuda.comm is not None:
                assert cuda.comm.pending == []
        for a, b in zip(results[True][1], results[False][1]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-5)
        assert int(comm.counters[1]) >= 8 and comm.error is None     # NCCL really ran
    finally:
        comm.close()


def test_gpu_parameters_gradients_are_reduced_in_their_own_type(vgpu):
    # T.grad of a GPU parameter is a GPU variable (HostFromGpu's gradient uploads): the
    # reduced gradient replacing it in the updates must be one too
    from symgpu.gpu.ops.collectives import GpuAllReduce
    from symgpu.gpu.ops.comm_join import GpuCommJoin
    from symgpu.gpu.placement.type import GpuArrayType
    W = GpuArrayType("float32", (False, False), None)("W")
    x = T.fmatrix("x")
    cost = (T.dot(x, W.transfer("cpu")) ** 2).sum()
    (g,) = T.grad(cost, [W])
    assert isinstance(g.type, GpuArrayType)
    (new,) = [v for _, v in dist.data_parallel([(W, W - 0.1 * g)], grads=[g],
                                                params=[np.zeros((3, 2), "float32")],
                                                group="self")]
    f = function([x, W], new)
    kinds = [type(n.op) for n in f.maker.fgraph.apply_nodes]
    assert GpuAllReduce in kinds and GpuCommJoin in kinds


def test_a_join_in_a_later_segment_is_joined_at_the_end_of_the_forks_capture(fake_world):
    # w + 1 goes to the host and back (plain steps) before the sum that reads the
    # all-reduce.  The runner's plan puts the join with the collective, before the host
    # work (a capture must join its forks anyway); a plan with the join in the second
    # segment has the first capture join the fork itself (comm_stream.join_pending)
    from graph_fakes import FakeScalarUp, FakeToHost
    from symgpu.gpu.exec import graphs
    from symgpu.gpu.ops.collectives import GpuAllReduce
    from symgpu.gpu.ops.comm_join import GpuCommJoin, gpu_comm_joins
    ctx, log = fake_world
    x, w = gvec(), gvec()
    s = FakeToHost()(add1()(w)).sum()
    z = FakeElemwise("add", np.add)(GpuAllReduce("sum", "world")(x), FakeScalarUp(6)(s))
    fg = FunctionGraph([x, w], [z], clone=False)
    fg.update_mapping = {}
    assert gpu_comm_joins(fg) == 1
    xv, wv = upload(ctx, np.arange(6.0)), upload(ctx, np.full(6, 3.0))
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [xv], w: [wv]}, allow_gc=True)
    at = {type(n.op).__name__: i for i, n in enumerate(vm.nodes)}
    segments = [{i for i, _, _ in seg.items} for seg in vm.runner.segments]
    assert at["GpuCommJoin"] in segments[0] and at["GpuAllReduce"] in segments[0]
    want = np.arange(6.0) + 24
    plans = [None, [("segment", [at["GpuAllReduce"], at["FakeKernelOp"]]),
                    ("plain", [at["FakeToHost"]]), ("plain", [at["CAReduce"]]),
                    ("segment", [at["FakeScalarUp"], at["GpuCommJoin"], at["FakeElemwise"]])]]
    for plan in plans:
        if plan is not None:
            vm.runner = graphs.Runner(vm, plan, ctx)
        del log[:]
        for _ in range(5):
            np.testing.assert_array_equal(read(call(vm, [z])[0]), want)
            assert ctx.comm.pending == []
        st = vm.runner.stats()
        assert st["captures"] == 2 and st["replays"] >= 2, st
        begins = [i for i, e in enumerate(log) if e[0] == "begin"]
        captures = [log[b:next(i for i in range(b, len(log)) if log[i][0] == "end")]
                    for b in begins]
        for inside in captures:    # every fork of a capture is joined before it ends
            forks = [t for t in inside if t[0] == "wait" and t[1] == COMM]
            joins = [t for t in inside if t[0] == "wait" and t[1] == COMPUTE]
            assert len(forks) == len(joins), inside
        assert sum(("wait", COMPUTE, 102, True) in c for c in captures) == 1
