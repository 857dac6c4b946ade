"""Theano's remaining nnet functions: ultra_fast_sigmoid, hard_sigmoid, softsign,
sigmoid_binary_crossentropy and h_softmax, against NumPy and with verify_grad."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient.check import verify_grad

RNG = np.random.default_rng(7)


def _ultra_np(x):
    h = 0.5 * np.asarray(x, dtype="float64")
    a = np.abs(h)
    z = np.where(a < 1.7, 1.5 * a / (1 + a),
                 np.where(a < 3, 0.935409070603099 + 0.0458812946797165 * (a - 1.7),
                          0.99505475368673))
    return 0.5 * (np.sign(h) * z + 1)


def _run(fn, *values):
    vars_ = [T.TensorType(np.asarray(v).dtype, (False,) * np.ndim(v))() for v in values]
    return symgpu.function(vars_, fn(*vars_))(*values)


def test_ultra_fast_sigmoid_matches_theano_approximation():
    x = np.concatenate([np.linspace(-10, 10, 201), [0.0, 3.4, -3.4, 6.0, -6.0]])
    got = _run(T.nnet.ultra_fast_sigmoid, x)
    np.testing.assert_allclose(got, _ultra_np(x), rtol=1e-12, atol=1e-12)
    sig = 1 / (1 + np.exp(-x))
    assert np.max(np.abs(got - sig)) < 0.03
    assert got[np.argmin(np.abs(x))] == 0.5


def test_ultra_fast_sigmoid_dtype_and_grad():
    assert T.nnet.ultra_fast_sigmoid(T.fmatrix()).dtype == "float32"
    assert T.nnet.ultra_fast_sigmoid(T.ivector()).dtype == "float64"
    # away from the kinks at |x| = 3.4 and 6
    x = np.array([-8.0, -5.0, -2.1, -0.4, 0.3, 1.9, 4.5, 7.0])
    verify_grad(T.nnet.ultra_fast_sigmoid, [x])
    g = symgpu.function([v := T.dscalar()], symgpu.grad(T.nnet.ultra_fast_sigmoid(v), v))
    assert g(0.0) == pytest.approx(0.375)
    assert g(10.0) == 0.0


def test_hard_sigmoid():
    x = np.linspace(-5, 5, 41)
    np.testing.assert_allclose(_run(T.nnet.hard_sigmoid, x), np.clip(0.2 * x + 0.5, 0, 1))
    xf = x.astype("float32")
    out = _run(T.nnet.hard_sigmoid, xf)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.clip(0.2 * xf + 0.5, 0, 1), rtol=1e-6)
    verify_grad(T.nnet.hard_sigmoid, [np.array([-4.0, -1.0, 0.3, 2.0, 4.0])])


def test_softsign():
    x = RNG.normal(scale=3, size=(4, 5))
    np.testing.assert_allclose(_run(T.nnet.softsign, x), x / (1 + np.abs(x)))
    verify_grad(T.nnet.softsign, [x])
    v = T.dvector()
    g = symgpu.function([v], symgpu.grad(T.sum(T.nnet.softsign(v)), v))
    pts = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(g(pts), 1 / (1 + np.abs(pts)) ** 2)


def _sbce_np(o, t):
    return np.logaddexp(0, o) - o * t


def test_sigmoid_binary_crossentropy_values_are_stable():
    o = np.array([-800.0, -40.0, -3.0, 0.0, 2.5, 40.0, 800.0])
    t = np.array([0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.5])
    got = _run(T.nnet.sigmoid_binary_crossentropy, o, t)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, _sbce_np(o, t), rtol=1e-12, atol=1e-15)
    # exact where the naive softplus(o) - o * t cancels
    assert _run(T.nnet.sigmoid_binary_crossentropy, np.array([40.0]), np.array([1.0]))[0] \
        == pytest.approx(np.exp(-40.0), rel=1e-12)
    # the same value as Theano's binary_crossentropy(sigmoid(o), t) where that is finite
    o2, t2 = RNG.normal(size=(3, 4)), RNG.uniform(size=(3, 4))
    ref = _run(lambda a, b: T.nnet.binary_crossentropy(T.nnet.sigmoid(a), b), o2, t2)
    np.testing.assert_allclose(_run(T.nnet.sigmoid_binary_crossentropy, o2, t2), ref,
                               rtol=1e-10)


def test_sigmoid_binary_crossentropy_grad():
    o, t = RNG.normal(size=(3, 4)), RNG.uniform(size=(3, 4))
    verify_grad(T.nnet.sigmoid_binary_crossentropy, [o, t])
    ov, tv = T.dvector(), T.dvector()
    cost = T.sum(T.nnet.sigmoid_binary_crossentropy(ov, tv))
    g = symgpu.function([ov, tv], symgpu.grad(cost, [ov, tv]))
    o1, t1 = np.array([-3.0, 0.0, 0.0, 900.0]), np.array([0.2, 0.0, 1.0, 1.0])
    go, gt = g(o1, t1)
    np.testing.assert_allclose(go, 1 / (1 + np.exp(-o1)) - t1)
    np.testing.assert_allclose(gt, -o1)


def _h_softmax_np(x, W1, b1, W2, b2, n_outputs):
    def sm(a):
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    cls = sm(x @ W1 + b1)                                      # (B, C)
    inner = sm(np.einsum("bi,cio->bco", x, W2) + b2)           # (B, C, P)
    return (cls[:, :, None] * inner).reshape(len(x), -1)[:, :n_outputs]


@pytest.mark.parametrize("n_outputs", [12, 10])
def test_h_softmax(n_outputs):
    B, n_in, C, P = 5, 6, 3, 4
    x = RNG.normal(size=(B, n_in))
    W1, b1 = RNG.normal(size=(n_in, C)), RNG.normal(size=C)
    W2, b2 = RNG.normal(size=(C, n_in, P)), RNG.normal(size=(C, P))
    xv, W1v, b1v, W2v, b2v = T.dmatrix(), T.dmatrix(), T.dvector(), T.dtensor3(), T.dmatrix()
    tv = T.ivector()
    full = T.nnet.h_softmax(xv, B, n_outputs, C, P, W1v, b1v, W2v, b2v)
    picked = T.nnet.h_softmax(xv, B, n_outputs, C, P, W1v, b1v, W2v, b2v, tv)
    f = symgpu.function([xv, W1v, b1v, W2v, b2v, tv], [full, picked])
    target = RNG.integers(0, n_outputs, size=B).astype("int32")
    got_full, got_picked = f(x, W1, b1, W2, b2, target)
    ref = _h_softmax_np(x, W1, b1, W2, b2, n_outputs)
    assert got_full.shape == (B, n_outputs)
    np.testing.assert_allclose(got_full, ref, rtol=1e-10)
    if n_outputs == C * P:
        np.testing.assert_allclose(got_full.sum(axis=1), 1.0)
    np.testing.assert_allclose(got_picked, ref[np.arange(B), target], rtol=1e-10)


def test_h_softmax_grad():
    B, n_in, C, P = 3, 4, 2, 3
    x = RNG.normal(size=(B, n_in))
    params = [RNG.normal(size=(n_in, C)), RNG.normal(size=C), RNG.normal(size=(C, n_in, P)),
              RNG.normal(size=(C, P))]
    target = np.array([0, 5, 3], dtype="int32")
    verify_grad(lambda *a: T.nnet.h_softmax(a[0], B, C * P, C, P, *a[1:]), [x] + params)
    verify_grad(lambda *a: T.nnet.h_softmax(a[0], B, C * P, C, P, *a[1:],
                                            target=T.constant(target)), [x] + params)
