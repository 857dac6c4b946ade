"""Small helpers for writing one CUDA kernel's source by hand (Theano's
theano.gpuarray.kernel_codegen and fp16_help, issue 31): `nvcc_kernel` wraps a parameter list
and statements into a complete module our compiler builds (symgpu.gpu.runtime.compiler:
``get_prepared_kernel(key, lambda: src, name, ...)``), and the fp16 helpers name the dtype a
kernel computes a stored dtype in and the CUDA functions that convert between the two.

Why: code written against Theano's helpers (custom ops, their kernels) renders the same
kernels here; the module starts with ``common.cuh`` (the half types, ``sg_load``/``sg_store``),
as every module our generator renders, so its text alone keys the compile cache.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from symgpu.gpu.runtime.codegen import common_source, template

__all__ = ["nvcc_kernel", "code_version", "work_dtype", "load_w", "write_w"]


def nvcc_kernel(name: str, params: Sequence[str], body: Iterable[Any]) -> str:
    """The source of a module holding one ``extern "C"`` kernel entry point `name` taking
    `params` (C parameter declarations) whose body is the statements of `body` (strings, or
    lists/tuples of strings one level deep), each ended by ';'."""
    def flat() -> Iterable[str]:
        for b in body:
            if isinstance(b, (list, tuple)):
                yield from b
            else:
                yield b
    return template("kernel_text.cu").substitute(
        common=common_source(), name=name, params=", ".join(params),
        body=";\n    ".join(flat()))


def code_version(version: tuple) -> Callable[[Callable], Callable]:
    """Decorator: record `version` (a tuple) as ``f.code_version``, the part of a cache key
    that says which revision of a code-writing function made a source."""
    if not isinstance(version, tuple):
        raise TypeError(f"code_version: version must be a tuple, got {version!r}")

    def deco(f: Callable) -> Callable:
        f.code_version = version
        return f
    return deco


#: half dtype -> (the dtype its values are computed in, load function, store function):
#: cuda_fp16.h's / cuda_bf16.h's conversions, which common.cuh includes
_HALF = {"float16": ("float32", "__half2float", "__float2half_rn"),
         "bfloat16": ("float32", "__bfloat162float", "__float2bfloat16_rn")}


def work_dtype(dtype: str) -> str:
    """The dtype a kernel computes values of `dtype` in: float32 for the half dtypes (stored
    16-bit, computed 32-bit), `dtype` itself otherwise."""
    return _HALF[dtype][0] if dtype in _HALF else dtype


def load_w(dtype: str) -> str:
    """The CUDA function that turns a stored `dtype` value into its work dtype, for
    ``'%s(ival)' % load_w(dtype)``; '' where the two are the same."""
    return _HALF[dtype][1] if dtype in _HALF else ""


def write_w(dtype: str) -> str:
    """The CUDA function that rounds a work-dtype value to a stored `dtype`, for
    ``'res = %s(oval)' % write_w(dtype)``; '' where the two are the same."""
    return _HALF[dtype][2] if dtype in _HALF else ""
