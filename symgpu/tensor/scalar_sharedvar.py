"""Theano's ``theano.scalar.sharedvar``: shared variables holding one number.

Theano made them of its graph-level Scalar type, for scan's loop counters, and never
registered the constructor with ``theano.shared``: a user asks for one by name. symgpu has no
graph-level scalar type (its scalar ops live inside Elemwise), so a scalar shared variable is
a 0-d shared tensor: it indexes, updates and computes like Theano's, and is a
TensorSharedVariable. The dtype rule is Theano's: a NumPy scalar keeps its dtype, a Python
int is int64 and a Python float float64 (not floatX).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.tensor.sharedvar import TensorSharedVariable
from symgpu.tensor.type import TensorType

__all__ = ["ScalarSharedVariable", "shared"]


class ScalarSharedVariable(TensorSharedVariable):
    """A shared variable of one number (a 0-d tensor)."""


def shared(value: Any, name: str | None = None, strict: bool = False,
           allow_downcast: bool | None = None) -> ScalarSharedVariable:
    """A ScalarSharedVariable holding `value`, a Python or NumPy number (not an array)."""
    if not isinstance(value, (np.number, np.bool_, bool, int, float)):
        raise TypeError(f"theano.scalar.sharedvar.shared needs a Python or NumPy number (not "
                        f"complex), got {type(value).__name__}: use shared() for arrays")
    arr = np.array(value, dtype=getattr(value, "dtype", None))   # a copy, 0-d
    if arr.dtype.kind == "c":
        raise TypeError(f"theano.scalar.sharedvar.shared: complex values ({arr.dtype}) are not "
                        "supported in shared variables")
    return ScalarSharedVariable(TensorType(arr.dtype.name, ()), arr, name=name, strict=strict,
                                allow_downcast=allow_downcast)
