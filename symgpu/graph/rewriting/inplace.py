"""In-place passes for ops that overwrite their first input when built with ``inplace=True``
(block-sparse products, typed-list edits): one mechanism, so each op family registers a pass
instead of writing its own loop."""
from __future__ import annotations

from typing import Sequence

from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import GraphRewriter, InconsistencyError, replace_validate
from symgpu.graph.rewriting.db import optdb
from symgpu.graph.rewriting.destroy import attach_destroy_handler, why_not_destroyable

__all__ = ["FirstInputInplace", "register_first_input_inplace"]


class FirstInputInplace(GraphRewriter):
    """Switch each node of `op_classes` (not yet in place) to ``type(op)(inplace=True)``
    where its first input may be overwritten: an intermediate that nothing else reads and
    that the node does not read twice (the destroy handler decides)."""

    def __init__(self, name: str, op_classes: Sequence[type]) -> None:
        super().__init__(None, name)
        self.op_classes = tuple(op_classes)

    def apply(self, fgraph: FunctionGraph) -> int:
        attach_destroy_handler(fgraph)
        n = 0
        for node in fgraph.toposort():
            op = node.op
            if (node not in fgraph.apply_nodes or type(op) not in self.op_classes
                    or op.inplace):
                continue
            first = node.inputs[0]
            if node.inputs.count(first) != 1 or why_not_destroyable(fgraph, first, node):
                continue
            try:
                new = type(op)(inplace=True).make_node(*node.inputs).outputs
                new[0].owner.tag.__dict__.update(node.tag.__dict__)
                replace_validate(fgraph, list(zip(node.outputs, new)), reason=self.name)
                n += 1
            except (InconsistencyError, TypeError):  # refused: the node stays as it was
                continue
        return n


def register_first_input_inplace(name: str, position: float, op_classes: Sequence[type]
                                 ) -> FirstInputInplace:
    """Register a FirstInputInplace pass at `position` with the tags fast_run and inplace."""
    rewriter = FirstInputInplace(name, op_classes)
    optdb.register(name, rewriter, position, "fast_run", "inplace")
    return rewriter
