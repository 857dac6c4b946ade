"""In-place pass (position 75): let ops write into an input's memory where that is safe.

Safe means what the DestroyHandler (symgpu/graph/rewriting/destroy.py) enforces: the input
is an intermediate result read by nobody else, not a view of something that is, and never a
graph input (explicit, constant or shared — updated shared values included, so a call that
raises leaves them untouched). Elemwise outputs reuse an input of the same type; Gemv/Gemm
accumulate into their y/C.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import (GraphRewriter, InconsistencyError, attach_destroy_handler,
                                    optdb, replace_validate, why_not_destroyable)
from symgpu.tensor.blas import Gemm, Gemv, Ger
from symgpu.tensor.elemwise import Elemwise

__all__ = ["InplaceRewriter", "make_inplace", "inplace_elemwise_op"]


def _candidates(fgraph, node, out_index: int, taken: set[int]) -> list[int]:
    out = node.outputs[out_index]
    found = []
    for i, inp in enumerate(node.inputs):
        if i in taken or inp.type != out.type or node.inputs.count(inp) != 1:
            continue
        if why_not_destroyable(fgraph, inp, node) is None:
            found.append(i)
    return found


def inplace_elemwise_op(fgraph: FunctionGraph, node: Any) -> Any:
    """The in-place version of the elementwise `node`'s op (each output writing into the
    first input the destroy handler lets it take), or None; the op class is kept (its
    constructor takes (scalar_op, inplace_pattern, name), as Elemwise's)."""
    op = node.op
    if op.inplace_pattern or node.outputs[0].ndim == 0:
        # (0-d results: a fresh scalar is cheaper than writing into an input)
        return None
    pattern: dict[int, int] = {}
    for o in range(len(node.outputs)):
        cands = _candidates(fgraph, node, o, set(pattern.values()))
        if cands:
            pattern[o] = cands[0]
    return type(op)(op.scalar_op, pattern, op.name) if pattern else None


def make_inplace(fgraph: FunctionGraph) -> int:
    """Switch every node that safely can to its in-place version; returns how many."""
    attach_destroy_handler(fgraph)
    n = 0
    for node in fgraph.toposort():
        if node not in fgraph.apply_nodes:
            continue
        op = node.op
        new_op = None
        if type(op) is Elemwise:
            new_op = inplace_elemwise_op(fgraph, node)
        elif type(op) in (Gemv, Gemm, Ger) and not op.inplace:
            if _candidates(fgraph, node, 0, set()) [:1] == [0]:
                new_op = type(op)(inplace=True)
        if new_op is None:
            continue
        try:
            new = new_op.make_node(*node.inputs).outputs
            new[0].owner.tag.__dict__.update(node.tag.__dict__)
            replace_validate(fgraph, list(zip(node.outputs, new)), reason="inplace")
            n += 1
        except (InconsistencyError, TypeError):
            continue
    return n


class InplaceRewriter(GraphRewriter):
    def __init__(self) -> None:
        super().__init__(None, "inplace")

    def apply(self, fgraph: FunctionGraph) -> int:
        return make_inplace(fgraph)


optdb.register("inplace", InplaceRewriter(), 75, "fast_run", "inplace")
