"""Interactive views of graphs (Theano's ``theano.d3viz``).

``d3viz(f, "graph.html")`` writes one self-contained HTML page (no network, no other file)
showing the graph of a compiled function: nodes coloured by kind, details and profile times
on click, pan, zoom, search and inner graphs. ``d3write(f, "graph.dot")`` writes the dot
source; `formatting.PyDotFormatter` builds it. Loaded on first use: ``import symgpu`` does
not import it.
"""
from __future__ import annotations

from symgpu.d3viz import d3viz  # the module, callable as the function (see d3viz.py)
from symgpu.d3viz.d3viz import d3write, html_page, page_data
from symgpu.d3viz.formatting import PyDotFormatter
from symgpu.d3viz.layout import layered_layout

__all__ = ["d3viz", "d3write", "PyDotFormatter", "page_data", "html_page", "layered_layout"]
