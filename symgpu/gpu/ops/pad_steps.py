"""GpuPadSteps and GpuPadPrefix: PadSteps (symgpu/tensor/nnet/pad_steps.py) on the device.

GpuPadSteps pads a sequence that arrives with its own length and runs between CUDA graphs
on purpose: captured, the changing length of its input would be in the key of the graph
that holds it, and the whole step after it would be captured again per length; run plainly
(one copy and one memset, about as much host time as a graph launch), it ends the graph
before it, and the graphs after it are keyed by the bucket.

GpuPadPrefix pads the first n rows of a longer array (``x[:L]`` of the whole data, as a
Theano user slices a shared sequence by an index): the array keeps its shape from call to
call, n is a graph parameter (symgpu/gpu/runtime/graph_params.py) and the bucket a host op
computes before the graph (StepBucket), so the pad is captured with the step that reads it
and one graph per bucket replays for every length in it, with no copy before it
(``local_gpu_pad_prefix`` puts it in place of a GpuPadSteps of such a slice).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.ops.kernel_ops import _context, _virtual_thunk
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen.layout import c_contiguous
from symgpu.gpu.runtime.graph_params import (load_kernels, pack_int64, pad_prefix,
                                             prefetch_request, slot_ptr)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op, PerformThunk
from symgpu.graph.rewriting import node_rewriter, optdb
from symgpu.graph.rewriting.db import POSITIONS
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.scalar.dtypes import is_int
from symgpu.tensor.nnet.pad_steps import PadSteps, StepBucket, StepBuckets
from symgpu.tensor.shape_rules import slice_length
from symgpu.tensor.subtensor import Slice
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["GpuPadSteps", "GpuPadPrefix", "local_gpu_pad_prefix"]


class GpuPadSteps(PadSteps):
    """PadSteps of a GPU array (not captured: see the module docstring)."""

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


class GpuPadPrefix(Op):
    """(x (rows, ...) on the GPU, n, steps, varied) -> ``x[:n]`` padded with zero rows to
    ``steps`` rows: a copy once lengths have varied, else the view ``x[:n]`` (then steps is
    n: StepBucket's rule). Captured with n read from the graph's parameter block (the key
    holds steps and varied), so one graph serves a bucket's lengths."""

    __props__ = ()
    view_map = {0: [0]}     # the view, while lengths have not varied
    capturable = True
    launches = True

    def make_node(self, x: Any, n: Any, steps: Any, varied: Any) -> Apply:
        if not is_gpu_var(x) or x.ndim < 1:
            raise TypeError(f"{self}: needs a GPU sequence (rows, ...), got {x}")
        ints = [as_tensor_variable(v) for v in (n, steps, varied)]
        for name, v in zip(("n", "steps", "varied"), ints):
            if v.ndim != 0 or not is_int(v.dtype):
                raise TypeError(f"{self}: {name} must be an integer scalar on the host, "
                                f"got {v.type}")
        out = GpuArrayType(x.dtype, (False,) + x.type.broadcastable[1:],
                           x.type.context_name)(name="padded")
        return Apply(self, [x, *ints], [out])

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return [(node.inputs[2],) + tuple(shapes[0][1:])]

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [prefetch_request()]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _PadPrefixThunk(self, node, storage_map, compute_map, ctx)

    def __str__(self) -> str:
        return "GpuPadPrefix"


def _rows(x: Any) -> tuple[int, int] | None:
    """(items per row, items between rows) where x's rows are C-contiguous runs at a
    non-negative stride (what pad_prefix reads), else None."""
    item = x.dtype.itemsize
    row = 1
    for d in x.shape[1:]:
        row *= d
    if not c_contiguous(tuple(x.shape[1:]), tuple(x.strides[1:]), item):
        return None
    stride = x.strides[0] if x.shape[0] > 1 else row * item
    if stride < 0 or stride % item:
        return None
    return row, stride // item


class _PadPrefixThunk(PerformThunk):
    """GpuPadPrefix's thunk, with the parameter protocol of graph_params.py (n in the slot)."""

    __slots__ = ("param_slot", "ctx", "layout")
    capturable = True
    launches = True
    param_nbytes = 8

    def __init__(self, op: GpuPadPrefix, node: Apply, storage_map: dict, compute_map: dict,
                 ctx: Any) -> None:
        super().__init__(op, node, storage_map, compute_map)
        self.param_slot: tuple | None = None
        self.ctx = ctx
        #: (shape, strides, _rows of them) of the last x: the same every call of a key
        self.layout: tuple = ((), (), None)

    def _rows(self, x: Any) -> tuple[int, int] | None:
        shape, strides, rows = self.layout
        if x.shape != shape or x.strides != strides:
            rows = _rows(x)
            self.layout = (x.shape, x.strides, rows)
        return rows

    def _args(self) -> tuple[Any, int, int, bool]:
        x, n, steps, varied = (c[0] for c in self.inputs)
        n, steps, varied = int(n), int(steps), bool(varied)
        if not 0 <= n <= x.shape[0] or steps < n or (not varied and steps != n):
            raise ValueError(f"{self.op}: {n} rows of a sequence of {x.shape[0]} padded to "
                             f"{steps} ({'a copy' if varied else 'a view'})")
        return x, n, steps, varied

    def param_prepare(self) -> None:
        load_kernels(self.ctx, pad_itemsize=np.dtype(self.node.inputs[0].dtype).itemsize)

    def param_values(self) -> tuple[tuple, bytes]:
        """((steps, varied), n): a copy reads n from the slot; one whose rows the kernel
        cannot read runs plainly (TypeError)."""
        x, n, steps, varied = self._args()
        if varied and self._rows(x) is None:
            raise TypeError(f"{self.op}: rows of strides {x.strides} are not contiguous")
        return (steps, varied), pack_int64(n)

    def __call__(self) -> None:
        x, n, steps, varied = self._args()
        if not varied:
            self.outputs[0][0] = x[:n]
            return
        ctx = self.ctx
        ctx.activate()
        out = new_array(ctx, (steps,) + tuple(x.shape[1:]), x.dtype)
        rows = self._rows(x)
        slot = self.param_slot
        if rows is not None:
            pad_prefix(ctx, out.ptr, x.ptr, slot_ptr(slot) if slot is not None else 0, n,
                       steps, rows[0], rows[1], x.dtype.itemsize)
        else:       # (a plain run only: param_values keeps such an x out of a capture)
            out[:n]._copy_from_device(x[:n])
            if steps > n:
                out[n:].fill(0)
        self.outputs[0][0] = out


def _prefix_slice(v: Any) -> tuple[Any, Any] | None:
    """(y, stop) where ``v`` is ``y[:stop]`` on the GPU (a GpuSubtensor of one prefix
    slice), else None."""
    node = v.owner
    if node is None or type(node.op) is not GpuSubtensor or len(node.op.idx_list) != 1:
        return None
    e = node.op.idx_list[0]
    if not isinstance(e, Slice) or e.start is not None or e.step is not None or \
            e.stop is None:
        return None
    return node.inputs[0], (node.inputs[1] if isinstance(e.stop, str) else e.stop)


def _prefix_of(v: Any) -> tuple[Any, Any] | None:
    """(y, n) where ``v`` is ``y[:a][:b]...`` through prefix slices on the GPU (y no such
    slice; n its rows, host arithmetic on the slices' stops), else None."""
    sliced = _prefix_slice(v)
    if sliced is None:
        return None
    y, stop = sliced
    inner = _prefix_of(y)
    base, rows = inner if inner is not None else (y, y.shape[0])
    return base, slice_length(None, stop, None, rows)


@node_rewriter([GpuPadSteps])
def local_gpu_pad_prefix(fgraph, node):
    """GpuPadSteps(y[:a][:b]...) -> GpuPadPrefix(y, n, *StepBucket(n)), n the slices'
    length: the pad is captured with what reads it, n a graph parameter, and the slices'
    views (plain steps before the graph) go."""
    prefix = _prefix_of(node.inputs[0])
    if prefix is None:
        return None
    base, n = prefix
    n = as_tensor_variable(n)
    if n.dtype != "int64":
        n = n.astype("int64")
    steps, varied = StepBucket(node.op.q)(n)
    return [GpuPadPrefix()(base, n, steps, varied), steps]


# after the lifting (the pad becomes GpuPadSteps there) and before gpu_shape_infer
optdb.register("gpu_pad_prefix", EquilibriumRewriter([local_gpu_pad_prefix],
                                                     name="gpu_pad_prefix"),
               POSITIONS["gpu"] + 0.6, "fast_run", "fast_compile", "gpu")
