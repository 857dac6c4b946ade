"""`scan_to_dnn_rnn`: a loop whose step is exactly one recurrent layer (Elman, LSTM, cuDNN's
GRU; masked or not) becomes one DnnRNN node, and its gradient loop one DnnRNNGrad node
(issue 32).

Why: cuDNN's RNN API runs the whole sequence (forward, and backward through time) in a few
calls; on the GPU the host ops below are lifted to GpuDnnRNNForward/Backward
(symgpu/gpu/ops/cudnn_rnn.py). On by default where a GPU may take part
(``scan_to_dnn_rnn_where_a_gpu_runs``), anywhere with ``optimizer_including=scan_to_dnn_rnn``;
docs/loops.md has the H200 figures.

The match is structural (no names; symgpu/scan/rnn_step_match.py): the step's inner graph
must be an Elman, LSTM or GRU layer, with the pre-activations built from ``dot(x_t, W)``,
``dot(h_prev, U)`` and optional biases, each state optionally a masked update; anything else
leaves the loop as it is. The user's W (in, nG*H), U (H, nG*H) and biases become cuDNN's
flat weight vector (`rnn_layout`) through a symbolic join of transposed column blocks, so the
gradient reaches the user's variables through it.

The gradient: T.grad has already built the backward loop when the function compiles, so the
backward loops scan_grad tags with `ScanGradOf` (symgpu/scan/info.py) for the matched loop are
replaced by DnnRNNGrad of the same inputs (each of their outputs by the matching gradient);
the forward's copies that only fed them go with them.
"""
from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Any, NamedTuple

import numpy as np

import symgpu.tensor as T
from symgpu.compile.sharedvalue import SharedVariable
from symgpu.compile.speculation import SpeculationFailed, may_guard
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.gradient import DisconnectedType, grad
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.op import Scan
from symgpu.scan.rnn_step_match import RNNMatch, _is_const, match_rnn_step
from symgpu.tensor.checks import Assert
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.nnet.pad_steps import PadSteps
from symgpu.tensor.nnet.rnn import SMALL_H_LIMIT, DnnRNN
from symgpu.tensor.subtensor import IncSubtensor, Slice, Subtensor
from symgpu.tensor.rewriting.subtensor_merge import merge_reads
from symgpu.tensor.type import specify_broadcastable_as

__all__ = ["PrefixMask", "PrefixGuard", "RNNMatch", "match_rnn_step", "scan_to_dnn_rnn",
           "scan_to_dnn_rnn_where_a_gpu_runs", "set_branch_builder", "GUARD", "BUCKET"]

#: True: a masked loop in a function that can compile again (compile/speculation.py) runs
#: cuDNN behind a guard (PrefixGuard: a mask that is no prefix recompiles the function
#: without this rewrite) instead of a per-call branch between cuDNN and the loop (the
#: branch splits the step around it: 0.82 against 0.55 ms a masked LSTM step on an H200)
GUARD = True
#: where a GPU may take part, a loop whose last cell state is not read runs cuDNN over its
#: sequence padded to a bucket once the length has varied between calls (PadSteps: a
#: multiple of BUCKET steps, or of an eighth of the length's power of two where more), its
#: states read up to the true length: the step after the pad then has a few shapes, each
#: captured once, instead of one per length (1: never padded).  8: lengths 10..90 pad to 11
#: buckets, 7% more steps on average (16 with four an octave: 6 buckets, 15%; on an H200
#: the padded steps were most of what a new length every call cost over length 50)
BUCKET = 8

#: the lazy branch (symgpu.ifelse.ifelse) a masked match needs; symgpu.ifelse, a layer above
#: this one, installs it when it loads (set_branch_builder; the GPU backend loads it, the
#: one that lifts cuDNN's RNN); masked loops stay loops without it
_BRANCH: list = []


def set_branch_builder(fn: Any) -> None:
    """Install ``fn(cond, then_list, else_list, outer=variables) -> list``
    (symgpu.ifelse.ifelse): the masked rewrite's choice between cuDNN (the mask is a prefix
    per row) and the original loop; `outer`, the graph's variables, stay outside."""
    _BRANCH[:] = [fn]


# ----------------------------------------------------------------------------- the rewrite

def _flat_weights(m: RNNMatch, x: Variable) -> Variable:
    """cuDNN's flat weight vector (rnn_layout, one layer, one direction) from the user's
    W, U and biases: matrices (H, in) and (H, H) row-major per gate, then input-side
    biases, then recurrent-side biases (zeros where the user has none)."""
    H = m.hidden
    mats = [m.W[:, s:s + H].T.flatten() for s in m.x_cols] + \
        [m.U[:, s:s + H].T.flatten() for s in m.h_cols]

    def biases(terms: list, cols: tuple) -> list:
        if not terms:
            return [T.zeros((H * len(cols),), dtype=x.dtype)]
        total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        return [total[s:s + H] for s in cols]
    return T.concatenate(mats + biases(m.x_biases, m.x_cols) + biases(m.h_biases, m.h_cols))


def _fit(v: Variable, like: Variable) -> Variable:
    return specify_broadcastable_as(v, like.type)


def _only_feeding(fgraph: FunctionGraph, targets: set, keep: Any) -> set:
    """The nodes all of whose used outputs are read only by `targets` or by such nodes."""
    only = set(targets)
    for nd in reversed(fgraph.toposort()):
        if nd in only or nd is keep:
            continue
        clients = [c for o in nd.outputs for c, _ in fgraph.clients.get(o, [])]
        if clients and all(c != "output" and c in only for c in clients):
            only.add(nd)
    return only


def _last_readers(fgraph: FunctionGraph, out: Variable, skip: set) -> list | None:
    """The variables reading ``out[-1]`` or ``out[1:][-1]``, if that (or `skip`'s nodes)
    is all that reads `out`."""
    readers = []
    for c, _ in fgraph.clients.get(out, []):
        if c in skip:
            continue
        if c == "output" or type(c.op) is not Subtensor or len(c.inputs) != 1:
            return None
        if c.op.idx_list == (-1,):
            readers.append(c.outputs[0])
        elif c.op.idx_list == (Slice(1, None, None),):
            sub = _last_readers(fgraph, c.outputs[0], skip)
            if sub is None:
                return None
            readers += sub
        else:
            return None
    return readers


def _last_value(g_rev: Variable) -> Variable | None:
    """`v` when the reversed adjoint sequence `g_rev` is ``inc_subtensor(zeros[-1], v)[::-1]``
    (scan_grad's sequence for a state whose last value alone is read)."""
    node = g_rev.owner
    if node is None or type(node.op) is not Subtensor or \
            node.op.idx_list != (Slice(None, None, -1),):
        return None
    inc = node.inputs[0].owner
    if inc is None or type(inc.op) is not IncSubtensor or len(inc.inputs) != 2 or \
            inc.op.idx_list != (-1,):
        return None
    base = inc.inputs[0].owner
    if base is None or not isinstance(base.op, Elemwise) or \
            getattr(base.op.scalar_op, "name", "") != "second" or \
            not _is_const(base.inputs[1], 0, None):
        return None
    return inc.inputs[1]


def _adjoints(b: Any, m: RNNMatch) -> tuple | None:
    """(dy, dhy, dcy) for DnnRNNGrad from the backward loop `b`'s adjoint sequences (None
    for zeros); None when cuDNN cannot take them (the cell state's adjoint at every step)."""
    kinds = {j: (p, k) for j, p, k in b.op.grad_of.adjoints}

    def last(j: int) -> Variable | None | bool:
        p, k = kinds.get(j, (-1, "zero"))
        if k == "zero" or p < 0:
            return None
        v = _last_value(b.inputs[1 + p]) if k == "last" else None
        return v.dimshuffle("x", 0, 1) if v is not None else False
    dy, dhy = None, last(m.h_state)
    if dhy is False:
        dy, dhy = b.inputs[1 + kinds[m.h_state][0]][::-1], None
    dcy = last(m.c_state) if m.c_state is not None else None
    if dcy is False:
        return None
    return dy, dhy, dcy


def _mask_grad_read(fgraph: FunctionGraph, b: Any) -> bool:
    """Whether the backward loop `b`'s gradient of the mask (sequence 1) is read (scan_grad
    builds every float sequence's gradient; an unread one is left to dead-code removal)."""
    g = b.op.grad_of
    first = len(g.windows) + len(g.sums)
    return any(fgraph.clients.get(b.outputs[first + i]) for i, k in enumerate(g.seq_grads)
               if k == 1)


def _rewrite(fgraph: FunctionGraph, node: Any, widest: dict | None = None) -> bool:
    """Replace `node` when it is one recurrent layer of a hidden size at most widest[cell]
    (None: any)."""
    m = match_rnn_step(node)
    if m is None:
        return False
    info = node.op.info
    S = info.n_seqs
    backs = [b for b in fgraph.apply_nodes if isinstance(b.op, Scan) and
             getattr(b.op.grad_of, "forward", None) is node.op]
    if sum(1 for b in fgraph.apply_nodes if b.op is node.op) != 1:
        return False
    only = _only_feeding(fgraph, set(backs), node)
    c_readers = []
    if m.c_state is not None:
        c_readers = _last_readers(fgraph, node.outputs[m.c_state], only)
        if c_readers is None:
            return False
    if m.masked and ((not _BRANCH and not (GUARD and may_guard(fgraph)))
                     or any(_mask_grad_read(fgraph, b) for b in backs)):
        return False   # neither a guard nor a lazy branch here, or the mask's gradient is read
    plans = [_adjoints(b, m) for b in backs]
    if any(p is None for p in plans) or any(
            len(b.outputs) != len(g.windows) + len(g.sums) + len(g.seq_grads)
            for b, g in ((b, b.op.grad_of) for b in backs)):
        return False
    seq, n = node.inputs[1], node.inputs[0]
    # the loop's own checks (ScanError), kept: x[:n] of a short sequence would run fewer steps
    n = Assert(f"{info.name}: the sequence is shorter than n_steps, or n_steps < 0 (the loop "
               "was replaced by scan_to_dnn_rnn)")(n, T.ge(seq.shape[0], n), T.ge(n, 0))
    x = seq[:n]
    mask = node.inputs[2] if m.masked else None   # PrefixMask reads its first n steps
    hx = node.inputs[1 + S + m.h_state][:1]
    cx = node.inputs[1 + S + m.c_state][:1] if m.c_state is not None else None
    if m.hidden is None:   # Elman: no gate blocks tell the hidden size
        m = _elman_width(m, hx)
        if m is None:
            return False
    if widest is not None and m.hidden > widest.get(m.mode, 0):
        return False
    return _replace(fgraph, node, m, x, hx, cx, backs, plans, c_readers, mask)


def _elman_width(m: RNNMatch, hx: Variable) -> RNNMatch | None:
    """Elman's hidden size is not in the step's graph (no gate slices): the match with it
    taken from a constant shape of the initial state or of U (None: not known)."""
    for v, axis in ((hx, 2), (m.U, 1), (m.U, 0)):
        try:
            return m._replace(hidden=int(get_scalar_constant_value(v.shape[axis])))
        except NotScalarConstantError:
            continue
    H = _shared_width(m.U)
    return None if H is None else m._replace(hidden=H)


def _shared_width(U: Variable) -> int | None:
    """U's width when it is a shared variable (its value's shape now; the DnnRNN op checks
    the weights' size at run time, so a later set_value of another width fails loudly)."""
    if not isinstance(U, SharedVariable):
        return None
    val = U.get_value(borrow=True)
    return int(val.shape[1]) if getattr(val, "ndim", 0) == 2 else None


class PrefixMask(Op):
    """(mask (steps, batch), n) -> (lengths int32 (batch,), ok int8 scalar) over the mask's
    first n steps: each row's number of steps, and whether the mask is a prefix mask there
    (row b is 1 for its first lengths[b] steps, then 0) with every length >= 1: the
    condition under which cuDNN's run equals the masked loop.

    Why an op of its own, on the host, that slices for itself: the masked loop's mask is
    usually an input the caller passes from the host; checking it there, before it is
    uploaded, lets the branch choose without reading anything back from the GPU (a
    synchronisation per call), where ``mask[:n]`` as a node of its own would be placed on
    the GPU beside the loop's upload. It has no GPU lifter: a mask already on the GPU is
    read back once (``host_check``: cpu_nodes does not report it as float work)."""

    host_check = True

    def _inputs(self, mask: Any, n: Any) -> list:
        mask, n = T.as_tensor_variable(mask), T.as_tensor_variable(n)
        if mask.ndim != 2 or n.ndim != 0 or "int" not in n.dtype:
            raise TypeError(f"{type(self).__name__}: expected a (steps, batch) mask and an "
                            f"integer step count, got {mask.type} and {n.type}")
        return [mask, n]

    def make_node(self, mask: Any, n: Any) -> Apply:
        return Apply(self, self._inputs(mask, n),
                     [T.TensorType("int32", (False,))(name="lengths"),
                      T.TensorType("int8", ())(name="prefix_ok")])

    @staticmethod
    def test(mask: Any, n: Any) -> tuple[np.ndarray, bool]:
        """(lengths int32, whether the mask is a prefix mask with every length >= 1)."""
        m = np.asarray(mask)[:int(n)]
        lengths = m.sum(axis=0, dtype=np.float64).astype(np.int32)
        steps = np.arange(m.shape[0])[:, None] < lengths[None, :]
        return lengths, bool(np.array_equal(m, steps.astype(m.dtype)) and (lengths >= 1).all())

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        lengths, ok = self.test(*inputs)
        outputs[0][0] = lengths
        outputs[1][0] = np.int8(ok)

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return [(shapes[0][1],), ()]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[False] * len(node.outputs) for _ in node.inputs]

    def L_op(self, inputs: list, outputs: list, output_grads: list) -> list:
        return [DisconnectedType()(), DisconnectedType()()]


class PrefixGuard(PrefixMask):
    """(mask (steps, batch), n) -> lengths int32 (batch,), PrefixMask's lengths, raising
    SpeculationFailed (scan_to_dnn_rnn) where PrefixMask's condition fails: the function
    then compiles again without the rewrite and runs that call as a loop.

    Its numpy work overlaps the GPU's (``overlaps_launches``, graph_plan.schedule): the
    cuDNN forward, which does not read the lengths, is launched before it."""

    overlaps_launches = True

    def make_node(self, mask: Any, n: Any) -> Apply:
        return Apply(self, self._inputs(mask, n),
                     [T.TensorType("int32", (False,))(name="lengths")])

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        lengths, ok = self.test(*inputs)
        if not ok:
            raise SpeculationFailed(
                "scan_to_dnn_rnn: the loop's mask is not a prefix mask in every row (ones, "
                "then zeros, at least one step), which a cuDNN layer needs: the function "
                "runs the loop from now on", rewrite="scan_to_dnn_rnn")
        outputs[0][0] = lengths

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return [(shapes[0][1],)]


class _Prefix(NamedTuple):
    """A masked loop's cuDNN side: per-row lengths, which steps run (L, batch, 1, float) and
    whether the mask is a prefix mask per row with every length >= 1 (the branch's
    condition)."""
    lengths: Variable
    valid: Variable
    cond: Variable | None


def _prefix(mask: Variable, x: Variable, guard: bool) -> _Prefix:
    """The prefix test over the mask's first len(x) steps (x the loop's sequence): a branch
    condition, or (`guard`) a guard and no condition."""
    if guard:
        lengths, ok = PrefixGuard()(mask, x.shape[0]), None
    else:
        lengths, ok = PrefixMask()(mask, x.shape[0])
    steps = T.lt(T.arange(x.shape[0]).dimshuffle(0, "x"), lengths.dimshuffle("x", 0))
    return _Prefix(lengths, T.cast(steps, x.dtype).dimshuffle(0, 1, "x"), ok)


def _held(y: Variable, lengths: Variable, steps: Variable) -> Variable:
    """A masked loop's states from an unmasked run over the padded sequence (`steps` long):
    with a prefix mask, row i's state at step t is the unmasked one at min(t, len_i - 1)
    (the loop holds a row's last state past its end, and before it both runs agree). An
    unmasked loop run over a sequence padded past its length L: lengths all L."""
    t = T.arange(steps).dimshuffle(0, "x")
    last = (lengths - 1).dimshuffle("x", 0)
    rows = T.arange(y.shape[1]).dimshuffle("x", 0)
    return y[T.maximum(T.minimum(t, last), 0), rows]


def _replace(fgraph: FunctionGraph, node: Any, m: RNNMatch, x: Variable, hx: Variable,
             cx: Variable | None, backs: list, plans: list, c_readers: list,
             mask: Variable | None = None) -> bool:
    """Replace the loop (and its gradient loops). With a mask: behind a guard where the
    function can compile again (PrefixGuard, GUARD), else each replaced output becomes
    ``ifelse(cond, cuDNN's value, the original loop's)``, the loop kept (a copy) for masks
    that are no prefix. Where the last cell state is not read, cuDNN runs unmasked over the
    padded sequence and each row's states are gathered (``_held``): its descriptors keep
    one shape whatever the lengths, so a CUDA graph of the step serves every call; else
    cuDNN takes the per-row lengths (its states are 0 past a row's end, so the all-states
    output is ``y + (1 - valid) * hy``)."""
    info = node.op.info
    S, M = info.n_seqs, info.n_states
    w = _flat_weights(m, x)
    guard = GUARD and may_guard(fgraph)
    pre = _prefix(mask, x, guard) if mask is not None else None
    branch = pre is not None and not guard
    gather = pre is not None and not c_readers
    steps = x.shape[0]
    bucket = BUCKET > 1 and not c_readers and not branch and may_guard(fgraph)
    run_x, run_steps = PadSteps(BUCKET)(x) if bucket else (x, steps)
    # the states are read per row at min(t, len - 1): a prefix mask's lengths, or the
    # true length of a padded run
    lens = pre.lengths if gather else \
        T.cast(T.alloc(steps, x.shape[1]), "int32") if bucket else None
    # the backward takes cuDNN's y and reserve space from the forward (else it would run
    # the forward layer again for them)
    op = DnnRNN(m.mode, "unidirectional", 1, m.hidden,
                with_lengths=pre is not None and not gather, reserve=pre is not None or bucket)
    fwd_in = [w, run_x, hx] + ([cx] if cx is not None else []) + \
        ([pre.lengths] if op.with_lengths else [])
    outs = op(*fwd_in)
    y, hy = outs[0], outs[1]
    nonseqs = node.inputs[1 + S + M:]
    if lens is not None:
        held = _held(y, lens, run_steps)
        h_all = held
        h_last = held[-1].dimshuffle("x", 0, 1)
    elif pre is None:
        h_all, h_last = y, hy
    else:
        h_all, h_last = y + (1 - pre.valid) * hy[0].dimshuffle("x", 0, 1), hy

    def swap(olds: list, news: list, alts: list, extra: tuple = ()) -> list:
        """Replace the outputs that are read (an unread one would keep its loop alive
        inside the branch); with a mask, through ``ifelse(cond, news, alts)``, which also
        gives the `extra` (cuDNN's value, the fallback's) pairs: returns those."""
        read = [k for k, o in enumerate(olds) if fgraph.clients.get(o)]
        olds, news = [olds[k] for k in read], [_fit(news[k], olds[k]) for k in read]
        got = [e for e, _ in extra]
        if branch and (news or extra):
            res = _BRANCH[0](pre.cond, news + got, [alts[k] for k in read] +
                             [a for _, a in extra], outer=fgraph.variables)
            news, got = res[:len(news)], res[len(news):]
        for old, new in zip(olds, news):
            new = _fit(new, old)
            fgraph.replace(old, new, reason="scan_to_dnn_rnn")
            if bucket:   # buffer[:L + 1] read as buffer[:L + 1][1:][-1]: one index,
                # its bounds from the bucket's length (known before the layer runs)
                merge_reads(fgraph, new, reason="scan_to_dnn_rnn",
                            shape=(run_steps + 1, hx.shape[1], hx.shape[2]))
        return got

    # the fallback branches read the loop's marked copy, and the forward copies that feed
    # only the gradient loops (scan_grad's full-history loop) go into them marked alike:
    # an unmarked loop inside a branch would be rewritten again when the branch compiles
    alt = _fallback_loop(node.op).make_node(*node.inputs) if branch else None
    copies = dict(zip(node.outputs, alt.outputs)) if alt is not None else {}
    if branch:
        for nd in _only_feeding(fgraph, set(backs), node):
            if isinstance(nd.op, Scan) and nd.op.grad_of is None:
                copies.update(zip(nd.outputs,
                                  _fallback_loop(nd.op).make_node(*nd.inputs).outputs))

    def fallback(inputs: list) -> list:
        return _substitute(list(inputs), copies)

    # the forward first: the gradient loops' adjoints are computed from its outputs, and
    # a branch built before would take the original loop inside with them
    h_out = node.outputs[m.h_state]
    # a padded run's buffer is sliced to the true length after the join, so that reads of
    # it merge into one index of a bucket-shaped array (subtensor_merge: the last state
    # buffer[:L + 1][1:][-1] is buffer[L]) and the graph reading it serves every length
    h_buf = (T.concatenate([hx, h_all])[:steps + 1] if bucket else
             T.concatenate([hx, h_all])) if info.keep[m.h_state] else h_last
    olds, news, alts = [h_out], [h_buf], ([alt.outputs[m.h_state]] if alt else [])
    for r in c_readers:
        olds.append(r)
        news.append(outs[2][0])
        if alt is not None:
            alts += fallback([r])
    extra = () if not branch else (
        (y, T.zeros((x.shape[0], x.shape[1], m.hidden), dtype=y.dtype)),
        (outs[-1], T.zeros((0,), dtype="uint8")))
    got = swap(olds, news, alts, extra)
    y_f, *reserve = got if branch else [y, outs[-1]] if op.reserve else [y]
    # zeros shaped like hx and cx, not like hy and cy: read from the branch, their shapes
    # would need the forward layer
    for b, (dy, dhy, dcy) in zip(backs, plans):
        g = b.op.grad_of
        if lens is not None:   # the adjoints of the gathered states, back onto cuDNN's y
            held = _held(y_f, lens, run_steps)
            seen = held[:steps] if bucket else held
            known = {v: d for v, d in ((seen, dy), (held[-1].dimshuffle("x", 0, 1), dhy))
                     if d is not None}
            out_grads = [grad(None, [y_f], known_grads=known, disconnected_inputs="ignore",
                              return_disconnected="zero")[0] if known else T.zeros_like(y_f),
                         T.zeros_like(hx)]
        else:
            dhy_all = T.zeros_like(hx) if dhy is None else dhy
            if pre is not None and dy is not None:   # the held states past the end read hy
                dhy_all = dhy_all + ((1 - pre.valid) * dy).sum(axis=0).dimshuffle("x", 0, 1)
            out_grads = [T.zeros_like(y_f) if dy is None else dy, dhy_all]
        if cx is not None:
            out_grads.append(T.zeros_like(cx) if dcy is None else dcy)
        if op.reserve:   # y and the reserve space from the forward (branch)
            fwd_out = [y_f] + list(outs[1:-1]) + reserve
            out_grads.append(None)
        else:
            fwd_out = outs
        dw, dx, dhx, *rest = op.L_op(fwd_in, fwd_out, out_grads)
        state_grad = {m.h_state: dhx}
        if cx is not None:
            state_grad[m.c_state] = rest[0]
        wrt = [nonseqs[k] for k in g.sums]
        g_ns = grad(None, wrt, known_grads={w: dw}, disconnected_inputs="ignore",
                    return_disconnected="zero") if wrt else []
        news_prefix = [state_grad[j].dimshuffle("x", 0, 1, 2) for j in g.windows] + \
            [v.dimshuffle("x", *range(v.ndim)) for v in g_ns]
        # a sequence other than x is the mask, whose gradient is not read (_mask_grad_read)
        dx_seq = dx[:steps] if bucket else dx
        news = news_prefix + [dx_seq[::-1] if k == 0 else None for k in g.seq_grads]
        alts = list(b.op.make_node(*fallback(b.inputs)).outputs) if branch else []
        swap(list(b.outputs), news, alts)
    return True


def _substitute(outputs: list, mapping: dict) -> list:
    """`outputs` with the keys of `mapping` replaced, rebuilding only the nodes between
    them (clone_replace copies every node back to the graph's inputs: a branch would then
    compute those copies again inside it)."""
    memo = dict(mapping)

    def new(v: Variable) -> Variable:
        if v in memo:
            return memo[v]
        nd = v.owner
        out = v
        if nd is not None:
            ins = [new(i) for i in nd.inputs]
            if any(a is not b for a, b in zip(ins, nd.inputs)):
                out = nd.op.make_node(*ins).outputs[nd.outputs.index(v)]
        memo[v] = out
        return out
    return [new(v) for v in outputs]


def _fallback_loop(op: Scan) -> Scan:
    """The masked loop's copy for the branch cuDNN cannot take, marked so that compiling
    that branch (with this rewrite on) does not replace it again."""
    return op.host_loop(op.inner_inputs, op.inner_outputs,
                        dc_replace(op.info, keep_as_loop=True))


def scan_to_dnn_rnn(fgraph: FunctionGraph, widest: dict | None = None) -> None:
    """Replace every loop that is one recurrent layer (and its gradient loops) by DnnRNN
    (and DnnRNNGrad); with `widest`, only layers of a hidden size at most widest[cell]."""
    for node in list(fgraph.toposort()):
        if isinstance(node.op, Scan) and node in fgraph.apply_nodes and \
                node.op.grad_of is None:
            _rewrite(fgraph, node, widest)


def scan_to_dnn_rnn_where_a_gpu_runs(fgraph: FunctionGraph) -> None:
    """scan_to_dnn_rnn in every fast_run compile where a GPU may take part (the function
    keeps its source, so a failed guard falls back to the loop), for hidden sizes cuDNN's
    persistent kernel takes (SMALL_H_LIMIT). Why that limit: on the H200 (benchmarks/rnn.py,
    TF32, ms a training step) at hidden 128, batch 16, the cuDNN path ran 0.57 against the
    loop's 1.32 (LSTM) and 0.43 against 1.46 (GRU); at hidden 512, batch 64 (cuDNN's
    standard algorithm) the loop was faster: LSTM 1.82 against 2.03-2.26, GRU 1.86 against
    1.97-2.06, Elman 1.22 against 1.25."""
    if may_guard(fgraph):
        scan_to_dnn_rnn(fgraph, SMALL_H_LIMIT)


# before scan_merge (3.5), which would fold the gradient's copies of the forward loop into
# it, and long before the GPU lifting (40). The opt-in tag runs it anywhere (the host too);
# the default entry where a GPU may take part; excluding the tag turns both off
optdb.register("scan_to_dnn_rnn", scan_to_dnn_rnn, 3.4, "scan_to_dnn_rnn")
optdb.register("scan_to_dnn_rnn_where_a_gpu_runs", scan_to_dnn_rnn_where_a_gpu_runs, 3.41,
               "fast_run", "scan_to_dnn_rnn")
