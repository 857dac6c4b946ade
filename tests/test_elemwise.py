"""Elementwise functions and operators against NumPy: every row of the scalar table, the
tensor language's functions and operators, broadcasting (static row/col types, different
ndims, random shapes) and the floating-point edge cases (division by zero, NaN, inf)."""
from __future__ import annotations

import itertools
import operator
import shutil
import subprocess

import numpy as np
import symgpu
import pytest
import scipy.special as sps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import symgpu.tensor as T
from symgpu import config, function
from symgpu.scalar.basic import SCALAR_OPS, Cast, cuda_expression
from symgpu.tensor.elemwise import Elemwise

RNG = np.random.default_rng(42)


def run(inputs, outputs, *values):
    return function(list(inputs), outputs, on_unused_input="ignore")(*values)


# ----------------------------------------------------------------------------- unary rows
# name -> (numpy reference, domain) ; domain: "any", "pos" (x > 0), "gt-1" (x > -1), "unit"

UNARY = {
    "exp": (np.exp, "any"), "exp2": (np.exp2, "any"), "expm1": (np.expm1, "any"),
    "log": (np.log, "pos"), "log2": (np.log2, "pos"), "log10": (np.log10, "pos"),
    "log1p": (np.log1p, "gt-1"), "sqrt": (np.sqrt, "pos"), "sqr": (np.square, "any"),
    "abs": (np.abs, "any"), "sgn": (np.sign, "any"), "neg": (np.negative, "any"),
    "tanh": (np.tanh, "any"), "sigmoid": (sps.expit, "any"),
    "softplus": (lambda v: np.logaddexp(0, v), "any"), "sin": (np.sin, "any"),
    "cos": (np.cos, "any"), "tan": (np.tan, "unit"), "arctan": (np.arctan, "any"),
    "sinh": (np.sinh, "any"), "cosh": (np.cosh, "any"), "erf": (sps.erf, "any"),
    "floor": (np.floor, "any"), "ceil": (np.ceil, "any"), "round": (np.round, "any"),
    "reciprocal": (np.reciprocal, "pos"), "identity": (lambda v: v, "any"),
    "isnan": (np.isnan, "any"), "isinf": (np.isinf, "any"),
}
UNARY["round_half_away_from_zero"] = (
    lambda v: np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5)).astype(v.dtype), "any")
UNARY.update({"arcsin": (np.arcsin, "unit"),
              "arccos": (np.arccos, "unit"), "arcsinh": (np.arcsinh, "any"),
              "arccosh": (np.arccosh, "pos"),
              "arctanh": (np.arctanh, "unit"), "deg2rad": (np.deg2rad, "any"),
              "rad2deg": (np.rad2deg, "any")})
UNARY.update({"erfc": (sps.erfc, "any"), "erfinv": (sps.erfinv, "unit"),
              "erfcinv": (sps.erfcinv, "pos"), "gamma": (sps.gamma, "pos"),
              "gammaln": (sps.gammaln, "pos"), "psi": (sps.psi, "pos"),
              "tri_gamma": (lambda v: sps.polygamma(1, v).astype(v.dtype), "pos")})
# Theano's complex parts on real inputs (complex ones: tests/test_theano_names_more.py);
# angle is float64 whatever the input, as Theano's
UNARY.update({"real": (np.real, "any"), "imag": (np.imag, "any"),
              "angle": (lambda v: np.angle(v).astype("float64"), "any")})
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "true_div": np.true_divide,
    "int_div": np.floor_divide, "mod": np.mod, "pow": np.power, "maximum": np.maximum,
    "minimum": np.minimum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "neq": np.not_equal,
}
BINARY["arctan2"] = np.arctan2
BINARY["chi2sf"] = lambda x, k: sps.chdtrc(k, x)
BINARY.update({"jv": sps.jv, "iv": sps.iv})   # order first, as scipy
UNARY.update({"trunc": (np.trunc, "any"), "erfcx": (sps.erfcx, "any"), "j0": (sps.j0, "any"),
              "j1": (sps.j1, "any"), "i0": (sps.i0, "any"), "i1": (sps.i1, "any")})
INTEGER_ONLY = {"and_": np.bitwise_and, "or_": np.bitwise_or, "xor": np.bitwise_xor,
                "invert": np.invert}
OTHER_ROWS = {"switch", "clip", "second"}  # tested by name below
# T.xlogx is Theano's module of the two (T.xlogx.xlogy0): tests/test_theano_programs_semantics.py
OTHER_ROWS |= {"xlogx", "xlogy0"}


def test_every_table_row_is_tested():
    """A new row in the scalar table must come with a NumPy check here."""
    covered = set(UNARY) | set(BINARY) | set(INTEGER_ONLY) | OTHER_ROWS
    assert set(SCALAR_OPS) <= covered, sorted(set(SCALAR_OPS) - covered)


def _domain(kind: str, shape, dtype) -> np.ndarray:
    v = RNG.normal(size=shape) * 3
    if kind == "pos":
        v = np.abs(v) + 0.1
    elif kind == "gt-1":
        v = np.abs(v) - 0.9
    elif kind == "unit":
        v = np.clip(v, -1.2, 1.2)
    return v.astype(dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary_row(name, dtype):
    ref, kind = UNARY[name]
    x = T.tensor(dtype=dtype, shape=(None, None))
    X = _domain(kind, (3, 4), dtype)
    X[0, 0] = 2.5 if kind == "any" else X[0, 0]  # a rounding tie: round is half-to-even
    z = getattr(T, name)(x)
    got = run([x], z, X)
    expected = np.asarray(ref(X))
    assert got.dtype == expected.dtype, (name, got.dtype, expected.dtype)
    assert got.shape == X.shape
    rtol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-30)


def test_spec_aliases_exist():
    """The names SPEC.md lists for the tensor language."""
    for name in ["exp", "log", "log1p", "expm1", "sqrt", "sqr", "abs", "sign", "neg", "tanh",
                 "sigmoid", "softplus", "sin", "cos", "floor", "ceil", "round", "maximum",
                 "minimum", "clip", "switch", "where", "pow", "cast", "eq", "neq"]:
        assert callable(getattr(T, name)), name
    x = T.dvector()
    X = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(run([x], T.sign(x), X), np.sign(X))
    np.testing.assert_array_equal(run([x], abs(x), X), np.abs(X))
    np.testing.assert_array_equal(run([x], x.abs(), X), np.abs(X))


def test_softplus_and_sigmoid_extremes():
    x = T.dvector()
    X = np.array([-1000.0, -40.0, -1e-12, 0.0, 1e-12, 40.0, 1000.0])
    sp, sg = run([x], [T.softplus(x), T.sigmoid(x)], X)
    np.testing.assert_allclose(sp, np.logaddexp(0, X), rtol=1e-14)
    assert np.all(np.isfinite(sp)) and sp[0] == 0.0 and sp[-1] == 1000.0
    np.testing.assert_allclose(sg, sps.expit(X), rtol=1e-14)
    x32 = T.fvector()
    sp32 = run([x32], T.softplus(x32), X.astype("float32"))
    assert sp32.dtype == np.float32 and np.all(np.isfinite(sp32))


def test_round_is_half_to_even():
    x = T.dvector()
    X = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(run([x], T.round(x), X), [-2, -2, -0, 0, 2, 2, 4])


# ----------------------------------------------------------------------------- binary rows

@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_binary_row(name, dtype):
    ref = BINARY[name]
    x, y = T.tensor(dtype, (None, None)), T.tensor(dtype, (None, None))
    if dtype.startswith("float"):
        X = _domain("pos" if name == "pow" else "any", (3, 4), dtype)
        Y = _domain("any", (3, 4), dtype)
        Y[0, :2] = X[0, :2]  # ties for comparisons, max/min
    else:
        X = RNG.integers(-6, 7, (3, 4)).astype(dtype)
        Y = RNG.integers(1, 4, (3, 4)).astype(dtype)
        Y[1] *= -1
        Y[0, :2] = np.where(X[0, :2] == 0, 1, X[0, :2])
        if name == "pow":
            X, Y = np.abs(X), np.abs(Y)
    z = getattr(T, name)(x, y)
    got = run([x, y], z, X, Y)
    expected = np.asarray(ref(X, Y))
    assert got.dtype == expected.dtype, (name, dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == "float32" else 1e-12)


OPERATORS = [
    ("+", operator.add, np.add), ("-", operator.sub, np.subtract),
    ("*", operator.mul, np.multiply), ("/", operator.truediv, np.true_divide),
    ("//", operator.floordiv, np.floor_divide), ("%", operator.mod, np.mod),
    ("**", operator.pow, np.power), ("<", operator.lt, np.less), ("<=", operator.le, np.less_equal),
    (">", operator.gt, np.greater), (">=", operator.ge, np.greater_equal),
]


@pytest.mark.parametrize("sym,op,ref", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_python_operators(sym, op, ref):
    x, y = T.dmatrix(), T.dmatrix()
    X = np.abs(RNG.normal(size=(2, 3))) + 0.5
    Y = RNG.normal(size=(2, 3))
    got = run([x, y], [op(x, y), op(x, 2.0), op(3.0, y)], X, Y)
    for g, e in zip(got, [ref(X, Y), ref(X, 2.0), ref(3.0, Y)]):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_unary_operators_and_eq_neq():
    x, y = T.lvector(), T.lvector()
    X, Y = np.array([3, -2, 0, 7]), np.array([3, 2, 0, -7])
    got = run([x, y], [-x, +x, abs(x), ~x, T.eq(x, y), T.neq(x, y)], X, Y)
    for g, e in zip(got, [-X, X, np.abs(X), ~X, X == Y, X != Y]):
        np.testing.assert_array_equal(g, e)
    # Python's == keeps identity semantics on variables (Theano's convention): use eq/neq
    assert (x == x) is True and (x == y) is False


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint16", "int64"])
def test_bitwise_and_logic(dtype):
    x, y = T.tensor(dtype, (None,)), T.tensor(dtype, (None,))
    if dtype == "bool":
        X, Y = np.array([True, True, False, False]), np.array([True, False, True, False])
    else:
        X = np.array([0, 5, 12, 127], dtype)
        Y = np.array([3, 6, 10, 1], dtype)
    got = run([x, y], [x & y, x | y, x ^ y, ~x, T.and_(x, y), T.or_(x, y), T.xor(x, y),
                       T.invert(x)], X, Y)
    for g, e in zip(got, [X & Y, X | Y, X ^ Y, ~X, X & Y, X | Y, X ^ Y, ~X]):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
    # a Python int meeting a tensor keeps the tensor's dtype
    if dtype != "bool":
        assert (x & 1).dtype == dtype and (1 | x).dtype == dtype


# ----------------------------------------------------------------------------- selection

def test_maximum_minimum_clip_with_nan_and_inf():
    x, y = T.dvector(), T.dvector()
    X = np.array([1.0, np.nan, -np.inf, 3.0, np.inf, -2.0])
    Y = np.array([np.nan, 2.0, 0.0, np.inf, 1.0, -2.0])
    got = run([x, y], [T.maximum(x, y), T.minimum(x, y), T.clip(x, -1.0, 2.0),
                       x.clip(-1.0, 2.0)], X, Y)
    expected = [np.maximum(X, Y), np.minimum(X, Y), np.clip(X, -1, 2), np.clip(X, -1, 2)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_maximum_cuda_expression_propagates_nan():
    """The GPU row must agree with np.maximum on NaN (fmax would drop it)."""
    for name in ("maximum", "minimum"):
        src = cuda_expression(SCALAR_OPS[name].spec.cuda, "float32", ["a", "b"], False)
        assert "isnan(a)" in src
    src = cuda_expression(SCALAR_OPS["clip"].spec.cuda, "float64", ["x", "lo", "hi"], False)
    assert "isnan(x)" in src


def test_clip_symbolic_bounds_and_int():
    x, lo, hi = T.ivector(), T.iscalar(), T.iscalar()
    X = np.array([-5, 0, 3, 9], "int32")
    got = run([x, lo, hi], T.clip(x, lo, hi), X, np.int32(-1), np.int32(4))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.clip(X, -1, 4))


def test_switch_and_where():
    c, a, b = T.bvector(), T.fvector(), T.fmatrix()
    C = np.array([1, 0, 2], "int8")
    A = np.array([1.0, 2.0, 3.0], "float32")
    B = RNG.normal(size=(2, 3)).astype("float32")
    got = run([c, a, b], [T.switch(c, a, b), T.where(c, a, b), T.switch(c > 0, a, 0),
                          T.where(T.lt(a, 2), 1, 2)], C, A, B)
    np.testing.assert_array_equal(got[0], np.where(C, A, B))
    np.testing.assert_array_equal(got[1], np.where(C, A, B))
    assert got[0].dtype == np.float32 and got[2].dtype == np.float32
    np.testing.assert_array_equal(got[2], np.where(C > 0, A, 0))
    np.testing.assert_array_equal(got[3], np.where(A < 2, 1, 2))


def test_second_broadcasts_b_to_a():
    a, b = T.dmatrix(), T.dscalar()
    got = run([a, b], T.second(a, b), np.zeros((2, 3)), np.float64(7))
    np.testing.assert_array_equal(got, np.full((2, 3), 7.0))
    np.testing.assert_array_equal(run([a], [T.zeros_like(a), T.ones_like(a)], np.ones((2, 2))),
                                  [np.zeros((2, 2)), np.ones((2, 2))])


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_pow_and_cast(dtype):
    x = T.dvector()
    X = np.array([0.5, 1.5, 2.0])
    z = T.pow(x, 3)
    np.testing.assert_allclose(run([x], [z, x ** 0.5, 2 ** x], X)[0], X ** 3)
    np.testing.assert_allclose(run([x], 2 ** x, X), 2 ** X)
    c = T.cast(x, dtype)
    assert isinstance(c.owner.op, Elemwise) and isinstance(c.owner.op.scalar_op, Cast)
    np.testing.assert_array_equal(run([x], c, X), X.astype(dtype))


# ----------------------------------------------------------------------------- division edge cases

def test_float_division_by_zero_like_numpy():
    x, y = T.dvector(), T.dvector()
    X = np.array([1.0, -1.0, 0.0, 7.0, -7.0, np.inf, 5.0])
    Y = np.array([0.0, 0.0, 0.0, -0.0, 2.0, 3.0, np.inf])
    with np.errstate(all="ignore"):
        got = run([x, y], [x / y, x // y, x % y], X, Y)
        expected = [X / Y, X // Y, X % Y]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    assert np.isposinf(got[0][0]) and np.isneginf(got[0][1]) and np.isnan(got[0][2])


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "float32", "float64"])
def test_floor_div_and_mod_follow_python_signs(dtype):
    x, y = T.tensor(dtype, (None,)), T.tensor(dtype, (None,))
    pairs = [(7, 2), (-7, 2), (7, -2), (-7, -2), (6, 3), (-6, 3), (0, -5), (1, -7)]
    X = np.array([p[0] for p in pairs], dtype)
    Y = np.array([p[1] for p in pairs], dtype)
    q, r = run([x, y], [x // y, x % y], X, Y)
    assert q.dtype == np.dtype(dtype) and r.dtype == np.dtype(dtype)
    for (a, b), qi, ri in zip(pairs, q, r):
        assert qi == a // b and ri == a % b, (a, b, qi, ri)
        assert ri == 0 or (ri > 0) == (b > 0)  # remainder takes the divisor's sign


def test_integer_division_by_zero_like_numpy():
    x, y = T.ivector(), T.ivector()
    X = np.array([5, -5, 0], "int32")
    Y = np.zeros(3, "int32")
    with np.errstate(all="ignore"):
        q, r, t = run([x, y], [x // y, x % y, x / y], X, Y)
        eq, er, et = X // Y, X % Y, X / Y
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(r, er)
    np.testing.assert_array_equal(t, et)
    assert t.dtype == np.float64 and np.isposinf(t[0]) and np.isnan(t[2])


# ----------------------------------------------------------------------------- broadcasting

def test_row_col_broadcasting_types_and_values():
    r, c, m, v, s = T.drow(), T.dcol(), T.dmatrix(), T.dvector(), T.dscalar()
    assert r.broadcastable == (True, False) and c.broadcastable == (False, True)
    assert (r + c).broadcastable == (False, False)
    assert (r + r).broadcastable == (True, False)
    assert (c * s).broadcastable == (False, True)
    assert (v + m).broadcastable == (False, False)
    assert (r + v).broadcastable == (True, False)
    assert (s + s).broadcastable == ()
    R, C = RNG.normal(size=(1, 4)), RNG.normal(size=(3, 1))
    M, V, S = RNG.normal(size=(3, 4)), RNG.normal(size=4), np.float64(2.5)
    got = run([r, c, m, v, s], [r + c, r * v, c - m, v + m, s * r, T.maximum(c, v)],
              R, C, M, V, S)
    for g, e in zip(got, [R + C, R * V, C - M, V + M, S * R, np.maximum(C, V)]):
        np.testing.assert_allclose(g, e)


def test_different_ndims_broadcast_on_the_left():
    t3, v, m = T.dtensor3(), T.dvector(), T.dmatrix()
    A, V, M = RNG.normal(size=(2, 3, 4)), RNG.normal(size=4), RNG.normal(size=(3, 4))
    z = t3 * v + m
    assert z.ndim == 3
    np.testing.assert_allclose(run([t3, v, m], z, A, V, M), A * V + M)
    t4 = T.dtensor4()
    B = RNG.normal(size=(2, 1, 3, 4))
    z4 = t4 + t3.dimshuffle(0, "x", 1, 2)
    np.testing.assert_allclose(run([t4, t3], z4, B, A), B + A[:, None])


def test_broadcast_mismatch_names_shapes():
    x, y = T.dmatrix(), T.dmatrix()
    f = function([x, y], x + y)
    with pytest.raises(Exception, match=r"\(2, ?3\)") as info:
        f(np.ones((2, 3)), np.ones((3, 2)))
    assert "(3, 2)" in str(info.value) or "(3,2)" in str(info.value)


def test_undeclared_broadcasting_is_refused_clearly():
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], x * y)
    with pytest.raises(ValueError, match="dimension 0.*not broadcastable"):
        f(np.ones(3), np.ones(1))
    # declared broadcastable, the same values broadcast (and the gradient has y's shape)
    yb = T.TensorType("float64", (True,))("yb")
    g = function([x, yb], [x * yb, symgpu.grad((x * yb).sum(), yb)])
    out, gy = g(np.arange(3.0), np.ones(1))
    np.testing.assert_array_equal(out, np.arange(3.0))
    assert gy.shape == (1,) and gy[0] == 3.0


def test_broadcastable_dim_must_have_length_one():
    r = T.drow()
    f = function([r], r * 2)
    with pytest.raises(TypeError, match="broadcastable"):
        f(np.ones((2, 3)))


@st.composite
def _broadcast_case(draw):
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4,
                                                    max_side=4))
    # a length-1 dim that is stretched must be declared broadcastable (Theano's rule); one
    # that meets only other length-1 dims may be declared or not: both must work
    out = shapes.result_shape
    bcasts = []
    for shp in shapes.input_shapes:
        lead = len(out) - len(shp)
        bcasts.append(tuple(s == 1 and (out[lead + d] > 1 or draw(st.booleans()))
                            for d, s in enumerate(shp)))
    return shapes.input_shapes, bcasts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_broadcast_case())
def test_broadcasting_random_shapes(case):
    shapes, bcasts = case
    dtypes = ["float64", "float32", "int16"]
    vars_ = [T.TensorType(d, b)() for d, b in zip(dtypes, bcasts)]
    vals = [(RNG.normal(size=s) * 4).astype(d) for d, s in zip(dtypes, shapes)]
    z = T.switch(vars_[2] > 0, vars_[0] * vars_[1], T.maximum(vars_[0], vars_[1]) - vars_[2])
    expected = np.where(vals[2] > 0, vals[0] * vals[1], np.maximum(vals[0], vals[1]) - vals[2])
    assert z.ndim == expected.ndim and z.dtype == expected.dtype.name
    got = run(vars_, z, *vals)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the static pattern is never wrong: a dim marked broadcastable has length 1
    for b, s in zip(z.broadcastable, got.shape):
        assert not b or s == 1


# ----------------------------------------------------------------------------- misc

def test_inplace_elemwise_overwrites_input():
    x = T.dvector()
    op = Elemwise(SCALAR_OPS["exp"], {0: 0})
    assert op.destroy_map == {0: [0]}
    X = np.array([0.0, 1.0])
    node = op.make_node(x)
    out = [[None]]
    op.perform(node, [X], out)
    assert out[0][0] is X
    np.testing.assert_allclose(X, np.exp([0.0, 1.0]))
    with pytest.raises(TypeError, match="in place"):
        Elemwise(SCALAR_OPS["exp"], {0: 0})(T.ivector())


def test_elemwise_str_and_variadic_add():
    x, y, z = T.dvector(), T.dvector(), T.dvector()
    s = T.add(x, y, z)
    assert str(s.owner.op) == "Elemwise{add,no_inplace}"
    assert len(s.owner.inputs) == 3
    X = np.arange(3.0)
    np.testing.assert_allclose(run([x, y, z], [s, T.mul(x, y, z)], X, X, X), [3 * X, X ** 3])
    np.testing.assert_array_equal(X, np.arange(3.0))  # a 3rd ufunc argument is `out`: untouched
    # mixed dtypes fold in the output dtype (no int8 overflow before meeting the int64)
    a, b, c = T.bvector(), T.bvector(), T.lvector()
    A = np.array([100, -100], "int8")
    got = run([a, b, c], [T.add(a, b, c), T.mul(a, b, c)], A, A, np.array([0, 1]))
    np.testing.assert_array_equal(got[0], [200, -199])
    np.testing.assert_array_equal(got[1], [0, 10000])
    # in place, variadic
    op = Elemwise(SCALAR_OPS["add"], {0: 0})
    node = op.make_node(x, y, z)
    X = np.arange(3.0)
    storage = [[None]]
    op.perform(node, [X, np.ones(3), np.ones(3)], storage)
    assert storage[0][0] is X
    np.testing.assert_array_equal(X, np.arange(3.0) + 2)


def test_float32_results_stay_float32():
    with config.change_flags(floatX="float32"):
        x = T.matrix()
        X = RNG.normal(size=(2, 3)).astype("float32")
        outs = [x * 2.5, x / 3, x // 2, x % 1.5, x ** 2, -x, T.exp(x), T.softplus(x), 1 - x,
                T.clip(x, 0, 1), T.switch(x > 0, x, 0.1)]
        for o, g in zip(outs, run([x], outs, X)):
            assert o.dtype == "float32" and g.dtype == np.float32


# ----------------------------------------------------------------------------- CUDA rows, on the host
# The CUDA expressions of the table are plain C: compiled with the host C compiler (same
# operand and result conversions as the GPU renderer: operands in the compute dtype, result
# converted to the output dtype) they must agree with the rows' NumPy functions, NaN, inf and
# Python's floor-division/modulo signs included. This checks GPU semantics without a GPU.

_C_PRELUDE = """
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#define max(a, b) ((a) > (b) ? (a) : (b))
#define min(a, b) ((a) < (b) ? (a) : (b))
"""
_C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t",
            "bool": "bool"}
_EDGE_FLOATS = [-7.0, -2.5, -1.0, -0.0, 0.0, 0.1, 0.3, 1.0, 2.0, 3.0, 7.0, 1e-30, np.inf,
                -np.inf, np.nan]
_EDGE_INTS = [-7, -2, -1, 0, 1, 2, 3, 7, 9]


def _host_cases(dtype: str):
    """(op, input dtypes, operand tuples, output dtype) for every row that applies to dtype."""
    grid = _EDGE_FLOATS if dtype.startswith("float") else _EDGE_INTS
    for name, op in sorted(SCALAR_OPS.items()):
        nin = 2 if op.nin < 0 else op.nin
        if op.spec.cuda is None or op.spec.cuda_only:
            continue  # no host C form (psi; erfinv): nvcc checks them, test_special_functions
        if name == "switch":
            in_dtypes = ("bool", dtype, dtype)
            tuples = [(c, a, b) for c in (0, 1) for a in grid[:4] for b in grid[-4:]]
        elif name == "clip":
            in_dtypes = (dtype,) * 3
            tuples = [(x, lo, hi) for x in grid for lo, hi in [(-1, 2), (0, 0), (-2, -1)]]
        else:
            in_dtypes = (dtype,) * nin
            tuples = list(itertools.product(grid, repeat=nin))
            if name == "pow" and dtype.startswith("int"):
                tuples = [t for t in tuples if t[1] >= 0]  # NumPy refuses negative int powers
        try:
            out = op.output_dtype(*in_dtypes)
        except TypeError:
            continue
        if dtype.startswith("int") and (out.startswith("float") or name in ("isnan", "isinf")):
            continue  # computed in the float output dtype: covered by the float cases
        yield op, in_dtypes, tuples, out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_cuda_templates_match_numpy_on_the_host(dtype, tmp_path):
    cases = list(_host_cases(dtype))
    is_float = dtype.startswith("float")
    store = "double" if is_float else "long long"
    lines = [_C_PRELUDE, "int main(void) {"]
    for k, (op, in_dtypes, tuples, out) in enumerate(cases):
        compute = dtype if op.spec.dtype_rule == "bool" or out == "bool" else out
        for j, d in enumerate(in_dtypes):
            vals = ", ".join(("NAN" if np.isnan(t[j]) else "INFINITY" if t[j] > 0 else
                              "-INFINITY") if is_float and not np.isfinite(t[j]) else
                             (float(t[j]).hex() if is_float else str(int(t[j])))
                             for t in tuples)
            lines.append(f"static const {store} in{k}_{j}[] = {{{vals}}};")
        decls = " ".join(
            f"{_C_TYPES['bool' if d == 'bool' else compute]} v{j} = "
            f"({_C_TYPES['bool' if d == 'bool' else compute]})in{k}_{j}[i];"
            for j, d in enumerate(in_dtypes))
        expr = op.cuda(compute, [f"v{j}" for j in range(len(in_dtypes))])
        fmt = '"%a\\n", (double)' if out.startswith("float") else '"%lld\\n", (long long)'
        lines.append(f"for (int i = 0; i < {len(tuples)}; i++) {{ {decls} "
                     f"{_C_TYPES[out]} r = ({_C_TYPES[out]})({expr}); printf({fmt}r); }}")
    lines.append("return 0; }")
    src = tmp_path / "rows.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "rows"
    subprocess.run(["cc", "-std=gnu99", "-O0", "-w", "-o", str(exe), str(src), "-lm"],
                   check=True, capture_output=True)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    pos = 0
    failures = []
    for op, in_dtypes, tuples, out in cases:
        cols = [np.array([t[j] for t in tuples], dtype=d) for j, d in enumerate(in_dtypes)]
        with np.errstate(all="ignore"):
            expected = np.asarray(op.impl(*cols)).astype(out)
        got_text = printed[pos:pos + len(tuples)]
        pos += len(tuples)
        if out.startswith("float"):
            got = np.array([float.fromhex(s) if "nan" not in s and "inf" not in s else float(s)
                            for s in got_text], dtype=out)
            rtol = 2e-6 if out == "float32" else 1e-13
            ok = np.isclose(got, expected, rtol=rtol, atol=0, equal_nan=True)
            # signed zeros too (e.g. -0.0 // 1 and 0.0 % -1 in Python)
            ok &= (got != 0) | (np.signbit(got) == np.signbit(expected))
        else:
            got = np.array([int(s) for s in got_text]).astype(out)
            ok = got == expected
        for i in np.flatnonzero(~ok)[:3]:
            failures.append(f"{op.name}{tuples[i]} [{dtype}]: cuda {got[i]!r}, "
                            f"numpy {expected[i]!r}")
    assert pos == len(printed)
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- CUDA rows, on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_gpu_rows_match_numpy_on_edge_values(dtype):
    """The same edge values through the real GPU renderer: one fused kernel per dtype whose
    outputs are every applicable row (pytest -m gpu; skipped where no GPU can be used)."""
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.scalar.composite import CompositeBuilder

    if not gctx.gpu_available():
        pytest.skip(f"needs a usable NVIDIA GPU: {gctx.why_unavailable()}")
    ctx = gctx.start_device("cuda0")
    assert not ctx.virtual, "this test must run on a real GPU"
    name = "test-elemwise-rows"
    gctx.register_context(name, ctx)
    try:
        grid = _EDGE_FLOATS if dtype.startswith("float") else _EDGE_INTS
        pairs = list(itertools.product(grid, repeat=2))
        a = np.array([p[0] for p in pairs], dtype)
        b = np.array([p[1] for p in pairs], dtype)
        if dtype.startswith("int"):
            b_pow = np.abs(b)  # NumPy refuses negative integer powers
        cond = np.arange(len(pairs)) % 3 == 0
        lo = np.resize(np.array([-1, 0, -2], dtype), len(pairs))
        hi = np.resize(np.array([2, 0, -1], dtype), len(pairs))
        builder = CompositeBuilder()
        ra, rb, rc, rlo, rhi = (builder.add_input(d) for d in (dtype, dtype, "bool", dtype, dtype))
        outs, expected, labels = [], [], []
        for op, in_dtypes, _, out in _host_cases(dtype):
            if op.name == "switch":
                refs, vals = [rc, ra, rb], [cond, a, b]
            elif op.name == "clip":
                refs, vals = [ra, rlo, rhi], [a, lo, hi]
            elif len(in_dtypes) == 1:
                refs, vals = [ra], [a]
            elif op.name == "pow" and dtype.startswith("int"):
                refs, vals = [ra, builder.add_op(SCALAR_OPS["abs"], [rb])[0]], [a, b_pow]
            else:
                refs, vals = [ra, rb], [a, b]
            outs += builder.add_op(op, refs)
            with np.errstate(all="ignore"):
                expected.append(np.asarray(op.impl(*vals)).astype(out))
            labels.append(op.name)
        comp = builder.build(outs)
        ins = [GpuArrayType(d, (False,), name)() for d in (dtype, dtype, "bool", dtype, dtype)]
        results = GpuElemwise(comp)(*ins)
        fg = FunctionGraph(ins, list(results), clone=False)
        storage = {v: [to_gpu(x, ctx)] for v, x in zip(ins, (a, b, cond, lo, hi))}
        link(fg, storage)()
        failures = []
        for label, o, e in zip(labels, fg.outputs, expected):
            g = np.asarray(storage[o][0])
            assert g.dtype == e.dtype, label
            if e.dtype.kind == "f":
                ok = np.isclose(g, e, rtol=2e-6 if e.dtype == np.float32 else 1e-13,
                                atol=0, equal_nan=True)
            else:
                ok = g == e
            for i in np.flatnonzero(~ok)[:3]:
                failures.append(f"{label}{pairs[i]} [{dtype}]: gpu {g[i]!r}, numpy {e[i]!r}")
        assert not failures, "\n".join(failures)
    finally:
        gctx.unregister_context(name)


def test_a_composites_text_grows_with_its_steps_not_its_paths():
    """x + x 22 times shares each sum twice: written out in full the text doubles at every
    step (millions of characters; at forty steps, more than any memory); long steps are
    named (t0=...) and read by name."""
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.scalar.composite import CompositeBuilder
    b = CompositeBuilder()
    x = b.add_input("float64")
    for _ in range(22):
        x = b.add_op(SCALAR_OPS["add"], [x, x])[0]
    c = b.build([x])
    text = str(c)
    assert len(text) < 20000 and "t0=" in text and c.name == text
    small = CompositeBuilder()
    i = small.add_input("float64")
    assert str(small.build([small.add_op(SCALAR_OPS["add"], [i, i])[0]])) == \
        "Composite{(i0 + i0)}"
    np.testing.assert_allclose(c.impl(np.float64(1.5)), 1.5 * 2 ** 22)
