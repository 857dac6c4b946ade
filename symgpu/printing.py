"""Looking at graphs: `debugprint` (Theano's indented text form), `pp` (a readable formula)
and `pydotprint` (a Graphviz picture with CPU, GPU and transfer ops in distinct colours).

Everything here is duck-typed on ops (``scalar_op``, ``axis``, ``new_order``, class names
starting with ``Gpu``) so that the printer never imports the GPU backend.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import warnings
from typing import Any, Callable, TextIO

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Variable, graph_inputs, io_toposort
from symgpu.graph.devices import node_kind
from symgpu.graph.op import Op
from symgpu.tensor.basic import Alloc, Join, MakeVector, Reshape
from symgpu.tensor.math import Dot, MatMul
from symgpu.tensor.shape import Shape, Shape_i
from symgpu.tensor.subtensor import AdvancedIncSubtensor, AdvancedSubtensor, IncSubtensor, Subtensor
from symgpu.tensor.type import as_tensor_variable
from symgpu.link import vm as _vm

__all__ = ["debugprint", "pp", "pprint", "pydotprint", "register_pp", "op_kind",
           "char_from_number", "GraphvizNotFoundWarning", "Print",
           "GraphvizNotFoundError", "graph_to_dot"]

#: class names of the ops that move data between host and device (or between devices)


def op_kind(node: Apply) -> str:
    """'transfer', 'gpu' or 'cpu': how the profiler and pydotprint classify a node (by what
    its op and types declare: symgpu/graph/devices.py)."""
    if not isinstance(node, Apply):
        raise TypeError(f"op_kind takes a node (an Apply), got {node!r}")
    return node_kind(node)


# ============================================================================ debugprint

def char_from_number(number: int) -> str:
    """Theano's node ids: 0 -> 'A', 25 -> 'Z', 26 -> 'BA' (base 26 with A as the zero)."""
    if number == 0:
        return "A"
    text = ""
    while number:
        number, rem = divmod(number, 26)
        text = chr(ord("A") + rem) + text
    return text


def _roots(obj: Any) -> list[tuple[Variable, dict[Apply, int]]]:
    """(variable, toposort positions) pairs to print for a Function, FunctionGraph, Apply,
    variable or a list of any of these."""
    if isinstance(obj, Variable):
        return [(obj, {})]
    if isinstance(obj, Apply):
        return [(o, {}) for o in obj.outputs]
    maker = getattr(obj, "maker", None)
    fgraph = getattr(maker, "fgraph", None) if maker is not None else None
    if fgraph is None and hasattr(obj, "toposort") and hasattr(obj, "outputs"):
        fgraph = obj
    if fgraph is not None:
        order = {node: i for i, node in enumerate(fgraph.toposort())}
        return [(o, order) for o in fgraph.outputs]
    if isinstance(obj, (list, tuple, set, frozenset)):
        roots = []
        for item in obj:
            roots.extend(_roots(item))
        return roots
    raise TypeError(f"debugprint cannot print a {type(obj).__name__}; pass a Function, a "
                    "FunctionGraph, an Apply, a variable or a list of them")


def _copied_outputs(obj: Any) -> list[bool]:
    """For each root `_roots(obj)` gives: whether the compiled function returns a copy of it
    (an output that is, or is a view of, an input or a constant, unless borrowed). Theano
    does that copy with a DeepCopyOp node, and its debugprint shows one; symgpu's function
    copies such outputs when it returns them, and debugprint shows the copy the same way."""
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [c for item in obj for c in _copied_outputs(item)]
    n = len(_roots(obj))
    layout = getattr(obj, "_layout", None) if getattr(obj, "maker", None) is not None else None
    copies = list(getattr(layout, "output_copy", None) or [])
    return (copies + [False] * n)[:n]


def _static_shape(var: Variable) -> str:
    shape = getattr(var.type, "shape", None)
    return f" shape={tuple(shape)}" if shape is not None else ""


def debugprint(obj: Any, file: TextIO | str | None = None, print_type: bool = False,
               print_shape: bool = False, ids: str = "CHAR", stop_on_name: bool = False,
               print_destroy_map: bool = False, print_view_map: bool = False,
               depth: int = -1) -> TextIO | str | None:
    """Print a graph the way Theano does, so users can read and compare graphs they know.

    One line per variable: ``Op [id X] 'name'   pos`` for computed ones (``pos`` is the
    toposort position, for compiled functions only) and ``var [id X]`` for inputs and
    constants, in Theano's layout: a node's inputs follow it, one column (`` |``) to the
    right, and the column stays drawn while more inputs of the node are to come (trailing
    blanks are left out). A node met again is printed once more, with its id, but without
    its inputs. ``ids`` is 'CHAR' (A, B, ...), 'int', 'id' (Python ids)
    or '' (none); ``stop_on_name`` does not descend below named variables; ``depth`` >= 0
    limits the levels printed. Returns the text when ``file='str'``, ``file`` when one is
    given, and None by default (Theano's: an interpreter then echoes nothing after it).
    """
    if ids not in ("CHAR", "int", "id", ""):
        raise ValueError(f"ids must be 'CHAR', 'int', 'id' or '', got {ids!r}")
    out: TextIO = io.StringIO() if file == "str" else (file or sys.stdout)
    labels: dict[Any, str] = {}
    printed: set[Apply] = set()

    def ident(obj_: Any) -> str:
        if obj_ not in labels:
            n = len(labels)
            labels[obj_] = {"CHAR": lambda: f"[id {char_from_number(n)}]",
                            "int": lambda: f"[id {n}]",
                            "id": lambda: f"[id {id(obj_)}]",
                            "": lambda: ""}[ids]()
        return labels[obj_]

    def visit(var: Variable, prefix: str, prefix_child: str, level: int,
              order: dict[Apply, int]) -> None:
        # Theano's layout: a node's inputs are drawn under it with "|", each input's own
        # inputs one column to the right; the column stays open ("|") while later inputs of
        # the same node are still to come, and closes (" ") under its last input
        if 0 <= depth <= level:
            return
        extra = ""
        if print_type:
            extra += f" <{var.type}>"
        if print_shape:
            extra += _static_shape(var)
        node = var.owner
        if node is None:
            out.write(f"{prefix}{var} {ident(var)}{extra}".rstrip() + "\n")
            return
        label = f"{node.op}" + (f".{var.index}" if len(node.outputs) > 1 else "")
        dmap = (f"d={dict(node.op.destroy_map)}" if print_destroy_map
                and getattr(node.op, "destroy_map", None) else "")
        vmap = (f"v={dict(node.op.view_map)}" if print_view_map
                and getattr(node.op, "view_map", None) else "")
        pos = str(order[node]) if node in order else ""
        # Theano's spacing ('%s%s %s%s '%s' %s %s %s'), less the trailing blanks
        line = f"{prefix}{label} {ident(node)}{extra} '{var.name or ''}' {dmap} {vmap} {pos}"
        out.write(line.rstrip() + "\n")
        if node in printed:
            return
        printed.add(node)
        if stop_on_name and var.name is not None:
            return
        last = len(node.inputs) - 1
        for i, inp in enumerate(node.inputs):
            visit(inp, prefix_child + " |", prefix_child + (" |" if i < last else "  "),
                  level + 1, order)

    n_copies = 0
    for (root, order), copied in zip(_roots(obj), _copied_outputs(obj)):
        if not copied or 0 <= depth <= 0:
            visit(root, "", "", 0, order)
            continue
        # the copy the function makes of this output, as Theano's DeepCopyOp node (after
        # the graph's nodes, when positions are printed)
        pos = len(order) + n_copies   # only compiled functions copy: always a position
        out.write(f"DeepCopyOp {ident(('DeepCopyOp', n_copies))} '{root.name or ''}'   {pos}".rstrip() + "\n")
        n_copies += 1
        visit(root, " |", "  ", 1, order)
    if file == "str":
        return out.getvalue()  # type: ignore[union-attr]
    out.flush()
    return file


# ============================================================================ pp

#: op class -> printer(op, node, argument strings) -> str, for ops without a table row; a
#: subclass prints as its nearest registered base (backends register their ops' classes).
#: Theano's printers where Theano has one (``(x \\dot w)``, ``join``, ``alloc``, ``[a, b]``),
#: readable calls where Theano falls back to the op's name (``shape(x)[0]``, ``reshape``)
PP_PRINTERS: dict[type, Callable[[Any, Apply, list[str]], str]] = {
    Dot: lambda op, node, a: f"({a[0]} \\dot {a[1]})",
    MatMul: lambda op, node, a: f"({a[0]} @ {a[1]})",
    Shape: lambda op, node, a: f"shape({a[0]})",
    Shape_i: lambda op, node, a: f"shape({a[0]})[{op.i}]",
    Reshape: lambda op, node, a: f"reshape({a[0]}, {a[1]})",
    MakeVector: lambda op, node, a: f"[{', '.join(a)}]",
    Alloc: lambda op, node, a: f"alloc({', '.join(a)})",
    Join: lambda op, node, a: f"join({op.axis}, {', '.join(a)})",
}

#: the elementwise ops Theano prints infix (always in parentheses; unary ones prefix): the
#: others print as calls by their name, as Theano's ``gt(x, y)``
_PP_INFIX = frozenset({"add", "mul", "sub", "neg", "true_div", "int_div", "pow"})

#: elementwise table rows printed under Theano's name (``second`` is Theano's ``fill``)
_ELEMWISE_PP_NAMES = {"second": "fill"}

#: variable names Theano's pp prints as TeX
_GREEK = {"alpha": "\\alpha", "beta": "\\beta", "gamma": "\\gamma", "delta": "\\delta",
          "epsilon": "\\epsilon"}


def _index_text(idx_list: Any, extra: list[str]) -> str:
    """``0, 1:3, ::2`` from an indexing op's ``idx_list``; ``$`` parts take the next of
    `extra` (the symbolic index inputs, printed)."""
    it = iter(extra)

    def part(p: Any) -> str:
        return "" if p is None else next(it, "?") if isinstance(p, str) else str(p)

    out = []
    for e in idx_list:
        if e is None:
            out.append("None")
        elif e is Ellipsis:
            out.append("...")
        elif isinstance(e, tuple) and len(e) == 3:  # a Slice(start, stop, step)
            parts = [part(e[0]), part(e[1])] + ([] if e[2] is None else [part(e[2])])
            out.append(":".join(parts))
        else:
            out.append(part(e))
    return ", ".join(out)


def _pp_subtensor(op: Any, node: Apply, a: list[str]) -> str:
    return f"{a[0]}[{_index_text(op.idx_list, a[1:])}]"


def _pp_inc_subtensor(op: Any, node: Apply, a: list[str]) -> str:
    fn = "set_subtensor" if getattr(op, "set_instead_of_inc", False) else "inc_subtensor"
    return f"{fn}({a[0]}[{_index_text(op.idx_list, a[2:])}], {a[1]})"


PP_PRINTERS.update({Subtensor: _pp_subtensor, AdvancedSubtensor: _pp_subtensor,
                    IncSubtensor: _pp_inc_subtensor, AdvancedIncSubtensor: _pp_inc_subtensor})

_REDUCE_PP = {"add": "sum", "mul": "prod", "maximum": "max", "minimum": "min",
              "and_": "all", "or_": "any"}


def register_pp(op_class: type, printer: Callable[[Any, Apply, list[str]], str]) -> None:
    """Teach `pp` an op class (and its subclasses): ``printer(op, node, args) -> str``."""
    if not isinstance(op_class, type):
        raise TypeError(f"register_pp takes an op class, got {op_class!r}")
    PP_PRINTERS[op_class] = printer


def _pp_printer(op: Any) -> Callable | None:
    for cls in type(op).__mro__:
        printer = PP_PRINTERS.get(cls)
        if printer is not None:
            return printer
    return None


def _pp_leaf(var: Variable) -> str:
    """Theano's leaf: the name (a Greek letter's as TeX), else the variable's text
    (``TensorConstant{2.0}``, ``<TensorType(float64, vector)>``)."""
    if var.name is not None:
        return _GREEK.get(var.name, var.name)
    return str(var)


def _pp_node(var: Variable, args: list[str]) -> str:
    node = var.owner
    op = node.op
    printer = _pp_printer(op)
    if printer is not None:
        return printer(op, node, args)
    scalar_op = getattr(op, "scalar_op", None)
    if scalar_op is not None and hasattr(op, "axis"):  # a reduction
        name = _REDUCE_PP.get(getattr(scalar_op, "name", ""), str(scalar_op))
        axis = op.axis
        return f"{name}({args[0]})" if axis is None else f"{name}({args[0]}, axis={list(axis)})"
    if scalar_op is not None:  # elementwise: Theano's printers
        name = getattr(scalar_op, "name", None)
        spec = getattr(scalar_op, "spec", None)
        symbol = getattr(spec, "symbol", None)
        if name in _PP_INFIX and symbol is not None:
            return f"({symbol}{args[0]})" if len(args) == 1 else f"({f' {symbol} '.join(args)})"
        if name == "abs" and len(args) == 1:
            return f"|{args[0]}|"
        if name == "identity" and len(args) == 1:  # Theano's tensor_copy prints its input
            return args[0]
        index = f".{var.index}" if len(node.outputs) > 1 else ""  # fused multi-output
        label = _ELEMWISE_PP_NAMES.get(name, name) if name else scalar_op
        return f"{label}{index}({', '.join(args)})"
    new_order = getattr(op, "new_order", None)
    if new_order is not None and len(args) == 1:  # a dimshuffle, as Theano prints one
        order = list(new_order)
        while order and order[0] == "x":  # leading broadcast dims are implicit
            order.pop(0)
        ndim = getattr(node.inputs[0].type, "ndim", None)
        if order == list(range(ndim or 0)):
            return args[0]
        if order == list(reversed(range(ndim or 0))):
            return f"{args[0]}.T"
        return f"DimShuffle{{{', '.join(str(d) for d in order)}}}({args[0]})"
    label = str(op)
    if len(node.outputs) > 1:
        label += f".{var.index}"
    return f"{label}({', '.join(args)})"


def pp(obj: Any) -> str:
    """A readable formula for a variable (``(exp(x) + y)``, ``sum(x, axis=[0])``): quicker to
    read than debugprint when the question is *what* is computed, not *how*.

    Theano's text: ``+ * - / // **`` infix and always parenthesised (negation as ``(-x)``),
    ``(x \\dot w)``, other elementwise ops as calls by name (``gt(x, y)``, ``fill(a, b)``),
    constants as ``TensorConstant{2.0}``, variables by name. Ops Theano prints by their
    name alone print as readable calls here (``sum(x, axis=[0])``, ``x[1:3]``,
    ``shape(x)[0]``). Accepts a variable, a list of them, or a Function / FunctionGraph
    (one line per output). Shared subexpressions are printed in full where they occur.
    """
    if isinstance(obj, Variable):
        roots = [obj]
    else:
        roots = [v for v, _ in _roots(obj)]
    memo: dict[Variable, str] = {}

    def walk(root: Variable) -> str:
        # iterative post-order: deep graphs must not hit Python's recursion limit
        stack = [(root, False)]
        while stack:
            var, expanded = stack.pop()
            if var in memo:
                continue
            if var.owner is None:
                memo[var] = _pp_leaf(var)
            elif expanded:
                memo[var] = _pp_node(var, [memo[i] for i in var.owner.inputs])
            else:
                stack.append((var, True))
                stack.extend((i, False) for i in reversed(var.owner.inputs) if i not in memo)
        return memo[root]

    return "\n".join(walk(r) for r in roots)


#: Theano's name for the same thing
pprint = pp


# ============================================================================ pydotprint

class GraphvizNotFoundWarning(UserWarning):
    """Graphviz's `dot` is not installed, so only the .dot source was written."""


class GraphvizNotFoundError(RuntimeError):
    """An image was asked for (``return_image=True``) but Graphviz's `dot` is not installed."""


#: fill colours by op kind (and for the variables at the graph's edges)
DOT_COLORS = {"cpu": "#FFAABB", "gpu": "#7CCD7C", "transfer": "#FF5555",
              "input": "#B0E0E6", "output": "#6495ED", "constant": "#DDDDDD",
              "shared": "cyan", "variable": "white"}

#: colours of GPU ops on the 2nd, 3rd ... GPU context met (the first uses DOT_COLORS['gpu'])
GPU_CONTEXT_COLORS = ("#40B0B0", "#B0B040", "#9370DB", "#D2B48C", "#66CDAA", "#DAA520")

#: edge colours: an input the op's output is a view of, or an input it overwrites (Theano's)
EDGE_COLORS = {"view": "blue", "destroy": "red"}

#: the image formats Graphviz's dot writes (for the outfile's extension)
DOT_FORMATS = frozenset({"svg", "png", "pdf", "ps", "eps", "jpg", "jpeg", "gif", "bmp",
                         "dot", "gv", "xdot", "json", "plain", "svgz", "tif", "tiff", "webp"})


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _context_of(node: Apply) -> Any:
    """The GPU context a Gpu* node runs on (from its outputs' types; duck-typed)."""
    for v in list(node.outputs) + list(node.inputs):
        if hasattr(v.type, "context_name"):
            return v.type.context_name
    return None


def _indices(mapping: dict) -> set[int]:
    return {i for idx in (mapping or {}).values() for i in idx}


class _DotWriter:
    """Builds the Graphviz source of one graph with pydotprint's options."""

    def __init__(self, obj: Any, compact: bool, with_ids: bool, high_contrast: bool,
                 color_codes: dict[str, str] | None, max_label_size: int,
                 var_with_name_simple: bool) -> None:
        roots = _roots(obj)
        self.order: dict[Apply, int] = {}
        for _, o in roots:
            self.order.update(o)
        self.outputs = [v for v, _ in roots]
        if with_ids and not self.order:  # a graph of variables: number it like a function
            self.order = {n: i for i, n in enumerate(io_toposort(graph_inputs(self.outputs),
                                                                 self.outputs))}
        #: a profiled Function's stats: each node's label gets its time, as Theano's
        self.profile = getattr(obj, "profile", None) if hasattr(obj, "maker") else None
        self.compact, self.high_contrast = compact, high_contrast
        self.color_codes = color_codes or {}
        self.max_label_size, self.simple = max_label_size, var_with_name_simple
        self.names: dict[Any, str] = {}
        self.contexts: dict[Any, str] = {}
        self.lines: list[str] = []
        self.edges: list[str] = []

    def nid(self, x: Any) -> str:
        if x not in self.names:
            self.names[x] = f"n{len(self.names)}"
        return self.names[x]

    def short(self, text: str) -> str:
        m = self.max_label_size
        return text if len(text) <= m else text[: m - 3] + "..."

    def style(self, color: str) -> str:
        if self.high_contrast:
            return f"style=filled, fillcolor={_dot_quote(color)}"
        return f"color={_dot_quote('black' if color == 'white' else color)}"

    def var_label(self, var: Variable) -> str:
        if var.name is not None:
            return var.name if self.simple else f"name={var.name} {var.type}"
        if isinstance(var, Constant):
            text = f"val={np.asarray(var.data)}".split("\n")[0]
            return f"{text} {var.type}"
        return str(var.type)

    def node_color(self, node: Apply) -> str:
        name = type(node.op).__name__
        color = None
        for key, value in self.color_codes.items():  # Theano: the last matching key wins
            if key in name:
                color = value
        if color is not None:
            return color
        kind = op_kind(node)
        if kind != "gpu":
            return DOT_COLORS[kind]
        ctx = _context_of(node)
        if ctx not in self.contexts:
            k = len(self.contexts)
            self.contexts[ctx] = (DOT_COLORS["gpu"] if k == 0 else
                                  GPU_CONTEXT_COLORS[(k - 1) % len(GPU_CONTEXT_COLORS)])
        return self.contexts[ctx]

    def profile_text(self, node: Apply) -> str:
        times = getattr(self.profile, "apply_time", None)
        if not times:
            return ""
        seconds = float(times.get(node, 0.0))
        total = getattr(self.profile, "fct_call_time", 0.0)
        return f"   ({seconds:.3f}s,{seconds * 100 / total if total else 0.0:.3f}%)"

    def add_var_box(self, var: Variable, color: str) -> None:
        label = _dot_quote(self.short(self.var_label(var)))
        self.lines.append(f"  {self.nid(var)} [label={label}, shape=box, {self.style(color)}];")

    def leaf_color(self, var: Variable) -> str:
        if isinstance(var, Constant):
            return DOT_COLORS["constant"]
        if getattr(var, "container", None) is not None:  # a shared variable
            return DOT_COLORS["shared"]
        return DOT_COLORS["input"]

    def build(self) -> str:
        shown: set[Variable] = set()  # variables drawn as boxes
        seen_nodes: set[Apply] = set()
        stack = list(reversed(self.outputs))
        while stack:
            var = stack.pop()
            node = var.owner
            if node is None:
                if var not in shown:
                    shown.add(var)
                    self.add_var_box(var, self.leaf_color(var))
                continue
            if node in seen_nodes:
                continue
            seen_nodes.add(node)
            label = str(node.op)
            if node in self.order:
                label += f" id={self.order[node]}"
            label += self.profile_text(node)
            self.lines.append(f"  {self.nid(node)} [label={_dot_quote(self.short(label))}, "
                              f"shape=ellipse, {self.style(self.node_color(node))}];")
            viewed, destroyed = _indices(node.op.view_map), _indices(node.op.destroy_map)
            many = len(node.inputs) > 1
            for i, inp in enumerate(node.inputs):
                attrs = []
                if i in destroyed:
                    attrs.append(f"color={EDGE_COLORS['destroy']}")
                elif i in viewed:
                    attrs.append(f"color={EDGE_COLORS['view']}")
                as_box = inp.owner is None or inp.name is not None or not self.compact
                if as_box:
                    if inp.owner is not None and inp not in shown:
                        shown.add(inp)
                        self.add_var_box(inp, DOT_COLORS["variable"])
                        src = self.nid(inp.owner)
                        self.edges.append(f"  {src} -> {self.nid(inp)};")
                    if many:
                        attrs.insert(0, f"label={_dot_quote(str(i))}")
                    src = self.nid(inp)
                else:
                    elabel = f"{i} {inp.type}" if many else f"{inp.type}"
                    attrs.insert(0, f"label={_dot_quote(self.short(elabel))}")
                    src = self.nid(inp.owner)
                extra = f" [{', '.join(attrs)}]" if attrs else ""
                self.edges.append(f"  {src} -> {self.nid(node)}{extra};")
                stack.append(inp)
        for k, var in enumerate(self.outputs):
            out_id = f"out{k}"
            name = var.name if self.simple and var.name else None
            label = name or (self.short(var.name or f"output {k}") + f"\n{var.type}")
            self.lines.append(f"  {out_id} [label={_dot_quote(label)}, shape=box, "
                              f"{self.style(DOT_COLORS['output'])}];")
            src = self.nid(var) if var.owner is None or var in shown else self.nid(var.owner)
            self.edges.append(f"  {src} -> {out_id};")
        return self.finish()

    def finish(self) -> str:
        node_style = "style=filled" if self.high_contrast else "style=solid"
        head = ["digraph G {", '  graph [rankdir=TB, fontname="Helvetica"];',
                f'  node [fontname="Helvetica", {node_style}];', '  edge [fontname="Helvetica"];']
        legend = ["  subgraph cluster_legend { label=\"legend\"; fontsize=10;"]
        kinds = [("cpu", "cpu op", DOT_COLORS["cpu"]), ("transfer", "transfer op",
                                                          DOT_COLORS["transfer"])]
        if not self.contexts:
            kinds.insert(1, ("gpu", "gpu op", DOT_COLORS["gpu"]))
        for k, (ctx, color) in enumerate(self.contexts.items()):
            label = "gpu op" if ctx is None else f"gpu op ({ctx})"
            kinds.insert(1 + k, (f"gpu{k}", label, color))
        for key, label, color in kinds:
            legend.append(f"    legend_{key} [label={_dot_quote(label)}, shape=ellipse, "
                          f"{self.style(color)}, fontsize=10];")
        legend.append("  }")
        return "\n".join(head + self.lines + legend + self.edges + ["}"]) + "\n"


def graph_to_dot(obj: Any, max_label_size: int = 70, compact: bool = True,
                 with_ids: bool = False, high_contrast: bool = True,
                 colorCodes: dict[str, str] | None = None,
                 var_with_name_simple: bool = False) -> str:
    """The Graphviz source of a graph (see `pydotprint` for the options): apply nodes as
    ellipses coloured by kind and GPU context, inputs, constants, shared variables and
    outputs as boxes, unnamed intermediate variables as labelled edges when `compact`."""
    return _DotWriter(obj, compact, with_ids, high_contrast, colorCodes, max_label_size,
                      var_with_name_simple).build()


def _default_outfile(fmt: str) -> str:
    base = getattr(config, "compiledir", None) or os.getcwd()
    return os.path.join(base, f"symgpu.pydotprint.{config.device}.{fmt}")


def _run_dot(dot_exe: str, fmt: str, source: str, outfile: str | None) -> bytes:
    args = [dot_exe, f"-T{fmt}"] + (["-o", outfile] if outfile else [])
    proc = subprocess.run(args, input=source.encode(), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pydotprint: dot -T{fmt} failed ({proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def pydotprint(fn_or_var: Any, outfile: str | None = None, format: str | None = None,
               max_label_size: int = 70, compact: bool = True, with_ids: bool = False,
               high_contrast: bool = True, colorCodes: dict[str, str] | None = None,
               var_with_name_simple: bool = False, print_output_file: bool = True,
               return_image: bool = False) -> str | bytes:
    """Draw the graph with Graphviz so the placement (CPU, GPU, transfers) is seen at a glance
    (Theano's options and colours; the legend names each GPU context met).

    Writes ``outfile`` (default: ``<compiledir>/symgpu.pydotprint.<device>.<format>``) in
    ``format`` ('svg', 'png', 'pdf' ... or 'dot' for the source itself; default: the
    outfile's extension, else 'svg') and returns its path, printing it when
    ``print_output_file``. ``compact`` draws unnamed intermediate variables as edge labels
    (False: every variable is a box); ``with_ids`` numbers the nodes of a variable graph
    (compiled functions always show their toposort positions); ``high_contrast`` fills
    nodes (False: coloured borders); ``colorCodes`` maps op class-name substrings to
    colours; ``var_with_name_simple`` labels named variables by name only. Edges are blue
    into an op viewing the input, red into one overwriting it. ``return_image`` returns
    the image (bytes; the source text for 'dot') instead of writing a file.
    Where Graphviz's ``dot`` program is missing, writes the ``.dot`` source next to
    ``outfile``, warns (GraphvizNotFoundWarning) and returns the ``.dot`` path; with
    ``return_image`` it raises GraphvizNotFoundError.
    """
    if format is None:
        ext = os.path.splitext(outfile or "")[1].lstrip(".").lower()
        format = ext if ext in DOT_FORMATS else "svg"
    source = graph_to_dot(fn_or_var, max_label_size=max_label_size, compact=compact,
                          with_ids=with_ids, high_contrast=high_contrast, colorCodes=colorCodes,
                          var_with_name_simple=var_with_name_simple)
    dot_exe = shutil.which("dot")
    if return_image:
        if format in ("dot", "gv"):
            return source
        if dot_exe is None:
            raise GraphvizNotFoundError(
                f"pydotprint(return_image=True, format={format!r}) needs Graphviz's 'dot' "
                "program, which was not found; install Graphviz (e.g. apt-get install "
                "graphviz) or pass format='dot' to get the graph's source")
        return _run_dot(dot_exe, format, source, None)
    if outfile is None:
        outfile = _default_outfile(format)
    outfile = os.path.abspath(os.path.expanduser(outfile))
    os.makedirs(os.path.dirname(outfile), exist_ok=True)
    written = _write_graph(source, outfile, format, dot_exe)
    if print_output_file:
        print(f"The output file is available at {written}")
    return written


def _write_graph(source: str, outfile: str, format: str, dot_exe: str | None) -> str:
    if format in ("dot", "gv") or outfile.endswith(".dot"):
        with open(outfile, "w") as fh:
            fh.write(source)
        return outfile
    root, _ = os.path.splitext(outfile)
    dot_path = root + ".dot"
    if dot_exe is None:
        with open(dot_path, "w") as fh:
            fh.write(source)
        warnings.warn(f"pydotprint: Graphviz's 'dot' program was not found, so {outfile} was "
                      f"not drawn; the graph's source was written to {dot_path} instead. Install "
                      f"Graphviz (e.g. apt-get install graphviz) and run: dot -T{format} "
                      f"{dot_path} -o {outfile}", GraphvizNotFoundWarning, stacklevel=3)
        return dot_path
    try:
        _run_dot(dot_exe, format, source, outfile)
    except RuntimeError as exc:
        with open(dot_path, "w") as fh:
            fh.write(source)
        raise RuntimeError(f"{exc}; the source is in {dot_path}") from None
    return outfile


# ============================================================================ Print

def _host_value(value: Any) -> Any:
    """A device array copied to the host (printing reads it there); anything else as is."""
    if hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray):
        return np.asarray(value)
    return value


def _print_fn(op: "Print", value: Any) -> None:
    """Theano's printer: ``<message> <attr> = <value of attr>`` for each attr."""
    for attr in op.attrs:
        item = getattr(value, attr) if attr in _DEVICE_ATTRS else getattr(_host_value(value), attr)
        print(op.message, attr, "=", item() if callable(item) else item)


#: attributes a device array answers without a copy to the host
_DEVICE_ATTRS = frozenset({"shape", "dtype", "ndim", "size", "strides"})


class Print(Op):
    """An identity op that prints when its value is computed (Theano's ``Print``):
    ``Print("x")(x)`` prints ``x __str__ = [...]`` each time the function computes ``x``.

    ``attrs`` are read on the value (called if callable), e.g. ``("shape", "__str__")``;
    ``global_fn(op, value)`` replaces the printing. The output is a view of the input, the
    gradient passes through, and rewrites neither fold nor merge distinct Print ops away.
    A value on the GPU is printed from a host copy (its shape and dtype without one).
    """

    __props__ = None  # identity: two Prints with one message are still two prints
    view_map = {0: [0]}
    #: constant folding would print once at compile time instead of at every call
    _no_constant_folding = True

    def __init__(self, message: str = "", attrs: tuple[str, ...] = ("__str__",),
                 global_fn: Callable[["Print", Any], None] = _print_fn) -> None:
        if isinstance(attrs, str):
            raise TypeError(f"Print: attrs must be a tuple of attribute names, got the "
                            f"string {attrs!r} (write ({attrs!r},))")
        self.message = message
        self.attrs = tuple(attrs)
        self.global_fn = global_fn

    def __str__(self) -> str:
        return f"Print{{message={self.message!r}, attrs={self.attrs}}}"

    def make_node(self, x: Any) -> Apply:
        if not isinstance(x, Variable):
            x = as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node: Apply, inputs: Any, output_storage: list[list]) -> None:
        output_storage[0][0] = inputs[0]
        self.global_fn(self, inputs[0])

    def grad(self, inputs: Any, output_grads: Any) -> list[Variable]:
        return list(output_grads)

    def R_op(self, inputs: Any, eval_points: Any) -> list[Variable]:
        return list(eval_points)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return list(input_shapes)


_vm.GRAPH_PRINTER[:] = [debugprint]  # the VM's failure reports print graphs with it
