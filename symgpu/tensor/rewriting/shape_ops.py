"""Rewrites of shape, reshape, alloc and indexing ops (the ops of tensor/basic.py and
tensor/subtensor.py): `Shape()[i]` -> `Shape_i(i)`, useless reshapes/allocs/subtensors,
shapes of computed variables from their ops' `infer_shape` (shape_feature.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.rewriting import node_rewriter, register_canonicalize, register_specialize
from symgpu.scalar.composite import Composite
from symgpu.tensor.basic import Alloc, Join, MakeVector, Reshape, join
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.shape import Shape, Shape_i, SpecifyShape, shape_i_of
from symgpu.tensor.subtensor import AdvancedIncSubtensor, IncSubtensor, Slice, Subtensor, \
    index_broadcastable
from symgpu.tensor.type import TensorConstant
from symgpu.tensor.rewriting.shape_feature import inferred_shape, rewrite_shape_read, same_dim
from symgpu.tensor.rewriting.utils import ew_cast, is_ew, make_constant, scalar_constant
from symgpu.tensor.shape_rules import dim_value

__all__ = ["local_shape_to_shape_i", "local_useless_subtensor", "local_subtensor_of_make_vector",
           "local_useless_reshape", "local_reshape_reshape", "local_useless_alloc",
           "local_shape_infer", "local_useless_specify_shape", "local_add_of_slice_writes",
           "local_fill_model_of_its_shape", "local_inc_fill_of_index_shape", "same_length"]


def _is_dim_of(var, x, d: int) -> bool:
    """Whether scalar `var` is known to equal x.shape[d]."""
    node = var.owner
    if node is not None and type(node.op) is Shape_i and node.op.i == d and node.inputs[0] is x:
        return True
    return bool(x.broadcastable[d]) and scalar_constant(var) == 1


def _shape_entries(shp):
    """The entries of a shape vector built by MakeVector or given as a constant, else None."""
    if isinstance(shp, TensorConstant):
        return [make_constant(int(s), "int64") for s in shp.data]
    node = shp.owner
    if node is not None and type(node.op) is MakeVector:
        return list(node.inputs)
    return None


@register_canonicalize
@node_rewriter([Subtensor])
def local_shape_to_shape_i(fgraph, node):
    """Shape(x)[i] -> Shape_i(i)(x)."""
    x = node.inputs[0]
    idx = node.op.idx_list
    if x.owner is None or type(x.owner.op) is not Shape or len(idx) != 1 or not isinstance(idx[0], int):
        return None
    src = x.owner.inputs[0]
    i = idx[0] + src.ndim if idx[0] < 0 else idx[0]
    if not 0 <= i < src.ndim:
        return None
    return [Shape_i(i)(src)]


@register_canonicalize
@node_rewriter([Subtensor])
def local_subtensor_of_make_vector(fgraph, node):
    """MakeVector(a, b, c)[1] -> b (shape arithmetic stays scalar)."""
    x = node.inputs[0]
    idx = node.op.idx_list
    if x.owner is None or type(x.owner.op) is not MakeVector or len(idx) != 1 \
            or not isinstance(idx[0], int):
        return None
    entries = x.owner.inputs
    i = idx[0]
    if not -len(entries) <= i < len(entries):
        return None
    return [ew_cast(entries[i], node.outputs[0].dtype)]


@register_canonicalize
@register_specialize
@node_rewriter([Subtensor])
def local_useless_subtensor(fgraph, node):
    """x[:, ::1, 0:] and similar full slices -> x."""
    x = node.inputs[0]
    for e in node.op.idx_list:
        if not isinstance(e, Slice) or e.start not in (None, 0) or e.stop is not None \
                or e.step not in (None, 1):
            return None
    out = node.outputs[0]
    return [x] if x.type == out.type else None


@register_canonicalize
@register_specialize
@node_rewriter([Subtensor])
def local_newaxis_subtensor_to_dimshuffle(fgraph, node):
    """x[:, None], x[None, ..., None] and the like (full slices, newaxis, Ellipsis only) ->
    a DimShuffle adding the broadcastable axes.

    Why: elementwise fusion goes through DimShuffles, not through indexing, so a mask
    written ``m[:, None] * h + (1 - m)[:, None] * h_prev`` is one kernel with its ``1 - m``
    instead of two (in every step of a loop, forward and backward)."""
    x = node.inputs[0]
    idx = node.op.idx_list
    if len(node.inputs) != 1 or None not in idx:
        return None
    n_dims = sum(1 for e in idx if e is not None and e is not Ellipsis)
    if sum(1 for e in idx if e is Ellipsis) > 1 or n_dims > x.ndim:
        return None
    order: list = []
    d = 0
    for e in idx:
        if e is None:
            order.append("x")
        elif e is Ellipsis:
            k = x.ndim - n_dims
            order.extend(range(d, d + k))
            d += k
        elif isinstance(e, Slice) and e.start in (None, 0) and e.stop is None \
                and e.step in (None, 1):
            order.append(d)
            d += 1
        else:
            return None
    order.extend(range(d, x.ndim))
    out = x.dimshuffle(*order)
    return [out] if out.type == node.outputs[0].type else None


@register_canonicalize
@register_specialize
@node_rewriter([Reshape])
def local_useless_reshape(fgraph, node):
    """Reshape(x, shape(x)) (or an equal MakeVector of x's dims) -> x."""
    x, shp = node.inputs
    out = node.outputs[0]
    if x.ndim != node.op.ndim or x.type != out.type:
        return None
    if shp.owner is not None and type(shp.owner.op) is Shape and shp.owner.inputs[0] is x:
        return [x]
    entries = _shape_entries(shp)
    if entries is not None and all(_is_dim_of(e, x, d) for d, e in enumerate(entries)):
        return [x]
    if x.ndim == 1 and entries is not None and scalar_constant(entries[0]) == -1:
        return [x]
    return None


@register_canonicalize
@node_rewriter([Reshape])
def local_reshape_reshape(fgraph, node):
    """Reshape(Reshape(x, s1), s2) -> Reshape(x, s2)."""
    inner = node.inputs[0].owner
    if inner is None or type(inner.op) is not Reshape:
        return None
    new = node.op(inner.inputs[0], node.inputs[1])
    return [new] if new.type == node.outputs[0].type else None


@register_canonicalize
@register_specialize
@node_rewriter([Alloc])
def local_useless_alloc(fgraph, node):
    """Alloc(v, *shape(v)) -> v: nothing to broadcast (the shape read from v, or provably
    the same as the shape infer_shape gives v)."""
    v, *shape = node.inputs
    out = node.outputs[0]
    if v.type != out.type or len(shape) != v.ndim:
        return None
    if all(_is_dim_of(s, v, d) for d, s in enumerate(shape)):
        return [v]
    inferred = inferred_shape(fgraph, v)  # v's shape spelled from its inputs' shapes
    if inferred is not None and all(same_dim(s, e) for s, e in zip(shape, inferred)):
        return [v]
    return None


@register_canonicalize
@register_specialize
@node_rewriter([Shape, Shape_i])
def local_shape_infer(fgraph, node):
    """Shape(x) / Shape_i(d)(x) of a computed x -> the shape its op's `infer_shape` gives
    from its inputs' shapes (see shape_feature.py): `(x ** 2).shape` becomes
    MakeVector(Shape_i{0}(x), Shape_i{1}(x)) and computes nothing."""
    return rewrite_shape_read(fgraph, node)


@register_canonicalize
@register_specialize
@node_rewriter([SpecifyShape])
def local_useless_specify_shape(fgraph, node):
    """SpecifyShape(x, ...) whose every entry is provably x's length already -> x; nested
    ones merge into one check."""
    x, *entries = node.inputs
    out = node.outputs[0]
    inner = x.owner
    if inner is not None and type(inner.op) is SpecifyShape:
        outer_e, inner_e = iter(entries), iter(inner.inputs[1:])
        given, merged = [], []
        for g_out, g_in in zip(node.op.given, inner.op.given):
            e_out = next(outer_e) if g_out else None
            e_in = next(inner_e) if g_in else None
            if e_out is not None or e_in is not None:
                given.append(True)
                merged.append(e_out if e_out is not None else e_in)
            else:
                given.append(False)
        new = SpecifyShape(given)(inner.inputs[0], *merged)
        return [new] if new.type == out.type else None
    if x.type != out.type:
        return None
    known = inferred_shape(fgraph, x)
    it = iter(entries)
    for d, g in enumerate(node.op.given):
        if not g:
            continue
        e = next(it)
        read = x.owner is None and e.owner is not None and type(e.owner.op) is Shape_i \
            and e.owner.op.i == d and e.owner.inputs[0] is x
        if not (read or _is_dim_of(e, x, d) or (known is not None and same_dim(e, known[d]))):
            return None
    return [x]


def _one_axis_slice(node) -> tuple[int, int, int | None] | None:
    """(axis, start, stop) when IncSubtensor `node` writes ``x[:, ..., start:stop, ...]``
    with constant bounds, every other axis whole; else None."""
    found = None
    for axis, e in enumerate(node.op.idx_list):
        if not isinstance(e, Slice):
            return None
        if e == Slice(None, None, None):
            continue
        if found is not None or e.step not in (None, 1) or isinstance(e.start, str) \
                or isinstance(e.stop, str):
            return None
        start, stop = e.start or 0, e.stop
        if start < 0 or (stop is not None and stop < start):
            return None
        found = (axis, start, stop)
    return found


def _zeros_key(var):
    """What identifies zeros `var`'s shape: ``second(ref, 0)`` -> ref (gradients make one
    such fill per slice, each with its own zero constant), ``alloc(0, *dims)`` -> dims."""
    node = var.owner
    if node is not None and isinstance(node.op, Elemwise) and \
            getattr(node.op.scalar_op, "name", None) == "second" and \
            node.inputs[0].type == var.type:
        return ("like", node.inputs[0])
    if node is not None and type(node.op) is Alloc:
        return ("alloc", tuple(node.inputs[1:]))
    return ("var", var)


@register_canonicalize
@node_rewriter([Elemwise])
def local_add_of_slice_writes(fgraph, node):
    """``inc(Z, g0, x[:, a:b]) + inc(Z, g1, x[:, b:c]) + ...`` with Z zeros ->
    ``inc(Z, join(g0, g1, ...), x[:, a:c])``: the gradient of gates sliced from one fused
    product (an LSTM's ``pre[:, k*H:(k+1)*H]``) is one region write of the joined gate
    gradients instead of a zeroed array, a write and an add per gate (per loop step).
    Contiguous slices only, so NumPy's clipping of a slice past the end gives the same
    region either way."""
    if getattr(node.op.scalar_op, "name", None) != "add" or len(node.inputs) < 2:
        return False
    writes: dict = {}
    for i, v in enumerate(node.inputs):
        w = v.owner
        if w is None or type(w.op) is not IncSubtensor or len(w.inputs) != 2 \
                or v.type != node.outputs[0].type or len(fgraph.clients[v]) != 1:
            continue
        where = _one_axis_slice(w)
        if where is None or scalar_constant(w.inputs[0]) != 0:
            continue
        writes.setdefault((_zeros_key(w.inputs[0]), where[0]), []).append(
            (where[1], where[2], i, w))
    for (_, axis), group in writes.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda t: t[0])
        if any(prev[1] != nxt[0] for prev, nxt in zip(group, group[1:])):
            continue
        base = group[0][3].inputs[0]
        ys = [w.inputs[1] for *_, w in group]
        if any(y.ndim != base.ndim or y.dtype != base.dtype for y in ys):
            continue
        start, stop = group[0][0], group[-1][1]
        region = tuple(Slice(start, stop, None) if a == axis else Slice(None, None, None)
                       for a in range(len(group[0][3].op.idx_list)))
        op = group[0][3].op
        merged = IncSubtensor(region, op.set_instead_of_inc)(base, join(axis, *ys))
        used = {i for _, _, i, _ in group}
        rest = [v for i, v in enumerate(node.inputs) if i not in used]
        out = node.op(merged, *rest) if rest else merged
        return [out] if out.type == node.outputs[0].type else False
    return False


def shape_twin(ref):
    """A variable of `ref`'s shape that `ref` is computed from: through elementwise nodes,
    to an input with ref's broadcast pattern (so the same shape; a program where it is not
    fails on ref already).  Why: a zero fill shaped like ``ref`` (a gradient's zeros) keeps
    ref's value alive; a fill shaped like the input it came from does not, so where ref is
    fused into a kernel with other outputs (a GPT's float32 ``qkv + b`` beside its bfloat16
    cast) the kernel need not write it."""
    while ref.owner is not None and isinstance(ref.owner.op, Elemwise):
        nxt = next((i for i in ref.owner.inputs
                    if i.type.broadcastable == ref.type.broadcastable), None)
        if nxt is None:
            break
        ref = nxt
    return ref


def _zeros_piece(z, axis: int, lo, hi):
    """Zeros `z` (a fill ``second(ref, 0)`` or any zeros) cut to ``[lo:hi]`` along `axis`:
    the fill of ``twin[lo:hi]`` (``shape_twin(ref)``), so no length is computed and a
    zero-width piece costs no work; otherwise a view of `z`."""
    idx = tuple(slice(lo, hi) if a == axis else slice(None) for a in range(z.ndim))
    node = z.owner
    if node is not None and isinstance(node.op, Elemwise) and \
            getattr(node.op.scalar_op, "name", None) == "second" and \
            node.inputs[0].type == z.type:
        twin = shape_twin(node.inputs[0])
        if twin is not node.inputs[0]:
            piece = node.op(twin[idx], node.inputs[1])
            if piece.type == z.type:
                return piece
        return node.op(node.inputs[0][idx], node.inputs[1])
    return z[idx]


@register_specialize   # after canonicalize's local_add_of_slice_writes merged the gates' writes
@node_rewriter([IncSubtensor])
def local_write_into_zeros_to_join(fgraph, node):
    """``inc_subtensor(Z[:, a:b], y)`` (or set) with Z zeros -> ``join(Z[:, :a], y, Z[:, b:])``
    (the zero pieces cut from Z's fill, without computing a length), a join in y's place
    spliced in: a BPTT step's joined gate gradients written into the fused product's
    gradient cost one join (one launch on the GPU, copykernel.strided_join) instead of
    filling zeros, copying the gates and adding them into the region.  Only where y needs
    no broadcasting into the region; NumPy's clipping of bounds past the end gives the same
    region either way."""
    if len(node.inputs) != 2:
        return None
    z, y = node.inputs
    where = _one_axis_slice(node)
    if where is None or scalar_constant(z) != 0 or y.ndim != z.ndim or y.dtype != z.dtype:
        return None
    axis, start, stop = where
    if any(yb and not zb for yb, zb in zip(y.broadcastable, z.broadcastable)) or \
            y.broadcastable[axis]:
        return None
    ys = [y]
    if y.owner is not None and type(y.owner.op) is Join and y.owner.op.axis == axis and \
            len(fgraph.clients.get(y, [])) == 1 and y not in fgraph.outputs:
        ys = list(y.owner.inputs)
    parts = ([_zeros_piece(z, axis, None, start)] if start else []) + ys + \
        ([_zeros_piece(z, axis, stop, None)] if stop is not None else [])
    out = join(axis, *parts)
    if out.type != node.outputs[0].type:
        out = node.outputs[0].type.convert_variable(out)
    return [out] if out is not None else None


def _resolved_dim(fgraph, d, depth: int = 4):
    """Length `d` with the reads of computed lengths replaced by what infer_shape says, and
    NumPy's broadcast of two lengths that are one (``switch(eq(a, 1), b, a)``) by that
    length: a form `same_dim` can compare."""
    node = d.owner
    if node is None or depth == 0:
        return d
    if type(node.op) is Shape_i and node.inputs[0].owner is not None:
        shape = inferred_shape(fgraph, node.inputs[0])
        return d if shape is None else _resolved_dim(fgraph, shape[node.op.i], depth - 1)
    if is_ew(node, "switch"):
        cond, b, a = node.inputs
        test = cond.owner
        if test is not None and is_ew(test, "eq") and test.inputs[0] is a and \
                scalar_constant(test.inputs[1]) == 1:
            ra, rb = _resolved_dim(fgraph, a, depth - 1), _resolved_dim(fgraph, b, depth - 1)
            if same_dim(ra, rb):
                return ra
    return d


def _unit_factor(node: Any, d: Any) -> Any:
    """The input that length ``d`` (an output of ``node``) equals when ``node`` only
    multiplies it by ones (a flatten's ``1 * n``, possibly inside a Composite), else None."""
    sop = getattr(node.op, "scalar_op", None)
    if getattr(sop, "name", None) == "mul":
        rest = [v for v in node.inputs if dim_value(v) != 1]
        return rest[0] if len(rest) == 1 else None
    if not isinstance(sop, Composite):
        return None
    slot = sop.out_slots[node.outputs.index(d)]
    while slot >= sop.first_step:
        step_op, args = sop.steps[slot - sop.first_step]
        rest = [a for a in args if not (sop.nin <= a < sop.first_step and
                                        sop.constants[a - sop.nin][0] == 1)]
        if getattr(step_op, "name", None) != "mul" or len(rest) != 1:
            return None
        slot = rest[0]
    return node.inputs[slot] if slot < sop.nin else None


def _unless_minus_one(node: Any) -> Any:
    """``e`` of ``switch(eq(e, -1), inferred, e)`` (a reshape's entry that may be -1)."""
    if getattr(getattr(node.op, "scalar_op", None), "name", None) != "switch" or \
            len(node.inputs) != 3:
        return None
    cond, _, e = node.inputs
    cn = cond.owner
    ok = cn is not None and getattr(getattr(cn.op, "scalar_op", None), "name", None) == "eq" \
        and any(v is e for v in cn.inputs) and any(dim_value(v) == -1 for v in cn.inputs)
    return e if ok else None


def _length(fgraph: Any, d: Any, depth: int = 8) -> Any:
    """Length ``d`` followed back through shape inference and products by one: an int, an
    (array, axis) read of a graph input, or the variable where the trail stops."""
    for _ in range(depth):
        value = dim_value(d)
        if value is not None:
            return value
        node = getattr(d, "owner", None)
        if node is None:
            return d
        e = _unless_minus_one(node)
        if e is not None:       # d is e where e is a length (never -1)
            got = _length(fgraph, e, depth - 1)
            return got if isinstance(got, tuple) or isinstance(got, int) and got >= 0 else d
        if getattr(node.op, "shape_read", None) == "dim":
            arr, axis = node.inputs[0], node.op.i
            shape = inferred_shape(fgraph, arr)
            nxt = None if shape is None else shape[axis]
            if nxt is None or nxt is d or (nxt.owner is not None and nxt.owner.op == node.op
                                           and nxt.owner.inputs[0] is arr):
                return (arr, axis)
            d = nxt
            continue
        nxt = _unit_factor(node, d)
        if nxt is None:
            return d
        d = nxt
    return d


def same_length(fgraph: Any, a: Any, b: Any) -> bool:
    """Whether lengths ``a`` and ``b`` are provably equal, each followed back through shape
    inference (a read of a computed array's length), a reshape's ``switch(eq(e, -1), .., e)``
    and products by one (a flatten's ``1 * n``): a reshape of a product that keeps its
    columns (gpu/ops/gemm_epilogue.py).  ``_resolved_dim`` above follows NumPy's broadcast
    of lengths instead, for ``same_dim``."""
    la, lb = _length(fgraph, a), _length(fgraph, b)
    if isinstance(la, tuple) and isinstance(lb, tuple):
        return la[0] is lb[0] and la[1] == lb[1]
    if isinstance(la, int) or isinstance(lb, int) or isinstance(la, tuple) or \
            isinstance(lb, tuple):
        return la == lb
    return same_dim(la, lb)


def _input_of_its_shape(fgraph, x):
    """An input of x's node with x's type pattern whose lengths infer_shape proves equal to
    x's, else None: ``lp[arange(y.shape[0]), y]`` is y's length."""
    node = x.owner
    if node is None or isinstance(node.op, Elemwise):
        return None
    shape = inferred_shape(fgraph, x)
    if shape is None:
        return None
    # a graph input first (nothing computes it), then any other (an arange to the labels'
    # length is computed for the fill alone once the pick is gone)
    for cand in sorted(node.inputs, key=lambda v: v.owner is not None):
        if type(cand.type) is type(x.type) and \
                cand.type.broadcastable == x.type.broadcastable and all(
                same_dim(_resolved_dim(fgraph, d), _resolved_dim(fgraph, shape_i_of(cand, i)))
                for i, d in enumerate(shape)):
            return cand
    return None


@register_canonicalize
@register_specialize
@node_rewriter([Elemwise])
def local_fill_model_of_its_shape(fgraph, node):
    """second(x, v) -> second(i, v) where i is an input of x's node of x's shape (the gradient
    of a picked-out loss ``-mean(lp[arange(n), y])`` fills the pick's shape with ``-1/n``),
    x seen through elementwise ops of its shape first (a negated pick,
    ``mean(-lp[arange(n), y])``): the fill reads only a shape, and x, read by nothing else,
    is no longer computed."""
    if not is_ew(node, "second") or len(node.inputs) != 2:
        return None
    model = shape_twin(node.inputs[0])
    twin = _input_of_its_shape(fgraph, model)
    if twin is None:
        return None
    out = node.op(twin, node.inputs[1])
    return [out] if out.type == node.outputs[0].type else None


@register_canonicalize
@register_specialize
@node_rewriter([AdvancedIncSubtensor])
def local_inc_fill_of_index_shape(fgraph, node):
    """x[a, b] += second(b, s) -> x[a, b] += s for a value s broadcast everywhere (a
    ``(True,)`` vector): the written region has the index's shape, which the fill only
    repeated. The gradient of ``-mean(lp[arange(n), y])`` scatters ``-1/n`` so, and then
    needs no kernel filling a vector with it."""
    x, v, *index = node.inputs
    fill = v.owner
    if fill is None or not is_ew(fill, "second") or len(fill.inputs) != 2:
        return None
    model, s = fill.inputs
    region = index_broadcastable(x.broadcastable, node.op.idx_list, index)
    if model not in index or v.ndim != len(region) or s.dtype != v.dtype or \
            not all(s.type.broadcastable) or s.ndim != v.ndim or \
            model.type.broadcastable != v.type.broadcastable:
        return None
    return [node.op.make_node(x, s, *index).outputs[0]]
