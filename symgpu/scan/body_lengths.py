"""The lengths of a loop body's variables in terms of the loop's outer inputs.

Why a module of its own: both the loop rewrites that move shape reads out of a body
(pushout_shapes.py) and the loops' own ``infer_shape`` (op.py: a per-step output's dims after
the loop) answer lengths from the body's shapes, and op.py cannot import the rewrites, which
import it.  No length in a body changes from step to step: a sequence's step has the
sequence's shape without its first axis, a state's tap the initial value's, a non-sequence
its own.
"""
from __future__ import annotations

from typing import Any

import symgpu.tensor as T
from symgpu.graph.basic import Constant, Variable, ancestors
from symgpu.graph.op import ShapeError
from symgpu.scan.inner import clone_with
from symgpu.tensor.rewriting.shape_feature import node_shapes
from symgpu.tensor.shape import shape_i_of

__all__ = ["BodyLengths", "invariant", "per_step_dims"]


class BodyLengths:
    """The lengths of the body's variables in terms of its inputs' lengths (placeholders made
    on first use, each with the outer expression it stands for)."""

    def __init__(self, node: Any) -> None:
        op = node.op
        info = op.info
        S, M = info.n_seqs, info.n_states
        outer = node.inputs
        #: inner input -> (outer variable, axis offset): its dim d is the outer's d + offset
        self.source: dict[Variable, tuple[Variable, int]] = {}
        inner_in = op.inner_inputs
        for k in range(S):
            self.source[inner_in[k]] = (outer[1 + k], 1)
        pos = S
        for j in range(M):
            for _tap in info.state_taps[j]:
                self.source[inner_in[pos]] = (outer[1 + S + j], 1)
                pos += 1
        for m, v in enumerate(inner_in[S + info.n_taps:]):
            self.source[v] = (outer[1 + S + M + m], 0)
        #: placeholder -> outer length expression
        self.placeholders: dict[Variable, Variable] = {}
        self._ph: dict[tuple[Variable, int], Variable] = {}
        self._memo: dict[Variable, tuple | None] = {}

    def dims(self, v: Variable) -> tuple | None:
        """v's shape as int64 scalars built on placeholders, constants and what infer_shape
        reads (None where an op has no rule here)."""
        if v in self._memo:
            return self._memo[v]
        ndim = getattr(v.type, "ndim", None)
        out: tuple | None
        if ndim is None:
            out = None
        elif isinstance(v, Constant) or all(v.type.broadcastable):
            out = tuple(shape_i_of(v, d) for d in range(ndim))
        elif v in self.source:
            out = tuple(shape_i_of(v, d) if v.type.broadcastable[d] else self._placeholder(v, d)
                        for d in range(ndim))
        elif v.owner is None:
            out = None
        else:
            node = v.owner
            ins = [self.dims(i) for i in node.inputs]
            if any(s is None and getattr(i.type, "ndim", None) is not None
                   for s, i in zip(ins, node.inputs)):
                out = None
            else:
                try:
                    shapes = node_shapes(node, ins)
                except (ShapeError, NotImplementedError):   # no rule: the read stays
                    shapes = None
                for o, s in zip(node.outputs, shapes or [None] * len(node.outputs)):
                    self._memo[o] = s
                return self._memo[v]
        self._memo[v] = out
        return out

    def _placeholder(self, v: Variable, d: int) -> Variable:
        key = (v, d)
        ph = self._ph.get(key)
        if ph is None:
            outer, off = self.source[v]
            ph = self._ph[key] = T.lscalar(f"{v.name or 'input'}.shape[{d}]")
            self.placeholders[ph] = shape_i_of(outer, d + off)
        return ph


def invariant(e: Variable, allowed: set) -> bool:
    """Whether `e` is built on constants and `allowed` variables only."""
    return all(isinstance(a, Constant) or a in allowed
               for a in ancestors([e], blockers=allowed) if a.owner is None)


def per_step_dims(node: Any, k: int) -> tuple | None:
    """The lengths of inner output k (a state's new value or a per-step output: the loop
    output's dims after the first) in terms of the outer inputs' lengths and the
    non-sequences, or None where one depends on a per-step value.  Why: Scan's
    ``infer_shape`` read a per-step output's dims from the output itself, so code after a
    loop that reshapes its outputs (a gradient loop's ``(L, batch, hidden)`` results flattened
    for the weight product) kept host reads of a device result mid-step: on the GPU, a host
    step between two CUDA graphs every call."""
    op = node.op
    info = op.info
    S, M = info.n_seqs, info.n_states
    lengths = BodyLengths(node)
    dims = lengths.dims(op.inner_outputs[k])
    if dims is None:
        return None
    nonseq_in = op.inner_inputs[S + info.n_taps:]
    allowed = set(lengths.placeholders) | set(nonseq_in)
    if not all(invariant(e, allowed) for e in dims):
        return None
    inner_to_outer = dict(zip(nonseq_in, node.inputs[1 + S + M:]))
    inner_to_outer.update(lengths.placeholders)
    return tuple(clone_with(list(dims), inner_to_outer))
