"""The GPU runtime: contexts and fallback, the memory pool, GpuArray, DLPack and
``__cuda_array_interface__`` exchange.

CPU tests run everywhere (fallback, registry, pool bookkeeping with a fake driver, DLPack
structs).  Tests marked ``gpu`` run on the GPU machine (``pytest -m gpu``) and skip elsewhere
with the reason from ``why_unavailable()``; where they run they check a real device was used.
"""
from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gpu_helpers import FakeCtx, requires_gpu
from symgpu.config import config
from symgpu.gpu.runtime import context as gctx
from symgpu.gpu.runtime import dlpack, pool
from symgpu.gpu.runtime.array import SUPPORTED_DTYPES, GpuArray, asarray, check_dtype, empty, \
    from_dlpack, to_gpu, zeros
from symgpu.gpu.runtime.copykernel import collapse_axes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, flags: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, SYMGPU_FLAGS=flags,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


# ============================================================================ CPU tests
HIDE_PYCUDA = "import sys; sys.modules['pycuda'] = None  # as if PyCUDA were not installed\n"


def test_import_does_not_need_pycuda():
    r = run_python(HIDE_PYCUDA + textwrap.dedent("""
        import symgpu.gpu, symgpu.gpu.runtime.array, symgpu.gpu.runtime.context, symgpu.gpu.runtime.pool
        import symgpu.gpu.runtime.compiler, symgpu.gpu.runtime.dlpack, symgpu.gpu.runtime.copykernel
        from symgpu.gpu import GpuArray, empty, zeros, to_gpu, from_dlpack
        print("ok", symgpu.gpu.gpu_available())
    """), "device=cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "False"]


def test_fallback_warns_and_runs_on_cpu():
    r = run_python(HIDE_PYCUDA + textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        import symgpu.gpu.runtime.context as c
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            result = c.init_default_context()
        print("RESULT", result)
        print("CATEGORY", [x.category.__name__ for x in w])
        print("ISUSER", all(issubclass(x.category, UserWarning) for x in w) and len(w) == 1)
        print("MESSAGE", w[0].message)
        print("AVAILABLE", c.gpu_available(), "|", c.why_unavailable())
    """), "device=cuda")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "RESULT None" in out
    assert "ISUSER True" in out
    assert "PyCUDA cannot be imported" in out.split("MESSAGE")[1]
    assert "running on the CPU" in out
    assert "AVAILABLE False | " in out and "PyCUDA" in out.split("AVAILABLE")[1]


def test_force_device_raises_naming_why():
    r = run_python(HIDE_PYCUDA + textwrap.dedent("""
        import symgpu.gpu.runtime.context as c
        try:
            c.init_default_context()
        except RuntimeError as exc:
            print("RAISED", type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """), "device=cuda,force_device=True")
    assert r.returncode == 0, r.stderr
    assert "RAISED GpuUnavailableError" in r.stdout
    assert "PyCUDA cannot be imported" in r.stdout and "force_device" in r.stdout


def test_cpu_device_starts_nothing():
    r = run_python(textwrap.dedent("""
        import sys, warnings
        warnings.simplefilter("error")
        import symgpu.gpu.runtime.context as c
        print("RESULT", c.init_default_context(), "pycuda" in sys.modules)
    """), "device=cpu")
    assert r.returncode == 0, r.stderr
    assert "RESULT None False" in r.stdout


def test_virtual_contexts_for_placement():
    ctx = gctx.register_context("vdev0", device="cuda1", arch="sm_90")
    try:
        assert gctx.get_context("vdev0") is ctx
        assert (ctx.name, ctx.device, ctx.ordinal, ctx.arch, ctx.virtual) == \
            ("vdev0", "cuda1", 1, "sm_90", True)
        assert "vdev0" in gctx.context_names()
        with pytest.raises(RuntimeError, match="virtual"):
            empty((2, 2), context="vdev0")
        with pytest.raises(RuntimeError, match="virtual"):
            ctx.activate()
    finally:
        gctx.unregister_context("vdev0")
    with pytest.raises(gctx.ContextNotFound, match="no GPU context named 'vdev0'"):
        gctx.get_context("vdev0")


def test_gpu_probe_never_raises():
    assert isinstance(gctx.gpu_available(), bool)
    assert isinstance(gctx.why_unavailable(), str)
    assert gctx.gpu_available() == (gctx.why_unavailable() == "")


def test_dtypes():
    for dt in SUPPORTED_DTYPES:
        assert check_dtype(dt) == dt
    for bad in ("complex64", "complex128"):
        with pytest.raises(TypeError, match="complex"):
            check_dtype(bad)
    for bad in ("object", "U3", "longdouble" if np.dtype("longdouble").itemsize > 8 else "V16"):
        with pytest.raises(TypeError):
            check_dtype(bad)
    assert check_dtype(">f4") == np.dtype("float32")


def test_array_constructor_checks_hold_on_its_fast_paths():
    """GpuArray(shape, dtype, ctx) remembers checked dtypes and keeps a tuple of ints as the
    shape; what the checks refuse is still refused, asked once or twice."""
    ctx = FakeContext()
    ctx.pool = FakePool(ctx, 0.0)
    for _ in range(2):
        for dtype in ("float32", np.dtype("float32"), np.float32, ">f4"):
            a = GpuArray((2, 3), dtype, ctx)
            assert a.dtype == np.dtype("float32") and a.dtype.isnative
            assert a.shape == (2, 3) and a.strides == (12, 4)
        for bad in ("complex64", "object", [("a", "f4")]):
            with pytest.raises(TypeError):
                GpuArray((2,), bad, ctx)
        with pytest.raises(ValueError, match="negative"):
            GpuArray((2, -1), "float32", ctx)
        assert GpuArray((np.int64(2), True), "int8", ctx).shape == (2, 1)
        assert GpuArray(4, "int8", ctx).shape == (4,)
        assert GpuArray([3], "int8", ctx).shape == (3,)


def test_size_classes():
    assert pool.size_class(0) == 512 and pool.size_class(1) == 512
    assert pool.size_class(513) == 1024 and pool.size_class(1 << 20) == 1 << 20
    for n in ((1 << 20) + 1, 3_000_000, 123_456_789, 1 << 33):
        c = pool.size_class(n)
        assert n <= c <= n * 1.25 + 1, n
        assert pool.size_class(c) == c  # a class is its own class
    assert len({pool.size_class(n) for n in range((1 << 21) + 1, (1 << 22) + 1, 4096)}) == 4


def _fake_array(shape, strides, ptr=4096):
    arr = GpuArray.__new__(GpuArray)
    arr._set(FakeCtx(), ptr, shape, strides, np.dtype("float32"), None)
    return arr


def test_views_are_computed_without_a_device():
    """The one view computation behind __getitem__ and GpuIncSubtensor's regions (true
    views, negative strides for reversed axes), and the one broadcast view of Alloc, the
    BLAS accumulators and set/inc_subtensor."""
    a = _fake_array((3, 4), (16, 4))
    assert a.is_c_contiguous and not a.is_f_contiguous
    f = _fake_array((3, 4), (4, 12))
    assert f.is_f_contiguous and not f.is_c_contiguous
    v, rev = a._basic_view((slice(None, None, -1), 1))
    assert (v.shape, v.strides, v.ptr, rev) == ((3,), (-16,), 4096 + 2 * 16 + 4, True)
    v, rev = a._basic_view((Ellipsis, None, slice(1, 3)))
    assert (v.shape, v.strides, v.ptr, rev) == ((3, 1, 2), (16, 0, 4), 4096 + 4, False)
    with pytest.raises(IndexError, match="out of bounds"):
        a._basic_view((3,))
    b = _fake_array((3, 1), (4, 4))._broadcast_to((2, 3, 5), "Op")
    assert (b.shape, b.strides) == ((2, 3, 5), (0, 4, 0))
    with pytest.raises(ValueError, match=r"Op: cannot broadcast a value of shape \(3, 4\)"):
        a._broadcast_to((3, 5), "Op")


def test_collapse_axes():
    # C-contiguous 3-D collapses to 1-D; a transpose stays 2-D
    assert collapse_axes((2, 3, 4), (48, 16, 4), (48, 16, 4)) == ([24], [4], [4])
    assert collapse_axes((3, 2), (4, 12), (8, 4)) == ([3, 2], [4, 12], [8, 4])
    assert collapse_axes((1, 5, 1), (0, 4, 0), (20, 4, 4)) == ([5], [4], [4])


class FakeContext:
    """Enough of a context for the pool: a 1 MiB-aligned fake address space of 64 MiB."""

    device = "cuda0"
    total_memory = 64 << 20

    def __init__(self):
        self.used = 0

    def activate(self):
        return self

    def mem_info(self):
        return self.total_memory - self.used, self.total_memory


class FakeAlloc:
    def __init__(self, ptr, size, ctx):
        self.ptr, self.size, self.ctx = ptr, size, ctx

    def __int__(self):
        return self.ptr

    def free(self):
        self.ctx.used -= self.size


class FakePool(pool.DevicePool):
    """DevicePool with the two driver calls replaced by bookkeeping."""

    _next = 1 << 40

    def _device_alloc(self, nbytes):
        ctx = self.context
        if ctx.used + nbytes > ctx.total_memory:
            raise pool._OutOfMemory("out of memory (fake)")
        ctx.used += nbytes
        FakePool._next += nbytes
        self.n_device_allocs += 1
        return FakeAlloc(FakePool._next - nbytes, nbytes, ctx)


def test_pool_reuses_blocks():
    p = FakePool(FakeContext(), 0.0)
    for _ in range(50):
        b = p.allocate(1000)
        assert b.size == 1024
        del b
    assert p.n_device_allocs == 1 and p.stats()["n_reused"] == 49
    assert p.bytes_cached == 1024 and p.bytes_in_use == 0
    blocks = [p.allocate(5000) for _ in range(3)]
    assert p.n_device_allocs == 4 and p.bytes_in_use == 3 * 5120
    del blocks
    assert p.bytes_cached == 1024 + 3 * 5120
    assert p.release_cached() == 1024 + 3 * 5120 and p.context.used == 0


def test_pool_serves_memoised_size_classes_and_bounds_the_memo(monkeypatch):
    monkeypatch.setattr(pool, "_class_memo", {})
    monkeypatch.setattr(pool, "_CLASS_MEMO_LIMIT", 3)
    p = FakePool(FakeContext(), 0.0)
    sizes = [1000, np.int64(1000), 5000, (1 << 20) + 1, 3_000_000, 7]
    for n in sizes:
        b = p.allocate(n)
        assert b.size == pool.size_class(int(n)), n
        del b
    assert pool._class_memo == {1000: 1024, 5000: 5120, (1 << 20) + 1: pool.size_class(
        (1 << 20) + 1)}    # the first three sizes asked; later ones computed each time
    assert p.allocate(3_000_000).size == pool.size_class(3_000_000)
    assert p.allocate(np.asarray(1000)).size == 1024    # unhashable, still served


def test_pool_preallocated_arena_coalesces():
    p = FakePool(FakeContext(), 16)  # 16 MiB arena
    assert p.preallocated == 16 << 20 and p.n_device_allocs == 1
    a, b, c = (p.allocate(4 << 20) for _ in range(3))
    assert b.ptr == a.ptr + (4 << 20) and p.n_device_allocs == 1
    del a, b
    big = p.allocate(8 << 20)  # fits only because a and b coalesced
    assert p.n_device_allocs == 1 and big.ptr == p._arena.base
    del big, c
    assert p.stats()["arena_free"] == 16 << 20
    outside = p.allocate(32 << 20)  # larger than the arena: grows on demand
    assert p.n_device_allocs == 2 and outside.size == 32 << 20


def test_pool_fraction_and_no_pooling():
    assert FakePool(FakeContext(), 0.5).preallocated == 32 << 20
    p = FakePool(FakeContext(), -1)
    blocks = [p.allocate(1000) for _ in range(3)]
    del blocks
    assert p.n_device_allocs == 3 and p.n_device_frees == 3 and p.bytes_cached == 0


def test_pool_out_of_memory_releases_cache_then_reports():
    ctx = FakeContext()
    p = FakePool(ctx, 0.0)
    cached = p.allocate(40 << 20)
    del cached
    assert p.bytes_cached == 40 << 20
    block = p.allocate(48 << 20)  # fails, releases the 40 MiB cache, succeeds on the retry
    assert p.bytes_cached == 0 and block.size == 48 << 20
    with pytest.raises(pool.GpuMemoryError) as info:
        p.allocate(1 << 50)
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.asked == 1 << 50 and err.total == 64 << 20 and err.free == 16 << 20
    msg = str(err)
    assert "asked 1125899906842624 bytes" in msg and "free 16777216 bytes" in msg
    assert "total 67108864 bytes" in msg and "cuda0" in msg


def test_dlpack_structs_round_trip_on_cpu():
    """Export a capsule and read it back with a virtual context: no device work involved."""
    assert ctypes.sizeof(dlpack._Tensor) == 48
    assert ctypes.sizeof(dlpack._Managed) == 64
    assert ctypes.sizeof(dlpack._ManagedVersioned) == 80
    ctx = gctx.GpuContext("v", "cuda0", "sm_90", virtual=True)
    for versioned in (False, True):
        owner = object()
        arr = GpuArray._from_pointer(ctx, 0x7F0000001000, (3, 4), np.dtype("float32"),
                                     (4, 12), owner)  # a transposed view
        before = len(dlpack._exports)
        capsule = dlpack.export_capsule(arr, versioned)
        assert len(dlpack._exports) == before + 1
        back = from_dlpack(capsule, context=ctx)
        assert (back.ptr, back.shape, back.strides, back.dtype) == \
            (arr.ptr, arr.shape, arr.strides, arr.dtype)
        with pytest.raises(BufferError, match="unconsumed"):
            from_dlpack(capsule, context=ctx)  # a capsule is consumed once
        del back
        gc.collect()
        assert len(dlpack._exports) == before  # our deleter ran
    # a capsule nobody consumes releases its tensor when collected
    capsule = dlpack.export_capsule(arr, False)
    assert len(dlpack._exports) == before + 1
    del capsule
    gc.collect()
    assert len(dlpack._exports) == before


def test_dlpack_deleters_survive_the_module_being_cleared(monkeypatch):
    """At interpreter shutdown this module's globals are cleared before the last garbage
    collection, which may free a consumer's tensor (a PyTorch tensor in a cycle) and call our
    deleter through its C pointer: that call must still find what it needs (it crashed)."""
    ctx = gctx.GpuContext("v", "cuda0", "sm_90", virtual=True)
    arr = GpuArray._from_pointer(ctx, 0x7F0000001000, (3,), np.dtype("float32"), (4,),
                                 object())
    exports = dlpack._exports
    for versioned in (False, True):
        capsule = dlpack.export_capsule(arr, versioned)
        struct_cls = dlpack._ManagedVersioned if versioned else dlpack._Managed
        managed_ptr = ctypes.pythonapi.PyCapsule_GetPointer
        managed_ptr.restype, managed_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                       ctypes.c_char_p]
        ptr = managed_ptr(capsule, dlpack._NAME_V if versioned else dlpack._NAME)
        dlpack._api.PyCapsule_SetName(capsule, b"used_dltensor")  # a consumer took it
        key = struct_cls.from_address(ptr).manager_ctx
        assert key in exports
        with monkeypatch.context() as m:  # what shutdown does to the module's globals
            for name in ("_release", "_exports", "_exports_lock", "_Managed",
                         "_ManagedVersioned", "_api", "_NAME", "_NAME_V"):
                m.setattr(dlpack, name, None)
            struct_cls.from_address(ptr).deleter(ptr)  # the consumer's call, through C
        assert key not in exports


def test_dlpack_dtype_codes():
    for dt in SUPPORTED_DTYPES:
        code = dlpack._dl_dtype(dt)
        assert dlpack._np_dtype(code) == dt
    assert dlpack._dl_dtype(np.dtype(bool)).code == 6


# ============================================================================ GPU tests
@pytest.fixture(scope="module")
def ctx():
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.pycuda_context is not None and c.stream_handle
    free, total = c.mem_info()
    assert 0 < free <= total and abs(total - c.total_memory) <= total // 100
    return c


@requires_gpu
def test_start_up_uses_a_real_device(ctx):
    import pycuda.driver as drv
    assert ctx.arch.startswith("sm_") and int(ctx.arch[3:]) >= 70
    assert "(" in ctx.devname and ctx.devname.startswith(drv.Device(0).name())
    a = to_gpu(np.arange(4, dtype=np.float32), ctx)
    assert gctx.device_of_pointer(a.ptr) == 0
    assert drv.Context.get_current() is not None


@requires_gpu
def test_print_active_device_and_preallocate():
    r = run_python("""
        import symgpu.gpu.runtime.context as c
        ctx = c.init_default_context()
        s = ctx.pool.stats()
        print("STATS", s["bytes_preallocated"], s["n_device_allocs"])
        from symgpu.gpu import empty
        for _ in range(20):
            x = empty((1000, 1000), "float32")
            del x
        s = ctx.pool.stats()
        print("AFTER", s["n_device_allocs"], s["n_allocs"])
        print("NAMED", c.get_context("dev0") is ctx)
    """, "device=cuda,gpuarray.preallocate=256,contexts=dev0->cuda0,print_active_device=True")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "Mapped name None to device cuda0: NVIDIA" in err, err
    assert "Mapped name dev0 to device cuda0: NVIDIA" in err
    assert "Preallocating 256/" in err and " Mb (0.00" in err and "on cuda0" in err
    stats = r.stdout.split("STATS")[1].split()
    assert int(stats[0]) == 256 << 20 and stats[1] == "1"
    after = r.stdout.split("AFTER")[1].split()[:2]
    assert after == ["1", "20"]  # every array carved from the arena: no cuMemAlloc
    assert "NAMED True" in r.stdout


@requires_gpu
@pytest.mark.parametrize("force", [False, True])
def test_fallback_when_the_driver_sees_no_device(force):
    """PyCUDA present but no visible device: the driver's own reason reaches the user."""
    env_flags = "device=cuda" + (",force_device=True" if force else "")
    code = """
        import os, warnings
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        import symgpu.gpu.runtime.context as c
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                print("RESULT", c.init_default_context())
            except RuntimeError as exc:
                print("RAISED", exc)
        for x in w:
            print("WARNED", x.category.__name__, x.message)
    """
    r = run_python(code, env_flags)
    assert r.returncode == 0, r.stderr
    if force:
        assert "RAISED device cuda was asked for" in r.stdout and "force_device" in r.stdout
    else:
        assert "RESULT None" in r.stdout and "WARNED GpuUnavailableWarning" in r.stdout
        assert "running on the CPU" in r.stdout
    assert "device" in r.stdout.split("RAISED" if force else "WARNED")[1].lower()


@requires_gpu
def test_pool_reuse_on_device(ctx):
    p = ctx.pool
    x = empty((1024, 1024), "float32", ctx)
    del x
    start = p.stats()
    for _ in range(100):
        y = empty((1024, 1024), "float32", ctx)
        del y
    end = p.stats()
    assert end["n_device_allocs"] == start["n_device_allocs"]
    assert end["n_allocs"] == start["n_allocs"] + 100


@requires_gpu
def test_out_of_memory_message(ctx):
    with pytest.raises(MemoryError) as info:
        empty((1 << 50,), "uint8", ctx)  # 1 PiB
    err = info.value
    assert isinstance(err, pool.GpuMemoryError)
    msg = str(err)
    assert f"asked {1 << 50} bytes" in msg and "free " in msg and "total " in msg
    assert abs(err.total - ctx.total_memory) <= err.total // 100 and 0 < err.free <= err.total
    a = to_gpu(np.ones(10, np.float32), ctx)  # still usable
    assert a.get().sum() == 10


def sample(dt, shape, rng):
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dt)


@requires_gpu
@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=str)
def test_round_trip_every_dtype(ctx, dt):
    rng = np.random.default_rng(0)
    host = sample(dt, (7, 33, 5), rng)
    g = to_gpu(host, ctx)
    assert (g.shape, g.dtype, g.strides, g.size, g.ndim, g.itemsize, g.nbytes) == \
        (host.shape, host.dtype, host.strides, host.size, host.ndim, host.itemsize, host.nbytes)
    np.testing.assert_array_equal(g.get(), host)
    np.testing.assert_array_equal(np.asarray(g), host)
    out = np.empty_like(host)
    assert g.get(out=out) is out
    np.testing.assert_array_equal(out, host)
    view = g[1:6:2, ::-3, 1]
    np.testing.assert_array_equal(view.get(), host[1:6:2, ::-3, 1])
    np.testing.assert_array_equal(g.transpose(2, 0, 1).get(), host.transpose(2, 0, 1))
    c = g.T.copy()
    assert c.is_c_contiguous
    np.testing.assert_array_equal(c.get(), host.T)
    d = empty(c.shape, dt, ctx).set(c)  # device-to-device
    np.testing.assert_array_equal(d.get(), host.T)
    value = host.reshape(-1)[3]
    np.testing.assert_array_equal(empty((5, 3), dt, ctx).fill(value).get(),
                                  np.full((5, 3), value, dt))
    np.testing.assert_array_equal(zeros((4,), dt, ctx).get(), np.zeros(4, dt))


@requires_gpu
def test_views_share_memory(ctx):
    host = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    g = to_gpu(host, ctx)
    v = g[1:, ::2, 3]
    assert v.base is g.base and not v.is_c_contiguous
    assert v.ptr == g.ptr + (1 * 30 + 3) * 4
    assert v.strides == (120, 40) and v.shape == (3, 3)
    np.testing.assert_array_equal(v.get(), host[1:, ::2, 3])
    np.testing.assert_array_equal(g[..., None, 2].get(), host[..., None, 2])
    np.testing.assert_array_equal(g[-1].get(), host[-1])
    assert g[2, 3, 4].get() == host[2, 3, 4] and g[2, 3, 4].shape == ()
    with pytest.raises(IndexError):
        g[4]
    with pytest.raises(IndexError):
        g[[0, 1]]
    # transposes are views; reshape of contiguous data is a view, otherwise a copy
    t = g.T
    assert t.ptr == g.ptr and t.flags["F_CONTIGUOUS"] and not t.flags.c_contiguous
    r = g.reshape(24, -1)
    assert r.ptr == g.ptr and r.shape == (24, 5)
    np.testing.assert_array_equal(r.get(), host.reshape(24, -1))
    rt = g.T.reshape(-1)
    assert rt.ptr != g.ptr and rt.is_c_contiguous
    np.testing.assert_array_equal(rt.get(), host.T.reshape(-1))
    # writing through a strided view changes the base
    v.set(np.full((3, 3), -1, np.float32))
    expected = host.copy()
    expected[1:, ::2, 3] = -1
    np.testing.assert_array_equal(g.get(), expected)
    v.fill(7)
    expected[1:, ::2, 3] = 7
    np.testing.assert_array_equal(g.get(), expected)
    # a reversed slice is a copy (strides stay non-negative)
    rev = g[::-1]
    assert all(s >= 0 for s in rev.strides) and rev.ptr != g.ptr
    np.testing.assert_array_equal(rev.get(), expected[::-1])


@requires_gpu
def test_large_copy_and_repr(ctx):
    big = np.random.default_rng(1).standard_normal(20_000_000).astype(np.float32)  # 80 MB
    g = to_gpu(big, ctx)
    np.testing.assert_array_equal(g.get(), big)
    assert repr(to_gpu(np.ones((2, 2), np.float32), ctx)) == \
        "gpuarray.array([[1., 1.],\n                [1., 1.]], dtype=float32)"
    g.sync()


@requires_gpu
def test_pycuda_kernel_arguments(ctx):
    """GpuArray and its gpudata work as PyCUDA kernel arguments (the seeds' PyCUDADoubleOp)."""
    from symgpu.gpu.runtime.compiler import compile_module
    mod = compile_module('extern "C" __global__ void my_fct(float *i0, float *o0, int size)\n'
                         '{ int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
                         '  if (i < size) o0[i] = i0[i] * 2; }\n', context=ctx)
    fn = mod.get_function("my_fct")
    x = np.arange(1000, dtype=np.float32)
    gi, go = to_gpu(x, ctx), zeros(x.shape, "float32", ctx)
    fn(gi, go, np.intc(x.size), block=(512, 1, 1), grid=(2, 1))
    np.testing.assert_array_equal(go.get(), 2 * x)
    fn(gi.gpudata, go.gpudata, np.intc(x.size), block=(512, 1, 1), grid=(2, 1))
    fn.prepare("PPi")
    go.fill(0)
    fn.prepared_async_call((2, 1), (512, 1, 1), ctx.stream, gi.gpudata, go.gpudata, x.size)
    np.testing.assert_array_equal(go.get(), 2 * x)
    assert int(gi.gpudata) == gi.ptr


@requires_gpu
def test_pycuda_gpuarray_interop(ctx):
    import pycuda.gpuarray as pga
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    p = pga.to_gpu(x)
    g = asarray(p)
    assert g.ptr == int(p.gpudata) and g.base is p
    g.fill(5)
    g.sync()
    np.testing.assert_array_equal(p.get(), np.full((3, 4), 5.0))
    back = pga.GPUArray(g.shape, g.dtype, gpudata=g.gpudata)
    assert int(back.gpudata) == g.ptr


@requires_gpu
def test_torch_exchange_both_ways(ctx):
    torch = pytest.importorskip("torch")
    # symgpu -> torch, via __cuda_array_interface__ and via DLPack
    g = to_gpu(np.arange(12, dtype=np.float32).reshape(3, 4), ctx)
    t_cai = torch.as_tensor(g, device="cuda")
    t_dl = torch.from_dlpack(g)
    assert t_cai.data_ptr() == g.ptr == t_dl.data_ptr()
    t_dl.mul_(10)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(g.get(), np.arange(12).reshape(3, 4) * 10)
    g.fill(3)
    g.sync()
    assert float(t_cai.sum()) == 36.0
    # a transposed view keeps its strides
    tt = torch.from_dlpack(g.T)
    assert tt.stride() == (1, 4) and tt.data_ptr() == g.ptr
    # torch -> symgpu
    t = torch.arange(20, dtype=torch.float32, device="cuda").reshape(4, 5)
    a, b = asarray(t), from_dlpack(t)
    assert a.ptr == b.ptr == t.data_ptr() and b.shape == (4, 5)
    np.testing.assert_array_equal(a.get(), t.cpu().numpy())
    b.fill(2)
    b.sync()
    assert float(t.sum()) == 40.0
    ts = t[:, 1::2]
    s = from_dlpack(ts)
    assert s.strides == (20, 8) and s.ptr == ts.data_ptr()
    np.testing.assert_array_equal(s.get(), ts.cpu().numpy())
    # deleting one side keeps the other valid
    del t, ts, a
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((1 << 20,), 9.0, device="cuda")  # would reuse freed memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(b.get(), np.full((4, 5), 2, np.float32))
    x = to_gpu(np.full(1000, 4, np.float32), ctx)
    tx = torch.from_dlpack(x)
    del x
    gc.collect()
    fresh = [empty((1000,), "float32", ctx).fill(-1) for _ in range(4)]
    assert float(tx.sum()) == 4000.0
    del tx, fresh, junk


@requires_gpu
def test_cupy_exchange_both_ways(ctx):
    cp = pytest.importorskip("cupy")
    g = to_gpu(np.arange(10, dtype=np.int32), ctx)
    c_cai = cp.asarray(g)
    c_dl = cp.from_dlpack(g)
    assert c_cai.data.ptr == g.ptr == c_dl.data.ptr
    c_dl += 1
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(g.get(), np.arange(1, 11))
    g.fill(0)
    g.sync()
    assert int(c_cai.sum()) == 0
    src = cp.arange(30, dtype=cp.float64).reshape(5, 6)[:, ::2]
    a, b = asarray(src), from_dlpack(src)
    assert a.ptr == b.ptr == src.data.ptr and a.strides == src.strides == b.strides
    np.testing.assert_array_equal(a.get(), cp.asnumpy(src))
    a.fill(1.5)
    a.sync()
    assert float(src.sum()) == 1.5 * 15
    del src
    gc.collect()
    np.testing.assert_array_equal(b.get(), np.full((5, 3), 1.5))


def test_driver_errors_read_the_same_everywhere(monkeypatch):
    """Every ctypes driver call (launches, graphs, events) reports a failure one way."""
    from symgpu.gpu.runtime import libcuda
    monkeypatch.setattr(libcuda, "error_string", lambda status: f"code {status} explained")
    libcuda.check(0, "cuNothing")
    with pytest.raises(RuntimeError, match=r"^cuEventRecord failed: code 700 explained$"):
        libcuda.check(700, "cuEventRecord")
