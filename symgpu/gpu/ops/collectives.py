"""Collectives on the GPU through NCCL: GpuAllReduce, GpuBroadcast, GpuAllGather,
GpuReduceScatter (lifted from symgpu.distributed's host ops), the NCCL communicator (the
``nccl`` backend of ``symgpu.distributed.init``) and its watchdog.

Each thunk enqueues one NCCL call, with no host synchronisation, so a step's CUDA graph
captures it (NCCL calls on a capturing stream are recorded as graph nodes): on the context's
communication stream, forked off the compute stream and joined back by the GpuCommJoin that
reads the result (ops/comm_join.py, runtime/comm_stream.py), or, without a join, on the
compute stream.
Around the call two one-thread kernels (codegen/nccl_watch.cu) count collectives started and
finished in mapped host memory.  A watchdog thread per communicator polls
``ncclCommGetAsyncError`` and those counters: on an NCCL error (a peer's connection closed) or
when a started collective has not finished within ``distributed.timeout`` seconds while no
other finished (a peer died or hangs), it records the error, sets the abort word and calls
``ncclCommAbort``, which makes the stuck NCCL kernels return; the finishing kernel then
reports through the node's device-check slot, so the waiting call raises the error at its
synchronisation, naming the node, instead of hanging.  Later collectives raise it at once.

Setup is watched too: the communicator is created non-blocking (ncclCommInitRankConfig with
``blocking = 0``, where the library has it) and polled under the ``distributed.timeout``
deadline, so a rank that dies before or during NCCL's setup makes the others fail with a
DistributedTimeoutError naming rank and world instead of hanging in ncclCommInitRank.  A
non-blocking communicator's calls may return ncclInProgress: ``settle`` polls
ncclCommGetAsyncError (under the same deadline) before the next call, as NCCL requires.
"""
from __future__ import annotations

import sys
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from symgpu.distributed.communicator import (Communicator, DistributedError,
                                             DistributedTimeoutError, communicator)
from symgpu.distributed.env import LaunchInfo
from symgpu.distributed.ops import AllGather, AllReduce, Broadcast, ReduceScatter
from symgpu.distributed.ops import group_communicator
from symgpu.distributed.local import register_context_lookup
from symgpu.distributed.runtime import register_backend
from symgpu.distributed.schedule import ShapeCheck
from symgpu.gpu.ops import nccl_lib
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import text
from symgpu.gpu.runtime.comm_stream import before_communicator_teardown, fork_slot
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.context import ContextNotFound, get_context
from symgpu.gpu.runtime.device_checks import (REPORT_SOURCE, DeviceChecked, checks_are_deferred,
                                              launch_checked)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.type import TensorType

__all__ = ["GpuAllReduce", "GpuBroadcast", "GpuAllGather", "GpuReduceScatter",
           "NcclCommunicator", "Watchdog", "watch_source"]

_MODULE_KEY = ("symgpu.nccl_watch",)


def watch_source() -> str:
    """The CUDA module of the watchdog's counting kernels."""
    return REPORT_SOURCE + text("nccl_watch.cu")


# ----------------------------------------------------------------------------- watchdog

class Watchdog:
    """Watches one NCCL communicator from a daemon thread (see the module's docstring).
    ``counters`` is the mapped host array [started, finished, aborted]; ``poll()`` is one
    round, returning the error it found (tests drive it with a fake clock)."""

    def __init__(self, comm: "NcclCommunicator", counters: np.ndarray, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.comm, self.counters, self.timeout, self.clock = comm, counters, timeout, clock
        self._since: float | None = None
        self._last_finished = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, period: float = 0.1) -> None:
        def loop() -> None:
            while not self._stop.wait(period):
                if self.poll() is not None:
                    return
        self._thread = threading.Thread(target=loop, name="symgpu-nccl-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def poll(self) -> Exception | None:
        comm = self.comm
        if comm.error is not None:
            return comm.error
        status = comm.nccl.async_error(comm.handle)
        if status not in (0, nccl_lib.IN_PROGRESS):
            return self.fail(DistributedError(
                f"rank {comm.rank} of {comm.world_size}: NCCL reported "
                f"{comm.nccl.error_text(status, comm.handle)} (a peer rank died or its "
                f"connection failed); the communicator was aborted"))
        started, finished = int(self.counters[0]), int(self.counters[1])
        now = self.clock()
        if started <= finished:
            self._since = None
        elif self._since is None or finished != self._last_finished:
            self._since = now
        elif now - self._since > self.timeout:
            return self.fail(DistributedTimeoutError(
                f"rank {comm.rank} of {comm.world_size}: NCCL collective #{finished + 1} did "
                f"not finish within {self.timeout:g} s (distributed.timeout): a peer rank "
                f"died or hangs; the communicator was aborted"))
        self._last_finished = finished
        return None

    def fail(self, exc: Exception) -> Exception:
        comm = self.comm
        comm.error = exc
        self.counters[2] = 1
        print(f"symgpu.distributed: {exc}", file=sys.stderr, flush=True)
        comm.nccl.abort(comm.handle)
        comm.aborted = True
        return exc


def _mapped_counters() -> tuple[np.ndarray, int]:
    import pycuda.driver as drv   # the GPU path only
    arr = drv.pagelocked_zeros((4,), np.uint64, mem_flags=drv.host_alloc_flags.DEVICEMAP)
    return arr, int(arr.base.get_device_pointer())


class NcclCommunicator(Communicator):
    """An NCCL communicator on this process's default GPU context.  Device collectives are
    the GPU ops' (``launch``); host-array collectives, ``exchange`` (the schedule check) and
    the unique id go through ``host``, the rendezvous's host communicator."""

    backend = "nccl"
    supports_device = True

    def __init__(self, info: LaunchInfo, host: Communicator, timeout: float,
                 ctx: Any = None, binding: Any = None,
                 counters: tuple[np.ndarray, int] | None = None,
                 watch: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(timeout)
        self.host, self.rank, self.world_size = host, host.rank, host.world_size
        self.ctx = _context(None) if ctx is None else ctx
        self.nccl = nccl_lib.nccl() if binding is None else binding
        self.error: Exception | None = None
        self.aborted = False
        self.clock, self.sleep = clock, sleep
        if not getattr(self.ctx, "virtual", False):
            self.ctx.activate()
        uid = self.nccl.unique_id() if self.rank == 0 else bytes(128)
        uid = host.broadcast(np.frombuffer(uid, np.uint8), 0).tobytes()
        self.handle, status = self.nccl.comm_init_rank(self.world_size, uid, self.rank,
                                                       blocking=False)
        self.nonblocking = self.nccl.has_nonblocking_init
        if self.nonblocking:
            try:
                self.settle("NCCL communicator setup (ncclCommInitRankConfig)")
            except DistributedError:
                host.close()                 # settle aborted NCCL's communicator already
                raise
        self.counters, self.counters_ptr = _mapped_counters() if counters is None else counters
        self.watchdog = Watchdog(self, self.counters, self.timeout)
        if watch:
            self.watchdog.start()

    # host arrays and small messages: the rendezvous's communicator
    def all_reduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        return self.host.all_reduce(x, op)

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        return self.host.broadcast(x, root)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return self.host.all_gather(x)

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        return self.host.reduce_scatter(x, op)

    def exchange(self, payload: bytes, what: str = "exchange") -> list[bytes]:
        return self.host.exchange(payload, what)

    def barrier(self) -> None:
        self.host.barrier()

    def settle(self, what: str) -> None:
        """Wait until the communicator's last call is no longer in progress (a non-blocking
        communicator's setup or enqueue), within ``timeout``; on an NCCL error or at the
        deadline abort the communicator and raise, naming rank and world."""
        deadline = self.clock() + self.timeout
        while True:
            status = self.nccl.async_error(self.handle)
            if status == 0:
                return
            if status != nccl_lib.IN_PROGRESS:
                exc: Exception = DistributedError(
                    f"rank {self.rank} of {self.world_size}: {what} failed: NCCL reported "
                    f"{self.nccl.error_text(status, self.handle)} (a peer rank died or its "
                    f"connection failed); the communicator was aborted")
                break
            if self.clock() > deadline:
                exc = DistributedTimeoutError(
                    f"rank {self.rank} of {self.world_size}: {what} did not finish within "
                    f"{self.timeout:g} s (distributed.timeout): a peer rank died or hangs "
                    f"(or never started); the communicator was aborted")
                break
            self.sleep(0.002)
        self.error = exc
        self.nccl.abort(self.handle)
        self.aborted = True
        raise exc

    def launch(self, node: Apply, ctx: Any, call: Callable[[], Any],
               stream: Any = None) -> None:
        """Queue ``call`` (one NCCL call on ``stream``, returning its status) between the
        counting kernels, on that stream too (PyCUDA's object: the context's communication
        stream; None: its compute stream); a call still in progress is settled before the
        next one."""
        if self.error is not None:
            raise self.error
        if self.handle is None:
            what = node.op if node is not None else "a collective"
            raise DistributedError(f"rank {self.rank} of {self.world_size}: {what} "
                                   f"runs on an NCCL communicator that was closed "
                                   f"(distributed.finalize()); init() again and compile the "
                                   f"function anew")
        start = get_prepared_kernel(_MODULE_KEY, watch_source, "nccl_started", "P", context=ctx)
        done = get_prepared_kernel(_MODULE_KEY, watch_source, "nccl_finished", "PP",
                                   context=ctx)
        start.prepared_async_call((1, 1), (1, 1, 1), ctx.stream if stream is None else stream,
                                  self.counters_ptr)
        if call() == nccl_lib.IN_PROGRESS:
            self.settle(f"{node.op if node is not None else 'an NCCL call'}")
        launch_checked(node, ctx, done, (1, 1), (1, 1, 1), (self.counters_ptr,),
                       self._describe, stream)

    def _describe(self, bad: int) -> Exception:
        return self.error or DistributedError(
            f"rank {self.rank}: the NCCL communicator was aborted during this collective")

    def close(self) -> None:
        """Tear NCCL's communicator down as NCCL asks of a non-blocking one: ncclCommFinalize,
        polled until it is done (within ``timeout``; else aborted, with a warning), then
        ncclCommDestroy, which then never blocks.  A plain ncclCommDestroy of a non-blocking
        communicator hung on two H200s (NCCL 2.28), both ranks inside it: it waits until every
        CUDA graph that captured one of its calls is destroyed, so those go first."""
        self.watchdog.stop()
        if self.handle is not None:
            if not (self.aborted or self.error is not None):   # else ncclCommAbort freed it
                self._finalize_and_destroy()
            self.handle = None
        self.host.close()

    def _finalize_and_destroy(self) -> None:
        if not getattr(self.ctx, "virtual", False):
            self.ctx.activate()
            before_communicator_teardown(self.ctx)   # NCCL waits for the graphs holding it
        if self.nonblocking and self.nccl.has_finalize:
            try:
                if self.nccl.finalize(self.handle) == nccl_lib.IN_PROGRESS:
                    self.settle("NCCL communicator teardown (ncclCommFinalize)")
            except (DistributedError, nccl_lib.NcclError) as exc:
                if not self.aborted:
                    self.nccl.abort(self.handle)
                    self.aborted = True
                warnings.warn(f"symgpu.distributed: {exc}", RuntimeWarning, stacklevel=3)
                return
        self.nccl.destroy(self.handle)


def _make_nccl(info: LaunchInfo, host: Communicator, timeout: float,
               context: Any = None) -> NcclCommunicator:
    """init()'s NCCL communicator on the default context (``context``: a local world's rank's)."""
    return NcclCommunicator(info, host, timeout, ctx=context)


def _local_context(name: str | None) -> Any:
    """A local world's context by name; None for the default one where there is none."""
    try:
        return get_context(name)
    except ContextNotFound:
        if name is None:
            return None
        raise


register_backend("nccl", _make_nccl)
register_context_lookup(_local_context)


# ----------------------------------------------------------------------------- the ops

class _GpuCollective(DeviceChecked, Op):
    """A host collective's GPU twin: the same props, shape rule and schedule entry; the
    thunk queues one NCCL call (``nccl_call``) on the stream (capturable)."""

    host_op: type = Op
    #: placed right after its inputs (symgpu/link/order.py): its join comes as late as the
    #: graph allows, so the computation queued between them overlaps the NCCL call
    schedule_hint = "early"
    #: a CUDA graph that captures it holds NCCL's communicator (released before teardown)
    captures_communicator = True

    def make_node(self, x: Any) -> Apply:
        ctx = x.type.context_name if is_gpu_var(x) else None
        x = as_gpuarray_variable(x, ctx)
        if x.dtype not in nccl_lib.NCCL_DTYPES:
            raise TypeError(f"{self}: NCCL cannot carry {x.dtype} ({x.type})")
        host = self.host_twin().make_node(TensorType(x.dtype, x.broadcastable)())
        bc = host.outputs[0].broadcastable
        return Apply(self, [x], [GpuArrayType(x.dtype, bc, ctx)()])

    def host_twin(self) -> Any:
        return self.host_op(**{p: getattr(self, p) for p in self.__props__})

    def __str__(self) -> str:
        return "Gpu" + str(self.host_twin())

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return self.host_twin().infer_shape(fgraph, node, input_shapes)

    def grad(self, inputs: list, output_grads: list) -> list:
        return self.host_twin().grad(inputs, output_grads)

    def schedule_entry(self, node: Apply) -> str:
        x = node.inputs[0].type
        return f"{self.host_twin()} of {x.dtype} {len(x.broadcastable)}-d " \
               f"{tuple(x.broadcastable)}"

    collective_kind = property(lambda self: self.host_op.collective_kind)

    def out_shape(self, shape: tuple) -> tuple:
        return shape

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, watch_source, ())]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        comm = group_communicator(self, node)
        if not getattr(comm, "supports_device", False):
            raise DistributedError(f"{self}: the communicator of group {self.group!r} "
                                   f"({comm!r}) cannot run GPU collectives; init() with the "
                                   f"nccl backend")
        own = getattr(getattr(comm, "ctx", None), "device", ctx.device)
        if own != ctx.device:
            raise DistributedError(f"{self}: its value is on {ctx.device} (context "
                                   f"{ctx.name!r}) but this thread's communicator of group "
                                   f"{self.group!r} is on {own}: in a local world, place each "
                                   f"rank's values on its own context (world.context(rank))")
        cell, out_cell = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        dtype = np.dtype(node.outputs[0].dtype)
        binding, stream = comm.nccl, ctx.stream_handle
        check_shape = ShapeCheck(comm, node)
        # the join of this node (GpuCommJoin, ops/comm_join.py), linked after it, gives the
        # slot a Fork: then the call is queued on the communication stream
        slot = fork_slot(out_cell)

        def thunk() -> None:
            x = cell[0]
            check_shape(tuple(x.shape))    # the first call only (distributed.check_shapes)
            if not x.is_c_contiguous:
                x = x.copy()
            shape = self.out_shape(tuple(x.shape))
            out = new_array(ctx, shape, dtype)
            if x.size:
                fork = slot.fork
                if fork is None:
                    comm.launch(node, ctx,
                                lambda: self.nccl_call(binding, comm, x, out, stream))
                else:
                    fork.begin()
                    h = fork.handle
                    comm.launch(node, ctx, lambda: self.nccl_call(binding, comm, x, out, h),
                                fork.stream)
                    fork.end(x, out)
            out_cell[0] = out

        thunk.capturable = checks_are_deferred()  # type: ignore[attr-defined]
        thunk.launches = True                     # type: ignore[attr-defined]
        return thunk


class GpuAllReduce(_GpuCollective):
    """AllReduce on the GPU: ncclAllReduce (sum, prod, max, min, avg)."""

    __props__ = ("op", "group")
    host_op = AllReduce

    def __init__(self, op: str = "sum", group: str = "world") -> None:
        self.op, self.group = op, group

    def nccl_call(self, b: Any, comm: Any, x: Any, out: Any, stream: int) -> int:
        return b.all_reduce(x.ptr, out.ptr, x.size, str(x.dtype), self.op, comm.handle, stream)


class GpuBroadcast(_GpuCollective):
    """Broadcast on the GPU: ncclBroadcast from ``root``."""

    __props__ = ("root", "group")
    host_op = Broadcast

    def __init__(self, root: int = 0, group: str = "world") -> None:
        self.root, self.group = int(root), group

    def nccl_call(self, b: Any, comm: Any, x: Any, out: Any, stream: int) -> int:
        return b.broadcast(x.ptr, out.ptr, x.size, str(x.dtype), self.root, comm.handle,
                           stream)


class GpuAllGather(_GpuCollective):
    """AllGather on the GPU: ncclAllGather (rank order along axis 0)."""

    __props__ = ("world_size", "group")
    host_op = AllGather

    def __init__(self, world_size: int, group: str = "world") -> None:
        self.world_size, self.group = int(world_size), group

    def out_shape(self, shape: tuple) -> tuple:
        return (shape[0] * self.world_size,) + shape[1:]

    def nccl_call(self, b: Any, comm: Any, x: Any, out: Any, stream: int) -> int:
        return b.all_gather(x.ptr, out.ptr, x.size, str(x.dtype), comm.handle, stream)


class GpuReduceScatter(_GpuCollective):
    """ReduceScatter on the GPU: ncclReduceScatter (axis 0 split in world_size parts)."""

    __props__ = ("op", "world_size", "group")
    host_op = ReduceScatter

    def __init__(self, op: str = "sum", world_size: int = 1, group: str = "world") -> None:
        self.op, self.world_size, self.group = op, int(world_size), group

    def out_shape(self, shape: tuple) -> tuple:
        if not shape or shape[0] % self.world_size:
            raise ValueError(f"{self}: the first dimension of shape {shape} must split into "
                             f"{self.world_size} equal parts")
        return (shape[0] // self.world_size,) + shape[1:]

    def nccl_call(self, b: Any, comm: Any, x: Any, out: Any, stream: int) -> int:
        return b.reduce_scatter(x.ptr, out.ptr, out.size, str(x.dtype), self.op, comm.handle,
                                stream)


_TWINS = {AllReduce: GpuAllReduce, Broadcast: GpuBroadcast, AllGather: GpuAllGather,
          ReduceScatter: GpuReduceScatter}


def _device_group(group: str) -> bool:
    """Whether ``group``'s communicator (in this thread) runs GPU collectives; a virtual
    context (placement tests) lifts whatever the communicator."""
    try:
        return bool(getattr(communicator(group), "supports_device", False))
    except DistributedError:
        return False


@register_lifter(AllReduce, Broadcast, AllGather, ReduceScatter)
def lift_collective(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    if node.inputs[0].dtype not in nccl_lib.NCCL_DTYPES:
        return None
    if not (_device_group(op.group) or _context(context_name).virtual):
        return None
    twin = _TWINS[type(op)](**{p: getattr(op, p) for p in op.__props__})
    return [twin(inputs[0])]
