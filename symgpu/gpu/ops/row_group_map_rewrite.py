"""gpu_row_group_map: the elementwise nodes that read a row group's results join the group
(symgpu/gpu/ops/row_group.py) as its per-row applies and its row map.

Why: a layer norm's forward is its row group, then one or two GpuElemwise launches over the
same rows (the normalised, scaled, shifted, cast output; in a pre-norm block also the std per
row, which the backward reads): 2-3 launches where one kernel that has just read the row can
write the output (the bf16 GPT block of benchmarks/half_symgpu.py: 31.5 us and 33.3 us a
layer norm on an H200, measured before; the map's second read of the row, just reduced by the
same warp, mostly hits L1/L2 where a separate launch reads it from DRAM again).

Which nodes: a GpuElemwise reading a group's result (as it is, or as one value per row through
``DimShuffle{0,..,x}``) or an output already absorbed, its scalar op supported by the CUDA
renderer, and each of its other operands one value (an epilogue operand), or with the group's
rows (a row operand; proved as the group pass proves rows: the same variable or equal by the
shape inference in every kept dim that is not broadcast, so ``g`` of shape (1, 1, K) joins),
and none of them computed from the group's outputs or the nodes absorbed (that would be a
cycle).  A node with one value per row in and out becomes a per-row apply (any number, in
order); the first, in topological order, with full rows out becomes the map (one a group).
A node destructive on an operand that anything else reads stays apart, and so does a map a
column sum reads (or recomputes from its inputs): ``gpu_col_reduce_group`` joins it to that.
A group of any number of members takes them; a lone GpuCAReduce stays one (wrapping it in a
group of one would change every reduction-then-elementwise graph, the softmax gradient's
included, where other passes and their tests expect a GpuElemwise).

In the default passes (``fast_run``) right after ``gpu_row_reduce_group`` (60.7);
``optimizer_excluding=gpu_row_group_map`` turns it off.
"""
from __future__ import annotations

from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.row_group import GpuRowReduceGroup, RowApply, RowMember
from symgpu.gpu.ops.row_group_rewrite import (chain_source, computed_from, row_tokens,
                                              same_token, slot)
from symgpu.gpu.runtime.codegen.scalar import supports_scalar_op
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import try_replace
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.rewriting.shape_feature import inferred_shape

__all__ = ["gpu_row_group_map"]


class _Growing:
    """A group with the nodes absorbed so far: its members, operands, applies, and the graph
    variables whose values it computes (``values``: variable -> RowApply argument)."""

    def __init__(self, fgraph: FunctionGraph, node: Apply, members: list[RowMember],
                 rows: list[Variable], extra: list[Variable], outs: list[Variable]) -> None:
        self.fgraph, self.node = fgraph, node
        self.members, self.rows, self.extra = list(members), list(rows), list(extra)
        self.olds = list(outs)
        self.nd = rows[0].ndim
        self.kept = outs[0].broadcastable
        self.values: dict[Variable, tuple[str, int]] = {o: ("res", q) for q, o in enumerate(outs)}
        self.per_row: list[RowApply] = []
        self.row_map: RowApply | None = None
        self.per_row_nodes: list[Apply] = []
        self.map_node: Apply | None = None
        self.napp = 0
        # what proves each kept dim: the group's row operands along it
        self.proofs = [[t for v in rows if not v.broadcastable[d] for t in row_tokens(fgraph, v, d)]
                       for d in range(self.nd - 1)]

    def value(self, v: Variable) -> tuple[str, int] | None:
        """The group's own value ``v`` stands for (its result, or one seen as one per row)."""
        got = self.values.get(v)
        if got is None:
            src = chain_source(v)
            if src is not None and src.ndim == self.nd - 1:
                got = self.values.get(src)
        return got

    def has_rows(self, v: Variable) -> bool:
        """Whether every kept dim of ``v`` is broadcast or provably the group's."""
        for d in range(self.nd - 1):
            if v.broadcastable[d]:
                continue
            if self.kept[d]:
                return False
            if v.ndim == self.nd:
                toks = row_tokens(self.fgraph, v, d)
            else:    # a kept-shape operand: its own dims only (its last is a kept dim)
                shape = inferred_shape(self.fgraph, v)
                toks = [("var", v)] + ([("dim", shape[d])] if shape is not None else [])
            if not any(same_token(a, b) for a in toks for b in self.proofs[d]):
                return False
        return True


def _destroys_shared(fgraph: FunctionGraph, node: Apply) -> bool:
    """Whether ``node`` overwrites an operand that something else reads too."""
    for _, i in getattr(node.op, "inplace_pattern", ()):
        if len(fgraph.clients.get(node.inputs[i], ())) > 1:
            return True
    return False


def _column_summed(fgraph: FunctionGraph, node: Apply) -> bool:
    """Whether a reduction over every dim but the last reads ``node``'s output, or only
    inputs of ``node`` (recomputing it): ``gpu_col_reduce_group`` (60.8) joins the node to
    that sum, a launch and a read of the full array saved, which a row map would take away."""
    nd = node.outputs[0].ndim
    mine = set(node.inputs)
    for v in [*node.outputs, *node.inputs]:
        for c, _ in fgraph.clients.get(v, ()):
            if c == "output" or type(c.op) is not GpuCAReduce or c.inputs[0].ndim != nd or \
                    c.op._axes(nd) != tuple(range(nd - 1)):
                continue
            if v in node.outputs or set(c.inputs) <= mine:
                return True
    return False


def _arguments(g: _Growing, node: Apply, pos: dict, first: int
               ) -> tuple[list, list, list, str] | None:
    """(RowApply arguments, new row operands, new epilogue operands, 'per-row' or 'map') for
    ``node`` joining ``g``, or None where it may not."""
    outs = node.outputs
    nd_out, bcast = outs[0].ndim, outs[0].broadcastable
    if nd_out == g.nd - 1 and bcast == g.kept:
        kind = "per-row"
    elif nd_out == g.nd and bcast[:-1] == g.kept:
        kind = "per-row" if bcast[-1] else "map"
    else:
        return None
    if kind == "map" and (g.row_map is not None or _column_summed(g.fgraph, node)):
        return None
    rows, extra = list(g.rows), list(g.extra)
    args: list[tuple[str, int]] = []
    computed = set(g.values) | set(g.map_node.outputs if g.map_node is not None else ())
    for v in node.inputs:
        got = g.value(v)
        if got is not None:
            args.append(got)
            continue
        if computed_from([v], computed, pos, first):
            return None       # computed from the group: absorbing would make a cycle
        if all(v.broadcastable):
            args.append(("ex", slot(extra, v)))
        elif not g.has_rows(v):
            return None
        elif v.ndim == g.nd - 1:
            if v.broadcastable != g.kept:
                return None   # an epilogue operand is one value or of the kept shape
            args.append(("ex", slot(extra, v)))
        elif kind == "per-row" and not v.broadcastable[-1]:
            return None
        else:
            args.append(("row", slot(rows, v)))
    return args, rows, extra, kind


def _try(g: _Growing, node: Apply, pos: dict, first: int) -> bool:
    """Absorb ``node`` into ``g`` where it may join (see the module docstring)."""
    op = node.op
    if type(op) is not GpuElemwise or _destroys_shared(g.fgraph, node) or \
            not supports_scalar_op(op.scalar_op, [v.dtype for v in node.inputs]):
        return False
    got = _arguments(g, node, pos, first)
    if got is None:
        return False
    args, rows, extra, kind = got
    apply = RowApply(op.scalar_op, tuple(args), keep_axis=node.outputs[0].ndim == g.nd)
    per_row = g.per_row + [apply] if kind == "per-row" else g.per_row
    row_map = apply if kind == "map" else g.row_map
    new = _make(g, rows, extra, per_row, row_map)
    if new is None:
        return False
    n_before = len(g.members) + g.napp
    mine = new[n_before:n_before + len(node.outputs)] if kind == "per-row" else \
        new[-len(node.outputs):]
    if any(a.type != b.type for a, b in zip(node.outputs, mine)):
        return False
    g.rows, g.extra, g.per_row, g.row_map = rows, extra, per_row, row_map
    if kind == "map":
        g.map_node = node
        return True
    g.per_row_nodes.append(node)
    for j, o in enumerate(node.outputs):
        g.values[o] = ("app", g.napp + j)
    g.napp += len(node.outputs)
    return True


def _make(g: _Growing, rows: list, extra: list, per_row: list,
          row_map: RowApply | None) -> list[Variable] | None:
    """The new group node's outputs, or None where GpuRowReduceGroup refuses them."""
    try:
        new = GpuRowReduceGroup(g.members, len(rows), per_row, row_map)(*rows, *extra)
    except (TypeError, ValueError):
        return None
    new = new if isinstance(new, list) else [new]
    if any(a.type != b.type for a, b in zip(g.olds, new)):
        return None
    return new


def _grow(fgraph: FunctionGraph, g: _Growing, topo: list, pos: dict) -> bool:
    """Absorb every node that may join ``g``, in topological order, then replace; returns
    whether the graph changed."""
    first = pos[g.node]
    for node in topo[first + 1:]:
        if any(g.value(v) is not None for v in node.inputs):
            _try(g, node, pos, first)
    if not g.per_row_nodes and g.map_node is None:
        return False
    new = _make(g, g.rows, g.extra, g.per_row, g.row_map)
    if new is None:
        return False
    olds = g.olds + [o for n in g.per_row_nodes for o in n.outputs]
    olds += g.map_node.outputs if g.map_node is not None else []
    new[0].owner.tag.trace = getattr(g.node.tag, "trace", [])
    return try_replace(fgraph, list(zip(olds, new)), "gpu_row_group_map")


def gpu_row_group_map(fgraph: FunctionGraph) -> int:
    """Absorb the elementwise consumers of ``fgraph``'s row groups into them (see the module
    docstring); returns how many groups changed."""
    made = 0
    topo = fgraph.toposort()
    pos = {n: i for i, n in enumerate(topo)}
    for node in list(topo):
        if node not in fgraph.apply_nodes:
            continue
        op = node.op
        if type(op) is not GpuRowReduceGroup or op.per_row or op.row_map is not None:
            continue
        n = len(op.members)
        g = _Growing(fgraph, node, list(op.members), node.inputs[:op.n_row],
                     node.inputs[op.n_row:], node.outputs[:n])
        if _grow(fgraph, g, topo, pos):
            made += 1
            topo = fgraph.toposort()
            pos = {n: i for i, n in enumerate(topo)}
    return made


optdb.register("gpu_row_group_map", gpu_row_group_map, 60.75, "fast_run", "gpu")
