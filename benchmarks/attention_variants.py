"""The fused attention kernels' tilings side by side (GPU machine): for each forward tiling
(warps, 16-row tiles a warp, keys a tile), backward stage count and minimum blocks
per SM, and on Hopper the wgmma kernels' warpgroups, key tile, minimum blocks, backward
warpgroups, its minimum blocks and query blocks a step (attention.py's ``Tiles``, in its
field order; 0 warpgroups: the general kernel), the results checked against
PyTorch's and the kernels' device times by CUPTI, next to PyTorch's flash kernels in the same
process. The winner goes into symgpu/gpu/ops/attention.py's ``_TILES``.

GPT-style block by default: batch 8, 12 heads, sequence 1024, head dim 64, causal.

    python benchmarks/attention_variants.py [--dtype bfloat16] [--shape 8,12,1024,64]
        [--variants "4,1,64,1;4,1,128,1,4,1"] [--reps 10]
"""
from __future__ import annotations

import argparse

import numpy as np

from attention import symgpu_step
from cupti_table import kernel_table

DEFAULT_VARIANTS = "4,1,64,2,4,1;4,1,64,2,1,1;4,1,128,2,2,1;4,2,64,2,2,1"


def torch_reference(dtype: str, host: list):
    """PyTorch's flash (or, in float32, efficient) fwd+bwd: its results and a step to time."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = getattr(torch, dtype)
    q, k, v = (torch.tensor(h, device="cuda", dtype=dt, requires_grad=True) for h in host[:3])
    do = torch.tensor(host[3], device="cuda", dtype=dt)
    backend = SDPBackend.FLASH_ATTENTION if dtype != "float32" else SDPBackend.EFFICIENT_ATTENTION

    def step():
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (o,) + torch.autograd.grad(o, (q, k, v), do)
    want = [x.detach().float().cpu().numpy() for x in step()]
    return step, want


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shape", default="8,12,1024,64")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    import torch
    from symgpu.config import config
    from symgpu.gpu.ops import attention as A
    config.device = "cuda"
    config.gpuarray.cuda_graphs = False   # a captured graph would replay the first tiling
    shape = tuple(int(x) for x in a.shape.split(","))
    key = (A._itemsize(a.dtype), A._head(None, shape[-1], str(shape)))
    f, args, host = symgpu_step(a.dtype, shape)
    ctx = args[0].context
    step, want = torch_reference(a.dtype, host)
    print(f"== PyTorch {a.dtype} {shape}")
    kernel_table(step, torch.cuda.synchronize, n=a.reps, rows=6)
    for spec in a.variants.split(";"):
        tiles = A.Tiles(*(int(x) for x in spec.split(",")))
        A._TILES[key] = tiles
        try:
            got = [np.asarray(x).astype("float32") for x in f(*args)]
        except Exception as exc:   # a tiling past the shared memory or registers: say so
            print(f"== symgpu tiles {tiles}: failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        errs = [float(np.abs(g - w).max() / (np.abs(w).max() + 1e-30)) for g, w in zip(got, want)]
        print(f"== symgpu {tiles}: max error / max |torch| o, dq, dk, dv = "
              + ", ".join(f"{e:.1e}" for e in errs))
        kernel_table(lambda: f(*args), ctx.synchronize, n=a.reps, rows=6)


if __name__ == "__main__":
    main()
