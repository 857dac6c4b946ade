"""Node rewrites, graph rewrites, and applying replacements safely.

A *node rewrite* is a small pure function `(fgraph, node) -> replacements | None`: a list aligned
with `node.outputs` (None entries keep that output) or a dict `{old_var: new_var}`. It never
mutates the graph itself; the driver validates the replacement (types, destroy rules), copies
the user's creation trace onto the new nodes, and performs it. That keeps each rewrite
testable on its own and lets one driver (equilibrium, one sweep, ...) run any set of them.

A *graph rewrite* is a callable `(fgraph) -> None` that may change the graph freely through
`fgraph.replace` / `replace_validate` (merge, fusion, in-place).
"""
from __future__ import annotations

import sys
import traceback
import warnings
from typing import Any, Callable, Iterable, Sequence

from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op

__all__ = [
    "NodeRewriter", "node_rewriter", "GraphRewriter", "graph_rewriter", "InconsistencyError",
    "copy_stack_trace", "replace_validate", "apply_node_rewriter", "WalkingRewriter",
    "in2out", "out2in", "RewriteSettings", "settings", "sweep", "try_replace",
    "same_typed_outputs",
]


class InconsistencyError(Exception):
    """A replacement would break a graph invariant (e.g. an op destroying a graph input)."""


class RewriteSettings:
    """Process-wide knobs of the driver (tests set `on_error='raise'`).

    `on_error`: what a rewrite that raises does — 'warn' (skip it, the graph stays correct) or
    'raise'. `verbose`: print every applied replacement (rewrite name, old -> new)."""

    def __init__(self) -> None:
        self.on_error = "warn"
        self.verbose = False


settings = RewriteSettings()


# ----------------------------------------------------------------------------- node rewrites

class NodeRewriter:
    """A named local rewrite with the op classes (or op instances) it looks at.

    `tracks`: Op subclasses (matched with isinstance) and/or Op instances (matched with ==);
    None means every node. Drivers only call the rewrite on nodes it tracks.
    """

    def __init__(self, fn: Callable[[FunctionGraph, Apply], Any], tracks: Sequence[Any] | None = None,
                 name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.tags: set[str] = set()
        self.track_classes: tuple[type, ...] = ()
        self.track_instances: tuple[Any, ...] = ()
        if tracks is not None:
            self.track_classes = tuple(t for t in tracks if isinstance(t, type))
            self.track_instances = tuple(t for t in tracks if not isinstance(t, type))
        self.tracks_all = tracks is None
        self.__doc__ = fn.__doc__
        self.__name__ = self.name

    def tracks_op(self, op: Any) -> bool:
        if self.tracks_all:
            return True
        if self.track_classes and isinstance(op, self.track_classes):
            return True
        return any(op == t for t in self.track_instances)

    def transform(self, fgraph: FunctionGraph, node: Apply) -> Any:
        return self.fn(fgraph, node)

    __call__ = transform

    def __repr__(self) -> str:
        return f"NodeRewriter({self.name})"


def node_rewriter(tracks: Sequence[Any] | None) -> Callable[[Callable], NodeRewriter]:
    """Decorator: make `fn(fgraph, node)` a NodeRewriter looking at `tracks` (op classes or ops)."""
    if tracks is not None and not isinstance(tracks, (list, tuple)):
        raise TypeError("node_rewriter takes a list of op classes or op instances (or None)")

    def deco(fn: Callable) -> NodeRewriter:
        return NodeRewriter(fn, tracks)

    return deco


class GraphRewriter:
    """A whole-graph rewrite: `apply(fgraph)` changes the graph in place."""

    def __init__(self, fn: Callable[[FunctionGraph], Any] | None = None, name: str | None = None):
        self.fn = fn
        self.name = name or (fn.__name__ if fn is not None else type(self).__name__)
        self.tags: set[str] = set()

    def apply(self, fgraph: FunctionGraph) -> Any:
        return self.fn(fgraph)

    def __call__(self, fgraph: FunctionGraph) -> Any:
        return self.apply(fgraph)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


def graph_rewriter(fn: Callable[[FunctionGraph], Any]) -> GraphRewriter:
    """Decorator: make `fn(fgraph)` a GraphRewriter."""
    return GraphRewriter(fn)


# ----------------------------------------------------------------------------- replacing

def copy_stack_trace(old: Variable, new: Variable, fgraph: FunctionGraph | None = None) -> None:
    """Give the nodes a rewrite created for `new` the creation trace of `old`'s node.

    Nodes built inside a rewrite would otherwise point at the `function(...)` call; with the
    trace copied, a runtime error names the user's line that built the replaced expression.
    Nodes that are already in `fgraph` keep their own trace.
    """
    src = old.owner
    trace = getattr(src.tag, "trace", None) if src is not None else None
    if not trace:
        return
    known = fgraph.variables if fgraph is not None else ()
    stack = [new]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        node = v.owner
        if node is None or v in known or id(node) in seen:
            continue
        seen.add(id(node))
        node.tag.trace = trace
        for o in node.outputs:
            o.tag.trace = trace
        stack.extend(node.inputs)


def check_stack_trace(f_or_fgraph: Any, ops_to_check: Any = "last",
                      bug_print: str = "raise") -> bool:
    """Theano's ``theano.gof.opt.check_stack_trace``: whether the outputs of the nodes chosen
    by `ops_to_check` in a compiled function (or FunctionGraph) carry a creation trace, the
    trace a runtime error names the user's line from (so a rewrite that forgot
    copy_stack_trace shows here).

    `ops_to_check`: ``'last'`` (the nodes of the graph's outputs), ``'all'``, an Op instance or
    class or a list/tuple of them (a class matches an Elemwise's scalar op too), or a predicate
    on Apply nodes. `bug_print` says what happens when nothing matches: ``'raise'``, ``'warn'``
    or ``'ignore'`` (then True).
    """
    maker = getattr(f_or_fgraph, "maker", None)   # a compiled Function (a layer above)
    fgraph = maker.fgraph if maker is not None else f_or_fgraph
    if not isinstance(fgraph, FunctionGraph):
        raise ValueError("check_stack_trace: expected a compiled function or a FunctionGraph, "
                         f"got {type(f_or_fgraph).__name__}")
    if isinstance(ops_to_check, Op) or (isinstance(ops_to_check, type)
                                        and issubclass(ops_to_check, Op)):
        ops_to_check = (ops_to_check,)
    if isinstance(ops_to_check, str):
        if ops_to_check == "last":
            nodes = [o.owner for o in fgraph.outputs if o.owner is not None]
        elif ops_to_check == "all":
            nodes = list(fgraph.apply_nodes)
        else:
            raise ValueError(f"check_stack_trace: ops_to_check {ops_to_check!r} is neither "
                             "'last' nor 'all'")
    elif isinstance(ops_to_check, (tuple, list)):
        classes = tuple(o for o in ops_to_check if isinstance(o, type))
        instances = [o for o in ops_to_check if not isinstance(o, type)]
        nodes = [n for n in fgraph.apply_nodes
                 if any(n.op == i for i in instances) or isinstance(n.op, classes)
                 or isinstance(getattr(n.op, "scalar_op", None), classes)]
    elif callable(ops_to_check):
        nodes = [n for n in fgraph.apply_nodes if ops_to_check(n)]
    else:
        raise ValueError("check_stack_trace: ops_to_check must be 'last', 'all', an op, an op "
                         f"class, a list of them or a predicate, got {type(ops_to_check).__name__}")
    if not nodes:
        msg = "check_stack_trace: the ops asked for are not in the graph, or it is empty"
        if bug_print == "raise":
            raise ValueError(msg)
        if bug_print == "warn":
            warnings.warn(msg, stacklevel=2)
        elif bug_print != "ignore":
            raise ValueError(f"check_stack_trace: bug_print {bug_print!r} is not 'raise', "
                             "'warn' or 'ignore'")
        return True
    return all(getattr(o.tag, "trace", None) for n in nodes for o in n.outputs)


def _as_pairs(node: Apply, result: Any, name: str) -> list[tuple[Variable, Variable]]:
    if isinstance(result, dict):
        return [(k, v) for k, v in result.items() if v is not None and k is not v]
    if isinstance(result, Variable):
        result = [result]
    result = list(result)
    if len(result) != len(node.outputs):
        raise ValueError(f"rewrite {name} returned {len(result)} replacement(s) for a node with "
                         f"{len(node.outputs)} output(s) ({node.op})")
    return [(o, n) for o, n in zip(node.outputs, result) if n is not None and o is not n]


def replace_validate(fgraph: FunctionGraph, pairs: Sequence[tuple[Variable, Variable]],
                     reason: str | None = None) -> None:
    """Replace each old variable by its new one, then validate the graph's features.

    If a feature (e.g. the destroy handler) rejects the result, every change is undone and
    InconsistencyError is raised, so the graph is never left half-rewritten.
    """
    log: list[tuple[Any, int, Variable]] = []
    for old, new in pairs:
        if old not in fgraph.variables:
            continue
        for client, i in list(fgraph.clients[old]):
            log.append((client, i, old))
        fgraph.replace(old, new, reason=reason)
    try:
        fgraph.validate()
    except InconsistencyError:
        for client, i, old in reversed(log):
            if client == "output" or client in fgraph.apply_nodes:
                fgraph.change_node_input(client, i, old, reason="undo")
        raise


def try_replace(fgraph: FunctionGraph, pairs: Sequence[tuple[Variable, Variable]],
                reason: str) -> bool:
    """`replace_validate`, or nothing (False) where the graph's features refuse the result."""
    try:
        replace_validate(fgraph, pairs, reason=reason)
    except InconsistencyError:
        return False
    return True


def same_typed_outputs(old: Apply, make: Callable[[], Sequence[Variable]]) -> list | None:
    """``make()``'s variables as replacements of ``old``'s outputs, or None when it refuses
    its inputs (TypeError, ValueError) or they differ in type from ``old``'s (a sweep's
    local rewrite declines instead of failing)."""
    try:
        new = list(make())
    except (TypeError, ValueError):
        return None
    return new if all(a.type == b.type for a, b in zip(old.outputs, new)) else None


def sweep(fgraph: FunctionGraph, local: Callable[[FunctionGraph, Apply], list | None],
          reason: str) -> int:
    """Apply ``local(fgraph, node)`` to every node once, in topological order: one pass, for
    fusions whose results are final. ``local`` returns None, a list of variables replacing
    the node's first outputs (the new node keeps the old one's creation trace), or a list of
    ``(old, new)`` pairs (a rewrite of several nodes at once: all of them or none). A
    replacement the graph's features refuse is skipped. Returns how many were made."""
    changed = 0
    for node in list(fgraph.toposort()):
        if node not in fgraph.apply_nodes:
            continue
        new = local(fgraph, node)
        if not new:
            continue
        if isinstance(new[0], tuple):
            pairs = new
        else:
            new[0].owner.tag.trace = getattr(node.tag, "trace", [])
            pairs = list(zip(node.outputs, new))
        changed += try_replace(fgraph, pairs, reason)
    return changed


def _check_types(old: Variable, new: Variable, name: str) -> Variable:
    if old.type == new.type:
        return new
    converted = old.type.convert_variable(new)
    if converted is None:
        raise TypeError(f"rewrite {name} replaced {old} ({old.type}) by {new} ({new.type}); "
                        "a replacement must have the same type")
    return converted


def apply_node_rewriter(fgraph: FunctionGraph, node: Apply, rewriter: NodeRewriter) -> bool:
    """Run one node rewrite on one node and perform its replacement; True if the graph changed."""
    try:
        result = rewriter.transform(fgraph, node)
    except Exception as exc:  # a buggy rewrite must not break compilation
        _rewrite_failed(rewriter.name, node, exc)
        return False
    if result is None or result is False:
        return False
    try:
        pairs = _as_pairs(node, result, rewriter.name)
        pairs = [(o, _check_types(o, n, rewriter.name)) for o, n in pairs]
    except Exception as exc:  # a buggy rewrite's result: reported by _rewrite_failed, skipped
        _rewrite_failed(rewriter.name, node, exc)
        return False
    if not pairs:
        return False
    for old, new in pairs:
        copy_stack_trace(old, new, fgraph)
    if settings.verbose:
        for old, new in pairs:
            print(f"rewrite {rewriter.name}: {old} -> {new}", file=sys.stderr)
    try:
        replace_validate(fgraph, pairs, reason=rewriter.name)
    except InconsistencyError:
        return False
    return True


def _rewrite_failed(name: str, node: Apply, exc: Exception) -> None:
    if settings.on_error == "raise":
        raise exc
    warnings.warn(f"rewrite {name} failed on {node} and was skipped: "
                  f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}",
                  RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------- one sweep

class RewriterIndex:
    """Node rewriters indexed by op class, so a driver looks only at those that can apply."""

    def __init__(self, rewriters: Iterable[NodeRewriter]):
        self.rewriters = list(rewriters)
        self._by_class: dict[type, list[tuple[NodeRewriter, bool]]] = {}

    def get(self, op: Any) -> list[NodeRewriter]:
        """The rewriters to try on a node with this op, in registration order."""
        cls = type(op)
        cands = self._by_class.get(cls)
        if cands is None:
            cands = []
            for r in self.rewriters:
                if r.tracks_all or (r.track_classes and isinstance(op, r.track_classes)):
                    cands.append((r, False))
                elif any(isinstance(op, type(t)) for t in r.track_instances):
                    cands.append((r, True))
            self._by_class[cls] = cands
        return [r for r, check in cands if not check or any(op == t for t in r.track_instances)]


class WalkingRewriter(GraphRewriter):
    """One sweep over the graph in topological order (in2out) or reversed (out2in),
    applying the first node rewrite that changes each node."""

    def __init__(self, rewriters: Sequence[NodeRewriter], order: str = "in_to_out",
                 name: str | None = None):
        super().__init__(None, name or "+".join(r.name for r in rewriters))
        self.index = RewriterIndex(rewriters)
        self.order = order

    def apply(self, fgraph: FunctionGraph) -> int:
        nodes = fgraph.toposort()
        if self.order == "out_to_in":
            nodes.reverse()
        changes = 0
        for node in nodes:
            if node not in fgraph.apply_nodes:
                continue
            for rw in self.index.get(node.op):
                if apply_node_rewriter(fgraph, node, rw):
                    changes += 1
                    break
        return changes


def in2out(*rewriters: NodeRewriter, name: str | None = None) -> WalkingRewriter:
    """A single input-to-output sweep of these node rewrites."""
    return WalkingRewriter(rewriters, "in_to_out", name)


def out2in(*rewriters: NodeRewriter, name: str | None = None) -> WalkingRewriter:
    """A single output-to-input sweep of these node rewrites."""
    return WalkingRewriter(rewriters, "out_to_in", name)


def is_constant(var: Variable) -> bool:
    return isinstance(var, Constant)
