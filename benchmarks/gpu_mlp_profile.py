"""Where the MLP SGD step of benchmarks/gpu_speed.py spends its time on the GPU: the step's
ops, its CUDA-graph segments, the per-node profile (CUDA-event timers, graphs off), and the
same matrix products run by PyTorch alone (the cuBLAS floor) when it is installed.

    python3 benchmarks/gpu_mlp_profile.py
    python3 benchmarks/gpu_mlp_profile.py --minibatch   # the same for gpu_spellings.py's
                                                        # minibatch step (cycling index)
    python3 benchmarks/gpu_mlp_profile.py --dropout     # the same for benchmarks/random.py's
                                                        # dropout MLP step (issue 16)

With SYMGPU_FLAGS=...,gpuarray.cublaslt=True each mode ends with cuBLASLt's timed algorithm
choices (symgpu/gpu/ops/blaslt.py): per product, every candidate's time and the one kept.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

import numpy as np  # noqa: E402

from gpu_speed import BATCH, MLP, mlp_init, per_call, symgpu_mlp_step  # noqa: E402


def minibatch() -> None:
    """gpu_spellings.py's minibatch MLP step (784-512-10, batch 128, cycling index): its ops,
    graph counts and per-node profile."""
    import symgpu.gpu
    from symgpu.compile.profiling import ProfileStats
    from gpu_spellings import BATCHES, symgpu_minibatch
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    f = symgpu_minibatch()
    k = [0]

    def cycling():
        k[0] = (k[0] + 1) % BATCHES
        f(k[0])
    t = per_call(cycling, 300, ctx.synchronize)
    print(f"minibatch step, cycling index, CUDA graphs on: {t * 1e6:.1f} us")
    print("graphs:", f.vm.runner.stats() if f.vm.runner is not None else "no runner")
    for n in f.maker.fgraph.toposort():
        print("   ", n.op, [str(v.type) for v in n.inputs])
    # where the host's time goes in graph mode (the GPU work is ~21 small kernels, far less
    # than the step's time on the H100 machine): the Python functions by own time
    import cProfile
    import pstats
    host = cProfile.Profile()
    host.enable()
    for _ in range(300):
        cycling()
    ctx.synchronize()
    host.disable()
    pstats.Stats(host).sort_stats("tottime").print_stats(25)
    prof = ProfileStats(atexit_print=False)
    g = symgpu_minibatch(profile=prof)
    for j in range(100):
        g(j % BATCHES)
    ctx.synchronize()
    prof.summary(n_ops_to_print=50)


def dropout() -> None:
    """benchmarks/random.py's dropout MLP step (784-1024-1024-10, two dropout layers, batch
    512, full float32): its ops, graph counts and per-node profile."""
    import symgpu.gpu
    from symgpu.compile.profiling import ProfileStats
    import mlp_dropout
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    train, _, _ = mlp_dropout.build(BATCH, on_device=True)
    t = per_call(train, 200, ctx.synchronize)
    print(f"dropout MLP step, CUDA graphs on: {t * 1e6:.1f} us")
    print("graphs:", train.vm.runner.stats() if train.vm.runner is not None else "no runner")
    for n in train.maker.fgraph.toposort():
        print("   ", n.op, [str(v.type) for v in n.inputs])
    prof = ProfileStats(atexit_print=False)
    profiled, _, _ = mlp_dropout.build(BATCH, on_device=True, profile=prof)
    for _ in range(50):
        profiled()
    ctx.synchronize()
    prof.summary(n_ops_to_print=70, n_apply_to_print=70)


def print_gemm_choices() -> None:
    """cuBLASLt's timed choices so far: per problem (column-major m x n x k, transposes),
    each candidate's time, the heuristic's first, classic cuBLAS's and the one kept."""
    from symgpu.config import config
    from symgpu.gpu.ops import blaslt
    print(f"GEMM algorithm choices (gpuarray.cublaslt={config.gpuarray.cublaslt}):")
    plans = {p: plan for (_, p), plan in blaslt.cublaslt().plans.items()} \
        if blaslt.CHOICES.timings else {}
    total = {"first": 0.0, "kept": 0.0, "classic": 0.0}
    for (dev, p), times in sorted(blaslt.CHOICES.timings.items(), key=lambda kv: str(kv[0])):
        chosen = blaslt.CHOICES.chosen[(dev, p)]
        labels = [a[2] for a in plans[p].algos] if p in plans else [""] * len(times)
        shown = " ".join("fail" if t is None else f"{t * 1e6:.1f}" for t in times)
        gain = times[0] / times[chosen] if times[0] else float("nan")
        classic = times[-1] if labels[-1] == "classic cuBLAS" else None
        total["first"] += times[0] or 0.0
        total["kept"] += times[chosen]
        total["classic"] += classic or 0.0
        print(f"  {p.dtype}{' tf32' if p.tf32 else ''} m={p.m} n={p.n} k={p.k} "
              f"op=({'NT'[p.transa]},{'NT'[p.transb]}): "
              f"kept {labels[chosen]} {times[chosen] * 1e6:.1f} us; heuristic's first "
              f"{(times[0] or 0) * 1e6:.1f} us ({gain:.2f}x)"
              + (f"; classic cuBLAS {classic * 1e6:.1f} us" if classic else ""))
        print(f"      all candidates (us): [{shown}]")
    print(f"  sums (each product once, device time in a graph, us): kept "
          f"{total['kept'] * 1e6:.1f}, heuristic's first {total['first'] * 1e6:.1f}, classic "
          f"cuBLAS {total['classic'] * 1e6:.1f}")


def main() -> None:
    if "--minibatch" in sys.argv[1:]:
        minibatch()
        print_gemm_choices()
        return
    if "--dropout" in sys.argv[1:]:
        dropout()
        print_gemm_choices()
        return
    import symgpu.gpu
    from symgpu.compile.profiling import ProfileStats
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    data = mlp_init(np.random.default_rng(4))
    step = symgpu_mlp_step(*data)
    step()
    t = per_call(step, 200, ctx.synchronize)
    print(f"MLP step, CUDA graphs on: {t * 1e6:.1f} us")
    runner = step.vm.runner
    print("graphs:", runner.stats() if runner is not None else "no runner")
    for n in step.maker.fgraph.toposort():
        print("   ", n.op, [str(v.type) for v in n.inputs])
    prof = ProfileStats(atexit_print=False)
    profiled = symgpu_mlp_step(*data, profile=prof)
    for _ in range(50):
        profiled()
    ctx.synchronize()
    prof.summary(n_ops_to_print=40, n_apply_to_print=70)
    print_gemm_choices()
    try:
        import torch
    except ImportError:
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    Ws, _, X, _ = data
    A = [torch.from_numpy(X).to(dev)] + [torch.randn(BATCH, n, device=dev) for n in MLP[1:]]
    W = [torch.from_numpy(w).to(dev) for w in Ws]

    def products():
        for k in range(len(W)):
            A[k] @ W[k]                      # forward
            A[k].T @ A[k + 1]                # weight gradient
            if k:
                A[k + 1] @ W[k].T            # input gradient
    t = per_call(products, 200, torch.cuda.synchronize)
    print(f"the step's matrix products alone in PyTorch: {t * 1e6:.1f} us")


if __name__ == "__main__":
    main()
