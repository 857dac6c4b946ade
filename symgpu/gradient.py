"""Reverse-mode differentiation over the graph (being extended by the autodiff work)."""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.graph.basic import Variable, io_toposort, graph_inputs

__all__ = ["grad"]


def grad(cost: Variable, wrt: Any, consider_constant: Sequence[Variable] | None = None,
         disconnected_inputs: str = "raise", known_grads: dict | None = None,
         return_disconnected: str = "zero") -> Any:
    """d cost / d wrt, by accumulating output gradients backwards through each node's grad."""
    import symgpu.tensor as T
    single = not isinstance(wrt, (list, tuple))
    wrt_list = [wrt] if single else list(wrt)
    grads: dict[Variable, Variable] = {cost: T.ones_like(cost)}
    nodes = io_toposort(graph_inputs([cost]), [cost])
    for node in reversed(nodes):
        outs_g = [grads.get(o) for o in node.outputs]
        if all(g is None for g in outs_g):
            continue
        outs_g = [g if g is not None else T.zeros_like(o) for g, o in zip(outs_g, node.outputs)]
        in_g = node.op.L_op(node.inputs, node.outputs, outs_g)
        for v, g in zip(node.inputs, in_g):
            if g is None:
                continue
            grads[v] = g if v not in grads else grads[v] + g
    result = [grads.get(w, T.zeros_like(w)) for w in wrt_list]
    return result[0] if single else result
