"""symgpu.tensor.nnet.bn (Theano's batch_normalization_train/_test) against NumPy, with both
parameter layouts, running averages (unbiased variance), verify_grad; and nnet.elu/selu."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient_check import verify_grad
from symgpu.tensor import nnet
from symgpu.tensor.nnet import bn

RNG = np.random.default_rng(3)


def _np_axes(axes, ndim):
    return {"per-activation": (0,), "spatial": (0,) + tuple(range(2, ndim))}.get(axes, axes)


@pytest.mark.parametrize("axes", ["per-activation", "spatial", (0, 2), (1, 3)])
@pytest.mark.parametrize("full_params", [True, False])
def test_train_matches_numpy(axes, full_params):
    xv = RNG.normal(size=(5, 3, 4, 2)) * 3 + 1
    ax = _np_axes(axes, 4)
    keep = tuple(1 if i in ax else n for i, n in enumerate(xv.shape))
    small = tuple(n for i, n in enumerate(xv.shape) if i not in ax)
    pshape = keep if full_params else small
    gv, bv, rmv, rvv = (RNG.normal(size=pshape) for _ in range(4))
    rvv = np.abs(rvv)
    x = T.dtensor4("x")
    ps = [T.tensor(dtype="float64", shape=tuple(1 if s == 1 and full_params else None for s in pshape))
          for _ in range(4)]
    outs = bn.batch_normalization_train(x, ps[0], ps[1], axes, epsilon=1e-3,
                                        running_average_factor=0.3, running_mean=ps[2],
                                        running_var=ps[3])
    out, mean, invstd, nrm, nrv = function([x] + ps, list(outs))(xv, gv, bv, rmv, rvv)
    m = xv.mean(ax, keepdims=True)
    v = xv.var(ax, keepdims=True)
    g, b = gv.reshape(keep), bv.reshape(keep)
    np.testing.assert_allclose(out, (xv - m) * g / np.sqrt(v + 1e-3) + b, rtol=1e-10)
    np.testing.assert_allclose(mean, m.reshape(pshape), rtol=1e-12)
    np.testing.assert_allclose(invstd, (1 / np.sqrt(v + 1e-3)).reshape(pshape), rtol=1e-12)
    n = np.prod([xv.shape[a] for a in ax])
    np.testing.assert_allclose(nrm, rmv * 0.7 + m.reshape(pshape) * 0.3, rtol=1e-12)
    np.testing.assert_allclose(nrv, rvv * 0.7 + (v * n / (n - 1)).reshape(pshape) * 0.3,
                               rtol=1e-12)
    assert nrv.shape == rvv.shape and mean.shape == pshape


def test_train_without_running_values_returns_three():
    x, g, b = T.dmatrix(), T.dvector(), T.dvector()
    outs = bn.batch_normalization_train(x, g, b)
    assert len(outs) == 3
    assert [o.ndim for o in outs] == [2, 1, 1]


@pytest.mark.parametrize("axes", ["per-activation", "spatial"])
def test_test_mode_matches_numpy(axes):
    xv = RNG.normal(size=(4, 3, 2, 2))
    ax = _np_axes(axes, 4)
    small = tuple(n for i, n in enumerate(xv.shape) if i not in ax)
    keep = tuple(1 if i in ax else n for i, n in enumerate(xv.shape))
    gv, bv, mv = (RNG.normal(size=small) for _ in range(3))
    vv = np.abs(RNG.normal(size=small))
    x = T.dtensor4()
    ps = [T.tensor(dtype="float64", shape=(None,) * len(small)) for _ in range(4)]
    out = function([x] + ps, bn.batch_normalization_test(x, *ps, axes=axes))(xv, gv, bv, mv, vv)
    ref = ((xv - mv.reshape(keep)) * gv.reshape(keep) / np.sqrt(vv.reshape(keep) + 1e-4)
           + bv.reshape(keep))
    np.testing.assert_allclose(out, ref, rtol=1e-12)


@pytest.mark.parametrize("axes", ["per-activation", "spatial"])
def test_train_gradients(axes):
    xv = RNG.normal(size=(3, 2, 2, 2))
    ax = _np_axes(axes, 4)
    small = tuple(n for i, n in enumerate(xv.shape) if i not in ax)
    gv, bv = RNG.normal(size=small), RNG.normal(size=small)

    def f(x, g, b):
        out, mean, invstd = bn.batch_normalization_train(x, g, b, axes)
        return [out, mean, invstd]
    verify_grad(f, [xv, gv, bv], rng=1)


def test_test_mode_gradients():
    xv = RNG.normal(size=(3, 4))
    verify_grad(lambda x, g, b, m, v: bn.batch_normalization_test(x, g, b, m, v),
                [xv, RNG.normal(size=4), RNG.normal(size=4), RNG.normal(size=4),
                 np.abs(RNG.normal(size=4)) + 0.5], rng=2)


def test_old_batch_normalization():
    xv, gv, bv, mv, sv = (RNG.normal(size=(3, 4)) for _ in range(5))
    vs = [T.dmatrix() for _ in range(5)]
    out = function(vs, bn.batch_normalization(*vs, mode="high_mem"))(xv, gv, bv, mv, sv)
    np.testing.assert_allclose(out, (xv - mv) * (gv / sv) + bv)


def test_errors():
    x, v = T.dtensor4(), T.dvector()
    with pytest.raises(ValueError, match="axes"):
        bn.batch_normalization_train(x, v, v, axes="channel")
    with pytest.raises(ValueError, match="out of range"):
        bn.batch_normalization_train(x, v, v, axes=(4,))
    with pytest.raises(ValueError, match="dimensions"):
        bn.batch_normalization_train(x, v, T.dmatrix())
    with pytest.raises(ValueError, match="both"):
        bn.batch_normalization_train(x, T.dtensor3(), T.dtensor3(), running_mean=T.dtensor3())
    with pytest.raises(ValueError, match="epsilon"):
        bn.batch_normalization_test(x, v, v, v, v, axes="spatial", epsilon=1e-6)


def test_full_layout_params_must_be_length_one_on_axes():
    x = T.dmatrix()
    g = T.dmatrix()
    out = bn.batch_normalization_train(x, g, g)[0]
    f = function([x, g], out)
    with pytest.raises(Exception, match="broadcastable"):
        f(np.zeros((3, 4)), np.ones((3, 4)))


def test_elu_selu():
    x = T.dvector()
    xv = np.array([-30.0, -1.0, -1e-9, 0.0, 2.0])
    np.testing.assert_allclose(function([x], nnet.elu(x))(xv),
                               np.where(xv > 0, xv, np.expm1(xv)), rtol=1e-15)
    np.testing.assert_allclose(function([x], nnet.elu(x, 0.5))(xv),
                               np.where(xv > 0, xv, 0.5 * np.expm1(xv)), rtol=1e-15)
    a, s = 1.6732632423543772, 1.0507009873554805
    np.testing.assert_allclose(function([x], nnet.selu(x))(xv),
                               s * np.where(xv > 0, xv, a * np.expm1(xv)), rtol=1e-14)
    verify_grad(nnet.elu, [np.array([-2.0, -0.3, 0.4, 1.5])])
    verify_grad(nnet.selu, [np.array([-2.0, -0.3, 0.4, 1.5])])


def test_activations_present():
    for name in ("relu", "elu", "softmax", "logsoftmax", "log_softmax", "softplus", "sigmoid",
                 "conv2d"):
        assert callable(getattr(nnet, name))
    assert symgpu.tensor.nnet.bn is bn
