"""Reverse-mode differentiation: grad, Lop, Rop, jacobian, hessian and verify_grad.

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
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Type, Variable, io_toposort
from symgpu.graph.op import Op

__all__ = ["grad", "Lop", "Rop", "jacobian", "hessian", "verify_grad", "numeric_grad",
           "GradientError", "DisconnectedInputError", "NullTypeGradError", "DisconnectedType",
           "NullType", "grad_undefined", "grad_not_implemented", "disconnected_grad",
           "zero_grad", "consider_constant", "ZeroGrad", "DisconnectedGrad", "JacobianOp"]


def _T():
    import symgpu.tensor as T
    return T


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


def _is_disconnected(v: Any) -> bool:
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


# ============================================================================ gradient-stopping ops

class _GradStop(Op):
    """Identity forward; subclasses decide what flows backwards. The output is a view of the
    input (`view_map`), so at run time the op costs one pointer copy."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        if not isinstance(x, Variable):
            x = _T().as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


class ZeroGrad(_GradStop):
    """Forward: the input itself. Backward: a zero gradient (the input stays connected)."""

    def grad(self, inputs, output_grads):
        return [_T().zeros_like(inputs[0])]

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else _T().zeros_like(eval_points[0])]


class DisconnectedGrad(_GradStop):
    """Forward: the input itself. Backward: no gradient path at all (the input is
    disconnected, so `grad(..., disconnected_inputs='raise')` raises if it is all there is)."""

    def grad(self, inputs, output_grads):
        return [DisconnectedType()()]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[False]]

    def R_op(self, inputs, eval_points):
        return [None]


_zero_grad = ZeroGrad()
_disconnected_grad = DisconnectedGrad()


def zero_grad(x: Any) -> Variable:
    """`x`, but its gradient is zero: the cost is treated as constant in `x` through here."""
    return _zero_grad(x)


def disconnected_grad(x: Any) -> Variable:
    """`x`, but no gradient flows back through it (as if it were a fresh input)."""
    return _disconnected_grad(x)


consider_constant = zero_grad  # Theano's older name for the same stop


def _register_removal() -> None:
    from symgpu.graph.rewriting import node_rewriter, register_canonicalize

    @register_canonicalize("fast_run", "fast_compile")
    @node_rewriter([ZeroGrad, DisconnectedGrad])
    def local_remove_gradient_stops(fgraph, node):
        """zero_grad/disconnected_grad only speak to grad(): a compiled function drops them
        (so they cost nothing and do not split elementwise fusion)."""
        return [node.inputs[0]]


_register_removal()


# ============================================================================ grad

def _as_var_list(x: Any, what: str) -> tuple[list[Variable], str]:
    """A list of variables and how `x` was given ('single', 'list' or 'tuple')."""
    kind = "list" if isinstance(x, list) else "tuple" if isinstance(x, tuple) else "single"
    items = list(x) if kind != "single" else [x]
    for i, v in enumerate(items):
        if not isinstance(v, Variable):
            raise TypeError(f"{what} must be symbolic variables; item {i} is {type(v).__name__} "
                            f"({v!r})")
    return items, kind


def _restore(items: list, kind: str) -> Any:
    return items[0] if kind == "single" else tuple(items) if kind == "tuple" else items


def _is_tensor(v: Variable) -> bool:
    from symgpu.tensor.type import TensorType
    return isinstance(v.type, TensorType)


def _float_dtype(v: Variable) -> bool:
    from symgpu.scalar.dtypes import is_float
    return is_float(getattr(v.type, "dtype", ""))


def _fit_to(g: Any, x: Variable, where: str) -> Variable | None:
    """Make gradient term `g` a variable of x's type (dtype cast, broadcast pattern checked),
    or None if it carries nothing (disconnected / integer-valued input)."""
    if _is_disconnected(g):
        return None
    if _is_null(g):
        return g
    if not _is_tensor(x):
        if not isinstance(g, Variable):
            raise TypeError(f"{where} returned {g!r} for {x} ({x.type}); expected a variable")
        if g.type != x.type:
            conv = x.type.convert_variable(g)
            if conv is None:
                raise TypeError(f"{where} returned a gradient of type {g.type} for {x} of type "
                                f"{x.type}")
            g = conv
        return g
    if not _float_dtype(x):
        return None  # integer inputs: gradient is zero, nothing to accumulate
    T = _T()
    if not isinstance(g, Variable):
        g = T.as_tensor_variable(g)
    if not _is_tensor(g):
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
    from symgpu.config import config
    if not _is_tensor(v):
        return DisconnectedType()()
    return _T().zeros_like(v, dtype=v.dtype if _float_dtype(v) else config.floatX)


def _zeros_like_var(w: Variable) -> Variable:
    """Zeros of w's type; a non-tensor type (a GPU array) goes through its host form."""
    T = _T()
    if _is_tensor(w):
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
    return _T().add(*terms)


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
    from symgpu.scalar.dtypes import is_float
    T = _T()
    wrt_list, kind = _as_var_list(wrt, "wrt")
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
        elif _is_tensor(w) and g.dtype != w.dtype:
            g = T.cast(g, w.dtype)
        if add_names and cost is not None and cost.name and w.name and g.name is None \
                and g.owner is not None:
            g.name = f"(d{cost.name}/d{w.name})"
        results.append(g)
    return _restore(results, kind)


def _created_at(node: Apply) -> str:
    trace = getattr(node.tag, "trace", None)
    return f", created at {trace[-1].filename}:{trace[-1].lineno}" if trace else ""


def _default_float() -> str:
    from symgpu.config import config
    return config.floatX


# ============================================================================ Lop / Rop

def Lop(f: Any, wrt: Any, eval_points: Any, consider_constant: Sequence[Variable] | None = None,
        disconnected_inputs: str = "raise") -> Any:
    """The vector-Jacobian product v^T (df/dwrt) with v = `eval_points` (one per f): reverse
    mode seeded with v. Same form as `wrt`."""
    f_list, _ = _as_var_list(f, "f")
    ev = list(eval_points) if isinstance(eval_points, (list, tuple)) else [eval_points]
    if len(ev) != len(f_list):
        raise ValueError(f"Lop: {len(f_list)} expression(s) but {len(ev)} eval point(s)")
    T = _T()
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
    f_list, f_kind = _as_var_list(f, "f")
    wrt_list, _ = _as_var_list(wrt, "wrt")
    ev = list(eval_points) if isinstance(eval_points, (list, tuple)) else [eval_points]
    if len(ev) != len(wrt_list):
        raise ValueError(f"Rop: {len(wrt_list)} wrt variable(s) but {len(ev)} eval point(s)")
    T = _T()
    seeds = {}
    for w, v in zip(wrt_list, ev):
        if not isinstance(v, Variable):
            v = T.as_tensor_variable(v)
        if _is_tensor(w):
            if v.ndim != w.ndim:
                raise ValueError(f"Rop: eval point {v} ({v.type}) does not match {w} ({w.type})")
            if _float_dtype(w) and v.dtype != w.dtype:
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
        elif _is_tensor(fi) and _float_dtype(fi):
            if r.dtype != fi.dtype:
                r = T.cast(r, fi.dtype)
            if r.broadcastable != fi.broadcastable:
                r = T.specify_broadcastable_as(r, fi.type)
        out.append(r)
    return _restore(out, f_kind)


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
            if o not in seeds and not _is_disconnected(t):
                tangent[o] = t
    return [tangent.get(fi) for fi in f_list]


def _zero_tangent(v: Variable) -> Variable | None:
    """zeros_like(v) for a free (ownerless, non-constant) float tensor, else None."""
    if v.owner is None and not isinstance(v, Constant) and _is_tensor(v) and _float_dtype(v):
        return _T().zeros_like(v)
    return None


def _rop_by_double_lop(f_list: list[Variable], wrt_list: list[Variable],
                       seeds: dict[Variable, Variable]) -> list:
    from symgpu.compile.function import clone_replace
    T = _T()
    dummies = [fi.type() for fi in f_list]
    lops = grad(None, wrt_list, known_grads=dict(zip(f_list, dummies)),
                disconnected_inputs="ignore", return_disconnected="None")
    inner = [(g * seeds[w]).sum() for g, w in zip(lops, wrt_list)
             if g is not None and _float_dtype(w)]
    if not inner:
        return [None] * len(f_list)
    total = inner[0] if len(inner) == 1 else T.add(*inner)
    rs = grad(total, dummies, disconnected_inputs="ignore", return_disconnected="None")
    fill = {u: T.zeros_like(fi) for u, fi in zip(dummies, f_list)}
    present = [r for r in rs if r is not None]
    replaced = iter(clone_replace(present, fill))
    return [None if r is None else next(replaced) for r in rs]


# ============================================================================ jacobian / hessian

class JacobianOp(Op):
    """The Jacobian of `expression` wrt variables, one row per element of the expression.

    Why an op: a Jacobian needs one vector-Jacobian product per element of the expression,
    and its length is only known at run time (TensorType has no static shapes). The op holds
    the VJP graph g(e) = Lop(expression, wrt, e) with its seed `e` as an inner input; every
    e-independent value that graph needs (the forward pass and the parts of the backward pass
    that do not depend on e) is an ordinary input of the op, computed once by the outer graph.
    At run time the op compiles the e-dependent part once and runs it with e = each one-hot
    seed in turn (a Python loop, Scan's job without Scan). Rows are exact reverse-mode
    gradients, so J agrees with `grad` to rounding.
    """

    def __init__(self, inner_inputs: list[Variable], inner_outputs: list[Variable],
                 expr_ndim: int, mode: Any = None):
        self.inner_inputs = inner_inputs
        self.inner_outputs = inner_outputs
        self.expr_ndim = expr_ndim
        self.mode = mode
        self._fn = None

    def __str__(self) -> str:
        return f"Jacobian{{{len(self.inner_outputs)} wrt}}"

    def make_node(self, expression: Variable, *frontier: Variable) -> Apply:
        from symgpu.tensor.type import TensorType
        outs = [TensorType(g.dtype, expression.broadcastable + g.broadcastable)()
                for g in self.inner_outputs]
        return Apply(self, [expression, *frontier], outs)

    def infer_shape(self, fgraph, node, input_shapes):
        """expression's shape + the shape of each inner gradient, inferred through the inner
        graph with the seed shaped as the expression and the frontier as the op's inputs."""
        from symgpu.compile.function import clone_replace
        from symgpu.tensor.rewriting.shape_feature import infer_graph_shapes
        known = {inner: shp for inner, shp in zip(self.inner_inputs, input_shapes)}
        inner = infer_graph_shapes(self.inner_outputs, known)
        flat = [e for s in inner for e in s]
        if flat:  # a shape that reads an inner input's value reads the outer one's
            flat = clone_replace(flat, dict(zip(self.inner_inputs, node.inputs)))
        out, k = [], 0
        for s in inner:
            out.append(tuple(input_shapes[0]) + tuple(flat[k:k + len(s)]))
            k += len(s)
        return out

    def _compiled(self):
        if self._fn is None:
            from symgpu.compile.function import function
            self._fn = function(self.inner_inputs, self.inner_outputs, mode=self.mode,
                                on_unused_input="ignore", name="jacobian row")
        return self._fn

    def perform(self, node, inputs, out):
        fn = self._compiled()
        expr, frontier = inputs[0], inputs[1:]
        seed = np.zeros(expr.shape, dtype=self.inner_inputs[0].type.dtype)
        n = seed.size
        rows = None
        flat = seed.reshape(-1)
        for i in range(max(n, 1)):
            if n:
                flat[i] = 1
            res = fn(seed, *frontier)
            if n:
                flat[i] = 0
            if rows is None:
                rows = [np.empty((n,) + np.shape(r), dtype=o.dtype)
                        for r, o in zip(res, node.outputs)]
            if n:
                for buf, r in zip(rows, res):
                    buf[i] = r
        for k, buf in enumerate(rows):
            out[k][0] = buf.reshape(expr.shape + buf.shape[1:])

    def grad(self, inputs, output_grads):
        return [grad_not_implemented(self, i, x, "A Jacobian is not differentiable again "
                                     "(jacobian/hessian results are final values).")
                for i, x in enumerate(inputs)]


def jacobian(expression: Variable, wrt: Any, consider_constant: Sequence[Variable] | None = None,
             disconnected_inputs: str = "raise") -> Any:
    """d expression / d wrt for a tensor expression: shape `expression.shape + wrt.shape`
    (for a vector expression, row i is grad(expression[i], wrt), Theano's layout). `wrt` is a
    variable or a list (then a list of Jacobians). A scalar expression gives `grad`.

    Built by `JacobianOp`: one reverse-mode pass per element of the expression, looped at run
    time, so the length need not be known when the graph is built and the forward pass is
    computed once. The result itself cannot be differentiated again.
    """
    from symgpu.compile.function import clone_replace
    T = _T()
    if not isinstance(expression, Variable):
        expression = T.as_tensor_variable(expression)
    wrt_list, kind = _as_var_list(wrt, "wrt")
    if expression.ndim == 0:
        gs = grad(expression, wrt_list, consider_constant=consider_constant,
                  disconnected_inputs=disconnected_inputs)
        return _restore(gs, kind)
    e = expression.type("jacobian_seed")
    gs = grad(None, wrt_list, consider_constant=consider_constant,
              disconnected_inputs=disconnected_inputs, known_grads={expression: e})
    # split the VJP graph into what depends on the seed (inner) and what does not (frontier)
    order = io_toposort(set(), gs)
    dep = _depends_on_any(order, [e])
    frontier: list[Variable] = []
    seen: set[Variable] = set()

    def add(v: Variable) -> None:
        if v not in dep and v not in seen and not isinstance(v, Constant):
            seen.add(v)
            frontier.append(v)

    for node in order:
        if any(o in dep for o in node.outputs):
            for v in node.inputs:
                add(v)
    for g in gs:
        add(g)
    inner_frontier = [v.type(v.name) for v in frontier]
    e_in = e.type("jacobian_seed")
    inner_outs = clone_replace(gs, {e: e_in, **dict(zip(frontier, inner_frontier))})
    op = JacobianOp([e_in] + inner_frontier, inner_outs, expression.ndim)
    outs = op(expression, *frontier)
    outs = outs if isinstance(outs, list) else [outs]
    return _restore(outs, kind)


def _depends_on_any(order: list[Apply], sources: Sequence[Variable]) -> set[Variable]:
    """Variables computed from `sources` by any path (connection patterns ignored)."""
    dep = set(sources)
    for node in order:
        if any(v in dep for v in node.inputs):
            dep.update(node.outputs)
    return dep


def hessian(cost: Variable, wrt: Any, consider_constant: Sequence[Variable] | None = None,
            disconnected_inputs: str = "raise") -> Any:
    """The Hessian of a scalar cost: for each `wrt` w, jacobian(grad(cost, w), w), of shape
    `w.shape + w.shape`. The second differentiation treats a gradient that does not depend on
    w (a cost linear in w) as a zero Hessian rather than an error."""
    wrt_list, kind = _as_var_list(wrt, "wrt")
    out = []
    for w in wrt_list:
        g = grad(cost, w, consider_constant=consider_constant,
                 disconnected_inputs=disconnected_inputs)
        out.append(jacobian(g, w, consider_constant=consider_constant,
                            disconnected_inputs="ignore"))
    return _restore(out, kind)


# verify_grad lives in its own module (one concern: checking gradients numerically); its names
# stay importable from here, where Theano users look for them.
from symgpu.gradient_check import GradientError, numeric_grad, verify_grad  # noqa: E402
import symgpu.tensor as _tensor_package  # noqa: E402

# Theano's T.grad, T.Lop, T.Rop, T.jacobian, T.hessian: the tensor namespace (a layer below
# this one) gets them from here when this module loads (the symgpu package imports it)
for _name in ("grad", "Lop", "Rop", "jacobian", "hessian"):
    setattr(_tensor_package, _name, globals()[_name])
