"""A context's communication stream: collectives forked off the compute stream, joined back.

Why: on the context's one stream a bucket's all-reduce waits for every kernel queued before
it and holds up every kernel queued after it, so communication and the rest of the backward
pass never overlap (PyTorch's DDP runs NCCL on a stream of its own for this).  Here:

* each context gets, with its first collective that has a join, a second stream, the
  *communication stream* (:func:`comm_stream_of`), made in the context like the first;
* a collective's thunk (symgpu/gpu/ops/collectives.py) allocates its output on the compute
  stream (the pool is ordered on it), then :meth:`Fork.begin` records an event there and
  makes the communication stream wait for it (the fork: the bucket's gradients and the
  output's allocation are queued before it), queues NCCL and the watchdog's counting kernels
  on the communication stream, and :meth:`Fork.end` records the *done* event behind them,
  keeping the arrays NCCL reads and writes alive;
* the node ``GpuCommJoin`` (symgpu/gpu/ops/comm_join.py) that the rewrite puts before the
  collective's consumers calls :meth:`Fork.join`: the compute stream waits for the done
  event, and the arrays are let go (the pool may hand their blocks out again: anything
  queued on the compute stream from then on runs after NCCL is done with them);
* a CUDA-graph capture joins whatever is still forked before it begins and before it ends
  (:func:`join_pending`, called by symgpu/gpu/exec/graph_segment.py): a captured fork is
  always joined back into the capturing stream, as CUDA requires, and a capture never waits
  on an event recorded outside it.  Events and cross-stream waits of a capture become the
  graph's edges: on replay the NCCL node runs beside the compute kernels between its fork
  and its join.

Every fork is joined before the call returns (each collective's consumers and the function's
outputs read it through its join), so a later synchronisation of the compute stream (a copy to
the host, ``ctx.synchronize()``) also waits for the collectives.  The driver is an object of
its own (:func:`driver`), so tests replace it with a fake that logs the calls.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

from symgpu.gpu.runtime import libcuda

__all__ = ["CommDriver", "CommStream", "Fork", "ForkSlot", "driver", "comm_stream_of",
           "on_communicator_teardown", "before_communicator_teardown",
           "join_pending", "fork_slot", "slot_of"]

_CU_EVENT_DISABLE_TIMING = 2


class CommDriver:
    """The driver calls of forks and joins (streams, events, cross-stream waits)."""

    def __init__(self) -> None:
        lib = libcuda.cdll()
        vp = ctypes.c_void_p
        for name, args in (("cuEventCreate", [ctypes.POINTER(vp), ctypes.c_uint]),
                           ("cuEventRecord", [vp, vp]), ("cuEventDestroy_v2", [vp]),
                           ("cuStreamWaitEvent", [vp, vp, ctypes.c_uint])):
            libcuda.declare(lib, name, args)
        self.lib, self.check = lib, libcuda.check

    def new_stream(self, ctx: Any) -> tuple[Any, int]:
        """A new stream of ``ctx`` (made current): (PyCUDA's Stream, its handle).  PyCUDA's
        object, because kernels are launched with ``prepared_async_call(..., stream)``."""
        import pycuda.driver as drv   # the GPU path only
        ctx.activate()
        stream = drv.Stream()
        return stream, int(stream.handle)

    def event(self) -> int:
        """A new event of the current context (no timing: the cheapest to record)."""
        ev = ctypes.c_void_p()
        self.check(self.lib.cuEventCreate(ctypes.byref(ev), _CU_EVENT_DISABLE_TIMING),
                   "cuEventCreate")
        return int(ev.value)

    def destroy_event(self, event: int) -> None:
        self.lib.cuEventDestroy_v2(ctypes.c_void_p(event))   # at exit the context may be gone

    def record(self, event: int, stream: int) -> None:
        self.check(self.lib.cuEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream)),
                   "cuEventRecord")

    def wait(self, stream: int, event: int) -> None:
        """Make work queued later on ``stream`` wait for ``event``'s last record."""
        self.check(self.lib.cuStreamWaitEvent(ctypes.c_void_p(stream), ctypes.c_void_p(event),
                                              0), "cuStreamWaitEvent")


_driver: Any = None
_lock = threading.Lock()
_make_lock = threading.Lock()


def driver() -> Any:
    """The process's fork/join driver (tests replace ``comm_stream._driver``)."""
    global _driver
    with _lock:
        if _driver is None:
            _driver = CommDriver()
        return _driver


class CommStream:
    """One context's communication stream and the forks queued on it not yet joined."""

    def __init__(self, ctx: Any, drv: Any) -> None:
        self.ctx, self.driver = ctx, drv
        self.stream, self.handle = drv.new_stream(ctx)
        #: forks begun and not yet joined, in the order they began
        self.pending: list[Fork] = []

    def __repr__(self) -> str:
        return f"<CommStream of {self.ctx!r}: stream {self.handle:#x}, " \
               f"{len(self.pending)} forks pending>"

    def join_all(self) -> int:
        """Join every pending fork (the compute stream waits for each); returns how many."""
        n = 0
        while self.pending:
            self.pending[0].join()
            n += 1
        return n


def comm_stream_of(ctx: Any) -> CommStream:
    """``ctx``'s communication stream, made on first use (never under a capture: the first
    call of a function runs its thunks plainly, and the join's thunk asks at link time)."""
    comm = getattr(ctx, "comm", None)
    if comm is not None:
        return comm
    drv = driver()
    with _make_lock:
        comm = getattr(ctx, "comm", None)
        if comm is None:
            comm = ctx.comm = CommStream(ctx, drv)
    return comm


def join_pending(ctx: Any) -> int:
    """Join every fork of ``ctx`` still pending (none when it has no communication stream):
    before a capture begins and before it ends (graph_segment.py)."""
    comm = getattr(ctx, "comm", None)
    if comm is None or not comm.pending:
        return 0
    return comm.join_all()


class Fork:
    """One collective node's fork and join, in one linked function (its thunk and its join's
    share it): two events made once, whether it is forked now, and what it keeps alive."""

    __slots__ = ("comm", "started", "done", "pending", "ended", "keep", "__weakref__")

    def __init__(self, comm: CommStream) -> None:
        self.comm = comm
        drv = comm.driver
        comm.ctx.activate()
        self.started, self.done = drv.event(), drv.event()
        self.pending = self.ended = False
        self.keep: tuple = ()
        weakref.finalize(self, _destroy, drv, (self.started, self.done))

    @property
    def stream(self) -> Any:
        """The communication stream (PyCUDA's object) the collective queues its work on."""
        return self.comm.stream

    @property
    def handle(self) -> int:
        return self.comm.handle

    def begin(self) -> None:
        """The fork: the communication stream waits for what the compute stream holds now.
        A fork of this node still pending (a failed call's) is joined first."""
        if self.pending:
            self.join()
        comm = self.comm
        drv = comm.driver
        drv.record(self.started, comm.ctx.stream_handle)
        drv.wait(comm.handle, self.started)
        self.pending, self.ended = True, False
        comm.pending.append(self)

    def end(self, *keep: Any) -> None:
        """After the collective's work: record the done event on the communication stream;
        ``keep`` (its input and output arrays) stays alive until the join."""
        self.comm.driver.record(self.done, self.comm.handle)
        self.ended = True
        self.keep = keep

    def join(self) -> None:
        """The compute stream waits for the done event (recorded now if the collective
        failed before its end); the kept arrays are let go.  Nothing when not forked."""
        if not self.pending:
            return
        comm = self.comm
        drv = comm.driver
        if not self.ended:
            drv.record(self.done, comm.handle)
            self.ended = True
        drv.wait(comm.ctx.stream_handle, self.done)
        self.pending = False
        self.keep = ()
        comm.pending.remove(self)


def _destroy(drv: Any, events: tuple[int, ...]) -> None:
    for ev in events:
        drv.destroy_event(ev)


class ForkSlot:
    """Where a collective's thunk finds its Fork: linked before its join, the thunk makes the
    slot (empty: the call stays on the compute stream), and the join's link puts the Fork in
    it.  So a collective forks only when a join will bring it back (a graph compiled without
    the join pass, or with ``distributed.comm_stream`` off, runs on one stream)."""

    __slots__ = ("cell", "fork", "__weakref__")

    def __init__(self, cell: list) -> None:
        self.cell, self.fork = cell, None


#: id(the collective's output cell) -> its slot, while its thunk lives (the thunk holds the
#: slot and the cell: a live slot's cell is alive, so its id names no other cell)
_SLOTS: "weakref.WeakValueDictionary[int, ForkSlot]" = weakref.WeakValueDictionary()


def fork_slot(out_cell: list) -> ForkSlot:
    """A new slot for the collective whose output goes into ``out_cell`` (its make_thunk)."""
    slot = ForkSlot(out_cell)
    with _lock:
        _SLOTS[id(out_cell)] = slot
    return slot


def slot_of(cell: list) -> ForkSlot | None:
    """The slot of the collective whose output cell is ``cell`` (the join's make_thunk)."""
    with _lock:
        slot = _SLOTS.get(id(cell))
    return slot if slot is not None and slot.cell is cell else None


#: what must let go of a communicator before NCCL tears it down (CUDA graphs holding its
#: calls: symgpu/gpu/exec/graphs.py registers their release); here, below both the
#: collectives (ops) and the graphs (exec), so neither layer imports the other
_TEARDOWN_HOOKS: list = []


def on_communicator_teardown(hook: Any) -> Any:
    """Register ``hook(ctx)`` to run before a GPU communicator on ``ctx`` is torn down."""
    if hook not in _TEARDOWN_HOOKS:
        _TEARDOWN_HOOKS.append(hook)
    return hook


def before_communicator_teardown(ctx: Any) -> None:
    """Run the registered hooks (NcclCommunicator.close, before ncclCommFinalize)."""
    for hook in list(_TEARDOWN_HOOKS):
        hook(ctx)
