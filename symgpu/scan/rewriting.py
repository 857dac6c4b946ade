"""Loop rewrites on the outer graph (the inner graph gets the normal passes when it compiles).

`scan_prune_and_save_memory` (pass `scan_save_mem`, between specialize and BLAS):
* outputs nobody reads are dropped, with the inner computation only they needed, and the
  sequences and non-sequences nothing reads any more (e.g. the gradient of a sequence that no
  one asked for, in a backward loop);
* a state whose history nobody reads (only its last value, `out[-1]`) keeps only the values
  its taps need: memory O(taps), not O(steps).
Loop-invariant work is moved out when the loop is built (symgpu/scan/inner.py,
`hoist_invariants`), for the step function's graph and for the backward loop's.
"""
from __future__ import annotations

from dataclasses import replace as dc_replace

import symgpu.tensor as T
from symgpu.graph.basic import ancestors, io_toposort
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.inner import clone_with, inner_mode_pass
from symgpu.scan.op import Scan
from symgpu.tensor.math import Dot
from symgpu.tensor.subtensor import Slice, Subtensor

__all__ = ["scan_prune_and_save_memory"]


def _last_value_readers(fgraph: FunctionGraph, out, n_init: int) -> list | None:
    """The variables that read `out`'s last value (`out[-1]`, or `out[n_init:][-1]`), if that
    is all anyone reads of `out`; None otherwise."""
    readers = []
    for client, _ in fgraph.clients.get(out, []):
        if client == "output" or not isinstance(client.op, Subtensor) or len(client.inputs) != 1:
            return None
        idx = client.op.idx_list
        if idx == (-1,):
            readers.append(client.outputs[0])
        elif idx == (Slice(n_init, None, None),):
            sub = _last_value_readers(fgraph, client.outputs[0], -1)
            if sub is None:
                return None
            readers.extend(sub)
        else:
            return None
    return readers


def _rewrite_node(fgraph: FunctionGraph, node) -> bool:
    op: Scan = node.op
    info = op.info
    S, M, K, N = info.n_seqs, info.n_states, info.n_nitsot, info.n_nonseqs
    inner_in, inner_out = op.inner_inputs, op.inner_outputs
    tap_start = S
    tap_slices = []
    for j in range(M):
        tap_slices.append(list(range(tap_start, tap_start + len(info.state_taps[j]))))
        tap_start += len(info.state_taps[j])
    used_outer = [bool(fgraph.clients.get(o)) for o in node.outputs]
    keep_state = [used_outer[j] for j in range(M)]
    keep_nitsot = [used_outer[M + i] for i in range(K)]
    cond = [inner_out[M + K]] if info.as_while else []
    # a dropped state is still needed if a kept output reads its taps
    changed = True
    while changed:
        changed = False
        roots = [inner_out[j] for j in range(M) if keep_state[j]] + \
            [inner_out[M + i] for i in range(K) if keep_nitsot[i]] + cond
        needed = set(ancestors(roots))
        for j in range(M):
            if not keep_state[j] and any(inner_in[t] in needed for t in tap_slices[j]):
                keep_state[j] = True
                changed = True
    new_keep = list(info.keep)
    last_readers: dict[int, list] = {}
    for j in range(M):
        if keep_state[j] and info.keep[j]:
            readers = _last_value_readers(fgraph, node.outputs[j], info.n_init(j))
            if readers:
                new_keep[j] = False
                last_readers[j] = readers
    if all(keep_state) and all(keep_nitsot) and not last_readers:
        roots_all = set(ancestors(list(inner_out)))
        if all(v in roots_all for v in inner_in):
            return False
    roots = [inner_out[j] for j in range(M) if keep_state[j]] + \
        [inner_out[M + i] for i in range(K) if keep_nitsot[i]] + cond
    needed = set(ancestors(roots))
    seqs_kept = [k for k in range(S) if inner_in[k] in needed]
    nonseq_base = S + info.n_taps
    nonseqs_kept = [k for k in range(N) if inner_in[nonseq_base + k] in needed]
    states = [j for j in range(M) if keep_state[j]]
    nitsots = [i for i in range(K) if keep_nitsot[i]]
    if not states and not nitsots:
        return False
    new_info = dc_replace(
        info, n_seqs=len(seqs_kept), state_taps=tuple(info.state_taps[j] for j in states),
        keep=tuple(new_keep[j] for j in states), n_nitsot=len(nitsots),
        n_nonseqs=len(nonseqs_kept),
        state_names=tuple(info.state_names[j] for j in states if j < len(info.state_names)),
        nitsot_names=tuple(info.nitsot_names[i] for i in nitsots if i < len(info.nitsot_names)))
    new_inner_in = [inner_in[k] for k in seqs_kept] + \
        [inner_in[t] for j in states for t in tap_slices[j]] + \
        [inner_in[nonseq_base + k] for k in nonseqs_kept]
    new_inner_out = [inner_out[j] for j in states] + [inner_out[M + i] for i in nitsots] + cond
    new_op = Scan(new_inner_in, new_inner_out, new_info, op.mode)
    outer = node.inputs
    new_outer = [outer[1 + k] for k in seqs_kept] + [outer[1 + S + j] for j in states] + \
        [outer[1 + S + M + k] for k in nonseqs_kept]
    outs = new_op(outer[0], *new_outer)
    outs = outs if isinstance(outs, list) else [outs]
    for pos, j in enumerate(states):
        if j in last_readers:
            for r in last_readers[j]:
                fgraph.replace(r, outs[pos][-1], reason="scan_save_mem")
        else:
            fgraph.replace(node.outputs[j], outs[pos], reason="scan_save_mem")
    for pos, i in enumerate(nitsots):
        fgraph.replace(node.outputs[M + i], outs[len(states) + pos], reason="scan_save_mem")
    return True


def scan_prune_and_save_memory(fgraph: FunctionGraph) -> None:
    """Apply the rewrites above to every Scan node of `fgraph`."""
    for node in list(fgraph.toposort()):
        if isinstance(node.op, Scan) and node in fgraph.apply_nodes:
            _rewrite_node(fgraph, node)


optdb.register("scan_save_mem", scan_prune_and_save_memory, 4, "fast_run", "scan")


# ----------------------------------------------------------------------------- merging loops

def _depends_on(var_list, targets: set) -> bool:
    return any(v in targets for v in ancestors(var_list))


def _serves(big, small) -> bool:
    """Whether loop node `big` computes everything loop node `small` returns: the same body
    on the same inputs, with more per-step outputs at the end (the gradient's forward loop
    that also saves its products, symgpu/scan/grad.py) and every history `small` keeps."""
    a, b = small.op, big.op
    ia, ib = a.info, b.info
    n_out = ia.n_states + ia.n_nitsot
    return (a.inner_inputs == b.inner_inputs and list(small.inputs) == list(big.inputs)
            and ia.state_taps == ib.state_taps and ia.n_nitsot <= ib.n_nitsot
            and (ia.as_while, ia.truncate_gradient) == (ib.as_while, ib.truncate_gradient)
            and list(a.inner_outputs) == list(b.inner_outputs[:n_out])
            and all(kb or not ka for ka, kb in zip(ia.keep, ib.keep)))


def _merge_pair(fgraph: FunctionGraph, na, nb) -> bool:
    """One loop doing the work of the two loops `na` and `nb` (same step count, neither
    reading the other's results); returns whether the graph changed."""
    a, b = na.op, nb.op
    ia, ib = a.info, b.info
    for big, small in ((na, nb), (nb, na)):
        if not _serves(big, small):
            continue
        # the same loop twice (the gradient's full-history copy of a loop that keeps only its
        # last values, or its copy saving per-step products): the bigger serves both
        bi, si = big.op.info, small.op.info
        for j in range(si.n_states):
            new = big.outputs[j] if bi.keep[j] == si.keep[j] else \
                big.outputs[j][-si.n_init(j):]
            fgraph.replace(small.outputs[j], new, reason="scan_merge")
        for i in range(si.n_nitsot):
            fgraph.replace(small.outputs[si.n_states + i], big.outputs[bi.n_states + i],
                           reason="scan_merge")
        return True
    if set(a.inner_inputs) & set(b.inner_inputs) or a.mode != b.mode:
        return False

    def parts(node):
        op, info = node.op, node.op.info
        S, M, NT = info.n_seqs, info.n_states, info.n_taps
        ins, outs = op.inner_inputs, op.inner_outputs
        return dict(seq_in=ins[:S], tap_in=ins[S:S + NT], ns_in=ins[S + NT:],
                    st_out=outs[:M], ni_out=outs[M:M + info.n_nitsot],
                    seqs=node.inputs[1:1 + S], inits=node.inputs[1 + S:1 + S + M],
                    nonseqs=node.inputs[1 + S + M:])
    pa, pb = parts(na), parts(nb)
    info = dc_replace(
        ia, n_seqs=ia.n_seqs + ib.n_seqs, state_taps=ia.state_taps + ib.state_taps,
        keep=ia.keep + ib.keep, n_nitsot=ia.n_nitsot + ib.n_nitsot,
        n_nonseqs=ia.n_nonseqs + ib.n_nonseqs, name=f"{ia.name}&{ib.name}",
        truncate_gradient=-1,
        state_names=_names(ia.state_names, ia.n_states) + _names(ib.state_names, ib.n_states),
        nitsot_names=_names(ia.nitsot_names, ia.n_nitsot) + _names(ib.nitsot_names, ib.n_nitsot))
    op = Scan(pa["seq_in"] + pb["seq_in"] + pa["tap_in"] + pb["tap_in"] + pa["ns_in"] + pb["ns_in"],
              pa["st_out"] + pb["st_out"] + pa["ni_out"] + pb["ni_out"], info, a.mode)
    outs = op(na.inputs[0], *pa["seqs"], *pb["seqs"], *pa["inits"], *pb["inits"],
              *pa["nonseqs"], *pb["nonseqs"])
    outs = outs if isinstance(outs, list) else [outs]
    Ma, Mb = ia.n_states, ib.n_states
    old = list(na.outputs[:Ma]) + list(nb.outputs[:Mb]) + list(na.outputs[Ma:]) + \
        list(nb.outputs[Mb:])
    for o, n in zip(old, outs):
        fgraph.replace(o, n, reason="scan_merge")
    return True


def _names(names: tuple, n: int) -> tuple:
    return tuple(names[i] if i < len(names) else "" for i in range(n))


def scan_merge(fgraph: FunctionGraph) -> None:
    """Merge loops that run the same number of steps (the same `n_steps` variable) and do not
    read each other's results: one Python loop instead of two."""
    changed = True
    while changed:
        changed = False
        nodes = [n for n in fgraph.toposort() if isinstance(n.op, Scan) and not n.op.info.as_while]
        for i, na in enumerate(nodes):
            for nb in nodes[i + 1:]:
                if na.inputs[0] is not nb.inputs[0]:
                    continue
                if _depends_on(list(nb.inputs), set(na.outputs)) or \
                        _depends_on(list(na.inputs), set(nb.outputs)):
                    continue
                if _merge_pair(fgraph, na, nb):
                    changed = True
                    break
            if changed:
                break


optdb.register("scan_merge", scan_merge, 3.5, "fast_run", "scan")


# ----------------------------------------------------------------------------- the inner mode

def _scan_with_mode(op: Scan, mode: str) -> Scan:
    return Scan(op.inner_inputs, op.inner_outputs, op.info, mode)


# loops built without `mode=` compile their inner graphs with the outer mode (ifelse.py
# registers the same for branches)
optdb.register("scan_inner_mode_fast_run", inner_mode_pass(Scan, _scan_with_mode, "FAST_RUN"),
               4.5, "fast_run")
optdb.register("scan_inner_mode_fast_compile",
               inner_mode_pass(Scan, _scan_with_mode, "FAST_COMPILE"), 4.5, "fast_compile")


# ----------------------------------------------------------------------------- sequence-only work

def _pushout_seq_dots(fgraph: FunctionGraph, node) -> bool:
    """dot(x[t], W) with x a sequence and W a non-sequence is computed for every step at once,
    before the loop, as one large matrix product (BLAS runs it faster than n small ones); the
    loop reads its rows as a new sequence."""
    op: Scan = node.op
    info = op.info
    S, M = info.n_seqs, info.n_states
    inner_in, inner_out = op.inner_inputs, op.inner_outputs
    seq_in = inner_in[:S]
    nonseq_in = inner_in[S + info.n_taps:]
    outer_seqs = node.inputs[1:1 + S]
    outer_nonseqs = node.inputs[1 + S + M:]
    n = node.inputs[0]
    found = []
    for inner_node in io_toposort(set(inner_in), list(inner_out)):
        if not isinstance(inner_node.op, Dot):
            continue
        a, w = inner_node.inputs
        if a in seq_in and w in nonseq_in and a.ndim in (1, 2) and w.ndim == 2:
            found.append((inner_node, seq_in.index(a), nonseq_in.index(w)))
    if not found:
        return False
    new_phs, new_seqs, replace = [], [], {}
    for inner_node, k, m in found:
        x, w = outer_seqs[k][:n], outer_nonseqs[m]
        if x.ndim == 2:
            y = T.dot(x, w)
        else:
            flat = x.reshape((x.shape[0] * x.shape[1], x.shape[2]), ndim=2)
            y = T.dot(flat, w).reshape((x.shape[0], x.shape[1], w.shape[1]), ndim=3)
        out = inner_node.outputs[0]
        ph = out.type(f"{out.name or 'dot'}[t] (computed before the loop)")
        new_phs.append(ph)
        new_seqs.append(y)
        replace[out] = ph
    new_out = clone_with(list(inner_out), replace)
    new_info = dc_replace(info, n_seqs=S + len(new_phs))
    new_op = Scan(list(seq_in) + new_phs + list(inner_in[S:]), new_out, new_info, op.mode)
    outs = new_op(n, *outer_seqs, *new_seqs, *node.inputs[1 + S:])
    outs = outs if isinstance(outs, list) else [outs]
    for o, nw in zip(node.outputs, outs):
        fgraph.replace(o, nw, reason="scan_pushout_seq_dot")
    return True


def scan_pushout_seq_dot(fgraph: FunctionGraph) -> None:
    """Apply `_pushout_seq_dots` to every for-loop of `fgraph`."""
    for node in list(fgraph.toposort()):
        if isinstance(node.op, Scan) and not node.op.info.as_while and node in fgraph.apply_nodes:
            _pushout_seq_dots(fgraph, node)


# opt-in (optimizer_including=scan_pushout_seq_dot): on the CPU, measured on benchmarks/rnn.py,
# one large product is no faster than the per-step ones (and the step's Gemm can then no
# longer work in place); on the GPU it saves a launch per step
optdb.register("scan_pushout_seq_dot", scan_pushout_seq_dot, 3.7, "scan_pushout")
