"""Theano's autocasters (`theano.scalar.autocast_float`, `autocast_int`, `autocast_float_as`):
the dtype Theano's 'custom' cast policy gives a Python number, the narrowest of a list of
dtypes that holds it exactly.

Why they exist here: code and tests written for Theano call them (`with
autocast_float_as('float32'): ...`). symgpu's own constants do not consult them: a Python
number next to a tensor takes the tensor's dtype (NumPy 2's rule, docs/from_theano.md), so
`autocast_float_as` changes what `autocast_float(x)` answers, not how graphs are typed.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.config import config

__all__ = ["NumpyAutocaster", "autocast_int", "autocast_float", "autocast_float_as"]


def _holds(dtype: str, x: int | float) -> bool:
    """Whether `dtype` represents the Python number `x` exactly (NaN and infinities too)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return isinstance(x, int) and np.iinfo(dt).min <= x <= np.iinfo(dt).max
    with np.errstate(over="ignore"):
        y = float(np.asarray(x, dtype=dt))
    return y == float(x) or (y != y and x != x)


class NumpyAutocaster:
    """`caster(x)`: the Python or NumPy scalar `x` as a 0-d array of the first of `dtypes`
    that represents it exactly (a Python float tries floatX first when floatX is narrower
    than float64 and among `dtypes`, as Theano's does); the last dtype if none does."""

    def __init__(self, dtypes: Sequence[str]):
        self.dtypes = tuple(dtypes)

    def __call__(self, x: Any) -> np.ndarray:
        if not (isinstance(x, (int, float, np.number)) or
                (isinstance(x, np.ndarray) and x.ndim == 0)):
            raise TypeError(f"autocast: {x!r} is not a scalar")
        if isinstance(x, np.ndarray) or isinstance(x, np.number):
            return np.asarray(x)
        try_dtypes = list(self.dtypes)
        if isinstance(x, float) and config.floatX in self.dtypes and config.floatX != "float64":
            try_dtypes = [config.floatX] + [d for d in try_dtypes if d != config.floatX]
        for dtype in try_dtypes:
            if _holds(dtype, x):
                return np.asarray(x, dtype=dtype)
        return np.asarray(x, dtype=self.dtypes[-1])


autocast_int = NumpyAutocaster(("int8", "int16", "int32", "int64"))
autocast_float = NumpyAutocaster(("float16", "float32", "float64"))


class autocast_float_as:  # noqa: N801  (Theano's name)
    """`with autocast_float_as('float32', ...):` — `autocast_float` tries only these dtypes
    inside the block."""

    def __init__(self, *dtypes: str):
        self.dtypes = dtypes

    def __enter__(self) -> "autocast_float_as":
        self.old_dtypes = autocast_float.dtypes
        autocast_float.dtypes = self.dtypes
        return self

    def __exit__(self, *exc: Any) -> None:
        autocast_float.dtypes = self.old_dtypes
