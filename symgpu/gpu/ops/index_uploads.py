"""Index arithmetic that only GPU ops read is done on the GPU: ``GpuFromHost(f(a, b))`` for
an integer Elemwise or DimShuffle ``f`` of host values becomes ``f`` on the GPU of their
uploads (Theano's lifter moved an op whose every client was a transfer to the GPU).

Why: a gather's index (scan_to_dnn_rnn's ``y[min(t, len - 1), rows]``, a shifted or clipped
position vector) is small host arithmetic before the upload, and every host op is a plain
step before a function's CUDA graph, paid each call (several microseconds each); on the GPU
the arithmetic is part of the graph, and what is uploaded is the smallest value it starts
from (a vector of lengths, not the index matrix made from it).  Ranges go with
``local_gpu_arange`` (advanced_pairs.py), which runs after this pass.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops.lifters import lift_elemwise
from symgpu.gpu.placement.basic_ops import (GpuDimShuffle, GpuFromHost, as_gpuarray_variable,
                                            specify_gpu_broadcastable_as)
from symgpu.gpu.placement.rewriting import GpuInputs
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.graph.rewriting import node_rewriter, optdb
from symgpu.graph.rewriting.db import POSITIONS
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.scalar.dtypes import is_bool, is_int
from symgpu.tensor.basic import ARange
from symgpu.tensor.elemwise import DimShuffle, Elemwise

__all__ = ["local_gpu_index_math"]


def _discrete(v: Any) -> bool:
    return is_int(v.dtype) or is_bool(v.dtype)


def _only_uploaded(fgraph: Any, v: Any) -> bool:
    """Every reader of ``v`` is an upload (the host value goes once they read the GPU op)."""
    clients = fgraph.clients.get(v, [])
    return bool(clients) and all(c != "output" and isinstance(c.op, GpuFromHost)
                                 for c, _ in clients)


@node_rewriter([GpuFromHost])
def local_gpu_index_math(fgraph, node):
    """GpuFromHost(Elemwise(a, b...)) -> GpuElemwise(GpuFromHost(a), ...) for an integer
    result of one dimension or more made from integer host values that nothing but uploads
    read; GpuFromHost(DimShuffle(x)) -> GpuDimShuffle(GpuFromHost(x)) where x is such a
    result or a range (the view moves with it)."""
    v = node.inputs[0]
    src = v.owner
    if src is None or v.ndim == 0 or not _discrete(v) or not _only_uploaded(fgraph, v):
        return None
    ctx = node.op.context_name
    if isinstance(src.op, DimShuffle):
        x = src.inputs[0]
        if x.owner is None or not _discrete(x) or \
                not isinstance(x.owner.op, (Elemwise, ARange, DimShuffle)):
            return None
        up = as_gpuarray_variable(x, ctx)
        new = GpuDimShuffle(up.broadcastable, src.op.new_order)(up)
    elif isinstance(src.op, Elemwise):
        if not all(_discrete(i) and not is_gpu_var(i) for i in src.inputs):
            return None
        ups = [as_gpuarray_variable(i, ctx) for i in src.inputs]
        outs = lift_elemwise(src.op, src, ctx,
                             GpuInputs(ups, lambda i: src.inputs[i], [False] * len(ups)))
        if outs is None or len(outs) != 1:
            return None
        new = outs[0]
    else:
        return None
    out = node.outputs[0]
    if new.type != out.type:
        if new.dtype != out.dtype or new.ndim != out.ndim:
            return None
        new = specify_gpu_broadcastable_as(new, out.type)
    return [new]


# after the lifting, before local_gpu_arange (POSITIONS["gpu"] + 0.5) turns the uploads of
# ranges it leaves into ranges made on the device
optdb.register("gpu_index_math", EquilibriumRewriter([local_gpu_index_math],
                                                     name="gpu_index_math"),
               POSITIONS["gpu"] + 0.4, "fast_run", "fast_compile", "gpu")
