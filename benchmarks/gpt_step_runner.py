"""How benchmarks/half.py's GPT block step (or another of its models) runs on the GPU: CUDA
graphs or plain launches, and what its updates cost (issue 34).  Not a test: a report for the
GPU machine.

Prints the runner of the compiled step (enabled, why disabled, plain runs / captures /
replays, each segment's nodes, updates copied back and written in place, whether its check
used two plain runs), any GraphCaptureWarning, the step's wall time (median of 20 after 10
warm-up steps), and with PyTorch's profiler (CUPTI) the kernels, device-to-device copies,
device time of one step and the kernels that take most of it.

    python3 benchmarks/gpt_step_runner.py
    python3 benchmarks/gpt_step_runner.py --old-limit    # graphs.VERIFY_LIMIT = 64 MB: as before
    python3 benchmarks/gpt_step_runner.py --jax          # then JAX's step, its kernels alike
    python3 benchmarks/gpt_step_runner.py --model mlp --jax   # half.py's MLP step (mlp, lenet,
                                                               # lstm, gpt)
"""
from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cupti_table import kernel_table, queue_times, step_times  # noqa: E402


def jax_table(model: str = "gpt") -> None:
    """The same table for JAX's step (for the GPT block: cuDNN attention), the best peer of
    half.py's rows."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX shares the GPU
    import half_peers
    try:
        name, step, sync = getattr(half_peers, f"jax_{model}")()[0]
    except ImportError as exc:
        print(f"JAX unavailable: {exc}")
        return
    med, best = step_times(step, sync)
    print(f"{name}: median {med * 1e3:.3f} ms, best {best * 1e3:.3f} ms")
    queued, total = queue_times(step, sync)
    print(f"50 steps back to back: {queued * 1e3:.3f} ms a step to queue, "
          f"{total * 1e3:.3f} ms a step with the final sync")
    kernel_table(step, sync)


def main(old_limit: bool, model: str = "gpt") -> None:
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
            step, _, sync = half_symgpu.BUILDERS[model]({})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(10):
                step()
            sync()
        for w in caught:
            print(f"warning: {w.category.__name__}: {w.message}")
        med, best = step_times(step, sync, warm=0)
        print(f"step: median {med * 1e3:.3f} ms, best {best * 1e3:.3f} ms")
        queued, total = queue_times(step, sync)
        print(f"50 steps back to back: {queued * 1e3:.3f} ms a step to queue, "
              f"{total * 1e3:.3f} ms a step with the final sync")
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
        kernel_table(step, sync)


if __name__ == "__main__":
    args = sys.argv[1:]
    which = args[args.index("--model") + 1] if "--model" in args else "gpt"
    main("--old-limit" in args, which)
    if "--jax" in args:
        jax_table(which)
