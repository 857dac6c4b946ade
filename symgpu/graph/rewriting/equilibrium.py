"""The equilibrium driver: apply node rewrites until none of them changes anything.

The first round visits every node once. A ChangeTracker feature then records the nodes that
were imported or had an input changed; later rounds revisit only those and the nodes a few
steps downstream of them (patterns look a few levels into a node's inputs), so a graph of
thousands of nodes with a handful of late changes does not pay a full sweep per change.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Sequence

from symgpu.graph.basic import Apply
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.rewriting.basic import (GraphRewriter, NodeRewriter, RewriterIndex,
                                          apply_node_rewriter)

__all__ = ["ChangeTracker", "EquilibriumRewriter"]


class ChangeTracker(Feature):
    """Remembers (in order) the nodes imported or rewired since the last `take()`."""

    def __init__(self) -> None:
        self.changed: dict[Apply, None] = {}

    def on_import(self, fgraph: FunctionGraph, node: Apply, reason) -> None:
        self.changed[node] = None

    def on_change_input(self, fgraph: FunctionGraph, node, i, old, new, reason) -> None:
        if node != "output":
            self.changed[node] = None

    def take(self) -> list[Apply]:
        out = list(self.changed)
        self.changed.clear()
        return out


class EquilibriumRewriter(GraphRewriter):
    """Apply `rewriters` (and after each round the `final` graph rewriters, e.g. merge) until
    a round changes nothing.

    `lookahead`: how many client levels below a changed node are revisited (a pattern such as
    log(1 + exp(x)) sees two levels of inputs). `max_use_ratio` bounds the total number of
    applied rewrites (times the node count) so a pair of rewrites undoing each other cannot
    loop forever; hitting it warns and names the busiest rewrites.
    """

    def __init__(self, rewriters: Sequence[NodeRewriter], final: Sequence[GraphRewriter] = (),
                 name: str = "equilibrium", lookahead: int = 3, max_use_ratio: float = 12.0):
        super().__init__(None, name)
        self.rewriters = list(rewriters)
        self.index = RewriterIndex(self.rewriters)
        self.final = list(final)
        self.lookahead = lookahead
        self.max_use_ratio = max_use_ratio
        #: filled by apply(): how many times each rewrite changed the graph
        self.last_counts: Counter = Counter()

    def _expand(self, fgraph: FunctionGraph, nodes: list[Apply]) -> set[Apply]:
        todo = {n for n in nodes if n in fgraph.apply_nodes}
        frontier = list(todo)
        for _ in range(self.lookahead):
            nxt = []
            for n in frontier:
                for o in n.outputs:
                    for client, _i in fgraph.clients.get(o, ()):
                        if client != "output" and client not in todo:
                            todo.add(client)
                            nxt.append(client)
            if not nxt:
                break
            frontier = nxt
        return todo

    def apply(self, fgraph: FunctionGraph) -> int:
        tracker = ChangeTracker()
        fgraph.attach_feature(tracker)
        counts: Counter = Counter()
        budget = int(self.max_use_ratio * max(len(fgraph.apply_nodes), 10)) + 100
        total = 0
        try:
            todo: set[Apply] | None = None  # None: the whole graph
            while True:
                order = fgraph.toposort()
                if todo is not None:
                    order = [n for n in order if n in todo]
                for node in order:
                    if node not in fgraph.apply_nodes:
                        continue
                    for rw in self.index.get(node.op):
                        if apply_node_rewriter(fgraph, node, rw):
                            counts[rw.name] += 1
                            total += 1
                            break
                    if total > budget:
                        break
                for g in self.final:
                    g.apply(fgraph)
                changed = tracker.take()
                if not changed:
                    break
                if total > budget:
                    busiest = ", ".join(f"{n} ({c})" for n, c in counts.most_common(3))
                    warnings.warn(f"{self.name}: stopped after {total} rewrites without reaching "
                                  f"a fixed point; busiest rewrites: {busiest}", RuntimeWarning)
                    break
                todo = self._expand(fgraph, changed)
                if not todo:
                    break
        finally:
            fgraph.remove_feature(tracker)
        self.last_counts = counts
        return total
