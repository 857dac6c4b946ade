"""Algebraic rewrites: the add/mul canonical forms, powers, sums, log1p/expm1.

The two canonicalizers flatten a tree of add/sub/neg (or mul/true_div/reciprocal/neg) of one
float dtype into signed terms (or numerator and denominator factors), cancel equal terms
(`x - x`, `x*y/y`), collect the constants into one, and rebuild a fixed layout:

    add:  add(c, p1, p2...) - add(n1, n2...)        (c > 0 first; c < 0 goes with the n's)
    mul:  c * n1 * n2... / (d1 * d2...)              (sign folded into c, else a neg() around)

A node already in that layout is left alone, which is what makes the rewrites idempotent.
Cancelling factors through whole gradient expressions is what makes the gradients of
log(sigmoid(x)) or log(softmax(x)) finite: g/(1-p) * p*(1-p) becomes g*p.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Variable
from symgpu.graph.rewriting import node_rewriter, register_canonicalize, register_specialize, \
    register_stabilize
from symgpu.scalar.dtypes import dtype_kind, is_float
from symgpu.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from symgpu.tensor.rewriting.utils import (broadcast_to_type, ew, ew_cast, ew_name, fill_like,
                                           is_constant_value, is_ew, make_constant,
                                           scalar_constant)

__all__ = ["local_mul_canonizer", "local_add_canonizer", "local_pow_canonicalize",
           "local_pow_specialize", "local_sum_mul_by_scalar", "local_log1p", "local_expm1",
           "local_log_exp"]

CONST = "const"


# ----------------------------------------------------------------------------- recipes

def matches(var: Variable, recipe: Any) -> bool:
    """Whether the graph at `var` already has exactly this layout."""
    if isinstance(recipe, Variable):
        return var is recipe
    if recipe[0] == CONST:
        c = scalar_constant(var)
        return c is not None and var.dtype == recipe[2] and bool(c == recipe[1])
    name = ew_name(var)
    if name != recipe[0] or len(var.owner.inputs) != len(recipe) - 1:
        return False
    return all(matches(v, r) for v, r in zip(var.owner.inputs, recipe[1:]))


def build(recipe: Any) -> Variable:
    if isinstance(recipe, Variable):
        return recipe
    if recipe[0] == CONST:
        return make_constant(recipe[1], recipe[2])
    return ew(recipe[0], *[build(r) for r in recipe[1:]])


def finish(node, recipe: Any, leaves: list[Variable]) -> list | None:
    """Replace node's output by `recipe` unless it already has that layout."""
    out = node.outputs[0]
    if matches(out, recipe):
        return None
    new = build(recipe)
    if new.type != out.type:
        new = broadcast_to_type(new, out.type, leaves)
        if new is None:
            return None
    return [new]


def float_node(node) -> bool:
    return len(node.outputs) == 1 and is_float(node.outputs[0].dtype) and not node.op.inplace_pattern


# ----------------------------------------------------------------------------- mul

class Factors:
    """The factors of a mul/true_div/reciprocal/neg tree of one dtype."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.num: list[Variable] = []
        self.den: list[Variable] = []
        self.sign = 1
        self.const = 1.0

    def add(self, var: Variable, inverted: bool, root: bool = False) -> None:
        name = ew_name(var) if (root or var.dtype == self.dtype) else None
        if name == "mul":
            for x in var.owner.inputs:
                self.add(x, inverted)
            return
        if name == "true_div":
            a, b = var.owner.inputs
            self.add(a, inverted)
            self.add(b, not inverted)
            return
        if name == "reciprocal":
            self.add(var.owner.inputs[0], not inverted)
            return
        if name == "neg":
            self.sign = -self.sign
            self.add(var.owner.inputs[0], inverted)
            return
        if name in ("sqr", "pow"):
            k = 2 if name == "sqr" else scalar_constant(var.owner.inputs[1])
            base = var.owner.inputs[0]
            if k is not None and k in (2, 3, -1, -2) and base.dtype == self.dtype:
                for _ in range(abs(int(k))):
                    self.add(base, inverted if k > 0 else not inverted)
                return
        c = scalar_constant(var)
        if c is not None and np.ndim(c) == 0 and dtype_kind(np.asarray(c).dtype) in "biuf":
            c = float(c)
            if c < 0:
                self.sign, c = -self.sign, -c
            if not inverted:
                self.const *= c
                return
            if c != 0:
                self.const /= c
                return
        (self.den if inverted else self.num).append(var)


def cancel(num: list[Variable], den: list[Variable]) -> tuple[list, list, list]:
    num, den, removed = list(num), list(den), []
    for d in list(den):
        for k, n in enumerate(num):
            if n is d:
                del num[k]
                den.remove(d)
                removed.append(d)
                break
    return num, den, removed


@register_canonicalize
@register_stabilize
@register_specialize
@node_rewriter([Elemwise])
def local_mul_canonizer(fgraph, node):
    """Flatten mul/true_div/reciprocal/neg, cancel x*y/y, collect constants, drop *1."""
    if not is_ew(node, "mul", "true_div", "reciprocal", "neg") or not float_node(node):
        return None
    out = node.outputs[0]
    f = Factors(out.dtype)
    f.add(out, False, root=True)
    num, den, removed = cancel(f.num, f.den)
    leaves = f.num + f.den
    const = f.const * f.sign
    dtype = out.dtype
    if const == 0:
        zero = broadcast_to_type(make_constant(0, dtype), out.type, leaves)
        return [zero] if zero is not None and not matches(out, (CONST, 0.0, dtype)) else None
    return finish(node, mul_layout(const, num, den, dtype), leaves)


def mul_layout(const: float, num: list, den: list, dtype: str) -> Any:
    """The canonical recipe c * n1 * n2... / (d1 * d2...) (a neg() around when c is -1)."""
    negate = False
    if const < 0 and (const == -1 or not np.isfinite(const)):
        negate, const = True, -const
    factors: list[Any] = [] if const == 1 else [(CONST, np.asarray(const, dtype=dtype)[()], dtype)]
    factors += num
    if den:
        d = den[0] if len(den) == 1 else ("mul", *den)
        if not factors:
            body = ("reciprocal", d)
        else:
            n = factors[0] if len(factors) == 1 else ("mul", *factors)
            body = ("true_div", n, d)
    elif factors:
        body = factors[0] if len(factors) == 1 else ("mul", *factors)
    else:
        body = (CONST, np.asarray(1, dtype=dtype)[()], dtype)
    return ("neg", body) if negate else body


# ----------------------------------------------------------------------------- add

class _Terms:
    def __init__(self, dtype: str):
        self.dtype = dtype
        self.terms: list[tuple[int, Variable]] = []
        self.const = 0.0

    def add(self, var: Variable, sign: int, root: bool = False) -> None:
        name = ew_name(var) if (root or var.dtype == self.dtype) else None
        if name == "add":
            for x in var.owner.inputs:
                self.add(x, sign)
            return
        if name == "sub":
            a, b = var.owner.inputs
            self.add(a, sign)
            self.add(b, -sign)
            return
        if name == "neg" and not root:
            self.add(var.owner.inputs[0], -sign)
            return
        c = scalar_constant(var)
        if c is not None and np.ndim(c) == 0 and dtype_kind(np.asarray(c).dtype) in "biuf":
            self.const += sign * float(c)
            return
        self.terms.append((sign, var))


@register_canonicalize
@register_stabilize
@register_specialize
@node_rewriter([Elemwise])
def local_add_canonizer(fgraph, node):
    """Flatten add/sub/neg, cancel x - x, collect constants, drop +0."""
    if not is_ew(node, "add", "sub") or not float_node(node):
        return None
    out = node.outputs[0]
    t = _Terms(out.dtype)
    t.add(out, 1, root=True)
    pos = [v for s, v in t.terms if s > 0]
    neg = [v for s, v in t.terms if s < 0]
    for v in list(neg):
        if v in pos:  # identity comparison: Variables do not define __eq__
            pos.remove(v)
            neg.remove(v)
    leaves = [v for _, v in t.terms]
    dtype, c = out.dtype, t.const
    # the constant leads both sums: a subtracted sum `a - (c + s)` must have the layout
    # that the inner `c + s` canonicalises to on its own, or the two rewrites undo each other
    if c > 0:
        pos.insert(0, (CONST, np.asarray(c, dtype=dtype)[()], dtype))
    elif c < 0:
        neg.insert(0, (CONST, np.asarray(-c, dtype=dtype)[()], dtype))
    if not pos and not neg:
        zero = broadcast_to_type(make_constant(0, dtype), out.type, leaves)
        return [zero] if zero is not None and not matches(out, (CONST, 0.0, dtype)) else None
    p = None if not pos else pos[0] if len(pos) == 1 else ("add", *pos)
    n = None if not neg else neg[0] if len(neg) == 1 else ("add", *neg)
    recipe = p if n is None else ("neg", n) if p is None else ("sub", p, n)
    return finish(node, recipe, leaves)


# ----------------------------------------------------------------------------- powers

@register_canonicalize
@node_rewriter([Elemwise])
def local_pow_canonicalize(fgraph, node):
    """x**1 -> x, x**0 -> ones."""
    if not is_ew(node, "pow"):
        return None
    x, y = node.inputs
    out = node.outputs[0]
    if is_constant_value(y, 1):
        new = broadcast_to_type(x, out.type, [y])
        return [new] if new is not None else None
    if is_constant_value(y, 0):
        new = broadcast_to_type(fill_like(x, make_constant(1, out.dtype)), out.type, [y])
        return [new] if new is not None else None
    return None


@register_specialize
@node_rewriter([Elemwise])
def local_pow_specialize(fgraph, node):
    """x**2 -> sqr(x), x**0.5 -> sqrt(x), x**-1 -> reciprocal(x), x**-0.5 -> 1/sqrt(x)."""
    if not is_ew(node, "pow"):
        return None
    x, y = node.inputs
    out = node.outputs[0]
    c = scalar_constant(y)
    if c is None:
        return None
    xc = ew_cast(x, out.dtype)
    if c == 2:
        new = ew("sqr", xc)
    elif c == 0.5 and is_float(out.dtype):
        new = ew("sqrt", xc)
    elif c == -1 and is_float(out.dtype):
        new = ew("reciprocal", xc)
    elif c == -0.5 and is_float(out.dtype):
        new = ew("reciprocal", ew("sqrt", xc))
    else:
        return None
    new = broadcast_to_type(new, out.type, [y])
    return [new] if new is not None else None


# ----------------------------------------------------------------------------- sums

@register_specialize
@node_rewriter([CAReduce])
def local_sum_mul_by_scalar(fgraph, node):
    """sum(c * x) -> c * sum(x) for factors c constant along the summed axes; also
    sum(-x) -> -sum(x) and sum(x / c) -> sum(x) / c. One multiply instead of n (when the
    scaled x is read by nothing else)."""
    op = node.op
    if op.scalar_op.name != "add" or op.dtype is not None:
        return None
    (x,) = node.inputs
    out = node.outputs[0]
    if not is_float(x.dtype) or x.owner is None or len(fgraph.clients.get(x, ())) != 1:
        return None  # if the scaled x is needed anyway, scaling the sum saves nothing
    axes = tuple(range(x.ndim)) if op.axis is None else op.axis
    kept = [d for d in range(x.ndim) if d not in axes]
    name = ew_name(x)
    if name == "neg":
        return [ew("neg", op(x.owner.inputs[0]))]
    if name == "true_div":
        a, b = x.owner.inputs
        if b.dtype == x.dtype and all(b.broadcastable[d] for d in axes):
            res = ew("true_div", op(a), DimShuffle(b.broadcastable, kept)(b))
            return [res] if res.type == out.type else None
        return None
    if name != "mul":
        return None
    outer, inner = [], []
    for f in x.owner.inputs:
        if f.dtype == x.dtype and all(f.broadcastable[d] for d in axes):
            outer.append(DimShuffle(f.broadcastable, kept)(f))
        else:
            inner.append(f)
    if not outer or not inner:
        return None
    summed = op(inner[0] if len(inner) == 1 else ew("mul", *inner))
    res = ew("mul", *outer, summed)
    return [res] if res.type == out.type else None


# ----------------------------------------------------------------------------- log / exp

@register_specialize
@node_rewriter([Elemwise])
def local_log1p(fgraph, node):
    """log(1 + x) -> log1p(x), log(1 - x) -> log1p(-x): accurate for small x."""
    if not is_ew(node, "log") or not float_node(node):
        return None
    (z,) = node.inputs
    name = ew_name(z)
    out = node.outputs[0]
    if name == "add":
        args = z.owner.inputs
        ones = [k for k, a in enumerate(args) if is_constant_value(a, 1)]
        if not ones:
            return None
        rest = [a for k, a in enumerate(args) if k != ones[0]]
        inner = rest[0] if len(rest) == 1 else ew("add", *rest)
    elif name == "sub" and is_constant_value(z.owner.inputs[0], 1):
        inner = ew("neg", z.owner.inputs[1])
    else:
        return None
    new = broadcast_to_type(ew("log1p", ew_cast(inner, out.dtype)), out.type, list(z.owner.inputs))
    return [new] if new is not None else None


@register_specialize
@node_rewriter([Elemwise])
def local_expm1(fgraph, node):
    """exp(x) - 1 -> expm1(x): accurate for small x."""
    if not is_ew(node, "sub") or not float_node(node):
        return None
    a, b = node.inputs
    if ew_name(a) != "exp" or not is_constant_value(b, 1):
        return None
    out = node.outputs[0]
    new = broadcast_to_type(ew("expm1", a.owner.inputs[0]), out.type, [b])
    return [new] if new is not None else None


@register_stabilize
@node_rewriter([Elemwise])
def local_log_exp(fgraph, node):
    """log(exp(x)) -> x (exact, and no overflow for large x)."""
    if not is_ew(node, "log") or not float_node(node):
        return None
    (z,) = node.inputs
    if ew_name(z) != "exp":
        return None
    x = z.owner.inputs[0]
    return [x] if x.type == node.outputs[0].type else None
