"""What every benchmark script times with: printing as it goes, seconds per call, peers that
may be missing, and interleaved timing for noisy machines."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
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


def profile_calls(call: Callable, number: int, sync: Callable | None = None,
                  sorts: tuple[str, ...] = ("tottime",), top: int = 14, warmup: int = 3):
    """Print cProfile's `top` functions, sorted by each of `sorts` in turn, over `number`
    calls of `call` made after `warmup` calls (and a `sync`); the device's work is waited for
    (`sync`) inside the profile. Returns the ``cProfile.Profile``."""
    import cProfile
    import pstats
    for _ in range(warmup):
        call()
    if sync is not None:
        sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(number):
        call()
    if sync is not None:
        sync()
    prof.disable()
    for key in sorts:
        pstats.Stats(prof).sort_stats(key).print_stats(top)
    return prof


def guarded(label: str, fn: Callable) -> None:
    """Run `fn`; a missing or broken peer prints why and the run goes on."""
    try:
        fn()
    except Exception as exc:
        say(f"  {label}: unavailable ({type(exc).__name__}: {exc})")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()


def interleaved(steps: list, number: int, rounds: int,
                syncs: list | None = None, lead: int = 0,
                calls: list | None = None,
                blocks_out: list | None = None) -> list[tuple[float, float]]:
    """(best, median) seconds per call of each `step()`, over blocks of `number` calls, the
    steps timed in alternation block after block: short blocks and many rounds, so that the
    machine's drift (on a shared 2-core VM it swings by tens of percent within a second;
    on a GPU, clocks and a peer's own run-to-run swings) hits every contender alike.
    `syncs[k]` (optional; None for none) ends each block of step k: a device's work is
    counted in its block and never overlaps the next contender's.  `lead` calls of a step
    run untimed before each of its blocks: the first call after another contender's block
    finds the caches holding that one's code and data, which a loop calling one step back
    to back (a training loop) never does.  `calls` (optional, one list per step) receives
    every timed call's own seconds, block by block (each call timed apart: where in a block
    the time goes); `blocks_out` (optional) receives each step's seconds per call of every
    block (for statistics other than the best and the median: trimmed_mean)."""
    syncs = syncs or [None] * len(steps)
    for step, sync in zip(steps, syncs):     # warm: compiles, captures, first-call tuning
        step()
        if sync is not None:
            sync()
    blocks: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for k, step in enumerate(steps):
            sync = syncs[k]
            for _ in range(lead):
                step()
            if lead and sync is not None:
                sync()
            t0 = time.perf_counter()
            if calls is None:
                for _ in range(number):
                    step()
            else:
                for _ in range(number):
                    t1 = time.perf_counter()
                    step()
                    calls[k].append(time.perf_counter() - t1)
            if sync is not None:
                sync()
            blocks[k].append((time.perf_counter() - t0) / number)
    if blocks_out is not None:
        blocks_out[:] = blocks
    return [(min(b), sorted(b)[len(b) // 2]) for b in blocks]


def trimmed_mean(values: list[float], cut: int = 1) -> float:
    """The mean of `values` without their `cut` smallest and `cut` largest (all of them when
    that would leave none): a mean, where a block's time varies by design (a new sequence
    length every call: a median of a few blocks is then a draw of the lengths, not their
    cost), kept from a stray slow block."""
    ordered = sorted(values)
    kept = ordered[cut:len(ordered) - cut] if len(ordered) > 2 * cut else ordered
    return sum(kept) / len(kept)


def report_interleaved(label: str, names: list[str], times: list[tuple[float, float]],
                       peer: str | None = None) -> None:
    """Print each contender's best and median (us) and, against `peer`, the ratios of the
    medians and of the bests (contender / peer: below 1, faster than the peer)."""
    ref = dict(zip(names, times)).get(peer) if peer else None
    for name, (best, med) in zip(names, times):
        line = f"  {label:28s} {name:30s} best {best * 1e6:9.1f} us  median {med * 1e6:9.1f} us"
        if ref is not None and name != peer:
            line += f"   vs {peer}: median {med / ref[1]:6.3f}x  best {best / ref[0]:6.3f}x"
        say(line)


def time_contenders(rows: dict[str, list], number: int, rounds: int, peer: str) -> dict:
    """Time each row's contenders ``(name, step, sync)`` in interleaved rounds, print them
    against `peer`; returns {row: {name: median seconds}}."""
    medians: dict = {}
    for row, contenders in rows.items():
        if not contenders:
            continue
        names = [c[0] for c in contenders]
        times = interleaved([c[1] for c in contenders], number, rounds,
                            [c[2] for c in contenders])
        report_interleaved(row, names, times, peer=peer)
        medians[row] = {who: med for who, (_, med) in zip(names, times)}
    return medians


def build_and_time(title: str, row_names: list[str], builders: list[tuple[str, Callable]],
                   number: int, rounds: int, peer: str) -> dict:
    """Each ``(label, build)`` adds its contenders to the rows (``build(rows)``; a builder
    that fails prints why, the others go on), then they are timed as `time_contenders`."""
    rows: dict[str, list] = {name: [] for name in row_names}
    say(f"{title}: {rounds} interleaved rounds of {number} steps per contender")
    for label, build in builders:
        guarded(label, lambda build=build: build(rows))
    return time_contenders(rows, number, rounds, peer)


def run_checkout(script: str, root: str, child_args: list[str], env: dict | None = None,
                 echo: bool = True) -> str:
    """Run ``script --child *child_args`` in a process that imports `root`'s symgpu; returns
    its standard output (printed too, with `echo`)."""
    base_env = os.environ if env is None else env
    # the checkout first; what was on the path stays after it (PyCUDA's --target install on
    # the GPU machine lives there)
    path = os.pathsep.join(p for p in (root, base_env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, os.path.abspath(script), "--child", *child_args],
                         env=dict(base_env, PYTHONPATH=path), cwd=root,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{os.path.basename(script)} in {root} failed:\n"
                           + "\n".join(out.stderr.strip().splitlines()[-6:]))
    if echo:
        print(out.stdout, end="", flush=True)
    return out.stdout


def alternate_checkouts(script: str, here: str, other: str, rounds: int,
                        child_args: list[str], env: dict | None = None) -> dict[str, dict]:
    """Run ``script --child *child_args`` with each checkout's symgpu first on the path,
    `rounds` times each, alternating (this, other, other, this, ...) so that the machine's
    drift hits both alike; each child prints one JSON line {key: seconds per call}.
    Returns {checkout: {key: the best seconds over its runs}}."""
    best: dict[str, dict] = {here: {}, other: {}}
    for r in range(rounds):
        for root in (here, other) if r % 2 == 0 else (other, here):
            out = run_checkout(script, root, child_args, env, echo=False)
            for key, t in json.loads(out.strip().splitlines()[-1]).items():
                best[root][key] = min(best[root].get(key, t), t)
    return best


def report_checkouts(best: dict[str, dict], here: str, other: str,
                     rows: list[tuple[str, str]], header: str) -> None:
    """Print ``alternate_checkouts``'s bests, row by row (label, key), with this / other."""
    say(header)
    say(f"{'':50s} {'this':>9s} {'other':>9s} {'ratio':>7s}")
    for label, key in rows:
        a, b = best[here].get(key), best[other].get(key)
        if a is None or b is None:
            say(f"{label:50s} (not measured in {'this' if a is None else 'the other'} checkout)")
            continue
        say(f"{label:50s} {a * 1e6:7.3f}us {b * 1e6:7.3f}us {a / b:6.3f}x")
    say(f"this = {here}\nother = {other}")
