"""Reductions against NumPy: sum mean prod max min argmax argmin var std all any, with every
form of `axis` (None, int, negative, tuple), `keepdims`, empty arrays, integer and bool inputs
(NumPy's result dtypes), and the method spellings on variables."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import symgpu.tensor as T
from symgpu import function

RNG = np.random.default_rng(7)
REDUCTIONS = ["sum", "mean", "prod", "max", "min", "var", "std", "all", "any"]
AXES = [None, 0, 1, 2, -1, -3, (0, 2), (-1, 0), (0, 1, 2), ()]


def run(inputs, outputs, *values):
    return function(list(inputs), outputs)(*values)


def check(got, expected, rtol=1e-6):
    expected = np.asarray(expected)
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    np.testing.assert_allclose(got, expected, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_axes(name, keepdims):
    x = T.dtensor3()
    X = RNG.normal(size=(2, 3, 4))
    outs = [getattr(T, name)(x, axis=a, keepdims=keepdims) for a in AXES]
    outs += [getattr(x, name)(axis=a, keepdims=keepdims) for a in AXES]
    with np.errstate(all="ignore"):
        got = run([x], outs, X)
        for g, a in zip(got, AXES + AXES):
            check(g, getattr(np, name)(X, axis=a, keepdims=keepdims))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_reductions(name):
    x = T.dtensor3()
    X = RNG.normal(size=(2, 3, 4))
    X[1, 2, :2] = X[1, 2].max() + 1  # a tie: the first index wins, as in NumPy
    cases = [(None, False), (0, False), (1, False), (-1, False), (2, True), (None, True),
             (-2, True)]
    outs = [getattr(T, name)(x, axis=a, keepdims=k) for a, k in cases]
    outs += [getattr(x, name)(axis=a, keepdims=k) for a, k in cases]
    for g, (a, k) in zip(run([x], outs, X), cases + cases):
        check(g, getattr(np, name)(X, axis=a, keepdims=k))
    with pytest.raises(ValueError, match="one axis"):
        getattr(T, name)(x, axis=(0, 1))
    v = T.dvector()
    check(run([v], getattr(T, name)(v, axis=0), X[0, 0]), getattr(np, name)(X[0, 0]))


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "int64", "uint8", "uint32",
                                   "float16", "float32"])
def test_result_dtypes_like_numpy(dtype):
    """sum/prod of small ints and bools accumulate in int64/uint64; mean/var/std of integers
    are float64; max/min keep the dtype; all/any are bool; arg* are int64."""
    x = T.tensor(dtype, (None, None))
    X = RNG.integers(0, 2, (3, 4)).astype(dtype) if dtype == "bool" else \
        (RNG.normal(size=(3, 4)) * 4).astype(dtype)
    names = REDUCTIONS + ["argmax", "argmin"]
    for axis in (None, 0, -1):
        outs = [getattr(T, n)(x, axis=axis) for n in names]
        with np.errstate(all="ignore"):
            got = run([x], outs, X)
        for n, o, g in zip(names, outs, got):
            with np.errstate(all="ignore"):
                expected = np.asarray(getattr(np, n)(X, axis=axis))
            assert o.dtype == expected.dtype.name, (n, dtype, axis)
            check(g, expected, rtol=1e-2 if dtype == "float16" else 1e-5)


def test_int_sum_does_not_overflow_like_numpy():
    x = T.bvector()
    X = np.full(1000, 100, "int8")
    s, m, p = run([x], [x.sum(), x.mean(), x.prod(axis=0)], X)
    assert s == 100000 and s.dtype == np.int64
    assert m == 100.0 and m.dtype == np.float64
    assert p.dtype == np.int64


def test_float16_mean_accumulates_in_float32():
    x = T.tensor("float16", (None,))
    X = np.ones(100000, "float16")
    m = run([x], x.mean(), X)
    assert m.dtype == np.float16 and m == 1.0 and np.mean(X) == 1.0


def test_sum_and_mean_dtype_arguments():
    x = T.ivector()
    X = np.array([1, 2, 4], "int32")
    outs = [x.sum(dtype="float32"), T.sum(x, acc_dtype="int64"), x.mean(dtype="float32"),
            x.prod(dtype="float64")]
    assert [o.dtype for o in outs] == ["float32", "int64", "float32", "float64"]
    got = run([x], outs, X)
    np.testing.assert_allclose(got, [7, 7, 7 / 3, 8], rtol=1e-6)


def test_var_std_ddof():
    x = T.dmatrix()
    X = RNG.normal(size=(4, 5))
    outs = [T.var(x, ddof=1), x.var(axis=0, ddof=1), T.std(x, axis=-1, ddof=1, keepdims=True),
            x.std(axis=(0, 1))]
    expected = [np.var(X, ddof=1), np.var(X, axis=0, ddof=1),
                np.std(X, axis=-1, ddof=1, keepdims=True), np.std(X, axis=(0, 1))]
    for g, e in zip(run([x], outs, X), expected):
        check(g, e, rtol=1e-12)


def test_scalar_input_reductions():
    s = T.dscalar()
    outs = [s.sum(), T.sum(s, axis=0), s.max(), s.mean(axis=0), s.prod(), T.argmax(s),
            s.var(), T.any(s)]
    got = run([s], outs, np.float64(3.0))
    assert [float(g) for g in got] == [3.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 1.0]
    assert all(g.shape == () for g in got)


def test_reducing_broadcastable_dims():
    r = T.drow()
    R = RNG.normal(size=(1, 3))
    outs = [r.sum(axis=0), r.max(axis=0), r.mean(axis=0, keepdims=True), r.sum(axis=1)]
    assert outs[2].broadcastable == (True, False)
    assert outs[3].broadcastable == (True,)
    for g, e in zip(run([r], outs, R), [R.sum(0), R.max(0), R.mean(0, keepdims=True), R.sum(1)]):
        check(g, e)


# ----------------------------------------------------------------------------- empty arrays

def test_empty_reductions_with_identity():
    x = T.dmatrix()
    E = np.zeros((0, 3))
    cases = [(T.sum, None), (T.sum, 0), (T.sum, 1), (T.prod, None), (T.prod, 0), (T.any, None),
             (T.all, None), (T.all, 0), (T.max, 1), (T.min, 1), (T.argmax, 1)]
    outs = [fn(x, axis=a) for fn, a in cases]
    for g, (fn, a) in zip(run([x], outs, E), cases):
        check(g, getattr(np, fn.__name__)(E, axis=a))
    assert run([x], x.sum(), E) == 0.0
    with np.errstate(all="ignore"):
        assert np.isnan(run([x], x.mean(), E))


@pytest.mark.parametrize("fn", [T.max, T.min, T.argmax, T.argmin])
@pytest.mark.parametrize("axis", [None, 0])
def test_empty_max_raises_clear_error(fn, axis):
    x = T.dmatrix()
    f = function([x], fn(x, axis=axis))
    with pytest.raises(ValueError, match=r"empty") as info:
        f(np.zeros((0, 3)))
    assert "(0, 3)" in str(info.value)


# ----------------------------------------------------------------------------- axis errors

def test_bad_axes_are_clear_errors():
    x = T.dmatrix()
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        x.sum(axis=2)
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        T.max(x, axis=-3)
    with pytest.raises(ValueError, match="repeats"):
        T.sum(x, axis=(0, -2))


# ----------------------------------------------------------------------------- random shapes

@st.composite
def _shape_and_axis(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    nd = len(shape)
    axis = draw(st.one_of(
        st.none(), st.integers(-nd, nd - 1),
        st.lists(st.integers(0, nd - 1), unique=True, max_size=nd).map(tuple)))
    return shape, axis, draw(st.booleans())


@settings(max_examples=25, deadline=None)
@given(_shape_and_axis())
def test_reductions_random_shapes(case):
    shape, axis, keepdims = case
    x = T.TensorType("float64", (False,) * len(shape))()
    X = RNG.normal(size=shape)
    names = ["sum", "mean", "prod", "max", "min", "var", "any"]
    got = run([x], [getattr(T, n)(x, axis=axis, keepdims=keepdims) for n in names], X)
    for n, g in zip(names, got):
        check(g, getattr(np, n)(X, axis=axis, keepdims=keepdims), rtol=1e-10)
