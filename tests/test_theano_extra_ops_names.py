"""theano.tensor.extra_ops's diff, fill_diagonal and squeeze (issue 31): Theano's module
has them, so symgpu.tensor.extra_ops does; checked against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.tensor import extra_ops


@pytest.mark.parametrize("n,axis", [(1, -1), (2, 0), (0, 1)])
def test_diff_as_numpy(n, axis):
    x = T.dmatrix("x")
    v = np.arange(12.0).reshape(3, 4) ** 2
    f = symgpu.function([x], extra_ops.diff(x, n=n, axis=axis))
    np.testing.assert_allclose(f(v), np.diff(v, n=n, axis=axis))
    with pytest.raises(ValueError, match="axis"):
        extra_ops.diff(x, axis=2)


def test_fill_diagonal_as_numpy():
    a = T.dmatrix("a")
    v = np.zeros((3, 5))
    expected = v.copy()
    np.fill_diagonal(expected, 7.0)
    np.testing.assert_allclose(symgpu.function([a], extra_ops.fill_diagonal(a, 7.0))(v),
                               expected)
    with pytest.raises(ValueError, match="matrix"):
        extra_ops.fill_diagonal(T.dvector(), 1.0)


def test_squeeze_drops_broadcastable_dimensions():
    x = T.TensorType("float64", (False, True, False, True))("x")
    y = extra_ops.squeeze(x)
    assert y.ndim == 2
    v = np.arange(6.0).reshape(2, 1, 3, 1)
    np.testing.assert_allclose(symgpu.function([x], y)(v), np.squeeze(v))
    assert extra_ops.diff is T.diff and extra_ops.squeeze is T.squeeze
