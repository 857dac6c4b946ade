"""Run the GPU tests (`pytest -m gpu`) in N concurrent processes when device time is short:
the collected test ids dealt round-robin (a file's tests spread over all shards, so one large
file does not make one shard the long pole), one pytest process per shard, each logging to
OUT/gpu_tests_K.txt; prints each shard's failures and summary line, exits non-zero if any
shard failed or a test file failed to load (its tests would be missing from every shard).

    python3 benchmarks/shard_tests.py 4 /tmp/out
    python3 benchmarks/shard_tests.py 4 /tmp/out tests/test_gpu_nll_grad.py ...   # some files
"""
from __future__ import annotations

import os
import subprocess
import sys

PYTEST = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]


def deal(test_ids: list[str], n: int) -> list[list[str]]:
    return [s for s in (test_ids[k::n] for k in range(n)) if s]


def main(n: int, out: str, paths: list[str]) -> int:
    listed = subprocess.run(PYTEST + ["--collect-only", *paths], capture_output=True, text=True)
    if listed.returncode not in (0, 5):   # 5: nothing selected; else a file failed to load,
        print(listed.stdout[-3000:], listed.stderr[-2000:], sep="\n")   # whose tests would
        return listed.returncode or 1                                    # be missing
    ids = [line.strip() for line in listed.stdout.splitlines() if "::" in line]
    print(f"{len(ids)} tests in {min(n, len(ids))} shards")
    procs = []
    for k, shard in enumerate(deal(ids, n)):
        log = open(os.path.join(out, f"gpu_tests_{k}.txt"), "w")
        code = ("import pytest, sys; sys.exit(pytest.main(sys.argv[1:]))")
        procs.append((log, subprocess.Popen([sys.executable, "-c", code, *PYTEST[3:], "-rfE",
                                             *shard], stdout=log, stderr=subprocess.STDOUT)))
    status = 0
    for k, (log, proc) in enumerate(procs):
        status |= proc.wait()
        log.close()
        with open(log.name) as fh:
            lines = fh.read().splitlines()
        print(f"shard {k}:", *[ln for ln in lines if ln.startswith(("FAILED", "ERROR"))],
              lines[-1] if lines else "(no output)", sep="\n  ")
    return status


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
