"""A mixed-precision layer's bias add in its product's epilogue (gpu/ops/gemm_epilogue.py):
``Cast{half}(Cast{float32}(dot(x, W)) + b)`` of a half product and a float32 bias (a float32
master weight's) -> GpuGemmEpilogue{bias} of the bias cast to the half dtype (autocast's
rounding of a linear layer's bias), directly or through the reshape of a 3-d activation
(then the reshape).

On the CPU: the rewritten graphs (vgpu; ``mixed_precision`` bfloat16 and float16, the GPT
block's qkv projection, whose bias cast joins the weights' cast group).  On a GPU
(``pytest -m gpu``): values against NumPy within one half-precision ulp of the result and of
the bias (the epilogue adds the rounded bias to the float32 accumulator and rounds once;
the unfused graph rounds the product, then the sum).
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import config, function, shared
from symgpu.gpu.ops import blaslt, gemm_epilogue
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
    """The one GpuGemmEpilogue of ``f``, checked: a half bias vector computed from the float32
    one, a half output, the reshape of a 3-d activation after it, and no elementwise kernel
    reading the result."""
    (node,) = _nodes(f, GpuGemmEpilogue)
    assert node.op.epilogue == "bias"
    assert node.inputs[2].dtype == dtype and node.inputs[2].ndim == 1
    assert node.inputs[2].owner is not None, "the float32 bias, cast"
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
def test_the_bias_of_a_layer_feeding_a_half_product_folds(vgpu, dtype, nd):
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
    """Either order of the float32 sum; a half bias cast to float32 is read as it is, a
    float32 one is cast to the product's dtype."""
    from symgpu.scalar.basic import Cast
    fg = _by_hand(dtype, bias_first, dtype if bias_dtype == "half" else "float32")
    assert gemm_epilogue.gpu_gemm_epilogue(fg) == 1
    node = fg.outputs[0].owner
    assert type(node.op) is GpuGemmEpilogue
    if bias_dtype == "half":
        assert node.inputs[2] is fg.inputs[2]
        assert [type(n.op) for n in fg.toposort()] == [GpuGemmEpilogue]
    else:
        cast = node.inputs[2].owner
        assert type(cast.op) is GpuElemwise and cast.op.scalar_op == Cast(dtype)
        assert cast.inputs[0] is fg.inputs[2]
        assert [type(n.op) for n in fg.toposort()] == [GpuElemwise, GpuGemmEpilogue]


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
    projection's bias add was a separate 8192 x 2304 bfloat16 pass after the product; its
    bias's cast joins the group that casts the weights."""
    f = gpt_step()
    (node,) = [n for n in _nodes(f, GpuGemmEpilogue) if n.op.epilogue == "bias"]
    assert node.inputs[2].dtype == "bfloat16" and node.outputs[0].dtype == "bfloat16"
    assert type(node.inputs[2].owner.op).__name__ == "GpuElemwiseGroup"
    (reshape,) = _readers(f, node.outputs[0])
    assert {type(c.op) for c in _readers(f, reshape.outputs[0])} == {GpuSubtensor}, \
        "read as q, k, v and the gradient's zero tail"


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
    # bias not: the epilogue reads it rounded to the half dtype
    ha = rng.standard_normal(shape).astype(dtype).astype("float32")
    hw = (rng.standard_normal((k, n)) / 8).astype(dtype).astype("float32")
    hb = (rng.standard_normal(n) * 3 + 1 / 3).astype("float32")
    a = T.matrix("a") if nd == 2 else T.tensor3("a")
    W, b = shared(hw, name="W"), shared(hb, name="b")
    with config.change_flags(mixed_precision=dtype, **{"gpuarray.cublaslt": lt}):
        f = function([a], T.cast(T.dot(a, W) + b, dtype))
    _the_fused(f, dtype, nd)
    product = ha.astype("float64") @ hw.astype("float64")
    want = product + hb
    tol = _ulp(np.maximum(np.abs(want), np.abs(product)), dtype) + _ulp(hb, dtype) / 2 + \
        2.0 ** -16 * np.abs(want).max()
    for _ in range(3):                    # plain, captured, replayed
        got = np.asarray(f(ha))
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        err = np.abs(got.astype("float64") - want)
        assert (err <= tol).all(), (dtype, nd, lt, float((err / tol).max()))
    assert runs, "the GpuGemmEpilogue node ran"
    if lt:   # cuBLASLt ran the epilogue (a plan is kept only where it offered one)
        assert [p for _, p in blaslt.cublaslt().plans
                if p.dtype == dtype and p.epilogue == blaslt.EPILOGUE_BIAS], "cuBLASLt declined"
