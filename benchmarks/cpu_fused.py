"""Fused elementwise chains on the CPU, measured side by side in one run: symgpu (its C loop,
and with C kernels off, its NumPy path), NumPy written by hand, and PyTensor when it is
installed (`pip install pytensor`; not a dependency).

The chain is the logistic loss and its gradient on logits z and labels y:
`softplus(z) - y*z` and `(sigmoid(z) - y) / n`, at a training step's size (400 values) and a
large one (2**20 values). Prints microseconds per call and symgpu's ratio to NumPy.

    python benchmarks/cpu_fused.py [--rounds 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def interleaved(fns: list, number: int, rounds: int) -> list[float]:
    """Best seconds per call of each function over blocks of `number` calls, timed in
    alternation so that drift in the machine's load hits every contender alike."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t0) / number)
    return best


def build(lib, tt):
    z, y = tt.vector("z", dtype="float32"), tt.vector("y", dtype="float32")
    n = tt.cast(z.shape[0], "float32")
    xent = tt.softplus(z) - y * z
    grad = (tt.sigmoid(z) - y) / n
    return lib.function([z, y], [xent, grad])


def numpy_chain(z, y):
    n = np.float32(z.shape[0])
    xent = np.logaddexp(np.float32(0), z) - y * z
    grad = (1 / (1 + np.exp(-z)) - y) / n
    return xent, grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    import symgpu
    import symgpu.tensor as T
    from symgpu.tensor.c_elemwise import allow_c_kernels, c_kernels_enabled
    symgpu.config.floatX = "float32"
    with_c = build(symgpu, T)
    with allow_c_kernels(False):
        without_c = build(symgpu, T)
    try:
        import pytensor
        import pytensor.tensor as pt
        from pytensor.tensor.math import sigmoid, softplus
        pt.softplus, pt.sigmoid = softplus, sigmoid
        peer = build(pytensor, pt)
    except ImportError:
        peer = None
    print(f"C kernels in use: {c_kernels_enabled()}")
    print(f"{'n':>9s}{'symgpu C':>11s}{'symgpu NumPy':>14s}{'NumPy':>9s}{'PyTensor':>10s}"
          f"{'C / NumPy':>11s}   (us per call)")
    rng = np.random.RandomState(0)
    for n, number in ((400, 200), (2 ** 20, 2)):
        z = (rng.randn(n) * 5).astype("float32")
        y = rng.randint(0, 2, n).astype("float32")
        ref = numpy_chain(z, y)
        for f in (with_c, without_c):
            for got, want in zip(f(z, y), ref):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        with np.errstate(all="ignore"):
            fns = [lambda: with_c(z, y), lambda: without_c(z, y), lambda: numpy_chain(z, y)]
            if peer is not None:
                fns.append(lambda: peer(z, y))
            times = interleaved(fns, number, args.rounds if n < 10 ** 5 else args.rounds // 10)
        us = [t * 1e6 for t in times] + ([float("nan")] if peer is None else [])
        print(f"{n:9d}{us[0]:11.1f}{us[1]:14.1f}{us[2]:9.1f}{us[3]:10.1f}"
              f"{us[0] / us[2]:11.3f}")


if __name__ == "__main__":
    main()
