"""Issue 34: bfloat16 on the tensor cores, symgpu against PyTorch and JAX in one run.

    python3 benchmarks/half.py                      # GPU machine: every row
    python3 benchmarks/half.py --rows gemm,mlp      # rows: gemm mlp lenet lstm gpt converge
    python3 benchmarks/half.py --no-torch-compile   # skip torch.compile (its compiles are slow)

Rows:
- gemm: bf16 8192^3 TFLOP/s, symgpu (a function returning dot(A, B) of bf16 shared
  variables: cuBLASLt, float32 accumulation) against ``torch.matmul`` (benchmarks/half_gemm.py).
- mlp, lenet, lstm, gpt: one training step in bf16 mixed precision (benchmarks/half_models.py
  says the sizes): symgpu compiles the float32 program with ``mixed_precision=bfloat16``
  (products in bf16, reductions, losses and updates in float32); the peers
  (benchmarks/half_peers.py) are PyTorch under autocast (eager, torch.compile of the loss,
  torch.compile max-autotune of the whole step with --max-autotune) and JAX jit with bf16 casts inside the loss and
  donated buffers. The contenders run in interleaved rounds (benchmarks/timing.py); the row
  prints each one's median and best, and symgpu's ratio to the best peer (goal: at most 1.0).
- converge: the MLP trained 200 steps in float32 and in bf16 mixed precision from the same
  start (symgpu); the losses' relative difference (goal: within 1%).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

import numpy as np  # noqa: E402

import half_peers  # noqa: E402
import half_symgpu  # noqa: E402
from half_models import gpt_flops  # noqa: E402
from timing import guarded, interleaved, say  # noqa: E402

ROWS = ("gemm", "mlp", "lenet", "lstm", "gpt", "converge")
#: (steps per block, rounds) per training row
TIMING = {"mlp": (50, 7), "lenet": (50, 7), "lstm": (20, 7), "gpt": (5, 7)}
SUMMARY: list[str] = []


def gemm_row(n: int = 8192, iters: int = 30) -> None:
    import half_gemm
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32).astype("bfloat16")
    b = rng.standard_normal((n, n), dtype=np.float32).astype("bfloat16")
    res = half_gemm.gemm_seconds("bfloat16", a, b, iters, rounds=7)
    if len(res) < 2:
        SUMMARY.append(f"gemm bf16 {n}^3: not measured (a contender failed, above)")
        return
    ours, theirs = res["symgpu"], res["torch"]
    flop = 2.0 * n ** 3
    ratio = theirs / ours
    say(f"  bf16 GEMM {n}^3: symgpu {flop / ours / 1e12:.1f} TFLOP/s, torch.matmul "
        f"{flop / theirs / 1e12:.1f} TFLOP/s: symgpu/torch {ratio:.3f} (goal >= 0.95)")
    SUMMARY.append(f"gemm bf16 {n}^3: {ratio:.3f} of torch.matmul's TFLOP/s "
                   f"({'met' if ratio >= 0.95 else 'NOT met'})")


def training_row(name: str, compile_torch: bool) -> None:
    """Time symgpu's bf16 step against every peer's, interleaved; print the ratio."""
    contenders = []

    def ours() -> None:
        step, _, sync = half_symgpu.BUILDERS[name]({})
        contenders.append(("symgpu bf16 mixed", step, sync))
    import symgpu
    with symgpu.config.change_flags(mixed_precision="bfloat16"):
        guarded(f"symgpu {name}", ours)
    guarded(f"PyTorch {name}", lambda: contenders.extend(half_peers.TORCH[name](compile_torch)))
    guarded(f"JAX {name}", lambda: contenders.extend(half_peers.JAX[name]()))
    if not contenders:
        return
    number, rounds = TIMING[name]
    times = interleaved([c[1] for c in contenders], number, rounds, [c[2] for c in contenders])
    peers = [(med, who) for (who, _, _), (_, med) in zip(contenders, times)
             if not who.startswith("symgpu")]
    best_peer = min(peers) if peers else None
    for (who, _, _), (best, med) in zip(contenders, times):
        extra = f"  {gpt_flops() / med / 1e12:6.1f} TFLOP/s" if name == "gpt" else ""
        say(f"  {name:6s} {who:36s} median {med * 1e3:9.3f} ms  best {best * 1e3:9.3f} ms{extra}")
    ours_t = [med for (who, _, _), (_, med) in zip(contenders, times) if who.startswith("symgpu")]
    if ours_t and best_peer:
        ratio = ours_t[0] / best_peer[0]
        say(f"  {name}: symgpu / best peer ({best_peer[1]}) = {ratio:.3f} (goal <= 1.0)")
        SUMMARY.append(f"{name} bf16 step: {ratio:.3f}x the best peer ({best_peer[1]}) "
                       f"({'met' if ratio <= 1.0 else 'NOT met'})")


def converge_row(steps: int = 200) -> None:
    """The MLP trained `steps` steps in float32 and in bf16 mixed precision from one start."""
    import symgpu
    losses = {}
    for policy in ("off", "bfloat16"):
        with symgpu.config.change_flags(mixed_precision=policy):
            step, loss, sync = half_symgpu.mlp({})
        first = loss()
        for _ in range(steps):
            step()
        losses[policy] = (first, loss())
    (f0, f32), (b0, b16) = losses["off"], losses["bfloat16"]
    rel = abs(b16 - f32) / abs(f32)
    say(f"  MLP loss: float32 {f0:.5f} -> {f32:.5f}; bf16 mixed {b0:.5f} -> {b16:.5f} after "
        f"{steps} steps: relative difference {rel * 100:.3f}% (goal <= 1%)")
    SUMMARY.append(f"converge: bf16 loss within {rel * 100:.3f}% of float32's after {steps} "
                   f"steps ({'met' if rel <= 0.01 else 'NOT met'})")


def share_cudnn_with_torch() -> None:
    """Load PyTorch's cuDNN before symgpu loads one: a process holds one libcudnn.so.9, and
    where symgpu loaded the system's first (9.14 on the GPU machine) PyTorch's cuDNN LSTM, built
    against its bundled 9.19, refused to run ("cuDNN version incompatibility"): the LSTM row
    lost its cuDNN peer.  symgpu then uses the cuDNN PyTorch loaded."""
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cudnn.version()
    except Exception as exc:   # no PyTorch: its rows say so themselves
        say(f"  (PyTorch's cuDNN not loaded first: {type(exc).__name__}: {exc})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also torch.compile(mode='max-autotune') of the whole step (slow)")
    args = ap.parse_args()
    half_peers.MAX_AUTOTUNE = args.max_autotune
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        raise SystemExit(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")
    share_cudnn_with_torch()
    import symgpu
    if symgpu.gpu.init_default_context() is None:
        raise SystemExit("no usable GPU here")
    t0 = time.perf_counter()
    for r in rows:
        say(f"== {r}")
        if r == "gemm":
            guarded("gemm", gemm_row)
        elif r == "converge":
            guarded("converge", converge_row)
        else:
            training_row(r, not args.no_torch_compile)
    say(f"== summary ({time.perf_counter() - t0:.0f} s)")
    for line in SUMMARY:
        say(f"  {line}")


if __name__ == "__main__":
    main()
