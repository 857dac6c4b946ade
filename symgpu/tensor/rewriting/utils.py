"""Helpers the tensor rewrites share: recognising ops and constants, building elemwise nodes."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.type import TensorConstant, TensorType, TensorVariable, constant

__all__ = ["ew", "ew_name", "is_ew", "scalar_constant", "is_constant_value", "make_constant",
           "fill_like", "broadcast_to_type", "single_client", "ELEMWISE"]

#: one Elemwise instance per table row (not in-place)
ELEMWISE: dict[str, Elemwise] = {name: Elemwise(op) for name, op in SCALAR_OPS.items()}


def ew(name: str, *inputs: Variable) -> TensorVariable:
    """`Elemwise(<table row name>)(*inputs)` (inputs of lower ndim are padded by make_node)."""
    return ELEMWISE[name](*inputs)


def ew_name(var: Variable) -> str | None:
    """The table-row name of the (single-output) Elemwise computing `var`, else None."""
    node = var.owner
    if node is None or type(node.op) is not Elemwise or len(node.outputs) != 1:
        return None
    return getattr(node.op.scalar_op, "name", None)


def is_ew(node: Apply, *names: str) -> bool:
    """Whether `node` is a non-inplace Elemwise of one of these table rows."""
    op = node.op
    return (type(op) is Elemwise and not op.inplace_pattern and len(node.outputs) == 1
            and getattr(op.scalar_op, "name", None) in names)


def scalar_constant(var: Variable, max_size: int = 4096) -> Any:
    """The value of `var` if it is known to be one constant number everywhere, else None.

    Sees through DimShuffle (padding), `second` (fill) and casts of constants."""
    while True:
        if isinstance(var, Constant):
            data = getattr(var, "data", None)
            if not isinstance(data, np.ndarray) or data.size == 0 or data.size > max_size:
                return None
            first = data.flat[0]
            if data.size > 1 and not np.all(data == first):
                return None
            return first
        node = var.owner
        if node is None:
            return None
        op = node.op
        if type(op) is DimShuffle:
            var = node.inputs[0]
        elif type(op) is Elemwise and not op.inplace_pattern and len(node.outputs) == 1:
            sop = op.scalar_op
            if getattr(sop, "name", None) == "second":
                var = node.inputs[1]
            elif isinstance(sop, Cast):
                inner = scalar_constant(node.inputs[0], max_size)
                if inner is None:
                    return None
                with np.errstate(all="ignore"):
                    return np.asarray(inner).astype(sop.dtype)[()]
            else:
                return None
        else:
            return None


def is_constant_value(var: Variable, value: float) -> bool:
    """Whether `var` is the constant `value` everywhere (e.g. the 1 of `1 + exp(x)`)."""
    c = scalar_constant(var)
    if c is None:
        return False
    try:
        return bool(c == value)
    except Exception:  # values that do not compare (shapes differ, objects): not equal
        return False


def make_constant(value: Any, dtype: str, ndim: int = 0) -> TensorConstant:
    """A constant of `dtype` with `ndim` broadcastable dimensions."""
    arr = np.asarray(value, dtype=dtype).reshape((1,) * ndim)
    return constant(arr)


def single_client(fgraph, var: Variable) -> bool:
    """Whether exactly one node reads `var` (and it is not a function output)."""
    clients = fgraph.clients.get(var, ())
    return len(clients) == 1 and clients[0][0] != "output"


def fill_like(model: Variable, value: Variable) -> TensorVariable:
    """`value` broadcast to the shape of `model` (Elemwise `second`)."""
    return ew("second", model, value)


def broadcast_to_type(new: Variable, target: TensorType, models: list[Variable]) -> Variable | None:
    """`new` made to have exactly the type `target`: cast to its dtype and, where `new` is
    broadcastable but `target` is not, filled to the shape of one of `models` that has that
    dimension. None if impossible."""
    if not isinstance(new.type, TensorType) or new.ndim > target.ndim:
        return None
    if new.dtype != target.dtype:
        new = ew_cast(new, target.dtype)
    for d in range(target.ndim):
        off = target.ndim - new.ndim
        have = True if d < off else new.broadcastable[d - off]
        if have and not target.broadcastable[d]:
            for m in models:
                moff = target.ndim - m.ndim
                if d >= moff and not m.broadcastable[d - moff]:
                    new = fill_like(m, new)
                    if new.dtype != target.dtype:
                        new = ew_cast(new, target.dtype)
                    break
            else:
                return None
    if new.ndim < target.ndim:
        new = DimShuffle(new.broadcastable, ["x"] * (target.ndim - new.ndim) + list(range(new.ndim)))(new)
    if new.type != target:
        return target.convert_variable(new) if new.broadcastable != target.broadcastable else None
    return new


def ew_cast(var: Variable, dtype: str) -> TensorVariable:
    if var.dtype == dtype:
        return var
    return Elemwise(Cast(dtype))(var)
