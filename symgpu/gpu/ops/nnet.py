"""Softmax / LogSoftmax on the GPU and GpuArgmax (one block per row, a small reduction kernel).

Along the last axis of a matrix (or more) the softmax family is GpuSoftmaxRows, one launch
(softmax_rows.py); along another axis, or over a vector, it is expanded into GpuCAReduce +
GpuElemwise, which the fusion passes then merge: the max-shifted expressions are exactly what
the CPU thunks compute, and those reductions spread one long row over the whole GPU.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops.careduce import GpuCAReduce, careduce_supported
from symgpu.gpu.ops.elemwise import gpu_elemwise
from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.elemwise import keepdims_order
from symgpu.tensor.math import Argmax as _Argmax
from symgpu.tensor.nnet import LogSoftmax as _LogSoftmax, Softmax as _Softmax

__all__ = ["gpu_softmax", "gpu_log_softmax", "GpuArgmax", "ARGMAX_DTYPES", "argmax_source"]

#: the half dtypes too: the one-launch kernel computes in float32, the expanded form's
#: reductions accumulate in float32
_SOFTMAX_DTYPES = ("float16", "bfloat16", "float32", "float64")


# ----------------------------------------------------------------------------- softmax

def _reduce_keepdims(red: str, x: Variable, axis: int | None) -> Variable:
    axes = tuple(range(x.ndim)) if axis is None else (axis,)
    r = GpuCAReduce(red, axes)(x)
    return GpuDimShuffle(r.broadcastable, keepdims_order(x.ndim, axes))(r)


def _shifted(x: Variable, axis: int | None) -> Variable:
    return gpu_elemwise("sub", x, _reduce_keepdims("maximum", x, axis))


def gpu_softmax(x: Variable, axis: int | None = -1) -> Variable:
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (None: all elements), on the GPU."""
    if axis is not None:
        axis %= x.ndim
    e = gpu_elemwise("exp", _shifted(x, axis))
    return gpu_elemwise("true_div", e, _reduce_keepdims("add", e, axis))


def gpu_log_softmax(x: Variable, axis: int | None = -1) -> Variable:
    """(x - max) - log(sum(exp(x - max))) along ``axis``, on the GPU."""
    if axis is not None:
        axis %= x.ndim
    s = _shifted(x, axis)
    lse = gpu_elemwise("log", _reduce_keepdims("add", gpu_elemwise("exp", s), axis))
    return gpu_elemwise("sub", s, lse)


def _softmax_ok(x: Variable) -> bool:
    return (is_gpu_var(x) and x.dtype in _SOFTMAX_DTYPES and x.ndim > 0
            and careduce_supported(SCALAR_OPS["maximum"], None, [x.dtype]))


def _along_rows(x: Variable, axis: int | None) -> bool:
    """Whether the softmax runs along the last axis of a matrix or more: GpuSoftmaxRows'
    one launch (softmax_rows.py); other axes, and vectors, are expanded."""
    return axis is not None and x.ndim >= 2 and axis % x.ndim == x.ndim - 1


@register_lifter(_Softmax)
def lift_softmax(op, node, context_name, inputs):
    if type(op) is not _Softmax or not _softmax_ok(inputs[0]):
        return None
    if _along_rows(inputs[0], op.axis):
        return [GpuSoftmaxRows(log=False)(inputs[0])]
    return [gpu_softmax(inputs[0], op.axis)]


@register_lifter(_LogSoftmax)
def lift_log_softmax(op, node, context_name, inputs):
    if not _softmax_ok(inputs[0]):
        return None
    if _along_rows(inputs[0], op.axis):
        return [GpuSoftmaxRows(log=True)(inputs[0])]
    return [gpu_log_softmax(inputs[0], op.axis)]


# ----------------------------------------------------------------------------- argmax

#: dtype -> CUDA storage type GpuArgmax has kernels for (the half types compared in float)
ARGMAX_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16",
                 "float32": "float", "float64": "double", "int8": "signed char",
                 "int16": "short", "int32": "int", "int64": "long long",
                 "uint8": "unsigned char", "uint16": "unsigned short",
                 "uint32": "unsigned int", "uint64": "unsigned long long"}
_ARG_BLOCK = 256
_MAX_GRID = 1 << 20

_CU = sections("argmax.cu")   # the row reduction, then the entry points


def _kernel_name(dtype: str, kind: str) -> str:
    return f"arg{kind}_{dtype}"


def argmax_source() -> str:
    """The CUDA module with every ``arg{max,min}_<dtype>`` kernel (block of 256 threads)."""
    parts = [common_source(), _CU[""].substitute()]
    for dtype, ctype in ARGMAX_DTYPES.items():
        for kind in ("max", "min"):
            parts.append(_CU["arg"].substitute(name=_kernel_name(dtype, kind), ctype=ctype,
                                               vtype=value_ctype(dtype),
                                               block=_ARG_BLOCK,
                                               is_max="true" if kind == "max" else "false"))
    return "".join(parts)


class GpuArgmax(Op):
    """Index (int64) of the max (``kind='max'``) or min over ``axis`` (None: the flattened
    array); ties and NaNs resolve to the first index, as NumPy. The input is made
    contiguous with the reduced axis last, then one block reduces each row."""

    __props__ = ("axis", "kind")

    def __init__(self, axis: int | None, kind: str = "max"):
        if kind not in ("max", "min"):
            raise ValueError(f"GpuArgmax: kind must be 'max' or 'min', got {kind!r}")
        self.axis = None if axis is None else int(axis)
        self.kind = kind

    def __str__(self) -> str:
        return f"GpuArg{self.kind}{{axis={self.axis}}}"

    infer_shape = _Argmax.infer_shape

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        if x.dtype not in ARGMAX_DTYPES:
            raise TypeError(f"{self}: no kernel for dtype {x.dtype}")
        if self.axis is not None and not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x.type}")
        bcast = () if self.axis is None else tuple(
            b for d, b in enumerate(x.broadcastable) if d != self.axis)
        return Apply(self, [x], [GpuArrayType("int64", bcast, x.type.context_name)()])

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The argmax module (compiled on the first call otherwise), for symgpu/gpu/
        prefetch.py to compile in parallel with the function's other kernels."""
        return [(("symgpu.argmax",), argmax_source, ())]

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_kernel_name(node.inputs[0].dtype, self.kind),)

    def perform(self, node, inputs, out, kernel=None):
        x = inputs[0]
        if self.axis is None or x.ndim == 0:
            out_shape: tuple = ()
            n = x.size
            xt = x
        else:
            perm = tuple(d for d in range(x.ndim) if d != self.axis) + (self.axis,)
            xt = x.transpose(perm)
            out_shape = tuple(x.shape[d] for d in perm[:-1])
            n = x.shape[self.axis]
        rows = 1
        for s in out_shape:
            rows *= s
        if n == 0:
            raise ValueError(f"{self}: attempt to get arg{self.kind} of an empty sequence "
                             f"(input shape {x.shape})")
        res = GpuArray(out_shape, "int64", x.context)
        if rows:
            xc = xt if xt.is_c_contiguous else xt.copy()
            ctx = x.context
            ctx.activate()
            fn = get_prepared_kernel(("symgpu.argmax",), argmax_source,
                                     self.perform_args(node)[0] if kernel is None else kernel, "PPqq",
                                     context=ctx)
            grid = max(1, min(rows, _MAX_GRID))
            fn.prepared_async_call((grid, 1), (_ARG_BLOCK, 1, 1), ctx.stream, xc.ptr, res.ptr,
                                   rows, n)
        out[0][0] = res

    def grad(self, inputs, output_grads):
        return [None]


@register_lifter(_Argmax)
def lift_argmax(op, node, context_name, inputs):
    x = inputs[0]
    if not is_gpu_var(x) or x.dtype not in ARGMAX_DTYPES or op.kind not in ("max", "min"):
        return None
    return [GpuArgmax(op.axis, op.kind)(x)]
