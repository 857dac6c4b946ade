"""What a GPU step's call costs the host when it starts a block of steps, the way
benchmarks/half.py times them (blocks of a few steps, each contender's block after another
library's): the first call after a sync, after another library's step and after the CPU's
caches were overwritten, against the calls that follow; then the step timed in blocks of 1, 5
and 50 against JAX's, with the device's view of a 5-step block (CUDA events) and when the
host queued each step.  A report for the GPU machine, not a test.

    python3 benchmarks/first_call.py                 # half.py's GPT block (bf16 mixed)
    python3 benchmarks/first_call.py --model mlp     # mlp, lenet, lstm, gpt
    python3 benchmarks/first_call.py --no-jax

Why: on the H200 the GPT step's device time was 1.13 ms and its host time 0.14 ms a call,
yet half.py measured 1.23 ms a step: a block's first step waited 0.3-0.5 ms for the host,
whose caches JAX's step had just filled.  Most of that call was 43 host nodes of shape
arithmetic the runner's shape memo did not take (it tested host ``Shape_i`` only; a GPU
step reads ``GpuShape_i``); with them memoised the first call after a JAX step took 0.11
ms, not 0.26, and half.py's GPT row went from 1.03x to 0.96x JAX's time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX shares the GPU

from timing import interleaved, say  # noqa: E402

#: bytes written to overwrite the CPU's caches (more than an L3)
CACHE_TRASH = 64 << 20


def first_calls(step, sync, name: str, before, reps: int = 25) -> None:
    """Median host seconds of the first and second call after ``sync(); before()``."""
    first, second = [], []
    for _ in range(reps):
        sync()
        before()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        step()
        second.append(time.perf_counter() - t1)
        first.append(t1 - t0)
    sync()
    say(f"  {name:34s} first call {statistics.median(first) * 1e3:.3f} ms "
        f"(best {min(first) * 1e3:.3f}), the next {statistics.median(second) * 1e3:.3f} ms")


def device_view(ctx, step, sync, peer, blocks: int = 5, number: int = 5) -> None:
    """Blocks of `number` steps after a step of `peer`'s: wall time, the device's span between
    CUDA events around the block, and when the host had queued each step (ms from the
    start)."""
    import pycuda.driver as drv
    for _ in range(blocks):
        if peer is not None:
            peer[1]()
            peer[2]()
        start, end = drv.Event(), drv.Event()
        t0 = time.perf_counter()
        start.record(ctx.stream)
        queued = []
        for _ in range(number):
            step()
            queued.append(time.perf_counter() - t0)
        end.record(ctx.stream)
        sync()
        wall = time.perf_counter() - t0
        say(f"  block of {number}: wall {wall * 1e3:.3f} ms, device span "
            f"{end.time_since(start):.3f} ms, steps queued at "
            + ", ".join(f"{q * 1e3:.2f}" for q in queued) + " ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt", help="half.py's model: mlp, lenet, lstm, gpt")
    ap.add_argument("--no-jax", action="store_true", help="leave JAX's step out")
    args = ap.parse_args()
    import symgpu
    import half_peers
    import half_symgpu
    with symgpu.config.change_flags(device="cuda", floatX="float32"):
        ctx = symgpu.gpu.init_default_context()
        if ctx is None:
            raise SystemExit("no usable GPU here")
        with symgpu.config.change_flags(mixed_precision="bfloat16"):
            step, _, sync = half_symgpu.BUILDERS[args.model]({})
        peer = None
        if not args.no_jax:
            try:
                peer = half_peers.JAX[args.model]()[0]
            except Exception as exc:    # no JAX: the rows without it still say something
                say(f"  JAX unavailable: {type(exc).__name__}: {exc}")
        for _ in range(5):
            step()
        sync()
        say(f"== {args.model}: host time of a call")
        trash = bytearray(CACHE_TRASH)

        def overwrite() -> None:
            for i in range(0, len(trash), 64):
                trash[i] = 1
        first_calls(step, sync, "after a sync", lambda: None)
        first_calls(step, sync, "after a sync and 2 ms asleep", lambda: time.sleep(0.002))
        if peer is not None:
            first_calls(step, sync, "after JAX's step", lambda: (peer[1](), peer[2]()))
        first_calls(step, sync, f"after {CACHE_TRASH >> 20} MB of CPU writes", overwrite)
        say(f"== {args.model}: blocks of steps, interleaved with JAX's")
        contenders = [("symgpu", step, sync)] + ([peer] if peer is not None else [])
        for number, rounds in ((1, 21), (5, 15), (50, 5)):
            times = interleaved([c[1] for c in contenders], number, rounds,
                                [c[2] for c in contenders])
            say(f"  {number:3d} steps a block: " + "; ".join(
                f"{c[0]} median {med * 1e3:.3f} ms, best {best * 1e3:.3f}"
                for c, (best, med) in zip(contenders, times)))
        say(f"== {args.model}: the device's view of a block")
        device_view(ctx, step, sync, peer)


if __name__ == "__main__":
    main()
