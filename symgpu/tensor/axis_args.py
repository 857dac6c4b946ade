"""Argument checks shared by the array functions of extra_ops.py and sorting.py: an axis
argument normalised against a tensor, integer-valued inputs required."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.tensor.type import TensorVariable

__all__ = ["norm_axis", "require_int"]


def norm_axis(x: TensorVariable, axis: Any, what: str) -> int:
    """`axis` (an int, negative counting from the end) as an axis of `x`; errors name `what`."""
    if x.ndim == 0:
        raise ValueError(f"{what}: {x} is a scalar (0 dimensions); there is no axis {axis}")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{what}: axis must be an int or None, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for {x} with {x.ndim} dimensions")
    return int(axis) % x.ndim


def require_int(v: TensorVariable, what: str, name: str) -> None:
    """A TypeError naming `what` and `name` unless `v` holds integers."""
    if not (v.dtype.startswith("int") or v.dtype.startswith("uint")):
        raise TypeError(f"{what}: {name} must be integers, got {v} ({v.type})")
