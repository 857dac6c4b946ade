"""A caching device-memory pool, one per context.

Why: ``cuMemAlloc``/``cuMemFree`` cost tens of microseconds and ``cuMemFree`` synchronises the
device, so a graph that allocates its outputs on every call would be bound by the allocator.
The pool keeps freed blocks in size-class bins and hands them out again; once warm, the hot
path is a dict lookup and a list pop.  Reuse is safe without events because all symgpu work on
a context runs on its one stream: a block freed by the host is only reused by work queued later
on the same stream.

Size classes: multiples of 512 B up to 1 MiB; above, four classes per power of two (at most
25% waste).  ``gpuarray.preallocate`` (read when the context starts):

* ``0``: grow on demand;
* ``0 < x <= 1``: take that fraction of total memory at start as one arena and carve blocks
  from it (first fit, coalescing on free); past the arena, grow on demand;
* ``x > 1``: the same with ``x`` MiB;
* ``x < 0``: no pooling: every block is a plain allocation freed when its array dies.

Out of memory: cached blocks are released and the allocation retried once; then
:class:`GpuMemoryError` (a ``MemoryError``) reports bytes asked, free and total.

CUDA-graph capture (symgpu/gpu/exec/graphs.py): while a capture runs, ``sink`` is a list and every
block handed out on the capturing thread is appended to it, so the graph owns (keeps alive)
each buffer its kernels touch; ``capture_guard`` wraps the driver allocation (a context manager
that lets ``cuMemAlloc`` run under capture).

:class:`PinnedPool` is the page-locked *host* counterpart: size-classed pinned buffers that
device-to-host copies land in directly (no second host copy), leased to the returned ndarray
and recycled when it is garbage-collected.
"""
from __future__ import annotations

import bisect
import ctypes
import sys
import threading
from typing import Any, Callable

import numpy as np

from symgpu.gpu.runtime.libcuda import driver_errors

__all__ = ["DevicePool", "Block", "GpuMemoryError", "size_class", "PinnedPool", "lend"]

_SMALL = 512
_SMALL_LIMIT = 1 << 20
_MIB = 1 << 20


class GpuMemoryError(MemoryError):
    """Device memory is exhausted; ``asked``, ``free`` and ``total`` are in bytes."""

    def __init__(self, message: str, asked: int = 0, free: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.asked, self.free, self.total = asked, free, total


def size_class(nbytes: int) -> int:
    """The rounded size a request of ``nbytes`` is served with (and binned under)."""
    if nbytes <= _SMALL_LIMIT:
        return max(_SMALL, -(-nbytes // _SMALL) * _SMALL)
    step = 1 << max((nbytes - 1).bit_length() - 3, 0)
    return -(-nbytes // step) * step


#: size_class by request size, for the sizes a process keeps asking for (each node's output
#: is one size call after call): a dict lookup instead of the arithmetic on the hot path
_class_memo: dict[int, int] = {}
_CLASS_MEMO_LIMIT = 4096


def _size_class_memoised(nbytes: int) -> int:
    size = size_class(int(nbytes))
    if len(_class_memo) < _CLASS_MEMO_LIMIT:
        _class_memo[int(nbytes)] = size
    return size


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n} bytes ({n / size:.2f} {unit})"
    return f"{n} bytes"


class _OutOfMemory(MemoryError):
    """The driver refused an allocation (internal; becomes GpuMemoryError after a retry)."""


class Block:
    """A device block owned by one or more arrays; returns to its pool when collected.

    ``ptr`` is the device address, ``size`` the size class actually reserved; ``lent``: an
    array over it was handed to the user as a value they may keep (:func:`lend`), so no graph
    overwrites it in place."""

    __slots__ = ("ptr", "size", "_pool", "_alloc", "lent", "__weakref__")

    def __init__(self, ptr: int, size: int, pool: "DevicePool", alloc: Any) -> None:
        self.ptr, self.size, self._pool, self._alloc = ptr, size, pool, alloc
        self.lent = False

    def __int__(self) -> int:
        return self.ptr

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        pool = self._pool
        if pool is not None:
            self._pool = None
            if _finalizing():  # interpreter exit (module globals may be gone): the driver
                return         # frees everything anyway
            try:
                pool._release(self.ptr, self.size, self._alloc)
            except driver_errors():  # a freed or faulted context: no memory left to free
                pass


def lend(array: Any) -> Any:
    """Mark the memory of a GpuArray handed to the user as theirs to keep (a shared
    variable's ``get_value(borrow=True, return_internal_type=True)`` or ``set_value(value,
    borrow=True)``): CUDA graphs then never copy an update back into it in place.  Returns
    ``array``."""
    base = getattr(array, "base", None)
    if type(base) is Block:
        base.lent = True
    return array


class _Arena:
    """One preallocated region carved first-fit; freed ranges coalesce with their neighbours."""

    def __init__(self, alloc: Any, size: int) -> None:
        self.alloc, self.base, self.size = alloc, int(alloc), size
        self.starts: list[int] = [self.base]   # free ranges, sorted by start
        self.sizes: list[int] = [size]

    def take(self, size: int) -> int | None:
        for i, avail in enumerate(self.sizes):
            if avail >= size:
                start = self.starts[i]
                if avail == size:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += size
                    self.sizes[i] -= size
                return start
        return None

    def give(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and start + size == self.starts[i]:   # merge with next
            size += self.sizes[i]
            del self.starts[i], self.sizes[i]
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start:  # merge with previous
            self.sizes[i - 1] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)

    def free_bytes(self) -> int:
        return sum(self.sizes)


class DevicePool:
    """The allocator of one context.  ``allocate(nbytes) -> Block``; a Block frees itself.

    ``preallocate`` follows the ``gpuarray.preallocate`` flag (see the module doc)."""

    def __init__(self, context: Any, preallocate: float = 0.0) -> None:
        self.context = context
        self.pooling = preallocate >= 0
        self._lock = threading.RLock()
        self._bins: dict[int, list[tuple[int, Any]]] = {}
        self._arena: _Arena | None = None
        self.bytes_in_use = 0        # reserved by live blocks (size classes)
        self.bytes_cached = 0        # held in bins, ready for reuse
        self.n_device_allocs = 0     # cuMemAlloc calls made
        self.n_device_frees = 0      # cuMemFree calls made
        self.n_allocs = 0            # allocate() calls served
        self.n_reused = 0            # ... of which from a bin or the arena
        self.preallocated = 0
        #: during a CUDA-graph capture: the list every block handed out on the capturing
        #: thread (``sink_thread``) is appended to; None otherwise
        self.sink: list | None = None
        self.sink_thread = 0
        #: during a capture: a context-manager factory wrapped around cuMemAlloc
        self.capture_guard: Callable[[], Any] | None = None
        #: a block the next allocation of its size class on ``hint_thread`` returns: a block
        #: a plain step of the graph runner owns and gives to its node's output each call
        #: (graph_steps._OwnedPlainStep), so the segment reading it finds it where it was
        self.hint: Block | None = None
        self.hint_thread = 0
        if preallocate > 0:
            total = int(context.total_memory) or context.mem_info()[1]
            want = int(total * preallocate) if preallocate <= 1 else int(preallocate * _MIB)
            want = min(want, context.mem_info()[0])
            want -= want % _SMALL
            if want > 0:
                self._arena = _Arena(self._device_alloc(want), want)
                self.preallocated = want

    # -- low level (the only two methods that touch the driver)
    def _device_alloc(self, nbytes: int) -> Any:
        """cuMemAlloc; raises _OutOfMemory when the device is full."""
        import pycuda.driver as drv
        self.context.activate()
        try:
            alloc = drv.mem_alloc(nbytes)
        except drv.MemoryError as exc:
            raise _OutOfMemory(str(exc)) from exc
        self.n_device_allocs += 1
        return alloc

    def _device_free(self, alloc: Any) -> None:
        alloc.free()
        self.n_device_frees += 1

    # -- capture support
    def begin_sink(self, sink: list, guard: Callable[[], Any] | None = None) -> None:
        """Route every block allocated on this thread into ``sink`` until :meth:`end_sink`."""
        with self._lock:
            self.sink_thread = threading.get_ident()
            self.capture_guard = guard
            self.sink = sink

    def end_sink(self) -> None:
        with self._lock:
            self.sink = None
            self.capture_guard = None
            self.sink_thread = 0

    # -- public
    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` (rounded up to its size class)."""
        try:
            size = _class_memo.get(nbytes)
        except TypeError:     # an unhashable integer-like size (a 0-d array)
            size = None
        if size is None:
            size = _size_class_memoised(nbytes)
        hint = self.hint
        if hint is not None and hint.size == size and \
                self.hint_thread == threading.get_ident():
            self.hint = None
            self.n_allocs += 1
            self.n_reused += 1
            return hint
        block = self._allocate(size, nbytes)
        sink = self.sink
        if sink is not None and self.sink_thread == threading.get_ident():
            sink.append(block)
        return block

    def _allocate(self, size: int, nbytes: int) -> Block:
        with self._lock:
            self.n_allocs += 1
            if self.pooling:
                cached = self._bins.get(size)
                if cached:
                    ptr, alloc = cached.pop()
                    self.bytes_cached -= size
                    self.bytes_in_use += size
                    self.n_reused += 1
                    return Block(ptr, size, self, alloc)
                if self._arena is not None:
                    start = self._arena.take(size)
                    if start is not None:
                        self.bytes_in_use += size
                        self.n_reused += 1
                        return Block(start, size, self, None)
            alloc = self._alloc_or_retry(size, nbytes)
            self.bytes_in_use += size
            return Block(int(alloc), size, self, alloc)

    def _guarded_alloc(self, size: int) -> Any:
        guard = self.capture_guard
        if guard is None or self.sink_thread != threading.get_ident():
            return self._device_alloc(size)
        with guard():
            return self._device_alloc(size)

    def _alloc_or_retry(self, size: int, nbytes: int) -> Any:
        try:
            return self._guarded_alloc(size)
        except _OutOfMemory:
            if self.sink is not None:
                raise  # no cuMemFree under capture: the capture fails and is retried plainly
            self.release_cached()
        try:
            return self._guarded_alloc(size)
        except _OutOfMemory as exc:
            free, total = self.context.mem_info()
            raise GpuMemoryError(
                f"out of GPU memory on {self.context.device}: asked {_fmt(nbytes)}, free "
                f"{_fmt(free)}, total {_fmt(total)} (the pool holds {_fmt(self.bytes_in_use)} "
                f"in live arrays; its cache was released before this retry)",
                nbytes, free, total) from exc

    def _release(self, ptr: int, size: int, alloc: Any) -> None:
        with self._lock:
            self.bytes_in_use -= size
            if alloc is None:
                if self._arena is not None:
                    self._arena.give(ptr, size)
            elif self.pooling:
                cached = self._bins.get(size)
                if cached is None:
                    cached = self._bins[size] = []
                cached.append((ptr, alloc))
                self.bytes_cached += size
            else:
                self._device_free(alloc)

    def release_cached(self) -> int:
        """Free every cached block back to the device; returns the bytes freed."""
        with self._lock:
            freed = 0
            for size, blocks in self._bins.items():
                for _ptr, alloc in blocks:
                    self._device_free(alloc)
                    freed += size
            self._bins.clear()
            self.bytes_cached = 0
            return freed

    def stats(self) -> dict[str, int]:
        """Counters tests and profiles read: bytes in use/cached/preallocated, call counts."""
        with self._lock:
            arena_free = self._arena.free_bytes() if self._arena is not None else 0
            return {"bytes_in_use": self.bytes_in_use, "bytes_cached": self.bytes_cached,
                    "bytes_preallocated": self.preallocated, "arena_free": arena_free,
                    "n_device_allocs": self.n_device_allocs,
                    "n_device_frees": self.n_device_frees, "n_allocs": self.n_allocs,
                    "n_reused": self.n_reused}

    def __repr__(self) -> str:
        s = self.stats()
        return (f"<DevicePool {self.context.device}: {s['bytes_in_use']} B in use, "
                f"{s['bytes_cached']} B cached, {s['n_device_allocs']} device allocations>")


# --------------------------------------------------------------------------- pinned host pool
_PINNED_CAP = 256 * _MIB          # page-locked bytes a context keeps at most (leased + cached)
_PINNED_LEASE_LIMIT = 64 * _MIB   # larger copies go through pageable memory


def _pagelocked_empty(nbytes: int) -> np.ndarray:
    import pycuda.driver as drv
    return drv.pagelocked_empty(nbytes, np.uint8)


class PinnedPool:
    """Page-locked host buffers in size classes (:func:`size_class`), one pool per context.

    ``empty(shape, dtype)`` returns an ndarray whose memory is a pinned buffer of the pool, or
    None when the buffer would be larger than ``lease_limit`` or the pool would pass ``cap``
    bytes (the caller then copies through pageable memory).  The array's base is a small owner
    object that keeps the buffer alive and gives it back to the pool when the last view of the
    array is garbage-collected: ``r = f()`` in a loop recycles one buffer, with no allocation
    and no page faults in the steady state.

    ``alloc(nbytes) -> uint8 ndarray`` makes a buffer (default: PyCUDA's
    ``pagelocked_empty``); tests pass a plain NumPy allocator."""

    def __init__(self, alloc: Callable[[int], np.ndarray] | None = None,
                 cap: int = _PINNED_CAP, lease_limit: int = _PINNED_LEASE_LIMIT) -> None:
        self._alloc = alloc or _pagelocked_empty
        self.cap, self.lease_limit = int(cap), int(lease_limit)
        self._lock = threading.RLock()   # __del__ of an owner may run inside a pool call
        self._bins: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._owners: dict[int, type] = {}
        self.bytes_pinned = 0    # page-locked bytes held: leased + cached
        self.bytes_leased = 0
        self.n_allocs = 0        # buffers made (page-locking calls)
        self.n_leases = 0        # empty() calls served
        self.n_reused = 0        # ... of which from a bin
        self.n_refused = 0       # empty() calls answered None (size or cap)
        self.n_freed = 0         # cached buffers dropped to stay under the cap

    def _owner_class(self, size: int) -> type:
        cls = self._owners.get(size)
        if cls is None:
            pool = self

            class _PinnedOwner(ctypes.c_ubyte * size):  # type: ignore[misc]
                """The base of a leased array: returns its buffer to the pool when it dies."""
                __slots__ = ("_buf",)

                def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
                    if not _finalizing():  # at interpreter exit the pool may be gone
                        pool._give_back(size, ctypes.addressof(self), self._buf)

            cls = self._owners[size] = _PinnedOwner
        return cls

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
        """A C-contiguous ndarray of ``shape``/``dtype`` in pinned memory, or None."""
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        if nbytes == 0 or nbytes > self.lease_limit:
            self.n_refused += 1
            return None
        size = size_class(nbytes)
        with self._lock:
            cached = self._bins.get(size)
            if cached:
                ptr, buf = cached.pop()
                self.n_reused += 1
            else:
                if self.bytes_pinned + size > self.cap:
                    self._trim(self.cap - size)
                    if self.bytes_pinned + size > self.cap:
                        self.n_refused += 1
                        return None
                buf = self._alloc(size)
                ptr = buf.__array_interface__["data"][0]
                self.bytes_pinned += size
                self.n_allocs += 1
            self.bytes_leased += size
            self.n_leases += 1
        owner = self._owner_class(size).from_address(ptr)
        owner._buf = buf
        arr = np.frombuffer(owner, dtype, count)
        return arr if len(shape) == 1 else arr.reshape(shape)

    def _give_back(self, size: int, ptr: int, buf: np.ndarray) -> None:
        with self._lock:
            self.bytes_leased -= size
            self._bins.setdefault(size, []).append((ptr, buf))

    def _trim(self, target: int) -> None:
        """Drop cached buffers (largest classes first) until at most ``target`` bytes are
        pinned or none is cached."""
        for size in sorted(self._bins, reverse=True):
            cached = self._bins[size]
            while cached and self.bytes_pinned > target:
                cached.pop()
                self.bytes_pinned -= size
                self.n_freed += 1

    def release_cached(self) -> int:
        """Free every cached (not leased) buffer; returns the bytes freed."""
        with self._lock:
            before = self.bytes_pinned
            self._trim(0)
            self._bins.clear()
            return before - self.bytes_pinned

    def stats(self) -> dict[str, int]:
        with self._lock:
            cached = sum(size * len(b) for size, b in self._bins.items())
            return {"bytes_pinned": self.bytes_pinned, "bytes_leased": self.bytes_leased,
                    "bytes_cached": cached, "n_allocs": self.n_allocs,
                    "n_leases": self.n_leases, "n_reused": self.n_reused,
                    "n_refused": self.n_refused, "n_freed": self.n_freed}

    def __repr__(self) -> str:
        return (f"<PinnedPool {self.bytes_leased} B leased, {self.bytes_pinned} B pinned, "
                f"cap {self.cap} B>")
