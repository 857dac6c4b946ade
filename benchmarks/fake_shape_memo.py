"""The runner's shape memo (symgpu/gpu/exec/shape_memo.py) on the host path, without a GPU:
a replayed CUDA graph (the runner tests' fake driver, tests/graph_fakes.py) whose slice
bounds come from host arithmetic on the shapes of ten host matrices (40 host nodes, about
the 43 of benchmarks/half_symgpu.py's GPT block), called with the memo on and off in
alternation.  Not a test: a figure for the notes.

    python3 benchmarks/fake_shape_memo.py
"""
from __future__ import annotations

import os
import sys
import timeit

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))


def build(memo: bool):
    """The function's VM, its graph captured and replaying."""
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
    hs = [TensorType("float32", (False, False))() for _ in range(10)]
    total = as_tensor_variable(np.asarray(0, "int64"))
    for h in hs:    # 4 nodes a matrix: two lengths, their product, the running sum
        total = add(total, mul(Shape_i(0)(h), Shape_i(1)(h)))
    y = fakes.add1()(fakes.FakeDynSlice()(x, total, add(total, as_tensor_variable(
        np.asarray(4, "int64")))))
    fg = FunctionGraph([x, *hs], [y], clone=False)
    fg.update_mapping = {}
    values = [fakes.upload(fakes.CTX_OBJ, np.arange(64, dtype="float32"))] + \
        [np.zeros((1, 1), "float32")] * 10
    shape_memo.ENABLED = memo
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {v: [a] for v, a in zip(fg.inputs, values)}, allow_gc=True)
    shape_memo.ENABLED = True

    def run():
        vm()
        vm.storage_map[y][0] = None
    for _ in range(5):
        run()
    return run


def main() -> None:
    import graph_fakes as fakes

    class Patch:
        @staticmethod
        def setattr(obj, name, value):
            setattr(obj, name, value)
    next(fakes.use_fake_gpu(Patch()))
    calls = {"memo on": build(True), "memo off": build(False)}
    best = {k: float("inf") for k in calls}
    for _ in range(15):
        for k, f in calls.items():
            best[k] = min(best[k], timeit.timeit(f, number=2000) / 2000)
    for k, t in best.items():
        print(f"{k}: {t * 1e6:.2f} us a call (best of 15 x 2000, fake driver)")


if __name__ == "__main__":
    main()
