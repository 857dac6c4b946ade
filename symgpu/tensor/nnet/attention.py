"""Fused attention: ``softmax(q k^T * scale + mask) v`` as one op, forward and backward.

    o = scaled_dot_product_attention(q, k, v, is_causal=True)      # (batch, heads, seq, dim)

Why an op of its own: written out, attention materialises the (seq x seq) score and
probability matrices per head (1024 x 1024 x 96 heads of a GPT block: 400 MB in float32) and
reads them three more times for the gradient. `Attention` computes each query row's softmax
online (FlashAttention), saves only the row's log-sum-exp (its second output, ``lse``), and
`AttentionGrad` recomputes the probabilities from it. The rewrite in
``tensor/rewriting/attention.py`` turns the spellings users write into these ops; the GPU
backend runs them as one kernel each (``gpu/ops/attention.py``).

Semantics (the host ops', which the GPU kernels match):
- q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv): the same leading (batch/head) dims, no
  broadcasting between them; 3-d (batch*heads, seq, dim) and 4-d (batch, heads, seq, dim).
- ``scale`` multiplies the scores; None means 1/sqrt(D), D read when the op runs.
- ``mask`` (optional) is *added* to the scores: a float tensor broadcasting against
  (..., Sq, Sk) (-inf or a large negative number masks). Boolean masks are turned into
  additive ones by `scaled_dot_product_attention`.
- ``causal``: key j is masked for query i where j > i (top-left aligned, like PyTorch's
  ``is_causal`` and ``tril(ones(Sq, Sk))``).
- A row whose keys are all masked with -inf gives zeros (and lse = -inf), not NaN.
- float16/bfloat16 inputs are computed in float32 (scores, softmax and both products
  accumulate in float32); the outputs are rounded once.
- ``dropout`` (optional, a `Dropout`): the probabilities that multiply v are dropped where
  the uniform draw of the generator state (the op's last input) is not below ``keep``, and
  the kept ones divided by ``div``: ``p * binomial(size=p.shape, p=keep) / div`` with the
  same draw, element for element (tensor/random/philox.py's layout over the scores' shape),
  so the fused op drops exactly what the written-out graph drops. lse is the undropped rows'.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.extra_funcs import tri
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.nnet.attention_written import mask_grad
from symgpu.tensor.random import philox
from symgpu.tensor.random.ops import PhiloxSample, check_state
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Attention", "AttentionGrad", "Dropout", "scaled_dot_product_attention",
           "attention_reference", "check_shapes", "dropout_draw", "dropout_kept"]

_HALF = ("float16", "bfloat16")


def _acc_dtype(dtype: str) -> str:
    """float64 stays float64; everything narrower accumulates in float32."""
    return "float64" if dtype == "float64" else "float32"


def _check_inputs(op: Op, q: Variable, k: Variable, v: Variable, mask: Variable | None) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x.type, TensorType) or not is_float(x.dtype):
            raise TypeError(f"{op}: {name} must be a float tensor, got {x} ({x.type})")
        if x.ndim < 2:
            raise TypeError(f"{op}: {name} needs (..., seq, dim) dimensions, got {x.type}")
    if not (q.ndim == k.ndim == v.ndim):
        raise TypeError(f"{op}: q, k and v need the same number of dimensions, got {q.type}, "
                        f"{k.type} and {v.type}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{op}: q, k and v need one dtype, got {q.dtype}, {k.dtype} and "
                        f"{v.dtype}")
    if mask is not None:
        if not isinstance(mask.type, TensorType) or not is_float(mask.dtype) or \
                mask.ndim > q.ndim:
            raise TypeError(f"{op}: the mask must be a float tensor (added to the scores) of "
                            f"at most {q.ndim} dimensions, got {mask} ({mask.type})")


def check_shapes(op: Op, q: Any, k: Any, v: Any, mask: Any) -> None:
    """q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv) with one set of leading dims, and a mask
    broadcasting against the scores (..., Sq, Sk): a ValueError naming `op` and the shapes."""
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead or k.shape[-1] != q.shape[-1] or \
            k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{op}: q {q.shape}, k {k.shape} and v {v.shape} do not fit "
                         "(q (..., Sq, D), k (..., Sk, D), v (..., Sk, Dv), same leading dims)")
    if mask is not None:
        try:
            np.broadcast_shapes(mask.shape, lead + (q.shape[-2], k.shape[-2]))
        except ValueError:
            raise ValueError(f"{op}: a mask of shape {mask.shape} does not broadcast against "
                             f"the scores {lead + (q.shape[-2], k.shape[-2])}") from None


class Dropout(NamedTuple):
    """Dropout on the probabilities: a score's probability is kept where the uniform of its
    element (a draw of the scores' shape, in ``draw``'s float type) is below ``keep``, and
    divided by ``div`` (``1 - p`` for a drop rate p)."""
    keep: float
    div: float
    draw: str


def dropout_kept(state: np.ndarray, shape: tuple, dropout: Dropout) -> np.ndarray:
    """Which elements of scores of `shape` the draw of generator `state` keeps (bool): the
    uniform that `binomial(size=shape, p=keep)` compares, element for element."""
    u = philox.sample(np.asarray(state, np.uint32), "uniform", dropout.draw, tuple(shape))
    return u < np.asarray(dropout.keep, dtype=u.dtype)


def _scale_value(scale: float | None, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _scores(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None, scale: float,
            causal: bool, acc: str) -> np.ndarray:
    """scale * q k^T + mask, causal positions -inf, in the accumulation dtype."""
    s = np.matmul(q.astype(acc), np.swapaxes(k.astype(acc), -1, -2)) * np.asarray(scale, acc)
    if mask is not None:
        s = s + mask.astype(acc)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tri(sq, sk, dtype=bool), s, np.asarray(-np.inf, acc))
    return s


def _dropped(p: np.ndarray, kept: np.ndarray | None, div: float) -> np.ndarray:
    """p with the dropped elements zero and the kept ones divided by div (as the written-out
    ``p * kept / div`` computes them)."""
    if kept is None:
        return p
    return np.where(kept, p / np.asarray(div, p.dtype), np.asarray(0, p.dtype))


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        mask: np.ndarray | None = None, scale: float | None = None,
                        causal: bool = False, kept: np.ndarray | None = None,
                        div: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) of the attention in NumPy, the semantics above (tests and the host op);
    `kept` (bool, the scores' shape): dropout's kept elements, divided by `div`."""
    acc = _acc_dtype(q.dtype.name)
    s = _scores(q, k, mask, _scale_value(scale, q.shape[-1]), causal, acc)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else \
            np.full(s.shape[:-1] + (1,), -np.inf, acc)
        m_safe = np.where(np.isfinite(m), m, 0).astype(acc)
        e = np.exp(s - m_safe)
        l = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(l > 0, l, 1)
        lse = np.where(l > 0, m_safe + np.log(l), -np.inf)[..., 0].astype(acc)
    o = np.matmul(_dropped(p, kept, div), v.astype(acc))
    return o.astype(q.dtype), lse


class Attention(Op):
    """softmax(scale * q k^T + mask, causal) v and the rows' log-sum-exp (the module's
    semantics); calling it returns o (``default_output = 0``), ``outputs[1]`` is lse (float32,
    float64 for float64 inputs), saved for the gradient."""

    __props__ = ("causal", "scale", "has_mask", "dropout")
    default_output = 0

    def __init__(self, causal: bool = False, scale: float | None = None,
                 has_mask: bool = False, dropout: Dropout | None = None) -> None:
        self.causal = bool(causal)
        self.scale = None if scale is None else float(scale)
        self.has_mask = bool(has_mask)
        self.dropout = as_dropout(dropout)

    def __str__(self) -> str:
        parts = ["causal"] if self.causal else []
        parts.append("scale=1/sqrt(d)" if self.scale is None else f"scale={self.scale:.6g}")
        if self.has_mask:
            parts.append("mask")
        if self.dropout is not None:
            parts.append(f"keep={self.dropout.keep:.6g}")
        return f"{type(self).__name__}{{{','.join(parts)}}}"

    def make_node(self, q: Any, k: Any, v: Any, *extra: Any) -> Apply:
        """q, k, v, then the mask (has_mask) and the generator state (dropout)."""
        q, k, v = (as_tensor_variable(x) for x in (q, k, v))
        mask, state = _extra_inputs(self, extra)
        _check_inputs(self, q, k, v, mask)
        lead = tuple(a and b and c for a, b, c in zip(q.broadcastable[:-2], k.broadcastable[:-2],
                                                      v.broadcastable[:-2]))
        o = TensorType(q.dtype, lead + (q.broadcastable[-2], v.broadcastable[-1]))()
        lse = TensorType(_acc_dtype(q.dtype), lead + (q.broadcastable[-2],))()
        ins = [q, k, v] + [x for x in (mask, state) if x is not None]
        return Apply(self, ins, [o, lse])

    def perform(self, node, inputs, out):
        q, k, v = inputs[:3]
        mask = inputs[3] if self.has_mask else None
        check_shapes(self, q, k, v, mask)
        kept = _kept(self, inputs, q, k)
        o, lse = attention_reference(q, k, v, mask, self.scale, self.causal, kept,
                                     self.dropout.div if kept is not None else 1.0)
        out[0][0] = o.astype(node.outputs[0].dtype)
        out[1][0] = lse.astype(node.outputs[1].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        qs, _, vs = input_shapes[:3]
        return [tuple(qs[:-1]) + (vs[-1],), tuple(qs[:-1])]

    def connection_pattern(self, node):
        n = 3 + self.has_mask
        return [[i < n, i < n] for i in range(len(node.inputs))]

    def L_op(self, inputs, outputs, output_grads):
        """One AttentionGrad node for dq, dk, dv (it recomputes the probabilities from lse,
        and the dropout from the same state); a mask's gradient (rarely wanted: a learned
        bias) as a graph of ordinary ops."""
        o, lse = outputs
        go, glse = output_grads
        has_dlse = not _is_zero(glse)
        grad_op = AttentionGrad(self.causal, self.scale, self.has_mask, has_dlse, self.dropout)
        extra = [glse] if has_dlse else []
        dq, dk, dv = grad_op(*inputs, o, lse, go, *extra)
        grads = [dq, dk, dv]
        if self.has_mask:
            grads.append(mask_grad(self, inputs, o, lse, go, glse if has_dlse else None))
        if self.dropout is not None:
            grads.append(None)          # the generator state: no gradient
        return grads


#: the draw dtypes of a dropout (philox.py's uniform draws), in the order of attention.cu's
#: AT_DRAW_* codes (1, 2, ...)
DROPOUT_DRAWS = ("float32", "float64", "float16", "bfloat16")


def as_dropout(dropout: Any) -> Dropout | None:
    """A (keep, div, draw) triple as a checked `Dropout` (None stays None): the ops' props
    compare and hash by it."""
    if dropout is None:
        return None
    keep, div, draw = dropout
    if not 0.0 < float(keep) <= 1.0 or float(div) == 0.0 or str(draw) not in DROPOUT_DRAWS:
        raise ValueError(f"attention dropout: keep must be in (0, 1], div non-zero and the "
                         f"draw one of {', '.join(DROPOUT_DRAWS)}; got {dropout}")
    return Dropout(float(keep), float(div), str(draw))


def _extra_inputs(op: Any, extra: Sequence[Any]) -> tuple[Any, Any]:
    """(mask, state) from the inputs after q, k, v, as the op's flags say (None where absent)."""
    dropout = op.dropout
    want = op.has_mask + (dropout is not None)
    if len(extra) != want:
        raise TypeError(f"{op} takes q, k, v{', a mask' if op.has_mask else ''}"
                        f"{', the generator state' if dropout is not None else ''}: got "
                        f"{3 + len(extra)} inputs")
    mask = as_tensor_variable(extra[0]) if op.has_mask else None
    state = None
    if dropout is not None:
        state = check_state(extra[-1], str(op))
    return mask, state


def _kept(op: Any, inputs: Sequence[Any], q: np.ndarray, k: np.ndarray) -> np.ndarray | None:
    """The dropout's kept elements of the scores (None without dropout): the state is the
    input after q, k, v and the mask."""
    if op.dropout is None:
        return None
    state = inputs[3 + op.has_mask]
    return dropout_kept(state, q.shape[:-1] + (k.shape[-2],), op.dropout)


def _is_zero(g: Variable) -> bool:
    """Whether a gradient is known to be all zeros (T.grad's filler for an unused output)."""
    while True:
        if isinstance(g, Constant):
            return bool(np.all(np.asarray(g.data) == 0))
        node = g.owner
        if node is None:
            return False
        if isinstance(node.op, DimShuffle):
            g = node.inputs[0]
        elif isinstance(node.op, Elemwise) and getattr(node.op.scalar_op, "name", "") == "second":
            g = node.inputs[1]     # zeros_like(x) is second(x, 0)
        else:
            return False


def grad_inputs(op: Any, inputs: Sequence[Any]) -> tuple:
    """(q, k, v, mask, o, lse, dO, dlse) of an attention gradient's inputs (host or GPU op):
    mask and dlse None where ``op`` has none (a dropout's state, after the mask: `_kept`)."""
    n = 3 + op.has_mask + (op.dropout is not None)
    o, lse, do = inputs[n:n + 3]
    return (*inputs[:3], inputs[3] if op.has_mask else None, o, lse, do,
            inputs[n + 3] if op.has_dlse else None)


class AttentionGrad(Op):
    """(dq, dk, dv) of `Attention` from its inputs, o, lse and dO (and, ``has_dlse``, the
    gradient of lse): P is recomputed from lse, Delta = rowsum(dO o) - dlse,
    dS = P (dO v^T - Delta), dq = scale dS k, dk = scale dS^T q, dv = P^T dO (FlashAttention-2's
    backward)."""

    __props__ = ("causal", "scale", "has_mask", "has_dlse", "dropout")

    def __init__(self, causal: bool = False, scale: float | None = None,
                 has_mask: bool = False, has_dlse: bool = False,
                 dropout: Dropout | None = None) -> None:
        self.causal = bool(causal)
        self.scale = None if scale is None else float(scale)
        self.has_mask, self.has_dlse = bool(has_mask), bool(has_dlse)
        self.dropout = as_dropout(dropout)

    __str__ = Attention.__str__

    def make_node(self, *inputs: Any) -> Apply:
        n = 3 + self.has_mask + (self.dropout is not None)
        want = n + 3 + self.has_dlse
        if len(inputs) != want:
            raise TypeError(f"{self} takes {want} inputs (q, k, v{', mask' if self.has_mask else ''}"
                            f"{', state' if self.dropout is not None else ''}"
                            f", o, lse, do{', dlse' if self.has_dlse else ''}), got {len(inputs)}")
        q, k, v = (as_tensor_variable(x) for x in inputs[:3])
        mask, state = _extra_inputs(self, inputs[3:n])
        _check_inputs(self, q, k, v, mask)
        o, lse, do = (as_tensor_variable(x) for x in inputs[n:n + 3])
        ins = [q, k, v] + [x for x in (mask, state) if x is not None] + [o, lse, do] + \
            [as_tensor_variable(x) for x in inputs[n + 3:]]
        if o.ndim != q.ndim or do.ndim != q.ndim or lse.ndim != q.ndim - 1:
            raise TypeError(f"{self}: o {o.type}, lse {lse.type} and do {do.type} do not "
                            f"fit q {q.type}")
        return Apply(self, ins, [q.type(), k.type(), v.type()])

    def perform(self, node, inputs, out):
        q, k, v, mask, o, lse, do, dlse = grad_inputs(self, inputs)
        check_shapes(self, q, k, v, mask)
        kept = _kept(self, inputs, q, k)
        dq, dk, dv = attention_grad_reference(q, k, v, mask, o, lse, do, dlse, self.scale,
                                              self.causal, kept,
                                              self.dropout.div if kept is not None else 1.0)
        for cell, g, var in zip(out, (dq, dk, dv), node.outputs):
            cell[0] = g.astype(var.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(s) for s in input_shapes[:3]]


def attention_grad_reference(q, k, v, mask, o, lse, do, dlse=None, scale=None, causal=False,
                             kept=None, div=1.0):
    """(dq, dk, dv) in NumPy (AttentionGrad's semantics), in the accumulation dtype; under
    dropout (`kept`, `div`) dv takes the dropped probabilities and dP the kept elements'
    divided by div (Delta = rowsum(dO o) holds as it is)."""
    acc = _acc_dtype(q.dtype.name)
    sc = _scale_value(scale, q.shape[-1])
    s = _scores(q, k, mask, sc, causal, acc)
    lse_e = np.asarray(lse, acc)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(np.isinf(lse_e), 0, np.exp(s - np.where(np.isinf(lse_e), 0, lse_e)))
    p = p.astype(acc)
    dof = do.astype(acc)
    dv = np.matmul(np.swapaxes(_dropped(p, kept, div), -1, -2), dof)
    dp = _dropped(np.matmul(dof, np.swapaxes(v.astype(acc), -1, -2)), kept, div)
    delta = np.sum(dof * o.astype(acc), axis=-1, keepdims=True)
    if dlse is not None:
        delta = delta - np.asarray(dlse, acc)[..., None]
    ds = p * (dp - delta)
    dq = np.matmul(ds, k.astype(acc)) * np.asarray(sc, acc)
    dk = np.matmul(np.swapaxes(ds, -1, -2), q.astype(acc)) * np.asarray(sc, acc)
    return dq, dk, dv


# ----------------------------------------------------------------------------- the function

def _additive_mask(mask: TensorVariable, dtype: str) -> TensorVariable:
    """A boolean mask (True = take part, PyTorch's convention) as 0 / -inf; a float mask cast."""
    if mask.dtype == "bool":
        return _m.switch(mask, _b.constant(0.0, dtype=dtype), _b.constant(-np.inf, dtype=dtype))
    return mask if mask.dtype == dtype else _m.cast(mask, dtype)


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, rng: Any = None) -> TensorVariable:
    """softmax(query key^T * scale + attn_mask) value, PyTorch's
    ``torch.nn.functional.scaled_dot_product_attention`` signature and (batch, heads, seq,
    dim) layout (3-d (batch*heads, seq, dim) too; JAX's ``dot_product_attention`` takes
    (batch, seq, heads, dim) instead). ``attn_mask``: boolean (True = attend) or float
    (added); ``scale`` None = 1/sqrt(dim); ``is_causal``: query i sees keys j <= i.

    This is one `Attention` node (one fused kernel on the GPU, and one for its gradient).
    ``dropout_p > 0`` drops probabilities with ``rng`` (a RandomStreams or MRG_RandomStreams)
    and scales the kept ones by 1/(1 - p): the op takes the generator state of a binomial
    draw of the scores' shape and drops what ``p * draw / (1 - p)`` would (the draw itself
    is never made; the state advances past it)."""
    q, k, v = (as_tensor_variable(x) for x in (query, key, value))
    if q.ndim not in (3, 4):
        raise ValueError(f"scaled_dot_product_attention: query must be (batch, heads, seq, "
                         f"dim) or (batch*heads, seq, dim), got {q.type}")
    mask = None if attn_mask is None else _additive_mask(as_tensor_variable(attn_mask),
                                                         _acc_dtype(q.dtype))
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got "
                         f"{dropout_p}")
    if dropout_p == 0.0:
        op = Attention(bool(is_causal), scale, mask is not None)
        return op(q, k, v, *([mask] if mask is not None else []))
    if rng is None:
        raise ValueError("scaled_dot_product_attention: dropout_p > 0 needs rng (a "
                         "RandomStreams) to draw the dropout mask from")
    keep = 1.0 - float(dropout_p)
    size = [shape_i(q, i) for i in range(q.ndim - 1)] + [shape_i(k, k.ndim - 2)]  # scores
    drawn = dropout_draw(rng.binomial(size=size, n=1, p=keep, dtype=_acc_dtype(q.dtype)))
    if drawn is None:
        raise TypeError(f"scaled_dot_product_attention: rng must be a RandomStreams (whose "
                        f"binomial is a Philox draw), got {type(rng).__name__}")
    state, keep_in_draw, draw = drawn
    op = Attention(bool(is_causal), scale, mask is not None, Dropout(keep_in_draw, keep, draw))
    return op(q, k, v, *([mask] if mask is not None else []), state)


def dropout_draw(kept: Variable) -> tuple[Variable, float, str] | None:
    """(generator state, keep, draw dtype) when `kept` is a dropout's keep-mask, uniform <
    keep (a bool, or cast to a number: ``binomial(n=1)``) of one Philox draw: what the fused
    op takes in its place (the draw's own node is then unused; the state's update stays)."""
    node = kept.owner
    if node is not None and isinstance(node.op, Elemwise) and \
            str(getattr(node.op.scalar_op, "name", "")).startswith("cast_") and \
            node.inputs[0].dtype == "bool":
        kept = node.inputs[0]
        node = kept.owner
    if node is None or not isinstance(node.op, Elemwise) or \
            getattr(node.op.scalar_op, "name", "") != "lt" or kept.dtype != "bool":
        return None
    u, thr = node.inputs
    try:
        keep = float(get_scalar_constant_value(thr))
    except NotScalarConstantError:
        return None
    draw = u.owner
    if not 0.0 < keep <= 1.0 or draw is None or \
            not isinstance(draw.op, PhiloxSample) or draw.op.dist != "uniform":
        return None
    return draw.inputs[0], keep, draw.op.dtype
