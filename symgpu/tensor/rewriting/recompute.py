"""Recompute instead of store: after fusion, an output of a fused elementwise kernel that
only other elementwise kernels read is recomputed inside each of them from the producer's
own inputs, where that moves fewer bytes than writing it once and reading it back.

Why: fusion exports every value that a node outside the group reads.  In a training step
the backward pass's elementwise kernels read the forward pass's intermediates, so a forward
activation kernel writes several full-size arrays (GELU's ``u = x + b``, ``tanh(...)`` and
``1 + tanh(...)``, in float32) only for the backward kernel to read them back; the forward
kernel's own inputs (a half-precision product and a bias) are a fraction of those bytes.
Recomputing costs a few arithmetic instructions in a kernel bound by memory.

The estimate counts full-size arrays by element size (a broadcast input such as a bias
counts nothing): the value's write plus one read per reader, against the producer's inputs
that each reader would newly read.  Small programs only (``MAX_STEPS``), and only where
every reader of the value is an elementwise kernel of the same class (a value that a
reduction, a product or the function's caller reads is stored anyway), and never a value
computed from a random draw (an op with ``draws_random``): a dropout mask is stored once,
as narrow as it can be, rather than drawn again by each reader.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import InconsistencyError, replace_validate
from symgpu.scalar.composite import Composite, CompositeBuilder

__all__ = ["recompute_exported_values", "MAX_STEPS", "program", "needed_slots", "replay",
           "full_bytes", "producer_without", "rewrite_outputs_until_stable"]

#: a value is recomputed only if its program has at most this many scalar steps
MAX_STEPS = 24
#: a reader may grow to at most this many inputs (the fused-kernel limit of fusion)
MAX_INPUTS = 64


def program(op: Any) -> Composite | None:
    sop = getattr(op, "scalar_op", None)
    return sop if isinstance(sop, Composite) else None


def needed_slots(comp: Composite, outs: Sequence[int]) -> set[int]:
    """The slots (inputs, constants, steps) that `comp`'s outputs `outs` depend on."""
    need, work = set(), [comp.out_slots[j] for j in outs]
    while work:
        s = work.pop()
        if s in need:
            continue
        need.add(s)
        if s >= comp.first_step:
            work.extend(comp.steps[s - comp.first_step][1])
    return need


def replay(b: CompositeBuilder, comp: Composite, in_refs: dict[int, Any],
            outs: Sequence[int]) -> list:
    """Refs of `comp`'s outputs `outs` built into `b` from refs of the inputs they need
    (only the steps those outputs depend on)."""
    need = needed_slots(comp, outs)
    slots: dict[int, Any] = {i: r for i, r in in_refs.items() if i in need}
    for k, (v, d) in enumerate(comp.constants):
        if comp.nin + k in need:
            slots[comp.nin + k] = b.add_constant(v, d)
    for s, (op, args) in enumerate(comp.steps):
        slot = comp.first_step + s
        if slot in need:
            slots[slot] = b.add_op(op, [slots[a] for a in args])[0]
    return [slots[comp.out_slots[j]] for j in outs]


def full_bytes(var: Variable, pattern: tuple) -> int:
    """Bytes per element of the iteration space that `var` costs to read: its item size if
    it is as large as `pattern`, 0 if it is broadcast along some axis (a bias, a scalar)."""
    bc = getattr(var.type, "broadcastable", None)
    if bc is None or len(bc) != len(pattern):
        return 0
    if any(b and not p for b, p in zip(bc, pattern)):
        return 0
    return np.dtype(var.dtype).itemsize


def _reader_with_value(reader: Apply, value: Variable, producer: Apply, j: int,
                       make_op: Any) -> Apply | None:
    """`reader` rebuilt to compute `value` (output `j` of `producer`) from the producer's
    inputs instead of reading it, or None where the rebuilt node would not type-check."""
    fcomp = program(producer.op)
    b = CompositeBuilder()
    ext: list[Variable] = []
    refs: dict[Variable, Any] = {}

    def ref(var: Variable) -> Any:
        if var not in refs:
            refs[var] = b.add_input(var.dtype)
            ext.append(var)
        return refs[var]
    need = needed_slots(fcomp, [j])
    vref = replay(b, fcomp, {i: ref(v) for i, v in enumerate(producer.inputs) if i in need},
                   [j])[0]
    args = [vref if v is value else ref(v) for v in reader.inputs]
    outs = b.add_op(reader.op.scalar_op, args)
    if len(ext) > MAX_INPUTS:
        return None
    try:
        node = make_op(b.build(outs)).make_node(*ext)
    except (TypeError, ValueError):
        return None
    if any(a.type != c.type for a, c in zip(reader.outputs, node.outputs)):
        return None
    return node


def producer_without(producer: Apply, drop: int, make_op: Any) -> Apply | None:
    """`producer` without its output `drop`."""
    comp = program(producer.op)
    keep = [k for k in range(comp.nout) if k != drop]
    b = CompositeBuilder()
    in_refs = {i: b.add_input(v.dtype) for i, v in enumerate(producer.inputs)}
    outs = replay(b, comp, in_refs, keep)
    # inputs the remaining outputs no longer read stay (dropping them would renumber slots
    # for no kernel saving: an unread input costs one pointer argument)
    try:
        node = make_op(b.build(outs)).make_node(*producer.inputs)
    except (TypeError, ValueError):
        return None
    kept = [producer.outputs[k] for k in keep]
    if any(a.type != c.type for a, c in zip(kept, node.outputs)):
        return None
    return node


def _worth_it(fgraph: FunctionGraph, producer: Apply, j: int, readers: list[Apply]) -> bool:
    comp = program(producer.op)
    need = needed_slots(comp, [j])
    if sum(1 for s in need if s >= comp.first_step) > MAX_STEPS:
        return False
    if any(v.owner is not None and getattr(v.owner.op, "draws_random", False)
           for i, v in enumerate(producer.inputs) if i in need):
        return False        # a value of a random draw: the draw is made (and read) once
    value = producer.outputs[j]
    pattern = value.type.broadcastable
    saved = full_bytes(value, pattern) * (1 + len(readers))
    cost = 0
    for r in readers:
        have = set(r.inputs)
        cost += sum(full_bytes(v, pattern) for i, v in enumerate(producer.inputs)
                    if i in need and v not in have)
    return cost < saved


def rewrite_outputs_until_stable(fgraph: FunctionGraph, op_class: type, attempt: Any,
                                 reason: str, min_outputs: int = 1) -> int:
    """Sweep the fused `op_class` nodes (not in place, with a Composite program and at least
    `min_outputs` outputs) and their outputs; ``attempt(producer, j)`` gives the
    replacement pairs for output j or None. Each accepted replacement restarts the sweep
    (the graph changed); returns how many were made. What recompute_exported_values and
    the GPU's reduce prologue (symgpu/gpu/ops/reduce_prologue.py) share."""
    count = 0
    changed = True
    while changed:
        changed = False
        for producer in fgraph.toposort():
            if type(producer.op) is not op_class or producer.op.inplace_pattern or \
                    program(producer.op) is None or len(producer.outputs) < min_outputs:
                continue
            for j in range(len(producer.outputs)):
                pairs = attempt(producer, j)
                if not pairs:
                    continue
                try:
                    replace_validate(fgraph, pairs, reason=reason)
                except InconsistencyError:
                    continue
                count += 1
                changed = True
                break
            if changed:
                break
    return count


def recompute_exported_values(fgraph: FunctionGraph, op_class: type, make_op: Any) -> int:
    """Apply the rule to every fused `op_class` node of `fgraph` (fused nodes built with
    `make_op`); returns how many values are now recomputed instead of stored."""

    def attempt(producer: Apply, j: int) -> list | None:
        value = producer.outputs[j]
        readers = [c for c, _ in fgraph.clients.get(value, [])]
        if not readers or any(c == "output" or c is producer or type(c.op) is not op_class
                              or c.op.inplace_pattern or program(c.op) is None
                              and not hasattr(c.op, "scalar_op") for c in readers):
            return None
        readers = list(dict.fromkeys(readers))
        if not _worth_it(fgraph, producer, j, readers):
            return None
        new_readers = [_reader_with_value(r, value, producer, j, make_op) for r in readers]
        new_producer = producer_without(producer, j, make_op)
        if new_producer is None or any(n is None for n in new_readers):
            return None
        pairs = [(o, n) for r, nr in zip(readers, new_readers)
                 for o, n in zip(r.outputs, nr.outputs)]
        kept = [o for k, o in enumerate(producer.outputs) if k != j]
        return pairs + list(zip(kept, new_producer.outputs))
    return rewrite_outputs_until_stable(fgraph, op_class, attempt, "recompute", min_outputs=2)
