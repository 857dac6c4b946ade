"""GPU indexing and joining: GpuSubtensor (a view), GpuIncSubtensor (set/inc into a copy or
in place), GpuJoin (device copies into slices of a new array), and their lifters.

Indices follow the CPU ops' `idx_list` convention (symgpu/tensor/subtensor.py): constants are
folded into the props and symbolic parts arrive as host int scalars (they stay on the host in
lifted graphs). The data movement is GpuArray's: basic-index views, the strided device copy
(symgpu/gpu/runtime/copykernel.py) for set and join, and its strided "+=" twin for inc.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.gpu.runtime.graph_params import (dyn_slice_copy, load_kernels, pack_int64,
                                          prefetch_request, slot_ptr)
from symgpu.gpu.ops.elemwise import gpu_elemwise
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, host_from_gpu
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.gpu.runtime.array import GpuArray, new_array
from symgpu.gpu.runtime.copykernel import (INC_DTYPES, MAX_JOIN, join_strides, strided_join,
                                           prefetch_request as strided_copy_request,
                                           strided_inc)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op, PerformThunk
from symgpu.tensor.basic import Join as _Join, join_broadcastable
from symgpu.tensor.subtensor import (IncSubtensor as _IncSubtensor, IncSubtensorProps, Slice,
                                     Subtensor as _Subtensor, SYM, _check_inputs, _constant_index,
                                     _entry_str, build_index, index_broadcastable)
from symgpu.printing import PP_PRINTERS, register_pp
from symgpu.scalar.dtypes import is_float

__all__ = ["GpuSubtensor", "GpuIncSubtensor", "GpuJoin"]

def _host_index(index: Sequence[Any]) -> list:
    out = []
    for i in index:
        i = host_from_gpu(i)
        out.append(i)
    return out


def _index_key(idx_list: tuple, const: tuple | None, values: Sequence) -> tuple:
    if const is not None:
        return const
    return build_index(idx_list, [np.asarray(v) for v in values])


def _check_basic(op: Op, idx_list: tuple) -> None:
    for e in idx_list:
        if not (e is None or e is Ellipsis or isinstance(e, (int, str, Slice))) or \
                isinstance(e, bool):
            raise TypeError(f"{op}: unsupported index entry {e!r}")


# ----------------------------------------------------------------------------- GpuSubtensor

class GpuSubtensor(Op):
    """Basic indexing of a GpuArray (ints, slices, newaxis, Ellipsis) as a view; symbolic
    index parts are host int scalars. A negative step yields a copy (GPU kernels assume
    non-negative strides)."""

    __props__ = ("idx_list",)
    view_map = {0: [0]}
    basic_indexing = True  # shape rules: lengths follow from the bounds (as Subtensor's)

    def __init__(self, idx_list: Sequence):
        self.idx_list = tuple(idx_list)
        _check_basic(self, self.idx_list)
        self._const = _constant_index(self.idx_list)

    def __str__(self) -> str:
        return f"GpuSubtensor{{{', '.join(_entry_str(e) for e in self.idx_list)}}}"

    infer_shape = _Subtensor.infer_shape

    def make_node(self, x: Any, *index: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        index = _host_index(index)
        _check_inputs(self, self.idx_list, index, False)
        bcast = index_broadcastable(x.broadcastable, self.idx_list, index)
        return Apply(self, [x, *index], [x.type.clone(broadcastable=tuple(bcast))()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        key = _index_key(self.idx_list, self._const, inputs[1:])
        if Ellipsis not in key:
            key = key + (Ellipsis,)
        try:
            out[0][0] = x[key]
        except IndexError as exc:
            raise IndexError(f"{self}: {exc} (indexing an array of shape {x.shape})") from None

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The dynamic-slice kernels a captured graph runs (symbolic bounds only)."""
        return [prefetch_request()] if len(node.inputs) > 1 else []

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """A thunk CUDA graphs may capture (symgpu/gpu/exec/graphs.py): a view on the host, and
        under a capture with a parameter slot (symbolic bounds, symgpu/gpu/runtime/graph_params.py)
        a copy of the slice whose offset the kernel reads from the graph's parameter block,
        so one graph serves every value of the bounds (JAX's dynamic_slice)."""
        return _SliceThunk(self, node, storage_map, compute_map)

    def grad(self, inputs, output_grads):
        x, rest = inputs[0], inputs[1:]
        if not is_float(x.dtype):
            return [None] * len(inputs)
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        zeros = gpu_elemwise("second", x, np.asarray(0, dtype=x.dtype))
        return [GpuIncSubtensor(self.idx_list)(zeros, gz, *rest)] + [None] * len(rest)


class _SliceThunk(PerformThunk):
    """GpuSubtensor's thunk: ``perform`` (a view), or the parameter protocol of
    symgpu/gpu/runtime/graph_params.py when its bounds are symbolic."""

    __slots__ = ("param_slot", "param_nbytes", "rows", "item", "keep_layout", "seen_layout")
    capturable = True   # a view (host bookkeeping), or one launch under a capture
    launches = False
    #: the parameters read x (input 0) only through its layout: x may be computed inside the
    #: segment (graph_params.py), which then passes a stand-in of the layout it last saw
    param_layout_input = 0

    def __init__(self, op: GpuSubtensor, node: Apply, storage_map: dict, compute_map: dict):
        super().__init__(op, node, storage_map, compute_map)
        self.param_slot: tuple | None = None
        if len(node.inputs) > 1 and np.dtype(node.inputs[0].dtype).itemsize in (1, 2, 4, 8):
            self.param_nbytes = 8   # the slice's byte offset from x's pointer
        #: x[a:b] on the first axis (the minibatch of a data set): computed directly per call
        self.rows = op.idx_list == (Slice(SYM, SYM, None),)
        #: x[i] on the first axis (a loop's last state: buffer[n] of a padded run)
        self.item = op.idx_list == (SYM,)
        #: set by a segment whose parameters need x's layout after the run (x computed
        #: inside it): each run leaves x's (context, shape, strides, dtype) and its key part
        #: in seen_layout
        self.keep_layout = False
        self.seen_layout: tuple | None = None

    def _view(self, x: Any = None) -> tuple[Any, Any, bool]:
        op = self.op
        if x is None:
            x = self.inputs[0][0]
        key = _index_key(op.idx_list, op._const, [c[0] for c in self.inputs[1:]])
        if Ellipsis not in key:
            key = key + (Ellipsis,)
        try:
            view, reversed_ = x._basic_view(key)
        except IndexError as exc:
            raise IndexError(f"{op}: {exc} (indexing an array of shape {x.shape})") from None
        return x, view, reversed_

    def param_prepare(self) -> None:
        x = self.node.inputs[0]    # from its type: the segment may not have computed it yet
        load_kernels(x.type.context, itemsize=np.dtype(x.dtype).itemsize)

    def _rows(self, x: Any) -> tuple[tuple, int]:
        """x[a:b] of ``rows`` (x not 0-d): (its shape, its byte offset from x's pointer),
        as the general routine (GpuArray._basic_view) computes them."""
        shape = x.shape
        start, stop, _ = slice(int(self.inputs[1][0]), int(self.inputs[2][0])).indices(shape[0])
        n = stop - start if stop > start else 0
        return (n,) + shape[1:], start * x.strides[0] if n else 0

    def param_values(self, x: Any = None) -> tuple[tuple, bytes]:
        """(the slice's shape and strides, its byte offset from x's pointer); ``x`` stands in
        for the input (an array of its layout) where the segment computes it."""
        if x is None:
            x = self.inputs[0][0]
        if self.rows and x.shape:
            shape, offset = self._rows(x)
            return (shape, x.strides), pack_int64(offset)
        if self.item and x.shape:
            i, n = int(self.inputs[1][0]), x.shape[0]
            if -n <= i < n:     # (else the general routine raises its IndexError)
                return (x.shape[1:], x.strides[1:]), pack_int64((i % n) * x.strides[0])
        x, view, _ = self._view(x)
        return (view.shape, view.strides), pack_int64(view.ptr - x.ptr)

    def __call__(self) -> None:
        slot = self.param_slot
        if self.keep_layout:
            x = self.inputs[0][0]
            self.seen_layout = (x.context, x.shape, x.strides, x.dtype, self.param_values()[0])
        if slot is None:
            x = self.inputs[0][0]
            if self.rows and x.shape:   # the minibatch's slice: no index key to parse
                shape, offset = self._rows(x)
                self.outputs[0][0] = x._view(x.ptr + offset, shape, x.strides)
                return
            self.perform(self.node, [c[0] for c in self.inputs], self.outputs)
            return
        x, view, _ = self._view()
        out = new_array(x.context, view.shape, view.dtype)
        dyn_slice_copy(x.context, x.ptr, slot_ptr(slot), out.ptr, view.shape, view.strides,
                       out.strides, view.itemsize)
        self.outputs[0][0] = out


# ----------------------------------------------------------------------------- GpuIncSubtensor

class GpuIncSubtensor(IncSubtensorProps):
    """``x`` with ``x[idx]`` set to (or incremented by) ``y`` broadcast to the region: a copy
    of ``x`` unless ``inplace``; the region is a view written by a device copy (set) or a
    strided "+=" kernel (inc)."""

    # a pool allocation and copies or one "+=" launch on the stream; the host work (the
    # region's view, its index errors) depends only on shapes and host indices, which are
    # part of every graph's key (graphs.py, scan_graph.py): a loop's gradient body, which
    # writes each gate's slice of a fused product's gradient so, is captured whole
    capturable = True
    launches = True

    def __init__(self, idx_list: Sequence, set_instead_of_inc: bool = False,
                 inplace: bool = False):
        super().__init__(idx_list, set_instead_of_inc, inplace)
        _check_basic(self, self.idx_list)

    def make_node(self, x: Any, y: Any, *index: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        y = as_gpuarray_variable(y, x.type.context_name)
        index = _host_index(index)
        _check_inputs(self, self.idx_list, index, False)
        region = index_broadcastable(x.broadcastable, self.idx_list, index)
        if y.ndim > len(region):
            raise ValueError(f"{self}: the value {y} has {y.ndim} dimensions, more than the "
                             f"{len(region)} of the indexed region")
        if y.dtype != x.dtype:
            raise TypeError(f"{self}: the value {y} has dtype {y.dtype} but {x} has {x.dtype}")
        if not self.set_instead_of_inc and x.dtype not in INC_DTYPES:
            raise TypeError(f"{self}: no increment kernel for dtype {x.dtype}")
        return Apply(self, [x, y, *index], [x.type()])

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The strided-copy module, whose kernels write the region ("+=", or a broadcast
        set): compiled with the function's kernels, not on the first call."""
        return [strided_copy_request()]

    def perform(self, node, inputs, out):
        x, y = inputs[0], inputs[1]
        res = x if self.inplace else x.copy()
        key = _index_key(self.idx_list, self._const, inputs[2:])
        try:
            region = res._basic_view(key)[0]
        except IndexError as exc:
            raise IndexError(f"{self}: {exc} (indexing an array of shape {x.shape})") from None
        if region.size:
            src = y._broadcast_to(region.shape, str(self))
            if self.set_instead_of_inc:
                region._copy_from_device(src)
            else:
                strided_inc(region, src)
        out[0][0] = res


# ----------------------------------------------------------------------------- GpuJoin

def join_gpu_arrays(inputs: list, a: int, dtype: Any) -> GpuArray:
    """A new array of ``inputs`` (GPU arrays of one rank) concatenated along axis ``a``: every
    input copied on the device into its slice, by one kernel (copykernel.strided_join) when
    they are at most MAX_JOIN and each is (outer, axis, inner) with one stride per side (a
    gradient's gates joined in a BPTT step are one graph node, not one per gate)."""
    first = inputs[0].shape
    for x in inputs:
        if len(x.shape) != len(first) or any(
                s != f for d, (s, f) in enumerate(zip(x.shape, first)) if d != a):
            raise ValueError(f"join along axis {a}: the shapes "
                             f"{', '.join(str(i.shape) for i in inputs)} differ outside "
                             "that axis")
    shape = list(first)
    shape[a] = sum(x.shape[a] for x in inputs)
    res = GpuArray(tuple(shape), dtype, inputs[0].context)
    if _join_in_one_launch(res, inputs, a):
        return res
    start = 0
    for x in inputs:
        n = x.shape[a]
        if n and x.size:
            view = res[(slice(None),) * a + (slice(start, start + n),)]
            view._copy_from_device(x)
        start += n
    return res


def _join_in_one_launch(res: GpuArray, inputs: Sequence[GpuArray], a: int) -> bool:
    """Copy every input into ``res`` with one strided_join launch; False (nothing copied)
    where there are too many inputs or one is not (outer, axis, inner) with one stride each."""
    if not 1 < len(inputs) <= MAX_JOIN or res.dtype.itemsize not in (1, 2, 4, 8):
        return False
    parts, start = [], 0
    for x in inputs:
        st = join_strides(x.shape, x.strides, a)
        if st is None:
            return False
        parts.append((x.ptr, start, x.shape[a], st))
        start += x.shape[a]
    outer = int(np.prod(res.shape[:a], dtype=np.int64))
    inner = int(np.prod(res.shape[a + 1:], dtype=np.int64))
    strided_join(res.context, res.ptr, res.dtype.itemsize, outer, res.shape[a], inner, parts)
    return True


class GpuJoin(Op):
    """Concatenate GPU tensors of one dtype along ``axis``: a new array, each input copied
    on the device into its slice."""

    __props__ = ("axis",)
    capturable = True   # a pool allocation and copies on the stream (graphs.py)
    launches = True

    def __init__(self, axis: int):
        self.axis = int(axis)

    def __str__(self) -> str:
        return f"GpuJoin{{axis={self.axis}}}"

    infer_shape = _Join.infer_shape

    def make_node(self, *tensors: Any) -> Apply:
        if not tensors:
            raise ValueError("GpuJoin needs at least one tensor")
        ctx = next((t.type.context_name for t in tensors if is_gpu_var(t)), None)
        tensors = [as_gpuarray_variable(t, ctx) for t in tensors]
        nd = tensors[0].ndim
        dtype = tensors[0].dtype
        for i, t in enumerate(tensors):
            if t.ndim != nd or t.dtype != dtype:
                raise TypeError(f"{self}: input {i} ({t.type}) differs in rank or dtype from "
                                f"input 0 ({tensors[0].type})")
        bcast = join_broadcastable(tensors, self.axis, str(self))
        return Apply(self, tensors, [tensors[0].type.clone(broadcastable=bcast)()])

    def perform(self, node, inputs, out):
        out[0][0] = join_gpu_arrays(list(inputs), self.axis, node.outputs[0].dtype)

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The strided-copy module (the join kernel and the copies): compiled with the
        function's kernels, not on the first call."""
        return [strided_copy_request()]


# ----------------------------------------------------------------------------- lifters

@register_lifter(_Subtensor)
def lift_subtensor(op, node, context_name, inputs):
    if not inputs.was_on_gpu[0] and not is_gpu_var(inputs[0]):
        return None
    index = [inputs.host(i) for i in range(1, len(node.inputs))]
    return [GpuSubtensor(op.idx_list)(inputs[0], *index)]


@register_lifter(_IncSubtensor)
def lift_incsubtensor(op, node, context_name, inputs):
    if type(op) is not _IncSubtensor:
        return None
    x = inputs[0]
    if not is_gpu_var(x):
        return None
    if not op.set_instead_of_inc and x.dtype not in INC_DTYPES:
        return None
    y = inputs[1] if is_gpu_var(inputs[1]) else inputs.host(1)
    index = [inputs.host(i) for i in range(2, len(node.inputs))]
    # never in place here: the placement pass shares uploads among readers
    return [GpuIncSubtensor(op.idx_list, op.set_instead_of_inc, False)(x, y, *index)]


@register_lifter(_Join)
def lift_join(op, node, context_name, inputs):
    if not all(is_gpu_var(v) for v in inputs):
        return None
    if len({v.dtype for v in inputs}) != 1 or inputs[0].dtype != node.outputs[0].dtype:
        return None
    return [GpuJoin(op.axis)(*inputs)]


# pp prints the GPU indexing ops as their host twins
register_pp(GpuSubtensor, PP_PRINTERS[_Subtensor])
register_pp(GpuIncSubtensor, PP_PRINTERS[_IncSubtensor])
