"""Theano's ``theano.d3viz.d3viz``: an interactive HTML page of a compiled function's graph.

Theano's page loaded d3.js and dagre-d3 (copied next to it, or from the package) and laid the
graph out in the browser. This one is a single file that works offline: the layout is
computed here (symgpu/d3viz/layout.py), the graph is an embedded JSON block, and the page's
script and style (page.js, page.css, page.html, package data) are inlined, so nothing is
fetched. This module is callable, like Theano's package attribute: ``d3viz(f, path)``,
``d3viz.d3viz(f, path)`` and ``d3viz.d3write(f, path)`` all work after
``from symgpu.d3viz import d3viz``.
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import sys
import types
from importlib import resources
from typing import Any

from symgpu.d3viz.formatting import PyDotFormatter
from symgpu.d3viz.layout import layered_layout
from symgpu.d3viz.model import Graph, build_graphs
from symgpu.printing import DOT_COLORS

__all__ = ["d3viz", "d3write", "page_data", "html_page", "safe_json", "replace_patterns"]

#: node sizes in pixels: height of a box, pixels per label character, padding
NODE_HEIGHT = 30.0
CHAR_WIDTH = 7.0
PADDING = 22.0
#: the slowest node is drawn this much bigger than an unprofiled one (area grows with time)
MAX_GROWTH = 0.9

_APPLY_KINDS = ("cpu", "gpu", "transfer")
LEGEND = [("host op", "cpu", "ellipse"), ("GPU op", "gpu", "ellipse"),
          ("transfer", "transfer", "ellipse"), ("input", "input", "box"),
          ("shared variable", "shared", "box"), ("constant", "constant", "box"),
          ("output / update", "output", "box"), ("variable", "variable", "box")]


def replace_patterns(x: str, replace: dict) -> str:
    """`x` with every key of `replace` replaced by its value, in the dict's order (Theano's
    helper: plain substrings, not regular expressions, both sides taken as `str`)."""
    for from_, to in replace.items():
        x = x.replace(str(from_), str(to))
    return x


def safe_json(obj: Any) -> str:
    """JSON that can sit inside a ``<script>`` element: ``<``, ``>``, ``&`` and the JS line
    separators are escaped, so no string of the graph (a variable's name) can end the
    element or start markup."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


def _graph_data(g: Graph) -> dict[str, Any]:
    """One graph's JSON: nodes with their boxes (laid out), edges with their polylines."""
    longest = max((n.time or 0.0 for n in g.nodes), default=0.0)
    sizes: dict[str, tuple[float, float]] = {}
    heat: dict[str, float] = {}
    for n in g.nodes:
        h = longest and (n.time or 0.0) / longest
        heat[n.id] = h
        grow = 1.0 + MAX_GROWTH * math.sqrt(h)
        w = max(56.0, CHAR_WIDTH * len(n.label) + PADDING)
        sizes[n.id] = (w * grow, NODE_HEIGHT * grow)
    lay = layered_layout([n.id for n in g.nodes], [(e.src, e.dst) for e in g.edges], sizes)
    nodes = []
    for n in g.nodes:
        x, y = lay.positions[n.id]
        w, h = sizes[n.id]
        nodes.append({"id": n.id, "kind": n.kind, "label": n.label, "color": n.color,
                      "shape": "ellipse" if n.kind in _APPLY_KINDS else "box",
                      "x": round(x, 1), "y": round(y, 1), "w": round(w, 1), "h": round(h, 1),
                      "op": n.op, "time": n.time, "share": n.share,
                      "heat": round(heat[n.id], 4), "search": n.search,
                      "details": [list(kv) for kv in n.details],
                      "inner": [list(kv) for kv in n.inner]})
    edges = [{"src": e.src, "dst": e.dst, "label": e.label, "kind": e.kind,
              "points": [[round(px, 1), round(py, 1)] for px, py in pts]}
             for e, pts in zip(g.edges, lay.edges)]
    return {"id": g.id, "title": g.title, "parent": list(g.parent) if g.parent else None,
            "profiled": g.profiled, "shapes": g.shapes_from, "width": round(lay.width, 1),
            "height": round(lay.height, 1), "crossings": lay.crossings,
            "nodes": nodes, "edges": edges}


def page_data(fct: Any, compact: bool = True, title: str | None = None) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data: the graphs (the function's first, then
    its inner graphs), each laid out, the legend and the profile's totals."""
    graphs = build_graphs(fct, compact=compact, title=title)
    profile = getattr(fct, "profile", None) if hasattr(fct, "maker") else None
    calls = getattr(profile, "fct_callcount", 0) if profile is not None else 0
    totals = None
    if calls:
        totals = {"calls": calls, "call_time": profile.fct_call_time,
                  "thunk_time": sum(profile.apply_time.values()),
                  "message": str(getattr(profile, "message", ""))}
    return {"title": graphs[0].title, "graphs": [_graph_data(g) for g in graphs],
            "legend": [[label, DOT_COLORS[kind], shape] for label, kind, shape in LEGEND],
            "profile": totals}


def _asset(name: str) -> str:
    return resources.files("symgpu.d3viz").joinpath(name).read_text(encoding="utf-8")


def html_page(data: dict[str, Any]) -> str:
    """The page: page.html with the style, the script and `data` inlined."""
    parts = {"TITLE": html.escape(str(data.get("title", "graph"))),
             "CSS": _asset("page.css"), "JS": _asset("page.js"), "DATA": safe_json(data)}
    # one pass, so a marker inside an inserted part (a name spelt "{{JS}}") stays text
    return re.sub(r"\{\{(TITLE|CSS|JS|DATA)\}\}", lambda m: parts[m.group(1)],
                  _asset("page.html"))


def d3viz(fct: Any, outfile: str, copy_deps: bool = True, compact: bool = True,
          title: str | None = None) -> str:
    """Write an HTML page showing the graph of `fct` (a compiled Function, a FunctionGraph,
    an Apply, a variable or a list of variables) to `outfile`; returns its path.

    The page pans (drag) and zooms (mouse wheel), colours nodes by kind (host op, GPU op,
    transfer, input, shared, constant, output), shows a node's op, parameters, types, shapes,
    device and (for a profiled function that ran) time per call and share when clicked, draws
    slow nodes bigger and redder, searches nodes by name, and opens inner graphs (Scan,
    IfElse, OpFromGraph). ``copy_deps`` is Theano's; the page embeds its scripts and styles,
    so there is nothing to copy and both values write the same self-contained file.
    ``compact`` (Theano's formatter option) draws unnamed intermediate variables as edges.
    """
    del copy_deps  # Theano copied d3.js next to the page; this page inlines everything
    text = html_page(page_data(fct, compact=compact, title=title))
    folder = os.path.dirname(os.path.abspath(outfile))
    os.makedirs(folder, exist_ok=True)
    with open(outfile, "w", encoding="utf-8") as fh:
        fh.write(text)
    return outfile


def d3write(fct: Any, path: str, *args: Any, **kwargs: Any) -> str:
    """Write the graph of `fct` as a dot file to `path` (arguments after `path` go to
    `PyDotFormatter`, e.g. ``compact=False``); returns the path."""
    return PyDotFormatter(*args, **kwargs)(fct).write_dot(path)


class _CallableModule(types.ModuleType):
    """``from symgpu.d3viz import d3viz`` gives this module; calling it draws, as Theano's
    package attribute did, and ``d3viz.d3viz`` / ``d3viz.d3write`` are the functions."""

    def __call__(self, fct: Any, outfile: str, *args: Any, **kwargs: Any) -> str:
        return d3viz(fct, outfile, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
