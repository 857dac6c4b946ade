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
from symgpu.tensor.extra_ops import ArgSort, Sort, argsort, sort  # re-exported: one definition
from symgpu.tensor.math import abs as _abs
from symgpu.tensor.math import zeros_like
from symgpu.tensor.ranges import arange
from symgpu.tensor.shape_rules import as_dim
from symgpu.tensor.subtensor import set_subtensor
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Sort", "ArgSort", "sort", "argsort", "TopKOp", "topk", "argtopk",
           "topk_and_argtopk"]


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
        axis = self.axis % x.ndim
        where = tuple(idx if i == axis else
                      arange(x.shape[i]).dimshuffle([0] + ["x"] * (x.ndim - i - 1))
                      for i in range(x.ndim))
        return [set_subtensor(zeros_like(x, dtype=gz.dtype)[where], gz), None]


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
