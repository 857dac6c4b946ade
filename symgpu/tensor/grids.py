"""Theano's mgrid/ogrid index tricks and get_scalar_constant_value: small helpers that user
code reaches for while building graphs (both read or make graphs; no ops of their own)."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Constant, Variable
from symgpu.scalar.dtypes import dtype_kind
from symgpu.tensor.basic import arange
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.math import add, cast, zeros_like
from symgpu.tensor.shape import Shape_i, SpecifyBroadcastable, Unbroadcast, dimshuffle
from symgpu.tensor.type import TensorVariable, constant

__all__ = ["mgrid", "ogrid", "NotScalarConstantError", "get_scalar_constant_value"]


class _MeshGrid:
    """`mgrid[0:5, 0:3]` (dense) or `ogrid[...]` (open): one int/float array per slice, as
    np.mgrid/np.ogrid. A complex step (`0:1:5j`) asks for that many points, stop included."""

    def __init__(self, sparse: bool):
        self.sparse = sparse

    def __repr__(self) -> str:
        return "ogrid" if self.sparse else "mgrid"

    def _range(self, sl: Any) -> TensorVariable:
        if not isinstance(sl, slice) or sl.stop is None:
            raise TypeError(f"{self}[...] takes slices with a stop (start:stop[:step]), got {sl!r}")
        start = 0 if sl.start is None else sl.start
        if isinstance(sl.step, complex):
            count = int(abs(sl.step))
            if count < 1 or any(isinstance(v, Variable) for v in (start, sl.stop)):
                raise ValueError(f"{self}: a complex step needs constant bounds and at least one "
                                 f"point, got {sl!r}")
            return constant(np.linspace(start, sl.stop, count).astype(config.floatX))
        return arange(start, sl.stop, 1 if sl.step is None else sl.step)

    def __getitem__(self, index: Any) -> list[TensorVariable]:
        slices = index if isinstance(index, tuple) else (index,)
        ndim = len(slices)
        ranges = [dimshuffle(self._range(sl), ["x"] * j + [0] + ["x"] * (ndim - 1 - j))
                  for j, sl in enumerate(slices)]
        if self.sparse:
            return ranges
        zeros = add(*[zeros_like(r) for r in ranges]) if ndim > 1 else zeros_like(ranges[0])
        return [add(r, cast(zeros, r.dtype)) for r in ranges]


mgrid = _MeshGrid(sparse=False)
ogrid = _MeshGrid(sparse=True)


class NotScalarConstantError(ValueError):
    """The variable is not a scalar whose value the graph fixes."""


def get_scalar_constant_value(v: Any, elemwise: bool = True) -> np.ndarray:
    """The value of `v` as a 0-d array when the graph fixes it: a one-element constant, seen
    through dimension shuffles, broadcast checks, casts and (with `elemwise`) elementwise ops
    of constants; the length of a broadcastable dimension is 1. Otherwise raise
    NotScalarConstantError (Theano's helper for shape arithmetic)."""
    if not isinstance(v, Variable):
        arr = np.asarray(v)
        if arr.size != 1 or dtype_kind(arr.dtype) not in "biufc":
            raise NotScalarConstantError(f"{v!r} is not a scalar number")
        return arr.reshape(())
    if isinstance(v, Constant):
        data = np.asarray(v.data)
        if data.size != 1:
            raise NotScalarConstantError(f"{v} holds {data.size} values, not one")
        return data.reshape(())
    node = v.owner
    if node is None:
        raise NotScalarConstantError(f"{v} is an input: its value is not fixed by the graph")
    op = node.op
    if isinstance(op, (DimShuffle, SpecifyBroadcastable, Unbroadcast)):
        return get_scalar_constant_value(node.inputs[0], elemwise)
    if isinstance(op, Shape_i) and node.inputs[0].broadcastable[op.i]:
        return np.asarray(1, dtype="int64")
    if isinstance(op, Elemwise) and (elemwise or op.scalar_op.name.startswith("cast")):
        values = [get_scalar_constant_value(i, elemwise) for i in node.inputs]
        return np.asarray(op.scalar_op.impl(*values), dtype=v.dtype).reshape(())
    raise NotScalarConstantError(f"{v} is computed by {op}, whose value the graph does not fix")
