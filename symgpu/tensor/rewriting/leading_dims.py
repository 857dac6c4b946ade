"""`sink_leading_dims` (position 48.5, before fusion): an elementwise node whose every input
has a leading length-1 axis, added by a DimShuffle to an elementwise result, computes on the
inputs without that axis and adds it to its result instead:

    f(x.dimshuffle('x', 0, 1), m.dimshuffle('x', 0, 'x'))  ->  f(x, m.dimshuffle(0, 'x')).dimshuffle('x', 0, 1)

Why: a scan gradient's step returns each state's adjoint with a leading window axis (shape
(1, batch, hidden)); the arithmetic that builds it then reads the gate kernel's results
through DimShuffles, so fusion (which groups nodes of one shape) cannot put it into the gate
kernel, and it is a launch of its own in every step of the backward loop (a masked LSTM: the
cell state's adjoint).  Without the leading axis it fuses.  Canonicalisation's
`local_dimshuffle_lift` moves DimShuffles the other way (towards the inputs), so this runs
after it, once, just before fusion.  The pass runs over the host ops and, registered by the
GPU backend (symgpu/gpu/ops/lifters.py), over GpuElemwise/GpuDimShuffle.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import optdb
from symgpu.tensor.elemwise import DimShuffle, Elemwise

__all__ = ["sink_leading_dims", "sink_leading_dims_of"]


def _stripped(x: Variable, ds_cls: type) -> tuple[Variable, bool] | None:
    """``x`` without its leading length-1 axis, and whether a DimShuffle added that axis
    (then the value behind it is read as it is: fusion can reach its producer)."""
    if x.ndim == 0 or not x.broadcastable[0]:
        return None
    own = x.owner
    if own is not None and type(own.op) is ds_cls and own.op.new_order[:1] == ("x",):
        src, rest = own.inputs[0], tuple(own.op.new_order[1:])
        if rest == tuple(range(src.ndim)):
            return src, True
        return ds_cls(src.broadcastable, rest)(src), True
    const = constant_behind(x)
    if const is not None:          # a constant (or its device copy) loses the axis itself,
        return _squeezed_constant(x, const), False   # so fusion still inlines it
    return ds_cls(x.broadcastable, tuple(range(1, x.ndim)))(x), False


def _squeezed_constant(x: Variable, const: Constant) -> Variable:
    """``x`` (a constant, or copies of one) rebuilt over the constant without its axis 0."""
    value = np.asarray(const.data)[0]
    new: Variable = type(const)(const.type.clone(broadcastable=const.type.broadcastable[1:]),
                             value)
    chain = []
    var = x
    while var is not const:
        chain.append(var.owner.op)
        var = var.owner.inputs[0]
    for op in reversed(chain):
        new = op(new)
    return new


def _rewrite(node: Apply, ew_cls: type, ds_cls: type) -> list[Variable] | None:
    op = node.op
    if type(op) is not ew_cls or op.inplace_pattern or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if out.ndim < 2 or not out.broadcastable[0] or all(out.broadcastable):
        return None   # an all-length-1 result (a scalar's arithmetic) fuses as it is
    parts = [_stripped(x, ds_cls) for x in node.inputs]
    if any(p is None for p in parts) or not any(added for _, added in parts):
        return None
    inner = ew_cls(op.scalar_op)(*[v for v, _ in parts])
    new = ds_cls(inner.broadcastable, ("x",) + tuple(range(inner.ndim)))(inner)
    return [new] if new.type == out.type else None


def sink_leading_dims_of(fgraph: FunctionGraph, ew_cls: type, ds_cls: type) -> int:
    """Apply the rewrite to every ``ew_cls`` node of ``fgraph`` (one sweep in topological
    order: a rewritten producer hands its consumers a DimShuffle to strip); how many."""
    done = 0
    for node in list(fgraph.toposort()):
        if node not in fgraph.apply_nodes:
            continue
        new = _rewrite(node, ew_cls, ds_cls)
        if new is not None:
            fgraph.replace(node.outputs[0], new[0], reason="sink_leading_dims")
            done += 1
    return done


def sink_leading_dims(fgraph: FunctionGraph) -> Any:
    """The host ops' sweep (Elemwise, DimShuffle)."""
    return sink_leading_dims_of(fgraph, Elemwise, DimShuffle)


optdb.register("sink_leading_dims", sink_leading_dims, 19.5, "fast_run", "fusion")
