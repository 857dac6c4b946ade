"""Lop and Rop: the vector-Jacobian and Jacobian-vector products, built on `grad`."""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import symgpu.tensor as T
from symgpu.compile.function import clone_replace
from symgpu.gradient.core import (DisconnectedInputError, DisconnectedType, as_var_list, grad,
                                  has_float_dtype, is_disconnected, is_tensor, restore_form)
from symgpu.graph.basic import Constant, Variable, io_toposort

__all__ = ["Lop", "Rop", "format_as", "subgraph_grad"]


def Lop(f: Any, wrt: Any, eval_points: Any, consider_constant: Sequence[Variable] | None = None,
        disconnected_inputs: str = "raise") -> Any:
    """The vector-Jacobian product v^T (df/dwrt) with v = `eval_points` (one per f): reverse
    mode seeded with v. Same form as `wrt`."""
    f_list, _ = as_var_list(f, "f")
    ev = list(eval_points) if isinstance(eval_points, (list, tuple)) else [eval_points]
    if len(ev) != len(f_list):
        raise ValueError(f"Lop: {len(f_list)} expression(s) but {len(ev)} eval point(s)")
    known = {}
    for fi, vi in zip(f_list, ev):
        if not isinstance(vi, Variable):
            vi = T.as_tensor_variable(vi)
        if getattr(vi.type, "ndim", None) != getattr(fi.type, "ndim", None):
            raise ValueError(f"Lop: eval point {vi} ({vi.type}) does not match {fi} ({fi.type})")
        known[fi] = vi
    return grad(None, wrt, consider_constant=consider_constant,
                disconnected_inputs=disconnected_inputs, known_grads=known)


def Rop(f: Any, wrt: Any, eval_points: Any, disconnected_outputs: str = "raise",
        return_disconnected: str = "zero", use_op_rop: bool = True) -> Any:
    """The Jacobian-vector product (df/dwrt) v with v = `eval_points` (one per wrt). Same form
    as `f`.

    Forward mode through each node's `R_op`; if some op on the way has none, the whole product
    is built instead by the double-Lop trick: with a dummy u of f's type, Lop(f, wrt, u) is
    linear in u, so grad(sum(Lop(f, wrt, u) * v), u) = J v for any differentiable graph. The
    dummy is then replaced by zeros of f's shape (only its shape can remain in the graph)."""
    f_list, f_kind = as_var_list(f, "f")
    wrt_list, _ = as_var_list(wrt, "wrt")
    ev = list(eval_points) if isinstance(eval_points, (list, tuple)) else [eval_points]
    if len(ev) != len(wrt_list):
        raise ValueError(f"Rop: {len(wrt_list)} wrt variable(s) but {len(ev)} eval point(s)")
    seeds = {}
    for w, v in zip(wrt_list, ev):
        if not isinstance(v, Variable):
            v = T.as_tensor_variable(v)
        if is_tensor(w):
            if v.ndim != w.ndim:
                raise ValueError(f"Rop: eval point {v} ({v.type}) does not match {w} ({w.type})")
            if has_float_dtype(w) and v.dtype != w.dtype:
                v = T.cast(v, w.dtype)
        seeds[w] = v
    results = None
    if use_op_rop:
        try:
            results = _rop_forward(f_list, seeds)
        except NotImplementedError:
            results = None
    if results is None:
        results = _rop_by_double_lop(f_list, wrt_list, seeds)
    out = []
    for k, (fi, r) in enumerate(zip(f_list, results)):
        if r is None:
            msg = (f"Rop: output {k} ({fi}) does not depend on any wrt variable")
            if disconnected_outputs == "raise":
                raise DisconnectedInputError(msg)
            if disconnected_outputs == "warn":
                warnings.warn(msg, stacklevel=2)
            if return_disconnected == "None":
                out.append(None)
                continue
            if return_disconnected == "Disconnected":
                out.append(DisconnectedType()())
                continue
            r = T.zeros_like(fi)
        elif is_tensor(fi) and has_float_dtype(fi):
            if r.dtype != fi.dtype:
                r = T.cast(r, fi.dtype)
            if r.broadcastable != fi.broadcastable:
                r = T.specify_broadcastable_as(r, fi.type)
        out.append(r)
    return restore_form(out, f_kind)


def _rop_forward(f_list: list[Variable], seeds: dict[Variable, Variable]) -> list:
    tangent = dict(seeds)
    for node in io_toposort(set(), f_list):
        eps = [tangent.get(v) for v in node.inputs]
        if all(e is None for e in eps):
            continue
        # as Theano and PyTensor: a free float input that is not differentiated gets a zero
        # tangent, so the product still reads it (Rop(dot(x, W), W, V) uses x *and* W, and
        # function([W, V, x], ...) from the tutorial finds W used)
        eps = [_zero_tangent(v) if e is None else e for v, e in zip(node.inputs, eps)]
        outs = node.op.R_op(node.inputs, eps)
        for o, t in zip(node.outputs, outs):
            if o not in seeds and not is_disconnected(t):
                tangent[o] = t
    return [tangent.get(fi) for fi in f_list]


def _zero_tangent(v: Variable) -> Variable | None:
    """zeros_like(v) for a free (ownerless, non-constant) float tensor, else None."""
    if v.owner is None and not isinstance(v, Constant) and is_tensor(v) and has_float_dtype(v):
        return T.zeros_like(v)
    return None


def _rop_by_double_lop(f_list: list[Variable], wrt_list: list[Variable],
                       seeds: dict[Variable, Variable]) -> list:
    dummies = [fi.type() for fi in f_list]
    lops = grad(None, wrt_list, known_grads=dict(zip(f_list, dummies)),
                disconnected_inputs="ignore", return_disconnected="None")
    inner = [(g * seeds[w]).sum() for g, w in zip(lops, wrt_list)
             if g is not None and has_float_dtype(w)]
    if not inner:
        return [None] * len(f_list)
    total = inner[0] if len(inner) == 1 else T.add(*inner)
    rs = grad(total, dummies, disconnected_inputs="ignore", return_disconnected="None")
    fill = {u: T.zeros_like(fi) for u, fi in zip(dummies, f_list)}
    present = [r for r in rs if r is not None]
    replaced = iter(clone_replace(present, fill))
    return [None if r is None else next(replaced) for r in rs]


def format_as(use_list: bool, use_tuple: bool, outputs: Any) -> Any:
    """`outputs` as a list (`use_list`), a tuple (`use_tuple`: a single value becomes a
    one-element sequence) or, with neither flag, the single value (a one-element sequence is
    unpacked). Theano's helper for returning results in the form they were asked in."""
    if use_list and use_tuple:
        raise ValueError("format_as: use_list and use_tuple cannot both be true")
    if use_list or use_tuple:
        seq = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return seq if use_list else tuple(seq)
    if isinstance(outputs, (list, tuple)):
        if len(outputs) != 1:
            raise ValueError(f"format_as: expected one output, got {len(outputs)}")
        return outputs[0]
    return outputs


def subgraph_grad(wrt: list, end: list, start: dict | None = None, cost: Variable | None = None,
                  details: bool = False) -> tuple:
    """Theano's gradient of one block of a chain: the gradients of `cost` (and/or of the
    gradients `start` = {variable: its known gradient}) with respect to `wrt` and to `end`,
    not propagated past `end` (the block's inputs), so that blocks can be chained by handing
    `end`'s gradients to the next block as its `start`. Returns (wrt grads, end grads), and
    with `details` also the parts from `start` and from `cost`."""
    if cost is None and start is None:
        raise ValueError("subgraph_grad: give cost, start or both")
    if not isinstance(end, list) or not isinstance(wrt, list):
        raise TypeError("subgraph_grad: wrt and end must be lists")
    if start is not None and not isinstance(start, dict):
        raise TypeError("subgraph_grad: start must be a dict {variable: gradient}")
    params = list(dict.fromkeys(wrt + end))
    start_grads = cost_grads = None
    if start is not None:
        start_grads = list(grad(None, params, known_grads=start, consider_constant=end,
                                disconnected_inputs="ignore"))
    if cost is not None:
        cost_grads = list(grad(cost, params, consider_constant=end,
                               disconnected_inputs="ignore"))
    if start_grads is None:
        grads = cost_grads
    else:
        grads = start_grads if cost_grads is None else [a + b for a, b in zip(start_grads,
                                                                             cost_grads)]
    by_param = dict(zip(params, grads))
    out = ([by_param[k] for k in wrt], [by_param[k] for k in end])
    return out + (start_grads, cost_grads) if details else out
