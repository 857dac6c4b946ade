"""General NumPy advanced indexing on the GPU (Theano's theano.gpuarray.subtensor classes):
GpuAdvancedSubtensor (``x[idx_a, 1:, idx_b]``: integer index arrays broadcast together, with
slices, ints and newaxis mixed in), GpuAdvancedIncSubtensor (``set_subtensor`` /
``inc_subtensor`` of such a region), and their boolean-mask twins GpuAdvancedBooleanSubtensor
and GpuAdvancedBooleanIncSubtensor (``x[mask]``), with lifters from the host ops of
symgpu/tensor/subtensor.py.

Why one kernel for all forms: the common forms have kernels of their own (advanced.py: one
vector on axis 0; advanced_pairs.py: two vectors into a matrix), which their lifters try
first; every other index goes through ``codegen/advanced_general.cu``, which walks the
region ``x[index]`` in C order and finds each element's place in x from a small description
(``AdvMeta``, a kernel parameter) made per call on the host from the run-time shapes, the
slices' bounds and the ints: each region dim is a slice, a newaxis or a dim of the index
arrays' broadcast block, placed as NumPy places it (where the first advanced index stands
when they are adjacent, else in front). Index arrays stay on the device and are read
through their strides (int32 or int64, negative counting from the end); every index is
checked by the kernel and a bad one raises IndexError at the next synchronisation
(device_checks.py), so the integer forms need no sync and capture into CUDA graphs.

Boolean masks: as in Theano, a mask is turned into its ``nonzero()`` index arrays, one per
dim it covers (``check_and_convert_boolean_masks``); the mask is a host input (a mask
computed on the GPU is downloaded by the placement's transfer: the region's size depends on
its values), its index arrays are uploaded, and the gather or scatter is the same kernel.

Set with repeated indices keeps one of the writes, which one is unspecified (NumPy keeps
the last); inc accumulates them (atomicAdd, as ``np.add.at``). Both work on a copy of x.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.gpu.ops.advanced import (ADVANCED_DTYPES, INDEX_DTYPES, _axis0_vector,
                                     _check_indexed_var, check_and_convert_boolean_masks)
from symgpu.gpu.ops.advanced_pairs import _two_vectors
from symgpu.gpu.ops.elemwise import gpu_elemwise
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, host_from_gpu
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.gpu.runtime.array import GpuArray, to_gpu
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import DeviceChecked, REPORT_SOURCE, launch_checked
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.elemwise import _sum_to_broadcast_pattern
from symgpu.tensor.subtensor import (AdvancedIncSubtensor as _AdvancedIncSubtensor,
                                     AdvancedSubtensor as _AdvancedSubtensor, Slice, SYM,
                                     _check_inputs, _entry_str, index_broadcastable,
                                     index_shape)
from symgpu.tensor.type import as_tensor_variable

__all__ = ["GpuAdvancedSubtensor", "GpuAdvancedIncSubtensor", "GpuAdvancedBooleanSubtensor",
           "GpuAdvancedBooleanIncSubtensor", "advanced_general_source", "plan_region",
           "MAX_REGION_DIMS", "MAX_INDEX_ARRAYS"]

#: dims of a region (x[index]) and index arrays one launch describes (AdvMeta's sizes)
MAX_REGION_DIMS = 8
MAX_INDEX_ARRAYS = 8

_BLOCK = 256
_MAX_BLOCKS = 4096
_MODULE_KEY = ("symgpu.advanced_general",)
_FORMAT = "PPq" + "q" * (3 * MAX_REGION_DIMS + 4 * MAX_INDEX_ARRAYS
                         + MAX_INDEX_ARRAYS * MAX_REGION_DIMS + 5) + "P"
_MODES = {0: "gather", 1: "set", 2: "inc"}

_ADV = sections("advanced.cu")
_CU = sections("advanced_general.cu")


def _kernel_name(mode: int, dtype: str) -> str:
    return f"advg_{_MODES[mode]}_{dtype}"


def advanced_general_source() -> str:
    """The CUDA module: the general gather, set and inc for every value dtype."""
    parts = [common_source(), REPORT_SOURCE, _ADV[""].substitute(),
             _CU[""].substitute(dims=MAX_REGION_DIMS, arrays=MAX_INDEX_ARRAYS)]
    for dtype, t in ADVANCED_DTYPES.items():
        parts.append(_CU["gather"].substitute(name=_kernel_name(0, dtype), t=t))
        for mode in (1, 2):
            parts.append(_CU["scatter"].substitute(name=_kernel_name(mode, dtype), t=t,
                                                   mode=mode))
    return "".join(parts)


# ----------------------------------------------------------------------------- the plan

class _Plan:
    """The region x[index] of one call: its shape, x's element strides and offset, the index
    arrays (GpuArrays with the axis length and x stride each indexes, their strides over
    the broadcast block) and where the block sits."""

    __slots__ = ("shape", "xs", "base", "arrays", "block_at", "block_nd")

    def meta(self, ys: Sequence[int] = ()) -> list[int]:
        """AdvMeta's fields, in order (ys: the value's element strides, set/inc)."""
        nd, na = MAX_REGION_DIMS, MAX_INDEX_ARRAYS
        pad = lambda v, n, fill=0: list(v) + [fill] * (n - len(v))  # noqa: E731
        idx, wide, lens, steps, istr = [], [], [], [], []
        for arr, length, step, strides in self.arrays:
            idx.append(arr.ptr)
            wide.append(1 if arr.dtype.itemsize == 8 else 0)
            lens.append(length)
            steps.append(step)
            istr += pad(strides, nd)
        return (pad(self.shape, nd, 1) + pad(self.xs, nd) + pad(ys, nd) + pad(idx, na)
                + pad(wide, na) + pad(lens, na) + pad(steps, na) + pad(istr, na * nd)
                + [len(self.shape), self.block_at, self.block_nd, len(self.arrays), self.base])


def _elements(op: Op, a: Any) -> tuple[Any, tuple[int, ...]]:
    """(a, its strides in elements), a C-contiguous copy where a stride is not whole."""
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides):
        a = a.copy()
    return a, tuple(s // isz for s in a.strides)


def _values(op: Op, idx_list: tuple, values: Sequence[Any]) -> list[tuple]:
    """The index's items with their run-time values: ("new",), ("ell",), ("slice", slice),
    ("int", i) or ("arr", GpuArray)."""
    it = iter(values)
    items: list[tuple] = []
    for e in idx_list:
        if e is None:
            items.append(("new",))
        elif e is Ellipsis:
            items.append(("ell",))
        elif isinstance(e, Slice):
            items.append(("slice", slice(*(int(next(it)) if isinstance(p, str) else p
                                            for p in e))))
        elif isinstance(e, str):
            v = next(it)
            if isinstance(v, GpuArray):
                if v.dtype.name not in INDEX_DTYPES or v.ndim == 0:
                    raise TypeError(f"{op}: index arrays must be int32/int64 arrays of at "
                                    f"least one dimension, got {v.dtype} of shape {v.shape}")
                items.append(("arr", v))
            else:
                items.append(("int", int(v)))
        else:
            items.append(("int", int(e)))
    return items


def plan_region(op: Op, x: Any, idx_list: tuple, values: Sequence[Any]) -> _Plan:
    """The plan of ``x[index]`` (x: a GpuArray read through its strides) for one call: bad
    ints and unbroadcastable index arrays raise IndexError here, bad array entries in the
    kernel."""
    items = _values(op, idx_list, values)
    x, xes = _elements(op, x)
    consumed = sum(k[0] in ("slice", "int", "arr") for k in items)
    if consumed > x.ndim:
        raise IndexError(f"{op}: too many indices for an array of shape {x.shape}")
    if not any(k[0] == "ell" for k in items):
        items.append(("ell",))      # the unindexed trailing dims (it separates nothing after)
    any_arr = any(k[0] == "arr" for k in items)
    dims: list[Any] = []            # (length, x stride) per basic dim, "BLOCK" for the block
    arrays, adv_pos = [], []
    base, d = 0, 0
    for pos, item in enumerate(items):
        kind = item[0]
        if kind == "new":
            dims.append((1, 0))
        elif kind == "ell":
            for _ in range(x.ndim - consumed):
                dims.append((x.shape[d], xes[d]))
                d += 1
        elif kind == "slice":
            start, stop, step = item[1].indices(x.shape[d])
            dims.append((len(range(start, stop, step)), step * xes[d]))
            base += start * xes[d]
            d += 1
        else:
            if kind == "int":
                j = item[1] + x.shape[d] if item[1] < 0 else item[1]
                if not 0 <= j < x.shape[d]:
                    raise IndexError(f"{op}: index {item[1]} is out of bounds for axis {d} "
                                     f"with size {x.shape[d]} (indexing an array of shape "
                                     f"{x.shape})")
                base += j * xes[d]
            else:
                arrays.append((item[1], x.shape[d], xes[d]))
            if any_arr:
                if not adv_pos:
                    dims.append("BLOCK")
                adv_pos.append(pos)
            d += 1
    plan = _Plan()
    plan.base, plan.arrays, plan.block_nd = base, [], 0
    if not any_arr:
        plan.shape = tuple(n for n, _ in dims)
        plan.xs = tuple(s for _, s in dims)
        plan.block_at = 0
        return plan
    try:
        block = np.broadcast_shapes(*(a.shape for a, _, _ in arrays))
    except ValueError:
        raise IndexError(f"{op}: shape mismatch: indexing arrays could not be broadcast "
                         f"together with shapes {' '.join(str(a.shape) for a, _, _ in arrays)} "
                         f"(indexing an array of shape {x.shape})") from None
    at = dims.index("BLOCK")
    del dims[at]
    if adv_pos[-1] - adv_pos[0] + 1 != len(adv_pos):
        at = 0                      # separated advanced indices: the block goes in front
    nb = len(block)
    for a, length, step in arrays:
        a, aes = _elements(op, a)
        strides = [0 if b < nb - a.ndim or a.shape[b - nb + a.ndim] == 1
                   else aes[b - nb + a.ndim] for b in range(nb)]
        plan.arrays.append((a, length, step, strides))
    plan.shape = tuple(n for n, _ in dims[:at]) + tuple(block) + tuple(n for n, _ in dims[at:])
    plan.xs = tuple(s for _, s in dims[:at]) + (0,) * nb + tuple(s for _, s in dims[at:])
    plan.block_at, plan.block_nd = at, nb
    return plan


def _launch(op: Op, node: Apply, mode: int, dst: Any, src: Any, plan: _Plan, x_shape: tuple,
            ys: Sequence[int] = ()) -> None:
    n = int(np.prod(plan.shape, dtype=np.int64))
    if n == 0:
        return
    if len(plan.shape) > MAX_REGION_DIMS or len(plan.arrays) > MAX_INDEX_ARRAYS:
        raise ValueError(f"{op}: a region of {len(plan.shape)} dims with "
                         f"{len(plan.arrays)} index arrays; the kernel takes at most "
                         f"{MAX_REGION_DIMS} dims and {MAX_INDEX_ARRAYS} arrays")
    ctx = dst.context
    ctx.activate()
    fn = get_prepared_kernel(_MODULE_KEY, advanced_general_source,
                             _kernel_name(mode, dst.dtype.name), _FORMAT, context=ctx)
    blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))

    def describe(bad: int) -> Exception:
        return IndexError(f"{op}: index {bad} is out of bounds (indexing an array of shape "
                          f"{x_shape})")
    ptrs = (src.ptr, dst.ptr) if mode == 0 else (dst.ptr, src.ptr)
    launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1),
                   (*ptrs, n, *plan.meta(ys)), describe)


# ----------------------------------------------------------------------------- the ops

def _region_limits(op: Op, bcast: tuple, n_arrays: int) -> None:
    if len(bcast) > MAX_REGION_DIMS or n_arrays > MAX_INDEX_ARRAYS:
        raise TypeError(f"{op}: the region has {len(bcast)} dims and {n_arrays} index "
                        f"arrays; at most {MAX_REGION_DIMS} and {MAX_INDEX_ARRAYS} (the "
                        "host op serves larger ones)")


def _index_inputs(op: Op, idx_list: tuple, index: Sequence[Any], ctx: Any,
                  masks: bool) -> list[Any]:
    """Integer arrays as GPU variables; scalars (slice bounds, ints) and boolean masks as
    host tensors."""
    out = []
    for v in index:
        if is_gpu_var(v) and (v.ndim == 0 or v.dtype == "bool"):
            v = host_from_gpu(v)
        v = v if is_gpu_var(v) else as_tensor_variable(v)
        if v.ndim and v.dtype != "bool":
            v = as_gpuarray_variable(v, ctx)
            if v.dtype not in INDEX_DTYPES:
                raise TypeError(f"{op}: index arrays must be int32/int64, got {v.type}")
        elif v.dtype == "bool" and not masks:
            raise TypeError(f"{op}: a boolean mask index ({v.type}) needs the op's boolean "
                            "twin (GpuAdvancedBooleanSubtensor / GpuAdvancedBooleanIncSubtensor)")
        out.append(v)
    _check_inputs(op, idx_list, out, True)
    return out


def _host_masks(op: Op, x: Any, idx_list: tuple, values: Sequence[Any]) -> tuple[tuple, list]:
    """(idx_list, values) with each boolean mask replaced by its nonzero() index arrays,
    uploaded to x's context, after Theano's check of the mask's shape against the dims of
    x it covers (check_and_convert_boolean_masks)."""
    if not any(isinstance(v, np.ndarray) and v.dtype == np.bool_ for v in values):
        return idx_list, list(values)
    it = iter(values)
    items = []                  # (entry, its values)
    for e in idx_list:
        if isinstance(e, Slice):
            items.append((e, [next(it) for p in e if isinstance(p, str)]))
        elif isinstance(e, str):
            items.append((e, [next(it)]))
        else:
            items.append((e, []))

    def width(e: Any, vals: list) -> int:
        if e is None or e is Ellipsis:
            return 0
        if isinstance(e, str) and vals[0].dtype == np.bool_:
            return vals[0].ndim
        return 1
    consumed = sum(width(e, vals) for e, vals in items)
    if consumed > x.ndim:
        raise IndexError(f"{op}: too many indices for an array of shape {x.shape}")
    entries: list = []
    new_values: list = []
    dim = 0
    for e, vals in items:
        if e is Ellipsis:
            dim += x.ndim - consumed
        if isinstance(e, str) and vals[0].dtype == np.bool_:
            mask = vals[0]
            # the dims before it as ints, so that Theano's check names x's own dims
            for arr in check_and_convert_boolean_masks(x, [0] * dim + [mask])[dim:]:
                entries.append(SYM)
                new_values.append(to_gpu(np.ascontiguousarray(arr, dtype=np.int64),
                                         x.context))
        else:
            entries.append(e)
            new_values.extend(vals)
        dim += width(e, vals)
    return tuple(entries), new_values


class GpuAdvancedSubtensor(DeviceChecked, Op):
    """``x[index]`` of a GPU array with integer index arrays (broadcast together; int32 or
    int64, negative counting from the end) mixed with slices, ints, newaxis and Ellipsis, as
    NumPy: a new C-contiguous array. Theano's theano.gpuarray.subtensor.GpuAdvancedSubtensor;
    ``idx_list`` is the host AdvancedSubtensor's."""

    __props__ = ("idx_list",)
    _masks = False

    def __init__(self, idx_list: Sequence):
        self.idx_list = tuple(idx_list)

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{', '.join(_entry_str(e) for e in self.idx_list)}}}"

    def make_node(self, x: Any, *index: Any) -> Apply:
        _check_indexed_var(self, x)
        index = _index_inputs(self, self.idx_list, index, x.type.context_name, self._masks)
        bcast = index_broadcastable(x.broadcastable, self.idx_list, index)
        _region_limits(self, bcast, sum(v.ndim > 0 for v in index))
        return Apply(self, [x, *index], [x.type.clone(broadcastable=bcast)()])

    def infer_shape(self, fgraph, node, input_shapes):
        """NumPy's indexing shape: the host AdvancedSubtensor's rule."""
        return [index_shape(self.idx_list, input_shapes[0], node.inputs[1:], input_shapes[1:])]

    def perform(self, node, inputs, out):
        x, values = inputs[0], inputs[1:]
        idx_list = self.idx_list
        if self._masks:
            idx_list, values = _host_masks(self, x, idx_list, values)
        plan = plan_region(self, x, idx_list, values)
        res = GpuArray(plan.shape, x.dtype, x.context)
        _launch(self, node, 0, res, x, plan, x.shape)
        out[0][0] = res

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The module, compiled at link time with the function's other kernels."""
        return [(_MODULE_KEY, advanced_general_source, ())]

    def grad(self, inputs, output_grads):
        x, rest = inputs[0], inputs[1:]
        if not is_float(x.dtype):
            return [None] * len(inputs)
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        zeros = gpu_elemwise("second", x, np.asarray(0, dtype=x.dtype))
        inc = GpuAdvancedBooleanIncSubtensor if self._masks else GpuAdvancedIncSubtensor
        return [inc(self.idx_list)(zeros, gz, *rest)] + [None] * len(rest)


class GpuAdvancedBooleanSubtensor(GpuAdvancedSubtensor):
    """``x[mask]`` (and masks mixed with the other index kinds) of a GPU array: each mask,
    a host input, becomes its nonzero() index arrays (Theano's
    GpuAdvancedBooleanSubtensor); the gather is GpuAdvancedSubtensor's kernel."""

    _masks = True


class GpuAdvancedIncSubtensor(DeviceChecked, Op):
    """A copy of GPU array x with ``x[index]`` (GpuAdvancedSubtensor's index kinds) set to
    or incremented by ``y`` broadcast to the region; inc accumulates repeated indices
    (atomicAdd, as ``np.add.at``), set keeps one of the repeated writes (which one is
    unspecified). Theano's GpuAdvancedIncSubtensor; never in place."""

    __props__ = ("idx_list", "set_instead_of_inc")
    _masks = False

    def __init__(self, idx_list: Sequence, set_instead_of_inc: bool = False):
        self.idx_list = tuple(idx_list)
        self.set_instead_of_inc = bool(set_instead_of_inc)

    def __str__(self) -> str:
        kind = "Set" if self.set_instead_of_inc else "Inc"
        name = type(self).__name__.replace("Inc", kind, 1)
        return f"{name}{{{', '.join(_entry_str(e) for e in self.idx_list)}}}"

    def make_node(self, x: Any, y: Any, *index: Any) -> Apply:
        _check_indexed_var(self, x)
        ctx = x.type.context_name
        y = as_gpuarray_variable(y, ctx)
        index = _index_inputs(self, self.idx_list, index, ctx, self._masks)
        region = index_broadcastable(x.broadcastable, self.idx_list, index)
        _region_limits(self, region, sum(v.ndim > 0 for v in index))
        if y.dtype != x.dtype:
            raise TypeError(f"{self}: the value {y} has dtype {y.dtype} but {x} has {x.dtype}")
        if y.ndim > len(region):
            raise ValueError(f"{self}: the value {y} has {y.ndim} dimensions, more than the "
                             f"{len(region)} of the indexed region")
        return Apply(self, [x, y, *index], [x.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        """x's shape: only a region of it changes."""
        return [input_shapes[0]]

    def perform(self, node, inputs, out):
        x, y, values = inputs[0], inputs[1], inputs[2:]
        idx_list = self.idx_list
        if self._masks:
            idx_list, values = _host_masks(self, x, idx_list, values)
        res = x.copy()      # C-contiguous: the plan reads res's strides
        plan = plan_region(self, res, idx_list, values)
        src = y._broadcast_to(plan.shape, str(self))
        src, ys = _elements(self, src)
        ys = tuple(0 if n == 1 else s for n, s in zip(plan.shape, ys))
        mode = 1 if self.set_instead_of_inc else 2
        _launch(self, node, mode, res, src, plan, x.shape, ys)
        out[0][0] = res

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The module, compiled at link time with the function's other kernels."""
        return [(_MODULE_KEY, advanced_general_source, ())]

    def grad(self, inputs, output_grads):
        x, y, rest = inputs[0], inputs[1], inputs[2:]
        if not is_float(x.dtype):
            return [None] * len(inputs)
        gz = as_gpuarray_variable(output_grads[0], x.type.context_name)
        reader = GpuAdvancedBooleanSubtensor if self._masks else GpuAdvancedSubtensor
        if self.set_instead_of_inc:
            gx = type(self)(self.idx_list, True)(gz, np.asarray(0, dtype=x.dtype), *rest)
        else:
            gx = gz
        gy = _sum_to_broadcast_pattern(reader(self.idx_list)(gz, *rest), y)
        return [gx, gy] + [None] * len(rest)


class GpuAdvancedBooleanIncSubtensor(GpuAdvancedIncSubtensor):
    """GpuAdvancedIncSubtensor whose index holds boolean masks (host inputs, turned into
    their nonzero() index arrays per call): Theano's GpuAdvancedBooleanIncSubtensor."""

    _masks = True


# ----------------------------------------------------------------------------- lifters

def _liftable(op: Any, node: Apply, x: Any, first: int) -> bool:
    """Whether the general ops take this node: not a form the specialised lifters take
    (tried after this one), a value dtype the kernels have, integer index arrays of
    int32/int64, and a region within the kernel's limits."""
    if _axis0_vector(op, node, first) or _two_vectors(op, node, first):
        return False
    if not is_gpu_var(x) or x.dtype not in ADVANCED_DTYPES:
        return False
    index = node.inputs[first:]
    if any(v.ndim and v.dtype != "bool" and v.dtype not in INDEX_DTYPES for v in index):
        return False
    region = index_broadcastable(node.inputs[0].broadcastable, op.idx_list, index)
    return len(region) <= MAX_REGION_DIMS and sum(v.ndim > 0 for v in index) <= MAX_INDEX_ARRAYS


def _lifted_index(inputs: Any, node: Apply, first: int) -> list[Any]:
    out = []
    for i in range(first, len(node.inputs)):
        v = node.inputs[i]
        out.append(inputs[i] if v.ndim and v.dtype != "bool" else inputs.host(i))
    return out


@register_lifter(_AdvancedSubtensor)
def lift_advanced_subtensor(op, node, context_name, inputs):
    """AdvancedSubtensor -> GpuAdvancedSubtensor, or GpuAdvancedBooleanSubtensor when the
    index has a mask."""
    if type(op) is not _AdvancedSubtensor or not _liftable(op, node, inputs[0], 1):
        return None
    index = _lifted_index(inputs, node, 1)
    cls = GpuAdvancedBooleanSubtensor if any(v.dtype == "bool" for v in node.inputs[1:]) \
        else GpuAdvancedSubtensor
    return [cls(op.idx_list)(inputs[0], *index)]


@register_lifter(_AdvancedIncSubtensor)
def lift_advanced_incsubtensor(op, node, context_name, inputs):
    """AdvancedIncSubtensor -> GpuAdvancedIncSubtensor (or its boolean twin)."""
    if type(op) is not _AdvancedIncSubtensor or not _liftable(op, node, inputs[0], 2) or \
            node.inputs[1].dtype != node.inputs[0].dtype:
        return None
    index = _lifted_index(inputs, node, 2)
    y = as_gpuarray_variable(inputs[1], context_name)
    cls = GpuAdvancedBooleanIncSubtensor if any(v.dtype == "bool" for v in node.inputs[2:]) \
        else GpuAdvancedIncSubtensor
    # never in place: the placement pass shares uploads among readers
    return [cls(op.idx_list, op.set_instead_of_inc)(inputs[0], y, *index)]
