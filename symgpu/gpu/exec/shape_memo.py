"""The host nodes that compute only from the shapes of a call's inputs, run once per new set
of shapes: the runner's shape memo (graphs.Runner).

Why: a compiled GPU step keeps on the host the arithmetic of shapes that its reshapes,
slices and graph parameters need (``Shape_i`` of a weight, integer products, ``MakeVector``).
Replaying a CUDA graph, the runner still ran each such node every call: 43 of them in
benchmarks/half_symgpu.py's GPT block, most of the host time of a call (a cProfile on the
H200: 93-161 us to queue a step), the same values from the same shapes every time.

Which nodes: host ops that are pure functions of their inputs (the shape reads: ``Shape_i``,
``Shape`` and every op declaring ``shape_read``, as ``GpuShape_i`` of a GPU shared variable;
``MakeVector``; a host ``DimShuffle``; a non-destructive ``Elemwise`` of a deterministic
scalar op), whose inputs are constants, earlier memo nodes' outputs, or (for the shape reads
alone) the function's own inputs, read for their shape.  Their outputs may not change after
they are made: no function output (a caller could keep and change the array), nothing a
later node overwrites, nor a view of either.  Such nodes need nothing computed in the call,
so the memo runs them all where the first of them ran; a call whose inputs have the shapes
of an earlier call's restores the outputs computed then instead.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.basic import Constant
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.elemwise import DimShuffle, Elemwise

__all__ = ["memo_nodes", "ShapeMemoStep", "with_shape_memo"]

#: the ops whose outputs depend on their inputs alone, besides the shape reads (a host
#: DimShuffle is a view: taken where nothing changes it, as every memo value)
_PURE = (MakeVector, Elemwise, DimShuffle)

#: read when a runner is built: False keeps every node a plain step of its own (A/B timing)
ENABLED = True
#: sets of shapes a memo keeps the values of (a new length per call: the lengths of a
#: data set, each met again); past that it starts again from none
MAX_SHAPE_SETS = 128


def _shape_read(op: Any) -> bool:
    """Whether ``op``'s value is its input's shape or one of its lengths (host or GPU input:
    the memo tested host ``Shape_i`` alone, and a GPU step's shapes are ``GpuShape_i``)."""
    return getattr(op, "shape_read", None) in ("dim", "all")


def _pure(op: Any) -> bool:
    """Whether ``op`` is one of the host ops whose outputs depend on their inputs alone."""
    if getattr(op, "destroy_map", None):
        return False
    if _shape_read(op):
        return True
    if type(op) not in _PURE:
        return False
    if type(op) is Elemwise:
        return not op.inplace_pattern and getattr(op.scalar_op, "deterministic", True)
    return True


def _changed(nodes: list, outputs: Sequence[Any]) -> set:
    """The values that may change after they are made: those a node overwrites, the
    function's outputs (the caller may write into them), and what any of these views."""
    viewed: dict = {}
    changed = set(outputs)
    for n in nodes:
        for k, ins in (getattr(n.op, "view_map", None) or {}).items():
            viewed.setdefault(n.outputs[k], []).extend(n.inputs[i] for i in ins)
        changed.update(n.inputs[i] for ins in (getattr(n.op, "destroy_map", None) or {}).values()
                       for i in ins)
    stack = list(changed)
    while stack:
        for v in viewed.get(stack.pop(), ()):
            if v not in changed:
                changed.add(v)
                stack.append(v)
    return changed


def memo_nodes(nodes: list, fgraph: Any, allowed: set | None = None) -> list[int]:
    """The positions in ``nodes`` (the VM's order) of the nodes the memo may take (among
    ``allowed`` positions: the runner's one-node plain steps)."""
    inputs = set(fgraph.inputs)
    changed = _changed(nodes, fgraph.outputs)
    made: set = set()
    taken: list[int] = []
    for i, node in enumerate(nodes):
        if allowed is not None and i not in allowed or not _pure(node.op):
            continue
        if _shape_read(node.op):
            ok = node.inputs[0] in inputs or isinstance(node.inputs[0], Constant)
        else:
            ok = all(isinstance(v, Constant) or v in made for v in node.inputs)
        if ok and not any(v in changed for v in node.outputs):
            taken.append(i)
            made.update(node.outputs)
    return taken


def _shape(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    return shape if shape is not None else np.shape(value)


class ShapeMemoStep:
    """One runner step for the memo nodes (``memo_nodes``), at the first one's place: on a
    call whose shape sources have the shapes of a call met before (up to MAX_SHAPE_SETS of
    them: lengths that vary by call come back, each with its own values), their outputs
    then go back into the cells that later nodes read; else their thunks run (``current``:
    the one running, for the error's node) and the outputs are kept.  Cells only memo nodes
    read are emptied after, as the plain steps' garbage collection did."""

    __slots__ = ("current", "first", "thunks", "indices", "sources", "kept", "dead", "memo",
                 "last")

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
        #: the sources' shapes -> the kept values computed from them (the same objects each
        #: time, and across sets where equal: a segment keys them by identity first, and a
        #: length that changes every call leaves a weight's shape the same object)
        self.memo: dict[tuple, list] = {}
        #: the values of the last set made (a new set takes their objects where equal)
        self.last: list | None = None

    def run(self) -> None:
        try:    # arrays, host or device (a Python scalar input has no .shape)
            key = tuple([c[0].shape for c in self.sources])
        except AttributeError:
            key = tuple([_shape(c[0]) for c in self.sources])
        values = self.memo.get(key)
        if values is not None:
            for c, v in zip(self.kept, values):
                c[0] = v
            return
        for i, thunk in zip(self.indices, self.thunks):
            self.current = i
            thunk()
        self.current = self.first
        if len(self.memo) >= MAX_SHAPE_SETS:
            self.memo.clear()
        values = [c[0] for c in self.kept]
        last = self.last
        if last is not None:    # equal values keep their objects: keys read them by identity
            for k, (c, v, old) in enumerate(zip(self.kept, values, last)):
                if v is not old and _equal(v, old):
                    values[k] = c[0] = old
        self.memo[key] = self.last = values
        for c in self.dead:
            c[0] = None


def _equal(a: Any, b: Any) -> bool:
    """Whether two host values are the same value of the same type (a memo value of one set
    of shapes that another set computes again: a weight's shape while a length changes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return isinstance(a, (int, float, bool)) and a == b


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
        if _shape_read(node.op) and not isinstance(node.inputs[0], Constant):
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
