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

from symgpu.graph.basic import ancestors
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.scan.op import Scan
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
        if keep_state[j] and info.keep[j] and not info.as_while:
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
