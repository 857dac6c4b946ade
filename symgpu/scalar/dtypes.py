"""Dtype facts shared by the scalar table, tensors and code generation."""
from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers numpy.dtype("bfloat16"), the type JAX uses)
import numpy as np

__all__ = ["ALL_DTYPES", "FLOAT_DTYPES", "HALF_DTYPES", "INT_DTYPES", "UINT_DTYPES",
           "COMPLEX_DTYPES", "upcast", "upgrade_to_float", "is_float", "is_half", "is_int",
           "is_bool", "C_TYPES", "check_dtype", "value_dtype", "dtype_kind", "APPROX_TOL",
           "approx_tolerance", "in_value_dtype"]

#: 16-bit floats: stored in 16 bits, computed in float32 by kernels (load, compute, round on store)
HALF_DTYPES = ("float16", "bfloat16")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64")
UINT_DTYPES = ("uint8", "uint16", "uint32", "uint64")
COMPLEX_DTYPES = ("complex64", "complex128")
ALL_DTYPES = ("bool",) + INT_DTYPES + UINT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES

#: the C/CUDA type that holds each dtype (half dtypes compute in float: see codegen)
C_TYPES = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int",
    "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
    "uint32": "unsigned int", "uint64": "unsigned long long", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}


def check_dtype(dtype) -> str:
    """Normalise a dtype spelling to its canonical name, or raise a TypeError naming it."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}; use one of {', '.join(ALL_DTYPES)}") from None
    if name not in ALL_DTYPES:
        raise TypeError(f"dtype {name!r} is not supported; use one of {', '.join(ALL_DTYPES)}")
    return name


def upcast(*dtypes: str) -> str:
    """The dtype NumPy gives when these dtypes meet (all treated as arrays).

    NumPy has no rule for bfloat16 beside most types: it promotes as float16 does (int8, uint8
    and bool keep it, wider integers go to float32/float64), and meeting float16 gives float32,
    the narrowest type holding both (JAX's rule)."""
    if "bfloat16" not in dtypes:
        return np.result_type(*[np.dtype(d) for d in dtypes]).name
    rest = [d for d in dtypes if d != "bfloat16"]
    if not rest:
        return "bfloat16"
    other = upcast(*rest)
    if other == "float16":
        return "float32"
    out = np.result_type(np.float16, np.dtype(other)).name
    return "bfloat16" if out == "float16" else out


def value_dtype(dtype: str) -> str:
    """The dtype kernels compute ``dtype`` values in: float32 for the half dtypes."""
    return "float32" if dtype in HALF_DTYPES else dtype


def upgrade_to_float(dtype: str) -> str:
    """Theano's rule for float-valued functions of integers: small ints go to float32."""
    if dtype in FLOAT_DTYPES or dtype in COMPLEX_DTYPES:
        return dtype
    if dtype in ("bool", "int8", "uint8", "int16", "uint16"):
        return "float32"
    return "float64"


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_half(dtype: str) -> bool:
    return dtype in HALF_DTYPES


def dtype_kind(dtype) -> str:
    """NumPy's kind letter of `dtype` (a name or a NumPy dtype), with 'f' for bfloat16.

    Why: ml_dtypes' bfloat16 is a NumPy user type whose ``dtype.kind`` is 'V' (void), so a
    ``dtype.kind in "fc"`` test silently treats it as not a float; ask this instead."""
    dt = np.dtype(dtype)
    return "f" if dt.name in HALF_DTYPES else dt.kind


#: relative and absolute tolerance of "approximately equal" values of each float dtype
#: (DebugMode's comparisons, TensorType.values_eq_approx): a few units in the last place
#: of the half types (float16's epsilon is 2**-10, bfloat16's 2**-7), Theano's for the others
APPROX_TOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-4, "float64": 1e-8,
              "complex64": 1e-4, "complex128": 1e-8}


def approx_tolerance(dtype) -> float:
    """The tolerance APPROX_TOL gives `dtype` (a name or a NumPy dtype); 1e-4 for others."""
    return APPROX_TOL.get(np.dtype(dtype).name, 1e-4)


def in_value_dtype(arr: np.ndarray) -> np.ndarray:
    """`arr` in the dtype it is computed in on the host: float32 for the half dtypes (the
    host's accumulating kernels, reductions, products, convolutions, softmax, compute in
    float32 and round once at the end, as the GPU kernels do), itself otherwise."""
    name = arr.dtype.name
    return arr.astype(np.float32) if name in HALF_DTYPES else arr


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES or dtype in UINT_DTYPES


def is_bool(dtype: str) -> bool:
    return dtype == "bool"
