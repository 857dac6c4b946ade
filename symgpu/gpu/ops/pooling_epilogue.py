"""Pooling gradients with an elementwise epilogue: the fusion pass ``gpu_pool_grad_epilogue``
and the ops it makes, GpuPoolGradEpilogue (2-d) and GpuPoolGradEpilogue3d.

Why: in a convolutional net the gradient of a pooling is multiplied at once by the derivative
of the activation before it (``gx * (1 - a * a)`` for tanh, where ``a`` is the pooling's
input).  As two kernels, the gradient is written out and read back: one launch and two passes
over the layer's activations more than needed.  Where a GpuMaxPoolGrad's or
GpuAveragePoolGrad's output is read only by one GpuElemwise whose other operands are the
pooling's input itself or arrays of its shape (relu's derivative reads the mask ``a < 0``
its forward kernel stored: ``switch(mask, 0, gx)``), the elementwise op is rendered into the
gradient kernel (codegen/scalar.py's ``render_apply_function``) and applied to each sum
before it is stored; the extra arrays (at most MAX_EXTRA) are read at the stored element.
Broadcast operands (a scale, a bias) keep the two kernels.  3-d uses the 3-d gradient
kernels (the one-thread-per-window one where windows do not overlap).
"""
from __future__ import annotations

import itertools
from typing import Any

from symgpu.graph.basic import Apply
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.runtime.codegen import common_source
from symgpu.gpu.runtime.codegen.scalar import render_apply_function, supports_scalar_op
from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.ops.elemwise import GpuElemwise, new_array
from symgpu.gpu.ops.pooling import (_CU, _FORMATS, _FORMATS3, _GEO, _GEO3, _INDEX, _MAKE, _MAKE3,
                                    POOL_DTYPES, GpuAveragePoolGrad, GpuAveragePoolGrad3d,
                                    GpuMaxPoolGrad, GpuMaxPoolGrad3d, _GpuPoolBase)
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.signal.pool import _PoolBase
from symgpu.tensor.signal.pool_numpy import MODES

__all__ = ["GpuPoolGradEpilogue", "GpuPoolGradEpilogue3d", "fuse_pool_grad_epilogue",
           "epilogue_source", "MAX_EXTRA"]

#: the most arrays besides x and the gradient an epilogue reads
MAX_EXTRA = 3
_GRADS = {GpuMaxPoolGrad: 2, GpuAveragePoolGrad: 2, GpuMaxPoolGrad3d: 3,
          GpuAveragePoolGrad3d: 3}


def _extra_count(roles: tuple[str, ...]) -> int:
    return len({r for r in roles if r.startswith("e")})


def epilogue_source(scalar_op: Any, roles: tuple[str, ...], dtype: str,
                    extra_dtypes: tuple[str, ...] = (), nd: int = 2) -> str:
    """The gradient kernels storing ``scalar_op`` of the sum ('g'), x's element ('x') and
    the extra arrays' ('e<k>', of ``extra_dtypes[k]``), its operands in the order of `roles`:
    2-d ``pool_grad_epi{,_i32}``, 3-d ``pool3_grad_epi`` and ``pool3_gradt_epi``."""
    t = POOL_DTYPES[dtype]
    dtypes = [dtype if r in ("g", "x") else extra_dtypes[int(r[1:])] for r in roles]
    apply_src, _ = render_apply_function(scalar_op, dtypes, name="sg_epilogue")
    args = ", ".join("acc" if r == "g" else "x[t]" if r == "x" else f"sg_load({r}[t])"
                     for r in roles)
    names = [f"e{k}" for k in range(len(extra_dtypes))]
    members = "".join(f"    const {storage_ctype(d)} *{n};\n" for n, d in zip(names,
                                                                             extra_dtypes))
    params = "".join(f", const {storage_ctype(d)} *{n}" for n, d in zip(names, extra_dtypes))
    parts = [common_source(), _CU[""].substitute()]
    if nd == 3:
        parts.append(_CU["body3"].substitute())
    parts += [apply_src, _CU["epilogue_store"].substitute(t=t, vt=value_ctype(dtype), args=args,
                                                          members=members)]
    kinds = ("grad3_epi", "gradt3_epi") if nd == 3 else ("grad_epi",)
    geo, make = (_GEO3, _MAKE3) if nd == 3 else (_GEO, _MAKE)
    for sfx, i in _INDEX.items():
        for kind in kinds:
            parts.append(_CU[kind].substitute(t=t, sfx=sfx, i=i, geo=geo,
                                              make=make.format(i=i), params=params,
                                              fields=", ".join(names)))
    return "".join(parts)


class GpuPoolGradEpilogue(_GpuPoolBase):
    """``scalar_op(gradient, x, extras...)`` of a pooling's gradient in one kernel: inputs
    (x, maxout, gz) for mode 'max', (x, gz) for the others, then the extra arrays of x's
    shape; ``roles`` says which operand of ``scalar_op`` is the gradient ('g'), which are x
    ('x') and which extra array ('e<k>': the k-th input after the pooling's)."""

    __props__ = _PoolBase.__props__ + ("scalar_op", "roles", "extra_dtypes")

    def __init__(self, ws: Any, stride: Any = None, pad: Any = None,
                 ignore_border: bool = True, mode: str = "max", scalar_op: Any = None,
                 roles: tuple = ("g",), extra_dtypes: tuple = ()):
        """``extra_dtypes``: the dtypes of the extra arrays, one per 'e<k>' of ``roles``."""
        super().__init__(ws, stride, pad, ignore_border, mode)
        self.scalar_op, self.roles = scalar_op, tuple(roles)
        self.extra_dtypes = tuple(str(d) for d in extra_dtypes)
        if _extra_count(self.roles) != len(self.extra_dtypes):
            raise ValueError(f"{type(self).__name__}: roles {self.roles} name "
                             f"{_extra_count(self.roles)} extra arrays, extra_dtypes "
                             f"{self.extra_dtypes} gives {len(self.extra_dtypes)}")

    def __str__(self) -> str:
        return f"{super().__str__()}[{self.scalar_op}{self.roles}]"

    infer_shape = GpuMaxPoolGrad.infer_shape

    def make_node(self, x: Any, *rest: Any) -> Apply:
        ctx = self._ctx_name(x, *rest)
        x = self._gpu(x, ctx, "input")
        want = (2 if self.mode == "max" else 1) + _extra_count(self.roles)
        pooled = want - _extra_count(self.roles)
        rest = tuple(self._gpu(v, ctx, "gradient input") if k < pooled else
                     as_gpuarray_variable(v, ctx) for k, v in enumerate(rest))
        if len(rest) != want or any(v.dtype != x.dtype for v in rest[:pooled]) or any(
                v.ndim != x.ndim or v.dtype != d for v, d in zip(rest[pooled:],
                                                                 self.extra_dtypes)):
            raise TypeError(f"{self}: takes x, {pooled} more input(s) of x's dtype and "
                            f"{want - pooled} array(s) of x's rank of dtypes "
                            f"{self.extra_dtypes}, got "
                            f"{[x.type] + [v.type for v in rest]}")
        return Apply(self, [x, *rest], [GpuArrayType(x.dtype, x.broadcastable,
                                                      x.type.context_name)()])

    def _key(self, dtype: str, extra_dtypes: tuple) -> tuple:
        return ("symgpu.pooling.epilogue", self.nd, self.scalar_op, self.roles, dtype,
                extra_dtypes)

    def _source(self, dtype: str, extra_dtypes: tuple) -> Any:
        return lambda: epilogue_source(self.scalar_op, self.roles, dtype, extra_dtypes,
                                       self.nd)

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        dtype = node.outputs[0].dtype
        return [(self._key(dtype, self.extra_dtypes), self._source(dtype, self.extra_dtypes),
                 ())]

    def _function(self, ctx: Any, kind: str, dtype: str, suffix: str) -> Any:
        extra = self.extra_dtypes
        fmt = (_FORMATS3[kind] if self.nd == 3 else _FORMATS["grad"]) + "P" * len(extra)
        name = f"pool3_{kind}_epi{suffix}" if self.nd == 3 else f"pool_grad_epi{suffix}"
        return get_prepared_kernel(self._key(dtype, extra), self._source(dtype, extra), name,
                                   fmt, context=ctx)

    def _run(self, ctx, inputs, dtype):
        n_extra = _extra_count(self.roles)
        pooled, extras = inputs[:len(inputs) - n_extra], inputs[len(inputs) - n_extra:]
        x, gz = pooled[0], pooled[-1]
        z = pooled[1] if self.mode == "max" else gz
        geo = self.geo(x.shape)
        if self.mode == "max":
            self._check_out(x, z, geo, "maxout")
        self._check_out(x, gz, geo, "the output gradient")
        for k, e in enumerate(extras):
            if tuple(e.shape) != tuple(x.shape):
                raise ValueError(f"{self}: epilogue operand e{k} has shape {e.shape}, "
                                 f"expected x's {x.shape}")
        gx = new_array(ctx, tuple(x.shape), x.dtype)
        self._launch_grad(ctx, dtype, gx, (x.ptr, z.ptr, gz.ptr, gx.ptr), geo,
                          MODES.index(self.mode), tuple(e.ptr for e in extras))
        return gx


class GpuPoolGradEpilogue3d(GpuPoolGradEpilogue):
    """GpuPoolGradEpilogue of a 3-d pooling's gradient."""

    nd = 3


def _epilogue_for(fgraph: Any, node: Apply) -> tuple[Apply, tuple[str, ...], list] | None:
    """(the pooling gradient node, roles, the extra arrays) when GpuElemwise `node` can be
    its epilogue: its operands are the gradient, the pooling's input, or (at most MAX_EXTRA)
    other arrays of the gradient's broadcast pattern."""
    if type(node.op) is not GpuElemwise or node.op.inplace_pattern or len(node.outputs) != 1:
        return None
    grads = {v.owner for v in node.inputs
             if v.owner is not None and type(v.owner.op) in _GRADS}
    for pg in grads:
        g, x = pg.outputs[0], pg.inputs[0]
        if any(c != node for c, _ in fgraph.clients.get(g, ())):
            continue   # read elsewhere too, or a function output
        extras = list(dict.fromkeys(v for v in node.inputs if v is not g and v is not x))
        if len(extras) > MAX_EXTRA or any(
                getattr(v.type, "broadcastable", None) != g.type.broadcastable
                or not hasattr(v.type, "context_name") for v in extras):
            continue
        out = node.outputs[0]
        roles = tuple("g" if v is g else "x" if v is x else f"e{extras.index(v)}"
                      for v in node.inputs)
        dtypes = [v.dtype for v in node.inputs]
        if out.type != g.type or not supports_scalar_op(node.op.scalar_op, dtypes):
            continue
        return pg, roles, extras
    return None


def fuse_pool_grad_epilogue(fgraph: Any) -> int:
    """Give each pooling gradient read only by an elementwise op of it, the pooling's input
    and arrays of its shape that op as its epilogue; returns how many were fused."""
    done = 0
    for node in fgraph.toposort():
        if node not in fgraph.apply_nodes:
            continue
        found = _epilogue_for(fgraph, node)
        if found is None:
            continue
        pg, roles, extras = found
        cls = GpuPoolGradEpilogue3d if pg.op.nd == 3 else GpuPoolGradEpilogue
        op = cls(**pg.op.params(), scalar_op=node.op.scalar_op, roles=roles,
                 extra_dtypes=tuple(v.dtype for v in extras))
        new = op(*pg.inputs, *extras)
        new.owner.tag.__dict__.update(node.tag.__dict__)
        fgraph.replace(node.outputs[0], new, reason="gpu_pool_grad_epilogue")
        done += 1
    return done


# after the elementwise fusion (49.5) and the reductions' pre-ops (60), before in place (76)
optdb.register("gpu_pool_grad_epilogue", fuse_pool_grad_epilogue, 61, "fast_run", "fusion",
               "gpu")
