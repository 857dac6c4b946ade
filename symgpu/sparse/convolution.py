"""Convolution and max pooling by sparse products (Theano's `theano.sparse.sandbox.sp`):
a constant csc matrix whose product with flattened images stacks every receptive field's
pixels (`ConvolutionIndices`), then a dense product with the kernels (`convolve`) or a max
over each pooling window (`max_pool`). Images are rows of a matrix, raster order, feature
maps one after the other; kernels apply as a correlation (tap (a, b) meets pixel
(y + a, x + b)); 'full' mode pads the image with kernel-size-minus-one zeros."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
import symgpu.tensor as _T
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable
from symgpu.sparse.construct import CSM
from symgpu.sparse.products import structured_dot

__all__ = ["ConvolutionIndices", "convolution_indices", "convolve", "max_pool"]

_MODES = ("valid", "full")


def _geometry(inshp: Any, kshp: Any, strides: Any, mode: str) -> tuple:
    """(nfeatures, image (h, w), kernel (h, w), (dy, dx), output (h, w)) of a convolution,
    checked."""
    inshp = tuple(int(v) for v in np.ravel(inshp))
    if len(inshp) == 2:
        inshp = (1,) + inshp
    kshp = tuple(int(v) for v in np.ravel(kshp))
    dx, dy = (int(v) for v in strides)
    if len(inshp) != 3 or len(kshp) != 2:
        raise ValueError(f"ConvolutionIndices: inshp must be (height, width) or (features, "
                         f"height, width) and kshp (height, width), got {inshp} and {kshp}")
    if mode not in _MODES:
        raise ValueError(f"ConvolutionIndices: mode must be one of {_MODES}, got {mode!r}")
    if dx <= 0 or dy <= 0 or min(inshp) <= 0 or min(kshp) <= 0:
        raise ValueError(f"ConvolutionIndices: shapes and strides must be positive: inshp "
                         f"{inshp}, kshp {kshp}, strides {(dx, dy)}")
    s = -1 if mode == "valid" else 1
    img, ker = np.array(inshp[1:]), np.array(kshp)
    outshp = np.int64(np.ceil((img + s * ker - s) / np.array([dy, dx], dtype="float64")))
    if (outshp <= 0).any():
        raise ValueError(f"ConvolutionIndices: invalid kernel {kshp} and/or step size "
                         f"{(dx, dy)} for input shape {inshp}")
    return inshp[0], inshp[1:], kshp, (dy, dx), outshp


class ConvolutionIndices(Op):
    """(inshp, kshp) -> the (indices, indptr, shape) of the csc matrix M whose product with
    an image (a raster-order row) stacks its patches: `images . M^T` holds, for each output
    pixel in raster order, each input feature's kernel-size receptive field (zero outside the
    image). The geometry's `strides` (dx, dy) and `mode` are the op's parameters (Theano's
    perform used the defaults: (1, 1), 'valid'); `evaluate` / `conv_eval` compute it on the
    host, as Theano's `convolve` does once when it builds its graph."""

    __props__ = ("strides", "mode")

    def __init__(self, strides: tuple = (1, 1), mode: str = "valid"):
        self.strides = tuple(int(v) for v in strides)
        self.mode = mode
        _geometry((1, 1), (1, 1), self.strides, mode)

    @staticmethod
    def conv_eval(inshp: Any, kshp: Any, strides: tuple = (1, 1), mode: str = "valid") -> tuple:
        """`evaluate` with weight sharing (the only kind Theano kept)."""
        return ConvolutionIndices.evaluate(inshp, kshp, strides, mode=mode, ws=True)

    @staticmethod
    def evaluate(inshp: Any, kshp: Any, strides: tuple = (1, 1), nkern: int = 1,
                 mode: str = "valid", ws: bool = True) -> tuple:
        """(indices, indptr, spmat shape, 'csc', output shape) of the patch-stacking matrix for
        images of `inshp` ((h, w) or (features, h, w)) and kernels of `kshp`; rows are
        ordered (output pixel, feature, tap), columns are input pixels (feature maps one after
        the other). `ws` must be True (weight sharing; `nkern` only counts without it)."""
        if not ws:
            raise ValueError("ConvolutionIndices.evaluate: ws is obsolete and must be True")
        nf, (h, w), (kh, kw), (dy, dx), outshp = _geometry(inshp, kshp, strides, mode)
        ksize = kh * kw
        top = np.array([kh - 1, kw - 1])
        if mode == "valid":
            lo, hi = top, top + np.array([h - kh + 1, w - kw + 1])
        else:
            lo, hi = np.zeros(2, dtype=np.int64), np.array([h + kh - 1, w + kw - 1])
        oy, ox = np.arange(lo[0], hi[0], dy), np.arange(lo[1], hi[1], dx)
        f, py, px, a, b = np.meshgrid(np.arange(nf), oy, ox, np.arange(kh), np.arange(kw),
                                      indexing="ij")
        ky, kx = py + a, px + b                   # in the zero-padded image's coordinates
        inside = (ky >= top[0]) & (ky < top[0] + h) & (kx >= top[1]) & (kx < top[1] + w)
        col = (ky - top[0]) * w + (kx - top[1]) + f * h * w
        y, x = (py, px) if mode == "full" else (py - top[0], px - top[1])
        row = ((y // dy) * outshp[1] + x // dx) * nf * ksize + a * kw + b + f * ksize
        shape = (int(np.prod(outshp)) * ksize * nf, nf * h * w)
        m = ssp.csc_matrix((np.ones(int(inside.sum())), (row[inside], col[inside])),
                           shape=shape).sorted_indices()
        return m.indices, m.indptr, shape, "csc", outshp

    def make_node(self, inshp: Any, kshp: Any) -> Apply:
        inshp, kshp = as_tensor_variable(inshp), as_tensor_variable(kshp)
        for v, name in ((inshp, "inshp"), (kshp, "kshp")):
            if v.ndim != 1 or not v.dtype.startswith(("int", "uint")):
                raise TypeError(f"ConvolutionIndices: {name} must be an integer vector, got "
                                f"{v} ({v.type})")
        return Apply(self, [inshp, kshp], [TensorType("int32", (False,))(),
                                           TensorType("int32", (False,))(),
                                           TensorType("int64", (False,))()])

    def perform(self, node, inputs, out):
        indices, indptr, shape, _, _ = self.evaluate(inputs[0], inputs[1], self.strides,
                                                     mode=self.mode)
        out[0][0] = np.asarray(indices, dtype="int32")
        out[1][0] = np.asarray(indptr, dtype="int32")
        out[2][0] = np.asarray(shape, dtype="int64")

    def infer_shape(self, fgraph, node, input_shapes):
        """The stored count from the geometry alone: per axis, the taps inside the image
        summed over the output positions (rows and columns are independent)."""
        inshp, kshp = node.inputs
        n = inshp.shape[0]
        nf = _T.switch(_T.eq(n, 3), inshp[0], 1)
        img = [inshp[n - 2], inshp[n - 1]]
        taps = []
        for axis, step in ((0, self.strides[1]), (1, self.strides[0])):
            k, size = kshp[axis], img[axis]
            if self.mode == "valid":
                o = _T.arange(k - 1, k - 1 + size - k + 1, step)
            else:
                o = _T.arange(0, size + k - 1, step)
            lo, hi = _T.maximum(o, k - 1), _T.minimum(o + k, k - 1 + size)
            taps.append(_T.maximum(hi - lo, 0).sum())
        nnz = _T.cast(nf * taps[0] * taps[1], "int64")
        cols = _T.cast(nf * img[0] * img[1] + 1, "int64")
        return [(nnz,), (cols,), (2,)]

    def grad(self, inputs, output_grads):
        return [None, None]   # integer geometry: no gradient flows


convolution_indices = ConvolutionIndices()


def _patches(images: Any, imgshp: tuple, kshp: tuple, step: tuple, mode: str) -> tuple:
    """(patches of `images` as (batch, outsize * features * ksize), output shape)."""
    indices, indptr, shape, sptype, outshp = ConvolutionIndices.conv_eval(imgshp, kshp, step,
                                                                          mode)
    csc = CSM(sptype)(np.ones(indices.size), indices.astype("int32"),
                      indptr.astype("int32"), np.asarray(shape, dtype="int64"))
    return structured_dot(csc, images.T).T, outshp


def _image_shape(imgshp: Any) -> tuple:
    imgshp = tuple(int(v) for v in np.ravel(imgshp))
    return (1,) + imgshp if len(imgshp) == 2 else imgshp


def convolve(kerns: Any, kshp: tuple, nkern: int, images: Any, imgshp: tuple,
             step: tuple = (1, 1), bias: Any = None, mode: str = "valid",
             flatten: bool = True) -> tuple[TensorVariable, np.ndarray]:
    """Convolution by a sparse product (Theano's sparse `convolve`): `images` (batch,
    features * h * w, raster order), `kerns` (nkern, features * kh * kw); returns (output,
    (nkern, out_h, out_w)), the output (batch, nkern * out_h * out_w) (each kernel's map
    contiguous) or, with `flatten=False`, (batch, nkern, out_h * out_w). `step` is (dx, dy);
    `bias` (nkern,) is added to every map."""
    kerns, images = as_tensor_variable(kerns), as_tensor_variable(images)
    imgshp = _image_shape(imgshp)
    kern_size = int(np.prod(kshp))
    patches, outshp = _patches(images, imgshp, tuple(kshp), step, mode)
    outsize = int(np.prod(outshp))
    patch_stack = _T.reshape(patches, _T.stack([images.shape[0] * outsize,
                                                imgshp[0] * kern_size]), ndim=2)
    output = _T.dot(patch_stack, kerns.T)
    if bias is not None:
        output = output + bias
    tensout = _T.reshape(output, _T.stack([images.shape[0], outsize, nkern]), ndim=3)
    output = tensout.dimshuffle(0, 2, 1)
    if flatten:
        output = _T.flatten(output, 2)
    return output, np.hstack((nkern, outshp))


def max_pool(images: Any, imgshp: tuple, maxpoolshp: tuple) -> tuple[TensorVariable, np.ndarray]:
    """Max pooling over non-overlapping `maxpoolshp` windows by a sparse product (Theano's
    sparse `max_pool`): `images` (batch, features * h * w); returns (output (batch, features *
    out_h * out_w), (out_h, out_w)); windows past the border are dropped."""
    images = as_tensor_variable(images)
    imgshp = _image_shape(imgshp)
    poolsize = int(np.prod(maxpoolshp))
    step = (int(maxpoolshp[1]), int(maxpoolshp[0]))   # (dx, dy): one window after the other
    patches, outshp = _patches(images, imgshp, tuple(maxpoolshp), step, "valid")
    outsize = int(np.prod(outshp))
    patch_stack = _T.reshape(patches, _T.stack([images.shape[0] * outsize, imgshp[0],
                                                poolsize]), ndim=3)
    out1 = _T.max(patch_stack, axis=2)
    out2 = _T.reshape(out1, _T.stack([images.shape[0], outsize, imgshp[0]]), ndim=3)
    return _T.flatten(out2.dimshuffle(0, 2, 1), 2), outshp
