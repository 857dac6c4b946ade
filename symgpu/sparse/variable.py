"""Python operators and methods of symbolic sparse matrices (installed on SparseVariable and
SparseConstant by the package): Theano's `_sparse_py_operators`."""
from __future__ import annotations

from symgpu.sparse import construct as _basic
from symgpu.sparse import elemwise as _elemwise
from symgpu.sparse import products as _products
from symgpu.sparse import reductions as _reductions
from symgpu.sparse.type import SparseConstant, SparseVariable


class SparseOperators:
    """Methods copied onto the sparse variable classes."""

    def __add__(self, o): return _elemwise.add(self, o)
    def __radd__(self, o): return _elemwise.add(o, self)
    def __sub__(self, o): return _elemwise.sub(self, o)
    def __rsub__(self, o): return _elemwise.sub(o, self)
    def __mul__(self, o): return _elemwise.mul(self, o)
    def __rmul__(self, o): return _elemwise.mul(o, self)
    def __neg__(self): return _basic.neg(self)

    def __dot__(self, o): return _products.structured_dot(self, o)
    def __rdot__(self, o): return _products.structured_dot(o, self)

    @property
    def T(self):
        """The transpose (format flipped)."""
        return _basic.transpose(self)

    @property
    def shape(self):
        """The shape as an int64 vector (read without densifying)."""
        return _basic.sparse_shape(self)

    @property
    def size(self):
        """The number of stored values (Theano: not the number of positions)."""
        return _basic.SpNnz()(self)

    def toarray(self):
        """The dense matrix (dense_from_sparse)."""
        return _basic.dense_from_sparse(self)

    def astype(self, dtype): return _basic.cast(self, dtype)
    def zeros_like(self): return _basic.sp_zeros_like(self)
    def ones_like(self): return _basic.sp_ones_like(self)

    def sum(self, axis=None, sparse_grad=False):
        return _reductions.sp_sum(self, axis=axis, sparse_grad=sparse_grad)

    def __iter__(self):
        raise TypeError("a symbolic sparse matrix cannot be iterated")

    def __len__(self):
        raise TypeError("a symbolic sparse matrix has no len(); use x.shape[0]")


def install_operators() -> None:
    for cls in (SparseVariable, SparseConstant):
        for name, value in vars(SparseOperators).items():
            if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"):
                setattr(cls, name, value)
