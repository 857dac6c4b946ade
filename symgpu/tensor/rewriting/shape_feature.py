"""Shapes from `infer_shape`: what `x.shape` is without computing `x` (Theano's ShapeFeature,
kept lazy and small).

Why lazy: Theano's ShapeFeature builds a shape for every variable of the graph; here a shape
is asked for only where a `Shape`/`Shape_i` reads a computed variable, one node at a time:
`Shape_i(d)(f(a, b))` becomes the expression `f.infer_shape` gives from `Shape_i(.)(a)`,
`Shape_i(.)(b)`, and the equilibrium driver pushes the new reads further up until they reach
graph inputs (or variables computed anyway). The per-node answers are memoised for the
fgraph (checked against the node's current inputs), so asking for two dims of one variable
calls `infer_shape` once.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable, io_toposort
from symgpu.graph.op import ShapeError
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.shape import _one, register_shape_reader, shape_i_of, shape_tuple
from symgpu.tensor.shape_rules import as_dim, dim_value, is_shape_read, same_dim
from symgpu.tensor.type import TensorConstant

__all__ = ["register_shape_reader", "shape_i_of", "shape_tuple", "node_shapes",
           "infer_graph_shapes", "rewrite_shape_read", "inferred_shape", "same_dim"]

def _checked(node: Apply, shapes: Any) -> list[tuple]:
    """`infer_shape`'s answer as int64 dims, after checking it has one entry per output dim
    (None for an output whose type has no shape, such as an MPI request: Theano's rule)."""
    if shapes is None or len(shapes) != len(node.outputs):
        raise ShapeError(f"{node.op}.infer_shape returned {shapes!r} for a node with "
                         f"{len(node.outputs)} output(s)")
    out: list = []
    for o, s in zip(node.outputs, shapes):
        if s is None and not hasattr(o.type, "ndim"):
            out.append(None)
            continue
        if s is None or len(s) != o.type.ndim:
            raise ShapeError(f"{node.op}.infer_shape gave the shape {s!r} for the "
                             f"{o.type.ndim}-dimensional output {o} ({o.type})")
        out.append(tuple(as_dim(e) for e in s))
    return out


def node_shapes(node: Apply, input_shapes: Sequence[tuple] | None = None, fgraph: Any = None) -> list[tuple]:
    """The shapes of `node`'s outputs from `infer_shape` (inputs' shapes read from them
    unless given)."""
    if input_shapes is None:
        input_shapes = [shape_tuple(v) if hasattr(v.type, "ndim") else None for v in node.inputs]
    return _checked(node, node.op.infer_shape(fgraph, node, list(input_shapes)))


def infer_graph_shapes(outputs: Sequence[Variable], known: dict[Variable, tuple] | None = None) -> list[tuple]:
    """The shapes of `outputs` inferred through the whole graph above them, in terms of the
    shapes (and values, where a shape depends on them) of its free variables (or of the
    variables given in `known`)."""
    known = dict(known or {})
    for node in io_toposort(list(known), list(outputs)):
        if all(o in known for o in node.outputs):
            continue
        ins = [known[v] if v in known else (shape_tuple(v) if hasattr(v.type, "ndim") else None)
               for v in node.inputs]
        for o, s in zip(node.outputs, node_shapes(node, ins)):
            known[o] = s
    return [known[o] if o in known else shape_tuple(o) for o in outputs]


# ----------------------------------------------------------------------------- the rewrite

_MEMO: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _memo_shapes(fgraph: Any, node: Apply) -> list[tuple] | None:
    memo = _MEMO.get(fgraph)
    if memo is None:
        memo = {}
        try:
            _MEMO[fgraph] = memo
        except TypeError:  # not weak-referenceable: no memo
            pass
    hit = memo.get(node)
    if hit is not None and len(hit[0]) == len(node.inputs) and all(
            a is b for a, b in zip(hit[0], node.inputs)) and _still_valid(fgraph, hit[1]):
        return hit[1]
    reads = memo.setdefault("reads", {})

    def read(v: Variable) -> tuple | None:
        """v's dims, each read once per fgraph (one Shape_i node per (v, d) to merge)."""
        if not hasattr(v.type, "ndim"):
            return None
        got = reads.get(v)
        if got is None:
            got = reads[v] = shape_tuple(v)
        return got
    try:
        shapes = node_shapes(node, [read(v) for v in node.inputs], fgraph=fgraph)
    except ShapeError:
        shapes = None
    memo[node] = (tuple(node.inputs), shapes)
    return shapes


def inferred_shape(fgraph: Any, var: Variable) -> tuple | None:
    """`var`'s shape from its op's infer_shape (memoised for `fgraph`), or None for a graph
    input or an op without a rule."""
    if var.owner is None:
        return None
    shapes = _memo_shapes(fgraph, var.owner)
    return None if shapes is None else shapes[var.owner.outputs.index(var)]


def _still_valid(fgraph: Any, shapes: list[tuple] | None) -> bool:
    """Whether a memoised answer only builds on variables still in the graph (a rewrite may
    have replaced a variable that an entry reads, e.g. a reshape's MakeVector input)."""
    if shapes is None:
        return True
    known = fgraph.variables
    todo = [e for s in shapes for e in s]
    seen: set = set()
    while todo:
        v = todo.pop()
        if v in known or isinstance(v, Constant) or id(v) in seen:
            continue
        seen.add(id(v))
        if v.owner is None:
            return False
        todo.extend(v.owner.inputs)
    return True


def _computed_anyway(fgraph: Any, node: Apply) -> bool:
    """Whether something other than shape reads needs `node`'s outputs."""
    for o in node.outputs:
        for client, _i in fgraph.clients.get(o, ()):
            if client == "output" or getattr(client.op, "shape_read", None) is None:
                return True
    return False


def _cheap(fgraph: Any, e: Variable) -> bool:
    """Free to use in place of reading a computed value's length: a constant, a value the
    graph has already, or a length read."""
    return dim_value(e) is not None or e in fgraph.variables or (
        is_shape_read(e))


def _sliced(node: Apply) -> bool:
    """A basic slice (a view) whose lengths follow from its bounds, or an op that says its
    output shape is a few host scalar operations on its inputs' shapes
    (``shape_from_inputs = True``: convolutions, pooling): worth those operations even
    where the value is computed anyway, since then nothing on the host waits for it (on the
    GPU, the op and what reads its shape can be one captured graph; a slice takes its bounds
    as graph parameters)."""
    return bool(getattr(node.op, "basic_indexing", False)
                or getattr(node.op, "shape_from_inputs", False))


def _as_shape_vector(entries: Sequence[Variable], out: Variable) -> Variable | None:
    values = [dim_value(e) for e in entries]
    if all(v is not None for v in values):
        return TensorConstant(out.type, np.asarray(values, dtype="int64").reshape(len(values)))
    new = MakeVector("int64")(*entries)
    return new if new.type == out.type else out.type.convert_variable(new)


def rewrite_shape_read(fgraph: Any, node: Apply) -> list[Variable] | None:
    """`Shape(x)` / `Shape_i(d)(x)` (or the GPU ones) of a computed `x` -> the shape
    `infer_shape` derives from x's inputs. Skipped where `x` is computed anyway and the
    inferred expression costs more than reading x's shape."""
    x = node.inputs[0]
    d = getattr(node.op, "i", None)
    if d is not None:
        if x.type.broadcastable[d]:
            return [_one()]
        if isinstance(x, Constant):
            return [shape_i_of(x, d)]
    elif x.type.ndim and all(x.type.broadcastable):
        return [_as_shape_vector([_one()] * x.type.ndim, node.outputs[0])]
    owner = x.owner
    if owner is None:
        return None
    shapes = _memo_shapes(fgraph, owner)
    if shapes is None:
        return None
    entries = shapes[owner.outputs.index(x)]
    anyway = _computed_anyway(fgraph, owner)
    if d is not None:
        e = entries[d]
        if e.owner is not None and e.owner.op == node.op and e.owner.inputs[0] is x:
            return None
        return None if anyway and not _cheap(fgraph, e) and not _sliced(owner) else [e]
    if anyway and not all(dim_value(e) is not None or e in fgraph.variables for e in entries):
        return None
    return [_as_shape_vector(entries, node.outputs[0])]
