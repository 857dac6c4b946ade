"""Theano's `theano.tensor.sort`: sorting (the ops of `symgpu.tensor.extra_ops`, re-exported)
and the k largest or smallest elements along an axis (`TopKOp`, `topk`, `argtopk`,
`topk_and_argtopk`).

`kth > 0` selects the kth largest elements, `kth < 0` the |kth| smallest; `kth` may be a
symbolic integer scalar. With `sorted=True` the selection comes in order (largest first for
kth > 0, smallest first for kth < 0); with `sorted=False` its order is unspecified (NumPy's
partition order). The gradient of the values scatters the output gradient into the selected
positions of a zero array.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import INT_DTYPES, UINT_DTYPES, is_float, is_int
from symgpu.tensor.basic import flatten
from symgpu.tensor.extra_ops import (ArgSort, ArgSortOp, Sort, SortOp,  # re-exported: one
                                     argsort, sort)                    # definition each
from symgpu.tensor.math import abs as _abs
from symgpu.tensor.ranges import arange
from symgpu.tensor.shape_rules import as_dim
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Sort", "ArgSort", "SortOp", "ArgSortOp", "sort", "argsort", "TopKOp", "topk", "argtopk",
           "topk_and_argtopk", "ScatterAlongAxis"]


def _select(x: np.ndarray, k: int, axis: int, ordered: bool) -> np.ndarray:
    """The indices along `axis` of the k largest (k > 0) or |k| smallest (k < 0) entries."""
    n = x.shape[axis]
    if k > 0:
        idx = np.argpartition(x, n - k, axis=axis)
        idx = np.take(idx, np.arange(n - k, n), axis=axis)
    else:
        idx = np.argpartition(x, -k - 1, axis=axis)
        idx = np.take(idx, np.arange(-k), axis=axis)
    if ordered:
        vals = np.take_along_axis(x, idx, axis=axis)
        order = np.argsort(vals, axis=axis, kind="stable")
        if k > 0:
            order = np.flip(order, axis=axis)
        idx = np.take_along_axis(idx, order, axis=axis)
    return idx


class TopKOp(Op):
    """The k largest (kth > 0) or |kth| smallest (kth < 0) elements along `axis` and/or
    their indices: inputs (x, kth), outputs the values (if `return_values`) then the indices
    (if `return_indices`, of dtype `idx_dtype`). The outputs have x's shape with |kth| along
    `axis`; `sorted=True` orders them (largest first for kth > 0, smallest first for kth < 0).
    """

    __props__ = ("axis", "sorted", "return_values", "return_indices", "idx_dtype")

    def __init__(self, axis: int = -1, sorted: bool = True, idx_dtype: str = "int64",
                 return_values: bool = True, return_indices: bool = True):
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
            raise TypeError(f"TopKOp: axis must be an integer, got {axis!r}")
        if idx_dtype not in INT_DTYPES + UINT_DTYPES:
            raise TypeError(f"TopKOp: idx_dtype must be an integer dtype, got {idx_dtype!r}")
        if not (return_values or return_indices):
            raise ValueError("TopKOp: return_values and return_indices are both False: "
                             "there is nothing to return")
        self.axis, self.sorted, self.idx_dtype = int(axis), bool(sorted), idx_dtype
        self.return_values, self.return_indices = bool(return_values), bool(return_indices)

    def __str__(self) -> str:
        return f"TopKOp{{axis={self.axis}, sorted={self.sorted}}}"

    def make_node(self, x: Any, kth: Any) -> Apply:
        x, kth = as_tensor_variable(x), as_tensor_variable(kth)
        if x.ndim == 0:
            raise ValueError(f"topk: x must have at least one dimension, got the scalar {x} "
                             f"({x.type})")
        if not -x.ndim <= self.axis < x.ndim:
            raise IndexError(f"topk: axis {self.axis} is out of range for {x} with {x.ndim} "
                             f"dimensions ({x.type})")
        if x.dtype.startswith("complex"):
            raise TypeError(f"topk: cannot order complex values ({x}, {x.type})")
        if kth.ndim != 0 or not is_int(kth.dtype):
            raise TypeError(f"topk: kth must be an integer scalar, got {kth} ({kth.type})")
        outs = []
        if self.return_values:
            outs.append(x.type())
        if self.return_indices:
            outs.append(TensorType(self.idx_dtype, x.broadcastable)())
        return Apply(self, [x, kth], outs)

    def perform(self, node, inputs, output_storage):
        x, k = inputs
        k = int(k)
        axis = self.axis % x.ndim
        n = x.shape[axis]
        if k == 0:
            raise ValueError(f"topk: kth must not be 0 (x of shape {x.shape}, dtype {x.dtype})")
        if abs(k) > n:
            raise ValueError(f"topk: |kth| = {abs(k)} is larger than the length {n} of axis "
                             f"{axis} of x (shape {x.shape}, dtype {x.dtype})")
        idx = _select(x, k, axis, self.sorted)
        outs = iter(output_storage)
        if self.return_values:
            next(outs)[0] = np.take_along_axis(x, idx, axis=axis)
        if self.return_indices:
            next(outs)[0] = idx.astype(self.idx_dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        shp = list(input_shapes[0])
        shp[self.axis % len(shp)] = as_dim(_abs(node.inputs[1]))
        return [tuple(shp)] * len(node.outputs)

    def connection_pattern(self, node):
        return [[True] * len(node.outputs), [False] * len(node.outputs)]

    def L_op(self, inputs, outputs, output_grads):
        x, kth = inputs
        if not self.return_values or not is_float(x.dtype):
            return [None, None]  # only indices (piecewise constant) or integer values
        gz = output_grads[0]
        if self.return_indices:
            idx = outputs[-1]
        else:
            idx = TopKOp(self.axis, self.sorted, "int64", return_values=False)(x, kth)
        return [ScatterAlongAxis(self.axis % x.ndim)(x, idx, gz), None]


def _along(idx: Any, axis: int, ndim: int) -> tuple:
    """The advanced index reading `idx`'s positions along `axis` (np.take_along_axis)."""
    return tuple(idx if i == axis else
                 arange(idx.shape[i]).dimshuffle([0] + ["x"] * (ndim - i - 1))
                 for i in range(ndim))


class ScatterAlongAxis(Op):
    """Zeros of x's shape (gz's dtype) with gz put at the indices `idx` along `axis`
    (np.put_along_axis; the indices of a row distinct): the gradient of topk's values, one
    op so that the GPU runs it as one kernel."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"ScatterAlongAxis{{{self.axis}}}"

    def make_node(self, x: Any, idx: Any, gz: Any) -> Apply:
        x, idx, gz = (as_tensor_variable(v) for v in (x, idx, gz))
        if not is_int(idx.dtype):
            raise TypeError(f"{self}: the indices must be integers, got {idx} ({idx.type})")
        if not (x.ndim == idx.ndim == gz.ndim) or not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: x {x} ({x.type}), indices {idx} ({idx.type}) and "
                             f"gradient {gz} ({gz.type}) need one number of dimensions, "
                             f"above the axis")
        return Apply(self, [x, idx, gz], [TensorType(gz.dtype, x.broadcastable)()])

    def perform(self, node, inputs, out):
        x, idx, gz = inputs
        if idx.shape != gz.shape:
            raise ValueError(f"{self}: indices of shape {idx.shape} and gradient of shape "
                             f"{gz.shape} differ")
        res = np.zeros(x.shape, dtype=gz.dtype)
        np.put_along_axis(res, idx.astype(np.int64), gz, axis=self.axis)
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def connection_pattern(self, node):
        return [[False], [False], [True]]

    def grad(self, inputs, output_grads):
        x, idx, gz = inputs
        g = output_grads[0]
        return [None, None, g[_along(idx, self.axis, x.ndim)]]

def _topk_node(x: Any, kth: Any, axis: Any, sorted: bool, idx_dtype: str, values: bool,
               indices: bool) -> Any:
    x = as_tensor_variable(x)
    if axis is None:
        x, axis = flatten(x, 1), 0
    return TopKOp(axis, sorted, idx_dtype, values, indices)(x, kth)


def topk(x: Any, kth: Any, axis: int | None = -1, sorted: bool = True,
         idx_dtype: str = "int64") -> TensorVariable:
    """The kth largest elements of `x` along `axis` (of the flattened x if None); kth < 0:
    the |kth| smallest. `sorted`: largest (kth < 0: smallest) first."""
    return _topk_node(x, kth, axis, sorted, idx_dtype, True, False)


def argtopk(x: Any, kth: Any, axis: int | None = -1, sorted: bool = True,
            idx_dtype: str = "int64") -> TensorVariable:
    """The indices along `axis` of the elements `topk` selects (dtype `idx_dtype`)."""
    return _topk_node(x, kth, axis, sorted, idx_dtype, False, True)


def topk_and_argtopk(x: Any, kth: Any, axis: int | None = -1, sorted: bool = True,
                     idx_dtype: str = "int64") -> tuple[TensorVariable, TensorVariable]:
    """`(topk(...), argtopk(...))` from one op."""
    values, indices = _topk_node(x, kth, axis, sorted, idx_dtype, True, True)
    return values, indices
