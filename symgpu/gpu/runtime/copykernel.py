"""The strided device-to-device copy GpuArray uses for non-contiguous views.

Why a kernel: cuMemcpy2D/3D only cover arrays whose innermost axis is contiguous, and a
transpose is not.  One gather/scatter kernel per item size (1, 2, 4, 8 bytes; the dtype does not
matter for a copy) handles any shape and any byte strides, including the negative ones of a
reversed slice.  Axes that are contiguous in both source and destination are merged first, so a
typical copy runs with one or two index divisions per element.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.gpu.runtime.codegen import common_source, template
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.dtypes import dtype_name

__all__ = ["MAX_DIMS", "MAX_JOIN", "STRIDED_COPY_SOURCE", "INC_DTYPES", "collapse_axes",
           "strided_copy", "strided_inc", "strided_join", "join_strides", "prefetch_request"]

MAX_DIMS = 8
#: inputs one strided_join launch copies (codegen/strided_copy.cu's MAX_JOIN)
MAX_JOIN = 8

#: dtype -> CUDA type of the strided "+=" kernels (a copy only needs the item size; the half
#: types add in float32)
INC_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16",
              "float32": "float", "float64": "double", "int8": "signed char",
              "int16": "short", "int32": "int", "int64": "long long",
              "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
              "uint64": "unsigned long long"}

#: one module (codegen/strided_copy.cu): ``dst[...] = src[...]`` per item size
#: (strided_copy_N) and ``dst[...] += src[...]`` per dtype (strided_inc_<dtype>,
#: GpuIncSubtensor), one walk over the strides
STRIDED_COPY_SOURCE = template("strided_copy.cu").substitute(max_dims=MAX_DIMS,
                                                             common=common_source())

_ARG_FORMAT = "PPqq" + "q" * (3 * MAX_DIMS)
_BLOCK = 256
_MAX_BLOCKS = 4096


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
    a broadcast or strided value on the device (symgpu/gpu/exec/prefetch.py compiles it with the
    function's other kernels instead of on the first call)."""
    return (("symgpu.strided_copy",), lambda: STRIDED_COPY_SOURCE, ())


def _launch(ctx: Any, name: str, src_ptr: int, dst_ptr: int, shape: Sequence[int],
            src_strides: Sequence[int], dst_strides: Sequence[int], what: str) -> None:
    size = 1
    for n in shape:
        size *= n
    if size == 0:
        return
    dims, s_str, d_str = collapse_axes(shape, src_strides, dst_strides)
    if len(dims) > MAX_DIMS:
        raise ValueError(f"{what} of shape {tuple(shape)} needs {len(dims)} axes after "
                         f"merging; at most {MAX_DIMS} are supported: do it in pieces")
    pad = [0] * (MAX_DIMS - len(dims))
    meta = [*dims, *[1] * len(pad), *s_str, *pad, *d_str, *pad]
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-size // _BLOCK)))
    fn = get_prepared_kernel(("symgpu.strided_copy",), lambda: STRIDED_COPY_SOURCE, name,
                             _ARG_FORMAT, context=ctx)
    fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, src_ptr, dst_ptr, size,
                           len(dims), *meta)


def strided_copy(ctx: Any, src_ptr: int, dst_ptr: int, shape: Sequence[int],
                 src_strides: Sequence[int], dst_strides: Sequence[int], itemsize: int) -> None:
    """Queue ``dst[...] = src[...]`` on ``ctx``'s stream; strides are in bytes."""
    if itemsize not in (1, 2, 4, 8):
        raise TypeError(f"no strided copy for items of {itemsize} bytes")
    _launch(ctx, f"strided_copy_{itemsize}", src_ptr, dst_ptr, shape, src_strides,
            dst_strides, "a strided copy")


def strided_inc(dst: Any, src: Any) -> None:
    """Queue ``dst[...] += src[...]`` on dst's stream (GpuArrays of equal shapes and dtypes;
    any byte strides, 0 for broadcast source dims, negative for reversed views).
    Destination elements must not repeat (basic indexing never makes them)."""
    dtype = dtype_name(dst.dtype)   # the run-time array's (the caller has no node at hand)
    if dtype not in INC_DTYPES:
        raise TypeError(f"GpuIncSubtensor: no increment kernel for dtype {dtype}")
    _launch(dst.context, f"strided_inc_{dtype}", src.ptr, dst.ptr, dst.shape, src.strides,
            dst.strides, "GpuIncSubtensor: a region")


_JOIN_FORMAT = "Pq" + "q" * (MAX_JOIN + (MAX_JOIN + 1) + 3 * MAX_JOIN + 3)


def join_strides(shape: Sequence[int], strides: Sequence[int], axis: int
                 ) -> tuple[int, int, int] | None:
    """An input of a join seen as (outer, axis, inner): the byte strides of its axes before
    `axis` merged into one, of `axis`, and of its axes after merged into one; None when the
    axes on one side do not merge (a transposed input: it is copied on its own)."""
    def merged(dims: Sequence[int], strs: Sequence[int]) -> int | None:
        out = None   # the stride of the innermost axis of length > 1
        prev_n = prev_s = None
        for n, st in zip(dims, strs):
            if n == 1:
                continue
            if prev_n is not None and prev_s != n * st:
                return None
            prev_n, prev_s, out = n, st, st
        return 0 if out is None else out
    so = merged(shape[:axis], strides[:axis])
    sc = merged(shape[axis + 1:], strides[axis + 1:])
    if so is None or sc is None:
        return None
    return so, strides[axis], sc


def strided_join(ctx: Any, dst_ptr: int, itemsize: int, outer: int, axis_len: int,
                 inner: int, parts: Sequence[tuple[int, int, int, tuple[int, int, int]]]) -> None:
    """Queue a join into the C-contiguous ``dst`` (outer, axis_len, inner) as one launch:
    ``parts`` (at most MAX_JOIN) are (source address, offset along the axis, length along
    it, (outer, axis, inner) byte strides from `join_strides`), covering the axis in order."""
    if itemsize not in (1, 2, 4, 8):
        raise TypeError(f"no strided join for items of {itemsize} bytes")
    parts = [p for p in parts if p[2]]
    if len(parts) > MAX_JOIN:
        raise ValueError(f"a join of {len(parts)} inputs in one launch; at most {MAX_JOIN}")
    n = outer * axis_len * inner
    if n == 0 or not parts:
        return
    pad = MAX_JOIN - len(parts)
    src = [p[0] for p in parts] + [0] * pad
    start = [p[1] for p in parts] + [axis_len] * (pad + 1)
    strides = [[p[3][k] for p in parts] + [0] * pad for k in range(3)]
    ctx.activate()
    fn = get_prepared_kernel(("symgpu.strided_copy",), lambda: STRIDED_COPY_SOURCE,
                             f"strided_join_{itemsize}", _JOIN_FORMAT, context=ctx)
    blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))
    fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, dst_ptr, n, *src, *start,
                           *strides[0], *strides[1], *strides[2], len(parts), axis_len, inner)
