"""float16 and bfloat16 end to end on the CPU, every result checked against float32.

Inputs are drawn in float32 and rounded to the half type; the reference is the same
computation in float32 on those rounded inputs. Tolerances, per dtype (EPS is the distance
from 1 to the next value: 2**-10 for float16, 2**-7 for bfloat16):

* one rounding (a scalar-table row, a fused chain, a reduction or product that accumulates
  in float32 and rounds once): relative error <= ONE_ROUNDING = EPS / 2 plus a float32
  allowance, i.e. float16 ~1e-3·k and bfloat16 ~8e-3·k with k = 1;
* a value computed through a few rounded half intermediates (a gradient graph, which is
  built of several ops, each storing its half result): relative error <= CHAIN = 8 EPS,
  absolute floor CHAIN * the largest magnitude of the float32 result (values near zero
  after cancellation carry the rounding of their larger terms).

Reductions use lengths at which accumulating in the half type itself would fail these
tolerances (bfloat16's sum of 20000 * 0.1 was 32), so they prove float32 accumulation.
"""
from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_nvcc
from symgpu import config, function
from symgpu.scalar.basic import SCALAR_TABLE, Cast
from symgpu.scalar.composite import Composite
from symgpu.scalar.dtypes import HALF_DTYPES, upcast
from symgpu.tensor.elemwise import CAReduce, Elemwise
from symgpu.tensor.math import _ELEMWISE
from symgpu.tensor.nnet import conv2d
from symgpu.tensor.signal.pool import pool_2d

HALF = list(HALF_DTYPES)
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
ONE_ROUNDING = {d: e / 2 * 1.01 for d, e in EPS.items()}
CHAIN = {d: 8 * e for d, e in EPS.items()}
#: the smallest positive value (a subnormal): the absolute error of one rounding near 0
TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133}

#: input domains (low, high) where a row is defined and well-conditioned; (-2, 2) otherwise
DOMAIN = {"log": (0.1, 4), "log2": (0.1, 4), "log10": (0.1, 4), "log1p": (-0.5, 3),
          "sqrt": (0.1, 4), "arcsin": (-0.9, 0.9), "arccos": (-0.9, 0.9),
          "arctanh": (-0.9, 0.9), "arccosh": (1.1, 4), "erfinv": (-0.9, 0.9),
          "erfcinv": (0.1, 1.9), "gamma": (0.5, 4), "gammaln": (0.5, 4), "psi": (0.5, 4),
          "tri_gamma": (0.5, 4), "chi2sf": (0.5, 4), "reciprocal": (0.5, 3), "pow": (0.5, 2),
          "true_div": (0.5, 3), "int_div": (0.5, 3), "mod": (0.5, 3), "tan": (-1.2, 1.2)}
#: rows of integers and booleans only
BITWISE = {"and_", "or_", "xor", "invert"}
FLOAT_ROWS = [s.name for s in SCALAR_TABLE if s.name not in BITWISE]
#: rows with no gradient, or none Theano defines (tri_gamma, chi2sf), or a zero one
NO_GRAD = {"int_div", "tri_gamma", "chi2sf", "lt", "le", "gt", "ge", "eq", "neq", "isnan",
           "isinf", "sgn", "floor", "ceil", "round", "round_half_away_from_zero", "angle",
           "imag", "second"}
GRAD_ROWS = [n for n in FLOAT_ROWS if n not in NO_GRAD]


def draw(shape, dtype: str, low: float = -1.0, high: float = 1.0, seed: int = 0) -> np.ndarray:
    """Uniform values in [low, high) rounded to `dtype`."""
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32).astype(dtype)


def f32(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def assert_close(got, ref, rtol: float, atol: float = 0.0, what: str = "") -> None:
    got64, ref64 = np.asarray(got).astype(np.float64), np.asarray(ref).astype(np.float64)
    assert got64.shape == ref64.shape, (what, got64.shape, ref64.shape)
    err = np.abs(got64 - ref64)
    bad = err > rtol * np.abs(ref64) + atol
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} values off; worst got "
                           f"{got64[bad][:3]} for {ref64[bad][:3]} (rtol {rtol}, atol {atol})")


def assert_chain_close(got, ref, dtype: str, what: str = "") -> None:
    ref = np.asarray(ref, dtype=np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    assert_close(got, ref, CHAIN[dtype], CHAIN[dtype] * scale, what)


def half_and_f32(build, shapes, dtype, low=-1.0, high=1.0, grad=False):
    """Run `build(*symbolic)` (or, with `grad`, the gradients of sum(build(...) * w), w fixed
    weights in [0.5, 1.5) rounded to `dtype`, so that no gradient vanishes by symmetry, as
    softmax's would under a plain sum) in `dtype` and in float32 on the same rounded inputs:
    (half results, float32 results)."""
    vals = [draw(s, dtype, low, high, seed=k) for k, s in enumerate(shapes)]
    weights = []

    def run(d, inputs):
        xs = [T.tensor(dtype=d, shape=(None,) * len(s)) for s in shapes]
        out = build(*xs)
        outs = [out]
        if grad:
            if not weights:
                shape = function(xs, out.shape)(*inputs)
                weights.append(draw(tuple(shape), dtype, 0.5, 1.5, seed=99))
            outs = T.grad(T.sum(out * T.constant(weights[0].astype(d))), xs)
        res = function(xs, outs)(*inputs)
        for o, r in zip(outs, res):
            assert r.dtype.name == o.dtype, (r.dtype, o.dtype)
        return res
    return run(dtype, vals), run("float32", [f32(v) for v in vals])


# ----------------------------------------------------------------------------- the scalar table

@pytest.mark.parametrize("name", FLOAT_ROWS)
@pytest.mark.parametrize("dtype", HALF)
def test_scalar_row_values_round_once(dtype, name):
    """Each row in half equals the float32 row on the same inputs, rounded once."""
    op = _ELEMWISE[name]
    n = op.scalar_op.nin if op.scalar_op.nin > 0 else 2
    low, high = DOMAIN.get(name, (-2, 2))
    vals = [draw(200, dtype, low, high, seed=k) for k in range(n)]
    if name == "switch":
        vals[0] = (vals[0] > 0).astype(dtype)
    xs = [T.vector(dtype=dtype) for _ in range(n)]
    out = op(*xs)
    assert out.dtype == op.scalar_op.output_dtype(*[dtype] * n)
    got = function(xs, out)(*vals)
    assert got.dtype.name == out.dtype
    ref = np.asarray(op.scalar_op.impl(*[f32(v) for v in vals]))
    if got.dtype == bool:
        np.testing.assert_array_equal(got, ref)
    else:
        assert_close(got, ref, ONE_ROUNDING[dtype] if out.dtype in HALF else 1e-6,
                     TINY[dtype], f"{name} in {dtype}")


@pytest.mark.parametrize("name", GRAD_ROWS)
@pytest.mark.parametrize("dtype", HALF)
def test_scalar_row_gradients_match_float32(dtype, name):
    """The gradient of each differentiable row, built and run in half, against float32's."""
    op = _ELEMWISE[name]
    n = op.scalar_op.nin if op.scalar_op.nin > 0 else 2
    low, high = DOMAIN.get(name, (-2, 2))

    def build(*xs):
        if name == "switch":
            return op(T.gt(xs[0], 0), xs[1], xs[2])
        return op(*xs)
    got, ref = half_and_f32(build, [(64,)] * n, dtype, low, high, grad=True)
    for k, (g, r) in enumerate(zip(got, ref)):
        assert_chain_close(g, r, dtype, f"d{name}/dx{k} in {dtype}")


@pytest.mark.parametrize("fn", [T.exp, T.tanh, T.sigmoid, T.sqr, lambda x: x * T.sin(x),
                                lambda x: T.log1p(x * x) / (1 + T.abs(x))])
@pytest.mark.parametrize("dtype", HALF)
def test_verify_grad_in_half(dtype, fn):
    """verify_grad itself in half, with its per-dtype step and tolerance."""
    symgpu.gradient.verify_grad(fn, [draw((3, 4), dtype, -1, 1)], rng=1)


@pytest.mark.parametrize("dtype", HALF)
def test_fused_chain_rounds_once(dtype):
    """A fused chain computes in float32 and rounds its output once: it equals the exact
    value rounded to the half type, as the GPU's fused kernel does (the unfused chain
    rounds every intermediate)."""
    x, y = T.vector(dtype=dtype), T.vector(dtype=dtype)
    e = T.tanh(x * y + T.exp(-x)) / (1 + T.sqr(y)) - 0.25 * y
    f = function([x, y], e)
    (node,) = f.maker.fgraph.toposort()
    assert isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Composite)
    a, b = draw(2000, dtype, -1, 1, 1), draw(2000, dtype, -1, 1, 2)
    A, B = a.astype(np.float64), b.astype(np.float64)
    exact = np.tanh(A * B + np.exp(-A)) / (1 + B * B) - 0.25 * B
    assert_close(f(a, b), exact, ONE_ROUNDING[dtype], TINY[dtype], "fused chain")


@pytest.mark.parametrize("dtype", HALF)
def test_fused_constant_and_cast_inside(dtype):
    """A half constant keeps its value inside a fused program (its C and CUDA literal is a
    float), and an explicit cast to the half type inside the program still rounds (the
    product x * c, an intermediate, is not rounded: it stays in float32)."""
    x = T.vector(dtype=dtype)
    c = T.constant(1.5, dtype=dtype)
    e = T.cast(T.cast(x * c, "float32") / 3, dtype) * 3 + c
    f = function([x], e)
    assert "1.5" in str(f.maker.fgraph.toposort()[-1].op)
    v = draw(50, dtype, -4, 4)
    step = f32(v) * np.float32(1.5) / np.float32(3)
    ref = (step.astype(dtype).astype(np.float32) * 3 + np.float32(1.5)).astype(dtype)
    np.testing.assert_array_equal(f32(f(v)), f32(ref))


# ----------------------------------------------------------------------------- promotion, casts

PROMOTION = [("bfloat16", "bfloat16", "bfloat16"), ("bfloat16", "float16", "float32"),
             ("bfloat16", "float32", "float32"), ("bfloat16", "float64", "float64"),
             ("bfloat16", "bool", "bfloat16"), ("bfloat16", "int8", "bfloat16"),
             ("bfloat16", "uint8", "bfloat16"), ("bfloat16", "int16", "float32"),
             ("bfloat16", "uint16", "float32"), ("bfloat16", "int32", "float64"),
             ("bfloat16", "int64", "float64"), ("float16", "int8", "float16"),
             ("float16", "int16", "float32"), ("float16", "int32", "float64"),
             ("float16", "float32", "float32")]


@pytest.mark.parametrize("a,b,want", PROMOTION)
def test_promotion_table(a, b, want):
    """upcast, a symbolic product's dtype and its computed value's dtype agree."""
    assert upcast(a, b) == want and upcast(b, a) == want
    x, y = T.vector(dtype=a), T.vector(dtype=b)
    z = x * y + 1
    assert z.dtype == want
    xv = np.array([1, 2, 3]).astype(a)
    yv = np.array([1, 0, 3]).astype(b)
    r = function([x, y], z)(xv, yv)
    assert r.dtype.name == want
    np.testing.assert_array_equal(r.astype(np.float64), xv.astype(float) * yv.astype(float) + 1)


@pytest.mark.parametrize("dtype", HALF)
def test_casts_both_ways_and_their_gradient(dtype):
    x = T.vector(dtype=dtype)
    y = T.fvector()
    v = draw(20, dtype, -3, 3)
    w = draw(20, "float32", -3, 3)
    down = function([y], [T.cast(y, dtype), y.astype(dtype)])(w)
    for r in down:
        assert r.dtype.name == dtype
        np.testing.assert_array_equal(f32(r), f32(w.astype(dtype)))
    other = "float16" if dtype == "bfloat16" else "bfloat16"
    up, ints, cross = function([x], [T.cast(x, "float32"), x.astype("int32"), T.cast(x, other)])(v)
    np.testing.assert_array_equal(up, f32(v))
    np.testing.assert_array_equal(ints, f32(v).astype(np.int32))
    assert cross.dtype.name == other
    g = function([x], T.grad(T.sum(T.cast(x, "float32") * w), x))(v)
    assert g.dtype.name == dtype
    np.testing.assert_array_equal(f32(g), f32(w.astype(dtype)))


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("dtype", HALF)
def test_long_sum_accumulates_in_float32(dtype):
    """20000 * 0.1: accumulating in bfloat16 itself gives 32 (each add of 0.1 to 32 rounds
    back to 32); float32 accumulation gives 2000 to the half type's precision."""
    x = T.vector(dtype=dtype)
    v = np.full(20000, 0.1, dtype=dtype)
    s, m, c = function([x], [T.sum(x), T.mean(x), T.cumsum(x)])(v)
    exact = 20000 * float(v[0])
    assert s.dtype.name == m.dtype.name == c.dtype.name == dtype
    assert_close(s, exact, ONE_ROUNDING[dtype], what="sum")
    assert_close(m, float(v[0]), ONE_ROUNDING[dtype], what="mean")
    assert_close(c, np.arange(1, 20001) * float(v[0]), ONE_ROUNDING[dtype], what="cumsum")
    node = [n for n in function([x], T.sum(x)).maker.fgraph.toposort()
            if isinstance(n.op, CAReduce)]
    assert node and node[0].outputs[0].dtype == dtype


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduction", ["sum", "prod", "max", "min", "argmax", "argmin", "var"])
def test_reductions_along_an_axis(dtype, reduction):
    fn = getattr(T, reduction)
    low, high = (0.9, 1.1) if reduction == "prod" else (0, 1)
    got, ref = half_and_f32(lambda x: fn(x, axis=1), [(5, 3000)], dtype, low, high)
    if reduction.startswith("arg"):
        np.testing.assert_array_equal(got[0], ref[0])
    else:
        assert_close(got[0], ref[0], ONE_ROUNDING[dtype] + 1e-5, what=reduction)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduction", ["sum", "prod", "max", "mean"])
def test_reduction_gradients(dtype, reduction):
    fn = getattr(T, reduction)
    got, ref = half_and_f32(lambda x: fn(x, axis=0), [(6, 7)], dtype, 0.5, 1.5, grad=True)
    assert_chain_close(got[0], ref[0], dtype, f"grad of {reduction}")


# ----------------------------------------------------------------------------- softmax family

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_rows_accumulate_in_float32(dtype, fn):
    """Rows of 4000: a bfloat16 normaliser would be off by more than a percent."""
    op = getattr(T.nnet, fn)
    got, ref = half_and_f32(op, [(3, 4000)], dtype, -3, 3)
    assert_close(got[0], ref[0], ONE_ROUNDING[dtype] + 1e-5, TINY[dtype], fn)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "sigmoid", "relu", "softplus"])
def test_activation_gradients(dtype, fn):
    op = getattr(T.nnet, fn, None) or getattr(T, fn)
    got, ref = half_and_f32(op, [(4, 50)], dtype, -3, 3, grad=True)
    assert_chain_close(got[0], ref[0], dtype, f"grad of {fn}")


@pytest.mark.parametrize("dtype", HALF)
def test_categorical_crossentropy_and_gradient(dtype):
    """Integer labels (the rewritten -log_softmax[i, y_i] path) and one-hot rows."""
    y = np.array([3, 0, 7, 9], dtype="int32")
    onehot = np.eye(10, dtype=np.float32)[y]
    for labels in (y, onehot):
        def build(x, labels=labels):
            return T.nnet.categorical_crossentropy(T.nnet.softmax(x), T.constant(labels))
        val, val32 = half_and_f32(build, [(4, 10)], dtype, -3, 3)
        assert_close(val[0], val32[0], CHAIN[dtype], what="crossentropy")
        g, g32 = half_and_f32(build, [(4, 10)], dtype, -3, 3, grad=True)
        assert_chain_close(g[0], g32[0], dtype, "crossentropy gradient")


@pytest.mark.parametrize("dtype", HALF)
def test_binary_crossentropy_and_gradient(dtype):
    def build(p, t):
        return T.nnet.binary_crossentropy(T.nnet.sigmoid(p), t)
    val, val32 = half_and_f32(build, [(4, 6), (4, 6)], dtype, 0.1, 0.9)
    assert_close(val[0], val32[0], CHAIN[dtype], what="binary crossentropy")
    g, g32 = half_and_f32(build, [(4, 6), (4, 6)], dtype, 0.1, 0.9, grad=True)
    for a, b in zip(g, g32):
        assert_chain_close(a, b, dtype, "binary crossentropy gradient")


# ----------------------------------------------------------------------------- products

PRODUCTS = {
    "dot_mv": (lambda a, b: T.dot(a, b), [(5, 2048), (2048,)]),
    "dot_mm": (lambda a, b: T.dot(a, b), [(5, 2048), (2048, 3)]),
    "dot_vv": (lambda a, b: T.dot(a, b), [(2048,), (2048,)]),
    # c + 0.5 * dot: the product rounds once, the fused scale-and-add once more
    "gemm": (lambda a, b, c: c + 0.5 * T.dot(a, b), [(5, 2048), (2048, 3), (5, 3)]),
    "outer": (lambda a, b: T.outer(a, b), [(7,), (5,)]),
    "batched_dot": (lambda a, b: T.batched_dot(a, b), [(3, 4, 1024), (3, 1024, 2)]),
    "matmul": (lambda a, b: a @ b, [(3, 4, 1024), (3, 1024, 2)]),
    "tensordot": (lambda a, b: T.tensordot(a, b, axes=[[1, 2], [0, 1]]),
                  [(3, 32, 64), (32, 64, 2)]),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
@pytest.mark.parametrize("dtype", HALF)
def test_products_accumulate_in_float32(dtype, name):
    """Inner dimensions of 2048 positive terms: a half accumulator would drift by several
    units in the last place; a float32 one rounds once."""
    build, shapes = PRODUCTS[name]
    got, ref = half_and_f32(build, shapes, dtype, 0, 1)
    roundings = 2 if name == "gemm" else 1
    assert_close(got[0], ref[0], roundings * ONE_ROUNDING[dtype] + 1e-5, what=name)


@pytest.mark.parametrize("name", ["dot_mm", "dot_mv", "batched_dot", "tensordot"])
@pytest.mark.parametrize("dtype", HALF)
def test_product_gradients(dtype, name):
    build, shapes = PRODUCTS[name]
    shapes = [tuple(min(s, 40) for s in shape) for shape in shapes]
    got, ref = half_and_f32(build, shapes, dtype, -1, 1, grad=True)
    for k, (a, b) in enumerate(zip(got, ref)):
        assert_chain_close(a, b, dtype, f"{name} gradient {k}")


# ----------------------------------------------------------------------------- conv, pool, bn

@pytest.mark.parametrize("dtype", HALF)
def test_conv2d_forward_and_gradients(dtype):
    build = lambda x, w: conv2d(x, w, border_mode="half")  # noqa: E731
    got, ref = half_and_f32(build, [(2, 16, 8, 8), (4, 16, 3, 3)], dtype, 0, 1)
    assert_close(got[0], ref[0], ONE_ROUNDING[dtype] + 1e-5, what="conv2d")
    got, ref = half_and_f32(build, [(2, 3, 8, 8), (4, 3, 3, 3)], dtype, -1, 1, grad=True)
    for what, a, b in zip(("input", "filters"), got, ref):
        assert_chain_close(a, b, dtype, f"conv2d gradient wrt {what}")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["max", "sum", "average_exc_pad", "average_inc_pad"])
def test_pool_forward_and_gradient(dtype, mode):
    def build(x):
        return pool_2d(x, (3, 3), ignore_border=True, stride=(2, 2), pad=(1, 1), mode=mode)
    got, ref = half_and_f32(build, [(2, 3, 9, 9)], dtype, -1, 1)
    assert_close(got[0], ref[0], ONE_ROUNDING[dtype] + 1e-5, TINY[dtype], f"pool {mode}")
    got, ref = half_and_f32(build, [(2, 3, 9, 9)], dtype, -1, 1, grad=True)
    assert_chain_close(got[0], ref[0], dtype, f"pool {mode} gradient")


@pytest.mark.parametrize("dtype", HALF)
def test_batch_normalization_and_gradients(dtype):
    from symgpu.tensor.nnet import bn

    def build(x, g, b):
        return bn.batch_normalization_train(x, g, b, axes=(0,))[0]
    got, ref = half_and_f32(build, [(64, 5), (1, 5), (1, 5)], dtype, -1, 1)
    assert_chain_close(got[0], ref[0], dtype, "batch norm")
    got, ref = half_and_f32(build, [(64, 5), (1, 5), (1, 5)], dtype, -1, 1, grad=True)
    for what, a, b in zip(("x", "gamma", "beta"), got, ref):
        assert_chain_close(a, b, dtype, f"batch norm gradient wrt {what}")


# ----------------------------------------------------------------------------- variables

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["uniform", "normal", "binomial"])
@pytest.mark.parametrize("streams", ["RandomStreams", "MRG_RandomStreams"])
def test_random_draws(dtype, kind, streams):
    if streams == "RandomStreams":
        from symgpu.tensor.shared_randomstreams import RandomStreams as Streams
    else:
        from symgpu.sandbox.rng_mrg import MRG_RandomStreams as Streams
    srng = Streams(7)
    kw = {"p": 0.5} if kind == "binomial" else {}
    v = getattr(srng, kind)(size=(400, 500), dtype=dtype, **kw)
    r = function([], v)()
    assert v.dtype == r.dtype.name == dtype
    r = f32(r)
    if kind == "uniform":   # (0, 1): a float32 draw above 1 - 2**-9 rounds to a bfloat16 1.0
        assert 0 < r.min() and r.max() < 1 and abs(r.mean() - 0.5) < 0.01
    elif kind == "normal":
        assert abs(r.mean()) < 0.01 and abs(r.std() - 1) < 0.01
    else:
        assert set(np.unique(r)) == {0.0, 1.0} and abs(r.mean() - 0.5) < 0.01


@pytest.mark.parametrize("dtype", HALF)
def test_shared_variables_values_updates_and_pickling(dtype):
    s = symgpu.shared(np.ones(3, dtype), name="s")
    assert s.dtype == dtype and s.get_value().dtype.name == dtype
    s.set_value(np.arange(3).astype(dtype))
    step = function([], s * 2, updates=[(s, s * 1.5)])
    np.testing.assert_array_equal(f32(step()), [0, 2, 4])
    np.testing.assert_array_equal(f32(s.get_value()), [0, 1.5, 3])
    back = pickle.loads(pickle.dumps(s))
    assert back.dtype == dtype and back.get_value().dtype.name == dtype
    np.testing.assert_array_equal(f32(back.get_value()), [0, 1.5, 3])
    f2 = pickle.loads(pickle.dumps(step))
    np.testing.assert_array_equal(f32(f2()), [0, 3, 6])
    with pytest.raises(TypeError, match="safely"):
        s.set_value(np.ones(3, np.float64))


@pytest.mark.parametrize("dtype", HALF)
def test_inputs_accept_and_convert_values(dtype):
    """A half input takes float32 arrays only by an allowed downcast; a float32 input takes
    half arrays (a safe cast)."""
    x, y = T.vector(dtype=dtype), T.fvector()
    with pytest.raises(TypeError, match="safely"):
        function([x], x * 2)(np.ones(2, np.float32))
    r = function([x], x * 2, allow_input_downcast=True)(np.ones(2, np.float32))
    assert r.dtype.name == dtype
    np.testing.assert_array_equal(function([y], y * 2)(np.ones(2, dtype)), [2, 2])
    s = T.scalar(dtype=dtype)
    assert function([s], s * 2)(1.5).dtype.name == dtype   # a Python float


def test_floatx_bfloat16():
    with config.change_flags(floatX="bfloat16"):
        assert T.matrix().dtype == T.scalar().dtype == "bfloat16"
        assert (T.vector() + 1.5).dtype == "bfloat16"
        assert (T.ivector() + 1.5).dtype == "bfloat16"        # a Python float takes floatX
        assert T.constant(1.5).dtype == "bfloat16"
        assert symgpu.shared(1.5).dtype == "bfloat16"
        x = T.vector()
        r = function([x], T.sum(x * 0.5))(np.ones(4, "bfloat16"))
        assert r.dtype.name == "bfloat16" and float(r) == 2.0


@pytest.mark.parametrize("dtype", HALF)
def test_constants_and_constructors(dtype):
    c = T.constant(1.5, dtype=dtype)
    assert c.dtype == dtype and c.data.dtype.name == dtype and float(c.data) == 1.5
    prefix = {"float16": "h", "bfloat16": "bf"}[dtype]
    m = getattr(T, prefix + "matrix")("m")
    assert m.type is getattr(T, prefix + "matrix") and m.dtype == dtype
    assert getattr(T, prefix + "tensor4").ndim == 4
    a, b = getattr(T, prefix + "vectors")("a", "b")
    assert a.dtype == b.dtype == dtype and a.name == "a"
    assert len(getattr(T, prefix + "scalars")(3)) == 3
    assert T.tensor(dtype=dtype, shape=(None, 1)).type == getattr(T, prefix + "col")


@pytest.mark.parametrize("dtype", HALF)
def test_printing(dtype):
    from symgpu.d3viz.model import type_to_str
    x = T.vector("x", dtype=dtype)
    e = T.exp(x) * 2.5
    assert symgpu.printing.pp(e) == "(exp(x) * TensorConstant{2.5})"
    text = symgpu.printing.debugprint(function([x], e), file="str", print_type=True)
    assert f"TensorType({dtype}, vector)" in text and "2.5" in text
    assert type_to_str(x.type) == {"float16": "hvector", "bfloat16": "bfvector"}[dtype]


@pytest.mark.parametrize("dtype", HALF)
def test_debugmode_checks_half_graphs(dtype):
    """DebugMode runs the rewritten graph, compares it with the unrewritten one within the
    dtype's tolerance, and re-checks disagreements against a float64 run."""
    x, y = T.matrix(dtype=dtype), T.matrix(dtype=dtype)
    e = T.nnet.softmax(T.dot(x, y) * 0.5 + 1) + T.log1p(T.exp(x)).sum(axis=1, keepdims=True)
    f = function([x, y], e, mode="DebugMode")
    got = f(draw((4, 6), dtype, -1, 1, 1), draw((6, 6), dtype, -1, 1, 2))
    ref = function([x, y], e)(draw((4, 6), dtype, -1, 1, 1), draw((6, 6), dtype, -1, 1, 2))
    assert got.dtype.name == dtype
    np.testing.assert_array_equal(f32(got), f32(ref))


def test_ml_dtypes_is_the_bfloat16():
    """The dtype is ml_dtypes' (JAX's), so arrays pass between the libraries unchanged."""
    assert np.dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    x = T.vector(dtype="bfloat16")
    r = function([x], x + 1)(np.ones(2, ml_dtypes.bfloat16))
    assert r.dtype == ml_dtypes.bfloat16


LINALG = {
    "matrix_inverse": lambda m: T.nlinalg.matrix_inverse(m),
    "det": lambda m: T.nlinalg.det(m),
    "eigh": lambda m: T.nlinalg.eigh(m + m.T)[0],
    "svd": lambda m: T.nlinalg.svd(m)[1],
    "cholesky": lambda m: __import__("symgpu.tensor.slinalg").tensor.slinalg.cholesky(
        T.dot(m, m.T)),
    "solve": lambda m: __import__("symgpu.tensor.slinalg").tensor.slinalg.solve(
        m, T.ones_like(m[:, :1])),
    "rfft": lambda m: __import__("symgpu.tensor.fft").tensor.fft.rfft(m),
}


@pytest.mark.parametrize("name", sorted(LINALG))
@pytest.mark.parametrize("dtype", HALF)
def test_linear_algebra_and_fft(dtype, name):
    """LAPACK and pocketfft have no half kernels (NumPy's linalg refuses float16): the ops
    compute on float32 copies and round their results once. (Their inputs, m + 4 I and the
    like, are half results themselves: a chain of roundings.)"""
    def build(m):
        return LINALG[name](m + 4 * T.eye(4, dtype=m.dtype))
    got, ref = half_and_f32(build, [(4, 4)], dtype, -1, 1)
    assert_chain_close(got[0], ref[0], dtype, name)
    if name in ("matrix_inverse", "det", "solve"):
        got, ref = half_and_f32(build, [(4, 4)], dtype, -1, 1, grad=True)
        assert_chain_close(got[0], ref[0], dtype, f"{name} gradient")


@pytest.mark.parametrize("dtype", HALF)
def test_half_elemwise_never_reaches_the_c_compiler(dtype):
    """The compiled C loops take neither half type: a fused half chain has no C source (it
    runs the NumPy program), so nothing half ever reaches the C compiler."""
    from symgpu.tensor.c_elemwise import c_source
    x, y = T.vector(dtype=dtype), T.vector(dtype=dtype)
    f = function([x, y], T.exp(x) * y + T.sqr(x), mode="FAST_RUN")
    nodes = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, (Elemwise, CAReduce))]
    assert nodes and all(c_source(n) is None for n in nodes)
    xf, yf = T.fvector(), T.fvector()   # the same program in float32 has a C source
    g = function([xf, yf], T.exp(xf) * yf + T.sqr(xf), mode="FAST_RUN")
    assert any(c_source(n) is not None for n in g.maker.fgraph.toposort())


CUDA_CAST = {"float16": "__half2float(__float2half_rn((float)(x[i])))",
             "bfloat16": "__bfloat162float(__float2bfloat16_rn((float)(x[i])))"}


@pytest.mark.parametrize("dtype", HALF)
def test_cuda_cast_to_half_rounds(dtype):
    """The Cast row's CUDA form rounds to the half type (and goes on in float), as the host
    does: a cast inside a fused GPU kernel is not a no-op."""
    assert Cast(dtype).cuda("float32", ["x[i]"]) == CUDA_CAST[dtype]


@requires_nvcc
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_cast_to_half_compiles(dtype, tmp_path):
    from gpu_helpers import compile_for_sm90
    src = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
           'extern "C" __global__ void k(const float *x, float *o)\n'
           f"{{ int i = threadIdx.x; o[i] = {CUDA_CAST[dtype]}; }}\n")
    assert compile_for_sm90(src, tmp_path)
