"""Copies between two GPUs: peer access enabled once per pair of devices, and a copy queued on
the consumer's stream, ordered after the producer's work by events, never by a host sync.

Why this shape:

* a copy is ``cuMemcpyPeerAsync`` on the *destination* context's stream (the consumer's: the
  kernels that read the copy are queued there next, so they need nothing more).  Before it,
  that stream waits for an event recorded on the source context's stream (the producer's
  kernels that wrote the value are queued there); the host never waits;
* after it, the source stream waits for an event recorded behind the copy on the destination
  stream.  Each context's memory pool hands a freed block out again at once because all the
  work on its memory is ordered on its one stream (runtime/pool.py); a peer copy reads the
  source's memory from another stream, so the source stream must not run anything queued
  later (a kernel writing into the freed block, a CUDA graph's replay over its buffers)
  before the copy is done.  The cost: work queued later on the source device waits for the
  destination stream's work queued before the copy;
* peer access (``cuCtxEnablePeerAccess``, both ways) is enabled the first time a pair of
  devices meets, where ``cuDeviceCanAccessPeer`` allows it (NVLink or PCIe peer-to-peer): the
  copy then goes device to device.  Where it does not, the same call still copies: the driver
  stages it through host memory itself (CUDA programming guide, "Peer-to-Peer Memory Copy"),
  asynchronously to the host and in stream order as well.  A driver that refuses the call
  (no unified addressing, a virtualised GPU) gets a copy through the host instead, which
  synchronises the source stream (:func:`copy_array` falls back with a warning, once);
* the driver is an object of its own (:func:`driver`), so tests replace it with a fake that
  counts the calls (tests/test_gpu_multi_context.py).

Two names mapped to one device share one context (runtime/context.py): no copy reaches here.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any

from symgpu.gpu.runtime import libcuda
from symgpu.gpu.runtime.array import GpuArray, new_array, to_gpu

__all__ = ["PeerDriver", "driver", "copy_array", "copy_bytes", "peer_access", "STATS",
           "PeerCopyWarning", "forget"]

_CU_EVENT_DISABLE_TIMING = 2
_ALREADY_ENABLED = 704          # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED

#: counters: 'peer_copies' (device to device through cuMemcpyPeerAsync, with or without
#: peer access), 'host_copies' (the fallback through the host), 'pairs_enabled' (device
#: pairs whose peer access this process enabled)
STATS: dict[str, int] = {"peer_copies": 0, "host_copies": 0, "pairs_enabled": 0}


class PeerCopyWarning(RuntimeWarning):
    """The driver refused a device-to-device copy; it went through the host instead."""


class PeerDriver:
    """The driver calls of a copy between contexts, through ctypes (PyCUDA's
    ``memcpy_peer_async`` picks its contexts wrongly, and it has no cross-stream events).
    Handles are plain ints: context handles (``GpuContext.context_handle``), streams
    (``GpuContext.stream_handle``), events made by :meth:`event`."""

    def __init__(self) -> None:
        lib = libcuda.cdll()
        vp, u32, i32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        P = ctypes.POINTER
        for name, args in (("cuDeviceGet", [P(i32), i32]),
                           ("cuDeviceCanAccessPeer", [P(i32), i32, i32]),
                           ("cuCtxEnablePeerAccess", [vp, u32]),
                           ("cuEventCreate", [P(vp), u32]),
                           ("cuEventRecord", [vp, vp]),
                           ("cuStreamWaitEvent", [vp, vp, u32]),
                           ("cuMemcpyPeerAsync", [ctypes.c_uint64, vp, ctypes.c_uint64, vp,
                                                  ctypes.c_size_t, vp])):
            libcuda.declare(lib, name, args)
        self.lib, self.check = lib, libcuda.check

    def can_access_peer(self, ordinal: int, peer_ordinal: int) -> bool:
        """Whether device ``ordinal`` can read and write ``peer_ordinal``'s memory directly."""
        dev, peer, can = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(0)
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self.check(self.lib.cuDeviceGet(ctypes.byref(peer), peer_ordinal), "cuDeviceGet")
        self.check(self.lib.cuDeviceCanAccessPeer(ctypes.byref(can), dev, peer),
                   "cuDeviceCanAccessPeer")
        return bool(can.value)

    def enable_peer_access(self, peer_context: int) -> None:
        """Let the current context access ``peer_context``'s memory (already enabled, by us
        or by another library sharing the primary context, counts as done)."""
        status = self.lib.cuCtxEnablePeerAccess(ctypes.c_void_p(peer_context), 0)
        if status != _ALREADY_ENABLED:
            self.check(status, "cuCtxEnablePeerAccess")

    def event(self) -> int:
        """A new event of the current context (no timing: the cheapest to record)."""
        ev = ctypes.c_void_p()
        self.check(self.lib.cuEventCreate(ctypes.byref(ev), _CU_EVENT_DISABLE_TIMING),
                   "cuEventCreate")
        return int(ev.value)

    def record(self, event: int, stream: int) -> None:
        self.check(self.lib.cuEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream)),
                   "cuEventRecord")

    def wait(self, stream: int, event: int) -> None:
        """Make work queued later on ``stream`` wait for ``event`` (of any device)."""
        self.check(self.lib.cuStreamWaitEvent(ctypes.c_void_p(stream), ctypes.c_void_p(event),
                                              0), "cuStreamWaitEvent")

    def memcpy_peer(self, dst: int, dst_context: int, src: int, src_context: int,
                    nbytes: int, stream: int) -> int:
        """Queue the copy on ``stream``; returns the CUresult (the caller decides)."""
        return self.lib.cuMemcpyPeerAsync(dst, ctypes.c_void_p(dst_context), src,
                                          ctypes.c_void_p(src_context), nbytes,
                                          ctypes.c_void_p(stream))


_driver: Any = None
_lock = threading.Lock()
#: frozenset({ordinal, ordinal}) -> whether peer access is on between the two devices
_pairs: dict[frozenset, bool] = {}
#: id(context) -> (context, the event its stream records for the other side to wait on)
_events: dict[int, tuple[Any, int]] = {}
_warned: list[bool] = []


def driver() -> Any:
    """The process's peer driver (tests replace ``symgpu.gpu.runtime.peer._driver``)."""
    global _driver
    if _driver is None:
        _driver = PeerDriver()
    return _driver


def peer_access(a: Any, b: Any) -> bool:
    """Whether contexts ``a`` and ``b`` (on two devices) access each other's memory
    directly; the first call for a pair of devices enables it both ways where the devices
    allow it.  Once per pair: the answer is remembered."""
    pair = frozenset((a.ordinal, b.ordinal))
    known = _pairs.get(pair)
    if known is not None:
        return known
    with _lock:
        known = _pairs.get(pair)
        if known is not None:
            return known
        drv = driver()
        try:
            on = drv.can_access_peer(a.ordinal, b.ordinal) and \
                drv.can_access_peer(b.ordinal, a.ordinal)
            if on:
                for me, peer in ((a, b), (b, a)):
                    me.activate()
                    drv.enable_peer_access(peer.context_handle)
                STATS["pairs_enabled"] += 1
        except libcuda.DriverError:   # too many peers, a virtualised GPU: copies still work,
            on = False                # staged by the driver (see the module doc)
        _pairs[pair] = on
        return on


def _event(ctx: Any, drv: Any) -> int:
    """The context's ordering event (made once, with the context current).  One per
    context serves every copy: a wait orders after the record that precedes it, and a later
    record on the same stream only ever waits for more."""
    entry = _events.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        ctx.activate()
        entry = _events[id(ctx)] = (ctx, drv.event())
    return entry[1]


def copy_bytes(dst_ctx: Any, dst_ptr: int, src_ctx: Any, src_ptr: int, nbytes: int) -> int:
    """Queue ``nbytes`` from ``src_ptr`` (in ``src_ctx``) to ``dst_ptr`` (in ``dst_ctx``) on
    ``dst_ctx``'s stream, after the work queued on ``src_ctx``'s stream, and make later work
    on ``src_ctx``'s stream wait for the copy (see the module doc).  Leaves ``dst_ctx``
    current.  Returns 0, or the CUresult of a copy the driver refused (nothing queued)."""
    drv = driver()
    peer_access(src_ctx, dst_ctx)
    produced, copied = _event(src_ctx, drv), _event(dst_ctx, drv)
    src_ctx.activate()
    drv.record(produced, src_ctx.stream_handle)
    dst_ctx.activate()
    drv.wait(dst_ctx.stream_handle, produced)
    status = drv.memcpy_peer(dst_ptr, dst_ctx.context_handle, src_ptr, src_ctx.context_handle,
                             nbytes, dst_ctx.stream_handle)
    if status:
        return status
    drv.record(copied, dst_ctx.stream_handle)
    src_ctx.activate()
    drv.wait(src_ctx.stream_handle, copied)
    dst_ctx.activate()
    STATS["peer_copies"] += 1
    return 0


def copy_array(x: GpuArray, dst_ctx: Any) -> GpuArray:
    """A C-contiguous copy of GpuArray ``x`` in ``dst_ctx`` (another device's context):
    device to device (:func:`copy_bytes`), through the host if the driver refuses that."""
    src = x if x.is_c_contiguous else x.copy()   # on the producer's stream
    out = new_array(dst_ctx, x.shape, x.dtype)
    if not x.size:
        return out
    status = copy_bytes(dst_ctx, out.ptr, src.context, src.ptr, src.nbytes)
    if not status:
        return out
    if not _warned:
        _warned.append(True)
        warnings.warn(f"symgpu: the driver refused a copy of {src.nbytes} bytes from "
                      f"{src.context.device} to {dst_ctx.device} (cuMemcpyPeerAsync: "
                      f"{_words(status)}); such copies go through the host, waiting for "
                      f"{src.context.device}", PeerCopyWarning, stacklevel=3)
    STATS["host_copies"] += 1
    return to_gpu(src.get(), dst_ctx)


def _words(status: int) -> str:
    try:
        return libcuda.error_string(status)
    except OSError:   # no libcuda (a fake driver's status): the number says it
        return f"CUresult {status}"


def forget(ctx: Any) -> None:
    """Drop what is remembered of ``ctx`` (its event; tests registering fake contexts)."""
    _events.pop(id(ctx), None)
