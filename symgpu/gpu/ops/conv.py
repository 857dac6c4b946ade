"""GPU convolution: GpuConv2d, GpuConv2dGradInputs, GpuConv2dGradWeights, their 3-d twins
GpuConv3d, GpuConv3dGradInputs, GpuConv3dGradWeights and their lifters from the CPU Ops of
symgpu/tensor/nnet/abstract_conv.py (same parameters, NCHW / NCDHW for users).  One code per
role for both (`nd`, the number of spatial axes, a class attribute as in the CPU Ops).

Each op runs through cuDNN (symgpu/gpu/ops/cudnn.py) when the library loads, with the algorithm
and descriptors chosen once per shape (the fastest of cuDNN's heuristic candidates, timed at
the first call outside any capture; with ALGO_SEARCH = "heuristic" the heuristic's choice) and the
workspace taken from the context's memory pool; a filter gradient of a small filter (<= 64
taps per filter) has a kernel of our own among the timed candidates (conv_wgrad.py: cuDNN's
legacy algorithms take 2.57 ms for the 3-D CNN's first layer on the H200);
otherwise, or for a shape cuDNN refuses, through im2col + cuBLAS (symgpu/gpu/ops/conv_gemm.py).
Which one runs is said once per process on stderr. Every call is queued on the context's
stream and never syncs, so the thunks are CUDA-graph capturable (symgpu/gpu/exec/graphs.py).
cuDNN pads symmetrically: asymmetric paddings are applied by copying into a zeroed buffer.

3-d has no im2col path: a 3-d conv is lifted only where cuDNN loads (elsewhere it stays on the
host, with transfers around it), and a 3-d geometry cuDNN refuses at run time is computed on
the host (conv_numpy: a download, a sync, an upload; said once on stderr).  The same holds
for float16 and bfloat16 convolutions (``HALF_CONV_DTYPES``), which run on cuDNN only, with
tensor-op math, in the precision ``dnn.conv.precision`` says with Theano's rule
(:func:`conv_precision`), fixed when the op is lifted (its ``precision``).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops.conv_gemm import (gemm_forward, gemm_grad_inputs, gemm_grad_weights,
                                      prefetch_request)
from symgpu.gpu.ops.conv_wgrad import direct_wgrad
from symgpu.gpu.ops.cudnn import (ConvDescs, CudnnError, DEFAULT_MATH, FMA_MATH, OwnAlgorithm,
                                  TENSOR_OP_MATH, cudnn)
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.graph.basic import Apply
from symgpu.scalar.dtypes import value_dtype
from symgpu.tensor.nnet import conv_numpy as _cn
from symgpu.tensor.nnet.abstract_conv import (Conv2d, Conv2dGradInputs, Conv2dGradWeights,
                                              Conv3d, Conv3dGradInputs, Conv3dGradWeights,
                                              _ConvBase)

__all__ = ["GpuConv2d", "GpuConv2dGradInputs", "GpuConv2dGradWeights", "GpuConv3d",
           "GpuConv3dGradInputs", "GpuConv3dGradWeights", "conv_backend", "CONV_DTYPES",
           "FORCE_GEMM", "ALGO_SEARCH", "HALF_CONV_DTYPES", "conv_precision"]

#: dtypes of the convolutions that run on cuDNN or on im2col + cuBLAS
CONV_DTYPES = ("float32", "float64")
#: dtypes of the convolutions that run on cuDNN only (lifted only where it loads)
HALF_CONV_DTYPES = ("float16", "bfloat16")
#: data dtype -> the compute precisions cuDNN's convolutions accept for it
_PRECISIONS = {"float16": ("float16", "float32"), "bfloat16": ("float32",),
               "float32": ("float32",), "float64": ("float64",)}
#: set True (tests) to run every GPU convolution through im2col + cuBLAS
FORCE_GEMM = False
#: how a cuDNN algorithm is chosen: "time" (the default, as PyTorch's cudnn.benchmark) runs
#: the heuristics' candidates once per geometry at its first call (warmed, then between CUDA
#: events: cudnn.ConvDescs.time_algorithms; a sync, at a call that is not being captured, so
#: never inside a CUDA graph) and keeps the fastest; "heuristic" takes cuDNN's heuristic
#: choice, with no device work.  Why timed: on the H200 the heuristic's filter gradient of
#: the 3-D CNN's first layer (benchmarks/library_gpu.py, 1 input channel) took 2.57 ms a step
#: against 0.5 ms for the algorithm PyTorch's timed search keeps (on the H100's LeNet step
#: both choices gave the same 303 us, docs/convnets.md)
ALGO_SEARCH = "time"
_announced: set[str] = set()
_lock = threading.Lock()


def conv_backend() -> tuple[str, str]:
    """('cudnn' | 'gemm', a sentence saying why), the reason printed once per process."""
    if FORCE_GEMM:
        kind, why = "gemm", "GPU convolutions run through im2col + cuBLAS (FORCE_GEMM is set)"
    else:
        try:
            lib = cudnn()
            kind, why = "cudnn", (f"GPU convolutions run through cuDNN {lib.version_string} "
                                  f"({lib.path})")
        except CudnnError as exc:
            kind, why = "gemm", f"{exc}; GPU convolutions run through im2col + cuBLAS"
    with _lock:
        if why not in _announced:
            _announced.add(why)
            print(f"symgpu: {why}", file=sys.stderr)
    return kind, why


def conv_precision(dtype: str, for_grad: bool = False) -> str:
    """The dtype cuDNN computes a convolution of ``dtype`` operands in, by Theano's rule for
    ``dnn.conv.precision``: ``as_input_f32`` (the default) computes float16 in float32 and
    the rest in their own dtype, ``as_input`` each in its own, ``float16``/``float32``/
    ``float64`` in that one.  bfloat16 always computes in float32 (cuDNN has no bfloat16
    arithmetic), so ``as_input`` means float32 for it.  As in Theano, float16 precision is
    refused for the gradients (cuDNN's half backward kernels lose too much), and so is a
    precision cuDNN cannot run for the dtype (float64 data only in float64, float32 only in
    float32): a TypeError naming the flag."""
    flag = config.dnn.conv.precision
    if flag in ("as_input", "as_input_f32"):
        prec = "float32" if dtype == "bfloat16" or (dtype == "float16" and
                                                    flag == "as_input_f32") else dtype
    else:
        prec = flag
    if for_grad and prec == "float16":
        raise TypeError("Float16 precision is disabled for cuDNN backward convolutions due to "
                        "computation errors (dnn.conv.precision=" + flag + "; use "
                        "as_input_f32 or float32)")
    if prec not in _PRECISIONS.get(dtype, ()):
        raise TypeError(f"dnn.conv.precision={flag}: cuDNN cannot compute a {dtype} "
                        f"convolution in {prec} (it computes {dtype} in "
                        f"{' or '.join(_PRECISIONS.get(dtype, ('nothing',)))})")
    return prec


def _math_mode(dtype: str) -> int:
    if dtype in HALF_CONV_DTYPES:
        return TENSOR_OP_MATH
    return DEFAULT_MATH if dtype == "float32" and config.gpuarray.allow_tf32 else FMA_MATH


def _packed(a: Any) -> Any:
    return a if a.is_c_contiguous else a.copy()


def _padded_shape(shape, pads) -> tuple:
    """(N, C, *spatial) grown by each axis's (before, after) pads."""
    return tuple(shape[:2]) + tuple(int(n) + sum(p) for n, p in zip(shape[2:], pads))


def _interior(shape, pads) -> tuple:
    """The index of the unpadded part of a padded (N, C, *spatial) buffer."""
    return (slice(None), slice(None)) + tuple(slice(p[0], p[0] + int(n))
                                              for n, p in zip(shape[2:], pads))


def _zero_padded(ctx: Any, x: Any, pads) -> Any:
    """x (N, C, *spatial) in a zeroed buffer grown by each axis's (before, after) pads."""
    buf = new_array(ctx, _padded_shape(x.shape, pads), x.dtype)
    buf.fill(0)
    buf[_interior(x.shape, pads)]._copy_from_device(x)
    return buf


def _symmetric(pads) -> bool:
    return all(p[0] == p[1] for p in pads)


def _announce(msg: str) -> None:
    with _lock:
        if msg not in _announced:
            _announced.add(msg)
            print(f"symgpu: {msg}", file=sys.stderr)


class _GpuConvBase(_ConvBase):
    """The CPU op's parameters; make_thunk picks cuDNN or the GEMM path per shape."""

    kind = ""           # 'fwd' | 'bwd_data' | 'bwd_filter'
    __props__ = _ConvBase.__props__ + ("precision",)

    def __init__(self, *args: Any, precision: str | None = None, **kwargs: Any):
        """``precision``: the dtype cuDNN computes in (None: float32 for the half dtypes,
        the operands' own otherwise); the lifters pass :func:`conv_precision`'s."""
        super().__init__(*args, **kwargs)
        self.precision = precision

    def compute_dtype(self, dtype: str) -> str:
        """What cuDNN computes this op's ``dtype`` operands in."""
        return self.precision or value_dtype(dtype)

    def _gpu4(self, v: Any, ctx_name: Any, what: str) -> Any:
        """v on the GPU, checked: (nd + 2)-d float (4-d for the 2-d ops)."""
        v = as_gpuarray_variable(v, ctx_name)
        if v.ndim != self.nd + 2 or v.dtype not in CONV_DTYPES + HALF_CONV_DTYPES:
            raise TypeError(f"{self}: {what} must be a {self.nd + 2}-d float32/float64 (or "
                            f"float16/bfloat16) GPU array, got {v.type}")
        return v

    @staticmethod
    def _ctx_name(*vs: Any) -> Any:
        return next((v.type.context_name for v in vs if is_gpu_var(v)), None)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        backend, _ = conv_backend()
        cells = [storage_map[v] for v in node.inputs]
        out_cell = storage_map[node.outputs[0]]
        name = node.outputs[0].dtype    # every operand's: the kernels' and cuBLAS's dtype
        dtype = np.dtype(name)
        plans: dict[tuple, Any] = {}

        def thunk() -> None:
            ctx.activate()
            out_cell[0] = self._run(ctx, backend, plans, dtype, name, [c[0] for c in cells])

        # 3-d and half without cuDNN compute on the host (a sync): not capturable
        thunk.capturable = backend == "cudnn" or (   # type: ignore[attr-defined]
            self.nd == 2 and name not in HALF_CONV_DTYPES)
        thunk.launches = True     # type: ignore[attr-defined]
        return thunk

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [prefetch_request()] if FORCE_GEMM and self.nd == 2 else []

    # ------------------------------------------------------------------ shared machinery
    def _plan(self, ctx: Any, backend: str, plans: dict, dtype: np.dtype, xshape, wshape,
              yshape, pads) -> Any:
        """The cached cuDNN descriptors for this shape, or None for the GEMM path (2-d) or
        the host (3-d)."""
        key = (xshape, wshape, yshape)
        if key in plans:
            return plans[key]
        plan = None
        if backend == "cudnn":
            sym = _symmetric(pads)
            if not sym:  # run on the explicitly padded input
                xshape = _padded_shape(xshape, pads)
            p = tuple(q[0] for q in pads) if sym else (0,) * self.nd
            compute = self.compute_dtype(dtype.name)
            # the compute dtype is named only where it is not the data's (half operands)
            extra = {} if compute == dtype.name else {"compute": compute}
            try:
                plan = ConvDescs(cudnn(), ctx, self.kind, dtype.name, xshape, wshape, yshape,
                                 p, self.subsample, self.filter_dilation, self.filter_flip,
                                 self.num_groups, _math_mode(dtype.name), **extra)
                self._offer_own(ctx, plan, dtype.name, xshape, wshape, yshape, p)
            except CudnnError as exc:
                where = "im2col" if self._gemm_path(dtype.name) else "the host"
                _announce(f"cuDNN refused a shape ({exc}); that convolution runs through "
                          f"{where}")
                plan = None
        plans[key] = plan
        return plan

    def _offer_own(self, ctx: Any, plan: Any, dtype: str, xshape, wshape, yshape,
                   pads) -> None:
        """Offer the timed search our own algorithm for this call where one applies: the
        direct filter gradient (conv_wgrad.py) of a small filter."""
        if self.kind != "bwd_filter":
            return
        direct = direct_wgrad(dtype, xshape, wshape, yshape, pads, self.subsample,
                              self.filter_dilation, self.filter_flip, self.num_groups)
        if direct is not None:
            plan.add_own(OwnAlgorithm("direct", direct.workspace,
                                      lambda a, b, out, ws: direct.run(ctx, a, b, out, ws)))

    @staticmethod
    def _execute(ctx: Any, plan: Any, a_ptr: int, b_ptr: int, out_ptr: int) -> None:
        """One cuDNN call of `plan` (see ConvDescs.run for the operands), its workspace from
        the pool; the first call outside a capture may time the algorithms (ALGO_SEARCH)."""
        if ALGO_SEARCH == "time" and not plan.timed and ctx.pool.sink is None:
            size = plan.search_workspace
            scratch = ctx.pool.allocate(size) if size else None
            plan.time_algorithms(a_ptr, b_ptr, out_ptr, scratch.ptr if size else 0, size)
            del scratch
        ws = ctx.pool.allocate(plan.workspace) if plan.workspace else None
        plan.run(a_ptr, b_ptr, out_ptr, ws.ptr if ws is not None else 0)

    def _gemm_path(self, name: str) -> bool:
        """Whether a shape cuDNN refuses runs through im2col + cuBLAS (2-d float32/float64)
        rather than on the host."""
        return self.nd == 2 and name in CONV_DTYPES

    def _on_host(self, out: Any, compute: Callable[..., np.ndarray], *arrays: Any) -> Any:
        """out = compute(*arrays on the host) (3-d or half without a cuDNN plan: it syncs;
        half operands are computed in float32 and rounded once)."""
        _announce(f"{type(self).__name__} computes on the host (no cuDNN for its shape)")
        vd = np.dtype(value_dtype(out.dtype.name))
        return out.set(np.ascontiguousarray(compute(*(a.get().astype(vd) for a in arrays)),
                                            dtype=out.dtype))

    def _geometry_args(self, pads) -> tuple:
        return (pads, self.subsample, self.filter_dilation, self.filter_flip, self.num_groups)


class GpuConv2d(_GpuConvBase):
    """conv2d(input, filters) on the GPU (GpuConv3d: conv3d)."""

    kind = "fwd"

    infer_shape = Conv2d.infer_shape

    def make_node(self, img: Any, kern: Any) -> Apply:
        ctx = self._ctx_name(img, kern)
        img, kern = self._gpu4(img, ctx, "input"), self._gpu4(kern, ctx, "filters")
        if img.dtype != kern.dtype:
            raise TypeError(f"{self}: input and filters need one dtype, got {img.dtype} and "
                            f"{kern.dtype}")
        out = GpuArrayType(img.dtype, (img.broadcastable[0], kern.broadcastable[0])
                           + (False,) * self.nd, ctx)
        return Apply(self, [img, kern], [out()])

    def _run(self, ctx, backend, plans, dtype, name, inputs):
        x, w = (_packed(a) for a in inputs)
        self._check_hint(self.imshp, x.shape, "input_shape")
        self._check_hint(self.kshp, w.shape, "filter_shape")
        _cn._check_groups(x.shape[1], w.shape, self.num_groups, str(self))
        pads = self.pads(w.shape[2:])
        osp = _cn._out_hw(x.shape[2:], w.shape[2:], pads, self.subsample,
                          self.filter_dilation, str(self))
        out = new_array(ctx, (x.shape[0], w.shape[0], *osp), dtype)
        if out.size == 0 or x.size == 0:
            if out.size:
                out.fill(0)
            return out
        plan = self._plan(ctx, backend, plans, dtype, x.shape, w.shape, out.shape, pads)
        if plan is None and not self._gemm_path(name):
            return self._on_host(out, lambda a, b: _cn.conv_forward(
                a, b, *self._geometry_args(pads), value_dtype(name)), x, w)
        if plan is None:
            gemm_forward(ctx, name, x, w, out, pads, self.subsample, self.filter_dilation,
                         self.filter_flip, self.num_groups)
            return out
        if not _symmetric(pads):
            x = _zero_padded(ctx, x, pads)
        self._execute(ctx, plan, x.ptr, w.ptr, out.ptr)
        return out


class GpuConv2dGradInputs(_GpuConvBase):
    """The transposed convolution (d conv2d / d input) on the GPU: (filters, output_grad,
    input spatial shape on the host)."""

    kind = "bwd_data"

    infer_shape = Conv2dGradInputs.infer_shape

    def make_node(self, kern: Any, topgrad: Any, shape: Any) -> Apply:
        ctx = self._ctx_name(kern, topgrad)
        kern, topgrad = self._gpu4(kern, ctx, "filters"), self._gpu4(topgrad, ctx, "output_grad")
        if kern.dtype != topgrad.dtype:
            raise TypeError(f"{self}: filters and output_grad need one dtype, got "
                            f"{kern.dtype} and {topgrad.dtype}")
        shape = self._shape2(shape, self)
        out = GpuArrayType(kern.dtype, (topgrad.broadcastable[0], kern.broadcastable[1])
                           + (False,) * self.nd, ctx)
        return Apply(self, [kern, topgrad, shape], [out()])

    def _run(self, ctx, backend, plans, dtype, name, inputs):
        w, gy = _packed(inputs[0]), _packed(inputs[1])
        sp = tuple(int(v) for v in np.asarray(inputs[2]))
        if len(sp) != self.nd:
            raise ValueError(f"{self}: the input spatial shape needs {self.nd} entries, got "
                             f"{sp}")
        self._check_hint(self.kshp, w.shape, "filter_shape")
        n, o = gy.shape[:2]
        if w.shape[0] != o or o % self.num_groups:
            raise ValueError(f"{self}: output_grad of shape {gy.shape} does not match filters "
                             f"of shape {w.shape} with num_groups={self.num_groups}")
        pads = self.pads(w.shape[2:])
        exp = _cn._out_hw(sp, w.shape[2:], pads, self.subsample, self.filter_dilation,
                          str(self))
        if tuple(gy.shape[2:]) != tuple(exp):
            raise ValueError(f"{self}: output_grad has spatial shape {gy.shape[2:]}, expected "
                             f"{exp} for an input of spatial shape {sp}")
        xshape = (n, w.shape[1] * self.num_groups, *sp)
        self._check_hint(self.imshp, xshape, "input_shape")
        dx = new_array(ctx, xshape, dtype)
        if dx.size == 0:
            return dx
        if gy.size == 0:
            return dx.fill(0)
        plan = self._plan(ctx, backend, plans, dtype, xshape, w.shape, gy.shape, pads)
        if plan is None and not self._gemm_path(name):
            return self._on_host(dx, lambda a, b: _cn.conv_grad_inputs(
                a, b, sp, *self._geometry_args(pads), value_dtype(name)), w, gy)
        if plan is None:
            gemm_grad_inputs(ctx, name, w, gy, dx, pads, self.subsample,
                             self.filter_dilation, self.filter_flip, self.num_groups)
            return dx
        if _symmetric(pads):
            self._execute(ctx, plan, w.ptr, gy.ptr, dx.ptr)
            return dx
        full = new_array(ctx, _padded_shape(xshape, pads), dtype)
        self._execute(ctx, plan, w.ptr, gy.ptr, full.ptr)
        dx._copy_from_device(full[_interior(xshape, pads)])
        return dx


class GpuConv2dGradWeights(_GpuConvBase):
    """d conv2d / d filters on the GPU: (input, output_grad, filter spatial shape on the
    host)."""

    kind = "bwd_filter"

    infer_shape = Conv2dGradWeights.infer_shape

    def make_node(self, img: Any, topgrad: Any, shape: Any) -> Apply:
        ctx = self._ctx_name(img, topgrad)
        img, topgrad = self._gpu4(img, ctx, "input"), self._gpu4(topgrad, ctx, "output_grad")
        if img.dtype != topgrad.dtype:
            raise TypeError(f"{self}: input and output_grad need one dtype, got {img.dtype} "
                            f"and {topgrad.dtype}")
        shape = self._shape2(shape, self)
        out = GpuArrayType(img.dtype, (topgrad.broadcastable[1],) + (False,) * (self.nd + 1),
                           ctx)
        return Apply(self, [img, topgrad, shape], [out()])

    def _run(self, ctx, backend, plans, dtype, name, inputs):
        x, gy = _packed(inputs[0]), _packed(inputs[1])
        ksp = tuple(int(v) for v in np.asarray(inputs[2]))
        if len(ksp) != self.nd:
            raise ValueError(f"{self}: the filter spatial shape needs {self.nd} entries, got "
                             f"{ksp}")
        self._check_hint(self.imshp, x.shape, "input_shape")
        n, c = x.shape[:2]
        o, g = gy.shape[1], self.num_groups
        if c % g or o % g:
            raise ValueError(f"{self}: {c} input channels and {o} output_grad channels must "
                             f"both be divisible by num_groups={g}")
        pads = self.pads(ksp)
        exp = _cn._out_hw(x.shape[2:], ksp, pads, self.subsample, self.filter_dilation,
                          str(self))
        if gy.shape[0] != n or tuple(gy.shape[2:]) != tuple(exp):
            raise ValueError(f"{self}: output_grad has shape {gy.shape}, expected "
                             f"{(n, o, *exp)} for input {x.shape}")
        wshape = (o, c // g, *ksp)
        self._check_hint(self.kshp, wshape, "filter_shape")
        dw = new_array(ctx, wshape, dtype)
        if dw.size == 0:
            return dw
        if gy.size == 0 or x.size == 0:
            return dw.fill(0)
        plan = self._plan(ctx, backend, plans, dtype, x.shape, wshape, gy.shape, pads)
        if plan is None and not self._gemm_path(name):
            return self._on_host(dw, lambda a, b: _cn.conv_grad_weights(
                a, b, ksp, *self._geometry_args(pads), value_dtype(name)), x, gy)
        if plan is None:
            gemm_grad_weights(ctx, name, x, gy, dw, pads, self.subsample,
                              self.filter_dilation, self.filter_flip, self.num_groups)
            return dw
        if not _symmetric(pads):
            x = _zero_padded(ctx, x, pads)
        self._execute(ctx, plan, x.ptr, gy.ptr, dw.ptr)
        return dw


class GpuConv3d(GpuConv2d):
    """conv3d(input, filters) on the GPU, through cuDNN's N-d API."""

    nd = 3
    infer_shape = Conv3d.infer_shape


class GpuConv3dGradInputs(GpuConv2dGradInputs):
    """d conv3d / d input on the GPU: (filters, output_grad, input spatial shape (D, H, W)
    on the host)."""

    nd = 3
    infer_shape = Conv3dGradInputs.infer_shape


class GpuConv3dGradWeights(GpuConv2dGradWeights):
    """d conv3d / d filters on the GPU: (input, output_grad, filter spatial shape on the
    host)."""

    nd = 3
    infer_shape = Conv3dGradWeights.infer_shape


# ----------------------------------------------------------------------------- lifters

def _same_float(*vs: Any) -> bool:
    """One dtype, which a GPU convolution takes: float32/float64 anywhere, float16/bfloat16
    only where cuDNN loads."""
    if len({v.dtype for v in vs}) != 1:
        return False
    dtype = vs[0].dtype
    return dtype in CONV_DTYPES or (dtype in HALF_CONV_DTYPES and
                                    conv_backend()[0] == "cudnn")


def _gpu_op(cls: type, op: Any, node: Apply, for_grad: bool) -> Any:
    """The GPU twin of conv Op ``op`` with the compute precision dnn.conv.precision gives."""
    return cls(**op.geometry(), precision=conv_precision(node.outputs[0].dtype, for_grad))


@register_lifter(Conv2d)
def lift_conv2d(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """Conv2d -> GpuConv2d (input and filters of one dtype: float32/float64, or
    float16/bfloat16 where cuDNN loads)."""
    if not _same_float(*node.inputs, node.outputs[0]):
        return None
    return [_gpu_op(GpuConv2d, op, node, False)(inputs[0], inputs[1])]


@register_lifter(Conv2dGradInputs)
def lift_conv2d_grad_inputs(op: Any, node: Apply, context_name: Any,
                            inputs: Any) -> list[Any] | None:
    if not _same_float(*node.inputs[:2], node.outputs[0]):
        return None
    return [_gpu_op(GpuConv2dGradInputs, op, node, True)(inputs[0], inputs[1],
                                                          inputs.host(2))]


@register_lifter(Conv2dGradWeights)
def lift_conv2d_grad_weights(op: Any, node: Apply, context_name: Any,
                             inputs: Any) -> list[Any] | None:
    if not _same_float(*node.inputs[:2], node.outputs[0]):
        return None
    return [_gpu_op(GpuConv2dGradWeights, op, node, True)(inputs[0], inputs[1],
                                                           inputs.host(2))]


def _cudnn_for_3d() -> bool:
    """Whether 3-d convolutions lift: only with cuDNN (no im2col path in 3-d; elsewhere the
    CPU op stays on the host and the placement inserts its transfers)."""
    return conv_backend()[0] == "cudnn"


@register_lifter(Conv3d)
def lift_conv3d(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """Conv3d -> GpuConv3d (float32/float64 of one dtype, cuDNN loadable)."""
    if not _same_float(*node.inputs, node.outputs[0]) or not _cudnn_for_3d():
        return None
    return [_gpu_op(GpuConv3d, op, node, False)(inputs[0], inputs[1])]


@register_lifter(Conv3dGradInputs)
def lift_conv3d_grad_inputs(op: Any, node: Apply, context_name: Any,
                            inputs: Any) -> list[Any] | None:
    if not _same_float(*node.inputs[:2], node.outputs[0]) or not _cudnn_for_3d():
        return None
    return [_gpu_op(GpuConv3dGradInputs, op, node, True)(inputs[0], inputs[1],
                                                          inputs.host(2))]


@register_lifter(Conv3dGradWeights)
def lift_conv3d_grad_weights(op: Any, node: Apply, context_name: Any,
                             inputs: Any) -> list[Any] | None:
    if not _same_float(*node.inputs[:2], node.outputs[0]) or not _cudnn_for_3d():
        return None
    return [_gpu_op(GpuConv3dGradWeights, op, node, True)(inputs[0], inputs[1],
                                                           inputs.host(2))]
