"""A sum of increments of subtensors becomes one chain of increments (Theano's
``local_IncSubtensor_serialize``), in a pass after scan_to_dnn_rnn.

Why: the gradient of a variable read through several slices (the gates of a fused weight
matrix, each ``W[:, k*H:(k+1)*H]``) is ``inc(zeros_like(W), g0, s0) + inc(zeros_like(W),
g1, s1) + ...``: each increment a copy of the zeros, then a sum of whole matrices.  An
increment is linear, so the sum is ``inc(inc(zeros_like(W), g0, s0), g1, s1)...``: one zero
fill and a block write per slice, which the in-place pass makes in place.  The canonical
passes turn such sums of slices that meet into one join already
(shape_ops.local_add_of_slice_writes, local_write_into_zeros_to_join); scan_to_dnn_rnn makes
its sums after them, when it unpacks cuDNN's weight gradient, so those two run again after
it (passes ``late_add_of_slice_writes``, 3.45, and ``late_write_into_zeros_to_join``, 3.47:
a matrix's gate blocks are one join, one launch) and this rewrite between them chains what
they leave (``inc_subtensor_serialize``, 3.46); the tag ``inc_subtensor_serialize`` names
all three.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.rewriting import node_rewriter, optdb
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.math import add
from symgpu.tensor.rewriting.shape_ops import (local_add_of_slice_writes,
                                               local_write_into_zeros_to_join)
from symgpu.tensor.rewriting.utils import is_constant_value, is_ew
from symgpu.tensor.subtensor import AdvancedIncSubtensor, IncSubtensor

__all__ = ["local_inc_subtensor_serialize"]


def _movable(fgraph: Any, v: Any, out_type: Any) -> bool:
    """An increment (not a set, not in place) of the sum's type read by the sum alone."""
    node = v.owner
    if node is None or type(node.op) not in (IncSubtensor, AdvancedIncSubtensor):
        return False
    op = node.op
    return (not op.set_instead_of_inc and not op.inplace and v.type == out_type
            and len(fgraph.clients.get(v, [])) == 1)


@node_rewriter([Elemwise])
def local_inc_subtensor_serialize(fgraph, node):
    """add(inc(a, y0, s0), inc(b, y1, s1), c) -> inc(inc(a + b + c, y0, s0), y1, s1), the
    zero fills among a, b, c dropped but one."""
    if not is_ew(node, "add"):
        return None
    out_type = node.outputs[0].type
    moved = [v for v in node.inputs if _movable(fgraph, v, out_type)]
    if not moved:
        return None
    bases = [v for v in node.inputs if v not in moved] + [v.owner.inputs[0] for v in moved]
    kept = [b for b in bases if not is_constant_value(b, 0)]
    if not kept:
        kept = bases[:1]
    tip = kept[0] if len(kept) == 1 else add(*kept)
    if tip.type != out_type:        # (a dropped zero fill gave the sum its shape)
        tip = add(*bases)
        if tip.type != out_type:
            return None
    for v in moved:
        tip = v.owner.op(tip, *v.owner.inputs[1:])
    return [tip]


# after scan_to_dnn_rnn (3.4, 3.41), which unpacks cuDNN's weight gradient into such sums:
# the blocks of a matrix that meet are joined (one launch: the canonical passes' rewrites run
# again), what is left chained; in passes of their own, in this order (in one equilibrium
# the writes would each become a join before their sum is seen whole)
for _k, (_name, _rewrite) in enumerate((
        ("late_add_of_slice_writes", local_add_of_slice_writes),
        ("inc_subtensor_serialize", local_inc_subtensor_serialize),
        ("late_write_into_zeros_to_join", local_write_into_zeros_to_join))):
    optdb.register(_name, EquilibriumRewriter([_rewrite], name=_name), 3.45 + 0.01 * _k,
                   "fast_run", "inc_subtensor_serialize")
