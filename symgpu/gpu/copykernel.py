"""The strided device-to-device copy GpuArray uses for non-contiguous views.

Why a kernel: cuMemcpy2D/3D only cover arrays whose innermost axis is contiguous, and a
transpose is not.  One gather/scatter kernel per item size (1, 2, 4, 8 bytes; the dtype does not
matter for a copy) handles any shape and any byte strides, including the negative ones of a
reversed slice.  Axes that are contiguous in both source and destination are merged first, so a
typical copy runs with one or two index divisions per element.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["MAX_DIMS", "STRIDED_COPY_SOURCE", "collapse_axes", "strided_copy",
           "prefetch_request"]

MAX_DIMS = 8

STRIDED_COPY_SOURCE = r"""
#define MAX_DIMS 8

struct CopyMeta {
    long long shape[MAX_DIMS];
    long long src_stride[MAX_DIMS];   /* bytes */
    long long dst_stride[MAX_DIMS];   /* bytes */
};

template <typename T>
__device__ __forceinline__ void strided_copy_body(const char *src, char *dst, long long n,
                                                  int ndim, const CopyMeta &m)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rest = i, s = 0, d = 0;
        for (int k = ndim - 1; k >= 0; --k) {
            const long long idx = rest % m.shape[k];
            rest /= m.shape[k];
            s += idx * m.src_stride[k];
            d += idx * m.dst_stride[k];
        }
        *reinterpret_cast<T *>(dst + d) = *reinterpret_cast<const T *>(src + s);
    }
}

extern "C" __global__ void strided_copy_1(const char *src, char *dst, long long n,
                                          long long ndim, CopyMeta m)
{ strided_copy_body<unsigned char>(src, dst, n, (int)ndim, m); }

extern "C" __global__ void strided_copy_2(const char *src, char *dst, long long n,
                                          long long ndim, CopyMeta m)
{ strided_copy_body<unsigned short>(src, dst, n, (int)ndim, m); }

extern "C" __global__ void strided_copy_4(const char *src, char *dst, long long n,
                                          long long ndim, CopyMeta m)
{ strided_copy_body<unsigned int>(src, dst, n, (int)ndim, m); }

extern "C" __global__ void strided_copy_8(const char *src, char *dst, long long n,
                                          long long ndim, CopyMeta m)
{ strided_copy_body<unsigned long long>(src, dst, n, (int)ndim, m); }
"""

_ARG_FORMAT = "PPqq" + "q" * (3 * MAX_DIMS)
_BLOCK = 256
_MAX_BLOCKS = 4096
_prepared: dict[tuple[int, int], Any] = {}


def collapse_axes(shape: Sequence[int], src: Sequence[int],
                  dst: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Drop length-1 axes and merge neighbours that are contiguous in both stride sets."""
    out_shape: list[int] = []
    out_src: list[int] = []
    out_dst: list[int] = []
    for n, s, d in zip(shape, src, dst):
        if n == 1:
            continue
        if out_shape and out_src[-1] == n * s and out_dst[-1] == n * d:
            out_shape[-1] *= n
            out_src[-1], out_dst[-1] = s, d
        else:
            out_shape.append(n)
            out_src.append(s)
            out_dst.append(d)
    return out_shape, out_src, out_dst


def prefetch_request() -> tuple:
    """(key, source factory, options) of the strided-copy module, for the ops that will copy
    a broadcast or strided value on the device (symgpu/gpu/prefetch.py compiles it with the
    function's other kernels instead of on the first call)."""
    return (("symgpu.strided_copy",), lambda: STRIDED_COPY_SOURCE, ())


def _kernel(ctx: Any, itemsize: int) -> Any:
    fn = _prepared.get((id(ctx), itemsize))
    if fn is None:
        from symgpu.gpu.compiler import get_kernel
        fn = get_kernel(("symgpu.strided_copy", itemsize), lambda: STRIDED_COPY_SOURCE,
                        f"strided_copy_{itemsize}", context=ctx)
        fn.prepare(_ARG_FORMAT)
        _prepared[(id(ctx), itemsize)] = fn
    return fn


def strided_copy(ctx: Any, src_ptr: int, dst_ptr: int, shape: Sequence[int],
                 src_strides: Sequence[int], dst_strides: Sequence[int], itemsize: int) -> None:
    """Queue ``dst[...] = src[...]`` on ``ctx``'s stream; strides are in bytes."""
    size = 1
    for n in shape:
        size *= n
    if size == 0:
        return
    dims, s_str, d_str = collapse_axes(shape, src_strides, dst_strides)
    if len(dims) > MAX_DIMS:
        raise ValueError(f"strided copy of shape {tuple(shape)} needs {len(dims)} axes after "
                         f"merging; at most {MAX_DIMS} are supported: copy it in pieces")
    if itemsize not in (1, 2, 4, 8):
        raise TypeError(f"no strided copy for items of {itemsize} bytes")
    pad = [0] * (MAX_DIMS - len(dims))
    meta = [*dims, *[1] * len(pad), *s_str, *pad, *d_str, *pad]
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-size // _BLOCK)))
    _kernel(ctx, itemsize).prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream,
                                               src_ptr, dst_ptr, size, len(dims), *meta)
