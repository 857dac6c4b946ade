"""Sigmoid algebra on products (stabilize): what makes gradients of logistic models finite.

Within one mul/true_div tree, factors are read as powers of sigmoid and exp:

    sigmoid(u)      = sig(u)^1          exp(u)        = exp(u)^1
    1 - sigmoid(u)  = sig(-u)^1         1 + exp(u)    = sig(-u)^-1
    and the identity exp(u) * sig(-u) = sig(u)  (exp(u)^-1 is exp(-u))

Powers of the same sig/exp net out, the identity is applied as often as it can, and the
product is rebuilt with sig(u)^p as p factors sigmoid(u) (p > 0) or 1 + exp(-u) (p < 0). So
`1 / (1 + exp(-t))` becomes sigmoid(t), `exp(-t) / (1 + exp(-t))**2` becomes
sigmoid(-t) * sigmoid(t), and nothing is ever divided by a sigmoid that can underflow to 0.

A factor that is a sum is distributed over (greedily, Theano's local_greedy_distributor)
when that lets at least one term cancel: `(a/(1-s) - b*(1+e)) * s*(1-s)` is two finite
products instead of inf - inf.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Variable
from symgpu.graph.rewriting import node_rewriter, register_stabilize
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.math import (CONST, Factors, build, cancel, finish, float_node,
                                          mul_layout, _Terms)
from symgpu.tensor.rewriting.stabilize import _one_minus, _one_plus
from symgpu.tensor.rewriting.utils import ew, ew_name, is_ew

__all__ = ["local_sigmoid_algebra", "local_logistic_crossentropy"]


def _signed(u: Variable) -> tuple[Variable, int]:
    if ew_name(u) == "neg":
        return u.owner.inputs[0], -1
    return u, 1


def _form(var: Variable, dtype: str) -> tuple[str, Variable, int, int] | None:
    """(kind, base, sign, power): sig(sign*base)^power or exp(sign*base)^power, else None."""
    if var.dtype != dtype:
        return None
    name = ew_name(var)
    if name == "sigmoid":
        b, s = _signed(var.owner.inputs[0])
        return "sig", b, s, 1
    if name == "exp":
        b, s = _signed(var.owner.inputs[0])
        return "exp", b, s, 1
    x = _one_minus(var)
    if x is not None and ew_name(x) == "sigmoid" and x.dtype == dtype:
        b, s = _signed(x.owner.inputs[0])
        return "sig", b, -s, 1
    e = _one_plus(var)
    if e is not None and ew_name(e) == "exp" and e.dtype == dtype:
        b, s = _signed(e.owner.inputs[0])
        return "sig", b, -s, -1
    return None


class _Algebra:
    """Net powers of sig(.) and exp(.) keyed by (kind, base, sign), in first-seen order."""

    def __init__(self) -> None:
        self.pw: dict[tuple, list] = {}

    def add(self, kind: str, base: Variable, sign: int, power: int) -> None:
        if kind == "exp" and power < 0:
            sign, power = -sign, -power
        key = (kind, id(base), sign)
        entry = self.pw.setdefault(key, [base, 0])
        entry[1] += power

    def _get(self, kind, base, sign) -> int:
        e = self.pw.get((kind, id(base), sign))
        return e[1] if e else 0

    def simplify(self) -> None:
        changed = True
        while changed:
            changed = False
            for (kind, _bid, sign), (base, p) in list(self.pw.items()):
                if kind != "exp" or p <= 0:
                    continue
                opp = self._get("exp", base, -sign)
                if opp > 0:  # exp(u) * exp(-u) = 1
                    k = min(p, opp)
                    self.pw[("exp", id(base), sign)][1] -= k
                    self.pw[("exp", id(base), -sign)][1] -= k
                    changed = True
                    continue
                q = self._get("sig", base, -sign)
                if q > 0:  # exp(u) * sig(-u) = sig(u)
                    k = min(p, q)
                    self.pw[("exp", id(base), sign)][1] -= k
                    self.pw[("sig", id(base), -sign)][1] -= k
                    self.add("sig", base, sign, k)
                    changed = True

    def emit(self, dtype: str) -> list[Any]:
        """The factors as recipes (see math.py), so an unchanged product is recognised."""
        out: list[Any] = []
        for (kind, _bid, sign), (base, p) in self.pw.items():
            u = base if sign > 0 else ("neg", base)
            if kind == "exp":
                out += [("exp", u)] * max(p, 0)
            elif p > 0:
                out += [("sigmoid", u)] * p
            elif p < 0:
                mu = ("neg", base) if sign > 0 else base
                out += [("add", (CONST, np.asarray(1, dtype=dtype)[()], dtype), ("exp", mu))] * (-p)
        return out


def _normalise(num: list[Variable], den: list[Variable], dtype: str) -> tuple[list, list]:
    """Factor lists with the sigmoid algebra applied and equal factors cancelled."""
    num, den, _ = cancel(num, den)
    alg = _Algebra()
    other_num, other_den = [], []
    for factors, sgn, other in ((num, 1, other_num), (den, -1, other_den)):
        for v in factors:
            f = _form(v, dtype)
            if f is None:
                other.append(v)
            else:
                kind, b, s, p = f
                alg.add(kind, b, s, p * sgn)
    alg.simplify()
    return other_num + alg.emit(dtype), other_den


def _count(num, den) -> int:
    return len(num) + len(den)


def _sum_terms(var: Variable, dtype: str) -> list[tuple[int, Variable]] | None:
    name = ew_name(var)
    if var.dtype != dtype or name not in ("add", "sub"):
        return None
    a = var.owner.inputs
    if name == "add":
        return [(1, t) for t in a]
    return [(1, a[0]), (-1, a[1])]


def _parse(var: Variable, dtype: str) -> Factors:
    f = Factors(dtype)
    f.add(var, False, root=var.dtype == dtype)
    return f


@register_stabilize
@node_rewriter([Elemwise])
def local_sigmoid_algebra(fgraph, node):
    """Products of sigmoids and exps simplified (see the module docstring); sums inside a
    product distributed when that lets a factor cancel."""
    if not is_ew(node, "mul", "true_div", "reciprocal") or not float_node(node):
        return None
    out = node.outputs[0]
    dtype = out.dtype
    f = _parse(out, dtype)
    const = f.const * f.sign
    forms = [v for v in f.num + f.den if _form(v, dtype) is not None]
    # distribute a sum factor when one of its terms then cancels something
    for k, s in enumerate(f.num):
        terms = _sum_terms(s, dtype)
        if terms is None or len(f.num) + len(f.den) < 2:
            continue
        rest_num = f.num[:k] + f.num[k + 1:]
        products, helped = [], False
        for sign, t in terms:
            tf = _parse(t, dtype)
            n0, d0 = tf.num + rest_num, tf.den + f.den
            n1, d1 = _normalise(n0, d0, dtype)
            helped |= _count(n1, d1) < _count(n0, d0)
            products.append(build(mul_layout(const * sign * tf.const * tf.sign, n1, d1, dtype)))
        if helped:
            new = products[0] if len(products) == 1 else ew("add", *products)
            return [new] if new.type == out.type else None
    if not forms:
        return None
    num, den = _normalise(f.num, f.den, dtype)
    return finish(node, mul_layout(const, num, den, dtype), f.num + f.den)


# ----------------------------------------------------------------------------- crossentropy

def _take(factors: list[Variable], pred) -> tuple[Variable | None, list[Variable]]:
    """The first factor satisfying `pred` and the others."""
    for k, v in enumerate(factors):
        if pred(v):
            return v, factors[:k] + factors[k + 1:]
    return None, factors


def _same(a: list, b: list) -> bool:
    return sorted(map(id, a)) == sorted(map(id, b))


def _fn_of(var: Variable, name: str, negated: bool) -> Variable | None:
    """t if var is name(-t) (negated) or name(t), else None."""
    if ew_name(var) != name:
        return None
    u = var.owner.inputs[0]
    if negated:
        return u.owner.inputs[0] if ew_name(u) == "neg" else None
    return u


def _match_pair(fa: Factors, fb: Factors, name: str, dtype: str):
    """If fa = c * y * name(-t) and fb = c' * (1-y) * name(t) with equal other factors, return
    (c, c', y, t, other num, other den)."""
    for k, v in enumerate(fa.num):
        t = _fn_of(v, name, True)
        if t is None:
            continue
        rest_a = fa.num[:k] + fa.num[k + 1:]
        f, rest_b = _take(fb.num, lambda w: _fn_of(w, name, False) is t)
        if f is None:
            continue
        for j, one_minus_y in enumerate(rest_b):
            y = _one_minus(one_minus_y)
            if y is None or y.dtype != dtype:
                continue
            ya, others_a = _take(rest_a, lambda w: w is y)
            others_b = rest_b[:j] + rest_b[j + 1:]
            if ya is not None and _same(others_a, others_b) and _same(fa.den, fb.den):
                return (fa.const * fa.sign, fb.const * fb.sign, y, t, others_a, fa.den)
    return None


@register_stabilize
@node_rewriter([Elemwise])
def local_logistic_crossentropy(fgraph, node):
    """The stable forms of the logistic crossentropy and of its gradient:
    y*softplus(-t) + (1-y)*softplus(t) -> softplus(t) - y*t   (one softplus, not two)
    (1-y)*sigmoid(t) - y*sigmoid(-t)   -> sigmoid(t) - y      (the classic dL/dt)
    (also with a common factor on both terms, e.g. the 1/n of a mean)."""
    if not is_ew(node, "add", "sub") or not float_node(node):
        return None
    out = node.outputs[0]
    dtype = out.dtype
    t_ = _Terms(dtype)
    t_.add(out, 1, root=True)
    terms = t_.terms
    if len(terms) < 2:
        return None
    facs = [_parse(v, dtype) for _, v in terms]
    for a in range(len(terms)):
        for b in range(len(terms)):
            if a == b:
                continue
            fa, fb = facs[a], facs[b]
            sa, sb = terms[a][0], terms[b][0]
            m = _match_pair(fa, fb, "softplus", dtype)
            if m is not None and sa * m[0] == sb * m[1]:
                c, _, y, t, num, den = m
                core = ew("sub", ew("softplus", t), ew("mul", y, t))
            else:
                # (1-y)*sigmoid(t) - y*sigmoid(-t): fb carries sigmoid(t), fa sigmoid(-t)
                m = _match_pair(fa, fb, "sigmoid", dtype)
                if m is None or sa * m[0] != -sb * m[1]:
                    continue
                c, _, y, t, num, den = m
                core = ew("sub", ew("sigmoid", t), y)
                c = sb * m[1]
                sa = 1
            new_term = build(mul_layout(sa * c, [core] + num, den, dtype))
            rest = [v if s > 0 else ew("neg", v) for k, (s, v) in enumerate(terms) if k not in (a, b)]
            if t_.const:
                rest.append(build((CONST, np.asarray(t_.const, dtype=dtype)[()], dtype)))
            new = new_term if not rest else ew("add", new_term, *rest)
            if new.type != out.type:
                return None
            return [new]
    return None
