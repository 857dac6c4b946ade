"""Theano's `theano.sandbox.linalg`: hints about matrices (`psd`) and `spectral_radius_bound`,
with the linear algebra that Theano's sandbox re-exported.

A hint is an identity op (`Hint`) carrying facts about its input (`psd=True, symmetric=True`).
`hints(v)` / `is_psd(v)` / `is_symmetric(v)` read them from the graph above `v`; the hint
nodes are removed in the specialize phase (`remove_hint_nodes`), so they cost nothing at run
time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_specialize
from symgpu.tensor.math import dot
from symgpu.tensor.nlinalg import (alloc_diag, det, diag, eig, eigh, extract_diag, matrix_inverse,
                                   trace)
from symgpu.tensor.slinalg import cholesky, eigvalsh, solve
from symgpu.tensor.type import as_tensor_variable

__all__ = ["Hint", "hints", "psd", "is_psd", "is_symmetric", "remove_hint_nodes",
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


def hints(variable: Variable) -> dict:
    """The hints given to `variable` (by Hint nodes that made it, nested hints merged)."""
    found: dict = {}
    v = variable
    while v.owner is not None and isinstance(v.owner.op, Hint):
        for k, val in v.owner.op.hints:
            found.setdefault(k, val)
        v = v.owner.inputs[0]
    return found


def psd(v: Any) -> Variable:
    """`v`, hinted to be a symmetric positive semi-definite matrix."""
    return Hint(psd=True, symmetric=True)(v)


def is_psd(v: Variable) -> bool:
    """Whether `v` carries the psd hint."""
    return bool(hints(v).get("psd", False))


def is_symmetric(v: Variable) -> bool:
    """Whether `v` carries the symmetric hint."""
    return bool(hints(v).get("symmetric", False))


@register_specialize
@node_rewriter([Hint])
def remove_hint_nodes(fgraph, node):
    """Hint(x) -> x (the hints have served the earlier phases)."""
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
