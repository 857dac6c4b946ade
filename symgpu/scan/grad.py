"""Back-propagation through time: the gradient of a Scan is a second Scan run backwards.

At backward step s (forward step t = n-1-s) the backward loop carries, for each state j, a
window W_j of the adjoints already accumulated for y_{t}, y_{t-1}, ..., y_{t-L+1} (L = the
state's number of initial values), and one running sum per non-sequence. It reads, as
sequences (reversed), the forward inputs of step t, the forward outputs of step t (so
gradients such as tanh's reuse them instead of recomputing), and the output gradients of
step t. Its inner graph is the forward body's vector-Jacobian product, built by `grad`, so
it is differentiable again (hessians) and gets the normal passes. With truncate_gradient=k
only the last k steps are run backwards.
"""
from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any, Sequence

import symgpu.tensor as T
from symgpu.gradient import grad
from symgpu.graph.basic import Constant, Variable, ancestors, graph_inputs, io_toposort
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.scan.info import ScanGradOf, ScanInfo
from symgpu.scan.inner import clone_with, hoist_invariants
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.math import Dot, MatMul
from symgpu.tensor.subtensor import IncSubtensor, Slice
from symgpu.tensor.type import TensorType

if TYPE_CHECKING:
    from symgpu.scan.op import Scan

__all__ = ["scan_grad"]


def _is_float(v: Variable) -> bool:
    return str(getattr(v.type, "dtype", "")).startswith(("float", "complex"))


def _padleft(x: Variable) -> Variable:
    return x.dimshuffle("x", *range(x.ndim))


def scan_grad(op: Scan, inputs: Sequence[Variable], outputs: Sequence[Variable],
              output_grads: Sequence[Variable]) -> list[Any]:
    """One gradient per outer input of `op`'s node (None where nothing flows). The loops it
    builds are `op.host_loop`s (op.py imports this module, not the other way round)."""
    info = op.info
    S, M, K, N = info.n_seqs, info.n_states, info.n_nitsot, info.n_nonseqs
    n_steps = inputs[0]
    seqs = list(inputs[1:1 + S])
    inits = list(inputs[1 + S:1 + S + M])
    nonseqs = list(inputs[1 + S + M:])
    inner_in = op.inner_inputs
    seq_in = inner_in[:S]
    tap_in = inner_in[S:S + info.n_taps]
    nonseq_in = inner_in[S + info.n_taps:]
    inner_out = op.inner_outputs
    state_out = inner_out[:M]
    nitsot_out = inner_out[M:M + K]

    # full histories: a state kept at its last values only is recomputed with its history
    bufs = list(outputs[:M])
    g_bufs = list(output_grads[:M])
    if not all(info.keep):
        full = op.host_loop(inner_in, inner_out, dc_replace(info, keep=(True,) * M))
        full_outs = full(*inputs)
        full_outs = full_outs if isinstance(full_outs, list) else [full_outs]
        for j in range(M):
            if not info.keep[j]:
                L = info.n_init(j)
                g_full = T.zeros_like(full_outs[j])
                g_bufs[j] = T.set_subtensor(g_full[-L:], output_grads[j])
        bufs = full_outs[:M]
        nitsots = full_outs[M:]
    else:
        nitsots = list(outputs[M:])
    g_nitsots = list(output_grads[M:])

    if M:
        n = bufs[0].shape[0] - info.n_init(0)
    elif K:
        n = nitsots[0].shape[0]
    else:
        n = n_steps
    n_back = n if info.truncate_gradient < 0 else T.minimum(n, info.truncate_gradient)

    # -- the backward body ---------------------------------------------------------------
    taps = [(j, tap) for j in range(M) for tap in info.state_taps[j]]
    float_states = [j for j in range(M) if _is_float(state_out[j])]
    g_state_ph = {j: TensorType(bufs[j].dtype, bufs[j].broadcastable[1:])(f"g_{info.state_label(j)}[t]")
                  for j in float_states}
    g_nitsot_ph = {i: TensorType(nitsots[i].dtype, nitsots[i].broadcastable[1:])(f"g_out{M + i}[t]")
                   for i in range(K) if _is_float(nitsot_out[i])}
    windows = {j: TensorType(bufs[j].dtype, bufs[j].broadcastable)(f"adjoint window {j}")
               for j in float_states}
    adj = {j: g_state_ph[j] + windows[j][0] for j in float_states}
    known: dict[Variable, Variable] = {}
    for j in float_states:
        if not isinstance(state_out[j], Constant):
            known[state_out[j]] = known[state_out[j]] + adj[j] if state_out[j] in known else adj[j]
    for i, ph in g_nitsot_ph.items():
        if not isinstance(nitsot_out[i], Constant):
            o = nitsot_out[i]
            known[o] = known[o] + ph if o in known else ph
    float_seqs = [k for k in range(S) if _is_float(seqs[k])]
    float_taps = [m for m, (j, _) in enumerate(taps) if j in windows]
    float_nonseqs = [k for k in range(N) if _is_float(nonseqs[k])]
    wrt = [seq_in[k] for k in float_seqs] + [tap_in[m] for m in float_taps] + \
        [nonseq_in[k] for k in float_nonseqs]
    gs = grad(None, wrt, known_grads=known, disconnected_inputs="ignore",
              return_disconnected="None") if (wrt and known) else [None] * len(wrt)
    g_seq = dict(zip(float_seqs, gs[:len(float_seqs)]))
    g_tap = dict(zip(float_taps, gs[len(float_seqs):len(float_seqs) + len(float_taps)]))
    g_nonseq = dict(zip(float_nonseqs, gs[len(float_seqs) + len(float_taps):]))

    # new windows: shift by one step and add this step's adjoints of the past values
    tap_index = {(j, tap): m for m, (j, tap) in enumerate(taps)}
    new_windows = {}
    for j in float_states:
        W = windows[j]
        L = info.n_init(j)
        entries = []
        for k in range(L):
            parts = [W[k + 1]] if k + 1 < L else []
            m = tap_index.get((j, -(k + 1)))
            if m is not None and g_tap.get(m) is not None:
                parts.append(g_tap[m])
            entries.append(parts[0] if len(parts) == 1 else T.add(*parts) if parts
                           else T.zeros_like(W[0]))
        new_windows[j] = _padleft(entries[0]) if L == 1 else T.stack(entries)
    accs = {k: nonseqs[k].type(f"g_{nonseqs[k]} sum") for k in float_nonseqs}
    new_accs = {k: accs[k] + g_nonseq[k] if g_nonseq.get(k) is not None else accs[k]
                for k in float_nonseqs}
    seq_grad_outs = [g_seq[k] if g_seq.get(k) is not None else T.zeros_like(seq_in[k])
                     for k in float_seqs]

    # forward outputs of step t stand for their recomputation
    y_ph = {j: state_out[j].type(f"{info.state_label(j)}[t]") for j in range(M)
            if state_out[j].owner is not None}
    z_ph = {i: nitsot_out[i].type(f"out{M + i}[t]") for i in range(K)
            if nitsot_out[i].owner is not None}
    state_keys = list(new_windows) + list(new_accs)
    body = [new_windows[j] for j in new_windows] + [new_accs[k] for k in new_accs] + seq_grad_outs
    replace = {state_out[j]: y_ph[j] for j in y_ph}
    replace.update({nitsot_out[i]: z_ph[i] for i in z_ph})
    # the forward step's matrix products the backward step reads are saved by the forward
    # loop instead of recomputed (cuDNN's reserve space): a gradient loop of an LSTM does
    # its one recurrent product per step, not three
    saved = _saved_products(io_toposort(list(inner_in), list(inner_out)), body,
                            set(seq_in) | set(tap_in), set(replace))
    s_ph = {v: v.type(f"{v.name or 'product'}[t] (saved)") for v in saved}
    replace.update(s_ph)
    saved_seqs: list[Variable] = []
    if saved:
        names = tuple(info.nitsot_names) + ("",) * (K - len(info.nitsot_names))
        fwd = op.host_loop(inner_in, list(inner_out) + saved, dc_replace(
            info, keep=(True,) * M, n_nitsot=K + len(saved),
            nitsot_names=names + tuple(f"saved {v.name or 'product'}" for v in saved)))
        fwd_outs = fwd(*inputs)
        fwd_outs = fwd_outs if isinstance(fwd_outs, list) else [fwd_outs]
        bufs, nitsots = fwd_outs[:M], fwd_outs[M:M + K]
        saved_seqs = fwd_outs[M + K:]
    body = clone_with(body, replace)

    # backward sequences (reversed), kept only where the body reads them
    def rev(x: Variable, start: Any) -> Variable:
        return x[start:start + n][::-1]

    seq_pairs: list[tuple[Variable, Variable]] = []
    seq_pairs += [(seq_in[k], seqs[k][:n][::-1]) for k in range(S)]
    seq_pairs += [(tap_in[m], rev(bufs[j], info.n_init(j) + tap)) for m, (j, tap) in enumerate(taps)]
    seq_pairs += [(y_ph[j], rev(bufs[j], info.n_init(j))) for j in y_ph]
    seq_pairs += [(z_ph[i], nitsots[i][::-1]) for i in z_ph]
    seq_pairs += [(s_ph[v], sv[::-1]) for v, sv in zip(saved, saved_seqs)]
    tails = {j: _tail_adjoint(g_bufs[j], outputs[j], info.n_init(j)) for j in g_state_ph}
    seq_pairs += [(g_state_ph[j], rev(g_bufs[j], info.n_init(j)) if tails[j] is None
                   else tails[j][::-1]) for j in g_state_ph]
    seq_pairs += [(g_nitsot_ph[i], g_nitsots[i][::-1]) for i in g_nitsot_ph]
    state_phs = [windows[j] for j in new_windows] + [accs[k] for k in new_accs]
    variant = [ph for ph, _ in seq_pairs] + state_phs
    body, nonseq_pairs, _ = hoist_invariants(body, variant, dict(zip(nonseq_in, nonseqs)))
    used = set(graph_inputs(body))
    seq_pairs = [(ph, ov) for ph, ov in seq_pairs if ph in used]
    n_states = len(state_phs)
    back_info = ScanInfo(
        n_seqs=len(seq_pairs), state_taps=((-1,),) * n_states, keep=(False,) * n_states,
        n_nitsot=len(seq_grad_outs), n_nonseqs=len(nonseq_pairs), as_while=False,
        truncate_gradient=-1, name=f"grad_of_{info.name}")
    back = op.host_loop([ph for ph, _ in seq_pairs] + state_phs + [ph for ph, _ in nonseq_pairs],
                        body, back_info)
    seq_pos = {ph: k for k, (ph, _) in enumerate(seq_pairs)}
    back.grad_of = ScanGradOf(
        forward=op,
        adjoints=tuple((j, seq_pos.get(g_state_ph[j], -1),
                        _adjoint_kind(output_grads[j], outputs[j], info.n_init(j))
                        if info.keep[j] else "any") for j in g_state_ph),
        windows=tuple(new_windows), sums=tuple(new_accs), seq_grads=tuple(float_seqs))
    init_windows = [_padleft(T.zeros_like(inits[j][:info.n_init(j)])) for j in new_windows]
    init_accs = [_padleft(T.zeros_like(nonseqs[k])) for k in new_accs]
    outs = back(n_back, *[ov for _, ov in seq_pairs], *init_windows, *init_accs,
                *[ov for _, ov in nonseq_pairs])
    outs = outs if isinstance(outs, list) else [outs]

    result: list[Any] = [None] * len(inputs)
    for pos, key in enumerate(state_keys[:len(new_windows)]):
        j = key
        L = info.n_init(j)
        from_steps = outs[pos][0][::-1]
        if info.truncate_gradient >= 0:
            from_steps = T.switch(T.lt(n_back, n), T.zeros_like(from_steps), from_steps)
        head = g_bufs[j][:L] if tails.get(j) is None else T.zeros_like(bufs[j][:L])
        result[1 + S + j] = head + from_steps
    for pos, k in enumerate(new_accs):
        result[1 + S + M + k] = outs[len(new_windows) + pos][0]
    for pos, k in enumerate(float_seqs):
        g_rev = outs[n_states + pos]
        g = T.zeros_like(seqs[k])
        result[1 + k] = T.set_subtensor(g[n - n_back:n], g_rev[::-1])
    return result


def _saved_products(forward: list, body: Sequence[Variable], variant: set,
                    replaced: set) -> list[Variable]:
    """The matrix products of the forward step (`forward`: its nodes) that the backward step
    `body` reads and that change with the step (they read a sequence's or a state's value
    at t); where the step only adds saved products together (an LSTM's ``dot(x_t, W) +
    dot(h, U)``), their sum instead (`_summed_products`)."""
    read = {n for n in io_toposort(list(variant), list(body))}
    out = []
    for node in forward:
        if isinstance(node.op, (Dot, MatMul)) and node in read and \
                node.outputs[0] not in replaced and \
                any(v in variant for v in ancestors(node.inputs)):
            out.append(node.outputs[0])
    return _summed_products(forward, out, read, replaced)


def _is_add(node: Any) -> bool:
    return isinstance(node.op, Elemwise) and node.op.scalar_op is SCALAR_OPS["add"]


def _summed_products(forward: list, saved: list[Variable], read: set,
                     replaced: set) -> list[Variable]:
    """`saved` with every add of saved products whose only reader is that add replaced by
    the add's output, repeatedly (``(a + b) + c``). Why: the backward step then reads one
    array per step where it read two and added them again (a launch per backward step), and
    the forward products no longer leave the step, so the second becomes a Gemm writing into
    the first (a launch less per forward step) and the forward loop stores half as much.
    Sums with anything else (``dot(x_t, W) + b``) stay apart: the bias then fuses into the
    kernels that read the sum."""
    clients: dict[Variable, list] = {}
    for node in forward:
        for v in node.inputs:
            clients.setdefault(v, []).append(node)
    saved = list(saved)
    while True:
        pool = set(saved)
        for node in forward:
            ins = node.inputs
            if not (_is_add(node) and node in read and len(ins) >= 2
                    and node.outputs[0] not in replaced and all(v in pool for v in ins)
                    and len(set(ins)) == len(ins)
                    and all(clients.get(v) == [node] for v in ins)):
                continue
            at = min(saved.index(v) for v in ins)
            saved = [v for v in saved if v not in ins]
            saved.insert(at, node.outputs[0])
            break
        else:
            return saved


def _tail_adjoint(g: Any, buf: Variable, L: int) -> Variable | None:
    """The adjoint of ``buf[L:]`` alone when ``g``, the adjoint of the whole state buffer
    ``buf``, is zeros with it added (or set) at ``[L:]``: the gradient of what scan()
    returns for a state (its buffer without the L initial values) and of nothing else.  The
    backward loop then reads it directly, instead of a zero-filled copy of the buffer with
    it written in (two passes over O(steps) memory per call); None for any other ``g``."""
    node = getattr(g, "owner", None)
    if node is None or type(node.op) is not IncSubtensor or len(node.inputs) != 2 \
            or node.op.idx_list != (Slice(L, None, None),):
        return None
    zeros, tail = node.inputs
    z = zeros.owner
    if z is None or not isinstance(z.op, Elemwise) or z.op.scalar_op is not SCALAR_OPS["second"] \
            or z.inputs[0] is not buf or not _is_zero(z.inputs[1]):
        return None
    if tail.type.dtype != buf.type.dtype or tail.type.broadcastable != buf.type.broadcastable:
        return None   # broadcast into the region: the general path
    return tail


def _adjoint_kind(g: Any, buf: Variable, L: int) -> str:
    """"zero" when the adjoint `g` of the state buffer `buf` is zeros, "last" when it is
    zeros but at the last step (what reading ``out[-1]`` of scan's result gives), else
    "any" (recorded in ScanGradOf for rewrites that need a state's last value only)."""
    if _zeros_of(g):
        return "zero"
    tail = _tail_adjoint(g, buf, L)
    node = getattr(tail, "owner", None)
    if tail is None or _zeros_of(tail):
        return "zero" if tail is not None else "any"
    if node is not None and type(node.op) is IncSubtensor and len(node.inputs) == 2 \
            and node.op.idx_list == (-1,) and _zeros_of(node.inputs[0]):
        return "last"
    return "any"


def _zeros_of(v: Any) -> bool:
    """Whether `v` is ``zeros_like(x)`` as the gradient builds it (second(x, 0))."""
    z = getattr(v, "owner", None)
    return z is not None and isinstance(z.op, Elemwise) and \
        z.op.scalar_op is SCALAR_OPS["second"] and _is_zero(z.inputs[1])


def _is_zero(v: Variable) -> bool:
    """Whether the graph fixes ``v`` to one zero (a constant, seen through dimshuffles)."""
    try:
        return get_scalar_constant_value(v, elemwise=False) == 0
    except NotScalarConstantError:
        return False

