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
becomes its pre-op), read directly or through a GpuDimShuffle that only inserts broadcast
axes (a mean's divisor, cast from the batch's length, read by a vector kernel: the cast is
made by every kernel that reads it, not by a launch of its own). All readers are rewritten at
once or none is.

On the MLP step of benchmarks/gpu_speed.py this removes the logits' bias add and the
softmax's ``exp(z - m)``: two launches of the 28 in its CUDA graph.
``optimizer_excluding=gpu_producer_copies`` turns it off.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops.careduce import GpuCAReduce, careduce_supported
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep, try_replace
from symgpu.graph.rewriting.basic import same_typed_outputs
from symgpu.graph.rewriting.db import optdb
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


def _inserts_axes(node: Apply) -> bool:
    """A GpuDimShuffle that only inserts broadcast axes ('x'), keeping every axis in order:
    applied to each input of an elementwise node, it gives the node's result so shuffled."""
    if type(node.op) is not GpuDimShuffle:
        return False
    kept = [d for d in node.op.new_order if d != "x"]
    return kept == list(range(len(node.op.input_broadcastable)))


#: (reader, 'ew' or 'red', the axis-inserting GpuDimShuffle it reads the producer through)
Reader = tuple[Apply, str, "Apply | None"]


def _qualifies(fgraph: FunctionGraph, node: Apply) -> list[Reader] | None:
    """The readers of `node`, directly or through axis-inserting GpuDimShuffles (a scalar's
    ``x`` broadcast to a vector), when `node` may be copied into them."""
    op = node.op
    if type(op) is not GpuElemwise or op.inplace_pattern or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if out in fgraph.outputs or _full_inputs(node) > 1 or \
            _scalar_ops(op.scalar_op) > MAX_PRODUCER_OPS:
        return None
    readers: dict[Apply, Reader] = {}
    for client, _ in fgraph.clients.get(out, []):
        if not isinstance(client, Apply):
            return None
        via = None
        if _inserts_axes(client) and client.outputs[0] not in fgraph.outputs:
            via, reads = client, [c for c, _ in fgraph.clients.get(client.outputs[0], [])]
        else:
            reads = [client]
        read = via.outputs[0] if via is not None else out
        for reader in reads:
            if not isinstance(reader, Apply):
                return None
            kind = _reader_kind(reader, read, node)
            if kind is None or readers.get(reader, (reader, kind, via))[2] is not via:
                return None
            readers[reader] = (reader, kind, via)
    return list(readers.values()) if len(readers) >= 2 else None


def _reader_kind(reader: Apply, read: Variable, producer: Apply) -> str | None:
    rop = reader.op
    if type(rop) is GpuElemwise and not rop.inplace_pattern:
        return "ew"
    if isinstance(rop, GpuCAReduce) and rop.pre_scalar_op is None and \
            rop.post_scalar_op is None and reader.inputs[0] is read and \
            reader.inputs.count(read) == 1 and \
            careduce_supported(rop.scalar_op, producer.op.scalar_op,
                               [v.dtype for v in producer.inputs]):
        return "red"
    return None


def _operands(producer: Apply, via: Apply | None) -> list[Variable]:
    """The producer's inputs, shuffled as `via` shuffles its result."""
    if via is None:
        return list(producer.inputs)
    return [GpuDimShuffle(v.broadcastable, via.op.new_order)(v) for v in producer.inputs]


def _inlined(producer: Apply, reader: Apply, via: Apply | None) -> list[Variable] | None:
    """The outputs of one GpuElemwise computing `reader` with `producer` inlined."""
    read = via.outputs[0] if via is not None else producer.outputs[0]
    operands = _operands(producer, via)
    ext: list[Variable] = []
    for v in operands + [v for v in reader.inputs if v is not read]:
        if not any(v is e for e in ext):
            ext.append(v)
    b = CompositeBuilder()
    refs = {id(v): b.add_input(v.dtype) for v in ext}
    (made,) = b.add_op(producer.op.scalar_op, [refs[id(v)] for v in operands])
    args = [made if v is read else refs[id(v)] for v in reader.inputs]
    comp = b.build(b.add_op(reader.op.scalar_op, args))
    return same_typed_outputs(reader, lambda: GpuElemwise(comp).make_node(*ext).outputs)


def _copies(fgraph: FunctionGraph, node: Apply) -> list[tuple[Variable, Variable]] | None:
    """The replacements of every reader of `node` by one recomputing it, else None."""
    readers = _qualifies(fgraph, node)
    if readers is None:
        return None
    pairs: list[tuple[Variable, Variable]] = []
    for reader, kind, via in readers:
        if kind == "red":
            rop = reader.op
            new = same_typed_outputs(reader, lambda: [GpuCAReduce(
                rop.scalar_op, rop.axis, rop.dtype, node.op.scalar_op)(*_operands(node, via))])
        else:
            new = _inlined(node, reader, via)
        if new is None:
            return None
        trace = getattr(reader.outputs[0].tag, "trace", None)
        for n in new:
            if trace:
                n.tag.trace = trace
        pairs += list(zip(reader.outputs, new))
    return pairs


def copy_producer_into_readers(fgraph: FunctionGraph, node: Apply) -> bool:
    """Recompute `node` in each of its readers (all or none); True when done."""
    pairs = _copies(fgraph, node)
    return pairs is not None and try_replace(fgraph, pairs, "gpu_producer_copies")


def gpu_producer_copies(fgraph: FunctionGraph) -> int:
    """Copy every qualifying producer into its readers, sweep after sweep until none is left
    (a reader that took a producer is a new node, and may itself qualify next; producers go
    first-first, since a reader that became a reduction's pre-op could not take another);
    returns how many were copied."""
    count = 0
    while True:
        done = sweep(fgraph, _copies, "gpu_producer_copies")
        if not done:
            return count
        count += done


# after gpu_fusion (49.5: chains already one kernel each), before gpu_careduce_pre_op (60)
optdb.register("gpu_producer_copies", gpu_producer_copies, 59.5, "fast_run", "gpu")
