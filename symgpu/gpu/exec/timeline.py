"""When each step of a GPU function ran on its device: CUDA events around the steps of one
call, on one time axis for all devices, to see that two GPUs worked at the same time.

Why events and a shared origin: a function on two devices queues work on two streams and
returns; the host's clock says when the work was *queued*, not when it ran.  Each step (a
segment's graph launch or plain launches, a copy between devices) is bracketed by two events
on its own context's stream.  Events of two devices cannot be compared directly, so before
the call every device is synchronised and records an *origin* event while idle (it completes
within microseconds of being queued); the host notes when it queued each origin, and a step's
times are its events' times since its device's origin, shifted by that origin's host time.
The error is the few microseconds an idle device takes to reach the origin event: enough to
tell a product of milliseconds running beside another from one running after it.

Used by tests/test_multigpu.py, benchmarks/multi_gpu.py and docs/multiple_gpus.md ("Checking
that the GPUs overlap").  Not for production calls: it synchronises every device before and
after the call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from symgpu.gpu.exec.graph_segment import Segment
from symgpu.gpu.exec.graphs import Runner, _Activate, _BatchStep

__all__ = ["StepInterval", "step_intervals", "overlap_ms"]


@dataclass(frozen=True)
class StepInterval:
    """One step of a call: its nodes' ops (``label``), the device it ran on, and when it
    started and ended there, in milliseconds since the call's origin."""

    label: str
    device: str
    start_ms: float
    end_ms: float


class _Timed:
    """A runner step bracketed by two events on its context's stream."""

    __slots__ = ("current", "inner", "ctx", "events")

    def __init__(self, inner: Any, ctx: Any) -> None:
        import pycuda.driver as drv   # deferred: PyCUDA only where a GPU runs
        self.current, self.inner, self.ctx = inner.current, inner, ctx
        ctx.activate()
        self.events = (drv.Event(), drv.Event())

    def run(self) -> None:
        ctx, (start, end) = self.ctx, self.events
        ctx.activate()
        start.record(ctx.stream)
        self.inner.run()
        ctx.activate()
        end.record(ctx.stream)


def _label(runner: Runner, step: Any) -> str:
    nodes = runner.vm.nodes
    idx = [i for i, _, _ in step.items] if isinstance(step, Segment) else [step.current]
    names = [str(nodes[i].op) for i in idx]
    return ",".join(names) if len(names) <= 3 else f"{names[0]},...({len(names)} nodes)"


def _step_context(runner: Runner, step: Any) -> Any:
    if isinstance(step, Segment):
        return step.ctx
    if runner.node_contexts is not None:
        return runner.node_contexts[step.current]
    return runner.ctx


def step_intervals(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[StepInterval]]:
    """Call the compiled GPU function ``fn`` once, return ``(its outputs, the intervals)``:
    one :class:`StepInterval` per step of its runner that queues device work (segments and
    plain GPU nodes; copies to the host are left out), in run order.  Two steps on two
    devices overlapped when their intervals intersect (:func:`overlap_ms`).  ``fn`` must run
    through the GPU runner (gpu/exec/graphs.py: a function on several devices always does;
    on one, with ``gpuarray.cuda_graphs`` on) and not be profiled."""
    vm = getattr(fn, "vm", None)
    runner = getattr(vm, "runner", None)
    if not isinstance(runner, Runner):
        raise TypeError(f"step_intervals needs a compiled GPU function run by the CUDA-graph "
                        f"runner; {fn!r} has {type(runner).__name__} (a CPU function, a "
                        f"profiled one, or one on one device with gpuarray.cuda_graphs off)")
    import pycuda.driver as drv   # deferred: PyCUDA only where a GPU runs
    steps = runner.steps
    saved = list(steps)
    timed: list[tuple[int, _Timed]] = []
    for k, step in enumerate(saved):
        if isinstance(step, (_Activate, _BatchStep)) or (
                not isinstance(step, Segment) and
                getattr(runner.vm.nodes[step.current].op, "transfer", None) == "download"):
            continue
        ctx = _step_context(runner, step)
        if ctx is None:
            continue
        timed.append((k, _Timed(step, ctx)))
    contexts = list(runner.contexts)
    for ctx in contexts:
        ctx.activate()
        ctx.synchronize()
    origins: dict[int, tuple[Any, float]] = {}
    for ctx in contexts:
        ctx.activate()
        ev = drv.Event()
        t = time.perf_counter()
        ev.record(ctx.stream)
        origins[id(ctx)] = (ev, t)
    for k, t in timed:
        steps[k] = t
    _reroute(runner)
    try:
        out = fn(*args, **kwargs)
    finally:
        steps[:] = saved
        _reroute(runner)
    for ctx in contexts:
        ctx.activate()
        ctx.synchronize()
    t0 = min(t for _, t in origins.values())
    result = []
    for _, t in timed:
        origin, host = origins[id(t.ctx)]
        shift = (host - t0) * 1e3
        start, end = t.events
        result.append(StepInterval(_label(runner, t.inner), t.ctx.device,
                                   shift + start.time_since(origin),
                                   shift + end.time_since(origin)))
    return out, result


def _reroute(runner: Runner) -> None:
    """Rebuild the runner's entry over its (changed) steps and route the VM's calls to it."""
    runner.entry = runner._entry() if runner.node_contexts is None else \
        runner._entry_contexts()
    runner.vm.runner = runner


def overlap_ms(a: StepInterval, b: StepInterval) -> float:
    """How long the two intervals ran at the same time (0.0 when they did not)."""
    return max(0.0, min(a.end_ms, b.end_ms) - max(a.start_ms, b.start_ms))
