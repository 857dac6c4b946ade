"""Elementwise fusion (position 49): connected Elemwise nodes become one Elemwise whose
scalar op is a Composite, with one output per value still needed outside the group.

Why: on the CPU each node costs a VM dispatch and a fresh array; a Composite runs its steps
back to back in reused buffers. On the GPU it is one kernel instead of one per op.

Groups grow through producers, consumers and siblings (nodes reading the same input with
the same output pattern: one pass over the input instead of two). A group must stay *convex* (no path leaving the group and coming back, or the fused node
would depend on itself), and every value it exports must have the broadcast pattern of the
fused node's output. Convexity is checked with ancestor/descendant bitsets over the
topological order, so a group grows in O(1) big-int operations per candidate.

The pass is parametrised by the elementwise op class, so the GPU backend can run the same
algorithm over its own elementwise op: `fuse_elemwise(fgraph, GpuElemwise, GpuElemwise)`.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import (GraphRewriter, InconsistencyError, optdb, replace_validate)
from symgpu.scalar.basic import ScalarOp
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.tensor.elemwise import Elemwise

__all__ = ["fuse_elemwise", "fused_replacement", "FusionRewriter", "MAX_FUSED_INPUTS"]

#: a fused node takes at most this many inputs (GPU kernel parameter space)
MAX_FUSED_INPUTS = 64


def _default_fusable(node: Apply, op_class: type) -> bool:
    op = node.op
    if type(op) is not op_class or op.inplace_pattern:
        return False
    sop = op.scalar_op
    if not isinstance(sop, (ScalarOp, Composite)):
        return False
    return all(np.dtype(o.dtype).kind != "c" for o in node.outputs + node.inputs)


def _inlinable_constant(var: Variable) -> bool:
    """A one-element constant, or a device copy of one: it becomes a literal of the kernel."""
    const = constant_behind(var)
    return const is not None and getattr(const, "data", None) is not None \
        and np.asarray(const.data).size == 1


def fuse_elemwise(fgraph: FunctionGraph, op_class: type = Elemwise,
                  make_op: Callable[[Any], Any] = Elemwise,
                  fusable: Callable[[Apply], bool] | None = None,
                  inline_lone_constants: bool = False) -> int:
    """Fuse groups of `op_class` nodes into `make_op(Composite)` nodes; returns how many.

    With `inline_lone_constants` a node that fuses with nothing but reads a one-element
    constant becomes a Composite too, the constant a literal (the GPU's choice: a literal
    costs no argument, no upload and no buffer that in-place rewrites could take).

    After each fusion the reachability bitsets are rebuilt: one node standing for a group
    joins paths that went through different members, and a stale view would let a later
    group close a cycle through it."""
    ok = fusable or (lambda n: _default_fusable(n, op_class))
    tried: set[Apply] = set()
    count = 0
    while True:
        nodes, index, can, anc, desc = _analyse(fgraph, ok)
        if sum(can) < 2:
            return count
        assigned: set[int] = set()
        fused = False
        for k in range(len(nodes) - 1, -1, -1):
            if not can[k] or k in assigned or nodes[k] in tried:
                continue
            group = _grow(fgraph, nodes, index, can, anc, desc, assigned, k)
            if len(group) < 2 and not (inline_lone_constants and _reads_inlinable(nodes[k])):
                tried.add(nodes[k])
                continue
            assigned |= group
            if _fuse_group(fgraph, [nodes[j] for j in sorted(group)], make_op):
                count += 1
                fused = True
                break
            tried.update(nodes[j] for j in group)
        if not fused:
            return count


def _reads_inlinable(node: Apply) -> bool:
    return not isinstance(node.op.scalar_op, Composite) and \
        any(_inlinable_constant(i) for i in node.inputs)


def _analyse(fgraph, ok):
    """Topological order, index, fusable flags and ancestor/descendant bitsets."""
    nodes = fgraph.toposort()
    index = {n: k for k, n in enumerate(nodes)}
    can = [ok(n) for n in nodes]
    anc = [0] * len(nodes)
    for k, n in enumerate(nodes):
        a = 0
        for inp in n.inputs:
            j = index.get(inp.owner)
            if j is not None:
                a |= anc[j] | (1 << j)
        anc[k] = a
    desc = [0] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):
        d = 0
        for o in nodes[k].outputs:
            for c, _ in fgraph.clients.get(o, ()):
                j = index.get(c) if c != "output" else None
                if j is not None:
                    d |= desc[j] | (1 << j)
        desc[k] = d
    return nodes, index, can, anc, desc


def _group_io(fgraph, members: list[Apply], inside: set[Apply]):
    """(external inputs, exported outputs) of a group."""
    produced = {o for n in members for o in n.outputs}
    ext, seen = [], set()
    for n in members:
        for inp in n.inputs:
            if inp not in produced and inp not in seen and not _inlinable_constant(inp):
                seen.add(inp)
                ext.append(inp)
    exported = [o for n in members for o in n.outputs
                if any(c == "output" or c not in inside for c, _ in fgraph.clients.get(o, ()))]
    return ext, exported


def _grow(fgraph, nodes, index, can, anc, desc, assigned, start: int) -> set[int]:
    """The group grown from node `start` through producers, consumers and siblings.

    Validity is kept locally: every member must be at least as broadcastable as the group's
    output pattern B (so the fused output is B), and a member whose pattern is not B must be
    read only inside the group (only B-shaped values can be exported). A candidate refused
    for a reason that more members could lift (a path through an outside node, an outside
    reader) is retried once the group has grown."""
    out0 = nodes[start].outputs[0]
    ndim, B = out0.ndim, out0.type.broadcastable
    must = [d for d in range(ndim) if B[d]]
    group, mask = {start}, 1 << start
    A, D = anc[start], desc[start]
    inside = {nodes[start]}
    ext: dict[Variable, int] = {}

    def add_inputs(n: Apply, sign: int) -> None:
        for inp in n.inputs:
            if inp.owner not in inside and not _inlinable_constant(inp):
                ext[inp] = ext.get(inp, 0) + sign
                if ext[inp] <= 0:
                    del ext[inp]

    add_inputs(nodes[start], 1)

    def neighbours(j: int) -> list[int]:
        # Every B-patterned member must have the same run-time shape, so consumers and
        # siblings are reached only through a B-patterned value (which has that shape, since
        # undeclared broadcasting is refused): two readers of a broadcastable value may have
        # different shapes and must not share one iteration space.
        n = nodes[j]
        out = [index[i.owner] for i in n.inputs if i.owner in index]
        for o in n.outputs:
            if o.type.broadcastable == B:
                out += [index[c] for c, _ in fgraph.clients.get(o, ())
                        if c != "output" and c in index]
        for inp in n.inputs:  # siblings: other readers of the same (non-constant) input
            if constant_behind(inp) is None and inp.type.broadcastable == B:
                out += [index[c] for c, _ in fgraph.clients.get(inp, ())
                        if c != "output" and c in index
                        and getattr(c.outputs[0].type, "broadcastable", None) == B]
        return out

    work = deque(neighbours(start))
    deferred: set[int] = set()
    grew = False
    while work or (deferred and grew):
        if not work:
            work.extend(deferred)
            deferred.clear()
            grew = False
        c = work.popleft()
        if c in group or c in assigned or not can[c]:
            continue
        node = nodes[c]
        bc = node.outputs[0].type.broadcastable
        if len(bc) != ndim or not all(bc[d] for d in must):
            continue
        if bc != B and any(cl == "output" or (cl not in inside and cl is not node)
                           for o in node.outputs for cl, _ in fgraph.clients.get(o, ())):
            deferred.add(c)
            continue
        bit = 1 << c
        nA, nD = A | anc[c], D | desc[c]
        if (nA & nD) & ~(mask | bit):
            deferred.add(c)  # a path leaves the group and comes back (for now)
            continue
        n_ext = len(ext) + sum(1 for i in set(node.inputs) if i not in ext and i.owner not in inside
                               and not _inlinable_constant(i)) \
            - sum(1 for o in node.outputs if o in ext)
        if n_ext > MAX_FUSED_INPUTS:
            deferred.add(c)
            continue
        group.add(c)
        inside.add(node)
        mask, A, D = mask | bit, nA, nD
        for o in node.outputs:
            ext.pop(o, None)
        add_inputs(node, 1)
        work.extend(neighbours(c))
        grew = True
    return group


def _fuse_group(fgraph, members: list[Apply], make_op) -> bool:
    pairs = fused_replacement(fgraph, members, make_op)
    if pairs is None:
        return False
    try:
        replace_validate(fgraph, pairs, reason="fusion")
    except InconsistencyError:
        return False
    return True


def fused_replacement(fgraph, members: list[Apply], make_op) -> list | None:
    """[(exported value, fused value)] for fusing `members` (in topological order) into one
    `make_op(Composite)` node, or None where the fused node cannot be made (same types)."""
    inside = set(members)
    ext, exported = _group_io(fgraph, members, inside)
    b = CompositeBuilder()
    refs: dict[Variable, Any] = {}
    for v in ext:
        refs[v] = b.add_input(v.dtype)
    for n in members:
        args = []
        for inp in n.inputs:
            r = refs.get(inp)
            if r is None:
                data = np.asarray(constant_behind(inp).data)
                r = b.add_constant(data.reshape(-1)[0], data.dtype.name)
            args.append(r)
        for o, r in zip(n.outputs, b.add_op(n.op.scalar_op, args)):
            refs[o] = r
    comp = b.build([refs[o] for o in exported])
    try:
        new = make_op(comp).make_node(*ext).outputs
    except (TypeError, ValueError):
        return None
    if any(a.type != c.type for a, c in zip(exported, new)):
        return None
    trace = getattr(exported[0].owner.tag, "trace", None)
    if trace:
        new[0].owner.tag.trace = trace
        for o in new:
            o.tag.trace = trace
    return list(zip(exported, new))


class FusionRewriter(GraphRewriter):
    """The fusion pass for one elementwise op class (Elemwise on the CPU)."""

    def __init__(self, op_class: type = Elemwise, make_op: Callable = Elemwise,
                 name: str = "fusion"):
        super().__init__(None, name)
        self.op_class, self.make_op = op_class, make_op

    def apply(self, fgraph: FunctionGraph) -> int:
        return fuse_elemwise(fgraph, self.op_class, self.make_op)


optdb.register("fusion", FusionRewriter(), 49, "fast_run", "fusion")
