"""Theano's abstract_conv helpers beyond the convolutions: shape assertions and bilinear
upsampling (served under `symgpu.tensor.nnet.abstract_conv` as Theano had them).

Why built from other ops: the assertions are `Assert` nodes (checked when the function
runs), and bilinear upsampling is a transposed convolution of the edge-padded input with
the fixed bilinear kernel (Theano's construction), so it runs wherever conv2d does (cuDNN on
the GPU) and has the convolution's gradient.
"""
from __future__ import annotations

from math import gcd
from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.checks import Assert
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.nnet.abstract_conv import (bilinear_kernel_1D, bilinear_kernel_2D, conv2d,
                                              conv2d_grad_wrt_inputs)
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["assert_conv_shape", "assert_shape", "bilinear_upsampling",
           "frac_bilinear_upsampling"]


def assert_conv_shape(shape: Sequence[Any]) -> tuple:
    """`shape` (a convolution's input, output or kernel shape) checked: the first two entries
    >= 0, the others > 0. A constant entry that fails raises ValueError now; a symbolic one is
    wrapped in an Assert checked when the function runs."""
    out = []
    for i, n in enumerate(shape):
        try:
            c = get_scalar_constant_value(n)
            if i < 2 and c < 0:
                raise ValueError(f"The convolution would produce an invalid shape "
                                 f"(dim[{i}]: {int(c)} < 0).")
            if i >= 2 and c <= 0:
                raise ValueError(f"The convolution would produce an invalid shape "
                                 f"(dim[{i}]: {int(c)} <= 0).")
            out.append(n)
        except NotScalarConstantError:
            if i < 2:
                check = Assert(f"The convolution would produce an invalid shape (dim[{i}] < 0).")
                out.append(check(n, _m.ge(n, 0)))
            else:
                check = Assert(f"The convolution would produce an invalid shape "
                               f"(dim[{i}] <= 0).")
                out.append(check(n, _m.gt(n, 0)))
    return tuple(out)


def assert_shape(x: Any, expected_shape: Sequence[Any] | None,
                 msg: str = "Unexpected shape.") -> TensorVariable:
    """`x` wrapped in an Assert that its shape is `expected_shape` (None entries unchecked),
    when the flag ``conv.assert_shape`` is True; otherwise (or with nothing to check) `x`."""
    x = as_tensor_variable(x)
    if expected_shape is None or not config.conv.assert_shape:
        return x
    tests = [_m.eq(x.shape[i], expected_shape[i]) for i in range(x.ndim)
             if expected_shape[i] is not None]
    return Assert(msg)(x, *tests) if tests else x


def _edge_padded(input: Any) -> tuple[TensorVariable, Any, Any]:
    """The (N*C, 1, H+2, W+2) stack of `input`'s maps with the first and last rows and
    columns repeated, and H, W."""
    row, col = input.shape[2], input.shape[3]
    up = input.reshape((-1, 1, row, col))
    mat = _b.concatenate((up[:, :, :1, :], up, up[:, :, -1:, :]), axis=2)
    mat = _b.concatenate((mat[:, :, :, :1], mat, mat[:, :, :, -1:]), axis=3)
    return mat, row, col


def frac_bilinear_upsampling(input: Any, frac_ratio: tuple) -> TensorVariable:
    """Bilinear upsampling of a (N, C, H, W) batch by a fractional ratio: `(p, q)` for both
    axes, or `((p_row, q_row), (p_col, q_col))`; each output axis is about size * p / q."""
    input = as_tensor_variable(input)
    if not isinstance(frac_ratio, tuple):
        raise ValueError(f"frac_ratio must be a tuple, got {frac_ratio!r}")
    if isinstance(frac_ratio[0], tuple):
        reduced = [tuple(np.array(fr) // gcd(*fr)) for fr in frac_ratio]
        ratio = (int(reduced[0][0]), int(reduced[1][0]))
        subsample = (int(reduced[0][1]), int(reduced[1][1]))
    else:
        p, q = np.array(frac_ratio) // gcd(*frac_ratio)
        ratio, subsample = (int(p), int(p)), (int(q), int(q))
    mat, row, col = _edge_padded(input)
    floatX = config.floatX
    double_pad = (2 * _b.as_tensor_variable([row, col]) - 1) * np.array(ratio) + 1
    pad = double_pad // 2
    kern = _m.cast(bilinear_kernel_2D(ratio=ratio), floatX).dimshuffle("x", "x", 0, 1)
    kh, kw = kern.shape[2], kern.shape[3]
    pad_kern = _b.concatenate((_b.zeros((1, 1, pad[0], kw), dtype=floatX), kern,
                               _b.zeros((1, 1, double_pad[0] - pad[0], kw), dtype=floatX)),
                              axis=2)
    rows = pad_kern.shape[2]
    pad_kern = _b.concatenate((_b.zeros((1, 1, rows, pad[1]), dtype=floatX), pad_kern,
                               _b.zeros((1, 1, rows, double_pad[1] - pad[1]), dtype=floatX)),
                              axis=3)
    up = conv2d(pad_kern, _m.cast(mat, floatX), border_mode="valid", filter_dilation=ratio,
                subsample=subsample)
    return up.reshape((input.shape[0], input.shape[1], up.shape[2], up.shape[3]))


def bilinear_upsampling(input: Any, ratio: Any = None, frac_ratio: Any = None,
                        batch_size: int | None = None, num_input_channels: int | None = None,
                        use_1D_kernel: bool = True) -> TensorVariable:
    """Bilinear upsampling of a (N, C, H, W) batch by the integer `ratio` (result (N, C,
    H*ratio, W*ratio)), or by `frac_ratio` (see frac_bilinear_upsampling; needs
    use_1D_kernel=False). The edges are repeated, so the first and last rows keep their
    values; `use_1D_kernel` upsamples rows then columns (same result as the 2-d kernel)."""
    if ratio and frac_ratio:
        raise ValueError("can't use ratio and frac_ratio together")
    if not (ratio or frac_ratio):
        raise ValueError("No ratio (or frac_ratio) provided")
    if frac_ratio:
        if use_1D_kernel:
            raise ValueError("For fractional ratios 1D kernel method not implemented. You may "
                             "want to pass use_1D_kernel as False")
        return frac_bilinear_upsampling(input, frac_ratio=frac_ratio)
    input = as_tensor_variable(input)
    try:
        up_bs = batch_size * num_input_channels
    except TypeError:
        up_bs = None
    mat, row, col = _edge_padded(input)
    pad = 2 * ratio - (ratio - 1) // 2 - 1
    if use_1D_kernel:
        kern = _m.cast(bilinear_kernel_1D(ratio=ratio, normalize=True), input.dtype)
        up_row = conv2d_grad_wrt_inputs(mat, kern.dimshuffle("x", "x", 0, "x"),
                                        input_shape=(up_bs, 1, row * ratio, col + 2),
                                        filter_shape=(1, 1, None, 1), border_mode=(pad, 0),
                                        subsample=(ratio, 1), filter_flip=True,
                                        filter_dilation=(1, 1))
        up = conv2d_grad_wrt_inputs(up_row, kern.dimshuffle("x", "x", "x", 0),
                                    input_shape=(up_bs, 1, row * ratio, col * ratio),
                                    filter_shape=(1, 1, 1, None), border_mode=(0, pad),
                                    subsample=(1, ratio), filter_flip=True,
                                    filter_dilation=(1, 1))
    else:
        kern = _m.cast(bilinear_kernel_2D(ratio=ratio, normalize=True), input.dtype)
        up = conv2d_grad_wrt_inputs(mat, kern.dimshuffle("x", "x", 0, 1),
                                    input_shape=(up_bs, 1, row * ratio, col * ratio),
                                    filter_shape=(1, 1, None, None), border_mode=(pad, pad),
                                    subsample=(ratio, ratio), filter_flip=True,
                                    filter_dilation=(1, 1))
    return up.reshape((input.shape[0], input.shape[1], row * ratio, col * ratio))
