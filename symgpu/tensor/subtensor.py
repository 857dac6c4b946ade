"""Indexing: `x[idx]` as a view (Subtensor) or a gathered copy (AdvancedSubtensor), and the
functional updates `set_subtensor` / `inc_subtensor` (IncSubtensor, AdvancedIncSubtensor).

An index is kept in the op's props as `idx_list`: one entry per item of the Python index, where
constants are folded in and every symbolic part is the placeholder `SYM` ("take the next extra
input"). Entries are `None` (newaxis), `Ellipsis`, an `int`, `SYM` (a symbolic int scalar, int
array or bool mask) or a `Slice(start, stop, step)` whose parts are `None`, ints or `SYM`.
Props are hashable, so equal indexings merge; the run-time values arrive as inputs.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.elemwise import _sum_to_broadcast_pattern
from symgpu.tensor.math import cast, eq, prod, switch, sum as _sum, zeros_like
from symgpu.tensor.ranges import arange
from symgpu.tensor.shape import Shape, shape, shape_i
from symgpu.tensor.shape_rules import _const, as_dim, numpy_broadcast, slice_length
from symgpu.tensor.type import (TensorConstant, TensorType, TensorVariable, as_tensor_variable,
                                constant)

__all__ = ["Subtensor", "AdvancedSubtensor", "IncSubtensor", "AdvancedIncSubtensor", "Slice",
           "IncSubtensorProps",
           "SYM", "getitem", "set_subtensor", "inc_subtensor", "index_shape"]

#: placeholder in `idx_list` for a symbolic index part (the op's next extra input)
SYM = "$"


class Slice(NamedTuple):
    """A hashable slice (Python 3.11 slices are not); parts are None, ints or SYM."""

    start: Any
    stop: Any
    step: Any

    def __str__(self) -> str:
        parts = ["" if p is None else str(p) for p in self]
        return ":".join(parts[:2]) if self.step is None else ":".join(parts)


def _entry_str(e: Any) -> str:
    if e is None:
        return "newaxis"
    if e is Ellipsis:
        return "..."
    return str(e)


# ----------------------------------------------------------------------------- parsing

def _is_int_dtype(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint")


def _scalar_part(p: Any, inputs: list) -> Any:
    """A slice part: None/int folded, a symbolic int scalar becomes SYM plus an input."""
    if p is None:
        return None
    if isinstance(p, (bool, np.bool_)):
        raise TypeError(f"slice bounds must be integers, got {p!r}")
    if isinstance(p, (int, np.integer)):
        return int(p)
    v = as_tensor_variable(p)
    if v.ndim != 0 or not _is_int_dtype(v.dtype):
        raise TypeError(f"slice bounds must be integer scalars, got {v} ({v.type})")
    if isinstance(v, TensorConstant):
        return int(v.data)
    inputs.append(v)
    return SYM


def _parse_index(index: Any) -> tuple[tuple, list[TensorVariable], bool]:
    """(idx_list, symbolic inputs, is_advanced) for a Python index. A list holding a slice
    is a tuple of indices, as in Theano (and NumPy before 1.23): `x[[slice(None), i]]`."""
    if isinstance(index, list) and any(isinstance(item, slice) for item in index):
        index = tuple(index)
    if not isinstance(index, tuple):
        index = (index,)
    entries: list = []
    inputs: list[TensorVariable] = []
    advanced = False
    for item in index:
        if item is None or item is Ellipsis:
            entries.append(item)
        elif isinstance(item, slice):
            entries.append(Slice(*(_scalar_part(p, inputs) for p in (item.start, item.stop, item.step))))
        elif isinstance(item, (bool, np.bool_)):
            raise TypeError("a Python bool is not a supported index; use a boolean array mask")
        elif isinstance(item, (int, np.integer)):
            entries.append(int(item))
        elif isinstance(item, Variable):
            v = as_tensor_variable(item)
            if v.dtype != "bool" and not _is_int_dtype(v.dtype):
                raise TypeError(f"indices must be integers or booleans, got {v} of dtype {v.dtype}")
            if v.ndim == 0:
                if v.dtype == "bool":
                    raise TypeError("a 0-d boolean index is not supported; use a boolean array mask")
                if isinstance(v, TensorConstant):
                    entries.append(int(v.data))
                    continue
            else:
                advanced = True
            entries.append(SYM)
            inputs.append(v)
        else:
            arr = np.asarray(item)
            if arr.size == 0 and arr.dtype.kind == "f":
                arr = arr.astype("int64")
            if arr.dtype.kind not in "biu":
                raise TypeError(f"indices must be integers, slices, None, Ellipsis, integer arrays "
                                f"or boolean masks; got {item!r}")
            if arr.ndim == 0:
                if arr.dtype.kind == "b":
                    raise TypeError("a 0-d boolean index is not supported; use a boolean array mask")
                entries.append(int(arr))
            else:
                advanced = True
                entries.append(SYM)
                inputs.append(constant(arr))
    return tuple(entries), inputs, advanced


def index_broadcastable(xb: Sequence[bool], idx_list: Sequence,
                        idx_inputs: Sequence[TensorVariable]) -> tuple[bool, ...]:
    """The broadcastable pattern of `x[idx]`, following NumPy's placement of advanced dims:
    where the first advanced index stands if they are all adjacent, else in front."""
    it = iter(idx_inputs)
    kinds = []  # (kind, broadcastable of an advanced index, dims of x it consumes)
    for e in idx_list:
        if e is None:
            kinds.append(("new", None, 0))
        elif e is Ellipsis:
            kinds.append(("ell", None, 0))
        elif isinstance(e, Slice):
            kinds.append(("slice", e, 1))
        elif isinstance(e, str):
            v = next(it)
            if v.ndim == 0:
                kinds.append(("int", (), 1))
            elif v.dtype == "bool":
                kinds.append(("adv", (False,), v.ndim))
            else:
                kinds.append(("adv", v.broadcastable, 1))
        else:
            kinds.append(("int", (), 1))
    consumed = sum(k[2] for k in kinds)
    if consumed > len(xb):
        raise IndexError(f"too many indices for a {len(xb)}-dimensional tensor: "
                         f"[{', '.join(_entry_str(e) for e in idx_list)}] indexes {consumed} dimensions")
    if sum(k[0] == "ell" for k in kinds) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    any_adv = any(k[0] == "adv" for k in kinds)
    pieces: list = []
    adv_pos: list[int] = []
    adv_b: list[tuple[bool, ...]] = []
    d = 0
    for pos, (kind, payload, n) in enumerate(kinds):
        if kind == "new":
            pieces.append(True)
        elif kind == "ell":
            n = len(xb) - consumed
            pieces.extend(xb[d:d + n])
        elif kind == "slice":
            full = payload.start is None and payload.stop is None and payload.step in (None, 1, -1)
            pieces.append(bool(xb[d]) and full)
        elif kind == "adv" or any_adv:  # ints join the advanced block when there is one
            if not adv_pos:
                pieces.append("ADV")
            adv_pos.append(pos)
            adv_b.append(payload)
        d += n
    pieces.extend(xb[d:])
    if adv_pos:
        nd = max(len(b) for b in adv_b)
        padded = [(True,) * (nd - len(b)) + tuple(b) for b in adv_b]
        block = [all(p[i] for p in padded) for i in range(nd)]
        at = pieces.index("ADV")
        del pieces[at]
        if adv_pos[-1] - adv_pos[0] + 1 != len(adv_pos):
            at = 0
        pieces[at:at] = block
    return tuple(bool(p) for p in pieces)


# ----------------------------------------------------------------------------- run time

def _constant_index(idx_list: tuple) -> tuple | None:
    """The NumPy index when no part is symbolic (built once), else None."""
    if any(isinstance(e, str) or (isinstance(e, Slice) and SYM in e) for e in idx_list):
        return None
    return tuple(slice(*e) if isinstance(e, Slice) else e for e in idx_list)


def build_index(idx_list: tuple, values: Sequence, masks_to_nonzero: bool = False) -> tuple:
    """The NumPy index tuple from `idx_list` and the extra inputs' run-time values."""
    it = iter(values)
    out = []
    for e in idx_list:
        if isinstance(e, Slice):
            out.append(slice(*(int(next(it)) if isinstance(p, str) else p for p in e)))
        elif isinstance(e, str):
            v = next(it)
            if v.ndim == 0:
                out.append(int(v))
            elif masks_to_nonzero and v.dtype == np.bool_:
                out.extend(v.nonzero())
            else:
                out.append(v)
        else:
            out.append(e)
    return tuple(out)


_NP_OOB = re.compile(r"index (-?\d+) is out of bounds for axis (\d+) with size (\d+)")


def _index_error(op: Op, exc: Exception, shape: tuple) -> IndexError:
    m = _NP_OOB.search(str(exc))
    if m:
        return IndexError(f"{op}: index {m[1]} is out of bounds for dimension {m[2]} "
                          f"(length {m[3]}) of an array of shape {shape}")
    return IndexError(f"{op}: {exc} (indexing an array of shape {shape})")


def _check_value_shape(op: Op, target: tuple, y: np.ndarray, y_bcast: tuple) -> None:
    """NumPy would silently broadcast a length-1 dim that the type does not call broadcastable;
    the gradient could not sum over it, so refuse with an explanation."""
    for j in range(1, y.ndim + 1):
        if j > len(target):
            break
        s, t = y.shape[-j], target[-j]
        if s != t and s == 1 and not y_bcast[-j]:
            raise ValueError(
                f"{op}: cannot write a value of shape {y.shape} into a region of shape {target}: "
                f"dimension {y.ndim - j} of the value has length 1 but its type does not say it "
                "is broadcastable; declare it broadcastable (a row/col, or tensor(shape=(1, ...)))")


def _check_inputs(op: Op, idx_list: tuple, inputs: list[TensorVariable], advanced: bool) -> None:
    n_sym = sum(isinstance(e, str) for e in idx_list) + sum(
        isinstance(p, str) for e in idx_list if isinstance(e, Slice) for p in e)
    if len(inputs) != n_sym:
        raise TypeError(f"{op} expects {n_sym} index input(s), got {len(inputs)}")
    slice_parts = set()
    k = 0
    for e in idx_list:
        if isinstance(e, Slice):
            for p in e:
                if isinstance(p, str):
                    slice_parts.add(k)
                    k += 1
        elif isinstance(e, str):
            k += 1
    for i, v in enumerate(inputs):
        if v.dtype != "bool" and not _is_int_dtype(v.dtype):
            raise TypeError(f"{op}: index input {i} ({v}) must be an integer or boolean tensor, "
                            f"got {v.type}")
        if (i in slice_parts or not advanced) and (v.ndim != 0 or v.dtype == "bool"):
            raise TypeError(f"{op}: index input {i} ({v}) must be an integer scalar, got {v.type}")


# ----------------------------------------------------------------------------- ops

# ----------------------------------------------------------------------------- shapes

def _mask_count(mask: Variable) -> Variable:
    """How many True entries a boolean mask has (the length of the dim it selects)."""
    return as_dim(_sum(mask, dtype="int64"))


def index_shape(idx_list: Sequence[Any], x_shape: tuple, index: Sequence[Variable],
                index_shapes: Sequence[tuple]) -> tuple:
    """The shape of `x[idx]` (NumPy's rules, as `subtensor.index_broadcastable` places the
    advanced dims): slices give their lengths, ints drop a dim, newaxis adds a 1, integer
    arrays broadcast together and a boolean mask gives its count of True."""
    kinds = []
    k = 0
    for e in idx_list:
        if e is None:
            kinds.append(("new", None, 0))
        elif e is Ellipsis:
            kinds.append(("ell", None, 0))
        elif isinstance(e, Slice):
            parts = []
            for p in e:
                if isinstance(p, str):
                    parts.append(index[k])
                    k += 1
                else:
                    parts.append(p)
            kinds.append(("slice", parts, 1))
        elif isinstance(e, str):
            v, vs = index[k], index_shapes[k]
            k += 1
            if v.ndim == 0:
                kinds.append(("int", (), 1))
            elif v.dtype == "bool":
                kinds.append(("adv", (_mask_count(v),), v.ndim))
            else:
                kinds.append(("adv", tuple(vs), 1))
        else:
            kinds.append(("int", (), 1))
    consumed = sum(n for _, _, n in kinds)
    any_adv = any(kind == "adv" for kind, _, _ in kinds)
    pieces: list = []
    adv_pos: list[int] = []
    adv_shapes: list[tuple] = []
    d = 0
    for pos, (kind, payload, n) in enumerate(kinds):
        if kind == "new":
            pieces.append(_const(1))
        elif kind == "ell":
            n = len(x_shape) - consumed
            pieces.extend(x_shape[d:d + n])
        elif kind == "slice":
            pieces.append(slice_length(*payload, x_shape[d]))
        elif kind == "adv" or any_adv:
            if not adv_pos:
                pieces.append("ADV")
            adv_pos.append(pos)
            adv_shapes.append(payload)
        d += n
    pieces.extend(x_shape[d:])
    if adv_pos:
        block = list(numpy_broadcast(adv_shapes))
        at = pieces.index("ADV")
        del pieces[at]
        if adv_pos[-1] - adv_pos[0] + 1 != len(adv_pos):
            at = 0
        pieces[at:at] = block
    return tuple(as_dim(p) for p in pieces)


class _IndexOp(Op):
    """Shared make_node/perform of the two reading ops."""

    __props__ = ("idx_list",)
    _advanced = False

    def __init__(self, idx_list: Sequence):
        self.idx_list = tuple(idx_list)
        self._const = _constant_index(self.idx_list)
        self._tail = ()

    def _index(self, values: Sequence) -> tuple:
        if self._const is not None:
            return self._const
        return build_index(self.idx_list, values) + self._tail

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else self(eval_points[0], *inputs[1:])]

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{', '.join(_entry_str(e) for e in self.idx_list)}}}"

    def make_node(self, x: Any, *index: Any) -> Apply:
        x = as_tensor_variable(x)
        index = [as_tensor_variable(i) for i in index]
        _check_inputs(self, self.idx_list, index, self._advanced)
        bcast = index_broadcastable(x.broadcastable, self.idx_list, index)
        return Apply(self, [x, *index], [TensorType(x.dtype, bcast)()])

    def infer_shape(self, fgraph, node, input_shapes):
        """NumPy's indexing shape (slices' lengths, advanced dims placed as NumPy places
        them); GpuSubtensor shares it."""
        return [index_shape(self.idx_list, input_shapes[0], node.inputs[1:], input_shapes[1:])]

    def perform(self, node, inputs, out):
        x = inputs[0]
        try:
            out[0][0] = np.asarray(x[self._index(inputs[1:])])
        except IndexError as exc:
            raise _index_error(self, exc, x.shape) from None


class Subtensor(_IndexOp):
    """Basic indexing (ints, slices, newaxis, Ellipsis): the output is a view of `x`."""

    view_map = {0: [0]}
    basic_indexing = True  # its lengths follow from its bounds (GpuSubtensor declares it too)

    def __init__(self, idx_list: Sequence):
        super().__init__(idx_list)
        if Ellipsis not in self.idx_list:
            # a trailing Ellipsis makes NumPy return a 0-d view, not a scalar copy
            self._tail = (Ellipsis,)
            if self._const is not None:
                self._const += self._tail

    def grad(self, inputs, output_grads):
        x, rest, gz = inputs[0], inputs[1:], output_grads[0]
        gx = None
        if is_float(x.dtype):
            gx = IncSubtensor(self.idx_list)(zeros_like(x), cast(gz, x.dtype), *rest)
        return [gx] + [None] * len(rest)


class AdvancedSubtensor(_IndexOp):
    """Indexing with integer arrays and/or boolean masks (and slices, ints, newaxis): a copy,
    laid out as NumPy lays it out."""

    _advanced = True

    def grad(self, inputs, output_grads):
        x, rest, gz = inputs[0], inputs[1:], output_grads[0]
        gx = None
        if is_float(x.dtype):
            gx = AdvancedIncSubtensor(self.idx_list)(zeros_like(x), cast(gz, x.dtype), *rest)
        return [gx] + [None] * len(rest)


class IncSubtensorProps(Op):
    """What every set/inc-subtensor op (host and GPU) is made of: the index list, set or
    inc, in place or not; printed as ``SetSubtensor{...}`` / ``IncSubtensor{...}``."""

    __props__ = ("idx_list", "set_instead_of_inc", "inplace")

    def __init__(self, idx_list: Sequence, set_instead_of_inc: bool = False, inplace: bool = False):
        self.idx_list = tuple(idx_list)
        self.set_instead_of_inc = bool(set_instead_of_inc)
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}
        self._const = _constant_index(self.idx_list)

    def __str__(self) -> str:
        kind = "Set" if self.set_instead_of_inc else "Inc"
        name = type(self).__name__.replace("Inc", kind, 1)
        flag = ", inplace" if self.inplace else ""
        return f"{name}{{{', '.join(_entry_str(e) for e in self.idx_list)}{flag}}}"

    def infer_shape(self, fgraph, node, input_shapes):
        """x's shape: only a region of it changes."""
        return [input_shapes[0]]


class _IncOp(IncSubtensorProps):
    """Shared body of IncSubtensor/AdvancedIncSubtensor: `x` with `x[idx]` set to (or
    incremented by) `y`; a new array unless `inplace` (which the in-place rewrite sets)."""

    _advanced = False
    _reader: type = None  # the matching reading op

    def make_node(self, x: Any, y: Any, *index: Any) -> Apply:
        x, y = as_tensor_variable(x), as_tensor_variable(y)
        index = [as_tensor_variable(i) for i in index]
        _check_inputs(self, self.idx_list, index, self._advanced)
        region = index_broadcastable(x.broadcastable, self.idx_list, index)
        if y.ndim > len(region):
            raise ValueError(f"{self}: the value {y} has {y.ndim} dimensions, more than the "
                             f"{len(region)} of the indexed region")
        if y.dtype != x.dtype:
            raise TypeError(f"{self}: the value {y} has dtype {y.dtype} but {x} has {x.dtype}; "
                            "cast it (set_subtensor/inc_subtensor do this for you)")
        return Apply(self, [x, y, *index], [x.type()])

    def perform(self, node, inputs, out):
        x, y = inputs[0], inputs[1]
        res = x if self.inplace else x.copy()
        values = inputs[2:]
        index = self._const if self._const is not None else build_index(self.idx_list, values)
        try:
            y_bcast = node.inputs[1].broadcastable
            if any(s == 1 and not b for s, b in zip(y.shape, y_bcast)):
                _check_value_shape(self, np.shape(res[index]), y, y_bcast)
            if self.set_instead_of_inc:
                res[index] = y
            elif self._advanced:
                np.add.at(res, build_index(self.idx_list, values, masks_to_nonzero=True), y)
            else:
                res[index] += y
        except IndexError as exc:
            raise _index_error(self, exc, x.shape) from None
        except ValueError as exc:
            if str(exc).startswith(str(self)):
                raise
            raise ValueError(f"{self}: cannot write a value of shape {y.shape} into the indexed "
                             f"region of an array of shape {x.shape}: {exc}") from None
        out[0][0] = res

    def grad(self, inputs, output_grads):
        x, y, rest = inputs[0], inputs[1], inputs[2:]
        gz = output_grads[0]
        if not is_float(x.dtype):
            return [None] * len(inputs)
        gz = cast(gz, x.dtype)
        if self.set_instead_of_inc:
            gx = type(self)(self.idx_list, True)(gz, constant(0, dtype=x.dtype), *rest)
        else:
            gx = gz
        gy = self._reader(self.idx_list)(gz, *rest)
        if self.set_instead_of_inc and self._advanced and any(
                v.ndim and v.dtype != "bool" for v in rest):
            gy = self._keep_last_writes(x, gy, rest)
        gy = _sum_to_broadcast_pattern(gy, y)
        return [gx, gy] + [None] * len(rest)

    def _keep_last_writes(self, x, gy, rest):
        """With repeated indices only the last write of a set reaches the output, so only it
        gets a gradient: number the region's elements, set the numbers, see which survive."""
        region_shape = shape(gy)
        ids = arange(1, prod(region_shape) + 1, dtype="int64").reshape(region_shape, ndim=gy.ndim)
        written = type(self)(self.idx_list, True)(zeros_like(x, dtype="int64"), ids, *rest)
        won = eq(self._reader(self.idx_list)(written, *rest), ids)
        return switch(won, gy, constant(0, dtype=gy.dtype))


class IncSubtensor(_IncOp):
    """`x` with a basic-indexed region set or incremented (regions never repeat elements)."""

    _reader = Subtensor


class AdvancedIncSubtensor(_IncOp):
    """`x` with an advanced-indexed region set (last write wins, as NumPy) or incremented
    (`np.add.at`: repeated indices accumulate)."""

    _advanced = True
    _reader = AdvancedSubtensor


# ----------------------------------------------------------------------------- front end

def getitem(x: Any, index: Any) -> TensorVariable:
    """`x[index]` with NumPy semantics (`TensorVariable.__getitem__` calls this)."""
    x = as_tensor_variable(x)
    idx_list, inputs, advanced = _parse_index(index)
    node = x.owner
    if (node is not None and isinstance(node.op, Shape) and len(idx_list) == 1
            and isinstance(idx_list[0], int) and not isinstance(idx_list[0], bool)):
        # x.shape[i] with a constant i: the cheaper Shape_i of the shaped tensor
        # (an index past its ndim stays a Subtensor that fails when it runs, as in Theano:
        # code reads x.shape[1] before checking that x is a matrix)
        src = node.inputs[0]
        i = idx_list[0]
        if -src.ndim <= i < src.ndim:
            return shape_i(src, i % src.ndim)
    op = AdvancedSubtensor(idx_list) if advanced else Subtensor(idx_list)
    return op(x, *inputs)


def _value_like(y: Any, dtype: str) -> TensorVariable:
    if isinstance(y, Variable):
        return cast(as_tensor_variable(y), dtype)
    return constant(y, dtype=dtype)


def _inc_or_set(x: Any, y: Any, set_instead_of_inc: bool, inplace: bool) -> TensorVariable:
    x = as_tensor_variable(x)
    what = "set_subtensor" if set_instead_of_inc else "inc_subtensor"
    node = x.owner
    if node is None or not isinstance(node.op, (Subtensor, AdvancedSubtensor)):
        raise TypeError(f"{what} needs an indexed tensor such as x[1:, idx] as its first "
                        f"argument; got {x}" + (f", computed by {node.op}" if node else ""))
    base, rest = node.inputs[0], node.inputs[1:]
    y = _value_like(y, base.dtype)
    cls = AdvancedIncSubtensor if isinstance(node.op, AdvancedSubtensor) else IncSubtensor
    return cls(node.op.idx_list, set_instead_of_inc, inplace)(base, y, *rest)


def set_subtensor(x: TensorVariable, y: Any, inplace: bool = False) -> TensorVariable:
    """A copy of the tensor that `x = t[idx]` indexes, with that region replaced by `y`
    (broadcast to it). `x` must be an indexing result: its owner tells what to rebuild. As in
    Theano only the last indexing is undone: `set_subtensor(t[1:][0], y)` is a new `t[1:]`."""
    return _inc_or_set(x, y, True, inplace)


def inc_subtensor(x: TensorVariable, y: Any, inplace: bool = False) -> TensorVariable:
    """A copy of the tensor that `x = t[idx]` indexes, with `y` added to that region;
    repeated advanced indices accumulate (like `np.add.at`)."""
    return _inc_or_set(x, y, False, inplace)
