"""Issue 33: symgpu's library ops (cuSOLVER, cuSPARSE, cuFFT, sort/top-k, cuDNN 3-D) against
PyTorch, CuPy and JAX on the GPU.

    python3 benchmarks/library_gpu.py                     # GPU machine, every row: ~3 min
                                                          # (longer while rows run on the host)
    python3 benchmarks/library_gpu.py --subset sort,topk --rounds 9
    python3 benchmarks/library_gpu.py --peers torch,jax   # torch, cupy, jax, all or none
    python3 benchmarks/library_gpu.py --quick --peers none   # small sizes: a smoke run (CPU)

Rows (float32): Cholesky, solve (general A X = B, B of 16 columns) and eigh of 1024 matrices
of 32x32, 64 of 256x256 and one of 4096x4096 (Cholesky and eigh of A = M M^T + n I, solve of
A = M / sqrt(n) + 2 I: well conditioned); a CSR 100k x 100k with 1000 non-zeros per row (1e8,
int32 indices) times a dense 100k x 256; rfft of one row of 2^26; sort and top-100 of 2^26;
one SGD step of a small 3-D CNN (batch 8 of 1x32^3: conv3d 16 3^3, relu, max-pool 2, conv3d
32 3^3, relu, max-pool 2, dense 10, softmax cross-entropy, lr 0.01).

Timing: every contender is warmed up (and checked against a peer: symgpu's result vs the
first peer's, or NumPy's when no peer runs), then timed in interleaved rounds: each round
runs every contender in turn, N calls back to back then one sync, divided by N (N chosen so
a block lasts about --block-ms); the figure is the median over rounds. symgpu's outputs stay
on the GPU (``Out(gpu_from_host(out), borrow=True)``, as benchmarks/gpu_speed.py does), so
it does only the work the peers do. A symgpu graph with host ops is flagged loudly; a peer
slower than the published figure allows is warned about. Ends with a Markdown table.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

sys.path.append(os.path.join(ROOT, "benchmarks"))   # appended: benchmarks/random.py
from library_peers import BUILDERS, LR, Contender, Skip  # noqa: E402
from timing import say  # noqa: E402

GOAL = 1.05
PEERS = ("torch", "cupy", "jax")
LINALG = {"cholesky": "chol", "solve": "solve", "eigh": "eigh"}
#: per size tag: (batch or None, n), full and --quick
LINALG_SIZES = {"32": ((1024, 32), (16, 8)), "256": ((64, 256), (4, 32)),
                "4096": ((None, 4096), (None, 64))}
ROWS = ([f"{short}{tag}" for short in LINALG.values() for tag in LINALG_SIZES]
        + ["spmm", "rfft", "sort", "topk", "cnn3d"])
GROUPS = {"linalg": [r for r in ROWS if r[:4] in ("chol", "solv", "eigh")],
          **{kind: [f"{short}{t}" for t in LINALG_SIZES] for kind, short in LINALG.items()}}
#: relative error allowed between symgpu and the reference (0: equal)
TOLERANCE = {"cholesky": 1e-3, "solve": 1e-3, "eigh": 1e-3, "spmm": 1e-4, "rfft": 1e-4,
             "sort": 0.0, "topk": 0.0, "cnn": 1e-3}


# ============================================================================ data

def row_kind(row: str) -> str:
    for kind, short in LINALG.items():
        if row.startswith(short):
            return kind
    return {"cnn3d": "cnn"}.get(row, row)


def linalg_data(kind: str, tag: str, quick: bool, rng) -> tuple[str, dict]:
    batch, n = LINALG_SIZES[tag][1 if quick else 0]
    lead = () if batch is None else (batch,)
    M = rng.standard_normal(lead + (n, n), dtype=np.float32)
    label = f"{kind} {'' if batch is None else f'{batch}x'}{n}x{n}"
    if kind == "solve":
        A = M / np.float32(np.sqrt(n)) + 2 * np.eye(n, dtype=np.float32)
        B = rng.standard_normal(lead + (n, 16), dtype=np.float32)
        return label + " (B: 16 columns)", {"A": A, "B": B}
    A = M @ np.swapaxes(M, -1, -2) + n * np.eye(n, dtype=np.float32)
    return label, {"A": A.astype(np.float32)}


def spmm_data(quick: bool, rng) -> tuple[str, dict]:
    """Sorted, distinct column indices fast: row r takes one column in each of the
    `per_row` strips of n // per_row columns (random within the strip)."""
    n, per_row, cols = (2000, 20, 16) if quick else (100_000, 1000, 256)
    strip = n // per_row
    t0 = time.perf_counter()
    idx = np.empty((n, per_row), np.int32)
    values = np.empty((n, per_row), np.float32)
    D = np.empty((n, cols), np.float32)
    offsets = (np.arange(per_row, dtype=np.int32) * strip)[None, :]

    def fill(gen, lo, hi):          # NumPy's generators release the GIL: threads help
        idx[lo:hi] = gen.integers(0, strip, size=(hi - lo, per_row), dtype=np.int32)
        idx[lo:hi] += offsets
        gen.random(out=values[lo:hi], dtype=np.float32)
        values[lo:hi] -= np.float32(0.5)
        gen.standard_normal(out=D[lo:hi], dtype=np.float32)
    workers = min(16, os.cpu_count() or 1)
    bounds = np.linspace(0, n, workers + 1).astype(int)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(fill, rng.spawn(workers), bounds[:-1], bounds[1:]))
    values = values.reshape(-1)
    indptr = np.arange(0, n * per_row + 1, per_row, dtype=np.int32)
    say(f"  (CSR {n}x{n} with {n * per_row:.3g} non-zeros built in "
        f"{time.perf_counter() - t0:.1f} s)")
    return (f"spmm CSR {n}x{n} ({per_row}/row) x {n}x{cols}",
            {"values": values, "indices": idx.reshape(-1), "indptr": indptr, "D": D,
             "shape": (n, n)})


def vector_data(kind: str, quick: bool, rng) -> tuple[str, dict]:
    log2 = 12 if quick else 26
    if kind == "rfft":
        return f"rfft 1x2^{log2}", {"x": rng.standard_normal((1, 1 << log2), dtype=np.float32)}
    data = {"x": rng.standard_normal(1 << log2, dtype=np.float32), "k": 100}
    return (f"topk k=100 of 2^{log2}" if kind == "topk" else f"sort 2^{log2}"), data


def cnn_data(quick: bool, rng, compile_mode: str) -> tuple[str, dict]:
    batch, side = (2, 12) if quick else (8, 32)
    flat = 32 * (((side - 2) // 2 - 2) // 2) ** 3
    shapes = [(16, 1, 3, 3, 3), (16,), (32, 16, 3, 3, 3), (32,), (flat, 10), (10,)]
    params = []
    for s in shapes:
        fan_in = int(np.prod(s[1:])) if len(s) == 5 else s[0]
        params.append(np.zeros(s, np.float32) if len(s) == 1 else
                      (rng.uniform(-1, 1, s) * np.sqrt(3.0 / fan_in)).astype(np.float32))
    labels = rng.integers(0, 10, batch)
    return (f"3-D CNN SGD step, batch {batch} of 1x{side}^3",
            {"x": rng.standard_normal((batch, 1, side, side, side), dtype=np.float32),
             "labels": labels, "onehot": np.eye(10, dtype=np.float32)[labels],
             "params": params, "torch_compile_mode": compile_mode})


def make_data(row: str, quick: bool, compile_mode: str) -> tuple[str, dict]:
    rng = np.random.default_rng(33)
    kind = row_kind(row)
    if kind in LINALG:
        return linalg_data(kind, row[len(LINALG[kind]):], quick, rng)
    if kind == "spmm":
        return spmm_data(quick, rng)
    if kind == "cnn":
        return cnn_data(quick, rng, compile_mode)
    return vector_data(kind, quick, rng)


# ============================================================================ symgpu

def symgpu_contender(kind: str, data: dict, ctx) -> tuple[Contender, list[str]]:
    """symgpu's function for a row (outputs kept on the GPU, borrowed) and the names of the
    host ops in its graph (empty: all on the GPU)."""
    import symgpu.tensor as T
    import symgpu.tensor.fft
    import symgpu.tensor.nlinalg
    import symgpu.tensor.slinalg  # noqa: F401  (T.fft, T.nlinalg, T.slinalg)
    from symgpu import Out, config, function, shared
    gpu = ctx is not None

    def keep(out):
        if not gpu:
            return out
        from symgpu.gpu.placement.basic_ops import gpu_from_host
        return Out(gpu_from_host(out), borrow=True)
    with config.change_flags(floatX="float32"):
        t0 = time.perf_counter()
        updates = None
        if kind == "cholesky":
            outs = keep(T.slinalg.cholesky(shared(data["A"])))
        elif kind == "solve":
            outs = keep(T.slinalg.solve(shared(data["A"]), shared(data["B"])))
        elif kind == "eigh":
            outs = [keep(o) for o in T.nlinalg.eigh(shared(data["A"]))]
        elif kind == "spmm":
            import scipy.sparse
            import symgpu.sparse
            S = shared(scipy.sparse.csr_matrix((data["values"], data["indices"], data["indptr"]),
                                               shape=data["shape"]))
            outs = keep(symgpu.sparse.structured_dot(S, shared(data["D"])))
        elif kind == "rfft":
            outs = keep(T.fft.rfft(shared(data["x"])))
        elif kind == "sort":
            outs = keep(T.sort(shared(data["x"])))
        elif kind == "topk":
            outs = keep(T.topk(shared(data["x"]), data["k"]))
        elif kind == "cnn":
            cost, updates = symgpu_cnn(data)
            outs = keep(cost)
        else:
            raise ValueError(kind)
        f = function([], outs, updates=updates, name=f"library_gpu {kind}")
    say(f"  (symgpu compiled in {time.perf_counter() - t0:.2f} s)")
    sync = ctx.synchronize if gpu else (lambda: None)

    def host(r):
        if isinstance(r, (list, tuple)):
            return tuple(np.asarray(v) for v in r)
        return np.asarray(r)
    return Contender("symgpu", f, sync, host), host_ops(f, gpu)


def symgpu_cnn(data: dict):
    """The CNN's loss and SGD updates: batch and parameters in shared variables (on the GPU
    under device=cuda); cross-correlation (filter_flip=False), as the peers' conv3d."""
    import symgpu.tensor as T
    from symgpu import shared
    from symgpu.tensor.nnet import conv3d
    from symgpu.tensor.signal.pool import pool_3d
    x, y = shared(data["x"], name="x"), shared(data["onehot"], name="y")
    ps = [shared(p.copy()) for p in data["params"]]
    w1, b1, w2, b2, w3, b3 = ps

    def block(h, w, b):
        h = T.nnet.relu(conv3d(h, w, filter_flip=False) + b.dimshuffle("x", 0, "x", "x", "x"))
        return pool_3d(h, (2, 2, 2), ignore_border=True)
    h = block(block(x, w1, b1), w2, b2)
    p = T.nnet.softmax(T.dot(h.flatten(2), w3) + b3)
    cost = T.mean(T.nnet.categorical_crossentropy(p, y))
    grads = T.grad(cost, ps)
    return cost, [(q, q - np.float32(LR) * g) for q, g in zip(ps, grads)]


def host_ops(f, gpu: bool) -> list[str] | None:
    """Op class names of the nodes doing array work on the host (not a GPU op, a transfer or
    a shape read; touching a float array or a sparse matrix); None on the CPU."""
    if not gpu:
        return None
    from symgpu.gpu.placement.basic_ops import TRANSFER_OPS
    from symgpu.graph.devices import is_device_node
    from symgpu.sparse.type import SparseType
    from symgpu.tensor.type import TensorType
    found = []
    for node in f.maker.fgraph.toposort():
        if (is_device_node(node) or isinstance(node.op, TRANSFER_OPS)
                or getattr(node.op, "shape_read", None) is not None):
            continue
        if any(isinstance(v.type, SparseType) or (isinstance(v.type, TensorType)
               and v.type.dtype.startswith("float") and v.type.ndim > 0)
               for v in node.inputs + node.outputs):
            found.append(type(node.op).__name__)
    return sorted(set(found))


# ============================================================================ checks

def numpy_reference(kind: str, data: dict):
    """The row's result on the host (when no peer runs), or None with a printed reason."""
    if kind == "cholesky":
        return np.linalg.cholesky(data["A"])
    if kind == "solve":
        return np.linalg.solve(data["A"], data["B"])
    if kind == "eigh":
        return np.linalg.eigh(data["A"])
    if kind == "spmm":
        import scipy.sparse
        if len(data["values"]) > 10**7:
            say("    (no check: SciPy's single-threaded product of this size takes a minute)")
            return None
        return scipy.sparse.csr_matrix((data["values"], data["indices"], data["indptr"]),
                                       shape=data["shape"]) @ data["D"]
    if kind == "rfft":
        r = np.fft.rfft(data["x"].astype(np.float64))
        return np.stack([r.real, r.imag], -1)
    if kind == "sort":
        return np.sort(data["x"])
    if kind == "topk":
        return np.sort(data["x"])[::-1][:data["k"]]
    say("    (no NumPy reference for the CNN step: no check without a peer)")
    return None


def compared(kind: str, result):
    """The part of a result the check compares: eigenvalues for eigh, the losses of the
    first two steps for the CNN."""
    if kind == "eigh":
        return np.asarray(result[0], np.float64)
    if kind == "cnn":
        return np.asarray([float(np.asarray(r)) for r in result], np.float64)
    return np.asarray(result, np.float64)


def check(kind: str, ours, theirs, who: str) -> str:
    a, b = compared(kind, ours), compared(kind, theirs)
    if a.shape != b.shape:
        say(f"  !! CHECK FAILED: symgpu's result has shape {a.shape}, {who}'s {b.shape}")
        return "shape differs"
    err = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    tol = TOLERANCE[kind]
    ok = err <= tol
    say(f"  check vs {who}: relative error {err:.2e} (tolerance {tol:.0e}): "
        f"{'ok' if ok else '!! FAILED'}")
    return f"ok ({who})" if ok else f"FAILED vs {who} ({err:.1e})"


def plausible_bound(row: str, quick: bool) -> tuple[float, str] | None:
    """(seconds, why): a peer slower than this on an H200 is suspect (a published or
    estimated figure, with a wide margin); None where no figure is known (batched solvers)."""
    if quick:
        return None
    return {
        "rfft": (1.2e-3, "2^26 rfft moves ~0.5 GB: ~0.1 ms at 4.8 TB/s, cuFFT ~2-3 passes"),
        "sort": (5e-3, "CUB onesweep sorts 2^26 float32 keys in ~1-2 ms (pairs ~2x)"),
        "topk": (5e-3, "a radix select reads 256 MB a few times: ~0.1-0.5 ms"),
        "spmm": (0.1, "1e8 nnz x 256 cols gathers ~100 GB of rows (L2/HBM): ~10-25 ms"),
        "chol4096": (0.03, "potrf 4096: 2.3e10 flop, cuSOLVER ~10+ TFLOP/s: ~2 ms"),
        "solve4096": (0.05, "getrf+getrs 4096: 4.6e10 flop: ~3-5 ms"),
        "eigh4096": (1.5, "syevd 4096 float32: ~0.1-0.4 s (tridiagonal reduction)"),
    }.get(row)


# ============================================================================ timing

def time_row(contenders: list[Contender], rounds: int, budget_s: float, block_s: float,
             first_call: list[float]) -> dict[str, tuple[float, float, str]]:
    """{name: (median, best, how)} seconds per call, from interleaved rounds: each round
    runs every contender once in turn (N calls back to back then one sync, / N). A
    contender whose single call is a third of the row's budget (symgpu on the host, say) is
    timed by that one call; symgpu's is its first call (compiled before it), a peer's its
    second (the first call compiles)."""
    est = []
    for c, first in zip(contenders, first_call):
        if c.name == "symgpu" and first > budget_s / 3:
            est.append(first)
            continue
        c.step()     # one more call first: symgpu captures its CUDA graph at its second
        c.sync()     # call, which would otherwise set the size of its blocks
        t0 = time.perf_counter()
        c.step()
        c.sync()
        est.append(time.perf_counter() - t0)
    slow = [t > budget_s / 3 for t in est]
    counts = [max(1, min(200, int(block_s / max(t, 1e-7)))) for t in est]
    per_round = sum(n * t for n, t, s in zip(counts, est, slow) if not s)
    r = max(1, min(rounds, int(budget_s / max(per_round, 1e-9))))
    if r < rounds:
        say(f"  (rounds cut to {r} by the row's budget of {budget_s:.0f} s)")
    blocks: list[list[float]] = [[] for _ in contenders]
    for _ in range(r):
        for k, c in enumerate(contenders):
            if slow[k]:
                continue
            t0 = time.perf_counter()
            for _ in range(counts[k]):
                c.step()
            c.sync()
            blocks[k].append((time.perf_counter() - t0) / counts[k])
    out = {}
    for k, c in enumerate(contenders):
        if slow[k]:
            out[c.name] = (est[k], est[k], "1 call")
        else:
            out[c.name] = (statistics.median(blocks[k]), min(blocks[k]),
                           f"{len(blocks[k])}x{counts[k]}")
    return out


def fmt(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def run_row(row: str, args, ctx, peers: list[str]) -> dict:
    kind = row_kind(row)
    label, data = make_data(row, args.quick, args.torch_compile_mode)
    say(f"\n== {row}: {label}")
    contenders: list[Contender] = []
    result: dict = {"row": row, "label": label, "times": {}, "host_ops": None,
                    "check": "not run"}
    try:
        sym, ops = symgpu_contender(kind, data, ctx)
        contenders.append(sym)
        result["host_ops"] = ops
        if ops:
            say(f"  !! symgpu runs HOST ops in this row (figures include host work and "
                f"transfers): {', '.join(ops)}")
    except Exception as exc:  # noqa: BLE001
        say(f"  !! symgpu failed to build: {type(exc).__name__}: {exc}")
    for peer in peers:
        try:
            for c in BUILDERS[peer](kind, data, ctx is not None):
                contenders.append(c)
                if c.note:
                    say(f"  ({c.name}: {c.note})")
        except Skip as why:
            say(f"  {peer}: skipped: {why}")
        except Exception as exc:  # noqa: BLE001
            say(f"  {peer}: unavailable ({type(exc).__name__}: {str(exc)[:300]})")
    # warm up (compiles, plans, autotuning) and keep each result for the check
    calls = 2 if kind == "cnn" else 1
    results, first, ok = {}, {}, []
    for c in contenders:
        try:
            t0 = time.perf_counter()
            got = [c.host(c.step()) for _ in range(calls)]
            first[c.name] = (time.perf_counter() - t0) / calls
            results[c.name] = got if kind == "cnn" else got[0]
            ok.append(c)
        except Exception as exc:  # noqa: BLE001
            say(f"  !! {c.name} failed on its first call: {type(exc).__name__}: "
                f"{str(exc)[:300]}")
    contenders = ok
    if "symgpu" in results:
        ref = next((c.name for c in contenders if c.name != "symgpu"), None)
        theirs = results[ref] if ref else numpy_reference(kind, data)
        if theirs is not None:
            result["check"] = check(kind, results["symgpu"], theirs, ref or "NumPy")
    results.clear()
    data.clear()
    if contenders:
        times = time_row(contenders, args.rounds, args.row_budget, args.block_ms / 1e3,
                         [first[c.name] for c in contenders])
        result["times"] = times
        report_row(row, times, result, ctx is not None and not args.quick)
    contenders.clear()
    free_device_memory()
    return result


def report_row(row: str, times: dict, result: dict, gpu_full: bool) -> None:
    sym = times.get("symgpu", (None,))[0]
    bound = plausible_bound(row, not gpu_full)
    for name, (med, best, how) in times.items():
        line = f"  {name:22s} median {fmt(med):>12s}  best {fmt(best):>12s}  ({how})"
        if sym is not None and name != "symgpu":
            line += f"   symgpu/{name} = {sym / med:6.3f}"
        say(line)
        if bound and name != "symgpu" and med > bound[0]:
            say(f"  !! {name} looks implausibly slow: {fmt(med)} > {fmt(bound[0])} "
                f"({bound[1]})")
    peers = {n: v[0] for n, v in times.items() if n != "symgpu"}
    if sym is not None and peers:
        best_peer = min(peers, key=peers.get)
        ratio = sym / peers[best_peer]
        result["best"] = (best_peer, ratio)
        say(f"  symgpu / best peer ({best_peer}) = {ratio:.3f}: "
            f"{'MET' if ratio <= GOAL else 'not met'} (goal <= {GOAL})")


def free_device_memory() -> None:
    gc.collect()
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if "cupy" in sys.modules:
        sys.modules["cupy"].get_default_memory_pool().free_all_blocks()


def markdown(results: list[dict], on_gpu: bool) -> None:
    names: list[str] = ["symgpu"]
    for r in results:
        names += [n for n in r["times"] if n not in names]
    order = ["symgpu", "PyTorch", "PyTorch eager", "torch.compile", "PyTorch CUDA graph",
             "CuPy", "JAX"]
    names.sort(key=lambda n: order.index(n) if n in order else len(order))
    say("\n## Library ops: symgpu vs peers" + ("" if on_gpu else " (NOT GPU figures)"))
    say("")
    say("| row | " + " | ".join(names) + " | symgpu / best peer | goal <= 1.05 | check | "
        "symgpu host ops |")
    say("|" + "---|" * (len(names) + 5))
    for r in results:
        cells = [fmt(r["times"].get(n, (None,))[0]) for n in names]
        best = r.get("best")
        ratio = f"{best[1]:.3f} ({best[0]})" if best else "-"
        met = ("MET" if best[1] <= GOAL else "not met") if best else "-"
        ops = r["host_ops"]
        ops = "n/a (CPU)" if ops is None else (", ".join(ops) if ops else "none")
        say(f"| {r['label']} | " + " | ".join(cells) + f" | {ratio} | {met} | {r['check']} "
            f"| {ops} |")


# ============================================================================ main

def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--subset", default="", help="comma-separated rows or groups: "
                   + ", ".join(ROWS + list(GROUPS)))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--peers", default="all", help="torch,cupy,jax | all | none")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--cpu", action="store_true", help="symgpu and the peers on the CPU")
    p.add_argument("--row-budget", type=float, default=20.0,
                   help="seconds of timing per row at most (rounds are cut to fit)")
    p.add_argument("--block-ms", type=float, default=25.0,
                   help="length of one contender's block of calls in a round")
    p.add_argument("--torch-compile-mode", default="default",
                   help="default | max-autotune-no-cudagraphs | reduce-overhead | off")
    args = p.parse_args(argv)
    rows: list[str] = []
    for name in filter(None, (s.strip() for s in args.subset.split(","))):
        if name not in ROWS and name not in GROUPS:
            p.error(f"--subset: unknown row {name!r}; rows: {', '.join(ROWS)}; groups: "
                    f"{', '.join(GROUPS)}")
        rows += [r for r in GROUPS.get(name, [name]) if r not in rows]
    args.rows = rows or list(ROWS)
    peers = {"all": list(PEERS), "none": []}.get(args.peers)
    if peers is None:
        peers = [q.strip() for q in args.peers.split(",") if q.strip()]
        bad = [q for q in peers if q not in PEERS]
        if bad:
            p.error(f"--peers: unknown {bad}; peers: {', '.join(PEERS)}, all, none")
    args.peer_list = peers
    return args


def gpu_context(force_cpu: bool):
    """symgpu's default GPU context, or None (CPU: said loudly)."""
    from symgpu import config
    if force_cpu or config.device == "cpu":
        return None
    import symgpu.gpu
    ctx = symgpu.gpu.init_default_context()
    if ctx is None or getattr(ctx, "virtual", False):
        return None
    return ctx


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    t_start = time.perf_counter()
    from symgpu import config
    ctx = gpu_context(args.cpu)
    if ctx is None:
        say("!! No GPU for symgpu (device=cpu or none usable): symgpu and the peers run on the "
            "CPU; these figures are NOT GPU figures (a smoke run of the code paths).")
        if not args.quick:
            say("   (full sizes on the CPU take long: use --quick)")
    else:
        say(f"symgpu on {ctx.devname}")
    say_versions(args.peer_list)
    results = []
    with config.change_flags(device="cpu") if ctx is None else _nothing():
        for row in args.rows:
            results.append(run_row(row, args, ctx, args.peer_list))
    markdown(results, ctx is not None)
    say(f"\n(timing: medians of interleaved rounds, N calls then one sync per block, / N; "
        f"benchmark took {time.perf_counter() - t_start:.1f} s)")
    return results


def say_versions(peers: list[str]) -> None:
    modules = {"torch": "torch", "cupy": "cupy", "jax": "jax"}
    for peer in peers:
        try:
            mod = __import__(modules[peer])
            say(f"{peer} {mod.__version__}")
        except Exception as exc:  # noqa: BLE001
            say(f"{peer}: not importable ({type(exc).__name__}: {exc}): its rows are skipped")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    # set here, not on import: a test that imports this module must not pass them on
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
    main()
