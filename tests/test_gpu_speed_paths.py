"""The GPU fast paths: whole-function CUDA graphs (symgpu/gpu/graphs.py), the pinned host
pool (symgpu/gpu/pool.py) and the VM's runner hook.

Most of it runs on the CPU: the graph runner is driven by a fake context, pool and driver whose
"kernels" are Python closures over a fake device memory (a capture records them, a replay runs
them), so keys, ownership, ping-pong, fallbacks and results are checked without a GPU.  The
tests marked ``gpu`` check, on a real device, that results are the same with cuda_graphs on and
off and that a captured function replays.
"""
from __future__ import annotations

import gc
import warnings
from contextlib import nullcontext

import numpy as np
import pytest

from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.gpu import graphs
from symgpu.gpu.pool import DevicePool, PinnedPool, size_class
from symgpu.link.vm import link

CTX = "fake-graphs"


# ============================================================================ fakes

class FakeDriver:
    """Capture records launches; a graph launch runs them in order."""

    def __init__(self) -> None:
        self.capturing = False
        self.recorded: list = []
        self.launches = 0
        self.fail_next_capture = False

    def launch_kernel(self, fn) -> None:
        if self.capturing:
            self.recorded.append(fn)
        else:
            fn()

    # the graphs._Driver interface
    def begin(self, stream):
        assert not self.capturing
        self.capturing, self.recorded = True, []

    def end(self, stream):
        self.capturing = False
        if self.fail_next_capture:
            self.fail_next_capture = False
            return None, "cuStreamEndCapture failed: operation not permitted when capturing"
        return list(self.recorded), None

    def instantiate(self, graph):
        return ("exe", graph)

    def launcher(self, exe, stream):
        def go():
            self.launches += 1
            for fn in exe[1]:
                fn()
            return 0
        return go

    def destroy(self, exe, graph):
        pass

    def node_count(self, graph):
        return len(graph)

    def check(self, status, what):
        if status:
            raise RuntimeError(what)

    def relaxed(self):
        return nullcontext()

    def copy(self, dst, src):
        assert dst.size == src.size and dst.is_c_contiguous and src.is_c_contiguous
        d, s_, n = dst.ptr, src.ptr, src.size

        def k():
            MEM[d][:n] = MEM[s_][:n]
        self.launch_kernel(k)

    def to_host(self, arrays):
        return [read(a) if a.size else np.empty(a.shape, a.dtype) for a in arrays]


MEM: dict[int, np.ndarray] = {}


class _FakeAlloc:
    def __init__(self, ptr):
        self.ptr = ptr

    def __int__(self):
        return self.ptr

    def free(self):
        MEM.pop(self.ptr, None)


class FakePool(DevicePool):
    next_ptr = 0x10000

    def _device_alloc(self, nbytes):
        ptr = FakePool.next_ptr
        FakePool.next_ptr += max(nbytes, 512) + 512
        MEM[ptr] = np.full(max(nbytes, 4) // 4, np.nan, dtype="float32")
        self.n_device_allocs += 1
        return _FakeAlloc(ptr)


class FakeCtx:
    virtual = False
    name = CTX
    device = "cuda0"
    ordinal = 0
    arch = "sm_90"
    stream_handle = 7
    pinned = None
    total_memory = 1 << 30

    def __init__(self):
        self.pool = FakePool(self, 0.0)

    def activate(self):
        return self

    def synchronize(self):
        pass


def read(a) -> np.ndarray:
    return MEM[a.ptr][: a.size].reshape(a.shape).copy()


def upload(ctx, values) -> object:
    from symgpu.gpu.elemwise import new_array
    values = np.asarray(values, dtype="float32")
    a = new_array(ctx, values.shape, values.dtype)
    if a.size:
        MEM[a.ptr][: a.size] = values.reshape(-1)
    return a


class FakeKernelOp(Op):
    """out = f(inputs) elementwise, through the fake driver; optionally in place on input 0
    and with a scratch buffer (as GpuCAReduce's partial sums)."""

    __props__ = ("name", "inplace", "scratch", "fail_when_capturing", "lie_when_captured")

    def __init__(self, name, fn, inplace=False, scratch=False, fail_when_capturing=False,
                 lie_when_captured=False):
        self.name, self.fn, self.inplace, self.scratch = name, fn, inplace, scratch
        self.fail_when_capturing = fail_when_capturing
        self.lie_when_captured = lie_when_captured
        if inplace:
            self.destroy_map = {0: [0]}

    def __str__(self):
        return f"Fake{self.name}"

    def make_node(self, *xs):
        return Apply(self, list(xs), [xs[0].type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.elemwise import new_array
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        ctx, drv, fn = CTX_OBJ, DRV, self.fn

        def thunk():
            if self.fail_when_capturing and drv.capturing:
                raise RuntimeError("operation not permitted when stream is capturing")
            xs = [c[0] for c in ins]
            if xs[0].shape != xs[-1].shape:
                raise ValueError(f"shapes differ: {xs[0].shape} {xs[-1].shape}")
            o = xs[0] if self.inplace else new_array(ctx, xs[0].shape, np.dtype("float32"))
            ptrs, n, optr = [x.ptr for x in xs], xs[0].size, o.ptr
            if n == 0:
                out[0] = o
                return
            if self.scratch:
                tmp = new_array(ctx, xs[0].shape, np.dtype("float32"))
                tptr = tmp.ptr

                def k1():
                    MEM[tptr][:n] = fn(*[MEM[p][:n] for p in ptrs])

                def k2():
                    MEM[optr][:n] = MEM[tptr][:n]
                drv.launch_kernel(k1)
                drv.launch_kernel(k2)
            else:
                lie = 1.0 if self.lie_when_captured and drv.capturing else 0.0

                def k():
                    MEM[optr][:n] = fn(*[MEM[p][:n] for p in ptrs]) + lie
                drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


class FakeToHost(Op):
    """Not capturable: reads device memory on the host."""

    __props__ = ()

    def make_node(self, x):
        from symgpu.tensor.type import TensorType
        return Apply(self, [x], [TensorType("float32", x.type.broadcastable)()])

    def perform(self, node, inputs, out):
        out[0][0] = read(inputs[0])


CTX_OBJ: FakeCtx = None  # type: ignore[assignment]
DRV: FakeDriver = None   # type: ignore[assignment]


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    global CTX_OBJ, DRV
    from symgpu.gpu import context as gctx
    CTX_OBJ, DRV = FakeCtx(), FakeDriver()
    gctx.register_context(CTX, CTX_OBJ)
    monkeypatch.setattr(graphs, "_driver", DRV)
    yield CTX_OBJ
    gctx.unregister_context(CTX)
    MEM.clear()


def gvec():
    from symgpu.gpu.type import GpuArrayType
    return GpuArrayType("float32", (False,), CTX)()


def add1():
    return FakeKernelOp("add1", lambda a: a + 1)


def mul2(**kw):
    return FakeKernelOp("mul2", lambda a: a * 2, **kw)


def call(vm, out_vars):
    """What Function.__call__ does around the VM: run, take the outputs, empty their cells."""
    vm()
    res = [vm.storage_map[v][0] for v in out_vars]
    for v in out_vars:
        vm.storage_map[v][0] = None
    return res


# ============================================================================ decisions

def test_capturability_comes_from_the_thunk_or_the_op():
    from symgpu.gpu.basic_ops import GpuDimShuffle, GpuShape_i, HostFromGpu
    x = gvec()
    y = add1()(x)
    node = y.owner
    thunk = node.op.make_thunk(node, {v: [None] for v in node.inputs + node.outputs}, {}, [])
    assert graphs.node_capturable(node, thunk) and graphs.node_launches(node, thunk)

    def plain():
        pass
    assert not graphs.node_capturable(node, plain)          # the op says nothing
    ds = GpuDimShuffle((False,), ("x", 0))(x).owner
    assert graphs.node_capturable(ds, plain) and not graphs.node_launches(ds, plain)
    sh = GpuShape_i(0)(x).owner
    assert graphs.node_capturable(sh, plain)
    h = HostFromGpu()(x).owner
    assert not graphs.node_capturable(h, plain)


def test_capturability_of_the_real_gpu_thunk_markers():
    from symgpu.gpu import blas, elemwise
    assert elemwise._capturable(lambda: None).capturable
    from symgpu.gpu.basic_ops import GpuAlloc, GpuFromHost, GpuToGpu, HostFromGpu
    for op_cls in (GpuAlloc, GpuFromHost, GpuToGpu, HostFromGpu):
        assert not getattr(op_cls, "capturable", False), op_cls
    assert blas.GpuAllocEmpty.capturable

    class Scal:  # device pointer mode fed by a host value: an upload each call
        device, const, is_gpu = True, [None, 0.0], [False, False]
    assert not blas._blas_capturable(lambda: None, Scal()).capturable
    Scal.is_gpu = [True, False]
    assert blas._blas_capturable(lambda: None, Scal()).capturable
    assert blas._blas_capturable(lambda: None, None).capturable


def test_one_element_uploads_are_capturable_memsets():
    """GpuFromHost of a one-element host value (x.shape[0] as a float, a scalar input) is a
    memset recorded into the graph, keyed on the value; bigger uploads stay plain."""
    from symgpu.gpu.basic_ops import GpuFromHost, _ScalarUploadThunk
    from symgpu.tensor.type import TensorType
    for bcast in ((), (True,), (True, True)):
        node = GpuFromHost(None)(TensorType("float64", bcast)()).owner
        assert graphs.node_capturable(node, _ScalarUploadThunk)
        assert graphs.node_launches(node, _ScalarUploadThunk)
    big = GpuFromHost(None)(TensorType("float32", (False, False))()).owner
    assert not graphs.node_capturable(big, None)


def test_a_node_reading_a_big_host_input_is_not_capturable():
    from symgpu.tensor.type import TensorType

    class HostIn(Op):
        capturable = True

        def make_node(self, x, h):
            return Apply(self, [x, h], [x.type()])
    x = gvec()
    assert graphs.node_capturable(HostIn()(x, TensorType("int64", ())()).owner, None)
    assert graphs.node_capturable(HostIn()(x, TensorType("int64", (False,))()).owner, None)
    assert not graphs.node_capturable(HostIn()(x, TensorType("float32", (False, False))()).owner,
                                      None)


def test_schedule_puts_host_work_first_and_transfers_last():
    x = gvec()
    a = add1()(x)                 # 0 launch
    h1 = FakeToHost()(a)          # 1 tail (after a launch)
    b = mul2()(a)                 # 2 launch
    h0 = FakeToHost()(x)          # 3 head (no launch before it)
    c = add1()(b)                 # 4 launch
    h2 = FakeToHost()(c)          # 5 tail
    nodes = [a.owner, h1.owner, b.owner, h0.owner, c.owner, h2.owner]
    capt = [True, False, True, False, True, False]
    launches = capt
    order = graphs.schedule(nodes, capt, launches)
    assert [nodes[i] for i in order] == [h0.owner, a.owner, b.owner, c.owner, h1.owner,
                                         h2.owner]
    steps = graphs.plan_steps(nodes, capt, launches, [not c for c in capt])
    assert steps == [("plain", [3]), ("segment", [0, 2, 4]), ("batch", [1, 5])]


def test_plan_keeps_view_only_runs_plain_and_splits_at_dependencies():
    from symgpu.gpu.basic_ops import GpuDimShuffle
    x = gvec()
    v = GpuDimShuffle((False,), (0,))(x)           # a view: capturable, no launch
    h = FakeToHost()(v)
    nodes = [v.owner, h.owner]
    assert graphs.plan_steps(nodes, [True, False], [False, False], [False, False]) == \
        [("plain", [0]), ("plain", [1])]
    # a launch that needs a host result computed after another launch: two segments
    a = add1()(x)
    h = FakeToHost()(a)

    class NeedsHost(Op):
        def make_node(self, x, h):
            return Apply(self, [x, h], [x.type()])
    b = NeedsHost()(a, h)
    nodes = [a.owner, h.owner, b.owner]
    assert graphs.plan_steps(nodes, [True, False, True], [True, False, True],
                             [False, False, False]) == \
        [("segment", [0]), ("plain", [1]), ("segment", [2])]


def test_graph_keys():
    ctx = CTX_OBJ
    a, b = upload(ctx, [1, 2, 3]), upload(ctx, [4, 5, 6])
    key = graphs.make_keyer([True, True])
    assert key([a, b]) == key([a, b])
    assert key([a, b]) != key([b, a])
    assert key([a, b]) != key([a[:2], b])                       # shape
    assert key([a, b]) != key([a[::2], b])                      # strides
    assert key([a, b]) == key([a._view(a.ptr, a.shape, a.strides), b])  # same memory
    hk = graphs.make_keyer([True, False])
    assert hk([a, np.int64(3)]) == hk([a, np.int64(3)])
    assert hk([a, np.int64(3)]) != hk([a, np.int64(4)])
    assert hk([a, np.asarray([3, 4])]) != hk([a, np.asarray([3, 5])])
    assert hk([a, 0.5]) != hk([a, np.float32(0.5)])             # the type is part of it
    with pytest.raises(graphs.Unkeyable):
        hk([a, np.zeros(1000)])
    with pytest.raises(AttributeError):
        key([a, None])


def test_graph_driver_calls_the_driver_api_with_the_right_arguments(monkeypatch):
    import ctypes
    from symgpu.gpu import graph_driver
    calls = []

    class Fn:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args):
            calls.append((self.name, args))
            if self.name == "cuStreamEndCapture":
                args[1]._obj.value = 0x1234
            if self.name == "cuGraphInstantiateWithFlags":
                args[0]._obj.value = 0x5678
            return 0

    class Lib:
        def __init__(self, missing=()):
            self.missing = missing

        def __getattr__(self, name):
            if name in self.missing:
                raise AttributeError(name)
            fn = Fn(name)
            setattr(self, name, fn)
            return fn
    monkeypatch.setattr(graph_driver.ctypes, "CDLL", lambda name: Lib({"cuGraphGetNodes"}))
    monkeypatch.setattr(graph_driver.ctypes, "PyDLL", lambda name: Lib())
    d = graph_driver.CudaGraphDriver()
    d.begin(77)
    name, args = calls[-1]
    assert name == "cuStreamBeginCapture_v2" and args[0].value == 77 and args[1] == 1
    graph, err = d.end(77)
    assert err is None and graph.value == 0x1234
    exe = d.instantiate(graph)
    assert exe.value == 0x5678 and calls[-1][1][2] == 1      # auto-free on launch
    assert d.launcher(exe, 77)() == 0
    name, args = calls[-1]
    assert name == "cuGraphLaunch" and args[0] is exe and args[1].value == 77
    with d.relaxed():
        assert calls[-1][0] == "cuThreadExchangeStreamCaptureMode"
    assert calls[-1][0] == "cuThreadExchangeStreamCaptureMode"
    assert d.node_count(graph) == -1                          # optional entry point missing
    d.destroy(exe, graph)
    assert [c[0] for c in calls[-2:]] == ["cuGraphExecDestroy", "cuGraphDestroy"]
    assert isinstance(ctypes.c_void_p(), ctypes.c_void_p)


# ============================================================================ pinned pool

def fake_pinned(cap=8 << 20, limit=4 << 20):
    made = []

    def alloc(n):
        made.append(n)
        return np.zeros(n, np.uint8)
    return PinnedPool(alloc, cap=cap, lease_limit=limit), made


def test_pinned_pool_recycles_a_result_when_it_is_collected():
    pool, made = fake_pinned()
    dt = np.dtype("float32")
    r = None
    for i in range(50):
        r = pool.empty((230400,), dt)      # the previous r is alive during the call
        r[:] = i
    assert made == [size_class(4 * 230400)] * 2
    s = pool.stats()
    assert s["n_leases"] == 50 and s["n_reused"] == 48 and s["bytes_leased"] == size_class(
        4 * 230400)
    v = r[10:20]            # a view keeps the buffer leased
    del r
    gc.collect()
    assert pool.stats()["bytes_leased"] == size_class(4 * 230400)
    assert v[0] == 49
    del v
    gc.collect()
    assert pool.stats()["bytes_leased"] == 0


def test_pinned_pool_shapes_dtypes_and_limits():
    pool, made = fake_pinned(cap=(3 << 20) + 4096, limit=1 << 20)
    a = pool.empty((3, 4, 5), np.dtype("float64"))
    assert a.shape == (3, 4, 5) and a.dtype == np.float64 and a.flags.c_contiguous
    assert a.flags.writeable
    z = pool.empty((), np.dtype("int32"))
    assert z.shape == () and z.dtype == np.int32
    assert pool.empty((0,), np.dtype("float32")) is None          # nothing to pin
    assert pool.empty(((1 << 20) // 4 + 1,), np.dtype("float32")) is None  # over the limit
    held = [pool.empty(((1 << 20) // 4,), np.dtype("float32")) for _ in range(4)]
    assert held[-1] is None                                       # over the cap
    assert pool.stats()["n_refused"] == 3
    del held
    gc.collect()
    # cached buffers of another class are dropped to make room under the cap
    b = [pool.empty((200000,), np.dtype("float32")) for _ in range(3)]
    assert all(x is not None for x in b)
    assert pool.stats()["bytes_pinned"] <= (3 << 20) + 4096 and pool.stats()["n_freed"] >= 1
    assert pool.release_cached() >= 0


def test_pinned_pool_distinct_live_results_do_not_share_memory():
    pool, _ = fake_pinned()
    xs = [pool.empty((1000,), np.dtype("float32")) for _ in range(5)]
    for i, x in enumerate(xs):
        x[:] = i
    assert [float(x[0]) for x in xs] == [0, 1, 2, 3, 4]


# ============================================================================ the runner

def linked(inputs, outputs, values, allow_gc=True, updates=None):
    """Link a GPU graph as function() would; ``updates`` is the FunctionGraph's
    update_mapping {output index: input index}."""
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = dict(updates or {})
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage, allow_gc=allow_gc)
    return vm, fg


def test_check1_like_function_captures_then_replays_alternating_two_graphs():
    ctx = CTX_OBJ
    x = gvec()
    y = mul2()(add1()(x))
    xv = upload(ctx, np.arange(5))
    vm, fg = linked([x], [y], [xv])
    assert isinstance(vm.runner, graphs.Runner)
    want = (np.arange(5) + 1) * 2
    r = None
    for i in range(8):
        (r,) = call(vm, [y])               # the previous r is still held meanwhile
        np.testing.assert_array_equal(read(r), want)
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 2 and st["replays"] == 5, st
    assert st["graphs"] == 2 and st["nodes_captured"] == 2
    allocs = ctx.pool.n_device_allocs
    for i in range(10):
        (r,) = call(vm, [y])
    assert ctx.pool.n_device_allocs == allocs      # no allocation in the steady state
    assert vm.runner.stats()["replays"] == 15


def test_results_the_caller_keeps_are_never_overwritten():
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    xv = upload(ctx, np.zeros(3))
    vm, fg = linked([x], [y], [xv])
    kept = []
    for i in range(12):
        MEM[xv.ptr][:3] = i
        (r,) = call(vm, [y])
        kept.append(r)
    for i, r in enumerate(kept):
        np.testing.assert_array_equal(read(r), np.full(3, i + 1))
    st = vm.runner.stats()
    assert st["graphs"] == graphs.MAX_GRAPHS and st["plain"] >= 12 - graphs.MAX_GRAPHS


def test_scratch_memory_of_a_graph_is_never_handed_out():
    ctx = CTX_OBJ
    x = gvec()
    y = FakeKernelOp("sq", lambda a: a * a, scratch=True)(x)
    xv = upload(ctx, [1, 2, 3])
    vm, fg = linked([x], [y], [xv])
    users = []
    for i in range(6):
        MEM[xv.ptr][:3] = [i, i + 1, i + 2]
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), np.array([i, i + 1, i + 2]) ** 2)
        u = upload(ctx, [7, 7, 7])      # the caller's own arrays, from the same pool
        users.append(u)
        del r
    for u in users:
        np.testing.assert_array_equal(read(u), [7, 7, 7])
    assert vm.runner.stats()["replays"] >= 3


def test_new_pointers_or_shapes_run_plainly_then_get_their_own_graph():
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    a, b = upload(ctx, [1, 2]), upload(ctx, [5, 6, 7])
    vm, fg = linked([x], [y], [a])
    cell = vm.storage_map[x]
    for v, want in [(a, [2, 3]), (b, [6, 7, 8]), (a, [2, 3]), (b, [6, 7, 8]), (a, [2, 3]),
                    (b, [6, 7, 8])]:
        cell[0] = v
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), want)
        del r
    st = vm.runner.stats()
    assert st["plain"] == 2 and st["captures"] == 2 and st["replays"] == 2, st


def test_in_place_update_of_an_input_keeps_its_pointer():
    ctx = CTX_OBJ
    w = gvec()
    w2 = mul2(inplace=True)(w)
    wv = upload(ctx, [1, 1])
    vm, fg = linked([w], [w2], [wv])
    for i in range(6):
        (r,) = call(vm, [w2])
        assert r is wv
    np.testing.assert_array_equal(read(wv), [64, 64])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] == 4, st


def test_feeding_a_result_back_as_the_next_input():
    """Without an update mapping (a bare VM) the new value's buffer belongs to a graph and the
    keys move with it: results stay right, graphs stay bounded."""
    ctx = CTX_OBJ
    w = gvec()
    w2 = mul2(inplace=True)(add1()(w))
    wv = upload(ctx, [1, 1])
    vm, fg = linked([w], [w2], [wv])
    for i in range(16):
        (r,) = call(vm, [w2])
        vm.storage_map[w][0] = r          # the update: the new value is the next input
    want = 1.0
    for i in range(16):
        want = 2 * (want + 1)
    np.testing.assert_array_equal(read(vm.storage_map[w][0]), [want, want])
    st = vm.runner.stats()
    assert st["graphs"] <= graphs.MAX_GRAPHS and st["replays"] >= 1, st


def function_like_updates(vm, out_var, in_var, n):
    """What Function does for ``updates={in_var: out_var}``: run, swap the new value in,
    empty the update's cell (the caller holds nothing)."""
    cell = vm.storage_map[in_var]
    for _ in range(n):
        vm()
        cell[0] = vm.storage_map[out_var][0]
        vm.storage_map[out_var][0] = None


def test_updates_are_copied_back_so_shared_pointers_never_move():
    ctx = CTX_OBJ
    b = gvec()
    b2 = add1()(b)                         # not in place: a new buffer each call
    vm, fg = linked([b], [b2], [upload(ctx, [0, 0, 0])], updates={0: 0})
    assert vm.runner.segments[0].copy_back
    ptr = vm.storage_map[b][0].ptr
    function_like_updates(vm, b2, b, 1)        # a plain call copies back too
    assert vm.storage_map[b][0].ptr == ptr
    function_like_updates(vm, b2, b, 9)
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [10, 10, 10])
    first = id(vm.storage_map[b][0])        # (holding the array would block the copy back)
    function_like_updates(vm, b2, b, 10)
    assert id(vm.storage_map[b][0]) == first   # the same array: the graph wrote into it
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [20, 20, 20])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] >= 16, st


def test_an_update_whose_old_value_is_held_elsewhere_is_not_overwritten():
    ctx = CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    vm, fg = linked([b], [b2], [upload(ctx, [0])], updates={0: 0})
    function_like_updates(vm, b2, b, 4)
    borrowed = vm.storage_map[b][0]          # get_value(borrow=True)
    function_like_updates(vm, b2, b, 3)
    np.testing.assert_array_equal(read(borrowed), [4])
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [7])
    del borrowed
    function_like_updates(vm, b2, b, 3)
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [10])


def test_no_copy_back_when_something_that_can_fail_runs_after_the_segment():
    ctx = CTX_OBJ
    b = gvec()
    b2 = add1()(b)

    class HostStep(Op):   # a plain node after the segment, not a transfer
        def make_node(self, x):
            from symgpu.tensor.type import TensorType
            return Apply(self, [x], [TensorType("float32", (False,))()])

        def perform(self, node, inputs, out):
            out[0][0] = read(inputs[0])
    h = HostStep()(b2)
    vm, fg = linked([b], [b2, h], [upload(ctx, [0])], updates={0: 0})
    assert not vm.runner.segments[0].copy_back


def test_outputs_read_by_a_host_node_and_views_of_inputs():
    from symgpu.gpu.basic_ops import GpuDimShuffle
    ctx = CTX_OBJ
    x = gvec()
    a = add1()(x)
    v = GpuDimShuffle((False,), ("x", 0))(x)      # a view of the input, an output
    h = FakeToHost()(a)
    xv = upload(ctx, [1, 2, 3])
    vm, fg = linked([x], [h, v], [xv])
    kinds = [k for k, _ in graphs.plan_steps(vm.nodes, [True, False, True], [True, False, False],
                                             [False] * 3)]
    assert "segment" in kinds
    for i in range(5):
        MEM[xv.ptr][:3] = [i, i, i]
        hv, vv = call(vm, [h, v])
        np.testing.assert_array_equal(hv, [i + 1] * 3)
        assert vv.shape == (1, 3) and vv.ptr == xv.ptr
    assert vm.runner.stats()["replays"] == 3


def test_empty_arrays_and_views_of_constants_are_rebuilt():
    from symgpu.gpu.basic_ops import GpuDimShuffle
    from symgpu.gpu.type import GpuArrayConstant, GpuArrayType
    ctx = CTX_OBJ
    x = gvec()
    c = GpuArrayConstant(GpuArrayType("float32", (False,), CTX), upload(ctx, [5, 6]))
    y = add1()(x)
    v = GpuDimShuffle((False,), ("x", 0))(c)
    z = add1()(v)
    vm, fg = linked([x], [y, v, z], [upload(ctx, np.zeros(0))])
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for i in range(6):
            yv, vv, zv = call(vm, [y, v, z])
            assert yv.shape == (0,) and vv.shape == (1, 2)
            np.testing.assert_array_equal(read(vv), [[5, 6]])
            np.testing.assert_array_equal(read(zv), [[6, 7]])
    assert vm.runner.stats()["replays"] == 3


class FakeUpload(Op):
    """GpuFromHost-like: not capturable, a fresh pool buffer every call (a constant upload)."""

    __props__ = ("value",)

    def __init__(self, value):
        self.value = value

    def make_node(self, like):
        return Apply(self, [like], [like.type()])

    def perform(self, node, inputs, out):
        from symgpu.gpu.elemwise import new_array
        a = new_array(CTX_OBJ, inputs[0].shape, np.dtype("float32"))
        MEM[a.ptr][: a.size] = self.value
        out[0][0] = a


def test_update_written_in_place_into_an_upload_still_replays():
    """The logistic regression's shape on the GPU: b_new is computed in place into a buffer
    uploaded each call (GpuFromHost of a constant), the result goes to the host, and small
    intermediates share the uploads' size class.  The uploads' pointers must stay stable for
    the segment's key to repeat, whatever the captures take from the pool."""
    ctx = CTX_OBJ
    b = gvec()
    up = FakeUpload(0.05)(b)
    t = add1()(b)                                           # an intermediate, same class
    b_new = FakeKernelOp("sub", lambda u, t_, b_: b_ - u * t_, inplace=True)(up, t, b)
    h = FakeToHost()(mul2()(t))
    bv = upload(ctx, [1.0])
    vm, fg = linked([b], [h, b_new], [bv])
    cell = vm.storage_map[b]
    want_b = 1.0
    for i in range(40):
        hv, new = call(vm, [h, b_new])
        np.testing.assert_allclose(hv, [2 * (want_b + 1)], rtol=1e-5)
        want_b = want_b - 0.05 * (want_b + 1)
        np.testing.assert_allclose(read(new), [want_b], rtol=1e-5)
        cell[0] = new                                       # the update
    st = vm.runner.stats()
    assert st["replays"] >= 30 and st["graphs"] <= 4, st


class HostFromGpu(FakeToHost):
    """A fake copy to the host under the real one's class name (the runner lets updates be
    copied back when only such copies follow a segment)."""


def test_logistic_regression_shaped_step_settles_on_one_graph():
    """The shape of the tutorial's training step on the GPU: per-call uploads (the length N
    and the constant 0.01, which b's update overwrites in place), a weight update into fresh
    memory, a reduction with scratch memory, a result copied to the host; every buffer of the
    size class the uploads use.  Keys must settle (stable uploads, updates copied back) and
    every result stay right."""
    ctx = CTX_OBJ
    w, b = gvec(), gvec()
    up_n, up_c = FakeUpload(4.0)(b), FakeUpload(0.01)(b)
    t = add1()(w)
    s_ = FakeKernelOp("scr", lambda a: a * 3, scratch=True)(t)
    w_new = FakeKernelOp("wupd", lambda w_, s2: w_ - 0.01 * s2)(w, s_)
    b_new = FakeKernelOp("bupd", lambda u, s2, b_: b_ - u * s2, inplace=True)(up_c, s_, b)
    h = HostFromGpu()(FakeKernelOp("pred", lambda s2, n: s2 / n)(s_, up_n))
    vm, fg = linked([w, b], [h, w_new, b_new], [upload(ctx, [0.5]), upload(ctx, [0.25])],
                    updates={1: 0, 2: 1})
    kinds = [type(st).__name__ for st in vm.runner.steps]
    assert kinds == ["_StablePlainStep", "_StablePlainStep", "Segment", "_PlainStep"], kinds
    hw, hb = 0.5, 0.25
    for i in range(30):
        vm()
        got = vm.storage_map[h][0]
        cells = [vm.storage_map[v] for v in (h, w_new, b_new)]
        new_w, new_b = cells[1][0], cells[2][0]
        for c in cells:
            c[0] = None
        vm.storage_map[w][0], vm.storage_map[b][0] = new_w, new_b
        s_val = (hw + 1) * 3
        np.testing.assert_allclose(got, [s_val / 4.0], rtol=1e-5)
        hw, hb = hw - 0.01 * s_val, hb - 0.01 * s_val
        np.testing.assert_allclose(read(new_w), [hw], rtol=1e-5)
        np.testing.assert_allclose(read(new_b), [hb], rtol=1e-5)
        del got, new_w, new_b, cells
    st = vm.runner.stats()
    assert st == {"segments": 1, "plain": 1, "captures": 1, "replays": 28, "graphs": 1,
                  "nodes_captured": 8}, st   # 6 kernels, 2 copies back


def test_allow_gc_false_still_replays():
    ctx = CTX_OBJ
    x = gvec()
    h = FakeToHost()(mul2()(add1()(x)))
    xv = upload(ctx, [1, 2])
    vm, fg = linked([x], [h], [xv], allow_gc=False)
    for i in range(5):
        (hv,) = call(vm, [h])
        np.testing.assert_array_equal(hv, [4, 6])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] == 3, st


def test_a_capture_error_warns_once_and_falls_back_for_the_function():
    ctx = CTX_OBJ
    x = gvec()
    y = FakeKernelOp("bad", lambda a: a + 3, fail_when_capturing=True)(x)
    xv = upload(ctx, [1])
    vm, fg = linked([x], [y], [xv])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(5):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [4])
    msgs = [m for m in w if issubclass(m.category, graphs.GraphCaptureWarning)]
    assert len(msgs) == 1 and "capturing" in str(msgs[0].message)
    assert not vm.runner.enabled and vm.runner.stats()["plain"] == 5


def test_a_graph_that_disagrees_with_plain_launches_is_dropped():
    ctx = CTX_OBJ
    x = gvec()
    y = FakeKernelOp("liar", lambda a: a * 2, lie_when_captured=True, inplace=True)(
        add1()(x))
    xv = upload(ctx, [1, 2])
    vm, fg = linked([x], [y], [xv])
    with pytest.warns(graphs.GraphCaptureWarning, match="differ from plain"):
        for i in range(5):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [4, 6])
            np.testing.assert_array_equal(read(xv), [1, 2])
    assert not vm.runner.enabled and vm.runner.stats()["graphs"] == 0


def test_segments_with_large_inputs_are_never_captured(monkeypatch):
    monkeypatch.setattr(graphs, "VERIFY_LIMIT", 8)
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    vm, fg = linked([x], [y], [upload(ctx, [1, 2, 3])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(6):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [2, 3, 4])
    st = vm.runner.stats()
    assert st["captures"] == 0 and st["plain"] == 6 and vm.runner.enabled


def test_without_verification_the_capture_call_runs_once(monkeypatch):
    monkeypatch.setattr(graphs, "VERIFY", False)
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    vm, fg = linked([x], [y], [upload(ctx, [1])])
    for i in range(4):
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [2])
        del r
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 2 and not vm.runner.verify


def test_an_end_capture_error_falls_back_too():
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    xv = upload(ctx, [1])
    vm, fg = linked([x], [y], [xv])
    DRV.fail_next_capture = True
    with pytest.warns(graphs.GraphCaptureWarning):
        for i in range(4):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [2])
    assert not vm.runner.enabled


def test_a_users_own_error_propagates_and_leaves_graphs_on():
    ctx = CTX_OBJ
    x, z = gvec(), gvec()
    y = FakeKernelOp("add", lambda a, b: a + b)(x, z)
    a, b = upload(ctx, [1, 2]), upload(ctx, [1, 2, 3])
    vm, fg = linked([x, z], [y], [a, b])
    for _ in range(3):
        with pytest.raises(ValueError, match="shapes differ"):
            vm()
    assert vm.runner.enabled
    vm.storage_map[z][0] = upload(ctx, [10, 20])
    for _ in range(4):
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [11, 22])
    assert vm.runner.stats()["replays"] >= 1


def test_flag_off_and_profiling_use_the_plain_vm():
    ctx = CTX_OBJ
    x = gvec()
    y = add1()(x)
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": False}):
        vm = link(fg, {x: [upload(ctx, [1])]})
    assert vm.runner is None
    vm, fg = linked([x], [y], [upload(ctx, [1])])
    calls = []
    vm.profiler = lambda v: calls.append(v)
    vm()
    assert calls == [vm] and vm.runner.stats()["plain"] == 0


def test_virtual_contexts_get_no_runner():
    from symgpu.gpu.rewriting import virtual_context
    from symgpu.gpu.type import GpuArrayType
    with virtual_context("virt-graphs"):
        x = GpuArrayType("float32", (False,), "virt-graphs")()
        y = add1()(x)
        vm = link(FunctionGraph([x], [y], clone=False), {x: [None]})
    assert vm.runner is None


def test_a_failing_vm_hook_never_breaks_linking(monkeypatch):
    from symgpu.link import vm as vm_mod

    def broken(vm):
        raise RuntimeError("boom")
    monkeypatch.setattr(vm_mod, "VM_HOOKS", [broken])
    x = gvec()
    with pytest.warns(RuntimeWarning, match="boom"):
        vm = link(FunctionGraph([x], [add1()(x)], clone=False), {x: [upload(CTX_OBJ, [1])]})
    assert vm.runner is None
    vm()


def test_errors_inside_a_segment_name_the_node():
    ctx = CTX_OBJ
    x, z = gvec(), gvec()
    y = FakeKernelOp("add", lambda a, b: a + b)(x, z)
    vm, fg = linked([x, z], [y], [upload(ctx, [1]), upload(ctx, [1, 2])])
    with pytest.raises(ValueError) as info:
        vm()
    assert "Apply node that caused the error: Fakeadd" in str(info.value)


def test_gpu_event_timers_are_registered_for_gpu_nodes():
    from symgpu.compile import profiling
    from symgpu.gpu import event_timers
    from symgpu.gpu.basic_ops import HostFromGpu
    x = gvec()
    h = HostFromGpu()(x).owner
    assert event_timers.is_gpu_node(h)
    assert not event_timers.is_gpu_node(FakeToHost()(x).owner)
    assert any(f is event_timers.event_timer for _, f in profiling.TIMERS)


class FakeView(Op):
    __props__ = ()
    view_map = {0: [0]}
    def make_node(self, x):
        return Apply(self, [x], [x.type()])
    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        i, o = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        def thunk():
            x = i[0]
            o[0] = x._view(x.ptr, x.shape, x.strides)
        thunk.capturable = True
        thunk.launches = False
        return thunk

def test_update_of_a_variable_read_through_a_plain_view_replays():
    """The training step's shape: b.dimshuffle('x') is a plain (view-only) step before the
    segment, so the view (a segment input dying in it) holds b's memory while the capture
    decides whether b's update may be copied back into b.  It must not block the copy back."""
    ctx = CTX_OBJ
    b = gvec()
    bv = FakeView()(b)
    up = FakeUpload(0.1)(bv)
    t = add1()(bv)
    b_new = FakeKernelOp("bupd", lambda u, t_, b_: t_ - u, inplace=True)(up, t, b)
    h = HostFromGpu()(mul2()(t))
    vm, fg = linked([b], [h, b_new], [upload(ctx, [1.0])], updates={1: 0})
    ptr = vm.storage_map[b][0].ptr
    want = 1.0
    for i in range(20):
        vm()
        got = vm.storage_map[h][0]
        new = vm.storage_map[b_new][0]
        vm.storage_map[h][0] = vm.storage_map[b_new][0] = None
        vm.storage_map[b][0] = new
        np.testing.assert_allclose(got, [2 * (want + 1)], rtol=1e-5)
        want = want + 1 - 0.1
        np.testing.assert_allclose(read(new), [want], rtol=1e-5)
        del new, got
    st = vm.runner.stats()
    assert st["replays"] >= 17 and st["graphs"] == 1, st
    assert vm.storage_map[b][0].ptr == ptr     # copied back in the graph too


# ============================================================================ on a GPU

def _real_gpu():
    from symgpu.gpu.context import gpu_available
    return gpu_available()


gpu = [pytest.mark.gpu, pytest.mark.skipif("not _real_gpu()")]


def _gpu_functions(flag: bool):
    import symgpu
    import symgpu.tensor as T
    from symgpu import Out, shared
    from symgpu.gpu.basic_ops import gpu_from_host
    rng = np.random.default_rng(5)
    with config.change_flags(**{"gpuarray.cuda_graphs": flag}):
        xs = shared(rng.random(230400).astype("float32"), target=GPU_CTX)
        check_dev = symgpu.function([], Out(gpu_from_host(T.exp(xs), GPU_CTX), borrow=True))
        check_host = symgpu.function([], T.exp(xs))
        X = shared(rng.standard_normal((400, 784)).astype("float32"), target=GPU_CTX)
        Y = shared(rng.integers(0, 2, 400).astype("float32"), target=GPU_CTX)
        w = shared(rng.standard_normal(784).astype("float32"), target=GPU_CTX)
        b = shared(np.asarray(0.0, dtype="float32"), target=GPU_CTX)
        p1 = 1 / (1 + T.exp(-T.dot(X, w) - b))
        xent = -Y * T.log(p1) - (1 - Y) * T.log(1 - p1)
        cost = T.cast(xent.mean(), "float32") + 0.01 * (w ** 2).sum()
        gw, gb = T.grad(cost, [w, b])
        train = symgpu.function([], [p1 > 0.5, xent], updates=[(w, w - 0.1 * gw),
                                                               (b, b - 0.1 * gb)])
    return check_dev, check_host, train, w, b


GPU_CTX = "speed-paths-test"


@pytest.fixture
def real_ctx(monkeypatch):
    from symgpu.gpu import context as gctx
    # the autouse fake_gpu fixture installs the fake driver: a real device needs the real one
    # (the fake's copy looked device pointers up in MEM: "KeyError: <device pointer>")
    monkeypatch.setattr(graphs, "_driver", None)
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(GPU_CTX, c)
    yield c
    gctx.unregister_context(GPU_CTX)


@pytest.mark.gpu
@pytest.mark.skipif("not _real_gpu()", reason="needs a usable NVIDIA GPU")
def test_gpu_results_equal_with_and_without_graphs_and_replays_happen(real_ctx, monkeypatch):
    monkeypatch.setattr(graphs, "_driver", None)          # the real driver
    on = _gpu_functions(True)
    off = _gpu_functions(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for step in range(12):
            r_on, r_off = on[0](), off[0]()
            np.testing.assert_allclose(np.asarray(r_on), np.asarray(r_off), rtol=1e-6)
            np.testing.assert_allclose(on[1](), off[1](), rtol=1e-6)
            p_on, x_on = on[2]()
            p_off, x_off = off[2]()
            assert np.mean(p_on != p_off) < 0.01     # a borderline p1 may round differently
            np.testing.assert_allclose(x_on, x_off, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(on[3].get_value(), off[3].get_value(), rtol=1e-4,
                                       atol=1e-5)
            np.testing.assert_allclose(on[4].get_value(), off[4].get_value(), rtol=1e-4,
                                       atol=1e-5)
    for f in on[:3]:
        assert f.vm.runner is not None, f.maker.fgraph.toposort()
        st = f.vm.runner.stats()
        # check1 on the device alternates two graphs (the caller holds the last result);
        # the training step keeps one: its uploads are recycled, its updates copied back
        assert st["replays"] >= 8 and st["graphs"] <= 2 and f.vm.runner.enabled, \
            (st, f.vm.runner.disabled_reason, f.maker.fgraph.toposort())
    for f in off[:3]:
        assert f.vm.runner is None
    ptr = on[3].container.storage[0].ptr
    on[2]()
    assert on[3].container.storage[0].ptr == ptr   # w keeps its buffer


@pytest.mark.gpu
@pytest.mark.skipif("not _real_gpu()", reason="needs a usable NVIDIA GPU")
def test_gpu_host_results_land_in_the_pinned_pool(real_ctx):
    import symgpu
    import symgpu.tensor as T
    from symgpu import shared
    xs = shared(np.linspace(-1, 1, 230400).astype("float32"), target=GPU_CTX)
    f = symgpu.function([], T.exp(xs))
    for _ in range(3):   # past the capture, whose check reads the results twice more
        r = f()
    before = real_ctx.pinned.stats()
    for _ in range(20):
        r = f()
    after = real_ctx.pinned.stats()
    assert after["n_allocs"] - before["n_allocs"] <= 1
    assert after["n_leases"] - before["n_leases"] == 20
    np.testing.assert_allclose(r, np.exp(np.linspace(-1, 1, 230400).astype("float32")),
                               rtol=1e-6)
    assert isinstance(r, np.ndarray) and type(r) is np.ndarray and r.flags.writeable


@pytest.mark.gpu
@pytest.mark.skipif("not _real_gpu()", reason="needs a usable NVIDIA GPU")
def test_gpu_profiled_function_uses_events_and_no_graphs(real_ctx):
    import symgpu
    import symgpu.tensor as T
    from symgpu import shared
    from symgpu.compile.profiling import ProfileStats
    xs = shared(np.ones(1 << 20, dtype="float32"), target=GPU_CTX)
    prof = ProfileStats(atexit_print=False)
    f = symgpu.function([], T.exp(xs) * 2, profile=prof)
    for _ in range(3):
        f()
    assert prof.fct_callcount == 3 and prof.thunk_time > 0
    if f.vm.runner is not None:
        assert f.vm.runner.stats()["captures"] == 0


@pytest.mark.gpu
@pytest.mark.skipif("not _real_gpu()", reason="needs a usable NVIDIA GPU")
def test_gpu_logistic_regression_step_is_one_graph(real_ctx, monkeypatch):
    """The tutorial's training step: its constants are kernel literals and its one
    shape-derived scalar (N) a memset inside the graph, so a call is one graph replay."""
    monkeypatch.setattr(graphs, "_driver", None)
    train = _gpu_functions(True)[2]
    for _ in range(6):
        train()
    st = train.vm.runner.stats()
    assert st["segments"] == 1 and st["replays"] >= 3, \
        (st, [str(n.op) for n in train.maker.fgraph.toposort()])


@pytest.mark.gpu
@pytest.mark.skipif("not _real_gpu()", reason="needs a usable NVIDIA GPU")
def test_gpu_scalar_uploads_in_graphs_follow_the_value(real_ctx, monkeypatch):
    """A scalar input uploaded by memset: each value gets its own graph, replays give that
    value's result (float64 0.1 needs two word memsets), and shape-derived scalars too."""
    import symgpu
    import symgpu.tensor as T
    from symgpu import Out, shared
    from symgpu.gpu.basic_ops import gpu_from_host
    monkeypatch.setattr(graphs, "_driver", None)
    xs = shared(np.arange(6.0), target=GPU_CTX)
    s = T.dscalar("s")
    f = symgpu.function([s], Out(gpu_from_host(xs * s / xs.shape[0], GPU_CTX), borrow=True))
    for v in (0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.1, -2.5, 0.1):
        np.testing.assert_allclose(np.asarray(f(v)), np.arange(6.0) * v / 6, rtol=1e-15)
    st = f.vm.runner.stats()
    assert st["replays"] >= 3 and st["segments"] == 1, st
