"""Dtype facts shared by the scalar table, tensors and code generation."""
from __future__ import annotations

import numpy as np

__all__ = ["ALL_DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "UINT_DTYPES", "COMPLEX_DTYPES",
           "upcast", "upgrade_to_float", "is_float", "is_int", "is_bool", "C_TYPES",
           "check_dtype"]

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64")
UINT_DTYPES = ("uint8", "uint16", "uint32", "uint64")
COMPLEX_DTYPES = ("complex64", "complex128")
ALL_DTYPES = ("bool",) + INT_DTYPES + UINT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES

#: the C/CUDA type that holds each dtype (float16 computes in float: see codegen)
C_TYPES = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int",
    "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
    "uint32": "unsigned int", "uint64": "unsigned long long", "float16": "__half",
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
    """The dtype NumPy gives when these dtypes meet (all treated as arrays)."""
    return np.result_type(*[np.dtype(d) for d in dtypes]).name


def upgrade_to_float(dtype: str) -> str:
    """Theano's rule for float-valued functions of integers: small ints go to float32."""
    if dtype in FLOAT_DTYPES or dtype in COMPLEX_DTYPES:
        return dtype
    if dtype in ("bool", "int8", "uint8", "int16", "uint16"):
        return "float32"
    return "float64"


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES or dtype in UINT_DTYPES


def is_bool(dtype: str) -> bool:
    return dtype == "bool"
