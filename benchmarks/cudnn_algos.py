"""Every cuDNN algorithm the heuristics list for the 3-D CNN's convolutions
(benchmarks/library_gpu.py): status, math type, workspace and device time of each (warmed,
then timed between CUDA events), symgpu's direct filter gradient beside them where it applies
(symgpu/gpu/ops/conv_wgrad.py: its time and its largest difference from cuDNN's heuristic
algorithm on random operands), and which one symgpu's search keeps.

    python3 benchmarks/cudnn_algos.py
"""
from __future__ import annotations

import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

import numpy as np  # noqa: E402

GEOMETRIES = [("fwd", (8, 1, 32, 32, 32), (16, 1, 3, 3, 3), (8, 16, 30, 30, 30)),
              ("bwd_filter", (8, 1, 32, 32, 32), (16, 1, 3, 3, 3), (8, 16, 30, 30, 30)),
              ("fwd", (8, 16, 15, 15, 15), (32, 16, 3, 3, 3), (8, 32, 13, 13, 13)),
              ("bwd_data", (8, 16, 15, 15, 15), (32, 16, 3, 3, 3), (8, 32, 13, 13, 13)),
              ("bwd_filter", (8, 16, 15, 15, 15), (32, 16, 3, 3, 3), (8, 32, 13, 13, 13))]


def main() -> None:
    import symgpu.gpu
    from symgpu.gpu.ops import conv_wgrad
    from symgpu.gpu.ops import cudnn as C
    from symgpu.gpu.runtime.array import new_array
    ctx = symgpu.gpu.init_default_context()
    lib = C.cudnn()
    print("cuDNN", lib.version_string)
    timer = C._event_timer(ctx.stream)
    for kind, xs, ws, ys in GEOMETRIES:
        d = C.ConvDescs(lib, ctx, kind, "float32", xs, ws, ys, (0, 0, 0), (1, 1, 1),
                        (1, 1, 1), False, 1, C.FMA_MATH)
        rng = np.random.default_rng(5)
        arrays = {s: new_array(ctx, s, np.dtype("float32")).set(
            rng.normal(size=s).astype("float32")) for s in (xs, ws, ys)}
        a, b, out = {"fwd": (xs, ws, ys), "bwd_data": (ws, ys, xs),
                     "bwd_filter": (xs, ys, ws)}[kind]
        perf = (C._Perf * 16)()
        count = ctypes.c_int(0)
        query = C._KINDS[kind][0]
        lib.call(query, d.handle, *d._order(), 16, ctypes.byref(count), perf)
        print(f"\n{kind} x {xs} w {ws} y {ys}: heuristic algo {d.algo}")
        for p in perf[:count.value]:
            line = f"  algo {p.algo} status {p.status} math {p.mathType}"
            size = ctypes.c_size_t(0)
            st = getattr(lib.lib, d.wsq)(d.handle, *d._order(), p.algo, ctypes.byref(size))
            line += f" ws {size.value if st == 0 else 'n/a'}"
            if p.status == 0 and st == 0:
                scratch = ctx.pool.allocate(max(int(size.value), 8))

                def run(algo=p.algo, n=int(size.value), w=scratch):
                    return d._call(algo, arrays[a].ptr, arrays[b].ptr, arrays[out].ptr,
                                   w.ptr, n)
                rc = run()
                if rc == 0:
                    line += f" {timer(run, 5) * 1e6:9.1f} us"
                else:
                    line += f" run status {rc}"
            print(line, flush=True)
        direct = None if kind != "bwd_filter" else conv_wgrad.direct_wgrad(
            "float32", xs, ws, ys, (0, 0, 0), (1, 1, 1), (1, 1, 1), False, 1)
        if direct is not None:
            scratch = ctx.pool.allocate(max(direct.workspace, 8))

            def run_direct(w=scratch, plan=direct):
                plan.run(ctx, arrays[xs].ptr, arrays[ys].ptr, arrays[ws].ptr, w.ptr)
                return 0
            run_direct()
            mine = arrays[ws].get()
            d.run(arrays[xs].ptr, arrays[ys].ptr, arrays[ws].ptr,
                  ctx.pool.allocate(max(d.workspace, 8)).ptr)
            ref = arrays[ws].get()
            print(f"  direct ({direct.partial_name}, {direct.chunks} chunks, ws "
                  f"{direct.workspace}) {timer(run_direct, 5) * 1e6:9.1f} us, max |diff| "
                  f"{np.abs(mine - ref).max():.3g} (|dW| max {np.abs(ref).max():.3g})")
            d.add_own(C.OwnAlgorithm("direct", direct.workspace,
                                     lambda x, y, w, s, plan=direct: plan.run(ctx, x, y, w, s)))
        d.time_algorithms(arrays[a].ptr, arrays[b].ptr, arrays[out].ptr,
                          ctx.pool.allocate(max(d.search_workspace, 8)).ptr,
                          d.search_workspace)
        kept = d.own_choice.name if d.own_choice is not None else f"algo {d.algo}"
        print(f"  search (workspace {d.search_workspace}) keeps {kept}")


if __name__ == "__main__":
    main()
