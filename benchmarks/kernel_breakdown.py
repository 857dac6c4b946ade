"""Where each contender's MLP step spends GPU time, kernel by kernel: symgpu beside JAX (and
PyTorch), the same step, recorded by CUPTI through PyTorch's profiler (it records every kernel
of the process, those replayed from CUDA graphs and XLA's too).

    python3 benchmarks/kernel_breakdown.py            # gpu_speed.py's MLP step (fp32, TF32)
    python3 benchmarks/kernel_breakdown.py --dropout  # random.py's dropout MLP step
    python3 benchmarks/kernel_breakdown.py --logreg   # gpu_spellings.py's logistic-regression
                                                      # step: data shared, GpuArrays or host
                                                      # arrays passed per call (copies too)

Per contender: kernels per step, device time per step (the sum of kernel durations; the step's
wall time minus this is launch gaps and host work) and the kernels by total time.  Needs
PyTorch with CUDA (the recorder); JAX is optional.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.append(HERE)          # appended: benchmarks/random.py must not shadow the stdlib's
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

STEPS = 20


def load(name: str):
    """A benchmark module by file name (random.py cannot be imported as ``random``)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def contenders(dropout: bool) -> dict[str, list]:
    """{row: [(who, step, sync)]} from the benchmark that times them."""
    bench = load("random" if dropout else "gpu_speed")
    rows_names = (bench.MLP, bench.MLP_TF32) if dropout else (bench.MLP_FP32, bench.MLP_TF32)
    rows: dict[str, list] = {r: [] for r in rows_names}
    for build in (bench.symgpu_mlp_contenders, bench.jax_mlp_contenders,
                  bench.torch_mlp_contenders):
        try:
            build(rows)
        except ImportError as exc:
            print(f"  (skipped {build.__name__}: {exc})")
    return rows


def logreg_contenders() -> dict[str, list]:
    """gpu_spellings.py's logistic-regression step with its data in shared variables, passed
    per call as GpuArrays, and passed per call from host memory: the spellings its
    ``--profile`` looks into, each its own function (one given only GpuArrays, one only host
    arrays)."""
    builders = load("gpu_spellings").profiled_spellings()
    from symgpu.gpu import init_default_context
    ctx = init_default_context()
    steps = []
    for who, key in (("symgpu, data in shared variables", "shared-logreg"),
                     ("symgpu, GpuArrays passed per call", "gpuarrays-logreg"),
                     ("symgpu, host arrays passed per call", "data-per-call-logreg")):
        _, call = builders[key]()
        steps.append((who, call, ctx.synchronize))
    return {"logistic-regression step": steps}


def kernel_table(step, sync) -> tuple[int, float, list[tuple[str, int, float]]]:
    """(kernels per step, device µs per step, [(kernel, count per step, µs per step)]):
    every device activity CUPTI records (copies and memsets too)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        sync()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time_total > 0:
            per[ev.name].append(ev.device_time_total)
    table = sorted(((name[:90], len(ts) // STEPS, sum(ts) / STEPS) for name, ts in per.items()),
                   key=lambda r: -r[2])
    n = sum(len(ts) for ts in per.values()) // STEPS
    return n, sum(r[2] for r in table), table


def main() -> None:
    import torch  # noqa: F401  (the recorder)
    dropout = "--dropout" in sys.argv[1:]
    rows = logreg_contenders() if "--logreg" in sys.argv[1:] else contenders(dropout)
    for row, entries in rows.items():
        print(f"\n===== {row}")
        for who, step, sync in entries:
            n, total, table = kernel_table(step, sync)
            print(f"--- {who}: {n} kernels/step, {total:.1f} us of kernels per step")
            for name, count, us in table:
                print(f"  {us:8.1f} us  x{count:<3d} {name}")


if __name__ == "__main__":
    main()
