"""Reductions of sparse matrices (Theano's `theano.sparse.basic`): `sp_sum`."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor import math as _tm
from symgpu.tensor.type import TensorType
from symgpu.sparse.construct import SparseFromDense, dense_from_sparse, sp_ones_like
from symgpu.sparse.elemwise import mul_s_d
from symgpu.sparse.type import as_sparse_variable

__all__ = ["SpSum", "sp_sum"]


class SpSum(Op):
    """The sum of a sparse matrix's values: all of them (axis None, a scalar), or along axis 0
    or 1 (a dense vector). With `sparse_grad`, the gradient is structured (x's stored
    positions only), else it is the full gradient (every position), stored sparse."""

    __props__ = ("axis", "structured")

    def __init__(self, axis: int | None = None, sparse_grad: bool = True):
        if axis is not None:
            axis = int(axis)
            if axis < 0:
                axis += 2
            if axis not in (0, 1):
                raise ValueError(f"sp_sum: axis must be None, 0 or 1 for a sparse matrix, got "
                                 f"{axis}")
        self.axis = axis
        self.structured = bool(sparse_grad)

    def make_node(self, x: Any) -> Apply:
        x = as_sparse_variable(x)
        bcast = () if self.axis is None else (False,)
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        (x,) = inputs
        dtype = node.outputs[0].dtype
        if self.axis is None:
            out[0][0] = np.asarray(x.sum(), dtype=dtype)
        else:
            out[0][0] = np.asarray(x.sum(axis=self.axis), dtype=dtype).ravel()

    def infer_shape(self, fgraph, node, input_shapes):
        if self.axis is None:
            return [()]
        return [(input_shapes[0][1 - self.axis],)]

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        if self.axis is None:
            gb = gz.dimshuffle("x", "x")
        elif self.axis == 0:
            gb = gz.dimshuffle("x", 0)
        else:
            gb = gz.dimshuffle(0, "x")
        if self.structured:
            return [mul_s_d(sp_ones_like(x), gb)]
        full = _tm.second(dense_from_sparse(x), gb)
        return [SparseFromDense(x.type.format)(full)]


def sp_sum(x: Any, axis: int | None = None, sparse_grad: bool = False):
    """The sum of sparse x's values (axis None: a scalar; 0 or 1: a dense vector); the
    gradient is structured (only x's stored positions) with `sparse_grad=True`."""
    return SpSum(axis, sparse_grad)(x)
