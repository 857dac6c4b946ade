"""Sums accumulated by a loop, computed after it: `scan_pushout_acc`.

Why: back-propagation through time accumulates each weight's gradient in a state that keeps
only its last value, ``gW <- gW + dot(x[t].T, g[t])`` and ``gb <- gb + sum(g[t], axis=0)``.
Step by step that is a small matrix product (and a reduction) per step and per weight; on the
GPU, a launch each.  The sum over the steps is one product over all of them:
``sum_t x[t].T @ g[t] = X.T @ G`` with X and G the steps stacked along the batch axis.  So the
loop returns the per-step factors instead (``g[t]`` as a per-step output, the sequences as they
are) and the sums are computed after it, as one GEMM and one reduction: the BPTT step keeps
only its recurrent work (the elementwise gradient and the product with W_h.T).

The rewrite applies to a for-loop's state that
* keeps only its last value (``keep`` False) with the one tap ``-1``;
* is read in the body only by ``acc + term`` (either order), which is the state's next value;
* has ``term`` = ``dot(P.T, B)`` (P, B matrices) or ``sum(B, axis=0)`` (dimshuffled to the
  accumulator's broadcastable pattern), where P and B change from step to step (a sequence's
  step, or computed in the body from per-step values).
Its outer result (the one-value window) becomes ``(init[0] + total)[None]``.  Other states,
while loops and loops with `truncate_gradient` are left alone.
"""
from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Any

import numpy as np

import symgpu.tensor as T
from symgpu.graph.basic import Constant, Variable, io_toposort
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.inner import variant_set
from symgpu.scan.op import Scan
from symgpu.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from symgpu.tensor.math import Dot
from symgpu.tensor.subtensor import Subtensor

__all__ = ["scan_pushout_acc"]


def _transposed(v: Variable) -> Variable | None:
    """P when `v` is ``P.T`` of a matrix P; None otherwise."""
    if v.owner is not None and isinstance(v.owner.op, DimShuffle) and \
            v.owner.op.new_order == (1, 0):
        return v.owner.inputs[0]
    return None


def _is_add(node: Any) -> bool:
    return isinstance(node.op, Elemwise) and getattr(node.op.scalar_op, "name", "") == "add" \
        and len(node.inputs) == 2


def _term(term: Variable, acc: Variable) -> tuple | None:
    """('dot', P, B) or ('sum', B) for the supported shapes of `term`; None otherwise."""
    node = term.owner
    if node is None:
        return None
    if isinstance(node.op, Dot):
        a, b = node.inputs
        p = _transposed(a)
        if p is not None and p.ndim == 2 and b.ndim == 2 and acc.ndim == 2:
            return ("dot", p, b)
        return None
    red = term
    if isinstance(node.op, DimShuffle):
        if tuple(x for x in node.op.new_order if x != "x") != tuple(range(node.inputs[0].ndim)):
            return None
        red = node.inputs[0]
    rn = red.owner
    if rn is not None and isinstance(rn.op, CAReduce) and \
            getattr(rn.op.scalar_op, "name", "") == "add" and rn.op.axis == (0,) and \
            rn.inputs[0].ndim == 2 and red.ndim == 1 and rn.inputs[0].dtype == acc.dtype:
        return ("sum", rn.inputs[0])
    return None


def _zeros(v: Variable) -> bool:
    """Whether the graph fixes every value of `v` at zero (a zero constant, or ``second(x,
    0)`` / zeros_like, seen through dimshuffles): then the total needs no initial value."""
    while True:
        if isinstance(v, Constant):
            return bool(np.all(np.asarray(v.data) == 0))
        node = v.owner
        if node is None:
            return False
        if isinstance(node.op, DimShuffle):
            v = node.inputs[0]
        elif isinstance(node.op, Elemwise) and \
                getattr(node.op.scalar_op, "name", "") == "second" and len(node.inputs) == 2:
            v = node.inputs[1]
        else:
            return False


def _readers_of_value(fgraph: FunctionGraph, window: Variable) -> list | None:
    """The outputs of ``window[0]`` / ``window[-1]`` (the one value of a keep-last window), if
    that is how every client reads it; None otherwise."""
    out = []
    for client, _ in fgraph.clients.get(window, []):
        if client == "output" or not isinstance(client.op, Subtensor) or \
                len(client.inputs) != 1 or client.op.idx_list not in ((0,), (-1,)):
            return None
        out.append(client.outputs[0])
    return out


def _pushout(fgraph: FunctionGraph, node: Any) -> bool:
    op: Scan = node.op
    info = op.info
    if info.as_while or info.truncate_gradient != -1:
        return False
    S, M, K = info.n_seqs, info.n_states, info.n_nitsot
    inner_in, inner_out = list(op.inner_inputs), list(op.inner_outputs)
    tap_pos, pos = [], S
    for j in range(M):
        tap_pos.append(pos)
        pos += len(info.state_taps[j])
    seq_in = inner_in[:S]
    variant = variant_set(inner_out, inner_in[:S + info.n_taps])
    uses: dict[Variable, int] = {}
    for n in io_toposort(set(inner_in), inner_out):
        for v in n.inputs:
            uses[v] = uses.get(v, 0) + 1
    for o in inner_out:
        uses[o] = uses.get(o, 0) + 1
    plans: dict[int, tuple] = {}
    for j in range(M):
        if info.keep[j] or tuple(info.state_taps[j]) != (-1,):
            continue
        acc, out = inner_in[tap_pos[j]], inner_out[j]
        if uses.get(acc, 0) != 1 or out.owner is None or not _is_add(out.owner) or \
                acc not in out.owner.inputs or out.dtype != acc.dtype:
            continue
        a, b = out.owner.inputs
        term = b if a is acc else a
        if term is acc:
            continue
        plan = _term(term, acc)
        if plan is None or not all(f in variant for f in plan[1:]):
            continue
        if any(f in inner_in[S:] for f in plan[1:]):   # a state's tap: keep it simple
            continue
        if T.as_tensor_variable(term).broadcastable != acc.broadcastable:
            continue
        plans[j] = plan
    if not plans:
        return False
    # the per-step factors the loop returns: sequence steps are read outside directly
    n = node.inputs[0]
    outer_seqs = list(node.inputs[1:1 + S])
    factors: list[Variable] = []
    for plan in plans.values():
        for f in plan[1:]:
            if f not in seq_in and f not in factors:
                factors.append(f)
    keep_states = [j for j in range(M) if j not in plans]
    new_in = seq_in + [inner_in[tap_pos[j]] for j in keep_states] + inner_in[S + info.n_taps:]
    new_out = [inner_out[j] for j in keep_states] + inner_out[M:M + K] + factors
    names = info.state_names
    new_info = dc_replace(
        info, state_taps=tuple(info.state_taps[j] for j in keep_states),
        keep=tuple(info.keep[j] for j in keep_states), n_nitsot=K + len(factors),
        state_names=tuple(names[j] for j in keep_states if j < len(names)) if names else (),
        nitsot_names=tuple(info.nitsot_names) + ("",) * len(factors) if info.nitsot_names
        else ())
    inits = list(node.inputs[1 + S:1 + S + M])
    new_op = Scan(new_in, new_out, new_info, op.mode)
    outs = new_op(n, *outer_seqs, *[inits[j] for j in keep_states],
                  *node.inputs[1 + S + M:])
    outs = outs if isinstance(outs, list) else [outs]
    n_keep = len(keep_states)
    stacked = {f: outs[n_keep + K + i] for i, f in enumerate(factors)}
    for f in seq_in:
        stacked[f] = outer_seqs[seq_in.index(f)][:n]
    replace = []
    for k, j in enumerate(keep_states):
        replace.append((node.outputs[j], outs[k]))
    for i in range(K):
        replace.append((node.outputs[M + i], outs[n_keep + i]))
    for j, plan in plans.items():
        init0 = None if _zeros(inits[j]) else inits[j][0]
        old = node.outputs[j]
        dtype, bcast = old.dtype, old.broadcastable[1:]
        if plan[0] == "dot":
            p, b = stacked[plan[1]], stacked[plan[2]]
            p2 = p.reshape((p.shape[0] * p.shape[1], p.shape[2]), ndim=2)
            b2 = b.reshape((b.shape[0] * b.shape[1], b.shape[2]), ndim=2)
            total = T.dot(p2.T, b2)
        else:
            total = T.sum(stacked[plan[1]], axis=(0, 1))
            if len(bcast) == 2:
                total = T.shape_padleft(total)
        value = total.astype(dtype) if init0 is None else init0 + total.astype(dtype)
        if value.broadcastable != bcast or value.dtype != dtype:
            return False
        readers = _readers_of_value(fgraph, old)
        if readers is not None:   # window[0]: the value itself, without a window around it
            replace.extend((r, value) for r in readers)
            continue
        final = T.shape_padleft(value)
        if final.type != old.type:
            return False
        replace.append((old, final))
    for old, new in replace:
        fgraph.replace(old, new, reason="scan_pushout_acc")
    return True


def scan_pushout_acc(fgraph: FunctionGraph) -> None:
    """Apply `_pushout` to every for-loop of `fgraph`."""
    for node in list(fgraph.toposort()):
        if isinstance(node.op, Scan) and node in fgraph.apply_nodes:
            _pushout(fgraph, node)


# on by default: measured on benchmarks/rnn.py, no slower on the CPU (one large GEMM for n small
# ones), and on the GPU the BPTT step keeps 3 launches of 6
optdb.register("scan_pushout_acc", scan_pushout_acc, 4.1, "fast_run", "scan", "scan_pushout_acc")
