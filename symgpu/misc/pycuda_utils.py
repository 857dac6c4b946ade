"""Convert between symgpu's ``GpuArray`` and PyCUDA's ``GPUArray`` without copying.

Theano's ``theano.misc.pycuda_utils``, for symgpu:

* :func:`to_gpuarray` ``(x, copyif=False)`` — a ``pycuda.gpuarray.GPUArray`` over ``x``'s
  memory.  PyCUDA arrays (and the raw kernels written for them, which index ``gpudata[i]``)
  assume C-contiguous data, so a strided ``x`` raises ``ValueError`` unless ``copyif=True``,
  which returns a C-contiguous *copy* (that one does not share memory with ``x``).
* :func:`from_gpuarray` ``(g)`` — a symgpu ``GpuArray`` over ``g``'s memory, strided views
  included.

Lifetimes: each side keeps the other alive.  The PyCUDA array's ``gpudata`` is a
``PointerHolderBase`` holding ``x`` (and ``base`` is ``x``), so ``x``'s pool block is not
reused while PyCUDA (or any view PyCUDA made of it) holds it; the GpuArray from
:func:`from_gpuarray` owns ``g``, so ``g``'s allocation stays until every symgpu view is gone.

Ordering: symgpu queues work on its context's stream, PyCUDA on the legacy default stream
(or a stream you pass).  Both functions make the consumer's stream wait for the producer's
queued work with an event (no host synchronisation); pass ``stream=`` when PyCUDA work runs
on a ``pycuda.driver.Stream`` of yours.

Both sides must use the same CUDA context: use ``import symgpu.misc.pycuda_init`` (or
``pycuda.autoprimaryctx``), not ``pycuda.autoinit``.  PyCUDA is imported inside the
functions, so this module imports on machines without it.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from symgpu.gpu.runtime import libcuda
from symgpu.gpu.runtime.array import GpuArray, from_cuda_array_interface
from symgpu.gpu.runtime.context import foreign_stream_waits, wait_for_foreign_stream

__all__ = ["to_gpuarray", "from_gpuarray"]

_holder_cls: Any = None
_CU_POINTER_ATTRIBUTE_CONTEXT = 1


def _pycuda() -> tuple[Any, Any]:
    """(pycuda.driver, pycuda.gpuarray), or an ImportError that says what to install."""
    try:
        import pycuda.driver as drv
        import pycuda.gpuarray as gpuarray
    except ImportError as exc:
        raise ImportError(f"symgpu.misc.pycuda_utils needs PyCUDA, which cannot be imported "
                          f"here ({exc}); install it with `pip install pycuda` on a machine "
                          f"with an NVIDIA driver") from exc
    return drv, gpuarray


def _holder(arr: "GpuArray") -> Any:
    """A ``pycuda.driver.PointerHolderBase`` over ``arr``: PyCUDA converts it to the device
    address wherever it takes ``gpudata`` (copies, kernel arguments), and it keeps ``arr``
    alive.  The class is made on first use because it subclasses a PyCUDA type."""
    global _holder_cls
    if _holder_cls is None:
        drv, _ = _pycuda()

        class GpuArrayPointer(drv.PointerHolderBase):
            """The device address of a symgpu GpuArray, keeping the array alive."""

            def __init__(self, array: Any) -> None:
                super().__init__()
                self.array = array

            def get_pointer(self) -> int:
                return self.array.ptr

            def __int__(self) -> int:
                return self.array.ptr

            __index__ = __int__

            def __repr__(self) -> str:
                return f"<GpuArrayPointer {self.array.ptr:#x}>"

        _holder_cls = GpuArrayPointer
    return _holder_cls(arr)


def _stream_handle(stream: Any) -> int | None:
    """A PyCUDA ``Stream``, a raw handle or None (PyCUDA's default: the legacy stream)."""
    if stream is None:
        return None
    handle = getattr(stream, "handle", stream)
    return int(handle)


def _driver_context_of(ptr: int) -> int | None:
    """The CUcontext ``ptr`` was allocated in, or None where the driver does not say."""
    try:
        fn = libcuda.declare(libcuda.cdll(), "cuPointerGetAttribute",
                             [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64])
        out = ctypes.c_void_p()
        if fn(ctypes.byref(out), _CU_POINTER_ATTRIBUTE_CONTEXT, ptr) != 0:
            return None
        return out.value or None
    except (OSError, AttributeError):
        return None


def _current_driver_context() -> int | None:
    try:
        out = ctypes.c_void_p()
        if libcuda.cdll().cuCtxGetCurrent(ctypes.byref(out)) != 0:
            return None
        return out.value or None
    except (OSError, AttributeError):
        return None


def to_gpuarray(x: "GpuArray", copyif: bool = False, stream: Any = None) -> Any:
    """A ``pycuda.gpuarray.GPUArray`` sharing ``x``'s memory (see the module doc).

    A strided ``x`` raises ``ValueError`` unless ``copyif=True`` (then a C-contiguous copy,
    not shared).  ``stream``: the PyCUDA stream that will use the result (default: PyCUDA's
    default stream); it is made to wait for work already queued on ``x``."""
    if not isinstance(x, GpuArray):
        hint = (" (it is already a PyCUDA array)" if hasattr(x, "gpudata")
                else "; upload host data with symgpu.gpu.to_gpu first")
        raise TypeError(f"to_gpuarray expects a symgpu GpuArray, got "
                        f"{type(x).__module__}.{type(x).__name__}{hint}")
    if not x.is_c_contiguous:
        if not copyif:
            raise ValueError(
                f"to_gpuarray: the GpuArray of shape {x.shape} has strides {x.strides} (bytes) "
                f"and is not C-contiguous; PyCUDA GPUArrays and the kernels written for them "
                f"assume C-contiguous memory. Pass copyif=True for a C-contiguous copy (it "
                f"does not share memory with x), or make it contiguous first (x.copy(), or "
                f"gpu_contiguous in the graph)")
        x = x.copy()
    drv, gpuarray = _pycuda()
    ctx = x.context
    ctx.activate()
    foreign_stream_waits(ctx, _stream_handle(stream))
    if x.size == 0:
        return gpuarray.GPUArray(x.shape, x.dtype)  # no memory to share
    return gpuarray.GPUArray(x.shape, x.dtype, base=x, gpudata=_holder(x))


def from_gpuarray(g: Any, stream: Any = None, context: Any = None) -> "GpuArray":
    """A symgpu ``GpuArray`` sharing the memory of PyCUDA array ``g`` (strided views too).

    ``stream``: the PyCUDA stream ``g`` was last written on (default: PyCUDA's default
    stream); symgpu's stream waits for it.  ``context``: a symgpu context (name or object);
    by default the one of the device that holds ``g``."""
    if isinstance(g, GpuArray):
        raise TypeError("from_gpuarray expects a PyCUDA GPUArray; this is already a symgpu "
                        "GpuArray")
    if isinstance(g, (np.ndarray, np.generic, list, tuple, int, float, complex)):
        raise TypeError(f"from_gpuarray expects a PyCUDA GPUArray (device memory), got "
                        f"{type(g).__module__}.{type(g).__name__} (host data); upload it with "
                        f"symgpu.gpu.to_gpu")
    _, gpuarray = _pycuda()
    if not isinstance(g, gpuarray.GPUArray):
        raise TypeError(f"from_gpuarray expects a pycuda.gpuarray.GPUArray, got "
                        f"{type(g).__module__}.{type(g).__name__}; other CUDA arrays (CuPy, "
                        f"PyTorch) convert with symgpu.gpu.asarray or symgpu.gpu.from_dlpack")
    arr = from_cuda_array_interface(g, context)
    if arr.ptr:
        arr.context.activate()
        owner, ours = _driver_context_of(arr.ptr), _current_driver_context()
        if owner is not None and ours is not None and owner != ours:
            raise ValueError(
                "from_gpuarray: this GPUArray was allocated in another CUDA context than "
                "symgpu's (pycuda.autoinit makes a private one), so symgpu kernels cannot "
                "use it; import symgpu.misc.pycuda_init (or pycuda.autoprimaryctx) instead "
                "of pycuda.autoinit")
    handle = _stream_handle(stream)
    wait_for_foreign_stream(arr.context, 1 if handle is None else handle)
    return arr
