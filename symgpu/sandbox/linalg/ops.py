"""Theano's `theano.sandbox.linalg.ops`: hints about matrices (`psd`) and
`spectral_radius_bound`, with the linear algebra that Theano's sandbox re-exported.

A hint is an identity op (`Hint`) carrying facts about its input (`psd=True, symmetric=True`).
`hints(v)` / `is_psd(v)` / `is_symmetric(v)` read them from the graph above `v`; the hint
nodes are removed in the specialize phase (`remove_hint_nodes`), so they cost nothing at run
time. In a function graph with a `HintsFeature` (attached by the `HintsOptimizer` pass,
first in the pipeline, where a graph holds a Hint) the hints outlive their nodes: removing a
Hint node hands its hints to the feature, which keeps them for the variable and for whatever
replaces it (`hints(v, fgraph)`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import GraphRewriter, node_rewriter, optdb, register_specialize
from symgpu.tensor.math import dot
from symgpu.tensor.nlinalg import (alloc_diag, det, diag, eig, eigh, extract_diag, matrix_inverse,
                                   trace)
from symgpu.tensor.slinalg import cholesky, eigvalsh, solve
from symgpu.tensor.type import as_tensor_variable

__all__ = ["Hint", "HintsFeature", "HintsOptimizer", "hints", "psd", "is_psd", "is_symmetric", "remove_hint_nodes",
           "spectral_radius_bound", "cholesky", "solve", "eigvalsh", "matrix_inverse", "diag",
           "extract_diag", "alloc_diag", "det", "eig", "eigh", "trace"]


class Hint(Op):
    """The identity, carrying facts about its input for the rewriter (`Hint(psd=True)(x)`);
    `hints` is a sorted tuple of (name, value) pairs."""

    __props__ = ("hints",)
    view_map = {0: [0]}

    def __init__(self, **kwargs: Any):
        self.hints = tuple(sorted(kwargs.items()))

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def R_op(self, inputs, eval_points):
        return [eval_points[0]]


def hints(variable: Variable, fgraph: FunctionGraph | None = None) -> dict:
    """The hints given to `variable`: by Hint nodes that made it (nested hints merged) and,
    where `fgraph` carries a HintsFeature, those the feature keeps for it (the hints of
    Hint nodes removed since)."""
    found: dict = {}
    feature = getattr(fgraph, "hints_feature", None)
    if feature is not None:
        found.update(feature.hints.get(variable, {}))
    v = variable
    while v.owner is not None and isinstance(v.owner.op, Hint):
        for k, val in v.owner.op.hints:
            found.setdefault(k, val)
        v = v.owner.inputs[0]
    return found


class HintsFeature(Feature):
    """Keeps matrix hints (psd, symmetric...) per variable of a function graph, so that they
    outlive the Hint nodes that gave them: hints are facts about a position in the graph, so
    when a rewrite puts a new variable in place of an old one each gets the other's hints.
    Attached as `fgraph.hints_feature`; `hints` maps each variable to its dict."""

    def __init__(self) -> None:
        self.hints: dict[Variable, dict] = {}

    def add_hint(self, r: Variable, k: str, v: Any) -> None:
        """Record hint `k` = `v` for variable `r`."""
        self.ensure_init_r(r)
        self.hints[r][k] = v

    def ensure_init_r(self, r: Variable) -> None:
        """Give `r` an (empty) hint dict if it has none."""
        self.hints.setdefault(r, {})

    def on_attach(self, fgraph: FunctionGraph) -> None:
        if getattr(fgraph, "hints_feature", None) is not None:
            raise ValueError(f"HintsFeature: {fgraph} already has a HintsFeature")
        fgraph.hints_feature = self
        self.hints = {}
        for node in fgraph.toposort():
            self.on_import(fgraph, node, "on_attach")
        for r in fgraph.inputs:
            self.ensure_init_r(r)

    def on_detach(self, fgraph: FunctionGraph) -> None:
        if getattr(fgraph, "hints_feature", None) is self:
            del fgraph.hints_feature

    def on_import(self, fgraph: FunctionGraph, node: Apply, reason: str | None) -> None:
        for r in list(node.inputs) + list(node.outputs):
            self.ensure_init_r(r)

    def update_second_from_first(self, r0: Variable, r1: Variable) -> None:
        """Copy r0's hints to r1 (a hint both have must agree)."""
        old, new = self.hints[r0], self.hints[r1]
        for k, v in old.items():
            if k in new and new[k] != v:
                raise ValueError(f"HintsFeature: {r0} and {r1} disagree on hint {k!r}: "
                                 f"{v!r} vs {new[k]!r}")
            new.setdefault(k, v)

    def on_change_input(self, fgraph: FunctionGraph, node: Any, i: int, old: Variable,
                        new: Variable, reason: str | None) -> None:
        self.ensure_init_r(old)
        self.ensure_init_r(new)
        self.update_second_from_first(old, new)
        self.update_second_from_first(new, old)


class HintsOptimizer(GraphRewriter):
    """The pass that gives a function graph its HintsFeature (registered first, position
    -1, as `HintsOpt` in fast_run and fast_compile; graphs without a Hint node are left
    alone, so only users of the hints pay for it)."""

    def __init__(self) -> None:
        super().__init__(name="HintsOpt")

    def add_requirements(self, fgraph: FunctionGraph) -> None:
        """Attach a HintsFeature to `fgraph` (once)."""
        if getattr(fgraph, "hints_feature", None) is None:
            fgraph.attach_feature(HintsFeature())

    def apply(self, fgraph: FunctionGraph) -> None:
        if any(isinstance(n.op, Hint) for n in fgraph.apply_nodes):
            self.add_requirements(fgraph)


optdb.register("HintsOpt", HintsOptimizer(), -1, "fast_run", "fast_compile")


def psd(v: Any) -> Variable:
    """`v`, hinted to be a symmetric positive semi-definite matrix."""
    return Hint(psd=True, symmetric=True)(v)


def is_psd(v: Variable, fgraph: FunctionGraph | None = None) -> bool:
    """Whether `v` carries the psd hint (in `fgraph`'s HintsFeature too, if given)."""
    return bool(hints(v, fgraph).get("psd", False))


def is_symmetric(v: Variable, fgraph: FunctionGraph | None = None) -> bool:
    """Whether `v` carries the symmetric hint (in `fgraph`'s HintsFeature too, if given)."""
    return bool(hints(v, fgraph).get("symmetric", False))


@register_specialize
@node_rewriter([Hint])
def remove_hint_nodes(fgraph, node):
    """Hint(x) -> x (the hints have served the earlier phases; a HintsFeature keeps them)."""
    feature = getattr(fgraph, "hints_feature", None)
    if feature is not None:
        for k, v in node.op.hints:
            feature.add_hint(node.inputs[0], k, v)
    return [node.inputs[0]]


def spectral_radius_bound(X: Any, log2_exponent: int) -> Variable:
    """An upper bound on the largest |eigenvalue| of the symmetric matrix X:
    trace(X^(2^k)) ** 2^-k with k = log2_exponent (> 0; tighter and slower as it grows;
    V. Pan, 1990)."""
    X = as_tensor_variable(X)
    if X.ndim != 2:
        raise TypeError(f"spectral_radius_bound: X = {X} ({X.type}) must be a matrix")
    if not isinstance(log2_exponent, (int, np.integer)) or isinstance(log2_exponent, bool):
        raise TypeError(f"spectral_radius_bound: log2_exponent must be an integer, got "
                        f"{log2_exponent!r}")
    if log2_exponent <= 0:
        raise ValueError(f"spectral_radius_bound: log2_exponent must be > 0, got {log2_exponent}")
    XX = X
    for _ in range(int(log2_exponent)):
        XX = dot(XX, XX)
    return trace(XX) ** (2.0 ** -int(log2_exponent))
