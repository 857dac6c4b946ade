"""Fused attention forward + backward against PyTorch's scaled_dot_product_attention, same
run (GPU machine): flash backend in bfloat16/float16, efficient and math in float32.
GPT-style block: batch 8, 12 heads, sequence 1024, head dim 64, causal. Prints ms per
forward+backward and the ratio symgpu / torch (lower is better).

    python benchmarks/attention.py [--dtypes float16,float32] [--reps 20]
    python benchmarks/attention.py --dropout 0.1   # dropout on the probabilities, both sides
                                                   # (symgpu: sdpa's binomial draw, fused)
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _time(fn, reps: int, sync) -> float:
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3


def symgpu_step(dtype: str, shape: tuple, dropout: float = 0.0):
    """A compiled causal attention fwd+bwd (outputs left on the GPU), its GPU arguments and
    their float32 host values; `dropout` > 0: on the probabilities (sdpa's draw, which the
    rewrite fuses into the kernels)."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu import to_gpu
    from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
    q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in ("q", "k", "v", "do"))
    if dropout:
        from symgpu.tensor.shared_randomstreams import RandomStreams
        o = sdpa(q, k, v, is_causal=True, dropout_p=dropout, rng=RandomStreams(0))
    else:
        o = sdpa(q, k, v, is_causal=True)
    grads = T.grad(None, [q, k, v], known_grads={o: do})
    outs = [symgpu.Out(x.transfer(None), borrow=True) for x in [o] + list(grads)]
    f = symgpu.function([q, k, v, do], outs)
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(shape).astype("float32") for _ in range(4)]
    return f, [to_gpu(h.astype(dtype)) for h in host], host


def symgpu_case(dtype: str, shape: tuple, reps: int, dropout: float = 0.0) -> float:
    f, args, _ = symgpu_step(dtype, shape, dropout)
    ctx = args[0].context
    return _time(lambda: f(*args), reps, lambda: ctx.synchronize() if hasattr(ctx, "synchronize")
                 else np.asarray(f(*args)[0]))


def torch_case(dtype: str, shape: tuple, backend: str, reps: int, dropout: float = 0.0
               ) -> float:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=dt)

    def step():
        with sdpa_kernel(getattr(SDPBackend, backend)):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 dropout_p=dropout)
        torch.autograd.grad(o, (q, k, v), do)
    return _time(step, reps, torch.cuda.synchronize)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shape", default="8,12,1024,64")
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args()
    from symgpu.config import config
    config.device = "cuda"
    shape = tuple(int(x) for x in a.shape.split(","))
    for dtype in a.dtypes.split(","):
        backends = ["FLASH_ATTENTION"] if dtype != "float32" else ["EFFICIENT_ATTENTION", "MATH"]
        try:
            ours = symgpu_case(dtype, shape, a.reps, a.dropout)
        except Exception as exc:    # bf16 before placement takes it: say so, go on
            print(f"{dtype}: symgpu failed: {type(exc).__name__}: {str(exc)[:300]}")
            ours = None
        for b in backends:
            theirs = torch_case(dtype, shape, b, a.reps, a.dropout)
            ratio = f"{ours / theirs:.2f}x" if ours else "n/a"
            print(f"{dtype:9s} B,H,S,D={shape} causal{f' dropout {a.dropout}' if a.dropout else ''}"
                  f" fwd+bwd: symgpu "
                  f"{ours if ours else float('nan'):.3f} ms, torch {b} {theirs:.3f} ms, "
                  f"ratio {ratio}")


if __name__ == "__main__":
    main()
