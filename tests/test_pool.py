"""symgpu.tensor.signal.pool.pool_2d against Theano's Pool loop (every combination of window,
stride, padding, ignore_border and mode), its gradients by verify_grad, second derivatives,
infer_shape and the errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient_check import verify_grad
from symgpu.tensor.signal.pool import (AveragePoolGrad, MaxPoolGrad, Pool, pool_2d,
                                       pool_output_shape)
from symgpu.tensor.signal.pool_numpy import MODES, pool_reference

RNG = np.random.default_rng(5)
COMBOS = [c for c in itertools.product([(2, 2), (3, 2), (1, 3)], [None, (1, 1), (2, 3), (3, 1)],
                                        [(0, 0), (1, 1), (2, 1)], [True, False], MODES)
          if (c[2] == (0, 0) or c[3]) and c[2][0] < c[0][0] and c[2][1] < c[0][1]]


@pytest.mark.parametrize("ws,stride,pad,ignore_border,mode", COMBOS)
def test_pool_2d_matches_theano_loop(ws, stride, pad, ignore_border, mode):
    x = T.dtensor4("x")
    gz = T.dtensor4("gz")
    y = pool_2d(x, ws, ignore_border=ignore_border, stride=stride, pad=pad, mode=mode)
    gx = symgpu.grad((y * gz).sum(), x)
    f = function([x, gz], [y, gx])
    xv = RNG.normal(size=(2, 3, 7, 8))
    ref = pool_reference(xv, ws, ignore_border, stride, pad, mode)
    gzv = RNG.normal(size=ref.shape)
    out, gxv = f(xv, gzv)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert out.shape == pool_output_shape(xv.shape, ws, ignore_border, stride, pad)
    if mode != "max":  # linear: the gradient is the adjoint
        np.testing.assert_allclose((xv * gxv).sum(), (ref * gzv).sum(), rtol=1e-10)
    else:  # each window's gradient lands on its (unique) maximum
        np.testing.assert_allclose(gxv.sum(), gzv.sum(), rtol=1e-10)
        assert np.count_nonzero(gxv) <= gzv.size


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(ws=(2, 2)),
                                dict(ws=(3, 2), stride=(2, 1), ignore_border=False),
                                dict(ws=(3, 3), stride=(2, 2), pad=(1, 2))])
def test_verify_grad(mode, kw):
    # distinct values far apart: finite differences never change which element is the max
    x = RNG.permutation(2 * 5 * 6).reshape(2, 1, 5, 6) * 0.1
    verify_grad(lambda a: pool_2d(a, mode=mode, **kw), [x], rng=4)


@pytest.mark.parametrize("mode", ["max", "average_exc_pad", "sum"])
def test_second_derivative(mode):
    x = RNG.permutation(30).reshape(1, 1, 5, 6) * 0.1

    def g_of(a):
        return symgpu.grad((pool_2d(a, (2, 3), stride=(1, 2), mode=mode) ** 2).sum(), a)
    verify_grad(g_of, [x], rng=6)


def test_max_ties_follow_theano():
    """Theano's MaxPoolGrad gives a window's gradient to every element equal to its max."""
    x = T.dmatrix()
    g = symgpu.grad(pool_2d(x, (2, 2)).sum(), x)
    out = function([x], g)(np.array([[1.0, 1.0], [0.0, 1.0]]))
    np.testing.assert_array_equal(out, [[1, 1], [0, 1]])


@pytest.mark.parametrize("shape", [(5, 6), (3, 5, 6), (2, 2, 2, 5, 6)])
def test_any_rank_of_two_or_more(shape):
    x = T.tensor(dtype="float64", shape=(None,) * len(shape))
    xv = RNG.normal(size=shape)
    out = function([x], pool_2d(x, (2, 3), ignore_border=False))(xv)
    np.testing.assert_allclose(out, pool_reference(xv, (2, 3), False, None, (0, 0), "max"))


def test_float32_and_int():
    x = T.ftensor4()
    xv = RNG.normal(size=(1, 2, 4, 4)).astype("float32")
    out = function([x], pool_2d(x, (2, 2), mode="average_inc_pad"))(xv)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, pool_reference(xv, (2, 2), mode="average_inc_pad"), rtol=1e-6)
    i = T.itensor4()
    iv = RNG.integers(-50, 50, size=(1, 1, 4, 5)).astype("int32")
    np.testing.assert_array_equal(function([i], pool_2d(i, (2, 2), ignore_border=False))(iv),
                                  pool_reference(iv, (2, 2), False))


def test_window_larger_than_input():
    x = T.dtensor4()
    xv = RNG.normal(size=(1, 1, 2, 2))
    assert function([x], pool_2d(x, (3, 3)))(xv).shape == (1, 1, 0, 0)
    np.testing.assert_allclose(function([x], pool_2d(x, (3, 3), ignore_border=False))(xv),
                               xv.max().reshape(1, 1, 1, 1))


def test_infer_shape():
    x = T.dtensor4()
    xv = RNG.normal(size=(2, 3, 9, 7))
    for kw in [dict(ws=(2, 2)), dict(ws=(3, 2), stride=(2, 1), ignore_border=False),
               dict(ws=(3, 3), pad=(1, 2), stride=(2, 2), mode="average_exc_pad")]:
        y = pool_2d(x, **kw)
        gx = symgpu.grad(y.sum(), x)
        for v, ref in ((y, pool_reference(xv, kw["ws"], kw.get("ignore_border", True),
                                          kw.get("stride"), kw.get("pad", (0, 0)))), (gx, xv)):
            node = v.owner
            assert isinstance(node.op, (Pool, MaxPoolGrad, AveragePoolGrad))
            shapes = [tuple(T.shape_i(i, k) for k in range(i.ndim)) for i in node.inputs]
            (s,) = node.op.infer_shape(None, node, shapes)
            got = function([x], list(s), on_unused_input="ignore")(xv)
            assert tuple(int(k) for k in got) == ref.shape


def test_errors():
    x = T.dtensor4()
    with pytest.raises(ValueError, match="mode"):
        pool_2d(x, (2, 2), mode="min")
    with pytest.raises(ValueError, match="ignore_border=True"):
        pool_2d(x, (2, 2), ignore_border=False, pad=(1, 1))
    with pytest.raises(ValueError, match="smaller than the window"):
        pool_2d(x, (2, 2), pad=(2, 0))
    with pytest.raises(ValueError, match="ws"):
        pool_2d(x, (0, 2))
    with pytest.raises(TypeError, match="at least 2 dimensions"):
        pool_2d(T.dvector(), (2, 2))


def test_theano_older_parameter_names():
    x = T.dtensor4()
    xv = RNG.normal(size=(1, 1, 6, 7))
    old = pool_2d(x, ds=(3, 2), st=(2, 2), padding=(1, 1), mode="average_inc_pad")
    new = pool_2d(x, ws=(3, 2), stride=(2, 2), pad=(1, 1), mode="average_inc_pad")
    a, b = function([x], [old, new])(xv)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        pool_2d(x, ws=(2, 2), ds=(2, 2))
