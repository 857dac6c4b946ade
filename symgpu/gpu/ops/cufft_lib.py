"""cuFFT through ctypes: the library (loaded on first use), real<->complex batched plans
cached per (context, direction, dtype, shape), and the execution calls GpuRFFT/GpuIRFFT need.

Why plans of our own making: a plan made with ``cufftCreate`` + ``cufftSetAutoAllocation(0)``
+ ``cufftMakePlanMany`` owns no work area; each call takes one from the context's memory pool
(``cufftSetWorkArea``) and runs on the context's stream (``cufftSetStream``), so an execution
only queues work there and is captured into CUDA graphs with the rest of a function (a plan
is made at a plain run: the graph runner runs a new key plainly before it captures it).
Enum values are those of NVIDIA's cufft.h (cuFFT 11 and 12 agree): cufftType_t R2C 0x2a,
C2R 0x2c, D2Z 0x6a, Z2D 0x6c; cufftResult_t 0..16 as in STATUS.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Callable, Sequence

from symgpu.gpu.ops.cublas_lib import CublasError, load_library

__all__ = ["CufftError", "Cufft", "FftPlan", "cufft", "cufft_available", "TYPES", "STATUS"]

#: (direction, dtype) -> cufftType_t: 'r2c' the forward real transform, 'c2r' its inverse
TYPES = {("r2c", "float32"): 0x2a, ("c2r", "float32"): 0x2c,
         ("r2c", "float64"): 0x6a, ("c2r", "float64"): 0x6c}
_EXEC = {0x2a: "cufftExecR2C", 0x2c: "cufftExecC2R", 0x6a: "cufftExecD2Z",
         0x6c: "cufftExecZ2D"}
STATUS = {0: "SUCCESS", 1: "INVALID_PLAN", 2: "ALLOC_FAILED", 3: "INVALID_TYPE",
          4: "INVALID_VALUE", 5: "INTERNAL_ERROR", 6: "EXEC_FAILED", 7: "SETUP_FAILED",
          8: "INVALID_SIZE", 9: "UNALIGNED_DATA", 10: "INCOMPLETE_PARAMETER_LIST",
          11: "INVALID_DEVICE", 12: "PARSE_ERROR", 13: "NO_WORKSPACE", 14: "NOT_IMPLEMENTED",
          15: "LICENSE_ERROR", 16: "NOT_SUPPORTED"}
_INT_P = ctypes.POINTER(ctypes.c_int)
_VP = ctypes.c_void_p


class CufftError(RuntimeError):
    """A cuFFT call failed, or the library could not be loaded."""


def _declare(lib: Any) -> None:
    """argtypes from cufft.h (cufftHandle is an int; cudaStream_t and data are pointers)."""
    lib.cufftCreate.argtypes = [_INT_P]
    lib.cufftSetAutoAllocation.argtypes = [ctypes.c_int, ctypes.c_int]
    # cufftMakePlanMany(plan, rank, n, inembed, istride, idist, onembed, ostride, odist,
    #                   type, batch, size_t *workSize)
    lib.cufftMakePlanMany.argtypes = [ctypes.c_int, ctypes.c_int, _INT_P, _INT_P, ctypes.c_int,
                                      ctypes.c_int, _INT_P, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_size_t)]
    lib.cufftSetWorkArea.argtypes = [ctypes.c_int, _VP]
    lib.cufftSetStream.argtypes = [ctypes.c_int, _VP]
    lib.cufftDestroy.argtypes = [ctypes.c_int]
    for name in _EXEC.values():
        getattr(lib, name).argtypes = [ctypes.c_int, _VP, _VP]
    for name in ("cufftCreate", "cufftSetAutoAllocation", "cufftMakePlanMany",
                 "cufftSetWorkArea", "cufftSetStream", "cufftDestroy", *_EXEC.values()):
        getattr(lib, name).restype = ctypes.c_int


def check(status: int, what: str) -> None:
    """CufftError naming the call and cuFFT's status for a nonzero status."""
    if status:
        raise CufftError(f"{what} failed: CUFFT_{STATUS.get(status, status)}")


class FftPlan:
    """One batched real<->complex plan: `batch` transforms of shape `n` (the real side's
    shape), packed on both sides; destroyed with the object (not at interpreter exit)."""

    def __init__(self, lib: Any, stream: int, direction: str, dtype: str, batch: int,
                 n: Sequence[int]) -> None:
        self.lib, self.direction, self.dtype = lib, direction, dtype
        self.batch, self.n = int(batch), tuple(int(v) for v in n)
        self.type = TYPES[(direction, dtype)]
        half = self.n[:-1] + (self.n[-1] // 2 + 1,)
        real_dist, cplx_dist = _prod(self.n), _prod(half)
        inembed, onembed = (self.n, half) if direction == "r2c" else (half, self.n)
        idist, odist = (real_dist, cplx_dist) if direction == "r2c" else (cplx_dist, real_dist)
        rank = len(self.n)
        arr = ctypes.c_int * rank
        self.handle = ctypes.c_int(0)
        check(lib.cufftCreate(ctypes.byref(self.handle)), "cufftCreate")
        self._alive = True
        check(lib.cufftSetAutoAllocation(self.handle, 0), "cufftSetAutoAllocation")
        size = ctypes.c_size_t(0)
        check(lib.cufftMakePlanMany(self.handle, rank, arr(*self.n), arr(*inembed), 1, idist,
                                    arr(*onembed), 1, odist, self.type, self.batch,
                                    ctypes.byref(size)),
              f"cufftMakePlanMany ({direction} {dtype}, batch {self.batch} of shape {self.n})")
        self.workspace = int(size.value)
        check(lib.cufftSetStream(self.handle, _VP(stream or None)), "cufftSetStream")
        self._exec_name = _EXEC[self.type]
        self._exec = getattr(lib, self._exec_name)

    def execute(self, src_ptr: int, dst_ptr: int, work_ptr: int) -> None:
        """Queue the transform src -> dst on the plan's stream, `work_ptr` its work area
        (`workspace` bytes; 0 when none is needed)."""
        if self.workspace:
            check(self.lib.cufftSetWorkArea(self.handle, _VP(work_ptr)), "cufftSetWorkArea")
        check(self._exec(self.handle, _VP(src_ptr), _VP(dst_ptr)),
              f"{self._exec_name} (batch {self.batch} of shape {self.n}, {self.dtype})")

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        if getattr(self, "_alive", False) and not _finalizing():
            # at interpreter exit libcufft (or the CUDA context) may be gone already
            self.lib.cufftDestroy(self.handle)
            self._alive = False


def _prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


class Cufft:
    """The loaded library and its plans, one per (context, direction, dtype, batch, shape)."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            lib = load_library("cuFFT", ("libcufft.so.12", "libcufft.so.11", "libcufft.so"),
                               "; install the CUDA toolkit's libcufft or add it to "
                               "LD_LIBRARY_PATH")
            _declare(lib)
        self.lib = lib
        self.plans: dict[tuple, FftPlan] = {}
        self.lock = threading.Lock()

    def plan(self, ctx: Any, direction: str, dtype: str, batch: int,
             n: Sequence[int]) -> FftPlan:
        """The cached plan of this geometry on ``ctx`` (made on first use, bound to its
        stream)."""
        key = (id(ctx), direction, dtype, int(batch), tuple(n))
        got = self.plans.get(key)
        if got is None:
            with self.lock:
                got = self.plans.get(key)
                if got is None:
                    ctx.activate()
                    got = self.plans[key] = FftPlan(self.lib, ctx.stream_handle, direction,
                                                    dtype, batch, n)
        return got


_lib: Cufft | None = None
_error: CufftError | None = None


def cufft() -> Cufft:
    """The process's cuFFT binding (loaded on first use; CufftError where unavailable)."""
    global _lib, _error
    if _lib is None:
        if _error is not None:
            raise _error
        try:
            _lib = Cufft()
        except (CublasError, AttributeError) as exc:
            _error = CufftError(str(exc))
            raise _error from exc
    return _lib


def cufft_available() -> bool:
    """Whether libcufft loads here."""
    try:
        cufft()
        return True
    except CufftError:
        return False
