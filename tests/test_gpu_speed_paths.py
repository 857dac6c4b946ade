"""The GPU fast paths around the CUDA-graph runner: planning whole-function CUDA graphs
(which nodes, in which order, keys: symgpu/gpu/exec/graph_plan.py through graphs.py), the driver's
ctypes calls (graph_driver.py), the profiler's event timers (event_timers.py), the pinned host
pool (symgpu/gpu/runtime/pool.py), and, marked ``gpu``, checks on a real device that results are the
same with cuda_graphs on and off and that a captured function replays.

The CPU tests use the fakes of tests/graph_fakes.py; the runner itself (captures, replays,
fallbacks) is tested with them in test_gpu_graph_runner.py.
"""
from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeToHost, add1, gvec, mul2, upload
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs
from symgpu.gpu.runtime.pool import PinnedPool, size_class


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


# ============================================================================ decisions

def test_capturability_comes_from_the_thunk_or_the_op():
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuShape_i, HostFromGpu
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
    from symgpu.gpu.ops import blas, elemwise
    assert elemwise._capturable(lambda: None).capturable
    from symgpu.gpu.placement.basic_ops import GpuAlloc, GpuFromHost, GpuToGpu, HostFromGpu
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
    from symgpu.gpu.placement.basic_ops import GpuFromHost, _ScalarUploadThunk
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


def test_a_host_check_runs_after_the_launches_that_do_not_need_it():
    """A host check that overlaps launches (``overlaps_launches``: scan_to_dnn_rnn's
    PrefixGuard, numpy over the caller's mask) runs after a first segment of the launches
    that do not read it, so that its host time overlaps theirs; the work that reads it and
    every write in place (a check that raises leaves the buffers as they were) wait for it.
    Any other host work still runs before the first launch."""
    from graph_fakes import FakeHostScale
    from symgpu.tensor.type import TensorType

    class Check(Op):
        def make_node(self, h):
            return Apply(self, [h], [h.type()])

    class OverlappingCheck(Check):
        overlaps_launches = True

    for check, plan in ((OverlappingCheck, [("segment", [0, 1]), ("plain", [2]),
                                            ("segment", [3, 4])]),
                        (Check, [("plain", [2]), ("segment", [0, 1, 3, 4])])):
        x, h = gvec(), TensorType("float32", ())()
        a = add1()(x)                          # 0 a launch that needs no check
        a2 = add1()(x)                         # 1 another, written in place below
        c = check()(h)                         # 2 the check
        b = FakeHostScale()(a, c)              # 3 reads the check's result
        w = mul2(inplace=True)(a2)             # 4 writes in place: after the check
        nodes = [a.owner, a2.owner, c.owner, b.owner, w.owner]
        capt = [True, True, False, True, True]
        assert graphs.plan_steps(nodes, capt, capt, [False] * 5) == plan, check


def test_plan_keeps_view_only_runs_plain_and_splits_at_dependencies():
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
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


def test_views_not_read_by_host_work_join_the_segment():
    """Only the shape reads that host work needs run before it; a view the kernels read
    (``b.dimshuffle('x')`` of a GPU scalar) waits and joins the segment, where a replay
    skips its Python (issue 18: 5 us per call on an H100 as a plain step)."""
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    x = gvec()
    v = GpuDimShuffle((False,), (0,))(x)           # 0 a view the kernel reads
    s = FakeToHost()(x)                            # 1 host work at the head
    a = add1()(v)                                  # 2 launch
    nodes = [v.owner, s.owner, a.owner]
    assert graphs.plan_steps(nodes, [True, False, True], [False, False, True],
                             [False, False, False]) == [("plain", [1]), ("segment", [0, 2])]
    w = GpuDimShuffle((False,), (0,))(x)           # a view that host work reads runs first
    h = FakeToHost()(w)
    b = add1()(x)
    nodes = [w.owner, h.owner, b.owner]
    assert graphs.plan_steps(nodes, [True, False, True], [False, False, True],
                             [False, False, False]) == \
        [("plain", [0]), ("plain", [1]), ("segment", [2])]


def test_graph_keys():
    ctx = fakes.CTX_OBJ
    a, b = upload(ctx, [1, 2, 3]), upload(ctx, [4, 5, 6])
    key = graphs.make_keyer([True, True])
    assert key([a, b]) == key([a, b])
    assert key([a, b]) == key([b, a])                           # not the pointers
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
    pk = graphs.make_keyer([True, True], by_pointer=[True, False])   # kept moving: pointer
    assert pk([a, b]) != pk([b, a]) and pk([a, b]) == pk([a, a])


def test_graph_fetchers_read_the_cells_and_key_them_as_the_keyers_do():
    """make_fetcher: the straight-line GPU-only case and the general one give the cells'
    values and a key that tells apart what make_keyer's does (and raise as it does)."""
    from symgpu.gpu.exec import graph_plan
    ctx = fakes.CTX_OBJ
    a, b = upload(ctx, [1, 2, 3]), upload(ctx, [4, 5, 6])
    n = graph_plan._UNROLLED_KEYS
    for gpu in ([True], [True, True], [True] * n, [True] * (n + 1)):   # n + 1: the loop
        cells = [[a] for _ in gpu]
        fetch, key = graph_plan.make_fetcher(cells, gpu), graphs.make_keyer(gpu)
        vals, k = fetch()
        assert vals == [a] * len(gpu)
        firsts = []
        for other in (b, a[:2], a[::2]):   # same layout; another shape; other strides
            cells[0][0] = other
            vals2, k2 = fetch()
            assert vals2[0] is other
            assert (k2 == k) == (key(vals2) == key(vals)), (gpu, other.shape)
            firsts.append(k2 == k)
        assert firsts == [True, False, False]
        cells[0][0] = None
        with pytest.raises(AttributeError):
            fetch()
    cells = [[a], [b]]
    pointer = graph_plan.make_fetcher(cells, [True, True], by_pointer=[True, False])
    k = pointer()[1]
    cells[0][0], cells[1][0] = b, a
    assert pointer()[1] != k                       # kept moving: the pointer counts


def test_graph_driver_calls_the_driver_api_with_the_right_arguments(monkeypatch):
    import ctypes
    from symgpu.gpu.exec import graph_driver
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
    monkeypatch.setattr(graph_driver.libcuda, "cdll", lambda: Lib({"cuGraphGetNodes"}))
    monkeypatch.setattr(graph_driver.libcuda, "pydll", lambda: Lib())
    # the ctypes replay call (the C runtime's is tested below with a real C function)
    monkeypatch.setattr(graph_driver.c_runtime, "pointer_pair_caller", lambda: None)
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


def test_graph_launcher_calls_the_entry_point_through_the_c_runtime():
    """Where the C runtime builds, a replay calls cuGraphLaunch's address with the graph's
    and the stream's handles through call_pp (no ctypes): checked with libc's strcmp in
    cuGraphLaunch's place (two pointers in, an int status out)."""
    import ctypes
    from symgpu.gpu.exec import graph_driver
    from symgpu.link import c_runtime
    if c_runtime.pointer_pair_caller() is None:
        pytest.skip(f"no C runtime here: {c_runtime.unavailable_reason()}")
    d = graph_driver.CudaGraphDriver.__new__(graph_driver.CudaGraphDriver)
    d._launch = ctypes.PyDLL(None).strcmp
    exe_text, stream_text = ctypes.create_string_buffer(b"b"), ctypes.create_string_buffer(b"a")
    exe = ctypes.c_void_p(ctypes.addressof(exe_text))
    launch = d.launcher(exe, ctypes.addressof(stream_text))
    assert launch.func is c_runtime.pointer_pair_caller()
    assert launch() > 0                                  # strcmp("b", "a")
    stream_text.value = b"b"
    assert launch() == 0


def test_gpu_event_timers_are_registered_for_gpu_nodes():
    from symgpu.compile import profiling
    from symgpu.gpu.exec import event_timers
    from symgpu.gpu.placement.basic_ops import HostFromGpu
    x = gvec()
    h = HostFromGpu()(x).owner
    assert event_timers.is_gpu_node(h)
    assert not event_timers.is_gpu_node(FakeToHost()(x).owner)
    assert any(f is event_timers.event_timer for _, f in profiling.TIMERS)


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


# ============================================================================ on a GPU

def _real_gpu():
    from symgpu.gpu.runtime.context import gpu_available
    return gpu_available()


gpu = [pytest.mark.gpu, pytest.mark.skipif("not _real_gpu()")]


def _gpu_functions(flag: bool):
    import symgpu
    import symgpu.tensor as T
    from symgpu import Out, shared
    from symgpu.gpu.placement.basic_ops import gpu_from_host
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
    from symgpu.gpu.runtime import context as gctx
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
        assert not isinstance(f.vm.runner, graphs.Runner)
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
    if isinstance(f.vm.runner, graphs.Runner):
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
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    monkeypatch.setattr(graphs, "_driver", None)
    xs = shared(np.arange(6.0), target=GPU_CTX)
    s = T.dscalar("s")
    f = symgpu.function([s], Out(gpu_from_host(xs * s / xs.shape[0], GPU_CTX), borrow=True))
    for v in (0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.1, -2.5, 0.1):
        np.testing.assert_allclose(np.asarray(f(v)), np.arange(6.0) * v / 6, rtol=1e-15)
    st = f.vm.runner.stats()
    assert st["replays"] >= 3 and st["segments"] == 1, st


def test_region_writes_and_joins_are_capturable():
    """GpuIncSubtensor (a fused gate product's gradient is written slice by slice) and
    GpuJoin only take pool memory and queue copies or launches: a loop body or a function
    holding them is captured whole, not run step by step."""
    from symgpu.gpu.ops.subtensor import GpuIncSubtensor, GpuJoin

    def plain():
        pass
    from symgpu.gpu.placement.type import GpuArrayType
    from graph_fakes import CTX
    x, y = (GpuArrayType("float32", (False, False), CTX)() for _ in range(2))
    import symgpu.tensor as T
    host = T.inc_subtensor(T.matrix()[:, 0:2], T.matrix()).owner
    inc = GpuIncSubtensor(host.op.idx_list)(x, y, *host.inputs[2:]).owner
    assert graphs.node_capturable(inc, plain) and graphs.node_launches(inc, plain)
    join = GpuJoin(1)(x, y).owner
    assert graphs.node_capturable(join, plain) and graphs.node_launches(join, plain)
