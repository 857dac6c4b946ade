"""Activation functions that nnet did not have yet, written as elementwise graphs (so their
gradients, fusion and the GPU kernels come from the scalar table)."""
from __future__ import annotations

from typing import Any

from symgpu.tensor import math as _m
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["elu", "selu"]


def elu(x: Any, alpha: Any = 1) -> TensorVariable:
    """Exponential linear unit: x if x > 0 else alpha * (exp(x) - 1) (Theano's elu; expm1
    keeps small negative inputs exact)."""
    x = as_tensor_variable(x)
    return _m.switch(_m.gt(x, 0), x, _m.mul(alpha, _m.expm1(x)))


def selu(x: Any) -> TensorVariable:
    """Scaled ELU with the self-normalising constants of Klambauer et al. (2017)."""
    alpha = 1.6732632423543772848170429916717
    scale = 1.0507009873554804934193349852946
    return _m.mul(scale, elu(x, alpha))
