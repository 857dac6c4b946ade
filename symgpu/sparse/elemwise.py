"""Elementwise sparse arithmetic (Theano's `theano.sparse.basic`): add, sub and mul of sparse
and dense operands, and the structured functions, which apply to the stored values only
(the zeros of the pattern stay zeros: `structured_exp(x)` is not `exp(x)`)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import upcast
import symgpu.tensor as _T
from symgpu.tensor import math as _tm
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable
from symgpu.sparse import construct as _basic
from symgpu.sparse.construct import (CSM, _sp_value, cast, csm_properties, dense_from_sparse, neg,
                                 sp_ones_like)
from symgpu.sparse.type import (SparseType, SparseVariable, _is_sparse_variable,
                                as_sparse_or_tensor_variable, as_sparse_variable)

__all__ = ["AddSS", "AddSD", "MulSS", "MulSD", "add_s_s", "add_s_d", "mul_s_s", "mul_s_d",
           "add", "sub", "mul", "structured_monoid", "structured_sigmoid", "structured_exp",
           "structured_log", "structured_pow", "structured_minimum", "structured_maximum",
           "structured_add", "sin", "tan", "arcsin", "arctan", "sinh", "arcsinh", "tanh",
           "arctanh", "sgn", "ceil", "floor", "log1p", "expm1", "deg2rad", "rad2deg", "sqr",
           "sqrt"]


def _same_dtype(x: SparseVariable, y: Any) -> tuple:
    """Sparse x and y (sparse or dense) cast to their common dtype."""
    dtype = upcast(x.dtype, y.dtype)
    x = cast(x, dtype)
    if _is_sparse_variable(y):
        y = cast(y, dtype)
    elif y.dtype != dtype:
        y = _tm.cast(y, dtype)
    return x, y


def _sum_to(g: TensorVariable, y: TensorVariable) -> TensorVariable:
    """The gradient `g` of a matrix summed back to y's shape (y broadcast, or of fewer dims)."""
    lead = g.ndim - y.ndim
    axes = list(range(lead)) + [lead + d for d, b in enumerate(y.broadcastable) if b]
    if axes:
        g = g.sum(axis=axes, keepdims=True)
        if lead:
            g = g.dimshuffle(*range(lead, g.ndim))
    return g


# ============================================================================ add

class _SparseSparse(Op):
    """An elementwise op of two sparse matrices of one format and dtype (`what`: add or mul):
    a sparse matrix of their shape; `compute` on the SciPy values."""

    __props__ = ()
    what = ""

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_sparse_variable(x), as_sparse_variable(y)
        if x.type != y.type:
            raise TypeError(f"{self.what}_s_s: {x} ({x.type}) and {y} ({y.type}) must have "
                            f"the same format and dtype (sparse.{self.what} casts the dtypes)")
        return Apply(self, [x, y], [x.type()])

    def perform(self, node, inputs, out):
        x, y = inputs
        if x.shape != y.shape:
            raise ValueError(f"sparse {self.what}: shapes {x.shape} and {y.shape} differ")
        out[0][0] = _sp_value(self.compute(x, y), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


class AddSS(_SparseSparse):
    """Sparse + sparse (same format and dtype): a sparse matrix."""

    what = "add"

    @staticmethod
    def compute(x: Any, y: Any) -> Any:
        return x + y

    def grad(self, inputs, output_grads):
        (gz,) = output_grads
        return [gz, gz]


class AddSD(Op):
    """Sparse + dense matrix: a dense matrix. x's gradient is structured (its pattern)."""

    __props__ = ()

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_sparse_variable(x), as_tensor_variable(y)
        if y.ndim != 2:
            raise TypeError(f"add_s_d: the dense operand {y} ({y.type}) must be a matrix")
        if x.dtype != y.dtype:
            raise TypeError(f"add_s_d: {x} ({x.type}) and {y} ({y.type}) must have the same "
                            "dtype (sparse.add casts them)")
        return Apply(self, [x, y], [TensorType(x.dtype, (False, False))()])

    def perform(self, node, inputs, out):
        x, y = inputs
        if y.shape[0] not in (1, x.shape[0]) or y.shape[1] not in (1, x.shape[1]):
            raise ValueError(f"sparse add: shapes {x.shape} (sparse) and {y.shape} (dense) do "
                             "not match")
        out[0][0] = np.asarray(x.toarray() + y, dtype=node.outputs[0].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        return [mul_s_d(sp_ones_like(x), gz), _sum_to(gz, y)]


add_s_s = AddSS()
add_s_d = AddSD()


def add(x: Any, y: Any) -> Any:
    """x + y where one at least is sparse: sparse + sparse is sparse, sparse + dense is
    dense."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    xs, ys = _is_sparse_variable(x), _is_sparse_variable(y)
    if not xs and not ys:
        raise TypeError(f"sparse.add: one of {x} and {y} must be sparse")
    if xs and ys:
        x, y = _same_dtype(x, y)
        return add_s_s(x, y)
    if ys:
        x, y = y, x
    x, y = _same_dtype(x, y)
    return add_s_d(x, y)


def sub(x: Any, y: Any) -> Any:
    """x - y where one at least is sparse (x + (-y))."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    return add(x, neg(y) if _is_sparse_variable(y) else -y)


# ============================================================================ mul

class MulSS(_SparseSparse):
    """Elementwise sparse * sparse (same format and dtype): a sparse matrix."""

    what = "mul"

    @staticmethod
    def compute(x: Any, y: Any) -> Any:
        return x.multiply(y)

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        return [mul_s_s(y, gz), mul_s_s(x, gz)]


class MulSD(Op):
    """Elementwise sparse * dense (a scalar, vector or matrix, broadcast as NumPy): a sparse
    matrix with x's pattern."""

    __props__ = ()

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_sparse_variable(x), as_tensor_variable(y)
        if y.ndim > 2:
            raise TypeError(f"mul_s_d: the dense operand {y} ({y.type}) has more than 2 "
                            "dimensions")
        if x.dtype != y.dtype:
            raise TypeError(f"mul_s_d: {x} ({x.type}) and {y} ({y.type}) must have the same "
                            "dtype (sparse.mul casts them)")
        return Apply(self, [x, y], [x.type()])

    def perform(self, node, inputs, out):
        x, y = inputs
        if y.ndim == 0:
            z = x.copy()
            z.data = z.data * y
        else:
            yb = y.reshape((1,) * (2 - y.ndim) + y.shape)
            if yb.shape[0] not in (1, x.shape[0]) or yb.shape[1] not in (1, x.shape[1]):
                raise ValueError(f"sparse mul: shapes {x.shape} (sparse) and {y.shape} (dense) "
                                 "do not match")
            coo = x.tocoo()
            vals = coo.data * yb[coo.row if yb.shape[0] > 1 else 0,
                                 coo.col if yb.shape[1] > 1 else 0]
            z = ssp.coo_matrix((vals, (coo.row, coo.col)), shape=x.shape)
        out[0][0] = _sp_value(z, node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        gy = dense_from_sparse(mul_s_s(x, gz))
        return [mul_s_d(gz, y), _sum_to(gy, y)]


mul_s_s = MulSS()
mul_s_d = MulSD()
_basic._MUL_SD[0] = mul_s_d


def mul(x: Any, y: Any) -> SparseVariable:
    """Elementwise x * y where one at least is sparse: a sparse result (with the sparse
    operand's pattern when the other is dense)."""
    x, y = as_sparse_or_tensor_variable(x), as_sparse_or_tensor_variable(y)
    xs, ys = _is_sparse_variable(x), _is_sparse_variable(y)
    if not xs and not ys:
        raise TypeError(f"sparse.mul: one of {x} and {y} must be sparse")
    if xs and ys:
        x, y = _same_dtype(x, y)
        return mul_s_s(x, y)
    if ys:
        x, y = y, x
    x, y = _same_dtype(x, y)
    return mul_s_d(x, y)


# ============================================================================ structured functions

def structured_monoid(tensor_op: Callable) -> Callable:
    """A decorator making `f(x, *scalars)` apply `tensor_op` to the stored values of sparse x
    (and the scalar arguments): the result has x's pattern."""
    def decorator(f: Callable) -> Callable:
        def wrapper(*args: Any) -> SparseVariable:
            x = as_sparse_variable(args[0])
            scalars = []
            for i, a in enumerate(args[1:], 1):
                a = as_tensor_variable(a)
                if a.ndim != 0:
                    raise TypeError(f"{f.__name__}: argument {i} must be a scalar, got {a} "
                                    f"({a.type})")
                scalars.append(a)
            data, ind, ptr, shape = csm_properties(x)
            data = tensor_op(data, *scalars)
            return CSM(x.type.format)(data, ind, ptr, shape)
        wrapper.__name__ = f.__name__
        wrapper.__qualname__ = f.__qualname__
        wrapper.__doc__ = f.__doc__
        return wrapper
    return decorator


@structured_monoid(_tm.sigmoid)
def structured_sigmoid(x):
    """sigmoid of the stored values of sparse x."""


@structured_monoid(_tm.exp)
def structured_exp(x):
    """exp of the stored values of sparse x."""


@structured_monoid(_tm.log)
def structured_log(x):
    """log of the stored values of sparse x."""


@structured_monoid(lambda d, y: _tm.pow(d, y))
def structured_pow(x, y):
    """The stored values of sparse x to the power of scalar y."""


@structured_monoid(lambda d, y: _tm.minimum(d, y))
def structured_minimum(x, y):
    """minimum of the stored values of sparse x and scalar y."""


@structured_monoid(lambda d, y: _tm.maximum(d, y))
def structured_maximum(x, y):
    """maximum of the stored values of sparse x and scalar y."""


@structured_monoid(lambda d, y: _tm.add(d, y))
def structured_add(x, y):
    """The stored values of sparse x plus scalar y."""


def _zero_preserving(name: str) -> Callable:
    fn = getattr(_T, name)

    def f(x):
        pass
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"{name} of sparse x (stored values only; {name}(0) = 0)."
    return structured_monoid(fn)(f)


sin, tan, arcsin, arctan, sinh, arcsinh, tanh, arctanh = (_zero_preserving(n) for n in (
    "sin", "tan", "arcsin", "arctan", "sinh", "arcsinh", "tanh", "arctanh"))
sgn, ceil, floor, log1p, expm1, deg2rad, rad2deg, sqr, sqrt = (_zero_preserving(n) for n in (
    "sgn", "ceil", "floor", "log1p", "expm1", "deg2rad", "rad2deg", "sqr", "sqrt"))
