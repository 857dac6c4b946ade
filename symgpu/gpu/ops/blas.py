"""cuBLAS through ctypes: GpuGemm, GpuGemv, GpuDot22, GpuGer (float32, float64; GpuGemm and
GpuDot22 also float16 and bfloat16, accumulated in float32 with float32 alpha/beta).

Why ctypes: cuBLAS ships with every CUDA install (``libcublas.so.13`` on the GPU machine) and
its C API is a handful of calls; binding them directly costs nothing to build and works on the
PyCUDA context (the primary context, current when the call is made).  One handle per context,
bound to the context's stream (``cublasSetStream_v2``), so BLAS calls are ordered with the
generated kernels and can be captured in CUDA graphs.

Row-major arrays are column-major transposes: ``C = A @ B`` is ``C^T = B^T A^T``; a
C-contiguous matrix is passed untransposed with its row stride as leading dimension, an
F-contiguous one transposed, anything else is first copied to C order.  The rank-1 update
of a row-major A (m x n) is the update of the column-major A^T (n x m) with x and y swapped.

Half products (``GEMM_DTYPES`` beyond ``BLAS_DTYPES``) run through cuBLASLt (compute type
CUBLAS_COMPUTE_32F, its algorithms timed as float32's are), else ``cublasGemmEx``; their
alpha and beta are float32 scalars (``scale_dtype``).  cuBLAS has no half gemv or ger, so a
half matrix-vector product is a GpuDot22 of one column (lifters.py).

GpuGer's lifter and in-place pass live here (the other BLAS ops' are in lifters.py).  The
library binding (loading, entry points, handles) is cublas_lib.py; cuBLASLt is blaslt.py.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops import blaslt, thin_gemm
from symgpu.gpu.ops.cublas_lib import (Cublas as _Cublas, CublasError,
                                       DEFAULT_MATH as _DEFAULT_MATH, TF32_MATH as _TF32_MATH,
                                       with_pointer_mode as _with_pointer_mode)
from symgpu.gpu.ops.elemwise import _as_gpu, _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import GpuShape_i
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import to_gpu
from symgpu.gpu.runtime.copykernel import prefetch_request
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import value_dtype
from symgpu.tensor import blas as _host_blas
from symgpu.tensor.math import cast
from symgpu.tensor.type import as_tensor_variable, constant

__all__ = ["GpuGemm", "GpuGemv", "GpuDot22", "GpuGer", "GpuAllocEmpty", "gpu_gemm", "gpu_gemv",
           "gpu_dot22", "gpu_ger", "lift_ger", "gemm_math_mode", "cublas", "CublasError",
           "BLAS_DTYPES", "GEMM_DTYPES", "scale_dtype"]

#: dtypes of every cuBLAS op here (gemv, ger: cuBLAS has no half ones)
BLAS_DTYPES = ("float32", "float64")
#: dtypes of the matrix products (GpuGemm, GpuDot22, GpuBatchedDot): the half ones too
GEMM_DTYPES = ("float16", "bfloat16") + BLAS_DTYPES


def scale_dtype(dtype: str) -> str:
    """The dtype of alpha and beta of a product of ``dtype``: float32 for the half dtypes
    (cuBLAS's scale type with CUBLAS_COMPUTE_32F), the operands' own otherwise."""
    return value_dtype(dtype)

_N, _T = 0, 1                       # cublasOperation_t

#: the process's binding (tests replace it)
_cublas: _Cublas | None = None


def cublas() -> _Cublas:
    """The process's cuBLAS binding (loaded on first use)."""
    global _cublas
    if _cublas is None:
        _cublas = _Cublas()
    return _cublas


blaslt.use_classic(cublas)   # cuBLASLt's "classic cuBLAS" candidate runs on this binding


# ----------------------------------------------------------------------------- layouts

def _colmajor(a: Any) -> tuple[int, int] | None:
    """How cuBLAS sees row-major matrix ``a`` (r x c): (op, ld) where op N means "a^T, stored
    column-major with leading dimension ld" and T means "a, column-major"; None if neither."""
    r, c = a.shape
    isz = a.dtype.itemsize
    s0, s1 = a.strides
    if c <= 1:
        s1 = isz
    if r <= 1:
        s0 = max(c, 1) * isz
    if s1 == isz and s0 % isz == 0 and s0 >= max(c, 1) * isz:
        return _N, s0 // isz
    if s0 == isz and s1 % isz == 0 and s1 >= max(r, 1) * isz:
        return _T, s1 // isz
    return None


def _matrix(a: Any) -> tuple[Any, int, int]:
    """(array, op, ld) for a matrix operand, copying to C order when cuBLAS cannot read it."""
    got = _colmajor(a)
    if got is None:
        a = a.copy()
        got = _colmajor(a)
    return a, got[0], got[1]


def _inc(v: Any) -> int:
    """cuBLAS increment of vector ``v`` (0 for an unusable stride)."""
    if v.shape[0] <= 1:
        return 1
    s = v.strides[0]
    return s // v.dtype.itemsize if s > 0 and s % v.dtype.itemsize == 0 else 0


def _check_int(*dims: int) -> None:
    if max(dims) >= 2 ** 31:
        raise ValueError(f"matrix dimensions {dims} exceed cuBLAS's 32-bit int arguments")


# ----------------------------------------------------------------------------- scalars

class _Scalars:
    """How a BLAS node's alpha/beta arrive: constants (read once), host scalars (read each
    call) or device scalars (device pointer mode; constants then live on the device too)."""

    def __init__(self, node: Apply, positions: Sequence[int], dtype: str, ctx: Any,
                 storage_map: dict) -> None:
        self.ctype = ctypes.c_float if dtype == "float32" else ctypes.c_double
        self.device = any(is_gpu_var(node.inputs[i]) for i in positions)
        self.cells = []
        self.const: list[float | None] = []
        for i in positions:
            v = node.inputs[i]
            data = getattr(v, "host_data", None) if is_gpu_var(v) else getattr(v, "data", None)
            if isinstance(v, Constant) and data is not None:
                self.const.append(float(np.asarray(data).reshape(())))
            else:
                self.const.append(None)
            self.cells.append(storage_map[v])
        self.is_gpu = [is_gpu_var(node.inputs[i]) for i in positions]
        self.dev_consts: list[Any] = []
        if self.device:
            for c in self.const:
                self.dev_consts.append(None if c is None else to_gpu(np.asarray([c], dtype), ctx))
        self.dtype = dtype
        self.ctx = ctx
        #: every scalar a constant read by cuBLAS from the host: the same arguments on every
        #: call, made once (the ctypes values live as long as this object)
        self.fixed: tuple[list[Any], list[Any]] | None = None
        if not self.device and all(c is not None for c in self.const):
            vals = [self.ctype(c) for c in self.const]
            self.fixed = ([ctypes.byref(v) for v in vals], vals)

    def known_zero(self, k: int) -> bool:
        return self.const[k] == 0.0

    def args(self) -> tuple[list[Any], list[Any]]:
        """(arguments to pass, objects to keep alive until the call returns)."""
        if self.fixed is not None:
            return self.fixed
        if not self.device:
            vals = [self.ctype(c if c is not None else float(np.asarray(cell[0]).reshape(())))
                    for c, cell in zip(self.const, self.cells)]
            return [ctypes.byref(v) for v in vals], vals
        ptrs, keep = [], []
        for c, dev, cell, gpu in zip(self.const, self.dev_consts, self.cells, self.is_gpu):
            if dev is not None:
                ptrs.append(ctypes.c_void_p(dev.ptr))
            elif gpu:
                ptrs.append(ctypes.c_void_p(cell[0].ptr))
                keep.append(cell[0])
            else:
                tmp = to_gpu(np.asarray([cell[0]], self.dtype).reshape(1), self.ctx)
                ptrs.append(ctypes.c_void_p(tmp.ptr))
                keep.append(tmp)
        return ptrs, keep

    def kernel_args(self) -> list[tuple[float, int]]:
        """(value, device address or 0) of each scalar for a kernel of ours (thin_gemm.py):
        constants and host values by value, read now; GPU scalars by address, read by the
        kernel."""
        out = []
        for c, cell, gpu in zip(self.const, self.cells, self.is_gpu):
            if c is not None:
                out.append((c, 0))
            elif gpu:
                out.append((0.0, cell[0].ptr))
            else:
                out.append((float(np.asarray(cell[0]).reshape(())), 0))
        return out

    def value(self, k: int) -> float | None:
        """The host value of scalar k when it is known without a device read."""
        if self.const[k] is not None:
            return self.const[k]
        if not self.is_gpu[k]:
            return float(np.asarray(self.cells[k][0]).reshape(()))
        return None


def _scalar_input(x: Any, dtype: str, ctx_name: Any) -> Variable:
    """alpha/beta as a 0-d variable of ``dtype``: GPU ones stay on the device, others on the
    host (host pointer mode needs no device read)."""
    if is_gpu_var(x):
        if x.ndim != 0 or x.dtype != dtype:
            raise TypeError(f"BLAS scalar {x} must be a 0-d {dtype} GPU array, got {x.type}")
        return x
    if isinstance(x, (int, float, np.number)):
        return constant(np.asarray(x, dtype=dtype))
    x = as_tensor_variable(x)
    if x.ndim != 0:
        raise TypeError(f"BLAS scalar {x} must be 0-d, got {x.type}")
    return cast(x, dtype) if x.dtype != dtype else x


def _blas_matrix(x: Any, ctx_name: Any, ndim: int, what: str,
                 dtypes: tuple = BLAS_DTYPES) -> Variable:
    x = _as_gpu(x, ctx_name)
    if x.ndim != ndim or x.dtype not in dtypes:
        raise TypeError(f"{what} must be a {ndim}-d {'/'.join(dtypes)} GPU array, got {x.type}")
    return x


def _broadcast_fill_prefetch(acc: Variable) -> list[tuple]:
    """The strided-copy module when the accumulated input (y, C, A) is broadcast: its value is
    copied into the output by that kernel (``GpuArray._broadcast_to``), compiled ahead with the
    function's kernels rather than on the first call."""
    return [prefetch_request()] if any(acc.broadcastable) else []


def _ctx_name(*xs: Any) -> Any:
    return next((x.type.context_name for x in xs if is_gpu_var(x)), None)


# ----------------------------------------------------------------------------- GpuGemm

class _CublasOp(Op):
    """A cuBLAS op: on a virtual context its thunk only says so; otherwise the subclass's
    ``_thunk(node, storage_map, ctx)`` makes it."""

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return self._thunk(node, storage_map, ctx)


class _AccumulatingBlasOp(_CublasOp):
    """A cuBLAS op that adds into its first input (GpuGemm's z, GpuGemv's y, GpuGer's A):
    in place on it when ``inplace``, else into a copy from the pool."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return _broadcast_fill_prefetch(node.inputs[0])


class GpuGemm(_AccumulatingBlasOp):
    """``z <- beta * z + alpha * dot(x, y)`` (inputs z, alpha, x, y, beta); in place on z
    when ``inplace``."""

    infer_shape = _host_blas.Gemm.infer_shape

    def make_node(self, z: Any, alpha: Any, x: Any, y: Any, beta: Any) -> Apply:
        ctx = _ctx_name(z, x, y)
        z = _blas_matrix(z, ctx, 2, "GpuGemm's z", GEMM_DTYPES)
        x = _blas_matrix(x, ctx, 2, "GpuGemm's x", GEMM_DTYPES)
        y = _blas_matrix(y, ctx, 2, "GpuGemm's y", GEMM_DTYPES)
        if not (z.dtype == x.dtype == y.dtype):
            raise TypeError(f"GpuGemm needs one dtype, got z {z.dtype}, x {x.dtype}, y {y.dtype}")
        sd = scale_dtype(z.dtype)
        alpha, beta = _scalar_input(alpha, sd, ctx), _scalar_input(beta, sd, ctx)
        out = z.type.clone(broadcastable=(x.broadcastable[0] and z.broadcastable[0],
                                          y.broadcastable[1] and z.broadcastable[1]))
        if self.inplace and z.type != out:
            raise TypeError(f"{self}: z ({z.type}) cannot hold the output ({out}) in place")
        return Apply(self, [z, alpha, x, y, beta], [out()])

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return super().prefetch_sources(node) + _thin_prefetch(node)

    def _thunk(self, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
        return _gemm_thunk(self, node, storage_map, ctx, node.inputs[0], 2, 3, (1, 4))


class GpuDot22(_CublasOp):
    """``dot(x, y)`` of two matrices through cuBLAS gemm (beta = 0, a fresh output)."""

    __props__ = ()

    def __str__(self) -> str:
        return "GpuDot22"

    infer_shape = _host_blas.Dot22.infer_shape

    def make_node(self, x: Any, y: Any) -> Apply:
        ctx = _ctx_name(x, y)
        x = _blas_matrix(x, ctx, 2, "GpuDot22's x", GEMM_DTYPES)
        y = _blas_matrix(y, ctx, 2, "GpuDot22's y", GEMM_DTYPES)
        if x.dtype != y.dtype:
            raise TypeError(f"GpuDot22 needs one dtype, got {x.dtype} and {y.dtype}")
        out = GpuArrayType(x.dtype, (x.broadcastable[0], y.broadcastable[1]), ctx)
        return Apply(self, [x, y], [out()])

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return _thin_prefetch(node)

    def _thunk(self, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
        return _gemm_thunk(self, node, storage_map, ctx, None, 0, 1, ())


def _thin_prefetch(node: Apply) -> list[tuple]:
    """The thin-product module (thin_gemm.py) a GpuDot22/GpuGemm thunk loads when made."""
    dtype = node.outputs[0].dtype
    return [thin_gemm.prefetch_request(dtype)] if _thin_enabled(dtype) else []


def _thin_enabled(dtype: str) -> bool:
    return thin_gemm.ENABLED and dtype in thin_gemm.DTYPES


def gemm_math_mode(dtype: str) -> int:
    """The cublasMath_t a matrix product of ``dtype`` compiled now runs with
    (``gpuarray.allow_tf32``: TF32 tensor cores for float32)."""
    return _TF32_MATH if dtype == "float32" and config.gpuarray.allow_tf32 else _DEFAULT_MATH


def _gemm_thunk(op: Op, node: Apply, storage_map: dict, ctx: Any, z_var: Variable | None,
                xi: int, yi: int, scalar_pos: tuple, epi: Any = None) -> Callable[[], None]:
    """The thunk of a product ``beta z + alpha x @ y`` (GpuGemm), ``x @ y`` (GpuDot22) or,
    with ``epi``, its epilogue (GpuGemmEpilogue, gemm_epilogue.py: ``epi.code`` is its
    cuBLASLt epilogue, ``epi.bias_index`` / ``epi.aux_index`` the bias / aux input or None,
    ``epi.aux_out`` whether aux is a second output (allocated here, of out's layout),
    ``epi.operand`` / ``epi.aux_operand`` those inputs checked and made readable,
    ``epi.apply(ctx, out, bias, aux)`` the same epilogue by a kernel of ours after a classic
    product)."""
    blas = cublas()
    handle = blas.handle(ctx)
    dtype = node.outputs[0].dtype
    math_mode = gemm_math_mode(dtype)
    use_lt = blaslt.lt_available(dtype)
    np_dtype = np.dtype(dtype)
    gemm = blas.gemm[dtype]
    ctype = ctypes.c_float if scale_dtype(dtype) == "float32" else ctypes.c_double
    one, zero = ctype(1.0), ctype(0.0)
    scal = _Scalars(node, scalar_pos, scale_dtype(dtype), ctx, storage_map) if scalar_pos \
        else None
    epi_code = blaslt.EPILOGUE_DEFAULT if epi is None else epi.code
    bias_cell = aux_cell = aux_out_cell = None
    if epi is not None:
        if epi.bias_index is not None:
            bias_cell = storage_map[node.inputs[epi.bias_index]]
        if epi.aux_index is not None:
            aux_cell = storage_map[node.inputs[epi.aux_index]]
        if epi.aux_out:
            aux_out_cell = storage_map[node.outputs[1]]
    device_scalars = scal is not None and scal.device
    in_cells = [storage_map[v] for v in node.inputs]
    out_cell = storage_map[node.outputs[0]]
    inplace = getattr(op, "inplace", False)
    z_cell = storage_map[z_var] if z_var is not None else None
    beta_zero = scal is not None and scal.known_zero(1)
    label = str(op)
    problems: dict = {}     # _lt_gemm's LtProblems by layout (None: cuBLASLt has none)
    into = [None]   # graph_segment sets it for one capture (write_into: a direct update)
    thin = thin_gemm.ThinGemm(ctx, dtype) if _thin_enabled(dtype) and epi is None else None
    unit = [(1.0, 0), (0.0, 0)]     # GpuDot22's alpha, beta for the thin kernels

    def thunk() -> None:
        ctx.activate()
        x, y = in_cells[xi][0], in_cells[yi][0]
        m, k = x.shape
        k2, n = y.shape
        if k != k2:
            raise ValueError(f"{label}: shapes {x.shape} and {y.shape} are not aligned "
                             f"({k} != {k2})")
        if z_cell is not None:
            z = z_cell[0]
            if any(a not in (b, 1) for a, b in zip(z.shape, (m, n))):
                raise ValueError(f"{label}: z of shape {z.shape} does not broadcast to the "
                                 f"{(m, n)} of dot(x, y)")
            t = into[0]
            if t is not None and _accumulates_into(t, z, x, y, (m, n)):
                out = t     # the update W + alpha x.y computed in W's own buffer: no copy
            elif inplace and z.shape == (m, n) and _colmajor(z) is not None \
                    and _colmajor(z)[0] == _N:
                out = z
            else:
                out = new_array(ctx, (m, n), np_dtype)
                if not beta_zero and out.size:
                    out._copy_from_device(z._broadcast_to((m, n)))
        else:
            out = new_array(ctx, (m, n), np_dtype)
        bias = aux = None
        if bias_cell is not None:
            bias = epi.operand(bias_cell[0], n, label)
        if aux_cell is not None:
            aux = epi.aux_operand(aux_cell[0], x, y, label)
        elif aux_out_cell is not None:
            aux = aux_out_cell[0] = new_array(ctx, (m, n), np_dtype)   # out's layout
        if m and n and thin is not None and \
                thin(x, y, out, *(unit if scal is None else scal.kernel_args())):
            out_cell[0] = out     # one launch of ours: a thin side (thin_gemm.py)
            return
        if m and n:
            _check_int(m, n, k)
            x, tb, ldb = _matrix(x)
            y, ta, lda = _matrix(y)
            ldc = _colmajor(out)[1]
            if scal is None:
                alpha_p, beta_p, keep = ctypes.byref(one), ctypes.byref(zero), ()
            else:
                (alpha_p, beta_p), keep = scal.args()
            if use_lt and k and _lt_gemm(ctx, dtype, math_mode, ta, tb, n, m, k, lda, ldb,
                                         ldc, y, x, out, alpha_p, beta_p, device_scalars,
                                         problems, epi_code, bias, aux):
                out_cell[0] = out
                return
            blas.math_mode(handle, math_mode)
            status = _with_pointer_mode(
                blas, handle, device_scalars,
                lambda: gemm(handle, ta, tb, n, m, k, alpha_p, ctypes.c_void_p(y.ptr),
                             max(lda, 1), ctypes.c_void_p(x.ptr), max(ldb, 1), beta_p,
                             ctypes.c_void_p(out.ptr), max(ldc, 1)))
            if status:   # (the message is made only then)
                blas.check(status, f"{label} (gemm {m}x{k} @ {k}x{n})")
            del keep
            if epi is not None:
                epi.apply(ctx, out, bias, aux)   # cuBLASLt missing or declined: our kernel
        out_cell[0] = out

    if z_var is not None:
        thunk.write_into = into   # type: ignore[attr-defined]
    return _blas_capturable(thunk, scal)


def _accumulates_into(t: Any, z: Any, x: Any, y: Any, shape: tuple) -> bool:
    """Whether a gemm may write its result into ``t`` (its ``write_into`` target: the buffer
    of the shared variable it updates, graph_segment's direct updates): ``t`` is ``z``
    itself, C-ordered, of the product's shape (accumulating in place, as the in-place gemm
    does), and neither factor lives in its memory (cuBLAS would read what it overwrites)."""
    base = getattr(t, "base", None)
    return t.ptr == z.ptr and t.shape == z.shape == shape and t.strides == z.strides and \
        t.dtype == z.dtype and t.is_c_contiguous and t.size > 0 and base is not None and \
        getattr(x, "base", None) is not base and getattr(y, "base", None) is not base


def _lt_gemm(ctx: Any, dtype: str, math_mode: int, ta: int, tb: int, rows: int, cols: int,
             k: int, lda: int, ldb: int, ldd: int, a: Any, b: Any, out: Any,
             alpha_p: Any, beta_p: Any, device_scalars: bool, problems: dict,
             epilogue: int = 1, bias: Any = None, aux: Any = None) -> bool:
    """The column-major gemm out (rows x cols) = alpha op(a) op(b) + beta out through
    cuBLASLt (symgpu/gpu/ops/blaslt.py); False where cuBLASLt has no algorithm for it (the
    caller runs classic cuBLAS).  ``problems`` is the thunk's memo of LtProblems (None for
    one cuBLASLt declined) by layout: the arguments that vary and the pointers' low byte,
    which fixes their alignment, so a call builds no LtProblem (dtype, math mode, pointer
    mode and epilogue are the thunk's own).  With an epilogue, ``bias`` is its vector (one
    value per row of the column-major out) and ``aux`` its aux matrix (out's layout; its
    address's low byte joins the memo's key)."""
    ap, bp, dp = a.ptr, b.ptr, out.ptr
    key = (ta, tb, rows, cols, k, lda, ldb, ldd, ap & 255, bp & 255, dp & 255)
    if aux is not None:
        key += (aux.ptr & 255,)
    p = problems.get(key, _NEW)
    if p is _NEW:
        p = problems[key] = blaslt.LtProblem(
            dtype, math_mode == _TF32_MATH, ta, tb, rows, cols, k, max(lda, 1), max(ldb, 1),
            max(ldd, 1), device_scalars, 1, 0, 0, 0, epilogue,
            tuple(blaslt.alignment(v) for v in (ap, bp, dp)))
    if p is None:
        return False
    try:
        if aux is not None:
            blaslt.lt_matmul(ctx, p, alpha_p, ap, bp, beta_p, dp,
                             0 if bias is None else bias.ptr, aux.ptr)
        elif bias is None:
            blaslt.lt_matmul(ctx, p, alpha_p, ap, bp, beta_p, dp)
        else:
            blaslt.lt_matmul(ctx, p, alpha_p, ap, bp, beta_p, dp, bias.ptr)
    except blaslt.LtUnsupported:
        problems[key] = None
        return False
    return True


_NEW = object()   # not in a memo yet


def _blas_capturable(thunk: Callable[[], None], scal: "_Scalars | None") -> Callable[[], None]:
    """Mark a BLAS thunk for CUDA-graph capture (symgpu/gpu/exec/graphs.py) unless its scalars go
    through a host-to-device upload each call (device pointer mode fed by a host value), which
    a graph would replay from freed host memory."""
    thunk.launches = True   # type: ignore[attr-defined]
    thunk.capturable = scal is None or not scal.device or all(  # type: ignore[attr-defined]
        c is not None or gpu for c, gpu in zip(scal.const, scal.is_gpu))
    return thunk


# ----------------------------------------------------------------------------- GpuGemv

class GpuGemv(_AccumulatingBlasOp):
    """``y <- beta * y + alpha * dot(A, x)`` (inputs y, alpha, A, x, beta); in place on y when
    ``inplace``.  ``dot(matrix, vector)`` on the GPU is this with beta = 0 on an empty y."""

    infer_shape = _host_blas.Gemv.infer_shape

    def make_node(self, y: Any, alpha: Any, A: Any, x: Any, beta: Any) -> Apply:
        ctx = _ctx_name(y, A, x)
        y = _blas_matrix(y, ctx, 1, "GpuGemv's y")
        A, x = _blas_matrix(A, ctx, 2, "GpuGemv's A"), _blas_matrix(x, ctx, 1, "GpuGemv's x")
        if not (y.dtype == A.dtype == x.dtype):
            raise TypeError(f"GpuGemv needs one dtype, got y {y.dtype}, A {A.dtype}, x {x.dtype}")
        alpha, beta = _scalar_input(alpha, y.dtype, ctx), _scalar_input(beta, y.dtype, ctx)
        out = y.type.clone(broadcastable=(A.broadcastable[0] and y.broadcastable[0],))
        if self.inplace and y.type != out:
            raise TypeError(f"{self}: y ({y.type}) cannot hold the output ({out}) in place")
        return Apply(self, [y, alpha, A, x, beta], [out()])

    def _thunk(self, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
        blas = cublas()
        handle = blas.handle(ctx)
        dtype = node.outputs[0].dtype
        np_dtype = np.dtype(dtype)
        gemv = blas.gemv[dtype]
        scal = _Scalars(node, (1, 4), dtype, ctx, storage_map)
        y_cell, A_cell, x_cell = (storage_map[node.inputs[i]] for i in (0, 2, 3))
        out_cell = storage_map[node.outputs[0]]
        inplace, label = self.inplace, str(self)
        beta_zero = scal.known_zero(1)

        def thunk() -> None:
            ctx.activate()
            y, A, x = y_cell[0], A_cell[0], x_cell[0]
            m, n = A.shape
            if x.shape[0] != n or y.shape[0] not in (m, 1):
                raise ValueError(f"{label}: A {A.shape}, x {x.shape} and y {y.shape} do not "
                                 f"match (y = A @ x needs x of length {n}, y of length {m} "
                                 f"or 1)")
            if inplace and y.shape[0] == m and _inc(y) > 0:
                out = y
            else:
                out = new_array(ctx, (m,), np_dtype)
                if not beta_zero and m:
                    out._copy_from_device(y._broadcast_to((m,)))
            if m and n == 0:
                # BLAS returns early on an empty product without scaling y: do it here
                beta = scal.value(1)
                if beta is None:
                    beta = float(np.asarray(scal.cells[1][0]))
                if beta == 0:
                    out.fill(0)
                elif beta != 1:
                    out.set(np.asarray(beta * out.get(), dtype=np_dtype))
            elif m:
                _check_int(m, n)
                A, op_, ld = _matrix(A)
                if _inc(x) == 0:
                    x = x.copy()
                # op N: memory is A^T (n x m) column-major -> gemv(T, n, m); op T: A itself
                trans, rows, cols = (_T, n, m) if op_ == _N else (_N, m, n)
                (alpha_p, beta_p), keep = scal.args()
                args = (handle, trans, rows, cols, alpha_p, ctypes.c_void_p(A.ptr), max(ld, 1),
                        ctypes.c_void_p(x.ptr), _inc(x), beta_p, ctypes.c_void_p(out.ptr),
                        _inc(out))
                status = _with_pointer_mode(blas, handle, True, lambda: gemv(*args)) \
                    if scal.device else gemv(*args)
                if status:   # (the message is made only then)
                    blas.check(status, f"{label} (gemv {m}x{n})")
                del keep
            out_cell[0] = out

        return _blas_capturable(thunk, scal)


# ----------------------------------------------------------------------------- GpuGer

def _ger_operands(op: int, m: int, n: int, x: Any, y: Any) -> tuple[int, int, Any, Any]:
    """(rows, cols, first vector, second vector) of the column-major ger that adds
    alpha * outer(x, y) to a row-major (m x n) matrix which ``_colmajor`` reads as ``op``:
    N means the memory is its transpose (n x m) column-major, updated by alpha * y x^T;
    T means the memory is the matrix itself column-major, updated by alpha * x y^T."""
    return (n, m, y, x) if op == _N else (m, n, x, y)


class GpuGer(_AccumulatingBlasOp):
    """``A <- A + alpha * outer(x, y)`` (inputs A, alpha, x, y; cuBLAS ger, the rank-1
    update); in place on A when ``inplace``, else into a copy of A from the pool."""

    infer_shape = _host_blas.Ger.infer_shape

    def make_node(self, A: Any, alpha: Any, x: Any, y: Any) -> Apply:
        ctx = _ctx_name(A, x, y)
        A = _blas_matrix(A, ctx, 2, "GpuGer's A")
        x, y = _blas_matrix(x, ctx, 1, "GpuGer's x"), _blas_matrix(y, ctx, 1, "GpuGer's y")
        if not (A.dtype == x.dtype == y.dtype):
            raise TypeError(f"GpuGer needs one dtype, got A {A.dtype}, x {x.dtype}, y {y.dtype}")
        alpha = _scalar_input(alpha, A.dtype, ctx)
        out = A.type.clone(broadcastable=(A.broadcastable[0] and x.broadcastable[0],
                                          A.broadcastable[1] and y.broadcastable[0]))
        if self.inplace and A.type != out:
            raise TypeError(f"{self}: A ({A.type}) cannot hold the output ({out}) in place")
        return Apply(self, [A, alpha, x, y], [out()])

    def _thunk(self, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
        blas = cublas()
        handle = blas.handle(ctx)
        dtype = node.outputs[0].dtype
        np_dtype = np.dtype(dtype)
        ger = blas.ger[dtype]
        scal = _Scalars(node, (1,), dtype, ctx, storage_map)
        A_cell, x_cell, y_cell = (storage_map[node.inputs[i]] for i in (0, 2, 3))
        out_cell = storage_map[node.outputs[0]]
        inplace, label = self.inplace, str(self)

        def thunk() -> None:
            ctx.activate()
            A, x, y = A_cell[0], x_cell[0], y_cell[0]
            m, n = x.shape[0], y.shape[0]
            if A.shape[0] not in (m, 1) or A.shape[1] not in (n, 1):
                raise ValueError(f"{label}: A {A.shape} does not match outer(x, y) of x "
                                 f"{x.shape} and y {y.shape} (A must have shape {(m, n)} or "
                                 f"broadcast to it)")
            layout = _colmajor(A) if inplace and A.shape == (m, n) else None
            if layout is not None:
                out = A
            else:
                out = new_array(ctx, (m, n), np_dtype)
                if out.size:
                    out._copy_from_device(A._broadcast_to((m, n)))
                    layout = _colmajor(out)
            if m and n:
                _check_int(m, n)
                if _inc(x) == 0:
                    x = x.copy()
                if _inc(y) == 0:
                    y = y.copy()
                op_, ld = layout
                rows, cols, u, v = _ger_operands(op_, m, n, x, y)
                (alpha_p,), keep = scal.args()
                status = _with_pointer_mode(
                    blas, handle, scal.device,
                    lambda: ger(handle, rows, cols, alpha_p, ctypes.c_void_p(u.ptr), _inc(u),
                                ctypes.c_void_p(v.ptr), _inc(v), ctypes.c_void_p(out.ptr),
                                max(ld, 1)))
                if status:   # (the message is made only then)
                    blas.check(status, f"{label} (ger {m}x{n})")
                del keep
            out_cell[0] = out

        return _blas_capturable(thunk, scal)


class GpuAllocEmpty(Op):
    """An uninitialised GpuArray of a host-given shape (for outputs that are fully written)."""

    __props__ = ("dtype", "context_name")
    capturable = True   # a pool allocation only (symgpu/gpu/exec/graphs.py)

    def __init__(self, dtype: str, context_name: Any = None):
        self.dtype, self.context_name = str(dtype), context_name

    def __str__(self) -> str:
        return f"GpuAllocEmpty{{dtype='{self.dtype}', context_name={self.context_name!r}}}"

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(node.inputs)]

    def make_node(self, *shape: Any) -> Apply:
        shape = [as_tensor_variable(s) for s in shape]
        for s in shape:
            if s.ndim != 0 or s.dtype[0] not in "iu":
                raise TypeError(f"{self}: shape entries must be integer scalars, got {s.type}")
        bcast = tuple(isinstance(s, Constant) and int(s.data) == 1 for s in shape)
        return Apply(self, shape, [GpuArrayType(self.dtype, bcast, self.context_name)()])

    def perform(self, node, inputs, out):
        shape = tuple(int(s) for s in inputs)
        # a fresh pool block each call: whether last call's array left the call is not this
        # op's to know (symgpu/gpu/exec/graph_plan.escaping), and the pool makes this cheap
        out[0][0] = new_array(_context(self.context_name), shape, np.dtype(self.dtype))


# ----------------------------------------------------------------------------- builders

def gpu_gemm(z: Any, alpha: Any, x: Any, y: Any, beta: Any, inplace: bool = False) -> Variable:
    return GpuGemm(inplace)(z, alpha, x, y, beta)


def gpu_gemv(y: Any, alpha: Any, A: Any, x: Any, beta: Any, inplace: bool = False) -> Variable:
    return GpuGemv(inplace)(y, alpha, A, x, beta)


def gpu_dot22(x: Any, y: Any) -> Variable:
    return GpuDot22()(x, y)


def gpu_ger(A: Any, alpha: Any, x: Any, y: Any, inplace: bool = False) -> Variable:
    return GpuGer(inplace)(A, alpha, x, y)


def gpu_matvec(A: Variable, x: Variable) -> Variable:
    """``dot(A, x)`` as Theano spelt it on the GPU: GpuGemv{inplace} on a GpuAllocEmpty."""
    ctx = A.type.context_name
    y = GpuAllocEmpty(A.dtype, ctx)(GpuShape_i(0)(A))
    zero = np.asarray(0, dtype=A.dtype)
    one = np.asarray(1, dtype=A.dtype)
    return GpuGemv(True)(y, constant(one), A, x, constant(zero))


# ----------------------------------------------------------------------------- Ger lifting

@register_lifter(_host_blas.Ger)
def lift_ger(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Ger(A, alpha, x, y) -> GpuGer (``W + lr * outer(x, y)`` is one call); alpha stays
    where it was (a host alpha is read in host pointer mode, constants once)."""
    A, _, x, y = inputs
    if len({A.dtype, x.dtype, y.dtype}) != 1 or A.dtype not in BLAS_DTYPES:
        return None
    alpha = inputs[1] if inputs.was_on_gpu[1] else inputs.host(1)
    return [GpuGer(False)(A, alpha, x, y)]


