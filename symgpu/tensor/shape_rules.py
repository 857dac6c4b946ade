"""Shape arithmetic shared by the ops' `infer_shape` methods (host and GPU twins alike).

Why a module: a host op and its GPU twin compute the same shape, so the rule is written once
here and both `infer_shape` methods call it. Dimensions are int64 scalar variables; the
helpers fold constants while building (`s_add(2, 3)` is the constant 5), so shapes that are
known when the graph is built stay constants and cost nothing at run time.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Constant, Variable
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.tensor.type import as_tensor_variable, constant

__all__ = ["as_dim", "dim_value", "s_add", "s_sub", "s_mul", "s_floordiv", "s_max", "s_min",
           "s_switch", "s_eq", "s_lt", "s_prod", "s_sum", "pick_dim", "elemwise_shape",
           "numpy_broadcast", "reduce_shape", "dimshuffle_shape", "slice_length",
           "join_shape", "dot_shape", "matmul_shape", "arange_length", "is_shape_read",
           "is_nonnegative", "same_dim", "use_elementwise_op"]

#: the elementwise op class that dimension arithmetic builds its nodes with: Elemwise, which
#: sits above this module (its own infer_shape uses these rules) and installs itself here
_ELEMWISE: list[type] = []
_EW: dict[Any, Any] = {}


def use_elementwise_op(cls: type) -> None:
    """Build dimension arithmetic with `cls` (tensor.elemwise passes Elemwise on import)."""
    _ELEMWISE[:] = [cls]
    _EW.clear()


def _ew_op(scalar_op: Any) -> Any:
    op = _EW.get(scalar_op)
    if op is None:
        op = _EW[scalar_op] = _ELEMWISE[0](scalar_op)
    return op


def _ew(name: str, *args: Variable) -> Variable:
    return _ew_op(SCALAR_OPS[name])(*args)


def _cast(s: Variable, dtype: str) -> Variable:
    return _ew_op(Cast(dtype))(s)


def _const(value: Any) -> Variable:
    return constant(np.asarray(value, dtype="int64"))


def dim_value(s: Any) -> int | None:
    """The int a dimension is known to be (a Python int or a 0-d constant), else None."""
    if isinstance(s, (int, np.integer)):
        return int(s)
    if isinstance(s, Constant) and np.ndim(s.data) == 0:
        try:
            return int(s.data)
        except (TypeError, ValueError):
            return None
    return None


def as_dim(s: Any) -> Variable:
    """`s` (an int or an integer scalar variable) as an int64 scalar variable."""
    v = dim_value(s)
    if v is not None:
        return s if isinstance(s, Constant) and s.type.dtype == "int64" else _const(v)
    if not isinstance(s, Variable):
        s = as_tensor_variable(s)
    if getattr(s.type, "ndim", None) != 0:
        raise TypeError(f"a dimension must be a scalar, got {s} ({s.type})")
    if s.type.dtype != "int64":
        s = _cast(s, "int64")
    return s


def is_shape_read(s: Variable) -> bool:
    """Whether `s` is the length of a dimension read from an array (never negative)."""
    return s.owner is not None and getattr(s.owner.op, "shape_read", None) == "dim"


def is_nonnegative(s: Any, depth: int = 4) -> bool:
    """Whether `s` is provably >= 0: a constant, a length read from an array, or sums,
    products, floor quotients and maxima of such (a flatten's product of lengths)."""
    v = dim_value(s)
    if v is not None:
        return v >= 0
    if not isinstance(s, Variable) or s.owner is None or depth == 0:
        return False
    if is_shape_read(s):
        return True
    op = s.owner.op
    name = getattr(getattr(op, "scalar_op", None), "name", None)
    ins = s.owner.inputs
    if name in ("add", "mul", "int_div") or isinstance(getattr(op, "scalar_op", None), Cast):
        return all(is_nonnegative(i, depth - 1) for i in ins)
    if name == "maximum":
        return any(is_nonnegative(i, depth - 1) for i in ins)
    return False


def same_dim(a: Any, b: Any) -> bool:
    """Whether two lengths are provably equal: the same variable, equal constants, or the
    same op on the same inputs (two reads of one array's length)."""
    if a is b:
        return True
    va, vb = dim_value(a), dim_value(b)
    if va is not None or vb is not None:
        return va == vb
    oa, ob = getattr(a, "owner", None), getattr(b, "owner", None)
    return (oa is not None and ob is not None and oa.op == ob.op
            and len(oa.inputs) == len(ob.inputs)
            and all(x is y for x, y in zip(oa.inputs, ob.inputs))
            and oa.outputs.index(a) == ob.outputs.index(b))


def _binary(name: str, fold, a: Any, b: Any) -> Variable:
    va, vb = dim_value(a), dim_value(b)
    if va is not None and vb is not None:
        return _const(fold(va, vb))
    return _ew(name, as_dim(a), as_dim(b))


def s_add(a: Any, b: Any) -> Variable:
    if dim_value(a) == 0:
        return as_dim(b)
    if dim_value(b) == 0:
        return as_dim(a)
    return _binary("add", lambda x, y: x + y, a, b)


def s_sub(a: Any, b: Any) -> Variable:
    if dim_value(b) == 0:
        return as_dim(a)
    return _binary("sub", lambda x, y: x - y, a, b)


def s_mul(a: Any, b: Any) -> Variable:
    if dim_value(a) == 1:
        return as_dim(b)
    if dim_value(b) == 1:
        return as_dim(a)
    return _binary("mul", lambda x, y: x * y, a, b)


def s_floordiv(a: Any, b: Any) -> Variable:
    """Python's `a // b` (floor)."""
    if dim_value(b) == 1:
        return as_dim(a)
    if dim_value(b) == 0:
        raise ZeroDivisionError("a shape expression divides by the constant 0")
    return _binary("int_div", lambda x, y: x // y, a, b)


def s_max(a: Any, b: Any) -> Variable:
    """max(a, b); a length's floor at 0 (an arange's or a slice's) is dropped where the
    other side is provably non-negative, so ``arange(y.shape[0])`` is ``y.shape[0]`` long
    and a shape graph comparing it with ``y.shape[0]`` can see the two are one length."""
    if dim_value(b) == 0 and is_nonnegative(a):
        return as_dim(a)
    if dim_value(a) == 0 and is_nonnegative(b):
        return as_dim(b)
    return _binary("maximum", max, a, b)


def s_min(a: Any, b: Any) -> Variable:
    return _binary("minimum", min, a, b)


def s_eq(a: Any, b: Any) -> Any:
    va, vb = dim_value(a), dim_value(b)
    if va is not None and vb is not None:
        return va == vb
    return _ew("eq", as_dim(a), as_dim(b))


def s_lt(a: Any, b: Any) -> Any:
    va, vb = dim_value(a), dim_value(b)
    if va is not None and vb is not None:
        return va < vb
    return _ew("lt", as_dim(a), as_dim(b))


def s_switch(cond: Any, a: Any, b: Any) -> Variable:
    """`a if cond else b`; `cond` a Python bool (folded) or a boolean scalar variable."""
    if isinstance(cond, (bool, np.bool_)):
        return as_dim(a if cond else b)
    return _ew("switch", cond, as_dim(a), as_dim(b))


def s_prod(dims: Sequence[Any]) -> Variable:
    out: Any = 1
    for d in dims:
        out = s_mul(out, d)
    return as_dim(out)


def s_sum(dims: Sequence[Any]) -> Variable:
    out: Any = 0
    for d in dims:
        out = s_add(out, d)
    return as_dim(out)


# ----------------------------------------------------------------------------- broadcasting

def pick_dim(candidates: Sequence[Variable]) -> Variable:
    """One of several dimensions known to be equal (a type check or the op's run-time check
    guarantees it): a constant if there is one, else the length of a graph input's
    dimension (cheapest to keep alive), else the first."""
    for c in candidates:
        if dim_value(c) is not None:
            return c
    for c in candidates:
        if is_shape_read(c) and c.owner.inputs[0].owner is None:
            return c
    return candidates[0]


def elemwise_shape(broadcastables: Sequence[Sequence[bool]], shapes: Sequence[tuple]) -> tuple:
    """The output shape of an elementwise op over inputs of equal rank: each dim is the
    length of an input not broadcastable there (elementwise ops check that those agree),
    1 where every input is broadcastable."""
    nd = len(shapes[0]) if shapes else 0
    out = []
    for d in range(nd):
        cands = [s[d] for b, s in zip(broadcastables, shapes) if not b[d]]
        out.append(pick_dim(cands) if cands else _const(1))
    return tuple(out)


def numpy_broadcast(shapes: Sequence[tuple]) -> tuple:
    """NumPy's broadcast of shapes decided at run time (index arrays, matmul batches): a
    length 1 gives way to the other."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(nd):
        dims = [s[d - (nd - len(s))] for s in shapes if d >= nd - len(s)]
        dims = [x for x in dims if dim_value(x) != 1]
        if not dims:
            out.append(_const(1))
            continue
        res = dims[0]
        for x in dims[1:]:
            if not same_dim(res, x):
                res = s_switch(s_eq(res, 1), x, res)
        out.append(as_dim(res))
    return tuple(out)


def reduce_shape(shape: tuple, axis: Sequence[int] | None) -> tuple:
    """`shape` without the reduced axes (None: all)."""
    if axis is None:
        return ()
    return tuple(s for d, s in enumerate(shape) if d not in axis)


def dimshuffle_shape(shape: tuple, new_order: Sequence[Any]) -> tuple:
    return tuple(_const(1) if d == "x" else shape[d] for d in new_order)


# ----------------------------------------------------------------------------- indexing

def slice_length(start: Any, stop: Any, step: Any, n: Any) -> Variable:
    """len(range(*slice(start, stop, step).indices(n))) with parts None, ints or int
    scalar variables (a symbolic step chooses between both signs' formulas at run time)."""
    vs, vt, vp, vn = dim_value(start), dim_value(stop), dim_value(step), dim_value(n)
    if vn is not None and (start is None or vs is not None) and (stop is None or vt is not None) \
            and (step is None or vp is not None):
        return _const(len(range(*slice(vs, vt, vp).indices(vn))))
    if step is None or vp is not None:
        return _slice_len_known_sign(start, stop, 1 if step is None else vp, n)
    pos = _slice_len_known_sign(start, stop, step, n, sign=1)
    neg = _slice_len_known_sign(start, stop, step, n, sign=-1)
    return s_switch(s_lt(0, step), pos, neg)


def _wrap(i: Any, n: Any) -> Variable:
    """A possibly negative index counted from the end: i + n if i < 0."""
    vi = dim_value(i)
    if vi is not None:
        return as_dim(i) if vi >= 0 else s_add(n, vi)
    return s_switch(s_lt(i, 0), s_add(i, n), i)


def _slice_len_known_sign(start: Any, stop: Any, step: Any, n: Any, sign: int | None = None) -> Variable:
    sign = sign if sign is not None else (1 if dim_value(step) > 0 else -1)
    if sign > 0:
        lo = 0 if start is None else s_min(s_max(_wrap(start, n), 0), n)
        hi = n if stop is None else s_min(s_max(_wrap(stop, n), 0), n)
        span = s_sub(hi, lo)
        if dim_value(step) == 1:
            return s_max(span, 0)
        return s_max(s_floordiv(s_add(span, s_sub(step, 1)), step), 0)
    hi = s_sub(n, 1) if start is None else s_min(s_max(_wrap(start, n), -1), s_sub(n, 1))
    lo = -1 if stop is None else s_min(s_max(_wrap(stop, n), -1), s_sub(n, 1))
    span = s_sub(hi, lo)
    neg_step = s_sub(0, step)
    if dim_value(neg_step) == 1:
        return s_max(span, 0)
    return s_max(s_floordiv(s_add(span, s_sub(neg_step, 1)), neg_step), 0)


# ----------------------------------------------------------------------------- join

def join_shape(axis: int, broadcastables: Sequence[Sequence[bool]], shapes: Sequence[tuple]) -> tuple:
    """Joined along `axis`: the lengths there add up, the others agree (Join checks)."""
    out = list(elemwise_shape(broadcastables, shapes))
    out[axis] = s_sum([s[axis] for s in shapes])
    return tuple(out)


# ----------------------------------------------------------------------------- products

def dot_shape(x_shape: tuple, y_shape: tuple) -> tuple:
    """np.dot of vectors and matrices."""
    if len(x_shape) == 1 and len(y_shape) == 1:
        return ()
    if len(y_shape) == 1:
        return tuple(x_shape[:-1])
    return tuple(x_shape[:-1]) + (y_shape[1],)


def matmul_shape(x_shape: tuple, y_shape: tuple) -> tuple:
    """np.matmul of stacks of matrices (the stack dims broadcast as NumPy's)."""
    batch = numpy_broadcast([tuple(x_shape[:-2]), tuple(y_shape[:-2])])
    return tuple(batch) + (x_shape[-2], y_shape[-1])


def arange_length(start: Variable, stop: Variable, step: Variable) -> Variable:
    """len(np.arange(start, stop, step)): ceil((stop - start) / step), at least 0 (exact
    integer arithmetic for integer bounds)."""
    vals = [dim_value(a) if a.type.dtype[0] in "iu" else None for a in (start, stop, step)]
    if all(v is not None for v in vals) and vals[2] != 0:
        return _const(len(range(*vals)))
    if all(a.type.dtype[0] in "iu" for a in (start, stop, step)):
        span = s_sub(stop, start)
        vstep = dim_value(step)
        if vstep is not None:
            adj = s_sub(step, 1) if vstep > 0 else s_add(step, 1)
        else:
            adj = s_switch(s_lt(0, step), s_sub(step, 1), s_add(step, 1))
        return s_max(s_floordiv(s_add(span, adj), step), 0)
    f = [a if a.type.dtype == "float64" else _cast(a, "float64") for a in (start, stop, step)]
    n = _ew("ceil", _ew("true_div", _ew("sub", f[1], f[0]), f[2]))
    return s_max(_cast(n, "int64"), 0)
