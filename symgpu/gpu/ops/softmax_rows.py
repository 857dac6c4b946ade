"""GpuSoftmaxRows: softmax or log_softmax along the last axis in one kernel, a warp per row
(a block per row past ``WIDE_ROW`` elements).

Why a kernel of its own: expanded into reductions and elementwise ops (symgpu/gpu/ops/nnet.py,
still used for the other axes), the softmax of a classifier's logits costs three or four
launches (the row max, exp(x - max), the row sum, the division or the log), each reading the
whole matrix; the rows of a classifier are short (tens to thousands of classes), so one warp
per row reads its row three times from cache and writes it once, in one launch.  Only arrays
of two or more dimensions take it (nnet.py's lifters): a 1-d softmax is one long row, which
one block would stream alone, where the expanded reductions spread it over the whole GPU.

x is read through its strides (leading axes that collapse into one row stride; otherwise a
contiguous copy first); the result is a new C-contiguous array. The values are those of the
CPU ops (max-shifted, NaN propagating as NumPy's max does).

``bias=True`` takes a second input, a vector added to every row as it is read: the pass
``gpu_softmax_rows_bias`` (49.43) gives a classifier's ``softmax(dot(h, W) + b)`` to the
kernel as (dot(h, W), b), so the bias add is no launch of its own. In the default passes
(``fast_run``); ``optimizer_excluding=gpu_softmax_rows_bias`` turns it off.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops.elemwise import GpuElemwise, cast_target
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb

__all__ = ["GpuSoftmaxRows", "SOFTMAX_ROWS_DTYPES", "HALF_INPUTS", "softmax_rows_source",
           "rows_layout", "gpu_softmax_rows_bias"]

#: dtype -> CUDA storage type the kernels are instantiated for (the half types are loaded,
#: computed and summed in float, rounded once on the store)
SOFTMAX_ROWS_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
                       "float64": "double"}
_BLOCK = 256            # 8 warps: 8 rows per block
_MAX_BLOCKS = 8192
_MODULE_KEY = ("symgpu.softmax_rows",)
_CU = sections("softmax_rows.cu")


#: rows longer than this take a whole block each (a warp each below: most classifiers)
WIDE_ROW = 1024


#: the half types whose arrays a float32 softmax may read as they are (``x_dtype``)
HALF_INPUTS = ("float16", "bfloat16")


def _kernel_name(dtype: str, log: bool, wide: bool, bias: bool = False,
                 x_dtype: str | None = None) -> str:
    """(Each kernel has a ``_bias`` twin: the module defines both.)"""
    name = f"{'log_' if log else ''}softmax_{'block' if wide else 'warp'}_rows_{dtype}"
    if x_dtype is not None:
        name += f"_from_{x_dtype}"
    return name + "_bias" if bias else name


def softmax_rows_source() -> str:
    """The CUDA module with every ``[log_]softmax_{warp,block}_rows_<dtype>`` kernel, and
    the float32 ones reading a half x (``..._float32_from_<half>``)."""
    parts = [common_source(), _CU[""].substitute()]
    kinds = [(d, None) for d in SOFTMAX_ROWS_DTYPES] + [("float32", h) for h in HALF_INPUTS]
    for dtype, x_dtype in kinds:
        ctype = SOFTMAX_ROWS_DTYPES[dtype]
        for log in (False, True):
            for wide in (False, True):
                parts.append(_CU["rows"].substitute(
                    name=_kernel_name(dtype, log, wide, x_dtype=x_dtype), ctype=ctype,
                    xtype=SOFTMAX_ROWS_DTYPES[x_dtype or dtype], vtype=value_ctype(dtype),
                    log="true" if log else "false", wide="true" if wide else "false"))
    return "".join(parts)


def rows_layout(shape: tuple, strides: tuple, itemsize: int) -> tuple[int, int, int, int] | None:
    """(rows, n, row stride, element stride) in elements of an array seen as rows of its
    last axis, or None when its leading axes do not collapse into one row stride (or a
    stride is not a whole number of elements): the caller then copies it first."""
    if any(s % itemsize for s in strides):
        return None
    n = shape[-1] if shape else 1
    es = strides[-1] // itemsize if shape and n > 1 else 1
    rows, row_stride = 1, 0
    for size, stride in reversed(list(zip(shape[:-1], strides[:-1]))):
        if size == 1:
            continue
        step = stride // itemsize
        if rows == 1:
            row_stride = step
        elif step != row_stride * rows:
            return None
        rows *= size
    return rows, n, row_stride, es


class GpuSoftmaxRows(Op):
    """softmax (``log=False``) or log_softmax (``log=True``) of a float GPU array
    along its last axis (with ``bias``: of the array plus a vector along that axis): a new
    C-contiguous array of its type. With ``x_dtype`` (a half type), x is an array of that
    type read as float32 and the result is float32: the softmax of ``cast(x, 'float32')``,
    the cast no launch of its own (``gpu_softmax_rows_bias``)."""

    __props__ = ("log", "bias", "x_dtype")
    capturable = True   # a pool allocation and one launch on the stream (graphs.py)
    launches = True

    def __init__(self, log: bool = False, bias: bool = False, x_dtype: str | None = None):
        if x_dtype is not None and x_dtype not in HALF_INPUTS:
            raise ValueError(f"GpuSoftmaxRows: x_dtype must be one of {HALF_INPUTS} or None, "
                             f"got {x_dtype!r}")
        self.log, self.bias, self.x_dtype = bool(log), bool(bias), x_dtype

    def __str__(self) -> str:
        src = f",from {self.x_dtype}" if self.x_dtype else ""
        return (f"GpuSoftmaxRows{{{'log' if self.log else 'softmax'}"
                f"{',bias' if self.bias else ''}{src}}}")

    def make_node(self, x: Any, b: Any = None) -> Apply:
        if not is_gpu_var(x):
            raise TypeError(f"{self}: expected a GPU variable, got {x}")
        if x.dtype not in SOFTMAX_ROWS_DTYPES or x.ndim == 0:
            raise TypeError(f"{self}: needs a float array ({', '.join(SOFTMAX_ROWS_DTYPES)}) "
                            f"of at least one dimension, got {x.type}")
        if (b is not None) != self.bias:
            raise TypeError(f"{self}: takes {'a bias' if self.bias else 'no bias'}")
        out_type = x.type
        if self.x_dtype is not None:
            if x.dtype != self.x_dtype:
                raise TypeError(f"{self}: reads an array of {self.x_dtype}, got {x.type}")
            out_type = GpuArrayType("float32", x.broadcastable, x.type.context_name)
        if b is None:
            return Apply(self, [x], [out_type()])
        if not is_gpu_var(b) or b.ndim != 1 or b.dtype != out_type.dtype:
            raise TypeError(f"{self}: the bias must be a GPU vector of {out_type.dtype}, "
                            f"got {b}")
        return Apply(self, [x, b], [out_type()])   # b broadcasts along x's last axis only

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The module (else compiled on the first call), for the link-time prefetch
        (symgpu/gpu/exec/prefetch.py) to compile alongside the function's other kernels."""
        return [(_MODULE_KEY, softmax_rows_source, ())]

    def perform_args(self, node: Apply) -> tuple[tuple[str, str]]:
        """``perform``'s kernels, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        dtype = node.outputs[0].dtype
        return ((_kernel_name(dtype, self.log, False, self.bias, self.x_dtype),
                 _kernel_name(dtype, self.log, True, self.bias, self.x_dtype)),)

    def perform(self, node, inputs, out, kernels=None):
        x = inputs[0]
        bias = ()
        if self.bias:
            b = inputs[1]
            n = x.shape[-1]
            if b.shape[0] not in (1, n):
                raise ValueError(f"{self}: a bias of shape {b.shape} does not broadcast "
                                 f"along the last axis of an array of shape {x.shape}")
            if b.strides[0] % b.dtype.itemsize:
                b = b.copy()
            bias = (b.ptr, 0 if b.shape[0] == 1 else b.strides[0] // b.dtype.itemsize)
        res = GpuArray(x.shape, node.outputs[0].dtype, x.context)
        if x.size:
            layout = rows_layout(x.shape, x.strides, x.dtype.itemsize)
            if layout is None:
                x = x.copy()
                layout = rows_layout(x.shape, x.strides, x.dtype.itemsize)
            rows, n, xs0, xs1 = layout
            ctx = x.context
            ctx.activate()
            wide = n > WIDE_ROW
            if kernels is None:
                kernels = self.perform_args(node)[0]
            fn = get_prepared_kernel(_MODULE_KEY, softmax_rows_source, kernels[wide],
                                     "PqqPqPqq" if self.bias else "PqqPqq", context=ctx)
            per_block = 1 if wide else _BLOCK // 32
            blocks = max(1, min(_MAX_BLOCKS, -(-rows // per_block)))
            fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, x.ptr, xs0, xs1,
                                   *bias, res.ptr, rows, n)
        out[0][0] = res


# ----------------------------------------------------------------------------- the pass

def _row_bias_add(var: Variable) -> tuple[Variable, Variable] | None:
    """(x, b) when ``var`` is ``x + b.dimshuffle('x', 0)`` (either order) of a matrix x."""
    node = var.owner
    if node is None or type(node.op) is not GpuElemwise or node.op.inplace_pattern or \
            getattr(node.op.scalar_op, "name", None) != "add" or len(node.inputs) != 2:
        return None
    for x, d in (node.inputs, node.inputs[::-1]):
        dn = d.owner
        if x.broadcastable == (False, False) and x.type == var.type and dn is not None and \
                type(dn.op) is GpuDimShuffle and dn.op.new_order == ("x", 0) and \
                dn.inputs[0].dtype == x.dtype:
            return x, dn.inputs[0]
    return None


def _read_only_by_softmaxes(fgraph: FunctionGraph, z: Variable) -> bool:
    return z not in fgraph.outputs and all(
        isinstance(c, Apply) and type(c.op) is GpuSoftmaxRows
        for c, _ in fgraph.clients.get(z, []))


def _half_cast_to_float32(var: Variable) -> Variable | None:
    """h where ``var`` is ``GpuElemwise{Cast{float32}}(h)`` of a half array h, else None."""
    if cast_target(var.owner) != "float32":
        return None
    (h,) = var.owner.inputs
    return h if h.dtype in HALF_INPUTS else None


def _with_bias(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuSoftmaxRows(x + b) -> GpuSoftmaxRows{bias}(x, b) where every reader of the sum is
    such a softmax (the add then launches nothing); then GpuSoftmaxRows(cast(h, 'float32'),
    ...) -> GpuSoftmaxRows{from half}(h, ...) where every reader of the cast is such a
    softmax (a mixed-precision classifier's half logits: the cast launches nothing); else
    None."""
    if type(node.op) is not GpuSoftmaxRows or node.op.x_dtype is not None:
        return None
    op, inputs = node.op, list(node.inputs)
    found = None if op.bias else _row_bias_add(inputs[0])
    if found is not None and not _read_only_by_softmaxes(fgraph, inputs[0]):
        found = None
    if found is not None:
        inputs = list(found)
    h = _half_cast_to_float32(inputs[0])
    # (below a bias add taken in, the cast's readers must be that add alone)
    add = node.inputs[0].owner if found is not None else None
    if h is not None and inputs[0] not in fgraph.outputs and all(
            c is add if add is not None else
            isinstance(c, Apply) and type(c.op) is GpuSoftmaxRows
            for c, _ in fgraph.clients.get(inputs[0], [])):
        return [GpuSoftmaxRows(op.log, len(inputs) == 2, x_dtype=h.dtype)(h, *inputs[1:])]
    if inputs == list(node.inputs):
        return None
    return [GpuSoftmaxRows(op.log, bias=True)(*inputs)]


def gpu_softmax_rows_bias(fgraph: FunctionGraph) -> int:
    """Apply `_with_bias` everywhere; returns how many softmaxes took their bias or the cast
    of their half input. ``optimizer_excluding=gpu_softmax_rows_bias`` turns both off."""
    return sweep(fgraph, _with_bias, "gpu_softmax_rows_bias")


# before gpu_fusion (49.5), which would merge the add into other elementwise kernels
optdb.register("gpu_softmax_rows_bias", gpu_softmax_rows_bias, 49.43, "fast_run", "fusion", "gpu")
