"""Theano's `gof.toolbox` features: FunctionGraph listeners that keep books on a graph.

- `Bookkeeper`: replays `on_import` for every node when attached and `on_prune` when detached.
- `History`: records every input change; `fgraph.checkpoint()` and `fgraph.revert(chk)` undo
  the changes made since a checkpoint, last first.
- `Validator`: gives the graph `consistent()` (whether `validate()` passes).
- `ReplaceValidate`: History and Validator together, and `fgraph.replace_validate(r, new_r)`,
  `replace_all_validate(pairs)`, `replace_all_validate_remove(pairs, remove)`: replacements
  that are undone (and the error re-raised) when a feature's `validate` refuses the result.
- `NodeFinder`: an index from op to the nodes applying it; `fgraph.get_nodes(op)`.
- `PrintListener`: prints every callback.

Methods a feature adds to the graph are plain attributes of the FunctionGraph object; adding
one that is already there raises `AlreadyThere` (two features of one kind on one graph).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable, Sequence

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.rewriting.basic import InconsistencyError

__all__ = ["AlreadyThere", "Bookkeeper", "History", "Validator", "ReplaceValidate",
           "NodeFinder", "PrintListener", "ReplacementDidNotRemoveError"]


class AlreadyThere(Exception):
    """The graph already has an attribute this feature would add (Theano's AlreadyThere)."""


def _add_methods(fgraph: FunctionGraph, methods: dict[str, Callable]) -> None:
    for name in methods:
        if name in vars(fgraph):
            raise AlreadyThere(f"the graph already has {name!r}: is a feature of this kind "
                               "attached twice?")
    for name, fn in methods.items():
        setattr(fgraph, name, fn)


def _remove_methods(fgraph: FunctionGraph, names: Iterable[str]) -> None:
    for name in names:
        vars(fgraph).pop(name, None)


class Bookkeeper(Feature):
    """On attach, `on_import(fgraph, node, 'on_attach')` for every node in order; on detach,
    `on_prune(fgraph, node, 'Bookkeeper.detach')` for every node."""

    def on_attach(self, fgraph: FunctionGraph) -> None:
        for node in fgraph.toposort():
            self.on_import(fgraph, node, "on_attach")

    def on_detach(self, fgraph: FunctionGraph) -> None:
        for node in fgraph.toposort():
            self.on_prune(fgraph, node, "Bookkeeper.detach")


class History(Feature):
    """Records each `on_change_input`; `revert(fgraph, checkpoint)` undoes the changes made
    after `checkpoint` (a length of the record, from `fgraph.checkpoint()`)."""

    pickle_rm_attr = ["checkpoint", "revert"]

    def __init__(self) -> None:
        self.history: dict[FunctionGraph, list | None] = {}

    def on_attach(self, fgraph: FunctionGraph) -> None:
        _add_methods(fgraph, {"checkpoint": lambda: len(self.history[fgraph]),
                              "revert": partial(self.revert, fgraph)})
        self.history[fgraph] = []

    def on_detach(self, fgraph: FunctionGraph) -> None:
        _remove_methods(fgraph, ("checkpoint", "revert"))
        self.history.pop(fgraph, None)

    def on_change_input(self, fgraph: FunctionGraph, node: Any, i: int, r: Variable,
                        new_r: Variable, reason: str | None = None) -> None:
        record = self.history.get(fgraph)
        if record is None:  # not attached, or reverting
            return
        record.append((node, i, r))

    def revert(self, fgraph: FunctionGraph, checkpoint: int) -> None:
        """Undo, last first, every change recorded after `checkpoint`."""
        record = self.history[fgraph]
        self.history[fgraph] = None  # the undoing changes are not recorded
        try:
            while len(record) > checkpoint:
                node, i, r = record.pop()
                fgraph.change_node_input(node, i, r, reason="Revert")
        finally:
            self.history[fgraph] = record


class Validator(Feature):
    """Gives the graph `consistent()`: True when every feature's `validate` passes, False
    when one raises `InconsistencyError`. (`fgraph.validate()` itself is FunctionGraph's.)"""

    def on_attach(self, fgraph: FunctionGraph) -> None:
        _add_methods(fgraph, {"consistent": partial(self.consistent_, fgraph)})

    def on_detach(self, fgraph: FunctionGraph) -> None:
        _remove_methods(fgraph, ("consistent",))

    @staticmethod
    def consistent_(fgraph: FunctionGraph) -> bool:
        try:
            fgraph.validate()
            return True
        except InconsistencyError:
            return False


class ReplaceValidate(History, Validator):
    """History and Validator, plus replacements that are undone when validation fails:
    `fgraph.replace_validate(r, new_r, reason=None)`, `fgraph.replace_all_validate(pairs,
    reason=None)` and `fgraph.replace_all_validate_remove(pairs, remove, reason=None,
    warn=True)` (which also fails, undone, if a node of `remove` is still in the graph)."""

    _METHODS = ("replace_validate", "replace_all_validate", "replace_all_validate_remove")

    def on_attach(self, fgraph: FunctionGraph) -> None:
        History.on_attach(self, fgraph)
        Validator.on_attach(self, fgraph)
        _add_methods(fgraph, {name: partial(getattr(self, name), fgraph)
                              for name in self._METHODS})

    def on_detach(self, fgraph: FunctionGraph) -> None:
        History.on_detach(self, fgraph)
        Validator.on_detach(self, fgraph)
        _remove_methods(fgraph, self._METHODS)

    def replace_validate(self, fgraph: FunctionGraph, r: Variable, new_r: Variable,
                         reason: str | None = None) -> None:
        self.replace_all_validate(fgraph, [(r, new_r)], reason=reason)

    def replace_all_validate(self, fgraph: FunctionGraph,
                             replacements: Sequence[tuple[Variable, Variable]],
                             reason: str | None = None) -> None:
        chk = fgraph.checkpoint()
        try:
            for r, new_r in replacements:
                fgraph.replace(r, new_r, reason=reason)
            fgraph.validate()
        except BaseException:  # any failure (a refused type, a validator): undo, then re-raise
            fgraph.revert(chk)
            raise

    def replace_all_validate_remove(self, fgraph: FunctionGraph,
                                    replacements: Sequence[tuple[Variable, Variable]],
                                    remove: Iterable[Apply], reason: str | None = None,
                                    warn: bool = True) -> None:
        chk = fgraph.checkpoint()
        self.replace_all_validate(fgraph, replacements, reason=reason)
        for node in remove:
            if node in fgraph.apply_nodes:
                fgraph.revert(chk)
                raise ReplacementDidNotRemoveError(
                    f"the replacements [{reason}] left {node} in the graph, which they should "
                    "have removed")


class ReplacementDidNotRemoveError(Exception):
    """`replace_all_validate_remove` left a node of `remove` in the graph (undone)."""


class NodeFinder(Bookkeeper):
    """An index op -> nodes applying it, kept up to date; `fgraph.get_nodes(op)` (or
    `finder.query(fgraph, op)`) lists them."""

    def __init__(self) -> None:
        self.fgraph: FunctionGraph | None = None
        self.d: dict[Any, list[Apply]] = {}

    def on_attach(self, fgraph: FunctionGraph) -> None:
        if self.fgraph is not None:
            raise AlreadyThere("this NodeFinder is already attached to another graph")
        _add_methods(fgraph, {"get_nodes": partial(self.query, fgraph)})
        self.fgraph = fgraph
        Bookkeeper.on_attach(self, fgraph)

    def on_detach(self, fgraph: FunctionGraph) -> None:
        if self.fgraph is not fgraph:
            raise ValueError("this NodeFinder is attached to another graph")
        Bookkeeper.on_detach(self, fgraph)
        _remove_methods(fgraph, ("get_nodes",))
        self.fgraph = None

    def on_import(self, fgraph: FunctionGraph, node: Apply, reason: str | None) -> None:
        nodes = self.d.setdefault(node.op, [])
        if node not in nodes:
            nodes.append(node)

    def on_prune(self, fgraph: FunctionGraph, node: Apply, reason: str | None) -> None:
        nodes = self.d.get(node.op)
        if nodes and node in nodes:
            nodes.remove(node)
            if not nodes:
                del self.d[node.op]

    def query(self, fgraph: FunctionGraph, op: Any) -> list[Apply]:
        return list(self.d.get(op, []))


class PrintListener(Feature):
    """Prints each callback it hears while `active`."""

    def __init__(self, active: bool = True) -> None:
        self.active = active

    def on_attach(self, fgraph: FunctionGraph) -> None:
        if self.active:
            print("-- attaching to: ", fgraph)

    def on_detach(self, fgraph: FunctionGraph) -> None:
        if self.active:
            print("-- detaching from: ", fgraph)

    def on_import(self, fgraph: FunctionGraph, node: Apply, reason: str | None) -> None:
        if self.active:
            print(f"-- importing: {node}, reason: {reason}")

    def on_prune(self, fgraph: FunctionGraph, node: Apply, reason: str | None) -> None:
        if self.active:
            print(f"-- pruning: {node}, reason: {reason}")

    def on_change_input(self, fgraph: FunctionGraph, node: Any, i: int, r: Variable,
                        new_r: Variable, reason: str | None = None) -> None:
        if self.active:
            print(f"-- changing ({node}.inputs[{i}]) from {r} to {new_r}")
