"""Shared sparse matrices: `symgpu.shared(scipy_matrix)` gives one once symgpu.sparse is
imported (Theano's `theano.sparse.sharedvar`)."""
from __future__ import annotations

from typing import Any

import scipy.sparse as ssp

from symgpu.graph.sharedvalue import SharedVariable, register_shared_constructor
from symgpu.graph.sharedvalue import shared as _shared
from symgpu.sparse.type import SparseType, SparseVariable, describe

__all__ = ["SparseTensorSharedVariable", "sparse_constructor", "shared"]


class SparseTensorSharedVariable(SharedVariable, SparseVariable):
    """A shared scipy.sparse matrix (csr or csc) on the host."""

    def _copy_out(self, value: Any) -> Any:
        return value.copy()

    def _copy_in(self, value: Any) -> Any:
        return value.copy()


def sparse_constructor(value: Any, name: str | None = None, strict: bool = False,
                       allow_downcast: bool | None = None, borrow: bool = False,
                       format: str | None = None, target: str | None = "default",
                       **kwargs: Any) -> SparseTensorSharedVariable:
    """A shared variable for a scipy.sparse matrix (copied unless `borrow`); `format` converts
    it ('csr' or 'csc'; default: its own, other scipy formats becoming csr)."""
    if not ssp.issparse(value):
        raise TypeError(f"the sparse constructor takes a scipy.sparse matrix, got {describe(value)}")
    if target not in ("default", "cpu"):
        raise TypeError(f"sparse shared variables live on the host, not target={target!r}")
    if kwargs:
        raise TypeError(f"the sparse constructor takes no {', '.join(sorted(kwargs))} argument")
    fmt = format or (value.format if value.format in SparseType.format_cls else "csr")
    stype = SparseType(fmt, value.dtype.name)
    filtered = stype.filter(value)
    if not borrow or filtered is value:
        filtered = filtered.copy() if not borrow else filtered
    return SparseTensorSharedVariable(stype, filtered, name=name, strict=strict,
                                      allow_downcast=allow_downcast)


# a fallback: a device's constructor (the GPU's, under device=cuda) takes sparse values first
register_shared_constructor(sparse_constructor, fallback=True)


def shared(value: Any, name: str | None = None, strict: bool = False,
           allow_downcast: bool | None = None, borrow: bool = False, format: str | None = None,
           target: str | None = "default") -> SharedVariable:
    """Theano's `theano.sparse.shared`: a shared variable for scipy.sparse matrix `value`,
    where `symgpu.shared` would put it (on the GPU under device=cuda, else on the host);
    `format` converts it ('csr' or 'csc')."""
    if not ssp.issparse(value):
        raise TypeError(f"sparse.shared takes a scipy.sparse matrix, got {describe(value)}")
    extra = {"format": format} if format is not None else {}
    return _shared(value, name=name, borrow=borrow, strict=strict,
                   allow_downcast=allow_downcast, target=target, **extra)
