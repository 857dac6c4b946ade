"""Page-lock the user's own host arrays so that uploads of them are plain DMA (issue 18).

An upload from pageable memory makes the driver wait for the stream, then copy the data
through its own pinned staging buffer: about 104 us for a 1.25 MB batch on an H100, where
the DMA alone takes 26 us.  Programs that pass data per call usually pass the *same* array
objects every call (a data set loaded once, a batch array refilled in place), so the
memory of such an array is registered with the driver (``cuMemHostRegister``) once and every
later upload of it, or of a view into it, goes straight from it.

Rules, and why:
- Only arrays of at least ``MIN_BYTES`` (a small copy costs less than the bookkeeping).
- The memory registered is the array's *root* (the ndarray at the end of its ``.base``
  chain that still is an ndarray), so slices of a data set share one registration.
- A root is registered the second time the same object is uploaded (a weak reference
  remembers the first sighting): fresh arrays made for every call are never registered,
  since registering costs far more than a copy (H100: register + unregister of 1.25 MB
  211 us; the upload then 50 us instead of 104 us, so it pays from the fifth upload on).
- A registered root is held by a strong reference, so its memory cannot be freed while the
  driver has it locked; at most ``MAX_BYTES`` are held, least recently used evicted first
  (and unregistered); :func:`release_all` unregisters everything (at exit, before the
  contexts go).
- A failed registration (read-only or mapped memory the driver refuses) is remembered and
  the array keeps the pageable path.

The caller (``GpuArray.set``) waits for a copy from registered memory to finish before it
returns, so the user may modify or free the array as soon as the call returns.
"""
from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from symgpu.gpu.runtime.libcuda import cdll, declare

__all__ = ["HostRegistry", "LibcudaRegistrar", "deferred_waits", "registry_for",
           "release_all", "root_of", "upload",
           "MIN_BYTES", "MAX_BYTES"]

#: smaller uploads keep the pageable path
MIN_BYTES = 256 * 1024
#: most bytes of user memory kept registered (and referenced) per context
MAX_BYTES = 2 * 1024 ** 3
#: first sightings remembered (weakly) while waiting for a second upload of the same array
_CANDIDATES = 32


def root_of(ary: np.ndarray) -> np.ndarray:
    """The ndarray whose memory ``ary`` views: the last ndarray of its ``.base`` chain."""
    root = ary
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


class LibcudaRegistrar:
    """``cuMemHostRegister``/``cuMemHostUnregister`` through ctypes (the caller has made the
    context current)."""

    def __init__(self) -> None:
        lib = cdll()
        name = "cuMemHostRegister_v2" if hasattr(lib, "cuMemHostRegister_v2") \
            else "cuMemHostRegister"
        self._register = declare(lib, name, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint])
        self._unregister = declare(lib, "cuMemHostUnregister", [ctypes.c_void_p])

    def register(self, ptr: int, nbytes: int) -> int:
        """The CUresult of locking ``nbytes`` at ``ptr`` (0: done)."""
        return self._register(ptr, nbytes, 0)

    def unregister(self, ptr: int) -> int:
        return self._unregister(ptr)


class HostRegistry:
    """Which user arrays of one context have registered memory (see the module's rules).
    ``driver`` has ``register(ptr, nbytes) -> CUresult`` and ``unregister(ptr)``."""

    def __init__(self, driver: Any, min_bytes: int = MIN_BYTES,
                 max_bytes: int = MAX_BYTES) -> None:
        self.driver, self.min_bytes, self.max_bytes = driver, min_bytes, max_bytes
        #: (address, nbytes) -> the registered root array (held), least recently used first
        self.held: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.held_bytes = 0
        #: id(root) -> weak reference to a root uploaded once
        self.seen: OrderedDict[int, weakref.ref] = OrderedDict()
        #: (address, nbytes) the driver refused, with the refused root (weakly)
        self.refused: dict[tuple[int, int], weakref.ref] = {}

    def is_registered(self, host: np.ndarray) -> bool:
        """Whether ``host`` (a C-contiguous array about to be uploaded) lies in registered
        memory now; registers its root on a second sighting."""
        if host.nbytes < self.min_bytes:
            return False
        root = root_of(host)
        key = (root.__array_interface__["data"][0], root.nbytes)
        held = self.held.get(key)
        if held is not None:       # (another ndarray over the same held buffer counts too)
            self.held.move_to_end(key)
            return True
        if not root.flags.c_contiguous and not root.flags.f_contiguous:
            return False           # its extent is not one range of memory
        refused = self.refused.get(key)
        if refused is not None and refused() is root:
            return False
        seen = self.seen.pop(id(root), None)
        if seen is None or seen() is not root:
            self._remember(root)
            return False
        return self._register(key, root)

    def _remember(self, root: np.ndarray) -> None:
        try:
            ref = weakref.ref(root)
        except TypeError:
            return
        self.seen[id(root)] = ref
        while len(self.seen) > _CANDIDATES:
            self.seen.popitem(last=False)

    def _register(self, key: tuple[int, int], root: np.ndarray) -> bool:
        if key[1] > self.max_bytes:
            return False
        while self.held and self.held_bytes + key[1] > self.max_bytes:
            self._evict(next(iter(self.held)))
        if self.driver.register(key[0], key[1]) != 0:
            self.refused[key] = weakref.ref(root)
            return False
        self.held[key] = root
        self.held_bytes += key[1]
        return True

    def _evict(self, key: tuple[int, int]) -> None:
        self.held.pop(key)
        self.held_bytes -= key[1]
        self.driver.unregister(key[0])

    def release(self) -> None:
        """Unregister every held array and drop the references."""
        while self.held:
            self._evict(next(iter(self.held)))
        self.seen.clear()
        self.refused.clear()


class _Deferred(threading.local):
    #: within a `deferred_waits` block on this thread: the copies not yet waited for
    events: list | None = None


_deferred = _Deferred()


class deferred_waits:
    """Within the block, an upload from registered memory on this thread does not wait for
    its copy; the block's end waits for all of them (also when it raises).  A function call
    uses it (gpu/exec/graphs.py): the host launches the call's kernels while the DMA runs,
    and the caller still gets its arrays back, unread from then on, when the call returns.
    (H100: a small pageable upload queued after a 1.25 MB DMA returns in 4 us, without
    waiting for it; one through a pinned staging buffer and an event took 11 us.)"""

    __slots__ = ("outer",)

    def __enter__(self) -> "deferred_waits":
        self.outer = _deferred.events
        if self.outer is None:
            _deferred.events = []
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.outer is not None:
            return
        events, _deferred.events = _deferred.events, None
        for event in events:
            event.synchronize()


def upload(ctx: Any, dst_ptr: int, host: np.ndarray) -> None:
    """Copy the C-contiguous ``host`` to ``dst_ptr`` on ``ctx``'s stream (``ctx`` current):
    from registered memory as an asynchronous DMA, then wait for that copy (an event right
    after it; at the end of the enclosing `deferred_waits` block, if any), so that ``host``
    is the caller's again when this returns; other arrays through the driver's pageable
    path, which returns once it has read ``host``."""
    import pycuda.driver as drv
    if host.dtype.kind == "V":
        # bfloat16 (ml_dtypes) exports no buffer (PEP 3118 has no code for it): its bytes do
        host = host.reshape(-1).view(np.uint8)
    reg = registry_for(ctx)
    if host.nbytes < reg.min_bytes:   # (the driver stages it: no wait for earlier DMA)
        drv.memcpy_htod_async(dst_ptr, host, ctx.stream)
        return
    with ctx.lock:     # calls on several threads share the registry
        registered = reg.is_registered(host)
    drv.memcpy_htod_async(dst_ptr, host, ctx.stream)
    if registered:
        copied = drv.Event(drv.event_flags.DISABLE_TIMING)
        copied.record(ctx.stream)
        pending = _deferred.events
        if pending is not None:
            pending.append(copied)
        else:
            copied.synchronize()


#: id(context) -> (context, its registry)
_registries: dict[int, tuple[Any, HostRegistry]] = {}


def registry_for(ctx: Any) -> HostRegistry:
    """The registry of a GPU context (made on first use, released at exit)."""
    entry = _registries.get(id(ctx))
    if entry is None:
        if not _registries:
            atexit.register(release_all)  # after the contexts' own exit hook: runs first
        entry = _registries[id(ctx)] = (ctx, HostRegistry(LibcudaRegistrar()))
    return entry[1]


def release_all() -> None:
    """Unregister all user memory on every context (at exit; also for tests)."""
    for ctx, reg in list(_registries.values()):
        if reg.held:
            ctx.activate()
            ctx.stream.synchronize()   # no copy may still read the memory
        reg.release()
    _registries.clear()
