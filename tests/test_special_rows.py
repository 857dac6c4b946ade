"""The scalar table's Bessel, erfcx and trunc rows: values against SciPy/NumPy (also in
tests/test_elemwise.py's table) and gradients with verify_grad; their `*_inplace` forms."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sps

import symgpu
import symgpu.tensor as T
from symgpu.gradient import verify_grad
from symgpu.tensor import inplace

X = np.array([0.3, 1.2, 2.5, 4.0])


@pytest.mark.parametrize("name", ["erfcx", "j0", "j1", "i0", "i1"])
def test_unary_special_rows_values_and_gradients(name):
    x = T.dvector("x")
    np.testing.assert_allclose(symgpu.function([x], getattr(T, name)(x))(X),
                               getattr(sps, name)(X), rtol=1e-12)
    verify_grad(getattr(T, name), [X], rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", ["jv", "iv"])
def test_real_order_rows_take_the_order_first_and_differentiate_in_x(name):
    x = T.dvector("x")
    np.testing.assert_allclose(symgpu.function([x], getattr(T, name)(1.5, x))(X),
                               getattr(sps, name)(1.5, X), rtol=1e-12)
    verify_grad(lambda a: getattr(T, name)(2.5, a), [X], rng=np.random.default_rng(1))


def test_trunc_rounds_towards_zero_with_a_zero_gradient():
    x = T.dvector("x")
    v = np.array([-2.7, -0.5, 0.5, 2.7])
    f = symgpu.function([x], [T.trunc(x), symgpu.grad(T.trunc(x).sum(), x)])
    got, g = f(v)
    np.testing.assert_array_equal(got, np.trunc(v))
    np.testing.assert_array_equal(g, np.zeros(4))


@pytest.mark.parametrize("name", ["trunc", "erfcx", "j0", "j1", "i0", "i1"])
def test_inplace_forms_overwrite_their_input(name):
    x = T.dvector("x")
    y = getattr(inplace, f"{name}_inplace")(x * 1)
    assert y.owner.op.destroy_map == {0: [0]}
    want = np.trunc(X) if name == "trunc" else getattr(sps, name)(X)
    np.testing.assert_allclose(symgpu.function([x], y)(X), want, rtol=1e-12)
