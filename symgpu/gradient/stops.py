"""Gradient stops: `zero_grad` and `disconnected_grad` (identity forward, no gradient back),
and Theano's other identity-forward gradient ops: `grad_clip`, `grad_scale`, `undefined_grad`.

A compiled function drops them (canonicalize): they only speak to `grad`.
"""
from __future__ import annotations

from typing import Any

import symgpu.tensor as T
from symgpu.gradient.core import DisconnectedType, NullType
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize

__all__ = ["zero_grad", "disconnected_grad", "consider_constant", "ZeroGrad", "DisconnectedGrad",
           "grad_clip", "grad_scale", "undefined_grad", "GradClip", "GradScale",
           "UndefinedGrad"]


class _GradStop(Op):
    """Identity forward; subclasses decide what flows backwards. The output is a view of the
    input (`view_map`), so at run time the op costs one pointer copy."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        if not isinstance(x, Variable):
            x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


class ZeroGrad(_GradStop):
    """Forward: the input itself. Backward: a zero gradient (the input stays connected)."""

    def grad(self, inputs, output_grads):
        return [T.zeros_like(inputs[0])]

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else T.zeros_like(eval_points[0])]


class DisconnectedGrad(_GradStop):
    """Forward: the input itself. Backward: no gradient path at all (the input is
    disconnected, so `grad(..., disconnected_inputs='raise')` raises if it is all there is)."""

    def grad(self, inputs, output_grads):
        return [DisconnectedType()()]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[False]]

    def R_op(self, inputs, eval_points):
        return [None]


class GradClip(_GradStop):
    """Forward: the input itself. Backward: the gradient clipped to [clip_lower_bound,
    clip_upper_bound] (Theano's GradClip)."""

    __props__ = ("clip_lower_bound", "clip_upper_bound")

    def __init__(self, clip_lower_bound: float, clip_upper_bound: float):
        if not clip_upper_bound >= clip_lower_bound:
            raise ValueError(f"GradClip: the upper bound {clip_upper_bound} is below the lower "
                             f"bound {clip_lower_bound}")
        self.clip_lower_bound = clip_lower_bound
        self.clip_upper_bound = clip_upper_bound

    def grad(self, inputs, output_grads):
        return [T.clip(output_grads[0], self.clip_lower_bound, self.clip_upper_bound)]


class GradScale(_GradStop):
    """Forward: the input itself. Backward: the gradient times `multiplier` (Theano's)."""

    __props__ = ("multiplier",)

    def __init__(self, multiplier: Any):
        self.multiplier = multiplier

    def grad(self, inputs, output_grads):
        return [output_grads[0] * self.multiplier]


class UndefinedGrad(_GradStop):
    """Forward: the input itself. Backward: an undefined gradient (NullType), so `grad`
    through it raises NullTypeGradError (Theano's)."""

    def grad(self, inputs, output_grads):
        return [NullType(f"undefined_grad: the gradient through {inputs[0]} is declared "
                         f"undefined")()]

    def R_op(self, inputs, eval_points):
        return [None]


def grad_clip(x: Any, lower_bound: float, upper_bound: float) -> Variable:
    """`x`, whose gradient is clipped elementwise to [lower_bound, upper_bound] on the way
    back (Theano's `theano.gradient.grad_clip`)."""
    return GradClip(lower_bound, upper_bound)(x)


def grad_scale(x: Any, multiplier: Any) -> Variable:
    """`x`, whose gradient is multiplied by `multiplier` on the way back."""
    return GradScale(multiplier)(x)


def undefined_grad(x: Any) -> Variable:
    """`x`, with an undefined gradient: `grad` through it raises NullTypeGradError."""
    return UndefinedGrad()(x)


_zero_grad = ZeroGrad()
_disconnected_grad = DisconnectedGrad()


def zero_grad(x: Any) -> Variable:
    """`x`, but its gradient is zero: the cost is treated as constant in `x` through here."""
    return _zero_grad(x)


def disconnected_grad(x: Any) -> Variable:
    """`x`, but no gradient flows back through it (as if it were a fresh input)."""
    return _disconnected_grad(x)


consider_constant = zero_grad  # Theano's older name for the same stop


@register_canonicalize("fast_run", "fast_compile")
@node_rewriter([ZeroGrad, DisconnectedGrad, GradClip, GradScale, UndefinedGrad])
def local_remove_gradient_stops(fgraph, node):
    """zero_grad/disconnected_grad (and grad_clip, grad_scale, undefined_grad) only speak to
    grad(): a compiled function drops them
    (so they cost nothing and do not split elementwise fusion)."""
    return [node.inputs[0]]
