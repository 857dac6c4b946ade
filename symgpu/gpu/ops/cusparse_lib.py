"""The cuSPARSE binding (generic API): loading the library on first use, one handle per
context bound to its stream, sparse/dense matrix and dense vector descriptors, SpMM, SDDMM
and SpMV.

Why ctypes with our own declarations: the build machines have no cuSPARSE headers; the
signatures are NVIDIA's documented C ones (cusparse.h, CUDA 12/13). The process's binding is
`cusparse()`; tests replace `_cusparse` with a fake that records the calls. Enum values we
rely on (cusparse.h / library_types.h): cusparseOperation_t NON_TRANSPOSE 0, TRANSPOSE 1;
cusparseOrder_t COL 1, ROW 2; cusparseIndexType_t 32I 2; cusparseIndexBase_t ZERO 0;
cudaDataType CUDA_R_32F 0, CUDA_R_64F 1; cusparseSpMMAlg_t ALG_DEFAULT 0, CSR_ALG1 4,
CSR_ALG2 6, CSR_ALG3 12; cusparseSDDMMAlg_t DEFAULT 0; cusparseSpMVAlg_t ALG_DEFAULT 0,
CSR_ALG1 2, CSR_ALG2 3; cusparseStatus_t NOT_SUPPORTED 10. SpMV's signature is SpMM's
without opB: (handle, opA, alpha, A, x, beta, y, computeType, alg, buffer | bufferSize*).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from symgpu.gpu.ops.cublas_lib import CublasError, context_handle, load_library

__all__ = ["CusparseError", "Cusparse", "cusparse", "STATUS", "OP_N", "OP_T", "ORDER_COL",
           "ORDER_ROW", "CUDA_R", "SPMM_ALG_DEFAULT", "SPMM_CSR_ALG1", "SPMM_CSR_ALG2",
           "SPMM_CSR_ALG3", "SDDMM_ALG_DEFAULT", "SPMV_ALG_DEFAULT", "SPMV_CSR_ALG1",
           "SPMV_CSR_ALG2", "NOT_SUPPORTED"]

OP_N, OP_T = 0, 1
ORDER_COL, ORDER_ROW = 1, 2
INDEX_32I, INDEX_BASE_ZERO = 2, 0
CUDA_R = {"float32": 0, "float64": 1}
SPMM_ALG_DEFAULT, SPMM_CSR_ALG1, SPMM_CSR_ALG2, SPMM_CSR_ALG3 = 0, 4, 6, 12
SDDMM_ALG_DEFAULT = 0
SPMV_ALG_DEFAULT, SPMV_CSR_ALG1, SPMV_CSR_ALG2 = 0, 2, 3
NOT_SUPPORTED = 10
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "ALLOC_FAILED", 3: "INVALID_VALUE",
          4: "ARCH_MISMATCH", 5: "MAPPING_ERROR", 6: "EXECUTION_FAILED", 7: "INTERNAL_ERROR",
          8: "MATRIX_TYPE_NOT_SUPPORTED", 9: "ZERO_PIVOT", 10: "NOT_SUPPORTED",
          11: "INSUFFICIENT_RESOURCES"}

_P, _I64, _I32, _SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
# (handle, opA, opB, alpha, A, B, beta, C, computeType, alg) + buffer size / buffer
_MM = [_P, _I32, _I32, _P, _P, _P, _P, _P, _I32, _I32]
# (handle, opA, alpha, A, x, beta, y, computeType, alg) + buffer size / buffer
_MV = [_P, _I32, _P, _P, _P, _P, _P, _I32, _I32]
_SIGNATURES = {
    "cusparseCreate": [ctypes.POINTER(_P)],
    "cusparseSetStream": [_P, _P],
    # (descr*, rows, cols, nnz, offsets, indices, values, offsetType, indexType, base, valueType)
    "cusparseCreateCsr": [ctypes.POINTER(_P), _I64, _I64, _I64, _P, _P, _P, _I32, _I32, _I32,
                          _I32],
    "cusparseSpMatSetValues": [_P, _P],
    "cusparseDestroySpMat": [_P],
    # (descr*, rows, cols, ld, values, valueType, order)
    "cusparseCreateDnMat": [ctypes.POINTER(_P), _I64, _I64, _I64, _P, _I32, _I32],
    "cusparseDnMatSetValues": [_P, _P],
    "cusparseDestroyDnMat": [_P],
    "cusparseSpMM_bufferSize": _MM + [ctypes.POINTER(_SZ)],
    "cusparseSpMM_preprocess": _MM + [_P],
    "cusparseSpMM": _MM + [_P],
    "cusparseSDDMM_bufferSize": _MM + [ctypes.POINTER(_SZ)],
    "cusparseSDDMM_preprocess": _MM + [_P],
    "cusparseSDDMM": _MM + [_P],
    # (descr*, size, values, valueType)
    "cusparseCreateDnVec": [ctypes.POINTER(_P), _I64, _P, _I32],
    "cusparseDnVecSetValues": [_P, _P],
    "cusparseDestroyDnVec": [_P],
    "cusparseSpMV_bufferSize": _MV + [ctypes.POINTER(_SZ)],
    "cusparseSpMV": _MV + [_P],
}
#: present in newer libraries only (cusparseSpMV_preprocess: CUDA 12.4 and later): None
#: where absent, and the preprocessing is skipped
_OPTIONAL = {"cusparseSpMV_preprocess": _MV + [_P]}


class CusparseError(RuntimeError):
    """A cuSPARSE call failed (or the library could not be loaded); `status` is the code."""

    def __init__(self, message: str, status: int = -1):
        super().__init__(message)
        self.status = status


class Cusparse:
    """The loaded library, its entry points (argtypes declared) and one handle per
    context. Methods take device addresses as ints and return descriptors as ints."""

    def __init__(self) -> None:
        try:
            lib = load_library("cuSPARSE", ("libcusparse.so.12", "libcusparse.so"),
                               "; install the CUDA toolkit's libcusparse or add it to "
                               "LD_LIBRARY_PATH")
        except CublasError as exc:
            raise CusparseError(str(exc)) from None
        self.lib = lib
        self.fn = {}
        for name, argtypes in _SIGNATURES.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = argtypes, ctypes.c_int
            self.fn[name] = f
        for name, argtypes in _OPTIONAL.items():
            f = getattr(lib, name, None)
            if f is not None:
                f.argtypes, f.restype = argtypes, ctypes.c_int
            self.fn[name] = f
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.lock = threading.Lock()

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            raise CusparseError(f"{what} failed: CUSPARSE_STATUS_{STATUS.get(status, status)}",
                                status)

    def handle(self, ctx: Any) -> int:
        """The handle of `ctx`, created on first use and bound to its stream."""
        return context_handle(self.handles, self.lock, ctx, self.fn["cusparseCreate"],
                              self.fn["cusparseSetStream"], self.check, "cusparse").value

    def csr(self, rows: int, cols: int, nnz: int, indptr: int, indices: int, data: int,
            dtype: str) -> int:
        """A CSR descriptor over device arrays (int32 indices, zero-based)."""
        d = _P()
        self.check(self.fn["cusparseCreateCsr"](ctypes.byref(d), rows, cols, nnz, _P(indptr),
                                                _P(indices), _P(data), INDEX_32I, INDEX_32I,
                                                INDEX_BASE_ZERO, CUDA_R[dtype]),
                   f"cusparseCreateCsr({rows}x{cols}, nnz={nnz}, {dtype})")
        return d.value

    def dense(self, rows: int, cols: int, ld: int, ptr: int, dtype: str, order: int) -> int:
        d = _P()
        self.check(self.fn["cusparseCreateDnMat"](ctypes.byref(d), rows, cols, ld, _P(ptr),
                                                  CUDA_R[dtype], order),
                   f"cusparseCreateDnMat({rows}x{cols}, ld={ld}, {dtype}, order={order})")
        return d.value

    def vector(self, size: int, ptr: int, dtype: str) -> int:
        """A dense vector descriptor over `size` elements at `ptr`."""
        d = _P()
        self.check(self.fn["cusparseCreateDnVec"](ctypes.byref(d), size, _P(ptr), CUDA_R[dtype]),
                   f"cusparseCreateDnVec({size}, {dtype})")
        return d.value

    def set_vector_values(self, descr: int, ptr: int) -> None:
        self.check(self.fn["cusparseDnVecSetValues"](_P(descr), _P(ptr)),
                   "cusparseDnVecSetValues")

    def destroy_vector(self, descr: int) -> None:
        self.check(self.fn["cusparseDestroyDnVec"](_P(descr)), "cusparseDestroyDnVec")

    def set_dense_values(self, descr: int, ptr: int) -> None:
        self.check(self.fn["cusparseDnMatSetValues"](_P(descr), _P(ptr)),
                   "cusparseDnMatSetValues")

    def set_sparse_values(self, descr: int, ptr: int) -> None:
        self.check(self.fn["cusparseSpMatSetValues"](_P(descr), _P(ptr)),
                   "cusparseSpMatSetValues")

    def destroy_sparse(self, descr: int) -> None:
        self.check(self.fn["cusparseDestroySpMat"](_P(descr)), "cusparseDestroySpMat")

    def destroy_dense(self, descr: int) -> None:
        self.check(self.fn["cusparseDestroyDnMat"](_P(descr)), "cusparseDestroyDnMat")

    @staticmethod
    def _scalars(dtype: str) -> tuple:
        c = ctypes.c_float if dtype == "float32" else ctypes.c_double
        return c(1.0), c(0.0)

    def _mm(self, name: str, h: int, op_a: int, op_b: int, a: int, b: int, c: int,
            dtype: str, alg: int, last: Any) -> int:
        """C = 1 * op(A) op(B) + 0 * C; for SpMV (no opB in its signature, `op_b` unused)
        y = 1 * op(A) x + 0 * y."""
        one, zero = self._scalars(dtype)
        alpha, beta = ctypes.cast(ctypes.byref(one), _P), ctypes.cast(ctypes.byref(zero), _P)
        if name.startswith("cusparseSpMV"):
            return self.fn[name](_P(h), op_a, alpha, _P(a), _P(b), beta, _P(c), CUDA_R[dtype],
                                 alg, last)
        return self.fn[name](_P(h), op_a, op_b, alpha, _P(a), _P(b), beta, _P(c),
                             CUDA_R[dtype], alg, last)

    def buffer_size(self, what: str, h: int, op_a: int, op_b: int, a: int, b: int, c: int,
                    dtype: str, alg: int) -> int:
        """cusparse{what}_bufferSize (what: 'SpMM', 'SDDMM' or 'SpMV') for
        C = 1 * op(A) op(B) + 0 * C;
        raises CusparseError (status NOT_SUPPORTED for a refused combination)."""
        size = _SZ()
        self.check(self._mm(f"cusparse{what}_bufferSize", h, op_a, op_b, a, b, c, dtype, alg,
                            ctypes.byref(size)),
                   f"cusparse{what}_bufferSize(opA={op_a}, opB={op_b}, {dtype}, alg={alg})")
        return size.value

    def preprocess(self, what: str, h: int, op_a: int, op_b: int, a: int, b: int, c: int,
                   dtype: str, alg: int, buf: int) -> None:
        if self.fn.get(f"cusparse{what}_preprocess", True) is None:
            return          # an older library without this preprocessing step
        self.check(self._mm(f"cusparse{what}_preprocess", h, op_a, op_b, a, b, c, dtype, alg,
                            _P(buf or None)), f"cusparse{what}_preprocess")

    def run(self, what: str, h: int, op_a: int, op_b: int, a: int, b: int, c: int,
            dtype: str, alg: int, buf: int) -> None:
        """cusparseSpMM / cusparseSDDMM / cusparseSpMV, queued on the handle's stream."""
        self.check(self._mm(f"cusparse{what}", h, op_a, op_b, a, b, c, dtype, alg,
                            _P(buf or None)), f"cusparse{what}(opA={op_a}, {dtype}, alg={alg})")


_cusparse: Cusparse | None = None
_load_lock = threading.Lock()


def cusparse() -> Cusparse:
    """The process's cuSPARSE binding, loaded on first use (tests replace `_cusparse`)."""
    global _cusparse
    if _cusparse is None:
        with _load_lock:
            if _cusparse is None:
                _cusparse = Cusparse()
    return _cusparse
