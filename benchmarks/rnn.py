"""The loop benchmark (issue 32): one training step (forward loop, BPTT, SGD on every weight)
of recurrent cells, symgpu's scan against the libraries people train RNNs with, in one run.

Rows (`rnn_cells.Spec`; keys ``{cell}-{masked|unmasked}-{last|all}-b{16|64}-h{128|512}-
{fixed|var}``): Elman, LSTM and GRU, and three cells no library has a kernel for (peephole
LSTM, layer-normalised LSTM, LSTM with a dropout draw in the step); masked or not; the loss
on the last state or on all; length 50 or a new length every call (uniform in 10..90, seeded).
Plus `elman-classic`, the benchmark as it was before (rnn_elman.py: 100 steps, the
cold-compile probe, the loop-graph counts).

Contenders per row: with `--device cuda` symgpu in float32 and TF32, PyTorch's cuDNN
nn.LSTM/nn.GRU/nn.RNN (eager, and the whole step as one CUDA graph: the ratio takes the
faster), torch.compile of the step, JAX's lax.scan (rnn_peers.py); on the CPU
symgpu and PyTensor's scan (default mode). Each contender's first two calls are checked
against a float64 reference with the same weights. The contenders' blocks of calls alternate;
a contender's time is the mean of its blocks without the fastest and the slowest (with a new
length every call a block's time varies by design: a median of ten blocks of three calls
would be a draw of the lengths, not their cost). A row of new lengths runs twice the rounds
and times symgpu and cuDNN's graph at length 50 too, in the same rounds (`TWINS`): its
var/fixed ratio is measured side by side, not against a row timed a minute apart. The run
ends with a Markdown table and the issue's "done when" criteria, PASS or FAIL.

    python benchmarks/rnn.py [--device cpu|cuda] [--subset KEYS|GLOBS] [--full] [--quick]
                             [--rounds N] [--steps N] [--budget S] [--skip cudnn,compile,...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

# benchmarks/ last: its random.py must not shadow the standard library's (statistics imports it)
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path.append(sys.path.pop(0))

import numpy as np  # noqa: E402

# the checkout's symgpu when no other is importable (`python benchmarks/rnn.py` from the root)
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rnn_cells as rc  # noqa: E402
from timing import interleaved, say, trimmed_mean  # noqa: E402

DEFAULT_CUDA = ["lstm-masked-last-b16-h128-fixed", "lstm-masked-last-b16-h128-var",
                "gru-masked-last-b16-h128-fixed", "elman-unmasked-all-b64-h512-fixed",
                "peephole-masked-last-b16-h128-fixed", "lnlstm-masked-last-b16-h128-fixed",
                "droplstm-masked-last-b16-h128-fixed", "lstm-unmasked-all-b64-h512-fixed",
                "gru-unmasked-all-b64-h512-fixed", "elman-classic"]
DEFAULT_CPU = ["lstm-masked-last-b16-h128-fixed", "elman-classic"]
DEFAULT_QUICK = ["lstm-masked-last-b16-h128-fixed", "lstm-masked-last-b16-h128-var",
                 "gru-unmasked-all-b16-h128-fixed", "elman-masked-all-b16-h128-var",
                 "peephole-masked-last-b16-h128-fixed", "lnlstm-unmasked-last-b16-h128-fixed",
                 "droplstm-masked-all-b16-h128-fixed"]
CPU_GOAL_ROW = "lstm-masked-last-b16-h128-fixed"
COLUMNS = [("symgpu", "symgpu fp32"), ("symgpu-tf32", "symgpu TF32"),
           ("symgpu-loop", "symgpu TF32, loop"), ("pytensor", "PyTensor"),
           ("cudnn", "cuDNN eager"), ("cudnn-graph", "cuDNN graph"),
           ("compile", "torch.compile"), ("jax", "JAX"),
           ("jax-fp32", "JAX fp32")]
PEERS = ("cudnn", "cudnn-graph", "compile", "jax", "jax-fp32", "pytensor")
#: cells scan_to_dnn_rnn recognises (on the GPU by default): their rows also time symgpu's
#: loop, the rewrite excluded
DNN_CELLS = ("lstm", "gru", "elman")
#: "the cuDNN module's time": the faster of its two formulations in the same run
CUDNN = ("cudnn", "cudnn-graph")
#: contenders a row of new lengths also times at length 50, in its own rounds (kind + AT_FIXED):
#: var/fixed side by side, as the machine's slow and fast phases hit both alike (rows run
#: apart in time: a phase during one row and not the other swung the ratio by 20%)
TWINS = ("symgpu", "symgpu-tf32", "symgpu-loop", "cudnn-graph")
AT_FIXED = "@fixed"
VAR_ROUNDS = 2          # a row of new lengths times this many times the rounds: fewer draws
#: untimed calls of each contender before each of its timed blocks (timing.interleaved):
#: every contender's block then times calls that follow its own, as a training loop makes
#: them, not the first call after another library's block (its caches cold)
LEAD = 1


# -- contenders -----------------------------------------------------------------------------------

def symgpu_contender(spec, params, arrays, device, tf32=False, loop=False) -> dict:
    """symgpu's scan as the user wrote it; `loop`: with scan_to_dnn_rnn excluded (an LSTM,
    GRU or Elman step stays a loop instead of one cuDNN layer)."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.compile.mode import get_mode
    flags = {"gpuarray__allow_tf32": tf32} if device != "cpu" else {}
    mode = get_mode(None).excluding_tags("scan_to_dnn_rnn") if loop else None
    with symgpu.config.change_flags(**flags):
        call, compile_s, fn = rc.build_symbolic(symgpu, T, spec, params, arrays, mode=mode)
    if flags:
        def run(L, mask, lens, call=call):
            with symgpu.config.change_flags(**flags):
                return call(L, mask)
    else:
        run = lambda L, mask, lens: call(L, mask)  # noqa: E731
    out = {"name": f"symgpu scan ({device})" + (", TF32" if tf32 else "")
           + (", loop (scan_to_dnn_rnn off)" if loop else ""), "call": run,
           "precision": "tf32" if tf32 else "fp32", "compile": compile_s, "function": fn}
    if spec.var and device != "cpu":
        out["warm"] = lambda: warm_lengths(spec, run)
    return out


def at_the_fixed_length(spec, contenders: list, n_calls: int) -> list[dict]:
    """The TWINS among a row's `contenders` again, called with the fixed row's calls (length
    50, its seeded masks): the same function or graphs, timed in the same rounds."""
    import dataclasses
    fixed = dataclasses.replace(spec, var=False)
    todo = rc.calls(fixed, n_calls, seed=rc.SEED + 6)
    out = []
    for c in contenders:
        if c["kind"] in TWINS:
            twin = dict(c, kind=c["kind"] + AT_FIXED,
                        name=c["name"] + f", length {fixed.fixed}")
            twin["fn"] = lambda c=c, it=iter(todo): c["call"](*next(it))
            out.append(twin)
    return out


def warm_lengths(spec, run) -> float:
    """Call `run` once with every length of the row's range (full-length rows), as the peers
    capture or compile every bucket before timing: each graph symgpu keeps per shape is
    made then. The weights train on (the losses were checked before). Returns seconds."""
    t0 = time.perf_counter()
    for L in range(spec.var_range[0], spec.var_range[1] + 1):
        mask = np.ones((L, spec.batch), "float32") if spec.masked else None
        run(L, mask, np.full(spec.batch, L, dtype="int64"))
    return time.perf_counter() - t0


def pytensor_contender(spec, params, arrays) -> dict:
    import pytensor
    import pytensor.tensor as pt
    call, compile_s, _ = rc.build_symbolic(pytensor, pt, spec, params, arrays)
    return {"name": f"PyTensor {pytensor.__version__} scan", "precision": "fp32",
            "call": lambda L, mask, lens: call(L, mask), "compile": compile_s}


def builders(spec, args) -> list[tuple[str, object]]:
    """(kind, build(params, arrays) -> contender) for the row, in timing order."""
    import rnn_peers as peers
    dev, pdev = args.device, args.peers
    out = [("symgpu", lambda p, a: symgpu_contender(spec, p, a, dev))]
    if dev != "cpu":
        out.append(("symgpu-tf32", lambda p, a: symgpu_contender(spec, p, a, dev, tf32=True)))
        if spec.cell in DNN_CELLS:
            out.append(("symgpu-loop", lambda p, a: symgpu_contender(spec, p, a, dev,
                                                                     tf32=True, loop=True)))
    else:
        out.append(("pytensor", lambda p, a: pytensor_contender(spec, p, a)))
    if pdev != "none":
        out += [("cudnn", lambda p, a: peers.cudnn(spec, p, a, pdev)),
                ("cudnn-graph", lambda p, a: peers.cudnn_graphed(spec, p, a, pdev)),
                ("compile", lambda p, a: peers.torch_compiled(spec, p, a, pdev)),
                ("jax", lambda p, a: peers.jax_scan(spec, p, a, "default", pdev))]
        if args.jax_fp32:
            out.append(("jax-fp32", lambda p, a: peers.jax_scan(spec, p, a, "highest", pdev)))
    return [(k, b) for k, b in out if k not in args.skip]


def reference(spec, params, arrays, checks) -> tuple[list[float], str]:
    try:
        import rnn_peers as peers
        return peers.torch_reference(spec, params, arrays, checks), "PyTorch float64"
    except ImportError:
        return [rc.numpy_loss(spec, params, *arrays, checks[0])], "NumPy float64 (forward)"


def run_row(spec, args) -> dict:
    """Build every contender (a failing one prints why), check its first two calls against
    the reference, time them in alternation; returns the row's results."""
    params, arrays = rc.init_params(spec), rc.data(spec)
    checks = rc.calls(spec, 2, seed=rc.SEED + 5)
    deterministic = spec.cell != "droplstm"
    ref, ref_name = reference(spec, params, arrays, checks) if deterministic else ([], "")
    rounds = args.rounds * (VAR_ROUNDS if spec.var else 1)
    n_calls = 2 + rounds * (args.steps + LEAD)
    contenders, bad = [], []
    for kind, build in builders(spec, args):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c = build(params, arrays)
                t0 = time.perf_counter()
                got = [float(c["call"](*k)) for k in checks]
                first = time.perf_counter() - t0
                if c["compile"] is None:            # compiled on its first call
                    c["compile"] = first
                if "warm" in c:
                    c["compile"] += c["warm"]()
        except Exception as exc:                    # a missing or broken peer: say why
            say(f"  {spec.key}: {kind} skipped ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''})")
            if os.environ.get("BENCH_TRACEBACK"):
                import traceback
                traceback.print_exc()
            continue
        rtol = 3e-2 if c["precision"] == "tf32" else 2e-3
        ok = all(np.isfinite(got))
        if ref:
            ok = ok and np.allclose(got[:len(ref)], ref, rtol=rtol, atol=1e-6)
        if not ok:
            bad.append(kind)
        c.update(kind=kind, losses=got, ok=ok)
        todo = rc.calls(spec, n_calls, seed=rc.SEED + 6)
        c["fn"] = (lambda c=c, it=iter(todo): c["call"](*next(it)))
        contenders.append(c)
    if not contenders:
        return {"spec": spec, "times": {}, "check": "nothing ran"}
    if spec.var:
        contenders += at_the_fixed_length(spec, contenders, n_calls)
    calls = [[] for _ in contenders] if args.per_call else None
    blocks: list = []
    times = interleaved([c["fn"] for c in contenders], args.steps, rounds, lead=LEAD,
                        calls=calls, blocks_out=blocks)
    means = [trimmed_mean(b) for b in blocks]
    say(f"{spec.key}: input {spec.inp}, hidden {spec.hidden}, batch {spec.batch}, "
        + (f"length uniform in {spec.var_range[0]}..{spec.var_range[1]} per call" if spec.var
           else f"length {spec.fixed}")
        + f"; {rounds} blocks of {args.steps} calls, each after {LEAD} untimed")
    if ref:
        say(f"  reference ({ref_name}) losses: " + ", ".join(f"{v:.6g}" for v in ref))
    for c, (best, med), mean in zip(contenders, times, means):
        say(f"  {c['name']:<38} {c['precision']:>4}  compile {c['compile']:7.3f} s  "
            f"best {best * 1e3:8.3f} ms  median {med * 1e3:8.3f} ms  "
            f"trimmed mean {mean * 1e3:8.3f} ms  losses "
            + ", ".join(f"{v:.6g}" for v in c["losses"]) + ("" if c["ok"] else "  MISMATCH"))
    if calls is not None:
        for c, own in zip(contenders, calls):
            say(f"  {c['name']}: " + per_call_summary(own, args.steps))
    if args.device != "cpu":
        from symgpu.gpu.exec import scan_graph
        say(f"  loop graphs so far: {dict(scan_graph.STATS)}")
        functions = [c for c in contenders if not c["kind"].endswith(AT_FIXED)]
        for c in functions:      # where symgpu's calls went: replays, captures, plain runs
            runner = getattr(getattr(c.get("function"), "vm", None), "runner", None)
            if hasattr(runner, "stats"):
                moved = [(sum(g.moves.values()), sum(g.repins.values())) for g in runner.segments]
                say(f"  {c['name']}: CUDA graphs {runner.stats()}, "
                    f"{len(runner.forced_plain)} nodes run plainly after a split; "
                    f"(inputs moved, re-pinned) per segment {moved}")
        for c in functions:      # why a loop runs step by step, when one does
            fg = getattr(getattr(c.get("function"), "maker", None), "fgraph", None)
            for node in (fg.apply_nodes if fg is not None else ()):
                lg = getattr(node.op, "loop_graphs", None)
                if lg is not None and lg.disabled is not None:
                    say(f"  {c['name']}: {node.op} runs step by step: {lg.disabled}")
    check = ("random (not checked)" if not deterministic else
             ("ok" if not bad else "MISMATCH " + ",".join(bad)))
    return {"spec": spec, "check": check,
            "times": {c["kind"]: mean for c, mean in zip(contenders, means)},
            "compile": {c["kind"]: c["compile"] for c in contenders}}


# -- report -----------------------------------------------------------------------------------

def headline(device: str) -> str:
    """The symgpu contender compared with the peers: on the GPU the TF32 one (cuDNN's and
    JAX's default precision), on the CPU float32."""
    return "symgpu" if device == "cpu" else "symgpu-tf32"


def _ratio(t: dict, a: str, b: str | tuple):
    """t[a] / t[b]; b a tuple of kinds: the fastest of them that ran."""
    peer = [t[k] for k in ((b,) if isinstance(b, str) else b) if k in t]
    return t[a] / min(peer) if a in t and peer else None


def _fixed_twin(results: dict, spec):
    import dataclasses
    twin = results.get(dataclasses.replace(spec, var=False).key)
    return twin["times"] if twin else {}


def table(results: dict, device: str) -> list[str]:
    sg = headline(device)
    peer = "pytensor" if device == "cpu" else None
    cols = [(k, n) for k, n in COLUMNS if any(k in r["times"] for r in results.values())]
    head = ["row"] + [f"{n} ms" for _, n in cols]
    head += ([f"{sg}/PyTensor"] if peer else [f"{sg}/cuDNN", f"{sg}/JAX"]) + \
        ["var/fixed", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, r in results.items():
        t = r["times"]
        cells = [key] + [f"{t[k] * 1e3:.2f}" if k in t else "" for k, _ in cols]
        ratios = [_ratio(t, sg, peer)] if peer else [_ratio(t, sg, CUDNN), _ratio(t, sg, "jax")]
        ratios.append(_var_ratio(results, r, sg) if r.get("spec") else None)
        cells += [f"{v:.2f}x" if v is not None else "" for v in ratios] + [r.get("check", "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _var_ratio(rows: dict, r: dict, kind: str, side_by_side: bool = True):
    """A row of new lengths: `kind`'s time over its time at length 50, timed in the row's
    own rounds (TWINS) where `side_by_side` and measured, else over the fixed row's."""
    t = r["times"]
    if not r["spec"].var or kind not in t:
        return None
    if side_by_side and kind + AT_FIXED in t:
        return t[kind] / t[kind + AT_FIXED]
    twin = _fixed_twin(rows, r["spec"])
    return t[kind] / twin[kind] if kind in twin else None


def _var_pairs(rows: dict, kind: str, side_by_side: bool = True) -> list[tuple]:
    """(key, time with a new length every call / time at length 50) of `kind` per row."""
    pairs = [(r["spec"].key, _var_ratio(rows, r, kind, side_by_side)) for r in rows.values()]
    return [(k, v) for k, v in pairs if v is not None]


def criteria(results: dict, device: str, quick: bool) -> list[str]:
    """The issue's "done when", each PASS, FAIL or n/a (not measured in this run)."""
    sg = headline(device)
    rows = {k: r for k, r in results.items() if r.get("spec") is not None}

    def verdict(name, pairs, limit, strict=False):
        vals = [(k, v) for k, v in pairs if v is not None]
        if not vals:
            return f"- n/a  {name} (not measured in this run)"
        bad = [f"{k} {v:.2f}x" for k, v in vals if (v >= limit if strict else v > limit)]
        worst = max(v for _, v in vals)
        return (f"- {'FAIL' if bad else 'PASS'} {name}: worst {worst:.2f}x over {len(vals)} rows"
                + (f"; over: {', '.join(bad)}" if bad else ""))
    out = []
    if device != "cpu":
        lg = [r for r in rows.values() if r["spec"].cell in ("lstm", "gru")]
        out.append(verdict("LSTM and GRU rows within 1.5x of cuDNN",
                           [(r["spec"].key, _ratio(r["times"], sg, CUDNN)) for r in lg], 1.5))
        out.append(verdict("LSTM and GRU rows at or under JAX",
                           [(r["spec"].key, _ratio(r["times"], sg, "jax")) for r in lg], 1.0))
        out.append(verdict("(the loop, scan_to_dnn_rnn off) LSTM and GRU rows within 1.5x "
                           "of cuDNN", [(r["spec"].key, _ratio(r["times"], "symgpu-loop", CUDNN))
                                        for r in lg], 1.5))
        nl = [r for r in rows.values() if r["spec"].cell in ("peephole", "lnlstm", "droplstm")]
        out.append(verdict("peephole, layer-norm and dropout cells at or under JAX",
                           [(r["spec"].key, _ratio(r["times"], sg, "jax")) for r in nl], 1.0))
        el = [(k, r) for k, r in results.items()
              if k == "elman-classic" or (k in rows and r["spec"].cell == "elman")]
        out.append(verdict("Elman ahead of JAX",
                           [(k, _ratio(r["times"], sg, "jax")) for k, r in el], 1.0,
                           strict=True))
    side = _var_pairs(rows, sg)
    out.append(verdict("a new length every call within 1.1x of length 50", side, 1.1))
    apart = _var_pairs(rows, sg, side_by_side=False)
    if apart and apart != side:         # against the fixed row's time, for the record
        out.append("  (against the fixed row's time, timed apart: "
                   + ", ".join(f"{k} {v:.2f}x" for k, v in apart) + ")")
    pairs = _var_pairs(rows, "symgpu-loop")
    if pairs:
        out.append(verdict("(the loop) a new length within 1.1x of length 50", pairs, 1.1))
    if device == "cpu":
        r = rows.get(CPU_GOAL_ROW)
        out.append(verdict(f"CPU {CPU_GOAL_ROW} at or under 0.5x PyTensor's scan",
                           [(CPU_GOAL_ROW, _ratio(r["times"], "symgpu", "pytensor"))] if r
                           else [], 0.5))
    bad = [k for k, r in results.items() if r.get("check", "").startswith(("MISMATCH", "nothing"))]
    out.append(f"- {'FAIL' if bad else 'PASS'} every contender's losses match the reference"
               + (f": {', '.join(bad)}" if bad else ""))
    if quick:
        out.append("  (--quick: toy sizes, not the issue's; the verdicts mean nothing)")
    return out


# -- main -----------------------------------------------------------------------------------

def per_call_summary(seconds: list, per_block: int) -> str:
    """Single calls' 10th, 50th and 90th percentiles, and the median of each position in a
    block (a slow first call after the lead call shows where a block's time goes)."""
    def ms(values: list, q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e3
    spots = [seconds[k::per_block] for k in range(per_block)]
    return (f"calls p10 {ms(seconds, 0.1):.3f} p50 {ms(seconds, 0.5):.3f} "
            f"p90 {ms(seconds, 0.9):.3f} ms; by position in a block (median) "
            + ", ".join(f"{ms(s, 0.5):.3f}" for s in spots) + " ms")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--subset", default=None, help="comma list of row keys or globs "
                    "(e.g. 'lstm-masked-*-b16-*,elman-classic'); default: every cell once")
    ap.add_argument("--full", action="store_true", help="every row of the issue's matrix")
    ap.add_argument("--quick", action="store_true", help="toy sizes, 2 rounds: a smoke run")
    ap.add_argument("--steps", type=int, default=None, help="calls per timed block (3)")
    ap.add_argument("--rounds", type=int, default=None, help="timed blocks per contender")
    ap.add_argument("--budget", type=float, default=360.0,
                    help="seconds; rows not started by then are skipped (the default run "
                    "fits the issue's 8 minutes)")
    ap.add_argument("--peers", default=None, help="where PyTorch and JAX run: cuda, cpu (to "
                    "try them without a GPU) or none; default: the device (none on the CPU)")
    ap.add_argument("--skip", default="", help=f"contenders to leave out: {','.join(PEERS)}")
    ap.add_argument("--jax-fp32", action="store_true", help="add JAX with 'highest' precision")
    ap.add_argument("--seq", type=int, default=100, help="elman-classic's time steps")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-compile probe")
    ap.add_argument("--per-call", action="store_true",
                    help="also time each call apart: percentiles and the median by position "
                    "in a block, per contender")
    ap.add_argument("--no-split", action="store_true",
                    help="varied CUDA-graph segments stay whole (graph_varying.SPLIT off)")
    ap.add_argument("--profile-cold", action="store_true",
                    help="print a cProfile of the cold compile's phases")
    ap.add_argument("--cold-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cold-wait", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.peers = args.peers or ("none" if args.device == "cpu" else args.device)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.steps = args.steps or (1 if args.quick else 3)
    args.rounds = args.rounds or (2 if args.quick else 10)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.cold_probe:
        import rnn_elman
        rnn_elman.cold_probe(args.seq, args.profile_cold, args.cold_wait)
        return {}
    start = time.perf_counter()
    if args.device != "cpu":
        # JAX takes 75% of the GPU's memory on its first array; symgpu and PyTorch share it
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")
        # force_device: without a usable GPU symgpu's rows fail and say why, rather than
        # warn (the builders silence warnings) and time the CPU under the GPU's name
        os.environ["SYMGPU_FLAGS"] = ",".join(
            f for f in (os.environ.get("SYMGPU_FLAGS", ""), f"device={args.device}",
                        "force_device=True") if f)
        if args.no_split:   # imported here: symgpu reads SYMGPU_FLAGS (set above) on import
            from symgpu.gpu.exec import graph_varying
            graph_varying.SPLIT = False
    if args.full:
        keys = [s.key for s in rc.all_specs()] + ["elman-classic"]
    else:
        keys = (args.subset.split(",") if args.subset else
                DEFAULT_QUICK if args.quick else
                DEFAULT_CUDA if args.device != "cpu" else DEFAULT_CPU)
    classic = any(k.strip() == "elman-classic" for k in keys)
    pats = ",".join(k for k in keys if k.strip() != "elman-classic")
    specs = rc.select(pats) if pats else []
    if args.quick:
        specs = [s.shrunk() for s in specs]
    results: dict = {}
    for spec in specs + (["elman-classic"] if classic else []):
        if time.perf_counter() - start > args.budget:
            say(f"{getattr(spec, 'key', spec)}: skipped (past --budget {args.budget:.0f} s)")
            continue
        if spec == "elman-classic":
            import rnn_elman
            meds = rnn_elman.run_classic(args)
            names = list(meds)
            results["elman-classic"] = {"spec": None, "check": "", "times": {
                "symgpu": meds[names[0]],
                **{k: meds[n] for k, n in (("symgpu-tf32", "symgpu scan (cuda), TF32"),
                                           ("jax", "JAX lax.scan (jit)"),
                                           ("cudnn", "PyTorch cuDNN nn.RNN")) if n in meds},
                **{"pytensor": v for n, v in meds.items() if n.startswith("PyTensor")}}}
            continue
        results[spec.key] = run_row(spec, args)
    say(f"\n## RNN matrix ({args.device}{', quick' if args.quick else ''}): ms per training "
        f"step, the mean of the timed blocks without the fastest and the slowest "
        f"(elman-classic: the median); ratios use {headline(args.device)}; "
        f"{time.perf_counter() - start:.0f} s in all\n")
    for line in table(results, args.device):
        say(line)
    say("")
    for line in criteria(results, args.device, args.quick):
        say(line)
    sys.stdout.flush()
    return results


if __name__ == "__main__":
    main()
