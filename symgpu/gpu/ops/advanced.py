"""Advanced indexing on axis 0 and batched matmul on the GPU: GpuAdvancedSubtensor1 (gather
``x[idx]``), GpuAdvancedIncSubtensor1 (``set_subtensor``/``inc_subtensor`` of ``x[idx]``) and
GpuBatchedDot (MatMul of two 3-d stacks through cublas<S|D>gemmStridedBatched; float16 and
bfloat16 stacks through cuBLASLt's strided batches with float32 accumulation, else
cublasGemmStridedBatchedEx), with lifters.

Only the common index form is lifted: the CPU op's ``idx_list`` is exactly one symbolic
integer vector (int32/int64) on axis 0 followed by nothing or full slices
(``x[idx]``, ``x[idx, :]``); any other advanced index stays on the CPU.

The index vector lives on the device. Negative indices count from the end (NumPy); every
index is bounds-checked by the kernel, which reports a bad one into its node's slot
(symgpu/gpu/runtime/device_checks.py): ``IndexError`` naming the index and the length of axis 0 is
raised at the next synchronisation (in the same call when its results come back to the
host), so the ops need no sync of their own and are captured into CUDA graphs.

Inc uses ``atomicAdd`` (float, double, int; int64 through ``unsigned long long``, which wraps
like two's complement), so repeated indices accumulate exactly as ``np.add.at``. Set writes
plainly: with repeated indices WHICH write lands is unspecified (NumPy's "last one wins" is
not guaranteed on the GPU). Both work on a copy of ``x``, never in place.

GpuGer (the rank-1 update) lives with the other cuBLAS ops in blas.py.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops import elemwise as elemwise_ops
from symgpu.gpu.ops import blaslt
from symgpu.gpu.ops.blas import (BLAS_DTYPES, GEMM_DTYPES, _blas_matrix, _check_int, _colmajor,
                                 _ctx_name, cublas, gemm_math_mode)
from symgpu.gpu.ops.elemwise import _virtual_thunk, gpu_elemwise
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray, new_array
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import (DeviceChecked, REPORT_SOURCE, launch_checked,
                                              new_error_buffer, read_error)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.math import MatMul as _MatMul
from symgpu.tensor.subtensor import (AdvancedIncSubtensor as _AdvancedIncSubtensor,
                                     AdvancedSubtensor as _AdvancedSubtensor, Slice, SYM)

__all__ = ["GpuAdvancedSubtensor1", "GpuAdvancedIncSubtensor1", "GpuBatchedDot",
           "ADVANCED_DTYPES", "INDEX_DTYPES", "advanced_source", "gpu_batched_dot",
           "ERROR_REPORT_SOURCE", "new_error_buffer", "read_error",
           "check_and_convert_boolean_masks"]

#: value dtype -> CUDA type of the gather/scatter kernels (the half types' increments are
#: atomicAdd's, rounded once as the elementwise add rounds)
ADVANCED_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
                   "float64": "double", "int32": "int", "int64": "long long"}
#: index dtype -> CUDA type
INDEX_DTYPES = {"int32": "int", "int64": "long long"}

_BLOCK = 256
_MAX_BLOCKS = 4096
_FULL = Slice(None, None, None)

#: the device side of a kernel's report slot (symgpu/gpu/runtime/device_checks.py): slot[1] gets the
#: bad value, then slot[0] becomes 1
ERROR_REPORT_SOURCE = REPORT_SOURCE

_CU = sections("advanced.cu")   # the indexing loop, then the entry points it instantiates


def _gather_name(dtype: str, idx_dtype: str) -> str:
    return f"adv_gather_{dtype}_{idx_dtype}"


def _scatter_name(dtype: str, idx_dtype: str, set_: bool) -> str:
    return f"adv_{'set' if set_ else 'inc'}_{dtype}_{idx_dtype}"


def advanced_source() -> str:
    """The CUDA module with every gather / set / inc kernel (all value and index dtypes)."""
    parts = [common_source(), ERROR_REPORT_SOURCE, _CU[""].substitute()]
    for dtype, t in ADVANCED_DTYPES.items():
        for idt, it in INDEX_DTYPES.items():
            parts.append(_CU["gather"].substitute(name=_gather_name(dtype, idt), t=t, it=it))
            for set_ in (True, False):
                parts.append(_CU["scatter"].substitute(name=_scatter_name(dtype, idt, set_),
                                                       t=t, it=it, mode=1 if set_ else 2))
    return "".join(parts)


def _contiguous(a: Any) -> Any:
    return a if a.is_c_contiguous else a.copy()


def _launch(op: Op, node: Apply, ctx: Any, name: str, a: Any, b: Any, idx: Any, n: int,
            row: int, length: int, shape: tuple) -> None:
    """Launch kernel ``name`` over n indices (rows of ``row`` elements) on the context's
    stream; a bad index raises IndexError at the next synchronisation (device_checks.py).
    Every kernel takes (a, b, idx, ...): (x, out, idx) to gather, (out, y, idx) to scatter."""
    if n == 0:
        return
    ctx.activate()
    fn = get_prepared_kernel(("symgpu.advanced",), advanced_source, name, "PPPqqqP", context=ctx)
    total = n * max(row, 1)
    blocks = max(1, min(_MAX_BLOCKS, -(-total // _BLOCK)))

    def describe(bad: int) -> Exception:
        return IndexError(f"{op}: index {bad} is out of bounds for axis 0 with size {length} "
                          f"(indexing an array of shape {shape})")
    launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1),
                   (a.ptr, b.ptr, idx.ptr, n, row, length), describe)


def _row(shape: tuple) -> int:
    row = 1
    for s in shape[1:]:
        row *= s
    return row


def _check_index_var(op: Op, idx: Any) -> None:
    if idx.ndim != 1 or idx.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: the index must be an int32/int64 vector, got {idx.type}")


# ----------------------------------------------------------------------------- gather

def _check_indexed_var(op: Op, x: Any) -> None:
    """The array the indexing ops read: a GPU variable of an ADVANCED_DTYPES dtype, >= 1-d."""
    if not is_gpu_var(x):
        raise TypeError(f"{op}: expected a GPU variable, got {x}")
    if x.ndim < 1 or x.dtype not in ADVANCED_DTYPES:
        raise TypeError(f"{op}: x must be an array of {'/'.join(ADVANCED_DTYPES)} of at "
                        f"least 1 dimension, got {x.type}")


class GpuAdvancedSubtensor1(DeviceChecked, Op):
    """``x[idx]`` for an integer vector ``idx`` on axis 0 of ``x`` (any ndim >= 1): a new
    C-contiguous array of shape ``(len(idx),) + x.shape[1:]``; negative indices allowed,
    out-of-bounds ones raise IndexError after the launch."""

    __props__ = ()
    #: its shape is the index's length and x's trailing dims: reads of it are host
    #: arithmetic before the launches (tensor/rewriting/shape_feature.py)
    shape_from_inputs = True

    def __str__(self) -> str:
        return "GpuAdvancedSubtensor1"

    def infer_shape(self, fgraph, node, input_shapes):
        """x[idx] for an integer vector idx: the host AdvancedSubtensor's rule."""
        return _AdvancedSubtensor.infer_shape(_AdvancedSubtensor((SYM,)), fgraph, node, input_shapes)

    def make_node(self, x: Any, idx: Any) -> Apply:
        _check_indexed_var(self, x)
        idx = as_gpuarray_variable(idx, x.type.context_name)
        _check_index_var(self, idx)
        bcast = (idx.broadcastable[0],) + tuple(x.broadcastable[1:])
        return Apply(self, [x, idx], [x.type.clone(broadcastable=bcast)()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_gather_name(node.inputs[0].dtype, node.inputs[1].dtype),)

    def perform(self, node, inputs, out, kernel=None):
        x, idx = inputs
        n = idx.shape[0]
        res = GpuArray((n,) + tuple(x.shape[1:]), x.dtype, x.context)
        if n:
            if kernel is None:
                kernel = self.perform_args(node)[0]
            _launch(self, node, x.context, kernel, _contiguous(x), res, _contiguous(idx),
                    n, _row(x.shape), x.shape[0], x.shape)
        out[0][0] = res

    def grad(self, inputs, output_grads):
        x, idx = inputs
        if not is_float(x.dtype):
            return [None, None]
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        zeros = gpu_elemwise("second", x, np.asarray(0, dtype=x.dtype))
        return [GpuAdvancedIncSubtensor1(False)(zeros, gz, idx), None]


# ----------------------------------------------------------------------------- set / inc

class GpuAdvancedIncSubtensor1(DeviceChecked, Op):
    """A copy of ``x`` with ``x[idx]`` incremented by (``np.add.at``: repeated indices
    accumulate, through atomicAdd) or set to ``y`` broadcast to ``(len(idx),) +
    x.shape[1:]``. With repeated indices a set keeps one of the writes, which one is
    unspecified. Never in place."""

    __props__ = ("set_instead_of_inc",)

    def __init__(self, set_instead_of_inc: bool = False):
        self.set_instead_of_inc = bool(set_instead_of_inc)

    def __str__(self) -> str:
        return f"GpuAdvanced{'Set' if self.set_instead_of_inc else 'Inc'}Subtensor1"

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def make_node(self, x: Any, y: Any, idx: Any) -> Apply:
        _check_indexed_var(self, x)
        y = as_gpuarray_variable(y, x.type.context_name)
        idx = as_gpuarray_variable(idx, x.type.context_name)
        _check_index_var(self, idx)
        if y.dtype != x.dtype:
            raise TypeError(f"{self}: the value {y} has dtype {y.dtype} but {x} has {x.dtype}")
        if y.ndim > x.ndim:
            raise ValueError(f"{self}: the value {y} has {y.ndim} dimensions, more than the "
                             f"{x.ndim} of the indexed region")
        return Apply(self, [x, y, idx], [x.type()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_scatter_name(node.inputs[0].dtype, node.inputs[2].dtype,
                              self.set_instead_of_inc),)

    def perform(self, node, inputs, out, kernel=None):
        x, y, idx = inputs
        res = x.copy()
        n = idx.shape[0]
        region = (n,) + tuple(x.shape[1:])
        src = y._broadcast_to(region, str(self))
        if n:
            if not src.is_c_contiguous:
                full = GpuArray(region, x.dtype, x.context)
                full._copy_from_device(src)
                src = full
            if kernel is None:
                kernel = self.perform_args(node)[0]
            _launch(self, node, x.context, kernel, res, src, _contiguous(idx), n,
                    _row(x.shape), x.shape[0], x.shape)
        out[0][0] = res


# ----------------------------------------------------------------------------- lifters

def _axis0_vector(op: Any, node: Apply, first: int) -> bool:
    """Whether the op indexes axis 0 with one int32/int64 vector, then only full slices."""
    idx_list = op.idx_list
    if not idx_list or idx_list[0] != SYM or len(node.inputs) != first + 1:
        return False
    if any(e != _FULL or not isinstance(e, Slice) for e in idx_list[1:]):
        return False
    x, idx = node.inputs[0], node.inputs[first]
    return (idx.ndim == 1 and idx.dtype in INDEX_DTYPES and x.dtype in ADVANCED_DTYPES
            and x.ndim >= len(idx_list))


@register_lifter(_AdvancedSubtensor)
def lift_advanced_subtensor1(op, node, context_name, inputs):
    if type(op) is not _AdvancedSubtensor or not _axis0_vector(op, node, 1):
        return None
    x = inputs[0]
    if not is_gpu_var(x):
        return None
    return [GpuAdvancedSubtensor1()(x, as_gpuarray_variable(inputs[1], context_name))]


@register_lifter(_AdvancedIncSubtensor)
def lift_advanced_incsubtensor1(op, node, context_name, inputs):
    if type(op) is not _AdvancedIncSubtensor or not _axis0_vector(op, node, 2):
        return None
    x = inputs[0]
    if not is_gpu_var(x) or node.inputs[1].dtype != x.dtype:
        return None
    y = as_gpuarray_variable(inputs[1], context_name)
    idx = as_gpuarray_variable(inputs[2], context_name)
    # never in place: the placement pass shares uploads among readers
    return [GpuAdvancedIncSubtensor1(op.set_instead_of_inc)(x, y, idx)]


# ----------------------------------------------------------------------------- batched dot

def _batch_operand(a: Any) -> tuple[Any, int, int, int]:
    """(array, op, ld, batch stride in elements) of a 3-d operand for strided-batched gemm,
    copying to C order when cuBLAS cannot read its matrices."""
    isz = a.dtype.itemsize
    for attempt in (0, 1):
        mat = a._view(a.ptr, tuple(a.shape[1:]), tuple(a.strides[1:]))
        got = _colmajor(mat)
        sb = 0 if a.shape[0] <= 1 else a.strides[0]
        if got is not None and sb >= 0 and sb % isz == 0:
            return a, got[0], got[1], sb // isz
        a = a.copy()
    raise AssertionError("a C-contiguous copy is always readable by cuBLAS")


class GpuBatchedDot(Op):
    """``matmul(x, y)`` of two stacks of matrices, ``x[b] @ y[b]`` for each b, through one
    cublas<S|D>gemmStridedBatched call (float32/float64) or one strided-batched cuBLASLt
    product accumulated in float32 (float16/bfloat16; row-major handled as column-major
    transposes, as GpuDot22). 3-d stacks: batch sizes equal or one of them 1 (read with
    stride 0); more dims ((batch, heads, m, k)): the leading dims are one batch (a view where
    the strides allow it), the same on both sides or all 1 on one."""

    __props__ = ()

    def __str__(self) -> str:
        return "GpuBatchedDot"

    infer_shape = _MatMul.infer_shape  # stacks of 1 broadcast, as in matmul

    def make_node(self, x: Any, y: Any) -> Apply:
        ctx = _ctx_name(x, y)
        nd = max(3, getattr(x, "ndim", 3))
        x, y = _blas_matrix(x, ctx, nd, "GpuBatchedDot's x", GEMM_DTYPES), \
            _blas_matrix(y, ctx, nd, "GpuBatchedDot's y", GEMM_DTYPES)
        if x.dtype != y.dtype:
            raise TypeError(f"GpuBatchedDot needs one dtype, got {x.dtype} and {y.dtype}")
        bcast = tuple(a and b for a, b in zip(x.broadcastable[:-2], y.broadcastable[:-2])) + \
            (x.broadcastable[-2], y.broadcastable[-1])
        return Apply(self, [x, y], [GpuArrayType(x.dtype, bcast, ctx)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = elemwise_ops._context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _batched_thunk(self, node, storage_map, ctx)


def _batched_thunk(op: Op, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
    blas = cublas()
    handle = blas.handle(ctx)
    dtype = node.outputs[0].dtype
    math_mode = gemm_math_mode(dtype)
    np_dtype = np.dtype(dtype)
    half = dtype not in BLAS_DTYPES
    gemm = None if half else blas.lib.cublasSgemmStridedBatched if dtype == "float32" else \
        blas.lib.cublasDgemmStridedBatched
    ctype = ctypes.c_double if dtype == "float64" else ctypes.c_float   # half: float scale
    use_lt = half and blaslt.lt_available(dtype)
    declined: set = set()     # half problems cuBLASLt has no algorithm for
    one, zero = ctype(1.0), ctype(0.0)
    x_cell, y_cell = storage_map[node.inputs[0]], storage_map[node.inputs[1]]
    out_cell = storage_map[node.outputs[0]]
    label = str(op)

    def thunk() -> None:
        ctx.activate()
        x, y = x_cell[0], y_cell[0]
        lead = None
        if x.ndim > 3:       # the leading dims as one batch
            lead, x, y = _one_batch(label, x, y)
        bx, m, k = x.shape
        by, k2, n = y.shape
        if k != k2:
            raise ValueError(f"{label}: shapes {x.shape} and {y.shape} are not aligned "
                             f"({k} != {k2})")
        if bx != by and 1 not in (bx, by):
            raise ValueError(f"{label}: the batch dimensions of shapes {x.shape} and "
                             f"{y.shape} do not broadcast")
        b = max(bx, by) if min(bx, by) else 0
        out = new_array(ctx, (b, m, n), np_dtype)
        if b and m and n:
            if k == 0:
                out.fill(0)
            else:
                _check_int(b, m, n, k)
                x, tb, ldb, sx = _batch_operand(x)
                y, ta, lda, sy = _batch_operand(y)
                if half:
                    _half_batched(ctx, dtype, use_lt, declined, (ta, tb, n, m, k, lda, ldb,
                                  sy, sx, b), one, zero, y, x, out, label)
                    out_cell[0] = out if lead is None else out.reshape(lead + (m, n))
                    return
                blas.math_mode(handle, math_mode)
                status = gemm(handle, ctypes.c_int(ta), ctypes.c_int(tb), ctypes.c_int(n),
                              ctypes.c_int(m), ctypes.c_int(k), ctypes.byref(one),
                              ctypes.c_void_p(y.ptr), ctypes.c_int(max(lda, 1)),
                              ctypes.c_longlong(sy), ctypes.c_void_p(x.ptr),
                              ctypes.c_int(max(ldb, 1)), ctypes.c_longlong(sx),
                              ctypes.byref(zero), ctypes.c_void_p(out.ptr),
                              ctypes.c_int(max(n, 1)), ctypes.c_longlong(m * n),
                              ctypes.c_int(b))
                blas.check(status, f"{label} (gemmStridedBatched {b} x {m}x{k} @ {k}x{n})")
        out_cell[0] = out if lead is None else out.reshape(lead + (m, n))

    thunk.launches = True       # type: ignore[attr-defined]
    thunk.capturable = True     # type: ignore[attr-defined]
    return thunk


def _one_batch(label: str, x: Any, y: Any) -> tuple[tuple, Any, Any]:
    """(the output's leading dims, x and y as 3-d stacks): N-d operands' leading dims merged
    into one batch (views where the strides allow, else copies); they must be equal, or all 1
    on one side (that side read with stride 0)."""
    lx, ly = tuple(x.shape[:-2]), tuple(y.shape[:-2])
    ones = lambda lead: all(n == 1 for n in lead)   # noqa: E731
    if lx != ly and not (ones(lx) or ones(ly)):
        raise ValueError(f"{label}: the leading dims of shapes {x.shape} and {y.shape} are "
                         f"neither equal nor all 1 (no broadcasting between them)")
    lead = lx if lx == ly or ones(ly) else ly
    flat = lambda a, lead_a: a.reshape((int(np.prod(lead_a, dtype=np.int64)),)  # noqa: E731
                                       + tuple(a.shape[-2:]))
    return lead, flat(x, lx), flat(y, ly)


def _half_batched(ctx: Any, dtype: str, use_lt: bool, declined: set, geo: tuple, one: Any,
                  zero: Any, y: Any, x: Any, out: Any, label: str) -> None:
    """out[b] = x[b] @ y[b] of a half stack: the column-major batch out^T = y^T x^T through
    cuBLASLt (float32 accumulation, the algorithm timed per problem), or classic
    cublasGemmStridedBatchedEx where cuBLASLt is off or declines the problem."""
    ta, tb, n, m, k, lda, ldb, sy, sx, b = geo
    p = blaslt.LtProblem(dtype, False, ta, tb, n, m, k, max(lda, 1), max(ldb, 1), max(n, 1),
                         False, b, sy, sx, m * n, blaslt.EPILOGUE_DEFAULT,
                         tuple(blaslt.alignment(v.ptr) for v in (y, x, out)))
    alpha, beta = ctypes.byref(one), ctypes.byref(zero)
    if use_lt and p not in declined:
        try:
            blaslt.lt_matmul(ctx, p, alpha, y.ptr, x.ptr, beta, out.ptr)
            return
        except blaslt.LtUnsupported:
            declined.add(p)
    status = blaslt.classic(ctx, p, alpha, y.ptr, x.ptr, beta, out.ptr)
    if status:
        cublas().check(status, f"{label} (gemmStridedBatchedEx {b} x {m}x{k} @ {k}x{n}, "
                               f"{dtype})")


def gpu_batched_dot(x: Any, y: Any) -> Any:
    return GpuBatchedDot()(x, y)


@register_lifter(_MatMul)
def lift_matmul(op, node, context_name, inputs):
    """matmul of two stacks of one rank (3-d, or (batch, heads, m, k) and more: the
    leading dims one batch) -> GpuBatchedDot."""
    x, y = inputs
    if x.ndim != y.ndim or x.ndim < 3 or not (is_gpu_var(x) and is_gpu_var(y)):
        return None
    if not (x.dtype == y.dtype == node.outputs[0].dtype) or x.dtype not in GEMM_DTYPES:
        return None
    if x.broadcastable[:-2] != y.broadcastable[:-2]:
        return None   # batch broadcasting declared in the types: stays on the CPU
    return [GpuBatchedDot()(x, y)]


# ----------------------------------------------------------------------------- boolean masks

def check_and_convert_boolean_masks(input: Any, idx_list: Sequence[Any]) -> list[Any]:
    """`idx_list` (a NumPy index of `input`) with each boolean mask replaced by its
    ``nonzero()`` index arrays, after checking that the mask's shape is `input`'s over the
    dims it covers (IndexError naming the dim otherwise); ``np.newaxis`` counts no dim
    (Theano's theano.gpuarray.subtensor helper)."""
    dim_seen = 0
    out: list[Any] = []
    for index in idx_list:
        if index is np.newaxis:
            out.append(index)
        elif isinstance(index, np.ndarray) and index.dtype == bool:
            for i in range(index.ndim):
                if index.shape[i] != input.shape[dim_seen + i]:
                    raise IndexError(
                        f"boolean index did not match indexed array along dimension "
                        f"{dim_seen + i}; dimension is {input.shape[dim_seen + i]} but "
                        f"corresponding boolean dimension is {index.shape[i]}")
            dim_seen += index.ndim
            out += list(index.nonzero())
        else:
            dim_seen += 1
            out.append(index)
    return out
