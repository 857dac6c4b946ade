"""Theano's ``theano.d3viz.formatting``: `PyDotFormatter` turns a graph into a dot graph.

Theano's returned a ``pydot.Dot``; pydot is not a dependency here, so `DotGraph` is a small
stand-in with the pydot methods Theano's users and tests call (``get_nodes``,
``get_subgraph_list``, ``to_string``, ``create_dot``, ``write_dot``...). The nodes carry
Theano's attributes (``node_type`` 'apply', 'input', 'constant_input', 'shared_input',
'output'; ``apply_op``, ``profile``), and each inner graph (OpFromGraph, Scan, IfElse) is a
cluster of its holder's graph, as Theano drew OpFromGraph.
"""
from __future__ import annotations

import os
from typing import Any

from symgpu.d3viz.model import Graph, build_graphs, type_to_str, var_label
from symgpu.printing import DOT_COLORS

__all__ = ["PyDotFormatter", "DotGraph", "DotNode", "DotEdge", "type_to_str", "var_label"]

#: the page's and model's kinds -> Theano's node_type attribute
NODE_TYPES = {"cpu": "apply", "gpu": "apply", "transfer": "apply", "input": "input",
              "constant": "constant_input", "shared": "shared_input", "output": "output",
              "variable": "variable"}


def _quote(text: Any) -> str:
    text = str(text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _cluster(holder: str, graph_id: str) -> str:
    """The cluster name of an inner graph (its holder node's id, then its own)."""
    return f"{holder}_{graph_id}"


class DotNode:
    """A node of a `DotGraph`: a name and its attributes (pydot's ``Node`` methods)."""

    def __init__(self, name: str, **attrs: Any) -> None:
        self.name = name
        self.attrs = {k: str(v) for k, v in attrs.items() if v is not None}

    def get_name(self) -> str:
        return self.name

    def get_attributes(self) -> dict[str, str]:
        return self.attrs

    def get(self, key: str) -> str | None:
        return self.attrs.get(key)

    def to_string(self) -> str:
        attrs = ", ".join(f"{k}={_quote(v)}" for k, v in self.attrs.items())
        return f"{self.name} [{attrs}];"


class DotEdge:
    """An edge of a `DotGraph` (pydot's ``Edge`` methods)."""

    def __init__(self, src: str, dst: str, **attrs: Any) -> None:
        self.src, self.dst = src, dst
        self.attrs = {k: str(v) for k, v in attrs.items() if v is not None}

    def get_source(self) -> str:
        return self.src

    def get_destination(self) -> str:
        return self.dst

    def get_attributes(self) -> dict[str, str]:
        return self.attrs

    def to_string(self) -> str:
        attrs = ", ".join(f"{k}={_quote(v)}" for k, v in self.attrs.items())
        return f"{self.src} -> {self.dst}" + (f" [{attrs}]" if attrs else "") + ";"


class DotGraph:
    """A dot graph with clusters (what pydot's ``Dot``/``Cluster`` are to Theano's d3viz)."""

    def __init__(self, name: str = "G", cluster: bool = False, label: str | None = None) -> None:
        self.name = f"cluster_{name}" if cluster else name
        self.label = label
        self.nodes: list[DotNode] = []
        self.edges: list[DotEdge] = []
        self.subgraphs: list[DotGraph] = []

    def get_name(self) -> str:
        return self.name

    def add_node(self, node: DotNode) -> None:
        self.nodes.append(node)

    def add_edge(self, edge: DotEdge) -> None:
        self.edges.append(edge)

    def add_subgraph(self, graph: "DotGraph") -> None:
        self.subgraphs.append(graph)

    def get_nodes(self) -> list[DotNode]:
        return list(self.nodes)

    def get_node(self, name: str) -> list[DotNode]:
        return [n for n in self.nodes if n.name == name]

    def get_edges(self) -> list[DotEdge]:
        return list(self.edges)

    def get_subgraph_list(self) -> list["DotGraph"]:
        return list(self.subgraphs)

    get_subgraphs = get_subgraph_list

    def _body(self, indent: str) -> list[str]:
        lines = []
        if self.label is not None:
            lines.append(f"{indent}label={_quote(self.label)};")
        lines += [indent + n.to_string() for n in self.nodes]
        for sub in self.subgraphs:
            lines.append(f"{indent}subgraph {sub.name} {{")
            lines += sub._body(indent + "  ")
            lines.append(f"{indent}}}")
        lines += [indent + e.to_string() for e in self.edges]
        return lines

    def to_string(self) -> str:
        """The dot source."""
        return "\n".join([f"digraph {self.name} {{", '  graph [rankdir=TB];',
                          '  node [fontname="Helvetica"];', '  edge [fontname="Helvetica"];']
                         + self._body("  ") + ["}"]) + "\n"

    def create_dot(self) -> bytes:
        """The dot source as bytes (pydot's ``create_dot``: Theano's d3viz decoded it)."""
        return self.to_string().encode("utf-8")

    def write_dot(self, path: str) -> str:
        """Write the dot source to `path` (its folder is made); returns the path."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_string())
        return path

    write = write_dot
    write_raw = write_dot


class PyDotFormatter:
    """Theano's formatter: ``PyDotFormatter(compact=True)(fct)`` is the graph of `fct` (a
    compiled Function, a FunctionGraph, an Apply, a variable or a list of variables) as a
    `DotGraph`. ``compact`` leaves unnamed intermediate variables out (edges carry their
    type); False draws every variable as a node."""

    def __init__(self, compact: bool = True) -> None:
        self.compact = compact
        #: fill colours of the variables' node types (printing's pydotprint colours)
        self.node_colors = {"input": DOT_COLORS["input"], "constant_input": DOT_COLORS["constant"],
                            "shared_input": DOT_COLORS["shared"], "output": DOT_COLORS["output"],
                            "variable": DOT_COLORS["variable"]}
        #: fill colours of apply nodes by kind (the first GPU context's colour for 'gpu')
        self.apply_colors = {k: DOT_COLORS[k] for k in ("cpu", "gpu", "transfer")}
        self.shapes = {"input": "box", "output": "box", "apply": "ellipse"}

    def __call__(self, fct: Any, graph: DotGraph | None = None) -> DotGraph:
        graphs = build_graphs(fct, compact=self.compact)
        top = graph if graph is not None else DotGraph()
        made: dict[str, DotGraph] = {graphs[0].id: top}
        for g in graphs:
            target = made.get(g.id)
            if target is None:  # an inner graph: a cluster of its holder's graph
                target = DotGraph(_cluster(g.parent[1] if g.parent else "", g.id), cluster=True,
                                  label=g.title)
                made[g.parent[0] if g.parent else graphs[0].id].add_subgraph(target)
                made[g.id] = target
            self._fill(target, g)
        return top

    def _fill(self, target: DotGraph, g: Graph) -> None:
        for n in g.nodes:
            node_type = NODE_TYPES[n.kind]
            is_apply = node_type == "apply"
            fill = n.color if is_apply or n.kind == "output" else self.node_colors[node_type]
            attrs: dict[str, Any] = {
                "label": n.label, "node_type": node_type,
                "shape": self.shapes["apply" if is_apply else "input"],
                "style": "filled", "fillcolor": fill}
            if is_apply:
                attrs["apply_op"] = n.op
                if n.time is not None:
                    attrs["profile"] = f"{n.time}\t{n.share}"
                if n.inner:
                    attrs["subg"] = "\t".join(f"cluster_{_cluster(n.id, gid)}"
                                               for gid, _ in n.inner)
            else:
                attrs["dtype"] = dict(n.details).get("dtype")
            target.add_node(DotNode(n.id, **attrs))
        for e in g.edges:
            color = {"view": "blue", "destroy": "red"}.get(e.kind)
            target.add_edge(DotEdge(e.src, e.dst, label=e.label or None, color=color))
