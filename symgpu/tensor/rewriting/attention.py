"""fuse_attention: the attention users write -> one `Attention` node, and its gradient graph
-> one `AttentionGrad` node (pass at 0.5, between merge1 and canonicalize).

Spellings of the forward recognised (any nesting of the score terms):

    p @ v / matmul(p, v) / batched_dot(p, v)            the output (3-d and 4-d)
    p = softmax(s, axis=-1)  |  exp(s - max(s, -1, keepdims)) / sum(that, -1, keepdims)
        | exp(s) / sum(exp(s), -1, keepdims)
    s = (q @ k^T) with k^T = k.dimshuffle(0,1,3,2) / k.transpose(...) / k.swapaxes(-1,-2)
        or batched_dot(q, k^T); q or k may be scaled (q * c, q / c), and s may be
          s * c, c * s, s / c                       (c a constant: folded into the op's scale;
                                                    a symbolic scalar multiplies q instead)
          s + mask                                  (a float mask; a constant lower-triangular
                                                    0/-inf (or <= -1e4) mask becomes `causal`)
          switch(cond, s, -inf | -1e9), switch(cond, -inf, s)   (cond a bool mask; a
                                                    triangle - constant, `tri`, `tril(ones)` -
                                                    becomes `causal`)

Why before canonicalize: the pass also replaces the *gradient* of each matched forward, and
that is found exactly as T.grad built it. For each match the pass differentiates the matched
(unfused) forward again with a placeholder output gradient and looks for the result in the
graph (structural unification, the placeholder binding to whatever gradient flows into the
output; add/mul operands in either order). What it finds is replaced by the gradient of the
fused node (AttentionGrad). So `T.grad` of a hand-written attention gets the fused backward
too, whatever spelling the forward used. Canonicalize would reshape those gradient graphs.

    dropout on the probabilities before the product with v:
        p * kept / c, p * kept * c, kept * (p / c) ...    (kept = binomial(size=p.shape,
                                                    p=keep) or its uniform < keep, one
                                                    draw of the probabilities' shape; any
                                                    constant factors: the op's div)
    The fused op takes the draw's generator state and drops exactly the elements the
    written-out graph drops (the same uniforms); the state's update stays as it was.

``optimizer_excluding=fuse_attention`` turns the pass off.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.basic import copy_stack_trace
from symgpu.graph.rewriting.db import optdb
import symgpu.tensor as _T
from symgpu.tensor import math as _m
from symgpu.tensor.basic import Alloc, ARange
from symgpu.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from symgpu.tensor.math import MatMul
from symgpu.tensor.nnet import Softmax
from symgpu.tensor.nnet.attention import Attention, Dropout, dropout_draw
from symgpu.tensor.rewriting.utils import ew_name, scalar_constant
from symgpu.tensor.type import TensorConstant, TensorType

__all__ = ["fuse_attention", "match_attention", "AttentionMatch"]

#: an additive mask value at or below this masks (PyTorch and HF use -1e4 .. -1e9, or -inf)
MASKED = -1e4


class AttentionMatch:
    """What `match_attention` found: the fused op's inputs and flags, and the variables the
    gradient flows to (the leaves of the matched subgraph)."""

    def __init__(self) -> None:
        self.q: Variable | None = None
        self.k: Variable | None = None
        self.v: Variable | None = None
        self.scale = 1.0
        self.q_factors: list[Variable] = []     # symbolic scalars multiplying the scores
        self.masks: list[Variable] = []         # additive masks
        self.causal = False
        self.leaves: list[Variable] = []
        self.dropout: Dropout | None = None
        self.state: Variable | None = None      # the dropout draw's generator state


# ----------------------------------------------------------------------------- constants

def _const(var: Variable) -> np.ndarray | None:
    """The value of `var` when it is computed from constants by DimShuffles and Elemwises
    only (``1/sqrt(64.)``, a mask), else None."""
    if isinstance(var, Constant):
        return np.asarray(var.data)
    node = var.owner
    if node is None or not isinstance(node.op, (Elemwise, DimShuffle)) or len(node.outputs) != 1:
        return None
    vals = [_const(i) for i in node.inputs]
    if any(v is None for v in vals):
        return None
    cells = [[None]]
    try:
        with np.errstate(all="ignore"):
            node.op.perform(node, vals, cells)
    except Exception:   # an op whose perform wants more context: not a constant here
        return None
    return np.asarray(cells[0][0])


def _scalar(var: Variable) -> float | None:
    """A constant that is one number everywhere, as a float, else None."""
    c = scalar_constant(var)
    if c is None:
        v = _const(var)
        if v is None or v.size == 0 or not np.all(v == v.flat[0]):
            return None
        c = v.flat[0]
    try:
        return float(c)
    except (TypeError, ValueError):
        return None


def _scalar_like(var: Variable) -> bool:
    return isinstance(var.type, TensorType) and all(var.broadcastable)


def _is_lower_tri(a: np.ndarray, keep: Any) -> bool:
    """Whether the last two axes of `a` are square and `keep(a)` holds exactly on and below
    the diagonal (the same triangle for every leading index)."""
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or a.shape[-1] < 1:
        return False
    k = np.asarray(keep(a), dtype=bool)
    return bool(np.all(k == np.tri(a.shape[-1], dtype=bool)))


def _is_arange_from_0(var: Variable, pattern: tuple) -> bool:
    node = var.owner
    if node is None or not isinstance(node.op, DimShuffle) or node.op.new_order != pattern:
        return False
    a = node.inputs[0].owner
    return a is not None and isinstance(a.op, ARange) and _scalar(a.inputs[0]) == 0 and \
        _scalar(a.inputs[2]) == 1


def _unpadded(var: Variable) -> Variable:
    """var without the leading broadcast dims an elementwise op pads its inputs with."""
    node = var.owner
    while node is not None and isinstance(node.op, DimShuffle):
        order, n = node.op.new_order, len(node.op.input_broadcastable)
        lead = len(order) - n
        if lead <= 0 or order != ("x",) * lead + tuple(range(n)):
            break
        var = node.inputs[0]
        node = var.owner
    return var


def _tri(cond: Variable) -> bool | None:
    """True when the boolean `cond` is true exactly on and below the diagonal (a causal
    keep-mask), False when exactly above it (a causal drop-mask), else None. Knows constant
    arrays, T.tri (``i + 0 >= j`` of two aranges), tril(ones) compared with 0 or 1, and
    their negations."""
    cond = _unpadded(cond)
    val = _const(cond)
    if val is not None and val.dtype == bool:
        if _is_lower_tri(val, lambda a: a):
            return True
        if _is_lower_tri(val, lambda a: ~a):
            return False
        return None
    name = ew_name(cond)
    if name == "invert":
        inner = _tri(cond.owner.inputs[0])
        return None if inner is None else not inner
    if name in ("ge", "le", "lt", "gt"):
        a, b = cond.owner.inputs
        if name in ("le", "gt"):
            a, b = b, a
        if ew_name(a) == "add" and len(a.owner.inputs) == 2:
            x, off = a.owner.inputs
            if _scalar(off) == 0:
                a = x
        if _is_arange_from_0(a, (0, "x")) and _is_arange_from_0(b, ("x", 0)):
            return True if name in ("ge", "le") else None
        return None
    if name in ("eq", "neq", "gt"):
        a, b = cond.owner.inputs
        c = _scalar(b)
        tri = _tril_ones(a)
        if tri and c is not None:
            if (name == "neq" and c == 0) or (name == "eq" and c == 1) or (name == "gt" and c == 0):
                return True
            if name == "eq" and c == 0:
                return False
    if name == "cast" or (cond.owner is not None and isinstance(cond.owner.op, Elemwise) and
                          getattr(cond.owner.op.scalar_op, "dtype", None) == "bool"):
        return _tril_ones(cond.owner.inputs[0]) or None
    return None


def _tril_ones(var: Variable) -> bool:
    """Whether `var` is a 0/1 lower triangle: a constant, or T.tril(ones(...)) (switch(tri,
    ones, zeros))."""
    var = _unpadded(var)
    val = _const(var)
    if val is not None:
        return _is_lower_tri(val, lambda a: a != 0) and bool(np.all((val == 0) | (val == 1)))
    if ew_name(var) != "switch":
        return False
    c, a, b = var.owner.inputs
    return _tri(c) is True and _scalar(b) == 0 and (_scalar(a) == 1 or (
        a.owner is not None and isinstance(a.owner.op, Alloc) and
        _scalar(a.owner.inputs[0]) == 1))


# ----------------------------------------------------------------------------- the forward

def _through_identity(var: Variable) -> Variable:
    """batched_dot's output is DimShuffle{0,1,2}(MatMul): look through identity shuffles."""
    node = var.owner
    while node is not None and isinstance(node.op, DimShuffle) and \
            node.op.new_order == tuple(range(len(node.op.input_broadcastable))):
        var = node.inputs[0]
        node = var.owner
    return var


def _peel_scale(var: Variable, m: AttentionMatch) -> Variable:
    """var without the scalar factors (constant ones into m.scale, others into m.q_factors)."""
    while True:
        name = ew_name(var)
        if name in ("mul", "true_div") and len(var.owner.inputs) == 2:
            a, b = var.owner.inputs
            if name == "mul" and _scalar_like(a) and not _scalar_like(b):
                a, b = b, a
            if _scalar_like(b) and not _scalar_like(a):
                c = _scalar(b)
                if c is not None and c != 0:
                    m.scale *= c if name == "mul" else 1.0 / c
                elif name == "mul":
                    m.q_factors.append(b)
                else:
                    m.q_factors.append(_m.true_div(np.asarray(1.0, dtype=b.dtype), b))
                var = a
                continue
        return var


def _transposed(var: Variable) -> Variable | None:
    """x when var is x with its last two axes swapped (dimshuffle / transpose / swapaxes)."""
    node = var.owner
    if node is None or not isinstance(node.op, DimShuffle):
        return None
    n = len(node.op.input_broadcastable)
    if n < 2 or node.op.new_order != tuple(range(n - 2)) + (n - 1, n - 2):
        return None
    return node.inputs[0]


def _scores(var: Variable, m: AttentionMatch) -> bool:
    """Peel masks and scales off the scores down to q @ k^T; fills m."""
    var = _through_identity(var)
    name = ew_name(var)
    if name == "switch":
        cond, a, b = var.owner.inputs
        fa, fb = _scalar(a), _scalar(b)
        if fb is not None and fb <= MASKED and fa is None:
            keep, rest, fill = cond, a, fb
        elif fa is not None and fa <= MASKED and fb is None:
            keep, rest, fill = _m.invert(cond), b, fa
        else:
            return False
        if cond.dtype != "bool":
            return False
        t = _tri(cond)
        if t is not None and (t if keep is cond else not t):
            m.causal = True
        else:
            m.masks.append(_m.switch(keep, np.asarray(0.0, dtype=var.dtype),
                                     np.asarray(fill, dtype=var.dtype)))
            if _const(cond) is None:
                m.leaves.append(cond)
        return _scores(rest, m)
    if name == "add" and len(var.owner.inputs) == 2:
        for s, mask in (var.owner.inputs, var.owner.inputs[::-1]):
            if _is_scores_chain(s):
                val = _const(mask)
                if (val is not None and _is_lower_tri(val, lambda a: a == 0) and
                        np.all((val == 0) | (val <= MASKED))) or _causal_additive(mask):
                    m.causal = True
                else:
                    m.masks.append(mask)
                    if val is None:
                        m.leaves.append(mask)
                return _scores(s, m)
        return False
    if name in ("mul", "true_div"):
        before = (m.scale, len(m.q_factors))
        rest = _peel_scale(var, m)
        if rest is var or (m.scale, len(m.q_factors)) == before:
            return False
        return _scores(rest, m)
    node = var.owner
    if node is None or not isinstance(node.op, MatMul):
        return False
    q, kt = node.inputs
    k = _transposed(_peel_scale(kt, m))
    if k is None:
        return False
    m.q, m.k = _peel_scale(q, m), _peel_scale(k, m)
    return m.q.ndim >= 3 and m.q.ndim == m.k.ndim


def _causal_additive(mask: Variable) -> bool:
    """switch(tri, 0, -inf) (or switch(~tri, -inf, 0)): a symbolic causal additive mask."""
    mask = _unpadded(mask)
    if ew_name(mask) != "switch":
        return False
    c, a, b = mask.owner.inputs
    fa, fb = _scalar(a), _scalar(b)
    t = _tri(c)
    return (t is True and fa == 0 and fb is not None and fb <= MASKED) or \
        (t is False and fb == 0 and fa is not None and fa <= MASKED)


def _is_scores_chain(var: Variable) -> bool:
    """Cheap look-ahead: whether peeling `var` reaches a MatMul (which side of an add is the
    scores)."""
    probe = AttentionMatch()
    return _scores(var, probe)


def _probabilities(var: Variable) -> Variable | None:
    """The scores s when var is softmax(s) along the last axis in one of the spellings."""
    var = _through_identity(var)
    node = var.owner
    if node is None:
        return None
    if isinstance(node.op, Softmax):
        x = node.inputs[0]
        return x if node.op.axis == x.ndim - 1 else None
    if ew_name(var) != "true_div":
        return None
    e, den = node.inputs
    last = var.ndim - 1
    d = den.owner
    if d is None or not isinstance(d.op, DimShuffle) or \
            d.op.new_order != tuple(range(last)) + ("x",):
        return None
    r = d.inputs[0].owner
    if r is None or not isinstance(r.op, CAReduce) or r.op.scalar_op.name != "add" or \
            r.op.axis != (last,) or r.inputs[0] is not e or ew_name(e) != "exp":
        return None
    x = e.owner.inputs[0]
    if ew_name(x) == "sub":
        s, mx = x.owner.inputs
        dm = mx.owner
        if dm is not None and isinstance(dm.op, DimShuffle) and \
                dm.op.new_order == tuple(range(last)) + ("x",):
            rm = dm.inputs[0].owner
            if rm is not None and isinstance(rm.op, CAReduce) and \
                    rm.op.scalar_op.name == "maximum" and rm.op.axis == (last,) and \
                    rm.inputs[0] is s:
                return s
    return x


def _dropout(var: Variable, m: AttentionMatch) -> Variable:
    """var without a dropout (a keep-mask and constant factors multiplying it): the
    probabilities, with m.dropout and m.state filled; var itself when there is none."""
    factor, kept, rest = 1.0, None, _through_identity(var)
    while ew_name(rest) in ("mul", "true_div") and len(rest.owner.inputs) == 2:
        a, b = rest.owner.inputs
        div = ew_name(rest) == "true_div"
        found = False
        for x, y in ((a, b), (b, a)) if not div else ((a, b),):
            c = _scalar(y) if _scalar_like(y) else None
            k = None if c is not None or div else dropout_draw(y)
            if c is not None and c != 0:
                factor = factor / c if div else factor * c
            elif k is not None and kept is None and y.broadcastable == var.broadcastable:
                kept = k
            else:
                continue
            rest, found = _through_identity(x), True
            break
        if not found:
            break
    if kept is None or factor == 0:
        return var
    state, keep, draw = kept
    m.dropout, m.state = Dropout(keep, 1.0 / factor, draw), state
    return rest


def match_attention(node: Apply) -> AttentionMatch | None:
    """The attention computed by the MatMul `node` (probabilities @ v), or None."""
    if not isinstance(node.op, MatMul):
        return None
    p, v = node.inputs
    m = AttentionMatch()
    s = _probabilities(_dropout(p, m))
    if s is None:
        return None
    if not _scores(s, m):
        return None
    m.v = v
    q, k = m.q, m.k
    if not (q.ndim == k.ndim == v.ndim and q.dtype == k.dtype == v.dtype == s.dtype ==
            node.outputs[0].dtype):
        return None
    if any(mk.ndim > q.ndim for mk in m.masks):
        return None
    m.leaves = [q, k, v] + m.leaves + [f for f in m.q_factors if f.owner is None]
    return m


def _fused(m: AttentionMatch) -> Variable:
    q, k, v = m.q, m.k, m.v
    for f in m.q_factors:
        q = q * f
    if q.dtype != m.q.dtype:
        return None
    mask = None
    for mk in m.masks:
        acc = "float64" if q.dtype == "float64" else "float32"   # the op adds masks in float32
        mk = mk if mk.dtype == acc else _m.cast(mk, acc)
        mask = mk if mask is None else mask + mk
    op = Attention(m.causal, m.scale, mask is not None, m.dropout)
    return op(q, k, v, *[x for x in (mask, m.state) if x is not None])


# ----------------------------------------------------------------------------- the gradient

_COMMUTATIVE = ("add", "mul")


class _Unifier:
    """Structural matching of a rebuilt gradient graph against the function's graph, one
    placeholder variable binding to a graph variable."""

    def __init__(self, placeholder: Variable, known: set) -> None:
        self.g = placeholder
        self.known = known        # variables of the function graph (match by identity)
        self.bound: Variable | None = None

    def unify(self, r: Variable, f: Variable) -> bool:
        if r is f:
            return True
        if r is self.g:
            if self.bound is None:
                if r.type != f.type:
                    return False
                self.bound = f
                return True
            return self.bound is f
        if r in self.known:
            return False
        if isinstance(r, Constant):
            return isinstance(f, Constant) and r.type == f.type and \
                np.shape(r.data) == np.shape(f.data) and bool(np.all(r.data == f.data))
        rn, fn = r.owner, f.owner
        if rn is None or fn is None or rn.op != fn.op or len(rn.inputs) != len(fn.inputs) or \
                rn.outputs.index(r) != fn.outputs.index(f):
            return False
        saved = self.bound
        if all(self.unify(a, b) for a, b in zip(rn.inputs, fn.inputs)):
            return True
        self.bound = saved
        if isinstance(rn.op, Elemwise) and getattr(rn.op.scalar_op, "name", "") in _COMMUTATIVE \
                and len(rn.inputs) == 2:
            if self.unify(rn.inputs[0], fn.inputs[1]) and self.unify(rn.inputs[1], fn.inputs[0]):
                return True
            self.bound = saved
        return False

    def find(self, r: Variable, fgraph: FunctionGraph, by_op: dict) -> Variable | None:
        rn = r.owner
        if rn is None:
            return None
        for fn in by_op.get(type(rn.op), ()):
            if fn.op != rn.op:
                continue
            f = fn.outputs[rn.outputs.index(r)]
            saved = self.bound
            if self.unify(r, f):
                return f
            self.bound = saved
        return None


def _gradient_pairs(fgraph: FunctionGraph, out: Variable, m: AttentionMatch,
                    fused: Variable) -> list[tuple[Variable, Variable]]:
    """(the graph's gradient of a leaf through this attention, the fused one) pairs."""
    leaves = [x for x in dict.fromkeys(m.leaves)
              if not isinstance(x, Constant) and x.dtype.startswith(("float", "bfloat"))]
    if not leaves:
        return []
    g = out.type()
    try:
        rebuilt = _T.grad(None, leaves, known_grads={out: g}, disconnected_inputs="ignore",
                        return_disconnected="None", add_names=False)
    except Exception:   # an op of the subgraph without a gradient: no backward to fuse
        return []
    by_op: dict[type, list[Apply]] = {}
    for n in fgraph.apply_nodes:
        by_op.setdefault(type(n.op), []).append(n)
    uni = _Unifier(g, fgraph.variables)
    found = []
    for leaf, r in zip(leaves, rebuilt):
        if r is None:
            continue
        f = uni.find(r, fgraph, by_op)
        if f is not None:
            found.append((leaf, f))
    if not found or uni.bound is None:
        return []
    new = _T.grad(None, [leaf for leaf, _ in found], known_grads={fused: uni.bound},
                disconnected_inputs="ignore", return_disconnected="zero", add_names=False)
    pairs = []
    for (leaf, old), n in zip(found, new):
        if n.type != old.type:
            n = old.type.convert_variable(n) if hasattr(old.type, "convert_variable") else None
            if n is None:
                return []
        pairs.append((old, n))
    return pairs


def _rewrite(fgraph: FunctionGraph, node: Apply) -> list | None:
    m = match_attention(node)
    if m is None:
        return None
    fused = _fused(m)
    if fused is None:
        return None
    out = node.outputs[0]
    if fused.type != out.type:
        fused = out.type.convert_variable(fused)
        if fused is None:
            return None
    copy_stack_trace(out, fused, fgraph)
    pairs = _gradient_pairs(fgraph, out, m, fused)
    return [(out, fused)] + pairs


def fuse_attention(fgraph: FunctionGraph) -> int:
    """Replace every recognised attention (and its gradient) by the fused ops; returns how
    many attentions were fused."""
    return sweep(fgraph, _rewrite, "fuse_attention")


optdb.register("fuse_attention", fuse_attention, 0.5, "fast_run", "attention")
