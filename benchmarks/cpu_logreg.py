"""The seeds' logistic regression on the CPU (N=400, feats=784, float32), measured side by side
in one run: symgpu, a hand-written NumPy loop of the same updates, and PyTensor when it is
installed (`pip install pytensor`; it is not a dependency).

Prints, for each: compile time (building the training function from the symbolic graph) and
time per training step: the best and the median block of `--steps` calls over `--rounds`
rounds, the contenders timed in alternation so that drift in the machine's load hits them
alike. Goals:
step time at most 1.0x the NumPy loop and under half of PyTensor's; compile time under 0.25 s.

    python benchmarks/cpu_logreg.py [--steps 25] [--rounds 400]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from timing import interleaved  # noqa: E402

N, FEATS = 400, 784


def data(seed: int = 22):
    rng = np.random.RandomState(seed)
    x = rng.randn(N, FEATS).astype("float32")
    y = rng.randint(size=N, low=0, high=2).astype("float32")
    w = rng.randn(FEATS).astype("float32")
    return x, y, w


def build_train(lib, T):
    """The seeds' training function, built with `lib` (symgpu or pytensor, same API) and its
    tensor module `T`; returns (train, w, b, compile seconds)."""
    lib.config.floatX = "float32"
    x0, y0, w0 = data()
    x, y = T.matrix("x"), T.vector("y")
    w = lib.shared(w0.copy(), name="w")
    b = lib.shared(np.asarray(0.0, dtype="float32"), name="b")
    p_1 = 1 / (1 + T.exp(-T.dot(x, w) - b))
    prediction = p_1 > 0.5
    xent = -y * T.log(p_1) - (1 - y) * T.log(1 - p_1)
    cost = xent.mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    t0 = time.perf_counter()
    train = lib.function([x, y], [prediction, xent],
                         updates={w: w - 0.01 * gw, b: b - 0.01 * gb}, name="train")
    return train, w, b, time.perf_counter() - t0


def bench_symgpu() -> dict:
    import symgpu
    import symgpu.tensor as T
    x0, y0, _ = data()
    train, w, b, compile_s = build_train(symgpu, T)
    topo = train.maker.fgraph.toposort()
    used_cpu = any(n.op.__class__.__name__ in ("Gemv", "CGemv", "Gemm", "CGemm") for n in topo)
    step = lambda: train(x0, y0)  # noqa: E731
    step()
    return {"compile": compile_s, "fn": step, "nodes": len(topo), "gemv": used_cpu}


def bench_numpy() -> dict:
    x, y, w0 = data()
    state = {"w": w0.copy(), "b": np.float32(0.0)}

    def step():
        w, b = state["w"], state["b"]
        p = 1 / (1 + np.exp(-(x @ w) - b))
        prediction = p > 0.5
        xent = -y * np.log(p) - (1 - y) * np.log(1 - p)
        g = (p - y) / np.float32(N)  # d mean(xent) / d (x @ w + b)
        w -= np.float32(0.01) * (x.T @ g + np.float32(0.02) * w)
        state["b"] = b - np.float32(0.01) * g.sum()
        return prediction, xent

    def quiet_step():
        with np.errstate(all="ignore"):  # the naive formulas overflow on saturated logits
            return step()
    quiet_step()
    return {"compile": 0.0, "fn": quiet_step}


def bench_pytensor() -> dict | None:
    try:
        import pytensor
        import pytensor.tensor as pt
    except ImportError:
        return None
    x0, y0, _ = data()
    train, _, _, compile_s = build_train(pytensor, pt)
    step = lambda: train(x0, y0)  # noqa: E731
    step()
    return {"compile": compile_s, "fn": step, "version": pytensor.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args()
    contenders = [c for c in (bench_symgpu(), bench_numpy(), bench_pytensor()) if c is not None]
    times = interleaved([c["fn"] for c in contenders], args.steps, args.rounds)
    for c, (best, median) in zip(contenders, times):
        c["step"], c["median"] = best, median
    sg, npy = contenders[0], contenders[1]
    pt = contenders[2] if len(contenders) > 2 else None
    us = 1e6
    print(f"logistic regression, N={N}, feats={FEATS}, float32, best block of {args.steps} "
          f"steps over {args.rounds} alternating rounds")
    print(f"symgpu:  {sg['nodes']} Apply nodes, {'Used the cpu (Gemv)' if sg['gemv'] else 'no Gemv!'}")
    print(f"{'':10s}{'step (us)':>12s}{'median':>10s}{'compile (s)':>14s}")
    print(f"{'symgpu':10s}{sg['step'] * us:12.1f}{sg['median'] * us:10.1f}{sg['compile']:14.3f}")
    print(f"{'numpy':10s}{npy['step'] * us:12.1f}{npy['median'] * us:10.1f}{'-':>14s}")
    if pt is not None:
        print(f"{'pytensor':10s}{pt['step'] * us:12.1f}{pt['median'] * us:10.1f}"
              f"{pt['compile']:14.3f}   (PyTensor {pt['version']})")
    else:
        print(f"{'pytensor':10s}{'not installed':>12s}")
    print(f"symgpu / numpy step time:    {sg['step'] / npy['step']:.3f}x  (goal <= 1.0x; "
          f"medians {sg['median'] / npy['median']:.3f}x)")
    if pt is not None:
        print(f"symgpu / pytensor step time: {sg['step'] / pt['step']:.3f}x  (goal < 0.5x)")
    print(f"symgpu compile time:         {sg['compile']:.3f} s  (goal < 0.25 s)")


if __name__ == "__main__":
    main()
