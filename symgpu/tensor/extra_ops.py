"""Theano's everyday array functions that are not elementwise: cumulative sums and products,
sorting, repetition, diagonals, identity matrices, nonzero, bincount and searchsorted.

Each op computes with NumPy on the host (on a GPU graph it keeps its transfers around it) and
knows its gradient and its output shape (`infer_shape`). Functions built from other ops (tile,
roll, max_and_argmax, ...) live in `symgpu.tensor.extra_funcs`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import check_dtype, is_float, value_dtype
from symgpu.tensor.basic import _as_int_scalar, arange, concatenate, flatten, squeeze, zeros
from symgpu.tensor.math import cast, max as _max, maximum, minimum, neq, sum as _sum
from symgpu.tensor.shape import shape_i
from symgpu.tensor.subtensor import inc_subtensor, set_subtensor
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable, constant
from symgpu.tensor.axis_args import norm_axis as _norm_axis, require_int as _require_int
# sorting lives in sorting.py; its names stay importable here, their documented path
from symgpu.tensor.sorting import (ArgSort, ArgSortOp, PermuteAlongAxis, Sort,  # noqa: F401
                                   SortOp, TakeAlongAxis, argsort, sort)

__all__ = ["CumOp", "Sort", "ArgSort", "SortOp", "ArgSortOp", "Repeat", "Eye", "AllocDiag",
           "ExtractDiag", "Nonzero",
           "cumsum", "cumprod", "sort", "argsort", "repeat", "eye", "identity_like", "diag",
           "diagonal", "nonzero", "flatnonzero", "nonzero_values", "BinCount", "SearchSorted",
           "bincount", "searchsorted", "to_one_hot", "diff", "fill_diagonal", "squeeze",
           "SearchsortedOp"]



def _int64(v: Any) -> TensorVariable:
    return cast(v, "int64")


def _reverse(x: TensorVariable, axis: int) -> TensorVariable:
    return x[(slice(None),) * axis + (slice(None, None, -1),)]


# ============================================================================ cumsum / cumprod

class CumOp(Op):
    """np.cumsum (mode 'add') or np.cumprod (mode 'mul') along one axis; the output dtype is
    NumPy's (small integers and bools accumulate in the platform integer; half floats
    accumulate in float32)."""

    __props__ = ("axis", "mode")

    def __init__(self, axis: int, mode: str = "add"):
        if mode not in ("add", "mul"):
            raise ValueError(f"CumOp: mode must be 'add' or 'mul', got {mode!r}")
        self.axis, self.mode = int(axis), mode

    def __str__(self) -> str:
        return f"Cum{'sum' if self.mode == 'add' else 'prod'}{{{self.axis}}}"

    def _np(self):
        return np.cumsum if self.mode == "add" else np.cumprod

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x} ({x.type})")
        dtype = self._np()(np.zeros(1, x.dtype)).dtype.name
        return Apply(self, [x], [TensorType(dtype, x.broadcastable)()])

    def perform(self, node, inputs, out):
        # half dtypes accumulate in float32 (value_dtype), each prefix rounded once, like sum
        dtype = node.outputs[0].dtype
        out[0][0] = np.asarray(self._np()(inputs[0], axis=self.axis, dtype=value_dtype(dtype)),
                               dtype=dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        ax = self.axis
        if self.mode == "add":
            return [cast(_reverse(CumOp(ax, "add")(_reverse(gz, ax)), ax), x.dtype)]
        fx = CumOp(ax, "mul")(x)  # Theano's rule; x must have no zeros
        return [cast(_reverse(CumOp(ax, "add")(_reverse(fx * gz, ax)), ax) / x, x.dtype)]


def _cum(x: Any, axis: Any, mode: str) -> TensorVariable:
    x = as_tensor_variable(x)
    if axis is None:
        return CumOp(0, mode)(flatten(x, 1))
    return CumOp(_norm_axis(x, axis, "cumsum" if mode == "add" else "cumprod"), mode)(x)


def cumsum(x: Any, axis: int | None = None) -> TensorVariable:
    """Cumulative sum along `axis` (of the flattened array if None), as np.cumsum."""
    return _cum(x, axis, "add")


def cumprod(x: Any, axis: int | None = None) -> TensorVariable:
    """Cumulative product along `axis` (of the flattened array if None), as np.cumprod."""
    return _cum(x, axis, "mul")


# ============================================================================ repeat

class Repeat(Op):
    """np.repeat(x, repeats, axis): `repeats` an integer scalar (every element the same
    number of times) or a vector with one count per element along `axis`."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"Repeat{{axis={self.axis}}}"

    def make_node(self, x: Any, repeats: Any) -> Apply:
        x, repeats = as_tensor_variable(x), as_tensor_variable(repeats)
        _require_int(repeats, "repeat", "repeats")
        if repeats.ndim > 1:
            raise ValueError(f"repeat: repeats must be a scalar or a vector, got {repeats} "
                             f"({repeats.type})")
        if not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x} ({x.type})")
        bcast = list(x.broadcastable)
        bcast[self.axis] = False
        return Apply(self, [x, repeats], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        x, repeats = inputs
        try:
            out[0][0] = np.repeat(x, repeats, axis=self.axis)
        except ValueError as exc:
            raise ValueError(f"repeat: cannot repeat an array of shape {x.shape} along axis "
                             f"{self.axis} with repeats {repeats!r}: {exc}") from None

    def infer_shape(self, fgraph, node, input_shapes):
        x, repeats = node.inputs
        shp = list(input_shapes[0])
        if repeats.ndim == 0:
            shp[self.axis] = shp[self.axis] * _int64(repeats)
        else:
            shp[self.axis] = _int64(_sum(repeats))
        return [tuple(shp)]

    def grad(self, inputs, output_grads):
        x, repeats = inputs
        if not is_float(x.dtype):
            return [None, None]
        return [RepeatGrad(self.axis)(output_grads[0], repeats, x), None]


class RepeatGrad(Op):
    """The gradient of Repeat: the sums of gz over the copies of each element of x (x is an
    input for its shape and type only)."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def make_node(self, gz: Any, repeats: Any, x: Any) -> Apply:
        gz, repeats, x = (as_tensor_variable(v) for v in (gz, repeats, x))
        return Apply(self, [gz, repeats, x], [TensorType(gz.dtype, x.broadcastable)()])

    def perform(self, node, inputs, out):
        gz, repeats, x = inputs
        n = x.shape[self.axis]
        owner = np.repeat(np.arange(n), repeats)
        g = np.moveaxis(gz, self.axis, 0)
        acc = np.zeros((n,) + g.shape[1:], dtype=gz.dtype)
        np.add.at(acc, owner, g)
        out[0][0] = np.moveaxis(acc, 0, self.axis)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[2])]

    def grad(self, inputs, output_grads):
        gz, repeats, x = inputs
        return [Repeat(self.axis)(output_grads[0], repeats), None, None]


def repeat(x: Any, repeats: Any, axis: int | None = None) -> TensorVariable:
    """Each element of `x` repeated `repeats` times along `axis` (of the flattened array if
    None), as np.repeat; `repeats` is an int, an integer scalar or a vector of counts."""
    x = as_tensor_variable(x)
    if isinstance(repeats, (list, tuple)) or (isinstance(repeats, np.ndarray) and repeats.ndim):
        repeats = constant(np.asarray(repeats, dtype="int64"))
    elif isinstance(repeats, (int, np.integer)):
        repeats = constant(int(repeats), dtype="int64")
    if axis is None:
        return Repeat(0)(flatten(x, 1), repeats)
    return Repeat(_norm_axis(x, axis, "repeat"))(x, repeats)


# ============================================================================ eye / diagonals

class Eye(Op):
    """np.eye(n, m, k) of integer scalars n, m, k, in `dtype`."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = check_dtype(dtype)

    def make_node(self, n: Any, m: Any, k: Any) -> Apply:
        args = [_as_int_scalar(v, "eye argument") for v in (n, m, k)]
        return Apply(self, args, [TensorType(self.dtype, (False, False))()])

    def perform(self, node, inputs, out):
        n, m, k = (int(v) for v in inputs)
        if n < 0 or m < 0:
            raise ValueError(f"eye: negative dimensions n={n}, m={m}")
        out[0][0] = np.eye(n, m, k, dtype=self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [(_int64(node.inputs[0]), _int64(node.inputs[1]))]

    def grad(self, inputs, output_grads):
        return [None, None, None]


def eye(n: Any, m: Any = None, k: Any = 0, dtype: str | None = None) -> TensorVariable:
    """An n x m matrix with ones on diagonal `k` (dtype floatX by default), as np.eye."""
    dtype = config.floatX if dtype in (None, "floatX") else dtype
    return Eye(dtype)(n, n if m is None else m, k)


def identity_like(x: Any) -> TensorVariable:
    """The identity matrix of the shape and dtype of the matrix `x`."""
    x = as_tensor_variable(x)
    if x.ndim != 2:
        raise ValueError(f"identity_like: {x} ({x.type}) is not a matrix")
    return Eye(x.dtype)(shape_i(x, 0), shape_i(x, 1), 0)


class AllocDiag(Op):
    """np.diag(v, offset) of a vector: the square matrix with v on diagonal `offset`."""

    __props__ = ("offset",)

    def __init__(self, offset: int = 0):
        self.offset = int(offset)

    def make_node(self, v: Any) -> Apply:
        v = as_tensor_variable(v)
        if v.ndim != 1:
            raise ValueError(f"AllocDiag: {v} ({v.type}) is not a vector")
        return Apply(self, [v], [TensorType(v.dtype, (False, False))()])

    def perform(self, node, inputs, out):
        out[0][0] = np.diag(inputs[0], self.offset)

    def infer_shape(self, fgraph, node, input_shapes):
        n = input_shapes[0][0] + abs(self.offset)
        return [(n, n)]

    def grad(self, inputs, output_grads):
        if not is_float(inputs[0].dtype):
            return [None]
        return [ExtractDiag(self.offset)(output_grads[0])]


class ExtractDiag(Op):
    """np.diagonal(x, offset, axis1, axis2), as a copy: the remaining axes, then the
    diagonal."""

    __props__ = ("offset", "axis1", "axis2")

    def __init__(self, offset: int = 0, axis1: int = 0, axis2: int = 1):
        if axis1 == axis2:
            raise ValueError(f"diagonal: axis1 and axis2 are both {axis1}")
        self.offset, self.axis1, self.axis2 = int(offset), int(axis1), int(axis2)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim < 2 or not (0 <= self.axis1 < x.ndim and 0 <= self.axis2 < x.ndim):
            raise ValueError(f"diagonal: axes ({self.axis1}, {self.axis2}) do not fit {x} "
                             f"({x.type}); it needs 2 dimensions or more")
        rest = [b for d, b in enumerate(x.broadcastable) if d not in (self.axis1, self.axis2)]
        return Apply(self, [x], [TensorType(x.dtype, rest + [False])()])

    def perform(self, node, inputs, out):
        out[0][0] = np.diagonal(inputs[0], self.offset, self.axis1, self.axis2).copy()

    def infer_shape(self, fgraph, node, input_shapes):
        shp = input_shapes[0]
        rows, cols, k = shp[self.axis1], shp[self.axis2], self.offset
        length = minimum(rows, cols - k) if k >= 0 else minimum(rows + k, cols)
        rest = [s for d, s in enumerate(shp) if d not in (self.axis1, self.axis2)]
        return [tuple(rest) + (_int64(maximum(length, 0)),)]

    def grad(self, inputs, output_grads):
        (x,) = inputs
        if not is_float(x.dtype):
            return [None]
        return [ExtractDiagGrad(self.offset, self.axis1, self.axis2)(x, output_grads[0])]


class ExtractDiagGrad(Op):
    """Zeros of x's shape with `gz` on the diagonal ExtractDiag read (x: shape only)."""

    __props__ = ("offset", "axis1", "axis2")

    def __init__(self, offset: int, axis1: int, axis2: int):
        self.offset, self.axis1, self.axis2 = offset, axis1, axis2

    def make_node(self, x: Any, gz: Any) -> Apply:
        x, gz = as_tensor_variable(x), as_tensor_variable(gz)
        return Apply(self, [x, gz], [TensorType(gz.dtype, x.broadcastable)()])

    def perform(self, node, inputs, out):
        x, gz = inputs
        res = np.zeros(x.shape, dtype=gz.dtype)
        view = np.moveaxis(res, (self.axis1, self.axis2), (-2, -1))
        n, k = gz.shape[-1], self.offset
        rows, cols = np.arange(n) + max(0, -k), np.arange(n) + max(0, k)
        view[..., rows, cols] = gz
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        return [None, ExtractDiag(self.offset, self.axis1, self.axis2)(output_grads[0])]


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> TensorVariable:
    """The diagonal `offset` of `a` over axes (axis1, axis2), as np.diagonal (a copy)."""
    a = as_tensor_variable(a)
    if a.ndim < 2:
        raise ValueError(f"diagonal: {a} ({a.type}) needs 2 dimensions or more")
    ax1, ax2 = _norm_axis(a, axis1, "diagonal"), _norm_axis(a, axis2, "diagonal")
    return ExtractDiag(offset, ax1, ax2)(a)


def diag(v: Any, k: int = 0) -> TensorVariable:
    """np.diag: a vector gives the matrix with it on diagonal k, a matrix its diagonal k."""
    v = as_tensor_variable(v)
    if v.ndim == 1:
        return AllocDiag(k)(v)
    if v.ndim == 2:
        return ExtractDiag(k, 0, 1)(v)
    raise ValueError(f"diag: {v} ({v.type}) must be a vector or a matrix")


# ============================================================================ nonzero

class Nonzero(Op):
    """np.nonzero as one int64 matrix: row d holds the indices along dimension d."""

    __props__ = ()

    def make_node(self, a: Any) -> Apply:
        a = as_tensor_variable(a)
        if a.ndim == 0:
            raise ValueError(f"nonzero: {a} is a scalar; give it at least one dimension")
        return Apply(self, [a], [TensorType("int64", (a.ndim == 1, False))()])

    def perform(self, node, inputs, out):
        a = inputs[0]
        res = np.empty((a.ndim, 0), dtype="int64") if a.size == 0 else \
            np.asarray(np.nonzero(a), dtype="int64").reshape(a.ndim, -1)
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        a = node.inputs[0]
        return [(constant(a.ndim, dtype="int64"), _int64(_sum(neq(a, 0))))]

    def grad(self, inputs, output_grads):
        return [None]


def nonzero(a: Any, return_matrix: bool = False) -> Any:
    """The indices of the nonzero elements of `a`: a tuple of one int64 vector per dimension
    (as np.nonzero), or, with `return_matrix`, one (ndim, count) matrix."""
    a = as_tensor_variable(a)
    m = Nonzero()(a)
    return m if return_matrix else tuple(m[d] for d in range(a.ndim))


def flatnonzero(a: Any) -> TensorVariable:
    """Indices of the nonzero elements of the flattened `a`, as np.flatnonzero."""
    return Nonzero()(flatten(as_tensor_variable(a), 1))[0]


def nonzero_values(a: Any) -> TensorVariable:
    """The nonzero elements of `a`, flattened, as a[np.nonzero(a)]."""
    a = as_tensor_variable(a)
    return flatten(a, 1)[flatnonzero(a)]


# ========================================================================= bincount / searchsorted

class BinCount(Op):
    """np.bincount(x, minlength=...) of a non-negative integer vector (int64 counts)."""

    __props__ = ("minlength",)

    def __init__(self, minlength: int = 0):
        self.minlength = int(minlength)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        _require_int(x, "bincount", "the values")
        if x.ndim != 1:
            raise ValueError(f"bincount: {x} ({x.type}) must be a vector")
        return Apply(self, [x], [TensorType("int64", (False,))()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        if x.size and x.min() < 0:
            raise ValueError(f"bincount: negative value {x.min()} in an input of shape {x.shape}")
        out[0][0] = np.bincount(x, minlength=self.minlength).astype("int64")

    def infer_shape(self, fgraph, node, input_shapes):
        # max(x) + 1, or 0 for an empty x: the max of x with a -1 appended
        padded = concatenate([cast(node.inputs[0], "int64"), constant(np.array([-1]))])
        return [(_int64(maximum(_max(padded) + 1, self.minlength)),)]

    def grad(self, inputs, output_grads):
        return [None]


def bincount(x: Any, weights: Any = None, minlength: int = 0) -> TensorVariable:
    """How often each value 0..max(x) occurs in the integer vector `x` (or the sum of
    `weights` at those places), as np.bincount."""
    x = as_tensor_variable(x)
    if weights is None:
        return BinCount(minlength)(x)
    weights = as_tensor_variable(weights)
    n = shape_i(BinCount(minlength)(x), 0)
    return inc_subtensor(zeros((n,), dtype=weights.dtype)[x], weights)


class SearchSorted(Op):
    """np.searchsorted(a, v, side): where the values of `v` would go in the sorted vector
    `a` (int64 indices, the shape of `v`)."""

    __props__ = ("side",)

    def __init__(self, side: str = "left"):
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        self.side = side

    def make_node(self, a: Any, v: Any, sorter: Any = None) -> Apply:
        """`sorter` (optional, Theano's): the int vector of indices that sort `a`."""
        a, v = as_tensor_variable(a), as_tensor_variable(v)
        if a.ndim != 1:
            raise ValueError(f"searchsorted: the sorted array {a} ({a.type}) must be a vector")
        inputs = [a, v]
        if sorter is not None:
            sorter = as_tensor_variable(sorter)
            if sorter.ndim != 1 or not sorter.dtype.startswith(("int", "uint")):
                raise TypeError(f"searchsorted: sorter {sorter} ({sorter.type}) must be an "
                                "integer vector (the argsort of a)")
            inputs.append(sorter)
        return Apply(self, inputs, [TensorType("int64", v.broadcastable)()])

    def perform(self, node, inputs, out):
        a, v, *sorter = inputs
        out[0][0] = np.asarray(np.searchsorted(a, v, side=self.side,
                                               sorter=sorter[0] if sorter else None),
                               dtype="int64")

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[1])]

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> TensorVariable:
    """Indices where the elements of `v` would be inserted into the sorted vector `a` to
    keep it sorted, as np.searchsorted (`sorter`: indices that sort `a`, if it is not)."""
    return SearchSorted(side)(a, v, sorter)


#: Theano's name of the op (theano.tensor.extra_ops.SearchsortedOp)
SearchsortedOp = SearchSorted


def to_one_hot(y: Any, nb_class: Any, dtype: str | None = None) -> TensorVariable:
    """Theano's ``extra_ops.to_one_hot``: a matrix (y.shape[0], nb_class) whose row i is 1 at
    column y[i] and 0 elsewhere (dtype floatX by default); `y` a vector of integer labels."""
    y = as_tensor_variable(y)
    if y.ndim != 1 or not y.dtype.startswith(("int", "uint")):
        raise TypeError(f"to_one_hot: y must be a vector of integer labels, got {y} ({y.type})")
    n = shape_i(y, 0)
    out = zeros((n, nb_class), dtype=dtype)
    return set_subtensor(out[arange(n), y], 1)


# Theano's theano.tensor.extra_ops functions (also in symgpu.tensor; `squeeze` is
# symgpu.tensor.basic's, imported above)

def diff(x: Any, n: int = 1, axis: int = -1) -> TensorVariable:
    """The n-th discrete difference along `axis`, as np.diff."""
    x = as_tensor_variable(x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"diff: axis {axis} is out of range for {x} ({x.type})")
    if n < 0:
        raise ValueError(f"diff: order n must be >= 0, got {n}")
    axis = axis % x.ndim
    before = (slice(None),) * axis
    for _ in range(n):
        x = x[before + (slice(1, None),)] - x[before + (slice(None, -1),)]
    return x


def fill_diagonal(a: Any, val: Any) -> TensorVariable:
    """A copy of the matrix `a` with its main diagonal set to the scalar `val`, as
    np.fill_diagonal (which works in place)."""
    a = as_tensor_variable(a)
    if a.ndim != 2:
        raise ValueError(f"fill_diagonal: {a} ({a.type}) must be a matrix")
    n = minimum(shape_i(a, 0), shape_i(a, 1))
    i = arange(n, dtype="int64")
    return set_subtensor(a[i, i], cast(val, a.dtype))


def compress(condition: Any, x: Any, axis: int | None = None) -> TensorVariable:
    """``numpy.compress``: the slices of `x` along `axis` (of the flattened `x` when None)
    where the 1-d `condition` is non-zero."""
    x = as_tensor_variable(x)
    where = flatnonzero(condition)
    if axis is None:
        return flatten(x)[where]
    axis = _norm_axis(x, axis, "compress")
    return x[(slice(None),) * axis + (where,)]


# Theano's extra_ops names whose ops live in symgpu/tensor/index_ops.py (index arithmetic)
from symgpu.tensor.index_ops import (Bartlett, CpuContiguous, FillDiagonalOffset,  # noqa: E402,F401
                                     RavelMultiIndex, Unique, UnravelIndex, bartlett,
                                     cpu_contiguous, fill_diagonal_offset, ravel_multi_index,
                                     unravel_index)
