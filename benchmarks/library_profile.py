"""Where the rows of benchmarks/library_gpu.py spend their time: per row, symgpu's seconds
per call, its CUDA-graph counts and its device kernels (torch.profiler's CUDA activity over a
few calls), and the same for each peer, so that a slow row shows whether symgpu is bound by
the host (per-call Python, no graph) or by its kernels, and which kernels the peers run.

    python3 benchmarks/library_profile.py --subset chol32,cnn3d
    python3 benchmarks/library_profile.py --subset cnn3d --algo-search time --host
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.append(os.path.join(ROOT, "benchmarks"))

from library_gpu import ROWS, make_data, row_kind, symgpu_contender  # noqa: E402
from library_peers import BUILDERS, Skip  # noqa: E402
from timing import per_call, profile_calls, say  # noqa: E402


def kernel_table(step, sync, calls: int, rows: int) -> None:
    """torch.profiler's CUDA activity over `calls` calls of `step` (one sync after)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        sync()
    say(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows,
                                  max_name_column_width=90))


def profile_row(row: str, peers: list[str], ctx, args, note: str = "") -> None:
    kind = row_kind(row)
    label, data = make_data(row, False, "off")
    say(f"\n======== {row}: {label}{note}")
    sym, host = symgpu_contender(kind, data, ctx)
    if host:
        say(f"  !! host ops: {host}")
    f = sym.step
    for _ in range(3):
        f()
    ctx.synchronize()
    t = per_call(f, args.number, ctx.synchronize)
    runner = getattr(f.vm, "runner", None)
    say(f"  symgpu: {t * 1e6:.1f} us per call; graphs: "
        f"{runner.stats() if runner is not None else 'no runner'}")
    if runner is not None and getattr(runner, "disabled_reason", None):
        say(f"  !! graphs disabled: {runner.disabled_reason}")
    if kind == "cnn":
        for node in f.maker.fgraph.toposort():
            say(f"    {type(node.op).__name__}: {[str(v.type) for v in node.inputs][:3]}")
    say("  -- symgpu kernels")
    kernel_table(f, ctx.synchronize, args.calls, args.rows)
    if args.host:
        profile_calls(f, args.number, ctx.synchronize, top=18)
    for peer in peers:
        try:
            contenders = BUILDERS[peer](kind, data, True)
        except Skip as why:
            say(f"  {peer}: skipped ({why})")
            continue
        for c in contenders:
            for _ in range(3):
                c.step()
            c.sync()
            t = per_call(c.step, args.number, c.sync)
            say(f"  {c.name}: {t * 1e6:.1f} us per call")
            if c.name in args.peer_kernels.split(","):
                say(f"  -- {c.name} kernels")
                kernel_table(c.step, c.sync, args.calls, args.rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--subset", default="chol32,chol256,chol4096,solve4096,cnn3d",
                   help="comma-separated rows: " + ", ".join(ROWS))
    p.add_argument("--peers", default="torch,cupy,jax")
    p.add_argument("--peer-kernels", default="PyTorch,PyTorch CUDA graph,JAX",
                   help="peers (contender names) whose kernels are listed too")
    p.add_argument("--number", type=int, default=50, help="calls per timed loop")
    p.add_argument("--calls", type=int, default=5, help="calls under the profiler")
    p.add_argument("--rows", type=int, default=14, help="kernel table rows")
    p.add_argument("--host", action="store_true", help="cProfile of symgpu's calls too")
    p.add_argument("--algo-search", default=None, help="conv.ALGO_SEARCH: heuristic | time")
    p.add_argument("--then-timed", action="store_true",
                   help="profile symgpu's convolution rows again with ALGO_SEARCH='time'")
    args = p.parse_args()
    import symgpu.gpu
    from symgpu.gpu.ops import conv
    if args.algo_search:
        conv.ALGO_SEARCH = args.algo_search
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not getattr(ctx, "virtual", False), "symgpu found no GPU"
    peers = [q for q in args.peers.split(",") if q]
    for row in args.subset.split(","):
        profile_row(row, peers, ctx, args)
        if args.then_timed and row == "cnn3d":
            conv.ALGO_SEARCH = "time"
            profile_row(row, [], ctx, args, " (cuDNN algorithms timed)")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
    main()
