"""Theano's `theano.tensor.nnet.ctc`: the connectionist temporal classification (CTC) loss.

`ctc(activations, labels, input_lengths)` is the negative log-likelihood of each batch
element's label sequence under every alignment of it to the element's first
`input_lengths[b]` time steps, blank = symbol 0:

- activations: (time, batch, alphabet) float32/float64, *un-normalised* (a softmax over the
  alphabet is applied inside, as warp-ctc and Theano do);
- labels: (batch, max_label_length) int32; negative entries are padding and are skipped
  wherever they are (Theano's wrapper keeps the entries >= 0 of each row, in order); a label
  must lie in [1, alphabet) -- the blank (0) or a symbol outside the alphabet is an error;
- input_lengths: (batch,) int32 in [0, time].

The op computes the gradient with respect to the activations in the same forward-backward
pass (Theano's second output; the canonicalize rewrite `local_ctc_no_grad` drops it where
nothing reads it): ``softmax(x) - occupancy``, zero at time steps past an element's length.
Where no alignment exists (a label sequence longer than its input allows, repeats counting a
blank between them) the cost is +inf and that element's gradient is zero (warp-ctc returned 0
there; +inf is the likelihood's true value and what PyTorch and cuDNN give). The gradient
output itself is not differentiated again: second derivatives of the loss are not provided
(as in Theano).

Why NumPy, not warp-ctc: the recursion runs in log space over the whole batch and every
position of the blank-extended label sequence at once, one vectorised step per time step,
in float64, so no library is needed and ``ctc_available()`` is always true.  On a GPU the
op is replaced by symgpu/gpu/ops/ctc.py's cuDNN version where cuDNN's limits allow.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["ConnectionistTemporalClassification", "ctc", "ctc_available", "ctc_present",
           "check_ctc_inputs", "check_ctc_types",
           "ctc_cost_and_grad", "local_ctc_no_grad", "CTC_DTYPES"]

#: the activations' dtypes (Theano's op took float32 only)
CTC_DTYPES = ("float32", "float64")
_NEG_INF = -np.inf


def ctc_present() -> bool:
    """Theano asked whether warp-ctc could be linked; here the loss is NumPy's: always True."""
    return True


def ctc_available() -> bool:
    """Whether the CTC op can be built: always True here (no external library is needed)."""
    return True


ctc_available.msg = None    # type: ignore[attr-defined]  # Theano's attributes, kept
ctc_available.path = None   # type: ignore[attr-defined]
ctc_present.msg = None      # type: ignore[attr-defined]
ctc_present.path = None     # type: ignore[attr-defined]


def check_ctc_inputs(what: str, acts_shape: tuple, labels: np.ndarray,
                     input_lengths: np.ndarray) -> None:
    """Raise ValueError naming `what`, the shapes and the offending value where the run-time
    values do not fit: batch sizes, lengths in [0, time], labels in [1, alphabet)."""
    t, b, a = acts_shape
    if labels.shape[0] != b or input_lengths.shape[0] != b:
        raise ValueError(f"{what}: activations of shape {acts_shape} (time, batch, alphabet) "
                         f"need {b} rows of labels and {b} input lengths, got labels of shape "
                         f"{labels.shape} and input_lengths of shape {input_lengths.shape}")
    if a < 1:
        raise ValueError(f"{what}: the alphabet (last axis of activations, shape "
                         f"{acts_shape}) must hold at least the blank symbol 0")
    bad = (input_lengths < 0) | (input_lengths > t)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}: input_lengths must lie in [0, {t}] (the time axis of "
                         f"activations of shape {acts_shape}); input_lengths[{i}] = "
                         f"{int(input_lengths[i])}")
    bad = (labels == 0) | (labels >= a)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{what}: labels must lie in [1, {a}) (0 is the blank; negative "
                         f"entries are padding) for activations of shape {acts_shape}; "
                         f"labels[{i}, {j}] = {int(labels[i, j])}")


def _extended(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ext (B, S): blank-interleaved compacted labels, lens (B,), skip (B, S): may position s
    be reached from s - 2 (a label different from the previous one))."""
    valid = labels >= 0
    lens = valid.sum(axis=1).astype(np.int64)
    width = int(lens.max()) if lens.size else 0
    order = np.argsort(~valid, axis=1, kind="stable")      # the kept entries first, in order
    compact = np.take_along_axis(labels, order, axis=1)[:, :width].astype(np.int64)
    compact[np.arange(width)[None, :] >= lens[:, None]] = 0
    ext = np.zeros((labels.shape[0], 2 * width + 1), np.int64)
    ext[:, 1::2] = compact
    skip = np.zeros(ext.shape, bool)
    skip[:, 3::2] = compact[:, 1:] != compact[:, :-1]
    return ext, lens, skip


def ctc_cost_and_grad(acts: np.ndarray, labels: np.ndarray, input_lengths: np.ndarray,
                      compute_grad: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(costs (B,), gradient wrt acts (T, B, A) or None), in acts' dtype, computed in float64
    (inputs assumed checked: `check_ctc_inputs`)."""
    t_max, nb, na = acts.shape
    x = acts.astype(np.float64)
    x = x - (x.max(axis=2, keepdims=True) if x.size else 0.0)
    logp = x - np.log(np.exp(x).sum(axis=2, keepdims=True))             # (T, B, A)
    ext, lens, skip = _extended(labels)
    ns = ext.shape[1]
    tl = input_lengths.astype(np.int64)
    active = np.arange(ns)[None, :] < (2 * lens + 1)[:, None]             # (B, S)
    lp = logp[:, np.arange(nb)[:, None], ext]                             # (T, B, S)
    lp = np.where(active[None], lp, _NEG_INF)
    alpha = np.full((t_max, nb, ns), _NEG_INF)
    with np.errstate(invalid="ignore"):
        if t_max:
            alpha[0, :, :2] = lp[0, :, :2]
        for t in range(1, t_max):
            prev = alpha[t - 1]
            a = prev.copy()
            a[:, 1:] = np.logaddexp(a[:, 1:], prev[:, :-1])
            a[:, 2:] = np.where(skip[:, 2:], np.logaddexp(a[:, 2:], prev[:, :-2]), a[:, 2:])
            alpha[t] = a + lp[t]
        last = np.maximum(tl - 1, 0)
        rows = np.arange(nb)
        ll = np.where(lens == 0, 0.0, _NEG_INF)                           # no input
        if t_max:
            end = alpha[last, rows]                                       # (B, S)
            ends = np.logaddexp(end[rows, 2 * lens], np.where(
                lens > 0, end[rows, np.maximum(2 * lens - 1, 0)], _NEG_INF))
            ll = np.where(tl > 0, ends, ll)
    feasible = np.isfinite(ll)
    costs = np.where(feasible, 0.0 - ll, np.inf).astype(acts.dtype)   # 0, not -0
    if not compute_grad:
        return costs, None
    grad = np.exp(logp)
    if t_max and nb:
        init = np.full((nb, ns), _NEG_INF)
        lp_end = lp[last, rows]
        for s in (2 * lens, np.maximum(2 * lens - 1, 0)):
            init[rows, s] = lp_end[rows, s]
        beta = np.full((t_max, nb, ns), _NEG_INF)
        nxt = np.full((nb, ns), _NEG_INF)
        with np.errstate(invalid="ignore"):
            for t in range(t_max - 1, -1, -1):
                r = nxt.copy()
                r[:, :-1] = np.logaddexp(r[:, :-1], nxt[:, 1:])
                r[:, :-2] = np.where(skip[:, 2:], np.logaddexp(r[:, :-2], nxt[:, 2:]), r[:, :-2])
                r = r + lp[t]
                cur = np.where((t == tl - 1)[:, None], init,
                               np.where((t < tl - 1)[:, None], r, _NEG_INF))
                beta[t] = cur
                nxt = cur
            both = alpha + beta
            log_occ = np.where(both > _NEG_INF, both - lp - np.where(feasible, ll, 0.0)[None, :, None],
                               _NEG_INF)
        occ = np.exp(log_occ)                                             # (T, B, S)
        onehot = (ext[:, :, None] == np.arange(na)[None, None, :]).astype(np.float64)
        grad -= np.einsum("tbs,bsa->tba", occ, onehot)
        keep = (np.arange(t_max)[:, None] < tl[None, :]) & feasible[None, :]
        grad *= keep[:, :, None]
    return costs, grad.astype(acts.dtype)


class ConnectionistTemporalClassification(Op):
    """The CTC loss (see the module's docstring): outputs the costs (batch,) and, with
    `compute_grad`, the gradient wrt the activations (time, batch, alphabet); calling the op
    returns the costs (`default_output = 0`). `openmp` is accepted for Theano's signature."""

    __props__ = ("compute_grad",)
    default_output = 0

    def __init__(self, compute_grad: bool = True, openmp: Any = None) -> None:
        self.compute_grad = bool(compute_grad)

    def make_node(self, activations: Any, labels: Any, input_lengths: Any) -> Apply:
        acts = as_tensor_variable(activations)
        labels = as_tensor_variable(labels)
        lengths = as_tensor_variable(input_lengths)
        check_ctc_types(self, acts, labels, lengths)
        outs = [TensorType(acts.dtype, (acts.broadcastable[1],))(name="ctc_cost")]
        if self.compute_grad:
            outs.append(TensorType(acts.dtype, acts.broadcastable)(name="ctc_grad"))
        return Apply(self, [acts, labels, lengths], outs)

    def perform(self, node: Apply, inputs: list, output_storage: list) -> None:
        acts, labels, lengths = inputs
        check_ctc_inputs(str(self), acts.shape, labels, lengths)
        costs, grad = ctc_cost_and_grad(acts, labels, lengths, self.compute_grad)
        output_storage[0][0] = costs
        if self.compute_grad:
            output_storage[1][0] = grad

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list[tuple]:
        t, b, a = input_shapes[0]
        return [(b,)] + ([(t, b, a)] if self.compute_grad else [])

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        n = len(node.outputs)
        return [[True] * n, [False] * n, [False] * n]

    def L_op(self, inputs: list, outputs: list, output_grads: list) -> list:
        """d cost / d activations = the stored gradient scaled by each element's output
        gradient; none flows to the integer labels and lengths."""
        gradients = (outputs[1] if len(outputs) > 1 else
                     ConnectionistTemporalClassification(True).make_node(*inputs).outputs[1])
        g = output_grads[0]
        return [gradients * g.dimshuffle("x", 0, "x"), None, None]


def check_ctc_types(op: Any, acts: TensorVariable, labels: TensorVariable,
                    lengths: TensorVariable) -> None:
    """The symbolic checks both CTC ops make (TypeError naming the input and its type)."""
    if acts.ndim != 3 or acts.dtype not in CTC_DTYPES:
        raise TypeError(f"{op}: activations must be a 3-d float32/float64 tensor (time, "
                        f"batch, alphabet), got {acts.type}")
    if labels.ndim != 2 or labels.dtype != "int32":
        raise TypeError(f"{op}: labels must be an int32 matrix (batch, max_label_length), "
                        f"padded with negative values, got {labels.type}")
    if lengths.ndim != 1 or lengths.dtype != "int32":
        raise TypeError(f"{op}: input_lengths must be an int32 vector (batch,), got "
                        f"{lengths.type}")


def ctc(activations: Any, labels: Any, input_lengths: Any) -> TensorVariable:
    """The CTC loss of each batch element (time, batch, alphabet activations, un-normalised;
    labels padded with negative values; blank = 0); see the module's docstring."""
    return ConnectionistTemporalClassification()(activations, labels, input_lengths)


@register_canonicalize("fast_compile", "fast_run")
@node_rewriter([ConnectionistTemporalClassification])
def local_ctc_no_grad(fgraph: Any, node: Apply) -> Any:
    """A CTC node whose gradient output nobody reads -> one that does not compute it."""
    if len(node.outputs) > 1 and not fgraph.clients.get(node.outputs[1]):
        return [ConnectionistTemporalClassification(False)(*node.inputs), None]
    return None
