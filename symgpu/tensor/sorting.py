"""Sorting along one axis: `Sort`/`ArgSort` (a Python-int axis, the ops the rewrites and the
GPU know), their gradient `PermuteAlongAxis`, Theano's `SortOp`/`ArgSortOp` (the axis a
symbolic input) with `TakeAlongAxis`, and the functions `sort`/`argsort`. Re-exported by
extra_ops.py and sort.py, their documented paths.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.axis_args import norm_axis as _norm_axis, require_int as _require_int
from symgpu.tensor.basic import flatten
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Sort", "ArgSort", "PermuteAlongAxis", "SortOp", "ArgSortOp", "TakeAlongAxis",
           "sort", "argsort"]

_SORT_KINDS = ("quicksort", "mergesort", "heapsort", "stable")


# ============================================================================ sort / argsort

class _SortBase(Op):
    __props__ = ("axis", "kind")

    def __init__(self, axis: int, kind: str = "quicksort"):
        if kind not in _SORT_KINDS:
            raise ValueError(f"{type(self).__name__}: kind must be one of {_SORT_KINDS}, "
                             f"got {kind!r}")
        self.axis, self.kind = int(axis), kind

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{self.axis}, {self.kind}}}"

    def _check(self, x: TensorVariable) -> None:
        if not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x} ({x.type})")
        if x.dtype.startswith("complex"):
            raise TypeError(f"{self}: cannot sort complex values ({x}, {x.type})")

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


class Sort(_SortBase):
    """np.sort along one axis."""

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        self._check(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = np.sort(inputs[0], axis=self.axis, kind=self.kind)

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        # sorted[j] = x[p[j]] with p = argsort(x): x[i] receives gz[inv[i]], inv = argsort(p)
        p = ArgSort(self.axis, self.kind)(x)
        inv = ArgSort(self.axis, "stable")(p)
        return [PermuteAlongAxis(self.axis)(gz, inv)]


class ArgSort(_SortBase):
    """np.argsort along one axis (int64 indices)."""

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        self._check(x)
        return Apply(self, [x], [TensorType("int64", x.broadcastable)()])

    def perform(self, node, inputs, out):
        out[0][0] = np.argsort(inputs[0], axis=self.axis, kind=self.kind).astype("int64")

    def grad(self, inputs, output_grads):
        return [None]


class PermuteAlongAxis(Op):
    """np.take_along_axis(values, perm, axis) where `perm` is a permutation along `axis`
    (an argsort): the gradient of Sort, and its own gradient is the inverse permutation."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def make_node(self, values: Any, perm: Any) -> Apply:
        values, perm = as_tensor_variable(values), as_tensor_variable(perm)
        _require_int(perm, str(self), "the permutation")
        if perm.ndim != values.ndim:
            raise ValueError(f"{self}: values {values} ({values.type}) and permutation {perm} "
                             f"({perm.type}) differ in dimensions")
        return Apply(self, [values, perm], [values.type()])

    def perform(self, node, inputs, out):
        values, perm = inputs
        out[0][0] = np.take_along_axis(values, perm, axis=self.axis)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        values, perm = inputs
        if not is_float(values.dtype):
            return [None, None]
        return [PermuteAlongAxis(self.axis)(output_grads[0], ArgSort(self.axis, "stable")(perm)),
                None]


# Theano's SortOp(kind, order) / ArgSortOp take the axis as a symbolic input (a scalar whose
# value is known only when the function runs). An axis known when the graph is built (a
# Python int, None or a constant) makes symgpu's Sort / ArgSort node, the one the rewrites and
# the GPU know; and `isinstance(node.op, SortOp)` holds for those nodes too, so code written
# for Theano that looks for SortOp nodes finds them.

class _SortFamily(type):
    """The metaclass of SortOp / ArgSortOp: their isinstance also accepts the static-axis
    op (Sort / ArgSort) that they build for an axis known in advance."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, cls._static)


def _constant_axis(axis: Any) -> tuple[bool, Any]:
    """(True, the int or None) for an axis known now; (False, the scalar variable) else."""
    if isinstance(axis, Constant):
        axis = axis.data
    if isinstance(axis, Variable):
        return False, axis
    if axis is None:
        return True, None
    value = np.asarray(axis)
    if value.ndim != 0 or value.dtype.kind not in "iuf" or int(value) != value:
        raise TypeError(f"sort: the axis must be an integer, None or a symbolic scalar, "
                        f"got {axis!r}")
    return True, int(value)


class _SymbolicAxisSort(Op, metaclass=_SortFamily):
    __props__ = ("kind", "order")
    _static: type = _SortBase
    _what = "sort"

    def __init__(self, kind: str = "quicksort", order: Any = None):
        if kind not in _SORT_KINDS:
            raise ValueError(f"{type(self).__name__}: kind must be one of {_SORT_KINDS}, "
                             f"got {kind!r}")
        if order:   # Theano's tests pass order=[]: no field names
            raise ValueError(f"{type(self).__name__}: order= needs structured dtypes, which "
                             "symgpu has not")
        self.kind, self.order = kind, None

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{self.kind}, {self.order}}}"

    def make_node(self, x: Any, axis: Any = -1) -> Apply:
        x = as_tensor_variable(x)
        known, axis = _constant_axis(axis)
        if known:   # symgpu's node (its op is still an instance of this class, see above)
            x, axis = (flatten(x, 1), 0) if axis is None else (x, _norm_axis(x, axis,
                                                                            self._what))
            return self._static(axis, self.kind).make_node(x)
        axis = as_tensor_variable(axis)
        if axis.ndim != 0 or axis.dtype.startswith(("complex", "bool")):
            raise TypeError(f"{self}: the axis must be a real scalar, got {axis} ({axis.type})")
        if x.ndim == 0 or x.dtype.startswith("complex"):
            raise TypeError(f"{self}: cannot sort {x} ({x.type})")
        return Apply(self, [x, axis], [self._out_type(x)()])

    def _out_type(self, x: TensorVariable) -> TensorType:
        return x.type

    def _axis(self, node: Apply, value: Any) -> int:
        axis = np.asarray(value).item()
        if int(axis) != axis or not -node.inputs[0].ndim <= axis < node.inputs[0].ndim:
            raise ValueError(f"{self}: axis {axis} is not an axis of the input "
                             f"({node.inputs[0].ndim} dimensions)")
        return int(axis)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


class SortOp(_SymbolicAxisSort):
    """Theano's ``SortOp(kind, order)``: ``SortOp(kind)(x, axis)`` sorts x along `axis`, a
    symbolic scalar; an axis known in advance makes a `Sort` node instead."""

    _static = Sort

    def perform(self, node, inputs, out):
        x, axis = inputs
        out[0][0] = np.sort(x, axis=self._axis(node, axis), kind=self.kind)

    def grad(self, inputs, output_grads):
        (x, axis), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None, None]
        p = ArgSortOp(self.kind)(x, axis)
        return [TakeAlongAxis()(gz, ArgSortOp("stable")(p, axis), axis), None]


class ArgSortOp(_SymbolicAxisSort):
    """Theano's ``ArgSortOp(kind, order)``: the int64 indices that sort x along `axis`, a
    symbolic scalar; an axis known in advance makes an `ArgSort` node instead."""

    _static = ArgSort
    _what = "argsort"

    def _out_type(self, x: TensorVariable) -> TensorType:
        return TensorType("int64", x.broadcastable)

    def perform(self, node, inputs, out):
        x, axis = inputs
        out[0][0] = np.argsort(x, axis=self._axis(node, axis), kind=self.kind).astype("int64")

    def grad(self, inputs, output_grads):
        return [None, None]


class TakeAlongAxis(Op):
    """np.take_along_axis(values, perm, axis) for a permutation `perm` along a symbolic
    `axis`: the gradient of SortOp; its own gradient applies the inverse permutation."""

    __props__ = ()

    def make_node(self, values: Any, perm: Any, axis: Any) -> Apply:
        values, perm, axis = map(as_tensor_variable, (values, perm, axis))
        _require_int(perm, str(self), "the permutation")
        if perm.ndim != values.ndim or axis.ndim != 0:
            raise ValueError(f"{self}: values {values} ({values.type}) and permutation {perm} "
                             f"({perm.type}) differ in dimensions, or axis {axis} "
                             f"({axis.type}) is not a scalar")
        return Apply(self, [values, perm, axis], [values.type()])

    def perform(self, node, inputs, out):
        values, perm, axis = inputs
        out[0][0] = np.take_along_axis(values, perm, axis=int(np.asarray(axis).item()))

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        values, perm, axis = inputs
        if not is_float(values.dtype):
            return [None, None, None]
        return [TakeAlongAxis()(output_grads[0], ArgSortOp("stable")(perm, axis), axis),
                None, None]


def _sort_args(a: Any, axis: Any, kind: str, order: Any, what: str) -> tuple:
    if order:
        raise ValueError(f"{what}: order= needs structured dtypes, which symgpu has not")
    a = as_tensor_variable(a)
    known, axis = _constant_axis(axis)
    if not known:
        return a, axis
    if axis is None:
        return flatten(a, 1), 0
    return a, _norm_axis(a, axis, what)


def sort(a: Any, axis: Any = -1, kind: str = "quicksort", order: Any = None
         ) -> TensorVariable:
    """A sorted copy of `a` along `axis` (of the flattened array if None), as np.sort; a
    symbolic scalar axis (Theano's) is read when the function runs."""
    a, axis = _sort_args(a, axis, kind, order, "sort")
    if isinstance(axis, Variable):
        return SortOp(kind)(a, axis)
    return Sort(axis, kind)(a)


def argsort(a: Any, axis: Any = -1, kind: str = "quicksort", order: Any = None
            ) -> TensorVariable:
    """The indices that sort `a` along `axis` (int64), as np.argsort; a symbolic scalar axis
    (Theano's) is read when the function runs."""
    a, axis = _sort_args(a, axis, kind, order, "argsort")
    if isinstance(axis, Variable):
        return ArgSortOp(kind)(a, axis)
    return ArgSort(axis, kind)(a)
