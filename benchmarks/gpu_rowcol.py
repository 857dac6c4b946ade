"""Row- and column-broadcast elementwise kernels (issue 34), timed on the GPU machine.

Per case: symgpu's node with the row/column kernel (sg_rowcol_vec_*), the same node sent to
the strided kernel (``_ElemwiseThunk.ROWCOL = False``: what ran before), a contiguous unary
op over the same array (the vector kernel's bandwidth: the ceiling), then torch eager and
torch.compile.  Cases: a bias add (8192 x 2304, a (1, 1, C) row vector) in bfloat16 and
float32; a layer norm's (x - mean) * rstd with (B, S, 1) statistics (column vectors) and its
affine form (x - mean) * rstd * g + b (rows and columns in one kernel); a bfloat16 bias over
a C % 4 != 0 vocabulary (the scalar row/column kernel).  CUDA-event times, microseconds, and
the bytes of every operand read or written once over that time.  Not a test.

    python3 benchmarks/gpu_rowcol.py
    python3 benchmarks/gpu_rowcol.py --no-torch-compile   # skip torch.compile (slow compiles)
"""
from __future__ import annotations

import functools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_kernels import _event_time as _kernels_event_time  # noqa: E402

#: the activations' shape (batch, sequence, channels) and the operands' broadcast patterns
B, S_, C = 8, 1024, 2304
ROW, COL = (True, True, False), (False, False, True)


#: CUDA-event timing (gpu_kernels'), best of 5: the kernels differ by a few µs
_event_time = functools.partial(_kernels_event_time, repeat=5)


def _layer_norm(dtype: str, affine: bool):
    from symgpu.scalar.basic import SCALAR_OPS as S
    from symgpu.scalar.composite import CompositeBuilder
    b = CompositeBuilder()
    x, m, r = (b.add_input(dtype) for _ in range(3))
    out = b.add_op(S["mul"], [b.add_op(S["sub"], [x, m])[0], r])[0]
    if affine:
        g, bias = b.add_input(dtype), b.add_input(dtype)
        out = b.add_op(S["add"], [b.add_op(S["mul"], [out, g])[0], bias])[0]
    return b.build([out])


def main(torch_compile: bool = True) -> None:
    import torch
    from symgpu.gpu.ops import elemwise as gelem
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.codegen import launch
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.scalar.basic import SCALAR_OPS as S

    ctx = gctx.start_device("cuda0")
    gctx.register_context("bench", ctx)
    print(f"device: {ctx.devname}, {launch.sm_count(ctx)} SMs")
    rng = np.random.default_rng(0)

    def thunk_for(scalar_op, values, patterns):
        vs = [GpuArrayType(str(a.dtype), p, "bench")() for a, p in zip(values, patterns)]
        out = GpuElemwise(scalar_op)(*vs)
        outs = out if isinstance(out, list) else [out]
        fg = FunctionGraph(vs, outs, clone=False)
        storage = {v: [to_gpu(a, ctx)] for v, a in zip(vs, values)}
        vm = link(fg, storage, allow_gc=False)
        return vm.thunks[-1]

    def host(shape, dtype):
        return rng.standard_normal(shape).astype(dtype)

    cases = []
    for dtype in ("bfloat16", "float32"):
        x, b = host((B, S_, C), dtype), host((1, 1, C), dtype)
        cases.append((f"bias add {dtype} {B * S_}x{C}", S["add"], [x, b], [(False,) * 3, ROW],
                      lambda tx, tb: tx + tb))
    for dtype in ("bfloat16", "float32"):
        x, m, r = host((B, S_, C), dtype), host((B, S_, 1), dtype), host((B, S_, 1), dtype)
        cases.append((f"(x - mean) * rstd {dtype}", _layer_norm(dtype, False), [x, m, r],
                      [(False,) * 3, COL, COL], lambda tx, tm, tr: (tx - tm) * tr))
        g, b = host((1, 1, C), dtype), host((1, 1, C), dtype)
        cases.append((f"(x - mean) * rstd * g + b {dtype}", _layer_norm(dtype, True),
                      [x, m, r, g, b], [(False,) * 3, COL, COL, ROW, ROW],
                      lambda tx, tm, tr, tg, tb: (tx - tm) * tr * tg + tb))
    x, b = host((8, 512, 50257), "bfloat16"), host((1, 1, 50257), "bfloat16")
    cases.append(("bias add bfloat16 4096x50257 (C % 4 != 0)", S["add"], [x, b],
                  [(False,) * 3, ROW], lambda tx, tb: tx + tb))

    print(f"{'case':44s} {'rowcol':>16s} {'strided':>16s} {'contig unary':>16s} "
          f"{'torch':>16s} {'torch.compile':>16s}")
    for name, sop, values, patterns, tfn in cases:
        nbytes = sum(a.nbytes for a in values) + values[0].nbytes   # operands + the output
        cell = lambda t: f"{t * 1e6:7.1f} us {nbytes / t / 1e12:4.2f} TB/s"
        row = [name.ljust(44)]
        for rowcol in (True, False):
            gelem._ElemwiseThunk.ROWCOL = rowcol
            row.append(cell(_event_time(thunk_for(sop, values, patterns))))
        gelem._ElemwiseThunk.ROWCOL = True
        unary = thunk_for(S["neg"], values[:1], patterns[:1])
        t = _event_time(unary)   # its bytes: x and the output only
        row.append(f"{t * 1e6:7.1f} us {2 * values[0].nbytes / t / 1e12:4.2f} TB/s")
        tvals = [torch.from_numpy(a.astype("float32")).to("cuda", getattr(torch, str(a.dtype)))
                 for a in values]
        row.append(cell(_event_time(lambda: tfn(*tvals))))
        if not torch_compile:
            row.append("skipped")
            print(" ".join(row), flush=True)
            continue
        try:
            compiled = torch.compile(tfn)
            compiled(*tvals)
            row.append(cell(_event_time(lambda: compiled(*tvals))))
        except Exception as exc:                     # no Triton/compiler on the machine
            row.append(f"unavailable ({type(exc).__name__})")
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main(torch_compile="--no-torch-compile" not in sys.argv[1:])
