"""Issue 35: a collective on the communication stream beside the compute stream, on one GPU.

    NCCL_NVLS_ENABLE=0 python3 benchmarks/comm_stream_overlap.py
    NCCL_NVLS_ENABLE=0 python3 benchmarks/comm_stream_overlap.py --mb 1024 --size 2048 --chain 4

One function computes ``all_reduce(g, 'avg')`` of a ``--mb`` MB float32 buffer (a world of one
rank through real NCCL) and, independently, a chain of ``--chain`` products of ``--size``
square float32 matrices; its outputs read both.  With ``distributed.comm_stream`` on, the
all-reduce runs on the context's communication stream beside the chain; off, on the compute
stream, one after the other.  Printed: the median time per call (CUDA graphs on, as a
training step runs) of the all-reduce alone, the chain alone, both with the flag off and on,
and how much of the shorter part the overlap hid.

In a world of one rank NCCL only copies (and scales, for avg) the buffer: this shows the two
streams overlapping on one device, not the network transfers of a real world, which the
multi-GPU machines measure (benchmarks/distributed.py).  Numbers, not assertions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402

import symgpu  # noqa: E402
import symgpu.distributed as dist  # noqa: E402
import symgpu.tensor as T  # noqa: E402
from symgpu import function, shared  # noqa: E402
from symgpu.config import config  # noqa: E402


def _median_ms(f, rounds: int) -> float:
    for _ in range(3):        # plain run, capture, first replay
        f()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()                   # returns host scalars: waits for the device
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="all-reduce buffer, MB")
    ap.add_argument("--size", type=int, default=2048, help="matrix size of the chain")
    ap.add_argument("--chain", type=int, default=4, help="products in the chain")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    from symgpu.distributed.env import LaunchInfo
    from symgpu.gpu import get_context
    from symgpu.gpu.ops.collectives import NcclCommunicator
    ctx = get_context(None)
    comm = NcclCommunicator(LaunchInfo(), dist.SelfCommunicator(), 60.0, ctx=ctx)
    rng = np.random.RandomState(0)
    g = shared(rng.rand(args.mb << 18).astype("float32"), name="g")
    w = shared((rng.randn(args.size, args.size) / np.sqrt(args.size)).astype("float32"))
    x0 = shared(rng.randn(args.size, args.size).astype("float32"))

    def chain():
        x = x0
        for _ in range(args.chain):
            x = T.dot(x, w)
        return x.sum()

    try:
        with dist.use_communicator(comm):
            fns = {}
            fns["all-reduce alone"] = function([], dist.all_reduce(g, "avg").sum())
            fns["chain alone"] = function([], chain())
            for on in (False, True):
                with config.change_flags(**{"distributed.comm_stream": on}):
                    # the chain's output first: the VM's order reaches the all-reduce's
                    # reader last, so its join comes after the chain
                    fns[f"both, comm_stream={on}"] = function(
                        [], [chain(), dist.all_reduce(g, "avg").sum()])
            res = {name: _median_ms(f, args.rounds) for name, f in fns.items()}
        print(f"symgpu {symgpu.__version__ if hasattr(symgpu, '__version__') else ''} on "
              f"{ctx.devname}: all-reduce of {args.mb} MB (world of one), chain of "
              f"{args.chain} products {args.size}^2, median of {args.rounds} calls")
        for name, ms in res.items():
            print(f"  {name:<26} {ms:8.3f} ms")
        a, c = res["all-reduce alone"], res["chain alone"]
        off, on = res["both, comm_stream=False"], res["both, comm_stream=True"]
        hidden = (off - on) / min(a, c) if min(a, c) > 0 else float("nan")
        print(f"  one stream / two streams: {off / on:.3f}x; the overlap hid {100 * hidden:.0f}% "
              f"of the shorter part")
        if ctx.comm is not None:
            print(f"  communication stream {ctx.comm.handle:#x}, forks pending after the calls: "
                  f"{len(ctx.comm.pending)}")
    finally:
        comm.close()


if __name__ == "__main__":
    main()
