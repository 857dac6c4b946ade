"""GPU 2-d and 3-d pooling with Theano's semantics, by kernels of our own: GpuPool,
GpuMaxPoolGrad, GpuAveragePoolGrad, GpuMaxPoolGradGrad, their 3-d twins GpuPool3d,
GpuMaxPoolGrad3d, GpuAveragePoolGrad3d, GpuMaxPoolGradGrad3d and their lifters from
symgpu/tensor/signal/pool.py.

Why not cuDNN's pooling: Theano's Pool keeps partial windows (ignore_border=False), has a
'sum' mode and gives a max window's gradient to every element equal to the max; cuDNN does
none of these. The kernels are one thread per output (forward, grad-grad) or per input element
(gradients, a gather over the windows that contain it: deterministic, no atomics), over a
C-contiguous (L, H, W) -- 3-d: (L, D, H, W) -- view of the input (L = the product of the
leading axes).  The 3-d kernels (``pool3_*``) are a module of their own (pooling3d_source), so
the 2-d module is unchanged; the ops' Python is one code over `nd`, as in the CPU Ops.
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
from symgpu.tensor.signal.pool import (AveragePoolGrad, AveragePoolGrad3d, MaxPoolGrad,
                                       MaxPoolGrad3d, MaxPoolGradGrad, MaxPoolGradGrad3d, Pool,
                                       Pool3d, _PoolBase)
from symgpu.tensor.signal.pool_numpy import MODES, pool_out_len

__all__ = ["GpuPool", "GpuMaxPoolGrad", "GpuAveragePoolGrad", "GpuMaxPoolGradGrad",
           "GpuPool3d", "GpuMaxPoolGrad3d", "GpuAveragePoolGrad3d", "GpuMaxPoolGradGrad3d",
           "pooling_source", "pooling3d_source", "POOL_DTYPES", "index_suffix"]

POOL_DTYPES = {"float32": "float", "float64": "double"}
_MODULE_KEY = ("symgpu.pooling",)
_MODULE_KEY3 = ("symgpu.pooling3d",)
_BLOCK = 256

_CU = sections("pooling.cu")   # the pooling bodies, then the entry points

_GEO = ("long long L, long long H, long long W, long long ho, long long wo, long long ws0, "
        "long long ws1, long long st0, long long st1, long long p0, long long p1")
_MAKE = "PoolGeo<{i}> g = {{({i})L, ({i})H, ({i})W, ({i})ho, ({i})wo, ({i})ws0, ({i})ws1, " \
        "({i})st0, ({i})st1, ({i})p0, ({i})p1}};"
_FORMATS = {"fwd": "PP" + "q" * 11 + "i", "grad": "PPPP" + "q" * 11 + "i",
            "ggrad": "PPPP" + "q" * 11}
_GEO3 = ", ".join(f"long long {n}" for n in (
    "L", "D", "H", "W", "od", "oh", "ow", "ws0", "ws1", "ws2", "st0", "st1", "st2", "p0", "p1",
    "p2"))
_MAKE3 = ("PoolGeo3<{i}> g = {{({i})L, ({i})D, ({i})H, ({i})W, ({i})od, ({i})oh, ({i})ow, "
          "({i})ws0, ({i})ws1, ({i})ws2, ({i})st0, ({i})st1, ({i})st2, ({i})p0, ({i})p1, "
          "({i})p2}};")
_FORMATS3 = {"fwd": "PP" + "q" * 16 + "i", "grad": "PPPP" + "q" * 16 + "i",
             "gradt": "PPPP" + "q" * 16 + "i", "ggrad": "PPPP" + "q" * 16}
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


def pooling3d_source() -> str:
    """The 3-d kernels' module: the shared prelude, the 3-d bodies, their entry points."""
    parts = [_CU[""].substitute(), _CU["body3"].substitute()]
    for (dt, t), (sfx, i) in itertools.product(POOL_DTYPES.items(), _INDEX.items()):
        for kind in ("fwd", "grad", "gradt", "ggrad"):
            parts.append(_CU[kind + "3"].substitute(dt=dt, t=t, sfx=sfx, i=i, geo=_GEO3,
                                                    make=_MAKE3.format(i=i)))
    return "".join(parts)


def index_suffix(geo: list[int]) -> str:
    """'_i32' when every index a pooling kernel computes for `geo` fits an int (with room for
    the grid-stride loop's last step): the input's and the output's element counts and the
    padded window extents.  `geo`: [L, *input spatial, *output spatial, *ws, *stride, *pad]
    (2 or 3 spatial axes: 11 or 16 entries)."""
    nd = (len(geo) - 1) // 5
    lead = geo[0]
    n, o, ws, st, p = (geo[1 + k * nd:1 + (k + 1) * nd] for k in range(5))
    biggest = max(lead * int(np.prod(n, dtype=object)), lead * int(np.prod(o, dtype=object)),
                  *((o[a] + 1) * st[a] + ws[a] + p[a] for a in range(nd)),
                  *(n[a] + p[a] + ws[a] for a in range(nd)))
    return "_i32" if biggest + 65535 * 256 < _INT32_LIMIT else ""


def _packed(a: Any) -> Any:
    return a if a.is_c_contiguous else a.copy()


class _GpuPoolBase(_PoolBase):
    """What the GPU pooling ops share: their thunk (a launch on the context's stream)."""

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        if self.nd == 3:
            return [(_MODULE_KEY3, pooling3d_source, ())]
        return [(_MODULE_KEY, pooling_source, ())]

    def _gpu(self, v: Any, ctx_name: Any, what: str) -> Any:
        v = as_gpuarray_variable(v, ctx_name)
        if v.ndim < self.nd or v.dtype not in POOL_DTYPES:
            raise TypeError(f"{self}: {what} must be a float32/float64 GPU array of "
                            f"{self.nd} or more dimensions, got {v.type}")
        return v

    @staticmethod
    def _ctx_name(*vs: Any) -> Any:
        return next((v.type.context_name for v in vs if is_gpu_var(v)), None)

    def geo(self, shape: tuple) -> list[int]:
        """[L, *input spatial, *output spatial, *ws, *stride, *pad]: the kernels' geometry."""
        nd = self.nd
        sp = [int(n) for n in shape[len(shape) - nd:]]
        out = [pool_out_len(sp[a], self.ws[a], self.stride[a], self.pad[a], self.ignore_border)
               for a in range(nd)]
        lead = int(np.prod(shape[:len(shape) - nd], dtype=np.int64))
        return [lead, *sp, *out, *self.ws, *self.stride, *self.pad]

    def tiled(self, geo: list[int]) -> bool:
        """Whether the gradient may run one thread per window (3-d ``gradt``): windows that
        do not overlap (every stride at least its window), no padding, and at least one
        window along every axis."""
        nd = self.nd
        o, ws, st, p = (geo[1 + k * nd:1 + (k + 1) * nd] for k in range(1, 5))
        return nd == 3 and all(s >= w for s, w in zip(st, ws)) and not any(p) and all(o)

    def _launch_grad(self, ctx: Any, dtype: str, gx: Any, ptrs: tuple, geo: list[int],
                     mode: int, extra: tuple = ()) -> None:
        """The gradient's launch: one thread per window where `tiled`, else per element
        (`extra`: arguments after the mode, an epilogue's operands)."""
        if self.tiled(geo) and gx.size:
            windows = geo[0] * int(np.prod(self.out_dims(geo), dtype=np.int64))
            self._launch(ctx, "gradt", dtype, windows, ptrs, geo, mode, extra)
        else:
            self._launch(ctx, "grad", dtype, gx.size, ptrs, geo, mode, extra)

    def out_dims(self, geo: list[int]) -> tuple:
        """The output's spatial lengths in `geo`."""
        return tuple(geo[1 + self.nd:1 + 2 * self.nd])

    def _launch(self, ctx: Any, kind: str, dtype: str, total: int, ptrs: tuple,
                geo: list[int], mode: int | None = None, extra: tuple = ()) -> None:
        """One launch of `kind` over `total` threads: (pointers, geometry, mode if any,
        `extra`)."""
        if total:
            blocks = max(1, min(65535, -(-total // _BLOCK)))
            tail = () if mode is None else (mode,)
            self._function(ctx, kind, dtype, index_suffix(geo)).prepared_async_call(
                (blocks, 1), (_BLOCK, 1, 1), ctx.stream, *ptrs, *geo, *tail, *extra)

    def _function(self, ctx: Any, kind: str, dtype: str, suffix: str) -> Any:
        """The prepared kernel of `kind` (symgpu/gpu/ops/pooling_epilogue.py has its own)."""
        if self.nd == 3:
            return get_prepared_kernel(_MODULE_KEY3, pooling3d_source,
                                       f"pool3_{kind}_{dtype}{suffix}", _FORMATS3[kind],
                                       context=ctx)
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
        want = tuple(x.shape[:x.ndim - self.nd]) + self.out_dims(geo)
        if tuple(other.shape) != want:
            raise ValueError(f"{self}: {what} has shape {other.shape}, expected {want} for an "
                             f"input of shape {x.shape}")


class GpuPool(_GpuPoolBase):
    """Pool on the GPU."""

    infer_shape = Pool.infer_shape

    def make_node(self, x: Any) -> Apply:
        x = self._gpu(x, self._ctx_name(x), "input")
        bc = x.broadcastable[:x.ndim - self.nd] + (False,) * self.nd
        return Apply(self, [x], [GpuArrayType(x.dtype, bc, x.type.context_name)()])

    def _run(self, ctx, inputs, dtype):
        (x,) = inputs
        geo = self.geo(x.shape)
        z = new_array(ctx, tuple(x.shape[:x.ndim - self.nd]) + self.out_dims(geo), x.dtype)
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
        self._launch_grad(ctx, dtype, gx, (x.ptr, z.ptr, gz.ptr, gx.ptr), geo, 0)
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
        self._launch_grad(ctx, dtype, gx, (x.ptr, gz.ptr, gz.ptr, gx.ptr), geo,
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


class GpuPool3d(GpuPool):
    """Pool3d on the GPU."""

    nd = 3
    infer_shape = Pool3d.infer_shape


class GpuMaxPoolGrad3d(GpuMaxPoolGrad):
    """MaxPoolGrad3d on the GPU: (x, maxout, gz) -> gx."""

    nd = 3
    infer_shape = MaxPoolGrad3d.infer_shape


class GpuAveragePoolGrad3d(GpuAveragePoolGrad):
    """AveragePoolGrad3d on the GPU: (x, gz) -> gx."""

    nd = 3
    infer_shape = AveragePoolGrad3d.infer_shape


class GpuMaxPoolGradGrad3d(GpuMaxPoolGradGrad):
    """MaxPoolGradGrad3d on the GPU: (x, maxout, ggx) -> ggz."""

    nd = 3
    infer_shape = MaxPoolGradGrad3d.infer_shape


# ----------------------------------------------------------------------------- lifters

def _floats(*vs: Any) -> bool:
    return len({v.dtype for v in vs}) == 1 and vs[0].dtype in POOL_DTYPES


_GPU_TWINS = {Pool: GpuPool, MaxPoolGrad: GpuMaxPoolGrad, AveragePoolGrad: GpuAveragePoolGrad,
              MaxPoolGradGrad: GpuMaxPoolGradGrad, Pool3d: GpuPool3d,
              MaxPoolGrad3d: GpuMaxPoolGrad3d, AveragePoolGrad3d: GpuAveragePoolGrad3d,
              MaxPoolGradGrad3d: GpuMaxPoolGradGrad3d}


def lift_pool(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """A pooling Op (2-d or 3-d, any role) -> its GPU twin, for float32/float64 operands."""
    if not _floats(*node.inputs):
        return None
    return [_GPU_TWINS[type(op)](**op.params())(*inputs)]


register_lifter(*_GPU_TWINS)(lift_pool)
