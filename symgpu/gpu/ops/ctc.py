"""The CTC loss on the GPU through cuDNN: GpuConnectionistTemporalClassification (Theano's
`theano.gpuarray.ctc`), `gpu_ctc`, and the lifter from symgpu/tensor/nnet/ctc.py's op.

Same inputs, outputs and results as the host op (see its docstring): activations (time,
batch, alphabet) un-normalised float32, labels (batch, width) int32 padded with negative
values, input lengths (batch,) int32; costs (batch,) and, with `compute_grad`, the gradient
(time, batch, alphabet). cuDNN's `cudnnCTCLoss_v8` (deterministic algorithm, softmax applied
by cuDNN: CUDNN_LOSS_NORMALIZATION_SOFTMAX, gradient wrt the un-normalised activations) wants
the labels concatenated and the lengths as int32 device arrays: one single-block kernel of
ours (runtime/codegen/ctc.cu, `ctc_pack`) counts each row's labels, checks them and the input
lengths (a bad one raises ValueError at the next synchronisation: device_checks.py), scans the
counts into offsets and compacts the labels; a second (`ctc_fixup`) writes what cuDNN is not
asked to compute: cost +inf and a zero gradient where no alignment exists (cuDNN is given an
empty label there instead: PyTorch saw illegal memory accesses with labels longer than their
input), cost 0 where there is neither input nor label, and zeros at the steps past each input
length. Nothing waits for the device, so the thunk is captured into CUDA graphs (unless
`gpuarray.sync_checks` makes the label check wait).

Where cuDNN's limits do not hold:
- float64 activations, or cuDNN missing (a real context whose cuDNN does not load): known when
  the graph is placed, so the lifter leaves the op on the host;
- more than MAX_LABELS (255) labels in one row: known only on the device, so that input is
  reported like a bad label (ValueError naming the row and its count at the next sync).
  Set `ENABLED = False` (this module) before compiling to keep CTC on the host for such data.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.cudnn import DATA_TYPES, _Desc, cudnn, cudnn_available
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import template
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import (REPORT_SOURCE, DeviceChecked, checks_are_deferred,
                                              launch_checked)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize
from symgpu.tensor.nnet.ctc import ConnectionistTemporalClassification, check_ctc_types

__all__ = ["GpuConnectionistTemporalClassification", "gpu_ctc", "local_gpu_ctc_no_grad",
           "ctc_source", "CtcPlan", "MAX_LABELS", "ENABLED"]

#: the most labels one batch element may have on the GPU (cuDNN documents 256; PyTorch keeps
#: below it after illegal memory accesses at the limit)
MAX_LABELS = 255
#: False: the lifter leaves every CTC node on the host (read when a function is compiled)
ENABLED = True

# cuDNN 9's enums (cudnn_adv.h / cudnn_graph.h): cudnnCTCLossAlgo_t
# CUDNN_CTC_LOSS_ALGO_DETERMINISTIC = 0; cudnnLossNormalizationMode_t
# CUDNN_LOSS_NORMALIZATION_SOFTMAX = 1; cudnnCTCGradMode_t CUDNN_CTC_ZERO_OOB_GRADIENTS = 0
# (cudnnSetCTCLossDescriptor_v9); cudnnDataType_t CUDNN_DATA_FLOAT = 0 (cudnn.DATA_TYPES)
ALGO_DETERMINISTIC = 0
NORM_SOFTMAX = 1
ZERO_OOB_GRADIENTS = 0

_BLOCK = 256            # ctc.cu's CTC_BLOCK: ctc_pack's one block
_MAX_BLOCKS = 4096
_MODULE_KEY = ("symgpu.ctc", MAX_LABELS)
_FORMATS = {"ctc_pack": "PqqPqqqqqPPPPPP", "ctc_fixup": "PPPPPqqq"}
_KINDS = {1: "a label outside [1, {a})", 2: "an input length outside [0, {t}]",
          3: "more than " + str(MAX_LABELS) + " labels (cuDNN's limit; set "
             "symgpu.gpu.ops.ctc.ENABLED = False to keep CTC on the host)"}


def ctc_source() -> str:
    """The CUDA module of ctc_pack and ctc_fixup, after device_checks' ``report``."""
    return REPORT_SOURCE + template("ctc.cu").substitute(max_labels=MAX_LABELS)


class CtcPlan:
    """cuDNN's descriptors for one (time, batch, alphabet) float32 problem and label limit,
    and the workspace its deterministic algorithm needs (no device work: safe while a graph
    is being captured)."""

    def __init__(self, lib: Any, ctx: Any, t: int, b: int, a: int, max_label: int) -> None:
        self.lib = lib
        self.handle = lib.handle(ctx)
        self.ctc = _Desc(lib, "CTCLoss")
        lib.call("cudnnSetCTCLossDescriptor_v9", self.ctc.ptr, ctypes.c_int(DATA_TYPES["float32"]),
                 ctypes.c_int(NORM_SOFTMAX), ctypes.c_int(ZERO_OOB_GRADIENTS),
                 ctypes.c_int(max_label))
        self.probs = self._tensor3(t, b, a)
        self.grads = self._tensor3(t, b, a)
        size = ctypes.c_size_t(0)
        lib.call("cudnnGetCTCLossWorkspaceSize_v8", self.handle, ctypes.c_int(ALGO_DETERMINISTIC),
                 self.ctc.ptr, self.probs.ptr, self.grads.ptr, ctypes.byref(size))
        self.workspace = int(size.value)

    def _tensor3(self, t: int, b: int, a: int) -> Any:
        d = _Desc(self.lib, "Tensor")
        dims, strides = (ctypes.c_int * 3)(t, b, a), (ctypes.c_int * 3)(b * a, a, 1)
        self.lib.call("cudnnSetTensorNdDescriptor", d.ptr, ctypes.c_int(DATA_TYPES["float32"]),
                      ctypes.c_int(3), dims, strides)
        return d

    def run(self, acts: int, labels: int, label_lengths: int, input_lengths: int, costs: int,
            grad: int, workspace: int) -> None:
        """cudnnCTCLoss_v8 on device pointers (labels concatenated, int32 lengths)."""
        v = ctypes.c_void_p
        self.lib.call("cudnnCTCLoss_v8", self.handle, ctypes.c_int(ALGO_DETERMINISTIC),
                      self.ctc.ptr, self.probs.ptr, v(acts), v(labels), v(label_lengths),
                      v(input_lengths), v(costs), self.grads.ptr, v(grad),
                      ctypes.c_size_t(self.workspace), v(workspace or None))


def _elem_strides(a: Any) -> tuple[Any, tuple[int, ...]]:
    """(a, its strides in elements), or a C-contiguous copy's where a stride is not a whole
    number of elements."""
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides):
        a = a.copy()
    return a, tuple(s // isz for s in a.strides)


def _describe(op: Any, acts_shape: tuple, labels_shape: tuple) -> Callable[[int], Exception]:
    t, _, a = acts_shape

    def describe(bad: int) -> Exception:
        kind, b, v = bad >> 56, (bad >> 32) & 0xFFFFFF, int(np.int32(np.uint32(bad & 0xFFFFFFFF)))
        what = _KINDS.get(kind, "a bad input").format(a=a, t=t)
        return ValueError(f"{op}: batch element {b} has {what}: {v} (activations of shape "
                          f"{acts_shape}, labels of shape {labels_shape}; 0 is the blank, "
                          f"negative labels are padding)")
    return describe


class GpuConnectionistTemporalClassification(DeviceChecked, Op):
    """The CTC loss of float32 GPU activations through cuDNN (see the module's docstring);
    calling it returns the costs (`default_output = 0`)."""

    __props__ = ("compute_grad",)
    default_output = 0

    def __init__(self, compute_grad: bool = True) -> None:
        self.compute_grad = bool(compute_grad)

    infer_shape = ConnectionistTemporalClassification.infer_shape
    connection_pattern = ConnectionistTemporalClassification.connection_pattern

    def make_node(self, activations: Any, labels: Any, input_lengths: Any) -> Apply:
        ctx = activations.type.context_name if is_gpu_var(activations) else None
        acts = as_gpuarray_variable(activations, ctx)
        labels = as_gpuarray_variable(labels, ctx)
        lengths = as_gpuarray_variable(input_lengths, ctx)
        check_ctc_types(self, acts, labels, lengths)
        if acts.dtype != "float32":
            raise TypeError(f"{self}: cuDNN's CTC loss takes float32 activations, got "
                            f"{acts.type} (float64 stays on the host op)")
        outs = [GpuArrayType("float32", (acts.broadcastable[1],), ctx)(name="ctc_cost")]
        if self.compute_grad:
            outs.append(GpuArrayType("float32", acts.broadcastable, ctx)(name="ctc_grad"))
        return Apply(self, [acts, labels, lengths], outs)

    def L_op(self, inputs: list, outputs: list, output_grads: list) -> list:
        """The stored gradient scaled by each element's output gradient, as the host op."""
        gradients = (outputs[1] if len(outputs) > 1 else
                     GpuConnectionistTemporalClassification(True).make_node(*inputs).outputs[1])
        return [gradients * output_grads[0].dimshuffle("x", 0, "x"), None, None]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The ctc module, for the link-time prefetch (symgpu/gpu/exec/prefetch.py)."""
        return [(_MODULE_KEY, ctc_source, ())]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        outs = [storage_map[v] for v in node.outputs]
        plans: dict[tuple, CtcPlan] = {}

        def thunk() -> None:
            ctx.activate()
            results = self._run(node, ctx, plans, *(c[0] for c in cells))
            for cell, value in zip(outs, results):
                cell[0] = value

        thunk.capturable = checks_are_deferred()   # type: ignore[attr-defined]
        thunk.launches = True                      # type: ignore[attr-defined]
        return thunk

    def _run(self, node: Apply, ctx: Any, plans: dict, acts: Any, labels: Any,
             lengths: Any) -> list[Any]:
        t, b, a = acts.shape
        if labels.shape[0] != b or lengths.shape[0] != b or a < 1:
            raise ValueError(f"{self}: activations of shape {acts.shape} (time, batch, "
                             f"alphabet, alphabet >= 1) need {b} rows of labels and {b} input "
                             f"lengths, got labels of shape {labels.shape} and input_lengths "
                             f"of shape {lengths.shape}")
        f32, i32 = np.dtype("float32"), np.dtype("int32")
        costs = new_array(ctx, (b,), f32)
        grad = new_array(ctx, (t, b, a), f32) if self.compute_grad else None
        if b == 0:
            return [costs] + ([grad] if grad is not None else [])
        acts = acts if acts.is_c_contiguous else acts.copy()
        labels, (ls0, ls1) = _elem_strides(labels)
        lengths, (is0,) = _elem_strides(lengths)
        width = labels.shape[1]
        packed = new_array(ctx, (max(b * width, 1),), i32)
        lab_len, in_len, offsets, status = (new_array(ctx, (b,), i32) for _ in range(4))
        pack = get_prepared_kernel(_MODULE_KEY, ctc_source, "ctc_pack", _FORMATS["ctc_pack"],
                                   context=ctx)
        launch_checked(node, ctx, pack, (1, 1), (_BLOCK, 1, 1),
                       (labels.ptr, ls0, ls1, lengths.ptr, is0, b, width, t, a, packed.ptr,
                        lab_len.ptr, in_len.ptr, offsets.ptr, status.ptr),
                       _describe(self, acts.shape, labels.shape))
        if t:
            key = (t, b, a, min(max(width, 1), MAX_LABELS))
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = CtcPlan(cudnn(), ctx, *key)
            g = grad if grad is not None else new_array(ctx, (t, b, a), f32)
            ws = ctx.pool.allocate(plan.workspace) if plan.workspace else None
            plan.run(acts.ptr, packed.ptr, lab_len.ptr, in_len.ptr, costs.ptr, g.ptr,
                     ws.ptr if ws is not None else 0)
        total = t * b * a if grad is not None else 0
        fixup = get_prepared_kernel(_MODULE_KEY, ctc_source, "ctc_fixup", _FORMATS["ctc_fixup"],
                                    context=ctx)
        blocks = max(1, min(_MAX_BLOCKS, -(-max(total, b) // _BLOCK)))
        fixup.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, status.ptr,
                                  in_len.ptr, costs.ptr, grad.ptr if total else 0, acts.ptr,
                                  b, a, total)
        return [costs] + ([grad] if grad is not None else [])


def gpu_ctc(activations: Any, labels: Any, input_lengths: Any) -> Any:
    """The CTC loss on the GPU (Theano's theano.gpuarray.ctc.gpu_ctc): activations moved to
    the default context if they are on the host; returns the costs."""
    return GpuConnectionistTemporalClassification()(activations, labels, input_lengths)


@register_canonicalize("fast_compile", "fast_run")
@node_rewriter([GpuConnectionistTemporalClassification])
def local_gpu_ctc_no_grad(fgraph: Any, node: Apply) -> Any:
    """A GPU CTC node whose gradient output nobody reads -> one that does not compute it."""
    if len(node.outputs) > 1 and not fgraph.clients.get(node.outputs[1]):
        return [GpuConnectionistTemporalClassification(False)(*node.inputs), None]
    return None


def _cudnn_usable(context_name: Any) -> bool:
    """A virtual context places graphs only (cuDNN is never loaded for it); a real one needs
    cuDNN 9 to load."""
    return _context(context_name).virtual or cudnn_available()


@register_lifter(ConnectionistTemporalClassification)
def lift_ctc(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """ConnectionistTemporalClassification -> GpuConnectionistTemporalClassification (float32
    activations, ENABLED, cuDNN loadable); float64 stays on the host op."""
    if not ENABLED or node.inputs[0].dtype != "float32" or not _cudnn_usable(context_name):
        return None
    gin = [as_gpuarray_variable(v, context_name) for v in inputs]
    out = GpuConnectionistTemporalClassification(op.compute_grad).make_node(*gin).outputs
    return list(out)
