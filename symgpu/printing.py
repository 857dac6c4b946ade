"""debugprint: the graph in Theano's indented form."""
from __future__ import annotations

import sys
from typing import Any, TextIO

from symgpu.graph.basic import Variable

__all__ = ["debugprint"]


def _ids():
    n = 0
    while True:
        s, k = "", n
        while True:
            s = chr(ord("A") + k % 26) + s
            k = k // 26 - 1
            if k < 0:
                break
        yield s
        n += 1


def debugprint(obj: Any, file: TextIO | None = None, print_type: bool = False,
               print_shape: bool = False) -> None:
    """Print each output's graph: `Op [id X] 'name' order` lines, inputs indented with `|`."""
    out = file or sys.stdout
    order = {}
    if hasattr(obj, "maker"):
        fg = obj.maker.fgraph
        outputs = fg.outputs
        order = {node: i for i, node in enumerate(fg.toposort())}
    elif isinstance(obj, Variable):
        outputs = [obj]
    else:
        outputs = list(obj)
    ids, gen, done = {}, _ids(), set()

    def ident(x):
        if x not in ids:
            ids[x] = next(gen)
        return ids[x]

    def visit(var, depth):
        prefix = " " * depth + ("|" if depth else "")
        node = var.owner
        type_str = f" {var.type}" if print_type else ""
        if node is None:
            out.write(f"{prefix}{var} [id {ident(var)}]{type_str}\n")
            return
        name = f" '{var.name}'" if var.name else " ''"
        label = str(node.op)
        if len(node.outputs) > 1:
            label += f".{var.index}"
        pos = f" {order[node]}" if node in order else ""
        seen = node in done
        out.write(f"{prefix}{label} [id {ident(node)}]{name}{type_str}{pos}{'' if not seen else ''}\n")
        if seen:
            return
        done.add(node)
        for inp in node.inputs:
            visit(inp, depth + 1)

    for o in outputs:
        visit(o, 0)
