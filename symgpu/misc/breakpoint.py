"""Theano's `theano.tests.breakpoint.PdbBreakpoint` (that path maps here): a conditional
breakpoint inside a compiled function.

``PdbBreakpoint(name)(condition, *monitored)`` returns the monitored variables unchanged
(views of them); when the scalar `condition` is true at run time it first enters the debugger
with the monitored values in the list ``monitored`` (edit its entries and the new values flow
on, as Theano). The debugger is Python's ``breakpoint()`` hook (``sys.breakpointhook``,
looked up at each stop): pdb by default, ``PYTHONBREAKPOINT=ipdb.set_trace`` (or pudb) for
another -- where Theano tried pudb, ipdb, then pdb.

At least one output must be used, else the op leaves the graph with the unused outputs.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from symgpu.gradient.core import DisconnectedType
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable

__all__ = ["PdbBreakpoint", "enter_debugger"]


def enter_debugger(name: str, monitored: list) -> None:
    """Stop in the debugger with `monitored` (the list the op reads its outputs back from)
    in scope; a module-level hook so that a test or a tool can replace it."""
    print(f"\n-------------------------------------------------\n"
          f"Conditional breakpoint '{name}' activated\n\n"
          f"The monitored variables are stored, in order,\n"
          f"in the list variable 'monitored' as NumPy arrays.\n\n"
          f"Their contents can be altered and, when execution\n"
          f"resumes, the updated values will be used.\n"
          f"-------------------------------------------------")
    sys.breakpointhook()  # the debugger starts in this frame: `monitored` is a local here


class PdbBreakpoint(Op):
    """An identity on its monitored inputs that enters the debugger when its condition (a
    scalar) is true. Gradients pass through to the monitored inputs; the condition has
    none (disconnected)."""

    __props__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def make_node(self, condition: Any, *monitored_vars: Any) -> Apply:
        if not isinstance(condition, Variable):
            condition = as_tensor_variable(condition)
        if getattr(condition.type, "ndim", None) != 0:
            raise TypeError(f"PdbBreakpoint {self.name!r}: the condition must be a scalar, got "
                            f"{condition} ({condition.type})")
        monitored = [v if isinstance(v, Variable) else as_tensor_variable(v)
                     for v in monitored_vars]
        # one op per node: its view_map depends on how many variables it monitors
        op = PdbBreakpoint(self.name)
        op.view_map = {i: [i + 1] for i in range(len(monitored))}
        return Apply(op, [condition, *monitored], [v.type() for v in monitored])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        if inputs[0]:
            monitored = [np.asarray(v) for v in inputs[1:]]
            enter_debugger(self.name, monitored)  # a global: a replaced hook is the one called
            for i, (cell, out) in enumerate(zip(output_storage, node.outputs)):
                cell[0] = out.type.filter(monitored[i])
        else:
            for i, cell in enumerate(output_storage):
                cell[0] = inputs[i + 1]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list[Variable]:
        return [DisconnectedType()(), *output_grads]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        n_out = len(node.outputs)
        return [[o == i - 1 for o in range(n_out)] for i in range(len(node.inputs))]

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: Sequence[tuple]) -> list[tuple]:
        return list(input_shapes[1:])
