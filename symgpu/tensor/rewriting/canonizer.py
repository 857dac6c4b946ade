"""Theano's `Canonizer` (theano.tensor.opt): a node rewrite that puts a tree of one
commutative, associative operation, its inverse and its reciprocal into the form
``inverse(main(*num), main(*denum))``, cancelling a variable that is in both lists and
folding the scalar constants into one.

symgpu's own canonical forms for add/sub/neg and mul/true_div/reciprocal are
local_add_canonizer / local_mul_canonizer (math.py), with extra knowledge (powers, signs);
this class is Theano's general tool, for code that builds its own canonicalizer over any such
triple, e.g. ``Canonizer(T.mul, T.true_div, T.inv, lambda n, d: prod(n) / prod(d))``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import NodeRewriter
from symgpu.tensor.rewriting.utils import broadcast_to_type, make_constant, scalar_constant
from symgpu.tensor.type import TensorType

__all__ = ["Canonizer"]


def _op_of(fn: Callable, arity: int) -> Any:
    """The Elemwise op that `fn` (T.add, T.neg, ... or an op) applies."""
    dummies = [TensorType("float64", ())() for _ in range(arity)]
    out = fn(*dummies)
    if getattr(out, "owner", None) is None:
        raise TypeError(f"Canonizer: {fn!r} does not build an op node")
    return out.owner.op


class Canonizer(NodeRewriter):
    """``Canonizer(main, inverse, reciprocal, calculate, use_reciprocal=True)``: `main` is
    commutative and associative (add, mul), ``inverse(main(x, y), y) == x`` (sub, true_div),
    ``main(x, reciprocal(y)) == inverse(x, y)`` (neg, inv); ``calculate(num, denum)`` computes
    ``inverse(main(*num), main(*denum))`` on NumPy values (``calculate([], [])`` is main's
    identity). Rewrites the root of each such tree (x/x -> 1, (x*y)/x -> y, x/y/z -> x/(y*z),
    (2*x)/(4*y) -> (0.5*x)/y); with ``use_reciprocal=False`` a tree with only a denominator
    keeps an explicit identity numerator (``1/x`` rather than ``inv(x)``)."""

    def __init__(self, main: Callable, inverse: Callable, reciprocal: Callable,
                 calculate: Callable, use_reciprocal: bool = True):
        self.main, self.inverse, self.reciprocal = main, inverse, reciprocal
        self.calculate = calculate
        self.use_reciprocal = use_reciprocal
        self.external_simplifiers: list[tuple[str, Callable]] = []
        self._main_op = _op_of(main, 2)
        self._inverse_op = _op_of(inverse, 2)
        self._reciprocal_op = _op_of(reciprocal, 1)
        name = f"Canonizer({self._main_op}, {self._inverse_op}, {self._reciprocal_op})"
        super().__init__(self._rewrite, self.tracks(), name=name)

    def add_simplifier(self, simplifier: Callable, reason: str) -> None:
        """Run ``simplifier(num, denum, out_type) -> (num, denum)`` after the built-in ones."""
        self.external_simplifiers.append((reason, simplifier))

    def tracks(self) -> list:
        return [self._main_op, self._inverse_op, self._reciprocal_op]

    def _role(self, var: Variable) -> str | None:
        node = var.owner
        if node is None or len(node.outputs) != 1:
            return None
        if node.op == self._main_op:
            return "main"
        if node.op == self._inverse_op and len(node.inputs) == 2:
            return "inverse"
        if node.op == self._reciprocal_op and len(node.inputs) == 1:
            return "reciprocal"
        return None

    def get_num_denum(self, input: Variable) -> tuple[list, list]:
        """(num, denum) with ``input == inverse(main(*num), main(*denum))``, flattening the
        tree of main/inverse/reciprocal nodes of input's dtype."""
        role = self._role(input)
        if role is None or any(getattr(i, "dtype", None) != input.dtype
                               for i in input.owner.inputs):
            return [input], []
        parts = [self.get_num_denum(i) for i in input.owner.inputs]
        if role == "main":
            return [v for n, _ in parts for v in n], [v for _, d in parts for v in d]
        if role == "inverse":
            (n0, d0), (n1, d1) = parts
            return n0 + d1, d0 + n1
        n0, d0 = parts[0]
        return d0, n0

    def merge_num_denum(self, num: Sequence[Variable], denum: Sequence[Variable]) -> Variable:
        """``inverse(main(*num), main(*denum))``, written as simply as possible."""
        num, denum = list(num), list(denum)
        if not num and not denum:
            return make_constant(self.calculate([], []), "float64")
        if not num:
            if self.use_reciprocal:
                return self.reciprocal(self.merge_num_denum(denum, []))
            ident = self.calculate([], [])
            num = [make_constant(ident, denum[0].dtype)]
        if not denum:
            return num[0] if len(num) == 1 else self.main(*num)
        return self.inverse(self.merge_num_denum(num, []), self.merge_num_denum(denum, []))

    @staticmethod
    def get_constant(v: Variable) -> Any:
        """v's value when it is one constant number, else None."""
        c = scalar_constant(v)
        return None if c is None or np.ndim(c) else c

    def simplify_factors(self, num: Sequence[Variable], denum: Sequence[Variable]) -> tuple:
        """Cancel each variable found in both lists (once per occurrence)."""
        num, denum = list(num), list(denum)
        for v in list(denum):
            for k, n in enumerate(num):
                if n is v:
                    del num[k]
                    denum.remove(v)
                    break
        return num, denum

    def simplify_constants(self, orig_num: Sequence[Variable], orig_denum: Sequence[Variable],
                           out_type: Any = None) -> tuple[list, list]:
        """The constants of both lists folded into one leading numerator constant (none when
        it is main's identity)."""
        num = [v for v in orig_num if self.get_constant(v) is None]
        denum = [v for v in orig_denum if self.get_constant(v) is None]
        numct = [self.get_constant(v) for v in orig_num if self.get_constant(v) is not None]
        denumct = [self.get_constant(v) for v in orig_denum if self.get_constant(v) is not None]
        if not numct and not denumct:
            return num, denum
        dtype = getattr(out_type, "dtype", None) or "float64"
        value = np.asarray(self.calculate(numct, denumct), dtype=dtype)
        if value == np.asarray(self.calculate([], []), dtype=dtype):
            return num, denum
        return [make_constant(value, dtype), *num], denum

    def simplify(self, num: Sequence[Variable], denum: Sequence[Variable],
                 out_type: Any) -> tuple[list, list]:
        num, denum = self.simplify_factors(num, denum)
        num, denum = self.simplify_constants(num, denum, out_type)
        for _, simplifier in self.external_simplifiers:
            num, denum = simplifier(num, denum, out_type)
        return num, denum

    def _layout(self, var: Variable) -> Any:
        """The shape of the tracked tree at `var` (leaves by identity, constants by value)."""
        role = self._role(var)
        if role is None:
            c = self.get_constant(var) if isinstance(var, Constant) else None
            return ("const", float(c)) if c is not None else id(var)
        return (role, tuple(self._layout(i) for i in var.owner.inputs))

    def _rewrite(self, fgraph: FunctionGraph, node: Apply) -> list | None:
        out = node.outputs[0]
        if self._role(out) is None or not isinstance(out.type, TensorType):
            return None
        # only the root of a tree: a node read only by tracked nodes is theirs to rewrite
        clients = fgraph.clients.get(out, []) if fgraph is not None else []
        if clients and all(not isinstance(c, str) and c.op in self.tracks()
                           and c.outputs[0].dtype == out.dtype for c, _ in clients):
            return None
        num, denum = self.get_num_denum(out)
        leaves = num + denum
        new = self.merge_num_denum(*self.simplify(num, denum, out.type))
        if self._layout(new) == self._layout(out):
            return None
        new = broadcast_to_type(new, out.type, leaves) if new.type != out.type else new
        return None if new is None else [new]
