"""`ifelse`: a lazy branch. Only the branch the condition picks is computed.

The VM runs straight-line code, so laziness lives in the op: `IfElse` holds each branch's own
computation (the part of the branch's graph that neither the condition nor the other branch
needs) as an inner graph, compiled like a loop body (symgpu/scan/inner.py), and runs only
the chosen one. What the branches share with the condition or with each other is computed
outside, once, as usual.
"""
from __future__ import annotations

from typing import Any, Collection, Sequence

import numpy as np

import symgpu.tensor as T
from symgpu.gradient import grad
from symgpu.graph.basic import Apply, Constant, Variable, ancestors, io_toposort
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.inner import InnerFunction, clone_with, inner_mode_pass
from symgpu.tensor.type import TensorType

__all__ = ["ifelse", "IfElse"]


class IfElse(Op):
    """Inputs: [condition, then-branch inputs..., else-branch inputs...]; outputs: one per
    branch output. `then_fn`/`else_fn` are the branches' inner graphs."""

    def __init__(self, then_inputs: Sequence[Variable], then_outputs: Sequence[Variable],
                 else_inputs: Sequence[Variable], else_outputs: Sequence[Variable],
                 name: str | None = None, mode: Any = None):
        self.name = name
        self.mode = mode
        self.n_then = len(then_inputs)
        self.then_fn = InnerFunction(then_inputs, then_outputs, mode, name="then branch")
        self.else_fn = InnerFunction(else_inputs, else_outputs, mode, name="else branch")

    def __str__(self) -> str:
        return f"if{{{self.name}}}" if self.name else "if"

    def make_node(self, condition: Variable, *branch_inputs: Variable) -> Apply:
        outs = []
        for a, b in zip(self.then_fn.outputs, self.else_fn.outputs):
            bc = tuple(x and y for x, y in zip(a.type.broadcastable, b.type.broadcastable))
            outs.append(TensorType(a.type.dtype, bc)())
        return Apply(self, [condition, *branch_inputs], outs)

    def prepare_node(self, node: Apply, storage_map: dict, compute_map: dict, impl: Any) -> None:
        """Compile both branches when the outer function is linked (once per op)."""
        self.then_fn.compile()
        self.else_fn.compile()

    def free(self) -> None:
        """Release both branches' intermediate storage (Theano's op.free; Function.free)."""
        self.then_fn.free()
        self.else_fn.free()

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        c = inputs[0]
        if bool(np.asarray(c)):
            args = inputs[1:1 + self.n_then]
            results = self.then_fn(*args)
        else:
            args = inputs[1 + self.n_then:]
            results = self.else_fn(*args)
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        for k, r in enumerate(results):
            r = np.asarray(r, dtype=node.outputs[k].dtype)
            if any(r is a or np.may_share_memory(r, a) for a in arrays):
                r = r.copy()  # an output never aliases an input (no view_map declared)
            output_storage[k][0] = r

    def infer_shape(self, fgraph, node: Apply, input_shapes: list) -> list[tuple]:
        ins = node.inputs[1:]
        then_map = dict(zip(self.then_fn.inputs, ins[:self.n_then]))
        else_map = dict(zip(self.else_fn.inputs, ins[self.n_then:]))
        shapes = []
        for a, b in zip(self.then_fn.outputs, self.else_fn.outputs):
            if a.ndim == 0:
                shapes.append(())
                continue
            sa = clone_with([a.shape[d] for d in range(a.ndim)], then_map)
            sb = clone_with([b.shape[d] for d in range(b.ndim)], else_map)
            both = ifelse(node.inputs[0], sa, sb, name="shape")
            shapes.append(tuple(both if isinstance(both, list) else [both]))
        return shapes

    def L_op(self, inputs, outputs, output_grads):
        """Each branch's inputs get that branch's gradient when it is taken, zeros when not."""
        cond = inputs[0]
        ins = inputs[1:]
        result: list[Any] = [None]
        for fn, outer, taken in ((self.then_fn, ins[:self.n_then], True),
                                 (self.else_fn, ins[self.n_then:], False)):
            wanted = [k for k, v in enumerate(outer) if is_float(str(v.type.dtype))]
            g_ph = [g.type() for g in output_grads]
            known = {}
            for o, gp in zip(fn.outputs, g_ph):
                if isinstance(o, Constant) or not is_float(str(o.type.dtype)):
                    continue
                known[o] = known[o] + gp if o in known else gp
            grads = [None] * len(outer)
            if wanted and known:
                gs = grad(None, [fn.inputs[k] for k in wanted], known_grads=known,
                          disconnected_inputs="ignore", return_disconnected="None")
                present = [(k, g) for k, g in zip(wanted, gs) if g is not None]
                if present:
                    mapping = dict(zip(fn.inputs, outer))
                    mapping.update(zip(g_ph, output_grads))
                    outer_gs = clone_with([g for _, g in present], mapping)
                    zeros = [T.zeros_like(outer[k]) for k, _ in present]
                    picked = ifelse(cond, outer_gs, zeros) if taken else ifelse(cond, zeros, outer_gs)
                    picked = picked if isinstance(picked, list) else [picked]
                    for (k, _), g in zip(present, picked):
                        grads[k] = g
            result.extend(grads)
        return result

    def R_op(self, inputs, eval_points):
        raise NotImplementedError(f"{self} has no R_op (Rop uses the double-Lop form instead)")


def _branch(outs: list[Variable], outside: set[Variable]) -> tuple[list[Variable], list[Variable], list[Variable]]:
    """(outer inputs, inner placeholders, inner outputs) of a branch: everything in `outs`'
    graph not in `outside` (what the condition or the other branch needs) moves inside."""
    inner_vars: set[Variable] = set()
    for node in io_toposort(set(), outs):
        if not any(o in outside for o in node.outputs):
            inner_vars.update(node.outputs)
    outer: list[Variable] = []
    seen: set[Variable] = set()

    def add(v: Variable) -> None:
        if v not in inner_vars and v not in seen and not isinstance(v, Constant):
            seen.add(v)
            outer.append(v)

    for node in io_toposort(set(), outs):
        if any(o in inner_vars for o in node.outputs):
            for v in node.inputs:
                add(v)
    for o in outs:
        add(o)
    phs = [v.type(v.name) for v in outer]
    inner_outs = clone_with(outs, dict(zip(outer, phs))) if outer else list(outs)
    return outer, phs, inner_outs


def ifelse(condition: Any, then_branch: Any, else_branch: Any, name: str | None = None,
           *, outer: Collection[Variable] = ()) -> Any:
    """`then_branch` if `condition` (a scalar) is true, else `else_branch`; lazily: only the
    chosen branch is computed. Branches are variables or equally long lists of them, with
    matching dtypes and dimensions; returns a variable or a list accordingly.

    Work a branch needs goes inside it, except what the condition or the other branch needs
    and the variables in `outer`: a rewrite that builds a branch inside a graph passes the
    graph's variables, which are computed anyway (inside, they would be computed twice)."""
    single = not isinstance(then_branch, (list, tuple))
    thens = [then_branch] if single else list(then_branch)
    elses = [else_branch] if not isinstance(else_branch, (list, tuple)) else list(else_branch)
    label = f"ifelse {name!r}" if name else "ifelse"
    if len(thens) != len(elses):
        raise ValueError(f"{label}: the then branch has {len(thens)} output(s) and the else "
                         f"branch {len(elses)}; they must match")
    if not thens:
        raise ValueError(f"{label}: the branches are empty")
    cond = T.as_tensor_variable(condition)
    if cond.ndim != 0:
        raise TypeError(f"{label}: the condition must be a scalar, got {cond.type}")
    thens = [T.as_tensor_variable(v) for v in thens]
    elses = [T.as_tensor_variable(v) for v in elses]
    for k, (a, b) in enumerate(zip(thens, elses)):
        if a.ndim != b.ndim or a.dtype != b.dtype:
            if a.ndim == b.ndim and isinstance(a, Constant) != isinstance(b, Constant):
                # a Python number adopts the other branch's dtype
                if isinstance(a, Constant):
                    thens[k] = a = T.cast(a, b.dtype)
                else:
                    elses[k] = b = T.cast(b, a.dtype)
            if a.ndim != b.ndim or a.dtype != b.dtype:
                raise TypeError(f"{label}: output {k} is {a.type} in the then branch and "
                                f"{b.type} in the else branch; both branches must give the same "
                                "dtype and number of dimensions (cast one of them)")
    need_cond = set(ancestors([cond])) | set(outer)
    then_outer, then_ph, then_inner = _branch(thens, need_cond | set(ancestors(elses)))
    else_outer, else_ph, else_inner = _branch(elses, need_cond | set(ancestors(thens)))
    op = IfElse(then_ph, then_inner, else_ph, else_inner, name=name)
    outs = op(cond, *then_outer, *else_outer)
    outs = outs if isinstance(outs, list) else [outs]
    return outs[0] if single else outs


def _ifelse_with_mode(op: IfElse, mode: str) -> IfElse:
    return IfElse(op.then_fn.inputs, op.then_fn.outputs, op.else_fn.inputs, op.else_fn.outputs,
                  name=op.name, mode=mode)


# branches built without `mode=` compile their inner graphs with the outer mode, as loops do
# (scan/rewriting.py registers the same pass for loops, at the same position)
optdb.register("ifelse_inner_mode_fast_run",
               inner_mode_pass(IfElse, _ifelse_with_mode, "FAST_RUN"), 4.5, "fast_run")
optdb.register("ifelse_inner_mode_fast_compile",
               inner_mode_pass(IfElse, _ifelse_with_mode, "FAST_COMPILE"), 4.5, "fast_compile")


# the masked scan_to_dnn_rnn rewrite (a layer below) chooses between cuDNN and the loop lazily
from symgpu.scan import dnn_rnn_match as _dnn_rnn_match  # noqa: E402

_dnn_rnn_match.set_branch_builder(ifelse)
