"""Parallel kernel compilation before linking (symgpu/gpu/exec/prefetch.py, issue 7) and the
thread safety of the compile cache it relies on (symgpu/gpu/runtime/compiler.py).

Most tests replace nvcc by a counting fake (``compiler._run_nvcc``), so they need neither a
GPU nor nvcc; those marked ``nvcc`` run the real compiler, those marked ``gpu`` a device."""
from __future__ import annotations

import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.exec import prefetch
from symgpu.gpu.runtime import compiler
from symgpu.gpu.runtime.codegen import launch
from symgpu.gpu.runtime.context import register_context, unregister_context
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.gpu.ops.nnet import GpuArgmax
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.link import vm
from symgpu.scalar.basic import SCALAR_OPS as S

CTX = "prefetch-test"
KERNEL = 'extern "C" __global__ void twice(float *a, int n)\n' \
         '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] *= 2.0f; }\n'


@pytest.fixture(autouse=True)
def fresh(tmp_path):
    """An empty compiledir, no memory of earlier compiles or prefetches, a virtual context."""
    compiler.clear_memory_cache()
    prefetch.clear()
    register_context(CTX, device="cuda0", arch="sm_90")
    with config.change_flags(compiledir=str(tmp_path / "cache"), compile_log=False,
                             **{"nvcc.flags": ""}):
        yield tmp_path / "cache"
    unregister_context(CTX)
    compiler.clear_memory_cache()
    prefetch.clear()


class FakeNvcc:
    """Stands in for ``compiler._run_nvcc``: counts runs per source, can be slow, tracks how
    many ran at once, and fails for sources containing ``FAIL``."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sources: list[str] = []
        self.threads: set[str] = set()
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, source, options, arch, digest) -> bytes:
        with self.lock:
            self.sources.append(source)
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.delay)
            if "FAIL" in source:
                raise compiler.CompileError(f"nvcc failed (fake); source kept at /kept/{digest}.cu",
                                            "error: FAIL", f"/kept/{digest}.cu")
            return b"cubin:" + digest.encode()
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def fake_nvcc(monkeypatch):
    fake = FakeNvcc()
    monkeypatch.setattr(compiler, "_run_nvcc", fake)
    monkeypatch.setattr(compiler, "nvcc_version", lambda: "fake nvcc 1.0")
    return fake


def gvar(dtype: str = "float32", bcast: tuple = (False,)):
    return GpuArrayType(dtype, bcast, CTX)()


def graph_nodes() -> list:
    """GPU nodes of five distinct modules, one of them twice (same key, another op)."""
    x, y, m = gvar(), gvar(), gvar(bcast=(False, False))
    e = GpuElemwise(S["exp"])(x)
    a = GpuElemwise(S["add"])(e, y)
    a2 = GpuElemwise(S["add"], {0: 0})(gvar(), gvar())       # same signature as ``a``
    s = GpuCAReduce(S["add"], (1,))(m)
    mx = GpuCAReduce(S["maximum"], None)(a)
    am = GpuArgmax(0)(m)
    return [v.owner for v in (e, a, a2, s, mx, am)]


# ============================================================================ the protocol

def test_requests_follow_the_thunks_keys_once_each_in_run_order(fake_nvcc):
    nodes = graph_nodes()
    reqs = prefetch.requests(nodes, include_virtual=True)
    keys = [r.key for r in reqs]
    assert len(keys) == len(set(keys)) == 5
    assert [k[0] for k in keys] == ["symgpu.elemwise", "symgpu.elemwise", "symgpu.reduce",
                                    "symgpu.reduce", "symgpu.argmax"]
    # the first node of a key wins (as in get_kernel's memory): a's title, not a2's
    assert str(nodes[1].op) in reqs[1].source and str(nodes[2].op) not in reqs[1].source
    assert all(r.arch == "sm_90" and r.options == () for r in reqs)
    # what the thunks compile: the elemwise module of the node, the 1x1 reduction module
    assert reqs[0].source == nodes[0].op.kernel_sources(nodes[0])[0][1]
    assert reqs[2].key == ("symgpu.reduce", nodes[3].op.signature(nodes[3], 1, 1))
    # nodes on a virtual context compile nothing when linked: skipped unless asked
    assert prefetch.requests(nodes) == []


def test_blas_ops_with_a_broadcast_accumulator_prefetch_the_copy_kernel(fake_nvcc):
    """dot(x, w) + b fills the output with b by the strided-copy kernel: it is compiled with
    the function's kernels, not on the first call; a full-size y needs no kernel."""
    from symgpu.gpu.ops.blas import GpuGemm, GpuGemv
    a, x = gvar(bcast=(False, False)), gvar()
    b1 = gvar(bcast=(True,))
    gemv = GpuGemv()(b1, np.float32(1.0), a, x, np.float32(1.0)).owner
    full = GpuGemv()(gvar(), np.float32(1.0), a, x, np.float32(1.0)).owner
    gemm = GpuGemm()(gvar(bcast=(True, False)), np.float32(1.0), a, a, np.float32(1.0)).owner
    keys = [r.key for r in prefetch.requests([gemv, full, gemm], include_virtual=True)]
    # the copy kernel once, for gemv and gemm together; gemm's thin-product module too
    assert keys == [("symgpu.strided_copy",), ("symgpu.thin_gemm", "float32")]
    assert prefetch.requests([full], include_virtual=True) == []


def test_prefetch_compiles_every_source_once_in_parallel(fake_nvcc):
    fake_nvcc.delay = 0.3
    nodes = graph_nodes()
    res = prefetch.prefetch(nodes, include_virtual=True, max_workers=8)
    assert (res.requested, res.cached, res.compiled, res.failed) == (5, 0, 5, [])
    assert len(fake_nvcc.sources) == len(set(fake_nvcc.sources)) == 5
    assert fake_nvcc.most > 1, "the modules were compiled one after another"
    assert all(t.startswith("symgpu-nvcc") for t in fake_nvcc.threads)
    assert res.seconds < 5 * 0.3
    # the thunks then find every module compiled: no further nvcc run
    for r in prefetch.requests(nodes, include_virtual=True, skip_seen=False):
        assert compiler.compile_to_cubin(r.source, r.options, r.arch)[2]
    # a second prefetch of the same graph renders and compiles nothing
    assert prefetch.requests(nodes, include_virtual=True) == []
    assert prefetch.prefetch(nodes, include_virtual=True).requested == 0
    assert len(fake_nvcc.sources) == 5


def test_background_start_returns_at_once_and_thunks_wait_for_their_module(fake_nvcc, fresh):
    """The link hook's way (wait=False): compiles start on the nvcc threads and the call
    returns before they end; a compile_to_cubin of one of them waits for that compile (no
    second nvcc run, none in the caller's thread), and the entries land in the compiledir
    of the moment they were started even if the flag changes meanwhile."""
    fake_nvcc.delay = 0.4
    nodes = graph_nodes()
    t0 = time.perf_counter()
    res = prefetch.prefetch(nodes, include_virtual=True, wait=False)
    assert time.perf_counter() - t0 < 0.4 and (res.requested, res.compiled) == (5, 5)
    with config.change_flags(compiledir=str(fresh) + "-elsewhere"):
        for r in prefetch.requests(nodes, include_virtual=True, skip_seen=False):
            _, cubin, hit = compiler.compile_to_cubin(r.source, r.options, r.arch)
            assert hit and cubin.startswith(b"cubin:")
    assert len(fake_nvcc.sources) == len(set(fake_nvcc.sources)) == 5
    assert all(t.startswith("symgpu-nvcc") for t in fake_nvcc.threads), fake_nvcc.threads
    assert len(list(Path(fresh, "kernels").glob("*/*.cubin"))) == 5
    assert not Path(str(fresh) + "-elsewhere").exists()
    # nothing in flight any more, nothing left to start
    assert compiler._in_flight == {}
    assert prefetch.prefetch(nodes, include_virtual=True, wait=False).requested == 0


def test_a_background_failure_is_raised_by_the_nodes_own_compile(fake_nvcc):
    bad = prefetch.KernelRequest("bad", "// FAIL\n" + KERNEL, (), "sm_90")
    good = prefetch.KernelRequest("good", "// fine\n" + KERNEL, (), "sm_90")
    prefetch.start_requests([bad, good])
    with pytest.raises(compiler.CompileError, match="source kept at"):
        compiler.compile_to_cubin(bad.source)
    assert compiler.compile_to_cubin(good.source)[2]
    assert fake_nvcc.sources.count(bad.source) == 2 and fake_nvcc.sources.count(good.source) == 1


def test_clearing_the_memory_waits_for_background_compiles(fake_nvcc):
    fake_nvcc.delay = 0.3
    req = prefetch.KernelRequest("k", f"// {uuid.uuid4()}\n{KERNEL}", (), "sm_90")
    prefetch.start_requests([req])
    compiler.clear_memory_cache()
    assert compiler._in_flight == {} and compiler._cubin_memo == {}
    assert compiler.is_cached(req.source)   # on disk, found without nvcc
    assert len(fake_nvcc.sources) == 1


def test_workers_are_bounded_by_the_cpus(fake_nvcc, monkeypatch):
    monkeypatch.setattr(prefetch, "_cpu_count", lambda: 2)
    fake_nvcc.delay = 0.1
    res = prefetch.prefetch(graph_nodes(), include_virtual=True)
    assert res.workers == 2 and fake_nvcc.most <= 2 and res.compiled == 5


def test_warm_cache_runs_no_nvcc(fake_nvcc, monkeypatch):
    nodes = graph_nodes()
    assert prefetch.prefetch(nodes, include_virtual=True).compiled == 5
    # a fresh process: nothing in memory, every entry on disk
    compiler.clear_memory_cache()
    prefetch.clear()

    def no_nvcc(*args):
        raise AssertionError("nvcc ran on a warm cache")
    monkeypatch.setattr(compiler, "_run_nvcc", no_nvcc)
    res = prefetch.prefetch(nodes, include_virtual=True)
    assert (res.requested, res.cached, res.compiled, res.workers) == (5, 5, 0, 0)
    for r in prefetch.requests(nodes, include_virtual=True, skip_seen=False):
        _, cubin, hit = compiler.compile_to_cubin(r.source, r.options, r.arch)
        assert hit and cubin.startswith(b"cubin:")


def test_a_failure_is_left_to_the_node(fake_nvcc):
    good = prefetch.KernelRequest("good", "// fine\n" + KERNEL, (), "sm_90")
    bad = prefetch.KernelRequest("bad", "// FAIL\n" + KERNEL, (), "sm_90")
    res = prefetch.compile_requests([good, bad])
    assert res.compiled == 1 and len(res.failed) == 1
    req, exc = res.failed[0]
    assert req is bad and isinstance(exc, compiler.CompileError)
    # the node's own compile raises it as usual (and the good one is a hit)
    with pytest.raises(compiler.CompileError, match="source kept at"):
        compiler.compile_to_cubin(bad.source)
    assert compiler.compile_to_cubin(good.source)[2]


def test_concurrent_compiles_of_one_source_run_nvcc_once(fake_nvcc, fresh):
    fake_nvcc.delay = 0.2
    src = f"// {uuid.uuid4()}\n{KERNEL}"
    barrier = threading.Barrier(6)
    results: list = []

    def go() -> None:
        barrier.wait()
        results.append(compiler.compile_to_cubin(src))
    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_nvcc.sources) == 1
    assert len({(p, c) for p, c, _ in results}) == 1
    assert sorted(hit for _, _, hit in results) == [False] + [True] * 5
    assert len(list(Path(fresh, "kernels").glob("*/*.cubin"))) == 1


def test_load_kernels_renders_a_module_once(monkeypatch):
    """Each kernel of a module misses get_kernel's memory; the source is rendered once."""
    renders = []

    def fake_get_kernel(key, source_factory, fn_name, options=(), context=None):
        source_factory()
        return object()

    class Ctx:
        stream, stream_handle = None, 0

        def activate(self):
            return self
    monkeypatch.setattr(compiler, "get_kernel", fake_get_kernel)
    monkeypatch.setattr(launch, "BACKEND", "pycuda")
    launch.clear_cache()
    ks = launch.load_kernels(Ctx(), ("test-once", 1), lambda: renders.append(1) or "src",
                             {"a": "q", "b": "qP", "c": "P"})
    launch.clear_cache()
    assert sorted(ks) == ["a", "b", "c"] and renders == [1]


# ============================================================================ the link hook

def test_link_prefetches_before_making_thunks(monkeypatch):
    assert prefetch._link_hook in vm.LINK_HOOKS
    events: list = []
    monkeypatch.setattr(prefetch, "prefetch", lambda nodes, **kw: events.append(
        ("prefetch", [str(n.op) for n in nodes], kw)))
    real = GpuElemwise.make_thunk

    def spy(self, node, *args, **kw):
        events.append(("thunk", str(self)))
        return real(self, node, *args, **kw)
    monkeypatch.setattr(GpuElemwise, "make_thunk", spy)
    with config.change_flags(floatX="float32", device="cuda"), virtual_context(None):
        x = T.fvector("x")
        function([x], T.exp(x) * 2 + 1)
    assert events[0][0] == "prefetch" and any("GpuElemwise" in s for s in events[0][1])
    assert events[0][2] == {"wait": False}   # started, not waited for (see the next test)
    assert events[1][0] == "thunk"
    events.clear()
    y = T.dvector("y")
    function([y], T.exp(y) + 1)
    assert events == []            # a CPU function has nothing to prefetch


def test_a_failing_prefetch_never_breaks_linking(monkeypatch):
    def boom(nodes, **kw):
        raise OSError("disk full")
    monkeypatch.setattr(prefetch, "prefetch", boom)
    with config.change_flags(floatX="float32", device="cuda"), virtual_context(None), \
            warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        x = T.fvector("x")
        function([x], T.exp(x))       # no exception, no warning: the thunks do the work


def test_a_failing_link_hook_warns_and_linking_goes_on(monkeypatch):
    def broken(fgraph, nodes):
        raise ValueError("hook bug")
    monkeypatch.setattr(vm, "LINK_HOOKS", [broken])
    x = T.dvector("x")
    with pytest.warns(RuntimeWarning, match="link hook .*broken.* failed .*hook bug"):
        f = function([x], T.exp(x))
    np.testing.assert_allclose(f(np.zeros(2)), [1.0, 1.0])


# ============================================================================ real nvcc

@requires_nvcc
def test_real_nvcc_in_parallel_and_errors_keep_the_source(fresh):
    good = [prefetch.KernelRequest(("k", i), f"// {uuid.uuid4()}\n{KERNEL}", (), "sm_90")
            for i in range(3)]
    bad_src = 'extern "C" __global__ void broken(float *a) { a[0] = undefined_name; }\n'
    bad = prefetch.KernelRequest("bad", bad_src, (), "sm_90")
    res = prefetch.compile_requests([*good, bad])
    assert res.compiled == 3 and [r for r, _ in res.failed] == [bad]
    for r in good:
        _, cubin, hit = compiler.compile_to_cubin(r.source)
        assert hit and b"twice" in cubin
    # the node's own compile: nvcc's message and the kept .cu, as without the prefetch
    with pytest.raises(compiler.CompileError) as info:
        compiler.compile_to_cubin(bad_src)
    err = info.value
    assert "undefined_name" in str(err) and err.source_path in str(err)
    assert Path(err.source_path).read_text() == bad_src


@requires_nvcc
def test_real_nvcc_concurrent_same_source_one_entry(fresh, monkeypatch):
    runs = []
    real = compiler._run_nvcc

    def counting(*args):
        runs.append(1)
        return real(*args)
    monkeypatch.setattr(compiler, "_run_nvcc", counting)
    src = f"// {uuid.uuid4()}\n{KERNEL}"
    barrier = threading.Barrier(4)
    out: list = []

    def go() -> None:
        barrier.wait()
        out.append(compiler.compile_to_cubin(src)[1])
    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs == [1] and len(set(out)) == 1 and len(out) == 4
    assert len(list(Path(fresh, "kernels").glob("*/*.cubin"))) == 1


# ============================================================================ GPU

@requires_gpu
def test_gpu_cold_compile_prefetches_then_warm_runs_no_nvcc(cuda, monkeypatch):
    from symgpu import shared
    compiler.clear_memory_cache()
    launch.clear_cache()
    runs: list[str] = []
    real = compiler._run_nvcc

    def counting(*args):
        runs.append(threading.current_thread().name)
        return real(*args)
    monkeypatch.setattr(compiler, "_run_nvcc", counting)
    r = np.random.RandomState(0)
    xv, wv = r.randn(40, 7).astype("float32"), r.randn(7).astype("float32")

    def build():
        x, w = shared(xv), shared(wv)
        p = 1 / (1 + T.exp(-T.dot(x, w)))
        return function([], [p, (p * p).sum()])
    f = build()
    assert len(runs) >= 2 and all(n.startswith("symgpu-nvcc") for n in runs), runs
    p, s = f()
    want = 1 / (1 + np.exp(-(xv @ wv)))
    np.testing.assert_allclose(np.asarray(p), want, rtol=1e-5)
    np.testing.assert_allclose(float(s), float((want ** 2).sum()), rtol=1e-4)
    # a fresh process on the same compiledir: no nvcc at all
    compiler.clear_memory_cache()
    launch.clear_cache()
    prefetch.clear()
    runs.clear()
    g = build()
    np.testing.assert_allclose(np.asarray(g()[0]), want, rtol=1e-5)
    assert runs == []
