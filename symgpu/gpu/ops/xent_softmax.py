"""Theano's fused classifier ops on the GPU (theano.gpuarray.nnet):
GpuCrossentropySoftmaxArgmax1HotWithBias (the NLL, softmax and argmax of x + b, one launch:
a warp per row, a block per row past softmax_rows.WIDE_ROW columns) and
GpuCrossentropySoftmax1HotWithBiasDx (the NLL's gradient at x, one launch over its
elements), lifted from the host ops of symgpu/tensor/nnet/xent_softmax.py.

The kernels (``codegen/xent_softmax.cu``) share softmax_rows.cu's row reductions; x, sm, b,
dy and the labels are read through their strides, results are new C-contiguous arrays.
Labels must lie in [0, k): a bad one is reported into the node's device-check slot and
raises ValueError at the next synchronisation (device_checks.py), so neither op syncs and
both capture into CUDA graphs. Half types are loaded and computed in float32.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops.advanced import INDEX_DTYPES
from symgpu.gpu.ops.crossentropy import CROSSENTROPY_DTYPES, _elem_strides
from symgpu.gpu.ops.softmax_rows import WIDE_ROW
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import DeviceChecked, REPORT_SOURCE, launch_checked
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.nnet.xent_softmax import (CrossentropySoftmax1HotWithBiasDx,
                                             CrossentropySoftmaxArgmax1HotWithBias)

__all__ = ["GpuCrossentropySoftmaxArgmax1HotWithBias", "GpuCrossentropySoftmax1HotWithBiasDx",
           "xent_softmax_source"]

_BLOCK = 256
_MAX_BLOCKS = 8192
_MODULE_KEY = ("symgpu.xent_softmax",)
_SR = sections("softmax_rows.cu")
_CU = sections("xent_softmax.cu")
_FORMATS = {"fwd": "PqqPqPqPPPqqP", "dx": "PqPqqPqPqqP"}


def _fwd_name(dtype: str, idt: str, wide: bool) -> str:
    return f"xent_sm_{'block' if wide else 'warp'}_{dtype}_{idt}"


def _dx_name(dtype: str, g_dtype: str, idt: str) -> str:
    return f"xent_dx_{dtype}_{g_dtype}_{idt}"


def xent_softmax_source() -> str:
    """The CUDA module: every forward (warp and block per row) and gradient kernel."""
    parts = [common_source(), REPORT_SOURCE, _SR[""].substitute(), _CU[""].substitute()]
    for dtype, t in CROSSENTROPY_DTYPES.items():
        for idt, it in INDEX_DTYPES.items():
            for wide in (False, True):
                parts.append(_CU["fwd"].substitute(name=_fwd_name(dtype, idt, wide), t=t,
                                                   vt=value_ctype(dtype), it=it,
                                                   wide="true" if wide else "false"))
            for gdt, gt in CROSSENTROPY_DTYPES.items():
                wt = "double" if "double" in (t, gt) else "float"
                parts.append(_CU["dx"].substitute(name=_dx_name(dtype, gdt, idt), t=t, gt=gt,
                                                  wt=wt, it=it))
    return "".join(parts)


def _run(op: Op, node: Apply, ctx: Any, name: str, kind: str, blocks: int, args: tuple,
         k: int, shape: tuple) -> None:
    """Launch ``name`` on ctx's stream; a label outside [0, k) raises ValueError at the next
    synchronisation."""
    ctx.activate()
    fn = get_prepared_kernel(_MODULE_KEY, xent_softmax_source, name, _FORMATS[kind],
                             context=ctx)

    def describe(bad: int) -> Exception:
        return ValueError(f"{op}: y_i value out of bounds: labels must lie in [0, {k}) for "
                          f"an input of shape {shape}; got label {bad}")
    launch_checked(node, ctx, fn, (max(1, min(_MAX_BLOCKS, blocks)), 1), (_BLOCK, 1, 1), args,
                   describe)


def _check_labels_var(op: Op, y: Any) -> None:
    if y.ndim != 1 or y.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: y_idx must be an int32/int64 vector, got {y.type}")


def _check_float(op: Op, what: str, v: Any, ndim: tuple) -> None:
    if v.ndim not in ndim or v.dtype not in CROSSENTROPY_DTYPES:
        raise TypeError(f"{op}: {what} must be a GPU float ({', '.join(CROSSENTROPY_DTYPES)}) "
                        f"of {' or '.join(map(str, ndim))} dimensions, got {v.type}")


class _XentKernelOp(DeviceChecked, Op):
    """What both ops share: one CUDA module, offered to the link-time prefetch."""

    __props__ = ()

    def __str__(self) -> str:
        return type(self).__name__

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The module, compiled with the function's other kernels."""
        return [(_MODULE_KEY, xent_softmax_source, ())]


class GpuCrossentropySoftmaxArgmax1HotWithBias(_XentKernelOp):
    """(nll, sm, am) of a GPU float matrix x, bias vector b and int32/int64 labels y_idx, in
    one launch: Theano's op of that name (CrossentropySoftmaxArgmax1HotWithBias's values)."""

    infer_shape = CrossentropySoftmaxArgmax1HotWithBias.infer_shape

    def make_node(self, x: Any, b: Any, y_idx: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable for x, got {x}")
        ctx = x.type.context_name
        b, y = as_gpuarray_variable(b, ctx), as_gpuarray_variable(y_idx, ctx)
        _check_float(self, "x", x, (2,))
        _check_float(self, "b", b, (1,))
        _check_labels_var(self, y)
        if b.dtype != x.dtype:
            raise TypeError(f"{self}: b ({b.type}) must have x's dtype {x.dtype}")
        nll = GpuArrayType(x.dtype, y.broadcastable, ctx)()
        return Apply(self, [x, b, y], [nll, x.type(), y.type()])

    def perform(self, node, inputs, out):
        x, b, y = inputs
        n, k = x.shape
        if b.shape[0] != k or y.shape[0] != n:
            raise ValueError(f"{self}: b of shape {b.shape} and y_idx of shape {y.shape} do "
                             f"not fit x of shape {x.shape}")
        if k == 0 and n:
            raise ValueError(f"{self}: x of shape {x.shape} has no columns to take a softmax of")
        ctx = x.context
        nll = GpuArray((n,), x.dtype, ctx)
        sm = GpuArray((n, k), x.dtype, ctx)
        am = GpuArray((n,), y.dtype, ctx)
        if n:
            x, (xs0, xs1) = _elem_strides(x)
            b, (bs,) = _elem_strides(b)
            y, (ys,) = _elem_strides(y)
            wide = k > WIDE_ROW
            blocks = n if wide else -(-n // (_BLOCK // 32))
            _run(self, node, ctx, _fwd_name(x.dtype.name, y.dtype.name, wide), "fwd", blocks,
                 (x.ptr, xs0, xs1, b.ptr, bs, y.ptr, ys, nll.ptr, sm.ptr, am.ptr, n, k), k,
                 x.shape)
        out[0][0], out[1][0], out[2][0] = nll, sm, am


class GpuCrossentropySoftmax1HotWithBiasDx(_XentKernelOp):
    """dx = dy_i * sm[i] with dy_i subtracted at (i, y_idx[i]), one launch: Theano's op of
    that name (CrossentropySoftmax1HotWithBiasDx's values); dy a float scalar or a vector of
    one value or one per row."""

    infer_shape = CrossentropySoftmax1HotWithBiasDx.infer_shape

    def make_node(self, dy: Any, sm: Any, y_idx: Any) -> Apply:
        if not is_gpu_var(sm):
            raise TypeError(f"{self}: expected a GPU variable for sm, got {sm}")
        ctx = sm.type.context_name
        dy, y = as_gpuarray_variable(dy, ctx), as_gpuarray_variable(y_idx, ctx)
        _check_float(self, "dy", dy, (0, 1))
        _check_float(self, "sm", sm, (2,))
        _check_labels_var(self, y)
        return Apply(self, [dy, sm, y], [sm.type()])

    def perform(self, node, inputs, out):
        dy, sm, y = inputs
        n, k = sm.shape
        if y.shape[0] != n or (dy.ndim == 1 and dy.shape[0] not in (1, n)):
            raise ValueError(f"{self}: dy of shape {dy.shape} and y_idx of shape {y.shape} "
                             f"do not fit sm of shape {sm.shape}")
        dx = GpuArray((n, k), sm.dtype, sm.context)
        if n:
            sm, (ss0, ss1) = _elem_strides(sm)
            y, (ys,) = _elem_strides(y)
            dy, dstr = _elem_strides(dy)
            dys = dstr[0] if dstr else 0
            _run(self, node, sm.context, _dx_name(sm.dtype.name, dy.dtype.name, y.dtype.name),
                 "dx", -(-n * max(k, 1) // _BLOCK),
                 (dy.ptr, dys, sm.ptr, ss0, ss1, y.ptr, ys, dx.ptr, n, k), k, sm.shape)
        out[0][0] = dx


# ----------------------------------------------------------------------------- lifters

@register_lifter(CrossentropySoftmaxArgmax1HotWithBias)
def lift_xent_softmax(op: Op, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """The host op -> GpuCrossentropySoftmaxArgmax1HotWithBias (float x of a kernel dtype,
    int32/int64 labels)."""
    x = inputs[0]
    if not is_gpu_var(x) or x.dtype not in CROSSENTROPY_DTYPES or \
            node.inputs[2].dtype not in INDEX_DTYPES:
        return None
    b = as_gpuarray_variable(inputs[1], context_name)
    y = as_gpuarray_variable(inputs[2], context_name)
    return GpuCrossentropySoftmaxArgmax1HotWithBias()(x, b, y)


@register_lifter(CrossentropySoftmax1HotWithBiasDx)
def lift_xent_softmax_dx(op: Op, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """The host op -> GpuCrossentropySoftmax1HotWithBiasDx."""
    sm = inputs[1]
    if not is_gpu_var(sm) or sm.dtype not in CROSSENTROPY_DTYPES or \
            node.inputs[0].dtype not in CROSSENTROPY_DTYPES or \
            node.inputs[2].dtype not in INDEX_DTYPES:
        return None
    dy = as_gpuarray_variable(inputs[0], context_name)
    y = as_gpuarray_variable(inputs[2], context_name)
    return [GpuCrossentropySoftmax1HotWithBiasDx()(dy, sm, y)]
