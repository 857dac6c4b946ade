"""Theano's `theano.tensor.signal.conv.conv2d`: 2-d convolution of one image or a batch of
single-channel images by one filter or a stack of filters.

It reshapes both operands to 4-d (images as (batch, 1, h, w), filters as (nkern, 1, kh, kw)),
runs `symgpu.tensor.nnet.conv2d` (a true convolution: filters flipped, as
scipy.signal.convolve2d) and drops the axes a 2-d operand did not have, so it places on the
GPU like any conv2d.
"""
from __future__ import annotations

from typing import Any

from symgpu.tensor.basic import reshape
from symgpu.tensor.nnet.abstract_conv import conv2d as _conv2d
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["conv2d"]

#: ConvOp keywords of Theano that only tune its C code: accepted, with nothing to tune here
_TUNING = frozenset({"unroll_batch", "unroll_kern", "unroll_patch", "verbose", "version",
                     "direction_hint", "openmp"})


def conv2d(input: Any, filters: Any, image_shape: Any = None, filter_shape: Any = None,
           border_mode: str = "valid", subsample: Any = (1, 1), **kargs: Any) -> TensorVariable:
    """Convolve `input` ([num_images,] h, w) with `filters` ([num_filters,] kh, kw).

    The result is ([num_images,] [num_filters,] out_h, out_w): an axis appears only where the
    operand had it. border_mode is 'valid' or 'full' (as scipy.signal.convolve2d); subsample
    keeps every (dy, dx)-th output. image_shape / filter_shape (2 or 3 entries) are optional
    hints, used (and checked at run time) when both are given, as Theano."""
    unknown = set(kargs) - _TUNING
    if unknown:
        raise TypeError(f"signal.conv.conv2d: unsupported keyword(s) {sorted(unknown)}; "
                        f"accepted ConvOp tuning keywords: {sorted(_TUNING)}")
    if border_mode not in ("valid", "full"):
        raise ValueError(f"signal.conv.conv2d: border_mode must be 'valid' or 'full', "
                         f"got {border_mode!r}")
    input = as_tensor_variable(input)
    filters = as_tensor_variable(filters)
    if input.ndim not in (2, 3) or filters.ndim not in (2, 3):
        raise ValueError(f"signal.conv.conv2d: input and filters must be 2-d or 3-d, got "
                         f"{input.ndim}-d and {filters.ndim}-d")
    imshp = kshp = None
    if image_shape and filter_shape:
        imshp = ((image_shape[0] if input.ndim == 3 else 1), 1, *tuple(image_shape)[-2:])
        kshp = ((filter_shape[0] if filters.ndim == 3 else 1), 1, *tuple(filter_shape)[-2:])
    bsize = shape_i(input, 0) if input.ndim == 3 else 1
    nkern = shape_i(filters, 0) if filters.ndim == 3 else 1
    input4 = reshape(input, [bsize, 1, shape_i(input, input.ndim - 2),
                             shape_i(input, input.ndim - 1)], ndim=4)
    filters4 = reshape(filters, [nkern, 1, shape_i(filters, filters.ndim - 2),
                                 shape_i(filters, filters.ndim - 1)], ndim=4)
    out = _conv2d(input4, filters4, input_shape=imshp, filter_shape=kshp,
                  border_mode=border_mode, subsample=tuple(subsample))
    if input.ndim == 3 and filters.ndim == 3:
        return out
    lead = [shape_i(out, 0)] if input.ndim == 3 else [shape_i(out, 1)] if filters.ndim == 3 \
        else []
    return reshape(out, lead + [shape_i(out, 2), shape_i(out, 3)], ndim=len(lead) + 2)
