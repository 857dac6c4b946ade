"""Products with sparse matrices (Theano's `theano.sparse.basic`): `structured_dot` (sparse x
dense, gradient only on the sparse operand's pattern), `dot` (dense result, full gradient)
and `true_dot` (sparse result for two sparse operands)."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, upcast
from symgpu.tensor import math as _tm
from symgpu.tensor.shape_rules import dot_shape
from symgpu.tensor.type import TensorType, as_tensor_variable
from symgpu.sparse.construct import (SparseFromDense, _sp_value, cast, dense_from_sparse, transpose)
from symgpu.sparse.type import (SparseType, SparseVariable, _is_sparse_variable,
                                as_sparse_or_tensor_variable, as_sparse_variable)

__all__ = ["StructuredDot", "StructuredDotGrad", "structured_dot", "Dot", "dot", "TrueDot",
           "true_dot"]


def _check_inner(what: str, x: Any, y: Any) -> None:
    if x.shape[-1] != y.shape[0]:
        kind = lambda v: f"{'sparse ' + v.format if ssp.issparse(v) else 'dense'} {v.shape}"
        raise ValueError(f"{what}: shapes {kind(x)} and {kind(y)} are not aligned")


def _dense_out(value: Any, dtype: str) -> np.ndarray:
    if ssp.issparse(value):
        value = value.toarray()
    return np.asarray(value, dtype=dtype)


class StructuredDot(Op):
    """Sparse a (csr or csc) times b: dense b gives a dense matrix, sparse b a sparse one (a's
    format). The gradient of a is structured: only its stored positions."""

    __props__ = ()

    def make_node(self, a: Any, b: Any) -> Apply:
        a = as_sparse_variable(a)
        b = as_sparse_or_tensor_variable(b)
        dtype = upcast(a.dtype, b.dtype)
        if _is_sparse_variable(b):
            return Apply(self, [a, b], [SparseType(a.type.format, dtype)()])
        if b.ndim != 2:
            raise TypeError(f"structured_dot: the dense operand {b} ({b.type}) must be a matrix")
        return Apply(self, [a, b], [TensorType(dtype, (False, b.broadcastable[1]))()])

    def perform(self, node, inputs, out):
        a, b = inputs
        _check_inner("structured_dot", a, b)
        o = node.outputs[0]
        r = a @ b
        out[0][0] = _sp_value(r, o) if isinstance(o.type, SparseType) else _dense_out(r, o.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [dot_shape(input_shapes[0], input_shapes[1])]

    def grad(self, inputs, output_grads):
        (a, b), (gz,) = inputs, output_grads
        if _is_sparse_variable(b):
            raise NotImplementedError("structured_dot of two sparse matrices has no gradient "
                                      "(use true_dot)")
        ga = StructuredDotGrad()(a, b, gz) if is_float(a.dtype) else None
        gb = structured_dot(transpose(a), gz) if is_float(b.dtype) else None
        return [ga, gb]


class StructuredDotGrad(Op):
    """`StructuredDotGrad()(a, b, gz)`: the gradient of structured_dot(a, b) with respect to
    sparse a: (gz . b^T) at a's stored positions, with a's pattern and format."""

    __props__ = ()

    def make_node(self, a: Any, b: Any, gz: Any) -> Apply:
        a = as_sparse_variable(a)
        b, gz = as_tensor_variable(b), as_tensor_variable(gz)
        if b.ndim != 2 or gz.ndim != 2:
            raise TypeError(f"StructuredDotGrad: b and gz must be matrices, got {b.type} and "
                            f"{gz.type}")
        return Apply(self, [a, b, gz], [SparseType(a.type.format, upcast(b.dtype, gz.dtype))()])

    def perform(self, node, inputs, out):
        a, b, gz = inputs
        coo = a.tocoo()
        vals = np.einsum("ij,ij->i", gz[coo.row], b[coo.col]) if coo.nnz else \
            np.zeros(0, node.outputs[0].dtype)
        g = SparseType.format_cls[a.format]((vals, (coo.row, coo.col)), shape=a.shape)
        out[0][0] = _sp_value(g, node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


def structured_dot(x: Any, y: Any) -> Any:
    """x . y with at least one sparse operand; a sparse x's gradient is structured (its stored
    positions only). Dense y: a dense result; a sparse x and a dense one: (y^T . x^T)^T."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    xs, ys = _is_sparse_variable(x), _is_sparse_variable(y)
    if not xs and not ys:
        raise TypeError(f"structured_dot needs at least one sparse argument, got {x.type} and "
                        f"{y.type}")
    if xs:
        return StructuredDot()(x, y)
    if x.ndim != 2:
        raise TypeError(f"structured_dot: the dense operand {x} ({x.type}) must be a matrix")
    return StructuredDot()(transpose(y), x.T).T


class Dot(Op):
    """x . y with at least one sparse operand (the dense one a vector or a matrix): always a
    dense result; the gradients are the full (not structured) ones."""

    __props__ = ()

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
        xs, ys = _is_sparse_variable(x), _is_sparse_variable(y)
        if not xs and not ys:
            raise TypeError(f"sparse Dot needs at least one sparse argument, got {x.type} and "
                            f"{y.type}")
        for v, s, name in ((x, xs, "x"), (y, ys, "y")):
            if not s and v.ndim not in (1, 2):
                raise TypeError(f"sparse dot: the dense operand {name} = {v} ({v.type}) must be "
                                "a vector or a matrix")
        bx = (False,) * x.ndim if xs else x.broadcastable
        by = (False,) * y.ndim if ys else y.broadcastable
        bout = bx[:-1] + by[1:]
        return Apply(self, [x, y], [TensorType(upcast(x.dtype, y.dtype), bout)()])

    def perform(self, node, inputs, out):
        x, y = inputs
        _check_inner("sparse dot", x, y)
        if ssp.issparse(x):
            r = x @ y
        else:  # dense x: (y^T x^T)^T keeps the product on the sparse side
            r = (y.T @ x.T).T
        r = _dense_out(r, node.outputs[0].dtype)
        out[0][0] = r.reshape(r.shape[:-1]) if (ssp.issparse(x) and np.ndim(y) == 1 and r.ndim == 2) else r

    def infer_shape(self, fgraph, node, input_shapes):
        return [dot_shape(input_shapes[0], input_shapes[1])]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads

        def prod(a, b):
            """a . b (a sparse Dot where one is sparse), an outer product for two vectors."""
            if a.ndim == 1 and b.ndim == 1:
                return _tm.outer(a, b)
            return Dot()(a, b) if (_is_sparse_variable(a) or _is_sparse_variable(b)) \
                else _tm.dot(a, b)

        def tr(v):
            return transpose(v) if _is_sparse_variable(v) else v.T

        gx = gy = None
        if is_float(x.dtype):
            if x.ndim == 1:         # dense vector . sparse matrix: y . gz
                gx = prod(y, gz)
            elif y.ndim == 1:       # sparse matrix . dense vector: outer(gz, y)
                gx = prod(gz, y)
            else:
                gx = prod(gz, tr(y))
            if _is_sparse_variable(x):
                gx = SparseFromDense(x.type.format)(cast_dense(gx, x.dtype))
        if is_float(y.dtype):
            if x.ndim == 1:
                gy = prod(x, gz)
            else:
                gy = prod(tr(x), gz)
            if _is_sparse_variable(y):
                gy = SparseFromDense(y.type.format)(cast_dense(gy, y.dtype))
        return [gx, gy]


def cast_dense(v: Any, dtype: str) -> Any:
    return v if v.dtype == dtype else _tm.cast(v, dtype)


def dot(x: Any, y: Any) -> Any:
    """x . y with at least one sparse operand (a dense result; full gradients)."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    if not _is_sparse_variable(x) and not _is_sparse_variable(y):
        raise TypeError(f"sparse.dot needs at least one sparse argument, got {x.type} and "
                        f"{y.type}")
    return Dot()(x, y)


class TrueDot(Op):
    """Sparse x . y: a sparse result (x's format) for sparse y, a dense one for a dense
    matrix y. With `grad_preserves_dense` (the default), a dense y's gradient is dense."""

    __props__ = ("grad_preserves_dense",)

    def __init__(self, grad_preserves_dense: bool = True):
        self.grad_preserves_dense = bool(grad_preserves_dense)

    def make_node(self, x: Any, y: Any) -> Apply:
        x = as_sparse_variable(x)
        y = as_sparse_or_tensor_variable(y)
        dtype = upcast(x.dtype, y.dtype)
        if _is_sparse_variable(y):
            return Apply(self, [x, y], [SparseType(x.type.format, dtype)()])
        if y.ndim != 2:
            raise TypeError(f"true_dot: the dense operand {y} ({y.type}) must be a matrix")
        return Apply(self, [x, y], [TensorType(dtype, (False, y.broadcastable[1]))()])

    def perform(self, node, inputs, out):
        x, y = inputs
        _check_inner("true_dot", x, y)
        o = node.outputs[0]
        r = x @ y
        out[0][0] = _sp_value(r, o) if isinstance(o.type, SparseType) else _dense_out(r, o.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [dot_shape(input_shapes[0], input_shapes[1])]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        if _is_sparse_variable(y):   # gz sparse, x's format
            gx = TrueDot()(gz, transpose(y))          # x's format
            gy = transpose(TrueDot()(transpose(gz), x))   # (x^T gz)^T^T: format of gz^T flipped back
            gy = gy if gy.type.format == y.type.format else \
                SparseFromDense(y.type.format)(dense_from_sparse(gy))
            return [cast(gx, x.dtype), cast(gy, y.dtype)]
        gx = SparseFromDense(x.type.format)(cast_dense(_tm.dot(gz, y.T), x.dtype))
        # symgpu.grad gives a dense y a dense gradient (grad_preserves_dense either way)
        return [gx, cast_dense(TrueDot()(transpose(x), gz), y.dtype)]


def true_dot(x: Any, y: Any, grad_preserves_dense: bool = True) -> Any:
    """x . y with at least one sparse operand: two sparse operands give a sparse result, a
    sparse and a dense matrix a dense one."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    xs, ys = _is_sparse_variable(x), _is_sparse_variable(y)
    if not xs and not ys:
        raise TypeError(f"true_dot needs at least one sparse argument, got {x.type} and {y.type}")
    if xs:
        return TrueDot(grad_preserves_dense)(x, y)
    if x.ndim != 2:
        raise TypeError(f"true_dot: the dense operand {x} ({x.type}) must be a matrix")
    return TrueDot(grad_preserves_dense)(transpose(y), x.T).T
