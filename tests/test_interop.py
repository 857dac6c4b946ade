"""Foreign device arrays (PyTorch, CuPy, PyCUDA) in and out of symgpu, and ElemwiseKernelOp.

CPU tests (CI): exports, errors for wrong inputs, ElemwiseKernelOp's checks, its NumPy
fallback and gradient (``verify_grad``), its placement under a virtual context, the generated
kernels compiled with nvcc, and the input path that keeps a device array fed to a host input
on the device.  ``gpu`` tests (``pytest -m gpu`` on the GPU machine) exchange memory both
ways with each library, check lifetimes, strides and stream ordering, feed compiled functions
with torch tensors without host copies, and run ElemwiseKernelOp kernels against NumPy.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import symgpu
import symgpu.gpu
import symgpu.tensor as T
from gpu_helpers import real_default_gpu, requires_gpu, requires_nvcc
from symgpu.compile.io import Out
from symgpu.config import config
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.placement.basic_ops import TRANSFER_COUNTS, gpu_contiguous, reset_transfer_counts
from symgpu.gpu.ops.kernel_op import ElemwiseKernelOp
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gradient import verify_grad

RNG = np.random.default_rng(7)

AXPY = dict(cuda_expression="o0 = i0 * 2 + i1", inputs=["float32", "float32"],
            outputs=["float32"])


def fused_sin(cpu: bool = True) -> ElemwiseKernelOp:
    """o0 = i0 * i1 + sin(i0) in float64, with its gradient (and a NumPy fallback)."""
    return ElemwiseKernelOp(
        "o0 = i0 * i1 + sin(i0)", ["float64", "float64"], ["float64"],
        grad=lambda inp, gz: [gz[0] * (inp[1] + T.cos(inp[0])), gz[0] * inp[0]],
        cpu_impl=(lambda a, b: a * b + np.sin(a)) if cpu else None)


def sum_diff(cpu: bool = True) -> ElemwiseKernelOp:
    """Two outputs from one body, with a gradient."""
    return ElemwiseKernelOp(
        "double s = i0 + i1; o0 = s; o1 = i0 - i1", ["float64", "float64"],
        ["float64", "float64"], grad=lambda inp, gz: [gz[0] + gz[1], gz[0] - gz[1]],
        cpu_impl=(lambda a, b: (a + b, a - b)) if cpu else None)


# ============================================================================ CPU tests

def test_exports():
    assert symgpu.gpu.ElemwiseKernelOp is ElemwiseKernelOp
    from symgpu.gpu.runtime.array import asarray, from_dlpack
    assert symgpu.gpu.from_dlpack is from_dlpack and symgpu.gpu.asarray is asarray
    import symgpu.misc.pycuda_utils as pu
    assert callable(pu.to_gpuarray) and callable(pu.from_gpuarray)


def test_from_dlpack_rejects_host_arrays():
    with pytest.raises(BufferError, match="needs a CUDA array.*to_gpu"):
        symgpu.gpu.from_dlpack(np.ones(3, "float32"))


@pytest.mark.parametrize("args, error, match", [
    (("o1 = i0", ["float32"]), ValueError, "uses o1 but the op has 1 output"),
    (("o0 = i0 + i2", ["float32", "float32"]), ValueError, "uses i2 but the op has 2 input"),
    (("i0 + i1", ["float32"] * 2, ["float32"] * 2), ValueError, "assigns no output"),
    (("o0 = i0", ["float32"], ["float32", "int32"]), ValueError, "never assigns o1"),
    (("o0 = i0", ["complex64"]), TypeError, "complex64 is not supported"),
    (("  ", ["float32"]), TypeError, "non-empty string"),
    (("o0 = i0", []), ValueError, "at least one input"),
])
def test_kernel_op_checks_its_definition(args, error, match):
    with pytest.raises(error, match=match):
        ElemwiseKernelOp(*args)


def test_kernel_op_checks_its_inputs():
    op = ElemwiseKernelOp(**AXPY)
    with pytest.raises(TypeError, match="takes 2 input"):
        op(T.fvector())
    with pytest.raises(TypeError, match="declares float32; cast it"):
        op(T.dvector(), T.fvector())
    assert str(op) == "ElemwiseKernelOp{o0 = i0 * 2 + i1}"
    assert str(ElemwiseKernelOp("i0 * 2", ["float32"], name="double")) == "double"


def test_kernel_op_without_gpu_says_a_gpu_is_needed():
    from symgpu.gpu.runtime.context import GpuUnavailableError
    op = ElemwiseKernelOp(**AXPY)
    x, b = T.fmatrix("x"), T.fvector("b")
    y = op(x, b)                                  # building the graph works
    assert isinstance(y.type, GpuArrayType) and y.broadcastable == (False, False)
    with pytest.raises(GpuUnavailableError, match="needs a GPU.*cpu_impl="):
        symgpu.function([x, b], y)


def test_kernel_op_cpu_fallback_and_broadcasting():
    op = fused_sin()
    a, v = T.dmatrix("a"), T.dvector("v")
    y = op(a, v)
    assert isinstance(y.type, T.TensorType) and y.broadcastable == (False, False)
    f = symgpu.function([a, v], y)
    av, vv = RNG.random((3, 4)), RNG.random(4)
    np.testing.assert_allclose(f(av, vv), av * vv + np.sin(av))
    s, d = sum_diff()(a, v)
    g = symgpu.function([a, v], [s, d])
    rs, rd = g(av, vv)
    np.testing.assert_allclose(rs, av + vv)
    np.testing.assert_allclose(rd, av - vv)
    bad = ElemwiseKernelOp("o0 = i0", ["float64"], cpu_impl=lambda x: (x, x))
    with pytest.raises(ValueError, match="cpu_impl returned 2 value"):
        symgpu.function([v], bad(v))(vv)


def test_kernel_op_gradient_cpu():
    op, two = fused_sin(), sum_diff()
    av, vv = RNG.random((3, 4)), RNG.random(4)
    verify_grad(lambda a, v: op(a, v), [av, vv])
    # v is broadcast over the rows: its gradient is summed for us
    verify_grad(lambda a, v: op(a, v.dimshuffle("x", 0)), [av, vv])
    verify_grad(lambda a, v: two(a, v)[0] * 3 + two(a, v)[1], [av, vv])
    verify_grad(lambda a, v: two(a, v)[1], [av, vv])   # output 0 disconnected: zeros
    m, v = T.dmatrix("m"), T.dvector("v")
    gv = symgpu.function([m, v], symgpu.grad(T.sum(two(m, v)[1]), v))
    np.testing.assert_allclose(gv(av, vv), np.full(4, -3.0))   # d(m - v)/dv summed over rows
    nograd = ElemwiseKernelOp("i0 * 2", ["float64"], cpu_impl=lambda x: x * 2)
    with pytest.raises(NotImplementedError, match="no gradient: give ElemwiseKernelOp a grad="):
        symgpu.grad(T.sum(nograd(v)), v)


def test_kernel_op_is_a_gpu_op_under_a_gpu_context():
    a, v = T.dmatrix("a"), T.dvector("v")
    host = fused_sin()(a, v)                      # no GPU in use: a host node (cpu_impl)
    assert isinstance(host.type, T.TensorType)
    from symgpu.compile.mode import get_mode
    from symgpu.graph.fg import FunctionGraph
    with virtual_context(None), config.change_flags(assert_no_cpu_op="raise"):
        direct = fused_sin()(a, v)                # a GPU context in use: a GPU node
        assert isinstance(direct.type, GpuArrayType)
        for out in (host, direct):
            fg = FunctionGraph([a, v], [out], clone=True)
            get_mode(None).rewrite(fg)            # raises CpuOpError if it stayed on the CPU
            kernel = [n for n in fg.toposort() if isinstance(n.op, ElemwiseKernelOp)]
            assert len(kernel) == 1 and isinstance(kernel[0].outputs[0].type, GpuArrayType)
            assert cpu_nodes(fg) == []


@requires_nvcc
@pytest.mark.parametrize("body, ins, outs, shapes", [
    ("o0 = i0 * 2 + i1", ["float32", "float32"], ["float32"], [(None, None), (None,)]),
    ("float t = i0 * i1; o0 = t + 1; o1 = t - (float)i2", ["float16", "float32", "int32"],
     ["float16", "float64"], [(None, None), (1, None), (None, 1)]),
    ("i0 > 0 && i1", ["float64", "bool"], ["bool"], [(None,), (None,)]),
    ("o0 = max(i0, i1); o1 = i0 % 7u", ["uint32", "uint32"], ["uint32", "uint64"],
     [(None, None, None), ()]),
])
def test_kernel_op_kernels_compile(body, ins, outs, shapes):
    from symgpu.gpu.runtime.compiler import compile_to_cubin
    op = ElemwiseKernelOp(body, ins, outs)
    with virtual_context(None):
        args = [T.tensor(dtype=d, shape=s) for d, s in zip(ins, shapes)]
        res = op(*args)
        node = (res[0] if isinstance(res, list) else res).owner
        [(key, src)] = op.kernel_sources(node)
    assert body.split(";")[0] in src and "sg_apply" in src
    _, cubin, _ = compile_to_cubin(src, (), "sm_90")
    assert len(cubin) > 1000


class FakeCudaArray:
    """Just enough of a CUDA array for the input path (never dereferenced on the CPU)."""

    def __init__(self, shape, dtype="float32", ptr=0x20000):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": np.dtype(dtype).str, "data": (ptr, False),
            "strides": None, "version": 3, "stream": None}


def test_device_array_fed_to_a_host_input_stays_on_the_device():
    from symgpu.gpu.placement.basic_ops import _is_device_array
    assert _is_device_array(FakeCudaArray((3,)))
    assert not _is_device_array(np.ones(3)) and not _is_device_array(3.0)

    class DL:
        def __init__(self, kind):
            self.kind = kind

        def __dlpack_device__(self):
            return (self.kind, 0)
    assert _is_device_array(DL(2)) and not _is_device_array(DL(1))
    x = T.fmatrix("x")
    op = ElemwiseKernelOp(**AXPY)
    with virtual_context(None) as vctx:
        # x is read by GpuFromHost and by a shape op only: a device array stays there
        f = symgpu.function([x], [op(x, x), x.shape[0]])
        cell_value = f._filters[0](FakeCudaArray((2, 3)))
        assert isinstance(cell_value, GpuArray) and cell_value.context is vctx
        assert cell_value.ptr == 0x20000 and cell_value.shape == (2, 3)
        host = np.ones((2, 3), "float32")
        assert f._filters[0](host) is host        # host values take the usual path
        with pytest.raises(TypeError, match="bad argument for input 'x'.*2 dimension"):
            f._filters[0](FakeCudaArray((2, 3, 4)))
        # an input that is itself an output is not moved (nothing would copy it)
        g = symgpu.function([x], [op(x, x), x])
        with pytest.raises(TypeError, match="bad argument for input 'x'"):
            g._filters[0](FakeCudaArray((2, 3)))


# ============================================================================ GPU tests

@pytest.fixture(scope="module")
def gpu():
    """The machine's GPU as symgpu's default context."""
    with real_default_gpu() as ctx:
        yield ctx


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")


@requires_gpu
def test_torch_both_directions_share_memory(gpu, torch):
    from symgpu.gpu.runtime.array import asarray, from_dlpack, to_gpu
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = to_gpu(host, gpu)
    t = torch.from_dlpack(x)                           # symgpu -> torch, no copy
    assert t.data_ptr() == x.ptr and t.is_cuda
    t.mul_(2)                                           # torch writes, symgpu sees it
    np.testing.assert_array_equal(x.get(), host * 2)
    x.fill(1)                                           # symgpu writes, torch sees it
    assert float(t.sum()) == 24.0
    tt = torch.from_dlpack(x.T)                         # strided export keeps strides
    assert tt.stride() == (1, 6) and tt.data_ptr() == x.ptr
    src = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)
    for y in (from_dlpack(src), asarray(src)):          # torch -> symgpu, no copy
        assert y.ptr == src.data_ptr() and y.context is gpu
    y = from_dlpack(src)
    s = from_dlpack(src[:, 1::2])                       # strided import
    assert s.strides == (24, 8) and s.ptr == src.data_ptr() + 4
    np.testing.assert_array_equal(s.get(), src[:, 1::2].cpu().numpy())
    y.fill(5)
    assert float(src.sum()) == 5 * 24
    # lifetimes: each side keeps the memory alive
    del src
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((1 << 20,), -1.0, device="cuda")
    np.testing.assert_array_equal(y.get(), np.full((4, 6), 5, np.float32))
    del x
    gc.collect()
    more = [symgpu.gpu.empty((24,), "float32").fill(-1) for _ in range(8)]
    assert float(t.sum()) == 24.0 and float(tt.sum()) == 24.0
    del junk, more


@requires_gpu
def test_cupy_both_directions_share_memory(gpu, cupy):
    from symgpu.gpu.runtime.array import asarray, from_dlpack, to_gpu
    x = to_gpu(np.arange(10, dtype=np.int32), gpu)
    c = cupy.from_dlpack(x)
    assert c.data.ptr == x.ptr
    c += 1
    np.testing.assert_array_equal(x.get(), np.arange(1, 11))
    x.fill(0)
    assert int(c.sum()) == 0
    src = cupy.arange(30, dtype=cupy.float64).reshape(5, 6)[:, ::2]
    for y in (asarray(src), from_dlpack(src)):
        assert y.ptr == src.data.ptr and y.strides == src.strides
        np.testing.assert_array_equal(y.get(), cupy.asnumpy(src))
    y.fill(1.5)
    assert float(src.sum()) == 1.5 * 15
    del src
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    np.testing.assert_array_equal(y.get(), np.full((5, 3), 1.5))
    del x
    gc.collect()
    assert int(c.sum()) == 0


@requires_gpu
@pytest.mark.parametrize("lib", ["torch", "cupy", "pycuda"])
def test_gpu_input_takes_foreign_arrays_without_copies(gpu, lib):
    host = RNG.random((3, 5)).astype(np.float32)
    if lib == "torch":
        mod = pytest.importorskip("torch")
        src = mod.from_numpy(host).cuda()
        ptr = src.data_ptr()
    elif lib == "cupy":
        mod = pytest.importorskip("cupy")
        src = mod.asarray(host)
        ptr = src.data.ptr
    else:
        from symgpu.misc import pycuda_init  # noqa: F401  (PyCUDA in symgpu's context)
        import pycuda.gpuarray as pga
        src = pga.to_gpu(host)
        ptr = int(src.gpudata)
    g = GpuArrayType("float32", (False, False))("g")
    same = symgpu.function([g], Out(gpu_contiguous(g), borrow=True))
    op = ElemwiseKernelOp("o0 = i0 * 2", ["float32"])
    double = symgpu.function([g], op(g))
    reset_transfer_counts()
    r = same(src)
    assert isinstance(r, GpuArray) and r.ptr == ptr          # the very same memory
    out = double(src)
    np.testing.assert_array_equal(np.asarray(out), host * 2)
    assert sum(v for k, v in TRANSFER_COUNTS.items() if not k.endswith("_bytes")) == 0


@requires_gpu
def test_host_input_fed_a_torch_tensor_has_no_host_copy(gpu, torch):
    x = T.fmatrix("x")
    op = ElemwiseKernelOp("o0 = i0 * 2 + 1", ["float32"])
    f = symgpu.function([x], [op(x), x.shape[0]])
    kinds = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuFromHost" in kinds
    host = RNG.random((64, 33)).astype(np.float32)
    t = torch.from_numpy(host).cuda()
    reset_transfer_counts()
    out, n = f(t)
    assert TRANSFER_COUNTS["host_to_gpu"] == 0 and TRANSFER_COUNTS["gpu_to_host"] == 0
    assert TRANSFER_COUNTS["device_copy"] == 0               # read where it is: no node
    #                                                          overwrites it (test_gpu_upload_paths)
    assert int(n) == 64
    res = torch.from_dlpack(out)                              # and the result goes back
    assert torch.allclose(res, t * 2 + 1)
    np.testing.assert_allclose(np.asarray(out), host * 2 + 1, rtol=1e-6)
    t.fill_(0)                                                # the result is its own
    np.testing.assert_allclose(np.asarray(out), host * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f(host)[0]), host * 2 + 1, rtol=1e-6)


@requires_gpu
def test_stream_ordering_with_torch_side_streams(gpu, torch):
    sleep = getattr(torch.cuda, "_sleep", None)
    g = GpuArrayType("float32", (False,))("g")
    op = ElemwiseKernelOp("o0 = i0 + 1", ["float32"])
    f = symgpu.function([g], op(g))
    n = 1 << 20
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            t = torch.zeros(n, device="cuda")
            if sleep is not None:
                sleep(50_000_000)                 # keep the side stream busy (~tens of ms)
            t.fill_(41)                           # queued on the side stream
            out = f(t)                            # symgpu must wait for the fill
        assert float(np.asarray(out).min()) == 42.0
        # export: torch on its side stream must wait for symgpu's kernel
        with torch.cuda.stream(side):
            back = torch.from_dlpack(out)
            total = float(back.sum())
        assert total == 42.0 * n


@requires_gpu
def test_kernel_op_on_gpu_matches_numpy(gpu):
    from symgpu.gpu.runtime.array import to_gpu
    op = ElemwiseKernelOp(**AXPY)
    x, b = T.fmatrix("x"), T.fvector("b")
    f = symgpu.function([x, b], op(x, b))
    xv, bv = RNG.random((37, 129)).astype(np.float32), RNG.random(129).astype(np.float32)
    out = f(xv, bv)
    assert isinstance(out, GpuArray) and out.context is gpu
    np.testing.assert_allclose(np.asarray(out), xv * 2 + bv, rtol=1e-6)
    # strided (transposed) and broadcast GPU inputs
    gx = GpuArrayType("float32", (False, False))("gx")
    gb = GpuArrayType("float32", (True, False))("gb")
    fg = symgpu.function([gx, gb], op(gx, gb))
    big = RNG.random((300, 200)).astype(np.float32)
    row = RNG.random((1, 300)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fg(to_gpu(big, gpu).T, row)), big.T * 2 + row,
                               rtol=1e-6)
    # several outputs, mixed dtypes and a scalar (all-broadcast) operand
    mixed = ElemwiseKernelOp("float t = i0 * i1; o0 = t + 1; o1 = t - (double)i2",
                             ["float16", "float32", "int32"], ["float16", "float64"])
    h, s, k = (T.tensor(dtype="float16", shape=(None, None)),
               T.tensor(dtype="float32", shape=(1, 1)), T.ivector())
    fm = symgpu.function([h, s, k], mixed(h, s, k))
    hv = RNG.random((5, 7)).astype(np.float16)
    sv = np.full((1, 1), 3, np.float32)
    kv = np.arange(7, dtype=np.int32)
    o0, o1 = fm(hv, sv, kv)
    tv = hv.astype(np.float32) * 3
    np.testing.assert_allclose(np.asarray(o0), (tv + 1).astype(np.float16), rtol=1e-3)
    assert np.asarray(o0).dtype == np.float16 and np.asarray(o1).dtype == np.float64
    np.testing.assert_allclose(np.asarray(o1), tv.astype(np.float64) - kv, rtol=1e-6)
    pos = ElemwiseKernelOp("i0 > 0", ["float64"], ["bool"])
    d = T.dvector()
    dv = RNG.standard_normal(1000)
    np.testing.assert_array_equal(np.asarray(symgpu.function([d], pos(d))(dv)), dv > 0)


@requires_gpu
def test_kernel_op_gradient_on_gpu(gpu):
    op, two = fused_sin(cpu=False), sum_diff(cpu=False)
    a = T.dmatrix()
    assert isinstance(op(a, a).type, GpuArrayType)        # the kernel, not the fallback
    av, vv = RNG.random((3, 4)), RNG.random(4)
    verify_grad(lambda a, v: op(a, v), [av, vv])
    verify_grad(lambda a, v: op(a, v.dimshuffle("x", 0)), [av, vv])
    verify_grad(lambda a, v: two(a, v)[0] * 3 + two(a, v)[1], [av, vv])
    f32 = ElemwiseKernelOp("o0 = i0 * i0 * i1", ["float32", "float32"],
                           grad=lambda inp, gz: [gz[0] * 2 * inp[0] * inp[1],
                                                 gz[0] * inp[0] * inp[0]])
    verify_grad(lambda a, v: f32(a, v), [av.astype(np.float32), av.astype(np.float32) + 1])
