"""Where a training step's memory-bound time goes, node by node (issue 34): each elementwise,
reduction and row-group node of one of half.py's bf16 mixed-precision steps timed alone on the
GPU, with the bytes its operands hold and the bandwidth that makes.

The step is compiled as half.py compiles it (``mixed_precision=bfloat16``), with CUDA graphs
off; during one step a VM profiler hook runs the thunks in order and, right after each chosen
node has run (its inputs are live then), times that node's thunk alone with CUDA events (best
of 5 x 20 launches).  A node that works in place is run again on its own result: the time is
the kernel's, the values afterwards are not the step's.  Bytes are every input's and output's
array once (a broadcast operand counts its own size): TB/s is a floor on what the kernel moved.
Not a test.

    python3 benchmarks/node_times.py                 # the GPT block's step
    python3 benchmarks/node_times.py --model mlp --sort
    python3 benchmarks/node_times.py --kinds GpuCAReduce
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

# appended, not first: benchmarks/random.py must not shadow the standard library's random
# (run as a script, this folder is sys.path[0]: moved to the end)
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path.append(sys.path.pop(0))
for _path in (os.path.dirname(_HERE), _HERE):
    if _path not in sys.path:
        sys.path.append(_path)

#: the node kinds timed by default: the memory-bound kernels symgpu generates
KINDS = ("GpuElemwise", "GpuCAReduce", "GpuRowReduceGroup")


def operand_bytes(arrays: list[Any]) -> int:
    """Bytes the arrays hold, each once (None: a cell the step left empty)."""
    return sum(int(a.size) * a.dtype.itemsize for a in arrays if a is not None)


def pattern(var: Any) -> str:
    """``bf16:nn1``: a variable's dtype and broadcast pattern, as the listings print them."""
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
             "int64": "i64", "int32": "i32", "bool": "b"}
    bcast = "".join("1" if b else "n" for b in getattr(var.type, "broadcastable", ()))
    return f"{short.get(var.dtype, var.dtype)}:{bcast}"


def time_nodes(model: str, kinds: tuple[str, ...]) -> list[dict]:
    """One row per chosen node of ``model``'s step, in the step's order."""
    import symgpu
    from symgpu import config
    from gpu_kernels import _event_time
    import half_symgpu
    rows: list[dict] = []
    with config.change_flags(device="cuda", floatX="float32", allow_gc=False):
        symgpu.gpu.init_default_context()
        config.gpuarray.cuda_graphs = False        # thunks, not a replayed graph
        with config.change_flags(mixed_precision="bfloat16"):
            step, _, sync = half_symgpu.BUILDERS[model]({})
        step()
        sync()
        vm = step.vm

        def timed_run(vm: Any) -> None:
            for i, (node, thunk) in enumerate(zip(vm.nodes, vm.thunks)):
                thunk()
                kind = type(node.op).__name__
                if kind not in kinds:
                    continue
                arrays = [vm.storage_map[v][0] for v in node.inputs + node.outputs]
                seconds = _event_time(thunk, iters=20, repeat=5)
                rows.append({"index": i, "kind": kind, "us": seconds * 1e6,
                             "bytes": operand_bytes(arrays),
                             "operands": " ".join(pattern(v) for v in node.inputs),
                             "op": str(node.op)})
        vm.profiler = timed_run
        step()
        sync()
        vm.profiler = None
    return rows


def report(rows: list[dict], sort: bool, width: int = 70) -> None:
    """The rows (slowest first with ``sort``), then each kind's total."""
    print(f"{'node':>5} {'kind':18} {'us':>8} {'MB':>8} {'TB/s':>6}  operands / op")
    for r in sorted(rows, key=lambda r: -r["us"]) if sort else rows:
        tbs = r["bytes"] / (r["us"] * 1e-6) / 1e12 if r["us"] else 0.0
        print(f"{r['index']:5d} {r['kind']:18} {r['us']:8.1f} {r['bytes'] / 1e6:8.1f} "
              f"{tbs:6.2f}  {r['operands']}  {r['op'][:width]}")
    totals: dict[str, list[float]] = {}
    for r in rows:
        t = totals.setdefault(r["kind"], [0, 0.0, 0])
        t[0] += 1
        t[1] += r["us"]
        t[2] += r["bytes"]
    for kind, (n, us, nbytes) in totals.items():
        print(f"total {kind}: {n} nodes, {us:.1f} us, {nbytes / 1e6:.1f} MB, "
              f"{nbytes / (us * 1e-6) / 1e12 if us else 0:.2f} TB/s")


def main() -> None:
    import half_symgpu
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt", choices=sorted(half_symgpu.BUILDERS))
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma list of op class names to time")
    ap.add_argument("--sort", action="store_true", help="slowest first")
    args = ap.parse_args()
    report(time_nodes(args.model, tuple(args.kinds.split(","))), args.sort)


if __name__ == "__main__":
    main()
