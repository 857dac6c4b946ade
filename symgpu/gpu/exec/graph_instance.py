"""One instantiated CUDA graph of a segment (graph_segment.py) and what outlives a call of it.

``_Graph``: the executable, the pool blocks it owns and how its outputs are rebuilt on
replay. ``Lease``: what the arrays handed out of a call hold, so the graph can tell by
liveness (a weak reference, never a count of references) whether they are gone. The
graveyard: graphs collected while a capture runs are destroyed once it has ended (no driver
call a capture may forbid runs during one). ``results_differ``: the check of a new graph's
results against plain launches (also scan_graph.py's).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

__all__ = ["Lease", "results_differ", "OUT_BUFFER", "OUT_INPUT", "OUT_INPUT_VIEW", "OUT_FIXED",
           "OUT_HOST", "OUT_EMPTY"]

#: how a graph rebuilds an output cell on replay (graph_outputs.output_specs writes them):
#: a buffer the graph owns, a segment input itself, a view of one, a fixed value (a
#: constant's), a host value computed from shapes, an empty array
OUT_BUFFER, OUT_INPUT, OUT_INPUT_VIEW, OUT_FIXED, OUT_HOST, OUT_EMPTY = range(6)


class Lease:
    """The base of the arrays a graph hands out of the call (its escaping outputs) over its
    own blocks: while any of them, or a view of one, is alive, so is the lease, and the graph
    does not run again (its next launch would overwrite them).  Liveness, not a count of
    references: the graph only keeps a weak reference to it."""

    __slots__ = ("blocks", "__weakref__")

    def __init__(self, blocks: tuple) -> None:
        self.blocks = blocks   # keeps the memory alive for the arrays, even past the graph


class _Graph:
    """One instantiated graph: the blocks it owns and how to rebuild its outputs."""

    __slots__ = ("exe", "graph", "owned", "outs", "launch", "drv", "ctx", "backs", "direct",
                 "lease", "escapes", "staged", "settle", "pinned", "fresh", "quick",
                 "__weakref__")

    def __init__(self, drv: Any, exe: Any, graph: Any, owned: tuple, outs: list,
                 launch: Callable[[], int], ctx: Any) -> None:
        self.drv, self.exe, self.graph, self.owned = drv, exe, graph, owned
        self.outs, self.launch, self.ctx = outs, launch, ctx
        self.backs: tuple = ()   # inputs the graph overwrites with an update's value
        self.direct: tuple = ()  # those of them an update's node writes (no copy back)
        self.lease: Any = None   # weak reference to the Lease of the last hand-out
        self.staged: tuple = ()  # (input index, static buffer) copied into before a launch
        #: staged inputs that may be read in place again once they settle (moved ones, not
        #: written by the segment: Segment._settled), decided at capture, not per replay
        self.settle: tuple = ()
        #: (input index, pointer) of the GPU inputs read (or written) where they were when
        #: captured: the graph serves a call only while each of them is still there
        self.pinned: tuple = ()
        #: whether some output handed out of the call is a buffer of the graph
        self.escapes = any(kind == OUT_BUFFER and esc for _, kind, _, _, esc in outs)
        #: when every output is a buffer of the graph that leaves the call (a function's
        #: results, the common case): (cell, context, pointer, shape, strides, dtype) each,
        #: handed out by Segment.run (a replay) without looking at the other kinds
        self.fresh = tuple((cell, *b) for cell, kind, a, b, esc in outs) \
            if outs and all(kind == OUT_BUFFER and esc for _, kind, _, _, esc in outs) else None
        #: whether a replay is the launch and that hand-out alone: every output fresh, no
        #: staged input, no graph parameters, no cell dying in the segment (set at capture;
        #: Segment.run skips the rest of the replay's steps for it)
        self.quick = False

    def idle(self) -> bool:
        """Whether nothing handed out of an earlier call still uses the graph's memory."""
        ref = self.lease
        return ref is None or ref() is None

    def __del__(self) -> None:
        entry = (self.drv, self.ctx, self.exe, self.graph, self.owned)
        pool = getattr(self.ctx, "pool", None)
        if pool is not None and pool.sink is not None:
            _GRAVEYARD.append(entry)   # collected during a capture: no sync may run now
            return
        _bury(entry)


#: graphs collected while a capture ran, destroyed once it has ended
_GRAVEYARD: list = []


def _bury(entry: tuple) -> None:
    """Destroy a collected graph.  No synchronisation: ``cuGraphExecDestroy`` of a graph still
    running frees it once it completes, and its blocks go back to a pool whose reuse is
    ordered on the same stream.  (A ``ctx.synchronize()`` here also read the device checks:
    a graph collected in the middle of a failing call raised that call's pending check into
    this function's ``except`` and cleared it, so the call's guarded update copy landed.)"""
    if sys.is_finalizing():   # the driver may be gone; the process frees everything
        return
    drv, _ctx, exe, graph, _owned = entry
    drv.destroy(exe, graph)   # (its status is not checked: nothing to do about a failure)


def _bury_collected() -> None:
    while _GRAVEYARD:
        _bury(_GRAVEYARD.pop())


#: (rtol, atol) of the 16-bit floats in results_differ: two ulps (bfloat16 is not a NumPy
#: float kind: ml_dtypes files it under 'V')
_HALF_TOLERANCE = {"float16": (2e-3, 1e-6), "bfloat16": (1.6e-2, 1e-6)}


#: how far past the two plain runs' largest difference a graph's results may stray
#: (results_differ): each is the largest of a tensor's differences, a heavy-tailed sample
#: (an AdamW step of the H200's GPT block: plain runs 7.6e-6 apart, the graph 2.8e-5 from
#: one of them, a graph that was right; 2x dropped it, and the step ran 2x slower plainly)
SPREAD_FACTOR = 4


#: a nondeterministic output's relative difference (in norm) that always passes
NOISE_FLOOR = 1e-4


def _close_in_norm(ref: np.ndarray, got: np.ndarray, other: np.ndarray) -> bool:
    """Whether ``got`` is as close to ``ref`` as another plain run (``other``) is, in norm
    relative to ``ref``'s: within SPREAD_FACTOR times that, or NOISE_FLOOR."""
    ok = ~np.isnan(ref)
    scale = float(np.linalg.norm(ref[ok])) or 1.0
    off = float(np.linalg.norm((got - ref)[ok])) / scale
    spread = float(np.linalg.norm((other - ref)[ok])) / scale
    return off <= max(SPREAD_FACTOR * spread, NOISE_FLOOR)


def results_differ(ref: list, got: list, spread: list | None = None) -> str | None:
    """Why two lists of host results differ (None when they agree to float tolerance): a
    new graph's check against plain launches (also scan_graph.py's).

    ``spread``: a second plain run's results, for segments whose ops may give other bits
    from the same inputs (float atomics): a float output then also agrees when no element
    differs from ``ref`` by more than ``SPREAD_FACTOR`` times the largest difference between
    the two plain runs, or when the whole output does not, measured as a norm relative to
    ``ref``'s (or ``NOISE_FLOOR`` of it): an optimizer step amplifies an ulp of a gradient
    near zero into a step of the learning rate, so an element-wise tolerance cannot hold and
    the largest of one pair's differences is a poor measure of the next pair's; a graph
    reading wrong memory differs by far more than plain runs do."""
    for k, (a, b) in enumerate(zip(ref, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        tol = _HALF_TOLERANCE.get(a.dtype.name)
        if tol is not None:     # an ulp or two (atomic sums add in any order), in float32
            a, b = a.astype(np.float32), b.astype(np.float32)
        if a.dtype.kind in "fc":
            rtol, atol = tol or (1e-4, 1e-6)
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                worst = np.nanmax(np.abs(a - b))
                c = None if spread is None else np.asarray(spread[k])
                same_nans = np.array_equal(np.isnan(a), np.isnan(b))
                if c is not None and c.shape == a.shape and a.size and same_nans:
                    c = c.astype(a.dtype)
                    seen = np.nanmax(np.abs(a - c))
                    if worst <= SPREAD_FACTOR * seen or _close_in_norm(a, b, c):
                        continue
                    return (f"output {k}: max difference {worst:.3g}, plain runs differ by "
                            f"{seen:.3g}")
                return f"output {k}: max difference {worst:.3g}"
        elif not np.array_equal(a, b):
            return f"output {k}: {int(np.sum(a != b))} elements differ"
    return None
