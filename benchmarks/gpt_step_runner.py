"""How benchmarks/half.py's GPT block step runs on the GPU: CUDA graphs or plain launches, and
what its updates cost (issue 34).  Not a test: a report for the GPU machine.

Prints the runner of the compiled step (enabled, why disabled, plain runs / captures /
replays, each segment's nodes, updates copied back and written in place, whether its check
used two plain runs), any GraphCaptureWarning, the step's wall time (median of 20 after 10
warm-up steps), and with PyTorch's profiler (CUPTI) the kernels, device-to-device copies and
device time of one step.

    python3 benchmarks/gpt_step_runner.py
    python3 benchmarks/gpt_step_runner.py --old-limit    # graphs.VERIFY_LIMIT = 64 MB: as before
"""
from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(old_limit: bool) -> None:
    import symgpu
    from symgpu import config
    from symgpu.gpu.exec import graphs
    import half_symgpu
    if old_limit:
        graphs.VERIFY_LIMIT = 64 << 20
    with config.change_flags(device="cuda", floatX="float32"):
        ctx = symgpu.gpu.init_default_context()
        print(f"device: {getattr(ctx, 'devname', ctx)}; verify limit "
              f"{graphs.verify_limit(ctx) / 2**20:.0f} MB")
        with config.change_flags(mixed_precision="bfloat16"):
            step, _, sync = half_symgpu.gpt({})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(10):
                step()
            sync()
        for w in caught:
            print(f"warning: {w.category.__name__}: {w.message}")
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        print(f"step: median {np.median(times) * 1e3:.3f} ms, best {min(times) * 1e3:.3f} ms")
        runner = getattr(step.vm, "runner", None)
        print(f"runner: {type(runner).__name__}, enabled {getattr(runner, 'enabled', None)}, "
              f"disabled because: {getattr(runner, 'disabled_reason', None)}")
        if hasattr(runner, "stats"):
            print(f"stats: {runner.stats()}")
        for k, seg in enumerate(getattr(runner, "segments", [])):
            gpu_in = sum(c[0].nbytes for c, g in zip(seg.in_cells, seg.in_gpu)
                         if g and c[0] is not None and hasattr(c[0], "nbytes"))
            print(f"segment {k}: {len(seg.items)} nodes, GPU inputs {gpu_in / 2**20:.1f} MB, "
                  f"copy-back pairs {len(seg.copy_back)}, nodes with direct updates "
                  f"{len(seg.direct)}, nondeterministic {seg.nondeterministic}, "
                  f"verified {seg.verified}, plain {seg.plain_runs}, captures {seg.captures}, "
                  f"replays {seg.replays}")
            for gs in seg.graphs.values():
                for g in gs:
                    print(f"  graph: updates written in place {len(g.direct)}, "
                          f"copied back {len(g.backs) - len(g.direct)}, staged {len(g.staged)}")
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except ImportError as exc:
            print(f"torch profiler unavailable: {exc}")
            return
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            sync()
        evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
        copies = [e for e in evs if "memcpy" in e.name.lower() and "dtod" in e.name.lower()]
        total = sum(e.device_time for e in evs)
        print(f"per step (CUPTI): {len(evs) / 5:.0f} device events, "
              f"{len(copies) / 5:.0f} device-to-device copies "
              f"({sum(e.device_time for e in copies) / 5:.1f} us), "
              f"device time {total / 5 / 1e3:.3f} ms")
        del torch


if __name__ == "__main__":
    main("--old-limit" in sys.argv[1:])
