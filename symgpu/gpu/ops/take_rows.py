"""GpuTakeRows: ``x[arange(r), b]`` without the arange, and the pass gpu_take_rows.

Why: the tutorials' negative log-likelihood, ``-mean(log(p)[arange(y.shape[0]), y])``, runs a
kernel that writes ``arange(r)`` to memory and a gather that reads it back; the row of pair i
is i itself, so one gather computes it instead (a launch less per training step).

The semantics are those of ``GpuAdvancedSubtensor2(x, arange(0, r, 1), b)``: the r rows and
b's labels broadcast as NumPy's index arrays do (a length 1 gives way), negative labels count
from the end, a label out of range is reported through the node's slot and raised at the next
synchronisation; a row count past x's rows raises at once.

The pass is not yet in the default passes (``fast_run``): its kernel has run on the CPU
emulator (tests/emulated_gpu.py), not yet on a GPU. ``optimizer_including=gpu_take_rows``
turns it on.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.ops.advanced import ADVANCED_DTYPES, INDEX_DTYPES
from symgpu.gpu.ops.advanced_pairs import (_BLOCK, _MAX_BLOCKS, _PAIRS_FORMAT, _CU,
                                           GpuAdvancedSubtensor2, _elem_stride)
from symgpu.gpu.ops.nll_grad import _first_rows
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import REPORT_SOURCE, DeviceChecked, launch_checked

__all__ = ["GpuTakeRows", "take_rows_source", "gpu_take_rows"]

_MODULE_KEY = ("symgpu.take_rows",)


def _kernel_name(dtype: str, idx_dtype: str) -> str:
    return f"take_rows_{dtype}_{idx_dtype}"


def take_rows_source() -> str:
    """The CUDA module: a take-rows gather per value and label dtype."""
    parts = [REPORT_SOURCE, _CU[""].substitute()]
    for dtype, t in ADVANCED_DTYPES.items():
        for bdt, bt in INDEX_DTYPES.items():
            parts.append(_CU["take_rows"].substitute(name=_kernel_name(dtype, bdt), t=t, bt=bt))
    return "".join(parts)


class GpuTakeRows(DeviceChecked, Op):
    """``x[arange(r), b]`` of a GPU matrix x, a host row count r and an integer vector b: a new
    C-contiguous vector (see the module docstring)."""

    __props__ = ()
    #: its length is the broadcast of r and b's length: host arithmetic (as the gather's)
    shape_from_inputs = True

    def __str__(self) -> str:
        return "GpuTakeRows"

    def make_node(self, x: Any, r: Any, b: Any) -> Apply:
        from symgpu.tensor.type import as_tensor_variable
        ctx = getattr(x.type, "context_name", None)
        r, b = as_tensor_variable(r), as_gpuarray_variable(b, ctx)
        if not is_gpu_var(x) or x.ndim != 2 or x.dtype not in ADVANCED_DTYPES:
            raise TypeError(f"{self}: x must be a GPU float32/float64/int32/int64 matrix, got "
                            f"{x.type}")
        if r.ndim != 0 or not r.dtype.startswith(("int", "uint")):
            raise TypeError(f"{self}: the row count must be an integer scalar, got {r.type}")
        if b.ndim != 1 or b.dtype not in INDEX_DTYPES:
            raise TypeError(f"{self}: the labels must be an int32/int64 vector, got {b.type}")
        return Apply(self, [x, r, b], [x.type.clone(broadcastable=(False,))()])

    def infer_shape(self, fgraph, node, input_shapes):
        """r rows and b's labels broadcast as NumPy's index arrays do."""
        from symgpu.tensor.shape_rules import numpy_broadcast
        return [numpy_broadcast([(node.inputs[1],), input_shapes[2]])]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return [(_MODULE_KEY, take_rows_source, ())]

    def perform(self, node, inputs, out):
        from symgpu.gpu.runtime.array import GpuArray
        x, r, b = inputs
        r, nb = int(r), b.shape[0]
        shape = x.shape
        if r != nb and 1 not in (r, nb):
            raise ValueError(f"{self}: index arrays of lengths {r} and {nb} cannot be broadcast "
                             f"together (indexing an array of shape {shape})")
        n = 0 if 0 in (r, nb) else max(r, nb)
        if n and r > shape[0]:
            raise IndexError(f"{self}: index {shape[0]} is out of bounds for an array of shape "
                             f"{shape} (axis 0 has length {shape[0]}, axis 1 has length "
                             f"{shape[1]})")
        res = GpuArray((n,), x.dtype, x.context)
        if n:
            isz = x.dtype.itemsize
            if any(s % isz for s in x.strides):
                x = x.copy()
            b, bs = _elem_stride(b)
            ctx = res.context
            ctx.activate()
            fn = get_prepared_kernel(_MODULE_KEY, take_rows_source,
                                     _kernel_name(x.dtype.name, b.dtype.name), _PAIRS_FORMAT,
                                     context=ctx)
            blocks = max(1, min(_MAX_BLOCKS, -(-n // _BLOCK)))

            def describe(bad: int) -> Exception:
                return IndexError(f"{self}: index {bad} is out of bounds for an array of shape "
                                  f"{shape} (axis 0 has length {shape[0]}, axis 1 has length "
                                  f"{shape[1]})")
            launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1),
                           (res.ptr, x.ptr, 0, 0, 0 if r == 1 else 1, b.ptr, bs, n, shape[0],
                            shape[1], x.strides[0] // isz, x.strides[1] // isz), describe)
        out[0][0] = res


def local_take_rows(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuAdvancedSubtensor2(x, arange(0, r, 1), b) -> GpuTakeRows(x, r, b)."""
    if type(node.op) is not GpuAdvancedSubtensor2:
        return None
    x, a, b = node.inputs
    r = _first_rows(a)
    if r is None:
        return None
    new = GpuTakeRows()(x, r, b)
    return [new] if new.type == node.outputs[0].type else None


def gpu_take_rows(fgraph: FunctionGraph) -> int:
    """Apply `local_take_rows` everywhere (one sweep); returns how many."""
    return sweep(fgraph, local_take_rows, "gpu_take_rows")


# after gpu_nll_grad_fusion (49.4), which reads the same arange as a scatter's rows
optdb.register("gpu_take_rows", gpu_take_rows, 49.45, "gpu")
