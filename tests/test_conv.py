"""symgpu.tensor.nnet.conv2d and its gradients against a direct NumPy loop (every combination of
border_mode / subsample / filter_dilation / filter_flip / num_groups), verify_grad on small
shapes, infer_shape, and the error messages."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient_check import verify_grad
from symgpu.tensor.nnet import (conv2d, conv2d_grad_wrt_inputs, conv2d_grad_wrt_weights,
                                conv2d_transpose)
from symgpu.tensor.nnet.abstract_conv import _ConvBase, get_conv_output_shape
from symgpu.tensor.nnet.conv_numpy import conv_reference

RNG = np.random.default_rng(7)
BORDER_MODES = ["valid", "full", "half", 1, (2, 0), ((1, 0), (0, 2))]
SUBSAMPLES = [(1, 1), (2, 3)]
DILATIONS = [(1, 1), (2, 1)]
COMBOS = list(itertools.product(BORDER_MODES, SUBSAMPLES, DILATIONS, [True, False], [1, 2]))


def _grad_reference(x, w, gy, **kw):
    """Brute-force gradients of sum(conv_reference(x, w) * gy) (conv is linear in x and in w:
    the derivative along a basis direction is the reference conv of that direction)."""
    gx = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = 1
        gx[idx] = (conv_reference(e, w, **kw) * gy).sum()
    gw = np.zeros_like(w)
    for idx in np.ndindex(w.shape):
        e = np.zeros_like(w)
        e[idx] = 1
        gw[idx] = (conv_reference(x, e, **kw) * gy).sum()
    return gx, gw


@pytest.fixture(scope="module")
def conv_fns():
    """One compiled forward + both gradients per parameter combination."""
    x, w, gy = T.tensor4("x", dtype="float64"), T.tensor4("w", dtype="float64"), T.tensor4("gy", dtype="float64")
    cache = {}

    def get(bm, s, d, flip, g):
        key = (bm, s, d, flip, g)
        if key not in cache:
            kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip,
                      num_groups=g)
            y = conv2d(x, w, **kw)
            gx, gw = symgpu.grad((y * gy).sum(), [x, w])
            cache[key] = function([x, w, gy], [y, gx, gw])
        return cache[key]
    return get


@pytest.mark.parametrize("bm,s,d,flip,g", COMBOS)
def test_conv2d_matches_loop_reference(conv_fns, bm, s, d, flip, g):
    x = RNG.normal(size=(2, 4, 9, 8))
    w = RNG.normal(size=(6, 4 // g, 3, 2))
    kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip, num_groups=g)
    ref = conv_reference(x, w, **kw)
    gy = RNG.normal(size=ref.shape)
    y, gx, gw = conv_fns(bm, s, d, flip, g)(x, w, gy)
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)
    assert y.shape == get_conv_output_shape(x.shape, w.shape, bm, s, d)
    # the gradients are the adjoints: <conv(x, w), gy> = <x, gx> = <w, gw>
    ip = (ref * gy).sum()
    np.testing.assert_allclose((x * gx).sum(), ip, rtol=1e-9)
    np.testing.assert_allclose((w * gw).sum(), ip, rtol=1e-9)


@pytest.mark.parametrize("bm,s,d,flip,g", [("valid", (1, 1), (1, 1), True, 1),
                                           ("full", (2, 1), (1, 2), False, 2),
                                           (((1, 0), (0, 2)), (2, 2), (2, 1), True, 1)])
def test_gradients_elementwise_against_loop(bm, s, d, flip, g):
    x = RNG.normal(size=(1, 2, 6, 5))
    w = RNG.normal(size=(2, 2 // g, 2, 3))
    kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip, num_groups=g)
    gy = RNG.normal(size=conv_reference(x, w, **kw).shape)
    rx, rw = _grad_reference(x, w, gy, **kw)
    xs, ws, gys = T.dtensor4(), T.dtensor4(), T.dtensor4()
    gx, gw = symgpu.grad((conv2d(xs, ws, **kw) * gys).sum(), [xs, ws])
    ax, aw = function([xs, ws, gys], [gx, gw])(x, w, gy)
    np.testing.assert_allclose(ax, rx, atol=1e-10)
    np.testing.assert_allclose(aw, rw, atol=1e-10)


@pytest.mark.parametrize("kw", [dict(), dict(border_mode="half", subsample=(2, 1)),
                                dict(border_mode="full", filter_dilation=(2, 2), filter_flip=False),
                                dict(border_mode=(1, 2), num_groups=2, subsample=(1, 2))])
def test_verify_grad(kw):
    x = RNG.normal(size=(2, 2, 5, 6))
    w = RNG.normal(size=(2, 2 // kw.get("num_groups", 1), 3, 2))
    verify_grad(lambda a, b: conv2d(a, b, **kw), [x, w], rng=3)


def test_second_order_gradients():
    """grad of the gradients stays within the three conv Ops and is right."""
    x = RNG.normal(size=(1, 2, 5, 5))
    w = RNG.normal(size=(2, 2, 3, 3))

    def gx_of(a, b):
        return symgpu.grad((conv2d(a, b, subsample=(2, 1), border_mode="half") ** 2).sum(), a)

    def gw_of(a, b):
        return symgpu.grad((conv2d(a, b, filter_dilation=(1, 2)) ** 2).sum(), b)
    verify_grad(gx_of, [x, w], rng=1)
    verify_grad(gw_of, [x, w], rng=2)


def test_public_gradient_functions_and_transpose():
    x = RNG.normal(size=(2, 3, 7, 7))
    w = RNG.normal(size=(4, 3, 3, 3))
    kw = dict(border_mode=1, subsample=(2, 2))
    ref = conv_reference(x, w, **kw)
    gy = RNG.normal(size=ref.shape)
    gys, ws, xs = T.dtensor4(), T.dtensor4(), T.dtensor4()
    gx = conv2d_grad_wrt_inputs(gys, ws, (None, None, 7, 7), **kw)
    gw = conv2d_grad_wrt_weights(xs, gys, (4, 3, 3, 3), **kw)
    tr = conv2d_transpose(gys, ws, (None, 3, 7, 7), border_mode=1, input_dilation=(2, 2))
    ax, aw, at = function([xs, ws, gys], [gx, gw, tr], on_unused_input="ignore")(x, w, gy)
    ip = (ref * gy).sum()
    np.testing.assert_allclose((x * ax).sum(), ip, rtol=1e-10)
    np.testing.assert_allclose((w * aw).sum(), ip, rtol=1e-10)
    np.testing.assert_allclose(at, ax)
    assert ax.shape == x.shape and aw.shape == w.shape


def test_grad_wrt_inputs_with_symbolic_shape():
    """With subsampling the input size is ambiguous: a symbolic shape picks it."""
    w = RNG.normal(size=(2, 1, 3, 3))
    gy = RNG.normal(size=(1, 2, 3, 3))
    h = T.lscalar("h")
    gys, ws = T.dtensor4(), T.dtensor4()
    out = conv2d_grad_wrt_inputs(gys, ws, (1, 1, h, h), subsample=(2, 2))
    f = function([gys, ws, h], out)
    assert f(gy, w, 7).shape == (1, 1, 7, 7)
    assert f(gy, w, 8).shape == (1, 1, 8, 8)


def test_infer_shape():
    x, w = T.dtensor4("x"), T.dtensor4("w")
    for kw in [dict(), dict(border_mode="full", subsample=(2, 3)),
               dict(border_mode="half", filter_dilation=(2, 2), num_groups=2)]:
        y = conv2d(x, w, **kw)
        node = y.owner
        shapes = [tuple(T.shape_i(v, i) for i in range(4)) for v in node.inputs]
        (out_shape,) = node.op.infer_shape(None, node, shapes)
        assert all(s.dtype == "int64" and s.ndim == 0 for s in out_shape)
        xv, wv = RNG.normal(size=(3, 4, 11, 10)), RNG.normal(size=(6, 2 if kw.get("num_groups") else 4, 3, 2))
        got = function([x, w], list(out_shape), on_unused_input="ignore")(xv, wv)
        assert tuple(int(v) for v in got) == function([x, w], y)(xv, wv).shape
        gx, gw = symgpu.grad(y.sum(), [x, w])
        for v, ref in ((gx, xv), (gw, wv)):
            node = v.owner if isinstance(v.owner.op, _ConvBase) else v.owner.inputs[0].owner
            shapes = [tuple(T.shape_i(i, k) for k in range(i.ndim)) for i in node.inputs]
            (s,) = node.op.infer_shape(None, node, shapes)
            got = function([x, w], list(s), on_unused_input="ignore")(xv, wv)
            assert tuple(int(k) for k in got) == ref.shape


def test_float32_and_dtypes():
    x, w = T.ftensor4(), T.ftensor4()
    y = conv2d(x, w, border_mode="half")
    assert y.dtype == "float32"
    xv = RNG.normal(size=(2, 3, 6, 6)).astype("float32")
    wv = RNG.normal(size=(5, 3, 3, 3)).astype("float32")
    out = function([x, w], y)(xv, wv)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, conv_reference(xv.astype("float64"), wv.astype("float64"),
                                                   border_mode="half"), rtol=1e-4, atol=1e-4)
    assert conv2d(T.dtensor4(), w).dtype == "float64"


def test_errors_name_the_problem():
    x, w = T.dtensor4("x"), T.dtensor4("w")
    with pytest.raises(TypeError, match="4-d float tensor"):
        conv2d(T.dmatrix(), w)
    with pytest.raises(TypeError, match="4-d float tensor"):
        conv2d(T.itensor4(), w)
    with pytest.raises(ValueError, match="border_mode"):
        conv2d(x, w, border_mode="same")
    with pytest.raises(ValueError, match="subsample"):
        conv2d(x, w, subsample=(0, 1))
    f = function([x, w], conv2d(x, w, num_groups=2))
    with pytest.raises(Exception, match="channels"):
        f(np.zeros((1, 4, 5, 5)), np.zeros((4, 3, 3, 3)))
    g = function([x, w], conv2d(x, w))
    with pytest.raises(Exception, match="do not fit"):
        g(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 3)))
    h = function([x, w], conv2d(x, w, input_shape=(None, 1, 5, 5)))
    with pytest.raises(Exception, match="input_shape was declared"):
        h(np.zeros((1, 1, 6, 6)), np.zeros((1, 1, 3, 3)))


def test_theano_older_spellings():
    """nnet.conv.conv2d(image_shape=...) and conv2d(image_shape=...) as in older Theano."""
    from symgpu.tensor.nnet import conv as old_conv
    x, w = T.dtensor4(), T.dtensor4()
    xv, wv = RNG.normal(size=(1, 2, 5, 5)), RNG.normal(size=(3, 2, 3, 3))
    a = old_conv.conv2d(x, w, image_shape=(1, 2, 5, 5), filter_shape=(3, 2, 3, 3),
                        border_mode="full")
    b = conv2d(x, w, image_shape=(1, 2, 5, 5), border_mode="full")
    outs = function([x, w], [a, b])(xv, wv)
    for o in outs:
        np.testing.assert_allclose(o, conv_reference(xv, wv, "full"))
    with pytest.raises(ValueError, match="not both"):
        conv2d(x, w, input_shape=(1, 2, 5, 5), image_shape=(1, 2, 5, 5))
