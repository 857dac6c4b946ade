"""Theano's abstract_conv shape assertions (served under `symgpu.tensor.nnet.abstract_conv`,
which imports them, as Theano had them).

Why `Assert` nodes: a symbolic shape is checked when the function runs; a constant one that
fails raises now.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.config import config
from symgpu.tensor import math as _m
from symgpu.tensor.checks import Assert
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["assert_conv_shape", "assert_shape"]


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
