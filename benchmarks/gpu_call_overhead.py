"""Issue 19's GPU rows: the per-call cost of small GPU functions, this checkout against another
one (e.g. a `git worktree` of c10bea3, before execution frames), in alternating processes.

    python3 benchmarks/gpu_call_overhead.py --against /path/to/other/checkout
    python3 benchmarks/gpu_call_overhead.py --device cpu --against ...   # the same on the CPU

Rows (float32, the data in shared variables on the GPU):
- check1 with its result left on the device (`function([], gpu_from_host(T.exp(x)))`);
- check1 with its result copied to the host (the seeds' program);
- the logistic-regression training step, its outputs left on the device;
- the same step with its prediction and cost copied to the host.

A device row is a host-bound loop: calls back to back, one synchronisation at the end of each
timed block, seconds per call (the best block of the best process). Both checkouts import
their own symgpu (each child process runs with PYTHONPATH set to its checkout). With
``--device cpu`` the same functions are compiled for the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

#: (label, key) of the rows, in the order printed
ROWS = [
    ("check1, result on the device", "check1_device"),
    ("check1, result to the host", "check1_host"),
    ("logistic regression step, outputs on the device", "logreg_device"),
    ("logistic regression step, outputs to the host", "logreg_host"),
]


def functions(device: str) -> tuple[dict, object]:
    """({key: zero-argument callable}, the synchronisation of the device they run on)."""
    os.environ["SYMGPU_FLAGS"] = f"device={device},floatX=float32"
    import symgpu.tensor as T
    from symgpu import function, shared
    sync = None
    on_gpu = lambda v: v   # noqa: E731  (the CPU: results are host arrays anyway)
    if device == "cuda":
        from symgpu.gpu import gpu_from_host, init_default_context
        ctx = init_default_context()
        assert ctx is not None, "no GPU: use --device cpu"
        sync, on_gpu = ctx.synchronize, gpu_from_host
    rng = np.random.RandomState(22)
    x = shared(np.asarray(rng.rand(10 * 30 * 768), "float32"))
    fns = {"check1_device": function([], on_gpu(T.exp(x))),
           "check1_host": function([], T.exp(x))}
    N, feats = 400, 784
    D = shared(rng.randn(N, feats).astype("float32"), name="D")
    L = shared(rng.randint(0, 2, N).astype("float32"), name="L")
    w = shared(rng.randn(feats).astype("float32") * 0.01, name="w")
    b = shared(np.asarray(0.0, dtype="float32"), name="b")
    p_1 = 1 / (1 + T.exp(-T.dot(D, w) - b))
    prediction = p_1 > 0.5
    xent = -L * T.log(p_1) - (1 - L) * T.log(1 - p_1)
    cost = xent.mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    updates = [(w, w - 0.1 * gw), (b, b - 0.1 * gb)]
    fns["logreg_device"] = function([], [on_gpu(prediction), on_gpu(xent)], updates=updates)
    fns["logreg_host"] = function([], [prediction, xent], updates=updates)
    return fns, sync


def best_per_call(fn, sync, number: int, repeat: int) -> float:
    """Best over `repeat` blocks of `number` calls (one synchronisation per block)."""
    fn()
    if sync is not None:
        sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def child(device: str, number: int, repeat: int) -> None:
    fns, sync = functions(device)
    print(json.dumps({key: best_per_call(fns[key], sync, number, repeat) for _, key in ROWS}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="PATH", help="the other checkout")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--rounds", type=int, default=6, help="child processes per checkout")
    parser.add_argument("--number", type=int, default=2000, help="calls per timed block")
    parser.add_argument("--repeat", type=int, default=7, help="timed blocks per process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    args = ["--device", opts.device, "--number", str(opts.number), "--repeat", str(opts.repeat)]
    if opts.child:
        child(opts.device, opts.number, opts.repeat)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import alternate_checkouts, report_checkouts
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = os.path.abspath(opts.against or here)
    best = alternate_checkouts(__file__, here, other, opts.rounds, args)
    report_checkouts(best, here, other, ROWS, f"best of {opts.rounds} processes x "
                     f"{opts.repeat} x {opts.number} calls each, per call:")


if __name__ == "__main__":
    main()
