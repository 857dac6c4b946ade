"""images2neibs on the GPU (Theano's theano.gpuarray.neighbours.GpuImages2Neibs) and its
gradient, by kernels of our own (``codegen/neighbours.cu``), with lifters from the host ops
of symgpu/tensor/nnet/neighbours.py.

``GpuImages2Neibs(mode)(ten4, neib_shape, neib_step)``: the windows of a GPU (N, S, H, W)
tensor as the rows of a new C-contiguous (N * S * windows, rows * columns) matrix, in every
mode of Images2Neibs ('valid', 'ignore_borders', 'half', 'full', 'wrap_centered'); one
thread per output element copies the pixel its window reads (a zero for padding), so it
holds every GPU dtype and a half value is copied bit for bit. ``GpuImages2NeibsGrad(mode)(gz,
ten4, neib_shape, neib_step)``: one thread per pixel sums the gradients of the window
elements that read it (a gather: deterministic, no atomics; half dtypes summed in float32,
integers in 64 bits, rounded once on the store). The two are each other's gradient, as the
host ops, so ``T.grad`` of a lifted graph and ``neibs2images`` (reshapes, lifted by their own
lifters) stay on the device.

Why kernels of our own: the host ops ran between two transfers (a round trip per call and a
break in the captured CUDA graph); these are one launch each, read strided inputs in place,
and are capturable (neib_shape and neib_step are short host vectors: the graph's key holds
their values). The window arithmetic and its checks are the host op's (window_geometry), so
the errors are the same on both devices.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import SUPPORTED, storage_ctype, value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import FLOAT_DTYPES, UINT_DTYPES, is_float
from symgpu.tensor.nnet.neighbours import MODES, Images2Neibs, Images2NeibsGrad, window_geometry
from symgpu.tensor.type import TensorType

__all__ = ["GpuImages2Neibs", "GpuImages2NeibsGrad", "neighbours_source", "NEIBS_DTYPES"]

_CU = sections("neighbours.cu")
_MODULE_KEY = ("symgpu.neighbours",)
_BLOCK = 256
_MAX_BLOCKS = 65535
#: the dtypes the kernels take: every GPU dtype (the storage C type of each)
NEIBS_DTYPES = {d: storage_ctype(d) for d in SUPPORTED}
#: kernel argument formats: two pointers, the geometry, two or four element strides, wrap
_FORMATS = {"fwd": "PP" + "q" * 16 + "i", "grad": "PP" + "q" * 14 + "i"}


def _acc_ctype(dtype: str) -> str:
    """What the gradient sums in: a float dtype's value type (float32 for the halves), 64-bit
    integers otherwise (the store wraps them as the host's np.add.at does)."""
    if dtype in FLOAT_DTYPES:
        return value_ctype(dtype)
    return "unsigned long long" if dtype in UINT_DTYPES else "long long"


def neighbours_source() -> str:
    """The CUDA module: neibs_fwd_<dtype> and neibs_grad_<dtype> for every dtype in
    NEIBS_DTYPES."""
    parts = [common_source(), _CU[""].substitute()]
    for dtype, t in NEIBS_DTYPES.items():
        parts.append(_CU["fwd"].substitute(dtype=dtype, t=t))
        parts.append(_CU["grad"].substitute(dtype=dtype, t=t, acc=_acc_ctype(dtype)))
    return "".join(parts)


def _element_strides(a: Any) -> tuple[Any, tuple[int, ...]]:
    """`a` (copied where a stride is not a whole number of elements) and its element strides."""
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides):
        a = a.copy()
    return a, tuple(s // isz for s in a.strides)


def _launch(kind: str, dtype: str, ctx: Any, total: int, args: tuple) -> None:
    """One grid-stride launch of neibs_<kind>_<dtype> over `total` threads."""
    if not total:
        return
    ctx.activate()
    fn = get_prepared_kernel(_MODULE_KEY, neighbours_source, f"neibs_{kind}_{dtype}",
                             _FORMATS[kind], context=ctx)
    blocks = max(1, min(_MAX_BLOCKS, -(-total // _BLOCK)))
    fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, *args)


def _context_name(*vs: Any) -> Any:
    return next((v.type.context_name for v in vs if is_gpu_var(v)), None)


class _GpuNeibsBase(Op):
    """What the two ops share: the mode, one launch on the stream."""

    __props__ = ("mode",)
    capturable = True         # a pool allocation and one launch (graphs.py)
    launches = True
    #: the output's shape is host arithmetic on the inputs' shapes and the window vectors
    shape_from_inputs = True

    def __init__(self, mode: str = "valid"):
        if mode not in MODES:
            raise ValueError(f"{type(self).__name__}: mode must be one of {MODES}, got "
                             f"{mode!r}")
        self.mode = mode

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{self.mode}}}"

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, neighbours_source, ())]

    def _geometry(self, shape: tuple, neib_shape: Any, neib_step: Any) -> tuple:
        """The flat geometry the kernels take: gc, gd, c, d, sx, sy, px, py."""
        (gc, c, sx, px), (gd, d, sy, py) = window_geometry(shape, neib_shape, neib_step,
                                                           self.mode)
        return gc, gd, c, d, sx, sy, px, py


class GpuImages2Neibs(_GpuNeibsBase):
    """Images2Neibs on the GPU (Theano's GpuImages2Neibs): inputs (ten4, neib_shape,
    neib_step), ten4 a 4-d GPU tensor, the two others host integer pairs (neib_step defaults
    to neib_shape); the windows as rows of a new matrix (see the module docstring)."""

    infer_shape = Images2Neibs.infer_shape
    connection_pattern = Images2Neibs.connection_pattern

    def make_node(self, ten4: Any, neib_shape: Any, neib_step: Any = None) -> Apply:
        ten4 = as_gpuarray_variable(ten4, _context_name(ten4))   # a GPU dtype: the kernels'
        # the host op's checks (4-d, integer vectors) and its input variables
        host = Images2Neibs(self.mode).make_node(TensorType(ten4.dtype, ten4.broadcastable)(),
                                                 neib_shape, neib_step)
        return Apply(self, [ten4, host.inputs[1], host.inputs[2]],
                     [GpuArrayType(ten4.dtype, (False, False), ten4.type.context_name)()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s dtype (the node's): resolved once per node, by Op.make_thunk."""
        return (node.inputs[0].dtype,)

    def perform(self, node, inputs, out, dtype=None):
        x, neib_shape, neib_step = inputs
        geo = self._geometry(x.shape, neib_shape, neib_step)
        gc, gd, c, d = geo[:4]
        n, s = int(x.shape[0]), int(x.shape[1])
        z = new_array(x.context, (n * s * gc * gd, c * d), x.dtype)
        x, xs = _element_strides(x)
        _launch("fwd", dtype or node.inputs[0].dtype, x.context, z.size,
                (x.ptr, z.ptr, n, s, int(x.shape[2]), int(x.shape[3]), *geo, *xs,
                 int(self.mode == "wrap_centered")))
        out[0][0] = z

    def grad(self, inputs, output_grads):
        x, neib_shape, neib_step = inputs
        if not is_float(x.dtype):
            return [None, None, None]
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        return [GpuImages2NeibsGrad(self.mode)(gz, x, neib_shape, neib_step), None, None]


class GpuImages2NeibsGrad(_GpuNeibsBase):
    """Images2NeibsGrad on the GPU: inputs (gz, ten4, neib_shape, neib_step); each row of the
    GPU matrix gz added back onto the pixels its window read, a new C-contiguous tensor of
    ten4's shape (ten4 gives the shape only)."""

    infer_shape = Images2NeibsGrad.infer_shape
    connection_pattern = Images2NeibsGrad.connection_pattern

    def make_node(self, gz: Any, ten4: Any, neib_shape: Any, neib_step: Any) -> Apply:
        ctx = _context_name(gz, ten4)
        gz, ten4 = as_gpuarray_variable(gz, ctx), as_gpuarray_variable(ten4, ctx)
        host = Images2NeibsGrad(self.mode).make_node(
            TensorType(gz.dtype, gz.broadcastable)(),
            TensorType(ten4.dtype, ten4.broadcastable)(), neib_shape, neib_step)
        return Apply(self, [gz, ten4, host.inputs[2], host.inputs[3]],
                     [GpuArrayType(gz.dtype, (False,) * 4, ctx)()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s dtype (the node's): resolved once per node, by Op.make_thunk."""
        return (node.inputs[0].dtype,)

    def perform(self, node, inputs, out, dtype=None):
        gz, x, neib_shape, neib_step = inputs
        geo = self._geometry(x.shape, neib_shape, neib_step)
        gc, gd, c, d = geo[:4]
        n, s, h, w = (int(v) for v in x.shape)
        want = (n * s * gc * gd, c * d)
        if tuple(gz.shape) != want:
            raise ValueError(f"{self}: gz has shape {tuple(gz.shape)} (dtype {gz.dtype}); "
                             f"images of shape {tuple(x.shape)} give windows of shape {want}")
        gx = new_array(gz.context, (n, s, h, w), gz.dtype)
        gz, gs = _element_strides(gz)
        _launch("grad", dtype or node.inputs[0].dtype, gz.context, gx.size,
                (gz.ptr, gx.ptr, n, s, h, w, *geo, *gs, int(self.mode == "wrap_centered")))
        out[0][0] = gx

    def grad(self, inputs, output_grads):
        gz, x, neib_shape, neib_step = inputs
        if not is_float(gz.dtype):
            return [None] * 4
        gg = as_gpuarray_variable(output_grads[0], gz.type.context_name)
        return [GpuImages2Neibs(self.mode)(gg, neib_shape, neib_step), None, None, None]


# ----------------------------------------------------------------------------- lifters

@register_lifter(Images2Neibs)
def lift_images2neibs(op: Images2Neibs, node: Apply, context_name: Any,
                      inputs: Any) -> list[Any] | None:
    """Images2Neibs of images the GPU holds -> GpuImages2Neibs (the window vectors stay on
    the host)."""
    if not is_gpu_var(inputs[0]) or node.inputs[0].dtype not in NEIBS_DTYPES:
        return None
    return [GpuImages2Neibs(op.mode)(inputs[0], inputs.host(1), inputs.host(2))]


@register_lifter(Images2NeibsGrad)
def lift_images2neibs_grad(op: Images2NeibsGrad, node: Apply, context_name: Any,
                           inputs: Any) -> list[Any] | None:
    """Images2NeibsGrad -> GpuImages2NeibsGrad (ten4, read for its shape only, as the GPU
    holds it: in a gradient graph it is the lifted images)."""
    if not is_gpu_var(inputs[0]) or node.inputs[0].dtype not in NEIBS_DTYPES:
        return None
    return [GpuImages2NeibsGrad(op.mode)(inputs[0], inputs[1], inputs.host(2),
                                         inputs.host(3))]
