"""Per-step cost of a GPU loop: the same scan run step by step (the body's thunks called from
Python on views of the device buffers) and as one captured CUDA graph (symgpu/gpu/
scan_graph.py), for a launch-bound body (an elementwise step on a 512-vector) and the RNN
step of benchmarks/rnn.py (forward only).

    python benchmarks/scan_steps.py [--steps 1000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def timed(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    os.environ["SYMGPU_FLAGS"] = ",".join(
        f for f in (os.environ.get("SYMGPU_FLAGS", ""), "device=cuda", "floatX=float32") if f)
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.exec import scan_graph

    n = args.steps
    v0 = symgpu.shared(np.zeros(512, "float32"))
    s, _ = symgpu.scan(lambda h: T.tanh(h * 0.5 + 0.1), outputs_info=v0, n_steps=n)
    tiny = symgpu.function([], s[-1])

    x = symgpu.shared(np.random.RandomState(0).randn(n, 64, 128).astype("float32") * .1)
    wx = symgpu.shared(np.random.RandomState(1).randn(128, 512).astype("float32") * .05)
    wh = symgpu.shared(np.random.RandomState(2).randn(512, 512).astype("float32") * .05)
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh)), sequences=x,
                       outputs_info=T.zeros((64, 512), dtype="float32"))
    rnn = symgpu.function([], h[-1])

    for name, f in (("elementwise step (512 floats)", tiny),
                    ("RNN forward step (64x512, 2 GEMMs)", rnn)):
        def plain():
            scan_graph.ENABLED = False
            try:
                f()
            finally:
                scan_graph.ENABLED = True
        f(), f(), f()
        plain()
        t_graph = timed(f, args.rounds)
        t_plain = timed(plain, args.rounds)
        print(f"{name}, {n} steps: step by step {t_plain / n * 1e6:7.2f} us/step, "
              f"CUDA graph {t_graph / n * 1e6:7.2f} us/step ({t_plain / t_graph:.1f}x)")
    print(f"loop graphs: {dict(scan_graph.STATS)}")


if __name__ == "__main__":
    main()
