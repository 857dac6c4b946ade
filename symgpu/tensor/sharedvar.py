"""Shared tensors on the host (the GPU backend registers its own constructor)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.sharedvalue import SharedVariable, register_shared_constructor
from symgpu.scalar.dtypes import dtype_kind
from symgpu.tensor.type import TensorType, TensorVariable, python_number_array

__all__ = ["TensorSharedVariable", "tensor_constructor", "host_value"]


class TensorSharedVariable(SharedVariable, TensorVariable):
    """A shared ndarray on the host."""


def host_value(value: Any) -> np.ndarray:
    """`value` as an ndarray; Python floats take floatX, Python ints int64."""
    arr = python_number_array(value)
    if arr is not None:
        return arr
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    raise TypeError(f"expected an ndarray or a Python number, got {type(value).__name__}")


@register_shared_constructor
def tensor_constructor(value: Any, name: str | None = None, borrow: bool = False,
                       strict: bool = False, allow_downcast: bool | None = None,
                       target: str | None = "default",
                       broadcastable: Sequence[bool] | None = None) -> TensorSharedVariable:
    """Host shared tensor; dims are not broadcastable unless `broadcastable` says so."""
    if target not in ("default", "cpu"):
        raise TypeError(f"the host constructor only serves target='cpu', not {target!r}")
    arr = host_value(value)
    if dtype_kind(arr.dtype) in "OUSVc":   # (bfloat16 is a 'V' type to NumPy, a float here)
        raise TypeError(f"shared values of dtype {arr.dtype} are not supported")
    if not borrow or not isinstance(value, np.ndarray):
        arr = np.array(arr, copy=True)
    bcast = tuple(broadcastable) if broadcastable is not None else (False,) * arr.ndim
    ttype = TensorType(arr.dtype.name, bcast)
    return TensorSharedVariable(ttype, arr, name=name, strict=strict, allow_downcast=allow_downcast)
