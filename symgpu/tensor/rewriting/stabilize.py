"""Numerical stabilisation: rewrite expressions that overflow or lose all precision into
equivalent ones that do not (softplus, sigmoid, log_softmax, stable crossentropies).

    log(1 + exp(x))        -> softplus(x)         (x = 1000 gives 1000, not inf)
    log(sigmoid(x))        -> -softplus(-x)
    log(1 - sigmoid(x))    -> -softplus(x)
    1 / (1 + exp(-x))      -> sigmoid(x)
    log(softmax(x))        -> log_softmax(x)
    crossentropy_1hot(softmax(x), y) -> -log_softmax(x)[i, y_i], and its gradient
                              g * (softmax(x) - onehot(y)) without the 1/p[i, y_i]

Gradients of these expressions become finite through the canonical mul form (factors
cancel, see math.py): d/dx log(sigmoid(x)) = g/p * p*(1-p) -> g*(1-p).
"""
from __future__ import annotations

from symgpu.graph.rewriting import node_rewriter, register_stabilize
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.nnet import (CrossentropyCategorical1Hot, CrossentropyCategorical1HotGrad,
                                LogSoftmax, Softmax)
from symgpu.tensor.rewriting.utils import (broadcast_to_type, ew, ew_name, is_constant_value,
                                           is_ew)
from symgpu.tensor.basic import arange
from symgpu.tensor.math import cast, zeros_like
from symgpu.tensor.shape import shape_i
from symgpu.tensor.subtensor import set_subtensor

__all__ = ["local_log1p_exp_to_softplus", "local_log_sigmoid_to_softplus",
           "local_log_1m_sigmoid_to_softplus", "local_inv_1p_exp_to_sigmoid",
           "local_log_softmax", "local_crossentropy_1hot_softmax",
           "local_crossentropy_1hot_grad_times_softmax", "local_distribute_softmax_over_1hot_grad"]


def _one_plus(var):
    """x if var is 1 + x (either order), else None."""
    if ew_name(var) != "add" or len(var.owner.inputs) != 2:
        return None
    a, b = var.owner.inputs
    if is_constant_value(a, 1):
        return b
    if is_constant_value(b, 1):
        return a
    return None


def _one_minus(var):
    """x if var is 1 - x, else None."""
    if ew_name(var) != "sub":
        return None
    a, b = var.owner.inputs
    return b if is_constant_value(a, 1) else None


def _same_type(node, new):
    out = node.outputs[0]
    if new.type != out.type:
        new = broadcast_to_type(new, out.type, list(node.inputs))
    return None if new is None else [new]


@register_stabilize
@node_rewriter([Elemwise])
def local_log1p_exp_to_softplus(fgraph, node):
    """log(1 + exp(x)) and log1p(exp(x)) -> softplus(x)."""
    if is_ew(node, "log"):
        x = _one_plus(node.inputs[0])
    elif is_ew(node, "log1p"):
        x = node.inputs[0]
    else:
        return None
    if x is None or ew_name(x) != "exp":
        return None
    return _same_type(node, ew("softplus", x.owner.inputs[0]))


@register_stabilize
@node_rewriter([Elemwise])
def local_log_sigmoid_to_softplus(fgraph, node):
    """log(sigmoid(x)) -> -softplus(-x)."""
    if not is_ew(node, "log") or ew_name(node.inputs[0]) != "sigmoid":
        return None
    x = node.inputs[0].owner.inputs[0]
    return _same_type(node, ew("neg", ew("softplus", ew("neg", x))))


@register_stabilize
@node_rewriter([Elemwise])
def local_log_1m_sigmoid_to_softplus(fgraph, node):
    """log(1 - sigmoid(x)) and log1p(-sigmoid(x)) -> -softplus(x)."""
    if is_ew(node, "log"):
        s = _one_minus(node.inputs[0])
    elif is_ew(node, "log1p") and ew_name(node.inputs[0]) == "neg":
        s = node.inputs[0].owner.inputs[0]
    else:
        return None
    if s is None or ew_name(s) != "sigmoid":
        return None
    return _same_type(node, ew("neg", ew("softplus", s.owner.inputs[0])))


@register_stabilize
@node_rewriter([Elemwise])
def local_inv_1p_exp_to_sigmoid(fgraph, node):
    """1 / (1 + exp(-x)) -> sigmoid(x); 1 / (1 + exp(u)) -> sigmoid(-u)."""
    if is_ew(node, "reciprocal"):
        d = node.inputs[0]
    elif is_ew(node, "true_div") and is_constant_value(node.inputs[0], 1):
        d = node.inputs[1]
    else:
        return None
    e = _one_plus(d)
    if e is None or ew_name(e) != "exp":
        return None
    u = e.owner.inputs[0]
    x = u.owner.inputs[0] if ew_name(u) == "neg" else ew("neg", u)
    return _same_type(node, ew("sigmoid", x))


@register_stabilize
@node_rewriter([Elemwise])
def local_log_softmax(fgraph, node):
    """log(softmax(x)) -> log_softmax(x)."""
    if not is_ew(node, "log"):
        return None
    sm = node.inputs[0]
    if sm.owner is None or type(sm.owner.op) is not Softmax:
        return None
    return _same_type(node, LogSoftmax(sm.owner.op.axis)(sm.owner.inputs[0]))


def _softmax_input(var):
    node = var.owner
    if node is None or type(node.op) is not Softmax or node.op.axis not in (-1, 1):
        return None
    return node.inputs[0]


def _onehot_neg(g, like, y):
    """-g[i] at (i, y_i), zero elsewhere, shaped like `like` (n, k)."""
    rows = arange(shape_i(like, 0))
    return set_subtensor(zeros_like(like)[rows, y], cast(ew("neg", g), like.dtype))


@register_stabilize
@node_rewriter([CrossentropyCategorical1Hot])
def local_crossentropy_1hot_softmax(fgraph, node):
    """crossentropy_1hot(softmax(x), y) -> -log_softmax(x)[i, y_i] (finite when p[i, y_i]
    underflows)."""
    p, y = node.inputs
    x = _softmax_input(p)
    if x is None or x.ndim != 2:
        return None
    ls = LogSoftmax(-1 if p.owner.op.axis == -1 else 1)(x)
    picked = ls[arange(shape_i(x, 0)), y]
    return _same_type(node, ew("neg", picked))


@register_stabilize
@node_rewriter([Elemwise])
def local_crossentropy_1hot_grad_times_softmax(fgraph, node):
    """crossentropy_1hot_grad(g, sm, y) * sm -> -g at (i, y_i): the softmax cancels the
    1/sm[i, y_i] of the gradient."""
    if not is_ew(node, "mul"):
        return None
    ins = list(node.inputs)
    for k, v in enumerate(ins):
        owner = v.owner
        if owner is None or type(owner.op) is not CrossentropyCategorical1HotGrad:
            continue
        g, sm, y = owner.inputs
        for j, w in enumerate(ins):
            if j != k and w is sm:
                rest = [x for i, x in enumerate(ins) if i not in (j, k)]
                new = _onehot_neg(g, sm, y)
                if rest:
                    new = ew("mul", new, *rest)
                return _same_type(node, new)
    return None


@register_stabilize
@node_rewriter([Elemwise])
def local_distribute_softmax_over_1hot_grad(fgraph, node):
    """sm * (G - s) -> sm*G - sm*s when G is crossentropy_1hot_grad(.., sm, ..): the shape of
    softmax's gradient, made so that the rewrite above applies."""
    if not is_ew(node, "mul") or len(node.inputs) != 2:
        return None
    for a, b in (node.inputs, node.inputs[::-1]):
        name = ew_name(b)
        if name not in ("sub", "add"):
            continue
        terms = b.owner.inputs
        if any(t.owner is not None and type(t.owner.op) is CrossentropyCategorical1HotGrad
               and t.owner.inputs[1] is a for t in terms):
            return _same_type(node, ew(name, *[ew("mul", a, t) for t in terms]))
    return None
