"""Stabilize: overflow-free forms, finite gradients on saturated inputs, same values elsewhere."""
import numpy as np
import pytest
from scipy.special import expit

import symgpu.tensor as T
from symgpu import config, function, grad
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, rewritten, same_values  # noqa: F401

X = np.array([-30.0, -5.0, -0.5, 0.0, 0.7, 6.0, 25.0])


@pytest.fixture
def x():
    return T.dvector("x")


def test_log1p_exp_to_softplus(x):
    out = T.log(1 + T.exp(x))
    f = rewritten([x], out)
    assert op_names(f) == ["softplus"]
    same_values([x], out, X)
    assert op_names(rewritten([x], T.log1p(T.exp(x)))) == ["softplus"]


def test_softplus_at_1000_is_1000():
    s = T.dscalar("s")
    assert function([s], T.log(1 + T.exp(s)))(1000.0) == 1000.0
    f32 = T.fscalar("f")
    assert function([f32], T.log(1 + T.exp(f32)))(np.float32(1000)) == np.float32(1000)


def test_log_sigmoid_to_softplus(x):
    out = T.log(T.sigmoid(x))
    f = rewritten([x], out)
    assert "softplus" in op_names(f) and "log" not in op_names(f)
    same_values([x], out, X)
    s = T.dscalar("s")
    v = function([s], T.log(T.sigmoid(s)))(-1000.0)
    assert np.isfinite(v) and v == -1000.0


def test_log_one_minus_sigmoid_to_softplus(x):
    out = T.log(1 - T.sigmoid(x))
    f = rewritten([x], out)
    assert "softplus" in op_names(f) and "log" not in op_names(f)
    same_values([x], out, X)
    s = T.dscalar("s")
    assert function([s], out.owner.op(1 - T.sigmoid(s)))(1000.0) == -1000.0


def test_one_over_one_plus_exp_to_sigmoid(x):
    out = 1 / (1 + T.exp(-x))
    f = rewritten([x], out)
    assert op_names(f) == ["sigmoid"]
    same_values([x], out, X)
    out = 1 / (1 + T.exp(x))
    f = rewritten([x], out)
    assert "sigmoid" in op_names(f) and "exp" not in op_names(f)
    same_values([x], out, X)


def test_sigmoid_algebra_in_products(x):
    e = T.exp(-x)
    out = e / (1 + e) ** 2  # the derivative of 1/(1+exp(-x)), as grad builds it
    f = rewritten([x], out)
    assert "exp" not in op_names(f) and op_names(f).count("sigmoid") == 2
    same_values([x], out, X[1:-1])
    g = function([x], out)
    assert np.all(np.isfinite(g(np.array([-1000.0, 1000.0]))))


def test_gradient_of_the_seed_sigmoid_is_finite(x):
    p = 1 / (1 + T.exp(-x))
    g = grad(T.log(p).sum() + T.log(1 - p).sum(), x)
    f = function([x], g)
    v = f(np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0]))
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(v, [1, 1, 0, -1, -1], atol=1e-12)


def test_binary_crossentropy_stable_value_and_gradient():
    z, t = T.dvector("z"), T.dvector("t")
    xent = T.nnet.binary_crossentropy(T.nnet.sigmoid(z), t)
    cost = xent.mean()
    gz = grad(cost, z)
    f = function([z, t], [xent, gz])
    zs = np.array([-1000.0, -40.0, 40.0, 1000.0, 0.3])
    ts = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    v, g = f(zs, ts)
    assert np.all(np.isfinite(v)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(v[[0, 3]], [1000.0, 1000.0])
    sig = expit(zs)
    np.testing.assert_allclose(g, (sig - ts) / 5, atol=1e-15)


def test_logistic_crossentropy_forms(x):
    y = T.dvector("y")
    xent = y * T.softplus(-x) + (1 - y) * T.softplus(x)
    f = rewritten([x, y], xent)
    assert op_names(f).count("softplus") == 1
    yv = (np.arange(7) % 2).astype(float)
    same_values([x, y], xent, X, yv)
    g = (1 - y) * T.sigmoid(x) / 7 - y * T.sigmoid(-x) / 7
    f = rewritten([x, y], g)
    assert op_names(f).count("sigmoid") == 1
    same_values([x, y], g, X, yv)


def test_float32_saturated_logistic_gradient_is_finite():
    with config.change_flags(floatX="float32"):
        z, t = T.vector("z"), T.vector("t")
        p = 1 / (1 + T.exp(-z))
        xent = -t * T.log(p) - (1 - t) * T.log(1 - p)
        g = grad(xent.mean(), z)
        f = function([z, t], [xent, g])
        v, gv = f(np.array([-100, -20, 20, 100], "float32"), np.array([1, 0, 0, 1], "float32"))
        assert np.all(np.isfinite(v)) and np.all(np.isfinite(gv))
        np.testing.assert_allclose(v, [100, 0, 20, 0], atol=1e-5)


def test_log_softmax(x):
    m = T.dmatrix("m")
    out = T.log(T.nnet.softmax(m))
    f = rewritten([m], out)
    assert op_names(f) == ["LogSoftmax"]
    mv = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 1000.0]])
    v = function([m], out)(mv)
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(v[0], np.log(np.exp(mv[0]) / np.exp(mv[0]).sum()))


def test_log_softmax_gradient_is_finite():
    m = T.dmatrix("m")
    g = grad(T.log(T.nnet.softmax(m))[:, 0].sum(), m)
    v = function([m], g)(np.array([[0.0, 0.0, 2000.0]]))
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(v, [[1.0, 0.0, -1.0]], atol=1e-12)


def test_categorical_crossentropy_stable_value_and_gradient():
    m, y = T.dmatrix("m"), T.lvector("y")
    ce = T.nnet.categorical_crossentropy(T.nnet.softmax(m), y)
    f = rewritten([m, y], ce)
    assert "CrossentropyCategorical1Hot" not in op_names(f)
    g = grad(ce.sum(), m)
    fv = function([m, y], [ce, g])
    mv = np.array([[0.0, 1000.0, 0.0], [1.0, 2.0, 3.0]])
    yv = np.array([0, 2])
    v, gv = fv(mv, yv)
    assert np.all(np.isfinite(v)) and np.all(np.isfinite(gv))
    np.testing.assert_allclose(v[0], 1000.0)
    sm = np.exp(mv[1] - mv[1].max()) / np.exp(mv[1] - mv[1].max()).sum()
    np.testing.assert_allclose(v[1], -np.log(sm[2]))
    np.testing.assert_allclose(gv[0], [-1.0, 1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(gv[1], sm - [0, 0, 1], atol=1e-12)


def test_log_exp_cancels(x):
    f = rewritten([x], T.log(T.exp(x)))
    assert op_names(f) == []
    assert function([x], T.log(T.exp(x)))(np.array([1000.0]))[0] == 1000.0
