"""Shape queries and pure dimension shuffles: shape, Shape_i, dimshuffle, transpose."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.elemwise import DimShuffle
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Shape", "Shape_i", "shape", "shape_i", "dimshuffle", "transpose",
           "SpecifyBroadcastable", "specify_broadcastable_as", "Unbroadcast", "SpecifyShape",
           "specify_shape"]


class Shape(Op):
    """The shape of a tensor as an int64 vector."""

    __props__ = ()
    reads_only_shape = True  # a device array fed to its input needs no host copy

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        return Apply(self, [x], [TensorType("int64", (False,))()])

    def perform(self, node, inputs, out):
        out[0][0] = np.asarray(inputs[0].shape, dtype="int64")

    def grad(self, inputs, output_grads):
        return [None]

    def infer_shape(self, fgraph, node, input_shapes):
        return [(len(input_shapes[0]),)]


class Shape_i(Op):
    """The length of one dimension as an int64 scalar (cheaper than Shape then indexing)."""

    __props__ = ("i",)
    reads_only_shape = True  # a device array fed to its input needs no host copy

    def __init__(self, i: int):
        self.i = int(i)

    def __str__(self) -> str:
        return f"Shape_i{{{self.i}}}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if not 0 <= self.i < x.ndim:
            raise ValueError(f"Shape_i{{{self.i}}}: {x} has only {x.ndim} dimensions")
        return Apply(self, [x], [TensorType("int64", ())()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """A closure: reading one length must not cost a generic perform call."""
        from symgpu.tensor.elemwise import _closure_thunk
        cin, cout, i, asarray = storage_map[node.inputs[0]], storage_map[node.outputs[0]], self.i, np.asarray

        def thunk():
            cout[0] = asarray(cin[0].shape[i], dtype="int64")
        return _closure_thunk(thunk, node, storage_map)

    def perform(self, node, inputs, out):
        out[0][0] = np.asarray(inputs[0].shape[self.i], dtype="int64")

    def grad(self, inputs, output_grads):
        return [None]

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]


_shape = Shape()


def shape(x: Any) -> TensorVariable:
    """The symbolic shape of `x` (an int64 vector)."""
    x = as_tensor_variable(x)
    return _shape(x)


def shape_i(x: Any, i: int) -> TensorVariable:
    """The symbolic length of dimension `i` of `x` (an int64 scalar)."""
    x = as_tensor_variable(x)
    if i < 0:
        i += x.ndim
    return Shape_i(i)(x)


def dimshuffle(x: Any, pattern: Sequence[Any]) -> TensorVariable:
    """Theano's dimshuffle: reorder dimensions, 'x' inserts a broadcastable one."""
    x = as_tensor_variable(x)
    return DimShuffle(x.broadcastable, tuple(pattern))(x)


def transpose(x: Any, axes: Sequence[int] | None = None) -> TensorVariable:
    """Reverse (or permute by `axes`) the dimensions of `x`; a view."""
    x = as_tensor_variable(x)
    if axes is None:
        axes = tuple(range(x.ndim))[::-1]
    axes = tuple(int(a) % x.ndim if x.ndim else int(a) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"transpose axes {axes} are not a permutation of {x.ndim} dimensions")
    return DimShuffle(x.broadcastable, axes)(x)


def check_declared_broadcastable(x: Any, broadcastable: Sequence[bool]) -> Any:
    """``x`` (a host or device array) after checking that each dim declared broadcastable has
    length 1 (SpecifyBroadcastable and its GPU twin)."""
    for d, b in enumerate(broadcastable):
        if b and x.shape[d] != 1:
            raise ValueError(f"dimension {d} of an array of shape {x.shape} was declared "
                             "broadcastable (length 1)")
    return x


class SpecifyBroadcastable(Op):
    """Asserts at run time that some dimensions have length 1, so the type can say so."""

    __props__ = ("broadcastable",)
    view_map = {0: [0]}

    def __init__(self, broadcastable: Sequence[bool]):
        self.broadcastable = tuple(bool(b) for b in broadcastable)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim != len(self.broadcastable):
            raise TypeError(f"{self}: {x} has {x.ndim} dimensions")
        bcast = tuple(a or b for a, b in zip(x.broadcastable, self.broadcastable))
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        out[0][0] = check_declared_broadcastable(inputs[0], self.broadcastable)

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def infer_shape(self, fgraph, node, input_shapes):
        """The input's shape with 1 where the op checks it (GpuSpecifyBroadcastable too)."""
        return [tuple(1 if b else s for b, s in zip(self.broadcastable, input_shapes[0]))]


def specify_broadcastable_as(x: Any, ttype: TensorType) -> TensorVariable:
    """`x` with the broadcastable pattern of `ttype` (dims may only become broadcastable
    if `x` is checked to have length 1 there; dims that `x` knows are 1 are relaxed)."""
    x = as_tensor_variable(x)
    if x.broadcastable == ttype.broadcastable:
        return x
    needed = tuple(b and not xb for b, xb in zip(ttype.broadcastable, x.broadcastable))
    if any(needed):
        x = SpecifyBroadcastable(needed)(x)
    if x.broadcastable != ttype.broadcastable:
        # only relaxation remains: a known-1 dim stands where any length is allowed
        x = Unbroadcast(tuple(xb and not b for xb, b in zip(x.broadcastable, ttype.broadcastable)))(x)
    return x


class Unbroadcast(Op):
    """Forget that some dimensions are known to have length 1 (a view, no run-time cost)."""

    __props__ = ("axes",)
    view_map = {0: [0]}

    def __init__(self, axes: Sequence[bool]):
        self.axes = tuple(bool(a) for a in axes)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        bcast = tuple(b and not a for b, a in zip(x.broadcastable, self.axes))
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        g = output_grads[0]
        return [specify_broadcastable_as(g, inputs[0].type.clone(dtype=g.dtype))]


class SpecifyShape(Op):
    """`x` itself (a view), after checking at run time that its shape is the given one.

    Why: the shape rewrites then know x's shape from the given entries (constants or other
    variables' lengths) without reading it. `given[d]` says whether dim d has an entry; the
    entries (int64 scalars) are the inputs after x. Works on host and device arrays alike.
    """

    __props__ = ("given",)
    view_map = {0: [0]}

    def __init__(self, given: Sequence[bool]):
        self.given = tuple(bool(g) for g in given)

    def __str__(self) -> str:
        return "SpecifyShape"

    def make_node(self, x: Any, *entries: Any) -> Apply:
        from symgpu.graph.basic import Variable
        from symgpu.tensor.shape_rules import as_dim, dim_value
        if not (isinstance(x, Variable) and hasattr(x.type, "broadcastable")):
            x = as_tensor_variable(x)
        if len(self.given) != x.type.ndim:
            raise ValueError(f"specify_shape: {x} has {x.type.ndim} dimensions but the shape "
                             f"has {len(self.given)} entries")
        if len(entries) != sum(self.given):
            raise TypeError(f"{self} expects {sum(self.given)} shape entries, got {len(entries)}")
        entries = [as_dim(e) for e in entries]
        it = iter(entries)
        bcast = []
        for d, g in enumerate(self.given):
            known_one = g and dim_value(next(it)) == 1
            bcast.append(x.type.broadcastable[d] or known_one)
        return Apply(self, [x, *entries], [x.type.clone(broadcastable=tuple(bcast))()])

    def perform(self, node, inputs, out):
        x, entries = inputs[0], iter(inputs[1:])
        want = tuple(int(next(entries)) if g else None for g in self.given)
        got = tuple(x.shape)
        if len(got) != len(want) or any(w is not None and w != s for w, s in zip(want, got)):
            shown = "(" + ", ".join("?" if w is None else str(w) for w in want) + \
                (",)" if len(want) == 1 else ")")
            raise AssertionError(f"specify_shape: {node.inputs[0]} should have the shape {shown} "
                                 f"but has the shape {got}")
        out[0][0] = x

    def infer_shape(self, fgraph, node, input_shapes):
        entries = iter(node.inputs[1:])
        return [tuple(next(entries) if g else s for g, s in zip(self.given, input_shapes[0]))]

    def grad(self, inputs, output_grads):
        return [output_grads[0]] + [None] * (len(inputs) - 1)

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else self(eval_points[0], *inputs[1:])]


def specify_shape(x: Any, shape: Any) -> Any:
    """`x`, checked at run time to have `shape` (Theano's/PyTensor's): a tuple of ints,
    int scalar variables and None (any length), or a symbolic int vector. The shape
    rewrites use it: `specify_shape(x, (3, n)).shape[0]` is the constant 3."""
    from symgpu.graph.basic import Variable
    from symgpu.tensor.shape_rules import dim_value
    if not (isinstance(x, Variable) and hasattr(x.type, "broadcastable")):
        x = as_tensor_variable(x)
    if isinstance(shape, (int, np.integer)) or (isinstance(shape, Variable) and shape.ndim == 0):
        shape = (shape,)
    if isinstance(shape, Variable):
        from symgpu.tensor.basic import _vector_length
        from symgpu.tensor.subtensor import getitem
        n = _vector_length(shape)
        if n is None:
            raise ValueError(f"specify_shape: cannot tell how many entries the shape {shape} has; "
                             "pass a tuple")
        shape = tuple(getitem(shape, i) for i in range(n))
    shape = tuple(shape)
    if len(shape) != x.type.ndim:
        raise ValueError(f"specify_shape: {x} has {x.type.ndim} dimensions but the shape "
                         f"{shape} has {len(shape)} entries")
    for d, e in enumerate(shape):
        if e is None:
            continue
        v = dim_value(e)
        if v is not None and v < 0:
            raise ValueError(f"specify_shape: entry {d} of the shape {shape} is negative")
        if v is None and not (isinstance(e, Variable) and e.ndim == 0 and e.dtype[0] in "iu"):
            raise TypeError(f"specify_shape: entry {d} of the shape must be an int, None or an "
                            f"integer scalar variable, got {e!r}")
        if v is not None and v != 1 and x.type.broadcastable[d]:
            raise ValueError(f"specify_shape: dimension {d} of {x} ({x.type}) has length 1, "
                             f"the shape {shape} says {v}")
    if all(e is None for e in shape):
        return x
    return SpecifyShape([e is not None for e in shape])(x, *[e for e in shape if e is not None])
