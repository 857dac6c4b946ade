"""Sparse matrices joined side by side or one above the other (Theano's `hstack` / `vstack` of
`theano.sparse.basic`), through scipy.sparse's own; regular (dense-structured) gradients."""
from __future__ import annotations

from typing import Any

import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, upcast
from symgpu.sparse.construct import SparseFromDense, cast, dense_from_sparse, sparse_shape
from symgpu.sparse.type import (SparseType, SparseVariable, _is_sparse_variable, all_dtypes,
                                as_sparse_variable, describe, sparse_formats)

__all__ = ["HStack", "VStack", "hstack", "vstack"]


class HStack(Op):
    """Sparse matrices side by side (their row counts agree), one sparse matrix of `format`
    (default csc) and `dtype` (required: `hstack` gives the blocks' upcast)."""

    __props__ = ("format", "dtype")
    axis = 1   # the axis the blocks are joined along (VStack: 0)

    def __init__(self, format: str | None = None, dtype: str | None = None):
        self.format = "csc" if format is None else format
        if self.format not in sparse_formats:
            raise ValueError(f"{type(self).__name__}: format must be one of {sparse_formats}, "
                             f"got {format!r}")
        if dtype is None:
            raise ValueError(f"{type(self).__name__}: the output dtype must be specified")
        if str(dtype) not in all_dtypes:
            raise ValueError(f"{type(self).__name__}: dtype must be one of {all_dtypes}, "
                             f"got {dtype!r}")
        self.dtype = str(dtype)

    def make_node(self, *blocks: Any) -> Apply:
        if not blocks:
            raise ValueError(f"{type(self).__name__}: cannot join an empty list of sparse "
                             "matrices")
        vs = _blocks(blocks, type(self).__name__)
        return Apply(self, vs, [SparseType(self.format, self.dtype)()])

    def perform(self, node, inputs, out):
        join = ssp.hstack if self.axis == 1 else ssp.vstack
        other = 1 - self.axis
        if len({b.shape[other] for b in inputs}) > 1:
            what = "rows" if other == 0 else "columns"
            raise ValueError(f"{type(self).__name__}: the blocks' {what} differ: "
                             + ", ".join(describe(b) for b in inputs))
        z = join(inputs, format=self.format, dtype=self.dtype)
        out[0][0] = z if z.dtype == self.dtype else z.astype(self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        along = input_shapes[0][self.axis]
        for s in input_shapes[1:]:
            along = along + s[self.axis]
        shape = [None, None]
        shape[self.axis] = along
        shape[1 - self.axis] = input_shapes[0][1 - self.axis]
        return [tuple(shape)]

    def grad(self, inputs, output_grads):
        """Each block's slice of the (dense) output gradient, stored in the block's format
        and dtype; no gradient flows to integer blocks."""
        (gz,) = output_grads
        if _is_sparse_variable(gz):
            gz = dense_from_sparse(gz)
        grads, start = [], 0
        for x in inputs:
            stop = start + sparse_shape(x)[self.axis]
            piece = gz[:, start:stop] if self.axis == 1 else gz[start:stop]
            grads.append(cast(SparseFromDense(x.type.format)(piece), x.dtype)
                         if is_float(x.dtype) or x.dtype.startswith("complex") else None)
            start = stop
        return grads

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.format},{self.dtype})"


class VStack(HStack):
    """Sparse matrices one above the other (their column counts agree)."""

    axis = 0


def _blocks(blocks: Any, what: str) -> list[SparseVariable]:
    out = []
    for i, b in enumerate(blocks):
        try:
            out.append(as_sparse_variable(b))
        except TypeError as exc:
            raise TypeError(f"{what}: block {i}: {exc}") from None
    return out


def hstack(blocks: Any, format: str | None = None, dtype: str | None = None) -> SparseVariable:
    """The sparse matrices `blocks` side by side (scipy.sparse.hstack): `format` csc unless
    given, `dtype` the blocks' upcast unless given."""
    blocks = _blocks(blocks, "hstack")
    if dtype is None:
        dtype = upcast(*[b.dtype for b in blocks])
    return HStack(format=format, dtype=dtype)(*blocks)


def vstack(blocks: Any, format: str | None = None, dtype: str | None = None) -> SparseVariable:
    """The sparse matrices `blocks` one above the other (scipy.sparse.vstack): `format` csc
    unless given, `dtype` the blocks' upcast unless given."""
    blocks = _blocks(blocks, "vstack")
    if dtype is None:
        dtype = upcast(*[b.dtype for b in blocks])
    return VStack(format=format, dtype=dtype)(*blocks)
