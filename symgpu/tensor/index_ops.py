"""Theano's remaining extra_ops: flat/multi index conversion, unique values, compress, the
Bartlett window, filling an offset diagonal and a C-contiguous copy.

Why host ops: each is one NumPy call whose result shape depends on values (unique,
compress) or is a small index computation; on a GPU they run on the host with transfers
around them, as Theano's (which had no GPU versions either).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op, ShapeError
from symgpu.scalar.dtypes import upcast
from symgpu.tensor.basic import get_vector_length, int_dtypes, integer_dtypes
from symgpu.tensor.math import (abs_, cast, ge, lt, minimum, prod, switch)
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["CpuContiguous", "cpu_contiguous", "Unique", "UnravelIndex", "unravel_index",
           "RavelMultiIndex", "ravel_multi_index", "compress", "Bartlett", "bartlett",
           "FillDiagonalOffset", "fill_diagonal_offset"]


class CpuContiguous(Op):
    """Its input if C-contiguous (a view), else a C-contiguous copy."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        x = inputs[0]
        output_storage[0][0] = x if x.flags["C_CONTIGUOUS"] else np.ascontiguousarray(x)

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [output_grads[0]]

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[0]]


cpu_contiguous = CpuContiguous()


class Unique(Op):
    """``numpy.unique``: the sorted unique values (of the flattened input, or of slices along
    `axis`), then, as asked, the first indices, the inverse indices and the counts (int64).
    The lengths depend on the values: `x.shape` of an output is read from it."""

    __props__ = ("return_index", "return_inverse", "return_counts", "axis")

    def __init__(self, return_index: bool = False, return_inverse: bool = False,
                 return_counts: bool = False, axis: int | None = None):
        self.return_index = bool(return_index)
        self.return_inverse = bool(return_inverse)
        self.return_counts = bool(return_counts)
        self.axis = None if axis is None else int(axis)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if self.axis is None:
            bcast: tuple = (False,)
        else:
            axis = self.axis + x.ndim if self.axis < 0 else self.axis
            if not 0 <= axis < x.ndim:
                raise ValueError(f"Unique axis `{self.axis}` is outside of input ndim = "
                                 f"{x.ndim} ({x.type})")
            bcast = tuple(False if d == axis else b for d, b in enumerate(x.broadcastable))
        outputs = [TensorType(x.dtype, bcast)()]
        n = self.return_index + self.return_inverse + self.return_counts
        outputs += [TensorType("int64", (False,))() for _ in range(n)]
        return Apply(self, [x], outputs)

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        kw: dict[str, Any] = dict(return_index=self.return_index,
                                  return_inverse=self.return_inverse,
                                  return_counts=self.return_counts)
        if self.axis is not None:
            kw["axis"] = self.axis
        outs = np.unique(inputs[0], **kw)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for k, (store, o, var) in enumerate(zip(output_storage, outs, node.outputs)):
            arr = np.asarray(o, dtype=var.dtype)
            store[0] = arr if k == 0 else arr.reshape(-1)   # index outputs are vectors

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        raise ShapeError(f"{self}: the number of unique values is known once they are computed")

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [None]


class UnravelIndex(Op):
    """``numpy.unravel_index(indices, dims, order)``: `ndim` int64 arrays of the indices'
    shape (`ndim` is the length of `dims`)."""

    __props__ = ("ndim", "order")

    def __init__(self, ndim: int, order: str = "C"):
        if order not in ("C", "F"):
            raise ValueError(f"UnravelIndex: order must be 'C' or 'F', got {order!r}")
        if not isinstance(ndim, (int, np.integer)) or ndim < 1:
            raise ValueError(f"UnravelIndex: ndim must be an integer greater than 0, got {ndim!r}")
        self.ndim, self.order = int(ndim), order

    def make_node(self, indices: Any, dims: Any) -> Apply:
        indices, dims = as_tensor_variable(indices), as_tensor_variable(dims)
        for v in (indices, dims):
            if v.dtype not in int_dtypes:
                raise TypeError(f"'{v.dtype}' object cannot be interpreted as an index ({v})")
        if dims.ndim != 1:
            raise TypeError(f"UnravelIndex: dims must be a 1D array, got {dims.type}")
        return Apply(self, [indices, dims],
                     [TensorType("int64", (False,) * indices.ndim)() for _ in range(self.ndim)])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        indices, dims = inputs
        if len(dims) != self.ndim:
            raise ValueError(f"{self}: dims has {len(dims)} entries, the op makes {self.ndim}")
        res = np.unravel_index(indices, tuple(int(d) for d in dims), order=self.order)
        for store, r in zip(output_storage, res):
            store[0] = np.array(r, dtype="int64")

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[0]] * len(node.outputs)

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [None, None]


def unravel_index(indices: Any, dims: Any, order: str = "C", ndim: int | None = None
                  ) -> tuple[TensorVariable, ...]:
    """The coordinates (a tuple of int64 arrays shaped like `indices`) of flat `indices`
    into an array of shape `dims`; `ndim` (the length of `dims`) is needed when the graph
    does not fix it."""
    if ndim is None:
        try:
            ndim = get_vector_length(dims)
        except (ValueError, TypeError):
            raise ValueError(f"The length of the provided dimension list ({dims}) cannot be "
                             "automatically determined; give unravel_index its `ndim`") from None
    res = UnravelIndex(ndim=ndim, order=order)(indices, dims)
    return (res,) if ndim == 1 else tuple(res)


class RavelMultiIndex(Op):
    """``numpy.ravel_multi_index(multi_index, dims, mode, order)``: the flat int64 indices."""

    __props__ = ("mode", "order")

    def __init__(self, mode: str = "raise", order: str = "C"):
        if mode not in ("raise", "wrap", "clip"):
            raise ValueError(f"RavelMultiIndex: mode must be 'raise', 'wrap' or 'clip', got {mode!r}")
        if order not in ("C", "F"):
            raise ValueError(f"RavelMultiIndex: order must be 'C' or 'F', got {order!r}")
        self.mode, self.order = mode, order

    def make_node(self, *inp: Any) -> Apply:
        if len(inp) < 2:
            raise TypeError("RavelMultiIndex takes the index arrays, then dims")
        multi_index = [as_tensor_variable(i) for i in inp[:-1]]
        dims = as_tensor_variable(inp[-1])
        for v in multi_index + [dims]:
            if v.dtype not in int_dtypes:
                raise TypeError(f"'{v.dtype}' object cannot be interpreted as an index ({v})")
        if dims.ndim != 1:
            raise TypeError(f"RavelMultiIndex: dims must be a 1D array, got {dims.type}")
        return Apply(self, multi_index + [dims],
                     [TensorType("int64", (False,) * multi_index[0].ndim)()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        multi_index, dims = inputs[:-1], inputs[-1]
        res = np.ravel_multi_index(tuple(multi_index), tuple(int(d) for d in dims),
                                   mode=self.mode, order=self.order)
        output_storage[0][0] = np.array(res, dtype="int64")

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[0]]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [None] * len(inputs)


def ravel_multi_index(multi_index: Sequence[Any], dims: Any, mode: str = "raise",
                      order: str = "C") -> TensorVariable:
    """Flat indices of the coordinates `multi_index` (a tuple or list of int arrays) into an
    array of shape `dims`; `mode` 'raise', 'wrap' or 'clip' for out-of-bounds indices."""
    if not isinstance(multi_index, (tuple, list)):
        raise TypeError(f"multi_index must be a tuple or a list, got {type(multi_index).__name__}")
    return RavelMultiIndex(mode=mode, order=order)(*multi_index, dims)



class Bartlett(Op):
    """``numpy.bartlett(M)``: the triangular window of M points (float64; empty for M <= 0)."""

    __props__ = ()

    def make_node(self, M: Any) -> Apply:
        M = as_tensor_variable(M)
        if M.ndim != 0:
            raise TypeError(f"Bartlett only works on scalar input, got {M.type}")
        if M.dtype not in integer_dtypes:
            raise TypeError(f"Bartlett only works on integer input, got {M.dtype}")
        return Apply(self, [M], [TensorType("float64", (False,))()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        output_storage[0][0] = np.bartlett(int(inputs[0])).astype("float64")

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        m = node.inputs[0]
        return [(cast(switch(lt(m, 0), 0, m), "int64"),)]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return [None]


bartlett_ = Bartlett()


def bartlett(M: Any) -> TensorVariable:
    """The Bartlett (triangular) window of `M` points, ends at zero (Theano's bartlett)."""
    return bartlett_(M)


class FillDiagonalOffset(Op):
    """A copy of the matrix `a` with its `offset` diagonal (above the main one for positive
    offsets, below for negative) set to the scalar `val` (not wrapped for tall matrices)."""

    __props__ = ()

    def make_node(self, a: Any, val: Any, offset: Any) -> Apply:
        a, val, offset = (as_tensor_variable(v) for v in (a, val, offset))
        if a.ndim != 2:
            raise TypeError(f"FillDiagonalOffset: first parameter must have exactly two "
                            f"dimensions, got {a.type}")
        if val.ndim != 0:
            raise TypeError(f"FillDiagonalOffset: second parameter must be a scalar, got {val.type}")
        if offset.ndim != 0:
            raise TypeError(f"FillDiagonalOffset: third parameter must be a scalar, got {offset.type}")
        val = cast(val, upcast(a.dtype, val.dtype))
        if val.dtype != a.dtype:
            raise TypeError(f"FillDiagonalOffset: type of second parameter ({val.dtype}) must "
                            f"be the same as the first's ({a.dtype})")
        if offset.dtype not in integer_dtypes:
            raise TypeError(f"FillDiagonalOffset: type of third parameter must be an integer, "
                            f"got {offset.dtype}")
        return Apply(self, [a, val, offset], [a.type()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        a, val, offset = inputs[0].copy(), inputs[1], int(inputs[2])
        height, width = a.shape
        if offset >= 0:
            start, steps = offset, min(min(width, height), width - offset)
        else:
            start, steps = -offset * width, min(min(width, height), height + offset)
        step = width + 1
        if steps > 0:
            a.flat[start:start + step * steps:step] = val
        output_storage[0][0] = a

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[0]]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        a, val, offset = inputs
        g = output_grads[0]
        if str(a.dtype).startswith("complex"):
            return [None, None, None]
        height, width = g.shape[0], g.shape[1]
        wr_a = fill_diagonal_offset(g, 0, offset)
        off = abs_(offset)
        pos, neg = ge(offset, 0), lt(offset, 0)
        start = offset * pos + off * width * neg
        steps = minimum(minimum(width, height), width * pos + height * neg - off)
        step = width + 1
        wr_val = g.flatten()[start:start + step * steps:step].sum()
        return [wr_a, cast(wr_val, val.dtype), None]


fill_diagonal_offset_ = FillDiagonalOffset()


def fill_diagonal_offset(a: Any, val: Any, offset: Any) -> TensorVariable:
    """A copy of matrix `a` with its `offset` diagonal set to `val` (Theano's function)."""
    return fill_diagonal_offset_(a, val, offset)
