"""Theano's older `theano.tensor.nnet.conv` entry point, kept for code written against it:
`conv.conv2d(input, filters, image_shape=None, filter_shape=None, border_mode='valid',
subsample=(1, 1))` is the abstract conv2d (a true convolution: filters flipped)."""
from __future__ import annotations

from typing import Any

from symgpu.tensor.nnet.abstract_conv import conv2d as _conv2d
from symgpu.tensor.type import TensorVariable

__all__ = ["conv2d"]


def conv2d(input: Any, filters: Any, image_shape: Any = None, filter_shape: Any = None,
           border_mode: Any = "valid", subsample: Any = (1, 1)) -> TensorVariable:
    """The old signature of conv2d: `image_shape` is the new `input_shape`."""
    return _conv2d(input, filters, input_shape=image_shape, filter_shape=filter_shape,
                   border_mode=border_mode, subsample=subsample)
