"""Each column or row of a sparse matrix scaled by a dense vector (Theano's `col_scale` /
`row_scale` of `theano.sparse.basic`); structured gradients (x's stored positions)."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable
from symgpu.sparse.construct import transpose
from symgpu.sparse.elemwise import mul
from symgpu.sparse.reductions import sp_sum
from symgpu.sparse.type import SparseVariable, as_sparse_variable, describe

__all__ = ["ColScaleCSC", "RowScaleCSC", "col_scale", "row_scale"]


def _csc_and_vector(op: Op, x: Any, s: Any) -> tuple:
    name = type(op).__name__
    try:
        x = as_sparse_variable(x)
    except TypeError as exc:
        raise TypeError(f"{name}: x: {exc}") from None
    if x.type.format != "csc":
        raise ValueError(f"{name}: x must be a csc matrix, got {x} ({x.type})")
    s = as_tensor_variable(s)
    if s.ndim != 1:
        raise TypeError(f"{name}: s must be a vector, got {s} ({s.type})")
    return x, s


class ColScaleCSC(Op):
    """A csc matrix with each column j multiplied by s[j] (s: a dense vector as long as x is
    wide); the result keeps x's type."""

    __props__ = ()
    axis = 1   # the axis s runs along

    def make_node(self, x: Any, s: Any) -> Apply:
        x, s = _csc_and_vector(self, x, s)
        return Apply(self, [x, s], [x.type()])

    def perform(self, node, inputs, out):
        x, s = inputs
        if s.shape != (x.shape[self.axis],):
            raise ValueError(f"{type(self).__name__}: s of shape {s.shape} does not fit "
                             f"{describe(x)} (it needs {x.shape[self.axis]} values)")
        factor = (np.repeat(s, np.diff(x.indptr)) if self.axis == 1 else s[x.indices])
        data = (x.data * factor).astype(x.dtype, copy=False)
        out[0][0] = ssp.csc_matrix((data, x.indices.copy(), x.indptr.copy()), shape=x.shape)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        x, s = inputs
        (gz,) = output_grads
        scale = col_scale if self.axis == 1 else row_scale
        return [scale(gz, s), sp_sum(mul(x, gz), axis=1 - self.axis)]


class RowScaleCSC(ColScaleCSC):
    """A csc matrix with each row i multiplied by s[i] (s as long as x is high)."""

    axis = 0


def col_scale(x: Any, s: Any) -> SparseVariable:
    """Each column j of sparse `x` multiplied by the dense vector's s[j], in x's format;
    structured gradient."""
    x = as_sparse_variable(x)
    if x.type.format == "csc":
        return ColScaleCSC()(x, s)
    return transpose(RowScaleCSC()(transpose(x), s))


def row_scale(x: Any, s: Any) -> SparseVariable:
    """Each row i of sparse `x` multiplied by the dense vector's s[i], in x's format;
    structured gradient."""
    return transpose(col_scale(transpose(as_sparse_variable(x)), s))
