"""Python operators and methods of symbolic tensors (installed on TensorVariable's mixin,
Theano's `_tensor_py_operators`)."""
from __future__ import annotations

from typing import Any

from symgpu.tensor import basic as _basic
from symgpu.tensor import extra_funcs as _extra_funcs
from symgpu.tensor import extra_ops as _extra_ops
from symgpu.tensor import grids as _grids
from symgpu.tensor import math as _math
from symgpu.tensor.subtensor import getitem
from symgpu.tensor.transfer import transfer
from symgpu.tensor.type import _tensor_py_operators


class TensorOperators:
    """Methods copied onto TensorVariable; kept apart so the type module stays small."""

    dunders = {
        "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
        "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
        "__rpow__", "__neg__", "__pos__", "__abs__", "__lt__", "__le__", "__gt__", "__ge__",
        "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__invert__",
        "__matmul__", "__rmatmul__", "__getitem__", "__iter__", "__len__", "__bool__",
    }

    # arithmetic
    def __add__(self, o): return _math.add(self, o)
    def __radd__(self, o): return _math.add(o, self)
    def __sub__(self, o): return _math.sub(self, o)
    def __rsub__(self, o): return _math.sub(o, self)
    def __mul__(self, o): return _math.mul(self, o)
    def __rmul__(self, o): return _math.mul(o, self)
    def __truediv__(self, o): return _math.true_div(self, o)
    def __rtruediv__(self, o): return _math.true_div(o, self)
    def __floordiv__(self, o): return _math.floor_div(self, o)
    def __rfloordiv__(self, o): return _math.floor_div(o, self)
    def __mod__(self, o): return _math.mod(self, o)
    def __rmod__(self, o): return _math.mod(o, self)
    def __pow__(self, o): return _math.pow(self, o)
    def __rpow__(self, o): return _math.pow(o, self)
    def __neg__(self): return _math.neg(self)
    def __pos__(self): return self
    def __abs__(self): return _math.abs(self)
    # comparisons (== and != keep Python identity semantics, as in Theano: use eq/neq)
    def __lt__(self, o): return _comparison(_math.lt(self, o))
    def __le__(self, o): return _comparison(_math.le(self, o))
    def __gt__(self, o): return _comparison(_math.gt(self, o))
    def __ge__(self, o): return _comparison(_math.ge(self, o))
    # logic
    def __and__(self, o): return _math.and_(self, o)
    def __rand__(self, o): return _math.and_(o, self)
    def __or__(self, o): return _math.or_(self, o)
    def __ror__(self, o): return _math.or_(o, self)
    def __xor__(self, o): return _math.xor(self, o)
    def __rxor__(self, o): return _math.xor(o, self)
    def __invert__(self): return _math.invert(self)
    # linear algebra
    def __matmul__(self, o): return _math.matmul(self, o)
    def __rmatmul__(self, o): return _math.matmul(o, self)

    def __getitem__(self, index):
        return getitem(self, index)

    def __iter__(self):
        """A vector whose length the graph tells (``x.shape``, a MakeVector, a constant)
        iterates over its entries, as Theano's (``rows, cols = x.shape``); others refuse
        (this also stops Python's builtin ``sum(x)`` by mistake for ``x.sum()``)."""
        n = _basic._vector_length(self) if self.ndim == 1 else None
        if n is None:
            raise TypeError(f"{self} ({self.type}) cannot be iterated: only a vector whose "
                            "length the graph tells (x.shape, a stack of scalars) can; index "
                            "it (x[i]) instead, or use x.sum() / x.max() rather than Python's "
                            "builtin sum / max")
        return (self[i] for i in range(n))

    def __len__(self):
        raise TypeError("a symbolic tensor has no len(); use x.shape[0]")

    def __bool__(self):
        """True, as in Theano (``if W:`` tests that a default argument was given), except for
        the result of a comparison operator, whose truth is only known when the function
        runs (``a < b < c`` would silently test one half)."""
        if getattr(self, "_comparison", False):
            raise TypeError(f"{self} is a symbolic comparison: it has no truth value until the "
                            "function runs; use switch/where, and T.and_ for chains such as "
                            "a < b < c")
        return True

    # shape
    @property
    def T(self): return _basic.transpose(self)
    @property
    def shape(self): return _basic.shape(self)
    @property
    def size(self): return _math.prod(_basic.shape(self))

    def dimshuffle(self, *pattern):
        if len(pattern) == 1 and isinstance(pattern[0], (list, tuple)):
            pattern = tuple(pattern[0])
        return _basic.dimshuffle(self, pattern)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        return _basic.transpose(self, axes or None)

    def reshape(self, shape, *more, ndim=None):
        if more:
            shape = (shape,) + more
        return _basic.reshape(self, shape, ndim=ndim)

    def flatten(self, ndim=1): return _basic.flatten(self, ndim)
    def ravel(self): return _basic.flatten(self, 1)
    def astype(self, dtype): return _basic.cast(self, dtype)
    def squeeze(self, axis=None): return _basic.squeeze(self, axis)

    # reductions
    def sum(self, axis=None, dtype=None, keepdims=False, acc_dtype=None):
        return _math.sum(self, axis=axis, dtype=dtype, keepdims=keepdims, acc_dtype=acc_dtype)
    def mean(self, axis=None, dtype=None, keepdims=False): return _math.mean(self, axis, dtype, keepdims)
    def prod(self, axis=None, dtype=None, keepdims=False): return _math.prod(self, axis, dtype, keepdims)
    def max(self, axis=None, keepdims=False): return _math.max(self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return _math.min(self, axis, keepdims)
    def argmax(self, axis=None, keepdims=False): return _math.argmax(self, axis, keepdims)
    def argmin(self, axis=None, keepdims=False): return _math.argmin(self, axis, keepdims)
    def var(self, axis=None, ddof=0, keepdims=False): return _math.var(self, axis, ddof, keepdims)
    def std(self, axis=None, ddof=0, keepdims=False): return _math.std(self, axis, ddof, keepdims)
    def all(self, axis=None, keepdims=False): return _math.all(self, axis, keepdims)
    def any(self, axis=None, keepdims=False): return _math.any(self, axis, keepdims)

    # elementwise conveniences
    def dot(self, o): return _math.dot(self, o)
    def clip(self, lo, hi): return _math.clip(self, lo, hi)
    def exp(self): return _math.exp(self)
    def log(self): return _math.log(self)
    def sqrt(self): return _math.sqrt(self)
    def abs(self): return _math.abs(self)

    # Theano's array methods (symgpu.tensor.extra_ops / extra_funcs)
    def norm(self, L, axis=None, keepdims=False): return _extra_funcs.norm(self, L, axis, keepdims)
    def sort(self, axis=-1, kind="quicksort", order=None): return _extra_ops.sort(self, axis, kind, order)
    def argsort(self, axis=-1, kind="quicksort", order=None):
        return _extra_ops.argsort(self, axis, kind, order)
    def cumsum(self, axis=None): return _extra_ops.cumsum(self, axis)
    def cumprod(self, axis=None): return _extra_ops.cumprod(self, axis)
    def repeat(self, repeats, axis=None): return _extra_ops.repeat(self, repeats, axis)
    def diagonal(self, offset=0, axis1=0, axis2=1): return _extra_ops.diagonal(self, offset, axis1, axis2)
    def trace(self, offset=0, axis1=0, axis2=1): return _extra_funcs.trace(self, offset, axis1, axis2)
    def round(self, mode=None): return _extra_funcs.round(self, mode)
    def nonzero(self, return_matrix=False): return _extra_ops.nonzero(self, return_matrix)
    def nonzero_values(self): return _extra_ops.nonzero_values(self)
    def swapaxes(self, axis1, axis2): return _extra_funcs.swapaxes(self, axis1, axis2)
    def take(self, indices, axis=None): return _extra_funcs.take(self, indices, axis)
    def zeros_like(self, dtype=None): return _math.zeros_like(self, dtype)
    def ones_like(self, dtype=None): return _math.ones_like(self, dtype)
    def copy(self, name=None):
        """A copy of this value as a new node (Theano's tensor_copy), named `name`."""
        out = _math.identity(self)
        out.name = name
        return out

    def get_scalar_constant_value(self): return _grids.get_scalar_constant_value(self)

    # placement
    def transfer(self, target: Any):
        """Move this value to `target`: None = the default GPU context, 'cpu', or a name."""
        return transfer(self, target)


def install_operators() -> None:
    """Copy the operators and methods onto TensorVariable's mixin, Theano's
    `_tensor_py_operators` (the package calls this once it has loaded the modules they build
    with; type.py sits below them)."""
    for name, value in vars(TensorOperators).items():
        if not name.startswith("__") or name in TensorOperators.dunders:
            setattr(_tensor_py_operators, name, value)


def _comparison(result: Any) -> Any:
    """Mark an operator's comparison result: its truth value is refused (see __bool__)."""
    result._comparison = True
    return result
