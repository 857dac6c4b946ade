"""Where a step's device time goes, by CUPTI (PyTorch's profiler sees every library's kernels
in the process: symgpu's, cuDNN's, JAX's): the table the profiling scripts print
(gpt_step_runner.py, rnn_varlen.py)."""
from __future__ import annotations

import time
from typing import Callable


def kernel_table(step: Callable[[], object], sync: Callable[[], object], n: int = 5,
                 rows: int = 25, say: Callable[[str], object] = print) -> None:
    """Run `step` n times under the profiler, then say the device events, device-to-device
    copies, device and wall time per step, and the kernels taking most of the device time
    (microseconds per step, launches per step)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        say(f"CUPTI unavailable (no torch profiler): {exc}")
        return
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        sync()
    wall = (time.perf_counter() - t0) / n
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    copies = [e for e in evs if "memcpy" in e.name.lower() and "dtod" in e.name.lower()]
    total = sum(e.device_time for e in evs)
    say(f"per step (CUPTI): {len(evs) / n:.0f} device events, {len(copies) / n:.0f} "
        f"device-to-device copies ({sum(e.device_time for e in copies) / n:.1f} us), "
        f"device time {total / n / 1e3:.3f} ms of {wall * 1e3:.3f} ms wall (profiled)")
    by: dict[str, list] = {}
    for e in evs:
        t = by.setdefault(e.name[:80], [0, 0.0])
        t[0] += 1
        t[1] += e.device_time
    say("kernels taking most of a step's device time (us per step, launches per step):")
    for name, (count, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:rows]:
        say(f"  {us / n:8.1f} us  x{count / n:5.1f}  {name}")
    idle_table(evs, n, say)


def idle_table(evs: list, n: int, say: Callable[[str], object] = print, rows: int = 8) -> None:
    """Where the device sat idle between its events (the profiled steps back to back): the
    span from the first event's start to the last one's end against the time some event ran,
    per step, and the longest idle stretches with the events on either side.  Idle time is
    launch latency between dependent kernels, host work the device waited for, or syncs."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:40]) for e in evs)
    if not spans:
        return
    busy, gaps, end, last = 0.0, [], spans[0][0], spans[0][2]
    for start, stop, name in spans:
        if start > end:
            gaps.append((start - end, last, name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, last = stop, name
    span = end - spans[0][0]
    say(f"device timeline: span {span / n:.1f} us a step, busy {busy / n:.1f} us, idle "
        f"{(span - busy) / n:.1f} us in {len(gaps) / n:.1f} stretches a step")
    for gap, before, after in sorted(gaps, reverse=True)[:rows]:
        say(f"  idle {gap:7.1f} us  after {before}  before {after}")


def step_times(step: Callable[[], object], sync: Callable[[], object], warm: int = 10,
               timed: int = 20) -> tuple[float, float]:
    """(median, best) seconds of `timed` synchronised steps after `warm` untimed ones."""
    for _ in range(warm):
        step()
    sync()
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], times[0]


def queue_times(step: Callable[[], object], sync: Callable[[], object],
                n: int = 50) -> tuple[float, float]:
    """(seconds a step takes the host to queue, seconds a step until the device is done) over
    `n` steps called back to back: the first near the second means the host, not the
    device, sets the pace (or a call waits for the device)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / n, (t2 - t0) / n
