"""The fused attention kernels' tilings side by side (GPU machine): for each forward tiling
(warps, 16-row tiles a warp, keys a tile), backward stage count and minimum blocks
per SM, and on Hopper the wgmma kernels' warpgroups, key tile, minimum blocks, backward
warpgroups, its minimum blocks and query blocks a step (attention.py's ``Tiles``, in its
field order; 0 warpgroups: the general kernel), the results checked against
PyTorch's and the kernels' device times by CUPTI, next to PyTorch's flash kernels in the same
process. The winner goes into symgpu/gpu/ops/attention.py's ``_TILES``.

GPT-style block by default: batch 8, 12 heads, sequence 1024, head dim 64, causal.

    python benchmarks/attention_variants.py [--dtype bfloat16] [--shape 8,12,1024,64]
        [--variants "4,1,64,1;4,1,128,1,4,1"] [--reps 10] [--check]
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


#: (q shape, k shape, causal) each variant is also checked on with --check: lengths that are
#: not a multiple of the tiles, more keys than queries and fewer
CHECK_SHAPES = [((2, 3, 200, 64), (2, 3, 200, 64), True), ((1, 2, 100, 64), (1, 2, 300, 64), True),
                ((1, 2, 300, 64), (1, 2, 100, 64), True), ((1, 2, 257, 64), (1, 2, 257, 64), False)]


def check_shapes(dtype: str, hd: int) -> list[str]:
    """The variant in the tiles table against float64 NumPy on CHECK_SHAPES (head dim hd): a
    line for each case whose relative error passes the dtype's bound (test_gpu_attention's)."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
    from symgpu.tensor.nnet.attention import attention_grad_reference, attention_reference
    tol = {"float16": 3e-2, "bfloat16": 1e-1, "float32": 1e-3}[dtype]
    rng, bad = np.random.default_rng(5), []
    for sq, sk, causal in CHECK_SHAPES:
        sq, sk = sq[:-1] + (hd,), sk[:-1] + (hd,)
        q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in "qkvd")
        o = sdpa(q, k, v, is_causal=causal)
        f = symgpu.function([q, k, v, do], [o] + T.grad(None, [q, k, v], known_grads={o: do}))
        vals = [rng.standard_normal(s).astype(dtype) for s in (sq, sk, sk, sq)]
        f64 = [x.astype("float64") for x in vals]
        ro, lse = attention_reference(*f64[:3], None, None, causal)
        want = [ro] + list(attention_grad_reference(*f64[:3], None, ro, lse, f64[3], None, None,
                                                    causal))
        for name, g, w in zip(("o", "dq", "dk", "dv"), f(*vals), want):
            err = float(np.abs(np.asarray(g, "float64") - w).max() / max(1.0, np.abs(w).max()))
            if not err <= tol:
                bad.append(f"{sq} {sk} causal={causal} {name}: {err:.1e}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shape", default="8,12,1024,64")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--check", action="store_true",
                    help="also check each variant against NumPy on CHECK_SHAPES")
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
        if a.check:
            bad = check_shapes(a.dtype, key[1])
            print(f"   other shapes against NumPy: {len(bad) or 'all'} "
                  f"{'fail: ' + '; '.join(bad) if bad else 'pass'}")
        kernel_table(lambda: f(*args), ctx.synchronize, n=a.reps, rows=6)


if __name__ == "__main__":
    main()
