"""libcuda through ctypes, loaded once: the driver entry points PyCUDA does not expose (stream
capture and CUDA graphs, raw kernel launches, cross-stream events, pointer queries).

``cdll()`` converts arguments by their declared ``argtypes`` and releases the GIL;
``pydll()`` keeps the GIL and is the cheapest call path (launches, graph replays).  Both are
the process's one libcuda, the library PyCUDA itself uses.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Sequence

__all__ = ["cdll", "pydll", "declare", "error_string", "check"]


@functools.cache
def cdll() -> Any:
    return ctypes.CDLL("libcuda.so.1")


@functools.cache
def pydll() -> Any:
    return ctypes.PyDLL("libcuda.so.1")


def declare(lib: Any, name: str, argtypes: Sequence[Any] | None) -> Any:
    """``lib.name`` returning a CUresult, with ``argtypes`` (None: left undeclared, the
    fastest call)."""
    fn = getattr(lib, name)
    if argtypes is not None:
        fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def error_string(status: int) -> str:
    """The driver's words for a CUresult."""
    msg = ctypes.c_char_p()
    fn = declare(cdll(), "cuGetErrorString", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
    fn(status, ctypes.byref(msg))
    return msg.value.decode() if msg.value else f"CUresult {status}"


def check(status: int, what: str) -> None:
    """Raise RuntimeError('<what> failed: <driver's words>') for a non-zero CUresult."""
    if status:
        raise RuntimeError(f"{what} failed: {error_string(status)}")
