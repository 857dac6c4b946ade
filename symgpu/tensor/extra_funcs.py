"""Theano's everyday functions that are built from other ops (so they fuse, run on the GPU
and differentiate through those): rounding modes, tile, roll, max_and_argmax, norm, trace,
swapaxes, broadcast patterns and padding, triangles, stacks, diff, ptp, take, isclose,
largest/smallest, batched_dot, batched_tensordot, choose, fill_diagonal, to_one_hot; and the
elementwise functions of the rows added with them (inverse trigonometry, degrees).
"""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Variable
from symgpu.scalar.dtypes import upcast
from symgpu.tensor.basic import (_as_int_scalar, _vector_length, alloc, arange, choose,
                                 concatenate, flatten, reshape, shape_padleft, shape_padright,
                                 stack)
from symgpu.tensor.extra_ops import diagonal, diff, fill_diagonal  # Theano's extra_ops names
from symgpu.tensor.math import (_make_elemwise, _prod_of, abs as _abs, all as _all, and_, argmax,
                                cast, clip, eq, ge, invert, isinf, isnan, le, lt, matmul,
                                max as _max, maximum, min as _min, minimum, neq, or_, second, sqr,
                                sqrt, sum as _sum, switch, zeros_like)
from symgpu.tensor.shape import Unbroadcast, dimshuffle, shape_i, specify_broadcastable_as
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable
from symgpu.tensor.subtensor import set_subtensor

__all__ = ["round", "iround", "round_half_to_even", "round_half_away_from_zero", "tile",
           "roll", "max_and_argmax", "norm", "trace", "swapaxes", "arcsin", "arccos", "arcsinh",
           "arccosh", "arctanh", "arctan2", "deg2rad", "rad2deg", "addbroadcast", "unbroadcast",
           "patternbroadcast", "shape_padleft", "shape_padright", "shape_padaxis", "tri", "tril",
           "triu", "stacklists", "horizontal_stack", "vertical_stack", "diff", "ptp", "take",
           "isclose", "allclose", "largest", "smallest", "batched_dot", "batched_tensordot",
           "choose", "fill_diagonal", "to_one_hot"]

round_half_to_even = _make_elemwise("round", "Elementwise rounding, halves to even (NumPy's).")
round_half_away_from_zero = _make_elemwise(
    "round_half_away_from_zero", "Elementwise rounding, halves away from zero (C's round).")

arcsin = _make_elemwise("arcsin", "Elementwise arc sine.")
arccos = _make_elemwise("arccos", "Elementwise arc cosine.")
arcsinh = _make_elemwise("arcsinh", "Elementwise inverse hyperbolic sine.")
arccosh = _make_elemwise("arccosh", "Elementwise inverse hyperbolic cosine.")
arctanh = _make_elemwise("arctanh", "Elementwise inverse hyperbolic tangent.")
arctan2 = _make_elemwise("arctan2", "Elementwise arc tangent of y/x in the right quadrant.")
deg2rad = _make_elemwise("deg2rad", "Elementwise degrees to radians.")
rad2deg = _make_elemwise("rad2deg", "Elementwise radians to degrees.")

_ROUND_MODES = {"half_to_even": round_half_to_even,
                "half_away_from_zero": round_half_away_from_zero}


def round(a: Any, mode: str | None = None) -> TensorVariable:
    """Elementwise rounding; `mode` 'half_to_even' (the default, as NumPy and PyTensor) or
    'half_away_from_zero' (Theano 0.x's default)."""
    try:
        fn = _ROUND_MODES["half_to_even" if mode is None else mode]
    except KeyError:
        raise ValueError(f"round: mode must be one of {sorted(_ROUND_MODES)}, "
                         f"got {mode!r}") from None
    return fn(a)


def iround(a: Any, mode: str | None = None) -> TensorVariable:
    """round(a, mode) as int64."""
    return cast(round(a, mode), "int64")


def _reps(reps: Any, ndim: int | None) -> list:
    """tile's repetitions as a list of ints / int scalars."""
    if isinstance(reps, Variable):
        reps = as_tensor_variable(reps)
        if reps.ndim == 0:
            return [_as_int_scalar(reps, "tile repetition")]
        if reps.ndim != 1:
            raise ValueError(f"tile: reps must be a vector or a list, got {reps} ({reps.type})")
        n = _vector_length(reps)
        if n is None:
            n = ndim
        if n is None:
            raise ValueError(f"tile: the length of the symbolic reps {reps} is not known; "
                             "pass ndim=")
        return [_as_int_scalar(reps[i], "tile repetition") for i in range(n)]
    if isinstance(reps, (int, np.integer)):
        return [int(reps)]
    out = []
    for r in reps:
        if isinstance(r, (int, np.integer)):
            if r < 0:
                raise ValueError(f"tile: negative repetition {r} in {reps!r}")
            out.append(int(r))
        else:
            out.append(_as_int_scalar(r, "tile repetition"))
    return out


def tile(x: Any, reps: Any, ndim: int | None = None) -> TensorVariable:
    """`x` repeated `reps[d]` times along each dimension d, as np.tile (reps: ints, integer
    scalars, or an integer vector of known length; `ndim`: the output's rank)."""
    x = as_tensor_variable(x)
    reps = _reps(reps, ndim)
    d = builtins.max(x.ndim, len(reps))
    if ndim is not None:
        if ndim < d:
            raise ValueError(f"tile: ndim={ndim} is less than x's {x.ndim} dimensions or the "
                             f"{len(reps)} repetitions")
        d = ndim
    reps = [1] * (d - len(reps)) + reps
    xp = dimshuffle(x, ["x"] * (d - x.ndim) + list(range(x.ndim)))
    if builtins.all(isinstance(r, int) and r == 1 for r in reps):
        return xp
    sizes = [shape_i(xp, i) for i in range(d)]
    pattern = []
    for i in range(d):
        pattern += ["x", i]
    spread = alloc(dimshuffle(xp, pattern), *[v for pair in zip(reps, sizes) for v in pair])
    return reshape(spread, [r * s for r, s in zip(reps, sizes)], ndim=d)


def roll(x: Any, shift: Any, axis: Any = None) -> TensorVariable:
    """Elements of `x` shifted by `shift` along `axis` (of the flattened array, then
    reshaped, if None), wrapping around, as np.roll; tuples of shifts and axes roll in turn."""
    x = as_tensor_variable(x)
    if axis is None:
        if isinstance(shift, (tuple, list)):
            raise ValueError("roll: a tuple of shifts needs a tuple of axes")
        return reshape(roll(flatten(x, 1), shift, 0), x.shape, ndim=x.ndim)
    if isinstance(axis, (tuple, list)):
        shifts = shift if isinstance(shift, (tuple, list)) else [shift] * len(axis)
        if len(shifts) != len(axis):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(axis)} axes")
        for s, a in zip(shifts, axis):
            x = roll(x, s, a)
        return x
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"roll: axis {axis} is out of range for {x} ({x.type})")
    axis = int(axis) % x.ndim
    n = shape_i(x, axis)
    s = _as_int_scalar(shift, "roll shift") % maximum(n, 1)  # in [0, n): Python's sign rule
    before = (slice(None),) * axis
    return concatenate([x[before + (slice(n - s, None),)], x[before + (slice(0, n - s),)]],
                       axis=axis)


def max_and_argmax(a: Any, axis: Any = None, keepdims: bool = False) -> list[TensorVariable]:
    """[max(a, axis), argmax(a, axis)]: Theano's pair."""
    return [_max(a, axis, keepdims), argmax(a, axis, keepdims)]


def norm(x: Any, L: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """The L-norm of `x`'s elements over `axis` (all by default), (sum |x|**L)**(1/L), as
    Theano's `x.norm(L)`; L may also be 0 (count of nonzeros), inf (max |x|) or -inf."""
    x = as_tensor_variable(x)
    if isinstance(L, Variable):
        return _sum(_abs(x) ** L, axis=axis, keepdims=keepdims) ** (1.0 / L)
    L = float(L)
    if L == np.inf:
        return _max(_abs(x), axis, keepdims)
    if L == -np.inf:
        return _min(_abs(x), axis, keepdims)
    if L == 0:
        return _sum(neq(x, 0), axis=axis, keepdims=keepdims)
    if L == 1:
        return _sum(_abs(x), axis=axis, keepdims=keepdims)
    if L == 2:
        return sqrt(_sum(sqr(_abs(x)) if x.dtype.startswith("complex") else sqr(x),
                         axis=axis, keepdims=keepdims))
    return _sum(_abs(x) ** L, axis=axis, keepdims=keepdims) ** (1.0 / L)


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> TensorVariable:
    """The sum of the diagonal `offset` of `a`, as np.trace."""
    return _sum(diagonal(a, offset, axis1, axis2), axis=-1)


def swapaxes(x: Any, axis1: int, axis2: int) -> TensorVariable:
    """`x` with two axes exchanged, as np.swapaxes."""
    x = as_tensor_variable(x)
    for a in (axis1, axis2):
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"swapaxes: axis {a} is out of range for {x} ({x.type})")
    order = list(range(x.ndim))
    a1, a2 = int(axis1) % x.ndim, int(axis2) % x.ndim
    order[a1], order[a2] = order[a2], order[a1]
    return dimshuffle(x, order)


# ============================================================================ broadcast patterns

def _axes(x: TensorVariable, axes: tuple, what: str) -> list[int]:
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or not -x.ndim <= a < x.ndim:
            raise ValueError(f"{what}: axis {a!r} is out of range for {x} ({x.type})")
        out.append(int(a) % x.ndim)
    return out


def addbroadcast(x: Any, *axes: int) -> TensorVariable:
    """`x` with `axes` declared broadcastable (checked to have length 1 at run time)."""
    x = as_tensor_variable(x)
    bcast = list(x.broadcastable)
    for a in _axes(x, axes, "addbroadcast"):
        bcast[a] = True
    return specify_broadcastable_as(x, TensorType(x.dtype, bcast))


def unbroadcast(x: Any, *axes: int) -> TensorVariable:
    """`x` with `axes` no longer known to have length 1 (a view)."""
    x = as_tensor_variable(x)
    drop = [False] * x.ndim
    for a in _axes(x, axes, "unbroadcast"):
        drop[a] = x.broadcastable[a]
    return Unbroadcast(drop)(x) if any(drop) else x


def patternbroadcast(x: Any, broadcastable: Any) -> TensorVariable:
    """`x` with exactly the broadcastable pattern `broadcastable`."""
    x = as_tensor_variable(x)
    if len(broadcastable) != x.ndim:
        raise ValueError(f"patternbroadcast: {len(broadcastable)} flags for {x} with {x.ndim} "
                         "dimensions")
    return specify_broadcastable_as(x, TensorType(x.dtype, [bool(b) for b in broadcastable]))


def shape_padaxis(t: Any, axis: int) -> TensorVariable:
    """`t` with a broadcastable dimension inserted at `axis` (as np.expand_dims)."""
    t = as_tensor_variable(t)
    if not -t.ndim - 1 <= axis <= t.ndim:
        raise ValueError(f"shape_padaxis: axis {axis} is out of range for {t} with {t.ndim} "
                         "dimensions")
    axis = axis % (t.ndim + 1)
    pattern: list = list(range(t.ndim))
    pattern.insert(axis, "x")
    return dimshuffle(t, pattern)


# ============================================================================ triangles, stacks

def tri(N: Any, M: Any = None, k: Any = 0, dtype: str | None = None) -> TensorVariable:
    """An N x M matrix with ones at and below diagonal `k`, as np.tri (dtype floatX)."""
    dtype = config.floatX if dtype in (None, "floatX") else dtype
    rows = arange(N, dtype="int64")
    cols = arange(N if M is None else M, dtype="int64")
    return cast(ge(dimshuffle(rows, [0, "x"]) + k, dimshuffle(cols, ["x", 0])), dtype)


def _triangle(m: Any, k: Any, lower: bool, what: str) -> TensorVariable:
    m = as_tensor_variable(m)
    if m.ndim < 2:
        raise ValueError(f"{what}: {m} ({m.type}) needs 2 dimensions or more")
    mask = tri(shape_i(m, m.ndim - 2), shape_i(m, m.ndim - 1), k if lower else k - 1, "bool")
    if lower:
        return switch(mask, m, zeros_like(m))
    return switch(mask, zeros_like(m), m)


def tril(m: Any, k: Any = 0) -> TensorVariable:
    """`m` with the elements above diagonal `k` zeroed (last two axes), as np.tril."""
    return _triangle(m, k, True, "tril")


def triu(m: Any, k: Any = 0) -> TensorVariable:
    """`m` with the elements below diagonal `k` zeroed (last two axes), as np.triu."""
    return _triangle(m, k, False, "triu")


def stacklists(arg: Any) -> TensorVariable:
    """A tensor from nested lists of scalars/tensors: `stacklists([[a, b], [c, d]])` is a
    2 x 2 (x the elements' shape) tensor."""
    if isinstance(arg, (list, tuple)):
        return stack([stacklists(a) for a in arg])
    return as_tensor_variable(arg)


def horizontal_stack(*args: Any) -> TensorVariable:
    """Matrices side by side (along axis 1), as np.hstack of matrices."""
    return concatenate(list(args), axis=1)


def vertical_stack(*args: Any) -> TensorVariable:
    """Matrices one above the other (along axis 0), as np.vstack of matrices."""
    return concatenate(list(args), axis=0)


# ============================================================================ differences, ranges

def ptp(a: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """max - min over `axis` (peak to peak), as np.ptp."""
    return _max(a, axis, keepdims) - _min(a, axis, keepdims)


def take(a: Any, indices: Any, axis: int | None = None) -> TensorVariable:
    """Elements of `a` at integer `indices` along `axis` (of the flattened array if None),
    as np.take (out-of-range indices raise)."""
    a = as_tensor_variable(a)
    indices = as_tensor_variable(indices)
    if axis is None:
        return flatten(a, 1)[indices]
    (axis,) = _axes(a, (axis,), "take")
    return a[(slice(None),) * axis + (indices,)]


# ============================================================================ comparisons, misc

def isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> TensorVariable:
    """Elementwise |a - b| <= atol + rtol * |b|, infinities equal only to themselves, as
    np.isclose."""
    a, b = as_tensor_variable(a), as_tensor_variable(b)
    finite = and_(invert(isinf(a)), invert(isinf(b)))
    close = le(_abs(a - b), atol + rtol * _abs(b))
    # where either is infinite: equal only if both are the same infinity (|inf - inf| is nan)
    result = switch(finite, close, eq(a, b))
    if equal_nan:
        result = or_(result, and_(isnan(a), isnan(b)))
    return result


def allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> TensorVariable:
    """True if every element of a and b is close (isclose), as np.allclose."""
    return _all(isclose(a, b, rtol, atol, equal_nan))


def largest(*args: Any) -> TensorVariable:
    """The elementwise maximum of any number of tensors."""
    if not args:
        raise TypeError("largest() needs at least one argument")
    out = as_tensor_variable(args[0])
    for a in args[1:]:
        out = maximum(out, a)
    return out


def smallest(*args: Any) -> TensorVariable:
    """The elementwise minimum of any number of tensors."""
    if not args:
        raise TypeError("smallest() needs at least one argument")
    out = as_tensor_variable(args[0])
    for a in args[1:]:
        out = minimum(out, a)
    return out


def batched_dot(a: Any, b: Any) -> TensorVariable:
    """One dot product per leading index: out[i] = dot(a[i], b[i]) for stacks of vectors or
    matrices (Theano's batched_dot)."""
    a, b = as_tensor_variable(a), as_tensor_variable(b)
    if a.ndim < 2 or b.ndim < 2 or a.ndim > 3 or b.ndim > 3:
        raise ValueError(f"batched_dot: {a} ({a.type}) and {b} ({b.type}) must be stacks "
                         "(2 or 3 dimensions) of vectors or matrices")
    a3 = dimshuffle(a, [0, "x", 1]) if a.ndim == 2 else a
    b3 = dimshuffle(b, [0, 1, "x"]) if b.ndim == 2 else b
    out = matmul(a3, b3)
    drop = [0] + ([1] if a.ndim == 3 else []) + ([2] if b.ndim == 3 else [])
    return dimshuffle(out, drop)


def batched_tensordot(x: Any, y: Any, axes: Any = 2) -> TensorVariable:
    """Theano's batched_tensordot: one np.tensordot per index of the leading (batch) axis.
    An integer `axes` contracts the last `axes` axes of x with y's axes 1..axes; a pair of
    lists names the contracted axes of x and of y, counted with the batch axis (so >= 1).
    Built as one batched matrix product (matmul) between transposes and reshapes."""
    x, y = as_tensor_variable(x), as_tensor_variable(y)
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"batched_tensordot: {x} ({x.type}) and {y} ({y.type}) need a batch "
                         "axis and at least one more")
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        x_axes, y_axes = list(range(x.ndim - n, x.ndim)), list(range(1, n + 1))
    else:
        if len(axes) != 2:
            raise ValueError(f"batched_tensordot: axes must be an integer or two lists, got {axes}")
        x_axes, y_axes = ([axes[0]] if isinstance(axes[0], (int, np.integer)) else list(axes[0]),
                          [axes[1]] if isinstance(axes[1], (int, np.integer)) else list(axes[1]))
    x_axes = [int(a) % x.ndim for a in x_axes]
    y_axes = [int(a) % y.ndim for a in y_axes]
    if len(x_axes) != len(y_axes):
        raise ValueError(f"batched_tensordot: {len(x_axes)} axes of x against {len(y_axes)} of y")
    if 0 in x_axes or 0 in y_axes or len(set(x_axes)) < len(x_axes) \
            or len(set(y_axes)) < len(y_axes):
        raise ValueError(f"batched_tensordot: axes {x_axes}, {y_axes} must be distinct and "
                         "not the batch axis 0")
    x_free = [d for d in range(1, x.ndim) if d not in x_axes]
    y_free = [d for d in range(1, y.ndim) if d not in y_axes]
    batch = shape_i(x, 0)
    x_shape = [shape_i(x, d) for d in x_free]
    y_shape = [shape_i(y, d) for d in y_free]
    k_x = _prod_of([shape_i(x, d) for d in x_axes])
    k_y = _prod_of([shape_i(y, d) for d in y_axes])  # y's own: a mismatch fails in matmul
    x3 = reshape(dimshuffle(x, [0] + x_free + x_axes), [batch, _prod_of(x_shape), k_x], ndim=3)
    y3 = reshape(dimshuffle(y, [0] + y_axes + y_free), [shape_i(y, 0), k_y, _prod_of(y_shape)],
                 ndim=3)
    out = matmul(x3, y3)
    return reshape(out, [batch] + x_shape + y_shape, ndim=1 + len(x_free) + len(y_free))


def to_one_hot(y: Any, nb_class: Any, dtype: str | None = None) -> TensorVariable:
    """A (len(y), nb_class) matrix with a 1 at (i, y[i]) for the integer vector `y`
    (dtype floatX by default)."""
    y = as_tensor_variable(y)
    if y.ndim != 1 or not (y.dtype.startswith("int") or y.dtype.startswith("uint")):
        raise TypeError(f"to_one_hot: {y} ({y.type}) must be an integer vector")
    dtype = config.floatX if dtype in (None, "floatX") else dtype
    classes = arange(nb_class, dtype="int64")
    return cast(eq(dimshuffle(y, [0, "x"]), dimshuffle(classes, ["x", 0])), dtype)
