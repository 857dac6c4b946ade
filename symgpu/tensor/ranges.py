"""np.arange as an op (ARange) and its front end `arange` (below indexing, whose gradients
number elements with it; `symgpu.tensor.basic` re-exports both)."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import check_dtype, is_float, upcast
from symgpu.tensor.math import as_operands, cast
from symgpu.tensor.shape_rules import arange_length
from symgpu.tensor.type import TensorConstant, TensorType, TensorVariable, as_tensor_variable, constant

__all__ = ["ARange", "arange"]


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


class ARange(Op):
    """np.arange(start, stop, step) of symbolic scalars, in `dtype`."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = check_dtype(dtype)

    def __str__(self) -> str:
        return f"ARange{{dtype='{self.dtype}'}}"

    def make_node(self, start: Any, stop: Any, step: Any) -> Apply:
        args = [as_tensor_variable(a) for a in (start, stop, step)]
        for name, a in zip(("start", "stop", "step"), args):
            if a.ndim != 0 or a.dtype == "bool" or not (is_float(a.dtype) or _is_int(a.dtype)):
                raise TypeError(f"arange: {name} must be a numeric scalar, got {a} ({a.type})")
        bcast = False
        if all(isinstance(a, TensorConstant) for a in args) and args[2].data != 0:
            bcast = len(np.arange(*(a.data for a in args), dtype=self.dtype)) == 1
        return Apply(self, args, [TensorType(self.dtype, (bcast,))()])

    def perform(self, node, inputs, out):
        start, stop, step = inputs
        if step == 0:
            raise ValueError("arange: step must not be zero")
        out[0][0] = np.arange(start, stop, step, dtype=self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [(arange_length(*node.inputs),)]

    def grad(self, inputs, output_grads):
        start, stop, step = inputs
        gz = output_grads[0]
        if not is_float(self.dtype):
            return [None, None, None]
        n = gz.shape[0]
        gstart = gz.sum()
        gstep = (gz * ARange(self.dtype)(constant(0, dtype=self.dtype), cast(n, self.dtype),
                                         constant(1, dtype=self.dtype))).sum()
        return [cast(gstart, start.dtype) if is_float(start.dtype) else None, None,
                cast(gstep, step.dtype) if is_float(step.dtype) else None]


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: str | None = None) -> TensorVariable:
    """np.arange with symbolic or constant bounds; the dtype follows NumPy (Python floats
    take floatX, Python ints adopt the dtype of symbolic arguments)."""
    if stop is None:
        start, stop = 0, start
    args = (start, stop, step)
    if dtype is None:
        if any(isinstance(a, Variable) for a in args):
            dtype = upcast(*[a.dtype for a in as_operands(*args)])
        else:
            dtype = config.floatX if any(np.asarray(a).dtype.kind == "f" for a in args) else "int64"
        if dtype == "bool":
            dtype = "int64"
    dtype = config.floatX if dtype == "floatX" else check_dtype(dtype)
    return ARange(dtype)(*as_operands(*args))
