"""Shape and construction ops: reshape, flatten, squeeze, concatenate, stack, alloc, zeros,
ones, arange, MakeVector; re-exports the shape helpers and indexing front ends.

Shapes are passed around as int64 scalars (or an int64 vector built by MakeVector), so a
constant `1` in a shape lets the output type know that dimension is broadcastable.
"""
from __future__ import annotations

import builtins
import warnings
from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import check_dtype, is_float, upcast
from symgpu.tensor.elemwise import DimShuffle, _sum_to_broadcast_pattern
from symgpu.tensor.math import (as_operands, cast, clip, fill, lt, ones_like, second, switch,
                                zeros_like)
from symgpu.tensor.shape import (Shape, Shape_i, SpecifyShape, dimshuffle, shape, shape_i,
                                 shape_tuple, specify_broadcastable_as, transpose)
from symgpu.tensor.shape_rules import (_const, as_dim, dim_value, is_nonnegative,
                                       join_shape, s_eq, s_floordiv, s_prod, s_switch)
from symgpu.tensor.subtensor import (AdvancedIncSubtensor, AdvancedSubtensor, IncSubtensor,
                                     Subtensor, getitem, inc_subtensor, set_subtensor)
from symgpu.tensor import type as _type
from symgpu.tensor.ranges import ARange, arange
from symgpu.tensor.type import TensorConstant, TensorType, TensorVariable, as_tensor_variable, constant

__all__ = [
    "int_dtypes", "uint_dtypes", "integer_dtypes", "discrete_dtypes", "float_dtypes",
    "complex_dtypes", "continuous_dtypes", "all_dtypes",
    "MakeVector", "make_vector", "Reshape", "reshape", "flatten", "squeeze", "Join", "join",
    "concatenate", "stack", "Alloc", "alloc", "zeros", "ones", "ARange", "arange",
    "specify_shape", "shape_padleft", "shape_padright", "choose", "get_vector_length",
    # re-exported from math.py / shape.py / subtensor.py
    "fill", "second", "zeros_like", "ones_like", "cast", "shape", "shape_i", "transpose",
    "dimshuffle", "specify_broadcastable_as", "getitem", "set_subtensor", "inc_subtensor",
    "Subtensor", "AdvancedSubtensor", "IncSubtensor", "AdvancedIncSubtensor",
]


def _is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


# ----------------------------------------------------------------------------- shape helpers

def _as_int_scalar(s: Any, what: str = "shape entry") -> TensorVariable:
    """An int64 scalar variable from a Python int or a symbolic integer scalar."""
    if isinstance(s, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, got {s!r}")
    if isinstance(s, (int, np.integer)):
        return constant(int(s), dtype="int64")
    v = as_tensor_variable(s)
    if v.ndim != 0 or not _is_int(v.dtype):
        raise TypeError(f"{what} must be an integer scalar, got {v} ({v.type})")
    if isinstance(v, TensorConstant):
        return constant(int(v.data), dtype="int64")
    return v if v.dtype == "int64" else cast(v, "int64")


def _known_one(v: Variable) -> bool:
    """Whether an int scalar is known, when the graph is built, to equal 1."""
    if isinstance(v, TensorConstant):
        return v.data.ndim == 0 and int(v.data) == 1
    node = v.owner
    if node is not None and isinstance(node.op, Shape_i):
        return node.inputs[0].broadcastable[node.op.i]
    return False


def _vector_length(v: TensorVariable) -> int | None:
    """The length of a symbolic vector when the graph tells it, else None."""
    if isinstance(v, TensorConstant):
        return len(v.data)
    node = v.owner
    if node is None:
        return None
    if isinstance(node.op, MakeVector):
        return len(node.inputs)
    if isinstance(node.op, Shape):
        return node.inputs[0].ndim
    if isinstance(node.op, Subtensor) and len(node.inputs) == 1 and len(node.op.idx_list) == 1:
        entry = node.op.idx_list[0]
        n = _vector_length(node.inputs[0])
        if n is not None and not isinstance(entry, int) and entry is not None and entry is not Ellipsis:
            return len(range(n)[slice(*entry)])
    return None


def get_vector_length(v: Any) -> int:
    """Theano's `T.get_vector_length`: the length of the symbolic vector `v` when the graph
    tells it (a constant, a shape, a MakeVector, a slice of those, a broadcastable vector);
    a ValueError when only running the graph would tell it."""
    v = as_tensor_variable(v)
    if v.ndim != 1:
        raise TypeError(f"get_vector_length: {v} ({v.type}) is not a vector")
    if v.broadcastable[0]:
        return 1
    n = _vector_length(v)
    if n is None:
        raise ValueError(f"get_vector_length: the length of {v} is not known before the graph "
                         "runs")
    return n


def _shape_entries(shape_: Any) -> list[TensorVariable]:
    """A shape argument (int, tuple/list, ndarray, or symbolic int scalar/vector of known
    length) as a list of int64 scalar variables."""
    if isinstance(shape_, (list, tuple)):
        return [_as_int_scalar(s) for s in shape_]
    if isinstance(shape_, np.ndarray):
        return [_as_int_scalar(s) for s in shape_.reshape(-1)] if shape_.ndim else [_as_int_scalar(shape_)]
    if not isinstance(shape_, Variable):
        return [_as_int_scalar(shape_)]
    v = as_tensor_variable(shape_)
    if v.ndim == 0:
        return [_as_int_scalar(v)]
    if v.ndim != 1 or not _is_int(v.dtype):
        raise TypeError(f"a shape must be an integer vector or a tuple of integers, got {v} ({v.type})")
    node = v.owner
    if isinstance(v, TensorConstant):
        return [constant(int(s), dtype="int64") for s in v.data]
    if node is not None and isinstance(node.op, MakeVector):
        return [_as_int_scalar(s) for s in node.inputs]
    if node is not None and isinstance(node.op, Shape):
        x = node.inputs[0]
        return [constant(1, dtype="int64") if b else shape_i(x, d) for d, b in enumerate(x.broadcastable)]
    n = _vector_length(v)
    if n is None:
        raise TypeError(f"cannot tell how many dimensions the shape {v} has; pass a tuple of "
                        "integer scalars instead")
    return [_as_int_scalar(getitem(v, i)) for i in range(n)]


# ----------------------------------------------------------------------------- MakeVector

class MakeVector(Op):
    """Stack scalars into a vector: how symbolic shapes are built from int scalars."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str = "int64"):
        self.dtype = check_dtype(dtype)

    def __str__(self) -> str:
        return f"MakeVector{{dtype='{self.dtype}'}}"

    def make_node(self, *inputs: Any) -> Apply:
        inputs = [as_tensor_variable(i) for i in inputs]
        for i, v in enumerate(inputs):
            if v.ndim != 0:
                raise TypeError(f"{self}: input {i} ({v}) must be a scalar, got {v.type}")
            if not np.can_cast(v.dtype, self.dtype, casting="safe"):
                raise TypeError(f"{self}: input {i} ({v}) has dtype {v.dtype}, which does not "
                                f"fit in {self.dtype}; cast it first")
        return Apply(self, inputs, [TensorType(self.dtype, (len(inputs) == 1,))()])

    def perform(self, node, inputs, out):
        out[0][0] = np.array(inputs, dtype=self.dtype).reshape(len(inputs))

    def infer_shape(self, fgraph, node, input_shapes):
        return [(len(node.inputs),)]

    def grad(self, inputs, output_grads):
        gz = output_grads[0]
        if not is_float(self.dtype):
            return [None] * len(inputs)
        return [cast(getitem(gz, i), v.dtype) if is_float(v.dtype) else None
                for i, v in enumerate(inputs)]


def make_vector(*scalars: Any, dtype: str | None = None) -> TensorVariable:
    """A vector of the given scalars (dtype: their upcast unless given)."""
    scalars = as_operands(*scalars) if scalars else []
    dtype = check_dtype(dtype) if dtype else (upcast(*[s.dtype for s in scalars]) if scalars else "int64")
    return MakeVector(dtype)(*[cast(s, dtype) for s in scalars])


# ----------------------------------------------------------------------------- reshape

def _shape_vector_entries(shp: Variable, ndim: int) -> list[Variable]:
    if isinstance(shp, TensorConstant):
        return [_const(int(s)) for s in np.asarray(shp.data).reshape(-1)]
    node = shp.owner
    if node is not None and isinstance(node.op, MakeVector):
        return [as_dim(s) for s in node.inputs]
    if node is not None and getattr(node.op, "shape_read", None) == "all":
        return list(shape_tuple(node.inputs[0]))  # reshape(x, y.shape)
    return [as_dim(getitem(shp, i)) for i in range(ndim)]


def reshape_shape(x_shape: tuple, shp: Variable, ndim: int) -> tuple:
    """The shape a Reshape gives: the requested entries, a -1 (constant, or a symbolic entry
    that turns out -1 at run time) replaced by what the size of `x` leaves over."""
    entries = _shape_vector_entries(shp, ndim)

    sure = is_nonnegative  # an entry that cannot be -1
    if all(sure(e) for e in entries):
        return tuple(entries)
    size = s_prod(x_shape)
    fixed = [e if sure(e) else (1 if dim_value(e) == -1 else s_switch(s_eq(e, -1), 1, e))
             for e in entries]
    out = []
    for i, e in enumerate(entries):
        if sure(e):
            out.append(e)
            continue
        missing = s_floordiv(size, s_prod(fixed[:i] + fixed[i + 1:]))
        out.append(missing if dim_value(e) == -1 else s_switch(s_eq(e, -1), missing, e))
    return tuple(as_dim(o) for o in out)



class Reshape(Op):
    """`x` with a new shape (an int vector of length `ndim`, -1 allowed); a view when NumPy
    can make one."""

    __props__ = ("ndim",)
    view_map = {0: [0]}

    def __init__(self, ndim: int):
        self.ndim = int(ndim)

    def __str__(self) -> str:
        return f"Reshape{{{self.ndim}}}"

    def make_node(self, x: Any, shp: Any) -> Apply:
        x, shp = as_tensor_variable(x), as_tensor_variable(shp)
        if shp.ndim != 1 or not _is_int(shp.dtype):
            raise TypeError(f"{self}: the shape must be an integer vector, got {shp} ({shp.type})")
        n = _vector_length(shp)
        if n is not None and n != self.ndim:
            raise ValueError(f"{self}: the shape {shp} has {n} entries, expected {self.ndim}")
        bcast = [False] * self.ndim
        if isinstance(shp, TensorConstant):
            bcast = [int(s) == 1 for s in shp.data]
        elif shp.owner is not None and isinstance(shp.owner.op, MakeVector):
            bcast = [_known_one(s) for s in shp.owner.inputs]
        return Apply(self, [x, shp], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        x, shp = inputs
        target = tuple(int(s) for s in shp)
        if len(target) != self.ndim:
            raise ValueError(f"{self}: got a shape with {len(target)} entries {target}")
        try:
            out[0][0] = x.reshape(target)
        except ValueError:
            raise ValueError(f"cannot reshape an array of shape {x.shape} (size {x.size}) into "
                             f"shape {target}") from None

    def infer_shape(self, fgraph, node, input_shapes):
        """The requested shape; a -1 is what x's size leaves over (GpuReshape's too)."""
        return [reshape_shape(input_shapes[0], node.inputs[1], self.ndim)]

    def grad(self, inputs, output_grads):
        x, gz = inputs[0], output_grads[0]
        if not is_float(x.dtype):
            return [None, None]
        back = [constant(1, dtype="int64") if b else shape_i(x, d)
                for d, b in enumerate(x.broadcastable)]
        return [reshape(cast(gz, x.dtype), back, ndim=x.ndim), None]

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else self(eval_points[0], inputs[1])]


def reshape(x: Any, shape: Any, ndim: int | None = None) -> TensorVariable:
    """`x` reshaped to `shape`: a tuple/list of ints and symbolic int scalars, or a symbolic
    int vector (then `ndim` is needed unless the graph tells its length). One -1 allowed."""
    x = as_tensor_variable(x)
    if isinstance(shape, (list, tuple)) or (isinstance(shape, Variable) and shape.ndim == 0) \
            or isinstance(shape, (int, np.integer)):
        entries = _shape_entries(shape if isinstance(shape, (list, tuple)) else [shape])
        if ndim is not None and ndim != len(entries):
            raise ValueError(f"reshape: ndim={ndim} but the shape has {len(entries)} entries")
        consts = [int(e.data) for e in entries if isinstance(e, TensorConstant)]
        if consts.count(-1) > 1:
            raise ValueError(f"reshape: at most one -1 is allowed in the shape {tuple(shape)}")
        if any(c < -1 for c in consts):
            raise ValueError(f"reshape: negative size in the shape {tuple(shape)}")
        if len(consts) == len(entries):
            shp = constant(np.array(consts, dtype="int64").reshape(len(consts)))
        else:
            shp = MakeVector("int64")(*entries)
        return Reshape(len(entries))(x, shp)
    shp = as_tensor_variable(shape)
    if shp.ndim != 1 or not _is_int(shp.dtype):
        raise TypeError(f"reshape: the shape must be integers, got {shp} ({shp.type})")
    if ndim is None:
        ndim = _vector_length(shp)
        if ndim is None:
            raise ValueError(f"reshape: cannot tell the length of the symbolic shape {shp}; "
                             "pass ndim=")
    return Reshape(ndim)(x, shp if shp.dtype == "int64" else cast(shp, "int64"))


def flatten(x: Any, ndim: int = 1) -> TensorVariable:
    """Theano's flatten: keep the first `ndim - 1` dimensions, merge the rest into one."""
    x = as_tensor_variable(x)
    if not 1 <= ndim <= max(x.ndim, 1):
        raise ValueError(f"flatten: ndim={ndim} must be between 1 and {max(x.ndim, 1)} for {x}")
    one = constant(1, dtype="int64")
    keep = [one if x.broadcastable[d] else shape_i(x, d) for d in range(ndim - 1)]
    rest = [shape_i(x, d) for d in range(ndim - 1, x.ndim) if not x.broadcastable[d]]
    size = one
    for s in rest:
        size = s if size is one else size * s
    return reshape(x, keep + [size], ndim=ndim)


def squeeze(x: Any, axis: Any = None) -> TensorVariable:
    """Drop length-1 dimensions: all broadcastable ones (axis=None) or those in `axis`, which
    are checked to have length 1 at run time when the type does not say so."""
    x = as_tensor_variable(x)
    if axis is None:
        axes = [d for d, b in enumerate(x.broadcastable) if b]
    else:
        axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
        for a in axes:
            if not -x.ndim <= a < x.ndim:
                raise ValueError(f"squeeze: axis {a} is out of range for {x} ({x.ndim} dimensions)")
        axes = sorted({int(a) % x.ndim for a in axes})
        need = [b or d in axes for d, b in enumerate(x.broadcastable)]
        x = specify_broadcastable_as(x, x.type.clone(broadcastable=need))
    return DimShuffle(x.broadcastable, [d for d in range(x.ndim) if d not in axes])(x)


# ----------------------------------------------------------------------------- join / stack

class Join(Op):
    """Concatenate tensors of equal rank along `axis` (dtypes upcast, like NumPy)."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"Join{{axis={self.axis}}}"

    def make_node(self, *tensors: Any) -> Apply:
        tensors = [as_tensor_variable(t) for t in tensors]
        if not tensors:
            raise ValueError("join needs at least one tensor")
        nd = tensors[0].ndim
        for i, t in enumerate(tensors):
            if t.ndim != nd:
                raise TypeError(f"join: all tensors need the same number of dimensions; input 0 "
                                f"has {nd}, input {i} ({t}) has {t.ndim}")
        bcast = join_broadcastable(tensors, self.axis, "join")
        dtype = upcast(*[t.dtype for t in tensors])
        return Apply(self, tensors, [TensorType(dtype, bcast)()])

    def perform(self, node, inputs, out):
        try:
            res = np.concatenate(inputs, axis=self.axis)
        except ValueError:
            raise ValueError(f"join along axis {self.axis}: the shapes "
                             f"{', '.join(str(i.shape) for i in inputs)} differ outside that "
                             "axis") from None
        out[0][0] = res.astype(node.outputs[0].dtype, copy=False)

    def infer_shape(self, fgraph, node, input_shapes):
        """Lengths along `axis` add up; the others agree (GpuJoin's too)."""
        return [join_shape(self.axis, [t.broadcastable for t in node.inputs], input_shapes)]

    def grad(self, inputs, output_grads):
        gz = output_grads[0]
        if not is_float(gz.dtype):
            return [None] * len(inputs)
        grads = []
        start: Any = 0
        for t in inputs:
            n = constant(1, dtype="int64") if t.broadcastable[self.axis] else shape_i(t, self.axis)
            stop = n if isinstance(start, int) else start + n
            g = getitem(gz, (slice(None),) * self.axis + (slice(start, stop),))
            start = stop
            if not is_float(t.dtype):
                grads.append(None)
                continue
            g = specify_broadcastable_as(cast(g, t.dtype), t.type)
            grads.append(g)
        return grads


def join_broadcastable(tensors: Sequence[Any], axis: int, what: str) -> tuple[bool, ...]:
    """The broadcast pattern of the join of `tensors` (equal rank) along `axis`: a dimension
    is broadcastable where any input's is, the joined one only for a lone input's (host and
    GPU join alike)."""
    nd = tensors[0].ndim
    if not 0 <= axis < nd:
        raise ValueError(f"{what}: axis {axis} is out of range for {nd} dimensions")
    bcast = [any(t.broadcastable[d] for t in tensors) for d in range(nd)]
    bcast[axis] = len(tensors) == 1 and tensors[0].broadcastable[axis]
    return tuple(bcast)


def _norm_join_axis(axis: int, nd: int, what: str) -> int:
    if not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be a Python int, got {axis!r}")
    if not -nd <= axis < nd:
        raise ValueError(f"{what}: axis {axis} is out of range for {nd} dimensions")
    return int(axis) % nd


def concatenate(tensors: Sequence[Any], axis: int = 0) -> TensorVariable:
    """np.concatenate: join tensors of equal rank along an existing `axis`."""
    tensors = as_operands(*tensors) if len(tensors) else []
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    if tensors[0].ndim == 0:
        raise ValueError("concatenate: zero-dimensional tensors cannot be concatenated; use stack")
    axis = _norm_join_axis(axis, tensors[0].ndim, "concatenate")
    if len(tensors) == 1:
        return tensors[0]
    return Join(axis)(*tensors)


def join(axis: int, *tensors: Any) -> TensorVariable:
    """Theano's spelling of concatenate: `join(axis, t1, t2, ...)`."""
    return concatenate(tensors, axis)


def stack(tensors: Sequence[Any], *more: Any, axis: int = 0) -> TensorVariable:
    """np.stack: join tensors of equal shape along a new `axis`. Theano's older spelling
    ``stack(a, b, c)`` (the tensors as arguments) works too, with its DeprecationWarning."""
    if more or not isinstance(tensors, (list, tuple)):
        if len(more) == 1 and isinstance(more[0], (int, np.integer)) and \
                isinstance(tensors, (list, tuple)):
            axis = int(more[0])  # stack(tensors, 1): the axis given by position
        else:
            warnings.warn("stack(*tensors) is Theano's deprecated spelling: use "
                          "stack([a, b, ...], axis=0)", DeprecationWarning, stacklevel=2)
            tensors = (tensors, *more)
    tensors = as_operands(*tensors) if len(tensors) else []
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    nd = tensors[0].ndim
    for i, t in enumerate(tensors):
        if t.ndim != nd:
            raise ValueError(f"stack: all tensors need the same number of dimensions; input 0 has "
                             f"{nd}, input {i} ({t}) has {t.ndim}")
    axis = _norm_join_axis(axis, nd + 1, "stack")
    if nd == 0:
        return make_vector(*tensors)
    pattern = list(range(nd))
    pattern.insert(axis, "x")
    expanded = [DimShuffle(t.broadcastable, pattern)(t) for t in tensors]
    return expanded[0] if len(expanded) == 1 else Join(axis)(*expanded)


# ----------------------------------------------------------------------------- alloc

class Alloc(Op):
    """A new array of the given shape filled with `value` broadcast to it."""

    __props__ = ()

    def make_node(self, value: Any, *shape_: Any) -> Apply:
        value = as_tensor_variable(value)
        shape_ = [_as_int_scalar(s) for s in shape_]
        if value.ndim > len(shape_):
            raise ValueError(f"alloc: the value {value} has {value.ndim} dimensions, more than "
                             f"the {len(shape_)} of the shape")
        bcast = [_known_one(s) for s in shape_]
        return Apply(self, [value, *shape_], [TensorType(value.dtype, bcast)()])

    def perform(self, node, inputs, out):
        v = inputs[0]
        target = tuple(int(s) for s in inputs[1:])
        if any(s < 0 for s in target):
            raise ValueError(f"alloc: negative dimension in the shape {target}")
        vb = node.inputs[0].broadcastable
        for j in range(1, v.ndim + 1):
            s, t = v.shape[-j], target[-j]
            if s != t and not (s == 1 and vb[-j]):
                hint = ("; its dimension {} has length 1 but the type does not say it is "
                        "broadcastable".format(v.ndim - j)) if s == 1 else ""
                raise ValueError(f"alloc: cannot broadcast a value of shape {v.shape} to the "
                                 f"shape {target}{hint}")
        res = np.empty(target, dtype=node.outputs[0].dtype)
        res[...] = v
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        """The shape inputs themselves (GpuAlloc's too)."""
        return [tuple(node.inputs[1:])]

    def grad(self, inputs, output_grads):
        value, gz = inputs[0], output_grads[0]
        if not is_float(value.dtype):
            return [None] * len(inputs)
        g = _sum_to_broadcast_pattern(gz, value)
        return [cast(g, value.dtype)] + [None] * (len(inputs) - 1)


def alloc(value: Any, *shape_: Any) -> TensorVariable:
    """`value` broadcast to `shape` in a new array: `alloc(v, 3, n)` (or one shape tuple)."""
    if len(shape_) == 1 and not (isinstance(shape_[0], Variable) and shape_[0].ndim == 0) \
            and not isinstance(shape_[0], (int, np.integer)):
        entries = _shape_entries(shape_[0])
    else:
        entries = [_as_int_scalar(s) for s in shape_]
    return Alloc()(value, *entries)


def _filled(fill_value: int, shape_: Any, dtype: str | None) -> TensorVariable:
    dtype = config.floatX if dtype in (None, "floatX") else check_dtype(dtype)
    return Alloc()(constant(fill_value, dtype=dtype), *_shape_entries(shape_))


def zeros(shape: Any, dtype: str | None = None) -> TensorVariable:
    """A tensor of zeros; `shape` an int, a tuple of ints/int scalars, or a shape vector."""
    return _filled(0, shape, dtype)


def ones(shape: Any, dtype: str | None = None) -> TensorVariable:
    """A tensor of ones; `shape` an int, a tuple of ints/int scalars, or a shape vector."""
    return _filled(1, shape, dtype)



# ----------------------------------------------------------------------------- specify_shape
# (here rather than beside SpecifyShape: a symbolic shape vector's length is read with
# _vector_length, which knows MakeVector and Subtensor)

def specify_shape(x: Any, shape: Any) -> Any:
    """`x`, checked at run time to have `shape` (Theano's/PyTensor's): a tuple of ints,
    int scalar variables and None (any length), or a symbolic int vector. The shape
    rewrites use it: `specify_shape(x, (3, n)).shape[0]` is the constant 3."""
    if not (isinstance(x, Variable) and hasattr(x.type, "broadcastable")):
        x = as_tensor_variable(x)
    if isinstance(shape, (int, np.integer)) or (isinstance(shape, Variable) and shape.ndim == 0):
        shape = (shape,)
    if isinstance(shape, Variable):
        n = _vector_length(shape)
        if n is None:
            raise ValueError(f"specify_shape: cannot tell how many entries the shape {shape} has; "
                             "pass a tuple")
        shape = tuple(getitem(shape, i) for i in range(n))
    shape = tuple(shape)
    if len(shape) != x.type.ndim:
        raise ValueError(f"specify_shape: {x} has {x.type.ndim} dimensions but the shape "
                         f"{shape} has {len(shape)} entries")
    for d, e in enumerate(shape):
        if e is None:
            continue
        v = dim_value(e)
        if v is not None and v < 0:
            raise ValueError(f"specify_shape: entry {d} of the shape {shape} is negative")
        if v is None and not (isinstance(e, Variable) and e.ndim == 0 and e.dtype[0] in "iu"):
            raise TypeError(f"specify_shape: entry {d} of the shape must be an int, None or an "
                            f"integer scalar variable, got {e!r}")
        if v is not None and v != 1 and x.type.broadcastable[d]:
            raise ValueError(f"specify_shape: dimension {d} of {x} ({x.type}) has length 1, "
                             f"the shape {shape} says {v}")
    if all(e is None for e in shape):
        return x
    return SpecifyShape([e is not None for e in shape])(x, *[e for e in shape if e is not None])


_type._SEQUENCES[:] = [stack]  # as_tensor_variable([x.shape[0], 3]) stacks what it holds


def shape_padleft(t: Any, n_ones: int = 1) -> TensorVariable:
    """`t` with `n_ones` broadcastable dimensions in front."""
    t = as_tensor_variable(t)
    return dimshuffle(t, ["x"] * n_ones + list(range(t.ndim)))


def shape_padright(t: Any, n_ones: int = 1) -> TensorVariable:
    """`t` with `n_ones` broadcastable dimensions at the end."""
    t = as_tensor_variable(t)
    return dimshuffle(t, list(range(t.ndim)) + ["x"] * n_ones)


def choose(a: Any, choices: Any, mode: str = "raise") -> TensorVariable:
    """np.choose: out[i...] = choices[a[i...]][i...], `a` (integers) and every choice
    broadcast together; `choices` is a tensor whose first axis lists the choices, or a list
    or tuple of tensors. `mode`: 'raise' (an index outside [0, n) is an error), 'wrap'
    (taken modulo n) or 'clip' (clipped into [0, n-1]). Built from broadcasting and advanced
    indexing, so the gradient flows to the choices (none to `a`)."""
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"choose: mode must be 'raise', 'wrap' or 'clip', got {mode!r}")
    a = as_tensor_variable(a)
    if not (a.dtype.startswith("int") or a.dtype.startswith("uint") or a.dtype == "bool"):
        raise TypeError(f"choose: {a} ({a.type}) must hold integers")
    if isinstance(choices, (list, tuple)):
        cs = [as_tensor_variable(c) for c in choices]
        if not cs:
            raise ValueError("choose: no choices")
        choices = stack(_broadcast_all(cs))
    else:
        choices = as_tensor_variable(choices)
        if choices.ndim < 1:
            raise ValueError(f"choose: choices {choices} ({choices.type}) need a leading axis")
    nd = builtins.max(a.ndim, choices.ndim - 1)
    a = shape_padleft(a, nd - a.ndim) if a.ndim < nd else a
    c = shape_padleft(choices, nd + 1 - choices.ndim) if choices.ndim < nd + 1 else choices
    c = dimshuffle(c, list(range(1, nd + 1)) + [0])  # the choices last, to broadcast the rest
    idx = second(c[..., 0], a)                        # a in the broadcast shape
    c = second(shape_padright(idx), c)                # every choice in it
    n = shape_i(choices, 0)
    if mode == "wrap":
        idx = idx % n
    elif mode == "clip":
        idx = clip(idx, 0, n - 1)
    else:
        idx = switch(lt(idx, 0), n, idx)              # negative: out of range, as np.choose
    grids = []
    for d in range(nd):
        pattern = ["x"] * nd
        pattern[d] = 0
        grids.append(dimshuffle(arange(shape_i(idx, d), dtype="int64"), pattern))
    return c[tuple(grids) + (idx,)]


def _broadcast_all(xs: list) -> list:
    """The tensors in `xs` broadcast against one another (and cast to their common dtype)."""
    nd = builtins.max(x.ndim for x in xs)
    xs = [shape_padleft(x, nd - x.ndim) if x.ndim < nd else x for x in xs]
    dtype = upcast(*[x.dtype for x in xs])
    xs = [cast(x, dtype) if x.dtype != dtype else x for x in xs]
    ref = xs[0]
    for x in xs[1:]:
        ref = second(x, ref)
    return [second(ref, x) for x in xs]


# -- Theano's test tolerances (theano.tensor.basic: tests written for Theano compare with them)
float16_atol, float16_rtol = 1e-3, 1e-3
float32_atol, float32_rtol = 1e-5, 1e-5
float64_atol, float64_rtol = 1e-8, 1.0000000000000001e-05   # np.allclose's defaults


def _get_atol_rtol(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Theano's (atol, rtol) for comparing `a` and `b`: by the narrowest float dtype."""
    dtypes = (str(a.dtype), str(b.dtype))
    if "float16" in dtypes:
        return float16_atol, float16_rtol
    if "float32" in dtypes or "complex64" in dtypes:
        return float32_atol, float32_rtol
    return float64_atol, float64_rtol


def _allclose(a: Any, b: Any, rtol: float | None = None, atol: float | None = None) -> bool:
    """Theano's ``theano.tensor.basic._allclose``: np.allclose with tolerances that follow
    the dtypes (float32 results are compared at 1e-5, not float64's 1e-8)."""
    a, b = np.asarray(a), np.asarray(b)
    atol_, rtol_ = _get_atol_rtol(a, b)
    return bool(np.allclose(a, b, atol=atol_ if atol is None else atol,
                            rtol=rtol_ if rtol is None else rtol))


# -- Theano's dtype lists (theano.tensor.*_dtypes; Theano's dtypes: no bfloat16)
int_dtypes = ["int8", "int16", "int32", "int64"]
uint_dtypes = ["uint8", "uint16", "uint32", "uint64"]
integer_dtypes = int_dtypes + uint_dtypes
discrete_dtypes = ["bool"] + integer_dtypes
float_dtypes = ["float16", "float32", "float64"]
complex_dtypes = ["complex64", "complex128"]
continuous_dtypes = float_dtypes + complex_dtypes
all_dtypes = discrete_dtypes + continuous_dtypes
