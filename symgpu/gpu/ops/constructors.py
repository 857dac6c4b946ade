"""Matrices made on the device and a split into views (Theano's theano.gpuarray.basic_ops
GpuEye, GpuTri and GpuSplit, issue 31): GpuEye(dtype, context_name)(n, m, k) is np.eye,
GpuTri(dtype, context_name)(n, m, k) np.tri, each one launch over a fresh array from the
pool; GpuSplit(len_splits)(x, axis, splits) cuts a GPU array along `axis` into views.

Why: eye's host op otherwise runs on the CPU and is uploaded; a split of a GPU array needs no
copy at all (its pieces are views, as Theano's). The host Eye and Split are lifted to them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, host_from_gpu
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import SUPPORTED, storage_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.graph.basic import Apply
from symgpu.gradient import DisconnectedType
from symgpu.graph.op import Op
from symgpu.tensor.extra_ops import Eye as _Eye
from symgpu.tensor.theano_basic import Split as _Split
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["GpuEye", "GpuTri", "GpuSplit", "constructors_source"]

_CU = sections("constructors.cu")
_MODULE_KEY = ("symgpu.constructors",)
_BLOCK = 256
_MAX_BLOCKS = 4096
#: the dtypes the kernels fill (every GPU dtype: bool, the ints, the halves and floats)
BAND_DTYPES = {d: storage_ctype(d) for d in SUPPORTED}


def _kernel_name(eye: bool, dtype: str) -> str:
    return f"{'eye' if eye else 'tri'}_{dtype}"


def constructors_source() -> str:
    """The CUDA module: eye and tri for every dtype in BAND_DTYPES."""
    parts = [common_source(), _CU[""].substitute()]
    for dtype, t in BAND_DTYPES.items():
        for eye in (True, False):
            parts.append(_CU["band"].substitute(name=_kernel_name(eye, dtype), t=t,
                                                eye="true" if eye else "false"))
    return "".join(parts)


def _int_scalar(v: Any, who: str, what: str) -> Any:
    v = as_tensor_variable(v)
    if v.ndim != 0 or not v.dtype.startswith(("int", "uint")):
        raise TypeError(f"{who}: {what} must be an integer scalar, got {v} ({v.type})")
    return v


class _GpuBand(Op):
    """An n x m matrix of 0s and 1s by diagonal offset k (GpuEye, GpuTri)."""

    __props__ = ("dtype", "context_name")
    capturable = True     # a pool allocation and one launch on the stream
    launches = True
    shape_from_inputs = True
    _eye = True

    def __init__(self, dtype: str | None = None, context_name: Any = None):
        dtype = config.floatX if dtype in (None, "floatX") else str(dtype)
        if dtype not in BAND_DTYPES:
            raise TypeError(f"{type(self).__name__}: dtype {dtype} is not one GPU arrays hold "
                            f"({', '.join(BAND_DTYPES)})")
        self.dtype, self.context_name = dtype, context_name

    def __str__(self) -> str:
        return f"{type(self).__name__}{{dtype={self.dtype}}}"

    def make_node(self, n: Any, m: Any, k: Any) -> Apply:
        who = str(self)
        args = [_int_scalar(v, who, w) for v, w in zip((n, m, k), ("n", "m", "k"))]
        return Apply(self, args, [GpuArrayType(self.dtype, (False, False), self.context_name)()])

    def perform(self, node, inputs, out):
        n, m, k = (int(v) for v in inputs)
        if n < 0 or m < 0:
            raise ValueError(f"{self}: negative dimensions n={n}, m={m}")
        ctx = gpu_context.get_context(self.context_name)
        res = new_array(ctx, (n, m), np.dtype(self.dtype))
        if n * m:
            ctx.activate()
            fn = get_prepared_kernel(_MODULE_KEY, constructors_source,
                                     _kernel_name(self._eye, self.dtype), "Pqqq", context=ctx)
            blocks = max(1, min(_MAX_BLOCKS, -(-(n * m) // _BLOCK)))
            fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, res.ptr, n, m, k)
        out[0][0] = res

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, constructors_source, ())]

    def infer_shape(self, fgraph, node, input_shapes):
        n, m, _ = node.inputs
        return [(n.astype("int64") if n.dtype != "int64" else n,
                 m.astype("int64") if m.dtype != "int64" else m)]

    def grad(self, inputs, output_grads):
        return [None, None, None]


class GpuEye(_GpuBand):
    """np.eye(n, m, k) made on the device (Theano's GpuEye(dtype, context_name))."""

    _eye = True


class GpuTri(_GpuBand):
    """np.tri(n, m, k) made on the device: ones on and below diagonal k (Theano's GpuTri)."""

    _eye = False


class GpuSplit(Op):
    """Theano's GpuSplit(len_splits)(x, axis, splits): GPU array `x` cut along the host
    integer `axis` into `len_splits` views of the lengths in the host vector `splits`."""

    __props__ = ("len_splits",)
    capturable = True     # views: host bookkeeping only

    def __init__(self, len_splits: int):
        self.len_splits = int(len_splits)
        self.view_map = {i: [0] for i in range(self.len_splits)}

    def make_node(self, x: Any, axis: Any, splits: Any) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        axis, splits = as_tensor_variable(axis), as_tensor_variable(splits)
        host = _Split(self.len_splits).make_node(TensorType(x.dtype, x.broadcastable)(),
                                                 axis, splits)    # Split's checks
        return Apply(self, [x, axis, splits],
                     [GpuArrayType(o.dtype, o.broadcastable, x.type.context_name)()
                      for o in host.outputs])

    def perform(self, node, inputs, out):
        x, axis, splits = inputs
        ax = int(axis)
        if not -x.ndim <= ax < x.ndim:
            raise ValueError(f"{self}: axis {ax} is out of range for shape {x.shape}")
        ax %= x.ndim
        lengths = [int(s) for s in np.asarray(splits)]
        if len(lengths) != self.len_splits:
            raise ValueError(f"{self}: {len(lengths)} split lengths for len_splits="
                             f"{self.len_splits}")
        if min(lengths, default=0) < 0 or sum(lengths) != x.shape[ax]:
            raise ValueError(f"{self}: lengths {lengths} do not add up to {x.shape[ax]}, the "
                             f"length of axis {ax} of shape {x.shape}")
        start = 0
        for o, length in zip(out, lengths):
            key = (slice(None),) * ax + (slice(start, start + length),)
            o[0] = x[key]
            start += length

    infer_shape = _Split.infer_shape

    def grad(self, inputs, output_grads):
        """The pieces' gradients joined along `axis` (zeros for a piece with none), uploaded."""
        x, axis, splits = inputs
        outs = self(x, axis, splits)
        gs = [host_from_gpu(o).zeros_like() if g is None or isinstance(g.type, DisconnectedType)
              else _host_grad(host_from_gpu(g) if is_gpu_var(g) else g)
              for g, o in zip(output_grads, outs if isinstance(outs, list) else [outs])]
        host = _Split(self.len_splits).grad([host_from_gpu(x), axis, splits], gs)
        return [as_gpuarray_variable(host[0], x.type.context_name), None, None]


def _host_grad(g: Any) -> TensorVariable:
    return g if isinstance(g, TensorVariable) else as_tensor_variable(g)


@register_lifter(_Eye, eager=True)
def lift_eye(op, node, context_name, inputs):
    if op.dtype not in BAND_DTYPES:
        return None
    return [GpuEye(op.dtype, context_name)(*(inputs.host(i) for i in range(3)))]


@register_lifter(_Split)
def lift_split(op, node, context_name, inputs):
    if not is_gpu_var(inputs[0]):
        return None     # a dtype the GPU does not hold
    outs = GpuSplit(op.len_splits)(inputs[0], inputs.host(1), inputs.host(2))
    return outs if isinstance(outs, list) else [outs]
