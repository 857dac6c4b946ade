"""DLPack export and import for GpuArray, in plain ctypes (no compiled extension).

Export: ``GpuArray.__dlpack__`` builds a ``DLManagedTensor`` (or, when the consumer passes
``max_version >= (1, 0)``, a ``DLManagedTensorVersioned``) in ctypes memory and wraps it in a
capsule named ``dltensor``/``dltensor_versioned``.  The GpuArray, the struct and its shape and
strides arrays are kept alive in ``_exports`` until the consumer calls the deleter; a capsule
that is never consumed calls it from its destructor.

Import (``symgpu.gpu.runtime.array.from_dlpack``): :func:`capsule_of` asks the producer for a
capsule, :func:`consume` reads the struct and renames the capsule ``used_...`` (so the
producer's destructor leaves it alone); the memory is wrapped in a GpuArray whose owner calls
the producer's deleter when the last view dies.  This module knows the format only: it imports
no other runtime module.

Layouts follow dlpack.h (v1.x); strides there count elements, ours count bytes.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["export_capsule", "producer_ordinal", "capsule_of", "consume", "KDL_CUDA"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6   # dlpack.h's kDLInt .. kDLBool
#: ml_dtypes' bfloat16, which NumPy files under kind 'V': DLPack's kDLBfloat of 16 bits
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FLAG_READ_ONLY = 1


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Managed(ctypes.Structure):
    pass


class _ManagedVersioned(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _Deleter)]
_ManagedVersioned._fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                              ("deleter", _Deleter), ("flags", ctypes.c_uint64),
                              ("dl_tensor", _Tensor)]

_NAME = b"dltensor"
_NAME_V = b"dltensor_versioned"
_USED = b"used_dltensor"
_USED_V = b"used_dltensor_versioned"

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]  # raw: safe in dealloc
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]

# --------------------------------------------------------------------------- export
_exports: dict[int, tuple] = {}   # manager_ctx key -> everything the struct points into
_exports_lock = threading.Lock()
_next_key = 0


def _release(managed_ptr: int, versioned: bool, exports: dict = _exports,
             lock: Any = _exports_lock, classes: tuple = (_Managed, _ManagedVersioned)) -> None:
    # a consumer may free its tensor during interpreter shutdown, after this module's globals
    # are cleared (a PyTorch tensor in a cycle, collected last): the deleter then reads only
    # what its defaults hold, and _keep_past_shutdown keeps those and the callbacks alive
    struct = classes[versioned].from_address(managed_ptr)
    key = struct.manager_ctx
    with lock:
        exports.pop(key, None)


@_Deleter
def _deleter(managed_ptr: int, release: Any = _release) -> None:
    release(managed_ptr, False)


@_Deleter
def _deleter_versioned(managed_ptr: int, release: Any = _release) -> None:
    release(managed_ptr, True)


def _capsule_destructor(capsule_ptr: int, api: Any = _api,
                        deleters: tuple = ((_NAME, _deleter), (_NAME_V, _deleter_versioned))
                        ) -> None:
    """An unconsumed capsule still owns its tensor: call the deleter."""
    for name, deleter in deleters:
        if api.PyCapsule_IsValid(capsule_ptr, name):
            deleter(api.PyCapsule_GetPointer(capsule_ptr, name))
            return


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_destructor = _CapsuleDestructor(_capsule_destructor)
_destructor_ptr = ctypes.cast(_destructor, ctypes.c_void_p).value


def _keep_past_shutdown(*objects: Any) -> None:
    """One reference each that is never given back: consumers hold pointers into these (the
    exported structs, the C callbacks) and may call them after shutdown has cleared this
    module, until the process ends."""
    incref = ctypes.pythonapi.Py_IncRef
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    for obj in objects:
        incref(obj)


_keep_past_shutdown(_exports, _deleter, _deleter_versioned, _destructor, _release)


def _dl_dtype(dtype: np.dtype) -> _DataType:
    if dtype == _BFLOAT16:
        return _DataType(_BFLOAT, 16, 1)
    code = {"b": _BOOL, "i": _INT, "u": _UINT, "f": _FLOAT}.get(dtype.kind)
    if code is None:
        raise BufferError(f"dtype {dtype} has no DLPack equivalent here")
    return _DataType(code, dtype.itemsize * 8, 1)


def export_capsule(arr: Any, versioned: bool) -> Any:
    """A DLPack capsule viewing ``arr`` (a GpuArray); ``arr`` lives until the deleter runs."""
    global _next_key
    ndim = arr.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // arr.itemsize for s in arr.strides))
    managed = _ManagedVersioned() if versioned else _Managed()
    t = managed.dl_tensor
    t.data = arr.ptr or None
    t.device = _Device(KDL_CUDA, arr.context.ordinal)
    t.ndim = ndim
    t.dtype = _dl_dtype(arr.dtype)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    with _exports_lock:
        _next_key += 1
        key = _next_key
        _exports[key] = (arr, managed, shape, strides)
    managed.manager_ctx = key
    if versioned:
        managed.version = _Version(1, 0)
        managed.deleter = _deleter_versioned
        managed.flags = 0
    else:
        managed.deleter = _deleter
    return _api.PyCapsule_New(ctypes.addressof(managed), _NAME_V if versioned else _NAME,
                              _destructor_ptr)


# --------------------------------------------------------------------------- import
class _DLPackOwner:
    """Holds a consumed DLPack tensor; calls the producer's deleter when collected."""

    __slots__ = ("ptr", "versioned", "producer", "struct_class", "is_finalizing")

    def __init__(self, ptr: int, versioned: bool, producer: Any) -> None:
        self.ptr, self.versioned, self.producer = ptr, versioned, producer
        # bound now: at interpreter exit module globals may already be gone
        self.struct_class = _ManagedVersioned if versioned else _Managed
        self.is_finalizing = sys.is_finalizing

    def __del__(self) -> None:
        if self.is_finalizing():
            return  # the producer's library may already be unloaded; the OS reclaims memory
        struct = self.struct_class.from_address(self.ptr)
        if struct.deleter:
            struct.deleter(self.ptr)


_NP_KIND = {_INT: "i", _UINT: "u", _FLOAT: "f", _BOOL: "b"}


def _np_dtype(dt: _DataType) -> np.dtype:
    if dt.code == _BFLOAT and dt.bits == 16 and dt.lanes == 1:
        return _BFLOAT16
    kind = _NP_KIND.get(dt.code)
    if kind is None or dt.lanes != 1 or dt.bits % 8:
        raise TypeError(f"DLPack dtype (code {dt.code}, {dt.bits} bits, {dt.lanes} lanes) is "
                        f"not supported on symgpu's GPU arrays (complex included)")
    return np.dtype("?" if kind == "b" else f"{kind}{dt.bits // 8}")


def producer_ordinal(obj: Any) -> int | None:
    """The CUDA device ordinal a DLPack producer's ``__dlpack_device__`` names (None when it
    has none); BufferError when it lives on another kind of device."""
    if not hasattr(obj, "__dlpack_device__"):
        return None
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise BufferError(f"from_dlpack needs a CUDA array; {type(obj).__name__} lives "
                          f"on DLPack device type {int(dev_type)} (1 = CPU: use to_gpu)")
    return int(dev_id)


def capsule_of(obj: Any, stream: int | None) -> Any:
    """A producer's capsule, its work ordered before ``stream`` (versioned when it can)."""
    try:
        return obj.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # a producer that predates versioned DLPack
        return obj.__dlpack__(stream=stream)


def consume(capsule: Any, producer: Any) -> tuple[int, tuple, np.dtype, tuple | None, int,
                                                  "_DLPackOwner"]:
    """Read an unconsumed ``dltensor`` capsule and mark it used: (device address, shape,
    dtype, byte strides or None, device ordinal, owner); the owner calls the producer's
    deleter when collected (keep it with the memory)."""
    name = _api.PyCapsule_GetName(capsule)
    if name not in (_NAME, _NAME_V):
        raise BufferError(f"expected an unconsumed DLPack capsule, got one named {name!r}")
    versioned = name == _NAME_V
    ptr = _api.PyCapsule_GetPointer(ctypes.c_void_p(id(capsule)), name)
    struct = (_ManagedVersioned if versioned else _Managed).from_address(ptr)
    if versioned and struct.version.major > 1:
        raise BufferError(f"DLPack version {struct.version.major}.{struct.version.minor} "
                          f"is newer than this reader (1.x)")
    t = struct.dl_tensor
    if t.device.device_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise BufferError(f"from_dlpack needs CUDA memory, got DLPack device type "
                          f"{t.device.device_type}")
    dtype = _np_dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    else:
        strides = None
    data = (t.data or 0) + t.byte_offset
    _api.PyCapsule_SetName(capsule, _USED_V if versioned else _USED)
    return data, shape, dtype, strides, t.device.device_id, _DLPackOwner(ptr, versioned,
                                                                        producer)
