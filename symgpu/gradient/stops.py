"""Gradient stops: `zero_grad` and `disconnected_grad` (identity forward, no gradient back).

A compiled function drops them (canonicalize): they only speak to `grad`.
"""
from __future__ import annotations

from typing import Any

import symgpu.tensor as T
from symgpu.gradient.core import DisconnectedType
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize

__all__ = ["zero_grad", "disconnected_grad", "consider_constant", "ZeroGrad", "DisconnectedGrad"]


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
@node_rewriter([ZeroGrad, DisconnectedGrad])
def local_remove_gradient_stops(fgraph, node):
    """zero_grad/disconnected_grad only speak to grad(): a compiled function drops them
    (so they cost nothing and do not split elementwise fusion)."""
    return [node.inputs[0]]
