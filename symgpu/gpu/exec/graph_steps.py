"""The CUDA-graph runner's steps other than segments (graphs.Runner builds them): a plain
node, a plain node that owns its output's block, a batch of copies to the host, and the
context switch of a runner on several devices."""
from __future__ import annotations

import threading
from typing import Any, Callable

from symgpu.gpu.runtime.context import thread_state as _thread_state
from symgpu.gpu.runtime.pool import Block as _Block

__all__ = ["_PlainStep", "_OwnedPlainStep", "_BatchStep", "_Activate"]


class _PlainStep:
    __slots__ = ("current", "thunk", "dead")

    def __init__(self, index: int, thunk: Callable, dead: list) -> None:
        self.current, self.thunk, self.dead = index, thunk, dead

    def run(self) -> None:
        self.thunk()
        for c in self.dead:
            c[0] = None


class _OwnedPlainStep:
    """A plain node whose GPU output feeds a segment and never leaves the call (an upload of
    a constant or of a host input, typically): the step owns one block and has the node
    compute into it every call, so the segment finds its input where its graph reads it (no
    staging copy, no new capture).

    Why this is safe, decided when the runner is built rather than by watching references:
    the output is not in ``graph_plan.escaping`` (no function output is it or a view of it),
    so nothing reads the previous call's array once that call has returned; the step keeps
    the :class:`~symgpu.gpu.runtime.pool.Block` itself, so the pool never hands it to anybody else;
    and the pool gives it (``pool.hint``) only to the node's next allocation of its size
    class on this thread.  Should another allocation of the node take it (a scratch buffer),
    the output is elsewhere that call and the segment copies it in."""

    __slots__ = ("current", "thunk", "dead", "out_cell", "pool", "block")

    def __init__(self, index: int, thunk: Callable, dead: list, out_cell: list,
                 pool: Any) -> None:
        self.current, self.thunk, self.dead = index, thunk, dead
        self.out_cell, self.pool, self.block = out_cell, pool, None

    def run(self) -> None:
        pool = self.pool
        block = self.block
        if block is not None:
            pool.hint_thread = threading.get_ident()
            pool.hint = block
        allocs = pool.n_allocs
        try:
            self.thunk()
        finally:
            pool.hint = None
        v = self.out_cell[0]
        if block is None or getattr(v, "ptr", None) != block.ptr:
            base = getattr(v, "base", None)
            # a block the node took from the pool in this call, under an array made here
            if type(base) is _Block and pool.n_allocs != allocs and v.ptr == base.ptr and \
                    getattr(v, "_gpudata", None) is None:
                self.block = base
        for c in self.dead:
            c[0] = None


class _BatchStep:
    """Adjacent HostFromGpu nodes: every copy queued, one stream sync."""

    __slots__ = ("current", "in_cells", "out_cells", "dead", "many")

    def __init__(self, index: int, in_cells: list, out_cells: list, dead: list,
                 many: Callable) -> None:
        self.current, self.in_cells, self.out_cells = index, in_cells, out_cells
        self.dead, self.many = dead, many

    def run(self) -> None:
        results = self.many([c[0] for c in self.in_cells])
        for c, r in zip(self.out_cells, results):
            c[0] = r
        for c in self.dead:
            c[0] = None


class _Activate:
    """A step of a runner on several devices: make the next step's context current (a
    replay runs no thunk that would; a thunk that activates its own is not slowed)."""

    __slots__ = ("current", "ctx", "activate")

    def __init__(self, index: int, ctx: Any) -> None:
        self.current, self.ctx, self.activate = index, ctx, ctx.activate

    def run(self) -> None:
        if getattr(_thread_state, "current", None) is not self.ctx:
            self.activate()
