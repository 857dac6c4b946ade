"""verify_grad's own module name (`from symgpu.gradient_check import verify_grad`): the code
is symgpu/gradient/check.py, also reached as `symgpu.gradient.verify_grad` (Theano's path)."""
from symgpu.gradient.check import GradientError, numeric_grad, verify_grad

__all__ = ["verify_grad", "numeric_grad", "GradientError"]
