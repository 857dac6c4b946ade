"""The gradient contract, its special types, and `grad` (reverse mode).

`grad` walks the nodes between `wrt` and the cost once, in reverse topological order, asks each
node's Op for the gradient of its inputs (`Op.L_op`, which defaults to `Op.grad`), and keeps a
list of gradient terms per variable; a variable's total is built only once, as ONE n-ary `add`
of its terms, when its owner node is reached. So building the gradient of an N-node graph is
linear in N and the result has one add per fan-out point, not a chain of pairwise adds.

Gradient contract of Ops (Theano's): `grad(inputs, output_grads)` returns one entry per input.
`None` (or a `DisconnectedType` variable) means "nothing flows to this input" -- for an input the
op's `connection_pattern` says is connected, that is a zero gradient (comparisons, casts to int,
shapes); the machinery then adds nothing rather than building zeros. A `NullType` variable (from
`grad_undefined` / `grad_not_implemented`) means the gradient does not exist or is not written;
it is an error only if it reaches a variable the user asked about.

The helpers without a leading underscore (`as_var_list`, `restore_form`, `is_tensor`,
`has_float_dtype`, `is_disconnected`) serve the other modules of this package.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import symgpu.tensor as T
from symgpu.config import config
from symgpu.graph.basic import Apply, Type, Variable, io_toposort
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.type import TensorType

__all__ = ["grad", "DisconnectedInputError", "NullTypeGradError", "DisconnectedType", "NullType",
           "grad_undefined", "grad_not_implemented"]


# ============================================================================ special types

class DisconnectedType(Type):
    """The type of a "gradient" that does not exist because the variable does not influence
    the cost. Returned by `grad(..., return_disconnected='Disconnected')`; an Op may return one
    from `grad` instead of None."""

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        raise TypeError("a DisconnectedType variable has no value: it stands for a gradient "
                        "that is not connected to the cost")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(DisconnectedType)

    def __str__(self) -> str:
        return "DisconnectedType"

    __repr__ = __str__


class NullType(Type):
    """The type of a gradient that is undefined (or not implemented); `why_null` says why."""

    def __init__(self, why_null: str = "(no explanation given)"):
        self.why_null = why_null

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        raise TypeError(f"a NullType variable has no value: {self.why_null}")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.why_null == other.why_null

    def __hash__(self) -> int:
        return hash((NullType, self.why_null))

    def __str__(self) -> str:
        return "NullType"

    __repr__ = __str__


class DisconnectedInputError(ValueError):
    """grad() was asked about a variable the cost does not depend on."""


class NullTypeGradError(TypeError):
    """The gradient asked for passes through an op whose gradient is undefined."""


def is_disconnected(v: Any) -> bool:
    return v is None or (isinstance(v, Variable) and isinstance(v.type, DisconnectedType))


def _is_null(v: Any) -> bool:
    return isinstance(v, Variable) and isinstance(v.type, NullType)


def grad_undefined(op: Any, x_pos: int, x: Variable, comment: str = "") -> Variable:
    """For Op.grad: the gradient wrt input `x_pos` is mathematically undefined."""
    return NullType(f"the gradient of {op} with respect to its input {x_pos} ({x}) is "
                    f"mathematically undefined. {comment}".strip())()


def grad_not_implemented(op: Any, x_pos: int, x: Variable, comment: str = "") -> Variable:
    """For Op.grad: the gradient wrt input `x_pos` exists but is not implemented."""
    return NullType(f"{op} does not implement the gradient with respect to its input {x_pos} "
                    f"({x}). {comment}".strip())()


# ============================================================================ grad

def as_var_list(x: Any, what: str) -> tuple[list[Variable], str]:
    """A list of variables and how `x` was given ('single', 'list' or 'tuple')."""
    kind = "list" if isinstance(x, list) else "tuple" if isinstance(x, tuple) else "single"
    items = list(x) if kind != "single" else [x]
    for i, v in enumerate(items):
        if not isinstance(v, Variable):
            raise TypeError(f"{what} must be symbolic variables; item {i} is {type(v).__name__} "
                            f"({v!r})")
    return items, kind


def restore_form(items: list, kind: str) -> Any:
    return items[0] if kind == "single" else tuple(items) if kind == "tuple" else items


def is_tensor(v: Variable) -> bool:
    return isinstance(v.type, TensorType)


def has_float_dtype(v: Variable) -> bool:
    return is_float(getattr(v.type, "dtype", ""))


def _fit_to(g: Any, x: Variable, where: str) -> Variable | None:
    """Make gradient term `g` a variable of x's type (dtype cast, broadcast pattern checked),
    or None if it carries nothing (disconnected / integer-valued input)."""
    if is_disconnected(g):
        return None
    if _is_null(g):
        return g
    if not is_tensor(x):
        if not isinstance(g, Variable):
            raise TypeError(f"{where} returned {g!r} for {x} ({x.type}); expected a variable")
        if g.type != x.type:
            conv = x.type.convert_variable(g)
            if conv is None:
                raise TypeError(f"{where} returned a gradient of type {g.type} for {x} of type "
                                f"{x.type}")
            g = conv
        return g
    if not has_float_dtype(x):
        return None  # integer inputs: gradient is zero, nothing to accumulate
    if not isinstance(g, Variable):
        g = T.as_tensor_variable(g)
    if not is_tensor(g):
        conv = getattr(g.type, "as_tensor", None)
        if conv is None:
            raise TypeError(f"{where} returned a gradient of type {g.type} for {x} ({x.type})")
        g = conv(g)
    if g.ndim != x.ndim:
        raise ValueError(f"{where} returned a gradient with {g.ndim} dimension(s) for {x} "
                         f"({x.type}, {x.ndim} dimension(s)); a gradient has its variable's shape")
    if g.dtype != x.dtype:
        g = T.cast(g, x.dtype)
    if g.broadcastable != x.broadcastable:
        g = T.specify_broadcastable_as(g, x.type)
    return g


def _zeros_for(v: Variable) -> Variable:
    """A zero output-gradient for an output that received none (its own dtype if float)."""
    if not is_tensor(v):
        return DisconnectedType()()
    return T.zeros_like(v, dtype=v.dtype if has_float_dtype(v) else config.floatX)


def _zeros_like_var(w: Variable) -> Variable:
    """Zeros of w's type; a non-tensor type (a GPU array) goes through its host form."""
    if is_tensor(w):
        return T.zeros_like(w)
    as_tensor = getattr(w.type, "as_tensor", None)
    if as_tensor is not None:
        back = w.type.convert_variable(T.zeros_like(as_tensor(w)))
        if back is not None:
            return back
    raise TypeError(f"grad: cannot build a zero gradient for {w} of type {w.type}")


def _sum_terms(terms: list[Variable]) -> Variable:
    """The total gradient of a variable: one n-ary add of all its terms."""
    for t in terms:
        if _is_null(t):
            return t
    if len(terms) == 1:
        return terms[0]
    return T.add(*terms)


def _connected_ancestors(order: list[Apply], outputs: Sequence[Variable]) -> set[Variable]:
    """Variables with a true (connection_pattern) path to one of `outputs`."""
    useful = set(outputs)
    for node in reversed(order):
        outs = [j for j, o in enumerate(node.outputs) if o in useful]
        if not outs:
            continue
        pattern = node.op.connection_pattern(node)
        for i, inp in enumerate(node.inputs):
            if inp not in useful and any(pattern[i][j] for j in outs):
                useful.add(inp)
    return useful


def _depends_on(order: list[Apply], sources: Sequence[Variable]) -> set[Variable]:
    """Variables with a true path from one of `sources` (sources included)."""
    dep = set(sources)
    for node in order:
        ins = [i for i, v in enumerate(node.inputs) if v in dep]
        if not ins:
            continue
        pattern = node.op.connection_pattern(node)
        for j, o in enumerate(node.outputs):
            if any(pattern[i][j] for i in ins):
                dep.add(o)
    return dep


def _handle_disconnected(var: Variable, policy: str, index: int) -> None:
    msg = (f"grad: the cost does not depend on wrt[{index}] ({var}, {var.type}): it is not part "
           "of the cost's graph, or every path to the cost is cut (disconnected_grad, "
           "consider_constant). Pass disconnected_inputs='ignore' to get a zero gradient.")
    if policy == "ignore":
        return
    if policy == "warn":
        warnings.warn(msg, stacklevel=3)
    elif policy == "raise":
        raise DisconnectedInputError(msg)
    else:
        raise ValueError(f"disconnected_inputs must be 'raise', 'warn' or 'ignore', got {policy!r}")


def grad(cost: Variable | None, wrt: Any, consider_constant: Sequence[Variable] | None = None,
         disconnected_inputs: str = "raise", known_grads: dict | None = None,
         return_disconnected: str = "zero", add_names: bool = True) -> Any:
    """d cost / d wrt (Theano's `grad`): one gradient per `wrt`, with wrt's type and dtype.

    `cost` is a scalar (or None when `known_grads` seeds the walk); `wrt` a variable or a list/
    tuple of them (the result has the same form). `consider_constant` variables act as
    constants: nothing flows through them to their ancestors. `known_grads` maps variables to
    gradients to inject (this is how `Lop` works). A `wrt` the cost does not depend on is
    reported per `disconnected_inputs` ('raise' | 'warn' | 'ignore') and returned per
    `return_disconnected` ('zero' | 'None' | 'Disconnected'). Integer-valued variables pass no
    gradient; the gradient of an integer `wrt` is zeros.
    """
    wrt_list, kind = as_var_list(wrt, "wrt")
    if return_disconnected not in ("zero", "None", "Disconnected"):
        raise ValueError("return_disconnected must be 'zero', 'None' or 'Disconnected', got "
                         f"{return_disconnected!r}")
    if disconnected_inputs not in ("raise", "warn", "ignore"):
        raise ValueError("disconnected_inputs must be 'raise', 'warn' or 'ignore', got "
                         f"{disconnected_inputs!r}")
    known = dict(known_grads or {})
    if cost is None and not known:
        raise ValueError("grad needs a cost, or known_grads to start from")
    if cost is not None:
        if not isinstance(cost, Variable):
            cost = T.as_tensor_variable(cost)
        if isinstance(cost.type, NullType):
            raise ValueError(f"cannot differentiate a NullType cost: {cost.type.why_null}")
        if getattr(cost.type, "ndim", 0) != 0 and cost not in known:
            raise TypeError(
                f"grad: the cost must be a scalar, but {cost} has type {cost.type} with "
                f"{cost.type.ndim} dimension(s); reduce it first (e.g. cost.sum() or cost.mean()), "
                "or use jacobian/Lop for a non-scalar expression")
    blockers = set()
    for c in consider_constant or ():
        if not isinstance(c, Variable):
            raise TypeError(f"consider_constant must hold symbolic variables, got {c!r}")
        blockers.add(c)

    # seed the walk
    terms: dict[Variable, list[Variable]] = {}
    if cost is not None and cost not in known:
        # d cost/d cost = 1, in the cost's dtype (floatX for an integer cost)
        dtype = cost.type.dtype if is_float(getattr(cost.type, "dtype", "")) else _default_float()
        terms[cost] = [T.ones_like(cost, dtype=dtype)]
    for var, g in known.items():
        if not isinstance(var, Variable):
            raise TypeError(f"known_grads keys must be symbolic variables, got {var!r}")
        fitted = _fit_to(g, var, f"known_grads[{var}]")
        if fitted is not None:
            terms.setdefault(var, []).append(fitted)
    outputs = ([cost] if cost is not None else []) + list(known)

    # the nodes between wrt and the outputs, once, in topological order
    order = io_toposort(blockers, outputs)
    useful = _connected_ancestors(order, outputs)
    live = _depends_on(order, wrt_list)

    totals: dict[Variable, Variable] = {}

    def total(v: Variable) -> Variable | None:
        if v in totals:
            return totals[v]
        ts = terms.pop(v, None)
        t = _sum_terms(ts) if ts else None
        if t is not None and len(ts) > 1 and not _is_null(t) and t.type != v.type:
            t = _fit_to(t, v, f"the gradient sum of {v}")  # e.g. an add of GPU terms
        totals[v] = t
        return t

    for node in reversed(order):
        if not any(o in live for o in node.outputs):
            continue
        out_grads = [total(o) for o in node.outputs]
        if all(g is None for g in out_grads):
            continue
        wanted = [i for i, v in enumerate(node.inputs) if v in live]
        if not wanted:
            continue
        nulls = [g for g in out_grads if _is_null(g)]
        if nulls:
            pattern = node.op.connection_pattern(node)
            for i in wanted:
                if any(pattern[i][j] for j, g in enumerate(out_grads) if _is_null(g)):
                    terms.setdefault(node.inputs[i], []).append(nulls[0])
            continue
        full = [g if g is not None else _zeros_for(o) for g, o in zip(out_grads, node.outputs)]
        try:
            in_grads = node.op.L_op(node.inputs, node.outputs, full)
        except NotImplementedError as exc:
            raise NotImplementedError(f"{exc} (needed to differentiate {node}"
                                      f"{_created_at(node)})") from exc
        if len(in_grads) != len(node.inputs):
            raise ValueError(f"{node.op}.grad returned {len(in_grads)} gradients for "
                             f"{len(node.inputs)} inputs")
        for i in wanted:
            g = _fit_to(in_grads[i], node.inputs[i], f"{node.op}.grad (input {i})")
            if g is not None:
                terms.setdefault(node.inputs[i], []).append(g)

    results = []
    for k, w in enumerate(wrt_list):
        g = total(w)
        if g is not None and _is_null(g):
            raise NullTypeGradError(f"grad: the gradient with respect to wrt[{k}] ({w}) is "
                                    f"undefined: {g.type.why_null}")
        if g is None:
            if w not in useful:
                _handle_disconnected(w, disconnected_inputs, k)
                if return_disconnected == "None":
                    results.append(None)
                    continue
                if return_disconnected == "Disconnected":
                    results.append(DisconnectedType()())
                    continue
            g = _zeros_like_var(w)
        elif is_tensor(w) and g.dtype != w.dtype:
            g = T.cast(g, w.dtype)
        if add_names and cost is not None and cost.name and w.name and g.name is None \
                and g.owner is not None:
            g.name = f"(d{cost.name}/d{w.name})"
        results.append(g)
    return restore_form(results, kind)


def _created_at(node: Apply) -> str:
    trace = getattr(node.tag, "trace", None)
    return f", created at {trace[-1].filename}:{trace[-1].lineno}" if trace else ""


def _default_float() -> str:
    return config.floatX
