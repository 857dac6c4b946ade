"""A varied segment split by what varies: the nodes whose shapes follow the call run plainly,
the others are captured apart.

Why: a segment whose key changes from call to call (a new sequence length each call: past
``graphs.VARIED_AFTER`` distinct keys) runs plainly, one launch through Python per node.
Often only part of it follows the call: a recurrent layer padded to a bucket of lengths
(PadSteps) computes over the bucket, and only the few nodes around the true length (the
states up to it, the loss over them, their gradients) take shapes of the length itself.  The
bucket's nodes would replay one graph per bucket if the length's nodes were not in their
segment.  So a varied segment watches its plain runs (:class:`ShapeWatch`): each node's
*signature* (its GPU inputs' and outputs' shapes and strides, its host inputs' shapes and,
for nodes that do not read them as graph parameters, values: what puts it in the key).
Once the runs have met ``MIN_KEYS`` distinct keys and some launching node has fewer
distinct signatures than the segment has keys (it repeats where the call does not: a
bucket), the nodes whose signatures are as many as the keys are the call's own; where the
others hold at least half of the segment's launches, the runner plans its steps again with
the call's own nodes run plainly (graphs.Runner.split), and the rest form segments of their
own, keyed by what they see.
Where no node repeats within ``MAX_KEYS`` keys, or the repeating ones launch little (a loop
whose every step follows the length, and only its weight updates do not: the copies into
their graph's buffers would cost what the replay saves), the segment stays as it is,
unwatched.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.exec.graph_plan import HOST_KEY_LIMIT
from symgpu.gpu.runtime.array import GpuArray

__all__ = ["ShapeWatch", "SPLIT", "MIN_KEYS", "MAX_KEYS"]

#: whether varied segments are watched and split (read when a runner is built)
SPLIT = True

#: distinct keys a watch sees before it may decide (a bucket's nodes repeat once two calls
#: fall in one bucket: with a few buckets, within a few calls)
MIN_KEYS = 6
#: distinct keys after which a watch that found no repeating node gives up
MAX_KEYS = 16


def _part(v: Any, by_value: bool) -> Any:
    """One value's share of a node's signature: a GPU value's shape and strides, a host
    array's dtype and shape, and its bytes and a host scalar's value where ``by_value`` (a
    node that does not read them as graph parameters: they are in the key by value)."""
    if isinstance(v, GpuArray):
        return (v.shape, v.strides)
    if isinstance(v, np.ndarray):
        if by_value and v.size <= HOST_KEY_LIMIT:   # in the key by value (graph_plan)
            return (v.dtype.str, v.shape, v.tobytes())
        return (v.dtype.str, v.shape)
    if by_value and isinstance(v, (bool, int, float, np.generic)):
        return v
    return type(v)


class ShapeWatch:
    """The plain runs of one varied segment, node by node, until :meth:`verdict` names the
    nodes that follow the call."""

    def __init__(self, items: list, nodes: list, storage_map: dict, param_ids: set,
                 launches: list[bool]) -> None:
        self.items = items
        self.launches = launches
        #: per item: (input cells, output cells, reads graph parameters)
        self.cells = [([storage_map[v] for v in nodes[i].inputs],
                       [storage_map[v] for v in nodes[i].outputs], id(t) in param_ids)
                      for i, t, _ in items]
        self.keys: dict[Any, list] = {}   # segment key -> its items' signatures

    def run(self, key: Any, set_current: Callable[[int], None]) -> None:
        """One plain run of the items, their signatures kept under ``key``."""
        sigs = []
        for (idx, thunk, dead), (ins, outs, params) in zip(self.items, self.cells):
            set_current(idx)
            before = tuple(_part(c[0], not params) for c in ins)
            thunk()
            sigs.append((before, tuple(_part(c[0], False) for c in outs)))
            for c in dead:
                c[0] = None
        if key not in self.keys:
            self.keys[key] = sigs

    def verdict(self) -> set[int] | None:
        """The node indices that follow the call, once decided (an empty set: nothing to
        split, stop watching); None while undecided."""
        runs = list(self.keys.values())
        n = len(runs)
        if n < MIN_KEYS:
            return None
        counts = [len(set(r[k] for r in runs)) for k in range(len(self.items))]
        stable = sum(1 for k, c in enumerate(counts) if c < n and self.launches[k])
        if not stable:
            return None if n < MAX_KEYS else set()
        # worth a split where most launches become replays: a few launches replayed beside
        # many run plainly save little and cost the copies into their graphs' buffers
        if stable < sum(self.launches) - stable:
            return set()
        return {self.items[k][0] for k, c in enumerate(counts) if c == n}
