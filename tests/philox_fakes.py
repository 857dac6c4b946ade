"""A NumPy "device" for the Philox kernels of symgpu/gpu/ops/random.py and random_fusion.py, on
the fake context, pool and graph driver of tests/graph_fakes.py.

:func:`philox_loader` stands in for ``codegen.launch.load_kernels``: each kernel launch goes
through the fake driver as a closure over the fake device memory (``graph_fakes.MEM``), so a
capture records it and a replay runs it again, reading the generator state *at replay time*,
as the real kernels do.  The numbers come from symgpu/tensor/random/philox.py (the contract
the CUDA kernels follow), so a test can check a replayed graph against plain launches and
against NumPy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import graph_fakes as fakes
from symgpu.tensor.random import philox


def words(ptr: int, n: int, dtype: Any) -> np.ndarray:
    """The first `n` elements of fake device memory at `ptr`, viewed as `dtype` (a view)."""
    return fakes.MEM[ptr].view(dtype)[:n]


def read_state(a: Any) -> np.ndarray:
    return words(a.ptr, 4, np.uint32).copy()


def upload_state(ctx: Any, state: np.ndarray) -> Any:
    from symgpu.gpu.ops.elemwise import new_array
    a = new_array(ctx, (4,), np.dtype("uint32"))
    words(a.ptr, 4, np.uint32)[:] = np.asarray(state, dtype=np.uint32)
    return a


def _elemwise_numpy(scalar_op: Any, dtypes: list[str], arrays: list[np.ndarray]) -> list:
    """The fused scalar op applied by NumPy (Elemwise.perform), one result per output."""
    from symgpu.tensor.elemwise import Elemwise
    from symgpu.tensor.type import TensorType
    ins = [TensorType(d, (False,) * a.ndim)() for d, a in zip(dtypes, arrays)]
    node = Elemwise(scalar_op).make_node(*ins)
    out = [[None] for _ in node.outputs]
    node.op.perform(node, arrays, out)
    return [np.asarray(o[0], dtype=v.dtype) for o, v in zip(out, node.outputs)]


class _Kernel:
    def __init__(self, name: str, key: Any) -> None:
        self.name, self.key = name, key

    def fast_launcher(self):
        name, key = self.name, self.key
        launches = fakes.DRV.launch_kernel

        def go(grid, block, *args):
            if name == "sg_philox_advance":
                st, out, nblocks = args

                def k():
                    new = philox.advance(words(st, 4, np.uint32).copy(), nblocks)
                    words(out, 4, np.uint32)[:] = new
            elif name.startswith("sg_philox_ew_"):
                assert name == "sg_philox_ew_contig", "the fake device has contiguous operands"
                _, scalar_op, dtypes, scal, pos, dist, _ndim, advance = key
                st, n, ptrs = args[0], args[1], args[2:]
                n_in = len(dtypes) - 1
                if advance:           # the last pointer: the state after the draw
                    ptrs, st_next = ptrs[:-1], ptrs[-1]

                def k():
                    state = words(st, 4, np.uint32).copy()
                    draw = philox.sample(state, dist, dtypes[pos], (n,))
                    if advance:
                        words(st_next, 4, np.uint32)[:] = philox.advance(
                            state, philox.blocks(n, dtypes[pos]))
                    others = [words(p, 1 if s else n, d) for p, d, s in zip(
                        ptrs[:n_in], [d for i, d in enumerate(dtypes) if i != pos],
                        [s for i, s in enumerate(scal) if i != pos])]
                    ins = others[:pos] + [draw] + others[pos:]
                    ins = [np.broadcast_to(a, (n,)) for a in ins]
                    for p, r in zip(ptrs[n_in:], _elemwise_numpy(scalar_op, list(dtypes), ins)):
                        words(p, n, r.dtype)[:] = r
            else:                     # sg_philox_{dist}_{dtype}
                _, _, dist, dtype = name.split("_")
                st, out, n = args

                def k():
                    state = words(st, 4, np.uint32).copy()
                    words(out, n, dtype)[:] = philox.sample(state, dist, dtype, (n,))
            launches(k)
        return go


def philox_loader(context: Any, key: Any, source_factory: Any, formats: dict,
                  options: Any = ()) -> dict:
    """``codegen.launch.load_kernels`` for the fake device (the source is rendered, so
    rendering must work)."""
    source_factory()
    return {name: _Kernel(name, key) for name in formats}
