"""The dtypes GPU arrays can hold, and their names remembered.

Below GpuArray (symgpu/gpu/runtime/array.py, which re-exports these) so that the kernels GpuArray
itself launches (the strided copy) can name dtypes without importing it.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["SUPPORTED_DTYPES", "BFLOAT16", "check_dtype", "dtype_name"]

#: ml_dtypes' bfloat16 (JAX's and PyTorch's interchange type): NumPy files it under kind 'V'
#: (no NumPy kind says "float" for a type NumPy does not define), so it is accepted by name
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED_DTYPES = tuple(np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64")) + (BFLOAT16,)


def check_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype if CUDA arrays can hold it: bool, int8..int64, uint8..uint64,
    float16/bfloat16/float32/float64 (native byte order).  Complex and everything else is a
    TypeError."""
    dt = np.dtype(dtype)
    if dt == BFLOAT16:
        return BFLOAT16
    if dt.kind == "c":
        raise TypeError(f"dtype {dt} is complex: symgpu GPU arrays do not support complex "
                        f"numbers; keep real and imaginary parts in two float arrays")
    if dt.kind not in "biuf" or dt.itemsize > 8 or dt.fields is not None or dt.subdtype:
        raise TypeError(f"dtype {dt} cannot live on the GPU; use bool, int8..int64, "
                        f"uint8..uint64 or float16/bfloat16/float32/float64")
    if not dt.isnative:
        dt = dt.newbyteorder("=")
    return dt


_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, remembered: NumPy computes the name in Python on every read (about
    2 us), and kernel names are built from it on every launch."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name
