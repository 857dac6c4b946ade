"""Pooling gradients with an elementwise epilogue: the fusion pass ``gpu_pool_grad_epilogue``
and the op it makes, GpuPoolGradEpilogue.

Why: in a convolutional net the gradient of a pooling is multiplied at once by the derivative
of the activation before it (``gx * (1 - a * a)`` for tanh, where ``a`` is the pooling's
input).  As two kernels, the gradient is written out and read back: one launch and two passes
over the layer's activations more than needed.  Where a GpuMaxPoolGrad's or
GpuAveragePoolGrad's output is read only by one GpuElemwise whose other operands are the
pooling's input itself (same shape, same dtype), the elementwise op is rendered into the
gradient kernel (codegen/scalar.py's ``render_apply_function``) and applied to each sum
before it is stored.  Other operands (a mask, a broadcast scale) keep the two kernels.
"""
from __future__ import annotations

import itertools
from typing import Any

from symgpu.graph.basic import Apply
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.runtime.codegen import common_source
from symgpu.gpu.runtime.codegen.scalar import render_apply_function, supports_scalar_op
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.ops.elemwise import GpuElemwise, new_array
from symgpu.gpu.ops.pooling import (_CU, _FORMATS, _GEO, _INDEX, _MAKE, POOL_DTYPES,
                                GpuAveragePoolGrad, GpuMaxPoolGrad, _GpuPoolBase)
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.signal.pool import _PoolBase
from symgpu.tensor.signal.pool_numpy import MODES

__all__ = ["GpuPoolGradEpilogue", "fuse_pool_grad_epilogue", "epilogue_source"]


def epilogue_source(scalar_op: Any, roles: tuple[str, ...], dtype: str) -> str:
    """The gradient kernels ``pool_grad_epi{,_i32}`` storing ``scalar_op`` of the sum ('g')
    and x's element ('x'), its operands in the order of `roles`."""
    t = POOL_DTYPES[dtype]
    apply_src, _ = render_apply_function(scalar_op, [dtype] * len(roles), name="sg_epilogue")
    args = ", ".join("acc" if r == "g" else "x[t]" for r in roles)
    parts = [common_source(), _CU[""].substitute(), apply_src,
             _CU["epilogue_store"].substitute(t=t, vt=value_ctype(dtype), args=args)]
    for sfx, i in _INDEX.items():
        parts.append(_CU["grad_epi"].substitute(t=t, sfx=sfx, i=i, geo=_GEO,
                                                make=_MAKE.format(i=i)))
    return "".join(parts)


class GpuPoolGradEpilogue(_GpuPoolBase):
    """``scalar_op(gradient, x)`` of a pooling's gradient in one kernel: inputs (x, maxout,
    gz) for mode 'max', (x, gz) for the others; ``roles`` says which operand of
    ``scalar_op`` is the gradient ('g') and which are x ('x')."""

    __props__ = _PoolBase.__props__ + ("scalar_op", "roles")

    def __init__(self, ws: Any, stride: Any = None, pad: Any = (0, 0),
                 ignore_border: bool = True, mode: str = "max", scalar_op: Any = None,
                 roles: tuple = ("g",)):
        super().__init__(ws, stride, pad, ignore_border, mode)
        self.scalar_op, self.roles = scalar_op, tuple(roles)

    def __str__(self) -> str:
        return f"{super().__str__()}[{self.scalar_op}{self.roles}]"

    infer_shape = GpuMaxPoolGrad.infer_shape

    def make_node(self, x: Any, *rest: Any) -> Apply:
        ctx = self._ctx_name(x, *rest)
        x = self._gpu(x, ctx, "input")
        rest = tuple(self._gpu(v, ctx, "gradient input") for v in rest)
        want = 2 if self.mode == "max" else 1
        if len(rest) != want or any(v.dtype != x.dtype for v in rest):
            raise TypeError(f"{self}: takes x and {want} more input(s) of x's dtype, got "
                            f"{[x.type] + [v.type for v in rest]}")
        return Apply(self, [x, *rest], [GpuArrayType(x.dtype, x.broadcastable,
                                                      x.type.context_name)()])

    def _key(self, dtype: str) -> tuple:
        return ("symgpu.pooling.epilogue", self.scalar_op, self.roles, dtype)

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        dtype = node.outputs[0].dtype
        return [(self._key(dtype), lambda: epilogue_source(self.scalar_op, self.roles, dtype),
                 ())]

    def _function(self, ctx: Any, kind: str, dtype: str, suffix: str) -> Any:
        return get_prepared_kernel(self._key(dtype),
                                   lambda: epilogue_source(self.scalar_op, self.roles, dtype),
                                   f"pool_grad_epi{suffix}", _FORMATS["grad"], context=ctx)

    def _run(self, ctx, inputs, dtype):
        x, gz = inputs[0], inputs[-1]
        z = inputs[1] if self.mode == "max" else gz
        geo = self.geo(x.shape)
        if self.mode == "max":
            self._check_out(x, z, geo, "maxout")
        self._check_out(x, gz, geo, "the output gradient")
        gx = new_array(ctx, tuple(x.shape), x.dtype)
        self._launch(ctx, "grad", dtype, gx.size, (x.ptr, z.ptr, gz.ptr, gx.ptr), geo,
                     MODES.index(self.mode))
        return gx


def _epilogue_for(fgraph: Any, node: Apply) -> tuple[Apply, tuple[str, ...]] | None:
    """(the pooling gradient node, roles) when GpuElemwise `node` can be its epilogue."""
    if type(node.op) is not GpuElemwise or node.op.inplace_pattern or len(node.outputs) != 1:
        return None
    grads = {v.owner for v in node.inputs
             if v.owner is not None and type(v.owner.op) in (GpuMaxPoolGrad, GpuAveragePoolGrad)}
    for pg in grads:
        g, x = pg.outputs[0], pg.inputs[0]
        if any(c != node for c, _ in fgraph.clients.get(g, ())):
            continue   # read elsewhere too, or a function output
        if not all(v is g or v is x for v in node.inputs):
            continue
        out = node.outputs[0]
        if out.type != g.type or not supports_scalar_op(node.op.scalar_op,
                                                        [g.dtype] * len(node.inputs)):
            continue
        return pg, tuple("g" if v is g else "x" for v in node.inputs)
    return None


def fuse_pool_grad_epilogue(fgraph: Any) -> int:
    """Give each pooling gradient read only by an elementwise op of it and the pooling's
    input that op as its epilogue; returns how many were fused."""
    done = 0
    for node in fgraph.toposort():
        if node not in fgraph.apply_nodes:
            continue
        found = _epilogue_for(fgraph, node)
        if found is None:
            continue
        pg, roles = found
        op = GpuPoolGradEpilogue(**pg.op.params(), scalar_op=node.op.scalar_op, roles=roles)
        new = op(*pg.inputs)
        new.owner.tag.__dict__.update(node.tag.__dict__)
        fgraph.replace(node.outputs[0], new, reason="gpu_pool_grad_epilogue")
        done += 1
    return done


# after the elementwise fusion (49.5) and the reductions' pre-ops (60), before in place (76)
optdb.register("gpu_pool_grad_epilogue", fuse_pool_grad_epilogue, 61, "fast_run", "fusion",
               "gpu")
