"""Theano semantics that code written for Theano depends on (issue: code written for Theano
runs unchanged): each checked against what Theano 1.0.5 does."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T


def test_shape_of_known_rank_iterates():
    x = T.dmatrix("x")
    rows, cols = x.shape
    f = symgpu.function([x], [rows, cols])
    assert [int(v) for v in f(np.zeros((2, 5)))] == [2, 5]
    assert len(list(T.stack([x.shape[0], x.shape[1], 3]))) == 3
    with pytest.raises(TypeError, match="cannot be iterated"):
        iter(T.dvector("v"))  # a length only known at run time
    with pytest.raises(TypeError, match="builtin sum"):
        sum(x)


def test_truth_value_as_theano():
    W = T.dmatrix("W")
    assert bool(W) and (W or None) is W  # `if W:` tests that an argument was given
    assert not (not W)
    for cmp in (W < 1, W <= 1, W > 1, W >= 1):
        with pytest.raises(TypeError, match="symbolic comparison"):
            bool(cmp)
    with pytest.raises(TypeError, match="symbolic comparison"):
        0 < W < 1  # noqa: B015  (chained comparisons would silently test one half)
    assert bool(T.lt(W, 1))  # only the operators' results refuse, as in Theano


def test_as_tensor_variable_of_a_list_holding_variables():
    x = T.dmatrix("x")
    v = T.as_tensor_variable([x.shape[0], 3])
    assert v.ndim == 1 and v.dtype == "int64"
    assert symgpu.function([x], v)(np.zeros((4, 2))).tolist() == [4, 3]
    a = T.dscalar("a")
    s = T.as_tensor_variable((a, 2.0))
    assert symgpu.function([a], s)(1.5).tolist() == [1.5, 2.0]
    assert T.as_tensor_variable([1, 2]).data.tolist() == [1, 2]  # plain values: a constant


def test_stack_of_arguments_is_theanos_deprecated_spelling():
    a, b, c = T.dscalars("a", "b", "c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = T.stack(a, b, c)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert symgpu.function([a, b, c], s)(1, 2, 3).tolist() == [1, 2, 3]
    m = T.dmatrix("m")
    r = T.stack([m, m], 1)  # the axis by position
    assert symgpu.function([m], r)(np.ones((2, 3))).shape == (2, 2, 3)


def test_tensor_type_name():
    t = T.TensorType("float32", (False, False), name="Mat")
    assert str(t) == "Mat" and t == T.TensorType("float32", (False, False))
    assert t("m").type.dtype == "float32"


def test_square_to_one_hot_and_scalar_upcast():
    x = T.dvector("x")
    assert np.allclose(symgpu.function([x], T.square(x))(np.array([1.0, -2.0])), [1.0, 4.0])
    y = T.lvector("y")
    out = symgpu.function([y], T.extra_ops.to_one_hot(y, 3))(np.array([2, 0]))
    assert out.tolist() == [[0, 0, 1], [1, 0, 0]] and out.dtype == symgpu.config.floatX
    assert symgpu.function([y], T.extra_ops.to_one_hot(y, 2, dtype="int8"))(
        np.array([1])).dtype == np.int8
    with pytest.raises(TypeError, match="integer labels"):
        T.extra_ops.to_one_hot(x, 3)
    assert symgpu.scalar.upcast("int32", "float32") == "float64"
    assert symgpu.scalar.upcast("int8", "int16") == "int16"


def test_max_pool_2d_same_size():
    from symgpu.tensor.signal.pool import max_pool_2d_same_size
    x = T.dtensor4("x")
    v = np.random.default_rng(0).standard_normal((2, 3, 4, 6))
    out = symgpu.function([x], max_pool_2d_same_size(x, (2, 3)))(v)
    windows = v.reshape(2, 3, 2, 2, 2, 3).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 2, 6)
    keep = windows == windows.max(axis=-1, keepdims=True)
    want = np.where(keep, windows, 0).reshape(2, 3, 2, 2, 2, 3).transpose(0, 1, 2, 4, 3, 5)
    np.testing.assert_allclose(out, want.reshape(v.shape))


def test_small_theano_names():
    import io
    import pickle

    from symgpu.compile.io import In
    from symgpu.compile.sharedvalue import shared_constructor
    from symgpu.misc.pkl_utils import CompatUnpickler
    v = T.dvector("v")
    assert In(v).name == "v" and In(v, autoname=False).name is None and In(v, name="w").name == "w"
    assert symgpu.Mode().optimizer == "fast_run"
    assert symgpu.Mode(optimizer="fast_compile").optimizer == "fast_compile"
    assert symgpu.function([v], v.take([2, 0]))(np.array([1.0, 2.0, 3.0])).tolist() == [3.0, 1.0]

    def ctor(value, name=None, **kw):  # a string's length (another constructor's value)
        if not isinstance(value, str):
            raise TypeError("strings only")  # shared() then tries the next constructor
        return symgpu.shared(np.float64(len(value)), name=name)

    assert shared_constructor(ctor) is ctor
    assert float(symgpu.shared("abc").get_value()) == 3.0  # the new constructor is tried first
    shared_constructor(ctor, remove=True)
    with pytest.raises(TypeError):
        symgpu.shared("abc")
    data = pickle.dumps({"a": np.arange(3)}, protocol=2)
    assert CompatUnpickler(io.BytesIO(data)).load()["a"].tolist() == [0, 1, 2]
