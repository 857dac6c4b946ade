"""gpu_producer_copies: a cheap elementwise result read by several kernels is recomputed in
each of them instead of being written once and read back.

The fusion pass (gpu_fusion) merges a producer into its consumers only when they can all
become one kernel; a reduction cannot join an elementwise kernel, so ``z = a + b`` read by a
row max, by ``exp(z - m)`` and by the loss stays a kernel of its own, whose output each
reader loads again. XLA duplicates such producers into every consumer. Here, a producer
qualifies when recomputing it costs no extra memory traffic: one output, at most one input
of the output's full shape (the others broadcast along some axis, as a bias or a row
statistic is), a small scalar expression, and every reader either an elementwise kernel
(the producer is inlined into its Composite) or a reduction without a pre-op (the producer
becomes its pre-op). All readers are rewritten at once or none is.

On the MLP step of benchmarks/gpu_speed.py this removes the logits' bias add and the
softmax's ``exp(z - m)``: two launches of the 28 in its CUDA graph.
``optimizer_excluding=gpu_producer_copies`` turns it off.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise, careduce_supported
from symgpu.scalar.composite import Composite, CompositeBuilder

__all__ = ["gpu_producer_copies", "copy_producer_into_readers"]

#: the most scalar operations a producer may have to be recomputed by each reader
MAX_PRODUCER_OPS = 8


def _scalar_ops(scalar_op: Any) -> int:
    return len(scalar_op.steps) if isinstance(scalar_op, Composite) else 1


def _full_inputs(node: Apply) -> int:
    """How many inputs have the output's shape (none of its axes broadcast where the
    output's is not): the arrays each reader would load again."""
    out = node.outputs[0].type.broadcastable
    return sum(1 for v in node.inputs
               if not any(b and not o for b, o in zip(v.type.broadcastable, out)))


def _qualifies(fgraph: FunctionGraph, node: Apply) -> list[tuple[Apply, str]] | None:
    """The readers of `node` (each with 'ew' or 'red'), when `node` may be copied into them."""
    op = node.op
    if type(op) is not GpuElemwise or op.inplace_pattern or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if out in fgraph.outputs or _full_inputs(node) > 1 or \
            _scalar_ops(op.scalar_op) > MAX_PRODUCER_OPS:
        return None
    clients = fgraph.clients.get(out, [])
    readers: dict[Apply, str] = {}
    for client, _ in clients:
        if not isinstance(client, Apply):
            return None
        cop = client.op
        if type(cop) is GpuElemwise and not cop.inplace_pattern:
            readers[client] = "ew"
        elif isinstance(cop, GpuCAReduce) and cop.pre_scalar_op is None and \
                cop.post_scalar_op is None and client.inputs[0] is out and \
                careduce_supported(cop.scalar_op, op.scalar_op,
                                   [v.dtype for v in node.inputs]):
            readers[client] = "red"
        else:
            return None
    return list(readers.items()) if len(readers) >= 2 else None


def _inlined(producer: Apply, reader: Apply) -> list[Variable] | None:
    """The outputs of one GpuElemwise computing `reader` with `producer` inlined."""
    out = producer.outputs[0]
    ext: list[Variable] = []
    for v in list(producer.inputs) + [v for v in reader.inputs if v is not out]:
        if not any(v is e for e in ext):
            ext.append(v)
    b = CompositeBuilder()
    refs = {id(v): b.add_input(v.dtype) for v in ext}
    (made,) = b.add_op(producer.op.scalar_op, [refs[id(v)] for v in producer.inputs])
    args = [made if v is out else refs[id(v)] for v in reader.inputs]
    comp = b.build(b.add_op(reader.op.scalar_op, args))
    try:
        new = GpuElemwise(comp).make_node(*ext).outputs
    except (TypeError, ValueError):
        return None
    if any(a.type != n.type for a, n in zip(reader.outputs, new)):
        return None
    return new


def copy_producer_into_readers(fgraph: FunctionGraph, node: Apply) -> bool:
    """Recompute `node` in each of its readers (all or none); True when done."""
    from symgpu.graph.rewriting import InconsistencyError, replace_validate
    readers = _qualifies(fgraph, node)
    if readers is None:
        return False
    pairs: list[tuple[Variable, Variable]] = []
    for reader, kind in readers:
        if kind == "red":
            cop = reader.op
            try:
                new = [GpuCAReduce(cop.scalar_op, cop.axis, cop.dtype,
                                   node.op.scalar_op)(*node.inputs)]
            except (TypeError, ValueError):
                return False
        else:
            new = _inlined(node, reader)
            if new is None:
                return False
        if any(a.type != n.type for a, n in zip(reader.outputs, new)):
            return False
        trace = getattr(reader.outputs[0].tag, "trace", None)
        for n in new:
            if trace:
                n.tag.trace = trace
        pairs += list(zip(reader.outputs, new))
    try:
        replace_validate(fgraph, pairs, reason="gpu_producer_copies")
    except InconsistencyError:
        return False
    return True


def gpu_producer_copies(fgraph: FunctionGraph) -> int:
    """Copy every qualifying producer into its readers, the first producers first (a reader
    that became a reduction's pre-op could not take another; a reader that took a producer
    may itself qualify next); returns how many were copied."""
    count = 0
    changed = True
    while changed:
        changed = False
        for node in fgraph.toposort():
            if node in fgraph.apply_nodes and copy_producer_into_readers(fgraph, node):
                count += 1
                changed = True
                break
    return count


# after gpu_fusion (49.5: chains already one kernel each), before gpu_careduce_pre_op (60)
optdb.register("gpu_producer_copies", gpu_producer_copies, 59.5, "fast_run", "gpu")
