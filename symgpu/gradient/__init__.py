"""Reverse-mode differentiation: grad, Lop, Rop, jacobian, hessian and verify_grad.

The names of Theano's `theano.gradient`, from the modules of this package (each imports only
`core` of its neighbours):

- `core`: the gradient contract of Ops, the special types (`DisconnectedType`, `NullType`)
  and `grad` itself;
- `stops`: `zero_grad`, `disconnected_grad` (gradient-stopping ops);
- `products`: `Lop`, `Rop`;
- `matrices`: `jacobian`, `hessian` (`JacobianOp`);
- `check`: `verify_grad`, `numeric_grad` (finite differences).
"""
import symgpu.tensor as _tensor_package
from symgpu.gradient.core import (DisconnectedInputError, DisconnectedType, NullType,
                                  NullTypeGradError, grad, grad_not_implemented, grad_undefined)
from symgpu.gradient.stops import (DisconnectedGrad, GradClip, GradScale, UndefinedGrad,
                                   ZeroGrad, consider_constant, disconnected_grad, grad_clip,
                                   grad_scale, undefined_grad, zero_grad)
from symgpu.gradient.products import Lop, Rop, format_as, subgraph_grad
from symgpu.gradient.matrices import JacobianOp, hessian, jacobian
from symgpu.gradient.check import GradientError, numeric_grad, verify_grad

__all__ = ["grad", "Lop", "Rop", "jacobian", "hessian", "verify_grad", "numeric_grad",
           "GradientError", "DisconnectedInputError", "NullTypeGradError", "DisconnectedType",
           "NullType", "grad_undefined", "grad_not_implemented", "disconnected_grad",
           "zero_grad", "consider_constant", "ZeroGrad", "DisconnectedGrad", "JacobianOp",
           "grad_clip", "grad_scale", "undefined_grad", "GradClip", "GradScale", "UndefinedGrad",
           "format_as", "subgraph_grad"]

# Theano's T.grad, T.Lop, T.Rop, T.jacobian, T.hessian, T.verify_grad, T.numeric_grad: the
# tensor namespace (a layer below
# this one) gets them from here when this package loads (the symgpu package imports it)
for _name in ("grad", "Lop", "Rop", "jacobian", "hessian", "verify_grad", "numeric_grad"):
    setattr(_tensor_package, _name, globals()[_name])
