"""The cuBLAS library binding: loading the libraries, the classic entry points with one
handle per context, status names, math and pointer modes.

Why apart from blas.py: cuBLASLt (blaslt.py) loads its library and reports its errors the same
way and runs classic cuBLAS as one of its candidates, and blas.py calls cuBLASLt; both build
on this module, which knows no op.  The process's binding, ``blas.cublas()``, stays in blas.py
(tests replace ``blas._cublas``).  Loading a library happens on first use, never on import.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

__all__ = ["CublasError", "load_library", "context_handle", "Cublas", "with_pointer_mode", "STATUS",
           "DEFAULT_MATH", "TF32_MATH", "POINTER_HOST", "POINTER_DEVICE", "CUDA_DATA_TYPES",
           "COMPUTE_32F", "COMPUTE_32F_FAST_TF32", "COMPUTE_64F", "compute_type"]

POINTER_HOST, POINTER_DEVICE = 0, 1
#: cublasMath_t: CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
DEFAULT_MATH, TF32_MATH = 0, 3
_WORKSPACE_BYTES = 32 << 20         # cuBLAS's own recommendation for Hopper
#: dtype -> cudaDataType (library_types.h): CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF
CUDA_DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
#: cublasComputeType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
_GEMM_DEFAULT = -1                  # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE",
          8: "ARCH_MISMATCH", 11: "MAPPING_ERROR", 13: "EXECUTION_FAILED",
          14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}


_P, _I, _Q = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
#: attribute -> (C name with {t} for S/D, argtypes after the handle): the entry points of the
#: GPU linear algebra (symgpu/gpu/ops/linalg.py), declared so that ints pass as pointers
_LINALG_SIGNATURES = {
    "trsm": ("cublas{t}trsm_v2", [_I, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I]),
    "trsm_batched": ("cublas{t}trsmBatched", [_I, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I,
                                              _I]),
    "getrf_batched": ("cublas{t}getrfBatched", [_I, _P, _I, _P, _P, _I]),
    "getrs_batched": ("cublas{t}getrsBatched", [_I, _I, _I, _P, _I, _P, _P, _I, _P, _I]),
    "getri_batched": ("cublas{t}getriBatched", [_I, _P, _I, _P, _P, _I, _P, _I]),
    "gemm_strided_batched": ("cublas{t}gemmStridedBatched",
                             [_I, _I, _I, _I, _I, _P, _P, _I, _Q, _P, _I, _Q, _P, _P, _I, _Q,
                              _I]),
}


def _linalg_entries(lib: Any) -> dict[str, dict[str, Any]]:
    """attribute -> {dtype: entry point} for _LINALG_SIGNATURES, argtypes set."""
    out = {}
    for attr, (pattern, args) in _LINALG_SIGNATURES.items():
        table = {}
        for dtype, t in (("float32", "S"), ("float64", "D")):
            fn = getattr(lib, pattern.format(t=t))
            fn.argtypes = [_P] + args
            fn.restype = _I
            table[dtype] = fn
        out[attr] = table
    return out


def compute_type(dtype: str, tf32: bool = False) -> int:
    """The cublasComputeType_t of a product of ``dtype``: float64 in double, the half dtypes
    and float32 accumulated in float32 (TF32 tensor cores for float32 when ``tf32``)."""
    if dtype == "float64":
        return COMPUTE_64F
    return COMPUTE_32F_FAST_TF32 if tf32 and dtype == "float32" else COMPUTE_32F


def _gemm_ex(lib: Any, dtype: str) -> Callable[..., int]:
    """``cublasGemmEx`` for ``dtype`` operands with ``cublas<S|D>gemm``'s arguments: A, B and
    C of ``dtype``, float32 accumulation and float32 alpha/beta (the half dtypes' classic
    path; cuBLAS picks tensor-core kernels itself)."""
    fn = lib.cublasGemmEx
    fn.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I]
    fn.restype = _I
    t = CUDA_DATA_TYPES[dtype]

    def gemm(h: Any, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, a: Any, lda: int,
             b: Any, ldb: int, beta: Any, c: Any, ldc: int) -> int:
        return fn(h, ta, tb, m, n, k, alpha, a, t, lda, b, t, ldb, beta, c, t, ldc,
                  COMPUTE_32F, _GEMM_DEFAULT)
    return gemm


class CublasError(RuntimeError):
    """A cuBLAS call failed (or the library could not be loaded)."""


def load_library(what: str, names: Sequence[str], hint: str = "") -> ctypes.CDLL:
    """The first of `names` the loader finds; CublasError naming every try otherwise."""
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise CublasError(f"{what} could not be loaded (" + "; ".join(errors) + ")" + hint)


def context_handle(handles: dict, lock: Any, ctx: Any, create: Callable, set_stream: Callable,
                   check: Callable[[int, str], None], prefix: str) -> ctypes.c_void_p:
    """The library handle of ``ctx`` in ``handles`` (keyed by id(ctx)), created on first use
    with ``create`` and bound to the context's stream with ``set_stream``: every NVIDIA
    library here (cuBLAS, cuSOLVER, cuSPARSE) keeps one handle per context so."""
    h = handles.get(id(ctx))
    if h is None:
        with lock:
            h = handles.get(id(ctx))
            if h is None:
                ctx.activate()
                h = ctypes.c_void_p()
                check(create(ctypes.byref(h)), f"{prefix}Create")
                check(set_stream(h, ctypes.c_void_p(ctx.stream_handle)), f"{prefix}SetStream")
                handles[id(ctx)] = h
    return h


class Cublas:
    """The loaded library, its entry points and one handle per context."""

    def __init__(self) -> None:
        lib = load_library("cuBLAS", ("libcublas.so.13", "libcublas.so.12", "libcublas.so"),
                           "; install the CUDA toolkit's libcublas or add it to "
                           "LD_LIBRARY_PATH")
        self.lib = lib
        self.gemm = {"float32": lib.cublasSgemm_v2, "float64": lib.cublasDgemm_v2,
                     "float16": _gemm_ex(lib, "float16"), "bfloat16": _gemm_ex(lib, "bfloat16")}
        fn = lib.cublasGemmStridedBatchedEx
        fn.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I, _Q, _P, _I, _I, _Q, _P, _P, _I,
                       _I, _Q, _I, _I, _I]
        fn.restype = _I
        self._strided_batched_ex = fn
        self.gemv = {"float32": lib.cublasSgemv_v2, "float64": lib.cublasDgemv_v2}
        self.ger = {"float32": lib.cublasSger_v2, "float64": lib.cublasDger_v2}
        for attr, table in _linalg_entries(lib).items():   # GPU linear algebra (linalg.py)
            setattr(self, attr, table)
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.math_modes: dict[int, int] = {}     # handle -> the cublasMath_t it was last set to
        self.workspaces: dict[int, Any] = {}
        self.lock = threading.Lock()

    def handle(self, ctx: Any) -> ctypes.c_void_p:
        """The handle of ``ctx``, created on first use and bound to its stream."""
        h = self.handles.get(id(ctx))
        if h is None:
            with self.lock:
                ctx.activate()
                h = ctypes.c_void_p()
                self.check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
                self.check(self.lib.cublasSetStream_v2(h, ctypes.c_void_p(ctx.stream_handle)),
                           "cublasSetStream")
                self._set_workspace(h, ctx)
                self.handles[id(ctx)] = h
        return h

    def _set_workspace(self, h: ctypes.c_void_p, ctx: Any) -> None:
        """Give the handle a workspace of our own (after cublasSetStream, which resets it),
        so cuBLAS allocates nothing while a CUDA graph is being captured (graphs.py).
        Best effort: without the call cuBLAS keeps its own workspace pool."""
        fn = getattr(self.lib, "cublasSetWorkspace_v2", None)
        if fn is None or getattr(ctx, "pool", None) is None:
            return
        try:
            block = ctx.pool.allocate(_WORKSPACE_BYTES)
        except MemoryError:   # a full device: cuBLAS keeps its own workspace
            return
        if fn(h, ctypes.c_void_p(block.ptr), ctypes.c_size_t(_WORKSPACE_BYTES)) == 0:
            self.workspaces[id(ctx)] = block    # alive as long as the handle

    def gemm_strided_batched_ex(self, h: Any, dtype: str, compute: int, ta: int, tb: int,
                                m: int, n: int, k: int, alpha: Any, a: Any, lda: int, sa: int,
                                b: Any, ldb: int, sb: int, beta: Any, c: Any, ldc: int,
                                sc: int, batch: int) -> int:
        """``cublasGemmStridedBatchedEx`` of ``batch`` column-major products, operands of
        ``dtype``, the given compute type (alpha/beta of the compute type's scale: float
        for 32F, double for 64F); the status."""
        t = CUDA_DATA_TYPES[dtype]
        return self._strided_batched_ex(h, ta, tb, m, n, k, alpha, a, t, lda, sa, b, t, ldb,
                                        sb, beta, c, t, ldc, sc, batch, compute,
                                        _GEMM_DEFAULT)

    def math_mode(self, h: ctypes.c_void_p, mode: int) -> None:
        """Set the handle's math mode if it differs (a host-side setting: the calls that
        follow, captured ones included, use it)."""
        if self.math_modes.get(h.value) != mode:
            self.check(self.lib.cublasSetMathMode(h, mode), "cublasSetMathMode")
            self.math_modes[h.value] = mode

    def pointer_mode(self, h: ctypes.c_void_p, mode: int) -> None:
        self.check(self.lib.cublasSetPointerMode_v2(h, mode), "cublasSetPointerMode")

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            raise CublasError(f"{what} failed: CUBLASSTATUS_{STATUS.get(status, status)}")


def with_pointer_mode(blas: Any, handle: Any, device: bool, call: Callable[[], int]) -> int:
    """`call()`'s status; with `device`, cuBLAS reads alpha/beta from device memory while it
    runs, and the shared handle is back in host mode afterwards, even if it raised."""
    if not device:
        return call()
    blas.pointer_mode(handle, POINTER_DEVICE)
    try:
        return call()
    finally:
        blas.pointer_mode(handle, POINTER_HOST)
