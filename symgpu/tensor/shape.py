"""Shape queries and pure dimension shuffles: shape, Shape_i, dimshuffle, transpose."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op, ShapeError
from symgpu.tensor.elemwise import DimShuffle, _closure_thunk
from symgpu.tensor.shape_rules import as_dim, dim_value
from symgpu.tensor.type import (SpecifyBroadcastable, TensorType, TensorVariable, Unbroadcast,
                                as_tensor_variable, check_declared_broadcastable,
                                specify_broadcastable_as)

__all__ = ["Shape", "Shape_i", "shape", "shape_i", "dimshuffle", "transpose",
           "SpecifyBroadcastable", "specify_broadcastable_as", "Unbroadcast", "SpecifyShape",
           "register_shape_reader", "shape_i_of", "shape_tuple", "check_declared_broadcastable"]


class Shape(Op):
    """The shape of a tensor as an int64 vector."""

    __props__ = ()
    reads_only_shape = True  # a device array fed to its input needs no host copy
    shape_read = "all"  # its value is its input's whole shape (GpuShape declares it too)

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
    shape_read = "dim"  # its value is one dimension's length (GpuShape_i declares it too)

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


# ----------------------------------------------------------------------------- reading shapes

#: (type class, maker(var, d) -> int64 scalar) in registration order; the host one is built in
_READERS: list[tuple[type, Callable[[Variable, int], Variable]]] = []


def register_shape_reader(type_cls: type, maker: Callable[[Variable, int], Variable]) -> None:
    """How to read dimension d of a variable of `type_cls` (backends register theirs: the GPU
    one reads a GpuArray's shape with GpuShape_i, no transfer)."""
    _READERS.insert(0, (type_cls, maker))


def _one() -> Variable:
    return as_dim(1)


def shape_i_of(var: Variable, d: int) -> Variable:
    """The length of dimension d of `var` as an int64 scalar: 1 where the type says so, the
    value's length for a constant, else a shape read."""
    if var.type.broadcastable[d]:
        return _one()
    if isinstance(var, Constant) and getattr(var.data, "shape", None) is not None:
        return as_dim(int(var.data.shape[d]))
    for cls, maker in _READERS:
        if isinstance(var.type, cls):
            return maker(var, d)
    return Shape_i(d)(var)


def shape_tuple(var: Variable) -> tuple:
    """The shape of `var` as read from it (no inference)."""
    ndim = getattr(var.type, "ndim", None)
    if ndim is None:
        raise ShapeError(f"{var} ({var.type}) has no shape")
    return tuple(shape_i_of(var, d) for d in range(ndim))



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
