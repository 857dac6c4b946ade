"""Per-call overhead on the CPU, measured side by side in one run.

Prints: the per-call time of a compiled trivial function (goal: under 10 us), and the seeds'
check1 per-call time (exp over 230,400 float32 values held in a shared variable) as a ratio
to `numpy.exp` on the same array (goal: at most 1.1x).

`--against PATH` compares the call overhead of this checkout with another one (e.g. a
`git worktree` of an older commit): the three small functions below (`CALLS`) are timed in
child processes, this checkout's and PATH's in alternation, and the best per-call time of
each over all rounds is printed with the ratio this / other. Processes, not threads of one
interpreter, so each checkout imports its own symgpu; alternation so that the shared
machine's drift hits both alike.
"""
from __future__ import annotations

import argparse
import json
import os
import timeit

import numpy as np

#: the functions whose per-call overhead --against compares: (label, what it compiles)
CALLS = [
    ("trivial function([x], x)", "trivial"),
    ("shared+1 function([], s + 1)", "shared_plus_one"),
    ("update-only function([], updates=[(s, s + 1)])", "update_only"),
    # the same two without a constant operand (a one-input ufunc): the call path's own cost
    ("negated shared function([], -s)", "shared_neg"),
    ("update-only function([], updates=[(s, -s)])", "update_neg"),
    ("ten updates function([], updates=[(s_k, -s_k)])", "ten_updates"),
]


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


def small_functions() -> dict:
    """The compiled functions of CALLS, as zero-argument callables (float32, on the CPU)."""
    import symgpu.tensor as T
    from symgpu import config, function, shared
    with config.change_flags(floatX="float32", device="cpu"):
        x = T.fvector("x")
        trivial = function([x], x)
        small = np.ones(4, dtype="float32")
        s = shared(np.ones(4, dtype="float32"))
        u = shared(np.ones(4, dtype="float32"))
        update = function([], updates=[(u, u + 1)])
        v = shared(np.ones(4, dtype="float32"))
        ten = [shared(np.ones(4, dtype="float32")) for _ in range(10)]
        return {"trivial": lambda: trivial(small),
                "shared_plus_one": function([], s + 1),
                "update_only": update,
                "shared_neg": function([], -s),
                "update_neg": function([], updates=[(v, -v)]),
                "ten_updates": function([], updates=[(t, -t) for t in ten])}


def child(number: int, repeat: int) -> None:
    """Print the best per-call seconds of each of CALLS as one JSON line (for --against)."""
    fns = small_functions()
    print(json.dumps({key: per_call(fns[key], number, repeat) for _, key in CALLS}))


def against(other: str, rounds: int, number: int, repeat: int) -> None:
    """Time CALLS in this checkout and in `other`, alternating child processes."""
    from timing import alternate_checkouts, report_checkouts
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = os.path.abspath(other)
    best = alternate_checkouts(__file__, here, other, rounds,
                               ["--number", str(number), "--repeat", str(repeat)])
    report_checkouts(best, here, other, CALLS,
                     f"best of {rounds} processes x {repeat} x {number} calls each, per call:")


def main() -> None:
    import symgpu.tensor as T
    from symgpu import config, function, shared
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="PATH",
                        help="compare call overhead with the checkout at PATH")
    parser.add_argument("--rounds", type=int, default=10, help="child processes per checkout")
    parser.add_argument("--number", type=int, default=20000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings per child process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.number, opts.repeat)
    elif opts.against:
        against(opts.against, opts.rounds, opts.number, opts.repeat)
    else:
        main()
