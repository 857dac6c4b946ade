"""libcuda through ctypes, loaded once: the driver entry points PyCUDA does not expose (stream
capture and CUDA graphs, raw kernel launches, cross-stream events, pointer queries).

``cdll()`` converts arguments by their declared ``argtypes`` and releases the GIL;
``pydll()`` keeps the GIL and is the cheapest call path (launches, graph replays).  Both are
the process's one libcuda, the library PyCUDA itself uses.
"""
from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, Sequence

__all__ = ["cdll", "pydll", "declare", "error_string", "check", "DriverError", "driver_errors"]


class DriverError(RuntimeError):
    """A driver call made here through ctypes returned an error (``status``: its CUresult)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def driver_errors() -> tuple[type[BaseException], ...]:
    """What a failing CUDA driver call raises: DriverError (calls made here) and
    ``pycuda.driver.Error`` (PyCUDA's: allocations, copies, launches, module loads) once
    PyCUDA is imported (before that none of its errors can be in flight).  For
    ``except driver_errors():`` around driver work whose failure has a fallback: anything
    else is a bug and propagates."""
    error = getattr(sys.modules.get("pycuda.driver"), "Error", None)
    return (DriverError,) if error is None else (DriverError, error)


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
    """Raise DriverError('<what> failed: <driver's words>') for a non-zero CUresult."""
    if status:
        raise DriverError(f"{what} failed: {error_string(status)}", status)
