"""Transfer ops (GpuFromHost, HostFromGpu, GpuToGpu) and the GPU view/shape ops.

Why here and small: placement is one subsystem (docs/internals.md). These ops only move or re-view
GpuArrays through the runtime API (symgpu.gpu.runtime.array); compute kernels live in elemwise.py,
blas.py and codegen/. Every class is a `Gpu*` op (or HostFromGpu) and none subclasses a CPU
op, so `isinstance(node.op, T.Elemwise)` tells CPU from GPU as in the seeds.

`TRANSFER_COUNTS` counts the transfers these ops performed (tests assert that shared
variables stay on the device across calls).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.runtime.graph_params import pack_scalar, slot_ptr
from symgpu.gpu.placement.type import (GpuArrayConstant, GpuArrayType, gpu_type_like, is_gpu_var,
                                       register_conversions)
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import GpuArray, get_many, new_array, to_gpu
from symgpu.gpu.runtime.context import ContextNotFound
from symgpu.gpu.runtime.copykernel import prefetch_request
from symgpu.gpu.runtime.host_register import upload
from symgpu.gpu.runtime.peer import copy_array
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op, PerformThunk
from symgpu.tensor.basic import Alloc as _Alloc, Reshape as _Reshape
from symgpu.tensor.elemwise import DimShuffle as _DimShuffle
from symgpu.tensor.shape import (Shape as _Shape, Shape_i as _Shape_i,
                                 SpecifyBroadcastable as _SpecifyBroadcastable,
                                 Unbroadcast as _Unbroadcast, check_declared_broadcastable)
from symgpu.tensor.transfer import TransferError, register_transfer
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["GpuFromHost", "HostFromGpu", "GpuToGpu", "GpuContiguous", "GpuDimShuffle",
           "GpuReshape", "GpuShape", "GpuShape_i", "GpuSpecifyBroadcastable", "GpuUnbroadcast",
           "GpuAlloc", "gpu_from_host", "host_from_gpu", "as_gpuarray_variable",
           "gpu_contiguous", "gpu_alloc", "specify_gpu_broadcastable_as", "TRANSFER_COUNTS",
           "reset_transfer_counts", "TRANSFER_OPS", "maybe_strided"]

#: transfers performed, by kind ('host_to_gpu', 'gpu_to_host', 'gpu_to_gpu', and
#: 'device_copy': a device array fed to a host-typed input, copied on the device) and bytes
TRANSFER_COUNTS: Counter = Counter()


def reset_transfer_counts() -> None:
    """Zero `TRANSFER_COUNTS` (tests call it before counting)."""
    TRANSFER_COUNTS.clear()


def _count(kind: str, nbytes: int) -> None:
    TRANSFER_COUNTS[kind] += 1
    TRANSFER_COUNTS[kind + "_bytes"] += int(nbytes)


def _get_context(name: str | None) -> Any:
    return gpu_context.get_context(name)


def _is_device_array(value: Any) -> bool:
    """Whether `value` lives in CUDA device memory (GpuArray, __cuda_array_interface__, or a
    DLPack producer on a CUDA device). Never raises."""
    if isinstance(value, (np.ndarray, np.generic, int, float, bool, list, tuple)):
        return False
    if isinstance(value, GpuArray):
        return True
    try:
        device = getattr(value, "__dlpack_device__", None)
        if device is not None:
            return int(device()[0]) in (2, 13)  # kDLCUDA, kDLCUDAManaged
        return hasattr(value, "__cuda_array_interface__")
    # broad on purpose: this probes the caller's own object, whose properties and
    # __dlpack_device__ may raise anything; any failure means "not a device array", and the
    # host path then reports what is wrong with the value (TensorType.filter's error)
    except Exception:
        return False


def _host_grad(gz: Any) -> TensorVariable:
    return gz if isinstance(gz, TensorVariable) else as_tensor_variable(gz)


# ----------------------------------------------------------------------------- transfers

class GpuFromHost(Op):
    """Upload a host tensor to the context `context_name` (None = the default one)."""

    __props__ = ("context_name",)
    transfer = "upload"  # compile.devices: host to device
    copies_value = True  # rewrites may see a constant through it (graph.basic.constant_behind)

    def __init__(self, context_name: str | None = None):
        self.context_name = context_name

    def __str__(self) -> str:
        return f"GpuFromHost<{self.context_name}>"

    def make_node(self, x: Any) -> Apply:
        if is_gpu_var(x):
            raise TypeError(f"{self}: {x} is already on the GPU ({x.type}); use GpuToGpu or "
                            "as_gpuarray_variable")
        x = as_tensor_variable(x)
        return Apply(self, [x], [gpu_type_like(x, self.context_name)()])

    def device_input_filter(self, host_type: TensorType) -> Callable[[Any, bool, Any], Any]:
        """How a CUDA array (GpuArray, torch/CuPy/PyCUDA...) fed to a host input that only
        this op reads stays on the device (compile/function.py asks once per input): the
        returned ``take(value, strict, allow_downcast)`` gives a GpuArray, or None for a value
        that is not a device array (the host path takes it).  The upload's thunk then hands
        that array on as its output, read in place, when nothing could write into it or give
        it back to the caller (``_UploadThunk.may_borrow``, decided when the function is
        linked), and `perform` copies it on the device otherwise.  A foreign array (torch,
        CuPy) is such a GpuArray too: a view whose ``base`` keeps the owner's memory alive.  A
        GpuArray of the input's dtype, rank and context passes with no more than attribute
        checks: this runs on every call of a function fed device arrays."""
        gtype = GpuArrayType(host_type.dtype, host_type.broadcastable, self.context_name)
        dtype, ndim = np.dtype(host_type.dtype), host_type.ndim
        ones = [i for i, b in enumerate(host_type.broadcastable) if b]
        context: list = []        # the context, looked up on the first call

        def passes(value: Any) -> bool:
            """Whether ``value`` is taken as it is: a GpuArray of the input's dtype, rank,
            broadcast pattern and context (the function's generated call tests this first)."""
            if type(value) is GpuArray and value.dtype == dtype and len(value.shape) == ndim \
                    and (not ones or all(value.shape[i] == 1 for i in ones)):
                if not context:
                    context.append(gtype.context)
                return value.context is context[0]
            return False

        def take(value: Any, strict: bool, allow_downcast: Any) -> Any:
            if passes(value):
                return value
            if not _is_device_array(value):
                return None
            return gtype.filter(value, strict=strict, allow_downcast=allow_downcast)
        take.accept = passes   # type: ignore[attr-defined]
        return take

    def perform(self, node, inputs, out):
        x = inputs[0]
        if isinstance(x, GpuArray):  # from device_input_filter: no host round trip; a fresh
            out[0][0] = x.copy()     # buffer, as an in-place kernel may overwrite this output
            # or it may leave the call (else _UploadThunk hands x on itself: may_borrow)
            _count("device_copy", x.nbytes)
            return
        out[0][0] = to_gpu(x, _get_context(self.context_name))
        _count("host_to_gpu", x.nbytes)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """A one-element host value (shape-derived scalars such as ``x.shape[0]``, scalar
        inputs) goes up as a driver memset of its bytes: asynchronous, no staging buffer, and
        capturable into a CUDA graph, whose key holds the host value (graph_plan.py), so a
        replay only happens for the value the memset was recorded with."""
        if not all(node.inputs[0].type.broadcastable):
            return _UploadThunk(self, node, storage_map, compute_map)
        return _ScalarUploadThunk(self, node, storage_map, compute_map)

    infer_shape = _Unbroadcast.infer_shape  # the value moves or is copied: same shape

    def grad(self, inputs, output_grads):
        return [_host_grad(output_grads[0])]

    def R_op(self, inputs, eval_points):
        ep = eval_points[0]
        return [None if ep is None else self(ep)]


class _UploadThunk(PerformThunk):
    """GpuFromHost of an array.  A device array fed to the host input is used as it is when
    ``may_borrow`` (set when the function is linked: gpu/exec/graph_plan.py
    ``mark_reusable_outputs``): the upload's output never leaves the call and no node
    overwrites it, so the caller's memory is only read.  Otherwise it is copied."""

    __slots__ = ("may_borrow", "device_array", "ctx", "dtype", "new_array", "upload")

    def __init__(self, op: "GpuFromHost", node: Apply, storage_map: dict, compute_map: dict):
        super().__init__(op, node, storage_map, compute_map)
        self.may_borrow, self.device_array = False, GpuArray
        self.ctx: Any = None      # looked up at the first call (linking needs no GPU)
        self.dtype = np.dtype(node.outputs[0].dtype)
        self.new_array, self.upload = new_array, upload

    def __call__(self) -> None:
        x = self.inputs[0][0]
        if type(x) is np.ndarray and x.dtype == self.dtype and x.flags.c_contiguous:
            # what the input's filter gives: straight into a pool block (no checks again)
            ctx = self.ctx
            if ctx is None:
                ctx = self.ctx = _get_context(self.op.context_name)
            out = self.new_array(ctx, x.shape, self.dtype)
            if x.size:
                ctx.activate()
                self.upload(ctx, out.ptr, x)
            self.outputs[0][0] = out
            _count("host_to_gpu", x.nbytes)
            return
        if self.may_borrow and type(x) is self.device_array:
            self.outputs[0][0] = x
            return
        self.perform(self.node, [x], self.outputs)


class _ScalarUploadThunk(PerformThunk):
    """GpuFromHost of a one-element value: a pool block set with memsets (see make_thunk)."""

    # param_*: symgpu/gpu/runtime/graph_params.py: under a capture with a slot, the value is copied
    # on the device from the graph's parameter block, so one graph serves every value
    __slots__ = ("ctx", "shape", "strides", "dtype", "device_array", "new_array",
                 "param_slot", "param_nbytes")
    capturable = True
    launches = True

    def __init__(self, op: "GpuFromHost", node: Apply, storage_map: dict, compute_map: dict):
        super().__init__(op, node, storage_map, compute_map)
        self.ctx = _get_context(op.context_name)
        self.shape = (1,) * node.inputs[0].ndim
        self.dtype = np.dtype(node.outputs[0].dtype)
        self.strides = (self.dtype.itemsize,) * len(self.shape)   # C order, every dim 1
        self.device_array, self.new_array = GpuArray, new_array
        self.param_slot: tuple | None = None
        self.param_nbytes = -(-self.dtype.itemsize // 8) * 8

    def param_values(self) -> tuple[tuple, bytes]:
        """(nothing for the key, the value's bytes); a device array fed to the input makes
        the segment run plainly (its value cannot be packed)."""
        x = self.inputs[0][0]
        if isinstance(x, self.device_array):
            raise TypeError("a device array fed to a host input")
        return (), pack_scalar(x, self.dtype)

    def __call__(self) -> None:
        x = self.inputs[0][0]
        if isinstance(x, self.device_array):   # a device array fed to the input: plain path
            self.perform(self.node, [x], self.outputs)
            return
        dtype = self.dtype
        out = self.new_array(self.ctx, self.shape, dtype, self.strides, dtype.itemsize)
        slot = self.param_slot
        if slot is not None:                   # capturing: read from the parameter block
            import pycuda.driver as drv
            drv.memcpy_dtod_async(out.ptr, slot_ptr(slot), self.dtype.itemsize,
                                  self.ctx.stream)
            self.outputs[0][0] = out
            return
        out._memset(np.asarray(x, dtype=dtype).reshape(()).tobytes(), 1)   # out.fill(x)
        self.outputs[0][0] = out
        _count("host_to_gpu", dtype.itemsize)


class HostFromGpu(Op):
    """Copy a GpuArray back to a host ndarray: the copy lands in a pinned buffer leased from
    the context's pool, which the returned array owns (no second host copy)."""

    __props__ = ()
    transfer = "download"  # compile.devices: device to host

    def __str__(self) -> str:
        return "HostFromGpu(gpuarray)"

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x} "
                            f"({getattr(x, 'type', type(x).__name__)})")
        return Apply(self, [x], [x.type.tensor_type()()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        out[0][0] = x.get()
        _count("gpu_to_host", x.nbytes)

    @staticmethod
    def perform_many(values: Sequence[Any]) -> list[np.ndarray]:
        """Host copies of several GpuArrays with one stream sync (the VM's graph runner
        batches adjacent HostFromGpu nodes through this)."""
        results = get_many(values)
        for x in values:
            _count("gpu_to_host", x.nbytes)
        return results

    infer_shape = _Unbroadcast.infer_shape  # the value moves or is copied: same shape

    def grad(self, inputs, output_grads):
        return [as_gpuarray_variable(output_grads[0], inputs[0].type.context_name)]

    def R_op(self, inputs, eval_points):
        ep = eval_points[0]
        return [None if ep is None else self(ep)]


class GpuToGpu(Op):
    """Copy a GpuArray to another context (a no-copy view when both names share one).

    Between two devices the copy is device to device on the destination's stream, ordered
    after the source's work by events, with no host sync (runtime/peer.py): a function
    using two GPUs keeps both busy.  Not capturable: a CUDA graph holds one device's work
    (gpu/exec/graphs.py splits a function's segments per context)."""

    __props__ = ("context_name",)
    transfer = "device"  # compile.devices: device to device
    view_map = {0: [0]}
    copies_value = True

    def __init__(self, context_name: str | None = None):
        self.context_name = context_name

    def __str__(self) -> str:
        return f"GpuToGpu<{self.context_name}>"

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        return Apply(self, [x], [x.type.clone(context_name=self.context_name)()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        ctx = _get_context(self.context_name)
        if x.context is ctx:
            out[0][0] = x
            return
        out[0][0] = copy_array(x, ctx)
        _count("gpu_to_gpu", x.nbytes)

    infer_shape = _Unbroadcast.infer_shape  # the value moves or is copied: same shape

    def grad(self, inputs, output_grads):
        return [as_gpuarray_variable(output_grads[0], inputs[0].type.context_name)]


TRANSFER_OPS = (GpuFromHost, HostFromGpu, GpuToGpu)
_host_from_gpu = HostFromGpu()


def gpu_from_host(x: Any, context_name: str | None = None) -> Variable:
    """Upload `x` to context `context_name` (None = the default context)."""
    return GpuFromHost(context_name)(x)


def host_from_gpu(x: Any) -> TensorVariable:
    """The host copy of GPU variable `x` (`x` itself if it already is a host tensor)."""
    if not is_gpu_var(x):
        return as_tensor_variable(x)
    return _host_from_gpu(x)


def as_gpuarray_variable(x: Any, context_name: str | None = None) -> Variable:
    """`x` as a GPU variable on `context_name`: GPU variables pass (or are copied to that
    context), `HostFromGpu(y)` gives back `y`, host values and tensors are uploaded."""
    if is_gpu_var(x):
        if x.type.context_name == context_name:
            return x
        return GpuToGpu(context_name)(x)
    if isinstance(x, Variable) and x.owner is not None and isinstance(x.owner.op, HostFromGpu):
        return as_gpuarray_variable(x.owner.inputs[0], context_name)
    if isinstance(x, GpuArray):
        t = GpuArrayType(x.dtype.name, (False,) * x.ndim, context_name)
        return GpuArrayConstant(t, x)
    return GpuFromHost(context_name)(as_tensor_variable(x))


# ----------------------------------------------------------------------------- views

def maybe_strided(var: Any) -> bool:
    """Whether the GPU variable ``var`` may be a strided view: a stepped or reversed slice or
    a transpose lies on its chain of views.  Ops that copy such a value into contiguous
    memory (with the strided-copy kernel, ``copykernel.prefetch_request()``) ask this to
    prefetch that module only where a graph will need it."""
    while var.owner is not None:
        op = var.owner.op
        view_map = getattr(op, "view_map", None) or {}
        src = view_map.get(var.owner.outputs.index(var))
        if not src:
            return False
        for entry in getattr(op, "idx_list", ()) or ():
            if getattr(entry, "step", None) not in (None, 1):
                return True
        order = [d for d in getattr(op, "new_order", ()) if d != "x"]
        if order != sorted(order):
            return True
        var = var.owner.inputs[src[0]]
    return False



class GpuContiguous(Op):
    """`x` itself if it is C-contiguous, else a C-contiguous copy (kernels that need dense
    input put this in front of it)."""

    __props__ = ()
    view_map = {0: [0]}
    capturable = True   # a pool allocation and a copy on the stream at most (graphs.py)

    def make_node(self, x: Any) -> Apply:
        x = as_gpuarray_variable(x, getattr(getattr(x, "type", None), "context_name", None))
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        out[0][0] = x if x.is_c_contiguous else x.copy()

    infer_shape = _Unbroadcast.infer_shape  # the value moves or is copied: same shape

    def grad(self, inputs, output_grads):
        return [output_grads[0]]


def gpu_contiguous(x: Any) -> Variable:
    """A C-contiguous version of GPU variable `x` (a no-op at run time when it is already)."""
    if is_gpu_var(x) and x.owner is not None and isinstance(x.owner.op, GpuContiguous):
        return x
    return GpuContiguous()(x)


class GpuDimShuffle(Op):
    """DimShuffle on the GPU: a pure view (transpose, drop length-1 dims, insert 'x')."""

    __props__ = ("input_broadcastable", "new_order")
    view_map = {0: [0]}
    capturable = True   # a view: host bookkeeping only (graphs.py)

    def __init__(self, input_broadcastable: Sequence[bool], new_order: Sequence[Any]):
        self.input_broadcastable = tuple(bool(b) for b in input_broadcastable)
        self.new_order = tuple(new_order)
        ref = _DimShuffle(self.input_broadcastable, self.new_order)  # validates the pattern
        self._perm = tuple(ref.shuffle) + tuple(ref.drop)
        self._identity_perm = self._perm == tuple(range(len(self._perm)))
        self._key = tuple(None if d == "x" else slice(None) for d in self.new_order) + \
            (0,) * len(ref.drop)
        # the view as a plan: output dim j reads input dim _src[j] of (shape + (1,), strides
        # + (0,)), so an 'x' (index nd) is a length 1 of stride 0; dropped dims must be 1
        self._nd = nd = len(self.input_broadcastable)
        self._src = tuple(nd if d == "x" else d for d in self.new_order)
        self._drop = tuple(ref.drop)

    def __str__(self) -> str:
        return f"GpuDimShuffle{{{','.join(str(d) for d in self.new_order)}}}"

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        if len(x.broadcastable) != len(self.input_broadcastable) or any(
                b and not xb for b, xb in zip(self.input_broadcastable, x.broadcastable)):
            raise TypeError(f"{self} expects an input with broadcastable pattern "
                            f"{self.input_broadcastable}, got {x.type}")
        bcast = tuple(True if d == "x" else x.broadcastable[d] for d in self.new_order)
        return Apply(self, [x], [x.type.clone(broadcastable=bcast)()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        shape = x.shape
        drop = self._drop
        if self._key and len(shape) == self._nd and \
                (not drop or all(shape[d] == 1 for d in drop)):
            src = self._src        # the plan (__init__): no transpose, no index parsing
            out[0][0] = x._view(x.ptr, tuple(map((shape + (1,)).__getitem__, src)),
                                tuple(map((x.strides + (0,)).__getitem__, src)))
            return
        out[0][0] = self.general_view(x)

    def general_view(self, x: Any) -> Any:
        """The view through GpuArray's general routines (transpose, then basic indexing):
        what ``perform``'s plan computes, and the errors for an input it does not fit."""
        if not self._identity_perm:
            x = x.transpose(self._perm)
        return x[self._key] if self._key else x

    infer_shape = _DimShuffle.infer_shape

    def grad(self, inputs, output_grads):
        x = inputs[0]
        host_x = x.type.tensor_type()()
        (g,) = _DimShuffle(self.input_broadcastable, self.new_order).grad(
            [host_x], [_host_grad(output_grads[0])])
        return [as_gpuarray_variable(g, x.type.context_name)]


class GpuReshape(Op):
    """Reshape on the GPU: a view when the input is C-contiguous, else a contiguous copy.
    The target shape is a host int64 vector."""

    __props__ = ("ndim",)
    view_map = {0: [0]}
    capturable = True   # a view, or a contiguous copy on the stream (graphs.py)

    def __init__(self, ndim: int):
        self.ndim = int(ndim)

    def __str__(self) -> str:
        return f"GpuReshape{{{self.ndim}}}"

    def make_node(self, x: Any, shp: Any, broadcastable: Sequence[bool] | None = None) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        shp = host_from_gpu(shp)
        if shp.ndim != 1 or shp.dtype[0] not in "iu":
            raise TypeError(f"{self}: the shape must be an integer vector, got {shp.type}")
        bcast = tuple(broadcastable) if broadcastable is not None else (False,) * self.ndim
        return Apply(self, [x, shp], [x.type.clone(broadcastable=bcast)()])

    # GpuArray.reshape has NumPy's contract (a view when possible): the host op's run-time
    # code applies unchanged (shared as a function, not by subclassing the CPU op)
    perform = _Reshape.perform

    infer_shape = _Reshape.infer_shape

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The strided-copy module when the input may be a strided view (reshaping it copies
        with that kernel): compiled with the function's kernels, not on the first call."""
        return [prefetch_request()] if maybe_strided(node.inputs[0]) else []

    def grad(self, inputs, output_grads):
        x, shp = inputs
        host_x = host_from_gpu(x)
        g = _Reshape(self.ndim).grad([host_x, shp], [_host_grad(output_grads[0])])[0]
        return [None if g is None else as_gpuarray_variable(g, x.type.context_name), None]


class _GpuRebroadcast(Op):
    """Base of the two broadcast-pattern view ops (no device work); a subclass says which
    dims it is about (``_axes()``) and the pattern it gives (``_out_bcast(bcast)``)."""

    view_map = {0: [0]}
    capturable = True

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        if x.ndim != len(self._axes()):
            raise TypeError(f"{self}: {x} has {x.ndim} dimensions")
        return Apply(self, [x], [x.type.clone(broadcastable=self._out_bcast(x.broadcastable))()])


class GpuSpecifyBroadcastable(_GpuRebroadcast):
    """Checks at run time that some dims have length 1, so the type can say so."""

    __props__ = ("broadcastable",)

    def __init__(self, broadcastable: Sequence[bool]):
        self.broadcastable = tuple(bool(b) for b in broadcastable)

    def _axes(self) -> tuple[bool, ...]:
        return self.broadcastable

    def _out_bcast(self, bcast):
        return tuple(a or b for a, b in zip(bcast, self.broadcastable))

    def perform(self, node, inputs, out):
        out[0][0] = check_declared_broadcastable(inputs[0], self.broadcastable)

    infer_shape = _SpecifyBroadcastable.infer_shape

    def grad(self, inputs, output_grads):
        return [as_gpuarray_variable(output_grads[0], inputs[0].type.context_name)]


class GpuUnbroadcast(_GpuRebroadcast):
    """Forget that some dims are known to have length 1 (no run-time cost)."""

    __props__ = ("axes",)

    def __init__(self, axes: Sequence[bool]):
        self.axes = tuple(bool(a) for a in axes)

    def _axes(self) -> tuple[bool, ...]:
        return self.axes

    def _out_bcast(self, bcast):
        return tuple(b and not a for b, a in zip(bcast, self.axes))

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    infer_shape = _Unbroadcast.infer_shape

    def grad(self, inputs, output_grads):
        x = inputs[0]
        g = as_gpuarray_variable(output_grads[0], x.type.context_name)
        return [specify_gpu_broadcastable_as(g, x.type.clone(dtype=g.dtype))]


def specify_gpu_broadcastable_as(x: Variable, gtype: GpuArrayType) -> Variable:
    """GPU variable `x` with the broadcast pattern of `gtype` (run-time checked where dims
    become broadcastable; relaxed where `x` knows more), like specify_broadcastable_as."""
    if x.broadcastable == gtype.broadcastable:
        return x
    needed = tuple(b and not xb for b, xb in zip(gtype.broadcastable, x.broadcastable))
    if any(needed):
        x = GpuSpecifyBroadcastable(needed)(x)
    if x.broadcastable != gtype.broadcastable:
        x = GpuUnbroadcast(tuple(xb and not b for xb, b in
                                 zip(x.broadcastable, gtype.broadcastable)))(x)
    return x


# ----------------------------------------------------------------------------- shapes

class GpuShape(Op):
    """The shape of a GpuArray as a host int64 vector (read from the array, no device work)."""

    __props__ = ()
    capturable = True
    shape_read = "all"  # its value is its input's whole shape (as the host Shape's)

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        return Apply(self, [x], [TensorType("int64", (False,))()])

    perform = _Shape.perform  # reads only the (host-side) shape tuple
    grad = _Shape.grad
    infer_shape = _Shape.infer_shape


class GpuShape_i(Op):
    """The length of one dimension of a GpuArray as a host int64 scalar."""

    __props__ = ("i",)
    capturable = True
    shape_read = "dim"  # its value is one dimension's length (as the host Shape_i's)

    def __init__(self, i: int):
        self.i = int(i)

    def __str__(self) -> str:
        return f"GpuShape_i{{{self.i}}}"

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        if not 0 <= self.i < x.ndim:
            raise ValueError(f"{self}: {x} has only {x.ndim} dimensions")
        return Apply(self, [x], [TensorType("int64", ())()])

    perform = _Shape_i.perform
    infer_shape = _Shape_i.infer_shape

    def grad(self, inputs, output_grads):
        return [None]


# ----------------------------------------------------------------------------- alloc

class GpuAlloc(Op):
    """A new GpuArray of the given shape filled with `value` broadcast to it: a memset for a
    host scalar, a broadcasting device copy for a GPU value."""

    __props__ = ("context_name",)

    def __init__(self, context_name: str | None = None):
        self.context_name = context_name

    def __str__(self) -> str:
        return f"GpuAlloc<{self.context_name}>"

    def make_node(self, value: Any, *shape: Any,
                  broadcastable: Sequence[bool] | None = None) -> Apply:
        if not is_gpu_var(value):
            value = as_tensor_variable(value)
            if value.ndim:
                value = as_gpuarray_variable(value, self.context_name)
        elif value.type.context_name != self.context_name:
            value = GpuToGpu(self.context_name)(value)
        shape = [host_from_gpu(s) for s in shape]
        for s in shape:
            if s.ndim != 0 or s.dtype[0] not in "iu":
                raise TypeError(f"{self}: shape entries must be integer scalars, got {s.type}")
        if value.ndim > len(shape):
            raise ValueError(f"{self}: the value has {value.ndim} dims, more than the shape's "
                             f"{len(shape)}")
        bcast = tuple(broadcastable) if broadcastable is not None else (False,) * len(shape)
        out = GpuArrayType(value.dtype, bcast, self.context_name)()
        return Apply(self, [value, *shape], [out])

    def perform(self, node, inputs, out):
        v, target = inputs[0], tuple(int(s) for s in inputs[1:])
        if any(s < 0 for s in target):
            raise ValueError(f"{self}: negative dimension in the shape {target}")
        res = GpuArray(target, node.outputs[0].type.dtype, _get_context(self.context_name))
        if not isinstance(v, GpuArray):
            res.fill(np.asarray(v).reshape(()).item())
        elif v.size == 1:
            res.fill(v.get().reshape(()).item())
        else:
            res._copy_from_device(v._broadcast_to(target, str(self)))
        out[0][0] = res

    infer_shape = _Alloc.infer_shape

    def grad(self, inputs, output_grads):
        value = inputs[0]
        host_v = host_from_gpu(value)
        g = _Alloc().grad([host_v, *inputs[1:]], [_host_grad(output_grads[0])])
        g0 = g[0]
        if g0 is not None and is_gpu_var(value):
            g0 = as_gpuarray_variable(g0, value.type.context_name)
        return [g0] + [None] * (len(inputs) - 1)


def gpu_alloc(value: Any, *shape: Any, context_name: str | None = None) -> Variable:
    """`value` broadcast to `shape` in a new GpuArray on `context_name`."""
    return GpuAlloc(context_name)(value, *shape)


# ----------------------------------------------------------------------------- transfer()

@register_transfer
def _gpu_transfer(var: Variable, target: str | None) -> Variable:
    """Serve `var.transfer(None | name)`: the context must exist (clear error otherwise)."""
    try:
        _get_context(target)
    except ContextNotFound as exc:
        raise TransferError(f"cannot transfer {var} to {target!r}: {exc}") from None
    return as_gpuarray_variable(var, target)


def _to_gpu_type(var: Variable, gtype: GpuArrayType) -> Variable:
    """``var`` moved to ``gtype``: uploaded or copied to its context, its broadcast pattern
    specified (GpuArrayType.convert_variable)."""
    return specify_gpu_broadcastable_as(as_gpuarray_variable(var, gtype.context_name), gtype)


register_conversions(host_from_gpu, _to_gpu_type)
