"""Attention written out in ordinary ops (matmul, the softmax's terms, the dropout's draw):
the gradient of a mask, and ``written_out`` / ``written_out_grad``, which a backend without a
fused kernel for an `Attention` or `AttentionGrad` node runs in its place (the GPU for
dropout: gpu/ops/attention.py). The semantics are nnet/attention.py's; these build the same
values as graphs, one matrix of scores per head."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Variable
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.extra_funcs import tri
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorVariable

__all__ = ["mask_grad", "written_out", "written_out_grad"]


def _swap(x: Variable) -> TensorVariable:
    return x.dimshuffle(*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)


def _scale(op: Any, q: Variable, acc: str) -> TensorVariable:
    if op.scale is not None:
        return _b.constant(op.scale, dtype=acc)
    return 1.0 / _m.sqrt(_m.cast(shape_i(q, q.ndim - 1), acc))


def _scores(op: Any, q: Variable, k: Variable, mask: Variable | None, acc: str
            ) -> TensorVariable:
    """scale * q k^T + mask, the causal positions -inf, in `acc`."""
    s = _m.matmul(_m.cast(q, acc), _swap(_m.cast(k, acc))) * _scale(op, q, acc)
    if mask is not None:
        s = s + _m.cast(mask, acc)
    if op.causal:
        keep = tri(shape_i(q, q.ndim - 2), shape_i(k, k.ndim - 2), 0, "bool")
        s = _m.switch(keep, s, _b.constant(-np.inf, dtype=acc))
    return s


def _kept(dropout: Any, state: Variable, like: TensorVariable) -> TensorVariable:
    """The dropout's kept elements (the draw `binomial` makes) of `like`'s shape."""
    from symgpu.tensor.random.ops import PhiloxSample   # deferred: random imports tensor
    u = PhiloxSample("uniform", dropout.draw)(state, *[shape_i(like, i)
                                                        for i in range(like.ndim)])
    return _m.lt(u, _b.constant(dropout.keep, dtype=dropout.draw))


def _dropped(op: Any, state: Variable | None, x: TensorVariable) -> TensorVariable:
    """x with the dropout's dropped elements zero and the kept ones divided by div (x itself
    without dropout)."""
    if op.dropout is None:
        return x
    zero = _b.constant(0.0, dtype=x.dtype)
    return _m.switch(_kept(op.dropout, state, x), x / _b.constant(op.dropout.div, x.dtype), zero)


def _parts(op: Any, inputs: Sequence[Variable]) -> tuple:
    """(q, k, v, mask, state, rest): the inputs after q, k, v as the op's flags lay them out."""
    n = 3 + op.has_mask
    mask = inputs[3] if op.has_mask else None
    state = inputs[n] if op.dropout is not None else None
    return (*inputs[:3], mask, state, list(inputs[n + (op.dropout is not None):]))


def _rows(x: TensorVariable) -> TensorVariable:
    return x.dimshuffle(*range(x.ndim), "x")


def written_out(op: Any, inputs: Sequence[Variable], acc: str) -> list[TensorVariable]:
    """An `Attention` node's (o, lse) in ordinary ops (`acc`: its lse dtype)."""
    q, k, v, mask, state, _ = _parts(op, inputs)
    s = _scores(op, q, k, mask, acc)
    m = _m.max(s, axis=-1, keepdims=True)
    m = _m.switch(_m.isinf(m), _b.constant(0.0, dtype=acc), m)   # a row masked throughout
    e = _m.exp(s - m)
    l = _m.sum(e, axis=-1, keepdims=True)
    some = _m.gt(l, 0)
    p = e / _m.switch(some, l, _b.constant(1.0, dtype=acc))
    lse = _m.switch(some, m + _m.log(l), _b.constant(-np.inf, dtype=acc))
    o = _m.matmul(_dropped(op, state, p), _m.cast(v, acc))
    return [_m.cast(o, q.dtype), lse[..., 0]]


def _probabilities(op: Any, q: Variable, k: Variable, mask: Variable | None, lse: Variable
                   ) -> TensorVariable:
    """P recomputed from the scores and the rows' log-sum-exp (zero in rows without keys)."""
    acc = lse.dtype
    s, lse_e = _scores(op, q, k, mask, acc), _rows(lse)
    return _m.switch(_m.isinf(lse_e), _b.constant(0.0, dtype=acc), _m.exp(s - lse_e))


def _ds(op: Any, inputs: Sequence[Variable], o: Variable, lse: Variable, go: Variable,
        glse: Variable | None) -> tuple[TensorVariable, TensorVariable, TensorVariable]:
    """(P, the dropped P, dS = P (dP - rowsum(dO o) + dlse)) of the attention's inputs."""
    q, k, v, mask, state, _ = _parts(op, inputs)
    acc = lse.dtype
    gof = _m.cast(go, acc)
    p = _probabilities(op, q, k, mask, lse)
    dp = _dropped(op, state, _m.matmul(gof, _swap(_m.cast(v, acc))))
    delta = _m.sum(gof * _m.cast(o, acc), axis=-1, keepdims=True)
    if glse is not None:
        delta = delta - _rows(glse)
    return p, _dropped(op, state, p), p * (dp - delta)


def mask_grad(op: Any, inputs: Sequence[Variable], o: Variable, lse: Variable, go: Variable,
              glse: Variable | None) -> TensorVariable:
    """d/dmask = dS, summed to the mask's broadcast dims."""
    mask = inputs[3]
    _, _, ds = _ds(op, inputs, o, lse, go, glse)
    return _m.cast(_sum_to(ds, mask), mask.dtype)


def written_out_grad(op: Any, inputs: Sequence[Variable]) -> list[TensorVariable]:
    """An `AttentionGrad` node's (dq, dk, dv) in ordinary ops."""
    q, k, v, mask, state, rest = _parts(op, inputs)
    o, lse, go = rest[:3]
    glse = rest[3] if op.has_dlse else None
    acc = lse.dtype
    _, pd, ds = _ds(op, inputs, o, lse, go, glse)
    sc = _scale(op, q, acc)
    dq = _m.matmul(ds, _m.cast(k, acc)) * sc
    dk = _m.matmul(_swap(ds), _m.cast(q, acc)) * sc
    dv = _m.matmul(_swap(pd), _m.cast(go, acc))
    return [_m.cast(g, x.dtype) for g, x in ((dq, q), (dk, k), (dv, v))]


def _sum_to(x: TensorVariable, like: Variable) -> TensorVariable:
    """x summed over the dims where `like` broadcasts (and its missing leading dims)."""
    lead = x.ndim - like.ndim
    axes = list(range(lead)) + [lead + i for i, b in enumerate(like.broadcastable) if b]
    if not axes:
        return x
    r = _m.sum(x, axis=axes, keepdims=True)
    if lead:
        r = r.dimshuffle(*range(lead, x.ndim))
    return r
