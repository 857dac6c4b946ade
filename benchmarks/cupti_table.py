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
