"""The runner's shape memo (symgpu/gpu/exec/shape_memo.py) on the host path, without a GPU:
a replayed CUDA graph (the runner tests' fake driver, tests/graph_fakes.py) whose slice
bounds come from host arithmetic on the shapes of ten host matrices (40 host nodes, about
the 43 of benchmarks/half_symgpu.py's GPT block), called with the memo on and off in
alternation.  Not a test: a figure for the notes.

    python3 benchmarks/fake_shape_memo.py

Rows: the benchmark's call (the same shapes every call); the same with GPU matrices, whose
shapes a GPU step reads with ``GpuShape_i`` (the memo took only host ``Shape_i`` until
2026-11-30, so on the H200 it took nothing of the GPT step; this row would have shown it);
with an index input and a
learning rate (a Python float) changed every call; with results held across calls; with
shapes that change every call (the memo misses every time: a new length per call); and two
threads calling the same function.
"""
from __future__ import annotations

import os
import sys
import timeit

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))


def build(memo: bool, variant: str = "same shapes"):
    """A call of the function's VM (``variant``: see the module docstring), its graph
    captured and replaying."""
    import graph_fakes as fakes
    from symgpu.config import config
    from symgpu.gpu.exec import shape_memo
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.tensor.elemwise import Elemwise
    from symgpu.tensor.shape import Shape_i
    from symgpu.tensor.type import TensorType, as_tensor_variable
    add, mul = Elemwise(SCALAR_OPS["add"]), Elemwise(SCALAR_OPS["mul"])
    x = fakes.gvec()
    on_gpu = variant == "GPU matrices' shapes"
    if on_gpu:      # the shapes a GPU step reads: GpuShape_i of GPU inputs (shared variables)
        from symgpu.gpu.placement.basic_ops import GpuShape_i as shape_i
        from symgpu.gpu.placement.type import GpuArrayType
        hs = [GpuArrayType("float32", (False, False), fakes.CTX)() for _ in range(10)]
    else:
        shape_i = Shape_i
        hs = [TensorType("float32", (False, False))() for _ in range(10)]
    total = as_tensor_variable(np.asarray(0, "int64"))
    for h in hs:    # 4 nodes a matrix: two lengths, their product, the running sum
        total = add(total, mul(shape_i(0)(h), shape_i(1)(h)))
    k, lr = TensorType("int64", ())(), TensorType("float32", ())()
    start = add(total, k)
    sl = fakes.FakeDynSlice()(x, start, add(start, as_tensor_variable(np.asarray(4, "int64"))))
    y = fakes.FakeKernelOp("mul", lambda a, b: a * b)(sl, fakes.FakeScalarUp(4)(lr))
    fg = FunctionGraph([x, k, lr, *hs], [y], clone=False)
    fg.update_mapping = {}
    matrix = fakes.upload(fakes.CTX_OBJ, np.zeros((1, 1))) if on_gpu else \
        np.zeros((1, 1), "float32")
    values = [fakes.upload(fakes.CTX_OBJ, np.arange(64, dtype="float32")), 0, 0.5] + \
        [matrix] * 10
    shape_memo.ENABLED = memo
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {v: [a] for v, a in zip(fg.inputs, values)}, allow_gc=True)
    shape_memo.ENABLED = True

    cells = vm.storage_map
    kc, lc, h0 = cells[k], cells[lr], cells[hs[0]]
    held: list = []
    step = [0]
    shapes = [np.zeros((1, 1), "float32"), np.zeros((1, 2), "float32")]

    def run():
        step[0] += 1
        if variant == "index and learning rate":
            kc[0], lc[0] = step[0] % 7, 0.5 + step[0] % 3
        elif variant == "new shapes every call":
            h0[0] = shapes[step[0] % 2]
        vm()
        if variant == "results held":
            held.append(cells[y][0])
            if len(held) > 4:
                held.pop(0)
        cells[y][0] = None
    for _ in range(12):
        run()
    return run


def _threads(f, number: int) -> float:
    """Seconds a call with two threads calling ``f`` (each number / 2 calls)."""
    import threading
    ts = [threading.Thread(target=lambda: [f() for _ in range(number // 2)]) for _ in range(2)]
    t0 = timeit.default_timer()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return (timeit.default_timer() - t0) / number


def main() -> None:
    import graph_fakes as fakes

    class Patch:
        @staticmethod
        def setattr(obj, name, value):
            setattr(obj, name, value)
    next(fakes.use_fake_gpu(Patch()))
    for variant in ("same shapes", "GPU matrices' shapes", "index and learning rate",
                    "results held", "new shapes every call", "two threads"):
        calls = {memo: build(memo, variant if variant != "two threads" else "same shapes")
                 for memo in (True, False)}
        best = {memo: float("inf") for memo in calls}
        for _ in range(9):
            for memo, f in calls.items():
                t = _threads(f, 2000) if variant == "two threads" else \
                    timeit.timeit(f, number=2000) / 2000
                best[memo] = min(best[memo], t)
        print(f"{variant:24s} memo on {best[True] * 1e6:6.2f} us a call, off "
              f"{best[False] * 1e6:6.2f} us (best of 9 x 2000, fake driver)")


if __name__ == "__main__":
    main()
