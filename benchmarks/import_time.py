"""Start-up: wall time of fresh ``python -c "import symgpu"`` processes beside PyTensor's.

Both run under the same interpreter (``--python``, default this one), from bytecode,
interleaved round by round so that a busy machine slows both alike; the figure is the median
of ``--rounds``.
PyTensor's row is left out where it is not installed for that interpreter.

    python benchmarks/import_time.py [--rounds 7] [--python /path/to/python]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """Both packages import from bytecode, as installed packages do: the warm-up run writes
    symgpu's __pycache__ (PYTHONDONTWRITEBYTECODE, set on some machines, would make every run
    compile symgpu from source while PyTensor's installed bytecode is read)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _time_import(python: str, module: str) -> float:
    env = _env()
    t0 = time.perf_counter()
    subprocess.run([python, "-c", f"import {module}"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _importable(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    modules = ["symgpu"] + [m for m in ("pytensor",) if _importable(args.python, m)]
    for m in modules:  # warm the file-system cache and the bytecode caches
        _time_import(args.python, m)
    times: dict[str, list[float]] = {m: [] for m in modules}
    for _ in range(args.rounds):
        for m in modules:
            times[m].append(_time_import(args.python, m))
    base = statistics.median(times["symgpu"])
    print(f"import time, median of {args.rounds} fresh processes ({args.python})")
    for m in modules:
        med = statistics.median(times[m])
        print(f"  {m:<10} {med * 1e3:8.1f} ms   symgpu / {m}: {base / med:.2f}x")
    if len(modules) == 1:
        print("  pytensor   not installed for this interpreter")


if __name__ == "__main__":
    main()
