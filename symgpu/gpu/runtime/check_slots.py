"""Device-check slots: the page-locked host words that checking kernels report into, and
what raises their reports after a synchronisation of the stream.

The mechanism (why slots, why page-aligned chunks, who reads them) is described in
:mod:`symgpu.gpu.runtime.device_checks`, which launches the checking kernels.  This module is
the part the context and GpuArray need after each synchronisation (:func:`raise_device_errors`)
and so sits below them: it imports no other runtime module and nothing of PyCUDA at import time.

Slots are never moved or freed while their context lives: a captured CUDA graph keeps the
device address of the slot its kernel writes.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

__all__ = ["DeviceChecks", "checks_of", "raise_device_errors", "is_device_check_error",
           "page_aligned"]

_CHUNK = 256  # slots per mapped allocation: one 4 KiB page; slot 0 is the page's report word
_PAGE = 4096


def _mapped_zeros(n: int) -> tuple[np.ndarray, int]:
    """(n x 2 uint64 page-locked host array, its device address) through PyCUDA; the device
    address is a multiple of 4096 (see :func:`page_aligned`)."""
    import pycuda.driver as drv
    pad = _PAGE // 16
    arr = drv.pagelocked_zeros((n + pad, 2), np.uint64,
                               mem_flags=drv.host_alloc_flags.DEVICEMAP)
    return page_aligned(arr, int(arr.base.get_device_pointer()), n)


def page_aligned(arr: np.ndarray, ptr: int, n: int) -> tuple[np.ndarray, int]:
    """The n rows of ``arr`` (rows of two uint64, at device address ``ptr``, with 256 rows to
    spare) that start at a multiple of 4096, and their device address.

    Why: a kernel's report sets the word at its slot's address rounded down to 4096, which
    must be its chunk's report word, the one guarded copies read.  The driver does not
    promise page alignment for page-locked allocations; a chunk that was not aligned had its
    reports' page word land elsewhere, and a failing call's guarded update copy went through
    (the update of a call that raised was applied on the device)."""
    skip = (-ptr) % _PAGE
    if skip % 16:
        raise RuntimeError(f"a page-locked allocation at {ptr:#x} is not 16-byte aligned")
    rows = skip // 16
    return arr[rows:rows + n], ptr + skip


class DeviceChecks:
    """The slots of one context. `allocate(n)` gives (host array, device address) of n zeroed
    slots; tests pass a plain NumPy allocator."""

    def __init__(self, allocate: Callable[[int], tuple[np.ndarray, int]] = _mapped_zeros):
        self._allocate = allocate
        self._chunks: list[tuple[np.ndarray, int]] = []
        self._describe: list[Callable[[int], Exception]] = []
        self._lock = threading.Lock()

    def new_slot(self, describe: Callable[[int], Exception]) -> int:
        """A fresh slot for one node: returns the device address its kernel writes to;
        `describe(bad_value)` makes the exception raised when the slot is found set."""
        with self._lock:
            k = len(self._describe)
            chunk, offset = divmod(k, _CHUNK - 1)
            if chunk == len(self._chunks):
                host, base = self._allocate(_CHUNK)
                if base % _PAGE:
                    raise RuntimeError(f"device-check slots at {base:#x}: not on a 4096-byte "
                                       f"boundary, so reports would set another page's word")
                self._chunks.append((host, base))
            self._describe.append(describe)
            return self._chunks[chunk][1] + (offset + 1) * 16

    def report_words(self) -> list[int]:
        """The device addresses of every chunk's report word."""
        return [base for _, base in self._chunks]

    def raise_pending(self) -> None:
        """Raise the error of the first set slot (and clear every slot): call only when the
        stream has been synchronised, so every queued kernel has finished writing."""
        for c, (host, _) in enumerate(self._chunks):
            flags = host[1:, 0]
            if not host[0, 0] and not flags.any():
                continue
            hits = np.flatnonzero(flags)
            if not len(hits):
                host[0] = 0
                continue
            i = int(hits[0])
            bad = int(host[i + 1, 1:2].view(np.int64)[0])
            for other, _ in self._chunks:
                other[...] = 0
            exc = self._describe[c * (_CHUNK - 1) + i](bad)
            exc.device_check = True   # the call's own error, never a reason to change course
            raise exc


def is_device_check_error(exc: BaseException) -> bool:
    """Whether `exc` is a kernel's reported check (a user error to propagate as is, not a
    failure of the machinery that happened to synchronise, such as a graph's check)."""
    return getattr(exc, "device_check", False)


_lock = threading.Lock()


def checks_of(ctx: Any) -> DeviceChecks:
    """The DeviceChecks of a context (made on first use)."""
    checks = getattr(ctx, "device_checks", None)
    if checks is None:
        with _lock:
            checks = getattr(ctx, "device_checks", None)
            if checks is None:
                checks = ctx.device_checks = DeviceChecks()
    return checks


def raise_device_errors(ctx: Any) -> None:
    """After a synchronisation of `ctx`'s stream: raise what its kernels reported."""
    checks = getattr(ctx, "device_checks", None)
    if checks is not None:
        checks.raise_pending()
