"""Lengths read inside a loop body, computed before the loop: `scan_pushout_shapes`.

Why: a step function that reads a length (``z.mean(axis=-1)`` divides by ``z.shape[-1]``,
its gradient too; ``x.reshape((x.shape[0], -1))``, ``T.zeros_like``...) keeps that read in
the body when ``z`` is computed per step, and with it the host arithmetic on the length (the
slice bounds of a gate, the cast of the count): on the GPU, a host op and an upload in every
step, so the loop cannot be captured as one CUDA graph and runs step by step.  Yet no length
in a loop body changes from step to step: a sequence's step has the sequence's shape without
its first axis, a state's tap the initial value's (the loop checks every step's result
against it), a non-sequence its own.  So every length the body reads is known before the
loop, from the outer inputs' shapes.

The pass, on every Scan node of the outer graph:
* answers each shape read of the body (`Shape`, `Shape_i`) from ``infer_shape`` all the way
  up to the body's inputs, whose lengths are new int64 placeholders;
* replaces the reads whose answer depends on those placeholders, non-sequences and constants
  only (a length that depends on a per-step value, ``x[:k[t]]``, stays);
* moves the loop-invariant work that this exposes out of the body (`hoist_invariants`, as
  `scan()` does when it builds the loop): the placeholders become the outer inputs' shape
  reads, and the body gets what it needs (a gate's width, a count as a float) as new
  non-sequences.
Run between the loop merge and the memory rewrites, before GPU placement sees the loop.
"""
from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Any

import numpy as np

from symgpu.graph.basic import Constant, Variable, io_toposort
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.body_lengths import BodyLengths, invariant
from symgpu.scan.inner import clone_with, hoist_invariants
from symgpu.scan.op import Scan
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.type import TensorConstant

__all__ = ["scan_pushout_shapes", "hoist_body_shapes"]

#: rounds of answering reads: a read whose answer goes through another op's shape input (an
#: Alloc of a length read from a per-step value) is answered once that read is
_ROUNDS = 4


def _as_vector(entries: tuple, like: Variable) -> Variable:
    values = [getattr(e, "data", None) if isinstance(e, Constant) else None for e in entries]
    if all(x is not None for x in values):
        return TensorConstant(like.type, np.asarray([int(x) for x in values], dtype="int64"))
    new = MakeVector("int64")(*entries)
    return new if new.type == like.type else like.type.convert_variable(new)


def _answer_reads(outputs: list, lengths: BodyLengths, allowed: set) -> dict:
    """{shape read output: its loop-invariant answer} over the body's graph."""
    replace: dict = {}
    for n in io_toposort([], outputs):
        kind = getattr(n.op, "shape_read", None)
        if kind not in ("dim", "all"):
            continue
        x = n.inputs[0]
        dims = lengths.dims(x)
        if dims is None:
            continue
        new = dims[n.op.i] if kind == "dim" else _as_vector(dims, n.outputs[0])
        if new is n.outputs[0] or not invariant(new, allowed | set(lengths.placeholders)):
            continue
        if new.type != n.outputs[0].type:
            new = n.outputs[0].type.convert_variable(new)
            if new is None:
                continue
        replace[n.outputs[0]] = new
    return replace


def hoist_body_shapes(fgraph: FunctionGraph, node: Any) -> bool:
    """Rewrite one Scan node (see the module doc); True when it was replaced."""
    op: Scan = node.op
    info = op.info
    S, M = info.n_seqs, info.n_states
    inner_in = op.inner_inputs
    nonseq_in = inner_in[S + info.n_taps:]
    outputs = list(op.inner_outputs)
    if not any(getattr(n.op, "shape_read", None) in ("dim", "all")
               for n in io_toposort([], outputs)):
        return False
    lengths = BodyLengths(node)
    changed = False
    for _ in range(_ROUNDS):
        replace = _answer_reads(outputs, lengths, set(nonseq_in))
        if not replace:
            break
        outputs = clone_with(outputs, replace)
        lengths._memo.clear()
        changed = True
    if not changed:
        return False
    inner_to_outer = dict(zip(nonseq_in, node.inputs[1 + S + M:]))
    inner_to_outer.update(lengths.placeholders)
    variant = list(inner_in[:S + info.n_taps])
    outputs, pairs, closures = hoist_invariants(outputs, variant, inner_to_outer)
    if closures:   # a free variable of the body that no input stands for: leave the loop
        return False
    new_info = dc_replace(info, n_nonseqs=len(pairs))
    new_op = Scan(list(variant) + [ph for ph, _ in pairs], outputs, new_info, op.mode)
    outs = new_op(node.inputs[0], *node.inputs[1:1 + S + M], *[ov for _, ov in pairs])
    outs = outs if isinstance(outs, list) else [outs]
    if outs and outs[0].owner is not None and hasattr(node.tag, "shared_states"):
        outs[0].owner.tag.shared_states = node.tag.shared_states
    for o, nw in zip(node.outputs, outs):
        if o.type != nw.type:
            return False
    fgraph.replace_all(list(zip(node.outputs, outs)), reason="scan_pushout_shapes")
    return True


def scan_pushout_shapes(fgraph: FunctionGraph) -> None:
    """Apply `hoist_body_shapes` to every loop of `fgraph`."""
    for node in list(fgraph.toposort()):
        if isinstance(node.op, Scan) and node in fgraph.apply_nodes:
            hoist_body_shapes(fgraph, node)


# on by default: a length read in a body is a host op per step on the GPU (the loop is then
# not captured); before the loop it costs one shape read per call
optdb.register("scan_pushout_shapes", scan_pushout_shapes, 3.6, "fast_run", "scan",
               "scan_pushout_shapes")
