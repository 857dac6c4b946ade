"""Run the GPU tests (`pytest -m gpu`) in N concurrent processes when device time is short:
the collected test ids dealt round-robin (a file's tests spread over all shards, so one large
file does not make one shard the long pole), one pytest process per shard, each logging to
OUT/gpu_tests_K.txt; prints each shard's failures and summary line, exits non-zero if any
shard failed or a test file failed to load (its tests would be missing from every shard).

    python3 benchmarks/shard_tests.py 4 /tmp/out
    python3 benchmarks/shard_tests.py 4 /tmp/out tests/test_gpu_nll_grad.py ...   # some files

Where benchmarks/gpu_test_durations.json holds the tests' seconds from an earlier run (what
this script writes as OUT/gpu_test_durations.json, committed), tests are dealt longest first
to the shard with the least work so far, so the shards end together (one H200 run: 398 s
for the longest of 8 round-robin shards against about 300 s for the others); tests it does
not list count as its median.  Every shard's log also goes into OUT/gpu_tests.txt (the
device tool brings back a limited number of files).  On a machine with several GPUs the
shards are spread over them (``CUDA_VISIBLE_DEVICES``: shard k on GPU k mod count); the
tests that need two GPUs run apart, with ``pytest -m multigpu``.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys

PYTEST = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_test_durations.json")
_DURATION_LINE = re.compile(r"^\s*([0-9.]+)s (?:setup|call|teardown)\s+(\S+::\S+)")


def deal(test_ids: list[str], n: int, seconds: dict[str, float] | None = None) -> list[list[str]]:
    """The ids in at most n shards, each in collection order: round robin, or with known
    `seconds`, longest first onto the least loaded shard (unknown tests at the median)."""
    if not seconds:
        return [s for s in (test_ids[k::n] for k in range(n)) if s]
    typical = statistics.median(seconds.values())
    cost = {t: seconds.get(t, typical) for t in test_ids}
    loads, shards = [0.0] * n, [[] for _ in range(n)]
    for t in sorted(test_ids, key=lambda t: -cost[t]):
        k = loads.index(min(loads))
        shards[k].append(t)
        loads[k] += cost[t]
    order = {t: i for i, t in enumerate(test_ids)}
    return [sorted(s, key=order.__getitem__) for s in shards if s]


def durations(log_lines: list[str]) -> dict[str, float]:
    """Seconds per test id (setup + call + teardown) from pytest's --durations report."""
    out: dict[str, float] = {}
    for line in log_lines:
        m = _DURATION_LINE.match(line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(1))
    return out


def gpu_count() -> int:
    """The GPUs nvidia-smi lists (0 where it cannot run)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def shard_env(k: int, gpus: int, base: dict[str, str]) -> dict[str, str]:
    """Shard k's environment: on several GPUs, GPU k mod count alone (unless the caller
    already chose the visible devices)."""
    env = dict(base)
    if gpus > 1 and "CUDA_VISIBLE_DEVICES" not in base:
        env["CUDA_VISIBLE_DEVICES"] = str(k % gpus)
    return env


def _known_seconds() -> dict[str, float]:
    try:
        with open(DURATIONS) as fh:
            return {str(k): float(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError):
        return {}


def main(n: int, out: str, paths: list[str]) -> int:
    os.makedirs(out, exist_ok=True)
    listed = subprocess.run(PYTEST + ["--collect-only", *paths], capture_output=True, text=True)
    if listed.returncode not in (0, 5):   # 5: nothing selected; else a file failed to load,
        print(listed.stdout[-3000:], listed.stderr[-2000:], sep="\n")   # whose tests would
        return listed.returncode or 1                                    # be missing
    ids = [line.strip() for line in listed.stdout.splitlines() if "::" in line]
    gpus = gpu_count()
    print(f"{len(ids)} tests in {min(n, len(ids))} shards" + (f" on {gpus} GPUs" if gpus > 1
                                                              else ""))
    procs = []
    for k, shard in enumerate(deal(ids, n, _known_seconds())):
        log = open(os.path.join(out, f"gpu_tests_{k}.txt"), "w")
        code = ("import pytest, sys; sys.exit(pytest.main(sys.argv[1:]))")
        procs.append((log, subprocess.Popen([sys.executable, "-c", code, *PYTEST[3:], "-rfE",
                                             "--durations=0", *shard],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env=shard_env(k, gpus, dict(os.environ)))))
    status, seconds = 0, {}
    with open(os.path.join(out, "gpu_tests.txt"), "w") as combined:
        for k, (log, proc) in enumerate(procs):
            status |= proc.wait()
            log.close()
            with open(log.name) as fh:
                lines = fh.read().splitlines()
            os.remove(log.name)
            combined.write(f"===== shard {k}\n" + "\n".join(lines) + "\n")
            seconds.update(durations(lines))
            summary = [ln for ln in lines if " passed" in ln or " failed" in ln]
            print(f"shard {k}:", *[ln for ln in lines if ln.startswith(("FAILED", "ERROR"))],
                  summary[-1] if summary else (lines[-1] if lines else "(no output)"),
                  sep="\n  ")
    with open(os.path.join(out, "gpu_test_durations.json"), "w") as fh:
        json.dump({t: round(v, 2) for t, v in sorted(seconds.items())}, fh, indent=0)
    return status


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
