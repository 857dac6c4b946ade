"""BLAS rewrites (the `blas` pass, position 20): dot -> Gemv / Dot22, then fold scalings and
added terms into them: `b + dot(x, w)` -> Gemv(b, 1, x, w, 1) and
`w - lr*(dot(x.T, g) + c*w)` -> Gemv(w, -lr, x.T, g, 1 - lr*c). `outer(x, y)` is
`dot(x[:, None], y[None, :])`, so `A + alpha*outer(x, y)` folds into a rank-1
Gemm(A, alpha, x[:, None], y[None, :], 1), which becomes Ger(A, alpha, x, y).

It runs before the GPU lifting (40) so the GPU backend maps Gemv/Gemm/Dot22/Ger one to one.
Their in-place variants come from the in-place pass (tensor/rewriting/inplace.py).
"""
from __future__ import annotations

from symgpu.graph.basic import Variable
from symgpu.graph.rewriting import RewriteGroup, node_rewriter, optdb
from symgpu.tensor.blas import BLAS_DTYPES, Dot22, Gemm, Gemv, dot22, gemm_no_inplace, \
    gemv_no_inplace, ger_no_inplace
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.math import Dot
from symgpu.tensor.rewriting.basic import constant_folding, local_dimshuffle_merge
from symgpu.tensor.rewriting.utils import (broadcast_to_type, ew, ew_name, is_ew, make_constant,
                                           scalar_constant, single_client)

__all__ = ["blas", "local_dot_to_blas", "local_fold_into_blas", "local_gemm_to_ger"]

blas = RewriteGroup("blas")
optdb.register("blas", blas, 20, "fast_run")


@node_rewriter([Dot])
def local_dot_to_blas(fgraph, node):
    """dot(matrix, vector) -> Gemv, dot(vector, matrix) -> Gemv on the transpose,
    dot(matrix, matrix) -> Dot22 (float32/float64 only)."""
    x, y = node.inputs
    out = node.outputs[0]
    if x.dtype != y.dtype or x.dtype not in BLAS_DTYPES:
        return None
    dtype = x.dtype
    if x.ndim == 2 and y.ndim == 1:
        new = gemv_no_inplace(make_constant(0, dtype, 1), make_constant(1, dtype), x, y,
                              make_constant(0, dtype))
    elif x.ndim == 1 and y.ndim == 2:
        new = gemv_no_inplace(make_constant(0, dtype, 1), make_constant(1, dtype),
                              DimShuffle(y.broadcastable, (1, 0))(y), x, make_constant(0, dtype))
    elif x.ndim == 2 and y.ndim == 2:
        new = dot22(x, y)
    else:
        return None
    return [new] if new.type == out.type else None


# ----------------------------------------------------------------------------- scales

class _Scale:
    """A product of a float and symbolic 0-d factors."""

    def __init__(self, value: float = 1.0, syms: tuple = ()):
        self.value, self.syms = value, tuple(syms)

    def times(self, other: "_Scale") -> "_Scale":
        if self.value == 0 or other.value == 0:
            return _Scale(0.0)  # beta = 0 stays the constant that tells BLAS to ignore y
        return _Scale(self.value * other.value, self.syms + other.syms)

    def build(self, dtype: str) -> Variable:
        const = make_constant(self.value, dtype)
        if not self.syms:
            return const
        factors = list(self.syms) if self.value == 1 else [const, *self.syms]
        return factors[0] if len(factors) == 1 else ew("mul", *factors)


def _as_scale(var: Variable, dtype: str) -> _Scale | None:
    """`var` as a scalar factor, if it is the same value everywhere (broadcast scalar)."""
    if var.dtype != dtype or not all(var.broadcastable):
        return None
    c = scalar_constant(var)
    if c is not None:
        return _Scale(float(c))
    v = var
    while v.owner is not None and type(v.owner.op) is DimShuffle:
        v = v.owner.inputs[0]
    if v.ndim:
        v = DimShuffle(v.broadcastable, ())(v)
    return _Scale(1.0, (v,))


def _terms(var: Variable, scale: _Scale, fgraph, root: bool, out: list) -> None:
    """Append (scale, term) pairs whose sum is `var` (descending through add/sub/neg/mul
    nodes read only here)."""
    name = ew_name(var) if (root or single_client(fgraph, var)) else None
    if name == "add":
        for x in var.owner.inputs:
            _terms(x, scale, fgraph, False, out)
        return
    if name == "sub":
        a, b = var.owner.inputs
        _terms(a, scale, fgraph, False, out)
        _terms(b, scale.times(_Scale(-1.0)), fgraph, False, out)
        return
    if name == "neg":
        _terms(var.owner.inputs[0], scale.times(_Scale(-1.0)), fgraph, False, out)
        return
    if name == "mul":
        dtype = var.dtype
        rest, s = [], scale
        for f in var.owner.inputs:
            sc = _as_scale(f, dtype)
            if sc is not None:
                s = s.times(sc)
            else:
                rest.append(f)
        if len(rest) == 1:
            _terms(rest[0], s, fgraph, False, out)
            return
    out.append((scale, var))


def _blas_node(var: Variable, fgraph):
    """The Gemv/Gemm/Dot22 node computing `var` alone (read only by the expression)."""
    node = var.owner
    if node is None or type(node.op) not in (Gemv, Gemm, Dot22) or not single_client(fgraph, var):
        return None
    if getattr(node.op, "inplace", False):
        return None
    return node


def _product_broadcastable(node) -> tuple:
    """The broadcastable pattern of the product alone (dot(a, b)) that a BLAS node computes."""
    if type(node.op) is Dot22:
        a, b = node.inputs
    else:
        a, b = node.inputs[2], node.inputs[3]
    return (a.broadcastable[0],) if b.ndim == 1 else (a.broadcastable[0], b.broadcastable[1])


def _fits_accumulator(v: Variable, product_bcast: tuple) -> bool:
    """Whether `v` may be the y of beta*y + alpha*product: same rank, and broadcastable
    wherever the product is (the product must never be broadcast into y)."""
    return v.ndim == len(product_bcast) and \
        all(vb or not pb for vb, pb in zip(v.broadcastable, product_bcast))


def _beta_is_zero(node) -> bool:
    if type(node.op) is Dot22:
        return True
    c = scalar_constant(node.inputs[4])
    return c is not None and c == 0


@node_rewriter([Elemwise])
def local_fold_into_blas(fgraph, node):
    """Fold s * blas(...) + t * y + rest into one Gemv/Gemm (alpha *= s, y and beta = t)."""
    if not is_ew(node, "add", "sub", "neg", "mul"):
        return None
    out = node.outputs[0]
    if out.dtype not in BLAS_DTYPES or out.ndim not in (1, 2):
        return None
    clients = fgraph.clients.get(out, ())
    if len(clients) == 1 and clients[0][0] != "output" and \
            is_ew(clients[0][0], "add", "sub", "neg", "mul") and \
            clients[0][0].outputs[0].dtype == out.dtype and clients[0][0].outputs[0].ndim == out.ndim:
        return None  # the enclosing expression folds this one too, all at once
    terms: list[tuple[_Scale, Variable]] = []
    _terms(out, _Scale(), fgraph, True, terms)
    blas_k = next((k for k, (_, v) in enumerate(terms) if _blas_node(v, fgraph) is not None), None)
    if blas_k is None:
        return None
    s_blas, v_blas = terms[blas_k]
    bnode = v_blas.owner
    others = [t for k, t in enumerate(terms) if k != blas_k]
    # merge repeated terms with constant scales (w - 0.01 * 0.02 * w -> 0.9998 * w)
    merged: list[tuple[_Scale, Variable]] = []
    for s, v in others:
        for k, (s2, v2) in enumerate(merged):
            if v2 is v and not s.syms and not s2.syms:
                merged[k] = (_Scale(s.value + s2.value), v)
                break
        else:
            merged.append((s, v))
    y_k = None
    if _beta_is_zero(bnode):
        product_bcast = _product_broadcastable(bnode)
        for k, (s, v) in enumerate(merged):
            if v.dtype == out.dtype and _fits_accumulator(v, product_bcast):
                y_k = k
                break
    if y_k is None and s_blas.value == 1.0 and not s_blas.syms:
        return None  # nothing to fold
    dtype = out.dtype
    if type(bnode.op) is Dot22:
        a, b = bnode.inputs
        alpha, beta, y = _Scale(), _Scale(0.0), make_constant(0, dtype, 2)
        op = gemm_no_inplace
    else:
        y, alpha_v, a, b, beta_v = bnode.inputs
        op = gemm_no_inplace if type(bnode.op) is Gemm else gemv_no_inplace
        alpha, beta = _as_scale(alpha_v, dtype), _as_scale(beta_v, dtype)
        if alpha is None or beta is None:
            return None
    alpha = alpha.times(s_blas)
    beta = beta.times(s_blas)
    if y_k is not None:
        beta, y = merged[y_k][0], merged[y_k][1]
        del merged[y_k]
    new = op(y, alpha.build(dtype), a, b, beta.build(dtype))
    rest = [v if (s.value == 1 and not s.syms) else ew("mul", s.build(dtype), v) for s, v in merged]
    if rest:
        new = ew("add", new, *rest)
    if new.type != out.type:
        new = broadcast_to_type(new, out.type, [v for _, v in terms])
        if new is None:
            return None
    return [new]


def _drop_broadcastable(var: Variable, axis: int) -> Variable:
    """`var` (a matrix whose dimension `axis` is broadcastable) as the vector it holds."""
    node = var.owner
    if node is not None and type(node.op) is DimShuffle and node.inputs[0].ndim == 1 and \
            node.op.new_order == ((0, "x") if axis == 1 else ("x", 0)):
        return node.inputs[0]          # outer's own x[:, None] / y[None, :]
    return DimShuffle(var.broadcastable, (1 - axis,))(var)


@node_rewriter([Gemm])
def local_gemm_to_ger(fgraph, node):
    """Gemm(A, alpha, x[:, None], y[None, :], 1) -> Ger(A, alpha, x, y): the rank-1 update
    `A + alpha*outer(x, y)` (as local_fold_into_blas leaves it) runs as BLAS ger, which reads
    x and y as vectors and updates A in place instead of a k=1 matrix product."""
    if node.op.inplace:
        return None
    c, alpha, a, b, beta = node.inputs
    if not (a.broadcastable[1] and b.broadcastable[0]):
        return None
    beta_v = scalar_constant(beta)
    if beta_v is None or beta_v != 1:
        return None
    new = ger_no_inplace(c, alpha, _drop_broadcastable(a, 1), _drop_broadcastable(b, 0))
    return [new] if new.type == node.outputs[0].type else None


blas.register(local_dot_to_blas)
blas.register(local_fold_into_blas)
blas.register(local_gemm_to_ger)
blas.register(constant_folding)
blas.register(local_dimshuffle_merge)
