"""The order the VM runs nodes in: a topological order, bent by the ops' scheduling hints.

Why: ``io_toposort`` visits the outputs depth first, so a node runs as soon as the first
output that needs it is being computed, and nodes that only order work on other streams
are placed where that walk happens to reach them.  A collective queued on a communication
stream (symgpu/gpu/runtime/comm_stream.py) overlaps the computation queued between it and its
join, so it should start as early, and be joined as late, as the data allow:

* an op whose ``schedule_hint`` is ``"early"`` (a collective) runs right after its
  ancestors, which run first: repeatedly, the early node with the fewest ancestors not yet
  placed (the bucket the backward pass finishes first: the last layers' gradients) is placed
  with those ancestors, in their original order.  So the rest of the graph (the earlier
  layers' gradients) is computed while the collective runs;
* an op whose hint is ``"late"`` (a join) runs right before the first node that reads its
  outputs (or at the end, before the function returns, when only outputs read it);
* every other node keeps its original relative order.

Backend-free: hints are op attributes, so the core knows nothing of streams.  Any
topological order is valid for the VM: the destroy handler lets a node overwrite only a
variable no other node reads (symgpu/graph/rewriting/destroy.py).
"""
from __future__ import annotations

from typing import Sequence

from symgpu.graph.basic import Apply

__all__ = ["hinted_order", "schedule_hint"]


def schedule_hint(node: Apply) -> str | None:
    """``node``'s op's ``schedule_hint``: "early", "late" or None."""
    return getattr(node.op, "schedule_hint", None)


def _bits(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _ancestor_masks(early: list[int], parents: list[list[int]], n: int) -> dict[int, int]:
    """The ancestors of each early node as a bit mask (bit j: node j), by a walk up from it
    that stops at early nodes already done (their masks are or-ed in): memory in the early
    nodes only, time in the nodes walked (a chain of collectives walks each node once)."""
    masks: dict[int, int] = {}
    for i in sorted(early):          # an early ancestor has a smaller index: done first
        bits = bytearray((n + 7) // 8)
        extra = 0
        seen = set(parents[i])
        stack = list(seen)
        while stack:
            j = stack.pop()
            bits[j >> 3] |= 1 << (j & 7)
            if j in masks:
                extra |= masks[j]
                continue
            for p in parents[j]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        masks[i] = int.from_bytes(bits, "little") | extra
    return masks


def hinted_order(nodes: Sequence[Apply]) -> list[Apply]:
    """``nodes`` (a topological order) with early nodes moved up and late nodes moved down
    (see the module's docstring); the same list when no node has a hint."""
    nodes = list(nodes)
    hints = [schedule_hint(n) for n in nodes]
    if not any(hints):
        return nodes
    n = len(nodes)
    index = {node: i for i, node in enumerate(nodes)}
    parents = [sorted({index[v.owner] for v in node.inputs if v.owner in index})
               for node in nodes]
    placed = [False] * n
    order: list[int] = []
    placed_mask = 0
    early = [i for i, h in enumerate(hints) if h == "early"]
    if early:
        ancestors = _ancestor_masks(early, parents, n)
        remaining = list(early)
        while remaining:
            best = min(remaining, key=lambda i: ((ancestors[i] & ~placed_mask).bit_count(), i))
            remaining.remove(best)
            if placed[best]:
                continue   # an ancestor of an early node placed before
            for j in _bits(ancestors[best] & ~placed_mask) + [best]:
                placed[j] = True
                order.append(j)
                placed_mask |= 1 << j
    late = [h == "late" for h in hints]
    deferred: list[int] = []

    def emit(i: int) -> None:
        # unplaced parents of a node met in the original order are deferred late nodes
        # (every node before it was placed or deferred), and so are theirs
        stack, todo = [i], []
        while stack:
            j = stack.pop()
            if placed[j]:
                continue
            todo.append(j)
            stack.extend(p for p in parents[j] if not placed[p])
        for j in sorted(set(todo)):   # original order is topological
            if not placed[j]:
                placed[j] = True
                order.append(j)

    for i in range(n):
        if placed[i]:
            continue
        if late[i]:
            deferred.append(i)
            continue
        emit(i)
    for i in deferred:
        emit(i)
    return [nodes[i] for i in order]
