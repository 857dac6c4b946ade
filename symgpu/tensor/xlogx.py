"""Theano's ``theano.tensor.xlogx``: x log x and x log y with 0 log 0 = 0 (``T.xlogx.xlogy0``,
as the RNN-RBM tutorial's pseudo-likelihood monitor calls it). The two are rows of the scalar
table (symgpu/scalar/basic.py), so they fuse, compile to C and CUDA and lift to the GPU."""
from __future__ import annotations

from typing import Any

from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.math import as_operands
from symgpu.tensor.type import TensorVariable

__all__ = ["xlogx", "xlogy0", "scalar_xlogx", "scalar_xlogy0"]

#: the scalar ops, under Theano's names
scalar_xlogx = SCALAR_OPS["xlogx"]
scalar_xlogy0 = SCALAR_OPS["xlogy0"]
_XLOGX, _XLOGY0 = Elemwise(scalar_xlogx), Elemwise(scalar_xlogy0)


def xlogx(x: Any) -> TensorVariable:
    """Elementwise x * log(x), 0 where x == 0 (a float result, as Theano's)."""
    return _XLOGX(*as_operands(x))


def xlogy0(x: Any, y: Any) -> TensorVariable:
    """Elementwise x * log(y), 0 where x == 0 whatever y is (a float result, as Theano's)."""
    return _XLOGY0(*as_operands(x, y))
