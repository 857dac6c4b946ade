"""`OpFromGraph` on the GPU: the inner graph lifted, its values kept on the device.

Why: a host OpFromGraph (``inline=False``) placed in a GPU function would download its inputs,
run its graph on the host and upload the results.  `GpuOpFromGraph` takes the inputs where
the placement pass put them (data on the GPU, discrete scalars on the host) and gives GPU
results; its inner graph is written with transfers at its edges (`gpu_inner_graph`, as a
loop body or a branch), which the placement pass of the inner compile lifts throughout.
``inline=True`` nodes never get here: they are expanded before placement.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.builders import OpFromGraph
from symgpu.gpu.ops.scan_op import _cache, gpu_inner_graph
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import gpu_supports_dtype, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.graph.basic import Apply, Variable
from symgpu.scalar.dtypes import is_float

__all__ = ["GpuOpFromGraph", "lift_op_from_graph"]


class GpuOpFromGraph(OpFromGraph):
    """`OpFromGraph` whose inner graph takes and gives GPU values on `context_name` (its
    inputs: the host op's node inputs, shared ones included, as placed)."""

    def __init__(self, inputs: Sequence[Variable], outputs: Sequence[Variable],
                 name: str | None = None, mode: Any = None, context_name: Any = None):
        super().__init__(list(inputs), list(outputs), name=name, mode=mode,
                         on_unused_input="ignore")
        self.context_name = context_name
        self._key = None

    def _identity(self) -> tuple:
        return (super()._identity(), self.context_name)

    def __str__(self) -> str:  # GpuOpFromGraph{...}, or Gpu<name>{...} for a named graph
        text = super().__str__()
        return text if self.name is None else f"Gpu{text}"

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        results = self.fn(*inputs)
        copy_out = self._copied_outputs()
        held_gpu = [a for a in inputs if isinstance(a, GpuArray)]
        held_host = [a for a in inputs if isinstance(a, np.ndarray)]
        for k, r in enumerate(results):
            if isinstance(r, GpuArray):
                if copy_out[k] or any(r is a or (r.base is not None and r.base is a.base)
                                      for a in held_gpu):
                    r = r.copy()   # no output aliases an input or another output
                held_gpu.append(r)
            else:
                r = np.asarray(r, dtype=node.outputs[k].type.dtype)
                if copy_out[k] or any(np.may_share_memory(r, a) for a in held_host):
                    r = r.copy()
                held_host.append(r)
            output_storage[k][0] = r


def _gpu_output(v: Variable) -> bool:
    t = v.type
    dtype = getattr(t, "dtype", None)
    return (dtype is not None and gpu_supports_dtype(dtype)
            and (t.ndim > 0 or is_float(str(dtype))))


@register_lifter(OpFromGraph)
def lift_op_from_graph(op: OpFromGraph, node: Apply, context_name: Any,
                       inputs: Any) -> list[Variable] | None:
    """OpFromGraph -> GpuOpFromGraph: inputs where the placement pass put them, results on the
    GPU (except discrete scalars, which stay on the host)."""
    if isinstance(op, GpuOpFromGraph):
        return None
    ins = list(inputs)
    on_in = tuple(is_gpu_var(v) for v in ins)
    on_out = tuple(_gpu_output(o) for o in node.outputs)

    def make() -> GpuOpFromGraph:
        g_ins, g_outs = gpu_inner_graph(op.local_inputs, op.local_outputs, on_in, on_out,
                                        context_name)
        return GpuOpFromGraph(g_ins, g_outs, op.name, op.mode, context_name)

    gop = _cache(op, ("op_from_graph", context_name, on_in, on_out), make)
    return gop.make_node(*ins).outputs
