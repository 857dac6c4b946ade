"""gpu_col_reduce_group: column reductions (every dim but the last) join the elementwise node
they read, or whose inputs they read, into one ``GpuColumnReduceGroup`` pass
(symgpu/gpu/ops/col_group.py); sibling column reductions of one operand join each other.

Why: a training step's bias and gain gradients are column sums over (batch * sequence) rows of
arrays that an elementwise node writes just before (the GELU backward, the layer norm
backward), or of that node's own expression recomputed from its inputs; separately, each sum
reads its megabytes again.  XLA fuses such reductions with their producer (multi-output
fusion); the GPT block's step spends about 230 us of 1.44 ms in those sums.

Which nodes: ``GpuCAReduce`` over every axis but the last of operands of two or more dims
(all of one ndim), add/mul/maximum/minimum, no epilogue (a reduction with one, as the SGD
update ``b - lr * d.sum(0)``, keeps its own kernel, which writes into the updated variable
under capture), a pre-op the generator supports.  Each one joins, in order:
  1. a ``GpuElemwise`` (not in place, every output spanning every position) reading every
     input the reduction reads (the bias gradient recomputing the map's expression: the
     kernel computes the shared arithmetic once);
  2. a ``GpuElemwise`` (the same kind) one of whose outputs the reduction reads: the member
     reads it as stored, and an output read only by the group is not written at all;
the first of these whose outputs none of the reduction's other inputs is computed from.
Reductions joining no map and sharing an input spanning every position (directly or through
one another) are siblings: one group of two or more.  A member's positions are the map's
where it reads a map output or an input of the map spanning every position (siblings: where
they share one); no input of a group may depend on an output of it.  In the default passes
(``fast_run``), after the row groups (60.7); ``optimizer_excluding=gpu_col_reduce_group``
turns it off.
"""
from __future__ import annotations

from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.col_group import ColMember, GpuColumnReduceGroup
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.row_group_rewrite import computed_from
from symgpu.gpu.runtime.codegen.col_group import COL_GROUP_REDUCIBLE
from symgpu.gpu.runtime.codegen.scalar import supports_scalar_op
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import try_replace
from symgpu.graph.rewriting.db import optdb

__all__ = ["gpu_col_reduce_group"]


def _full(v: Variable) -> bool:
    return not any(v.broadcastable)


def _candidate(node: Apply) -> bool:
    op = node.op
    if type(op) is not GpuCAReduce or op.post_scalar_op is not None \
            or op.scalar_op.name not in COL_GROUP_REDUCIBLE:
        return False
    nd = node.inputs[0].ndim
    if nd < 2 or op._axes(nd) != tuple(range(nd - 1)) or any(v.ndim != nd for v in node.inputs):
        return False
    if not any(_full(v) for v in node.inputs):
        return False
    dtypes = [v.dtype for v in node.inputs]
    return op.pre_scalar_op is None or supports_scalar_op(op.pre_scalar_op, dtypes)


def _map_node(node: Apply | None, nd: int) -> bool:
    """Whether ``node`` can be a group's map: a GpuElemwise not in place whose outputs all
    span every position (of ndim ``nd``) and whose scalar op the generator supports."""
    if node is None or type(node.op) is not GpuElemwise or node.op.inplace_pattern:
        return False
    if any(v.ndim != nd or not _full(v) for v in node.outputs) or \
            any(v.ndim != nd for v in node.inputs):
        return False
    return supports_scalar_op(node.op.scalar_op, [v.dtype for v in node.inputs])


def _map_anchor(fgraph: FunctionGraph, node: Apply, pos: dict) -> Apply | None:
    """The map a column reduction joins (rules 1 and 2 of the module docstring), or None:
    the first whose outputs none of the reduction's other inputs is computed from."""
    nd = node.inputs[0].ndim
    mine = set(node.inputs)
    readers = [c for v in node.inputs if _full(v) for c, _ in fgraph.clients.get(v, [])
               if c != "output" and _map_node(c, nd) and mine <= set(c.inputs)]
    producers = [v.owner for v in node.inputs if _map_node(v.owner, nd)]
    for emap in readers + producers:
        others = [v for v in node.inputs if v.owner is not emap]
        if not computed_from(others, set(emap.outputs), pos, pos[emap]):
            return emap
    return None


def _build(fgraph: FunctionGraph, emap: Apply | None, reds: list[Apply], pos: dict
           ) -> list[tuple[Variable, Variable]] | None:
    """The (old output, group output) pairs of one group (``emap``: its map, or None for
    sibling reductions), or None where it declines."""
    if emap is not None:
        # a member's positions are the map's where it reads a map output or a full map input
        proven = set(emap.outputs) | {v for v in emap.inputs if _full(v)}
        reds = [r for r in reds if any(v in proven for v in r.inputs if _full(v))]
    elif len(reds) < 2:
        return None
    if not reds:
        return None
    operands: list[Variable] = []

    def slot(v: Variable) -> int:
        for i, w in enumerate(operands):
            if w is v:
                return i
        operands.append(v)
        return len(operands) - 1

    map_args = tuple(slot(v) for v in emap.inputs) if emap is not None else ()
    map_outs = list(emap.outputs) if emap is not None else []
    members = [ColMember(r.op.scalar_op.name, r.op.pre_scalar_op,
                         tuple(-map_outs.index(v) - 1 if v in map_outs else slot(v)
                               for v in r.inputs), r.op.dtype) for r in reds]
    group_nodes = set(reds) | ({emap} if emap is not None else set())
    outs = {o for n in group_nodes for o in n.outputs}
    if computed_from(operands, outs, pos, min(pos[n] for n in group_nodes)):
        return None
    kept = tuple(any(c == "output" or c not in group_nodes for c, _ in fgraph.clients[o])
                 for o in map_outs)
    try:
        op = GpuColumnReduceGroup(members, emap.op.scalar_op if emap else None, map_args, kept)
        new = op(*operands)
    except (TypeError, ValueError):
        return None
    new = new if isinstance(new, list) else [new]
    olds = [o for o, k in zip(map_outs, kept) if k] + [r.outputs[0] for r in reds]
    if len(new) != len(olds) or any(a.type != b.type for a, b in zip(olds, new)):
        return None
    new[0].owner.tag.trace = getattr((emap or reds[0]).tag, "trace", [])
    return list(zip(olds, new))


def gpu_col_reduce_group(fgraph: FunctionGraph) -> int:
    """Group the column reductions of ``fgraph`` (see the module docstring); returns how many
    group nodes were made."""
    topo = fgraph.toposort()
    pos = {n: i for i, n in enumerate(topo)}
    groups: list[tuple[Apply | None, list[Apply]]] = []
    by_map: dict[Apply, list[Apply]] = {}
    siblings: list[tuple[set, list[Apply]]] = []    # (their full inputs, reductions)
    for node in topo:
        if not _candidate(node):
            continue
        emap = _map_anchor(fgraph, node, pos)
        if emap is not None:
            by_map.setdefault(emap, []).append(node)
            continue
        full = {v for v in node.inputs if _full(v)}
        joined = [g for g in siblings if g[0] & full]
        merged = (full.union(*(g[0] for g in joined)), [n for g in joined for n in g[1]] + [node])
        siblings = [g for g in siblings if not g[0] & full] + [merged]
    groups += list(by_map.items())
    groups += [(None, sorted(reds, key=pos.get)) for _, reds in siblings if len(reds) > 1]
    made = 0
    for emap, reds in groups:
        pairs = _build(fgraph, emap, reds, pos)
        if pairs is not None and try_replace(fgraph, pairs, "gpu_col_reduce_group"):
            made += 1
    return made


optdb.register("gpu_col_reduce_group", gpu_col_reduce_group, 60.8, "fast_run", "gpu")
