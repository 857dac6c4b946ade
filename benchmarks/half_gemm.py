"""Half-precision GEMM on tensor cores: symgpu against torch.matmul in the same run.

For bfloat16 and float16, n^3 products (8192 and 4096 by default): a compiled symgpu
function over two GPU shared variables returning the product on the device (cuBLASLt,
float32 accumulation, the algorithm timed on the first call), and ``torch.matmul`` on the
same values; each timed warm with CUDA events on its own stream over ``--iters`` calls,
in ``--rounds`` alternating rounds (the median counts).
Prints TFLOP/s (2 n^3 per product) and symgpu / torch (issue 34 asks 0.95 or more at
8192^3 bf16; the H200 peaks near 790 dense bf16 TFLOP/s).  Not a test: numbers.

    python3 benchmarks/half_gemm.py                  # bf16 and fp16, 8192 and 4096
    python3 benchmarks/half_gemm.py --sizes 8192 --dtypes bfloat16 --iters 50
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from timing import guarded, say  # noqa: E402


def symgpu_block(dtype: str, a: np.ndarray, b: np.ndarray) -> Callable[[int], float]:
    """A timer of ``iters`` calls of a symgpu function returning dot(A, B) on the GPU:
    seconds per product, by CUDA events on the context's stream."""
    import pycuda.driver as drv
    import symgpu.tensor as T
    from symgpu import function, shared
    from symgpu.gpu.ops.blas import GpuDot22
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    from symgpu.gpu.runtime.context import get_context
    sa, sb = shared(a), shared(b)
    if not isinstance(sa, GpuArraySharedVariable):
        raise RuntimeError(f"shared() of {dtype} stays on the host here (the GPU placement "
                           f"does not take {dtype})")
    f = function([], gpu_from_host(T.dot(sa, sb)))
    nodes = [nd for nd in f.maker.fgraph.toposort() if isinstance(nd.op, GpuDot22)]
    assert nodes, "the product is not a GpuDot22"
    ctx = get_context(None)
    for _ in range(3):             # the first call times cuBLASLt's candidates
        f()
    ctx.stream.synchronize()

    def block(iters: int) -> float:
        start, end = drv.Event(), drv.Event()
        start.record(ctx.stream)
        for _ in range(iters):
            f()
        end.record(ctx.stream)
        end.synchronize()
        return end.time_since(start) / 1e3 / iters
    return block


def torch_block(dtype: str, a: np.ndarray, b: np.ndarray) -> Callable[[int], float]:
    """A timer of ``iters`` calls of ``torch.matmul`` on the same values."""
    import torch
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ta = torch.from_numpy(a.astype("float32")).to("cuda", tdt)
    tb = torch.from_numpy(b.astype("float32")).to("cuda", tdt)
    for _ in range(3):
        torch.matmul(ta, tb)
    torch.cuda.synchronize()

    def block(iters: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(ta, tb)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    return block


def interleaved_seconds(blocks: dict[str, Callable[[int], float]], iters: int,
                        rounds: int) -> dict[str, float]:
    """Median seconds per product of each contender, timed in alternating rounds after one
    untimed round (so neither meets the GPU's clocks cold, nor always second)."""
    for block in blocks.values():
        block(iters)
    times: dict[str, list[float]] = {who: [] for who in blocks}
    for _ in range(rounds):
        for who, block in blocks.items():
            times[who].append(block(iters))
    return {who: float(np.median(t)) for who, t in times.items()}


def gemm_seconds(dtype: str, a: np.ndarray, b: np.ndarray, iters: int,
                 rounds: int) -> dict[str, float]:
    """{"symgpu": s, "torch": s}: median seconds per product, interleaved (a contender that
    fails is left out, its error printed)."""
    blocks: dict[str, Callable[[int], float]] = {}

    def add(who: str, make: Callable) -> None:
        blocks[who] = make(dtype, a, b)
    guarded(f"symgpu {dtype} {a.shape[0]}^3", lambda: add("symgpu", symgpu_block))
    guarded(f"torch {dtype} {a.shape[0]}^3", lambda: add("torch", torch_block))
    return interleaved_seconds(blocks, iters, rounds) if blocks else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds")
    args = ap.parse_args()
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)
    import symgpu
    from symgpu import config
    rng = np.random.default_rng(0)
    with config.change_flags(device="cuda", floatX="float32"):
        if symgpu.gpu.init_default_context() is None:
            raise SystemExit("no usable GPU here")
        for dtype in args.dtypes:
            for n in args.sizes:
                a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
                b = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
                flop = 2.0 * n ** 3
                res = gemm_seconds(dtype, a, b, args.iters, args.rounds)
                line = [f"{dtype:9s} {n}^3:"]
                for who in ("symgpu", "torch"):
                    if who in res:
                        line.append(f"{who} {flop / res[who] / 1e12:7.1f} TFLOP/s "
                                    f"({res[who] * 1e3:.3f} ms)")
                if len(res) == 2:
                    line.append(f"ratio symgpu/torch {res['torch'] / res['symgpu']:.3f}")
                say("  ".join(line))


if __name__ == "__main__":
    main()
