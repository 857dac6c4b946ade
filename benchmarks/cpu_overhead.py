"""Per-call overhead on the CPU, measured side by side in one run.

Prints: the per-call time of a compiled trivial function (goal: under 10 us), and the seeds'
check1 per-call time (exp over 230,400 float32 values held in a shared variable) as a ratio
to `numpy.exp` on the same array (goal: at most 1.1x).
"""
import timeit

import numpy as np

import symgpu.tensor as T
from symgpu import config, function, shared


def per_call(fn, number: int, repeat: int = 7) -> float:
    """Best-of-`repeat` seconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def interleaved(fns: list, number: int, rounds: int = 25) -> list[float]:
    """Best seconds per call of each function, timed in alternation so that drift in the
    machine's load (other processes, frequency) hits every contender alike."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            best[k] = min(best[k], timeit.timeit(fn, number=number) / number)
    return best


def main() -> None:
    with config.change_flags(floatX="float32", device="cpu"):
        x = T.fvector("x")
        trivial = function([x], x)
        small = np.ones(4, dtype="float32")
        t_trivial = per_call(lambda: trivial(small), 20000)

        s = shared(np.ones(4, dtype="float32"))
        no_args = function([], s + 1)
        t_no_args = per_call(no_args, 20000)

        vlen = 10 * 30 * 768
        rng = np.random.RandomState(22)
        data = np.asarray(rng.rand(vlen), "float32")
        xs = shared(data)
        check1 = function([], T.exp(xs))
        t_check1, t_numpy = interleaved([check1, lambda: np.exp(data)], 100)

    print(f"trivial function f(x)=x, per call:        {t_trivial * 1e6:8.2f} us  (goal < 10 us)")
    print(f"f()=shared+1 (4 floats), per call:        {t_no_args * 1e6:8.2f} us")
    print(f"check1 exp(230400 float32), per call:     {t_check1 * 1e6:8.2f} us")
    print(f"numpy.exp on the same array, per call:    {t_numpy * 1e6:8.2f} us")
    print(f"check1 / numpy ratio:                     {t_check1 / t_numpy:8.3f}x  (goal <= 1.1x)")


if __name__ == "__main__":
    main()
