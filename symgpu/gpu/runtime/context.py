"""GPU start-up: devices, contexts, streams, the CPU fallback and the context registry.

Why this shape:

* a device is driven through its *primary* context (``retain_primary_context``), the one the
  CUDA runtime uses, so PyTorch, CuPy and JAX see the same context and pointers exchanged
  through DLPack / ``__cuda_array_interface__`` are valid on both sides;
* every context owns one non-default stream: all symgpu work on that device is ordered on it,
  which is what lets the memory pool reuse a freed block at once;
* nothing here imports PyCUDA at module level: ``import symgpu`` works on a machine with no GPU,
  no driver and no PyCUDA.  :func:`init_default_context` falls back to the CPU with a warning
  saying why (or raises with ``force_device=True``).

A *virtual* context (:func:`register_context`) knows its name, device and arch but owns no
device: the placement pass is tested on the CPU with it.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import re
import os
import sys
import threading
import warnings
from typing import Any

from symgpu.config import config
from symgpu.gpu.runtime import libcuda
from symgpu.gpu.runtime.check_slots import raise_device_errors
from symgpu.gpu.runtime.pool import DevicePool, PinnedPool
from symgpu.link.token_lock import TokenLock

__all__ = [
    "GpuContext", "GpuUnavailableError", "GpuUnavailableWarning", "ContextNotFound",
    "gpu_available", "why_unavailable", "start_device", "init_default_context",
    "register_context", "unregister_context", "get_context", "context_names",
    "context_for_ordinal", "foreign_stream_waits", "wait_for_foreign_stream",
    "device_of_pointer", "device_count", "registered_name", "context_in_use",
]

_MIB = 1 << 20


class GpuUnavailableError(RuntimeError):
    """The GPU asked for cannot be used; the message says why."""


class GpuUnavailableWarning(UserWarning):
    """Emitted when ``device=cuda*`` falls back to the CPU."""


class ContextNotFound(LookupError):
    """No context of that name is registered (or no default GPU context is in use)."""


def _parse_device(device: str) -> int:
    m = re.fullmatch(r"cuda(\d*)", device.strip())
    if m is None:
        raise ValueError(f"{device!r} is not a GPU device name; expected 'cuda' or 'cudaN'")
    return int(m.group(1) or 0)


# --------------------------------------------------------------------------- the driver
class _Driver:
    """A few driver-API calls PyCUDA lacks (cross-stream ordering, pointer queries)."""

    def __init__(self) -> None:
        lib = libcuda.cdll()
        vp, u32 = ctypes.c_void_p, ctypes.c_uint
        for name, args in (("cuEventCreate", [ctypes.POINTER(vp), u32]),
                           ("cuEventRecord", [vp, vp]), ("cuEventDestroy_v2", [vp]),
                           ("cuStreamWaitEvent", [vp, vp, u32]),
                           ("cuPointerGetAttribute", [vp, ctypes.c_int, ctypes.c_uint64])):
            libcuda.declare(lib, name, args)
        self.lib, self.check = lib, libcuda.check

    def order(self, first: int, then: int) -> None:
        """Make work later queued on stream ``then`` wait for work already on ``first``."""
        ev = ctypes.c_void_p()
        self.check(self.lib.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # no timing
        try:
            self.check(self.lib.cuEventRecord(ev, first), "cuEventRecord")
            self.check(self.lib.cuStreamWaitEvent(then, ev, 0), "cuStreamWaitEvent")
        finally:
            self.lib.cuEventDestroy_v2(ev)  # released once the event completes

    def pointer_ordinal(self, ptr: int) -> int:
        out = ctypes.c_int(-1)
        # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
        self.check(self.lib.cuPointerGetAttribute(ctypes.byref(out), 9, ptr),
                   "cuPointerGetAttribute")
        return out.value


@functools.cache
def _drv() -> _Driver:
    return _Driver()


# --------------------------------------------------------------------------- contexts
#: per-thread state: ``current`` is the context activate() made current in this thread (a
#: hot caller may test ``getattr(thread_state, "current", None) is ctx`` before calling it)
thread_state = _tls = threading.local()


class _PopAtThreadExit:
    """Kept in a worker thread's local storage once it has pushed a context: when the thread
    ends, Python drops its locals on that thread and this pops the context, so PyCUDA finds
    the thread's context stack empty (it aborts the process otherwise: "The context stack was
    not empty upon module cleanup")."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            import pycuda.driver as drv
        except ImportError:  # interpreter shutdown: nothing left to pop
            return
        try:
            drv.Context.pop()
        except drv.Error:  # no context left (popped already)
            pass


class GpuContext:
    """One device's primary context, its stream and memory pool (or a virtual stand-in).

    ``name`` is the first name it was registered under (None for the default context),
    ``device`` is ``'cudaN'``, ``arch`` the nvcc target (``'sm_90'`` on Hopper)."""

    def __init__(self, name: str | None, device: str, arch: str = "sm_90",
                 virtual: bool = True) -> None:
        self.name, self.device, self.arch, self.virtual = name, device, arch, virtual
        self.ordinal = _parse_device(device)
        self.devname = f"virtual {arch} device"
        self.pycuda_context: Any = None
        self.pycuda_device: Any = None
        #: the CUcontext (an int), for driver calls naming contexts (runtime/peer.py)
        self.context_handle = 0
        self.stream: Any = None
        self.stream_handle = 0
        #: the communication stream of its collectives (runtime/comm_stream.py), made by the
        #: first collective that forks off the compute stream; None until then
        self.comm: Any = None
        self.pool: Any = None
        self.pinned: Any = None  # PinnedPool: page-locked host buffers for copies back
        self.total_memory = 0
        self.lock = threading.RLock()  # guards the staging buffers of host copies
        #: held by each call of a compiled GPU function (symgpu/gpu/exec/graphs.py) and by a GPU
        #: shared variable's transfers: one at a time per context, since a CUDA-graph capture
        #: records whatever reaches the context's one stream and cuBLAS's handle settings are
        #: per context (docs/threads.md); re-entrant, its token taken by a runner's entry
        #: with one list pop (symgpu/link/token_lock.py)
        self.call_lock = TokenLock()
        self.staging: dict[int, Any] = {}

    def __repr__(self) -> str:
        kind = "virtual" if self.virtual else self.devname
        return f"<GpuContext {self.name!r} on {self.device} ({kind}, {self.arch})>"

    # -- copying and pickling: a context is a process's handle on a device, never data. A
    # copy is the context itself; a pickle names it and is looked up again on load (PyCUDA's
    # Context, Stream and allocations cannot be pickled, and mean nothing in another process)
    def __copy__(self) -> "GpuContext":
        return self

    def __deepcopy__(self, memo: dict) -> "GpuContext":
        return self

    def __reduce__(self):
        return (_context_from_pickle, (registered_name(self), self.device))

    def _require_device(self) -> None:
        if self.virtual:
            raise RuntimeError(f"context {self.name!r} is virtual (registered without a device): "
                               f"it can describe placement but cannot allocate or run kernels")

    def activate(self) -> "GpuContext":
        """Make this context current in the calling thread (cheap when it already is)."""
        if getattr(_tls, "current", None) is self:
            return self
        self._require_device()
        import pycuda.driver as drv
        if getattr(_tls, "current", None) is not None:
            drv.Context.pop()
        elif threading.current_thread() is not threading.main_thread():
            _tls.exit_guard = _PopAtThreadExit()   # the first push of a worker thread
        self.pycuda_context.push()
        _tls.current = self
        return self

    def synchronize(self) -> None:
        """Wait for all work queued on this context's stream, then raise what its kernels'
        checks reported (symgpu/gpu/runtime/device_checks.py)."""
        self._require_device()
        self.stream.synchronize()
        raise_device_errors(self)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory as the driver reports them now."""
        self.activate()
        import pycuda.driver as drv
        free, total = drv.mem_get_info()
        return int(free), int(total)

    # -- start-up
    @classmethod
    def _start(cls, ordinal: int) -> "GpuContext":
        import pycuda.driver as drv
        drv.init()
        count = drv.Device.count()
        if count == 0:
            raise GpuUnavailableError("the CUDA driver reports no device")
        if ordinal >= count:
            raise GpuUnavailableError(f"device cuda{ordinal} does not exist: this machine has "
                                      f"{count} CUDA device(s) (cuda0..cuda{count - 1})")
        dev = drv.Device(ordinal)
        major, minor = dev.compute_capability()
        ctx = cls(None, f"cuda{ordinal}", f"sm_{major}{minor}", virtual=False)
        ctx.pycuda_device = dev
        ctx.devname = f"{dev.name()} ({dev.pci_bus_id()})"
        ctx.total_memory = int(dev.total_memory())
        ctx.pycuda_context = dev.retain_primary_context()
        ctx.context_handle = int(ctx.pycuda_context.handle)
        ctx.activate()
        ctx.stream = drv.Stream()
        ctx.stream_handle = int(ctx.stream.handle)
        ctx.pool = DevicePool(ctx, config.gpuarray.preallocate)
        ctx.pinned = PinnedPool()
        return ctx


_devices: dict[int, GpuContext] = {}          # ordinal -> started context
_registry: dict[str | None, GpuContext] = {}  # name (None = default) -> context
_default_tried = False
_default_error: str | None = None
_probe: tuple[bool, str] | None = None
_start_lock = threading.RLock()


def _probe_gpu() -> tuple[bool, str]:
    """(usable, why not): PyCUDA importable, driver answers, at least one device."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:  # not installed, or built against another CUDA (undefined
        # symbols and missing libraries are ImportErrors too)
        return False, f"PyCUDA cannot be imported ({type(exc).__name__}: {exc})"
    try:
        drv.init()
        count = drv.Device.count()
    except drv.Error as exc:  # no driver, driver too old for the toolkit, no permission
        return False, f"the CUDA driver cannot be initialised ({type(exc).__name__}: {exc})"
    if count == 0:
        return False, "the CUDA driver reports no device"
    return True, ""


def gpu_available() -> bool:
    """True if a GPU can be used here (and, if one was started, it started).  Never raises."""
    return not why_unavailable()


def why_unavailable() -> str:
    """Why the GPU cannot be used ('' when it can).  Never raises."""
    global _probe
    if _default_error:
        return _default_error
    if _devices:
        return ""
    if _probe is None:
        _probe = _probe_gpu()   # answers every failure it expects as its reason
    return _probe[1]


def device_count() -> int:
    """How many CUDA devices this process sees (0 where the GPU cannot be used: no PyCUDA,
    no driver, no device).  Never raises; starts no context."""
    if why_unavailable():
        return 0
    import pycuda.driver as drv
    try:
        drv.init()
        return int(drv.Device.count())
    except drv.Error:
        return 0


def start_device(device: str = "cuda0") -> GpuContext:
    """Start (once) and return the context of ``device`` ('cuda' = 'cuda0').

    Raises :class:`GpuUnavailableError` saying why when the GPU cannot be used."""
    ordinal = _parse_device(device)
    with _start_lock:
        ctx = _devices.get(ordinal)
        if ctx is not None:
            return ctx
        try:
            ctx = GpuContext._start(ordinal)
        except GpuUnavailableError:
            raise
        except ImportError as exc:
            raise GpuUnavailableError(f"PyCUDA cannot be imported ({exc}); install it with "
                                      f"`pip install pycuda` to use device={device}") from exc
        except (_driver_error(), MemoryError) as exc:  # a driver call, or the preallocation
            raise GpuUnavailableError(f"starting {device} failed ({type(exc).__name__}: {exc})"
                                      ) from exc
        _devices[ordinal] = ctx
        if len(_devices) == 1:
            atexit.register(_shutdown)
        return ctx


def _announce(name: str | None, ctx: GpuContext, first: bool) -> None:
    """Theano's start-up lines, on stderr: the preallocation (once a device) and the mapping."""
    if config.print_active_device:
        pre = ctx.pool.preallocated if ctx.pool is not None else 0
        if pre and first:
            print(f"Preallocating {pre // _MIB}/{ctx.total_memory // _MIB} Mb "
                  f"({pre / ctx.total_memory:f}) on {ctx.device}", file=sys.stderr)
        print(f"Mapped name {name} to device {ctx.device}: {ctx.devname}", file=sys.stderr)


def _map(name: str | None, device: str) -> GpuContext:
    ctx = start_device(device)
    if name not in _registry:
        first = not any(c is ctx for c in _registry.values())
        if first:
            ctx.name = name
        _registry[name] = ctx
        _announce(name, ctx, first)
    return _registry[name]


def init_default_context() -> GpuContext | None:
    """Start the GPU the flags ask for; return the default context, or None on the CPU.

    ``device=cuda``/``cudaN`` maps the default context (name None); the ``contexts`` flag maps
    its named contexts.  If the GPU cannot be used: a :class:`GpuUnavailableWarning` saying why
    and None (everything runs on the CPU), or with ``force_device=True`` a
    :class:`GpuUnavailableError`.  Only the first call starts anything."""
    global _default_tried, _default_error
    with _start_lock:
        if _default_tried:
            if _default_error and config.force_device:
                raise GpuUnavailableError(_default_error)
            return _registry.get(None)
        _default_tried = True
        cfg = config
        wanted: list[tuple[str | None, str]] = []
        if cfg.device != "cpu":
            wanted.append((None, cfg.device))
        wanted += list(cfg.context_map().items())
        for name, device in wanted:
            try:
                _map(name, device)
            except GpuUnavailableError as exc:
                label = "the default context" if name is None else f"context {name!r}"
                error = (f"device {device} was asked for ({label}) but the GPU cannot be "
                         f"used: {exc}")
                _default_error = _default_error or error
                if cfg.force_device:
                    raise GpuUnavailableError(error + " (force_device=True)") from exc
                warnings.warn(error + "; running on the CPU instead", GpuUnavailableWarning,
                              stacklevel=_user_stacklevel())
        return _registry.get(None)


def _user_stacklevel() -> int:
    """The warnings stacklevel of the first caller outside symgpu (so a warning points at
    the user's line, whichever symgpu entry point started the GPU)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def register_context(name: str | None, context: GpuContext | None = None, *,
                     device: str = "cuda0", arch: str = "sm_90") -> GpuContext:
    """Register ``context`` under ``name`` (None = default); without one, a *virtual* context
    for ``device``/``arch`` that owns no GPU (CPU-only placement tests).  Returns it."""
    ctx = context if context is not None else GpuContext(name, device, arch, virtual=True)
    with _start_lock:
        _registry[name] = ctx
    return ctx


def unregister_context(name: str | None) -> None:
    """Forget the name ``name`` (the context itself stays started)."""
    with _start_lock:
        _registry.pop(name, None)


def get_context(name: str | None = None) -> GpuContext:
    """The context registered as ``name``; None = the default one (started from the flags on
    first use).  Raises :class:`ContextNotFound` with the known names or the fallback reason."""
    ctx = _registry.get(name)
    if ctx is not None:
        return ctx
    if not _default_tried:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GpuUnavailableWarning)  # the message goes below
            init_default_context()
        ctx = _registry.get(name)
        if ctx is not None:
            return ctx
    known = ", ".join(repr(n) for n in _registry) or "none"
    if name is None:
        if _default_error:
            raise ContextNotFound(f"no default GPU context: {_default_error}")
        raise ContextNotFound(f"no default GPU context: the device flag is "
                              f"{config.device!r}. Set device=cuda (e.g. SYMGPU_FLAGS="
                              f"device=cuda) or pass a context; registered contexts: {known}")
    raise ContextNotFound(f"no GPU context named {name!r}; registered contexts: {known} "
                          f"(name them with the contexts flag, e.g. {name}->cuda0)")


def registered_name(ctx: Any) -> str | None:
    """The name ``ctx`` is registered under (its own first name when that still maps to it,
    else the first name that does; its first name when none does): what a pickle of a value
    on ``ctx`` records, to look the context up again on load."""
    name = getattr(ctx, "name", None)
    if _registry.get(name) is ctx:
        return name
    for other, registered in list(_registry.items()):
        if registered is ctx:
            return other
    return name


def context_in_use(name: str | None) -> GpuContext | None:
    """The real (not virtual) context named ``name`` if this process uses it, else None: where
    an unpickled GPU value goes.  The default context (None) is started from the flags on
    first use (device=cuda); with device=cpu, or without a usable GPU, there is none."""
    if name is None and None not in _registry:
        if config.device == "cpu":
            return None
        init_default_context()   # device=cuda without a usable GPU warns once, as anywhere
    ctx = _registry.get(name)
    return None if ctx is None or ctx.virtual else ctx


def _context_from_pickle(name: str | None, device: str) -> GpuContext:
    """Unpickling a GpuContext: the context registered under ``name`` here."""
    ctx = _registry.get(name) if name is not None or None in _registry else None
    if ctx is None:
        try:
            return get_context(name)
        except ContextNotFound as exc:
            raise ContextNotFound(f"a pickled GPU context ({name!r}, {device} where it was "
                                  f"saved) is not in use here: {exc}") from None
    return ctx


def context_names() -> list[str | None]:
    """Names of the registered contexts (None is the default one)."""
    return list(_registry)


def context_for_ordinal(ordinal: int) -> GpuContext:
    """The started context of device ``cuda<ordinal>``, starting it if needed."""
    ctx = _devices.get(ordinal)
    return ctx if ctx is not None else start_device(f"cuda{ordinal}")


# --------------------------------------------------------------------------- interop helpers
def _normal_stream(handle: int | None) -> int:
    """Interop stream numbers -> driver handles: None/0 mean the legacy default stream (1)."""
    return 1 if not handle else int(handle)


def foreign_stream_waits(ctx: GpuContext, consumer_stream: int | None) -> None:
    """Make ``consumer_stream`` wait for the work queued on ``ctx``'s stream (DLPack export).

    ``-1`` means the consumer asked for no synchronisation."""
    if consumer_stream == -1:
        return
    handle = _normal_stream(consumer_stream)
    if handle != ctx.stream_handle:
        ctx.activate()
        _drv().order(ctx.stream_handle, handle)


def wait_for_foreign_stream(ctx: GpuContext, producer_stream: int | None) -> None:
    """Make ``ctx``'s stream wait for work queued on ``producer_stream`` (imports).

    ``None`` in ``__cuda_array_interface__`` means the producer needs no synchronisation."""
    if producer_stream is None or producer_stream == -1:
        return
    handle = _normal_stream(producer_stream)
    if handle != ctx.stream_handle:
        ctx.activate()
        _drv().order(handle, ctx.stream_handle)


def device_of_pointer(ptr: int) -> int:
    """The ordinal of the device that owns device pointer ``ptr``."""
    return _drv().pointer_ordinal(ptr)


def _driver_error() -> type[Exception]:
    """``pycuda.driver.Error``, the base of the CUDA driver errors PyCUDA raises. Call it only
    where PyCUDA has been imported (an ``except`` clause evaluates it when an exception is
    being matched, after the code that imported PyCUDA ran)."""
    import pycuda.driver as drv
    return drv.Error


def _shutdown() -> None:
    """Drop cached memory and pop our contexts at exit, as pycuda.autoprimaryctx does.
    A driver error here (a context whose kernel faulted) only means there is nothing left to
    clean up; any other exception is a bug and is reported."""
    for ctx in list(_devices.values()):
        try:
            ctx.activate()            # each device's own context (several GPUs)
            ctx.stream.synchronize()  # not synchronize(): no pending check errors at exit
            if ctx.pool is not None:
                ctx.pool.release_cached()
            ctx.staging.clear()
            if ctx.pinned is not None:
                ctx.pinned.release_cached()  # leased buffers stay with their arrays
        except _driver_error():
            pass
    if getattr(_tls, "current", None) is not None:
        import pycuda.driver as drv
        try:
            drv.Context.pop()
        except drv.Error:
            pass
        _tls.current = None
    try:
        from pycuda.tools import clear_context_caches
    except ImportError:
        return
    clear_context_caches()
