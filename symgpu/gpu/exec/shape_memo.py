"""The host nodes that compute only from the shapes of a call's inputs, run once per new set
of shapes: the runner's shape memo (graphs.Runner).

Why: a compiled GPU step keeps on the host the arithmetic of shapes that its reshapes,
slices and graph parameters need (``Shape_i`` of a weight, integer products, ``MakeVector``).
Replaying a CUDA graph, the runner still ran each such node every call: 43 of them in
benchmarks/half_symgpu.py's GPT block, most of the host time of a call (a cProfile on the
H200: 93-161 us to queue a step), the same values from the same shapes every time.

Which nodes: host ops that are pure functions of their inputs (``Shape_i``, ``Shape``,
``MakeVector``, a non-destructive ``Elemwise`` of a deterministic scalar op), whose inputs
are constants, earlier memo nodes' outputs, or (for the shape reads alone) the function's
own inputs, read for their shape.  Their outputs may not be function outputs (a caller
could keep and change the array) nor overwritten or viewed by a later node.  Such nodes need nothing
computed in the call, so the memo runs them all where the first of them ran; a call whose
inputs have the shapes of the last call's restores their last outputs instead.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Constant
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.shape import Shape, Shape_i

__all__ = ["memo_nodes", "ShapeMemoStep", "with_shape_memo"]

_PURE = (Shape_i, Shape, MakeVector, Elemwise)

#: read when a runner is built: False keeps every node a plain step of its own (A/B timing)
ENABLED = True


def _pure(op: Any) -> bool:
    """Whether ``op`` is one of the host ops whose outputs depend on their inputs alone."""
    if type(op) not in _PURE or getattr(op, "destroy_map", None):
        return False
    if type(op) is Elemwise:
        return not op.inplace_pattern and getattr(op.scalar_op, "deterministic", True)
    return True


def memo_nodes(nodes: list, fgraph: Any, allowed: set | None = None) -> list[int]:
    """The positions in ``nodes`` (the VM's order) of the nodes the memo may take (among
    ``allowed`` positions: the runner's one-node plain steps)."""
    inputs, outputs = set(fgraph.inputs), set(fgraph.outputs)
    # values a later node overwrites, or views (a view could be overwritten in turn)
    changed = {n.inputs[i] for n in nodes for m in ("destroy_map", "view_map")
               for ins in (getattr(n.op, m, None) or {}).values() for i in ins}
    made: set = set()
    taken: list[int] = []
    for i, node in enumerate(nodes):
        if allowed is not None and i not in allowed or not _pure(node.op):
            continue
        if type(node.op) in (Shape_i, Shape):
            ok = node.inputs[0] in inputs or isinstance(node.inputs[0], Constant)
        else:
            ok = all(isinstance(v, Constant) or v in made for v in node.inputs)
        if ok and not any(v in outputs or v in changed for v in node.outputs):
            taken.append(i)
            made.update(node.outputs)
    return taken


def _shape(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    return shape if shape is not None else np.shape(value)


class ShapeMemoStep:
    """One runner step for the memo nodes (``memo_nodes``), at the first one's place: on a
    call whose shape sources have the last call's shapes, their last outputs go back into
    the cells that later nodes read; else their thunks run (``current``: the one running,
    for the error's node) and the outputs are kept.  Cells only memo nodes read are emptied
    after, as the plain steps' garbage collection did."""

    __slots__ = ("current", "first", "thunks", "indices", "sources", "kept", "dead", "key",
                 "values")

    def __init__(self, indices: list[int], thunks: list[Callable], sources: list[list],
                 out_cells: list[list], dead: list[list]) -> None:
        self.indices, self.thunks = indices, thunks
        self.current = self.first = indices[0]
        #: the cells of the function inputs whose shapes the memo nodes read
        self.sources = sources
        dead_ids = {id(c) for c in dead}
        #: the output cells read after the memo (restored on a hit)
        self.kept = [c for c in out_cells if id(c) not in dead_ids]
        self.dead = dead
        self.key: Any = None
        self.values: list = []

    def run(self) -> None:
        try:    # arrays, host or device (a Python scalar input has no .shape)
            key = tuple([c[0].shape for c in self.sources])
        except AttributeError:
            key = tuple([_shape(c[0]) for c in self.sources])
        if key == self.key:
            for c, v in zip(self.kept, self.values):
                c[0] = v
            return
        self.key = None
        for i, thunk in zip(self.indices, self.thunks):
            self.current = i
            thunk()
        self.current = self.first
        self.values = [c[0] for c in self.kept]
        self.key = key
        for c in self.dead:
            c[0] = None


def with_shape_memo(steps: list, plain_type: type, nodes: list, thunks: list, sm: dict,
                    fgraph: Any) -> list:
    """``steps`` with the memo nodes' plain steps (of ``plain_type``: one node, its thunk,
    its dead cells) replaced by one ShapeMemoStep where the first of them was; unchanged
    where there is none."""
    if not ENABLED:
        return steps
    plain = {st.current: st for st in steps if type(st) is plain_type}
    taken = memo_nodes(nodes, fgraph, set(plain))
    if not taken:
        return steps
    mine = set(taken)
    sources: list = []
    for i in taken:
        node = nodes[i]
        if type(node.op) in (Shape_i, Shape) and not isinstance(node.inputs[0], Constant):
            cell = sm[node.inputs[0]]
            if all(c is not cell for c in sources):
                sources.append(cell)
    outs = [sm[v] for i in taken for v in nodes[i].outputs]
    # the memo runs where its first node was: a cell freed after a later memo node (its last
    # reader) stays alive where another node read it between the two places (a shape read's
    # input too)
    read_after = {id(sm[v]) for j in range(taken[0] + 1, len(nodes)) if j not in mine
                  for v in nodes[j].inputs if v in sm}
    dead = [c for i in taken for c in plain[i].dead if id(c) not in read_after]
    memo = ShapeMemoStep(taken, [thunks[i] for i in taken], sources, outs, dead)
    out: list = []
    for st in steps:
        if type(st) is plain_type and st.current in mine:
            if st.current == taken[0]:
                out.append(memo)
            continue
        out.append(st)
    return out
