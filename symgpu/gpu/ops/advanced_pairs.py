"""Integer-pair indexing of a matrix on the GPU, and `arange` made on the device: the
negative log-likelihood of Theano's tutorials, ``-mean(log(p)[arange(y.shape[0]), y])``, and
its gradient run where p and the labels live.

- ``GpuAdvancedSubtensor2``: ``x[a, b]`` for a matrix x and two integer vectors a, b (equal
  lengths, or one of length 1): ``out[i] = x[a[i], b[i]]``, x read through its strides.
- ``GpuAdvancedIncSubtensor2``: a copy of x with ``x[a, b]`` incremented by (``np.add.at``:
  repeated pairs accumulate, through atomicAdd) or set to a value of at most one dimension.
- ``GpuARange``: ``arange(start, stop, step)`` of integer dtype, made by a kernel from host
  scalars (kernel arguments, no upload). ``GpuFromHost(ARange(...))`` — what lifting leaves
  when an arange feeds a GPU op — is rewritten into it.

Negative indices count from the end; a bad index is reported through the node's slot
(symgpu/gpu/runtime/device_checks.py) and raised at the next synchronisation: no sync of their own,
and all three ops capture into CUDA graphs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.runtime.graph_params import (arange_from_params, load_kernels, pack_int64,
                                          prefetch_request, slot_ptr)
from symgpu.gpu.ops.advanced import ADVANCED_DTYPES, INDEX_DTYPES
from symgpu.gpu.ops.elemwise import gpu_elemwise, new_array
from symgpu.gpu.placement.basic_ops import (GpuDimShuffle, GpuFromHost, as_gpuarray_variable,
                                            specify_gpu_broadcastable_as)
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import DeviceChecked, REPORT_SOURCE, launch_checked
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op, PerformThunk
from symgpu.graph.rewriting import node_rewriter, optdb
from symgpu.graph.rewriting.db import POSITIONS
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.tensor.basic import ARange
from symgpu.tensor.elemwise import DimShuffle
from symgpu.tensor.shape_rules import arange_length, numpy_broadcast
from symgpu.tensor.subtensor import AdvancedIncSubtensor, AdvancedSubtensor, SYM
from symgpu.tensor.type import as_tensor_variable
from symgpu.scalar.dtypes import is_float

__all__ = ["GpuAdvancedSubtensor2", "GpuAdvancedIncSubtensor2", "GpuARange", "pairs_source",
           "gather_pairs"]

_BLOCK = 256
_MAX_BLOCKS = 4096
_MODULE_KEY = ("symgpu.advanced_pairs",)

_CU = sections("advanced_pairs.cu")   # the pair loops, then the entry points

_MODES = {0: "gather", 1: "set", 2: "inc"}


def _pairs_name(mode: int, dtype: str, a_dtype: str, b_dtype: str) -> str:
    return f"pairs_{_MODES[mode]}_{dtype}_{a_dtype}_{b_dtype}"


def _rows_name(dtype: str, b_dtype: str) -> str:
    """The gather whose row index is the pair's own: x[arange(r), b] (take_rows.py)."""
    return f"pairs_rows_{dtype}_{b_dtype}"


def pairs_source() -> str:
    """The CUDA module: every gather/set/inc kernel (value x index dtypes), the gathers at
    rows arange(r), and the aranges."""
    parts = [common_source(), REPORT_SOURCE, _CU[""].substitute()]
    for dtype, t in ADVANCED_DTYPES.items():
        for adt, at in INDEX_DTYPES.items():
            for bdt, bt in INDEX_DTYPES.items():
                for mode in _MODES:
                    parts.append(_CU["pairs"].substitute(
                        name=_pairs_name(mode, dtype, adt, bdt), t=t, at=at, bt=bt, mode=mode))
        for bdt, bt in INDEX_DTYPES.items():
            parts.append(_CU["take_rows"].substitute(name=_rows_name(dtype, bdt), t=t, bt=bt))
    for idt, it in INDEX_DTYPES.items():
        parts.append(_CU["arange"].substitute(idt=idt, it=it))
    return "".join(parts)


_PAIRS_FORMAT = "PPqPqPqqqqqqP"


def _elem_stride(a: Any) -> tuple[Any, int]:
    """(vector a, its stride in elements; 0 for length 1), copying an odd-strided one."""
    isz = a.dtype.itemsize
    if a.shape[0] <= 1:
        return a, 0
    if a.strides[0] % isz:
        a = a.copy()
    return a, a.strides[0] // isz


def _pair_length(op: Op, a: Any, b: Any, shape: tuple) -> int:
    """The pairs' broadcast length; ``a`` an index vector, or the row count r of rows
    ``arange(r)``."""
    na, nb = (a if isinstance(a, int) else a.shape[0]), b.shape[0]
    if na != nb and 1 not in (na, nb):
        raise ValueError(f"{op}: index arrays of lengths {na} and {nb} cannot be broadcast "
                         f"together (indexing an array of shape {shape})")
    return 0 if 0 in (na, nb) else max(na, nb)


def _launch_pairs(op: Op, node: Apply, name: str, dst: Any, src: Any, vs: int, a: Any, b: Any,
                  n: int, shape: tuple, s0: int, s1: int) -> None:
    """Launch kernel ``name`` (the node's: _pairs_name, or _rows_name when ``a`` is a row
    count)."""
    ctx = dst.context
    ctx.activate()
    b, bs = _elem_stride(b)
    if isinstance(a, int):   # rows arange(a): the kernel takes each pair's row as its index
        a_ptr, as_ = 0, 0 if a == 1 else 1
    else:
        a, as_ = _elem_stride(a)
        a_ptr = a.ptr
    fn = get_prepared_kernel(_MODULE_KEY, pairs_source, name, _PAIRS_FORMAT, context=ctx)
    blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))

    def describe(bad: int) -> Exception:
        return IndexError(f"{op}: index {bad} is out of bounds for an array of shape {shape} "
                          f"(axis 0 has length {shape[0]}, axis 1 has length {shape[1]})")
    launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1),
                   (dst.ptr, src.ptr, vs, a_ptr, as_, b.ptr, bs, n, shape[0], shape[1], s0, s1),
                   describe)


def gather_pairs(op: Op, node: Apply, x: Any, a: Any, b: Any, name: str) -> Any:
    """``x[a, b]`` as a new vector: ``a`` an index vector, or the row count r of rows
    ``arange(r)`` (more rows than x has raise at once); ``name`` the node's kernel
    (_pairs_name of mode 0, or _rows_name for a row count)."""
    n = _pair_length(op, a, b, x.shape)
    if n and isinstance(a, int) and a > x.shape[0]:
        raise IndexError(f"{op}: index {x.shape[0]} is out of bounds for an array of shape "
                         f"{x.shape} (axis 0 has length {x.shape[0]}, axis 1 has length "
                         f"{x.shape[1]})")
    res = new_array(x.context, (n,), x.dtype)   # x's dtype and context: nothing to check
    if n:
        isz = x.dtype.itemsize
        if any(s % isz for s in x.strides):
            x = x.copy()
        _launch_pairs(op, node, name, res, x, 0, a, b, n, x.shape,
                      x.strides[0] // isz, x.strides[1] // isz)
    return res


def _check_vars(op: Op, x: Any, a: Any | None, b: Any) -> None:
    """x a GPU matrix of a supported dtype, a and b integer vectors (a None: rows arange(r))."""
    if not is_gpu_var(x) or x.ndim != 2 or x.dtype not in ADVANCED_DTYPES:
        raise TypeError(f"{op}: x must be a GPU matrix of {'/'.join(ADVANCED_DTYPES)}, got "
                        f"{x.type}")
    for name, v in (("first", a), ("second", b)):
        if v is not None and (v.ndim != 1 or v.dtype not in INDEX_DTYPES):
            raise TypeError(f"{op}: the {name} index must be an int32/int64 vector, got {v.type}")


class GpuAdvancedSubtensor2(DeviceChecked, Op):
    """``x[a, b]`` of a GPU matrix and two integer vectors: a new C-contiguous vector."""

    __props__ = ()
    #: its length is the index vectors' broadcast length: a mean's divisor over it (the
    #: tutorials' NLL) is host arithmetic before the launches, not a read that splits the
    #: captured step (tensor/rewriting/shape_feature.py)
    shape_from_inputs = True

    def __str__(self) -> str:
        return "GpuAdvancedSubtensor2"

    def make_node(self, x: Any, a: Any, b: Any) -> Apply:
        ctx = getattr(x.type, "context_name", None)
        a, b = as_gpuarray_variable(a, ctx), as_gpuarray_variable(b, ctx)
        _check_vars(self, x, a, b)
        bcast = (a.broadcastable[0] and b.broadcastable[0],)
        return Apply(self, [x, a, b], [x.type.clone(broadcastable=bcast)()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        x, a, b = node.inputs
        return (_pairs_name(0, x.dtype, a.dtype, b.dtype),)

    def perform(self, node, inputs, out, kernel=None):
        x, a, b = inputs
        out[0][0] = gather_pairs(self, node, x, a, b,
                                 self.perform_args(node)[0] if kernel is None else kernel)

    def infer_shape(self, fgraph, node, input_shapes):
        """The pairs broadcast as NumPy's index arrays do (a length 1 gives way)."""
        return [numpy_broadcast([input_shapes[1], input_shapes[2]])]

    def grad(self, inputs, output_grads):
        x, a, b = inputs
        if not is_float(x.dtype):
            return [None, None, None]
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        zeros = gpu_elemwise("second", x, np.asarray(0, dtype=x.dtype))
        return [GpuAdvancedIncSubtensor2(False)(zeros, gz, a, b), None, None]


class GpuAdvancedIncSubtensor2(DeviceChecked, Op):
    """A copy of matrix x with ``x[a, b]`` incremented by (atomically: repeated pairs
    accumulate) or set to y, a scalar or a vector broadcast to the pairs. With repeated pairs
    a set keeps one of the writes, which one is unspecified. Never in place."""

    __props__ = ("set_instead_of_inc",)

    def __init__(self, set_instead_of_inc: bool = False):
        self.set_instead_of_inc = bool(set_instead_of_inc)

    def __str__(self) -> str:
        return f"GpuAdvanced{'Set' if self.set_instead_of_inc else 'Inc'}Subtensor2"

    def make_node(self, x: Any, y: Any, a: Any, b: Any) -> Apply:
        ctx = getattr(x.type, "context_name", None)
        y = as_gpuarray_variable(y, ctx)
        a, b = as_gpuarray_variable(a, ctx), as_gpuarray_variable(b, ctx)
        _check_vars(self, x, a, b)
        if y.dtype != x.dtype or y.ndim > 1:
            raise TypeError(f"{self}: the value must be a {x.dtype} scalar or vector, got {y.type}")
        return Apply(self, [x, y, a, b], [x.type()])

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        x, _, a, b = node.inputs
        return (_pairs_name(1 if self.set_instead_of_inc else 2, x.dtype, a.dtype, b.dtype),)

    def perform(self, node, inputs, out, kernel=None):
        x, y, a, b = inputs
        res = x.copy()
        n = _pair_length(self, a, b, x.shape)
        if y.ndim == 1 and y.shape[0] not in (1, n):
            raise ValueError(f"{self}: a value of shape {y.shape} does not broadcast to the "
                             f"{n} indexed elements of an array of shape {x.shape}")
        if n:
            if y.ndim == 1:
                y, vs = _elem_stride(y)
            else:
                vs = 0
            if kernel is None:
                kernel = self.perform_args(node)[0]
            _launch_pairs(self, node, kernel, res, y, vs, a, b, n, x.shape, x.shape[1], 1)
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


class GpuARange(Op):
    """``arange(start, stop, step)`` of an integer dtype, made on the device from host
    scalars passed as kernel arguments."""

    __props__ = ("dtype", "context_name")
    capturable = True   # a pool allocation and one launch on the stream (graphs.py)
    launches = True
    shape_from_inputs = True   # its length is arithmetic on its host scalars

    def __init__(self, dtype: str, context_name: Any = None):
        if dtype not in INDEX_DTYPES:
            raise TypeError(f"GpuARange makes int32/int64 ranges, not {dtype}")
        self.dtype = dtype
        self.context_name = context_name

    def __str__(self) -> str:
        return f"GpuARange{{dtype={self.dtype}}}"

    def make_node(self, start: Any, stop: Any, step: Any) -> Apply:
        args = [as_tensor_variable(v) for v in (start, stop, step)]
        for name, v in zip(("start", "stop", "step"), args):
            if v.ndim != 0 or not v.dtype.startswith(("int", "uint")):
                raise TypeError(f"{self}: {name} must be an integer scalar on the host, got {v.type}")
        return Apply(self, args, [GpuArrayType(self.dtype, (False,), self.context_name)()])

    def perform(self, node, inputs, out):
        start, stop, step = (int(v) for v in inputs)
        if step == 0:
            raise ValueError("arange: step must not be zero")
        n = len(range(start, stop, step))
        ctx = gpu_context.get_context(self.context_name)
        res = GpuArray((n,), self.dtype, ctx)
        if n:
            ctx.activate()
            fn = get_prepared_kernel(_MODULE_KEY, pairs_source, f"arange_{self.dtype}", "Pqqq",
                                     context=ctx)
            blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))
            fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, res.ptr, start,
                                   step, n)
        out[0][0] = res

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """Its plain kernel's module and the one a captured graph runs."""
        return [(_MODULE_KEY, pairs_source, ()), prefetch_request()]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """``perform``, and the parameter protocol of symgpu/gpu/runtime/graph_params.py: under a
        capture with a slot, start and step are read from the graph's parameter block (the
        length stays in the graph's key), so one graph serves every start."""
        return _ARangeThunk(self, node, storage_map, compute_map)

    def infer_shape(self, fgraph, node, input_shapes):
        """The host ARange's rule (exact integer arithmetic)."""
        return [(arange_length(*node.inputs),)]

    def grad(self, inputs, output_grads):
        return [None, None, None]


class _ARangeThunk(PerformThunk):
    """GpuARange's thunk (see GpuARange.make_thunk)."""

    __slots__ = ("param_slot",)
    capturable = True
    launches = True
    param_nbytes = 16   # start, step as int64

    def __init__(self, op: GpuARange, node: Apply, storage_map: dict, compute_map: dict):
        super().__init__(op, node, storage_map, compute_map)
        self.param_slot: tuple | None = None

    def _args(self) -> tuple[int, int, int]:
        start, stop, step = (int(c[0]) for c in self.inputs)
        if step == 0:
            raise ValueError(f"{self.op}: arange step must not be zero")
        return start, step, len(range(start, stop, step))

    def param_prepare(self) -> None:
        load_kernels(gpu_context.get_context(self.op.context_name), dtype=self.op.dtype)

    def param_values(self) -> tuple[int, bytes]:
        """(the length, start and step)."""
        start, step, n = self._args()
        return n, pack_int64(start, step)

    def __call__(self) -> None:
        slot = self.param_slot
        if slot is None:
            self.perform(self.node, [c[0] for c in self.inputs], self.outputs)
            return
        _, _, n = self._args()
        ctx = gpu_context.get_context(self.op.context_name)
        res = GpuArray((n,), self.op.dtype, ctx)
        arange_from_params(ctx, res.ptr, slot_ptr(slot), n, self.op.dtype)
        self.outputs[0][0] = res


# ----------------------------------------------------------------------------- lifting

def _two_vectors(op: Any, node: Apply, first: int) -> bool:
    """Whether the op indexes a matrix with exactly two int32/int64 vectors."""
    if getattr(op, "idx_list", None) != (SYM, SYM) or len(node.inputs) != first + 2:
        return False
    x = node.inputs[0]
    a, b = node.inputs[first], node.inputs[first + 1]
    return x.ndim == 2 and x.dtype in ADVANCED_DTYPES and all(
        v.ndim == 1 and v.dtype in INDEX_DTYPES for v in (a, b))


@register_lifter(AdvancedSubtensor)
def lift_advanced_subtensor2(op, node, context_name, inputs):
    if type(op) is not AdvancedSubtensor or not _two_vectors(op, node, 1) or \
            not is_gpu_var(inputs[0]):
        return None
    return [GpuAdvancedSubtensor2()(inputs[0], as_gpuarray_variable(inputs[1], context_name),
                                     as_gpuarray_variable(inputs[2], context_name))]


@register_lifter(AdvancedIncSubtensor)
def lift_advanced_incsubtensor2(op, node, context_name, inputs):
    if type(op) is not AdvancedIncSubtensor or not _two_vectors(op, node, 2) or \
            not is_gpu_var(inputs[0]) or node.inputs[1].ndim > 1 or \
            node.inputs[1].dtype != node.inputs[0].dtype:
        return None
    y, a, b = (as_gpuarray_variable(inputs[k], context_name) for k in (1, 2, 3))
    return [GpuAdvancedIncSubtensor2(op.set_instead_of_inc)(inputs[0], y, a, b)]


@node_rewriter([GpuFromHost])
def local_gpu_arange(fgraph, node):
    """GpuFromHost(ARange(start, stop, step)) -> GpuARange(start, stop, step): an integer
    range that only GPU ops read is made on the device, not computed and uploaded; the same
    through a DimShuffle (``arange(n)[:, None]``, a gather's broadcast row or column
    index), which then becomes a GpuDimShuffle view of the device range."""
    src = node.inputs[0]
    shuffle = None
    if src.owner is not None and isinstance(src.owner.op, DimShuffle):
        shuffle, src = src.owner.op, src.owner.inputs[0]
    if src.owner is None or type(src.owner.op) is not ARange or \
            src.owner.op.dtype not in INDEX_DTYPES:
        return None
    start, stop, step = src.owner.inputs
    if not all(v.dtype.startswith(("int", "uint")) for v in (start, stop, step)):
        return None
    new = GpuARange(src.owner.op.dtype, node.op.context_name)(start, stop, step)
    if shuffle is not None:
        new = GpuDimShuffle(new.broadcastable, shuffle.new_order)(new)
    out = node.outputs[0]
    if new.type != out.type:
        new = specify_gpu_broadcastable_as(new, out.type)
    return [new]


# right after the lifting and before gpu_shape_infer (POSITIONS["gpu"] + 1): a length read of
# the range then comes from GpuARange's own rule, not from a host ARange left behind for it
optdb.register("gpu_arange", EquilibriumRewriter([local_gpu_arange], name="gpu_arange"),
               POSITIONS["gpu"] + 0.5, "fast_run", "fast_compile", "gpu")
