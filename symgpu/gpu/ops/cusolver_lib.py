"""The cuSOLVER dense (cusolverDn) binding: loading the library on first use, one handle per
context bound to its stream, status names, and the entry points GPU linear algebra
(symgpu/gpu/ops/linalg.py) calls, with their C signatures declared (no cuSOLVER headers are
needed: the toolkit's headers may be absent where symgpu is installed).

Why apart from linalg.py: tests replace the process binding (``cusolver_lib._cusolver``) by a
fake that does the arithmetic with NumPy, so the ops' argument mapping is tested without a GPU.
Enum values used (cusolver_common.h / cublas_api.h): cublasFillMode_t LOWER=0 UPPER=1,
cublasOperation_t N=0 T=1, cublasSideMode_t LEFT=0 RIGHT=1, cublasDiagType_t NON_UNIT=0
UNIT=1, cusolverEigMode_t NOVECTOR=0 VECTOR=1; cudaDataType (library_types.h) CUDA_R_32F=0
CUDA_R_64F=1. The 64-bit ("X") entry points take a cusolverDnParams_t (one per context here)
and report their device and host workspaces in bytes; their signatures are cusolverDn.h's
(CUDA 13): Xpotrf(handle, params, uplo, n, dataTypeA, A, lda, computeType, bufferOnDevice,
bytesOnDevice, bufferOnHost, bytesOnHost, info); XsyevBatched(handle, params, jobz, uplo, n,
dataTypeA, A, lda, dataTypeW, W, computeType, bufferOnDevice, bytesOnDevice, bufferOnHost,
bytesOnHost, info, batchSize) (cuSOLVER 11.7 / CUDA 12.6.2 and later).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from symgpu.gpu.ops.cublas_lib import context_handle, load_library

__all__ = ["CusolverError", "Cusolver", "cusolver", "CUSOLVER_STATUS", "FILL_LOWER",
           "FILL_UPPER", "OP_N", "OP_T", "SIDE_LEFT", "SIDE_RIGHT", "DIAG_NON_UNIT",
           "DIAG_UNIT", "EIG_NOVECTOR", "EIG_VECTOR", "CUDA_R"]

FILL_LOWER, FILL_UPPER = 0, 1
OP_N, OP_T = 0, 1
SIDE_LEFT, SIDE_RIGHT = 0, 1
DIAG_NON_UNIT, DIAG_UNIT = 0, 1
EIG_NOVECTOR, EIG_VECTOR = 0, 1
#: dtype -> cudaDataType
CUDA_R = {"float32": 0, "float64": 1}

CUSOLVER_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE",
                   4: "ARCH_MISMATCH", 5: "MAPPING_ERROR", 6: "EXECUTION_FAILED",
                   7: "INTERNAL_ERROR", 8: "MATRIX_TYPE_NOT_SUPPORTED", 9: "NOT_SUPPORTED",
                   10: "ZERO_PIVOT", 11: "INVALID_LICENSE"}

_P, _I, _Q, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
# name (with {t} for S/D) -> argtypes after the handle
_SIGNATURES = {
    "cusolverDn{t}potrf_bufferSize": [_I, _I, _P, _I, _P],
    "cusolverDn{t}potrf": [_I, _I, _P, _I, _P, _I, _P],
    "cusolverDn{t}potrfBatched": [_I, _I, _P, _I, _P, _I],
    "cusolverDn{t}getrf_bufferSize": [_I, _I, _P, _I, _P],
    "cusolverDn{t}getrf": [_I, _I, _P, _I, _P, _P, _P],
    "cusolverDn{t}getrs": [_I, _I, _I, _P, _I, _P, _P, _I, _P],
    "cusolverDn{t}syevd_bufferSize": [_I, _I, _I, _P, _I, _P, _P],
    "cusolverDn{t}syevd": [_I, _I, _I, _P, _I, _P, _P, _I, _P],
    "cusolverDn{t}syevjBatched_bufferSize": [_I, _I, _I, _P, _I, _P, _P, _P, _I],
    "cusolverDn{t}syevjBatched": [_I, _I, _I, _P, _I, _P, _P, _I, _P, _P, _I],
    "cusolverDn{t}geqrf_bufferSize": [_I, _I, _P, _I, _P],
    "cusolverDn{t}geqrf": [_I, _I, _P, _I, _P, _P, _I, _P],
    "cusolverDn{t}orgqr_bufferSize": [_I, _I, _I, _P, _I, _P, _P],
    "cusolverDn{t}orgqr": [_I, _I, _I, _P, _I, _P, _P, _I, _P],
    # (jobz, econ, m, n, A, lda, S, U, ldu, V, ldv, lwork* | work, lwork, info, params)
    "cusolverDn{t}gesvdj_bufferSize": [_I, _I, _I, _I, _P, _I, _P, _P, _I, _P, _I, _P, _P],
    "cusolverDn{t}gesvdj": [_I, _I, _I, _I, _P, _I, _P, _P, _I, _P, _I, _P, _I, _P, _P],
    # (jobz, m, n, A, lda, S, U, ldu, V, ldv, lwork* | work, lwork, info, params, batch)
    "cusolverDn{t}gesvdjBatched_bufferSize": [_I, _I, _I, _P, _I, _P, _P, _I, _P, _I, _P, _P,
                                              _I],
    "cusolverDn{t}gesvdjBatched": [_I, _I, _I, _P, _I, _P, _P, _I, _P, _I, _P, _I, _P, _P,
                                   _I],
}
#: the 64-bit API (one entry point for every dtype): name -> argtypes after the handle
_X_SIGNATURES = {
    "cusolverDnXpotrf_bufferSize": [_P, _I, _Q, _I, _P, _Q, _I, _P, _P],
    "cusolverDnXpotrf": [_P, _I, _Q, _I, _P, _Q, _I, _P, _SZ, _P, _SZ, _P],
    "cusolverDnXsyevBatched_bufferSize": [_P, _I, _I, _Q, _I, _P, _Q, _I, _P, _I, _P, _P, _Q],
    "cusolverDnXsyevBatched": [_P, _I, _I, _Q, _I, _P, _Q, _I, _P, _I, _P, _SZ, _P, _SZ, _P,
                               _Q],
}
_LETTER = {"float32": "S", "float64": "D"}


class CusolverError(RuntimeError):
    """A cuSOLVER call failed (or the library could not be loaded)."""


class Cusolver:
    """The loaded library, its entry points per dtype (``self.potrf['float32']`` ...), one
    handle per context and one syevj parameter object per handle (host-side settings)."""

    def __init__(self) -> None:
        try:
            lib = load_library("cuSOLVER", ("libcusolver.so.12", "libcusolver.so.11",
                                            "libcusolver.so"),
                               "; install the CUDA toolkit's libcusolver or add it to "
                               "LD_LIBRARY_PATH")
        except RuntimeError as exc:
            raise CusolverError(str(exc)) from exc
        self.lib = lib
        for pattern, args in _SIGNATURES.items():
            table = {}
            for dtype, t in _LETTER.items():
                fn = getattr(lib, pattern.format(t=t))
                fn.argtypes = [_P] + args
                fn.restype = _I
                table[dtype] = fn
            setattr(self, pattern.format(t="")[len("cusolverDn"):], table)
        for name, args in _X_SIGNATURES.items():
            # absent from cuSOLVER before 11.7 (XsyevBatched): None, and callers fall back
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [_P] + args
                fn.restype = _I
            setattr(self, name[len("cusolverDn"):], fn)
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.syevj_params: dict[int, ctypes.c_void_p] = {}
        self.gesvdj_params: dict[int, ctypes.c_void_p] = {}
        self.x_params: dict[int, ctypes.c_void_p] = {}
        self.lock = threading.Lock()

    def handle(self, ctx: Any) -> ctypes.c_void_p:
        """The handle of ``ctx``, created on first use and bound to its stream."""
        return context_handle(self.handles, self.lock, ctx, self.lib.cusolverDnCreate,
                              self.lib.cusolverDnSetStream, self.check, "cusolverDn")

    def syevj_info(self, ctx: Any) -> ctypes.c_void_p:
        """The syevjInfo_t of ``ctx``'s handle (defaults: tolerance = machine precision,
        100 sweeps, eigenvalues sorted ascending)."""
        p = self.syevj_params.get(id(ctx))
        if p is None:
            p = ctypes.c_void_p()
            self.check(self.lib.cusolverDnCreateSyevjInfo(ctypes.byref(p)),
                       "cusolverDnCreateSyevjInfo")
            self.syevj_params[id(ctx)] = p
        return p

    def gesvdj_info(self, ctx: Any) -> ctypes.c_void_p:
        """The gesvdjInfo_t of ``ctx``'s handle (defaults: tolerance = machine precision,
        100 sweeps, singular values sorted descending, as NumPy's)."""
        p = self.gesvdj_params.get(id(ctx))
        if p is None:
            p = ctypes.c_void_p()
            self.check(self.lib.cusolverDnCreateGesvdjInfo(ctypes.byref(p)),
                       "cusolverDnCreateGesvdjInfo")
            self.gesvdj_params[id(ctx)] = p
        return p

    def params(self, ctx: Any) -> ctypes.c_void_p:
        """The cusolverDnParams_t of ``ctx``'s handle (default algorithms) for the 64-bit
        API."""
        p = self.x_params.get(id(ctx))
        if p is None:
            p = ctypes.c_void_p()
            self.check(self.lib.cusolverDnCreateParams(ctypes.byref(p)),
                       "cusolverDnCreateParams")
            self.x_params[id(ctx)] = p
        return p

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            raise CusolverError(f"{what} failed: CUSOLVER_STATUS_"
                                f"{CUSOLVER_STATUS.get(status, status)}")


_cusolver: Any = None
_lock = threading.Lock()


def cusolver() -> Any:
    """The process's cuSOLVER binding, loaded on first use (tests replace ``_cusolver``)."""
    global _cusolver
    if _cusolver is None:
        with _lock:
            if _cusolver is None:
                _cusolver = Cusolver()
    return _cusolver
