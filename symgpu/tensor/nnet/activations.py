"""Activation functions that nnet did not have yet, written as elementwise graphs (so their
gradients, fusion and the GPU kernels come from the scalar table)."""
from __future__ import annotations

import math
from typing import Any

from symgpu.scalar.dtypes import is_float, upgrade_to_float
from symgpu.tensor import math as _m
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["elu", "selu", "gelu", "ultra_fast_sigmoid", "hard_sigmoid", "softsign",
           "sigmoid_binary_crossentropy"]


def _float(x: Any) -> TensorVariable:
    """`x` as a tensor in the float dtype Theano's `upgrade_to_float` gives it."""
    x = as_tensor_variable(x)
    if not is_float(x.dtype):
        x = _m.cast(x, upgrade_to_float(x.dtype))
    return x


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


def gelu(x: Any, approximate: str | bool = "tanh") -> TensorVariable:
    """Gaussian error linear unit (Hendrycks and Gimpel), as ``jax.nn.gelu`` and
    ``torch.nn.functional.gelu`` take it: ``approximate="tanh"`` (or True, JAX's default)
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, the form GPT-2 trained with and the
    one cuBLASLt's epilogues compute (after a product with a bias on the GPU it runs inside
    the product: gpu/ops/gelu_epilogue_rewrite.py); ``"none"`` (or False) the exact ``x
    Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))``."""
    form = ("tanh" if approximate else "none") if isinstance(approximate, bool) \
        else approximate
    if form not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh', 'none', True or False, got "
                         f"{approximate!r}")
    x = _float(x)      # Python constants take x's float dtype
    if form == "none":
        return _m.mul(0.5, x, _m.add(1.0, _m.erf(_m.mul(x, math.sqrt(0.5)))))
    inner = _m.mul(math.sqrt(2 / math.pi), _m.add(x, _m.mul(0.044715, _m.mul(x, x, x))))
    return _m.mul(0.5, x, _m.add(1.0, _m.tanh(inner)))


def _fast_tanh_half(a: TensorVariable) -> TensorVariable:
    """Theano's piecewise approximation of tanh(a) for a >= 0 (values for a < 0 are unused)."""
    return _m.switch(_m.lt(a, 1.7), _m.true_div(_m.mul(1.5, a), _m.add(1, a)),
                     _m.switch(_m.lt(a, 3), _m.add(0.935409070603099,
                                                   _m.mul(0.0458812946797165, _m.sub(a, 1.7))),
                               _m.mul(_m.ones_like(a), 0.99505475368673)))


def ultra_fast_sigmoid(x: Any) -> TensorVariable:
    """Theano's piecewise approximation of the sigmoid: with h = x/2,
    0.5 * (t(h) + 1) where t(h) = 1.5 h / (1 + h) for |h| < 1.7, a line up to |h| = 3 and
    0.99505475368673 beyond (odd in h); max abs error about 0.03. The gradient is that of the
    approximation (continuous; 0.375 at 0)."""
    x = _float(x)
    h = _m.mul(0.5, x)
    z = _m.switch(_m.ge(h, 0), _fast_tanh_half(h), _m.neg(_fast_tanh_half(_m.neg(h))))
    return _m.mul(0.5, _m.add(z, 1))


def hard_sigmoid(x: Any) -> TensorVariable:
    """clip(0.2 x + 0.5, 0, 1) in the float dtype of `x` (Theano's hard_sigmoid)."""
    x = _float(x)
    return _m.clip(_m.add(_m.mul(x, 0.2), 0.5), 0, 1)


def softsign(x: Any) -> TensorVariable:
    """x / (1 + |x|); its gradient is 1 / (1 + |x|)**2."""
    x = _float(x)
    return _m.true_div(x, _m.add(1, _m.abs(x)))


def sigmoid_binary_crossentropy(output: Any, target: Any) -> TensorVariable:
    """binary_crossentropy(sigmoid(output), target) computed from the pre-sigmoid `output`
    without overflow: softplus(-|o|) + o * ((o > 0) - t), written per sign of `o` so that
    every term stays exact and the gradient is sigmoid(o) - t (to `output`) and -o (to
    `target`) everywhere, 0 included."""
    o = _float(output)
    t = as_tensor_variable(target)
    pos = _m.add(_m.softplus(_m.neg(o)), _m.mul(o, _m.sub(1, t)))
    neg = _m.sub(_m.softplus(o), _m.mul(o, t))
    return _m.switch(_m.gt(o, 0), pos, neg)

