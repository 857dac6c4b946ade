"""Pooling with graph-valued window, stride and padding (symgpu.tensor.signal.pool_dynamic:
Theano's Pool takes them as inputs; Lasagne's SpatialPyramidPoolingLayer probes for it):
against the static Pool for every mode, its gradients by verify_grad (first and second
derivatives), the shape it infers, and the run-time checks of the sizes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient_check import verify_grad
from symgpu.tensor.signal.pool import Pool, pool_2d, pool_3d
from symgpu.tensor.signal.pool_dynamic import DynamicPool, DynamicPoolGrad
from symgpu.tensor.signal.pool_numpy import MODES

RNG = np.random.default_rng(11)
SIZES = [((2, 2), None, (0, 0), True), ((3, 2), (2, 1), (0, 0), False),
         ((3, 3), (2, 2), (1, 2), True), ((1, 3), (3, 1), (0, 0), False)]


def _iv(v):
    return np.asarray(v, dtype="int32")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ws,stride,pad,ignore_border", SIZES)
def test_dynamic_pool_matches_static(mode, ws, stride, pad, ignore_border):
    x, gz = T.dtensor4("x"), T.dtensor4("gz")
    w, s, p = T.ivector("ws"), T.ivector("stride"), T.ivector("pad")
    y = pool_2d(x, ws=w, stride=s, pad=p, ignore_border=ignore_border, mode=mode)
    assert isinstance(y.owner.op, DynamicPool)
    gx = symgpu.grad((y * gz).sum(), x)
    f = function([x, gz, w, s, p], [y, gx, y.shape])
    ys = pool_2d(x, ws, ignore_border=ignore_border, stride=stride, pad=pad, mode=mode)
    assert isinstance(ys.owner.op, Pool)
    g = function([x, gz], [ys, symgpu.grad((ys * gz).sum(), x)])
    xv = RNG.normal(size=(2, 3, 7, 8))
    gzv = RNG.normal(size=function([x], ys)(xv).shape)
    out, gxv, shape = f(xv, gzv, _iv(ws), _iv(stride or ws), _iv(pad))
    ref, gref = g(xv, gzv)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    np.testing.assert_allclose(gxv, gref, rtol=1e-12)
    assert tuple(shape) == ref.shape


def test_sizes_mixing_ints_and_shape_scalars():
    # Lasagne's spatial pyramid: windows and strides from the input's symbolic shape
    x = T.dtensor4("x")
    h, w = x.shape[2], x.shape[3]
    y = pool_2d(x, ws=((h + 1) // 2, (w + 1) // 2), stride=(h // 2, w // 2), pad=None,
                mode="average_exc_pad", ignore_border=True)
    xv = RNG.normal(size=(2, 3, 7, 6))
    want = pool_2d(x, (4, 3), stride=(3, 3), mode="average_exc_pad").eval({x: xv})
    np.testing.assert_allclose(y.eval({x: xv}), want, rtol=1e-12)
    # Lasagne's probe: an integer vector for ws and stride, pad=None
    assert isinstance(pool_2d(T.tensor4(), ws=T.ivector(), stride=T.ivector(),
                              ignore_border=True, pad=None).owner.op, DynamicPool)


def test_dynamic_pool_3d():
    x = T.dtensor5("x")
    w = T.ivector("w")
    y = pool_3d(x, ws=w, ignore_border=False, mode="sum")
    xv = RNG.normal(size=(2, 1, 5, 4, 3))
    want = pool_3d(x, (2, 3, 2), ignore_border=False, mode="sum").eval({x: xv})
    np.testing.assert_allclose(y.eval({x: xv, w: _iv([2, 3, 2])}), want, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_verify_grad_with_constant_vector_sizes(mode):
    # sizes given as a constant vector still build a DynamicPool (a vector is a graph value)
    x = RNG.permutation(2 * 5 * 6).reshape(2, 1, 5, 6) * 0.1
    verify_grad(lambda a: pool_2d(a, ws=T.constant(_iv([3, 2])), stride=(2, 1),
                                  ignore_border=False, mode=mode), [x], rng=4)


@pytest.mark.parametrize("mode", ["max", "average_exc_pad", "sum"])
def test_second_derivative(mode):
    x = RNG.permutation(30).reshape(1, 1, 5, 6) * 0.1
    w = T.constant(_iv([2, 3]))

    def g_of(a):
        return symgpu.grad((pool_2d(a, ws=w, stride=(1, 2), mode=mode) ** 2).sum(), a)
    verify_grad(g_of, [x], rng=6)


def test_sizes_are_checked_when_the_function_runs():
    x, w, p = T.dtensor4("x"), T.ivector("w"), T.ivector("p")
    f = function([x, w, p], pool_2d(x, ws=w, pad=p))
    xv = np.zeros((1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"pad \(2, 0\) must be smaller than the window"):
        f(xv, _iv([2, 2]), _iv([2, 0]))
    with pytest.raises(ValueError, match="must have 2 entries"):
        f(xv, _iv([2, 2, 2]), _iv([0, 0]))
    with pytest.raises(ValueError, match=">= 1"):
        f(xv, _iv([0, 2]), _iv([0, 0]))
    with pytest.raises(TypeError, match="vector of integers"):
        pool_2d(x, ws=T.dvector())
    with pytest.raises(ValueError, match="must have 2 entries"):
        pool_2d(x, ws=(T.iscalar(), 2, 2))
    with pytest.raises(ValueError, match="does not go with mode"):
        DynamicPoolGrad(2, True, "max", "average_grad")


def test_stays_on_the_host_between_transfers_on_a_gpu(vgpu):
    # no GPU kernel of its own: a GPU graph reads it through transfers
    x = T.ftensor4("x")
    w = T.ivector("w")
    f = function([x, w], T.exp(pool_2d(T.exp(x), ws=w)))
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "DynamicPool" in names and "GpuElemwise" in names and "HostFromGpu" in names


@pytest.mark.gpu
def test_between_gpu_kernels_on_a_gpu(cuda):
    from symgpu.tensor.signal.pool_numpy import pool_reference
    x = T.ftensor4("x")
    w = T.ivector("w")
    f = function([x, w], T.exp(pool_2d(T.exp(x), ws=w, ignore_border=False)))
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "DynamicPool" in names and "GpuElemwise" in names   # the GPU ran the exps
    xv = np.random.default_rng(4).standard_normal((2, 3, 5, 7)).astype("float32") * 0.5
    want = np.exp(pool_reference(np.exp(xv), (2, 3), False, (2, 3), (0, 0), "max"))
    np.testing.assert_allclose(f(xv, _iv([2, 3])), want, rtol=1e-5)
