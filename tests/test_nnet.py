"""symgpu.tensor.nnet against NumPy/SciPy: softmax and log_softmax (any axis, large logits),
relu, sigmoid, softplus, binary and categorical cross-entropy; gradients by central finite
differences (with a random projection, so the whole Jacobian is exercised) and R_op by
directional differences."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special as sps

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.tensor import nnet

RNG = np.random.default_rng(11)


def run(inputs, outputs, *values):
    return function(list(inputs), outputs)(*values)


def ftype(ndim: int, dtype: str = "float64") -> T.TensorType:
    return T.TensorType(dtype, (False,) * ndim)


def check_grad(build, values, eps=1e-6, rtol=1e-5, atol=1e-8):
    """Compare symgpu.grad of sum(build(*vars) * R) (R a fixed random weight) with central
    differences of the same cost, for every input, in float64."""
    vars_ = [ftype(np.ndim(v))() for v in values]
    out = build(*vars_)
    weight = T.constant(RNG.normal(size=_shape_of(build, values)))
    cost = T.sum(out * weight)
    grads = symgpu.grad(cost, vars_)
    f_cost = function(vars_, cost)
    analytic = function(vars_, grads)(*values)
    for i, v in enumerate(values):
        numeric = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            plus = [w.copy() for w in values]
            minus = [w.copy() for w in values]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            numeric[idx] = (f_cost(*plus) - f_cost(*minus)) / (2 * eps)
        np.testing.assert_allclose(analytic[i], numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


def _shape_of(build, values):
    vars_ = [ftype(np.ndim(v))() for v in values]
    return run(vars_, build(*vars_), *values).shape


def check_rop(build, x_value, rtol=1e-5, eps=1e-6):
    """op.R_op (J v) against the directional difference (f(x + eps v) - f(x - eps v)) / 2eps."""
    x, v = ftype(x_value.ndim)(), ftype(x_value.ndim)()
    out = build(x)
    (jv,) = out.owner.op.R_op([x], [v])
    V = RNG.normal(size=x_value.shape)
    got = run([x, v], jv, x_value, V)
    f = function([x], out)
    numeric = (f(x_value + eps * V) - f(x_value - eps * V)) / (2 * eps)
    np.testing.assert_allclose(got, numeric, rtol=rtol, atol=1e-8)
    assert out.owner.op.R_op([x], [None]) == [None]


# ----------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("shape,axis", [((5,), -1), ((3, 4), -1), ((3, 4), 0), ((3, 4), 1),
                                        ((2, 3, 4), 1), ((2, 3, 4), -1), ((3, 4), None)])
def test_softmax_and_log_softmax_values(shape, axis):
    x = ftype(len(shape))()
    X = RNG.normal(size=shape) * 3
    sm, ls = run([x], [nnet.softmax(x, axis=axis), nnet.log_softmax(x, axis=axis)], X)
    if len(shape) == 1:   # a vector is a 1 x n row, as in Theano 1.0
        X, axis = X[None], 1
    assert sm.shape == ls.shape == X.shape
    np.testing.assert_allclose(sm, sps.softmax(X, axis=axis), rtol=1e-12)
    np.testing.assert_allclose(ls, sps.log_softmax(X, axis=axis), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sm.sum(axis=axis), 1.0)


def test_softmax_is_an_op_reachable_as_T_nnet():
    x = T.fmatrix()
    y = T.nnet.softmax(x)
    assert isinstance(y.owner.op, nnet.Softmax) and y.owner.op.axis == 1
    assert y.type == x.type
    z = T.nnet.log_softmax(x, axis=0)
    assert isinstance(z.owner.op, nnet.LogSoftmax) and z.owner.op.axis == 0
    assert str(z.owner.op) == "LogSoftmax{axis=0}"
    assert nnet.Softmax(1) == nnet.Softmax(1) and nnet.Softmax(1) != nnet.Softmax(0)
    assert nnet.logsoftmax is nnet.log_softmax
    for name in ["softmax", "log_softmax", "sigmoid", "binary_crossentropy",
                 "categorical_crossentropy", "relu", "softplus"]:
        assert callable(getattr(T.nnet, name))


def test_softmax_large_logits_do_not_overflow():
    x = T.dmatrix()
    X = np.array([[1000.0, 0.0, -1000.0], [1e300, 1e300, -1e300], [-800.0, -800.0, -801.0],
                  [710.0, 709.0, 708.0]])
    sm, ls = run([x], [nnet.softmax(x), nnet.log_softmax(x)], X)
    assert np.all(np.isfinite(sm)) and np.all(np.isfinite(ls))
    np.testing.assert_allclose(sm[0], [1.0, 0.0, 0.0], atol=1e-300)
    np.testing.assert_allclose(ls[0], [0.0, -1000.0, -2000.0])
    np.testing.assert_allclose(sm[1], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(sm[2], sps.softmax([0.0, 0.0, -1.0]), rtol=1e-12)
    np.testing.assert_allclose(ls[3], sps.log_softmax([2.0, 1.0, 0.0]), rtol=1e-12)
    # float32 too (exp overflows float32 at 88.7)
    xf = T.fmatrix()
    smf, lsf = run([xf], [nnet.softmax(xf), nnet.log_softmax(xf)],
                   np.array([[100.0, 0.0], [-200.0, -100.0]], "float32"))
    assert smf.dtype == np.float32 and lsf.dtype == np.float32
    np.testing.assert_allclose(smf, [[1.0, 0.0], [0.0, 1.0]], atol=1e-30)
    np.testing.assert_allclose(lsf, [[0.0, -100.0], [-100.0, 0.0]])


def test_softmax_dtypes():
    with config.change_flags(floatX="float32"):
        x = T.matrix()
        assert nnet.softmax(x).dtype == "float32"
        assert nnet.log_softmax(x).dtype == "float32"
        i = T.imatrix()
        assert nnet.softmax(i).dtype == "float64"  # integers: the scalar table's float rule
        assert nnet.softmax(T.bmatrix()).dtype == "float32"
        got = run([i], nnet.softmax(i), np.array([[1, 2]], "int32"))
        np.testing.assert_allclose(got, sps.softmax([[1.0, 2.0]], axis=-1))


def test_softmax_bad_inputs():
    with pytest.raises(TypeError, match="at least one dimension"):
        nnet.softmax(T.dscalar())
    with pytest.raises(ValueError, match="axis 2"):
        nnet.softmax(T.dmatrix(), axis=2)
    with pytest.raises(TypeError, match="float"):
        nnet.Softmax(-1)(T.imatrix())


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_softmax_grad(axis):
    X = RNG.normal(size=(3, 4))
    check_grad(lambda x: nnet.softmax(x, axis=axis), [X])


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_log_softmax_grad(axis):
    X = RNG.normal(size=(3, 4))
    check_grad(lambda x: nnet.log_softmax(x, axis=axis), [X])


def test_softmax_grad_3d_and_vector():
    check_grad(lambda x: nnet.softmax(x, axis=1), [RNG.normal(size=(2, 3, 2))])
    check_grad(lambda x: nnet.log_softmax(x), [RNG.normal(size=5)])


def test_softmax_grads_are_finite_for_large_logits():
    x = T.dmatrix()
    X = np.array([[1000.0, 0.0, -1000.0], [50.0, 60.0, 70.0]])
    w = T.constant(np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]]))
    g1 = symgpu.grad(T.sum(nnet.softmax(x) * w), x)
    g2 = symgpu.grad(T.sum(nnet.log_softmax(x) * w), x)
    G1, G2 = run([x], [g1, g2], X)
    assert np.all(np.isfinite(G1)) and np.all(np.isfinite(G2))
    sm = sps.softmax(X, axis=-1)
    W = w.data
    np.testing.assert_allclose(G1, sm * (W - (W * sm).sum(-1, keepdims=True)), atol=1e-12)
    np.testing.assert_allclose(G2, W - sm * W.sum(-1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_softmax_rop(axis):
    X = RNG.normal(size=(3, 4))
    check_rop(lambda x: nnet.softmax(x, axis=axis), X)
    check_rop(lambda x: nnet.log_softmax(x, axis=axis), X)


# ----------------------------------------------------------------------------- relu etc.

def test_relu_values():
    x = T.dvector()
    X = np.array([-np.inf, -3.0, -0.5, 0.0, 0.5, 3.0, np.inf, np.nan])
    a = T.dscalar()
    got = run([x, a], [nnet.relu(x), nnet.relu(x, 0.1), nnet.relu(x, a)], X, np.float64(0.2))
    np.testing.assert_array_equal(got[0], np.where(X < 0, 0.0, X))
    assert got[0][0] == 0.0 and np.isnan(got[0][-1])
    np.testing.assert_allclose(got[1], np.where(X < 0, 0.1 * X, X))
    np.testing.assert_allclose(got[2], np.where(X < 0, 0.2 * X, X))


def test_relu_dtypes_and_grad():
    assert nnet.relu(T.fmatrix()).dtype == "float32"
    assert nnet.relu(T.fmatrix(), 0.01).dtype == "float32"
    assert nnet.relu(T.ivector()).dtype == "int32"
    X = np.array([-2.0, -0.3, 0.4, 1.7])
    check_grad(nnet.relu, [X])
    check_grad(lambda x: nnet.relu(x, alpha=0.3), [X])
    x = T.dvector()
    np.testing.assert_allclose(run([x], symgpu.grad(nnet.relu(x, 0.3).sum(), x), X),
                               [0.3, 0.3, 1.0, 1.0])


def test_sigmoid_and_softplus_are_the_elementwise_ones():
    assert nnet.sigmoid is T.sigmoid and nnet.softplus is T.softplus
    x = T.fvector()
    X = np.array([-100.0, -1.0, 0.0, 2.0, 100.0], "float32")
    s, p = run([x], [nnet.sigmoid(x), nnet.softplus(x)], X)
    assert s.dtype == np.float32 and p.dtype == np.float32
    np.testing.assert_allclose(s, sps.expit(X), rtol=1e-6)
    np.testing.assert_allclose(p, np.logaddexp(0, X.astype("float64")), rtol=1e-6, atol=1e-43)
    check_grad(nnet.sigmoid, [X.astype("float64") / 10])
    check_grad(nnet.softplus, [X.astype("float64") / 10])


# ----------------------------------------------------------------------------- cross-entropies

def test_binary_crossentropy():
    o, t = T.dmatrix(), T.dmatrix()
    O = sps.expit(RNG.normal(size=(3, 4)))
    Tt = (RNG.random((3, 4)) > 0.5).astype("float64")
    Tt[0] = 0.3  # soft targets too
    got = run([o, t], nnet.binary_crossentropy(o, t), O, Tt)
    np.testing.assert_allclose(got, -(Tt * np.log(O) + (1 - Tt) * np.log(1 - O)), rtol=1e-12)
    check_grad(nnet.binary_crossentropy, [O, Tt], rtol=1e-4)
    # float32 stays float32; an integer target works; broadcasting
    of, ti = T.fmatrix(), T.bvector()
    z = nnet.binary_crossentropy(of, ti)
    assert z.dtype == "float32"
    got = run([of, ti], z, O.astype("float32"), np.array([0, 1, 1, 0], "int8"))
    tb = np.array([0, 1, 1, 0])
    np.testing.assert_allclose(got, -(tb * np.log(O) + (1 - tb) * np.log(1 - O)), rtol=1e-5)
    # of a sigmoid, the usual pattern
    x = T.dvector()
    X = np.array([-3.0, 0.0, 2.0])
    np.testing.assert_allclose(
        run([x], nnet.binary_crossentropy(nnet.sigmoid(x), 1.0), X), np.logaddexp(0, -X),
        rtol=1e-12)


def _one_hot(labels, k):
    return np.eye(k)[labels]


def test_categorical_crossentropy_onehot_and_labels_agree():
    p, t, y = T.dmatrix(), T.dmatrix(), T.lvector()
    P = sps.softmax(RNG.normal(size=(4, 5)), axis=-1)
    Y = np.array([0, 4, 2, 2])
    a, b = run([p, t, y], [nnet.categorical_crossentropy(p, t),
                           nnet.categorical_crossentropy(p, y)], P, _one_hot(Y, 5), Y)
    expected = -np.log(P[np.arange(4), Y])
    np.testing.assert_allclose(a, expected, rtol=1e-12)
    np.testing.assert_allclose(b, expected, rtol=1e-12)
    # soft targets: -sum(t log p) over the last axis
    Tsoft = sps.softmax(RNG.normal(size=(4, 5)), axis=-1)
    np.testing.assert_allclose(run([p, t], nnet.categorical_crossentropy(p, t), P, Tsoft),
                               -(Tsoft * np.log(P)).sum(-1), rtol=1e-12)


def test_categorical_crossentropy_int_label_dtypes_and_float32():
    p = T.fmatrix()
    P = sps.softmax(RNG.normal(size=(3, 4)), axis=-1).astype("float32")
    for dtype in ["int8", "int32", "int64", "uint8"]:
        y = T.tensor(dtype, (None,))
        z = nnet.categorical_crossentropy(p, y)
        assert z.dtype == "float32" and z.ndim == 1
        Y = np.array([3, 0, 1], dtype)
        np.testing.assert_allclose(run([p, y], z, P, Y), -np.log(P[np.arange(3), Y]),
                                   rtol=1e-6)


def test_categorical_crossentropy_grads():
    P = sps.softmax(RNG.normal(size=(3, 4)), axis=-1)
    Y = np.array([1, 3, 0])
    y = T.constant(Y)
    check_grad(lambda p: nnet.categorical_crossentropy(p, y), [P], rtol=1e-4)
    check_grad(lambda p, t: nnet.categorical_crossentropy(p, t), [P, _one_hot(Y, 4)],
               rtol=1e-4)


def test_softmax_crossentropy_gradient_is_softmax_minus_onehot():
    x, y = T.dmatrix(), T.lvector()
    X = RNG.normal(size=(4, 3)) * 5
    Y = np.array([2, 0, 1, 1])
    cost = nnet.categorical_crossentropy(nnet.softmax(x), y).sum()
    g = run([x, y], symgpu.grad(cost, x), X, Y)
    np.testing.assert_allclose(g, sps.softmax(X, axis=-1) - _one_hot(Y, 3), atol=1e-10)
    # labels get no gradient
    assert symgpu.grad(cost, [x])[0] is not None


def test_categorical_crossentropy_errors():
    p, y = T.dmatrix(), T.lvector()
    f = function([p, y], nnet.categorical_crossentropy(p, y))
    P = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        f(P, np.array([0, 3]))
    with pytest.raises(ValueError, match=r"labels must lie in"):
        f(P, np.array([-1, 0]))
    with pytest.raises(ValueError, match=r"3 labels for 2 rows"):
        f(P, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="same number of dimensions"):
        nnet.categorical_crossentropy(p, T.dtensor3())
    with pytest.raises(TypeError, match="integer vector"):
        nnet.categorical_crossentropy(p, T.dvector())
    with pytest.raises(TypeError, match="float matrix"):
        nnet.crossentropy_categorical_1hot(T.dtensor3(), T.lmatrix())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_nnet_grads_with_verify_grad(dtype):
    """The project's own checker agrees (float32 with its looser tolerances)."""
    from symgpu.gradient import verify_grad
    X = RNG.normal(size=(3, 4)).astype(dtype)
    P = sps.softmax(RNG.normal(size=(3, 4)), axis=-1).astype(dtype)
    Tt = RNG.random((3, 4)).astype(dtype)
    y = T.constant(np.array([1, 3, 0]))
    verify_grad(lambda x: nnet.softmax(x), [X])
    verify_grad(lambda x: nnet.softmax(x, axis=0), [X])
    verify_grad(lambda x: nnet.log_softmax(x), [X])
    verify_grad(lambda x: nnet.log_softmax(x, axis=None), [X])
    verify_grad(lambda x: nnet.relu(x, 0.2), [X + np.sign(X).astype(dtype) * 0.1])
    verify_grad(lambda p, t: nnet.binary_crossentropy(p, t), [P, Tt])
    verify_grad(lambda p: nnet.categorical_crossentropy(p, y), [P])
    verify_grad(lambda p, t: nnet.categorical_crossentropy(p, t), [P, Tt])
    verify_grad(lambda x: nnet.categorical_crossentropy(nnet.softmax(x), y), [X])
