"""Where one call of a one-kernel GPU function replaying its CUDA graph spends its time
(issue 19's `check1, result on the device` row): the whole call, then each layer inside it
timed alone, down to the graph launch.

    python3 benchmarks/gpu_call_parts.py          # the GPU machine: check1 on the device
    python3 benchmarks/gpu_call_parts.py --fake   # this machine: the fake driver's function

Layers, outermost first: ``f()`` (Function.__call__), ``f._fast()`` (the frame's generated
call: its token, the cells), ``runner.entry()`` (the context's call lock), ``segment.run()``
(fetch and key, the graph's lease, the replay, the result handed out), ``graph.launch()``
(cuGraphLaunch, or the fake's kernel). The difference between two rows is what that layer
adds; gpu_call_overhead.py compares the whole call with another checkout.
"""
from __future__ import annotations

import os
import sys
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def check1_on_device():
    """gpu_call_overhead.py's check1_device function, its graph captured."""
    from gpu_call_overhead import functions
    fns, sync = functions("cuda")
    f = fns["check1_device"]
    for _ in range(5):
        f()
    sync()
    return f


def best_us(fn, number: int = 20000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    if "--fake" in sys.argv:
        from fake_gpu_call_path import one_kernel_function
        f = one_kernel_function()
    else:
        f = check1_on_device()
    runner = f.vm.runner
    seg = runner.steps[0]
    graph = next(iter(seg.graphs.values()))[0]
    # what the frame's call puts in the segment's input cell (the one shared variable's
    # value) before running it; a replay empties it
    (cell,) = seg.in_cells
    value = f._frame.layout.containers[0].storage[0]

    def refill() -> None:
        cell[0] = value

    def entry() -> None:
        refill()
        runner.entry()

    def run() -> None:
        refill()
        seg.run()
    base = best_us(refill)
    rows = [("f()", best_us(f)), ("f._fast()", best_us(f._fast)),
            ("runner.entry()", best_us(entry) - base), ("segment.run()", best_us(run) - base),
            ("graph.launch()", best_us(graph.launch))]
    print(f"runner stats: {runner.stats()}")
    for name, us in rows:
        print(f"  {name:18s} {us:7.3f} us")
    print("  layer costs: " + ", ".join(
        f"{a} {ua - ub:.3f}" for (a, ua), (_, ub) in zip(rows, rows[1:])))


if __name__ == "__main__":
    main()
