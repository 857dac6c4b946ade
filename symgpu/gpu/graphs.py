"""Whole-function CUDA graphs: record a compiled function's launches once, replay them after.

Why: a GPU function call is mostly Python (one thunk per node, ~4 us a launch through the
driver).  A CUDA graph replays every kernel, cuBLAS call, memset and device copy of a function
with one ``cuGraphLaunch``.  PyCUDA has no capture API, so the driver is called through ctypes
on the context's stream (``cuStreamBeginCapture_v2`` ... ``cuStreamEndCapture``,
``cuGraphInstantiateWithFlags``, ``cuGraphLaunch``).

How (the VM hook :func:`install`, run on every new VM while ``gpuarray.cuda_graphs`` is on):

* **Which nodes.** A thunk (or its op) says ``capturable = True`` when it only takes pool memory,
  does host bookkeeping and queues work on the context's stream (GpuElemwise, GpuCAReduce,
  the BLAS ops, the view/shape ops); ``launches = True`` when it queues device work.  Transfers
  and CPU ops are not capturable.  The nodes are re-ordered (any topological order is valid:
  the destroy handler lets a node overwrite only a variable nobody else reads) so that host
  work with no GPU work before it runs first, capturable nodes next, and the rest as late as
  possible; maximal runs of capturable nodes with at least one launch become *segments*, and
  adjacent HostFromGpu nodes one batched copy with a single stream sync.
* **When.** A segment is keyed on its inputs: device pointer, shape and strides of every GPU
  value, the value of every (small) host value.  The first call with a new key runs plainly
  and remembers the key; a repeat captures (the thunks run with the stream in capture mode and
  every pool block they take goes to the graph); later repeats replay.
* **Whose memory.** A graph owns every block allocated while it was captured: outputs,
  intermediates, reduction scratch.  It replays only while no one else holds any of them
  (reference counts: a result the caller still holds keeps its graph busy, and the next call
  captures or replays a second graph, so ``r = f()`` in a loop alternates between two).
  Outputs come back as new GpuArrays over the graph's blocks (or over the inputs, for in-place
  and view outputs).
* **Stable pointers.** Keys repeat only if the inputs' buffers do.  A plain node whose output
  feeds a segment (an upload) recycles its own few pool blocks (``_StablePlainStep``), and an
  update's new value is copied back into the buffer of the shared variable it updates (in the
  graph, or after a plain run) when nobody else holds either and nothing that can fail runs
  after the segment, so ``w`` keeps its pointer from call to call (the copy costs one
  device-to-device copy of the variable; the destroy handler never lets ops write into a
  function's inputs, so updates are computed into fresh memory).
* **Checked.** Each new graph is checked once: the segment runs plainly from copies of its
  inputs, then the graph runs from the same values, and the results must agree (segments
  whose GPU inputs pass ``VERIFY_LIMIT`` bytes are not captured at all).
* **Fallback.** Anything unexpected (an unkeyable input, a capture error, an output the graph
  cannot rebuild, a disagreeing graph) runs the thunks plainly; a capture error also warns once
  and turns graphs off for that function.  Profiled functions (``vm.profiler`` set) never use
  graphs.

Beside it: graph_plan.py (which nodes, in which order, keys: pure functions), graph_driver.py
(the driver calls through ctypes) and event_timers.py (the profiler's CUDA-event timers, which
importing this module registers).
"""
from __future__ import annotations

import sys
import threading
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.event_timers import register_gpu_timers
from symgpu.gpu.graph_plan import (Unkeyable, aliases as _aliases, dead_cells as _dead_cells,
                                   make_keyer, node_capturable, node_launches, plan_steps,
                                   schedule)
from symgpu.gpu.type import is_gpu_var as _is_gpu_var

__all__ = ["install", "node_capturable", "node_launches", "schedule", "plan_steps",
           "make_keyer", "Unkeyable", "Segment", "Runner", "GraphCaptureWarning", "STATS",
           "MAX_GRAPHS", "register_gpu_timers", "driver"]

#: graphs kept per segment (two alternate when the caller holds the last result)
MAX_GRAPHS = 8
#: keys remembered per segment before the first repeat
MAX_SEEN = 64
#: check each new graph once against plain launches of the same inputs (the GPU inputs are
#: copied for that; segments whose GPU inputs pass VERIFY_LIMIT bytes are never captured)
VERIFY = True
VERIFY_LIMIT = 64 << 20
#: process-wide counters of the rare events: 'captures', 'capture_failures' (per-segment
#: counts of plain runs and replays: ``Runner.stats()``)
STATS: Counter = Counter()

_getrefcount = sys.getrefcount


class GraphCaptureWarning(RuntimeWarning):
    """A function's launches could not be captured into a CUDA graph; it runs them plainly."""


# ============================================================================ the driver

_driver: Any = None


def driver() -> Any:
    """The process's graph driver (tests may replace ``symgpu.gpu.graphs._driver``)."""
    global _driver
    if _driver is None:
        from symgpu.gpu.graph_driver import CudaGraphDriver
        _driver = CudaGraphDriver()
    return _driver


# ============================================================================ graphs

class _Graph:
    """One instantiated graph: the blocks it owns and how to rebuild its outputs."""

    __slots__ = ("exe", "graph", "owned", "outs", "launch", "drv", "ctx", "backs",
                 "__weakref__")

    def __init__(self, drv: Any, exe: Any, graph: Any, owned: tuple, outs: list,
                 launch: Callable[[], int], ctx: Any) -> None:
        self.drv, self.exe, self.graph, self.owned = drv, exe, graph, owned
        self.outs, self.launch, self.ctx = outs, launch, ctx
        self.backs: tuple = ()   # inputs the graph overwrites with an update's value

    def free(self) -> bool:
        """No one but this graph holds any of its blocks (they may be overwritten)."""
        for b in self.owned:
            # the tuple, the loop variable, getrefcount's argument
            if _getrefcount(b) > 3:
                return False
        return True

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
    drv, ctx, exe, graph, _owned = entry
    try:
        if not getattr(ctx, "virtual", True):
            ctx.synchronize()   # no launch of the graph may still be running
        drv.destroy(exe, graph)
    except Exception:  # interpreter shutdown
        pass


def _bury_collected() -> None:
    while _GRAVEYARD:
        _bury(_GRAVEYARD.pop())


class Segment:
    """A run of capturable nodes: plain launches, a capture, or a replay per call."""

    def __init__(self, runner: "Runner", items: list[tuple[int, Callable, list]],
                 in_cells: list[list], in_gpu: list[bool], const_values: list[Any],
                 out_cells: list[list], produced_cells: list[list],
                 internal_cells: list[list], ctx: Any,
                 copy_back: Sequence[tuple[list, int]] = ()) -> None:
        self.runner = runner
        self.items = items                   # (node index, thunk, cells dead after it)
        self.in_cells, self.in_gpu = in_cells, in_gpu
        self.const_ids = {id(c): c for c in const_values}
        self.out_cells = out_cells           # read after the segment (or function outputs)
        self.produced_cells = produced_cells  # every output cell of the segment's nodes
        self.internal_cells = internal_cells  # produced and read only inside the segment
        #: (update output cell, index of the updated input): a graph may copy the new value
        #: back into the input's buffer, so shared variables keep their pointers
        self.copy_back = list(copy_back)
        #: inputs whose cells empty inside the segment: their memory is scratch after it
        dead_ids = {id(c) for _, _, d in items for c in d}
        self.dying_inputs = [k for k, c in enumerate(in_cells) if id(c) in dead_ids]
        self.dead = [c for _, _, d in items for c in d]
        self.key = make_keyer(in_gpu)
        self.ctx = ctx
        self.graphs: dict[tuple, list[_Graph]] = {}
        self.n_graphs = 0
        self.seen: dict[tuple, bool] = {}    # key -> may be captured
        self.current = items[0][0]
        self.plain_runs = self.captures = self.replays = self.verified = 0
        self.nodes_captured = 0

    # -- the per-call path
    def run(self) -> None:
        if self.runner.enabled:
            vals = [c[0] for c in self.in_cells]
            try:
                key = self.key(vals)
            except Exception:
                key = None
            if key is not None:
                graphs = self.graphs.get(key)
                if graphs is not None:
                    for g in graphs:
                        for b in g.owned:
                            # the tuple, the loop variable, getrefcount's argument
                            if _getrefcount(b) > 3:
                                break
                        else:
                            if g.backs and not self._exclusive(vals, g.backs):
                                continue
                            self._replay(g, vals)
                            return
                ok = self.seen.get(key)
                if ok:
                    if self.n_graphs < MAX_GRAPHS:
                        self._capture(key, vals)
                        return
                elif ok is None:
                    if len(self.seen) >= MAX_SEEN:
                        self.seen.clear()
                    self.seen[key] = True
            self._plain_call(vals)
            return
        self._plain()

    def _plain_call(self, vals: list) -> None:
        self._plain()
        if self.copy_back:
            self._plain_copy_back(vals)

    def _plain(self, count: bool = True) -> None:
        if count:   # the reference run of a capture being verified is not counted
            self.plain_runs += 1
        for idx, thunk, dead in self.items:
            self.current = idx
            thunk()
            for c in dead:
                c[0] = None

    def _exclusive(self, vals: list, inputs: Sequence[int]) -> bool:
        """Whether the arrays ``vals[j]`` are held by their cell (and ``vals``) alone, with
        their memory: a graph may then overwrite them with an update's new value.  Views of
        the same memory that are segment inputs dying inside the segment (``b.dimshuffle('x')``
        made by a plain step before it) are read before the copy back and do not count."""
        for j in inputs:
            v = vals[j]
            # the cell, the vals list, this local, getrefcount's argument
            if _getrefcount(v) != 4:
                return False
            base = v.base
            if type(base) is not _Block:
                return False
            refs = _getrefcount(base) - base.held   # not counting recycling caches
            for k in self.dying_inputs:
                u = vals[k]
                if k != j and u is not v and getattr(u, "base", None) is base and \
                        getattr(u, "_gpudata", None) is None:
                    refs -= 1
            gd = v._gpudata
            if gd is None:
                if refs != 3:                   # v.base, this local, the argument
                    return False
            elif _getrefcount(gd) != 3 or refs != 4:  # gd.owner too
                return False
        return True

    def _replay(self, g: _Graph, vals: list) -> None:
        self.current = self.items[0][0]
        status = g.launch()
        if status:
            g.drv.check(status, "cuGraphLaunch")
        owned = g.owned
        for cell, kind, a, b in g.outs:
            if kind == 0:        # a buffer of the graph: a = its index in owned, b = layout
                arr = _gpuarray_new(_GpuArray)
                ctx, ptr, shape, strides, dtype = b
                arr._set(ctx, ptr, shape, strides, dtype, owned[a])
                cell[0] = arr
            elif kind == 1:      # a segment input itself
                cell[0] = vals[a]
            elif kind == 2:      # a view of a segment input: (input, (offset, shape, strides))
                v = vals[a]
                off, shape, strides = b
                cell[0] = v._view(v.ptr + off, shape, strides)
            elif kind == 3:      # a fixed value (a constant's, or a view of one)
                cell[0] = a
            elif kind == 4:      # a host value computed from the shapes: a fresh copy
                cell[0] = a.copy() if isinstance(a, np.ndarray) else a
            else:                # an empty array (no memory)
                arr = _gpuarray_new(_GpuArray)
                arr._set(*b)
                cell[0] = arr
        for c in self.dead:
            c[0] = None
        self.replays += 1

    # -- capture
    def _snapshot(self, vals: list) -> list | None:
        """Device copies of the GPU inputs (to run the segment twice from the same values),
        or None when they are too large to copy (the key is then never captured)."""
        total = 0
        for v, g in zip(vals, self.in_gpu):
            if g:
                total += v.nbytes
        if total > VERIFY_LIMIT:
            return None
        from symgpu.gpu.elemwise import new_array
        copy = self.runner.driver.copy
        snap: list = []
        for v, g in zip(vals, self.in_gpu):
            if g and v.size:
                s = new_array(self.ctx, v.shape, v.dtype)
                copy(s, v)
                snap.append(s)
            else:
                snap.append(None)
        return snap

    def _restore(self, vals: list, snap: list) -> None:
        copy = self.runner.driver.copy
        for c, v, s in zip(self.in_cells, vals, snap):
            if s is not None:
                copy(v, s)
            c[0] = v

    def _host_values(self) -> list:
        vals = [c[0] for c in self.out_cells]
        dev = [k for k, v in enumerate(vals) if isinstance(v, _GpuArray)]
        got = self.runner.driver.to_host([vals[k] for k in dev]) if dev else []
        out: list = [np.array(v, copy=True) if not isinstance(v, _GpuArray) else None
                     for v in vals]
        for k, h in zip(dev, got):
            out[k] = h
        return out

    def _capture(self, key: tuple, vals: list) -> None:
        runner, ctx = self.runner, self.ctx
        drv = runner.driver
        pool = ctx.pool
        stream = ctx.stream_handle
        ref = snap = None
        if runner.verify:
            # run plainly first: the graph must give the same values (checked below)
            try:
                snap = self._snapshot(vals)
            except Exception as exc:   # no memory for the copies...: no graphs, no harm
                self.runner.disable(f"copying the inputs to check a graph failed "
                                    f"({type(exc).__name__}: {exc})", self)
                snap = None
            if snap is None:
                self.seen[key] = False
                self._plain_call(vals)
                return
            self._plain(count=False)   # a thunk's error is the call's own: it propagates
            try:
                ref = self._host_values()
            except Exception as exc:   # the plain results stand
                self.runner.disable(f"reading results to check a graph failed "
                                    f"({type(exc).__name__}: {exc})", self)
                return
            self._restore(vals, snap)
        backs = [j for _, j in self.copy_back if self._exclusive(vals, (j,))]
        for c in self.produced_cells:
            c[0] = None
        sink: list = []
        try:
            ctx.activate()
            pool.begin_sink(sink, drv.relaxed)
            try:
                drv.begin(stream)
            except BaseException:
                pool.end_sink()
                raise
        except Exception as exc:
            self._give_up(exc, vals, snap)
            return
        err: BaseException | None = None
        copied: list[int] = []
        try:
            for idx, thunk, _dead in self.items:  # cells die at the end: a failed capture
                self.current = idx                # runs again plainly from the same inputs
                thunk()
            scratch = {id(b) for b in sink}
            scratch.update(id(vals[k]) for k in self.dying_inputs)
            for cell, j in self.copy_back:
                if j in backs and self._copy_back(cell, vals[j], scratch):
                    copied.append(j)
        except BaseException as exc:  # noqa: B902 - the capture must end whatever happened
            err = exc
        finally:
            try:
                graph, end_err = drv.end(stream)
            finally:
                pool.end_sink()
            if _GRAVEYARD:
                _bury_collected()
        if err is not None or end_err is not None:
            drv.destroy(None, graph)
            if err is not None and not isinstance(err, Exception):
                raise err  # KeyboardInterrupt and the like
            if err is not None and snap is None:
                self._retry_after_thunk_error(err, vals)
            else:
                self._give_up(err or RuntimeError(end_err), vals, snap)
            return
        try:
            exe = drv.instantiate(graph)
        except Exception as exc:
            drv.destroy(None, graph)
            self._give_up(exc, vals, snap)
            return
        owned = tuple(b for b in sink if b is not None)
        del sink
        outs = self._output_specs(vals, owned)
        if outs is None:
            drv.destroy(exe, graph)
            del owned
            self._give_up(None, vals, snap, why="an output the graph cannot rebuild")
            return
        launch = drv.launcher(exe, stream)
        status = launch()
        if status:
            drv.check(status, "cuGraphLaunch (first replay)")
        g = _Graph(drv, exe, graph, owned, outs, launch, ctx)
        g.backs = tuple(copied)
        if ref is not None:
            try:
                why = _differs(ref, self._host_values())
            except Exception as exc:
                why = f"reading them failed: {type(exc).__name__}: {exc}"
            if why is not None:
                del g, owned
                self._give_up(None, vals, snap, why=f"the graph's results differ from plain "
                                                   f"launches ({why})")
                return
            self.verified += 1
        try:
            self.nodes_captured = drv.node_count(graph)
        except Exception:
            pass
        self.graphs.setdefault(key, []).append(g)
        self.n_graphs += 1
        self.captures += 1
        STATS["captures"] += 1
        for c in self.internal_cells:
            c[0] = None
        for c in self.dead:
            c[0] = None

    def _copy_back(self, cell: list, target: Any, scratch: set) -> bool:
        """Under capture: copy an update's new value into the buffer of the variable it
        updates, and hand that variable's array on as the new value.  The new value must be
        scratch: a buffer of the graph, or a segment input that dies in the segment."""
        new = cell[0]
        if not isinstance(new, _GpuArray) or new is target or not _same_layout(new, target):
            return False
        if id(new) not in scratch and (new.base is None or id(new.base) not in scratch):
            return False
        self.runner.driver.copy(target, new)
        cell[0] = target
        return True

    def _plain_copy_back(self, vals: list) -> None:
        """After a plain run: copy each update's new value into the updated variable's
        buffer when nobody else holds either, so shared variables keep their pointers (and
        the keys of later calls repeat) from the first call on."""
        copy = None
        for cell, j in self.copy_back:
            new = cell[0]
            if not isinstance(new, _GpuArray) or new is vals[j] or \
                    not _same_layout(new, vals[j]) or \
                    not _sole(new, sum(1 for v in vals if v is new)) or \
                    not self._exclusive(vals, (j,)):
                continue
            if copy is None:
                copy = self.runner.driver.copy
            copy(vals[j], new)
            cell[0] = vals[j]

    def _output_specs(self, vals: list, owned: tuple) -> list | None:
        """How each output cell is rebuilt on replay, from the values the capture run left
        in them; None when one cannot be."""
        where = {id(b): k for k, b in enumerate(owned)}
        in_ids = {id(v): j for j, v in enumerate(vals)}
        in_bases = {}
        for j, (v, g) in enumerate(zip(vals, self.in_gpu)):
            if g and v is not None and getattr(v, "base", None) is not None:
                in_bases.setdefault(id(v.base), j)
        const_bases = {id(c.base) for c in self.const_ids.values()
                       if isinstance(c, _GpuArray) and c.base is not None}
        outs = []
        for cell in self.out_cells:
            a = cell[0]
            if a is None:
                return None
            j = in_ids.get(id(a))
            if j is not None:
                outs.append((cell, 1, j, None))
                continue
            if id(a) in self.const_ids:
                outs.append((cell, 3, a, None))
                continue
            if isinstance(a, _GpuArray):
                base = a.base
                if a.size == 0:
                    outs.append((cell, 5, None, (a.context, 0, a.shape, a.strides, a.dtype,
                                                 None)))
                    continue
                if base is not None and id(base) in const_bases:
                    outs.append((cell, 3, a, None))
                    continue
                k = where.get(id(base)) if base is not None else None
                if k is not None:
                    outs.append((cell, 0, k, (a.context, a.ptr, a.shape, a.strides, a.dtype)))
                    continue
                j = in_bases.get(id(base)) if base is not None else None
                if j is not None and vals[j].dtype == a.dtype:
                    outs.append((cell, 2, j, (a.ptr - vals[j].ptr, a.shape, a.strides)))
                    continue
                return None
            if isinstance(a, (np.ndarray, np.generic, int, float, bool)):
                outs.append((cell, 4, a, None))
                continue
            return None
        return outs

    def _retry_after_thunk_error(self, err: Exception, vals: list) -> None:
        """A thunk raised under capture: run plainly.  If the plain run raises too, the error
        is the call's own (bad shapes...) and propagates with graphs left on; otherwise the
        capture was at fault and graphs are turned off for the function."""
        for c in self.produced_cells:
            c[0] = None
        for c, v in zip(self.in_cells, vals):
            c[0] = v
        self._plain()
        STATS["capture_failures"] += 1
        self.runner.disable(f"{type(err).__name__}: {err}", self)

    def _give_up(self, exc: BaseException | None, vals: list, snap: list | None = None,
                 why: str | None = None) -> None:
        """A capture failed: warn once, turn graphs off for the function, and compute the
        call plainly (from the snapshot of the inputs when one was taken: a graph that ran may
        have written into them)."""
        STATS["capture_failures"] += 1
        reason = why or f"{type(exc).__name__}: {exc}"
        self.runner.disable(reason, self)
        for c in self.produced_cells:
            c[0] = None
        if snap is not None:
            self._restore(vals, snap)
        for c, v in zip(self.in_cells, vals):
            c[0] = v
        self._plain()

    def release(self) -> None:
        self.graphs.clear()
        self.n_graphs = 0


from symgpu.gpu.array import GpuArray as _GpuArray  # noqa: E402  (no PyCUDA import)
from symgpu.gpu.pool import Block as _Block  # noqa: E402

_gpuarray_new = _GpuArray.__new__


def _same_layout(a: Any, b: Any) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.size > 0 and \
        a.is_c_contiguous and b.is_c_contiguous


def _sole(a: Any, extra: int = 0) -> bool:
    """Whether GpuArray ``a`` is held by one cell (and the caller's local, plus ``extra``
    references the caller knows of) alone, with its memory (a Block nobody else holds)."""
    if _getrefcount(a) != 4 + extra:   # the cell, the caller's local, this argument, the call
        return False
    base = a.base
    if type(base) is not _Block:
        return False
    refs = _getrefcount(base) - base.held       # not counting recycling caches
    gd = a._gpudata
    if gd is None:
        return refs == 3                        # a.base, this local, the argument
    return _getrefcount(gd) == 3 and refs == 4


def _differs(ref: list, got: list) -> str | None:
    """Why two lists of host results differ (None when they agree)."""
    for k, (a, b) in enumerate(zip(ref, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype.kind in "fc":
            if not np.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True):
                return f"output {k}: max difference {np.nanmax(np.abs(a - b)):.3g}"
        elif not np.array_equal(a, b):
            return f"output {k}: {int(np.sum(a != b))} elements differ"
    return None


# ============================================================================ the runner

class _PlainStep:
    __slots__ = ("current", "thunk", "dead")

    def __init__(self, index: int, thunk: Callable, dead: list) -> None:
        self.current, self.thunk, self.dead = index, thunk, dead

    def run(self) -> None:
        self.thunk()
        for c in self.dead:
            c[0] = None


class _StablePlainStep:
    """A plain node whose GPU output feeds a segment (an upload, typically): its output
    memory is recycled from the node's own few blocks, so the segment's key (which holds the
    pointer) repeats whatever else the pool hands out or a capture takes from it."""

    __slots__ = ("current", "thunk", "dead", "out_cell", "pool", "cache")

    def __init__(self, index: int, thunk: Callable, dead: list, out_cell: list,
                 pool: Any) -> None:
        self.current, self.thunk, self.dead = index, thunk, dead
        self.out_cell, self.pool, self.cache = out_cell, pool, []

    def run(self) -> None:
        pool = self.pool
        cache = self.cache
        for b in cache:
            if _getrefcount(b) <= 3:   # the list, the loop variable, the argument
                pool.hint_thread = threading.get_ident()
                pool.hint = b
                break
        try:
            self.thunk()
        finally:
            pool.hint = None
        v = self.out_cell[0]
        base = getattr(v, "base", None)
        if type(base) is _Block and len(cache) < 4:
            for b in cache:
                if b is base:
                    break
            else:
                cache.append(base)
                base.held += 1
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


class Runner:
    """``vm.runner``: runs the VM's nodes as plain steps, batched copies and segments."""

    def __init__(self, vm: Any, steps: list[tuple[str, list[int]]], ctx: Any,
                 drv: Any = None) -> None:
        self.vm = vm
        self.ctx = ctx
        self.driver = drv if drv is not None else driver()
        self.enabled = True
        self.verify = VERIFY
        self.disabled_reason: str | None = None
        nodes, thunks, sm = vm.nodes, vm.thunks, vm.storage_map
        fg = vm.fgraph
        order = [i for _, idx in steps for i in idx]
        dead = _dead_cells(nodes, order, vm.gc_after, sm)
        protected = set(fg.outputs)
        # update pairs (new value, updated input): fgraph.update_mapping {out idx: in idx}
        mapping = getattr(fg, "update_mapping", None) or {}
        updates = [(fg.outputs[o], fg.inputs[i]) for o, i in mapping.items()
                   if o < len(fg.outputs) and i < len(fg.inputs)]
        seg_inputs: set = set()
        for kind, idx in steps:
            if kind == "segment":
                seg_inputs.update(v for i in idx for v in nodes[i].inputs)
        self.segments: list[Segment] = []
        self.steps: list[Any] = []
        seg_out_cells: list[list] = []
        pos = 0
        for s_no, (kind, idx) in enumerate(steps):
            my_dead = [dead[pos + k] for k in range(len(idx))]
            pos += len(idx)
            if kind == "plain":
                node = nodes[idx[0]]
                outs = node.outputs
                if len(outs) == 1 and outs[0] in seg_inputs and _is_gpu_var(outs[0]):
                    self.steps.append(_StablePlainStep(idx[0], thunks[idx[0]], my_dead[0],
                                                       sm[outs[0]], ctx.pool))
                else:
                    self.steps.append(_PlainStep(idx[0], thunks[idx[0]], my_dead[0]))
            elif kind == "batch":
                from symgpu.gpu.basic_ops import HostFromGpu
                self.steps.append(_BatchStep(
                    idx[0], [sm[nodes[i].inputs[0]] for i in idx],
                    [sm[nodes[i].outputs[0]] for i in idx],
                    [c for d in my_dead for c in d], HostFromGpu.perform_many))
            else:
                # an update may be copied back into its variable's buffer only when nothing
                # that can fail runs after the segment (the call then cannot raise after the
                # shared variable changed): the steps left are copies to the host at most
                tail_safe = all(k == "batch" or (k == "plain" and all(
                    type(nodes[i].op).__name__ == "HostFromGpu" for i in ix))
                    for k, ix in steps[s_no + 1:])
                seg = self._segment(idx, my_dead, nodes, thunks, sm, order, protected,
                                    updates if tail_safe else [])
                seg_out_cells += [c for c, v in seg._out_vars if v not in protected]
                self.segments.append(seg)
                self.steps.append(seg)
        # without garbage collection, cells read after a segment would keep its graph busy
        self.post_clear = seg_out_cells if vm.gc_after is None else []

    def _segment(self, idx: list[int], my_dead: list[list], nodes: list, thunks: list,
                 sm: dict, order: list[int], protected: set, updates: list) -> Segment:
        from symgpu.graph.basic import Constant
        produced = [v for i in idx for v in nodes[i].outputs]
        produced_set = set(produced)
        inputs: list[Any] = []
        consts: list[Any] = []
        seen: set = set()
        for i in idx:
            for v in nodes[i].inputs:
                if v in produced_set or v in seen:
                    continue
                seen.add(v)
                if isinstance(v, Constant):
                    consts.append(sm[v][0])
                else:
                    inputs.append(v)
        later = set()
        after = order[order.index(idx[-1]) + 1:]
        for i in after:
            later.update(nodes[i].inputs)
        out_vars = [v for v in produced if v in later or v in protected]
        internal = [v for v in produced if v not in later and v not in protected]
        copy_back = []
        readers = later | set(protected)
        for new, old in updates:
            if new in produced_set and old in inputs and _is_gpu_var(old) and \
                    sum(1 for n, _ in updates if n is new) == 1 and \
                    not any(_aliases(v, old) for v in readers if v is not new):
                copy_back.append((sm[new], inputs.index(old)))
        seg = Segment(self, [(i, thunks[i], d) for i, d in zip(idx, my_dead)],
                      [sm[v] for v in inputs], [_is_gpu_var(v) for v in inputs], consts,
                      [sm[v] for v in out_vars], [sm[v] for v in produced],
                      [sm[v] for v in internal], self.ctx, copy_back)
        seg._out_vars = [(sm[v], v) for v in out_vars]
        return seg

    def __call__(self) -> None:
        step = None
        try:
            for step in self.steps:
                step.run()
        except Exception as exc:
            self.vm.raise_with_node_info(step.current if step is not None else 0, exc)
        for c in self.post_clear:
            c[0] = None

    def disable(self, reason: str, segment: Segment | None = None) -> None:
        """Turn graphs off for this function (warned once)."""
        if not self.enabled:
            return
        self.enabled = False
        self.disabled_reason = reason
        where = ""
        if segment is not None:
            node = self.vm.nodes[segment.current]
            where = f" (at {node})"
        warnings.warn(f"symgpu: capturing a CUDA graph failed{where}: {reason}; this function "
                      f"runs its launches plainly from now on", GraphCaptureWarning,
                      stacklevel=4)
        for seg in self.segments:
            seg.release()

    def stats(self) -> dict[str, int]:
        """Counts over the segments: plain runs, captures, replays, graphs held."""
        out = {"segments": len(self.segments), "plain": 0, "captures": 0, "replays": 0,
               "graphs": 0, "nodes_captured": 0}
        for s in self.segments:
            out["plain"] += s.plain_runs
            out["captures"] += s.captures
            out["replays"] += s.replays
            out["graphs"] += s.n_graphs
            out["nodes_captured"] = max(out["nodes_captured"], s.nodes_captured)
        return out


# ============================================================================ installing

def _graph_context(vm: Any) -> Any:
    """The one started (non-virtual) context all GPU variables of ``vm`` live on, or None."""
    from symgpu.gpu import context as gctx
    names = set()
    for node in vm.nodes:
        for v in list(node.inputs) + list(node.outputs):
            if _is_gpu_var(v):
                names.add(v.type.context_name)
    if len(names) != 1:
        return None
    ctx = gctx._registry.get(next(iter(names)))
    if ctx is None or ctx.virtual or ctx.pool is None or not ctx.stream_handle:
        return None
    return ctx


def install(vm: Any) -> None:
    """The VM hook: give ``vm`` a :class:`Runner` when graphs are on and worth it."""
    from symgpu.config import config
    from symgpu.link.vm import VM
    if type(vm) is not VM or not config.gpuarray.cuda_graphs or not vm.nodes:
        return
    ctx = _graph_context(vm)
    if ctx is None:
        return
    nodes, thunks = vm.nodes, vm.thunks
    capt = [node_capturable(n, t) for n, t in zip(nodes, thunks)]
    if not any(capt):
        return
    launches = [c and node_launches(n, t) for n, t, c in zip(nodes, thunks, capt)]
    batch = [type(n.op).__name__ == "HostFromGpu" for n in nodes]
    steps = plan_steps(nodes, capt, launches, batch)
    if not any(kind != "plain" for kind, _ in steps):
        return
    vm.runner = Runner(vm, steps, ctx)


def _register_vm_hook() -> None:
    from symgpu.link import vm as vm_mod
    hooks = getattr(vm_mod, "VM_HOOKS", None)
    if hooks is not None and install not in hooks:
        hooks.append(install)


_lock = threading.Lock()
with _lock:
    _register_vm_hook()
    register_gpu_timers()
