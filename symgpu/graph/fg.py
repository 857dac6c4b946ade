"""FunctionGraph: a mutable, self-contained graph with client lists and features.

Rewrites work on a FunctionGraph: they replace variables, and features (validators, destroy
handlers, change trackers) hear about every change through callbacks.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Variable, clone_graph, io_toposort

__all__ = ["FunctionGraph", "MissingInputError", "Feature"]


_flags = config._flags  # read directly: replace runs thousands of times per compile


class MissingInputError(ValueError):
    """An output depends on a free variable that is not an input of the function."""


class Feature:
    """Base class of FunctionGraph listeners; every callback is optional."""

    def on_attach(self, fgraph: "FunctionGraph") -> None: ...
    def on_detach(self, fgraph: "FunctionGraph") -> None: ...
    def on_import(self, fgraph: "FunctionGraph", node: Apply, reason: str | None) -> None: ...
    def on_prune(self, fgraph: "FunctionGraph", node: Apply, reason: str | None) -> None: ...
    def on_change_input(self, fgraph: "FunctionGraph", node: Any, i: int, old: Variable,
                        new: Variable, reason: str | None) -> None: ...
    def validate(self, fgraph: "FunctionGraph") -> None: ...


class FunctionGraph:
    """Inputs, outputs and the Apply nodes between them, with `clients` bookkeeping.

    `clients[var]` lists `(node, input_index)` pairs; an output of the graph appears as
    `("output", output_index)`.
    """

    def __init__(self, inputs: Sequence[Variable], outputs: Sequence[Variable],
                 features: Iterable[Feature] = (), clone: bool = True,
                 update_mapping: dict[int, int] | None = None):
        if clone:
            inputs, outputs, _ = clone_graph(list(inputs), list(outputs), copy_inputs=True)
        self.inputs: list[Variable] = []
        self.outputs: list[Variable] = list(outputs)
        self.apply_nodes: set[Apply] = set()
        self.variables: set[Variable] = set()
        self.clients: dict[Variable, list[tuple[Any, int]]] = {}
        self._features: list[Feature] = []
        self.update_mapping = update_mapping or {}
        self._toposort_cache: list[Apply] | None = None
        for inp in inputs:
            if inp.owner is not None:
                raise ValueError(f"graph input {inp} is computed by {inp.owner.op}; inputs must be free")
            self.add_input(inp)
        for i, out in enumerate(self.outputs):
            self._import_var(out, reason="init")
            self.clients[out].append(("output", i))
        for f in features:
            self.attach_feature(f)

    # -- construction -----------------------------------------------------------------------
    def add_input(self, var: Variable) -> None:
        if var in self.clients:
            return
        self.inputs.append(var)
        self.variables.add(var)
        self.clients[var] = []

    def _import_var(self, var: Variable, reason: str | None) -> None:
        if var in self.variables:
            return
        if var.owner is not None:
            self._import_node(var.owner, reason)
        elif isinstance(var, Constant) or getattr(var.tag, "allow_free", False):
            self.variables.add(var)
            self.clients.setdefault(var, [])
        else:
            where = ""
            trace = getattr(var.tag, "trace", None)
            if trace:
                f = trace[-1]
                where = f" (created at {f.filename}:{f.lineno})"
            raise MissingInputError(
                f"the graph needs the value of {var} ({var.type}){where}, which is neither an "
                "input of the function nor a constant or shared variable; add it to the inputs "
                "or use givens")

    def _import_node(self, node: Apply, reason: str | None) -> None:
        new_nodes = io_toposort(self.variables, node.outputs)
        for n in new_nodes:
            if n in self.apply_nodes:
                continue
            for inp in n.inputs:
                if inp not in self.variables:
                    self._import_var(inp, reason)
            self.apply_nodes.add(n)
            for o in n.outputs:
                self.variables.add(o)
                self.clients.setdefault(o, [])
            for i, inp in enumerate(n.inputs):
                self.clients[inp].append((n, i))
            self._toposort_cache = None
            self.execute_callbacks("on_import", n, reason)

    # -- mutation ---------------------------------------------------------------------------
    def change_node_input(self, node: Any, i: int, new_var: Variable, reason: str | None = None) -> None:
        if node == "output":
            old = self.outputs[i]
            self.outputs[i] = new_var
        else:
            old = node.inputs[i]
            node.inputs[i] = new_var
        if old is new_var:
            return
        self._import_var(new_var, reason)
        self.clients[new_var].append((node, i))
        self.clients[old].remove((node, i))
        self._toposort_cache = None
        self.execute_callbacks("on_change_input", node, i, old, new_var, reason)
        if not self.clients[old]:
            self._prune(old, reason)

    def _prune(self, var: Variable, reason: str | None) -> None:
        # iterative: dropping the end of a chain of thousands of nodes must not recurse
        stack = [var]
        while stack:
            var = stack.pop()
            node = var.owner
            if node is None or node not in self.apply_nodes:
                if var.owner is None and var not in self.inputs:
                    self.variables.discard(var)
                    self.clients.pop(var, None)
                continue
            if any(self.clients.get(o) for o in node.outputs):
                continue
            self.apply_nodes.discard(node)
            for o in node.outputs:
                self.variables.discard(o)
                self.clients.pop(o, None)
            self._toposort_cache = None
            self.execute_callbacks("on_prune", node, reason)
            for i, inp in reversed(list(enumerate(node.inputs))):
                cl = self.clients.get(inp)
                if cl is None:
                    continue
                cl.remove((node, i))
                if not cl:
                    stack.append(inp)

    def replace(self, var: Variable, new_var: Variable, reason: str | None = None,
                validate: bool = False) -> None:
        """Make every client of `var` use `new_var` instead."""
        if var is new_var:
            return
        if var.type != new_var.type:
            converted = var.type.convert_variable(new_var)
            if converted is None:
                raise TypeError(
                    f"cannot replace {var} ({var.type}) by {new_var} ({new_var.type}) "
                    f"[{reason}]: the types differ")
            new_var = converted
        if var not in self.variables:
            return
        if _flags["optimizer_verbose"].value:  # Theano's optimizer_verbose line
            print(f"rewriting: rewrite {reason} replaces {var} of {var.owner} with {new_var} "
                  f"of {new_var.owner}")
        for node, i in list(self.clients[var]):
            self.change_node_input(node, i, new_var, reason)
        if validate:
            self.validate()

    def replace_all(self, pairs: Iterable[tuple[Variable, Variable]], reason: str | None = None) -> None:
        for var, new_var in pairs:
            self.replace(var, new_var, reason)

    # -- features ---------------------------------------------------------------------------
    def attach_feature(self, feature: Feature) -> None:
        if feature in self._features:
            return
        self._features.append(feature)
        feature.on_attach(self)

    def remove_feature(self, feature: Feature) -> None:
        if feature in self._features:
            self._features.remove(feature)
            feature.on_detach(self)

    @property
    def features(self) -> list[Feature]:
        return list(self._features)

    def execute_callbacks(self, name: str, *args: Any) -> None:
        for f in self._features:
            cb = getattr(f, name, None)
            if cb is not None:
                cb(self, *args)

    def validate(self) -> None:
        for f in self._features:
            f.validate(self)

    # -- queries ----------------------------------------------------------------------------
    def toposort(self) -> list[Apply]:
        """The nodes in an order where each comes after its inputs' producers (cached)."""
        if self._toposort_cache is None:
            self._toposort_cache = io_toposort(self.inputs, self.outputs)
        return list(self._toposort_cache)

    def get_clients(self, var: Variable) -> list[tuple[Any, int]]:
        return self.clients.get(var, [])

    def clone(self, check_integrity: bool = False) -> "FunctionGraph":
        """A deep copy (same ops, new variables and nodes), without features."""
        return self.clone_get_equiv()[0]

    def clone_get_equiv(self) -> tuple["FunctionGraph", dict]:
        ins, outs, memo = clone_graph(self.inputs, self.outputs, copy_inputs=True)
        fg = FunctionGraph(ins, outs, clone=False, update_mapping=dict(self.update_mapping))
        return fg, memo

    def check_integrity(self) -> None:
        nodes = set(io_toposort(self.inputs, self.outputs))
        if nodes != self.apply_nodes:
            raise AssertionError("apply_nodes is out of sync with the graph")
        for node in nodes:
            for i, inp in enumerate(node.inputs):
                if (node, i) not in self.clients[inp]:
                    raise AssertionError(f"client ({node}, {i}) missing for {inp}")

    def __str__(self) -> str:
        return f"FunctionGraph({', '.join(str(o) for o in self.outputs)})"
