"""Theano's `scan_checkpoints`: a loop whose gradient keeps one state in every
`save_every_N` steps instead of all of them.

The steps run in blocks: an outer loop over the blocks, each block an inner loop of
`save_every_N` steps (the last block the remainder). The outer loop keeps only each block's
last states, so back-propagation stores O(n / N) states and recomputes a block's steps from
its first state when its gradient is needed: memory traded for a second forward pass.
"""
from __future__ import annotations

from typing import Any, Callable

import symgpu.tensor as T
from symgpu.scan.basic import scan

__all__ = ["scan_checkpoints"]


def _as_list(x: Any) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def scan_checkpoints(fn: Callable[..., Any], sequences: Any = (), outputs_info: Any = None,
                     non_sequences: Any = (), name: str = "checkpointscan_fn",
                     n_steps: Any = None, save_every_N: int = 10,
                     padding: bool = True) -> tuple[Any, Any]:
    """Theano's checkpointed scan: `fn`, `sequences`, `outputs_info`, `non_sequences` and
    `n_steps` as :func:`symgpu.scan` (every sequence as long as the loop; states with one tap,
    -1); the outputs are the states after each block of `save_every_N` steps (and a
    per-step output's value at each block's last step), as Theano returns them. With
    `padding` (default) sequences whose length is not a multiple of `save_every_N` are padded
    with zeros to one (a copy); without it their length must be a multiple. Returns
    ``(outputs, updates)``."""
    if int(save_every_N) < 1:
        raise ValueError(f"scan_checkpoints: save_every_N must be a positive int, got "
                         f"{save_every_N!r}")
    every = int(save_every_N)
    seqs = [T.as_tensor_variable(s) for s in _as_list(sequences)]
    infos = _as_list(outputs_info) if outputs_info is not None else [None]
    for k, info in enumerate(infos):
        if isinstance(info, dict) and "taps" in info:
            raise ValueError(f"scan_checkpoints: outputs_info[{k}] has taps; only states with "
                             "the one tap -1 (or per-step outputs, None) are supported")
    nonseqs = _as_list(non_sequences)
    if not seqs and n_steps is None:
        raise ValueError("scan_checkpoints: give sequences or n_steps")
    steps = T.as_tensor_variable(seqs[0].shape[0] if n_steps is None else n_steps)
    blocks = T.cast(T.ceil(steps / float(every)), "int64")
    rest = steps % every
    last = T.switch(T.eq(rest, 0), every, rest)
    block_steps = T.set_subtensor((T.ones((blocks,), "int64") * every)[-1], last)
    blocked = []
    for s in seqs:
        tail = [s.shape[i] for i in range(1, s.ndim)]
        if padding:
            pad = (every - s.shape[0] % every) % every
            s = T.concatenate([s, T.zeros([pad] + tail, dtype=s.dtype)], 0)
        blocked.append(s.reshape([s.shape[0] // every, every] + tail, ndim=s.ndim + 1))
    n_states = sum(1 for i in infos if i is not None)
    n_out_seq = len(blocked)
    n_nonseq = len(nonseqs)

    def block(*args: Any) -> Any:
        block_seqs = list(args[:n_out_seq])
        count = args[n_out_seq]
        states = list(args[n_out_seq + 1:n_out_seq + 1 + n_states])
        ns = list(args[len(args) - n_nonseq:]) if n_nonseq else []
        it = iter(states)
        inner_infos = [next(it) if i is not None else None for i in infos]
        outs, updates = scan(fn, sequences=block_seqs, outputs_info=inner_infos,
                             non_sequences=ns, n_steps=count, name=f"{name}_inner",
                             return_list=True)
        return [o[-1] for o in outs], updates

    return scan(block, sequences=blocked + [block_steps], outputs_info=infos,
                non_sequences=nonseqs, n_steps=blocks, name=f"{name}_outer")
