"""The integer-label categorical cross-entropy on the GPU: GpuCrossentropyCategorical1Hot
(``-log p[i, y_i]``) and GpuCrossentropyCategorical1HotGrad (``-g_i / p[i, y_i]`` at
``(i, y_i)``, zeros elsewhere), with lifters from the CPU ops of symgpu/tensor/nnet.py.

Why kernels of their own: without them a graph using these ops goes to the host and back.
The stabilising rewrites replace ``crossentropy_1hot(softmax(x), y)`` by a log_softmax form
before lifting, so these ops only remain when p is not a softmax (sigmoid-normalised or given
probabilities).

p is a float matrix (float16, bfloat16, float32 or float64; the half types computed in
float32) read through its strides (transposed or sliced views need no
copy); labels are an int32/int64 vector on the device, also read through their stride. As on
the CPU, labels must lie in [0, k): negative labels do NOT count from the end. Every label is
checked by the kernel, which records an offending value in the report
slot of its node (symgpu/gpu/runtime/device_checks.py); a bad label raises ValueError naming the
shapes and the value, like the CPU op, at the next synchronisation (in the same call when
its results come back to the host): no sync of their own, and they capture into CUDA graphs.
g of the gradient is a scalar, a length-1 vector or a length-n vector (NumPy broadcasting of the CPU op); a g of the other float dtype
is read as is and the quotient is computed in the wider type, as NumPy does.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops.advanced import ERROR_REPORT_SOURCE, INDEX_DTYPES
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import DeviceChecked, launch_checked
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.nnet import CrossentropyCategorical1Hot, CrossentropyCategorical1HotGrad

__all__ = ["GpuCrossentropyCategorical1Hot", "GpuCrossentropyCategorical1HotGrad",
           "CROSSENTROPY_DTYPES", "crossentropy_source"]

#: p (and g) dtype -> CUDA storage type (the half types computed in float32)
CROSSENTROPY_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
                       "float64": "double"}

_BLOCK = 256
_MAX_BLOCKS = 4096

_CU = sections("crossentropy.cu")   # the bodies, then the entry points


def _fwd_name(dtype: str, idx_dtype: str) -> str:
    return f"ce1hot_{dtype}_{idx_dtype}"


def _grad_name(dtype: str, g_dtype: str, idx_dtype: str) -> str:
    return f"ce1hot_grad_{dtype}_{g_dtype}_{idx_dtype}"


def crossentropy_source() -> str:
    """The CUDA module with every forward and gradient kernel (all p, g and label dtypes),
    after advanced.py's ``report`` device function."""
    parts = [common_source(), ERROR_REPORT_SOURCE, _CU[""].substitute()]
    for dtype, t in CROSSENTROPY_DTYPES.items():
        for idt, it in INDEX_DTYPES.items():
            parts.append(_CU["fwd"].substitute(name=_fwd_name(dtype, idt), t=t,
                                               vt=value_ctype(dtype), it=it))
            for gdt, gt in CROSSENTROPY_DTYPES.items():
                wt = "double" if "double" in (t, gt) else "float"
                parts.append(_CU["grad"].substitute(name=_grad_name(dtype, gdt, idt), t=t,
                                                    gt=gt, wt=wt, it=it))
    return "".join(parts)


_FORMATS = {"fwd": "PqqPqPqqP", "grad": "PqPqqPqPqqP"}
_MODULE_KEY = ("symgpu.crossentropy",)


def _elem_strides(a: Any) -> tuple[Any, tuple[int, ...]]:
    """(a, its strides in elements; 0 on length-1 axes), or a C-contiguous copy's where a
    stride is not a whole number of elements."""
    isz = a.dtype.itemsize
    if any(s % isz for s, n in zip(a.strides, a.shape) if n > 1):
        a = a.copy()
    return a, tuple(0 if n <= 1 else s // isz for s, n in zip(a.strides, a.shape))


def _check_rows(op: Op, p: Any, y: Any) -> None:
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"categorical_crossentropy ({op}): {y.shape[0]} labels for "
                         f"{p.shape[0]} rows (coding_dist shape {p.shape}, labels shape "
                         f"{y.shape})")


def _launch(op: Op, node: Apply, name: str, kind: str, args: tuple, total: int, p: Any,
            y: Any) -> None:
    """Launch ``name`` over ``total`` threads' worth of work on p's context stream; a label
    outside [0, k) raises ValueError at the next synchronisation (device_checks.py)."""
    ctx = p.context
    ctx.activate()
    fn = get_prepared_kernel(_MODULE_KEY, crossentropy_source, name, _FORMATS[kind], context=ctx)
    blocks = max(1, min(_MAX_BLOCKS, -(-total // _BLOCK)))
    p_shape, y_shape = p.shape, y.shape

    def describe(bad: int) -> Exception:
        return ValueError(f"categorical_crossentropy ({op}): labels must lie in "
                          f"[0, {p_shape[1]}) for coding_dist of shape {p_shape} (labels "
                          f"shape {y_shape}); got label {bad}")
    launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1), args, describe)


def _context_of(op: Op, p: Any) -> Any:
    if not is_gpu_var(p):
        raise TypeError(f"{op}: expected a GPU variable for coding_dist, got {p}")
    return p.type.context_name


def _check_p_y(op: Op, p: Any, y: Any) -> None:
    if p.ndim != 2 or p.dtype not in CROSSENTROPY_DTYPES:
        raise TypeError(f"{op}: coding_dist must be a float matrix "
                        f"({', '.join(CROSSENTROPY_DTYPES)}), got {p.type}")
    if y.ndim != 1 or y.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: true labels must be an int32/int64 vector, got {y.type}")


class _CrossentropyKernelOp(DeviceChecked, Op):
    """What both ops share: their one CUDA module, offered to the parallel prefetch."""


    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The crossentropy module (else compiled on the first call), for the link-time
        prefetch (symgpu/gpu/exec/prefetch.py) to compile alongside the function's other kernels."""
        return [(_MODULE_KEY, crossentropy_source, ())]


# ----------------------------------------------------------------------------- forward

class GpuCrossentropyCategorical1Hot(_CrossentropyKernelOp):
    """``-log(p[i, y_i])`` per row of a float matrix p for int labels y in [0, k): a new
    C-contiguous vector of p's dtype; a label out of range raises ValueError after the
    launch, as the CPU op."""

    __props__ = ()

    def __str__(self) -> str:
        return "GpuCrossentropyCategorical1Hot"

    infer_shape = CrossentropyCategorical1Hot.infer_shape

    def make_node(self, coding_dist: Any, true_one_of_n: Any) -> Apply:
        p = coding_dist
        ctx_name = _context_of(self, p)
        y = as_gpuarray_variable(true_one_of_n, ctx_name)
        _check_p_y(self, p, y)
        out = GpuArrayType(p.dtype, (p.broadcastable[0],), ctx_name)()
        return Apply(self, [p, y], [out])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_fwd_name(node.inputs[0].dtype, node.inputs[1].dtype),)

    def perform(self, node, inputs, out, kernel=None):
        p, y = inputs
        _check_rows(self, p, y)
        n, k = p.shape
        res = GpuArray((n,), p.dtype, p.context)
        if n:
            p, (ps0, ps1) = _elem_strides(p)
            y, (ys,) = _elem_strides(y)
            _launch(self, node, self.perform_args(node)[0] if kernel is None else kernel, "fwd",
                    (p.ptr, ps0, ps1, y.ptr, ys, res.ptr, n, k), n, p, y)
        out[0][0] = res

    def grad(self, inputs, output_grads):
        p, y = inputs
        g = as_gpuarray_variable(output_grads[0], p.type.context_name)
        return [GpuCrossentropyCategorical1HotGrad()(g, p, y), None]


# ----------------------------------------------------------------------------- gradient

class GpuCrossentropyCategorical1HotGrad(_CrossentropyKernelOp):
    """The gradient of the cross-entropy w.r.t. p: ``-g_i / p[i, y_i]`` at ``(i, y_i)``,
    zero elsewhere, as a new C-contiguous matrix of p's type (one kernel writes every
    element, no separate fill). g: a float scalar or a vector of length 1 or n."""

    __props__ = ()

    def __str__(self) -> str:
        return "GpuCrossentropyCategorical1HotGrad"

    infer_shape = CrossentropyCategorical1HotGrad.infer_shape

    def make_node(self, g: Any, coding_dist: Any, true_one_of_n: Any) -> Apply:
        p = coding_dist
        ctx_name = _context_of(self, p)
        g = as_gpuarray_variable(g, ctx_name)
        y = as_gpuarray_variable(true_one_of_n, ctx_name)
        _check_p_y(self, p, y)
        if g.ndim > 1 or g.dtype not in CROSSENTROPY_DTYPES:
            raise TypeError(f"{self}: the output gradient must be a float scalar or vector "
                            f"({', '.join(CROSSENTROPY_DTYPES)}), got {g.type}")
        return Apply(self, [g, p, y], [p.type()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        g, p, y = node.inputs
        return (_grad_name(p.dtype, g.dtype, y.dtype),)

    def perform(self, node, inputs, out, kernel=None):
        g, p, y = inputs
        _check_rows(self, p, y)
        n, k = p.shape
        if g.ndim == 1 and g.shape[0] not in (1, n):
            raise ValueError(f"{self}: the output gradient of shape {g.shape} does not "
                             f"broadcast to the {n} rows of coding_dist of shape {p.shape}")
        res = GpuArray((n, k), p.dtype, p.context)
        if n:
            p, (ps0, ps1) = _elem_strides(p)
            y, (ys,) = _elem_strides(y)
            g, gstr = _elem_strides(g)
            gs = gstr[0] if gstr else 0
            if kernel is None:
                kernel = self.perform_args(node)[0]
            _launch(self, node, kernel, "grad",
                    (g.ptr, gs, p.ptr, ps0, ps1, y.ptr, ys, res.ptr, n, k),
                    n * max(k, 1), p, y)
        out[0][0] = res


# ----------------------------------------------------------------------------- lifters

def _liftable(p: Any, y_host: Any) -> bool:
    return (is_gpu_var(p) and p.ndim == 2 and p.dtype in CROSSENTROPY_DTYPES
            and y_host.ndim == 1 and y_host.dtype in INDEX_DTYPES)


@register_lifter(CrossentropyCategorical1Hot)
def lift_crossentropy_1hot(op: Op, node: Apply, context_name: Any,
                           inputs: Any) -> list[Any] | None:
    """CrossentropyCategorical1Hot -> GpuCrossentropyCategorical1Hot (int32/int64 labels)."""
    if type(op) is not CrossentropyCategorical1Hot or not _liftable(inputs[0], node.inputs[1]):
        return None
    y = as_gpuarray_variable(inputs[1], context_name)
    return [GpuCrossentropyCategorical1Hot()(inputs[0], y)]


@register_lifter(CrossentropyCategorical1HotGrad)
def lift_crossentropy_1hot_grad(op: Op, node: Apply, context_name: Any,
                                inputs: Any) -> list[Any] | None:
    """CrossentropyCategorical1HotGrad -> GpuCrossentropyCategorical1HotGrad (float g of at
    most one dimension, int32/int64 labels); what users' grad() builds before lifting."""
    if type(op) is not CrossentropyCategorical1HotGrad or \
            not _liftable(inputs[1], node.inputs[2]):
        return None
    g_host = node.inputs[0]
    if g_host.ndim > 1 or g_host.dtype not in CROSSENTROPY_DTYPES:
        return None
    g = as_gpuarray_variable(inputs[0], context_name)
    y = as_gpuarray_variable(inputs[2], context_name)
    return [GpuCrossentropyCategorical1HotGrad()(g, inputs[1], y)]
