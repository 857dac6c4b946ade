"""What the page (and the dot file) shows of a graph: nodes, edges and their details, read
once from a compiled Function, a FunctionGraph or output variables.

Kept apart from the HTML and dot writers so both show the same graph, and so tests can check
the data without a browser. Node kinds are printing's (``op_kind``: 'cpu', 'gpu', 'transfer')
plus the variables at the graph's edges ('input', 'shared', 'constant', 'output') and, when
not compact, intermediate ones ('variable'). Inner graphs (Scan's body, IfElse's branches,
OpFromGraph's graph) are found by what the op holds (an inner function with an ``fgraph``),
so no loop or builder module is imported here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable, graph_inputs
from symgpu.graph.devices import is_device_var, transfer_kind
from symgpu.graph.fg import FunctionGraph
from symgpu.printing import DOT_COLORS, GPU_CONTEXT_COLORS, op_kind
from symgpu.tensor.rewriting.shape_feature import node_shapes, shape_tuple
from symgpu.tensor.shape_rules import dim_value
from symgpu.tensor.typed_constructors import PREFIXES as TYPED_PREFIXES

__all__ = ["Node", "Edge", "Graph", "build_graphs", "type_to_str", "var_label"]

#: how deep inner graphs are followed (an inner graph of an inner graph of ...)
MAX_DEPTH = 8
#: labels longer than this are cut (the details panel has the whole text)
LABEL_SIZE = 36


@dataclass
class Node:
    """One box of the picture: an apply node or a variable."""
    id: str
    kind: str                  # cpu, gpu, transfer, input, shared, constant, output, variable
    label: str
    color: str
    details: list[tuple[str, str]] = field(default_factory=list)
    search: str = ""           # the text the search box matches
    op: str | None = None      # the op's class name, for apply nodes
    time: float | None = None  # seconds per call, when profiled
    share: float | None = None  # of the function's call time, when profiled
    inner: list[tuple[str, str]] = field(default_factory=list)  # (graph id, title)


@dataclass
class Edge:
    src: str
    dst: str
    label: str = ""
    kind: str = ""             # '', 'view' (the op's output views it), 'destroy' (overwrites it)


@dataclass
class Graph:
    id: str
    title: str
    nodes: list[Node]
    edges: list[Edge]
    parent: tuple[str, str] | None = None  # (graph id, node id) of the op holding it
    profiled: bool = False
    shapes_from: str = "static"  # 'last call' when a profile recorded them


# ----------------------------------------------------------------------------- labels

_BCAST_NAMES = {(): "scalar", (False,): "vector", (False, True): "col", (True, False): "row",
                (False, False): "matrix"}
#: the constructors' dtype prefixes (``fmatrix``, ``hvector``, ``bfmatrix``), and two more
_DTYPE_CHARS = {**{dtype: prefix for prefix, dtype in TYPED_PREFIXES.items()},
                "bool": "?", "uint8": "B"}


def type_to_str(t: Any) -> str:
    """Theano's short type names: ``fmatrix``, ``dvector``, ``lscalar``; str(t) otherwise."""
    bcast = getattr(t, "broadcastable", None)
    dtype = getattr(t, "dtype", None)
    if bcast is None or dtype is None:
        return str(t)
    name = _BCAST_NAMES.get(tuple(bcast))
    char = _DTYPE_CHARS.get(str(dtype))
    if name is None or char is None:
        return f"{dtype} {len(bcast)}-d"
    return char + name


def var_label(var: Variable, precision: int = 3) -> str:
    """A variable's name, a constant's value (first line), else its short type."""
    if var.name is not None:
        return str(var.name)
    if isinstance(var, Constant):
        data = np.asarray(var.data)
        text = np.array2string(data.reshape(1) if data.ndim == 0 else data, precision=precision)
        text = text.split("\n")[0]
        return text.strip("[]") if data.ndim == 0 else text
    return type_to_str(var.type)


def _short(text: str, size: int = LABEL_SIZE) -> str:
    return text if len(text) <= size else text[: size - 1] + "\u2026"


def _trace(tag: Any) -> str | None:
    trace = getattr(tag, "trace", None)
    if not trace:
        return None
    frame = trace[-1]
    filename, lineno = getattr(frame, "filename", None), getattr(frame, "lineno", None)
    if filename is None:
        return None
    return f"{os.path.basename(filename)}:{lineno}"


def _fmt_shape(shape: Any) -> str:
    if shape is None:
        return "?"
    try:
        dims = tuple(shape)
    except TypeError:
        return str(shape)
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ("," if len(dims) == 1
                                                                         else "") + ")"


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} \u00b5s"


# ----------------------------------------------------------------------------- inputs

def _fgraph_of(obj: Any) -> tuple[FunctionGraph, Any]:
    """(graph, profile) of a Function, FunctionGraph, Apply, variable or list of variables."""
    maker = getattr(obj, "maker", None)
    if maker is not None and getattr(maker, "fgraph", None) is not None:
        return maker.fgraph, getattr(obj, "profile", None)
    if isinstance(obj, FunctionGraph):
        return obj, None
    if isinstance(obj, Apply):
        obj = list(obj.outputs)
    if isinstance(obj, Variable):
        obj = [obj]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(v, Variable) for v in obj):
        outputs = list(obj)
        inputs = [v for v in graph_inputs(outputs) if not isinstance(v, Constant)]
        return FunctionGraph(inputs, outputs, clone=False), None
    raise TypeError(f"d3viz draws a compiled Function, a FunctionGraph, an Apply, a variable or "
                    f"a list of variables, not {type(obj).__name__}")


def _inner_functions(op: Any) -> list[tuple[str, Any]]:
    """(attribute, inner function) pairs of an op that holds graphs (duck-typed: anything
    with an ``fgraph`` that toposorts), in the op's attribute order."""
    found = []
    for attr, value in vars(op).items():
        fg = getattr(value, "fgraph", None)
        if fg is not None and hasattr(fg, "toposort") and hasattr(fg, "outputs"):
            found.append((attr, value))
    return found


def _static_shapes(fgraph: FunctionGraph) -> dict[Variable, tuple]:
    """Each variable's dims known without running (ints, None where unknown), from the ops'
    ``infer_shape`` rules over the graph."""
    known: dict[Variable, tuple] = {}
    out: dict[Variable, tuple] = {}

    def symbolic(v: Variable) -> Any:
        if v in known:
            return known[v]
        if not hasattr(v.type, "ndim"):
            return None
        if isinstance(v, Constant):
            return tuple(np.shape(v.data))
        return shape_tuple(v)

    for node in fgraph.toposort():
        try:
            shapes = node_shapes(node, [symbolic(v) for v in node.inputs])
        except Exception:  # an op without a usable shape rule: its shapes show as unknown
            continue
        for o, s in zip(node.outputs, shapes):
            known[o] = s
            out[o] = tuple(dim_value(d) for d in s)
    for v in fgraph.inputs:
        if hasattr(v.type, "ndim"):
            out[v] = tuple(1 if b else None for b in v.type.broadcastable)
    return out


# ----------------------------------------------------------------------------- the builder

class _Builder:
    """Walks one graph, then the inner graphs of its ops (each becomes a Graph of its own)."""

    def __init__(self, compact: bool) -> None:
        self.compact = compact
        self.graphs: list[Graph] = []
        self.inner_ids: dict[int, str] = {}  # id(inner function) -> graph id (shared ops)
        self.contexts: dict[Any, str] = {}

    def gpu_color(self, node: Apply) -> str:
        ctx = None
        for v in list(node.outputs) + list(node.inputs):
            if is_device_var(v):
                ctx = v.type.context_name
                break
        if ctx not in self.contexts:
            k = len(self.contexts)
            self.contexts[ctx] = (DOT_COLORS["gpu"] if k == 0 else
                                  GPU_CONTEXT_COLORS[(k - 1) % len(GPU_CONTEXT_COLORS)])
        return self.contexts[ctx]

    def build(self, fgraph: FunctionGraph, profile: Any, title: str,
              parent: tuple[str, str] | None, depth: int) -> Graph:
        gid = f"g{len(self.graphs)}"
        graph = Graph(gid, title, [], [], parent)
        self.graphs.append(graph)
        ids: dict[Any, str] = {}

        def nid(x: Any) -> str:
            if x not in ids:
                ids[x] = f"{gid}n{len(ids) + 1}"
            return ids[x]

        calls = getattr(profile, "fct_callcount", 0) if profile is not None else 0
        total = getattr(profile, "fct_call_time", 0.0) if calls else 0.0
        apply_time = getattr(profile, "apply_time", {}) if calls else {}
        apply_calls = getattr(profile, "apply_callcount", {}) if calls else {}
        graph.profiled = bool(calls)
        thunks = sum(apply_time.values()) or 1.0
        run_shapes = getattr(profile, "variable_shape", {}) if calls else {}
        if run_shapes:
            graph.shapes_from = "last call"
            shapes = run_shapes
        else:
            shapes = _static_shapes(fgraph)
        order = {node: i for i, node in enumerate(fgraph.toposort())}
        outputs = list(fgraph.outputs)
        updates = {o: i for o, i in getattr(fgraph, "update_mapping", {}).items()}

        def var_details(var: Variable) -> list[tuple[str, str]]:
            t = var.type
            rows = [("type", str(t))]
            if hasattr(t, "dtype"):
                rows.append(("dtype", str(t.dtype)))
            if hasattr(t, "broadcastable"):
                rows.append(("broadcastable", str(tuple(t.broadcastable))))
            if isinstance(var, Constant):
                rows.append(("shape", _fmt_shape(np.shape(var.data))))
            elif hasattr(t, "ndim"):
                rows.append((f"shape ({graph.shapes_from})", _fmt_shape(shapes.get(var))))
            rows.append(("device", f"gpu ({t.context_name})" if is_device_var(var) else "host"))
            where = _trace(var.tag)
            if where:
                rows.append(("created at", where))
            return rows

        def leaf_kind(var: Variable) -> str:
            if isinstance(var, Constant):
                return "constant"
            if getattr(var, "container", None) is not None:
                return "shared"
            return "input"

        def add_var(var: Variable, kind: str, label: str | None = None,
                    key: Any = None) -> str:
            key = ("var", var) if key is None else key
            if key in ids:
                return ids[key]
            i = nid(key)
            text = label if label is not None else var_label(var)
            details = [("kind", kind), ("name", str(var.name))] + var_details(var)
            if isinstance(var, Constant):
                details.insert(2, ("value", np.array2string(np.asarray(var.data), threshold=20,
                                                            precision=4)))
            graph.nodes.append(Node(i, kind, _short(text), DOT_COLORS[kind], details,
                                    search=f"{text} {var.name or ''} {type_to_str(var.type)}"))
            return i

        def edge_kind(node: Apply, k: int) -> str:
            if k in {j for idx in (getattr(node.op, "destroy_map", None) or {}).values()
                     for j in idx}:
                return "destroy"
            if k in {j for idx in (getattr(node.op, "view_map", None) or {}).values()
                     for j in idx}:
                return "view"
            return ""

        for v in fgraph.inputs:  # every input, even one no node reads
            add_var(v, leaf_kind(v))
        produced: dict[Variable, str] = {}
        for node in fgraph.toposort():
            i = nid(node)
            kind = op_kind(node)
            color = self.gpu_color(node) if kind == "gpu" else DOT_COLORS[kind]
            op_text = str(node.op)
            details = [("op", op_text), ("op class", type(node.op).__name__), ("kind", kind),
                       ("position", str(order.get(node, "?")))]
            props = getattr(node.op, "__props__", None) or ()
            for p in props:
                details.append((f"param {p}", repr(getattr(node.op, p, None))))
            if kind == "transfer":
                details.append(("transfer", str(transfer_kind(node.op))))
            device = [f"gpu ({o.type.context_name})" for o in node.outputs if is_device_var(o)]
            details.append(("device", device[0] if device else "host"))
            for k, o in enumerate(node.outputs):
                details.append((f"output {k}", f"{type_to_str(o.type)} "
                                f"dtype={getattr(o.type, 'dtype', '?')} "
                                f"broadcastable={tuple(getattr(o.type, 'broadcastable', ()))} "
                                f"shape={_fmt_shape(shapes.get(o))}"
                                + (f" name={o.name}" if o.name else "")))
            time = share = None
            if graph.profiled:
                seconds = float(apply_time.get(node, 0.0))
                n = apply_calls.get(node, 0) or calls
                time = seconds / n if n else 0.0
                share = seconds / total if total else 0.0
                details += [("time per call", _fmt_time(time)),
                            ("share of the function's time", f"{100 * share:.2f}%"),
                            ("share of the time in thunks", f"{100 * seconds / thunks:.2f}%"),
                            ("calls", str(apply_calls.get(node, 0)))]
            where = _trace(node.tag)
            if where:
                details.append(("created at", where))
            out_names = " ".join(str(o.name) for o in node.outputs if o.name)
            item = Node(i, kind, _short(op_text), color, details,
                        search=f"{op_text} {type(node.op).__name__} {out_names}",
                        op=type(node.op).__name__, time=time, share=share)
            graph.nodes.append(item)
            for k, inp in enumerate(node.inputs):
                if inp in produced:
                    src = produced[inp]
                elif inp.owner is None:
                    src = add_var(inp, leaf_kind(inp))
                else:  # a variable computed outside fgraph.toposort(): cannot happen in an fgraph
                    src = add_var(inp, "variable")
                label = type_to_str(inp.type)
                if len(node.inputs) > 1:
                    label = f"{k} {label}"
                graph.edges.append(Edge(src, i, label, edge_kind(node, k)))
            for o in node.outputs:
                if self.compact and o.name is None:
                    produced[o] = i
                else:
                    vi = add_var(o, "variable")
                    graph.edges.append(Edge(i, vi, type_to_str(o.type)))
                    produced[o] = vi
            if depth < MAX_DEPTH:
                for attr, inner in _inner_functions(node.op):
                    item.inner.append(self.inner_graph(inner, attr, item, gid, depth))
        for k, var in enumerate(outputs):
            if k in updates and updates[k] < len(fgraph.inputs):
                target = fgraph.inputs[updates[k]]
                label = f"update of {var_label(target)}"
            else:
                label = var.name or f"output {k}"
            oi = add_var(var, "output", label=label, key=("output", k))
            src = produced.get(var) or add_var(var, leaf_kind(var))
            graph.edges.append(Edge(src, oi, type_to_str(var.type)))
        return graph

    def inner_graph(self, inner: Any, attr: str, holder: Node, gid: str,
                    depth: int) -> tuple[str, str]:
        known = self.inner_ids.get(id(inner))
        title = f"{holder.label} \u203a {getattr(inner, 'name', None) or attr}"
        if known is not None:
            return known, title
        fg = getattr(inner, "compiled_fgraph", None) or inner.fgraph
        g = self.build(fg, None, title, (gid, holder.id), depth + 1)
        self.inner_ids[id(inner)] = g.id
        return g.id, title


def build_graphs(fct: Any, compact: bool = True, title: str | None = None) -> list[Graph]:
    """The graphs to show: the function's own first (id 'g0'), then every inner graph."""
    fgraph, profile = _fgraph_of(fct)
    name = title or getattr(fct, "name", None) or "graph"
    builder = _Builder(compact)
    builder.build(fgraph, profile, str(name), None, 0)
    return builder.graphs
