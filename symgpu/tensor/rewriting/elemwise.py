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

from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import (GraphRewriter, InconsistencyError, optdb, replace_validate)
from symgpu.scalar.basic import ScalarOp
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.tensor.elemwise import Elemwise

__all__ = ["fuse_elemwise", "FusionRewriter", "MAX_FUSED_INPUTS"]

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
    return isinstance(var, Constant) and getattr(var, "data", None) is not None \
        and np.asarray(var.data).size == 1


def fuse_elemwise(fgraph: FunctionGraph, op_class: type = Elemwise,
                  make_op: Callable[[Any], Any] = Elemwise,
                  fusable: Callable[[Apply], bool] | None = None) -> int:
    """Fuse groups of `op_class` nodes into `make_op(Composite)` nodes; returns how many."""
    ok = fusable or (lambda n: _default_fusable(n, op_class))
    nodes = fgraph.toposort()
    index = {n: k for k, n in enumerate(nodes)}
    can = [ok(n) for n in nodes]
    if sum(can) < 2:
        return 0
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
    assigned: set[int] = set()
    count = 0
    for k in range(len(nodes) - 1, -1, -1):
        if not can[k] or k in assigned:
            continue
        group = _grow(fgraph, nodes, index, can, anc, desc, assigned, k)
        if len(group) < 2:
            continue
        assigned |= group
        if _fuse_group(fgraph, [nodes[j] for j in sorted(group)], make_op):
            count += 1
    return count


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


def _valid(fgraph, members: list[Apply], inside: set[Apply]) -> bool:
    ext, exported = _group_io(fgraph, members, inside)
    if not exported or len(ext) > MAX_FUSED_INPUTS:
        return False
    ndim = members[0].outputs[0].ndim
    bcast = tuple(all(v.broadcastable[d] for v in ext) for d in range(ndim))
    return all(o.broadcastable == bcast for o in exported)


def _grow(fgraph, nodes, index, can, anc, desc, assigned, start: int) -> set[int]:
    group = {start}
    mask = 1 << start
    A, D = anc[start], desc[start]
    ndim = nodes[start].outputs[0].ndim
    bcast = nodes[start].outputs[0].type.broadcastable
    changed = True
    while changed:
        changed = False
        cands = []
        for j in group:
            n = nodes[j]
            for inp in n.inputs:
                p = index.get(inp.owner)
                if p is not None:
                    cands.append(p)
            for o in n.outputs:
                for c, _ in fgraph.clients.get(o, ()):
                    if c != "output":
                        q = index.get(c)
                        if q is not None:
                            cands.append(q)
            for inp in n.inputs:  # siblings: other readers of the same (non-constant) input
                if isinstance(inp, Constant):
                    continue
                for c, _ in fgraph.clients.get(inp, ()):
                    if c != "output" and c.outputs[0].type.broadcastable == bcast:
                        q = index.get(c)
                        if q is not None:
                            cands.append(q)
        for c in cands:
            if c in group or c in assigned or not can[c] or nodes[c].outputs[0].ndim != ndim:
                continue
            bit = 1 << c
            nA, nD = A | anc[c], D | desc[c]
            if (nA & nD) & ~(mask | bit):
                continue  # a path would leave the group and come back
            trial = group | {c}
            members = [nodes[j] for j in sorted(trial)]
            if not _valid(fgraph, members, set(members)):
                # a producer whose value is also used elsewhere may still join later, once
                # the group grew; a group that is valid now stays valid without it
                continue
            group, mask, A, D = trial, mask | bit, nA, nD
            changed = True
    if len(group) > 1 and not _valid(fgraph, [nodes[j] for j in sorted(group)],
                                     {nodes[j] for j in group}):
        return {start}
    return group


def _fuse_group(fgraph, members: list[Apply], make_op) -> bool:
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
                data = np.asarray(inp.data)
                r = b.add_constant(data.reshape(-1)[0], data.dtype.name)
            args.append(r)
        for o, r in zip(n.outputs, b.add_op(n.op.scalar_op, args)):
            refs[o] = r
    comp = b.build([refs[o] for o in exported])
    try:
        new = make_op(comp).make_node(*ext).outputs
    except (TypeError, ValueError):
        return False
    if any(a.type != c.type for a, c in zip(exported, new)):
        return False
    trace = getattr(exported[0].owner.tag, "trace", None)
    if trace:
        new[0].owner.tag.trace = trace
        for o in new:
            o.tag.trace = trace
    try:
        replace_validate(fgraph, list(zip(exported, new)), reason="fusion")
    except InconsistencyError:
        return False
    return True


class FusionRewriter(GraphRewriter):
    """The fusion pass for one elementwise op class (Elemwise on the CPU)."""

    def __init__(self, op_class: type = Elemwise, make_op: Callable = Elemwise,
                 name: str = "fusion"):
        super().__init__(None, name)
        self.op_class, self.make_op = op_class, make_op

    def apply(self, fgraph: FunctionGraph) -> int:
        return fuse_elemwise(fgraph, self.op_class, self.make_op)


optdb.register("fusion", FusionRewriter(), 49, "fast_run", "fusion")
