"""GpuArray computes: arithmetic, comparisons, in-place operators, reductions, ``astype`` and
NumPy's ufuncs on device arrays, as pygpu's and PyCUDA's arrays do (Theano code adds the
gradients a GPU function returns: ``g = f(0); g += f(1)``).

Why it looks like this: a GpuArray operation is a one-node graph.  Each (operation, dtypes,
scalar operands, rank, context) gets one GpuElemwise or GpuCAReduce node and its thunk, made
once and kept (the same planning, generated kernels and kernel cache as compiled functions);
a call puts the arrays in the thunk's cells, runs it and takes the result out.  The array
module sits below the ops, so the operators are installed on :class:`GpuArray` from here
(the GPU package imports this module with its ops).

Operands follow NumPy 2's rules (NEP 50): another GpuArray on the same context, a Python
scalar (weak: ``float32 + 2.5`` stays float32), a NumPy scalar or 0-d array (its own dtype
counts).  A NumPy array of one or more dimensions is refused with a TypeError, as pygpu and
PyCUDA refuse it: nothing is uploaded, or computed on the host, behind the user's back.
Dtypes meet through the scalar table's rules (``symgpu.scalar.dtypes.upcast``, bfloat16 included).
"""
from __future__ import annotations

import operator
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops.careduce import GpuCAReduce, _ReduceThunk
from symgpu.gpu.ops.elemwise import GpuElemwise, _ElemwiseThunk
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import GpuArray, byte_extent, to_gpu
from symgpu.gpu.runtime.codegen.scalar import output_dtypes
from symgpu.gpu.runtime.context import registered_name
from symgpu.gpu.runtime.dtypes import BFLOAT16, check_dtype, dtype_name
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.dtypes import upcast
from symgpu.tensor.elemwise import reduce_output_dtype

__all__ = ["elementwise", "elementwise_inplace", "astype", "reduce", "mean"]

_COMPARISONS = frozenset(("eq", "neq", "lt", "le", "gt", "ge"))
_REDUCTIONS = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum",
               "all": "and_", "any": "or_"}


# ----------------------------------------------------------------------------- one-node graphs

class _Launcher:
    """One GpuElemwise/GpuCAReduce node and its thunk over its own cells: ``run(arrays)``
    returns the outputs.  The lock keeps two threads out of the cells at once."""

    __slots__ = ("in_cells", "out_cells", "thunk", "lock")

    def __init__(self, node: Any, thunk_class: Any, ctx: Any) -> None:
        storage = {v: [None] for v in [*node.inputs, *node.outputs]}
        self.in_cells = [storage[v] for v in node.inputs]
        self.out_cells = [storage[v] for v in node.outputs]
        self.thunk = thunk_class(node.op, node, storage, ctx).thunk()
        self.lock = threading.Lock()

    def run(self, arrays: Sequence[GpuArray]) -> list[GpuArray]:
        with self.lock:
            for cell, a in zip(self.in_cells, arrays):
                cell[0] = a
            try:
                self.thunk()
                return [cell[0] for cell in self.out_cells]
            finally:
                for cell in self.in_cells + self.out_cells:
                    cell[0] = None   # the caller owns the results; the cells keep nothing


_LAUNCHERS: dict[tuple, _Launcher] = {}
_LAUNCHERS_LOCK = threading.Lock()


def _launcher(key: tuple, make: Callable[[], _Launcher]) -> _Launcher:
    got = _LAUNCHERS.get(key)
    if got is None:
        with _LAUNCHERS_LOCK:
            got = _LAUNCHERS.get(key)
            if got is None:
                got = _LAUNCHERS[key] = make()
    return got


def _gtype(dtype: str, nd: int, scalar: bool, ctx: Any) -> GpuArrayType:
    return GpuArrayType(dtype, (scalar,) * nd, registered_name(ctx))


# ----------------------------------------------------------------------------- operands

#: uploaded scalar operands by (context, dtype, bytes): read-only 0-d arrays, reused
_SCALARS: "OrderedDict[tuple, GpuArray]" = OrderedDict()
_SCALARS_KEEP = 256
_SCALARS_LOCK = threading.Lock()


def _scalar_array(ctx: Any, value: Any, dtype: np.dtype) -> GpuArray:
    host = np.asarray(value).astype(dtype).reshape(())
    key = (id(ctx), dtype, host.tobytes())
    with _SCALARS_LOCK:
        got = _SCALARS.get(key)
        if got is not None and got.context is ctx:
            _SCALARS.move_to_end(key)
            return got
    got = to_gpu(host, ctx)
    with _SCALARS_LOCK:
        _SCALARS[key] = got
        while len(_SCALARS) > _SCALARS_KEEP:
            _SCALARS.popitem(last=False)
    return got


def _kind_rank(dtype: np.dtype) -> int:
    """0 bool, 1 integers, 2 floats (bfloat16 too): NumPy's order of kinds."""
    if dtype == BFLOAT16:
        return 2
    return {"b": 0, "u": 1, "i": 1, "f": 2}[dtype.kind]


def _weak_dtype(value: Any, base: np.dtype, comparison: bool, what: str) -> np.dtype:
    """The dtype a Python scalar takes beside arrays of dtype ``base`` (NEP 50: it adapts to
    the arrays' kind; an int outside an integer dtype's range is an OverflowError, except in
    a comparison)."""
    rank = _kind_rank(base)
    if isinstance(value, bool):
        return base
    if isinstance(value, int):
        if rank == 0:
            return np.dtype("int64")
        if rank == 2:
            return base
        info = np.iinfo(base)
        if info.min <= value <= info.max:
            return base
        if comparison:
            return np.dtype("int64") if -2**63 <= value < 2**63 else np.dtype("float64")
        raise OverflowError(f"{what}: Python integer {value} out of bounds for {base}")
    return base if rank == 2 else np.dtype("float64")


def _operands(values: Sequence[Any], what: str, comparison: bool = False) -> list | None:
    """``values`` as GpuArrays on one context (scalars uploaded in NumPy's dtype), or None
    when one of them is not an operand at all (the operator answers NotImplemented)."""
    arrays = [v for v in values if isinstance(v, GpuArray)]
    ctx = arrays[0].context
    for a in arrays[1:]:
        if a.context is not ctx:
            raise ValueError(f"{what}: the operands live on different GPU contexts "
                             f"({ctx} and {a.context}); copy one with to_gpu(x.get(), ctx)")
    strong: list[np.dtype] = []
    kinds = []
    for v in values:
        if isinstance(v, GpuArray):
            strong.append(v.dtype)
            kinds.append("array")
        elif isinstance(v, (np.generic, np.ndarray)):   # first: np.float64 is a float too
            if np.ndim(v):
                raise TypeError(
                    f"{what}: a GpuArray does not combine with a NumPy array of shape "
                    f"{np.shape(v)} (as pygpu and PyCUDA refuse it): upload it with "
                    f"symgpu.gpu.to_gpu(x), or compute on the host with np.asarray(gpu_array)")
            strong.append(check_dtype(np.asarray(v).dtype))
            kinds.append("strong")
        elif isinstance(v, (bool, int, float)):
            kinds.append("weak")
        elif isinstance(v, complex):
            raise TypeError(f"{what}: GPU arrays do not support complex numbers ({v!r})")
        else:
            return None
    base = check_dtype(upcast(*[dtype_name(d) for d in strong])) if len(strong) > 1 else \
        strong[0]
    out = []
    for v, kind in zip(values, kinds):
        if kind == "array":
            out.append(v)
        elif kind == "strong":
            out.append(_scalar_array(ctx, v, check_dtype(np.asarray(v).dtype)))
        else:
            out.append(_scalar_array(ctx, v, _weak_dtype(v, base, comparison, what)))
    return out


def _padded(a: GpuArray, nd: int) -> GpuArray:
    k = nd - a.ndim
    return a if not k else a._view(a.ptr, (1,) * k + a.shape, (0,) * k + a.strides)


def _scalar_op(op: Any) -> Any:
    return SCALAR_OPS[op] if isinstance(op, str) else op


# ----------------------------------------------------------------------------- elementwise

def _run_elemwise(op: Any, arrays: list[GpuArray], inplace: bool = False) -> GpuArray:
    ctx = arrays[0].context
    nd = max(a.ndim for a in arrays)
    arrays = [_padded(a, nd) for a in arrays]
    scalar = tuple(a.size == 1 for a in arrays)
    dtypes = tuple(dtype_name(a.dtype) for a in arrays)
    key = ("elemwise", ctx, op, dtypes, scalar, nd, inplace)

    def make() -> _Launcher:
        ins = [_gtype(d, nd, s, ctx)() for d, s in zip(dtypes, scalar)]
        node = GpuElemwise(op, {0: 0} if inplace else None)(*ins).owner
        return _Launcher(node, _ElemwiseThunk, ctx)
    return _launcher(key, make).run(arrays)[0]


def elementwise(op: Any, *values: Any) -> Any:
    """``op`` (a scalar-table name or op) over GpuArrays and scalars, broadcast as NumPy
    does, into a new GpuArray; NotImplemented when an operand is not one."""
    sop = _scalar_op(op)
    what = f"GpuArray {sop.name}"
    arrays = _operands(values, what, sop.name in _COMPARISONS)
    if arrays is None:
        return NotImplemented
    np.broadcast_shapes(*[a.shape for a in arrays])   # NumPy's error, naming the shapes
    return _run_elemwise(sop, arrays)


def _same_kind(src: np.dtype, dst: np.dtype) -> bool:
    return _kind_rank(src) <= _kind_rank(dst)


def _hazard(a: GpuArray, b: GpuArray) -> bool:
    """Whether writing ``a`` element by element may change values of ``b`` still to be read
    (``a += a.T``): they overlap in memory with another layout."""
    if b is a or (b.ptr == a.ptr and b.shape == a.shape and b.strides == a.strides):
        return False
    if not a.size or not b.size:
        return False
    (alo, ahi), (blo, bhi) = byte_extent(a), byte_extent(b)
    return alo < bhi and blo < ahi


def elementwise_inplace(op: Any, target: GpuArray, other: Any) -> Any:
    """``target = op(target, other)`` written into ``target`` (``a += b``), NumPy's rules:
    the result must broadcast to ``target``'s shape and cast to its dtype ('same_kind')."""
    sop = _scalar_op(op)
    what = f"GpuArray in-place {sop.name}"
    arrays = _operands([target, other], what)
    if arrays is None:
        return NotImplemented
    b = arrays[1]
    shape = np.broadcast_shapes(target.shape, b.shape)
    if shape != target.shape:
        raise ValueError(f"{what}: non-broadcastable output operand with shape {target.shape} "
                         f"doesn't match the broadcast shape {shape}")
    out_dtype = check_dtype(output_dtypes(sop, [dtype_name(target.dtype),
                                                 dtype_name(b.dtype)])[0])
    if out_dtype != target.dtype and not _same_kind(out_dtype, target.dtype):
        raise TypeError(f"{what}: cannot cast the result from dtype {out_dtype} to the "
                        f"array's dtype {target.dtype} with casting rule 'same_kind'")
    if out_dtype == target.dtype and not _hazard(target, b):
        result = _run_elemwise(sop, [target, b], inplace=True)
        if result is target or (result.ptr == target.ptr and result.shape == target.shape):
            return target
    else:
        result = _run_elemwise(sop, [target, b])
        if result.dtype != target.dtype:
            result = astype(result, target.dtype)
    target.set(result)   # a layout the kernel could not write in place: a device copy
    return target


def astype(a: GpuArray, dtype: Any, copy: bool = True) -> GpuArray:
    """``a`` converted to ``dtype`` on the device (a copy unless ``copy=False`` and the dtype
    is already ``a``'s)."""
    dt = check_dtype(dtype)
    if dt == a.dtype:
        return a.copy() if copy else a
    if a.size == 0:
        return GpuArray(a.shape, dt, a.context)
    return _run_elemwise(Cast(dtype_name(dt)), [a])


# ----------------------------------------------------------------------------- reductions

def _axes(axis: Any, nd: int, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(nd))
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    out = []
    for ax in axes:
        ax = operator.index(ax)
        if not -nd <= ax < nd:
            raise np.exceptions.AxisError(ax, nd, f"{what}")
        out.append(ax % nd)
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: duplicate value in 'axis': {axis}")
    return tuple(sorted(out))


def _finish(res: GpuArray, shape: tuple, axes: tuple, keepdims: bool, out: Any,
            what: str) -> GpuArray:
    if keepdims:
        res = res.reshape(tuple(1 if d in axes else n for d, n in enumerate(shape)))
    if out is None:
        return res
    if not isinstance(out, GpuArray):
        raise TypeError(f"{what}: out must be a GpuArray, not {type(out).__name__}")
    if out.shape != res.shape:
        raise ValueError(f"{what}: out has shape {out.shape}, the result {res.shape}")
    out.set(astype(res, out.dtype, copy=False))
    return out


def reduce(a: GpuArray, how: str, axis: Any = None, dtype: Any = None, out: Any = None,
           keepdims: bool = False) -> GpuArray:
    """``a.sum/prod/max/min/all/any(axis, dtype, out, keepdims)`` on the device, NumPy's
    result dtypes (sum of int32: int64); a 0-d result is a 0-d GpuArray."""
    what = f"GpuArray.{how}"
    name = _REDUCTIONS[how]
    shape = a.shape
    axes = _axes(axis, a.ndim, what)
    if how in ("all", "any") and a.dtype != np.dtype(bool):
        a = astype(a, "bool")
    src = dtype_name(a.dtype)
    if dtype is not None and how in ("sum", "prod"):
        red_dtype = dtype_name(check_dtype(dtype))
    else:
        red_dtype = reduce_output_dtype(name, src)
    out_shape = tuple(n for d, n in enumerate(shape) if d not in axes)
    count = 1
    for d in axes:
        count *= shape[d]
    if not axes:
        res = astype(a, red_dtype)
    elif count == 0 or 0 in out_shape:
        if count == 0 and name in ("maximum", "minimum") and 0 not in out_shape:
            raise ValueError(f"{what}: zero-size array to reduction operation {name} which "
                             f"has no identity (shape {shape}, axis {axis})")
        res = GpuArray(out_shape, red_dtype, a.context)
        if count == 0:
            res.fill({"add": 0, "mul": 1, "and_": True, "or_": False}.get(name, 0))
    else:
        ctx = a.context
        nd = a.ndim
        key = ("reduce", ctx, name, axes, red_dtype, src, nd)

        def make() -> _Launcher:
            node = GpuCAReduce(name, axis=axes, dtype=red_dtype)(
                _gtype(src, nd, False, ctx)()).owner
            return _Launcher(node, _ReduceThunk, ctx)
        res = _launcher(key, make).run([a])[0]
    return _finish(res, shape, axes, keepdims, out, what)


def mean(a: GpuArray, axis: Any = None, dtype: Any = None, out: Any = None,
         keepdims: bool = False) -> GpuArray:
    """``a.mean(...)``: NumPy's dtypes (integers give float64; float16/bfloat16 accumulate in
    float32 and give their own dtype); an empty mean is NaN with NumPy's RuntimeWarning."""
    what = "GpuArray.mean"
    axes = _axes(axis, a.ndim, what)
    if dtype is not None:
        acc = result = check_dtype(dtype)
    elif _kind_rank(a.dtype) < 2:
        acc = result = np.dtype("float64")
    elif a.dtype.itemsize == 2:
        acc, result = np.dtype("float32"), a.dtype
    else:
        acc = result = a.dtype
    count = 1
    for d in axes:
        count *= a.shape[d]
    total = reduce(a, "sum", axis=axes, dtype=acc)
    if count == 0:
        warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=3)
        res = GpuArray(total.shape, result, a.context).fill(np.nan) if total.size else \
            GpuArray(total.shape, result, a.context)
    else:
        res = astype(_run_elemwise(SCALAR_OPS["true_div"],
                                   [total, _scalar_array(a.context, count, acc)]),
                     result, copy=False)
    return _finish(res, a.shape, axes, keepdims, out, what)


# ----------------------------------------------------------------------------- NumPy's ufuncs

#: NumPy ufunc -> scalar-table op run for it on a GpuArray
UFUNCS: dict[np.ufunc, Any] = {op.spec.numpy: op for op in SCALAR_OPS.values()
                               if isinstance(op.spec.numpy, np.ufunc)}
UFUNCS[np.true_divide] = SCALAR_OPS["true_div"]
UFUNCS[np.floor_divide] = SCALAR_OPS["int_div"]
UFUNCS[np.square] = SCALAR_OPS["sqr"]


def array_ufunc(self: GpuArray, ufunc: np.ufunc, method: str, *inputs: Any,
                **kwargs: Any) -> Any:
    """NumPy's ufuncs on GpuArrays run on the device (``np.exp(g)``, ``np.float32(2) * g``,
    ``np.add(a, b, out=a)``); anything else is a TypeError saying what to do (never a
    silent download)."""
    name = ufunc.__name__
    if method != "__call__":
        raise TypeError(f"numpy.{name}.{method} is not supported on a GpuArray: use its "
                        f"methods (sum, prod, max, min, mean, all, any) or np.asarray(a) to "
                        f"compute on the host")
    op = UFUNCS.get(ufunc)
    if op is None or op.nin not in (-1, len(inputs)) or ufunc.nout != 1:
        raise TypeError(f"numpy.{name} has no GPU kernel for GpuArray: call it on "
                        f"np.asarray(a) to compute on the host (a download)")
    out = kwargs.pop("out", None)
    if kwargs:
        raise TypeError(f"numpy.{name} on a GpuArray: the arguments {sorted(kwargs)} are not "
                        f"supported (only out=)")
    if out is not None:
        out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
        if not isinstance(out, GpuArray):
            raise TypeError(f"numpy.{name} on a GpuArray: out must be a GpuArray, not "
                            f"{type(out).__name__}")
        if len(inputs) == 2 and inputs[0] is out:
            return elementwise_inplace(op, out, inputs[1])
    res = elementwise(op, *inputs)
    if res is NotImplemented:
        raise TypeError(f"numpy.{name}: unsupported operand types "
                        f"{', '.join(type(v).__name__ for v in inputs)} for a GpuArray")
    if out is None:
        return res
    if out.shape != res.shape:
        raise ValueError(f"numpy.{name}: out has shape {out.shape}, the result {res.shape}")
    if res.dtype != out.dtype and not _same_kind(res.dtype, out.dtype):
        raise TypeError(f"numpy.{name}: cannot cast the result from dtype {res.dtype} to out's "
                        f"dtype {out.dtype} with casting rule 'same_kind'")
    out.set(astype(res, out.dtype, copy=False))
    return out


# ----------------------------------------------------------------------------- installing

def _binary(name: str) -> tuple[Callable, Callable, Callable]:
    def forward(self: GpuArray, other: Any) -> Any:
        return elementwise(name, self, other)

    def reflected(self: GpuArray, other: Any) -> Any:
        return elementwise(name, other, self)

    def inplace(self: GpuArray, other: Any) -> Any:
        return elementwise_inplace(name, self, other)
    return forward, reflected, inplace


_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "true_div",
           "floordiv": "int_div", "mod": "mod", "pow": "pow", "and": "and_", "or": "or_",
           "xor": "xor"}
_COMPARE = {"eq": "eq", "ne": "neq", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def _pow(self: GpuArray, other: Any, modulo: Any = None) -> Any:
    if modulo is not None:
        raise TypeError("pow() with a modulo is not supported on a GpuArray")
    return elementwise("pow", self, other)


def _install() -> None:
    """Put the operators and methods on GpuArray (its module cannot import this one)."""
    for dunder, name in _BINARY.items():
        forward, reflected, inplace = _binary(name)
        setattr(GpuArray, f"__{dunder}__", forward)
        setattr(GpuArray, f"__r{dunder}__", reflected)
        setattr(GpuArray, f"__i{dunder}__", inplace)
    GpuArray.__pow__ = _pow
    for dunder, name in _COMPARE.items():
        setattr(GpuArray, f"__{dunder}__", _binary(name)[0])
    GpuArray.__hash__ = object.__hash__   # identity, as before: the runtime keys on arrays
    GpuArray.__neg__ = lambda self: elementwise("neg", self)
    GpuArray.__abs__ = lambda self: elementwise("abs", self)
    GpuArray.__invert__ = lambda self: elementwise("invert", self)
    GpuArray.__pos__ = lambda self: self.copy()
    GpuArray.__array_ufunc__ = array_ufunc
    GpuArray.astype = astype
    GpuArray.mean = mean
    for how in _REDUCTIONS:
        setattr(GpuArray, how, _reduction_method(how))


def _reduction_method(how: str) -> Callable:
    """``GpuArray.<how>`` with ndarray's signature: sum/prod take ``dtype``, the others not."""
    if how in ("sum", "prod"):
        def method(self: GpuArray, axis: Any = None, dtype: Any = None, out: Any = None,
                   keepdims: bool = False) -> GpuArray:
            return reduce(self, how, axis, dtype, out, keepdims)
    else:
        def method(self: GpuArray, axis: Any = None, out: Any = None,  # type: ignore[misc]
                   keepdims: bool = False) -> GpuArray:
            return reduce(self, how, axis, None, out, keepdims)
    method.__name__ = method.__qualname__ = how
    method.__doc__ = f"``numpy.ndarray.{how}`` on the device (see array_math.reduce)."
    return method


_install()
