"""symgpu.tensor.nnet.conv3d and its gradients (Theano's AbstractConv3d and its two gradient
Ops) against a direct NumPy loop written here, for every combination of border_mode /
subsample / filter_dilation / filter_flip / num_groups; verify_grad on small shapes, second
derivatives, the public gradient functions, infer_shape and the error messages."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet import conv3d, conv3d_grad_wrt_inputs, conv3d_grad_wrt_weights
from symgpu.tensor.nnet.abstract_conv import (Conv2d, Conv3d, Conv3dGradInputs,
                                              Conv3dGradWeights, get_conv_output_shape)

RNG = np.random.default_rng(11)
BORDER_MODES = ["valid", "full", "half", 1, (1, 0, 2), ((1, 0), (0, 2), 1)]
SUBSAMPLES = [(1, 1, 1), (2, 1, 3)]
DILATIONS = [(1, 1, 1), (1, 2, 1)]
COMBOS = list(itertools.product(BORDER_MODES, SUBSAMPLES, DILATIONS, [True, False], [1, 2]))


def _pads(bm, dk):
    if bm == "valid":
        return [(0, 0)] * 3
    if bm == "full":
        return [(e - 1, e - 1) for e in dk]
    if bm == "half":
        return [(e // 2, e // 2) for e in dk]
    if isinstance(bm, int):
        return [(bm, bm)] * 3
    return [tuple(p) if isinstance(p, tuple) else (p, p) for p in bm]


def ref_conv3d(x, w, border_mode="valid", subsample=(1, 1, 1), filter_dilation=(1, 1, 1),
               filter_flip=True, num_groups=1):
    """y[n, o, i, j, l] = sum over the group's channels c and taps (a, b, e) of
    xpad[n, c, i*s0 + a*d0, j*s1 + b*d1, l*s2 + e*d2] * w'[o, c, a, b, e]."""
    s, d = subsample, filter_dilation
    k = w.shape[2:]
    dk = [(k[a] - 1) * d[a] + 1 for a in range(3)]
    xp = np.pad(x, [(0, 0), (0, 0)] + _pads(border_mode, dk))
    wk = w[:, :, ::-1, ::-1, ::-1] if filter_flip else w
    o, cg = w.shape[:2]
    og = o // num_groups
    out = [(xp.shape[2 + a] - dk[a]) // s[a] + 1 for a in range(3)]
    y = np.zeros((x.shape[0], o, *out))
    for g in range(num_groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = wk[g * og:(g + 1) * og]
        for i in range(out[0]):
            for j in range(out[1]):
                for m in range(out[2]):
                    patch = xs[:, :, i * s[0]:i * s[0] + dk[0]:d[0],
                               j * s[1]:j * s[1] + dk[1]:d[1], m * s[2]:m * s[2] + dk[2]:d[2]]
                    y[:, g * og:(g + 1) * og, i, j, m] = np.einsum("ncabe,ocabe->no", patch, ws)
    return y


def test_reference_loop_on_a_hand_computed_case():
    """The reference itself: a 1-channel 2x2x2 'valid' correlation and convolution."""
    x = np.arange(8.0).reshape(1, 1, 2, 2, 2)
    w = np.arange(1.0, 9.0).reshape(1, 1, 2, 2, 2)
    assert ref_conv3d(x, w, filter_flip=False).item() == (np.arange(8.0) * np.arange(1, 9)).sum()
    assert ref_conv3d(x, w).item() == (np.arange(8.0) * np.arange(8, 0, -1)).sum()


@pytest.fixture(scope="module")
def conv_fns():
    """One compiled forward + both gradients per parameter combination."""
    x, w, gy = T.dtensor5("x"), T.dtensor5("w"), T.dtensor5("gy")
    cache = {}

    def get(bm, s, d, flip, g):
        key = (bm, s, d, flip, g)
        if key not in cache:
            y = conv3d(x, w, border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip,
                       num_groups=g)
            gx, gw = symgpu.grad((y * gy).sum(), [x, w])
            cache[key] = function([x, w, gy], [y, gx, gw])
        return cache[key]
    return get


@pytest.mark.parametrize("bm,s,d,flip,g", COMBOS)
def test_conv3d_matches_loop_reference(conv_fns, bm, s, d, flip, g):
    x = RNG.normal(size=(2, 4, 5, 7, 6))
    w = RNG.normal(size=(4, 4 // g, 2, 3, 2))
    ref = ref_conv3d(x, w, bm, s, d, flip, g)
    gy = RNG.normal(size=ref.shape)
    y, gx, gw = conv_fns(bm, s, d, flip, g)(x, w, gy)
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)
    assert y.shape == get_conv_output_shape(x.shape, w.shape, bm, s, d)
    # the gradients are the adjoints: <conv(x, w), gy> = <x, gx> = <w, gw>
    ip = (ref * gy).sum()
    assert gx.shape == x.shape and gw.shape == w.shape
    np.testing.assert_allclose((x * gx).sum(), ip, rtol=1e-9)
    np.testing.assert_allclose((w * gw).sum(), ip, rtol=1e-9)


@pytest.mark.parametrize("bm,s,d,flip,g", [("valid", (1, 1, 1), (1, 1, 1), True, 1),
                                           ("full", (2, 1, 1), (1, 1, 2), False, 2),
                                           ((1, (0, 1), 0), (1, 2, 2), (2, 1, 1), True, 1)])
def test_gradients_elementwise_against_loop(bm, s, d, flip, g):
    """Each entry of gx and gw against the reference conv of the matching basis tensor (the
    convolution is linear in x and in w)."""
    x = RNG.normal(size=(1, 2, 4, 3, 4))
    w = RNG.normal(size=(2, 2 // g, 2, 2, 2))
    kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip, num_groups=g)
    gy = RNG.normal(size=ref_conv3d(x, w, **kw).shape)
    rx, rw = np.zeros_like(x), np.zeros_like(w)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = 1
        rx[idx] = (ref_conv3d(e, w, **kw) * gy).sum()
    for idx in np.ndindex(w.shape):
        e = np.zeros_like(w)
        e[idx] = 1
        rw[idx] = (ref_conv3d(x, e, **kw) * gy).sum()
    xs, ws, gys = T.dtensor5(), T.dtensor5(), T.dtensor5()
    gx, gw = symgpu.grad((conv3d(xs, ws, **kw) * gys).sum(), [xs, ws])
    ax, aw = function([xs, ws, gys], [gx, gw])(x, w, gy)
    np.testing.assert_allclose(ax, rx, atol=1e-10)
    np.testing.assert_allclose(aw, rw, atol=1e-10)


@pytest.mark.parametrize("kw", [dict(), dict(border_mode="half", subsample=(2, 1, 2)),
                                dict(border_mode="full", filter_dilation=(2, 1, 2),
                                     filter_flip=False),
                                dict(border_mode=(1, 0, 2), num_groups=2, subsample=(1, 2, 1))])
def test_verify_grad(kw):
    x = RNG.normal(size=(1, 2, 4, 5, 3))
    w = RNG.normal(size=(2, 2 // kw.get("num_groups", 1), 2, 3, 2))
    verify_grad(lambda a, b: conv3d(a, b, **kw), [x, w], rng=np.random.default_rng(0))


def test_second_order_gradients():
    """grad of the gradients stays within the three conv3d Ops and is right."""
    x = RNG.normal(size=(1, 2, 4, 4, 3))
    w = RNG.normal(size=(2, 2, 2, 2, 2))

    def gx_of(a, b):
        return symgpu.grad((conv3d(a, b, subsample=(2, 1, 1), border_mode="half") ** 2).sum(), a)

    def gw_of(a, b):
        return symgpu.grad((conv3d(a, b, filter_dilation=(1, 2, 1)) ** 2).sum(), b)
    verify_grad(gx_of, [x, w], rng=np.random.default_rng(0))
    verify_grad(gw_of, [x, w], rng=np.random.default_rng(0))
    y = conv3d(T.dtensor5(), T.dtensor5())
    gx = symgpu.grad((y ** 2).sum(), y.owner.inputs[0])
    ops = {type(n.op) for n in symgpu.graph.basic.io_toposort([], [gx])
           if isinstance(n.op, (Conv2d, Conv3d, Conv3dGradInputs, Conv3dGradWeights))}
    assert Conv3dGradInputs in ops and Conv2d not in ops


def test_public_gradient_functions():
    x = RNG.normal(size=(2, 3, 5, 6, 5))
    w = RNG.normal(size=(4, 3, 3, 2, 3))
    kw = dict(border_mode=1, subsample=(2, 2, 1))
    ref = ref_conv3d(x, w, **kw)
    gy = RNG.normal(size=ref.shape)
    gys, ws, xs = T.dtensor5(), T.dtensor5(), T.dtensor5()
    gx = conv3d_grad_wrt_inputs(gys, ws, (None, None, 5, 6, 5), **kw)
    gw = conv3d_grad_wrt_weights(xs, gys, (4, 3, 3, 2, 3), **kw)
    assert isinstance(gx.owner.op, Conv3dGradInputs)
    assert isinstance(gw.owner.op, Conv3dGradWeights)
    ax, aw = function([xs, ws, gys], [gx, gw])(x, w, gy)
    ip = (ref * gy).sum()
    assert ax.shape == x.shape and aw.shape == w.shape
    np.testing.assert_allclose((x * ax).sum(), ip, rtol=1e-10)
    np.testing.assert_allclose((w * aw).sum(), ip, rtol=1e-10)


def test_grad_wrt_inputs_with_symbolic_shape():
    """With subsampling the input size is ambiguous: a symbolic shape picks it."""
    w = RNG.normal(size=(2, 1, 3, 3, 3))
    gy = RNG.normal(size=(1, 2, 3, 3, 2))
    h = T.lscalar("h")
    gys, ws = T.dtensor5(), T.dtensor5()
    out = conv3d_grad_wrt_inputs(gys, ws, (1, 1, h, h, 4), subsample=(2, 2, 1))
    f = function([gys, ws, h], out)
    assert f(gy, w, 7).shape == (1, 1, 7, 7, 4)
    assert f(gy, w, 8).shape == (1, 1, 8, 8, 4)


def test_infer_shape():
    x, w = T.dtensor5("x"), T.dtensor5("w")
    for kw in [dict(), dict(border_mode="full", subsample=(2, 3, 1)),
               dict(border_mode="half", filter_dilation=(2, 1, 2), num_groups=2)]:
        y = conv3d(x, w, **kw)
        node = y.owner
        shapes = [tuple(T.shape_i(v, i) for i in range(5)) for v in node.inputs]
        (out_shape,) = node.op.infer_shape(None, node, shapes)
        assert all(s.dtype == "int64" and s.ndim == 0 for s in out_shape)
        xv = RNG.normal(size=(2, 4, 7, 6, 8))
        wv = RNG.normal(size=(6, 2 if kw.get("num_groups") else 4, 3, 2, 2))
        got = function([x, w], list(out_shape), on_unused_input="ignore")(xv, wv)
        assert tuple(int(v) for v in got) == function([x, w], y)(xv, wv).shape
        gx, gw = symgpu.grad(y.sum(), [x, w])
        for v, ref in ((gx, xv), (gw, wv)):
            node = v.owner if isinstance(v.owner.op, Conv3dGradInputs | Conv3dGradWeights) \
                else v.owner.inputs[0].owner
            shapes = [tuple(T.shape_i(i, k) for k in range(i.ndim)) for i in node.inputs]
            (s,) = node.op.infer_shape(None, node, shapes)
            got = function([x, w], list(s), on_unused_input="ignore")(xv, wv)
            assert tuple(int(k) for k in got) == ref.shape


def test_float32_and_lazy_name():
    x, w = T.ftensor5(), T.ftensor5()
    y = T.nnet.conv3d(x, w, border_mode="half")
    assert y.dtype == "float32"
    xv = RNG.normal(size=(2, 3, 4, 5, 4)).astype("float32")
    wv = RNG.normal(size=(2, 3, 3, 3, 3)).astype("float32")
    out = function([x, w], y)(xv, wv)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref_conv3d(xv.astype("float64"), wv.astype("float64"),
                                               border_mode="half"), rtol=1e-4, atol=1e-4)
    assert conv3d(T.dtensor5(), w).dtype == "float64"


def test_errors_name_the_problem():
    x, w = T.dtensor5("x"), T.dtensor5("w")
    with pytest.raises(TypeError, match="5-d float tensor"):
        conv3d(T.dtensor4(), w)
    with pytest.raises(TypeError, match="5-d float tensor"):
        conv3d(x, T.itensor5())
    with pytest.raises(ValueError, match="border_mode"):
        conv3d(x, w, border_mode=(1, 1))
    with pytest.raises(ValueError, match="subsample"):
        conv3d(x, w, subsample=(1, 1))
    with pytest.raises(ValueError, match="filter_dilation"):
        conv3d(x, w, filter_dilation=(1, 0, 1))
    with pytest.raises(ValueError, match="input_shape"):
        conv3d(x, w, input_shape=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="spatial entries"):
        conv3d_grad_wrt_inputs(x, w, (1, 1, None, 4, 4))
    f = function([x, w], conv3d(x, w, num_groups=2))
    with pytest.raises(Exception, match="channels"):
        f(np.zeros((1, 4, 5, 5, 5)), np.zeros((4, 3, 3, 3, 3)))
    g = function([x, w], conv3d(x, w))
    with pytest.raises(Exception, match="do not fit"):
        g(np.zeros((1, 1, 4, 4, 2)), np.zeros((1, 1, 3, 3, 3)))
    h = function([x, w], conv3d(x, w, filter_shape=(1, 1, 3, 3, 2)))
    with pytest.raises(Exception, match="filter_shape was declared"):
        h(np.zeros((1, 1, 6, 6, 6)), np.zeros((1, 1, 3, 3, 3)))


def test_2d_ops_stay_2d():
    """conv2d's Ops are not conv3d's (the GPU backend lifts the 2-d ones by type)."""
    y2 = T.nnet.conv2d(T.dtensor4(), T.dtensor4())
    y3 = conv3d(T.dtensor5(), T.dtensor5())
    assert type(y2.owner.op) is Conv2d and not isinstance(y3.owner.op, Conv2d)
    assert get_conv_output_shape((1, 1, 5, 6), (1, 1, 3, 3), "valid", (1, 1)) == (1, 1, 3, 4)
    assert get_conv_output_shape((2, 3, 5, 6, 7), (4, 3, 3, 3, 1), "full", (2, 1, 1),
                                 (1, 2, 1)) == (2, 4, 4, 10, 7)


# ----------------------------------------------------------------------------- conv3d2d
def _pyconv3d(signals, filters, modes):
    """Theano's reference for conv3d2d: scipy.ndimage.convolve of every (signal, filter,
    channel) movie, cropped per axis to the border mode, summed over the channels."""
    from scipy import ndimage
    ns, ts, c, hs, ws = signals.shape
    nf, tf, _, hf, wf = filters.shape
    sizes = [(ts, tf), (hs, hf), (ws, wf)]
    out_len = {"valid": lambda n, k: n - k + 1, "full": lambda n, k: n + k - 1,
               "half": lambda n, k: n + 2 * (k // 2) - k + 1}
    pads = {"valid": lambda k: 0, "full": lambda k: k - 1, "half": lambda k: k // 2}
    outs = [out_len[m](n, k) for m, (n, k) in zip(modes, sizes)]
    rval = np.zeros((ns, outs[0], nf, outs[1], outs[2]))
    for a in range(ns):
        for b in range(nf):
            for ch in range(c):
                s = np.pad(signals[a, :, ch], [(pads[m](k), pads[m](k))
                                               for m, (_, k) in zip(modes, sizes)])
                full = ndimage.convolve(s, filters[b, :, ch], mode="constant", cval=0)
                # ndimage centres the filter (origin k // 2): the result of the padded
                # signal starts k // 2 - (1 if k is even) in
                sl = tuple(slice(k // 2 - ((k + 1) % 2), k // 2 - ((k + 1) % 2) + o)
                           for (_, k), o in zip(sizes, outs))
                rval[a, :, b] += full[sl]
    return rval


@pytest.mark.parametrize("border_mode,fshape", [
    ("valid", (2, 3, 2, 3, 2)), ("full", (2, 2, 2, 3, 3)), ("half", (1, 3, 2, 3, 3)),
    (("full", "valid", "valid"), (2, 3, 2, 2, 3)), (("valid", "half", "half"), (3, 2, 2, 3, 3))])
def test_conv3d2d_is_theanos_movie_convolution(border_mode, fshape):
    from symgpu.tensor.nnet import conv3d2d
    rng = np.random.default_rng(5)
    sv = rng.normal(size=(2, 5, 2, 6, 7))
    fv = rng.normal(size=fshape)
    s, f = T.TensorType("float64", (False,) * 5)(), T.TensorType("float64", (False,) * 5)()
    out = conv3d2d.conv3d(s, f, filters_shape=fshape, border_mode=border_mode)
    modes = (border_mode,) * 3 if isinstance(border_mode, str) else border_mode
    np.testing.assert_allclose(symgpu.function([s, f], out)(sv, fv),
                               _pyconv3d(sv, fv, modes), rtol=1e-10, atol=1e-10)


def test_conv3d2d_rejects_what_theano_rejects():
    from symgpu.tensor.nnet import conv3d2d
    s, f = T.TensorType("float64", (False,) * 5)(), T.TensorType("float64", (False,) * 5)()
    with pytest.raises(ValueError, match="height and width"):
        conv3d2d.conv3d(s, f, border_mode=("valid", "full", "valid"))
    with pytest.raises(ValueError, match="filters_shape"):
        conv3d2d.conv3d(s, f, border_mode=("full", "valid", "valid"))
    with pytest.raises(TypeError, match="5-d"):
        conv3d2d.conv3d(T.tensor4(), f)
