"""Slices as symbolic integers: Theano's `get_canonical_form_slice` and `merge_two_slices`
(theano.tensor.subtensor / theano.tensor.opt), for rewrites and user code that compose
slices whose bounds or lengths are only known when the function runs.

A canonical slice has ``0 <= start <= stop <= length`` and ``step > 0``, with a direction
(1, or -1 when the elements come in reverse): ``x[s] == x[canonical][::direction]``. For a
negative step, `start` is the smallest element taken and ``stop - 1`` the largest, which is
what lets `merge_two_slices` compose two slices with arithmetic alone.
"""
from __future__ import annotations

from typing import Any

from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.math import and_, ge, gt, le, lt, maximum, minimum, sgn, switch
from symgpu.tensor.type import as_tensor_variable

__all__ = ["get_canonical_form_slice", "merge_two_slices"]

def _constant(x: Any) -> tuple[Any, bool]:
    """(its value, True) when `x` is None or a known integer, else (x, False)."""
    if x is None:
        return None, True
    try:
        return int(get_scalar_constant_value(x)), True
    except (NotScalarConstantError, TypeError):
        return as_tensor_variable(x), False

def get_canonical_form_slice(theslice: Any, length: Any) -> tuple[Any, Any]:
    """`theslice` (a slice, or an integer index) of an axis of `length` in canonical form:
    ``(slice(start, stop, step), direction)`` with ``0 <= start <= stop <= length`` and
    ``step > 0`` (symbolic where the bounds are); an index gives ``(index, 1)`` with a
    negative index counted from the end."""
    if not isinstance(theslice, slice):
        value = as_tensor_variable(theslice)
        return switch(lt(value, 0), value + length, value), 1
    start, _ = _constant(theslice.start)
    stop, _ = _constant(theslice.stop)
    step, step_known = _constant(theslice.step)
    if step is None:
        step, step_known = 1, True
    if step_known:
        if step == 0:
            raise ValueError(f"get_canonical_form_slice: slice step cannot be zero ({theslice})")
        negative = step < 0

        def by_sign(if_neg: Any, if_pos: Any) -> Any:
            return if_neg if negative else if_pos
        abs_step, sgn_step = abs(step), (-1 if negative else 1)
    else:
        is_neg = lt(step, 0)

        def by_sign(if_neg: Any, if_pos: Any) -> Any:
            return switch(is_neg, if_neg, if_pos)
        abs_step, sgn_step = abs(step), sgn(step)
    if start is None:
        start = by_sign(length - 1, 0)
    else:
        start = switch(lt(start, 0), start + length, start)
        start = switch(lt(start, 0), by_sign(-1, 0), start)
        start = switch(ge(start, length), by_sign(length - 1, length), start)
    if stop is None:
        stop = by_sign(-1, length)
    else:
        stop = switch(lt(stop, 0), stop + length, stop)
        stop = switch(lt(stop, 0), -1, stop)
        stop = switch(ge(stop, length), length, stop)
    # a negative step takes start, start - |step|, ... > stop: the smallest of them becomes
    # the canonical start, start + 1 the canonical stop
    nw_stop = by_sign(start + 1, stop)
    slice_len = (start - stop - 1) // abs_step + 1
    slice_len = switch(lt(slice_len, 0), 0, slice_len)
    neg_start = nw_stop - (slice_len - 1) * abs_step - 1
    neg_start = switch(lt(neg_start, 0), nw_stop - 1, neg_start)
    nw_start = by_sign(neg_start, start)
    nw_start = switch(lt(nw_start, 0), 0, nw_start)
    nw_stop = switch(lt(nw_stop, 0), 0, nw_stop)
    nw_start = switch(lt(nw_start, nw_stop), nw_start, nw_stop)
    return slice(nw_start, nw_stop, abs_step), (1 if step_known and step == 1 else sgn_step)

def merge_two_slices(slice1: slice, len1: Any, slice2: Any, len2: Any) -> Any:
    """One slice (or index) equal to applying `slice1` to an axis of length `len1` and then
    `slice2` (a slice or an index) to the result, of length `len2`: ``x[slice1][slice2] ==
    x[merge_two_slices(slice1, len1, slice2, len2)]``. Not in canonical form. An index out of
    range after the first slice becomes one out of range of `len1` (an IndexError when used)."""
    if type(slice1) is not slice:
        raise ValueError(f"merge_two_slices: the first slice must be a slice, not an index "
                         f"({slice1!r})")
    sl1, reverse1 = get_canonical_form_slice(slice1, len1)
    sl2, reverse2 = get_canonical_form_slice(slice2, len2)
    step_known = not hasattr(slice1.step, "owner") and slice1.step is not None
    if type(sl2) is not slice:
        # the k-th element of the first slice: from its start, or from its end when reversed
        p_val = sl1.start + sl2 * sl1.step
        n_val = sl1.stop - 1 - sl2 * sl1.step
        val = switch(lt(reverse1, 0), n_val, p_val)
        val = switch(le(len2, 0), len1 + 1, val)
        val = switch(ge(sl2, len2), len1 + 1, val)
        val = switch(lt(sl2, 0), -len1 - 1, val)
        if not step_known:
            val = switch(lt(sl1.step, 1), len1 + 1, val)
        return val
    flen = sl2.stop - sl2.start
    p_step = sl1.step * sl2.step
    n_step = sl1.step * sl2.step * -1
    # four cases by the directions of the two slices: (p)ositive / (n)egative, first then second
    pp_start = minimum(sl1.start + sl2.start * sl1.step, sl1.stop)
    pp_stop = minimum(sl1.start + sl2.stop * sl1.step, sl1.stop)
    pn_stop = sl1.start + (sl2.start - 1) * sl1.step
    pn_stop = switch(and_(lt(pn_stop, 0), gt(flen, 0)), -len1 - 1, minimum(pn_stop, sl1.stop))
    pn_start = maximum(minimum(sl1.start + (sl2.stop - 1) * sl1.step, sl1.stop), 0)
    np_stop = sl1.stop - sl2.stop * sl1.step - 1
    np_stop = switch(and_(lt(np_stop, 0), gt(flen, 0)), -len1 - 1,
                     maximum(sl1.start - 1, np_stop))
    np_start = maximum(sl1.start, sl1.stop - sl2.start * sl1.step - 1)
    nn_start = maximum(sl1.start, (sl1.stop - 1) - (sl2.stop - 1) * sl1.step)
    nn_stop = maximum(sl1.start, sl1.stop - sl2.start * sl1.step)
    mixed = lt(reverse2 * reverse1, 0)
    first_rev = lt(reverse1, 0)
    start = switch(mixed, switch(first_rev, np_start, pn_start),
                   switch(first_rev, nn_start, pp_start))
    stop = switch(mixed, switch(first_rev, np_stop, pn_stop),
                  switch(first_rev, nn_stop, pp_stop))
    step = switch(mixed, n_step, p_step)
    start = switch(le(flen, 0), 0, start)
    stop = switch(le(flen, 0), 0, stop)
    return slice(start, stop, step)

