"""Modes: which rewrite passes run, and how the rewritten graph is linked.

* FAST_RUN — every pass tagged `fast_run` (see symgpu/graph/rewriting/db.py for the list and
  positions): merge, canonicalize, stabilize, specialize, BLAS, fusion, in-place...
* FAST_COMPILE — only what is tagged `fast_compile`: merge and constant folding (plus the GPU
  backend's placement passes), for the quickest compile.
* DebugMode — FAST_RUN's rewrites, then every call also runs the unrewritten graph and
  compares outputs, and checks that no op writes into memory it did not declare destroyed
  (symgpu/compile/debugmode.py).

The `optimizer_including` / `optimizer_excluding` flags add or remove tags (pass names, rewrite
names or group tags) for every mode.
"""
from __future__ import annotations

import time
from typing import Callable

from symgpu.config import config
from symgpu.graph.fg import FunctionGraph

__all__ = ["Mode", "get_mode", "MODE_TAGS", "FAST_RUN", "FAST_COMPILE", "FAST_THUNKS",
           "register_fast_thunk"]

#: the rewrite tags each mode includes
MODE_TAGS = {
    "FAST_RUN": ("fast_run",),
    "FAST_COMPILE": ("fast_compile",),
    "DebugMode": ("fast_run",),
}


def _load_rewrites() -> None:
    # tensor rewrites register themselves on import (symgpu.tensor imports them at its end);
    # importing here too keeps a graph-only user of Mode from silently getting no rewrites
    import symgpu.tensor.rewriting  # noqa: F401


class Mode:
    """A rewrite selection (tags included/excluded) and a linker."""

    def __init__(self, name: str = "FAST_RUN", including: tuple[str, ...] = (),
                 excluding: tuple[str, ...] = ()):
        if name not in MODE_TAGS:
            raise ValueError(f"unknown mode {name!r}; use one of {', '.join(MODE_TAGS)}")
        self.name = name
        self.including = tuple(including)
        self.excluding = tuple(excluding)

    def _clone(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "Mode":
        return get_mode(self.name)._with(including, excluding)

    def _with(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "Mode":
        self.including, self.excluding = tuple(including), tuple(excluding)
        return self

    def including_tags(self, *tags: str) -> "Mode":
        """A copy of this mode that also runs the rewrites with these tags."""
        return self._clone(self.including + tags, self.excluding)

    def excluding_tags(self, *tags: str) -> "Mode":
        """A copy of this mode that skips the rewrites with these tags."""
        return self._clone(self.including, self.excluding + tags)

    # Theano/PyTensor spellings
    including_ = including_tags
    excluding_ = excluding_tags

    def tags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(include, exclude) tags, flags included."""
        include = MODE_TAGS[self.name] + self.including + tuple(config.tags("optimizer_including"))
        exclude = self.excluding + tuple(config.tags("optimizer_excluding"))
        return include, exclude

    def passes(self):
        """The (name, rewrite) pairs this mode runs, in order."""
        from symgpu.graph.rewriting.db import optdb
        _load_rewrites()
        include, exclude = self.tags()
        return optdb.query(include, exclude)

    def rewrite(self, fgraph: FunctionGraph) -> dict[str, float]:
        """Run the passes on `fgraph` in place; returns seconds spent per pass."""
        times = {}
        for name, rewrite in self.passes():
            t0 = time.perf_counter()
            rewrite(fgraph)
            times[name] = time.perf_counter() - t0
        return times

    def link(self, fgraph: FunctionGraph, storage_map: dict):
        """The VM running `fgraph` over `storage_map` (DebugMode returns a checking one).

        Nodes of the ops in FAST_THUNKS get a closure thunk instead of the generic
        perform-based one: for a transpose or a shape lookup the generic path costs
        several times the work itself, and such nodes are in every function."""
        from symgpu.link.vm import VM, link
        vm = link(fgraph, storage_map)
        changed = False
        thunks = list(vm.thunks)
        for k, node in enumerate(vm.nodes):
            make = FAST_THUNKS.get(type(node.op))
            if make is None:
                continue
            fast = make(node, [vm.storage_map[v] for v in node.inputs],
                        [vm.storage_map[v] for v in node.outputs])
            if fast is not None:
                fast.op, fast.node = node.op, node
                fast.inputs = [vm.storage_map[v] for v in node.inputs]
                fast.outputs = [vm.storage_map[v] for v in node.outputs]
                fast.lazy = False
                thunks[k] = fast
                changed = True
        if not changed:
            return vm
        return VM(fgraph, vm.nodes, thunks, vm.storage_map, vm.gc_after)

    def __repr__(self) -> str:
        return f"Mode({self.name!r})"


# ----------------------------------------------------------------------------- fast thunks

#: op class -> make(node, input_cells, output_cells) -> thunk or None (use the generic one)
FAST_THUNKS: dict[type, Callable] = {}


def register_fast_thunk(op_class: type) -> Callable[[Callable], Callable]:
    """Decorator: a closure-thunk maker for nodes of `op_class` (see Mode.link)."""
    def deco(fn: Callable) -> Callable:
        FAST_THUNKS[op_class] = fn
        return fn
    return deco


def _register_tensor_thunks() -> None:
    import numpy as np
    from symgpu.tensor.elemwise import CAReduce, DimShuffle
    from symgpu.tensor.shape import Shape_i

    @register_fast_thunk(DimShuffle)
    def _dimshuffle(node, ins, outs):
        op = node.op
        (cin,), (cout,) = ins, outs
        nd = len(op.input_broadcastable)
        perm = tuple(op.shuffle + op.drop)
        if perm == tuple(range(nd)):
            perm = None
        if not op.augment and not op.drop:
            def thunk():
                cout[0] = cin[0].transpose(perm)
            return thunk if perm is not None else None
        if nd == 0:  # a scalar made a (1, 1, ...) array
            shape = (1,) * len(op.new_order)

            def thunk():
                cout[0] = cin[0].reshape(shape)
            return thunk
        return None

    @register_fast_thunk(Shape_i)
    def _shape_i(node, ins, outs):
        i = node.op.i
        (cin,), (cout,) = ins, outs
        asarray = np.asarray

        def thunk():
            cout[0] = asarray(cin[0].shape[i], dtype="int64")
        return thunk

    @register_fast_thunk(CAReduce)
    def _careduce(node, ins, outs):
        op = node.op
        if op.scalar_op.name not in ("add", "mul"):
            return None
        (cin,), (cout,) = ins, outs
        reduce, axis, dtype = op.ufunc.reduce, op.axis, node.outputs[0].dtype
        asarray = np.asarray

        def thunk():
            cout[0] = asarray(reduce(cin[0], axis=axis, dtype=dtype))
        return thunk


_register_tensor_thunks()

FAST_RUN = "FAST_RUN"
FAST_COMPILE = "FAST_COMPILE"


def get_mode(mode) -> Mode:
    """A Mode from None (the `mode` flag), a name, or a Mode."""
    if mode is None:
        mode = config.mode
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        if mode == "DebugMode":
            from symgpu.compile.debugmode import DebugMode
            return DebugMode()
        return Mode(mode)
    raise TypeError(f"mode must be a name ({', '.join(MODE_TAGS)}) or a Mode, got {mode!r}")
