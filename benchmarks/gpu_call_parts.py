"""Where one call of a one-kernel GPU function replaying its CUDA graph spends its time
(issue 19's `check1, result on the device` row): the whole call, then each layer inside it
timed alone, down to the graph launch.

    python3 benchmarks/gpu_call_parts.py          # the GPU machine: check1 on the device
    python3 benchmarks/gpu_call_parts.py --fake   # this machine: the fake driver's function
    python3 benchmarks/gpu_call_parts.py --against PATH   # also the layers another checkout
                                                  # (e.g. c10bea3) shares with this one
    python3 benchmarks/gpu_call_parts.py --fake --against PATH   # the same on the fake driver

Layers, outermost first: ``f()`` (Function.__call__), ``f._fast()`` (the frame's generated
call: its token, the cells), ``runner.entry()`` (the context's call lock), ``segment.run()``
(fetch and key, the graph's lease, the replay, the result handed out), ``graph.launch()``
(cuGraphLaunch, or the fake's kernel). The difference between two rows is what that layer
adds; gpu_call_overhead.py compares the whole call with another checkout. Every checkout has
``f()`` and ``graph.launch()``; ``launch, synced`` is one replay waited for (the graph's own
latency on the device, host and device together), ``launches, back to back`` 20,000 replays
and one wait (the device's throughput for that graph: when it is above ``graph.launch()``'s
host time, the call is bound by the device, not by Python). The fake driver has no device to
wait for: with ``--fake`` the shared rows are ``f()`` and ``graph.launch()`` alone.
"""
from __future__ import annotations

import os
import sys
import timeit

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "benchmarks"))


def check1_on_device():
    """function([], gpu_from_host(T.exp(x))) over a GPU shared x of 230,400 float32 (the
    seeds' check1, its result left on the device), its graph captured; and the sync."""
    os.environ["SYMGPU_FLAGS"] = "device=cuda,floatX=float32"
    import symgpu.tensor as T
    from symgpu import function, shared
    from symgpu.gpu import gpu_from_host, init_default_context   # in every layout
    ctx = init_default_context()
    assert ctx is not None, "no GPU"
    x = shared(np.asarray(np.random.RandomState(22).rand(10 * 30 * 768), "float32"))
    f = function([], gpu_from_host(T.exp(x)))
    for _ in range(5):
        f()
    ctx.synchronize()
    return f, ctx.synchronize


def best_us(fn, number: int = 20000, repeat: int = 7, sync=None) -> float:
    def block():
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
    return min(timeit.repeat(block, number=1, repeat=repeat)) / number * 1e6


def the_graph(f):
    runner = f.vm.runner
    seg = next(s for s in runner.steps if getattr(s, "graphs", None))
    return runner, seg, next(iter(seg.graphs.values()))[0]


def shared_rows(f, sync) -> list[tuple[str, float]]:
    """The layers every checkout has; the two rows that wait for the device only with a
    `sync` (none on the fake driver)."""
    _, _, graph = the_graph(f)
    rows = [("f()", best_us(f, sync=sync)), ("graph.launch()", best_us(graph.launch))]
    if sync is None:
        return rows

    def launch_synced():
        graph.launch()
        sync()
    return rows + [("launches, back to back", best_us(graph.launch, sync=sync)),
                   ("launch, synced", best_us(launch_synced, number=2000))]


def layer_rows(f) -> list[tuple[str, float]]:
    """This checkout's layers between f() and the launch."""
    runner, seg, graph = the_graph(f)
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
    return [("f()", best_us(f)), ("f._fast()", best_us(f._fast)),
            ("runner.entry()", best_us(entry) - base), ("segment.run()", best_us(run) - base),
            ("graph.launch()", best_us(graph.launch))]


def piece_rows(f) -> list[tuple[str, float]]:
    """Segment.run's replay path cut into pieces, each timed alone on the real objects (what
    the layer rows cannot tell apart), with what shapes that path: the graph's fields."""
    import types
    from symgpu.gpu.exec import graph_segment
    _, seg, g = the_graph(f)
    (cell,) = seg.in_cells
    value = f._frame.layout.containers[0].storage[0]
    print(f"  graph: fresh={g.fresh is not None} pinned={g.pinned} staged={g.staged} "
          f"backs={g.backs} escapes={g.escapes} params={bool(seg.param_thunks)} "
          f"dead={len(seg.dead)} fetch={getattr(seg.fetch, '__qualname__', seg.fetch)}")
    cell[0] = value
    vals, key = seg.fetch()
    fresh = g.fresh or ()

    def fetch():
        cell[0] = value
        seg.fetch()

    def lookup():
        seg.graphs.get(key)

    def checks():
        lease = g.lease
        if (lease is None or lease() is None) and not g.backs:
            for j, ptr in g.pinned:
                if vals[j].ptr != ptr:
                    break

    def hand_out(g=g, fresh=fresh):
        # Segment.run's inline hand-out, line for line; its names are looked up where
        # Segment.run looks them up (graph_segment's globals, g and fresh locals)
        lease = _new_object(Lease)   # noqa: F821  (graph_segment's globals)
        lease.blocks = g.owned
        g.lease = _weak(lease)   # noqa: F821
        for cell, ctx, ptr, shape, strides, dtype in fresh:
            arr = _gpuarray_new(_GpuArray)   # noqa: F821
            arr.context, arr.ptr, arr.shape = ctx, ptr, shape
            arr.strides, arr.dtype, arr.base = strides, dtype, lease
            arr._gpudata = None
            cell[0] = arr
    hand_out = types.FunctionType(hand_out.__code__, vars(graph_segment), "hand_out",
                                  hand_out.__defaults__)

    def nothing():
        pass
    base = best_us(nothing)
    rows = [(name, best_us(fn) - base) for name, fn in
            (("fetch (refill, key)", fetch), ("graphs.get", lookup),
             ("lease, pinned checks", checks), ("hand out", hand_out))]
    for out, *_ in fresh:     # the last array handed out holds the graph's lease: drop it,
        out[0] = None         # as a call's result is dropped, or the next call cannot replay
    return rows


def child(fake: bool, layers: bool) -> None:
    if fake:
        from fake_gpu_call_path import one_kernel_function
        f, sync = one_kernel_function(), None
    else:
        f, sync = check1_on_device()
    print(f"runner stats: {f.vm.runner.stats()}")
    if layers:
        rows = layer_rows(f)
        for name, us in rows:
            print(f"  {name:24s} {us:7.3f} us")
        print("  layer costs: " + ", ".join(
            f"{a} {ua - ub:.3f}" for (a, ua), (_, ub) in zip(rows, rows[1:])))
        for name, us in piece_rows(f):
            print(f"  piece {name:22s} {us:7.3f} us")
    for name, us in shared_rows(f, sync):   # the fake's sync is None: no device rows
        print(f"  {name:24s} {us:7.3f} us")


def main() -> None:
    fake = "--fake" in sys.argv
    if "--child" in sys.argv:
        child(fake, layers="--layers" in sys.argv)
        return
    from timing import run_checkout
    roots = [HERE]
    if "--against" in sys.argv:
        roots.append(os.path.abspath(sys.argv[sys.argv.index("--against") + 1]))
    for root in roots * 2:     # each checkout twice, alternating
        print(f"== {root}", flush=True)
        run_checkout(__file__, root, [*(["--fake"] if fake else []),
                                      *(["--layers"] if root == HERE else [])])


if __name__ == "__main__":
    main()
