"""Issue 19's `check1, result on the device` row without a GPU: the host cost of one call of a
one-kernel GPU function replaying its CUDA graph, the driver replaced by the runner tests'
fake (tests/graph_fakes.py: a "kernel" is a NumPy closure over a 4-element array, the same in
both checkouts), this checkout against another one in alternating processes.

    python3 benchmarks/fake_gpu_call_path.py --against /path/to/other/checkout
    python3 benchmarks/fake_gpu_call_path.py --profile     # cProfile of this checkout's calls
    python3 benchmarks/fake_gpu_call_path.py --against PATH --variants
        # also an index input, a Python-float shared variable, results held, another thread
    python3 benchmarks/fake_gpu_call_path.py --against PATH --null-launch
        # the replay's launch a C no-op: only symgpu's own Python per call is timed (the
        # fake kernel, a NumPy closure of ~2 us, no longer hides the difference)

On the GPU machine gpu_call_overhead.py measures the real row; this one lets a session with no
device time see the same Python path change (2026-11-28: the fake reproduced the real row's
gap to c10bea3, 4.37 against 4.00 us here, 3.92 against 3.38 us on an H200; on
2026-11-28 at 370cefc, 4.01 against 4.07 here, 1.46 against 1.57 with --null-launch, yet
3.64 against 3.13 us on the H200: what remains of that row is not on this Python path; it
was ctypes' call of cuGraphLaunch, which the fake does not make: through the C runtime's
call_pp since 2026-11-28, the H200 row is 2.82 against 3.15 us).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import timeit

import numpy as np


def one_kernel_function(variant: str = "shared"):
    """function([], Out(add1(x), borrow=True)) over a GPU shared x on the fake context, its
    graph captured and replaying, the context current in this thread (as on a GPU).  Other
    spellings (``variant``): "index", x[i:i + 2] for an int input i that changes every call
    (a graph parameter); "float_lr", x * lr for a Python-float shared lr (a host scalar
    upload, a parameter too); "held", the results of the last three calls kept alive.
    Returns a callable of no argument."""
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import graph_fakes as fakes
    try:                                    # the layout since the gpu/ package was split
        from symgpu.gpu.runtime import context as gctx
        from symgpu.gpu.placement.type import GpuArrayType, GpuArraySharedVariable
    except ImportError:                     # c10bea3's layout
        from symgpu.gpu import context as gctx
        from symgpu.gpu.type import GpuArrayType, GpuArraySharedVariable
    from symgpu import Out, function
    from symgpu.compile.sharedvalue import Container

    class Patch:                            # what the tests' monkeypatch does, for good
        @staticmethod
        def setattr(obj, name, value):
            setattr(obj, name, value)

    ctx = next(fakes.use_fake_gpu(Patch()))
    state = getattr(gctx, "thread_state", getattr(gctx, "_tls", None))
    state.current = ctx
    t = GpuArrayType("float32", (False,), fakes.CTX)
    arr = fakes.upload(ctx, np.ones(4, "float32"))
    x = GpuArraySharedVariable(t, arr, name="x", container=Container(t, arr, "x"))
    if variant == "index":
        import symgpu.tensor as T
        i = T.lscalar("i")
        g = function([i], Out(fakes.add1()(fakes.FakeDynSlice()(x, i, i + 2)), borrow=True))
        idx = iter(np.arange(10 ** 8) % 2)
        f = lambda: g(next(idx))  # noqa: E731
    elif variant == "float_lr":
        from symgpu import shared
        lr = shared(0.5, name="lr")
        mul = fakes.FakeKernelOp("mul", lambda a, b: a * b)
        f = function([], Out(mul(x, fakes.FakeScalarUp(4)(lr)), borrow=True))
    elif variant == "held":
        g = function([], fakes.add1()(x))
        kept: list = [None, None, None]

        def f():
            kept.append(g())
            del kept[0]
    else:
        f = function([], Out(fakes.add1()(x), borrow=True))
    for _ in range(5):                      # plain, capture, replays
        f()
    return f


VARIANTS = [("one-kernel GPU call, fake driver", "shared"),
            ("x[i:i + 2], an index input per call", "index"),
            ("x * lr, a Python-float shared variable", "float_lr"),
            ("results of the last three calls held", "held"),
            ("one-kernel call from a second thread", "thread")]


def null_launches(f) -> None:
    """Make every captured graph of ``f`` launch a C no-op returning status 0."""
    import functools
    for seg in getattr(f.vm.runner, "steps", ()):
        for graphs in getattr(seg, "graphs", {}).values():
            for g in graphs:
                g.launch = functools.partial(int, 0)


def child(number: int, repeat: int, profile: bool, null_launch: bool = False,
          variants: bool = False) -> None:
    f = one_kernel_function()
    if null_launch:
        null_launches(f)
    if profile:
        from timing import profile_calls
        profile_calls(f, number)
        return
    out = {"call": min(timeit.repeat(f, number=number, repeat=repeat)) / number}
    if variants:
        import threading
        for _, name in VARIANTS[1:]:
            if name == "thread":    # the shared-variable call, made from another thread
                got: list = []
                t = threading.Thread(target=lambda: got.append(
                    min(timeit.repeat(f, number=number, repeat=repeat)) / number))
                t.start()
                t.join()
                out[name] = got[0]
            else:
                g = one_kernel_function(name)
                out[name] = min(timeit.repeat(g, number=number, repeat=repeat)) / number
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="PATH", help="the other checkout")
    parser.add_argument("--rounds", type=int, default=6, help="child processes per checkout")
    parser.add_argument("--number", type=int, default=50000, help="calls per timed block")
    parser.add_argument("--repeat", type=int, default=7, help="timed blocks per process")
    parser.add_argument("--profile", action="store_true", help="profile this checkout's calls")
    parser.add_argument("--null-launch", action="store_true",
                        help="replays launch a C no-op: time symgpu's Python alone")
    parser.add_argument("--variants", action="store_true",
                        help="also the spellings users write: an index input, a Python-float "
                             "shared variable, results held across calls, another thread")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.number, opts.repeat, opts.profile, opts.null_launch, opts.variants)
        return
    from timing import alternate_checkouts, report_checkouts, run_checkout
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["--number", str(opts.number), "--repeat", str(opts.repeat)] + \
        (["--null-launch"] if opts.null_launch else []) + \
        (["--variants"] if opts.variants else [])
    if opts.profile:
        run_checkout(__file__, here, [*args, "--profile"])
        return
    other = os.path.abspath(opts.against or here)
    best = alternate_checkouts(__file__, here, other, opts.rounds, args)
    rows = [(VARIANTS[0][0], "call")] + (VARIANTS[1:] if opts.variants else [])
    report_checkouts(best, here, other, rows,
                     f"best of {opts.rounds} processes x {opts.repeat} x {opts.number} calls:")


if __name__ == "__main__":
    main()
