"""Matrix products in float16 and bfloat16 (gpu/ops/blas.py, blaslt.py, advanced.py) and the
bias/ReLU epilogue fold (gpu/ops/gemm_epilogue.py).

On the CPU: placement (half dot/gemm/batched graphs land on GpuDot22/GpuBatchedDot, never
on the CPU or on a half gemv), the epilogue pass (inspected rewritten graphs), the cuBLASLt
descriptors a half, batched or epilogue problem builds (a fake libcublasLt), the routing of
half thunks (fake cuBLASLt and classic cuBLAS), the fallback epilogue kernel compiled by nvcc
and run on the host.  On a GPU (``pytest -m gpu``): values against float32 NumPy, with
tolerances per dtype (a product of K terms accumulated in float32 and rounded once: about
2^-11 relative for float16, 2^-8 for bfloat16, plus the inputs' own rounding, which the
references share because they are computed from the rounded inputs).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import FakeCtx, fake_gpu_array, recording_loader, requires_gpu, requires_nvcc
from symgpu import config, function, shared
from symgpu.gpu.ops import blas, blaslt, gemm_epilogue, thin_gemm
from symgpu.gpu.ops.advanced import GpuBatchedDot
from symgpu.gpu.ops.blas import GpuDot22, GpuGemm, GpuGemv
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue

HALF = ["float16", "bfloat16"]
#: relative tolerance of a half product against float32 NumPy on the same rounded inputs
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-5}


@pytest.fixture
def gpu_bf16(monkeypatch):
    """bfloat16 accepted by the GPU placement (another change adds it for good): products
    need nothing else of it."""
    from symgpu.gpu.placement import type as gtype
    monkeypatch.setattr(gtype, "_GPU_DTYPES", gtype._GPU_DTYPES | {"bfloat16"})


def _ops(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


def _nodes(f, cls):
    return [n for n in f.maker.fgraph.toposort() if type(n.op) is cls]


# ============================================================================ placement

@pytest.mark.parametrize("dtype", HALF)
def test_half_products_land_on_the_gpu_products(vgpu, gpu_bf16, dtype):
    x, W = T.matrix("x", dtype=dtype), T.matrix("W", dtype=dtype)
    v = T.vector("v", dtype=dtype)
    a, b = T.tensor3("a", dtype=dtype), T.tensor3("b", dtype=dtype)
    f = function([x, W], T.dot(x, W))
    (node,) = _nodes(f, GpuDot22)
    assert node.outputs[0].dtype == dtype and "Dot" not in _ops(f)
    for out in (T.dot(x, v), T.dot(v, W)):       # no half gemv: a product of one column
        g = function([x, v, W], out, on_unused_input="ignore")
        assert _nodes(g, GpuDot22) and not _nodes(g, GpuGemv), _ops(g)
        assert "Dot" not in _ops(g)
    for out in (T.matmul(a, b), T.batched_dot(a, b)):
        g = function([a, b], out)
        (node,) = _nodes(g, GpuBatchedDot)
        assert node.outputs[0].dtype == dtype and "MatMul" not in _ops(g)


@pytest.mark.parametrize("dtype", HALF)
def test_half_gemm_takes_float32_scalars(gpu_bf16, dtype):
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context("half-gemm"):
        g = lambda bc=(False, False): GpuArrayType(dtype, bc, "half-gemm")()   # noqa: E731
        node = GpuGemm()(g(), 0.5, g(), g(), 1.0).owner
        assert node.inputs[1].dtype == node.inputs[4].dtype == "float32"
        assert node.outputs[0].dtype == dtype
        with pytest.raises(TypeError, match="one dtype"):
            GpuGemm()(g(), 1.0, g(), GpuArrayType("float32", (False, False), "half-gemm")(),
                      1.0)
        with pytest.raises(TypeError, match="float32/float64 GPU array"):
            GpuGemv()(g((False,)), 1.0, g(), g((False,)), 0.0)


# ============================================================================ the epilogue pass

def _layer(dtype, act):
    x = T.matrix("x", dtype=dtype)
    W = shared(np.ones((4, 5), dtype), name="W")
    b = shared(np.ones(5, dtype), name="b")
    z = T.dot(x, W) + b
    return x, W, b, {"none": z, "relu": T.nnet.relu(z), "max": T.maximum(z, 0),
                     "tanh": T.tanh(z)}[act]


@pytest.mark.parametrize("act,want", [("none", "bias"), ("relu", "relu_bias"),
                                      ("max", "relu_bias"), ("tanh", "bias")])
def test_bias_and_relu_fold_into_a_half_product(vgpu, act, want):
    x, W, b, out = _layer("float16", act)
    f = function([x], out)
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.op.epilogue == want
    assert not _nodes(f, GpuDot22)
    names = _ops(f)
    assert ("GpuElemwise" in names) == (act == "tanh"), names   # tanh stays a kernel
    # the epilogue reads x, W and the bias vector itself, not its broadcast
    assert [i.ndim for i in node.inputs] == [2, 2, 1]


def test_relu_gradient_keeps_the_comparison_so_only_the_bias_folds(vgpu):
    x, W, b, y = _layer("float16", "relu")
    f = function([x], [y, T.grad(y.sum(), W)])
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.op.epilogue == "bias"


def test_a_product_read_elsewhere_is_not_folded(vgpu):
    x, W, b, _ = _layer("float16", "none")
    p = T.dot(x, W)
    f = function([x], [p + b, p * 2])
    assert not _nodes(f, GpuGemmEpilogue) and _nodes(f, GpuDot22)


def test_the_flag_chooses_the_dtypes(vgpu):
    x, W, b, out = _layer("float32", "relu")
    assert not _nodes(function([x], out), GpuGemmEpilogue), "float32 folds only under 'all'"
    with config.change_flags(**{"gpuarray.gemm_epilogue": "all"}):
        (node,) = _nodes(function([x], out), GpuGemmEpilogue)
        assert node.op.epilogue == "relu_bias"
    x, W, b, out = _layer("float16", "relu")
    with config.change_flags(**{"gpuarray.gemm_epilogue": "off"}):
        f = function([x], out)
        assert not _nodes(f, GpuGemmEpilogue) and _nodes(f, GpuDot22)
    with config.change_flags(optimizer_excluding="gpu_gemm_epilogue"):
        assert not _nodes(function([x], out), GpuGemmEpilogue)


def test_a_classifiers_bias_goes_to_the_softmax_first(vgpu):
    """float32 under 'all': softmax(dot(h, W) + b) keeps GpuSoftmaxRows{bias} (49.43)."""
    from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
    x, W, b, z = _layer("float32", "none")
    with config.change_flags(**{"gpuarray.gemm_epilogue": "all"}):
        f = function([x], T.nnet.softmax(z))
    assert _nodes(f, GpuSoftmaxRows) and not _nodes(f, GpuGemmEpilogue)


def test_epilogue_op_checks_its_operands(vgpu):
    from symgpu.gpu.placement.type import GpuArrayType
    g = lambda dt, nd: GpuArrayType(dt, (False,) * nd, None)()   # noqa: E731
    with pytest.raises(ValueError, match="epilogue must be one of"):
        GpuGemmEpilogue("gelu")
    with pytest.raises(TypeError, match="one dtype"):
        GpuGemmEpilogue()(g("float16", 2), g("float16", 2), g("float32", 1))
    with pytest.raises(TypeError, match="bias must be a 1-d"):
        GpuGemmEpilogue()(g("float16", 2), g("float16", 2), g("float16", 2))
    assert str(GpuGemmEpilogue("relu_bias")) == "GpuGemmEpilogue{relu_bias}"


# ============================================================================ cuBLASLt, faked

class _FakeLtLib:
    """libcublasLt's entry points, recording (name, values read through the arguments)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, [_value(a) for a in args]))
            if name == "cublasLtMatmulAlgoGetHeuristic":
                results, count = args[-2], args[-1]
                results[0].state, results[0].workspaceSize = 0, 0
                count._obj.value = 1
            if name == "cublasLtMatmulAlgoCheck":
                return 15      # no split-K variant here
            return 0
        return call


def _value(a):
    obj = getattr(a, "_obj", a)           # byref(x) -> x
    return getattr(obj, "value", obj)


def _fake_lt(monkeypatch):
    lt = blaslt._CublasLt.__new__(blaslt._CublasLt)
    lt.lib, lt.error, lt.plans = _FakeLtLib(), blas.CublasError, {}
    lt.handles, lt.workspaces = {}, {}
    import threading
    lt.lock = threading.Lock()
    monkeypatch.setattr(lt, "handle", lambda ctx: (ctypes.c_void_p(1), 0, 1 << 20))
    return lt


def _problem(dtype, batch=1, epilogue=blaslt.EPILOGUE_DEFAULT):
    return blaslt.LtProblem(dtype, False, 0, 1, 64, 32, 16, 64, 16, 64, False, batch,
                            64 * 16 if batch > 1 else 0, 0, 64 * 32 if batch > 1 else 0,
                            epilogue, (256, 256, 256))


@pytest.mark.parametrize("dtype,cuda_type", [("float16", 2), ("bfloat16", 14)])
def test_half_plan_has_float32_compute_and_scale_and_half_layouts(monkeypatch, dtype,
                                                                  cuda_type):
    lt = _fake_lt(monkeypatch)
    plan = lt.plan(FakeCtx(), _problem(dtype))
    calls = lt.lib.calls
    (create,) = [a for n, a in calls if n == "cublasLtMatmulDescCreate"]
    assert create[1:] == [68, 0], "CUBLAS_COMPUTE_32F, scale type CUDA_R_32F"
    layouts = [a for n, a in calls if n == "cublasLtMatrixLayoutCreate"]
    assert [a[1] for a in layouts] == [cuda_type] * 4
    assert not [n for n, _ in calls if n == "cublasLtMatrixLayoutSetAttribute"]
    assert plan.algos[-1][0] is None, "classic cuBLAS (cublasGemmEx) is a candidate"


def test_batched_plan_sets_count_and_strides_on_every_layout(monkeypatch):
    lt = _fake_lt(monkeypatch)
    p = _problem("bfloat16", batch=6)
    lt.plan(FakeCtx(), p)
    sets = [a[1:3] for n, a in lt.lib.calls if n == "cublasLtMatrixLayoutSetAttribute"]
    assert sets == [[5, 6], [6, p.stride_a], [5, 6], [6, p.stride_b], [5, 6],
                    [6, p.stride_d], [5, 6], [6, p.stride_d]]
    assert blaslt.problem_elements(p) == 5 * p.stride_d + p.n * p.ldd


def test_epilogue_plan_sets_the_epilogue_has_no_classic_candidate_and_takes_the_bias(
        monkeypatch):
    lt = _fake_lt(monkeypatch)
    plan = lt.plan(FakeCtx(), _problem("float16", epilogue=blaslt.EPILOGUE_RELU_BIAS))
    attrs = [a[1:3] for n, a in lt.lib.calls if n == "cublasLtMatmulDescSetAttribute"]
    assert [7, 6] in attrs, "CUBLASLT_MATMUL_DESC_EPILOGUE = RELU_BIAS"
    assert all(algo is not None for algo, _, _ in plan.algos)
    lt.set_bias(plan, 0xABC00)
    assert lt.lib.calls[-1][0] == "cublasLtMatmulDescSetAttribute"
    assert lt.lib.calls[-1][1][1:3] == [8, 0xABC00], "CUBLASLT_MATMUL_DESC_BIAS_POINTER"
    with pytest.raises(ValueError, match="no epilogue"):
        blaslt.classic(FakeCtx(), plan.problem, None, 0, 0, None, 0)


class _FakeClassic:
    """Classic cuBLAS: records gemm and strided-batched calls."""

    def __init__(self):
        self.calls = []
        self.gemm = {d: (lambda *a, d=d: self.calls.append(("gemm", d, a)) or 0)
                     for d in blas.GEMM_DTYPES}

    def gemm_strided_batched_ex(self, *args):
        self.calls.append(("batched", args))
        return 0

    def handle(self, ctx):
        return ctypes.c_void_p(1)

    def math_mode(self, h, mode):
        pass

    def pointer_mode(self, h, mode):
        pass

    check = staticmethod(blas._Cublas.check)


@pytest.fixture
def fakes(monkeypatch):
    """(ctx, classic calls, cuBLASLt calls, state, kernel launches) for thunks built on a
    fake context."""
    ctx, classic, lt_calls, launches = FakeCtx(), _FakeClassic(), [], []
    monkeypatch.setattr(blas, "_cublas", classic)
    monkeypatch.setattr(blaslt, "lt_available", lambda dtype: True)
    monkeypatch.setattr(gemm_epilogue.launch, "load_kernels", recording_loader(launches))
    state = {"raise": False}

    def lt_matmul(ctx_, p, alpha, a, b, beta, d, bias=0):
        lt_calls.append(dict(p=p, a=a, b=b, d=d, bias=bias, alpha=alpha))
        if state["raise"]:
            raise blaslt.LtUnsupported("faked")
    monkeypatch.setattr(blaslt, "lt_matmul", lt_matmul)
    return ctx, classic, lt_calls, state, launches


def _gvar(dtype, nd):
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType(dtype, (False,) * nd, "half-fake")()


@pytest.fixture
def fake_ctx_name():
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context("half-fake"):
        yield


def _thunk(node, values, ctx):
    storage = {v: [x] for v, x in zip(node.inputs, values)}
    for v in node.inputs:
        if getattr(v, "data", None) is not None:
            storage[v] = [v.data]
    storage.update({v: [None] for v in node.outputs})
    return node.op._thunk(node, storage, ctx), storage


@pytest.mark.parametrize("dtype", HALF)
def test_half_dot22_runs_cublaslt_with_float_scalars(fakes, fake_ctx_name, gpu_bf16, dtype):
    ctx, classic, lt_calls, state, _ = fakes
    x, y = fake_gpu_array(ctx, (6, 5), dtype), fake_gpu_array(ctx, (5, 7), dtype)
    thunk, storage = _thunk(GpuDot22()(_gvar(dtype, 2), _gvar(dtype, 2)).owner, [x, y], ctx)
    thunk()
    (call,) = lt_calls
    p = call["p"]
    assert p.dtype == dtype and (p.m, p.n, p.k) == (7, 6, 5) and p.batch == 1
    assert p.epilogue == blaslt.EPILOGUE_DEFAULT and not p.tf32
    assert isinstance(call["alpha"]._obj, ctypes.c_float), "float32 alpha for half"
    state["raise"] = True              # declined: cublasGemmEx from then on
    thunk()
    (name, d, args), = classic.calls
    assert name == "gemm" and d == dtype and isinstance(args[6]._obj, ctypes.c_float)


@pytest.mark.parametrize("declined", [False, True])
def test_half_batched_dot_is_one_strided_batch(fakes, fake_ctx_name, declined):
    ctx, classic, lt_calls, state, _ = fakes
    state["raise"] = declined
    x, y = fake_gpu_array(ctx, (3, 4, 5), "float16"), fake_gpu_array(ctx, (1, 5, 2), "float16")
    from symgpu.gpu.ops.advanced import _batched_thunk
    node = GpuBatchedDot()(_gvar("float16", 3), _gvar("float16", 3)).owner
    storage = {node.inputs[0]: [x], node.inputs[1]: [y], node.outputs[0]: [None]}
    thunk = _batched_thunk(node.op, node, storage, ctx)
    thunk()
    out = storage[node.outputs[0]][0]
    assert out.shape == (3, 4, 2) and out.dtype == np.float16
    p = lt_calls[0]["p"]
    assert (p.batch, p.m, p.n, p.k) == (3, 2, 4, 5)
    assert (p.stride_a, p.stride_b, p.stride_d) == (0, 20, 8), "y broadcast: stride 0"
    if declined:
        (kind, args), = classic.calls
        assert kind == "batched" and args[1] == "float16" and args[2] == 68
        assert args[-1] == 3 and args[-2] == 8
    else:
        assert not classic.calls


@pytest.mark.parametrize("declined", [False, True])
def test_epilogue_thunk_passes_the_bias_or_runs_the_kernel_after_classic(fakes,
                                                                        fake_ctx_name,
                                                                        declined):
    ctx, classic, lt_calls, state, launches = fakes
    state["raise"] = declined
    x, w = fake_gpu_array(ctx, (6, 5), "float16"), fake_gpu_array(ctx, (5, 7), "float16")
    b = fake_gpu_array(ctx, (7,), "float16")
    node = GpuGemmEpilogue("relu_bias")(_gvar("float16", 2), _gvar("float16", 2),
                                        _gvar("float16", 1)).owner
    thunk, storage = _thunk(node, [x, w, b], ctx)
    thunk()
    out = storage[node.outputs[0]][0]
    (call,) = lt_calls
    assert call["p"].epilogue == blaslt.EPILOGUE_RELU_BIAS and call["bias"] == b.ptr
    if declined:
        assert [c[0] for c in classic.calls] == ["gemm"]
        (name, grid, block, args), = launches
        assert name == "ge_bias_act_float16" and args == (out.ptr, b.ptr, 6, 7, 1)
    else:
        assert not classic.calls and not launches
    bad = fake_gpu_array(ctx, (6,), "float16")
    storage[node.inputs[2]][0] = bad
    with pytest.raises(ValueError, match="bias of shape"):
        thunk()


def test_a_strided_or_misaligned_bias_is_copied_first(fakes, fake_ctx_name, monkeypatch):
    from symgpu.gpu.runtime.array import GpuArray
    ctx, *_ = fakes
    copies = []
    monkeypatch.setattr(GpuArray, "copy", lambda self: copies.append(self) or
                        fake_gpu_array(ctx, self.shape, self.dtype))
    epi = gemm_epilogue._Epilogue(ctx, "float16", "bias")
    ok = fake_gpu_array(ctx, (7,), "float16")
    assert epi.operand(ok, 7, "t") is ok and not copies
    strided = fake_gpu_array(ctx, (7,), "float16", strides=(4,))
    assert epi.operand(strided, 7, "t") is not strided and copies == [strided]
    odd = fake_gpu_array(ctx, (7,), "float16", ptr=ok.ptr + 2)
    assert epi.operand(odd, 7, "t") is not odd


def test_thin_products_stay_float32_float64():
    assert thin_gemm.DTYPES == ("float32", "float64")


# ============================================================================ the fallback kernel

@requires_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_epilogue_module_compiles(dtype, tmp_path):
    from gpu_helpers import compile_for_sm90
    assert compile_for_sm90(gemm_epilogue.epilogue_source(dtype), tmp_path)


_BF16_SHIM = r"""
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { std::uint16_t bits; };
static inline float __bfloat162float(__nv_bfloat16 h)
{ std::uint32_t f = (std::uint32_t)h.bits << 16; float o; std::memcpy(&o, &f, 4); return o; }
static inline __nv_bfloat16 __float2bfloat16_rn(float v)
{
    std::uint32_t f; std::memcpy(&f, &v, 4); __nv_bfloat16 h;
    if ((f & 0x7fffffffu) > 0x7f800000u) { h.bits = (std::uint16_t)((f >> 16) | 0x40u); return h; }
    f += 0x7fffu + ((f >> 16) & 1u); h.bits = (std::uint16_t)(f >> 16); return h;
}
"""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_epilogue_kernel_on_the_host(dtype, tmp_path):
    """ge_bias_act on the CPU (tests/cuda_on_host.py): out + bias per column, then ReLU with
    NaN kept, computed in float and rounded once."""
    from cuda_on_host import build, requires_gxx  # noqa: F401
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    import ml_dtypes  # noqa: F401
    (tmp_path / "cuda_bf16.h").write_text(_BF16_SHIM)
    t = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}[dtype]
    lib = build(gemm_epilogue.epilogue_source(dtype),
                f"EMU_WRAP(run, ge_bias_act_{dtype}, ({t} *o, const {t} *b, long long r, "
                f"long long c, int relu), (o, b, r, c, relu))", tmp_path)
    rng = np.random.default_rng(0)
    out = rng.standard_normal((5, 7)).astype(dtype)
    out[1, 2] = np.nan
    bias = rng.standard_normal(7).astype(dtype)
    for relu in (0, 1):
        o = out.copy()
        lib.run(ctypes.c_longlong(2), ctypes.c_longlong(32), ctypes.c_longlong(1),
                ctypes.c_void_p(o.ctypes.data), ctypes.c_void_p(bias.ctypes.data),
                ctypes.c_longlong(5), ctypes.c_longlong(7), ctypes.c_int(relu))
        want = out.astype("float32") + bias.astype("float32")
        if relu:
            want = np.where(want < 0, 0, want)
        np.testing.assert_array_equal(o.astype("float32"), want.astype(dtype).astype("float32"))


# ============================================================================ on a GPU

def _rounded(rng, shape, dtype, scale=1.0):
    """Random values rounded to ``dtype``, as (device dtype array, float32 copy)."""
    import ml_dtypes  # noqa: F401
    a = (rng.standard_normal(shape) * scale).astype(dtype)
    return a, a.astype("float32")


def _close(got, want, dtype, k):
    """|got - want| within RTOL[dtype] of the scale of the product's terms (sqrt(k) * max)."""
    got = np.asarray(got).astype("float64")
    scale = max(np.abs(want).max(), 1.0)
    err = np.abs(got - want).max() / scale
    assert err < RTOL[dtype] * max(1.0, np.sqrt(k) / 8), (dtype, err)


def _gpu_dtypes():
    from symgpu.gpu.placement.type import gpu_supports_dtype
    return [d for d in HALF if gpu_supports_dtype(d)] or ["float16"]


@requires_gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mnk", [(256, 192, 320), (67, 45, 33)])
def test_gpu_half_dot_matches_float32_numpy(cuda, dtype, mnk):
    from symgpu.gpu.placement.type import gpu_supports_dtype
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"the GPU placement does not take {dtype} yet")
    m, n, k = mnk
    rng = np.random.default_rng(1)
    (hx, fx), (hy, fy) = _rounded(rng, (m, k), dtype), _rounded(rng, (k, n), dtype)
    x, y = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype)
    f = function([x, y], T.dot(x, y))
    assert _nodes(f, GpuDot22), _ops(f)
    got = f(hx, hy)
    assert got.dtype == np.dtype(dtype)
    _close(got, fx.astype("float64") @ fy, dtype, k)


@requires_gpu
@pytest.mark.parametrize("dtype", HALF)
def test_gpu_half_batched_and_gemm_match_float32_numpy(cuda, dtype):
    from symgpu.gpu.placement.type import gpu_supports_dtype
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime.array import to_gpu
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"the GPU placement does not take {dtype} yet")
    rng = np.random.default_rng(2)
    (ha, fa), (hb, fb) = _rounded(rng, (7, 33, 40), dtype), _rounded(rng, (7, 40, 18), dtype)
    a, b = T.tensor3("a", dtype=dtype), T.tensor3("b", dtype=dtype)
    f = function([a, b], T.matmul(a, b))
    assert _nodes(f, GpuBatchedDot), _ops(f)
    _close(f(ha, hb), np.matmul(fa.astype("float64"), fb), dtype, 40)
    # GpuGemm (beta z + alpha x @ y) built directly: half z, float32 alpha/beta
    (hz, fz), (hx, fx), (hy, fy) = (_rounded(rng, s, dtype) for s in
                                    ((64, 48), (64, 96), (96, 48)))
    g = lambda: GpuArrayType(dtype, (False, False), None)()    # noqa: E731
    z, x, y = g(), g(), g()
    out = GpuGemm(False)(z, -0.5, x, y, 0.75)
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph([z, x, y], [out], clone=False)
    vals = [to_gpu(v, cuda) for v in (hz, hx, hy)]
    storage = {v: [val] for v, val in zip([z, x, y], vals)}
    link(fg, storage)()
    got = np.asarray(storage[fg.outputs[0]][0].get()).astype("float64")
    _close(got, 0.75 * fz.astype("float64") - 0.5 * fx.astype("float64") @ fy, dtype, 96)


@requires_gpu
@pytest.mark.parametrize("dtype", HALF + ["float32"])
@pytest.mark.parametrize("act", ["none", "relu"])
def test_gpu_epilogue_layer_matches_float32_numpy(cuda, dtype, act):
    from symgpu.gpu.placement.type import gpu_supports_dtype
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"the GPU placement does not take {dtype} yet")
    rng = np.random.default_rng(3)
    (hx, fx), (hw, fw), (hb, fb) = (_rounded(rng, s, dtype) for s in
                                    ((128, 256), (256, 96), (96,)))
    x = T.matrix("x", dtype=dtype)
    W, b = shared(hw), shared(hb)
    z = T.dot(x, W) + b
    out = T.nnet.relu(z) if act == "relu" else z
    with config.change_flags(**{"gpuarray.gemm_epilogue": "all"}):
        f = function([x], out)
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.op.epilogue == ("relu_bias" if act == "relu" else "bias")
    want = fx.astype("float64") @ fw + fb
    if act == "relu":
        want = np.maximum(want, 0)
    for _ in range(3):                    # plain, captured, replayed
        _close(f(hx), want, dtype, 256)
