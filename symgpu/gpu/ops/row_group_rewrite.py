"""gpu_row_reduce_group: sibling and chained reductions over the last axis of the same rows
become one ``GpuRowReduceGroup`` launch (symgpu/gpu/ops/row_group.py).

Why: a layer norm's mean and variance (and, backward, its three row sums) are one tiny launch
each; in a captured loop body every launch costs ~3.5 us whatever its size, so the LSTM step
of benchmarks/rnn.py with four layer-normalised gates spends 8 launches forward and 12
backward on row reductions of (16, 128) slices.  XLA fuses such reductions into one kernel.

Which nodes: ``GpuCAReduce`` over the last axis only, of operands of two or more dims, with
add/mul/maximum/minimum, whose rows are provably the same (every kept dim: the same
variable, or equal by the graph's shape inference, looking through slices of the last axis
only, as the four gate slices ``z[:, k*H:(k+1)*H]`` of one matrix) and whose outputs have
the same broadcast pattern.  Members may not depend on one another, except that a member's
operand may be another member's result as one value per row (``DimShuffle{0,..,x}`` of it:
the variance reading the mean), computed in the same kernel after it.  Groups of two or more.

Where it is kept off: a member whose row length is known to exceed ``MAX_ROW`` (4096)
values.  The group reads each row with a warp (a block past 1024 values) and no split, as
GpuCAReduce's own planner does for rows of fewer than 4096 values when there are enough of
them; past that the planner's vector loads and split rows (few very long rows) win, and an
ungrouped reduction is at most one launch more.  Where the row length is not known at
compile time (a loop body's slices: lengths are shape expressions), the pass groups: that
is the loop-body case it is for, and the kernel still covers any length in one launch.

In the default passes (``fast_run``), after the pre-op fusion (60) and the epilogue fusion
(60.5) so that members carry theirs; ``optimizer_excluding=gpu_row_reduce_group`` turns it
off.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.row_group import GpuRowReduceGroup, RowMember
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.runtime.codegen.row_group import ROW_GROUP_REDUCIBLE
from symgpu.gpu.runtime.codegen.scalar import supports_scalar_op
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import try_replace
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.rewriting.shape_feature import inferred_shape, same_dim
from symgpu.tensor.shape_rules import dim_value

__all__ = ["gpu_row_reduce_group", "MAX_ROW", "computed_from", "chain_source", "row_tokens",
           "same_token", "slot"]

#: a member whose row is known to be longer stays a GpuCAReduce (see the module docstring)
MAX_ROW = 4096
_FULL = (None, None, None)


def chain_source(v: Variable) -> Variable | None:
    """x where ``v`` is ``DimShuffle{0,..,nd-2,x}(x)`` (one value per row of x), else None."""
    o = v.owner
    if o is None or type(o.op) is not GpuDimShuffle:
        return None
    nd = o.inputs[0].ndim
    return o.inputs[0] if o.op.new_order == tuple(range(nd)) + ("x",) else None


def _reduced(node: Apply) -> list[Variable]:
    return node.inputs[:node.op.n_reduced_inputs(len(node.inputs))]


def _candidate(fgraph: FunctionGraph, node: Apply) -> bool:
    op = node.op
    if type(op) is not GpuCAReduce or op.scalar_op.name not in ROW_GROUP_REDUCIBLE:
        return False
    ins = _reduced(node)
    nd = ins[0].ndim
    if nd < 2 or op.axis != (nd - 1,) or any(v.ndim != nd for v in ins):
        return False
    if op.post_scalar_op is not None and getattr(op.post_scalar_op, "nin", -1) < 1:
        return False
    for v in ins:
        shape = inferred_shape(fgraph, v)
        n = None if shape is None else dim_value(shape[-1])
        if n is not None and n > MAX_ROW:
            return False
    return True


def row_tokens(fgraph: FunctionGraph, v: Variable, d: int) -> list[tuple[str, Any]]:
    """What proves dim ``d`` (a kept dim) of ``v``: the variables it is a last-axis slice of
    (``v`` included) and their inferred dims."""
    out: list[tuple[str, Any]] = []
    while True:
        out.append(("var", v))
        shape = inferred_shape(fgraph, v)
        if shape is not None:
            out.append(("dim", shape[d]))
        o = v.owner
        if o is not None and type(o.op) is GpuSubtensor and len(o.op.idx_list) == v.ndim \
                and o.inputs[0].ndim == v.ndim \
                and all(tuple(e) == _FULL for e in o.op.idx_list[:-1]):
            v = o.inputs[0]
            continue
        return out


def same_token(a: tuple, b: tuple) -> bool:
    """Whether two of ``row_tokens``' proofs name the same dim."""
    if a[0] != b[0]:
        return False
    return a[1] is b[1] if a[0] == "var" else same_dim(a[1], b[1])


class _Member:
    """A candidate reduction: its node, its rows' proofs per kept dim, its chain inputs."""

    def __init__(self, fgraph: FunctionGraph, node: Apply) -> None:
        self.node = node
        ins = _reduced(node)
        nd = ins[0].ndim
        self.rows: list[list] = []
        for d in range(nd - 1):
            toks = []
            for v in ins:
                if not v.broadcastable[d] and chain_source(v) is None:
                    toks += row_tokens(fgraph, v, d)
            self.rows.append(toks)

    def same_rows(self, other: "_Member") -> bool:
        if self.node.outputs[0].broadcastable != other.node.outputs[0].broadcastable:
            return False
        for a, b in zip(self.rows, other.rows):
            if not a and not b:
                continue
            if not any(same_token(x, y) for x in a for y in b):
                return False
        return True


def computed_from(inputs: list[Variable], outputs: set, pos: dict, first: int) -> bool:
    """Whether any of ``inputs`` is one of ``outputs`` or computed from one, walking up the
    graph no further than the node at topological position ``first`` (``pos``: node ->
    position): the test a group node's inputs must fail (the column groups use it too)."""
    todo, seen = list(inputs), set()
    while todo:
        v = todo.pop()
        if v in outputs:
            return True
        o = v.owner
        if o is None or o in seen or pos.get(o, -1) < first:
            continue
        seen.add(o)
        todo.extend(o.inputs)
    return False


def _depends(node: Apply, group: list[_Member], pos: dict, first: int) -> bool:
    """Whether ``node`` reads a group member's output other than through a chain input."""
    outs = {m.node.outputs[0] for m in group}
    todo = [v for v in node.inputs
            if (chain_source(v) if v in _reduced(node) else None) not in outs]
    return computed_from(todo, outs, pos, first)


def slot(lst: list, v: Variable) -> int:
    """v's index in ``lst`` (by identity), appended where it is not there yet."""
    for i, w in enumerate(lst):
        if w is v:
            return i
    lst.append(v)
    return len(lst) - 1


def _build(group: list[_Member]) -> list[tuple[Variable, Variable]] | None:
    """The (old output, group output) pairs of one group node, or None where it declines."""
    rows: list[Variable] = []
    extra: list[Variable] = []
    members: list[RowMember] = []
    index = {m.node.outputs[0]: q for q, m in enumerate(group)}
    for m in group:
        op, ins = m.node.op, _reduced(m.node)
        args = []
        for v in ins:
            src = chain_source(v)
            args.append(-index[src] - 1 if src in index else slot(rows, v))
        post = tuple(slot(extra, v) for v in m.node.inputs[len(ins):])
        members.append(RowMember(op.scalar_op.name, op.pre_scalar_op, tuple(args),
                                 op.post_scalar_op, post, op.dtype))
    try:
        new = GpuRowReduceGroup(members, len(rows))(*rows, *extra)
    except (TypeError, ValueError):
        return None
    new = new if isinstance(new, list) else [new]
    olds = [m.node.outputs[0] for m in group]
    if any(a.type != b.type for a, b in zip(olds, new)):
        return None
    trace = getattr(group[0].node.tag, "trace", [])
    new[0].owner.tag.trace = trace
    return list(zip(olds, new))


def _supported(node: Apply, group_dtypes: list[str]) -> bool:
    op = node.op
    return op.pre_scalar_op is None or supports_scalar_op(op.pre_scalar_op, group_dtypes)


def gpu_row_reduce_group(fgraph: FunctionGraph) -> int:
    """Group the last-axis reductions of ``fgraph`` (see the module docstring); returns how
    many group nodes were made."""
    topo = fgraph.toposort()
    pos = {n: i for i, n in enumerate(topo)}
    groups: list[list[_Member]] = []
    for node in topo:
        if not _candidate(fgraph, node):
            continue
        cand = _Member(fgraph, node)
        for g in groups:
            if g[0].same_rows(cand) and not _depends(node, g, pos, pos[g[0].node]):
                g.append(cand)
                break
        else:
            groups.append([cand])
    made = 0
    for g in groups:
        if len(g) < 2:
            continue
        pairs = _build(g)
        if pairs is not None and try_replace(fgraph, pairs, "gpu_row_reduce_group"):
            made += 1
    return made


optdb.register("gpu_row_reduce_group", gpu_row_reduce_group, 60.7, "fast_run", "gpu")
