"""`ifelse` on the GPU: both branches' inner graphs lifted, their values kept on the device.

Why: the host IfElse placed in a GPU function downloads its branch inputs, runs the chosen
branch on the host (or uploads again inside it) and uploads the results.  `GpuIfElse` takes
GPU branch inputs and gives GPU results; each branch body is lifted by the placement pass like
a loop body (symgpu/gpu/ops/scan_op.py: `gpu_inner_graph`).  The condition decides which branch
runs, so it is read on the host: one stream synchronisation per call when it was computed on
the GPU (documented in docs/loops.md).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.gpu.ops.scan_op import _cache, gpu_inner_graph
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import gpu_supports_dtype, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.graph.basic import Apply, Variable
from symgpu.ifelse import IfElse
from symgpu.scalar.dtypes import is_float

__all__ = ["GpuIfElse", "lift_ifelse"]


def _to_host_scalar(value: Any) -> Any:
    if isinstance(value, GpuArray):
        return value.get()   # the one sync of the call
    return value


class GpuIfElse(IfElse):
    """`IfElse` whose branch inputs and results live on the GPU context `context_name`."""

    def __init__(self, then_inputs: Sequence[Variable], then_outputs: Sequence[Variable],
                 else_inputs: Sequence[Variable], else_outputs: Sequence[Variable],
                 name: str | None = None, mode: Any = None, context_name: Any = None):
        super().__init__(then_inputs, then_outputs, else_inputs, else_outputs, name, mode)
        self.context_name = context_name

    def __str__(self) -> str:
        return f"gpu_if{{{self.name}}}" if self.name else "gpu_if"

    def make_node(self, condition: Variable, *branch_inputs: Variable) -> Apply:
        outs = []
        for a, b in zip(self.then_fn.outputs, self.else_fn.outputs):
            bc = tuple(x and y for x, y in zip(a.type.broadcastable, b.type.broadcastable))
            outs.append(a.type.clone(broadcastable=bc)())
        return Apply(self, [condition, *branch_inputs], outs)

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        c = _to_host_scalar(inputs[0])
        if bool(np.asarray(c)):
            args = inputs[1:1 + self.n_then]
            results = self.then_fn(*args)
        else:
            args = inputs[1 + self.n_then:]
            results = self.else_fn(*args)
        gpu_args = [a for a in args if isinstance(a, GpuArray)]
        for k, r in enumerate(results):
            if isinstance(r, GpuArray):
                if any(r.base is not None and r.base is a.base for a in gpu_args):
                    r = r.copy()   # an output never aliases an input (no view_map declared)
            else:
                r = np.asarray(r, dtype=node.outputs[k].dtype)
                if any(isinstance(a, np.ndarray) and np.may_share_memory(r, a) for a in args):
                    r = r.copy()
            output_storage[k][0] = r


def _gpu_output(v: Variable) -> bool:
    t = v.type
    return gpu_supports_dtype(t.dtype) and (t.ndim > 0 or is_float(t.dtype))


@register_lifter(IfElse)
def lift_ifelse(op: IfElse, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """IfElse -> GpuIfElse: branch inputs where the placement pass put them, results on the
    GPU (except discrete scalars, which stay on the host), the condition on the host."""
    if isinstance(op, GpuIfElse):
        return None
    branch = list(inputs)[1:]
    on_in = tuple(is_gpu_var(v) for v in branch)
    on_out = tuple(_gpu_output(o) for o in node.outputs)
    n_then = op.n_then

    def make() -> GpuIfElse:
        t_ins, t_outs = gpu_inner_graph(op.then_fn.inputs, op.then_fn.outputs, on_in[:n_then],
                                        on_out, context_name)
        e_ins, e_outs = gpu_inner_graph(op.else_fn.inputs, op.else_fn.outputs, on_in[n_then:],
                                        on_out, context_name)
        return GpuIfElse(t_ins, t_outs, e_ins, e_outs, op.name, op.mode, context_name)

    gop = _cache(op, ("ifelse", context_name, on_in, on_out), make)
    cond = inputs[0] if inputs.was_on_gpu[0] else inputs.host(0)
    return gop.make_node(cond, *branch).outputs
