"""Dtype facts for generated CUDA: storage and value types, literals, reduction identities.

Why two C types per dtype: float16 (bfloat16) is *stored* as ``__half`` (``__nv_bfloat16``) but
*computed* in ``float`` (the
scalar table's expressions are written for float/double), so every operand has a storage type
(what memory holds) and a value type (what the generated expression works in); ``sg_load`` and
``sg_store`` in ``common.cuh`` convert between them.
"""
from __future__ import annotations

import math

import numpy as np

from symgpu.scalar.dtypes import C_TYPES, FLOAT_DTYPES, HALF_DTYPES

__all__ = ["storage_ctype", "value_ctype", "literal", "SUPPORTED", "acc_ctype_for",
           "is_float_dtype"]

#: dtypes the generator handles (complex has no CUDA table entries)
SUPPORTED = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "bfloat16", "float32", "float64")


def is_float_dtype(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def storage_ctype(dtype: str) -> str:
    """The C type that holds one element of ``dtype`` in device memory."""
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype!r} has no CUDA representation; GPU kernels support "
                        f"{', '.join(SUPPORTED)}") from None


def value_ctype(dtype: str) -> str:
    """The C type generated expressions compute ``dtype`` values in (float for float16)."""
    return "float" if dtype in HALF_DTYPES else storage_ctype(dtype)


def _float_literal(value: float, dtype: str) -> str:
    single = dtype != "float64"
    if math.isnan(value):
        return "__int_as_float(0x7fc00000)" if single else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(value):
        body = "__int_as_float(0x7f800000)" if single else "__longlong_as_double(0x7ff0000000000000LL)"
        return f"(-{body})" if value < 0 else body
    if single:
        text = repr(float(np.float32(value)))
        text = text if ("e" in text or "." in text) else text + ".0"
        return f"{text}f"
    text = repr(float(value))
    return text if ("e" in text or "." in text) else text + ".0"


def literal(value, dtype: str) -> str:
    """A C literal of ``value`` in the value type of ``dtype`` (exact, NaN/inf safe)."""
    if dtype == "bool":
        return "true" if bool(value) else "false"
    if dtype in HALF_DTYPES:
        # the value the dtype holds (0.1 is 0.10009765625 in bfloat16), as the CPU's constant
        with np.errstate(over="ignore"):      # past the dtype's range: inf, as it holds
            held = np.asarray(value, dtype=dtype).astype(np.float32)
        return _float_literal(float(held), dtype)
    if is_float_dtype(dtype):
        return _float_literal(float(value), dtype)
    v = int(value)
    if dtype in ("int64",):
        if v == -(1 << 63):
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL"
    if dtype == "uint64":
        return f"{v}ULL"
    if dtype in ("uint32", "uint16", "uint8"):
        return f"{v}u"
    if v == -(1 << 31):
        return "(-2147483647 - 1)"
    return f"({storage_ctype(dtype)})({v})" if dtype in ("int8", "int16") else str(v)


def acc_ctype_for(dtype: str) -> tuple[str, str]:
    """(accumulator dtype, its C type) for reducing values of ``dtype``: a type that
    ``__shfl_down_sync`` can move (32/64-bit ints, float, double)."""
    if dtype in HALF_DTYPES:
        return "float32", "float"
    if dtype == "bool" or dtype in ("int8", "int16"):
        return "int32", "int"
    if dtype in ("uint8", "uint16"):
        return "uint32", "unsigned int"
    return dtype, storage_ctype(dtype)
