"""Dtype rules of the tensor language, checked against NumPy 2.

Tensor/tensor operations follow NumPy's promotion (int8 + float32 -> float32, int32 + float32
-> float64, uint8 + int8 -> int16); Python numbers are "weak" and adopt the tensor's dtype
(`x_float32 * 2.5` stays float32, `x_int8 + 1` stays int8); a Python float meeting only
integer tensors gives floatX; unary float functions of small integers follow Theano's rule
(float32, not NumPy's float16). Also floatX, casts and `warn_float64`.
"""
from __future__ import annotations

import itertools
import operator
import os
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.scalar.dtypes import ALL_DTYPES, check_dtype, upcast, upgrade_to_float

REAL = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64"]
RNG = np.random.default_rng(1234)


def sample(dtype: str, n: int = 6, positive: bool = False) -> np.ndarray:
    if dtype == "bool":
        return np.array([True, False, True, True, False, True][:n])
    if dtype.startswith("uint"):
        return RNG.integers(1, 6, n).astype(dtype)
    if dtype.startswith("int"):
        lo = 1 if positive else -5
        v = RNG.integers(lo, 6, n)
        if not positive:
            v[v == 0] = 3
        return v.astype(dtype)
    v = RNG.normal(size=n) * 3
    return (np.abs(v) + 0.5 if positive else v).astype(dtype)


def vec(dtype: str, name: str | None = None) -> T.TensorVariable:
    return T.tensor(dtype=dtype, shape=(None,), name=name)


def run(inputs, outputs, *values):
    return function(list(inputs), outputs)(*values)


# ----------------------------------------------------------------------------- tensor/tensor

BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "true_div": operator.truediv, "floor_div": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "maximum": (T.maximum, np.maximum), "minimum": (T.minimum, np.minimum),
    "lt": operator.lt, "ge": operator.ge, "eq": (T.eq, np.equal), "neq": (T.neq, np.not_equal),
    "and": operator.and_, "or": operator.or_, "xor": operator.xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_promotion_matches_numpy(name):
    """Every pair of real dtypes: same result dtype and values as NumPy, or an error where
    NumPy refuses (bool - bool, float & int...), raised when the graph is built."""
    fn = BINARY[name]
    sym_fn, np_fn = fn if isinstance(fn, tuple) else (fn, fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a, b in itertools.product(REAL, REAL):
            positive = name == "pow"
            A, B = sample(a, positive=positive), sample(b, positive=positive)
            try:
                with np.errstate(all="ignore"):
                    expected = np_fn(A, B)
            except TypeError:
                with pytest.raises(TypeError):
                    sym_fn(vec(a), vec(b))
                continue
            x, y = vec(a), vec(b)
            z = sym_fn(x, y)
            assert z.dtype == expected.dtype.name, (name, a, b)
            with np.errstate(all="ignore"):
                got = run([x, y], z, A, B)
            assert got.dtype == expected.dtype, (name, a, b)
            np.testing.assert_allclose(got.astype("float64"), expected.astype("float64"),
                                       rtol=2e-3, equal_nan=True, err_msg=f"{name} {a} {b}")


@pytest.mark.parametrize("a,b,expected", [
    ("int8", "float32", "float32"), ("int16", "float32", "float32"),
    ("int32", "float32", "float64"), ("int64", "float32", "float64"),
    ("uint8", "int8", "int16"), ("uint16", "int16", "int32"), ("uint32", "int32", "int64"),
    ("uint64", "int64", "float64"), ("bool", "int8", "int8"), ("bool", "float16", "float16"),
    ("float16", "float32", "float32"), ("int8", "float16", "float16"),
    ("uint8", "float16", "float16"), ("int16", "float16", "float32"),
])
def test_numpy2_upcast_examples(a, b, expected):
    assert (vec(a) + vec(b)).dtype == expected
    assert (vec(b) * vec(a)).dtype == expected
    assert upcast(a, b) == expected


def test_int_true_division_gives_float64():
    for d in ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64"]:
        assert (vec(d) / vec(d)).dtype == "float64", d
    x = T.bvector()
    assert (x / 2).dtype == "float64"
    got = run([x], x / 3, np.array([1, -7], "int8"))
    np.testing.assert_allclose(got, np.array([1, -7]) / 3)
    assert got.dtype == np.float64
    with config.change_flags(floatX="float32"):
        assert (T.ivector() / T.ivector()).dtype == "float64"


# ----------------------------------------------------------------------------- Python scalars

@pytest.mark.parametrize("dtype,value,expected", [
    ("float32", 2.5, "float32"), ("float16", 2.5, "float16"), ("float32", 2, "float32"),
    ("int8", 1, "int8"), ("uint8", 3, "uint8"), ("int16", -2, "int16"), ("int32", 7, "int32"),
    ("uint64", 1, "uint64"), ("bool", 1, "int64"), ("bool", True, "bool"),
    ("float64", 2.5, "float64"), ("int8", True, "int8"),
])
def test_python_scalars_adopt_tensor_dtype(dtype, value, expected):
    x = vec(dtype)
    for z in (x + value, value + x, x * value, value * x):
        assert z.dtype == expected, (dtype, value, z.dtype)
    X = sample(dtype)
    got = run([x], x + value, X)
    assert got.dtype == expected
    np.testing.assert_allclose(got.astype(float), (X + value).astype(float), rtol=1e-3)


def test_python_int_out_of_range_widens():
    x = T.bvector()
    z = x + 300
    assert np.iinfo(z.dtype).max >= 427
    np.testing.assert_array_equal(run([x], z, np.array([127, -128], "int8")), [427, 172])


def test_python_float_with_int_tensor_gives_floatx():
    with config.change_flags(floatX="float32"):
        for d in ["bool", "int8", "int32", "int64", "uint16"]:
            x = vec(d)
            for z in (x + 1.5, 1.5 * x, x / 2.0, x ** 0.5, x - 0.5, T.maximum(x, 0.5),
                      T.clip(x, 0, 2.5)):
                assert z.dtype == "float32", (d, z.dtype)
        x = T.ivector()
        got = run([x], x + 1.5, np.array([1, 2], "int32"))
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, [2.5, 3.5])
        # switch: the condition stays boolean, the branches take floatX
        c = T.bvector()
        z = T.switch(c > 0, x, 1.5)
        assert z.dtype == "float32"
        np.testing.assert_allclose(run([c, x], z, np.array([1, 0], "int8"),
                                       np.array([4, 5], "int32")), [4.0, 1.5])
        # comparisons stay exact and boolean
        assert (x < 1.5).dtype == "bool"
    with config.change_flags(floatX="float64"):
        assert (T.ivector() + 1.5).dtype == "float64"
        assert (T.bvector() * 2.5).dtype == "float64"


def test_numpy_scalars_are_strong():
    """NumPy scalars carry their dtype (NumPy 2: np.float64(2) * float32 array -> float64)."""
    x = T.fvector()
    assert (x * np.float64(2.5)).dtype == "float64"
    assert (x * np.float32(2.5)).dtype == "float32"
    assert (T.bvector() + np.int32(1)).dtype == "int32"


# ----------------------------------------------------------------------------- floatX

def test_floatx_for_untyped_constructors_and_python_floats():
    for fx in ["float32", "float64", "float16"]:
        with config.change_flags(floatX=fx):
            for ctor in (T.scalar, T.vector, T.matrix, T.row, T.col, T.tensor3, T.tensor4):
                assert ctor().dtype == fx
            assert T.tensor(shape=(None, 3)).dtype == fx
            assert T.constant(1.5).dtype == fx
            assert T.as_tensor_variable([1.5, 2.0]).dtype == fx
            # Python ints: Theano's autocast_int, the narrowest int that holds them
            assert T.constant(2).dtype == "int8" and T.constant(300).dtype == "int16"
            assert T.constant(2 ** 40).dtype == "int64" and T.constant([2, 3]).dtype == "int64"
            assert (T.constant(1) - T.fvector()).dtype == "float32"
            assert symgpu.shared(2).dtype == "int64"
            assert T.cast(T.ivector(), "floatX").dtype == fx
    # typed constructors ignore floatX
    with config.change_flags(floatX="float32"):
        assert T.dvector().dtype == "float64"
        assert T.fvector().dtype == "float32"
        assert T.ivector().dtype == "int32"
        assert T.lmatrix().dtype == "int64"
        assert T.bscalar().dtype == "int8"


def test_float32_graph_stays_float32():
    with config.change_flags(floatX="float32", warn_float64="raise"):
        x = T.matrix("x")
        y = T.vector("y")
        z = T.exp(x * 2.5 + y) / 3 - T.sqrt(abs(x)) ** 2 + T.nnet.sigmoid(x).sum(axis=0)
        assert z.dtype == "float32"
        X = np.ones((2, 3), "float32")
        Y = np.ones(3, "float32")
        assert run([x, y], z, X, Y).dtype == np.float32


# ----------------------------------------------------------------------------- unary rules

FLOAT_UNARY = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sigmoid",
               "softplus", "sin", "cos", "tan", "arctan", "tanh", "sinh", "cosh", "erf",
               "reciprocal"]


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "int32", "int64"])
def test_float_unary_of_integers(dtype):
    """Theano's rule (small ints -> float32, others -> float64), computed in that dtype:
    NumPy alone would compute exp(int8) in float16 and reciprocal(int) in integers."""
    import scipy.special as sps
    x = vec(dtype)
    X = np.array([1, 0, 1, 1], dtype) if dtype == "bool" else np.array([3, 1, 100, 2], dtype)
    for name in FLOAT_UNARY:
        z = getattr(T, name)(x)
        assert z.dtype == upgrade_to_float(dtype), name
        with np.errstate(all="ignore"):
            got = run([x], z, X)
            ref_fn = {"sigmoid": sps.expit, "erf": sps.erf,
                      "softplus": lambda v: np.logaddexp(0, v),
                      "reciprocal": lambda v: 1.0 / v}.get(name, getattr(np, name, None))
            expected = ref_fn(X.astype("float64")).astype(z.dtype)
        assert got.dtype == z.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)


def test_int_preserving_unary():
    x = T.bvector()
    X = np.array([-3, 0, 5, -128], "int8")
    for name, ref in [("abs", np.abs), ("sgn", np.sign), ("neg", np.negative),
                      ("sqr", lambda v: v * v), ("floor", np.floor), ("ceil", np.ceil),
                      ("round", np.round), ("invert", np.invert)]:
        z = getattr(T, name)(x)
        assert z.dtype == "int8", name
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(run([x], z, X), ref(X), err_msg=name)


def test_bool_arithmetic_like_numpy():
    a, b = T.tensor("bool", (None,)), T.tensor("bool", (None,))
    with pytest.raises(TypeError, match="boolean"):
        a - b
    with pytest.raises(TypeError, match="boolean"):
        -a
    with pytest.raises(TypeError, match="boolean"):
        T.sgn(a)
    A, B = np.array([True, False, True]), np.array([True, True, False])
    with np.errstate(all="ignore"):
        cases = [(a + b, A + B), (a * b, A * B), (a // b, A // B), (a ** b, A ** B),
                 (a & b, A & B), (a | b, A | B), (a ^ b, A ^ B), (~a, ~A),
                 (T.maximum(a, b), np.maximum(A, B)), (a + 1, A + 1)]
    for sym, ref in cases:
        assert sym.dtype == ref.dtype.name
        with np.errstate(all="ignore"):
            got = function([a, b], sym, on_unused_input="ignore")(A, B)
        np.testing.assert_array_equal(got, ref)


def test_bitwise_on_floats_is_a_type_error():
    with pytest.raises(TypeError, match="integer or bool"):
        T.fvector() & T.fvector()
    with pytest.raises(TypeError):
        ~T.dvector()


# ----------------------------------------------------------------------------- casts

@pytest.mark.parametrize("dtype", REAL)
def test_cast_to_every_dtype(dtype):
    x = T.dvector()
    X = np.array([-1.5, 0.0, 2.7, 3.0])
    z = T.cast(x, dtype)
    assert z.dtype == dtype
    assert x.astype(dtype).dtype == dtype
    with np.errstate(all="ignore"):
        expected = X.astype(dtype)
        got = run([x], z, X)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_cast_is_noop_for_same_dtype_and_rejects_unknown():
    x = T.fvector()
    assert T.cast(x, "float32") is x
    with pytest.raises(TypeError, match="dtype"):
        T.cast(x, "float128x")
    with pytest.raises(TypeError, match="not supported"):
        T.cast(x, "datetime64")
    assert check_dtype(np.float32) == "float32"
    assert check_dtype("f8") == "float64"
    assert set(REAL) <= set(ALL_DTYPES)


# ----------------------------------------------------------------------------- warn_float64

def test_warn_float64_raise():
    with config.change_flags(warn_float64="raise"):
        with pytest.raises(TypeError, match="float64"):
            T.dvector()
        with pytest.raises(TypeError, match="float64"):
            T.ivector() / T.ivector()
        with pytest.raises(TypeError, match="float64"):
            T.fvector() * np.float64(2)
        # float32 work creates no float64 variable
        x = T.fvector()
        (T.exp(x) * 2.5 + 1).sum()
    with config.change_flags(warn_float64="raise", floatX="float32"):
        assert (T.bvector() + 1.5).dtype == "float32"
        assert T.vector().dtype == "float32"


def test_warn_float64_warn_points_at_user_code():
    with config.change_flags(warn_float64="warn"):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            T.dmatrix()
            T.lvector() / 2
        assert len(rec) == 2
        for w in rec:
            assert issubclass(w.category, T.Float64Warning)
            assert os.path.samefile(w.filename, __file__)


def test_warn_float64_ignore_is_default_and_silent():
    with config.change_flags(warn_float64="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            T.dmatrix() + 1.5
