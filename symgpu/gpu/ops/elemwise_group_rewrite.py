"""The pass ``gpu_elemwise_group`` (77, after gpu_inplace: ``fast_run``): independent
GpuElemwise nodes into one GpuElemwiseGroup launch (gpu/ops/elemwise_group.py says why).

Two kinds of nodes are independent by construction, and those are the ones grouped:

* **sinks**: every output is read by nothing but the function's outputs (a parameter's
  update, at the end of a training step), or copied to the host for them: no node reads
  another's results (not an update reading an all-reduced gradient through its join: each
  runs when its own collective is in);
* **sources**: every input is a function input or a constant, seen through transfers and
  views, or host arithmetic on them and their lengths (the cast of a parameter to half at
  the start of a mixed-precision step; a loss's ``-1 / n`` made a one-element kernel).

A group of either kind reads no member's result, so it is acyclic and the members may run in
any order. A member's in-place input must be read by no other member, through no view
either (they run at once).
``optimizer_excluding=gpu_elemwise_group`` turns the pass off.
"""
from __future__ import annotations

from symgpu.gpu.ops.collectives import _GpuCollective
from symgpu.gpu.ops.comm_join import GpuCommJoin
from symgpu.gpu.ops.elemwise import KERNEL_PARAM_BYTES, GpuElemwise
from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup
from symgpu.gpu.placement.basic_ops import GpuFromHost, HostFromGpu
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import InconsistencyError, replace_validate
from symgpu.graph.rewriting.db import optdb
from symgpu.graph.traversal import sharing_memory

__all__ = ["gpu_elemwise_group", "MAX_MEMBERS"]

#: members of one group at most (each a branch of the kernel's dispatch)
MAX_MEMBERS = 64


def _only_returned(fgraph: FunctionGraph, var: Variable) -> bool:
    """Read by nothing but the function's outputs (or copies of it to the host that are)."""
    clients = fgraph.clients.get(var, [])
    return bool(clients) and all(
        c == "output" or isinstance(c.op, HostFromGpu) and
        all(cc == "output" for cc, _ in fgraph.clients.get(c.outputs[0], []))
        for c, _ in clients)


def _is_sink(fgraph: FunctionGraph, node: Apply) -> bool:
    """Read only as outputs, and not reading a collective's result (or its join): each
    update of a data-parallel step runs as soon as its gradient's all-reduce is in, while
    the others are still on the wire (gpu/ops/comm_join.py); a group would wait for the
    last."""
    return all(_only_returned(fgraph, o) for o in node.outputs) and not any(
        v.owner is not None and isinstance(v.owner.op, (GpuCommJoin, _GpuCollective))
        for v in node.inputs)


def _from_inputs(var: Variable, depth: int = 6) -> bool:
    """A function input or a constant, possibly uploaded or seen through views (a
    dimshuffle, a reshape: GPU ops viewing their first input, any other input on the
    host), or a host value computed from such values and their lengths (a mean's count,
    uploaded for a one-element kernel)."""
    if var.owner is None or isinstance(var, Constant):
        return True
    node = var.owner
    if depth == 0:
        return False
    if getattr(node.op, "shape_read", None):            # a length: no kernel's result
        return _from_inputs(node.inputs[0], depth - 1)
    if not is_gpu_var(var) and not getattr(node.op, "transfer", None):   # host arithmetic
        return all(_from_inputs(v, depth - 1) for v in node.inputs)
    views = isinstance(node.op, GpuFromHost) or (
        getattr(node.op, "view_map", None) == {0: [0]} and len(node.outputs) == 1
        and not any(is_gpu_var(v) for v in node.inputs[1:]))
    return views and _from_inputs(node.inputs[0], depth - 1)


def _is_source(node: Apply) -> bool:
    return all(_from_inputs(v) for v in node.inputs)


def _destroys(node: Apply) -> set:
    """The memory ``node`` overwrites: its in-place inputs and what they view."""
    return sharing_memory(node.inputs[i] for _, i in node.op.inplace_pattern)


def _reads(node: Apply) -> set:
    return sharing_memory(node.inputs)


def _param_bytes(node: Apply) -> int:
    """The group kernel's parameter bytes for a member (three int64, a pointer per
    operand)."""
    return 24 + 8 * (len(node.inputs) + len(node.outputs))


def _groups(fgraph: FunctionGraph) -> list[list[Apply]]:
    """Sinks and sources of the same context, in topological order, cut to the member and
    parameter limits; a member's in-place input read by another member starts a new one."""
    kinds: dict[tuple, list[list[Apply]]] = {}
    for node in fgraph.toposort():
        if type(node.op) is not GpuElemwise or not node.outputs:
            continue
        kind = "sink" if _is_sink(fgraph, node) else "source" if _is_source(node) else None
        if kind is None:
            continue
        runs = kinds.setdefault((kind, node.outputs[0].type.context_name), [[]])
        run = runs[-1]
        # (memory, not variables: a view of a destroyed input is the same memory)
        clash = any(_destroys(node) & _reads(m) or _destroys(m) & _reads(node) for m in run)
        if clash or len(run) >= MAX_MEMBERS or \
                sum(map(_param_bytes, run)) + _param_bytes(node) > KERNEL_PARAM_BYTES:
            run = []
            runs.append(run)
        run.append(node)
    return [run for runs in kinds.values() for run in runs if len(run) > 1]


def gpu_elemwise_group(fgraph: FunctionGraph) -> int:
    """Replace each group of independent GpuElemwise nodes (`_groups`) by one
    GpuElemwiseGroup; returns how many groups were made."""
    made = 0
    for run in _groups(fgraph):
        if not all(n in fgraph.apply_nodes for n in run):
            continue
        op = GpuElemwiseGroup([n.op for n in run],
                              [(len(n.inputs), len(n.outputs)) for n in run])
        new = op.make_node(*[v for n in run for v in n.inputs])
        for n in run:
            if hasattr(n.tag, "trace"):
                new.tag.trace = n.tag.trace
                break
        olds = [o for n in run for o in n.outputs]
        try:
            replace_validate(fgraph, list(zip(olds, new.outputs)), reason="gpu_elemwise_group")
        except InconsistencyError:
            continue
        made += 1
    return made


optdb.register("gpu_elemwise_group", gpu_elemwise_group, 77, "fast_run", "gpu")
