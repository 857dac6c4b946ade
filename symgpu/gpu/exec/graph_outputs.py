"""How a captured graph's outputs are rebuilt on each replay (graph_segment.py's Segment).

After the capture run, each output cell holds a value; ``output_specs`` describes where it
came from, as one of the kinds below, so a replay can put the same value (or a fresh array
over the same graph buffer) back into the cell without running any thunk; ``hand_out`` does
that.  Why a module of its own: the spec is written in one place and read in two (here and
graph_instance._Graph, which precomputes the common all-``BUFFER`` case for Segment.run's
inlined replay), and its kinds are easier to follow by name than by number.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from symgpu.gpu.exec.graph_instance import (OUT_BUFFER, OUT_EMPTY, OUT_FIXED, OUT_HOST,
                                            OUT_INPUT, OUT_INPUT_VIEW, Lease, _Graph)
from symgpu.gpu.runtime.array import GpuArray

__all__ = ["output_specs", "hand_out"]

_gpuarray_new = GpuArray.__new__


def output_specs(seg: Any, vals: list, owned: tuple, static: set = frozenset()) -> list | None:
    """How each of segment ``seg``'s output cells is rebuilt on replay, from the values the
    capture run left in them: ``(cell, kind, a, b, escapes)`` per cell (the kinds:
    graph_instance's ``OUT_*``), or None when one cannot be.  ``vals``: the segment's inputs;
    ``owned``: the graph's buffers; ``static``: staged inputs whose static buffers (in
    ``owned``) the graph writes: outputs over them are the graph's buffers."""
    where = {id(b): k for k, b in enumerate(owned)}
    in_ids = {id(v): j for j, v in enumerate(vals) if j not in static}
    in_bases = {}
    for j, (v, g) in enumerate(zip(vals, seg.in_gpu)):
        if j in static:
            continue
        if g and v is not None and getattr(v, "base", None) is not None:
            in_bases.setdefault(id(v.base), j)
    const_bases = {id(c.base) for c in seg.const_ids.values()
                   if isinstance(c, GpuArray) and c.base is not None}
    outs = []
    for cell in seg.out_cells:
        a = cell[0]
        if a is None:
            return None
        j = in_ids.get(id(a))
        if j is not None:
            outs.append((cell, OUT_INPUT, j, None, False))
            continue
        if id(a) in seg.const_ids:
            outs.append((cell, OUT_FIXED, a, None, False))
            continue
        if isinstance(a, GpuArray):
            base = a.base
            if a.size == 0:
                outs.append((cell, OUT_EMPTY, None,
                             (a.context, 0, a.shape, a.strides, a.dtype, None), False))
                continue
            if base is not None and id(base) in const_bases:
                outs.append((cell, OUT_FIXED, a, None, False))
                continue
            k = where.get(id(base)) if base is not None else None
            if k is not None:
                outs.append((cell, OUT_BUFFER, k, (a.context, a.ptr, a.shape, a.strides,
                                                   a.dtype), id(cell) in seg.escaping))
                continue
            j = in_bases.get(id(base)) if base is not None else None
            if j is not None and vals[j].dtype == a.dtype:
                outs.append((cell, OUT_INPUT_VIEW, j,
                             (a.ptr - vals[j].ptr, a.shape, a.strides), False))
                continue
            return None
        if isinstance(a, (np.ndarray, np.generic, int, float, bool)):
            outs.append((cell, OUT_HOST, a, None, False))
            continue
        return None
    return outs


def hand_out(g: _Graph, vals: list) -> None:
    """Fill the output cells from graph ``g``'s specs (``vals``: this call's inputs); the
    arrays over the graph's blocks that leave the call share one new lease (see Lease)."""
    owned = g.owned
    lease = None
    if g.escapes:
        lease = Lease(owned)
        g.lease = weakref.ref(lease)
    for cell, kind, a, b, esc in g.outs:
        if kind == OUT_BUFFER:          # a = its index in owned, b = its layout
            arr = _gpuarray_new(GpuArray)
            ctx, ptr, shape, strides, dtype = b
            arr._set(ctx, ptr, shape, strides, dtype, lease if esc else owned[a])
            cell[0] = arr
        elif kind == OUT_INPUT:         # a = the input's index
            cell[0] = vals[a]
        elif kind == OUT_INPUT_VIEW:    # a = the input's index, b = (offset, shape, strides)
            v = vals[a]
            off, shape, strides = b
            cell[0] = v._view(v.ptr + off, shape, strides)
        elif kind == OUT_FIXED:         # a = the value (a constant's, or a view of one)
            cell[0] = a
        elif kind == OUT_HOST:          # a = a host value computed from shapes: a fresh copy
            cell[0] = a.copy() if isinstance(a, np.ndarray) else a
        else:                           # OUT_EMPTY: b = _set's arguments (no memory)
            arr = _gpuarray_new(GpuArray)
            arr._set(*b)
            cell[0] = arr
