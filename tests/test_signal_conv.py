"""theano.tensor.signal.conv.conv2d: every rank combination of image and filter, both border
modes and subsampling, against scipy.signal.convolve2d."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

import symgpu
import symgpu.tensor as T
from symgpu.tensor.signal import conv

RNG = np.random.default_rng(7)


def _reference(img, fil, mode, sub):
    imgs = img if img.ndim == 3 else img[None]
    fils = fil if fil.ndim == 3 else fil[None]
    out = np.array([[scipy.signal.convolve2d(i, f, mode=mode)[::sub[0], ::sub[1]]
                     for f in fils] for i in imgs])
    if img.ndim == 2:
        out = out[0]
    elif fil.ndim == 2:
        out = out[:, 0]
    if img.ndim == 2 and fil.ndim == 2:
        out = out[0]
    return out


@pytest.mark.parametrize("ind", [2, 3])
@pytest.mark.parametrize("find", [2, 3])
@pytest.mark.parametrize("mode", ["valid", "full"])
@pytest.mark.parametrize("sub", [(1, 1), (2, 3)])
def test_conv2d_matches_scipy(ind, find, mode, sub):
    img = RNG.standard_normal((4, 9, 11)[3 - ind:])
    fil = RNG.standard_normal((3, 3, 4)[3 - find:])
    x = T.TensorType("float64", (False,) * ind)("x")
    w = T.TensorType("float64", (False,) * find)("w")
    y = conv.conv2d(x, w, border_mode=mode, subsample=sub)
    want = _reference(img, fil, mode, sub)
    assert y.ndim == want.ndim
    got = symgpu.function([x, w], y)(img, fil)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_shape_hints_are_used_and_checked():
    x, w = T.tensor3("x"), T.tensor3("w")
    y = conv.conv2d(x, w, image_shape=(2, 6, 7), filter_shape=(3, 2, 2))
    f = symgpu.function([x, w], y)
    img, fil = RNG.standard_normal((2, 6, 7)), RNG.standard_normal((3, 2, 2))
    np.testing.assert_allclose(f(img, fil), _reference(img, fil, "valid", (1, 1)))
    with pytest.raises(Exception, match="input_shape"):
        f(RNG.standard_normal((2, 5, 7)), fil)


def test_infer_shape_needs_no_run():
    x, w = T.matrix("x"), T.tensor3("w")
    y = conv.conv2d(x, w, border_mode="full")
    f = symgpu.function([x, w], y.shape)
    assert tuple(f(np.zeros((5, 6)), np.zeros((2, 3, 2)))) == (2, 7, 7)


def test_tuning_keywords_pass_and_others_are_refused():
    x, w = T.matrix("x"), T.matrix("w")
    conv.conv2d(x, w, unroll_batch=2, verbose=0)
    with pytest.raises(TypeError, match="imshp_logical"):
        conv.conv2d(x, w, imshp_logical=(1, 5, 5))
    with pytest.raises(ValueError, match="border_mode"):
        conv.conv2d(x, w, border_mode="half")
    with pytest.raises(ValueError, match="2-d or 3-d"):
        conv.conv2d(T.tensor4("x4"), w)


def test_the_theano_path_imports(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "theano", symgpu)
    from theano.tensor.signal import conv as tconv  # noqa: PLC0415
    assert tconv.conv2d is conv.conv2d
