"""A layered drawing of a DAG, computed in Python so the page needs no layout library.

Sugiyama's scheme, kept small: longest-path layering (sources pulled down next to their
first reader, so constants do not all sit on the top row), virtual points on edges that span
several layers, barycenter ordering sweeps (the ordering with the fewest crossings is kept),
then x positions pulled towards each node's neighbours without overlapping.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Hashable, Sequence

__all__ = ["Layout", "layered_layout", "count_crossings"]

#: space between nodes of one layer, and between layers (pixels)
NODE_GAP = 24.0
LAYER_GAP = 56.0
MARGIN = 20.0
#: marks the virtual points of long edges (tuples that no caller's node can equal)
_VIRTUAL = object()
#: barycenter sweeps (down and up alternate)
SWEEPS = 12
#: adjacent swaps after the sweeps only up to this many points (nodes and virtual points):
#: each round costs a pass over every pair of neighbours' edges
TRANSPOSE_LIMIT = 3000
#: at most this many virtual points on long edges (beyond: long edges are drawn straight)
POINTS_LIMIT = 20000


@dataclass
class Layout:
    positions: dict[Hashable, tuple[float, float]]  # node -> centre
    edges: list[list[tuple[float, float]]]          # per edge: its points, source to target
    width: float
    height: float
    layers: list[list[Hashable]]                    # the order found, virtual points included
    crossings: int


def _topo(nodes: Sequence[Hashable], succ: dict) -> list[Hashable]:
    """Kahn's order keeping the given order among ready nodes; nodes of a cycle (not
    expected: the graphs are DAGs) are appended in their given order."""
    indeg = {n: 0 for n in nodes}
    for n in nodes:
        for s in succ[n]:
            indeg[s] += 1
    pos = {n: i for i, n in enumerate(nodes)}
    ready = [(pos[n], n) for n in nodes if indeg[n] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(n)
        for s in succ[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (pos[s], s))
    seen = set(out)
    return out + [n for n in nodes if n not in seen]


def _inversions(seq: list[int], size: int) -> int:
    """Pairs i < j with seq[i] > seq[j], for values in range(size) (a Fenwick tree)."""
    tree = [0] * (size + 1)
    count = 0
    for seen, v in enumerate(seq):
        i, not_above = v + 1, 0
        while i > 0:  # how many earlier values are <= v
            not_above += tree[i]
            i -= i & -i
        count += seen - not_above
        i = v + 1
        while i <= size:
            tree[i] += 1
            i += i & -i
    return count


def count_crossings(layers: list[list[Hashable]], succ: dict) -> int:
    """Edge crossings between adjacent layers of an ordering (edges join adjacent layers)."""
    total = 0
    for upper, lower in zip(layers, layers[1:]):
        pos = {n: i for i, n in enumerate(lower)}
        pairs = sorted((i, pos[s]) for i, n in enumerate(upper) for s in succ.get(n, ())
                       if s in pos)
        total += _inversions([b for _, b in pairs], len(lower))
    return total


def _transpose(layers: list[list[Hashable]], pred: dict, succ: dict, rounds: int = 8) -> None:
    """Swap neighbours of a layer wherever that removes crossings (after the barycenter
    sweeps, which leave such local improvements)."""
    for _ in range(rounds):
        improved = False
        for r, layer in enumerate(layers):
            up = {n: i for i, n in enumerate(layers[r - 1])} if r else {}
            down = {n: i for i, n in enumerate(layers[r + 1])} if r + 1 < len(layers) else {}

            def cross(u: Hashable, v: Hashable) -> int:
                """Crossings of u's and v's edges with u placed left of v."""
                c = 0
                for ref, nbrs in ((up, pred), (down, succ)):
                    pu = [ref[m] for m in nbrs.get(u, ()) if m in ref]
                    pv = [ref[m] for m in nbrs.get(v, ()) if m in ref]
                    c += sum(1 for a in pu for b in pv if a > b)
                return c
            for i in range(len(layer) - 1):
                u, v = layer[i], layer[i + 1]
                if cross(v, u) < cross(u, v):
                    layer[i], layer[i + 1] = v, u
                    improved = True
        if not improved:
            return


def layered_layout(nodes: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]],
                   sizes: dict[Hashable, tuple[float, float]]) -> Layout:
    """Positions for `nodes` (with `sizes` (width, height)) so that every edge points down.

    `edges` are (source, target) pairs; repeated pairs are drawn once each but laid out as
    one. Returns centres, each edge's polyline and the drawing's size."""
    nodes = list(nodes)
    succ: dict[Hashable, list] = {n: [] for n in nodes}
    pred: dict[Hashable, list] = {n: [] for n in nodes}
    for a, b in dict.fromkeys(edges):
        if a != b:
            succ[a].append(b)
            pred[b].append(a)
    order = _topo(nodes, succ)
    rank: dict[Hashable, int] = {}
    for n in order:  # longest path from the sources
        rank[n] = max((rank[p] + 1 for p in pred[n] if p in rank), default=0)
    for n in reversed(order):  # a source sits just above its first reader
        if not pred[n] and succ[n]:
            rank[n] = max(0, min(rank[s] for s in succ[n]) - 1)

    # virtual points on long edges, one chain per source shared by all its long edges (a
    # value read on many layers, a weight read forward and backward, runs down one trunk;
    # per-edge chains would multiply the points, and the work, by its readers)
    chains: dict[tuple, list[Hashable]] = {}
    vsucc: dict[Hashable, list] = defaultdict(list)
    vpred: dict[Hashable, list] = defaultdict(list)
    vrank = dict(rank)
    linked: set[tuple] = set()

    def link(u: Hashable, v: Hashable) -> None:
        if (u, v) not in linked:
            linked.add((u, v))
            vsucc[u].append(v)
            vpred[v].append(u)
    reach: dict[Hashable, int] = {}
    for a, b in edges:
        reach[a] = max(reach.get(a, 0), rank[b] - rank[a] - 1)
    # a deep graph whose values are read far below (a long training step) would need more
    # points than the sweeps can order in reasonable time: its long edges are drawn straight
    chained = sum(reach.values()) <= POINTS_LIMIT
    for a, b in dict.fromkeys(edges):
        if a == b:
            continue
        ra, rb = rank[a], rank[b]
        if rb <= ra or (rb > ra + 1 and not chained):  # drawn straight, ordered by its ends
            chains[(a, b)] = [a, b]
            if rb > ra:
                link(a, b)
            continue
        chain = [a] + [(_VIRTUAL, a, r) for r in range(ra + 1, rb)] + [b]
        for r, v in zip(range(ra + 1, rb), chain[1:-1]):
            vrank[v] = r
        for u, v in zip(chain, chain[1:]):
            link(u, v)
        chains[(a, b)] = chain
    n_layers = max(vrank.values(), default=-1) + 1
    layers: list[list[Hashable]] = [[] for _ in range(n_layers)]
    topo_pos = {n: i for i, n in enumerate(order)}
    for v in sorted(vrank, key=lambda v: (topo_pos[v] if v in topo_pos else
                                          topo_pos[v[1]] + 0.5)):
        layers[vrank[v]].append(v)

    where = {n: i for layer in layers for i, n in enumerate(layer)}  # index within its layer
    best = [list(layer) for layer in layers]
    best_cross = count_crossings(best, vsucc)
    for sweep in range(SWEEPS):
        if best_cross == 0:
            break
        down = sweep % 2 == 0
        rng = range(1, n_layers) if down else range(n_layers - 2, -1, -1)
        for r in rng:
            ref = layers[r - 1] if down else layers[r + 1]
            pos = {n: i for i, n in enumerate(ref)} if chained else where
            nbrs = vpred if down else vsucc
            current = {n: i for i, n in enumerate(layers[r])}

            def bary(n: Hashable) -> float:
                ps = [pos[m] for m in nbrs[n] if m in pos]
                return sum(ps) / len(ps) if ps else float(current[n])
            layers[r].sort(key=lambda n: (bary(n), current[n]))
            if not chained:
                where.update((n, i) for i, n in enumerate(layers[r]))
        cross = count_crossings(layers, vsucc)
        if cross < best_cross:
            best, best_cross = [list(layer) for layer in layers], cross
    layers = best
    if best_cross and len(vrank) <= TRANSPOSE_LIMIT:
        _transpose(layers, vpred, vsucc)
        best_cross = count_crossings(layers, vsucc)

    def size(v: Hashable) -> tuple[float, float]:
        return sizes.get(v, (2.0, 0.0))  # a virtual point is 2 pixels wide

    # x: packed, then pulled towards the neighbours' mean with the order kept
    x: dict[Hashable, float] = {}
    for layer in layers:
        cur = 0.0
        for v in layer:
            w = size(v)[0]
            x[v] = cur + w / 2
            cur += w + NODE_GAP
        shift = cur / 2
        for v in layer:
            x[v] -= shift
    for it in range(8):
        seq = range(n_layers) if it % 2 == 0 else range(n_layers - 1, -1, -1)
        for r in seq:
            layer = layers[r]
            if not layer:
                continue
            want = []
            for v in layer:
                ns = [x[m] for m in vpred[v] + vsucc[v]]
                want.append(sum(ns) / len(ns) if ns else x[v])
            sep = [(size(a)[0] + size(b)[0]) / 2 + NODE_GAP for a, b in zip(layer, layer[1:])]
            left, right = list(want), list(want)
            for i in range(1, len(layer)):
                left[i] = max(left[i], left[i - 1] + sep[i - 1])
            for i in range(len(layer) - 2, -1, -1):
                right[i] = min(right[i], right[i + 1] - sep[i])
            for v, a, b in zip(layer, left, right):
                x[v] = (a + b) / 2

    y: dict[Hashable, float] = {}
    top = MARGIN
    for layer in layers:
        h = max((size(v)[1] for v in layer), default=0.0)
        for v in layer:
            y[v] = top + h / 2
        top += h + LAYER_GAP
    min_x = min((x[v] - size(v)[0] / 2 for v in x), default=0.0)
    max_x = max((x[v] + size(v)[0] / 2 for v in x), default=0.0)
    for v in x:
        x[v] += MARGIN - min_x
    positions = {n: (x[n], y[n]) for n in nodes}

    def point(v: Hashable, end: str) -> tuple[float, float]:
        if v in sizes:
            h = size(v)[1] / 2
            return (x[v], y[v] + h) if end == "out" else (x[v], y[v] - h)
        return (x[v], y[v])
    lines = []
    for a, b in edges:
        chain = chains.get((a, b), [a, b])
        if a == b:
            lines.append([point(a, "out"), point(a, "in")])
            continue
        lines.append([point(chain[0], "out")] + [point(v, "") for v in chain[1:-1]]
                     + [point(chain[-1], "in")])
    return Layout(positions, lines, max_x - min_x + 2 * MARGIN, max(top - LAYER_GAP + MARGIN,
                                                                      2 * MARGIN),
                  layers, best_cross)
