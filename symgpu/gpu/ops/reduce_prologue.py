"""A reduction computes its input itself: an output of a fused elementwise kernel that only a
reduction reads becomes that reduction's pre-op, recomputed from the kernel's own inputs,
where that moves fewer bytes than writing the value and reading it back.

Why: in a mixed-precision training step the backward kernel of an activation (or of a layer
norm) computes the gradient in float32 and writes it twice: cast to half for the next
product, and in float32 for the bias (or gain) gradient, a column sum. The float32 copy is a
full-size array written once and read once; the kernel's inputs it comes from are half
arrays and broadcast vectors. `gpu_careduce_pre_op` folds a single-output kernel into its
reduction; fusion has by then joined the two casts into one kernel with two outputs, so it
cannot. This pass takes the output read by the reduction out of that kernel and gives its
program to the reduction (GpuCAReduce's ``pre_scalar_op``), over the inputs it needs.

The estimate (symgpu/tensor/rewriting/recompute.py's, for a single reader): the value's
write and read against the full-size inputs the reduction then reads (a broadcast input, a
bias or a row statistic, counts nothing); small programs only, never a random draw.
"""
from __future__ import annotations

from symgpu.gpu.ops.careduce import GpuCAReduce, careduce_supported
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.composite import CompositeBuilder
from symgpu.tensor.rewriting.recompute import (MAX_STEPS, full_bytes, needed_slots,
                                               producer_without, program, replay,
                                               rewrite_outputs_until_stable)

__all__ = ["gpu_reduce_prologue"]


def _reduction_reader(fgraph: FunctionGraph, producer: Apply, j: int) -> Apply | None:
    """The GpuCAReduce without a pre-op that is the only reader of output `j`."""
    clients = fgraph.clients.get(producer.outputs[j], [])
    if len(clients) != 1:
        return None
    reader, _ = clients[0]
    if reader == "output" or type(reader.op) is not GpuCAReduce or \
            reader.op.pre_scalar_op is not None or reader.inputs != [producer.outputs[j]]:
        return None
    return reader


def _worth_it(producer: Apply, j: int) -> bool:
    comp = program(producer.op)
    need = needed_slots(comp, [j])
    if sum(1 for s in need if s >= comp.first_step) > MAX_STEPS:
        return False
    ins = [v for i, v in enumerate(producer.inputs) if i in need]
    if any(v.owner is not None and getattr(v.owner.op, "draws_random", False) for v in ins):
        return False
    pattern = producer.outputs[j].type.broadcastable
    return sum(full_bytes(v, pattern) for v in ins) < 2 * full_bytes(producer.outputs[j],
                                                                      pattern)


def _reduction_with_program(reader: Apply, producer: Apply, j: int) -> Apply | None:
    """`reader` rebuilt to compute output `j` of `producer` from the inputs it needs."""
    comp = program(producer.op)
    need = needed_slots(comp, [j])
    used = [i for i in range(len(producer.inputs)) if i in need]
    b = CompositeBuilder()
    refs = {i: b.add_input(producer.inputs[i].dtype) for i in used}
    pre = b.build(replay(b, comp, refs, [j]))
    ins = [producer.inputs[i] for i in used]
    op = reader.op
    if not careduce_supported(op.scalar_op, pre, [v.dtype for v in ins]):
        return None
    try:
        node = GpuCAReduce(op.scalar_op, op.axis, op.dtype, pre,
                           op.post_scalar_op).make_node(*ins)
    except (TypeError, ValueError):
        return None
    return node if node.outputs[0].type == reader.outputs[0].type else None


def gpu_reduce_prologue(fgraph: FunctionGraph) -> int:
    """Apply the rule to every GpuElemwise of `fgraph` (a single-output one whenever its
    reduction is its only reader); returns how many values are now computed by their
    reduction."""

    def attempt(producer: Apply, j: int) -> list | None:
        if producer.outputs[j] in fgraph.outputs:
            return None
        alone = len(producer.outputs) == 1
        reader = _reduction_reader(fgraph, producer, j)
        # the last output left (the others taken by their reductions): the kernel goes
        # altogether, as gpu_careduce_pre_op folds a single-output kernel
        if reader is None or not (alone or _worth_it(producer, j)):
            return None
        new_reader = _reduction_with_program(reader, producer, j)
        new_producer = None if alone else producer_without(producer, j, GpuElemwise)
        if new_reader is None or (new_producer is None and not alone):
            return None
        pairs = [(reader.outputs[0], new_reader.outputs[0])]
        if new_producer is not None:
            kept = [o for k, o in enumerate(producer.outputs) if k != j]
            pairs += list(zip(kept, new_producer.outputs))
        return pairs
    return rewrite_outputs_until_stable(fgraph, GpuElemwise, attempt, "reduce_prologue")


# after the single-output fold (gpu_careduce_pre_op, 60), before the reductions' epilogues
# (60.5) and row groups (60.7), which then see the reductions with their pre-ops
optdb.register("gpu_reduce_prologue", gpu_reduce_prologue, 60.2, "fast_run", "gpu")
