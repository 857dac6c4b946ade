"""GPU sort, argsort and topk (issue 33): GpuSort, GpuArgSort, GpuTopK, and the gradients'
GpuPermuteAlongAxis and GpuScatterAlongAxis, lifted from the host ops of
symgpu/tensor/extra_ops.py and symgpu/tensor/sort.py.

Why this shape: the sorts are CUB's device-wide radix sorts (cub::DeviceRadixSort for one
row, cub::DeviceSegmentedSort's stable sorts for many), built once into a host shared
library (codegen/sort_lib.cu, runtime/shared_library.py) and called through ctypes with their
temporary storage from the context's pool: a thunk queues work on the context's stream,
never syncs and allocates only from the pool, so it is captured with the CUDA graph.
NumPy's order differs from CUB's bits in two places: NaNs (CUB puts the sign-bit NaNs first)
and -0.0 (before +0.0 for CUB, tied for a stable argsort). A one-row float sort, the
benchmarked case, runs CUB on the values and moves a leading NaN block to the end by two
launches that return at once when there is none; argsorts and many-row float sorts sort
codegen/sort.cu's ordered unsigned keys instead. topk is a radix select (sort.cu): a
histogram pass per 8-bit digit over the rows, a pick of the k-th key's digit, a gather of
the selected keys, then (sorted=True) a CUB sort of the k results. A sort along another axis
runs on a transposed contiguous copy, its result copied back.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import threading
from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen import common_source, sections, text
from symgpu.gpu.runtime.codegen.types import storage_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.shared_library import load_shared_library, shared_library_in_background
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import INT_DTYPES, UINT_DTYPES, is_float
from symgpu.tensor.extra_ops import ArgSort, PermuteAlongAxis, Sort
from symgpu.tensor.sort import ScatterAlongAxis, TopKOp
from symgpu.tensor.type import as_tensor_variable

__all__ = ["GpuSort", "GpuArgSort", "GpuTopK", "GpuPermuteAlongAxis", "GpuScatterAlongAxis",
           "SORT_DTYPES", "sort_source", "sort_library", "SortError"]

#: the key dtypes sorted on the GPU (others stay on the host)
SORT_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
#: index dtypes of the gathers and scatters along an axis
ALONG_INDEX_DTYPES = ("int32", "int64")
#: the dtypes CUB sorts as they are (codes of sort_lib.cu); the half types sort as ordered
#: uint32 keys (sort.cu: their 16 bits zero-extended)
_CODES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3, "uint32": 4, "uint64": 5}
_UNSIGNED = {2: "uint32", 4: "uint32", 8: "uint64"}
_BLOCK = 256
_MAX_BLOCKS = 2048        # about 16 blocks of 256 threads per SM of an H200: one wave
_MAX_Y = 65535
_MODULE_KEY = ("symgpu.sort",)
_lib_lock = threading.Lock()
_lib: list[Any] = []


class SortError(RuntimeError):
    """A CUB sort in the shared library returned a CUDA error."""


def sort_source() -> str:
    """The CUDA module of every sort/topk/gather kernel (all key and index dtypes)."""
    cu = sections("sort.cu")
    parts = [cu[""].substitute(), cu["pick"].substitute()]
    parts.insert(0, common_source())
    for dn in SORT_DTYPES:
        t, u = storage_ctype(dn), storage_ctype(_UNSIGNED[np.dtype(dn).itemsize])
        parts.append(cu["keys"].substitute(dn=dn, t=t, u=u))
        if is_float(dn):
            parts.append(cu["floats"].substitute(dn=dn, t=t, u=u))
            if dn in _CODES:     # CUB sorts the values of one row (gpu_sort's fast path)
                parts.append(cu["nan_shift"].substitute(dn=dn, t=t, u=u))
        for idn in INT_DTYPES + UINT_DTYPES:
            parts.append(cu["indexed"].substitute(dn=dn, t=t, idn=idn, it=storage_ctype(idn)))
        for idn in ALONG_INDEX_DTYPES:
            parts.append(cu["along"].substitute(dn=dn, t=t, idn=idn, it=storage_ctype(idn)))
    return "".join(parts)


def sort_library() -> Any:
    """The CUB sort library (codegen/sort_lib.cu), built and loaded on first use."""
    if _lib:
        return _lib[0]
    with _lib_lock:
        if not _lib:
            lib = load_shared_library(text("sort_lib.cu"), ("-O3",))
            lib.symgpu_sort.argtypes = [ctypes.c_int, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int,
                                        ctypes.c_void_p]
            lib.symgpu_sort.restype = ctypes.c_int
            lib.symgpu_sort_error_string.argtypes = [ctypes.c_int]
            lib.symgpu_sort_error_string.restype = ctypes.c_char_p
            _lib.append(lib)
    return _lib[0]


def _start_library_build() -> None:
    """Build the library on a background thread while linking goes on (the prefetch)."""
    if _lib:
        return
    global _executor
    with _lib_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, "symgpu-sort-lib")
    shared_library_in_background(text("sort_lib.cu"), ("-O3",), "sm_90", _executor)


_executor: Any = None


# ----------------------------------------------------------------------------- device calls

def _launch(ctx: Any, name: str, signature: str, total: int, args: tuple, rows_y: int = 1
            ) -> None:
    fn = get_prepared_kernel(_MODULE_KEY, sort_source, name, signature, context=ctx)
    blocks = max(1, min(-(-max(total, 1) // _BLOCK), max(1, _MAX_BLOCKS // rows_y)))
    fn.prepared_async_call((blocks, rows_y), (_BLOCK, 1, 1), ctx.stream, *args)


def cub_sort(op: Any, ctx: Any, plans: dict, code: int, keys_in: int, keys_out: int,
             vals_in: int | None, vals_out: int | None, rows: int, n: int,
             descending: bool = False) -> None:
    """One library sort of `rows` rows of `n` keys (dtype code, see sort_lib.cu), with int64
    values when given; its temporary storage (asked once per geometry) from the pool."""
    lib = sort_library()
    stream = ctypes.c_void_p(ctx.stream_handle or None)
    key = (code, vals_in is not None, rows, n, descending)
    need = plans.get(key)
    args = (keys_in, keys_out, vals_in, vals_out, rows, n, int(descending), stream)
    if need is None:
        size = ctypes.c_size_t(0)
        _check(op, lib, lib.symgpu_sort(code, None, ctypes.byref(size), *args), rows, n, code)
        need = plans[key] = size.value
    temp = ctx.pool.allocate(max(need, 1))
    size = ctypes.c_size_t(need)
    _check(op, lib, lib.symgpu_sort(code, temp.ptr, ctypes.byref(size), *args), rows, n, code)


def _check(op: Any, lib: Any, status: int, rows: int, n: int, code: int) -> None:
    if status:
        dtype = next(k for k, v in _CODES.items() if v == code)
        raise SortError(f"{op}: CUB's sort of {rows} row(s) of {n} {dtype} keys failed: "
                        f"{lib.symgpu_sort_error_string(status).decode()} (cudaError {status})")


def _rows(ctx: Any, x: Any, axis: int) -> tuple[Any, tuple[int, ...]]:
    """x with `axis` last, C-contiguous (a copy when it was not already), and the
    permutation that moved it."""
    nd = x.ndim
    perm = tuple(i for i in range(nd) if i != axis) + (axis,)
    if axis == nd - 1 and x.is_c_contiguous:
        return x, perm
    view = x.transpose(perm)
    out = new_array(ctx, view.shape, x.dtype)
    out._copy_from_device(view)
    return out, perm


def _unrows(ctx: Any, y: Any, perm: tuple[int, ...]) -> Any:
    """y (axes in `perm`'s order) back in the original order, C-contiguous."""
    if perm == tuple(range(len(perm))):
        return y
    view = y.transpose(tuple(int(i) for i in np.argsort(perm)))
    out = new_array(ctx, view.shape, y.dtype)
    out._copy_from_device(view)
    return out


def _udtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(_UNSIGNED[dtype.itemsize])


def gpu_sort(op: Any, ctx: Any, plans: dict, x: Any, axis: int, indices: bool) -> Any:
    """np.sort (indices=False) or a stable np.argsort (int64) of GPU array x along `axis`."""
    xr, perm = _rows(ctx, x, axis)
    n = xr.shape[-1]
    rows = xr.size // n if n else 0
    dtype, name = xr.dtype, xr.dtype.name
    out = new_array(ctx, xr.shape, np.dtype("int64") if indices else dtype)
    if out.size == 0:
        return _unrows(ctx, out, perm)
    floats = is_float(name)
    total = rows * n
    if indices:
        iota = new_array(ctx, xr.shape, np.dtype("int64"))
        keys, code = xr, _CODES.get(name)
        if floats:      # NumPy's order, -0.0 tied with +0.0, as unsigned keys
            keys = new_array(ctx, xr.shape, _udtype(dtype))
            code = _CODES[keys.dtype.name]
        _launch(ctx, f"sort_prep_pairs_{name}", "PPPqq", total,
                (xr.ptr, keys.ptr if floats else 0, iota.ptr, total, n))
        sorted_keys = new_array(ctx, xr.shape, keys.dtype)
        cub_sort(op, ctx, plans, code, keys.ptr, sorted_keys.ptr, iota.ptr, out.ptr, rows, n)
    elif not floats:
        cub_sort(op, ctx, plans, _CODES[name], xr.ptr, out.ptr, None, None, rows, n)
    elif rows == 1 and name in _CODES:
        # the fast path: CUB on the values, then any sign-bit NaNs moved last
        cub_sort(op, ctx, plans, _CODES[name], xr.ptr, out.ptr, None, None, 1, n)
        scratch, count = new_array(ctx, (n,), dtype), ctx.pool.allocate(8)
        _launch(ctx, f"sort_nan_shift_out_{name}", "PPPq", n,
                (out.ptr, scratch.ptr, count.ptr, n))
        _launch(ctx, f"sort_nan_shift_back_{name}", "PPPq", n,
                (out.ptr, scratch.ptr, count.ptr, n))
    else:
        keys = new_array(ctx, xr.shape, _udtype(dtype))
        _launch(ctx, f"sort_to_keys_{name}", "PPq", total, (xr.ptr, keys.ptr, total))
        # the sorted keys land in the output when they have its item size (turned back into
        # values in place); a half type's 32-bit keys need their own array
        done = out if keys.dtype.itemsize == dtype.itemsize else \
            new_array(ctx, xr.shape, keys.dtype)
        cub_sort(op, ctx, plans, _CODES[keys.dtype.name], keys.ptr, done.ptr, None, None,
                 rows, n)
        _launch(ctx, f"sort_from_keys_{name}", "PPq", total, (done.ptr, out.ptr, total))
    return _unrows(ctx, out, perm)


def gpu_topk(op: Any, ctx: Any, plans: dict, x: Any, axis: int, kth: int, ordered: bool,
             values: bool, indices: bool, idx_dtype: str) -> list[Any]:
    """The |kth| largest (kth > 0) or smallest (kth < 0) along `axis` of GPU array x: a radix
    select (see the module docstring); [values][, indices]."""
    n = x.shape[axis]
    if kth == 0:
        raise ValueError(f"{op}: kth must not be 0 (x of shape {x.shape}, dtype {x.dtype})")
    k = abs(kth)
    if k > n:
        raise ValueError(f"{op}: |kth| = {k} is larger than the length {n} of axis {axis} "
                         f"of x (shape {x.shape}, dtype {x.dtype})")
    xr, perm = _rows(ctx, x, axis)
    rows = xr.size // n if n else 0
    name, udt = xr.dtype.name, _udtype(xr.dtype)
    shape = xr.shape[:-1] + (k,)
    vals = new_array(ctx, shape, xr.dtype) if values else None
    idx = new_array(ctx, shape, np.dtype(idx_dtype)) if indices else None
    if rows:
        state = ctx.pool.allocate(rows * 5 * 8)
        hist = ctx.pool.allocate(rows * 256 * 8)
        rows_y = min(rows, _MAX_Y)
        _launch(ctx, "topk_init", "PPqq", rows * 256, (state.ptr, hist.ptr, rows, k))
        smallest = int(kth < 0)
        for shift in range(xr.dtype.itemsize * 8 - 8, -1, -8):
            _launch(ctx, f"topk_hist_{name}", "PqqiPPi", n,
                    (xr.ptr, rows, n, smallest, state.ptr, hist.ptr, shift), rows_y)
            get_prepared_kernel(_MODULE_KEY, sort_source, "topk_pick", "PPqi",
                                context=ctx).prepared_async_call(
                (min(rows, 2 ** 31 - 1), 1), (_BLOCK, 1, 1), ctx.stream, state.ptr, hist.ptr,
                rows, shift)
        keys = new_array(ctx, shape, udt)
        chosen = new_array(ctx, shape, np.dtype("int64"))
        _launch(ctx, f"topk_gather_{name}", "PqqqiPPP", n,
                (xr.ptr, rows, n, k, smallest, state.ptr, keys.ptr, chosen.ptr), rows_y)
        if ordered and k > 1:
            keys2 = new_array(ctx, shape, udt)
            chosen2 = new_array(ctx, shape, np.dtype("int64"))
            cub_sort(op, ctx, plans, _CODES[udt.name], keys.ptr, keys2.ptr, chosen.ptr,
                     chosen2.ptr, rows, k, descending=True)
            chosen = chosen2
        _launch(ctx, f"topk_finish_{name}_{idx_dtype}", "PPqqqPP", rows * k,
                (xr.ptr, chosen.ptr, rows, n, k, vals.ptr if values else 0,
                 idx.ptr if indices else 0))
    return [_unrows(ctx, a, perm) for a in (vals, idx) if a is not None]


def gpu_along(ctx: Any, kind: str, src: Any, idx: Any, axis: int, out_len: int) -> Any:
    """take (out[.., j, ..] = src[.., idx[.., j, ..], ..]) or put (zeros with out[.., idx,
    ..] = src) along `axis`; the result has idx's shape with `out_len` along the axis."""
    sr, perm = _rows(ctx, src, axis)
    ir, _ = _rows(ctx, idx, axis)
    shape = ir.shape[:-1] + (out_len,)
    out = new_array(ctx, shape if kind == "put" else ir.shape, sr.dtype)
    n_src, n_idx = sr.shape[-1], ir.shape[-1]
    rows = ir.size // n_idx if n_idx else 0
    name = f"{kind}_last_{sr.dtype.name}_{ir.dtype.name}"
    if kind == "put":
        if out.size:
            out.fill(0)
        if rows:
            _launch(ctx, name, "PPPqqq", rows * n_idx,
                    (sr.ptr, ir.ptr, out.ptr, rows, out_len, n_idx))
    elif rows:
        _launch(ctx, name, "PPPqqq", rows * n_idx,
                (sr.ptr, ir.ptr, out.ptr, rows, n_src, n_idx))
    return _unrows(ctx, out, perm)


# ----------------------------------------------------------------------------- the ops

class _GpuSortOp(Op):
    """make_thunk: the node's inputs' cells to `_run(ctx, plans, values)`, its outputs."""

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return [(_MODULE_KEY, sort_source, ())]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        if self.uses_library:
            _start_library_build()
        cells = [storage_map[v] for v in node.inputs]
        outs = [storage_map[v] for v in node.outputs]
        plans: dict[tuple, int] = {}

        def thunk() -> None:
            ctx.activate()
            for cell, value in zip(outs, self._run(ctx, plans, [c[0] for c in cells])):
                cell[0] = value

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        return thunk

    uses_library = True


def _gpu_key_var(op: Any, x: Any, ctx: Any = None) -> Any:
    x = as_gpuarray_variable(x, ctx if ctx is not None else getattr(x.type, "context_name",
                                                                        None))
    if x.dtype not in SORT_DTYPES:
        raise TypeError(f"{op}: keys must be one of {SORT_DTYPES} on the GPU, got {x} "
                        f"({x.type})")
    return x


class GpuSort(_GpuSortOp):
    """np.sort along `axis` of a GPU array (Sort's parameters)."""

    __props__ = ("axis",)

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"GpuSort{{{self.axis}}}"

    infer_shape = Sort.infer_shape

    def make_node(self, x: Any) -> Apply:
        x = _gpu_key_var(self, x)
        if not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x} ({x.type})")
        return Apply(self, [x], [x.type()])

    def _run(self, ctx, plans, inputs):
        return [gpu_sort(self, ctx, plans, inputs[0], self.axis, False)]


class GpuArgSort(GpuSort):
    """A stable np.argsort along `axis` of a GPU array (int64 indices)."""

    def __str__(self) -> str:
        return f"GpuArgSort{{{self.axis}}}"

    def make_node(self, x: Any) -> Apply:
        node = GpuSort.make_node(self, x)
        x = node.inputs[0]
        out = GpuArrayType("int64", x.broadcastable, x.type.context_name)
        return Apply(self, [x], [out()])

    def _run(self, ctx, plans, inputs):
        return [gpu_sort(self, ctx, plans, inputs[0], self.axis, True)]


class GpuTopK(_GpuSortOp):
    """TopKOp on a GPU array: inputs (x on the GPU, kth a host integer scalar), outputs as
    TopKOp's (values and/or indices of `idx_dtype`)."""

    __props__ = ("axis", "sorted", "return_values", "return_indices", "idx_dtype")

    def __init__(self, axis: int, sorted: bool = True, idx_dtype: str = "int64",
                 return_values: bool = True, return_indices: bool = True):
        self.axis, self.sorted, self.idx_dtype = int(axis), bool(sorted), idx_dtype
        self.return_values, self.return_indices = bool(return_values), bool(return_indices)

    def __str__(self) -> str:
        return f"GpuTopK{{axis={self.axis}, sorted={self.sorted}}}"

    def _host_op(self) -> TopKOp:
        return TopKOp(self.axis, self.sorted, self.idx_dtype, self.return_values,
                      self.return_indices)

    def infer_shape(self, fgraph, node, input_shapes):
        return TopKOp.infer_shape(self._host_op(), fgraph, node, input_shapes)

    def connection_pattern(self, node):
        return [[True] * len(node.outputs), [False] * len(node.outputs)]

    def make_node(self, x: Any, kth: Any) -> Apply:
        x, kth = _gpu_key_var(self, x), as_tensor_variable(kth)
        host = self._host_op().make_node(x, kth)     # TopKOp's checks of axis and kth
        ctx = x.type.context_name
        outs = [GpuArrayType(v.dtype, v.broadcastable, ctx)() for v in host.outputs]
        return Apply(self, [x, kth], outs)

    def _run(self, ctx, plans, inputs):
        x, kth = inputs
        return gpu_topk(self, ctx, plans, x, self.axis % x.ndim, int(np.asarray(kth)),
                        self.sorted, self.return_values, self.return_indices, self.idx_dtype)


class GpuPermuteAlongAxis(_GpuSortOp):
    """PermuteAlongAxis on the GPU: np.take_along_axis(values, perm, axis)."""

    __props__ = ("axis",)
    uses_library = False

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"GpuPermuteAlongAxis{{{self.axis}}}"

    infer_shape = PermuteAlongAxis.infer_shape

    def make_node(self, values: Any, perm: Any) -> Apply:
        values = _gpu_key_var(self, values)
        perm = as_gpuarray_variable(perm, values.type.context_name)
        if perm.dtype not in ALONG_INDEX_DTYPES or perm.ndim != values.ndim:
            raise TypeError(f"{self}: the permutation must be an int32/int64 array of "
                            f"{values.ndim} dimensions, got {perm} ({perm.type})")
        return Apply(self, [values, perm], [values.type()])

    def _run(self, ctx, plans, inputs):
        values, perm = inputs
        if values.shape != perm.shape:
            raise ValueError(f"{self}: values of shape {values.shape} and permutation of "
                             f"shape {perm.shape} differ")
        return [gpu_along(ctx, "take", values, perm, self.axis, values.shape[self.axis])]


class GpuScatterAlongAxis(GpuPermuteAlongAxis):
    """ScatterAlongAxis on the GPU: zeros of x's shape with gz put at idx along `axis`."""

    def __str__(self) -> str:
        return f"GpuScatterAlongAxis{{{self.axis}}}"

    infer_shape = ScatterAlongAxis.infer_shape

    def make_node(self, x: Any, idx: Any, gz: Any) -> Apply:
        host = ScatterAlongAxis(self.axis).make_node(x, idx, gz)   # its checks
        ctx = next(getattr(v.type, "context_name", None) for v in (gz, x, idx)
                   if hasattr(v.type, "context_name"))
        x, idx = as_gpuarray_variable(x, ctx), as_gpuarray_variable(idx, ctx)
        gz = _gpu_key_var(self, gz, ctx)
        if idx.dtype not in ALONG_INDEX_DTYPES:
            raise TypeError(f"{self}: the indices must be int32/int64, got {idx} ({idx.type})")
        out = GpuArrayType(gz.dtype, host.outputs[0].broadcastable, ctx)
        return Apply(self, [x, idx, gz], [out()])

    def _run(self, ctx, plans, inputs):
        x, idx, gz = inputs
        if idx.shape != gz.shape:
            raise ValueError(f"{self}: indices of shape {idx.shape} and gradient of shape "
                             f"{gz.shape} differ")
        out = gpu_along(ctx, "put", gz, idx, self.axis, x.shape[self.axis])
        if out.shape != x.shape:
            raise ValueError(f"{self}: indices of shape {idx.shape} do not fit x of shape "
                             f"{x.shape} along axis {self.axis}")
        return [out]


# ----------------------------------------------------------------------------- lifters

@register_lifter(Sort)
def lift_sort(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """Sort -> GpuSort for the key dtypes CUB sorts here (any kind: the GPU's is stable)."""
    if node.inputs[0].dtype not in SORT_DTYPES:
        return None
    return [GpuSort(op.axis)(inputs[0])]


@register_lifter(ArgSort)
def lift_argsort(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    if node.inputs[0].dtype not in SORT_DTYPES:
        return None
    return [GpuArgSort(op.axis)(inputs[0])]


@register_lifter(TopKOp)
def lift_topk(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    if node.inputs[0].dtype not in SORT_DTYPES:
        return None
    gop = GpuTopK(op.axis, op.sorted, op.idx_dtype, op.return_values, op.return_indices)
    return list(gop.make_node(inputs[0], inputs.host(1)).outputs)


@register_lifter(PermuteAlongAxis)
def lift_permute_along_axis(op: Any, node: Apply, context_name: Any,
                            inputs: Any) -> list[Any] | None:
    values, perm = node.inputs
    if values.dtype not in SORT_DTYPES or perm.dtype not in ALONG_INDEX_DTYPES:
        return None
    return [GpuPermuteAlongAxis(op.axis)(inputs[0], inputs[1])]


@register_lifter(ScatterAlongAxis)
def lift_scatter_along_axis(op: Any, node: Apply, context_name: Any,
                            inputs: Any) -> list[Any] | None:
    x, idx, gz = node.inputs
    if gz.dtype not in SORT_DTYPES or idx.dtype not in ALONG_INDEX_DTYPES:
        return None
    return [GpuScatterAlongAxis(op.axis)(inputs[0], inputs[1], inputs[2])]
