"""Several GPUs in one process, on the CPU: placement and planning of a function on two
contexts, its runner (segments per device, every launch before the copies to the host, both
call locks), and GpuToGpu's copy between devices (runtime/peer.py) through a fake driver that
counts its calls: events recorded and waited on, never a host sync; peer access enabled once
per pair of devices.  The same on two real GPUs: tests/test_multigpu.py (pytest -m multigpu).

The fake contexts here are graph_fakes' FakeCtx on two devices (ordinals 0 and 1, streams 7
and 8); their "kernels" run on graph_fakes' fake memory when launched (a capture records them,
a graph launch runs them), and every launch, graph launch, copy to the host and context
switch is logged in ``LOG``.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import graph_fakes as fakes
import symgpu.tensor as T
from graph_fakes import MEM, FakeDriver, read, upload
from symgpu import function
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs
from symgpu.gpu.exec.graph_plan import plan_steps
from symgpu.gpu.placement.basic_ops import (TRANSFER_COUNTS, GpuToGpu, HostFromGpu,
                                            reset_transfer_counts)
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime import context as gctx
from symgpu.gpu.runtime import peer
from symgpu.gpu.runtime.array import GpuArray
from symgpu.link.vm import link

LOG: list = []


class DeviceCtx(fakes.FakeCtx):
    """graph_fakes' fake context on device ``cudaN`` with a stream and a CUcontext of its
    own; activating it makes it current in this thread (context.thread_state) and logs."""

    def __init__(self, name: str, ordinal: int) -> None:
        super().__init__()
        self.name, self.ordinal, self.device = name, ordinal, f"cuda{ordinal}"
        self.stream_handle = 7 + ordinal
        self.context_handle = 0x100 + ordinal

    def activate(self):
        if getattr(gctx.thread_state, "current", None) is not self:
            LOG.append(("activate", self.name))
            gctx.thread_state.current = self
        return self

    def synchronize(self):
        LOG.append(("synchronize", self.name))


class LoggingDriver(FakeDriver):
    """graph_fakes' graph driver; a graph launch is logged and must find its stream's
    context current (cuGraphLaunch runs in the current context)."""

    def launcher(self, exe, stream):
        go = super().launcher(exe, stream)

        def launch():
            cur = gctx.thread_state.current
            assert cur.stream_handle == stream, (cur.name, stream)
            LOG.append(("graph", cur.name))
            return go()
        return launch


class FakePeerDriver:
    """runtime/peer.py's driver on fake memory: counts calls, remembers the current context
    of each, copies at once (the fakes run work when it is queued)."""

    def __init__(self, can_access: bool = True, refuse: int = 0) -> None:
        self.can_access, self.refuse = can_access, refuse
        self.calls: list = []
        self.n_events = 0

    def _log(self, *what):
        cur = getattr(gctx.thread_state, "current", None)
        self.calls.append((*what, cur.name if cur is not None else None))
        LOG.append(("peer", what[0]))

    def can_access_peer(self, ordinal, peer_ordinal):
        self._log("can_access_peer", ordinal, peer_ordinal)
        return self.can_access

    def enable_peer_access(self, peer_context):
        self._log("enable_peer_access", peer_context)

    def event(self):
        self.n_events += 1
        self._log("event", self.n_events)
        return self.n_events

    def record(self, event, stream):
        self._log("record", event, stream)

    def wait(self, stream, event):
        self._log("wait", stream, event)

    def memcpy_peer(self, dst, dst_context, src, src_context, nbytes, stream):
        self._log("memcpy_peer", dst_context, src_context, nbytes, stream)
        if self.refuse:
            return self.refuse
        n = nbytes // 4
        MEM[dst][:n] = MEM[src][:n]
        return 0

    def named(self, what):
        return [c for c in self.calls if c[0] == what]


@pytest.fixture
def two_devices(monkeypatch):
    """Contexts 'da' (cuda0) and 'db' (cuda1), a logging graph driver and a fake peer
    driver; yields (ctx_a, ctx_b, peer driver)."""
    a, b = DeviceCtx("da", 0), DeviceCtx("db", 1)
    gctx.register_context("da", a)
    gctx.register_context("db", b)
    pdrv = FakePeerDriver()
    monkeypatch.setattr(graphs, "_driver", LoggingDriver())
    monkeypatch.setattr(peer, "_driver", pdrv)
    monkeypatch.setattr(peer, "_pairs", {})
    monkeypatch.setattr(peer, "_events", {})
    monkeypatch.setattr(peer, "_warned", [])
    monkeypatch.setattr(peer, "STATS", {k: 0 for k in peer.STATS})
    LOG.clear()
    yield a, b, pdrv
    gctx.unregister_context("da")
    gctx.unregister_context("db")
    gctx.thread_state.current = None
    MEM.clear()
    LOG.clear()


def gmat(name: str) -> object:
    return GpuArrayType("float32", (False,), name)()


class Kernel(Op):
    """out = fn(inputs) on the context of its output (a fake GPU op: activates its context,
    launches through the graph driver, logs the launch)."""

    __props__ = ("name",)

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def __str__(self):
        return f"Fake{self.name}"

    def make_node(self, *xs):
        return Apply(self, list(xs), [xs[0].type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        ctx = gctx.get_context(node.outputs[0].type.context_name)
        drv, fn = graphs._driver, self.fn

        def thunk():
            ctx.activate()
            xs = [c[0] for c in ins]
            o = new_array(ctx, xs[0].shape, np.dtype("float32"))
            ptrs, n, optr = [x.ptr for x in xs], xs[0].size, o.ptr
            for x in xs:
                assert x.context is ctx, "a kernel reads another device's memory"
            if not drv.capturing:
                LOG.append(("launch", ctx.name))

            def k():
                MEM[optr][:n] = fn(*[MEM[p][:n] for p in ptrs])
            drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


class ToHost(Op):
    """A copy to the host (not capturable): waits for its device, as HostFromGpu does."""

    __props__ = ()
    transfer = "download"

    def make_node(self, x):
        from symgpu.tensor.type import TensorType
        return Apply(self, [x], [TensorType("float32", x.type.broadcastable)()])

    def perform(self, node, inputs, out):
        LOG.append(("sync", inputs[0].context.name))
        out[0][0] = read(inputs[0])


def add1():
    return Kernel("add1", lambda a: a + 1)


def mul2():
    return Kernel("mul2", lambda a: a * 2)


def linked(inputs, outputs, values, graphs_on=True):
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = {}
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": graphs_on}):
        vm = link(fg, storage, allow_gc=True)
    return vm


def run(vm, outs):
    return fakes.call(vm, outs)


def launches_before_syncs(entries: list) -> bool:
    kinds = [k for k, _ in entries if k in ("launch", "graph", "sync")]
    if "sync" not in kinds:
        return True
    first_sync = kinds.index("sync")
    return all(k == "sync" for k in kinds[first_sync:])


# ============================================================================ planning

def test_the_seeds_two_products_get_one_segment_per_device_and_copies_last():
    """The seeds' program on two (virtual) devices: each product on its device, and the
    plan makes one segment per device (a CUDA graph is one device's), then the copies to the
    host, batched; without the devices the same nodes make one segment."""
    with config.change_flags(floatX="float32"), virtual_context("dev0", device="cuda0"), \
            virtual_context("dev1", device="cuda1"):
        m = GpuArrayType("float32", (False, False))
        v01, v02 = m.clone(context_name="dev0")("v01"), m.clone(context_name="dev0")("v02")
        v11, v12 = m.clone(context_name="dev1")("v11"), m.clone(context_name="dev1")("v12")
        f = function([v01, v02, v11, v12], [T.dot(v01, v02), T.dot(v11, v12)])
        nodes = f.maker.fgraph.toposort()
        products = [n for n in nodes if type(n.op).__name__ == "GpuDot22"]
        assert sorted(n.outputs[0].type.context_name for n in products) == ["dev0", "dev1"]
        devices = [_device_of(n) for n in nodes]
        capt = [type(n.op).__name__ == "GpuDot22" for n in nodes]
        batch = [isinstance(n.op, HostFromGpu) for n in nodes]
        steps = plan_steps(nodes, capt, capt, batch, devices)
        assert [k for k, _ in steps] == ["segment", "segment", "batch"]
        assert [{devices[i] for i in idx} for k, idx in steps[:2]] == [{0}, {1}]
        assert [k for k, _ in plan_steps(nodes, capt, capt, batch)] == ["segment", "batch"]


def _device_of(node) -> int:
    for v in list(node.outputs) + list(node.inputs):
        name = getattr(v.type, "context_name", "no")
        if name != "no" and isinstance(v.type, GpuArrayType):
            return gctx.get_context(name).ordinal
    return -1


def test_a_transfer_to_another_context_is_a_gpu_to_gpu_node():
    with config.change_flags(floatX="float32"), virtual_context("dev0", device="cuda0"), \
            virtual_context("dev1", device="cuda1"):
        m = GpuArrayType("float32", (False, False))
        a, b = m.clone(context_name="dev0")("a"), m.clone(context_name="dev0")("b")
        f = function([a, b], T.dot(a, b).transfer("dev1"))
        ops = [str(n.op) for n in f.maker.fgraph.toposort()]
        assert ops == ["GpuDot22", "GpuToGpu<dev1>"]
        out = f.maker.fgraph.outputs[0]
        assert out.type.context_name == "dev1" and isinstance(out.owner.op, GpuToGpu)


def test_interleaved_chains_make_one_segment_per_device_not_one_per_node():
    """Two chains of products whose topological order alternates between the devices: the
    schedule groups each device's ready nodes, so two segments, not one per node."""
    chain = _ChainGraph(8)
    devices = [i % 2 for i in range(8)]
    ones = [True] * 8
    steps = plan_steps(chain.nodes, ones, ones, [False] * 8, devices)
    assert [k for k, _ in steps] == ["segment", "segment"]
    assert [sorted(idx) for _, idx in steps] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [k for k, _ in plan_steps(chain.nodes, ones, ones, [False] * 8)] == ["segment"]


class _ChainGraph:
    """Two chains of ``n // 2`` nodes, alternating in topological order (node i reads node
    i - 2): enough for graph_plan.schedule (it reads inputs and owners)."""

    def __init__(self, n: int) -> None:
        class V:
            def __init__(self, owner):
                self.owner = owner

        class N:
            def __init__(self, inputs):
                self.inputs, self.outputs = inputs, []
        self.nodes: list = []
        for i in range(n):
            node = N([V(self.nodes[i - 2])] if i >= 2 else [])
            self.nodes.append(node)


# ============================================================================ the runner

def test_a_function_on_two_devices_launches_on_both_before_any_host_copy(two_devices):
    a, b, _ = two_devices
    xa, xb = gmat("da"), gmat("db")
    ya, yb = mul2()(add1()(xa)), mul2()(add1()(xb))
    ha, hb = ToHost()(ya), ToHost()(yb)
    va, vb = upload(a, np.arange(4)), upload(b, 10 + np.arange(4))
    vm = linked([xa, xb], [ha, hb], [va, vb])
    runner = vm.runner
    assert isinstance(runner, graphs.Runner) and runner.node_contexts is not None
    assert [seg.ctx for seg in runner.segments] == [a, b]
    for seg in runner.segments:   # each segment holds one device's nodes
        assert {runner.node_contexts[i] for i, _, _ in seg.items} == {seg.ctx}
    assert runner.locks == [a.call_lock, b.call_lock]
    for k in range(6):            # plain, capture, replays
        LOG.clear()
        ra, rb = run(vm, [ha, hb])
        np.testing.assert_array_equal(ra, (np.arange(4) + 1) * 2)
        np.testing.assert_array_equal(rb, (10 + np.arange(4) + 1) * 2)
        assert launches_before_syncs(LOG), (k, LOG)
        assert {n for kind, n in LOG if kind in ("launch", "graph")} == {"da", "db"}, LOG
        assert not [e for e in LOG if e[0] == "synchronize"]
    st = runner.stats()
    assert st["segments"] == 2 and st["replays"] >= 6, st
    assert [e for e in LOG if e[0] == "graph"] == [("graph", "da"), ("graph", "db")]


def test_without_cuda_graphs_the_plan_still_launches_everything_first(two_devices):
    """Graphs off: the same plan (a Runner whose segments run their thunks), in an order
    that puts a copy to the host of device a after device b's launches: a plain VM in
    topological order would wait for a before launching on b."""
    a, b, _ = two_devices
    xa, xb = gmat("da"), gmat("db")
    ha = ToHost()(add1()(xa))            # topological order: a's work, its copy, then b's
    hb = ToHost()(add1()(xb))
    vm = linked([xa, xb], [ha, hb], [upload(a, np.ones(3)), upload(b, np.zeros(3))],
                graphs_on=False)
    assert isinstance(vm.runner, graphs.Runner) and not vm.runner.enabled
    for _ in range(3):
        LOG.clear()
        ra, rb = run(vm, [ha, hb])
        np.testing.assert_array_equal(ra, np.full(3, 2.0))
        np.testing.assert_array_equal(rb, np.ones(3))
        assert launches_before_syncs(LOG), LOG
        assert not [e for e in LOG if e[0] == "graph"]


def test_each_segment_runs_with_its_own_context_current(two_devices):
    """A replay runs no thunk that would make its context current: the runner does
    (LoggingDriver asserts it at every graph launch), before each step on another device."""
    a, b, _ = two_devices
    xa, xb = gmat("da"), gmat("db")
    outs = [ToHost()(add1()(xa)), ToHost()(add1()(xb))]
    vm = linked([xa, xb], outs, [upload(a, np.ones(2)), upload(b, np.ones(2))])
    for _ in range(5):
        LOG.clear()
        run(vm, outs)
    assert LOG == [("activate", "da"), ("graph", "da"), ("activate", "db"), ("graph", "db"),
                   ("activate", "da"), ("sync", "da"), ("activate", "db"), ("sync", "db")]


def test_calls_from_two_threads_hold_both_contexts_locks(two_devices):
    a, b, _ = two_devices
    xa, xb = gmat("da"), gmat("db")

    class Checked(Kernel):
        def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
            inner = super().make_thunk(node, storage_map, compute_map, no_recycling)

            def thunk():
                assert a.call_lock.locked() and b.call_lock.locked()
                inner()
            thunk.capturable, thunk.launches = True, True
            return thunk
    outs = [ToHost()(Checked("add1", lambda v: v + 1)(xa)),
            ToHost()(Checked("add1", lambda v: v + 1)(xb))]
    vm = linked([xa, xb], outs, [upload(a, np.arange(3)), upload(b, np.arange(3))])
    lock = threading.Lock()
    errors: list = []
    results: list = []

    def worker():
        try:
            for _ in range(20):
                with lock:   # one frame's cells: the caller takes turns (frames do so)
                    results.append(run(vm, outs))
        except Exception as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 40
    for ra, rb in results:
        np.testing.assert_array_equal(ra, np.arange(3) + 1)
        np.testing.assert_array_equal(rb, np.arange(3) + 1)
    assert not a.call_lock.locked() and not b.call_lock.locked()


# ============================================================================ copies

def test_gpu_to_gpu_copies_on_the_consumer_stream_ordered_by_events(two_devices):
    """The copy: an event recorded on the producer's stream (its context current), the
    consumer's stream waits for it, cuMemcpyPeerAsync on the consumer's stream, an event
    behind it, and the producer's stream waits for that; no synchronisation anywhere."""
    a, b, pdrv = two_devices
    x = upload(a, np.arange(6))
    node = GpuToGpu("db")(gmat("da")).owner
    reset_transfer_counts()
    storage = {node.inputs[0]: [x], node.outputs[0]: [None]}
    thunk = node.op.make_thunk(node, storage, {}, [])
    thunk()
    y = storage[node.outputs[0]][0]
    assert isinstance(y, GpuArray) and y.context is b and y.ptr != x.ptr
    np.testing.assert_array_equal(read(y), np.arange(6))
    assert TRANSFER_COUNTS["gpu_to_gpu"] == 1
    ordering = [c for c in pdrv.calls if c[0] in ("record", "wait", "memcpy_peer")]
    ev_a = next(c[1] for c in ordering if c[0] == "record")
    ev_b = [c[1] for c in ordering if c[0] == "record"][1]
    assert ordering == [("record", ev_a, a.stream_handle, "da"),
                        ("wait", b.stream_handle, ev_a, "db"),
                        ("memcpy_peer", b.context_handle, a.context_handle, 24,
                         b.stream_handle, "db"),
                        ("record", ev_b, b.stream_handle, "db"),
                        ("wait", a.stream_handle, ev_b, "da")]
    assert not [e for e in LOG if e[0] == "synchronize"]
    assert peer.STATS["peer_copies"] == 1 and peer.STATS["host_copies"] == 0


def test_peer_access_is_enabled_once_per_pair_both_ways(two_devices):
    a, b, pdrv = two_devices
    for k in range(4):   # copies both ways
        src, dst = (a, b) if k % 2 == 0 else (b, a)
        y = peer.copy_array(upload(src, np.full(3, k)), dst)
        assert y.context is dst
        np.testing.assert_array_equal(read(y), np.full(3, k))
    enables = pdrv.named("enable_peer_access")
    # each side, once, with itself current: a reads b's memory and b reads a's
    assert sorted(enables) == sorted([("enable_peer_access", b.context_handle, "da"),
                                      ("enable_peer_access", a.context_handle, "db")])
    assert len(pdrv.named("can_access_peer")) == 2
    assert pdrv.n_events == 2      # one ordering event per context, made once
    assert peer.STATS == {"peer_copies": 4, "host_copies": 0, "pairs_enabled": 1}


def test_without_peer_access_the_copy_is_the_same_call_and_nothing_is_enabled(two_devices,
                                                                             monkeypatch):
    a, b, _ = two_devices
    pdrv = FakePeerDriver(can_access=False)
    monkeypatch.setattr(peer, "_driver", pdrv)
    y = peer.copy_array(upload(a, np.arange(5)), b)
    np.testing.assert_array_equal(read(y), np.arange(5))
    assert not pdrv.named("enable_peer_access") and len(pdrv.named("memcpy_peer")) == 1
    assert peer.STATS["pairs_enabled"] == 0 and peer.STATS["peer_copies"] == 1


def test_a_refused_copy_goes_through_the_host_with_one_warning(two_devices, monkeypatch):
    a, b, _ = two_devices
    monkeypatch.setattr(peer, "_driver", FakePeerDriver(refuse=801))
    monkeypatch.setattr(GpuArray, "get", lambda self: read(self))
    monkeypatch.setattr(peer, "to_gpu", lambda host, ctx: upload(ctx, host))
    with pytest.warns(peer.PeerCopyWarning, match="cuda0 to cuda1"):
        y = peer.copy_array(upload(a, np.arange(4)), b)
    np.testing.assert_array_equal(read(y), np.arange(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = peer.copy_array(upload(a, np.arange(4)), b)   # no second warning
    assert y.context is b and peer.STATS["host_copies"] == 2


def test_same_device_names_share_a_context_and_the_transfer_is_a_view(two_devices):
    a, _, pdrv = two_devices
    gctx.register_context("da2", a)   # 'da2' -> cuda0 as well
    try:
        x = upload(a, np.arange(3))
        node = GpuToGpu("da2")(gmat("da")).owner
        storage = {node.inputs[0]: [x], node.outputs[0]: [None]}
        node.op.make_thunk(node, storage, {}, [])()
        assert storage[node.outputs[0]][0] is x and not pdrv.calls
    finally:
        gctx.unregister_context("da2")


def test_a_pipeline_across_devices_runs_through_graphs_and_a_peer_copy(two_devices):
    """a: y = add1(x); copied to b; b: z = mul2(y): two segments (one per device) around
    the copy, replayed call after call, with the right values and no host sync."""
    a, b, pdrv = two_devices
    x = gmat("da")
    y = add1()(x)
    z = mul2()(GpuToGpu("db")(y))
    h = ToHost()(z)
    vm = linked([x], [h], [upload(a, np.arange(5))])
    runner = vm.runner
    assert [seg.ctx for seg in runner.segments] == [a, b]
    for k in range(6):
        LOG.clear()
        (r,) = run(vm, [h])
        np.testing.assert_array_equal(r, (np.arange(5) + 1) * 2)
        assert not [e for e in LOG if e[0] == "synchronize"]
        assert launches_before_syncs(LOG)
    assert runner.stats()["replays"] >= 3
    assert len(pdrv.named("memcpy_peer")) == 6
    assert len(pdrv.named("enable_peer_access")) == 2


# ============================================================================ timelines

def test_step_intervals_bracket_each_step_on_its_own_device(two_devices, monkeypatch):
    """symgpu.gpu.step_intervals on the fakes, PyCUDA's Event faked by a clock that each
    kernel advances by 1 ms (the fakes run a kernel when it is launched): one interval per
    device step, on its device, in run order; the runner's steps are put back after."""
    import sys
    import types
    from symgpu.gpu import overlap_ms, step_intervals
    a, b, _ = two_devices
    clock = [0.0]

    class Event:
        def record(self, stream=None):
            self.t = clock[0]

        def time_since(self, other):
            return self.t - other.t
    drv = types.ModuleType("pycuda.driver")
    drv.Event = Event
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)

    def tick(v):
        clock[0] += 1.0
        return v + 1
    xa, xb = gmat("da"), gmat("db")
    outs = [ToHost()(Kernel("tick", tick)(Kernel("tick", tick)(xa))),
            ToHost()(Kernel("tick", tick)(xb))]
    vm = linked([xa, xb], outs, [upload(a, np.zeros(2)), upload(b, np.zeros(2))])

    class Fn:
        def __init__(self):
            self.vm = vm

        def __call__(self):
            return run(vm, outs)
    fn = Fn()
    for _ in range(3):
        fn()
    steps, entry = list(vm.runner.steps), vm.runner.entry
    (ra, rb), iv = step_intervals(fn)
    np.testing.assert_array_equal(ra, np.full(2, 2.0))
    np.testing.assert_array_equal(rb, np.ones(2))
    assert [(i.label, i.device) for i in iv] == [("Faketick,Faketick", "cuda0"),
                                                 ("Faketick", "cuda1")]
    assert iv[0].end_ms - iv[0].start_ms == pytest.approx(2.0, abs=0.5)
    assert iv[1].end_ms - iv[1].start_ms == pytest.approx(1.0, abs=0.5)
    assert iv[1].start_ms == pytest.approx(2.0, abs=0.5)   # the fakes ran them in turn
    assert overlap_ms(iv[0], iv[1]) == 0.0
    assert overlap_ms(iv[0], iv[0]) == pytest.approx(2.0, abs=0.5)
    assert vm.runner.steps == steps and vm.runner.entry is not entry
    fn()   # the runner works as before
    with pytest.raises(TypeError, match="CUDA-graph runner"):
        step_intervals(lambda: None)


def test_a_pair_whose_peer_access_cannot_be_enabled_still_copies(two_devices, monkeypatch):
    """cuCtxEnablePeerAccess failing (too many peers...) leaves the pair without peer access,
    remembered; the copy is the same call (the driver stages it)."""
    from symgpu.gpu.runtime.libcuda import DriverError
    a, b, pdrv = two_devices

    def refuse(peer_context):
        pdrv._log("enable_peer_access", peer_context)
        raise DriverError("cuCtxEnablePeerAccess failed: too many peers", 711)
    monkeypatch.setattr(pdrv, "enable_peer_access", refuse)
    for _ in range(2):
        y = peer.copy_array(upload(a, np.arange(3)), b)
        np.testing.assert_array_equal(read(y), np.arange(3))
    assert len(pdrv.named("enable_peer_access")) == 1
    assert peer._pairs == {frozenset((0, 1)): False} and peer.STATS["pairs_enabled"] == 0
