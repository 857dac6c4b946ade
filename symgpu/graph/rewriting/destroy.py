"""The destroy handler: which variables an in-place op may overwrite.

Policy (simple on purpose, so it is obviously right):

* never a graph input — an explicit argument (the caller's array), a constant, or a shared
  variable, *whether or not it is updated*. Updates therefore compute into fresh memory and
  the function swaps it in after the whole call succeeded, which keeps the promise that a
  call that raises leaves every shared variable as it was. The cost is one copy of each
  updated value per call (e.g. `Gemv` on `w` copies `w` before accumulating into it);
* never a function output (the caller receives it);
* only a variable read by no other node (exactly one client: the destroyer), so no ordering
  constraint between readers and the destroyer is ever needed;
* through views: destroying a view destroys its base, so the base must pass the same test.

One narrow exception: an input tagged ``loop_scratch`` (a GPU loop body's recurrent state
whose memory the loop itself owns and hands to no one else: symgpu/gpu/ops/scan_op.py) may be
overwritten, under the other rules, so an accumulator is updated in place at every step.

Why SGD updates are not in place (measured on an H100 for issues 16/18): ``W - lr * g`` is a
GpuElemwise that destroys its gradient input (an intermediate), and the CUDA-graph runner then
copies the result into W's buffer (symgpu/gpu/exec/graph_segment.py ``copy_back``), or, in a
captured graph where its rules allow, has the elemwise write it into W's buffer directly
(graph_segment ``DIRECT_UPDATES``: the runner, not the graph, orders the readers of W before
it and knows that nothing can fail after it). Letting it
destroy W instead would need, besides an exception to the first rule: (1) an ordering edge
from every other reader of W to the destroyer -- the input-gradient product ``d @ W.T`` is not
an ancestor of W's update, and neither ``io_toposort`` nor the runner's
``graph_plan.schedule`` knows any edge but data dependencies; (2) no failure after the
destroyer (device checks such as the label check of the cross-entropy report at the next
sync; a plain run can raise in a later node). An experiment that lifted the first and third
rules for updated shared variables changed no node: the update picks its first destroyable
input, the gradient, and GpuDot22 has no in-place form.
"""
from __future__ import annotations

from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.rewriting.basic import InconsistencyError

__all__ = ["DestroyHandler", "why_not_destroyable", "attach_destroy_handler"]


def why_not_destroyable(fgraph: FunctionGraph, var: Variable, destroyer: Apply) -> str | None:
    """None if `destroyer` may overwrite `var`; otherwise the reason, in words."""
    if constant_behind(var) is not None:
        return "a constant"  # or a copy of one, which constant folding uploads only once
    if var.owner is None and not getattr(var.tag, "loop_scratch", False):
        return "an input of the function (explicit or shared)"
    if getattr(var.tag, "indestructible", False):
        return "marked indestructible"
    clients = fgraph.clients.get(var, ())
    if any(c == "output" for c, _ in clients):
        return "an output of the function"
    if len(clients) != 1 or clients[0][0] is not destroyer:
        return "read by other nodes"
    owner = var.owner
    if owner is None:   # a loop_scratch input
        return None
    op = owner.op
    for mapping in (getattr(op, "view_map", None) or {}, getattr(op, "destroy_map", None) or {}):
        for j in mapping.get(var.index, ()):
            reason = why_not_destroyable(fgraph, owner.inputs[j], owner)
            if reason is not None:
                return f"a view of {owner.inputs[j]}, which is {reason}"
    return None


class DestroyHandler(Feature):
    """Validates every node with a `destroy_map` against the policy above."""

    def __init__(self) -> None:
        self.destroyers: set[Apply] = set()

    def on_attach(self, fgraph: FunctionGraph) -> None:
        if getattr(fgraph, "destroy_handler", None) not in (None, self):
            raise ValueError("this graph already has a destroy handler")
        fgraph.destroy_handler = self
        self.destroyers = {n for n in fgraph.apply_nodes if getattr(n.op, "destroy_map", None)}

    def on_detach(self, fgraph: FunctionGraph) -> None:
        fgraph.destroy_handler = None

    def on_import(self, fgraph: FunctionGraph, node: Apply, reason) -> None:
        if getattr(node.op, "destroy_map", None):
            self.destroyers.add(node)

    def on_prune(self, fgraph: FunctionGraph, node: Apply, reason) -> None:
        self.destroyers.discard(node)

    def check(self, fgraph: FunctionGraph, node: Apply) -> str | None:
        for ins in node.op.destroy_map.values():
            for i in ins:
                reason = why_not_destroyable(fgraph, node.inputs[i], node)
                if reason is not None:
                    return f"{node.op} would overwrite input {i} ({node.inputs[i]}), which is {reason}"
        return None

    def validate(self, fgraph: FunctionGraph) -> None:
        for node in self.destroyers:
            reason = self.check(fgraph, node)
            if reason is not None:
                raise InconsistencyError(reason)


def attach_destroy_handler(fgraph: FunctionGraph) -> DestroyHandler:
    """The graph's destroy handler, attaching one if it has none."""
    dh = getattr(fgraph, "destroy_handler", None)
    if dh is None:
        dh = DestroyHandler()
        fgraph.attach_feature(dh)
    return dh
