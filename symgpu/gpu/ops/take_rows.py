"""GpuTakeRows: ``x[arange(r), b]`` without the arange, and the pass gpu_take_rows.

Why: the tutorials' negative log-likelihood, ``-mean(log(p)[arange(y.shape[0]), y])``, runs a
kernel that writes ``arange(r)`` to memory and a gather that reads it back; the row of pair i
is i itself, so one gather computes it instead (a launch less per training step).

The semantics are those of ``GpuAdvancedSubtensor2(x, arange(0, r, 1), b)``: the r rows and
b's labels broadcast as NumPy's index arrays do (a length 1 gives way), negative labels count
from the end, a label out of range is reported through the node's slot and raised at the next
synchronisation; a row count past x's rows raises at once.

The kernel is advanced_pairs.cu's pairs gather with the row of pair i computed as i, in the
pairs module. The pass is in the default passes (``fast_run``): measured on an H200 (an
MLP's SGD step 222.2 -> 215.5 us, with gpu_careduce_epilogue);
``optimizer_excluding=gpu_take_rows`` turns it off.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops.advanced_pairs import (GpuAdvancedSubtensor2, _check_vars, _MODULE_KEY,
                                           _rows_name, gather_pairs, pairs_source)
from symgpu.gpu.ops.nll_grad import _first_rows
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.runtime.device_checks import DeviceChecked
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.shape_rules import numpy_broadcast
from symgpu.tensor.type import as_tensor_variable

__all__ = ["GpuTakeRows", "gpu_take_rows"]


class GpuTakeRows(DeviceChecked, Op):
    """``x[arange(r), b]`` of a GPU matrix x, a host row count r and an integer vector b: a new
    C-contiguous vector (see the module docstring); advanced_pairs.gather_pairs with its row
    count for the rows."""

    __props__ = ()
    #: its length is the broadcast of r and b's length: host arithmetic (as the gather's)
    shape_from_inputs = True

    def __str__(self) -> str:
        return "GpuTakeRows"

    def make_node(self, x: Any, r: Any, b: Any) -> Apply:
        ctx = getattr(x.type, "context_name", None)
        r, b = as_tensor_variable(r), as_gpuarray_variable(b, ctx)
        _check_vars(self, x, None, b)
        if r.ndim != 0 or not r.dtype.startswith(("int", "uint")):
            raise TypeError(f"{self}: the row count must be an integer scalar, got {r.type}")
        return Apply(self, [x, r, b], [x.type.clone(broadcastable=(False,))()])

    def infer_shape(self, fgraph, node, input_shapes):
        """r rows and b's labels broadcast as NumPy's index arrays do."""
        return [numpy_broadcast([(node.inputs[1],), input_shapes[2]])]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return [(_MODULE_KEY, pairs_source, ())]

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_rows_name(node.inputs[0].dtype, node.inputs[2].dtype),)

    def perform(self, node, inputs, out, kernel=None):
        x, r, b = inputs
        out[0][0] = gather_pairs(self, node, x, int(r), b,
                                 self.perform_args(node)[0] if kernel is None else kernel)


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
optdb.register("gpu_take_rows", gpu_take_rows, 49.45, "fast_run", "gpu")
