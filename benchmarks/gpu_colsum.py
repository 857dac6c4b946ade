"""Column sums of tall arrays (a transformer step's bias gradients, issue 34), timed on the GPU.

Per case: symgpu's GpuCAReduce with the column-tile kernel (``sg_cols_tile``), the same node
with ``_ReduceThunk.COLS_TILE = False`` (the split of scalar loads plus ``sg_finish``: what ran
before), and ``torch.sum(dim=0)``.  Cases: (8192, 2304), (8192, 768) and (8192, 3072) in
bfloat16 (stored bfloat16, summed in float32), bfloat16 summed into a float32 result (the
mixed-precision step's ``pre=Cast{float32}``), float32; and a (8192, 2306) bfloat16 whose rows
are not 8-byte aligned (the scalar loop).  CUDA-event times, microseconds, and the bytes read
(the input once) over that time.  Not a test.

    python3 benchmarks/gpu_colsum.py
"""
from __future__ import annotations

import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_kernels import _event_time as _kernels_event_time  # noqa: E402

R = 8192
#: CUDA-event timing (gpu_kernels'), best of 5: the kernels differ by a few µs
_event_time = functools.partial(_kernels_event_time, repeat=5)


def main() -> None:
    import torch
    from symgpu.gpu.ops import elemwise as gelem
    from symgpu.gpu.ops.elemwise import GpuCAReduce
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.codegen import launch
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.scalar.basic import Cast, SCALAR_OPS as S

    ctx = gctx.start_device("cuda0")
    gctx.register_context("bench", ctx)
    print(f"device: {ctx.devname}, {launch.sm_count(ctx)} SMs")
    rng = np.random.default_rng(0)

    def thunk_for(value, pre):
        v = GpuArrayType(str(value.dtype), (False, False), "bench")()
        out = GpuCAReduce(S["add"], (0,), None, pre)(v)
        fg = FunctionGraph([v], [out], clone=False)
        storage = {v: [to_gpu(value, ctx)]}
        vm = link(fg, storage, allow_gc=False)
        th = vm.thunks[-1]
        th()
        ctx.synchronize()
        (plan,) = th.reduce_thunk.plans.values()
        return th, plan[0].kernel, np.asarray(storage[fg.outputs[0]][0].get(), "float64")

    cases = []
    for c in (2304, 768, 3072):
        cases.append((f"bfloat16 {R}x{c}", "bfloat16", c, None))
    cases.append((f"bfloat16 -> float32 {R}x2304", "bfloat16", 2304, Cast("float32")))
    for c in (2304, 768):
        cases.append((f"float32 {R}x{c}", "float32", c, None))
    cases.append((f"bfloat16 {R}x2306 (rows not aligned)", "bfloat16", 2306, None))

    print(f"{'case':40s} {'cols_tile':>24s} {'before (split)':>24s} {'torch.sum(0)':>18s}"
          f"  max rel err")
    for name, dtype, c, pre in cases:
        host = rng.standard_normal((R, c)).astype(dtype)
        nbytes = host.nbytes
        cell = lambda t: f"{t * 1e6:7.1f} us {nbytes / t / 1e12:4.2f} TB/s"
        row = [name.ljust(40)]
        want = host.astype("float64").sum(0)
        err = 0.0
        for tile in (True, False):
            gelem._ReduceThunk.COLS_TILE = tile
            th, kernel, got = thunk_for(host, pre)
            err = max(err, float(np.max(np.abs(got - want) / (np.abs(want) + 1))))
            row.append(f"{kernel[3:]:>9s} {cell(_event_time(th))}")
        gelem._ReduceThunk.COLS_TILE = True
        tx = torch.from_numpy(host.astype("float32")).to("cuda", getattr(torch, dtype))
        if pre is not None:
            row.append(cell(_event_time(lambda: torch.sum(tx, dim=0, dtype=torch.float32))))
        else:
            row.append(cell(_event_time(lambda: torch.sum(tx, dim=0))))
        row.append(f"{err:.1e}")
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
