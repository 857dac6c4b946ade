"""Assertions inside a graph (Theano's `theano.tensor.opt.Assert`).

Why an op: a check on values computed in the graph (a shape, a bound) must run when the
function runs, between the ops that produce the values and those that use them; the op
returns its first input (a view), so the check stays in the graph exactly as long as the
value it guards is used.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable

__all__ = ["Assert", "assert_op"]


class Assert(Op):
    """``Assert(msg)(value, *conds)`` returns `value`; when the function runs, a condition
    that is false (zero) raises AssertionError(msg). The conditions are scalars (0-d).

    The specialize rewrite ``local_remove_useless_assert`` drops conditions that are
    constant and true (and the op, when none is left)."""

    __props__ = ("msg",)
    view_map = {0: [0]}

    def __init__(self, msg: str = "Theano Assert failed!"):
        self.msg = msg

    def make_node(self, value: Any, *conds: Any) -> Apply:
        if not isinstance(value, Variable):
            value = as_tensor_variable(value)
        cond = [as_tensor_variable(c) for c in conds]
        for k, c in enumerate(cond):
            if c.ndim != 0:
                raise TypeError(f"Assert({self.msg!r}): condition {k} must be a scalar (0-d), "
                                f"got {c.type}")
        return Apply(self, [value] + cond, [value.type()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        if not all(bool(np.asarray(c)) for c in inputs[1:]):
            raise AssertionError(self.msg)
        output_storage[0][0] = inputs[0]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [output_grads[0]] + [None] * (len(inputs) - 1)

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[True]] + [[False]] * (len(node.inputs) - 1)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[0]]

    def __str__(self) -> str:
        return f"Assert{{msg={self.msg!r}}}"


#: Theano's instance (``theano.tensor.opt.assert_op``, also ``assert_``)
assert_op = Assert()
