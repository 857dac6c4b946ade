"""Construction and conversion of sparse matrices (Theano's `theano.sparse.basic`): building
one from its arrays (CSM) and reading them back (CSMProperties), dense <-> sparse, casts,
transpose, negation, shapes, `sp_ones_like` / `sp_zeros_like`, and the sparse gradient of
row indexing (`sparse_grad`)."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize, register_specialize
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.math import cast as _tcast, ones_like as _ones_like
from symgpu.tensor.rewriting.shape_feature import rewrite_shape_read
from symgpu.tensor.shape import register_shape_reader
from symgpu.tensor.shape_rules import as_dim
from symgpu.tensor.subtensor import AdvancedSubtensor
from symgpu.tensor.type import (TensorType, TensorVariable, as_tensor_variable,
                                specify_broadcastable_as)
from symgpu.sparse import type as _type
from symgpu.sparse.type import SparseType, SparseVariable, as_sparse_variable, describe

__all__ = ["CSM", "CSMProperties", "CSMGrad", "csm_properties", "csm_data", "csm_indices",
           "csm_indptr", "csm_shape", "CSR", "CSC", "DenseFromSparse", "dense_from_sparse",
           "SparseFromDense", "csr_from_dense", "csc_from_dense", "Cast", "cast", "bcast",
           "wcast", "icast", "lcast", "fcast", "dcast", "ccast", "zcast", "Transpose",
           "transpose", "Neg", "neg", "Remove0", "remove0", "SparseShape_i", "SpNnz",
           "sp_ones_like", "sp_zeros_like", "EnsureSortedIndices", "ensure_sorted_indices",
           "clean", "ConstructSparseFromList",
           "construct_sparse_from_list", "SparseGradSubtensor1", "sparse_grad", "sparse_shape",
           "local_sparse_shape_infer"]


def _sparse_input(x: Any, what: str, name: str = "x") -> SparseVariable:
    try:
        return as_sparse_variable(x)
    except TypeError as exc:
        raise TypeError(f"{what}: {name}: {exc}") from None


def _int_vector(v: Any, what: str, name: str) -> TensorVariable:
    v = as_tensor_variable(v)
    if v.ndim != 1 or v.dtype[:3] not in ("int", "uin"):
        raise TypeError(f"{what}: {name} must be an integer vector, got {v} ({v.type})")
    return v if v.dtype == "int32" else _tcast(v, "int32")


def _sp_value(value: Any, var: Variable) -> Any:
    """A scipy.sparse result as a value of `var`'s SparseType (format and dtype)."""
    t = var.type
    cls = SparseType.format_cls[t.format]
    if isinstance(value, cls) and value.dtype.name == t.dtype:
        return value
    return cls(value, dtype=t.dtype)


# ============================================================================ CSM

class CSM(Op):
    """Build a sparse matrix of `format` from its arrays: `CSM(format)(data, indices, indptr,
    shape)` (scipy's `(data, indices, indptr)` constructor; the arrays are copied)."""

    __props__ = ("format",)

    def __init__(self, format: str):
        if format not in SparseType.format_cls:
            raise ValueError(f"CSM: format must be 'csr' or 'csc', got {format!r}")
        self.format = format

    def make_node(self, data: Any, indices: Any, indptr: Any, shape: Any) -> Apply:
        data = as_tensor_variable(data)
        if data.ndim != 1 or data.dtype not in _type.all_dtypes:
            raise TypeError(f"CSM: data must be a numeric vector, got {data} ({data.type})")
        indices = _int_vector(indices, "CSM", "indices")
        indptr = _int_vector(indptr, "CSM", "indptr")
        shape = _int_vector(shape, "CSM", "shape")
        return Apply(self, [data, indices, indptr, shape], [SparseType(self.format, data.dtype)()])

    def perform(self, node, inputs, out):
        data, indices, indptr, shape = inputs
        if shape.shape != (2,):
            raise ValueError(f"CSM: shape must have 2 entries, got {shape.tolist()}")
        if data.shape != indices.shape:
            raise ValueError(f"CSM: data (length {data.shape[0]}) and indices (length "
                             f"{indices.shape[0]}) must have the same length")
        major = shape[0] if self.format == "csr" else shape[1]
        if indptr.shape[0] != major + 1:
            raise ValueError(f"CSM: a {self.format} matrix of shape {tuple(shape.tolist())} needs "
                             f"an indptr of length {major + 1}, got {indptr.shape[0]}")
        cls = SparseType.format_cls[self.format]
        out[0][0] = cls((data.copy(), indices.copy(), indptr.copy()), shape=tuple(int(s) for s in shape))

    def infer_shape(self, fgraph, node, input_shapes):
        shape = node.inputs[3]
        return [(as_dim(shape[0]), as_dim(shape[1]))]

    def grad(self, inputs, output_grads):
        data, indices, indptr, shape = inputs
        g = CSMGrad()(data, indices, indptr, shape, output_grads[0]) \
            if is_float(data.dtype) else None
        return [g, None, None, None]

    def connection_pattern(self, node):
        return [[True], [False], [False], [False]]


class CSMGrad(Op):
    """The gradient of CSM's data: `CSMGrad()(data, indices, indptr, shape, gz)` reads the
    sparse gradient `gz` at each stored position of the matrix the arrays describe (in gz's
    format)."""

    __props__ = ()

    def make_node(self, data, indices, indptr, shape, gz) -> Apply:
        data = as_tensor_variable(data)
        gz = _sparse_input(gz, "CSMGrad", "gz")
        inputs = [data, _int_vector(indices, "CSMGrad", "indices"),
                  _int_vector(indptr, "CSMGrad", "indptr"), _int_vector(shape, "CSMGrad", "shape"),
                  gz]
        return Apply(self, inputs, [TensorType(gz.dtype, (False,))()])

    def perform(self, node, inputs, out):
        data, indices, indptr, shape, gz = inputs
        major = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
        rows, cols = (major, indices) if node.inputs[4].type.format == "csr" else (indices, major)
        if tuple(gz.shape) != tuple(int(s) for s in shape):
            raise ValueError(f"CSMGrad: the gradient has shape {gz.shape}, the matrix "
                             f"{tuple(shape.tolist())}")
        vals = np.asarray(gz[rows, cols]).ravel() if rows.size else np.zeros(0, gz.dtype)
        out[0][0] = vals.astype(node.outputs[0].dtype, copy=False)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


def CSR(data, indices, indptr, shape) -> SparseVariable:
    """CSM('csr')(data, indices, indptr, shape)."""
    return CSM("csr")(data, indices, indptr, shape)


def CSC(data, indices, indptr, shape) -> SparseVariable:
    """CSM('csc')(data, indices, indptr, shape)."""
    return CSM("csc")(data, indices, indptr, shape)


class CSMProperties(Op):
    """The arrays of a sparse matrix: `[data, indices, indptr, shape]` (copies; indices,
    indptr and shape are int32). The gradient flows to the data."""

    __props__ = ()

    def make_node(self, csm: Any) -> Apply:
        csm = _sparse_input(csm, "csm_properties", "csm")
        ivec = TensorType("int32", (False,))
        return Apply(self, [csm], [TensorType(csm.dtype, (False,))(), ivec(), ivec(), ivec()])

    def perform(self, node, inputs, out):
        (x,) = inputs
        out[0][0] = x.data.copy()
        out[1][0] = np.asarray(x.indices, dtype="int32").copy()
        out[2][0] = np.asarray(x.indptr, dtype="int32").copy()
        out[3][0] = np.asarray(x.shape, dtype="int32")

    def infer_shape(self, fgraph, node, input_shapes):
        x = node.inputs[0]
        m, n = input_shapes[0]
        nnz = SpNnz()(x)
        major = m if x.type.format == "csr" else n
        return [(nnz,), (nnz,), (as_dim(major) + 1,), (as_dim(2),)]

    def grad(self, inputs, output_grads):
        (x,) = inputs
        if not is_float(x.dtype):
            return [None]
        _, indices, indptr, shape = csm_properties(x)
        return [CSM(x.type.format)(output_grads[0], indices, indptr, shape)]

    def connection_pattern(self, node):
        return [[True, False, False, False]]


def csm_properties(csm: Any) -> list[TensorVariable]:
    """`[data, indices, indptr, shape]` of a sparse matrix."""
    return CSMProperties()(csm)


def csm_data(csm: Any) -> TensorVariable:
    """The stored values of a sparse matrix (a vector)."""
    return csm_properties(csm)[0]


def csm_indices(csm: Any) -> TensorVariable:
    """The minor indices of a sparse matrix's stored values (int32)."""
    return csm_properties(csm)[1]


def csm_indptr(csm: Any) -> TensorVariable:
    """Where each row (csr) / column (csc) starts in data and indices (int32)."""
    return csm_properties(csm)[2]


def csm_shape(csm: Any) -> TensorVariable:
    """The shape of a sparse matrix (an int32 vector of 2)."""
    return csm_properties(csm)[3]


# ============================================================================ shapes

class SparseShape_i(Op):
    """The length of dimension `i` of a sparse matrix (an int64 scalar); the shape rewrites
    answer it from the producing op's `infer_shape`."""

    __props__ = ("i",)
    shape_read = "dim"

    def __init__(self, i: int):
        if i not in (0, 1):
            raise ValueError(f"SparseShape_i: a sparse matrix has dimensions 0 and 1, not {i}")
        self.i = int(i)

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "SparseShape_i")
        return Apply(self, [x], [TensorType("int64", ())()])

    def perform(self, node, inputs, out):
        out[0][0] = np.asarray(inputs[0].shape[self.i], dtype="int64")

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]

    def grad(self, inputs, output_grads):
        return [None]


class SpNnz(Op):
    """The number of stored entries of a sparse matrix (an int64 scalar)."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "SpNnz")
        return Apply(self, [x], [TensorType("int64", ())()])

    def perform(self, node, inputs, out):
        out[0][0] = np.asarray(inputs[0].nnz, dtype="int64")

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]

    def grad(self, inputs, output_grads):
        return [None]


def sparse_shape(x: Any) -> TensorVariable:
    """The shape of a sparse matrix as an int64 vector (what `x.shape` gives)."""
    x = as_sparse_variable(x)
    return MakeVector("int64")(SparseShape_i(0)(x), SparseShape_i(1)(x))


register_shape_reader(SparseType, lambda var, d: SparseShape_i(d)(var))


@register_canonicalize
@register_specialize
@node_rewriter([SparseShape_i])
def local_sparse_shape_infer(fgraph, node):
    """SparseShape_i(d)(x) of a computed sparse x -> the length its op's `infer_shape`
    gives from its inputs' shapes (x is not computed for its shape)."""
    return rewrite_shape_read(fgraph, node)


# ============================================================================ dense <-> sparse

class DenseFromSparse(Op):
    """A sparse matrix as a dense ndarray. Its gradient is structured (only on the sparsity
    pattern) unless `structured=False`."""

    __props__ = ("sparse_grad",)

    def __init__(self, structured: bool = True):
        self.sparse_grad = bool(structured)

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "dense_from_sparse")
        return Apply(self, [x], [TensorType(x.dtype, (False, False))()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0].toarray()

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        if self.sparse_grad:
            return [_MUL_SD[0](sp_ones_like(x), gz)]
        return [SparseFromDense(x.type.format)(gz)]


#: elemwise.mul_s_d, installed there (elemwise.py sits above this module)
_MUL_SD: list = [None]

dense_from_sparse = DenseFromSparse()


class SparseFromDense(Op):
    """A dense matrix as a sparse matrix of `format` (its zeros are not stored)."""

    __props__ = ("format",)

    def __init__(self, format: str):
        if format not in SparseType.format_cls:
            raise ValueError(f"SparseFromDense: format must be 'csr' or 'csc', got {format!r}")
        self.format = format

    def __str__(self) -> str:
        return f"SparseFromDense{{{self.format}}}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim != 2:
            raise TypeError(f"{self.format}_from_dense: x must be a matrix, got {x} ({x.type}, "
                            f"{x.ndim} dimension(s))")
        if x.dtype not in _type.all_dtypes:
            raise TypeError(f"{self.format}_from_dense: dtype {x.dtype} of {x} cannot be stored "
                            f"sparse (supported: {', '.join(_type.all_dtypes)})")
        return Apply(self, [x], [SparseType(self.format, x.dtype)()])

    def perform(self, node, inputs, out):
        out[0][0] = SparseType.format_cls[self.format](inputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        return [specify_broadcastable_as(dense_from_sparse(gz), x.type.clone(dtype=gz.dtype))]


csr_from_dense = SparseFromDense("csr")
csc_from_dense = SparseFromDense("csc")


# ============================================================================ casts, transpose, neg

class Cast(Op):
    """A sparse matrix with its values cast to `out_type` (a dtype)."""

    __props__ = ("out_type",)

    def __init__(self, out_type: str):
        out_type = str(np.dtype(out_type))
        if out_type not in _type.all_dtypes:
            raise TypeError(f"sparse cast: dtype {out_type} is not a sparse dtype")
        self.out_type = out_type

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "sparse cast")
        return Apply(self, [x], [SparseType(x.type.format, self.out_type)()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0].astype(self.out_type)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype) or not is_float(self.out_type):
            return [None]
        return [cast(gz, x.dtype)]


def cast(variable: Any, dtype: str) -> SparseVariable:
    """A sparse matrix with its values cast to `dtype` (itself if it has that dtype)."""
    variable = as_sparse_variable(variable)
    if variable.dtype == str(np.dtype(dtype)):
        return variable
    return Cast(dtype)(variable)


def _from_dense(var: TensorVariable, stype: SparseType) -> SparseVariable:
    if var.dtype != stype.dtype:
        var = _tcast(var, stype.dtype)
    return SparseFromDense(stype.format)(var)


_type._HOOKS.update(cast=cast, from_dense=_from_dense,
                    to_dense=lambda v: DenseFromSparse(structured=False)(v))

bcast, wcast, icast, lcast = (Cast(d) for d in ("int8", "int16", "int32", "int64"))
fcast, dcast, ccast, zcast = (Cast(d) for d in ("float32", "float64", "complex64", "complex128"))


class Transpose(Op):
    """The transpose of a sparse matrix (a csr matrix's is csc and vice versa: no copy)."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "transpose")
        fmt = "csc" if x.type.format == "csr" else "csr"
        return Apply(self, [x], [SparseType(fmt, x.dtype)()])

    def perform(self, node, inputs, out):
        out[0][0] = _sp_value(inputs[0].transpose(), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(reversed(input_shapes[0]))]

    def grad(self, inputs, output_grads):
        return [transpose(output_grads[0])]


def transpose(x: Any) -> SparseVariable:
    """The transpose of sparse matrix `x` (format flipped)."""
    return Transpose()(x)


class Neg(Op):
    """-x of a sparse matrix."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "neg")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = _sp_value(-inputs[0], node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [neg(output_grads[0])]


def neg(x: Any) -> SparseVariable:
    """-x of sparse matrix `x`."""
    return Neg()(x)


class Remove0(Op):
    """The matrix without its explicitly stored zeros."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "remove0")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        c = inputs[0].copy()
        c.eliminate_zeros()
        out[0][0] = c

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]


remove0 = Remove0()


class EnsureSortedIndices(Op):
    """The matrix with its indices sorted within each row (csr) or column (csc): scipy.sparse
    does not keep them sorted, and other libraries may need them so. `inplace=True` sorts the
    input's own arrays (the output is a view of it). Regular gradient."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        if self.inplace:
            self.view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        x = _sparse_input(x, "ensure_sorted_indices")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        if self.inplace:
            x.sort_indices()
            out[0][0] = x
        else:
            out[0][0] = x.sorted_indices()

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{'inplace' if self.inplace else 'no_inplace'}}}"


ensure_sorted_indices = EnsureSortedIndices(inplace=False)


def clean(x: Any) -> SparseVariable:
    """`x` without its explicitly stored zeros and with sorted indices (Theano's `clean`:
    what other libraries expect); regular gradient."""
    return ensure_sorted_indices(remove0(x))


def sp_ones_like(x: Any) -> SparseVariable:
    """A sparse matrix with x's pattern and 1 at each stored position."""
    x = as_sparse_variable(x)
    data, indices, indptr, shape = csm_properties(x)
    return CSM(x.type.format)(_ones_like(data), indices, indptr, shape)


def sp_zeros_like(x: Any) -> SparseVariable:
    """A sparse matrix of x's shape, format and dtype with nothing stored."""
    x = as_sparse_variable(x)
    _, _, indptr, shape = csm_properties(x)
    empty = as_tensor_variable(np.zeros(0, dtype=x.dtype))
    return CSM(x.type.format)(empty, np.zeros(0, dtype="int32"), indptr * 0, shape)


# ============================================================================ sparse gradients of indexing

class ConstructSparseFromList(Op):
    """`ConstructSparseFromList()(x, values, ilist)`: a csc matrix of x's shape holding the
    rows `values` at rows `ilist` (repeated rows add up): the sparse gradient of x[ilist]."""

    __props__ = ()

    def make_node(self, x: Any, values: Any, ilist: Any) -> Apply:
        x, values, ilist = (as_tensor_variable(v) for v in (x, values, ilist))
        if x.ndim != 2 or values.ndim != 2:
            raise TypeError(f"construct_sparse_from_list: x and values must be matrices, got "
                            f"{x} ({x.type}) and {values} ({values.type})")
        if ilist.ndim != 1 or ilist.dtype[:3] not in ("int", "uin"):
            raise TypeError(f"construct_sparse_from_list: ilist must be an integer vector, got "
                            f"{ilist} ({ilist.type})")
        return Apply(self, [x, values, ilist], [SparseType("csc", values.dtype)()])

    def perform(self, node, inputs, out):
        x, values, ilist = inputs
        m, n = x.shape
        if values.shape != (ilist.shape[0], n):
            raise ValueError(f"construct_sparse_from_list: values of shape {values.shape} do not "
                             f"fit {ilist.shape[0]} rows of a matrix of shape {x.shape}")
        if ilist.size and (ilist.max() >= m or ilist.min() < -m):
            raise IndexError(f"construct_sparse_from_list: row index out of range for shape {x.shape}")
        rows = np.repeat(np.where(ilist < 0, ilist + m, ilist), n)
        cols = np.tile(np.arange(n), ilist.shape[0])
        coo = ssp.coo_matrix((values.ravel(), (rows, cols)), shape=(m, n))
        out[0][0] = _sp_value(coo.tocsc(), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        x, values, ilist = inputs
        gvals = DenseFromSparse(structured=False)(output_grads[0])[ilist]
        return [None, gvals, None]

    def connection_pattern(self, node):
        return [[False], [True], [False]]


construct_sparse_from_list = ConstructSparseFromList()


class SparseGradSubtensor1(Op):
    """x[ilist] of a matrix (rows picked by an integer vector) whose gradient with respect to
    x is built as a sparse matrix (ConstructSparseFromList): Theano's
    AdvancedSubtensor1(sparse_grad=True), made by `sparse_grad`."""

    __props__ = ()

    def make_node(self, x: Any, ilist: Any) -> Apply:
        x, ilist = as_tensor_variable(x), as_tensor_variable(ilist)
        if x.ndim != 2:
            raise TypeError(f"sparse_grad: x must be a matrix, got {x} ({x.type})")
        if ilist.ndim != 1 or ilist.dtype[:3] not in ("int", "uin"):
            raise TypeError(f"sparse_grad: the index must be an integer vector, got {ilist} "
                            f"({ilist.type})")
        return Apply(self, [x, ilist], [TensorType(x.dtype, (False, x.broadcastable[1]))()])

    def perform(self, node, inputs, out):
        x, ilist = inputs
        try:
            out[0][0] = np.take(x, ilist, axis=0)
        except IndexError as exc:
            raise IndexError(f"sparse_grad x[ilist]: {exc} (x of shape {x.shape})") from None

    def infer_shape(self, fgraph, node, input_shapes):
        return [(input_shapes[1][0], input_shapes[0][1])]

    def grad(self, inputs, output_grads):
        x, ilist = inputs
        if not is_float(x.dtype):
            return [None, None]
        g = construct_sparse_from_list(x, output_grads[0], ilist)
        # symgpu.grad gives a dense variable a dense gradient (gradient/core.py's _fit_to)
        return [DenseFromSparse(structured=False)(g), None]

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else self(eval_points[0], inputs[1])]

    def connection_pattern(self, node):
        return [[True], [False]]


def sparse_grad(var: Variable) -> TensorVariable:
    """`var` = x[ilist] (a matrix indexed by one integer vector) recomputed by an op whose
    gradient with respect to x is built sparse (Theano's `theano.sparse_grad`)."""
    owner = getattr(var, "owner", None)
    if owner is None or not isinstance(owner.op, AdvancedSubtensor):
        raise TypeError(f"sparse_grad: {var} is not x[int_vector]: only the result of advanced "
                        "indexing by one integer vector has a sparse gradient")
    idx = owner.inputs[1:]
    if len(owner.op.idx_list) != 1 or len(idx) != 1 or idx[0].ndim != 1 or \
            idx[0].dtype[:3] not in ("int", "uin"):
        raise TypeError(f"sparse_grad: {var} must be x[int_vector] (one integer vector index), "
                        f"got the index {owner.op}")
    return SparseGradSubtensor1()(owner.inputs[0], idx[0])
