"""Shape queries and pure dimension shuffles: shape, Shape_i, dimshuffle, transpose."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.elemwise import DimShuffle
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Shape", "Shape_i", "shape", "shape_i", "dimshuffle", "transpose",
           "SpecifyBroadcastable", "specify_broadcastable_as", "Unbroadcast"]


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

    def grad(self, inputs, output_grads):
        g = output_grads[0]
        return [specify_broadcastable_as(g, inputs[0].type.clone(dtype=g.dtype))]
