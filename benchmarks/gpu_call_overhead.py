"""Issue 19's GPU rows: the per-call cost of small GPU functions, this checkout against another
one (e.g. a `git worktree` of c10bea3, before execution frames), in alternating processes.

    python3 benchmarks/gpu_call_overhead.py --against /path/to/other/checkout
    python3 benchmarks/gpu_call_overhead.py --device cpu --against ...   # the same on the CPU
    python3 benchmarks/gpu_call_overhead.py --against ... --profile check1_device
                                  # where one row's calls spend their time, in each checkout

Rows (float32, the data in shared variables on the GPU):
- check1 with its result left on the device (`function([], gpu_from_host(T.exp(x)))`);
- check1 with its result copied to the host (the seeds' program);
- the logistic-regression training step, its outputs left on the device;
- the same step with its prediction and cost copied to the host.

A device row is a host-bound loop: calls back to back, one synchronisation at the end of each
timed block (the rows' blocks interleaved), seconds per call (the best block of the best
process). Both checkouts import
their own symgpu (each child process runs with PYTHONPATH set to its checkout). With
``--device cpu`` the same functions are compiled for the CPU.
"""
from __future__ import annotations

import argparse
import json
import os

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
    from workloads import build_logreg
    rng = np.random.RandomState(22)
    x = shared(np.asarray(rng.rand(10 * 30 * 768), "float32"))
    fns = {"check1_device": function([], on_gpu(T.exp(x))),
           "check1_host": function([], T.exp(x))}
    data = (rng.randn(400, 784).astype("float32"), rng.randint(0, 2, 400).astype("float32"),
            rng.randn(784).astype("float32") * 0.01, np.asarray(0.0, dtype="float32"))
    outs, updates = build_logreg(shared, T, *data)
    fns["logreg_device"] = function([], [on_gpu(o) for o in outs], updates=updates)
    outs, updates = build_logreg(shared, T, *data)
    fns["logreg_host"] = function([], outs, updates=updates)
    return fns, sync


def child(device: str, number: int, repeat: int) -> None:
    """Print one JSON line: {row key: the best block's seconds per call}."""
    from timing import interleaved
    fns, sync = functions(device)
    keys = [key for _, key in ROWS]
    times = interleaved([fns[k] for k in keys], number, repeat, [sync] * len(keys))
    print(json.dumps({k: best for k, (best, _) in zip(keys, times)}))


def profile_child(device: str, key: str, number: int) -> None:
    """Print cProfile's top functions (by own time) over `number` calls of row `key`: the
    per-call difference between two checkouts, function by function."""
    from timing import profile_calls
    fns, sync = functions(device)
    profile_calls(fns[key], number, sync)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="PATH", help="the other checkout")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--rounds", type=int, default=6, help="child processes per checkout")
    parser.add_argument("--number", type=int, default=2000, help="calls per timed block")
    parser.add_argument("--repeat", type=int, default=7, help="timed blocks per process")
    parser.add_argument("--profile", metavar="KEY", choices=[k for _, k in ROWS],
                        help="profile one row's calls in each checkout instead of timing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    args = ["--device", opts.device, "--number", str(opts.number), "--repeat", str(opts.repeat)]
    if opts.child and opts.profile:
        profile_child(opts.device, opts.profile, opts.number)
        return
    if opts.child:
        child(opts.device, opts.number, opts.repeat)
        return
    from timing import alternate_checkouts, report_checkouts, run_checkout
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = os.path.abspath(opts.against or here)
    if opts.profile:
        for root in dict.fromkeys((here, other)):
            print(f"== {opts.profile} in {root}", flush=True)
            run_checkout(__file__, root, [*args, "--profile", opts.profile])
        return
    best = alternate_checkouts(__file__, here, other, opts.rounds, args)
    report_checkouts(best, here, other, ROWS, f"best of {opts.rounds} processes x "
                     f"{opts.repeat} x {opts.number} calls each, per call:")


if __name__ == "__main__":
    main()
