"""The in-place pass of typed lists (Theano's ``typed_list_inplace_opt``): Append, Extend,
Insert, Remove and Reverse change their input list instead of copying it, where the destroy
handler allows it (the list is an intermediate read by nothing else). Runs after the tensor
in-place pass (position 75.5), with the tags ``fast_run`` and ``inplace``."""
from __future__ import annotations

from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import (GraphRewriter, InconsistencyError, attach_destroy_handler,
                                    optdb, replace_validate, why_not_destroyable)
from symgpu.typed_list.basic import Append, Extend, Insert, Remove, Reverse

__all__ = ["typed_list_inplace"]

_MUTATING = (Append, Extend, Insert, Remove, Reverse)


def typed_list_inplace(fgraph: FunctionGraph) -> int:
    """Switch every list op that safely can to its in-place version; returns how many."""
    attach_destroy_handler(fgraph)
    n = 0
    for node in fgraph.toposort():
        if node not in fgraph.apply_nodes:
            continue
        op = node.op
        if type(op) not in _MUTATING or op.inplace:
            continue
        x = node.inputs[0]
        if node.inputs.count(x) != 1 or why_not_destroyable(fgraph, x, node) is not None:
            continue
        try:
            new = type(op)(inplace=True).make_node(*node.inputs).outputs
            replace_validate(fgraph, list(zip(node.outputs, new)), reason="typed_list_inplace")
            n += 1
        except InconsistencyError:
            continue
    return n


class _TypedListInplace(GraphRewriter):
    def __init__(self) -> None:
        super().__init__(None, "typed_list_inplace")

    def apply(self, fgraph: FunctionGraph) -> int:
        return typed_list_inplace(fgraph)


optdb.register("typed_list_inplace", _TypedListInplace(), 75.5, "fast_run", "inplace")
