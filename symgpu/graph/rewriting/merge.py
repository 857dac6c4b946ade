"""Merge: one node per distinct (op, inputs) and one constant per distinct value.

Common subexpressions appear everywhere in gradient graphs (each Elemwise.grad rebuilds its
output, `1 - p` is written twice...). Merging first makes later pattern rewrites see equal
things as the same variable, which is what lets `g / (1-p) * (1-p)` cancel.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Apply, Constant
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import GraphRewriter, InconsistencyError, replace_validate

__all__ = ["MergeRewriter", "merge_constants", "merge_nodes"]


def _constant_key(c: Constant) -> Any:
    try:
        key = c.signature()
        hash(key)
        return key
    except TypeError:
        return None


def merge_constants(fgraph: FunctionGraph) -> int:
    """Replace every constant by the first equal one (same type and value)."""
    first: dict[Any, Constant] = {}
    pairs = []
    for var in list(fgraph.variables):
        if not isinstance(var, Constant) or not fgraph.clients.get(var):
            continue
        key = _constant_key(var)
        if key is None:
            continue
        keep = first.setdefault(key, var)
        if keep is not var and keep.type == var.type:
            pairs.append((var, keep))
    for old, new in pairs:
        fgraph.replace(old, new, reason="merge")
    return len(pairs)


def merge_nodes(fgraph: FunctionGraph) -> int:
    """Replace the outputs of each node by those of an earlier node with equal op and inputs."""
    seen: dict[tuple, Apply] = {}
    n = 0
    for node in fgraph.toposort():
        if node not in fgraph.apply_nodes:
            continue
        op = node.op
        if getattr(op, "destroy_map", None):
            continue
        try:
            key = (op, tuple(node.inputs))
            other = seen.get(key)
        except TypeError:  # an op without a usable hash
            continue
        if other is None:
            seen[key] = node
            continue
        pairs = [(a, b) for a, b in zip(node.outputs, other.outputs) if a.type == b.type]
        if len(pairs) != len(node.outputs):
            continue
        try:
            replace_validate(fgraph, pairs, reason="merge")
            n += 1
        except InconsistencyError:
            pass
    return n


class MergeRewriter(GraphRewriter):
    """Merge equal constants, then equal nodes (one topological sweep cascades)."""

    def __init__(self) -> None:
        super().__init__(None, "merge")

    def apply(self, fgraph: FunctionGraph) -> int:
        return merge_constants(fgraph) + merge_nodes(fgraph)
