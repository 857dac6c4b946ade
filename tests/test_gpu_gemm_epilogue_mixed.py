"""A mixed-precision layer's bias add in its product's epilogue (gpu/ops/gemm_epilogue.py):
``Cast{half}(Cast{float32}(dot(x, W)) + b)`` of a half product and a float32 bias (a float32
master weight's) -> GpuGemmEpilogue{bias} with the float32 bias and a half output, directly
or through the reshape of a 3-d activation (then the reshape).

On the CPU: the rewritten graphs (vgpu; ``mixed_precision`` bfloat16 and float16, the GPT
block's qkv projection), the cuBLASLt problem and descriptor of a float32 bias (a fake
libcublasLt), the thunk's routing, and the fallback kernel ``ge_bias_act_<half>_float32``
run on the host emulator against NumPy and compiled by nvcc for sm_90.  On a GPU
(``pytest -m gpu``): values against NumPy within one half-precision ulp (the epilogue rounds
the float32 sum once; the unfused graph rounds the product, then the sum).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import FakeCtx, fake_gpu_array, recording_loader, requires_gpu, requires_nvcc
from symgpu import config, function, shared
from symgpu.gpu.ops import blas, blaslt, gemm_epilogue
from symgpu.gpu.ops.blas import GpuDot22
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.placement.basic_ops import GpuReshape

HALF = ["bfloat16", "float16"]


def _nodes(f, cls):
    return [n for n in f.maker.fgraph.toposort() if type(n.op) is cls]


def _readers(f, var):
    return [c for c, _ in f.maker.fgraph.clients[var] if c != "output"]


def _layer(nd, cols=5):
    """(a, W, b): a 2-d or 3-d float32 activation, float32 master weights and bias."""
    a = T.matrix("a") if nd == 2 else T.tensor3("a")
    W = shared(np.ones((4, cols), "float32"), name="W")
    b = shared(np.ones(cols, "float32"), name="b")
    return a, W, b


def _the_fused(f, dtype, nd):
    """The one GpuGemmEpilogue of ``f``, checked: a float32 bias vector, a half output, the
    reshape of a 3-d activation after it, and no elementwise kernel reading the result."""
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.op.epilogue == "bias"
    assert node.inputs[2].dtype == "float32" and node.inputs[2].ndim == 1
    assert node.outputs[0].dtype == dtype
    out = node.outputs[0]
    if nd == 3:
        (reshape,) = _readers(f, out)
        assert type(reshape.op) is GpuReshape and reshape.outputs[0].ndim == 3
        out = reshape.outputs[0]
    assert not [c for c in _readers(f, out) if type(c.op) is GpuElemwise], _readers(f, out)
    return node


# ============================================================================ the rewrite

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("nd", [2, 3])
def test_the_bias_of_a_layer_feeding_a_half_product_folds_in_float32(vgpu, dtype, nd):
    a, W, b = _layer(nd)
    W2 = shared(np.ones((5, 3), "float32"), name="W2")
    with config.change_flags(mixed_precision=dtype):
        f = function([a], T.dot(T.dot(a, W) + b, W2))
    _the_fused(f, dtype, nd)
    assert len(_nodes(f, GpuDot22)) == 1, "the second product"


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("order", ["dot + b", "b + dot"])
def test_a_half_cast_of_the_sum_folds_in_either_order(vgpu, dtype, nd, order):
    a, W, b = _layer(nd)
    z = T.dot(a, W) + b if order == "dot + b" else b + T.dot(a, W)
    with config.change_flags(mixed_precision=dtype):
        f = function([a], T.cast(z, dtype))
    _the_fused(f, dtype, nd)
    assert not _nodes(f, GpuDot22)


def _by_hand(dtype, bias_first, bias_dtype="float32"):
    """``Cast{half}(Cast{float32}(GpuDot22(x, W)) + GpuDimShuffle{x,0}(b))`` built of GPU
    ops, the sum's operands in the order asked (no canonicalisation to reorder them)."""
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.graph.fg import FunctionGraph
    from symgpu.scalar.basic import SCALAR_OPS, Cast
    x, W = (GpuArrayType(dtype, (False, False), None)() for _ in range(2))
    b = GpuArrayType(bias_dtype, (False,), None)()
    p = GpuElemwise(Cast("float32"))(GpuDot22()(x, W))
    d = GpuDimShuffle((False,), ("x", 0))(b)
    if bias_dtype != "float32":
        d = GpuElemwise(Cast("float32"))(d)
    s = GpuElemwise(SCALAR_OPS["add"])(*((d, p) if bias_first else (p, d)))
    return FunctionGraph([x, W, b], [GpuElemwise(Cast(dtype))(s)], clone=False)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("bias_dtype", ["float32", "half"])
def test_the_pass_on_a_hand_built_graph(vgpu, dtype, bias_first, bias_dtype):
    """Either order of the float32 sum; a half bias cast to float32 is read as it is."""
    fg = _by_hand(dtype, bias_first, dtype if bias_dtype == "half" else "float32")
    assert gemm_epilogue.gpu_gemm_epilogue(fg) == 1
    node = fg.outputs[0].owner
    assert type(node.op) is GpuGemmEpilogue and node.inputs[2] is fg.inputs[2]
    assert [type(n.op) for n in fg.toposort()] == [GpuGemmEpilogue]


def test_a_half_bias_folds_through_the_reshape_too(vgpu):
    """Today's half ``dot + b`` (bias of the product's dtype), with a 3-d activation."""
    a = T.tensor3("a", dtype="float16")
    W = shared(np.ones((4, 5), "float16"), name="W")
    b = shared(np.ones(5, "float16"), name="b")
    f = function([a], T.dot(a, W) + b)
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.inputs[2].dtype == "float16"
    assert [type(c.op) for c in _readers(f, node.outputs[0])] == [GpuReshape]


def test_a_reshape_that_splits_the_columns_is_left_alone(vgpu):
    """(m, 6) seen as (m, 2, 3) plus a bias of 3: not a bias per column of the product."""
    x = T.matrix("x", dtype="float16")
    W = shared(np.ones((4, 6), "float16"), name="W")
    b = shared(np.ones(3, "float16"), name="b")
    f = function([x], T.dot(x, W).reshape((x.shape[0], 2, 3)) + b)
    assert not _nodes(f, GpuGemmEpilogue) and _nodes(f, GpuDot22)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("nd", [2, 3])
def test_a_product_read_by_something_else_is_left_alone(vgpu, dtype, nd):
    a, W, b = _layer(nd)
    p = T.dot(a, W)
    with config.change_flags(mixed_precision=dtype):
        f = function([a], [T.cast(p + b, dtype), p * 2])
    assert not _nodes(f, GpuGemmEpilogue) and _nodes(f, GpuDot22)


@pytest.mark.parametrize("dtype", HALF)
def test_the_flag_off_leaves_it_alone(vgpu, dtype):
    a, W, b = _layer(3)
    with config.change_flags(mixed_precision=dtype, **{"gpuarray.gemm_epilogue": "off"}):
        f = function([a], T.cast(T.dot(a, W) + b, dtype))
    assert not _nodes(f, GpuGemmEpilogue) and _nodes(f, GpuDot22)


def test_a_gradients_zero_tail_moves_onto_the_fused_product(vgpu):
    """A GPT's qkv: q, k, v sliced from ``dot(x, w) + b`` feed half products, and their
    gradient joins a zero tail ``second(p[:, :, 12:], 0)`` that reads the product for its
    shape only.  That reader follows the product into the epilogue's result; the gradient
    graph reads the bias separately."""
    x = T.tensor3("x")
    w = shared(np.ones((5, 12), "float32"), name="w")
    b = shared(np.ones(12, "float32"), name="b")
    qkv = T.dot(x, w) + b
    q, k, v = (qkv[:, :, j * 4:(j + 1) * 4] for j in range(3))
    cost = T.sum(T.matmul(T.matmul(q, k.dimshuffle(0, 2, 1)), v))
    with config.change_flags(mixed_precision="bfloat16"):
        f = function([x], [cost] + T.grad(cost, [w, b]))
    node = _the_fused(f, "bfloat16", 3)
    (reshape,) = _readers(f, node.outputs[0])
    slices = sorted(str(c.op) for c in _readers(f, reshape.outputs[0]))
    assert slices == ["GpuSubtensor{:, :, 0:4}", "GpuSubtensor{:, :, 12:}",
                      "GpuSubtensor{:, :, 4:8}", "GpuSubtensor{:, :, 8:12}"], slices


def test_the_gpt_blocks_qkv_bias_is_in_the_products_epilogue(vgpu, gpt_step):
    """benchmarks/half_symgpu.py's GPT block (bfloat16, float32 master weights): the qkv
    projection's bias add was a separate 8192 x 2304 bfloat16 pass after the product."""
    f = gpt_step()
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.inputs[2].dtype == "float32" and node.outputs[0].dtype == "bfloat16"
    (reshape,) = _readers(f, node.outputs[0])
    assert {type(c.op) for c in _readers(f, reshape.outputs[0])} == {GpuSubtensor}, \
        "read as q, k, v and the gradient's zero tail"


def test_the_op_takes_a_float32_bias_for_half_products_only(vgpu):
    from symgpu.gpu.placement.type import GpuArrayType
    g = lambda dt, nd: GpuArrayType(dt, (False,) * nd, None)()   # noqa: E731
    for dtype in HALF:
        out = GpuGemmEpilogue("relu_bias")(g(dtype, 2), g(dtype, 2), g("float32", 1))
        assert out.dtype == dtype
    for x, bias in (("float32", "float16"), ("float64", "float32"), ("bfloat16", "float16")):
        with pytest.raises(TypeError, match=f"got x {x}, y {x}, b {bias}"):
            GpuGemmEpilogue()(g(x, 2), g(x, 2), g(bias, 1))


# ============================================================================ cuBLASLt, faked

def _problem(bias_dtype=None):
    return blaslt.LtProblem("bfloat16", False, 0, 0, 64, 32, 16, 64, 16, 64, False, 1, 0, 0,
                            0, blaslt.EPILOGUE_BIAS, (256, 256, 256), bias_dtype)


def test_a_float32_bias_sets_the_bias_data_type_and_is_its_own_problem(monkeypatch):
    from test_gpu_half_blas import _fake_lt
    lt = _fake_lt(monkeypatch)
    wide, own = _problem("float32"), _problem()
    assert wide != own and hash(wide) != hash(own)
    plans = [lt.plan(FakeCtx(), p) for p in (wide, own)]
    assert plans[0] is not plans[1] and len(lt.plans) == 2, "one plan per bias dtype"
    sets = [a[1:3] for n, a in lt.lib.calls if n == "cublasLtMatmulDescSetAttribute"]
    assert sets.count([26, 0]) == 1, "CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUDA_R_32F, once"
    assert [7, blaslt.EPILOGUE_BIAS] in sets
    families = blaslt.size_families("dev", wide)
    assert all(fam[2].bias_dtype == "float32" for fam, _ in families)


@pytest.mark.parametrize("declined", [False, True])
def test_the_thunk_passes_the_float32_bias_or_runs_its_kernel_after_classic(monkeypatch,
                                                                           declined):
    from test_gpu_half_blas import _FakeClassic
    from symgpu.gpu.placement.rewriting import virtual_context
    ctx, classic, lt_calls, launches = FakeCtx(), _FakeClassic(), [], []
    monkeypatch.setattr(blas, "_cublas", classic)
    monkeypatch.setattr(blaslt, "lt_available", lambda dtype: True)
    monkeypatch.setattr(gemm_epilogue.launch, "load_kernels", recording_loader(launches))

    def lt_matmul(ctx_, p, alpha, a, b, beta, d, bias=0):
        lt_calls.append(dict(p=p, bias=bias))
        if declined:
            raise blaslt.LtUnsupported("faked")
    monkeypatch.setattr(blaslt, "lt_matmul", lt_matmul)
    from symgpu.gpu.placement.type import GpuArrayType
    with virtual_context("mixed-fake"):
        g = lambda dt, nd: GpuArrayType(dt, (False,) * nd, "mixed-fake")()   # noqa: E731
        node = GpuGemmEpilogue("bias")(g("bfloat16", 2), g("bfloat16", 2),
                                       g("float32", 1)).owner
        x, w = fake_gpu_array(ctx, (6, 5), "bfloat16"), fake_gpu_array(ctx, (5, 7), "bfloat16")
        bias = fake_gpu_array(ctx, (7,), "float32")
        storage = {v: [val] for v, val in zip(node.inputs, (x, w, bias))}
        storage[node.outputs[0]] = [None]
        thunk = node.op._thunk(node, storage, ctx)
        thunk()
    out = storage[node.outputs[0]][0]
    assert out.dtype == np.dtype("bfloat16")
    (call,) = lt_calls
    assert call["p"].bias_dtype == "float32" and call["bias"] == bias.ptr
    if declined:
        assert [c[0] for c in classic.calls] == ["gemm"]
        (name, grid, block, args), = launches
        assert name == "ge_bias_act_bfloat16_float32"
        assert args == (out.ptr, bias.ptr, 6, 7, 0)
    else:
        assert not classic.calls and not launches


# ======================================================================== the fallback kernel

@requires_nvcc
@pytest.mark.parametrize("dtype", HALF)
def test_the_float32_bias_kernel_compiles_for_sm90(dtype, tmp_path):
    from gpu_helpers import compile_for_sm90
    cubin = compile_for_sm90(gemm_epilogue.epilogue_source(dtype, "float32"), tmp_path)
    assert f"ge_bias_act_{dtype}_float32".encode() in cubin


def _wide_bias(rng, n):
    """A float32 bias whose values a half dtype cannot hold (so reading it rounded shows)."""
    return (rng.standard_normal(n) * 3 + 1 / 3).astype("float32")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("relu", [False, True])
def test_the_float32_bias_kernel_on_the_emulator(monkeypatch, tmp_path, dtype, relu):
    """ge_bias_act_<half>_float32 run on the host: half out + float32 bias summed in float,
    rounded once, ReLU keeping NaN."""
    import ml_dtypes  # noqa: F401
    from emulated_gpu import device_array, emulated_kernel_device, host_view
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    rng = np.random.default_rng(7)
    start = (rng.standard_normal((37, 29)) * 4).astype(dtype)
    start[3, 5] = np.nan
    bias = _wide_bias(rng, 29)
    epi = gemm_epilogue._Epilogue(ctx, dtype, "relu_bias" if relu else "bias", "float32")
    assert epi.bias_type == "float32"
    out = device_array(ctx, start)
    epi.apply(ctx, out, device_array(ctx, bias))
    want = start.astype("float32") + bias
    if relu:
        want = np.where(want < 0, np.float32(0), want)
    got = host_view(out).astype("float32")
    np.testing.assert_array_equal(got, want.astype(dtype).astype("float32"))
    rounded_first = start.astype("float32") + bias.astype(dtype).astype("float32")
    if relu:
        rounded_first = np.where(rounded_first < 0, np.float32(0), rounded_first)
    assert (got != rounded_first.astype(dtype).astype("float32")).any(), \
        "the bias is read in float32, not rounded to the output's dtype first"


def _host_matrix(ptr, shape, dtype):
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    return raw.view(dtype).reshape(shape)


class _ComputingClassic:
    """Classic cuBLAS on host memory: C-ordered (m x k) @ (k x n), summed in float32 and
    rounded once to the product's dtype (what cublasGemmEx does, up to summation order)."""

    def __init__(self, dtype):
        self.dtype, self.calls = dtype, []
        self.gemm = {dtype: self._gemm}

    def _gemm(self, h, ta, tb, n, m, k, alpha, y, lda, x, ldb, beta, out, ldc):
        assert (ta, tb, lda, ldb, ldc) == (0, 0, n, k, n), "C-ordered operands"
        xs = _host_matrix(x.value, (m, k), self.dtype).astype("float32")
        ys = _host_matrix(y.value, (k, n), self.dtype).astype("float32")
        _host_matrix(out.value, (m, n), self.dtype)[...] = (xs @ ys).astype(self.dtype)
        self.calls.append((m, n, k))
        return 0

    def handle(self, ctx):
        return ctypes.c_void_p(1)

    def math_mode(self, h, mode):
        pass

    check = staticmethod(blas._Cublas.check)


@pytest.mark.parametrize("dtype", HALF)
def test_the_op_without_cublaslt_on_the_emulator(monkeypatch, tmp_path, dtype):
    """GpuGemmEpilogue's own thunk where cuBLASLt is off: the product (classic cuBLAS, on
    host memory), then ge_bias_act_<half>_float32 on the emulator, against NumPy."""
    import ml_dtypes  # noqa: F401
    from emulated_gpu import device_array, emulated_kernel_device, host_view
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import GpuArrayType
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    classic = _ComputingClassic(dtype)
    monkeypatch.setattr(blas, "_cublas", classic)
    monkeypatch.setattr(blaslt, "lt_available", lambda d: False)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((33, 20)).astype(dtype)
    w = (rng.standard_normal((20, 27)) / 4).astype(dtype)
    bias = _wide_bias(rng, 27)
    with virtual_context("mixed-emulated"):
        g = lambda dt, nd: GpuArrayType(dt, (False,) * nd, "mixed-emulated")()  # noqa: E731
        node = GpuGemmEpilogue("relu_bias")(g(dtype, 2), g(dtype, 2), g("float32", 1)).owner
    vals = [device_array(ctx, v) for v in (x, w, bias)]
    storage = {v: [val] for v, val in zip(node.inputs, vals)}
    storage[node.outputs[0]] = [None]
    node.op._thunk(node, storage, ctx)()
    assert classic.calls == [(33, 27, 20)]
    got = host_view(storage[node.outputs[0]][0]).astype("float32")
    product = (x.astype("float32") @ w.astype("float32")).astype(dtype).astype("float32")
    want = np.maximum(product + bias, np.float32(0)).astype(dtype).astype("float32")
    np.testing.assert_array_equal(got, want)


# ============================================================================ on a GPU

#: explicit mantissa bits
_MANTISSA = {"float16": 10, "bfloat16": 7}
_MIN_EXP = {"float16": -14, "bfloat16": -126}


def _ulp(v, dtype):
    """One ``dtype`` ulp at the magnitudes ``v``."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** _MIN_EXP[dtype])))
    return 2.0 ** (e - _MANTISSA[dtype])


def _counting_thunks(monkeypatch) -> list:
    """GpuGemmEpilogue thunks report each plain run (a CUDA graph's replays run none)."""
    runs: list = []
    real = GpuGemmEpilogue._thunk

    def thunk(self, node, storage_map, ctx):
        inner = real(self, node, storage_map, ctx)

        def run():
            runs.append(node)
            inner()
        run.__dict__.update(inner.__dict__)
        return run
    monkeypatch.setattr(GpuGemmEpilogue, "_thunk", thunk)
    return runs


@requires_gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "fallback-kernel"])
def test_gpu_mixed_bias_epilogue_matches_numpy(cuda, monkeypatch, dtype, nd, lt):
    from symgpu.gpu.placement.type import gpu_supports_dtype
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"the GPU placement does not take {dtype}")
    import ml_dtypes  # noqa: F401
    runs = _counting_thunks(monkeypatch)
    rng = np.random.default_rng(9)
    k, n = 256, 96
    shape = (128, k) if nd == 2 else (4, 32, k)
    # activation and weight exact in the half dtype (the policy's casts lose nothing), the
    # bias not: it is read in float32
    ha = rng.standard_normal(shape).astype(dtype).astype("float32")
    hw = (rng.standard_normal((k, n)) / 8).astype(dtype).astype("float32")
    hb = _wide_bias(rng, n)
    a = T.matrix("a") if nd == 2 else T.tensor3("a")
    W, b = shared(hw, name="W"), shared(hb, name="b")
    with config.change_flags(mixed_precision=dtype, **{"gpuarray.cublaslt": lt}):
        f = function([a], T.cast(T.dot(a, W) + b, dtype))
    _the_fused(f, dtype, nd)
    product = ha.astype("float64") @ hw.astype("float64")
    want = product + hb
    tol = _ulp(np.maximum(np.abs(want), np.abs(product)), dtype) + \
        2.0 ** -16 * np.abs(want).max()
    for _ in range(3):                    # plain, captured, replayed
        got = np.asarray(f(ha))
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        err = np.abs(got.astype("float64") - want)
        assert (err <= tol).all(), (dtype, nd, lt, float((err / tol).max()))
    assert runs, "the GpuGemmEpilogue node ran"
    if lt:   # cuBLASLt took the float32 bias (a plan is kept only where it offered one)
        assert [p for _, p in blaslt.cublaslt().plans
                if p.dtype == dtype and p.bias_dtype == "float32"], "cuBLASLt declined"
