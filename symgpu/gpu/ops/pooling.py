"""GPU 2-d pooling with Theano's semantics, by kernels of our own: GpuPool, GpuMaxPoolGrad,
GpuAveragePoolGrad, GpuMaxPoolGradGrad and their lifters from symgpu/tensor/signal/pool.py.

Why not cuDNN's pooling: Theano's Pool keeps partial windows (ignore_border=False), has a
'sum' mode and gives a max window's gradient to every element equal to the max; cuDNN does
none of these. The kernels are one thread per output (forward, grad-grad) or per input element
(gradients, a gather over the windows that contain it: deterministic, no atomics), over a
C-contiguous (L, H, W) view of the input (L = the product of the leading axes).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.codegen import sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.graph.basic import Apply
from symgpu.tensor.signal.pool import (AveragePoolGrad, MaxPoolGrad, MaxPoolGradGrad, Pool,
                                       _PoolBase)
from symgpu.tensor.signal.pool_numpy import MODES, pool_out_len

__all__ = ["GpuPool", "GpuMaxPoolGrad", "GpuAveragePoolGrad", "GpuMaxPoolGradGrad",
           "pooling_source", "POOL_DTYPES", "index_suffix"]

POOL_DTYPES = {"float32": "float", "float64": "double"}
_MODULE_KEY = ("symgpu.pooling",)
_BLOCK = 256

_CU = sections("pooling.cu")   # the pooling bodies, then the entry points

_GEO = ("long long L, long long H, long long W, long long ho, long long wo, long long ws0, "
        "long long ws1, long long st0, long long st1, long long p0, long long p1")
_MAKE = "PoolGeo<{i}> g = {{({i})L, ({i})H, ({i})W, ({i})ho, ({i})wo, ({i})ws0, ({i})ws1, " \
        "({i})st0, ({i})st1, ({i})p0, ({i})p1}};"
_FORMATS = {"fwd": "PP" + "q" * 11 + "i", "grad": "PPPP" + "q" * 11 + "i",
            "ggrad": "PPPP" + "q" * 11}
#: index types: kernel name suffix -> C type (``_i32`` where every index fits an int)
_INDEX = {"": "long long", "_i32": "int"}
_INT32_LIMIT = 2 ** 31 - 1


def pooling_source() -> str:
    parts = [_CU[""].substitute()]
    for (dt, t), (sfx, i) in itertools.product(POOL_DTYPES.items(), _INDEX.items()):
        for kind in ("fwd", "grad", "ggrad"):
            parts.append(_CU[kind].substitute(dt=dt, t=t, sfx=sfx, i=i, geo=_GEO,
                                              make=_MAKE.format(i=i)))
    return "".join(parts)


def index_suffix(geo: list[int]) -> str:
    """'_i32' when every index a pooling kernel computes for `geo` fits an int (with room for
    the grid-stride loop's last step): the input's and the output's element counts and the
    padded window extents."""
    lead, h, w, ho, wo, ws0, ws1, st0, st1, p0, p1 = geo
    biggest = max(lead * h * w, lead * ho * wo, (ho + 1) * st0 + ws0 + p0,
                  (wo + 1) * st1 + ws1 + p1, h + p0 + ws0, w + p1 + ws1)
    return "_i32" if biggest + 65535 * 256 < _INT32_LIMIT else ""


def _packed(a: Any) -> Any:
    return a if a.is_c_contiguous else a.copy()


class _GpuPoolBase(_PoolBase):
    """What the GPU pooling ops share: their thunk (a launch on the context's stream)."""

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, pooling_source, ())]

    def _gpu(self, v: Any, ctx_name: Any, what: str) -> Any:
        v = as_gpuarray_variable(v, ctx_name)
        if v.ndim < 2 or v.dtype not in POOL_DTYPES:
            raise TypeError(f"{self}: {what} must be a float32/float64 GPU array of 2 or more "
                            f"dimensions, got {v.type}")
        return v

    @staticmethod
    def _ctx_name(*vs: Any) -> Any:
        return next((v.type.context_name for v in vs if is_gpu_var(v)), None)

    def geo(self, shape: tuple) -> list[int]:
        h, w = shape[-2:]
        ho = pool_out_len(h, self.ws[0], self.stride[0], self.pad[0], self.ignore_border)
        wo = pool_out_len(w, self.ws[1], self.stride[1], self.pad[1], self.ignore_border)
        lead = int(np.prod(shape[:-2], dtype=np.int64))
        return [lead, h, w, ho, wo, self.ws[0], self.ws[1], self.stride[0], self.stride[1],
                self.pad[0], self.pad[1]]

    def _launch(self, ctx: Any, kind: str, dtype: str, total: int, ptrs: tuple,
                geo: list[int], mode: int | None = None) -> None:
        """One launch of `kind` over `total` threads: (pointers, geometry, mode if any)."""
        if total:
            blocks = max(1, min(65535, -(-total // _BLOCK)))
            tail = () if mode is None else (mode,)
            self._function(ctx, kind, dtype, index_suffix(geo)).prepared_async_call(
                (blocks, 1), (_BLOCK, 1, 1), ctx.stream, *ptrs, *geo, *tail)

    def _function(self, ctx: Any, kind: str, dtype: str, suffix: str) -> Any:
        """The prepared kernel of `kind` (symgpu/gpu/ops/pooling_epilogue.py has its own)."""
        return get_prepared_kernel(_MODULE_KEY, pooling_source, f"pool_{kind}_{dtype}{suffix}",
                                   _FORMATS[kind], context=ctx)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        out_cell = storage_map[node.outputs[0]]
        dtype = node.inputs[0].dtype   # x's, the kernels' dtype: resolved once, here

        def thunk() -> None:
            ctx.activate()
            out_cell[0] = self._run(ctx, [_packed(c[0]) for c in cells], dtype)

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        return thunk

    def _check_out(self, x: Any, other: Any, geo: list[int], what: str) -> None:
        want = tuple(x.shape[:-2]) + (geo[3], geo[4])
        if tuple(other.shape) != want:
            raise ValueError(f"{self}: {what} has shape {other.shape}, expected {want} for an "
                             f"input of shape {x.shape}")


class GpuPool(_GpuPoolBase):
    """Pool on the GPU."""

    infer_shape = Pool.infer_shape

    def make_node(self, x: Any) -> Apply:
        x = self._gpu(x, self._ctx_name(x), "input")
        bc = x.broadcastable[:-2] + (False, False)
        return Apply(self, [x], [GpuArrayType(x.dtype, bc, x.type.context_name)()])

    def _run(self, ctx, inputs, dtype):
        (x,) = inputs
        geo = self.geo(x.shape)
        z = new_array(ctx, tuple(x.shape[:-2]) + (geo[3], geo[4]), x.dtype)
        self._launch(ctx, "fwd", dtype, z.size if x.size else 0, (x.ptr, z.ptr), geo,
                     MODES.index(self.mode))
        if z.size and not x.size:
            z.fill(0)
        return z


class GpuMaxPoolGrad(_GpuPoolBase):
    """MaxPoolGrad on the GPU: (x, maxout, gz) -> gx."""

    infer_shape = MaxPoolGrad.infer_shape

    def make_node(self, x: Any, maxout: Any, gz: Any) -> Apply:
        ctx = self._ctx_name(x, maxout, gz)
        x = self._gpu(x, ctx, "input")
        maxout, gz = self._gpu(maxout, ctx, "maxout"), self._gpu(gz, ctx, "output gradient")
        if not x.dtype == maxout.dtype == gz.dtype:
            raise TypeError(f"{self}: x, maxout and gz need one dtype")
        return Apply(self, [x, maxout, gz], [x.type()])

    def _run(self, ctx, inputs, dtype):
        x, z, gz = inputs
        geo = self.geo(x.shape)
        self._check_out(x, z, geo, "maxout")
        self._check_out(x, gz, geo, "the output gradient")
        gx = new_array(ctx, tuple(x.shape), x.dtype)
        self._launch(ctx, "grad", dtype, gx.size, (x.ptr, z.ptr, gz.ptr, gx.ptr), geo, 0)
        return gx


class GpuAveragePoolGrad(_GpuPoolBase):
    """AveragePoolGrad on the GPU ('sum' and both averages): (x, gz) -> gx."""

    infer_shape = AveragePoolGrad.infer_shape

    def make_node(self, x: Any, gz: Any) -> Apply:
        ctx = self._ctx_name(x, gz)
        x, gz = self._gpu(x, ctx, "input"), self._gpu(gz, ctx, "output gradient")
        if x.dtype != gz.dtype:
            raise TypeError(f"{self}: x and gz need one dtype")
        return Apply(self, [x, gz], [x.type()])

    def _run(self, ctx, inputs, dtype):
        x, gz = inputs
        geo = self.geo(x.shape)
        self._check_out(x, gz, geo, "the output gradient")
        gx = new_array(ctx, tuple(x.shape), x.dtype)
        self._launch(ctx, "grad", dtype, gx.size, (x.ptr, gz.ptr, gz.ptr, gx.ptr), geo,
                     MODES.index(self.mode))
        return gx


class GpuMaxPoolGradGrad(_GpuPoolBase):
    """MaxPoolGradGrad on the GPU: (x, maxout, ggx) -> ggz."""

    infer_shape = MaxPoolGradGrad.infer_shape

    def make_node(self, x: Any, maxout: Any, ggx: Any) -> Apply:
        ctx = self._ctx_name(x, maxout, ggx)
        x, maxout, ggx = (self._gpu(v, ctx, w) for v, w in
                          ((x, "input"), (maxout, "maxout"), (ggx, "ggx")))
        return Apply(self, [x, maxout, ggx], [maxout.type()])

    def _run(self, ctx, inputs, dtype):
        x, z, ggx = inputs
        geo = self.geo(x.shape)
        self._check_out(x, z, geo, "maxout")
        ggz = new_array(ctx, tuple(z.shape), x.dtype)
        self._launch(ctx, "ggrad", dtype, ggz.size if x.size else 0,
                     (x.ptr, z.ptr, ggx.ptr, ggz.ptr), geo)
        if ggz.size and not x.size:
            ggz.fill(0)
        return ggz


# ----------------------------------------------------------------------------- lifters

def _floats(*vs: Any) -> bool:
    return len({v.dtype for v in vs}) == 1 and vs[0].dtype in POOL_DTYPES


@register_lifter(Pool)
def lift_pool(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    if not _floats(node.inputs[0]):
        return None
    return [GpuPool(**op.params())(inputs[0])]


@register_lifter(MaxPoolGrad)
def lift_max_pool_grad(op: Any, node: Apply, context_name: Any,
                       inputs: Any) -> list[Any] | None:
    if not _floats(*node.inputs):
        return None
    return [GpuMaxPoolGrad(**op.params())(*inputs)]


@register_lifter(AveragePoolGrad)
def lift_average_pool_grad(op: Any, node: Apply, context_name: Any,
                           inputs: Any) -> list[Any] | None:
    if not _floats(*node.inputs):
        return None
    return [GpuAveragePoolGrad(**op.params())(*inputs)]


@register_lifter(MaxPoolGradGrad)
def lift_max_pool_grad_grad(op: Any, node: Apply, context_name: Any,
                            inputs: Any) -> list[Any] | None:
    if not _floats(*node.inputs):
        return None
    return [GpuMaxPoolGradGrad(**op.params())(*inputs)]
