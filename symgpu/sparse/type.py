"""SparseType: matrices whose values are scipy.sparse matrices ('csr' or 'csc'), and the
symbolic sparse variables and constants (Theano's `theano.sparse.type` and the typed
constructors of `theano.sparse.basic`).

Operators and methods of SparseVariable (``+``, ``*``, ``.T``, ``.shape``, ``toarray``...) are
installed by `symgpu.sparse.variable` once the ops they build with are loaded.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.config import config
from symgpu.graph.basic import Constant, Type, Variable
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["SparseType", "SparseVariable", "SparseConstant", "sparse_formats", "all_dtypes",
           "as_sparse_variable", "as_sparse", "as_sparse_or_tensor_variable", "constant",
           "matrix", "csr_matrix", "csc_matrix", "csr_dmatrix", "csc_dmatrix", "csr_fmatrix",
           "csc_fmatrix", "csr_imatrix", "csc_imatrix", "csr_lmatrix", "csc_lmatrix",
           "_is_sparse", "_is_dense", "_is_sparse_variable", "_is_dense_variable", "describe"]

#: the formats a SparseType may have (Theano's `sparse_formats`)
sparse_formats = ("csc", "csr")
#: the dtypes a sparse value may hold (scipy.sparse's numeric dtypes)
all_dtypes = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float32", "float64", "complex64", "complex128")
_FORMAT_CLS = {"csr": ssp.csr_matrix, "csc": ssp.csc_matrix}


def describe(value: Any) -> str:
    """A value's kind, shape, dtype and (for sparse values) format, for error messages."""
    if ssp.issparse(value):
        return (f"a {value.format} sparse matrix of shape {value.shape}, dtype {value.dtype}, "
                f"{value.nnz} stored entries")
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)}, dtype {getattr(value, 'dtype', '?')}"
    return f"{type(value).__name__} {value!r}"


class SparseType(Type):
    """A sparse matrix type: a format ('csr' or 'csc') and a dtype. Values are
    scipy.sparse.csr_matrix / csc_matrix; always 2 dimensions, none broadcastable."""

    format_cls = _FORMAT_CLS
    dtype_set = set(all_dtypes)
    ndim = 2
    broadcastable = (False, False)

    def __init__(self, format: str, dtype: str):
        if format not in _FORMAT_CLS:
            raise ValueError(f"SparseType: format must be one of {sparse_formats}, "
                                      f"got {format!r}")
        dtype = str(np.dtype(dtype))
        if dtype not in self.dtype_set:
            raise TypeError(f"SparseType: dtype {dtype} is not supported for sparse "
                                      f"matrices (supported: {', '.join(all_dtypes)})")
        self.format = format
        self.dtype = dtype

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.format == other.format and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((SparseType, self.format, self.dtype))

    def __str__(self) -> str:
        return f"Sparse[{self.dtype}, {self.format}]"

    __repr__ = __str__

    def clone(self, format: str | None = None, dtype: str | None = None) -> "SparseType":
        return SparseType(format or self.format, dtype or self.dtype)

    @property
    def shape(self) -> tuple:
        return (None, None)

    # -- values -----------------------------------------------------------------------------
    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        """`value` as a scipy.sparse matrix of this format and dtype (a sparse matrix of the
        other format, or a dense 2-d array, is converted unless `strict`; a dtype is only
        converted where no precision can be lost, unless `allow_downcast`)."""
        cls = _FORMAT_CLS[self.format]
        if isinstance(value, cls) and value.dtype.name == self.dtype:
            return value
        if strict:
            raise TypeError(f"expected a {self.format} sparse matrix of dtype {self.dtype} "
                            f"({self}), got {describe(value)}")
        if ssp.issparse(value):
            src = value
        elif isinstance(value, (np.ndarray, list, tuple)):
            arr = np.asarray(value)
            if arr.ndim != 2 or arr.dtype.kind not in "biufc":
                raise TypeError(f"expected a sparse matrix ({self}), got {describe(arr)}")
            src = arr
        else:
            raise TypeError(f"expected a sparse matrix ({self}), got {describe(value)}")
        if src.ndim != 2:
            raise TypeError(f"expected a 2-d sparse matrix ({self}), got {describe(value)}")
        dt = np.dtype(src.dtype)
        if dt.name != self.dtype and not allow_downcast and not np.can_cast(dt, self.dtype, "safe"):
            raise TypeError(f"cannot safely convert {describe(value)} to {self} (it could lose "
                            f"precision); cast it first (value.astype('{self.dtype}')) or pass "
                            "allow_input_downcast=True")
        out = cls(src, dtype=self.dtype)
        return out

    def is_valid_value(self, value: Any) -> bool:
        return isinstance(value, _FORMAT_CLS[self.format]) and value.dtype.name == self.dtype

    def make_fast_filter(self):
        cls, dtype = _FORMAT_CLS[self.format], np.dtype(self.dtype)
        return lambda v: v.__class__ is cls and v.dtype == dtype

    def values_eq(self, a: Any, b: Any) -> bool:
        return (ssp.issparse(a) and ssp.issparse(b) and a.shape == b.shape
                and abs(a - b).sum() == 0)

    def values_eq_approx(self, a: Any, b: Any, eps: float = 1e-6) -> bool:
        if not (ssp.issparse(a) and ssp.issparse(b)) or a.shape != b.shape:
            return False
        diff = abs(a - b)
        return diff.nnz == 0 or bool(diff.max() < eps)

    def make_variable(self, name: str | None = None) -> "SparseVariable":
        return SparseVariable(self, None, None, name)

    def make_constant(self, value: Any, name: str | None = None) -> "SparseConstant":
        return SparseConstant(self, value, name)

    def convert_variable(self, var: Variable) -> Variable | None:
        """`var` as a variable of this type: a sparse variable of another dtype is cast where
        that is safe (gradients keep their variable's type)."""
        vt = var.type
        if vt == self:
            return var
        if isinstance(vt, SparseType) and vt.format == self.format and \
                np.can_cast(vt.dtype, self.dtype, "same_kind"):
            return _HOOKS["cast"](var, self.dtype)
        if isinstance(var, TensorVariable) and var.ndim == 2 and \
                np.can_cast(var.dtype, self.dtype, "same_kind"):
            # a gradient summed densely (symgpu.grad adds gradient terms with tensor.add)
            return _HOOKS["from_dense"](var, self)
        return None

    def as_tensor(self, var: Variable) -> TensorVariable:
        """The dense form of a sparse variable (dense_from_sparse, full gradient): how tensor
        functions (and symgpu.grad's sums of gradient terms) read a sparse variable."""
        return _HOOKS["to_dense"](var)


#: sparse.construct's cast and dense <-> sparse conversions, installed there (construct.py sits
#: above this module)
_HOOKS: dict = {}


class _SparseMixin:
    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def format(self) -> str:
        return self.type.format

    @property
    def ndim(self) -> int:
        return 2

    @property
    def broadcastable(self) -> tuple:
        return (False, False)


class SparseVariable(_SparseMixin, Variable):
    """A symbolic sparse matrix (operators from symgpu.sparse.variable)."""


class SparseConstant(Constant, SparseVariable):
    """A sparse matrix with a fixed value."""

    def __init__(self, type: SparseType, data: Any, name: str | None = None):
        Constant.__init__(self, type, type.filter(data), name)

    def signature(self) -> tuple:
        d = self.data
        if d.nnz <= 1024:
            d = d.tocsr() if d.format == "csr" else d.tocsc()
            return (self.type, d.shape, d.data.tobytes(), d.indices.tobytes(), d.indptr.tobytes())
        return (self.type, d.shape, id(d))

    def auto_name(self) -> str:
        if self.name is not None:
            return self.name
        return f"SparseConstant{{{self.type.format}, {self.type.dtype}, shape={self.data.shape}, nnz={self.data.nnz}}}"


# ----------------------------------------------------------------------------- predicates

def _is_sparse(x: Any) -> bool:
    """Whether `x` is a scipy.sparse value."""
    return ssp.issparse(x)


def _is_dense(x: Any) -> bool:
    """Whether `x` is an ndarray."""
    return isinstance(x, np.ndarray)


def _is_sparse_variable(x: Any) -> bool:
    """Whether `x` is a symbolic sparse variable."""
    return isinstance(x, Variable) and isinstance(x.type, SparseType)


def _has_sparse_form(x: Any) -> bool:
    """Whether `x` is a symbolic sparse matrix of a device (its type has `as_sparse`, the
    host form through a transfer, as a GPU array type has `as_tensor`)."""
    return isinstance(x, Variable) and callable(getattr(x.type, "as_sparse", None))


def _is_dense_variable(x: Any) -> bool:
    """Whether `x` is a symbolic tensor variable."""
    return isinstance(x, TensorVariable)


# ----------------------------------------------------------------------------- conversions

def as_sparse_variable(x: Any, name: str | None = None) -> SparseVariable:
    """`x` as a symbolic sparse variable: sparse variables pass through, scipy.sparse
    matrices become constants; anything else is refused (use csr_from_dense / csc_from_dense
    for dense values)."""
    if isinstance(x, Variable):
        if isinstance(x.type, SparseType):
            return x
        if _has_sparse_form(x):
            return x.type.as_sparse(x)   # a device sparse matrix, through its download
        raise TypeError(f"expected a sparse variable, got {x} of type {x.type} (convert a dense "
                        "matrix with csr_from_dense or csc_from_dense)")
    if ssp.issparse(x):
        return constant(x, name=name)
    raise TypeError(f"cannot convert {describe(x)} to a sparse variable (expected a "
                    "scipy.sparse csr or csc matrix)")


as_sparse = as_sparse_variable


def as_sparse_or_tensor_variable(x: Any, name: str | None = None) -> Variable:
    """`x` as a sparse variable if it is sparse (symbolic or scipy.sparse), else as a
    tensor."""
    if _is_sparse_variable(x) or ssp.issparse(x) or _has_sparse_form(x):
        return as_sparse_variable(x, name)
    return as_tensor_variable(x, name=name)


def constant(x: Any, name: str | None = None) -> SparseConstant:
    """A SparseConstant holding scipy.sparse matrix `x` (csr or csc; other formats become
    csr)."""
    if not ssp.issparse(x):
        raise TypeError(f"sparse.constant expects a scipy.sparse matrix, got {describe(x)}")
    fmt = x.format if x.format in _FORMAT_CLS else "csr"
    return SparseConstant(SparseType(fmt, x.dtype.name), x, name)


# ----------------------------------------------------------------------------- constructors

def matrix(format: str, name: str | None = None, dtype: str | None = None) -> SparseVariable:
    """A symbolic sparse matrix of `format` ('csr' or 'csc') and dtype (floatX by default)."""
    return SparseType(format, dtype or config.floatX)(name)


def csr_matrix(name: str | None = None, dtype: str | None = None) -> SparseVariable:
    """A symbolic csr matrix (floatX by default)."""
    return matrix("csr", name, dtype)


def csc_matrix(name: str | None = None, dtype: str | None = None) -> SparseVariable:
    """A symbolic csc matrix (floatX by default)."""
    return matrix("csc", name, dtype)


# Theano's type instances: calling one makes a variable (csr_dmatrix('x'))
csr_dmatrix = SparseType("csr", "float64")
csc_dmatrix = SparseType("csc", "float64")
csr_fmatrix = SparseType("csr", "float32")
csc_fmatrix = SparseType("csc", "float32")
csr_imatrix = SparseType("csr", "int32")
csc_imatrix = SparseType("csc", "int32")
csr_lmatrix = SparseType("csr", "int64")
csc_lmatrix = SparseType("csc", "int64")
