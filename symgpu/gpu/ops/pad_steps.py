"""GpuPadSteps: PadSteps (symgpu/tensor/nnet/pad_steps.py) on the device, run between CUDA
graphs on purpose.

Why not captured: its input's length changes from call to call while its output's takes a
few values (the buckets). A captured pad would put the changing length into the key of the
graph that holds it, and the whole step after it would be captured again per length; run
plainly (one copy and one memset, about as much host time as a graph launch), it ends the
graph before it, and the graphs after it are keyed by the bucket.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.ops.kernel_ops import _context, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import new_array
from symgpu.graph.basic import Apply
from symgpu.tensor.nnet.pad_steps import PadSteps, StepBuckets
from symgpu.tensor.type import TensorType

__all__ = ["GpuPadSteps"]


class GpuPadSteps(PadSteps):
    """PadSteps of a GPU array (not capturable: see the module docstring)."""

    def make_node(self, x: Any) -> Apply:
        x = as_gpuarray_variable(x, getattr(x.type, "context_name", None))
        out = GpuArrayType(x.dtype, (False,) + x.type.broadcastable[1:],
                           x.type.context_name)(name="padded")
        return Apply(self, [x], [out, TensorType("int64", ())(name="padded_steps")])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        src, dst = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        steps = storage_map[node.outputs[1]]
        buckets = StepBuckets(self.q)

        def thunk() -> None:
            ctx.activate()
            x = src[0]
            n = x.shape[0]
            padded = buckets.steps(n)
            if padded == n:     # nothing to pad: the sequence itself (view_map)
                dst[0], steps[0] = x, np.int64(n)
                return
            out = new_array(ctx, (padded,) + tuple(x.shape[1:]), x.dtype)
            out[:n]._copy_from_device(x)
            if out.shape[0] > n:
                out[n:].fill(0)
            dst[0], steps[0] = out, np.int64(out.shape[0])
        return thunk


@register_lifter(PadSteps)
def lift_pad_steps(op: PadSteps, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """PadSteps of a value placed on the GPU -> GpuPadSteps (the length stays on the host)."""
    if isinstance(op, GpuPadSteps) or not inputs.was_on_gpu[0]:
        return None
    return GpuPadSteps(op.q).make_node(as_gpuarray_variable(inputs[0], context_name)).outputs
