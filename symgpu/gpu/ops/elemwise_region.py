"""The elementwise arithmetic above a variable, as a function one can evaluate: which rewrites
use to recognise a formula however it is spelled (gelu_epilogue_rewrite.py).

Why evaluate rather than match a pattern: a user writes GELU as ``0.5 * x * (1 + tanh(...))``,
as ``x * sigmoid(1.5957691 * (x + 0.044715 * x ** 3))``, with ``x ** 3`` or ``x * x * x``, with
the constants folded or not; its gradient, built by ``grad`` from any of these and then
canonicalised, has a different shape again.  Each is a few GpuElemwise nodes over the same
leaves, and equal as functions: evaluated at a few hundred points they agree to float32's
precision with the formula they spell, where a different function (GELU's erf form, a wrong
constant) does not.

A region is the pure GpuElemwise nodes (no in-place, one output) that compute a root from
leaves: variables no GpuElemwise computes (a product, a reshape, a broadcast bias) and
constants of one value; at most ``MAX_NODES`` nodes.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.scalar.basic import Cast
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.type import as_tensor_variable

__all__ = ["Region", "region", "MAX_NODES"]

#: the largest region looked at (GELU's forward is about 10 nodes, its gradient about 20)
MAX_NODES = 64


class Region:
    """The nodes (in topological order) computing ``root`` from ``leaves`` and constants."""

    def __init__(self, root: Variable, nodes: list[Apply], leaves: list[Variable],
                 constants: dict[Variable, Any]) -> None:
        self.root, self.nodes, self.leaves, self.constants = root, nodes, leaves, constants
        self.variables = {o for n in nodes for o in n.outputs}

    def evaluate(self, values: dict[Variable, np.ndarray],
                 wanted: list[Variable] | None = None) -> list[np.ndarray]:
        """The values of ``wanted`` (default: the root) as real functions of the leaves, each
        leaf bound to a 1-d array of samples (``values``): every node's scalar op computed
        in float64 (the host's Elemwise), casts between floating dtypes taken as the
        identity, so that two spellings of one formula agree to float64's precision and only
        their constants (a float32 graph's, rounded) tell them apart."""
        env: dict[Variable, np.ndarray] = {v: np.asarray(a, np.float64).reshape(-1)
                                           for v, a in values.items()}
        for v, c in self.constants.items():
            env[v] = np.asarray(c, dtype=np.float64).reshape(1)
        for node in self.nodes:
            args = [env[v] for v in node.inputs]
            op = node.op.scalar_op
            if isinstance(op, Cast) and np.dtype(op.dtype).kind == "f":
                env[node.outputs[0]] = args[0]
                continue
            host = Elemwise(op)
            hnode = host.make_node(*[as_tensor_variable(a) for a in args])
            out: list = [[None]]
            host.perform(hnode, args, out)
            env[node.outputs[0]] = np.asarray(out[0][0])
        return [env[v] for v in (wanted or [self.root])]

    def depends_on(self, var: Variable, leaf: Variable,
                   besides: Variable | None = None) -> bool:
        """Whether region variable ``var`` is computed from ``leaf`` (by a path that does not
        go through ``besides``, when given)."""
        seen, todo = set(), [var]
        while todo:
            v = todo.pop()
            if v is besides:
                continue
            if v is leaf:
                return True
            if v in self.variables and id(v) not in seen:
                seen.add(id(v))
                todo.extend(v.owner.inputs)
        return False


def _pure(node: Any) -> bool:
    return isinstance(node, Apply) and type(node.op) is GpuElemwise and \
        not node.op.inplace_pattern and len(node.outputs) == 1


def _one_value(var: Variable) -> Any:
    """The value of a constant of one value (a broadcast scalar), else None."""
    c = constant_behind(var)
    if c is None:
        return None
    data = np.asarray(c.data)
    if data.size == 0 or not np.all(data == data.flat[0]):
        return None
    return data.flat[0]


def region(root: Variable, stop: Callable[[Variable], bool] = lambda v: False) -> Region | None:
    """The region computing ``root`` (itself a GpuElemwise output), its walk also ending at
    the variables ``stop`` accepts (they become leaves); None past MAX_NODES nodes."""
    if not _pure(root.owner):
        return None
    order: list[Apply] = []
    leaves: list[Variable] = []
    constants: dict[Variable, Any] = {}
    seen = {id(root.owner)}           # nodes pushed (each taken once)
    stack: list[tuple[Apply, int]] = [(root.owner, 0)]
    while stack:
        node, i = stack.pop()
        if i < len(node.inputs):
            stack.append((node, i + 1))
            v = node.inputs[i]
            if v in constants or any(v is x for x in leaves):
                continue
            owner = v.owner
            if not stop(v) and _pure(owner):
                if id(owner) not in seen:
                    seen.add(id(owner))
                    stack.append((owner, 0))
                continue
            value = _one_value(v)
            if value is not None:
                constants[v] = value
            else:
                leaves.append(v)
            continue
        order.append(node)
        if len(order) > MAX_NODES:
            return None
    return Region(root, order, leaves, constants)
