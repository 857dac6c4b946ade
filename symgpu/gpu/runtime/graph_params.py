"""Host scalars as parameters of a CUDA graph: one graph serves every value of an index, a
learning rate or a slice offset.

Why: a graph records kernel arguments by value, so a graph whose kernels took a host scalar
as an argument would only be right for the value it was captured with, and keying graphs on
those values means a training loop that changes its minibatch index never replays one.
Instead, a segment (graph_segment.py) keeps one small device *parameter block*; before each
replay it writes the current values of its host scalars there with ONE stream-ordered
host-to-device copy (``cuMemcpyHtoDAsync`` from pageable memory: the driver has taken the bytes
when the call returns), and the captured kernels read them from the block.

The protocol, on a node's thunk (``graph_segment`` looks for ``param_nbytes``):

* ``param_nbytes``: bytes of its slot in the block (a multiple of 8);
* ``param_values() -> (key_part, bytes)``: from its current input cells, what the graph's key
  must still hold (what changes shapes: a slice's shape and strides, an arange's length) and
  the slot's bytes.  It may raise for bad input (an index out of range): the segment then runs
  plainly and the node raises its own error;
* ``param_slot``: ``None`` normally; while a capture records the node, ``(block, offset)``,
  and the thunk reads its host scalars from ``block.ptr + offset`` on the device.

Only a node whose inputs are all segment inputs (or constants) takes part: its values must be
known before the segment runs; but for the input its thunk names ``param_layout_input`` (its
parameters read that one's layout alone: a slice's offset and shape).  That one may be computed
inside the segment; the thunk then has ``keep_layout`` set and leaves ``seen_layout`` (that
input's context, shape, strides and dtype, and the run's key part) at each run, and
``param_values(stand_in)`` is given :func:`layout_stand_in` of the layout seen under the same
key.  A host input read by any other node of the segment stays in
the key by value (graph_plan.make_keyer).

Kernels here: ``dyn_slice_copy_N`` (JAX's dynamic_slice: a strided copy whose source offset is
read from the block, into a buffer the graph owns), ``arange_dev_T`` (an arange whose start
and step are read from the block), ``pad_prefix_N`` (a sequence's first n rows, n read from
the block, then zeros up to its bucket's length) and ``table_copy`` (byte copies whose
destinations, sources and lengths are read from the block: a chunked loop's staging copies
and results, so a chunk is one upload and one graph launch, not a copy per input and result:
scan_graph.py).
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np

from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.copykernel import MAX_DIMS, STRIDED_COPY_SOURCE, collapse_axes

__all__ = ["PARAMS_SOURCE", "slot_ptr", "pack_int64", "pack_scalar", "dyn_slice_copy",
           "layout_stand_in", "arange_from_params", "pad_prefix", "prefetch_request",
           "load_kernels", "table_copy", "pack_table", "TABLE_ENTRY_BYTES"]

_BLOCK = 256
_MAX_BLOCKS = 4096
_MODULE_KEY = ("symgpu.graph_params",)

#: the strided copy's body, entered at a source offset read from device memory, and an
#: arange whose start and step are read from device memory
_CU = sections("graph_params.cu")
#: an item of each size as a CUDA type (kernels that move items without reading them)
_ITEM_TYPES = ((1, "unsigned char"), (2, "unsigned short"), (4, "unsigned int"),
               (8, "unsigned long long"))
PARAMS_SOURCE = STRIDED_COPY_SOURCE + "".join(
    _CU["dyn_slice"].substitute(n=n, t=t) for n, t in _ITEM_TYPES) + "".join(
    _CU["arange_dev"].substitute(d=d, t=t) for d, t in (("int32", "int"), ("int64", "long long"))) \
    + "".join(_CU["pad_prefix"].substitute(n=n, t=t) for n, t in _ITEM_TYPES) \
    + _CU["table_copy"].substitute()

_COPY_FORMAT = "PPPqq" + "q" * (3 * MAX_DIMS)
_PAD_FORMAT = "PPPqqqq"

_ndarray, _asarray = np.ndarray, np.asarray
_q = struct.Struct("<q")
_qq = struct.Struct("<qq")


def slot_ptr(slot: tuple) -> int:
    """The device address of a ``(block, offset)`` parameter slot."""
    block, offset = slot
    return int(block.ptr) + offset


def pack_int64(*values: int) -> bytes:
    """The bytes of int64 slot values."""
    if len(values) == 1:
        return _q.pack(values[0])
    if len(values) == 2:
        return _qq.pack(*values)
    return struct.pack(f"<{len(values)}q", *values)


def pack_scalar(value: Any, dtype: Any) -> bytes:
    """The bytes of one scalar of ``dtype`` padded to 8 (a slot).  Every replay packs each
    parameter: a 0-d array already of ``dtype`` (a filtered input, a host op's result) gives
    its bytes without going through ``np.asarray``."""
    if value.__class__ is _ndarray and not value.shape and value.dtype == dtype:
        raw = value.tobytes()
    else:
        raw = _asarray(value, dtype=dtype).reshape(()).tobytes()
    pad = -len(raw) % 8
    return raw + b"\0" * pad if pad else raw


def prefetch_request() -> tuple:
    """(key, source factory, options) of this module's kernels (symgpu/gpu/exec/prefetch.py)."""
    return (_MODULE_KEY, lambda: PARAMS_SOURCE, ())


def _kernel(ctx: Any, name: str, fmt: str) -> Any:
    return get_prepared_kernel(_MODULE_KEY, lambda: PARAMS_SOURCE, name, fmt, context=ctx)


def load_kernels(ctx: Any, itemsize: int | None = None, dtype: str | None = None,
                 table: bool = False, pad_itemsize: int | None = None) -> None:
    """Load the kernels a capture will launch (a thunk's ``param_prepare``): no module is
    loaded while a stream captures."""
    if pad_itemsize is not None:
        _kernel(ctx, f"pad_prefix_{pad_itemsize}", _PAD_FORMAT)
    if table:
        _kernel(ctx, "table_copy", "P")
    if itemsize is not None:
        _kernel(ctx, f"dyn_slice_copy_{itemsize}", _COPY_FORMAT)
    if dtype is not None:
        _kernel(ctx, f"arange_dev_{dtype}", "PPq")


def dyn_slice_copy(ctx: Any, base_ptr: int, offset_ptr: int, dst_ptr: int,
                   shape: Sequence[int], src_strides: Sequence[int],
                   dst_strides: Sequence[int], itemsize: int) -> None:
    """Queue ``dst[...] = (base + *offset)[...]`` (byte strides; the byte offset is read on
    the device from ``offset_ptr``, so a captured graph copies whatever slice the parameter
    block names at replay)."""
    if itemsize not in (1, 2, 4, 8):
        raise TypeError(f"no dynamic slice copy for items of {itemsize} bytes")
    size = 1
    for n in shape:
        size *= n
    if size == 0:
        return
    dims, s_str, d_str = collapse_axes(shape, src_strides, dst_strides)
    if not dims:   # one element
        dims, s_str, d_str = [1], [0], [0]
    if len(dims) > MAX_DIMS:
        raise ValueError(f"a dynamic slice of shape {tuple(shape)} needs {len(dims)} axes "
                         f"after merging; at most {MAX_DIMS} are supported")
    pad = [0] * (MAX_DIMS - len(dims))
    meta = [*dims, *[1] * len(pad), *s_str, *pad, *d_str, *pad]
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-size // _BLOCK)))
    _kernel(ctx, f"dyn_slice_copy_{itemsize}", _COPY_FORMAT).prepared_async_call(
        (blocks, 1), (_BLOCK, 1, 1), ctx.stream, base_ptr, offset_ptr, dst_ptr, size,
        len(dims), *meta)


def arange_from_params(ctx: Any, out_ptr: int, params_ptr: int, n: int, dtype: str) -> None:
    """Queue ``out[i] = start + i * step`` for i < n, start and step read on the device as two
    int64 at ``params_ptr``."""
    if n == 0:
        return
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))
    _kernel(ctx, f"arange_dev_{dtype}", "PPq").prepared_async_call(
        (blocks, 1), (_BLOCK, 1, 1), ctx.stream, out_ptr, params_ptr, n)


def pad_prefix(ctx: Any, out_ptr: int, x_ptr: int, n_ptr: int, n: int, rows: int, row: int,
               x_row: int, itemsize: int) -> None:
    """Queue ``out[:n] = x[:n]; out[n:] = 0`` for ``out`` of ``rows`` C-contiguous rows of
    ``row`` items and ``x``'s rows ``x_row`` items apart; ``n`` is read on the device at
    ``n_ptr`` (a parameter slot) unless that is 0, then ``n`` is passed."""
    if itemsize not in (1, 2, 4, 8):
        raise TypeError(f"no padded copy for items of {itemsize} bytes")
    total = rows * row
    if total == 0:
        return
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-total // _BLOCK)))
    _kernel(ctx, f"pad_prefix_{itemsize}", _PAD_FORMAT).prepared_async_call(
        (blocks, 1), (_BLOCK, 1, 1), ctx.stream, out_ptr, x_ptr, n_ptr, n, rows, row, x_row)


#: bytes of one table_copy entry: destination, source, length (three int64)
TABLE_ENTRY_BYTES = 24


def pack_table(values: Sequence[int]) -> bytes:
    """The bytes of table_copy entries given flat as (dst, src, nbytes, dst, src, ...)."""
    return struct.pack(f"<{len(values)}q", *values)


def table_copy(ctx: Any, table_ptr: int, entries: int, max_bytes: int) -> None:
    """Queue the ``entries`` copies described at ``table_ptr`` (TABLE_ENTRY_BYTES each, read
    on the device when the launch runs, so a captured graph copies whatever the block names at
    replay); ``max_bytes`` sizes the grid (any length is still copied whole)."""
    if entries <= 0:
        return
    if entries > 65535:
        raise ValueError(f"table_copy: {entries} entries; at most 65535 per launch")
    ctx.activate()
    blocks = max(1, min(_MAX_BLOCKS, -(-max_bytes // (16 * _BLOCK))))
    _kernel(ctx, "table_copy", "P").prepared_async_call(
        (blocks, entries), (_BLOCK, 1, 1), ctx.stream, table_ptr)


def layout_stand_in(ctx: Any, shape: tuple, strides: tuple, dtype: np.dtype) -> Any:
    """An array of this layout over no memory (pointer 0): what ``param_values`` reads of an
    input a segment computes (its views' offsets from the pointer, its bounds)."""
    arr = GpuArray.__new__(GpuArray)
    arr._set(ctx, 0, shape, strides, dtype, None)
    return arr
