"""What every benchmark script times with: printing as it goes, seconds per call, peers that
may be missing, and interleaved timing for noisy machines."""
from __future__ import annotations

import os
import statistics
import time
import traceback
from typing import Callable


def say(*args: object) -> None:
    print(*args, flush=True)


def per_call(fn: Callable, number: int, sync: Callable | None = None, repeat: int = 5) -> float:
    """Median over `repeat` loops of seconds per call (`number` calls, one sync per loop)."""
    fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def guarded(label: str, fn: Callable) -> None:
    """Run `fn`; a missing or broken peer prints why and the run goes on."""
    try:
        fn()
    except Exception as exc:
        say(f"  {label}: unavailable ({type(exc).__name__}: {exc})")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()


def interleaved(steps: list, number: int, rounds: int) -> list[tuple[float, float]]:
    """(best, median) seconds per call of each `step()`, over blocks of `number` calls, the
    steps timed in alternation block after block: short blocks and many rounds, so that the
    machine's drift (on a shared 2-core VM it swings by tens of percent within a second)
    hits every contender alike."""
    blocks: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for k, step in enumerate(steps):
            t0 = time.perf_counter()
            for _ in range(number):
                step()
            blocks[k].append((time.perf_counter() - t0) / number)
    return [(min(b), sorted(b)[len(b) // 2]) for b in blocks]
