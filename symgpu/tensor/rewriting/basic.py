"""General tensor rewrites: constant folding, useless ops, fill sinking, dimshuffles, shapes.

Each rewrite is a small function `(fgraph, node) -> replacements | None`; see
symgpu/graph/rewriting/basic.py for the protocol and db.py for the passes they join.
"""
from __future__ import annotations

import numpy as np

from symgpu.graph.basic import Apply, Constant
from symgpu.graph.rewriting import node_rewriter, register_canonicalize, register_specialize, \
    register_stabilize
from symgpu.scalar.basic import Cast
from symgpu.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from symgpu.tensor.shape import Shape, SpecifyBroadcastable, Unbroadcast
from symgpu.tensor.type import TensorConstant, TensorType
from symgpu.tensor.rewriting.utils import ew, fill_like, is_ew, make_constant, single_client

__all__ = ["constant_folding", "local_useless_elemwise", "local_cast_cast", "local_fill_sink",
           "local_dimshuffle_merge", "local_useless_dimshuffle", "local_dimshuffle_lift",
           "local_useless_specify_broadcastable", "evaluate_node",
           "local_reduce_over_broadcastable"]

#: folded constants larger than this (elements) are not made, unless the inputs were as big
MAX_FOLD_SIZE = 100_000


def evaluate_node(node: Apply) -> list | None:
    """Run `node` on its constant inputs; the output values, or None if it cannot run."""
    cells_in = [[i.data] for i in node.inputs]
    cells_out = [[None] for _ in node.outputs]
    op = node.op
    try:
        op.perform(node, [c[0] for c in cells_in], cells_out)
    except Exception:  # perform refused (it may need make_thunk's set-up): try the thunk
        try:
            storage = {v: c for v, c in zip(node.inputs, cells_in)}
            storage.update({v: c for v, c in zip(node.outputs, cells_out)})
            compute = {v: [True] for v in node.inputs}
            compute.update({v: [False] for v in node.outputs})
            op.make_thunk(node, storage, compute, [])()
        except Exception:  # the op fails on these constants: not folded, it fails at run time
            return None
    return [c[0] for c in cells_out]


@register_canonicalize("fast_run", "fast_compile")
@register_stabilize("fast_run", "fast_compile")
@register_specialize("fast_run", "fast_compile")
@node_rewriter(None)
def constant_folding(fgraph, node):
    """A node whose inputs are all constants becomes a constant (value computed once)."""
    if not node.inputs or not all(isinstance(i, TensorConstant) for i in node.inputs):
        return None
    op = node.op
    if getattr(op, "destroy_map", None) or getattr(op, "_no_constant_folding", False):
        return None
    if not all(type(o.type) is TensorType for o in node.outputs):
        return None
    values = evaluate_node(node)
    if values is None:
        return None
    biggest_in = max(i.data.size for i in node.inputs)
    out = []
    for var, value in zip(node.outputs, values):
        value = np.asarray(value)
        if value.size > MAX_FOLD_SIZE and value.size > biggest_in:
            return None
        try:
            out.append(TensorConstant(var.type, value))
        except (TypeError, ValueError):
            return None
    return out


@register_canonicalize
@register_stabilize
@register_specialize
@node_rewriter([Elemwise])
def local_useless_elemwise(fgraph, node):
    """identity(x) -> x; cast(x) to x's dtype -> x; second(a, b) -> b when b already has the
    output's type; switch(c, a, a) -> a (a broadcast's length test whose two lengths are
    one); a one-input add/mul -> its input."""
    op = node.op
    if op.inplace_pattern or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    sop = op.scalar_op
    name = getattr(sop, "name", None)
    if name == "identity" or (name in ("add", "mul") and len(node.inputs) == 1):
        cand = node.inputs[0]
    elif isinstance(sop, Cast):
        cand = node.inputs[0]
    elif name == "second":
        cand = node.inputs[1]
    elif name == "switch" and node.inputs[1] is node.inputs[2]:
        cand = node.inputs[1]
    else:
        return None
    return [cand] if cand.type == out.type else None


@register_canonicalize
@node_rewriter([Elemwise])
def local_cast_cast(fgraph, node):
    """cast(cast(x, wider), d) -> cast(x, d): the inner cast loses nothing."""
    if not isinstance(node.op.scalar_op, Cast) or node.op.inplace_pattern:
        return None
    inner = node.inputs[0].owner
    if inner is None or type(inner.op) is not Elemwise or not isinstance(inner.op.scalar_op, Cast):
        return None
    x = inner.inputs[0]
    if not np.can_cast(x.dtype, inner.op.scalar_op.dtype, casting="safe"):
        return None
    target = node.op.scalar_op.dtype
    return [x if x.dtype == target else Elemwise(Cast(target))(x)]


@register_canonicalize
@register_stabilize
@node_rewriter([Elemwise])
def local_fill_sink(fgraph, node):
    """f(second(a, b), c) -> second(a, f(b, c)), and the outer fill is dropped when c already
    gives the shape: gradients are full of `second(x, g)` that hide the arithmetic."""
    op = node.op
    if op.inplace_pattern or len(node.outputs) != 1 or getattr(op.scalar_op, "name", None) == "second":
        return None
    models, inputs = [], []
    for inp in node.inputs:
        owner = inp.owner
        if owner is not None and is_ew(owner, "second"):
            models.append(owner.inputs[0])
            inputs.append(owner.inputs[1])
        else:
            inputs.append(inp)
    if not models:
        return None
    new = op(*inputs)
    out = node.outputs[0]
    for m in models:
        if new.broadcastable == out.broadcastable:
            break
        if any(nb and not mb for nb, mb in zip(new.broadcastable, m.broadcastable)):
            new = fill_like(m, new)
    if new.type != out.type:
        return None
    return [new]


# ----------------------------------------------------------------------------- dimshuffle

@register_canonicalize
@register_specialize
@node_rewriter([DimShuffle])
def local_dimshuffle_merge(fgraph, node):
    """DimShuffle(DimShuffle(x)) -> one DimShuffle (or x when they cancel)."""
    inner = node.inputs[0].owner
    if inner is None or type(inner.op) is not DimShuffle:
        return None
    first, second = inner.op.new_order, node.op.new_order
    order = tuple("x" if d == "x" else first[d] for d in second)
    x = inner.inputs[0]
    if order == tuple(range(x.ndim)):
        return [x] if x.type == node.outputs[0].type else None
    return [DimShuffle(x.broadcastable, order)(x)]


@register_canonicalize
@register_specialize
@node_rewriter([DimShuffle])
def local_useless_dimshuffle(fgraph, node):
    """A DimShuffle that keeps every dimension in place -> its input."""
    x = node.inputs[0]
    if node.op.new_order == tuple(range(x.ndim)) and x.type == node.outputs[0].type:
        return [x]
    return None


@register_canonicalize
@node_rewriter([DimShuffle])
def local_dimshuffle_lift(fgraph, node):
    """DimShuffle(f(a, b)) -> f(DimShuffle(a), DimShuffle(b)) for an Elemwise f read only
    here: moves layout ops towards the inputs (constants fold, elemwise chains fuse)."""
    inp = node.inputs[0]
    inner = inp.owner
    if inner is None or type(inner.op) is not Elemwise or len(inner.outputs) != 1:
        return None
    if inner.op.inplace_pattern or not single_client(fgraph, inp):
        return None
    order = node.op.new_order
    new_inputs = []
    for x in inner.inputs:
        if x.ndim != inp.ndim:
            return None
        new_inputs.append(DimShuffle(x.broadcastable, order)(x))
    new = inner.op(*new_inputs)
    return [new] if new.type == node.outputs[0].type else None


@register_canonicalize
@register_specialize
@node_rewriter([CAReduce])
def local_reduce_over_broadcastable(fgraph, node):
    """A reduction over length-1 (broadcastable) dimensions only -> those dimensions
    dropped: sum/prod/max/min of one element is the element."""
    (x,) = node.inputs
    op = node.op
    axes = tuple(range(x.ndim)) if op.axis is None else op.axis
    if not axes or not all(x.broadcastable[d] for d in axes):
        return None
    out = node.outputs[0]
    new = DimShuffle(x.broadcastable, [d for d in range(x.ndim) if d not in axes])(x)
    if new.dtype != out.dtype:
        new = Elemwise(Cast(out.dtype))(new)
    return [new] if new.type == out.type else None


# ----------------------------------------------------------------------------- shapes
# (Shape_i of a computed variable: local_shape_infer in shape_ops.py, from infer_shape)

@register_canonicalize
@node_rewriter([Shape])
def local_shape_of_scalar(fgraph, node):
    """Shape(x) of a 0-d x -> the constant empty vector."""
    if node.inputs[0].ndim == 0:
        return [TensorConstant(node.outputs[0].type, np.zeros(0, dtype="int64"))]
    return None


@register_canonicalize
@register_specialize
@node_rewriter([SpecifyBroadcastable, Unbroadcast])
def local_useless_specify_broadcastable(fgraph, node):
    """SpecifyBroadcastable/Unbroadcast that change nothing -> their input; nested ones merge."""
    x = node.inputs[0]
    out = node.outputs[0]
    if x.type == out.type:
        return [x]
    inner = x.owner
    if inner is not None and type(inner.op) is type(node.op):
        if type(node.op) is Unbroadcast:
            axes = tuple(a or b for a, b in zip(inner.op.axes, node.op.axes))
        else:
            axes = tuple(a or b for a, b in zip(inner.op.broadcastable, node.op.broadcastable))
        new = type(node.op)(axes)(inner.inputs[0])
        return [new] if new.type == out.type else None
    return None
