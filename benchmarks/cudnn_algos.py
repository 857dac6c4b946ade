"""Every cuDNN algorithm the heuristics list for the 3-D CNN's convolutions
(benchmarks/library_gpu.py): status, math type, workspace and device time of each (warmed,
then timed between CUDA events), and which one symgpu's search keeps.

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
    from symgpu.gpu.ops import cudnn as C
    from symgpu.gpu.runtime.array import new_array
    ctx = symgpu.gpu.init_default_context()
    lib = C.cudnn()
    print("cuDNN", lib.version_string)
    timer = C._event_timer(ctx.stream)
    for kind, xs, ws, ys in GEOMETRIES:
        d = C.ConvDescs(lib, ctx, kind, "float32", xs, ws, ys, (0, 0, 0), (1, 1, 1),
                        (1, 1, 1), False, 1, C.FMA_MATH)
        arrays = {s: new_array(ctx, s, np.dtype("float32")) for s in (xs, ws, ys)}
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
        d.time_algorithms(arrays[a].ptr, arrays[b].ptr, arrays[out].ptr,
                          ctx.pool.allocate(max(d.search_workspace, 8)).ptr,
                          d.search_workspace)
        print(f"  search (workspace {d.search_workspace}) keeps algo {d.algo}")


if __name__ == "__main__":
    main()
