"""CUDA-event node timers for the profiler: nodes of the GPU backend's ops are timed on
their context's stream, so a profile's GPU op times are true (``register_node_timer`` in
symgpu/compile/profiling.py).  Registered when the GPU backend is imported.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.compile import profiling
from symgpu.compile.profiling import perf_counter_timer
from symgpu.gpu.placement.type import is_gpu_var as _is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.graph.devices import is_device_var, transfer_kind

__all__ = ["register_gpu_timers", "is_gpu_node", "event_timer"]


def node_context(node: Any) -> Any:
    for v in list(node.outputs) + list(node.inputs):
        if _is_gpu_var(v):
            return gpu_context._registry.get(v.type.context_name)
    return None


def is_gpu_node(node: Any) -> bool:
    """A transfer, or a node making device values (a GPU op: graph/devices.py), on a
    registered context: its work is queued on that context's stream. A host op that only
    reads device values (a shape, a host copy of its own) is timed on the host."""
    makes_device_values = any(is_device_var(o) for o in node.outputs)
    return ((makes_device_values or transfer_kind(node.op) is not None)
            and node_context(node) is not None)


def event_timer(node: Any) -> Callable:
    """Time ``node`` with two CUDA events on its context's stream (resolved after the call,
    so a profiled call syncs once, not once per node)."""
    ctx = node_context(node)
    if ctx is None or ctx.virtual or not ctx.stream_handle:
        return perf_counter_timer
    events: list = []

    def timer(thunk: Callable[[], None]) -> Callable[[], float]:
        if not events:
            import pycuda.driver as drv
            ctx.activate()
            events.extend([drv.Event(), drv.Event()])
        start, end = events
        start.record(ctx.stream)
        thunk()
        end.record(ctx.stream)

        def elapsed() -> float:
            end.synchronize()
            return end.time_since(start) / 1e3
        return elapsed

    return timer


def register_gpu_timers() -> None:
    """Make the profiler time Gpu* and HostFromGpu nodes with CUDA events (once)."""
    if any(f is event_timer for _, f in profiling.TIMERS):
        return
    profiling.register_node_timer(is_gpu_node, event_timer)
