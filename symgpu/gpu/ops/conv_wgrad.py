"""A direct filter gradient for convolutions whose filter is small: an algorithm of our own
that the timed search of cuDNN's algorithms (cudnn.ConvDescs.time_algorithms) runs beside
cuDNN's and keeps where it is the fastest.

Why: for the 3-D CNN's first layer (1 input channel, x (8, 1, 32, 32, 32), dW (16, 1, 3, 3, 3),
benchmarks/library_gpu.py) every legacy ``_v7`` filter-gradient algorithm of cuDNN runs a
grouped direct kernel of 2.57 ms on the H200, 80% of the whole step.  The reduction is tiny
(K = C/groups * prod(kernel) <= 64 taps per filter, each a dot product of dy with a shifted x):
blocks (chunk, filter) keep one accumulator per tap in registers over a chunk of (image,
output position), reduce them over the block, and a second launch sums the chunks' partials
in order (no float atomics: a call's result is the same every time).  Kernels:
codegen/conv_wgrad.cu.

What it handles: 2-d and 3-d, any stride, dilation, symmetric padding (as given to cuDNN;
conv.py pads asymmetric borders explicitly), groups, filter_flip, float16/bfloat16 (accumulated
in float32) and float32/float64 (accumulated in their own type); only where K <= 64 and every
index fits an int (``eligible``).
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import storage_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel

__all__ = ["WgradDirect", "direct_wgrad", "wgrad_source", "module_kernels", "MAX_TAPS",
           "WGRAD_DTYPES"]

#: the register-array sizes the partial kernel is instantiated for (taps per filter)
KMAX = (8, 16, 32, 64)
MAX_TAPS = KMAX[-1]
#: dtype -> accumulator C type
WGRAD_DTYPES = {"float16": "float", "bfloat16": "float", "float32": "float",
                "float64": "double"}
_MODULE_KEY = ("symgpu.conv_wgrad",)
_THREADS = 256
#: blocks a launch aims at (8 resident blocks of 256 threads on each of the H200's 132 SMs)
TARGET_BLOCKS = 1024
#: the fewest (image, position) pairs a block reduces (fewer: more partials than work)
MIN_CHUNK = 4 * _THREADS
_INT_LIMIT = 2 ** 31 - 1
_GEO_FIELDS = 28
_FORMAT_PARTIAL = "PPP" + "i" * _GEO_FIELDS
_FORMAT_SUM = "PP" + "i" * _GEO_FIELDS

_CU = sections("conv_wgrad.cu")


def wgrad_source() -> str:
    """The module: every dtype's partial kernel for each KMAX, and its summing kernel."""
    parts = [common_source(), _CU[""].substitute()]
    for dt, a in WGRAD_DTYPES.items():
        t = storage_ctype(dt)
        for kmax in KMAX:
            parts.append(_CU["partial"].substitute(dt=dt, t=t, a=a, kmax=kmax))
        parts.append(_CU["sum"].substitute(dt=dt, t=t, a=a))
    return "".join(parts)


def _as3(values: Sequence[int], fill: int) -> list[int]:
    """2-d parameters as 3-d ones (a leading axis of `fill`)."""
    values = [int(v) for v in values]
    return [fill] * (3 - len(values)) + values


class WgradDirect:
    """The direct filter gradient of one geometry: launch parameters fixed at construction,
    ``workspace`` bytes of partials, ``run`` queues both launches on the context's stream."""

    def __init__(self, dtype: str, xshape: Sequence[int], wshape: Sequence[int],
                 yshape: Sequence[int], pads: Sequence[int], strides: Sequence[int],
                 dilation: Sequence[int], flip: bool, groups: int) -> None:
        self.dtype = dtype
        n, c = int(xshape[0]), int(xshape[1])
        o, cg = int(wshape[0]), int(wshape[1])
        sp, ksp, osp = _as3(xshape[2:], 1), _as3(wshape[2:], 1), _as3(yshape[2:], 1)
        st, dl, pd = _as3(strides, 1), _as3(dilation, 1), _as3(pads, 0)
        self.taps = cg * int(np.prod(ksp))
        self.kmax = next(k for k in KMAX if k >= self.taps)
        total = n * int(np.prod(osp))
        chunks = max(1, min(-(-TARGET_BLOCKS // o), -(-total // MIN_CHUNK)))
        chunk_len = -(-total // chunks)
        self.chunks = -(-total // chunk_len)
        self.filters = o
        self.geo = [n, c, o, cg, o // groups, *sp, *osp, *ksp, *st, *dl, *pd, self.taps,
                    int(bool(flip)), int(any(pd)), chunk_len, self.chunks]
        assert len(self.geo) == _GEO_FIELDS
        acc_bytes = 8 if WGRAD_DTYPES[dtype] == "double" else 4
        self.workspace = o * self.taps * self.chunks * acc_bytes
        self.partial_name = f"wgrad_partial_{dtype}_k{self.kmax}"
        self.sum_name = f"wgrad_sum_{dtype}"
        self.sum_blocks = max(1, -(-(o * self.taps) // _THREADS))

    def run(self, ctx: Any, x_ptr: int, dy_ptr: int, dw_ptr: int, ws_ptr: int) -> None:
        """dw = the filter gradient of (x, dy); ws_ptr: ``workspace`` bytes (partials)."""
        partial = get_prepared_kernel(_MODULE_KEY, wgrad_source, self.partial_name,
                                      _FORMAT_PARTIAL, context=ctx)
        total = get_prepared_kernel(_MODULE_KEY, wgrad_source, self.sum_name, _FORMAT_SUM,
                                    context=ctx)
        partial.prepared_async_call((self.chunks, self.filters), (_THREADS, 1, 1), ctx.stream,
                                    x_ptr, dy_ptr, ws_ptr, *self.geo)
        total.prepared_async_call((self.sum_blocks, 1), (_THREADS, 1, 1), ctx.stream, ws_ptr,
                                  dw_ptr, *self.geo)


def direct_wgrad(dtype: str, xshape: Sequence[int], wshape: Sequence[int],
                 yshape: Sequence[int], pads: Sequence[int], strides: Sequence[int],
                 dilation: Sequence[int], flip: bool, groups: int) -> WgradDirect | None:
    """The direct filter gradient of this geometry, or None where it does not apply: a dtype
    it has no kernel for, more than MAX_TAPS taps per filter, 2 or 3 spatial axes only, an
    index beyond an int, or a grid it cannot launch (more than 65535 filters)."""
    if dtype not in WGRAD_DTYPES or len(xshape) not in (4, 5):
        return None
    taps = int(wshape[1]) * int(np.prod([int(k) for k in wshape[2:]]))
    if not 0 < taps <= MAX_TAPS or not 0 < int(wshape[0]) <= 65535:
        return None
    sizes = (int(np.prod(xshape, dtype=object)), int(np.prod(yshape, dtype=object)),
             int(np.prod(wshape, dtype=object)) * TARGET_BLOCKS)
    padded = [int(s) + 2 * int(p) + int(d) * int(k) + int(st)
              for s, p, d, k, st in zip(xshape[2:], pads, dilation, wshape[2:], strides)]
    if max(*sizes, *padded) + _THREADS * 2 >= _INT_LIMIT or 0 in sizes:
        return None
    return WgradDirect(dtype, xshape, wshape, yshape, pads, strides, dilation, flip, groups)


def module_kernels() -> list[str]:
    """Every kernel name of the module (the nvcc test checks they are all in the cubin)."""
    return [f"wgrad_partial_{dt}_k{k}" for dt, k in itertools.product(WGRAD_DTYPES, KMAX)] + \
        [f"wgrad_sum_{dt}" for dt in WGRAD_DTYPES]
