"""The gradient of attention's mask (a learned bias, rarely wanted), written out in ordinary
ops: the scores, P recomputed from the rows' log-sum-exp, the dropout's draw again, dS. The
semantics are nnet/attention.py's; this builds them as a graph, one matrix of scores per
head."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Variable
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.extra_funcs import tri
from symgpu.tensor.random.ops import PhiloxSample
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorVariable

__all__ = ["mask_grad"]


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
    """(q, k, v, mask, state): the inputs after q, k, v as the op's flags lay them out."""
    mask = inputs[3] if op.has_mask else None
    state = inputs[3 + op.has_mask] if op.dropout is not None else None
    return (*inputs[:3], mask, state)


def _rows(x: TensorVariable) -> TensorVariable:
    return x.dimshuffle(*range(x.ndim), "x")


def _probabilities(op: Any, q: Variable, k: Variable, mask: Variable | None, lse: Variable
                   ) -> TensorVariable:
    """P recomputed from the scores and the rows' log-sum-exp (zero in rows without keys)."""
    acc = lse.dtype
    s, lse_e = _scores(op, q, k, mask, acc), _rows(lse)
    return _m.switch(_m.isinf(lse_e), _b.constant(0.0, dtype=acc), _m.exp(s - lse_e))


def mask_grad(op: Any, inputs: Sequence[Variable], o: Variable, lse: Variable, go: Variable,
              glse: Variable | None) -> TensorVariable:
    """d/dmask = dS = P (dP - rowsum(dO o) + dlse), summed to the mask's broadcast dims (under
    dropout dP is the kept elements' divided by div, the rest zero)."""
    q, k, v, mask, state = _parts(op, inputs)
    acc = lse.dtype
    gof = _m.cast(go, acc)
    p = _probabilities(op, q, k, mask, lse)
    dp = _dropped(op, state, _m.matmul(gof, _swap(_m.cast(v, acc))))
    delta = _m.sum(gof * _m.cast(o, acc), axis=-1, keepdims=True)
    if glse is not None:
        delta = delta - _rows(glse)
    return _m.cast(_sum_to(p * (dp - delta), mask), mask.dtype)


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
