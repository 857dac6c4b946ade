"""Why a new sequence length every call costs what it costs (issue 32): one row of
benchmarks/rnn.py (default `lstm-masked-last-b16-h128`), its fixed-length and new-length-per-
call functions side by side, each call timed alone, with what every call did: the function's
CUDA-graph segments (captures, replays, plain runs, graphs held) and the loops' graphs
(scan_graph.STATS), then a cProfile of steady-state calls.

    python benchmarks/rnn_varlen.py [--row lstm-masked-last-b16-h128] [--calls 40]
                                    [--profile 20] [--tf32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.append(os.path.dirname(_HERE))

import rnn_cells as rc  # noqa: E402
from timing import say  # noqa: E402
from cupti_table import kernel_table  # noqa: E402


def segment_counts(fn) -> list[tuple]:
    runner = getattr(fn.vm, "runner", None)
    segs = getattr(runner, "segments", None) or []
    return [(len(s.items), s.plain_runs, s.captures, s.replays, s.n_graphs,
             sum(s.moves.values()), sum(s.by_pointer)) for s in segs]


def probe(key: str, calls: int, profile: int, tf32: bool, verbose: bool = True,
          warm_full: bool = False) -> None:
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.exec import graphs, scan_graph
    spec = rc.parse_key(key)
    with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
        call, compile_s, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec),
                                                rc.data(spec))
    todo = rc.calls(spec, 2 + calls + profile + 8, seed=rc.SEED + 6)   # 5 for device_time
    it = iter(todo)
    caught: list = []

    def one():
        L, mask, _ = next(it)
        with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
            return L, float(call(L, mask))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        if warm_full and spec.var:   # as rnn.py does: every length once, full masks
            for n in range(spec.var_range[0], spec.var_range[1] + 1):
                with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
                    call(n, np.ones((n, spec.batch), "float32") if spec.masked else None)
            say(f"  after every length once: {segment_counts(fn)}")
        one()
        one()
        say(f"{key}: compile {compile_s:.2f} s, first two calls {time.perf_counter() - t0:.2f} s")
        times = []
        before = segment_counts(fn)
        loops0 = dict(scan_graph.STATS)
        for k in range(calls):
            t0 = time.perf_counter()
            L, _ = one()
            dt = time.perf_counter() - t0
            times.append(dt)
            now = segment_counts(fn)
            loops = dict(scan_graph.STATS)
            dl = {k2: v - loops0.get(k2, 0) for k2, v in loops.items()
                  if v != loops0.get(k2, 0) and not k2.startswith("graph nodes")}
            ds = [(n[0], n[1] - b[1], n[2] - b[2], n[3] - b[3], n[4], n[5], n[6])
                  for n, b in zip(now, before)]
            if verbose:
                say(f"  call {k:3d} L={L:3d} {dt * 1e3:7.2f} ms "
                    "segs(nodes,plain,capt,repl,held,moves,by_pointer)"
                    f"={ds} loops={dl}")
            before, loops0 = now, loops
        say(f"  median {statistics.median(times) * 1e3:.3f} ms, best {min(times) * 1e3:.3f} ms"
            f" over {calls} calls; graphs.STATS {dict(graphs.STATS)}")
        say(f"  loop STATS {dict(scan_graph.STATS)}")
        if profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(profile):
                one()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        try:
            import torch
            kernel_table(one, torch.cuda.synchronize, rows=10, say=say)
        except ImportError as exc:
            say(f"  CUPTI unavailable: {exc}")
    for w in caught:
        say(f"  warning: {w.category.__name__}: {str(w.message)[:300]}")
    for node in fn.maker.fgraph.apply_nodes:
        lg = getattr(node.op, "loop_graphs", None)
        if lg is not None:
            say(f"  loop {node.op}: disabled={lg.disabled!r} chunking={lg.chunking} "
                f"graphs={len(lg.graphs)}")


def pair(key: str, blocks: int) -> None:
    """The benchmark's own order: the float32 and the TF32 functions of one row built in one
    process and called in alternating blocks of 3 calls (as timing.interleaved does), each
    call timed alone with what it did."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.exec import scan_graph
    spec = rc.parse_key(key)
    fns = []
    for tf32 in (False, True):
        with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
            call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec),
                                            rc.data(spec))
        todo = iter(rc.calls(spec, 3 + 3 * blocks, seed=rc.SEED + 6))
        fns.append((tf32, call, fn, todo))
    ops = {id(n.op) for _, _, fn, _ in fns for n in fn.maker.fgraph.apply_nodes
           if hasattr(n.op, "loop_graphs")}
    say(f"{key}: fp32 and TF32 functions, {len(ops)} distinct loop ops")
    for tf32, call, fn, todo in fns:
        for _ in range(3):
            L, mask, _ = next(todo)
            with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
                call(L, mask)
    for b in range(blocks):
        for tf32, call, fn, todo in fns:
            line = []
            for _ in range(3):
                L, mask, _ = next(todo)
                before, loops0 = segment_counts(fn), dict(scan_graph.STATS)
                t0 = time.perf_counter()
                with symgpu.config.change_flags(gpuarray__allow_tf32=tf32):
                    float(call(L, mask))
                dt = time.perf_counter() - t0
                now = segment_counts(fn)
                capt = sum(n[2] - o[2] for n, o in zip(now, before))
                dl = {k: v - loops0.get(k, 0) for k, v in scan_graph.STATS.items()
                      if v != loops0.get(k, 0) and k in ("captures", "plain", "capture_failures")}
                line.append(f"L={L:2d} {dt * 1e3:6.2f}ms c{capt}{dl or ''}")
            say(f"  block {b} {'tf32' if tf32 else 'fp32'}: " + " | ".join(line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="lstm-masked-last-b16-h128")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--profile", type=int, default=20)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--warm-full", action="store_true",
                    help="call the var function with every length once first, full masks "
                         "(as rnn.py warms it)")
    ap.add_argument("--profile-fixed", action="store_true",
                    help="profile the fixed-length function's calls too")
    ap.add_argument("--pair", type=int, default=0,
                    help="instead: N blocks of the fp32 and TF32 var functions alternating")
    args = ap.parse_args()
    os.environ["SYMGPU_FLAGS"] = ",".join(
        f for f in (os.environ.get("SYMGPU_FLAGS", ""), "device=cuda") if f)
    if args.pair:
        pair(f"{args.row}-var", args.pair)
        return
    for tail in ("fixed", "var"):
        probe(f"{args.row}-{tail}", args.calls,
              args.profile if tail == "var" or args.profile_fixed else 0,
              args.tf32, verbose=tail == "var", warm_full=args.warm_full)


if __name__ == "__main__":
    main()
