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
* **Fallback.** Anything unexpected (an unkeyable input, a capture error, an output the graph
  cannot rebuild) runs the thunks plainly; a capture error also warns once and turns graphs off
  for that function.  Profiled functions (``vm.profiler`` set) never use graphs.

Also here: CUDA-event node timers for the profiler (:func:`register_gpu_timers`).
"""
from __future__ import annotations

import ctypes
import sys
import threading
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from symgpu.gpu.type import is_gpu_var as _is_gpu_var

__all__ = ["install", "node_capturable", "node_launches", "schedule", "plan_steps",
           "make_keyer", "Unkeyable", "Segment", "Runner", "GraphCaptureWarning", "STATS",
           "MAX_GRAPHS", "register_gpu_timers", "driver"]

#: graphs kept per segment (two alternate when the caller holds the last result)
MAX_GRAPHS = 8
#: keys remembered per segment before the first repeat
MAX_SEEN = 64
#: elements of a host value a key may hold (larger host inputs: the segment runs plainly)
HOST_KEY_LIMIT = 64
#: process-wide counters: 'plain', 'captures', 'replays', 'capture_failures', 'fallbacks'
STATS: Counter = Counter()

_getrefcount = sys.getrefcount
_CAPTURE_THREAD_LOCAL, _CAPTURE_RELAXED = 1, 2
_INSTANTIATE_AUTO_FREE_ON_LAUNCH = 1


class GraphCaptureWarning(RuntimeWarning):
    """A function's launches could not be captured into a CUDA graph; it runs them plainly."""


class Unkeyable(Exception):
    """A segment input whose value cannot be part of a graph key (a large host array...)."""


# ============================================================================ the driver

class _Driver:
    """The graph entry points of libcuda, through ctypes (handles are ``c_void_p``)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        vp, P = ctypes.c_void_p, ctypes.POINTER
        sigs = {
            "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
            "cuStreamEndCapture": [vp, P(vp)],
            "cuGraphInstantiateWithFlags": [P(vp), vp, ctypes.c_ulonglong],
            "cuGraphExecDestroy": [vp],
            "cuGraphDestroy": [vp],
            "cuThreadExchangeStreamCaptureMode": [P(ctypes.c_int)],
            "cuGetErrorString": [ctypes.c_int, P(ctypes.c_char_p)],
        }
        optional = {   # only for statistics and checks: absent, they are skipped
            "cuGraphGetNodes": [vp, vp, P(ctypes.c_size_t)],
            "cuStreamIsCapturing": [vp, P(ctypes.c_int)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.optional: dict[str, Any] = {}
        for name, args in optional.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = args, ctypes.c_int
                self.optional[name] = fn
        self.lib = lib
        # the replay call: PyDLL (the GIL stays held, no argument conversion: c_void_p in)
        self._launch = ctypes.PyDLL("libcuda.so.1").cuGraphLaunch
        self._launch.restype = ctypes.c_int

    def error(self, status: int) -> str:
        msg = ctypes.c_char_p()
        self.lib.cuGetErrorString(status, ctypes.byref(msg))
        return msg.value.decode() if msg.value else f"CUresult {status}"

    def check(self, status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"{what} failed: {self.error(status)}")

    def begin(self, stream: int) -> None:
        self.check(self.lib.cuStreamBeginCapture_v2(ctypes.c_void_p(stream),
                                                     _CAPTURE_THREAD_LOCAL),
                   "cuStreamBeginCapture")

    def end(self, stream: int) -> tuple[Any, str | None]:
        """End the capture (always call it once begun): (graph or None, error or None)."""
        graph = ctypes.c_void_p()
        status = self.lib.cuStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph))
        if status:
            if graph.value:
                self.lib.cuGraphDestroy(graph)
            return None, f"cuStreamEndCapture failed: {self.error(status)}"
        return graph, None

    def instantiate(self, graph: Any) -> Any:
        exe = ctypes.c_void_p()
        self.check(self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph,
                                                        _INSTANTIATE_AUTO_FREE_ON_LAUNCH),
                   "cuGraphInstantiateWithFlags")
        return exe

    def launcher(self, exe: Any, stream: int) -> Callable[[], int]:
        """A zero-argument replay call returning the CUresult."""
        launch, s = self._launch, ctypes.c_void_p(stream)
        return lambda: launch(exe, s)

    def destroy(self, exe: Any, graph: Any) -> None:
        if exe is not None and exe.value:
            self.lib.cuGraphExecDestroy(exe)
        if graph is not None and graph.value:
            self.lib.cuGraphDestroy(graph)

    def node_count(self, graph: Any) -> int:
        """Nodes in a captured graph (-1 where the driver lacks cuGraphGetNodes)."""
        fn = self.optional.get("cuGraphGetNodes")
        if fn is None:
            return -1
        n = ctypes.c_size_t(0)
        self.check(fn(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        return int(n.value)

    def capturing(self, stream: int) -> bool:
        """Whether ``stream`` is capturing now (False where the driver cannot say)."""
        fn = self.optional.get("cuStreamIsCapturing")
        if fn is None:
            return False
        status = ctypes.c_int(0)
        self.check(fn(ctypes.c_void_p(stream), ctypes.byref(status)), "cuStreamIsCapturing")
        return status.value != 0

    @contextmanager
    def relaxed(self) -> Iterator[None]:
        """Let this thread make calls a capture forbids (cuMemAlloc from the pool)."""
        mode = ctypes.c_int(_CAPTURE_RELAXED)
        self.check(self.lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)),
                   "cuThreadExchangeStreamCaptureMode")
        try:
            yield
        finally:
            self.lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


_driver: Any = None


def driver() -> Any:
    """The process's graph driver (tests may replace ``symgpu.gpu.graphs._driver``)."""
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


# ============================================================================ decisions

def _flag(node: Any, thunk: Any, name: str) -> bool:
    value = getattr(thunk, name, None)
    if value is None:
        value = getattr(node.op, name, False)
    return bool(value)


def node_capturable(node: Any, thunk: Any) -> bool:
    """Whether ``node``'s thunk may run inside a stream capture: it (or its op) says so, and
    every host-typed input is a small value a key can hold (a scalar or a short vector)."""
    if not _flag(node, thunk, "capturable"):
        return False
    for v in node.inputs:
        if _is_gpu_var(v):
            continue
        ndim = getattr(getattr(v, "type", None), "ndim", None)
        if ndim is None or ndim > 1:
            return False
    return True


def node_launches(node: Any, thunk: Any) -> bool:
    """Whether the thunk queues device work (a segment is worth a graph only with one)."""
    return _flag(node, thunk, "launches")


def schedule(nodes: Sequence[Any], capturable: Sequence[bool],
             launches: Sequence[bool]) -> list[int]:
    """A topological order (indices into ``nodes``, themselves in topological order) that
    groups capturable nodes: ready host work with no launching node before it first, then
    capturable nodes (non-launching ones, such as views, before launching ones), then the
    remaining nodes as late as possible.  Ties keep the original order."""
    n = len(nodes)
    index = {node: i for i, node in enumerate(nodes)}
    parents: list[set[int]] = []
    children: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        ps = {index[v.owner] for v in node.inputs if v.owner is not None and v.owner in index}
        parents.append(ps)
        for p in ps:
            children[p].append(i)
    after_launch = [False] * n      # some launching node is an ancestor
    for i in range(n):
        after_launch[i] = any(after_launch[p] or launches[p] for p in parents[i])

    def rank(i: int) -> tuple[int, int]:
        if not capturable[i]:
            return (0 if not after_launch[i] else 3, i)
        return (1 if not launches[i] else 2, i)

    import heapq
    waiting = [len(ps) for ps in parents]
    ready = [rank(i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, rank(c))
    if len(order) != n:  # pragma: no cover - nodes were not in topological order
        return list(range(n))
    return order


def plan_steps(nodes: Sequence[Any], capturable: Sequence[bool], launches: Sequence[bool],
               batchable: Sequence[bool]) -> list[tuple[str, list[int]]]:
    """The runner's steps in order: ``('segment', [i...])`` for a run of capturable nodes
    with a launch, ``('batch', [i...])`` for adjacent batchable (HostFromGpu) nodes,
    ``('plain', [i])`` for everything else."""
    order = schedule(nodes, capturable, launches)
    steps: list[tuple[str, list[int]]] = []
    run: list[int] = []

    def flush_run() -> None:
        if run:
            if any(launches[i] for i in run):
                steps.append(("segment", list(run)))
            else:
                steps.extend(("plain", [i]) for i in run)
            run.clear()

    for i in order:
        if capturable[i]:
            run.append(i)
            continue
        flush_run()
        if batchable[i] and steps and steps[-1][0] in ("batch", "plain") and \
                all(batchable[j] for j in steps[-1][1]):
            kind, idx = steps.pop()
            steps.append(("batch", idx + [i]))
        else:
            steps.append(("plain", [i]))
    flush_run()
    return steps


# ============================================================================ keys

def _host_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        if v.size > HOST_KEY_LIMIT:
            raise Unkeyable(f"a host array of {v.size} elements")
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (bool, int, float, np.generic)):
        return (type(v), v)
    if v is None:
        return None
    raise Unkeyable(f"a host value of type {type(v).__name__}")


def make_keyer(is_gpu: Sequence[bool]) -> Callable[[list], tuple]:
    """``key(values)``: the tuple a graph of a segment is looked up by.  GPU values give
    (pointer, shape, strides); host values their dtype, shape and bytes (scalars: type and
    value).  Raises :class:`Unkeyable` (or AttributeError for a value of the wrong kind)."""
    gpu = tuple(bool(g) for g in is_gpu)
    if all(gpu):
        def key_gpu(vals: list) -> tuple:
            return tuple([(v.ptr, v.shape, v.strides) for v in vals])
        return key_gpu

    def key(vals: list) -> tuple:
        return tuple([(v.ptr, v.shape, v.strides) if g else _host_key(v)
                      for v, g in zip(vals, gpu)])
    return key


# ============================================================================ graphs

class _Graph:
    """One instantiated graph: the blocks it owns and how to rebuild its outputs."""

    __slots__ = ("exe", "graph", "owned", "outs", "launch", "drv", "ctx", "__weakref__")

    def __init__(self, drv: Any, exe: Any, graph: Any, owned: tuple, outs: list,
                 launch: Callable[[], int], ctx: Any) -> None:
        self.drv, self.exe, self.graph, self.owned = drv, exe, graph, owned
        self.outs, self.launch, self.ctx = outs, launch, ctx

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
                 internal_cells: list[list], ctx: Any) -> None:
        self.runner = runner
        self.items = items                   # (node index, thunk, cells dead after it)
        self.in_cells, self.in_gpu = in_cells, in_gpu
        self.const_ids = {id(c): c for c in const_values}
        self.out_cells = out_cells           # read after the segment (or function outputs)
        self.produced_cells = produced_cells  # every output cell of the segment's nodes
        self.internal_cells = internal_cells  # produced and read only inside the segment
        self.dead = [c for _, _, d in items for c in d]
        self.key = make_keyer(in_gpu)
        self.ctx = ctx
        self.graphs: dict[tuple, list[_Graph]] = {}
        self.n_graphs = 0
        self.seen: dict[tuple, None] = {}
        self.current = items[0][0]
        self.plain_runs = self.captures = self.replays = 0
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
                            self._replay(g, vals)
                            return
                if key in self.seen:
                    if self.n_graphs < MAX_GRAPHS:
                        self._capture(key, vals)
                        return
                else:
                    if len(self.seen) >= MAX_SEEN:
                        self.seen.clear()
                    self.seen[key] = None
        self._plain()

    def _plain(self) -> None:
        self.plain_runs += 1
        for idx, thunk, dead in self.items:
            self.current = idx
            thunk()
            for c in dead:
                c[0] = None

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

    def _capture(self, key: tuple, vals: list) -> None:
        runner, ctx = self.runner, self.ctx
        drv = runner.driver
        pool = ctx.pool
        stream = ctx.stream_handle
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
            self._give_up(exc, vals)
            return
        err: BaseException | None = None
        try:
            for idx, thunk, _dead in self.items:  # cells die at the end: a failed capture
                self.current = idx                # runs again plainly from the same inputs
                thunk()
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
            if err is not None:
                self._retry_after_thunk_error(err, vals)
            else:
                self._give_up(RuntimeError(end_err), vals)
            return
        try:
            exe = drv.instantiate(graph)
        except Exception as exc:
            drv.destroy(None, graph)
            self._give_up(exc, vals)
            return
        owned = tuple(b for b in sink if b is not None)
        del sink
        outs = self._output_specs(vals, owned)
        if outs is None:
            drv.destroy(exe, graph)
            del owned
            self._give_up(None, vals, why="an output the graph cannot rebuild")
            return
        launch = drv.launcher(exe, stream)
        status = launch()
        if status:
            drv.check(status, "cuGraphLaunch (first replay)")
        try:
            self.nodes_captured = drv.node_count(graph)
        except Exception:
            pass
        self.graphs.setdefault(key, []).append(_Graph(drv, exe, graph, owned, outs, launch, ctx))
        self.n_graphs += 1
        self.captures += 1
        STATS["captures"] += 1
        for c in self.internal_cells:
            c[0] = None
        for c in self.dead:
            c[0] = None

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

    def _give_up(self, exc: BaseException | None, vals: list, why: str | None = None) -> None:
        """A capture failed: warn once, turn graphs off for the function, run plainly."""
        STATS["capture_failures"] += 1
        reason = why or f"{type(exc).__name__}: {exc}"
        self.runner.disable(reason, self)
        for c in self.produced_cells:
            c[0] = None
        for c, v in zip(self.in_cells, vals):   # nothing was cleared, but be sure
            c[0] = v
        self._plain()

    def release(self) -> None:
        self.graphs.clear()
        self.n_graphs = 0


from symgpu.gpu.array import GpuArray as _GpuArray  # noqa: E402  (no PyCUDA import)

_gpuarray_new = _GpuArray.__new__


# ============================================================================ the runner

class _PlainStep:
    __slots__ = ("current", "thunk", "dead")

    def __init__(self, index: int, thunk: Callable, dead: list) -> None:
        self.current, self.thunk, self.dead = index, thunk, dead

    def run(self) -> None:
        self.thunk()
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
        self.disabled_reason: str | None = None
        nodes, thunks, sm = vm.nodes, vm.thunks, vm.storage_map
        fg = vm.fgraph
        order = [i for _, idx in steps for i in idx]
        dead = _dead_cells(nodes, order, vm.gc_after, sm)
        protected = set(fg.outputs)
        self.segments: list[Segment] = []
        self.steps: list[Any] = []
        seg_out_cells: list[list] = []
        pos = 0
        for kind, idx in steps:
            my_dead = [dead[pos + k] for k in range(len(idx))]
            pos += len(idx)
            if kind == "plain":
                self.steps.append(_PlainStep(idx[0], thunks[idx[0]], my_dead[0]))
            elif kind == "batch":
                from symgpu.gpu.basic_ops import HostFromGpu
                self.steps.append(_BatchStep(
                    idx[0], [sm[nodes[i].inputs[0]] for i in idx],
                    [sm[nodes[i].outputs[0]] for i in idx],
                    [c for d in my_dead for c in d], HostFromGpu.perform_many))
            else:
                seg = self._segment(idx, my_dead, nodes, thunks, sm, order, protected)
                seg_out_cells += [c for c, v in seg._out_vars if v not in protected]
                self.segments.append(seg)
                self.steps.append(seg)
        # without garbage collection, cells read after a segment would keep its graph busy
        self.post_clear = seg_out_cells if vm.gc_after is None else []

    def _segment(self, idx: list[int], my_dead: list[list], nodes: list, thunks: list,
                 sm: dict, order: list[int], protected: set) -> Segment:
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
        seg = Segment(self, [(i, thunks[i], d) for i, d in zip(idx, my_dead)],
                      [sm[v] for v in inputs], [_is_gpu_var(v) for v in inputs], consts,
                      [sm[v] for v in out_vars], [sm[v] for v in produced],
                      [sm[v] for v in internal], self.ctx)
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


def _dead_cells(nodes: list, order: list[int], gc_after: list | None, sm: dict) -> list[list]:
    """Cells to empty after each position of ``order``: the VM's collectable cells, each
    after its last reader in the new order (none without garbage collection)."""
    if gc_after is None:
        return [[] for _ in order]
    collectable = {id(c) for d in gc_after for c in d}
    last: dict[Any, int] = {}
    for pos, i in enumerate(order):
        for v in nodes[i].inputs:
            last[v] = pos
        for v in nodes[i].outputs:
            last.setdefault(v, pos)
    dead: list[list] = [[] for _ in order]
    done: set[int] = set()
    for v, pos in last.items():
        cell = sm.get(v)
        if cell is not None and id(cell) in collectable and id(cell) not in done:
            done.add(id(cell))
            dead[pos].append(cell)
    return dead


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


# ============================================================================ profiler timers

def _node_context(node: Any) -> Any:
    from symgpu.gpu import context as gctx
    for v in list(node.outputs) + list(node.inputs):
        if _is_gpu_var(v):
            return gctx._registry.get(v.type.context_name)
    return None


def _is_gpu_node(node: Any) -> bool:
    name = type(node.op).__name__
    return (name.startswith("Gpu") or name == "HostFromGpu") and _node_context(node) is not None


def _event_timer(node: Any) -> Callable:
    """Time ``node`` with two CUDA events on its context's stream (resolved after the call,
    so a profiled call syncs once, not once per node)."""
    from symgpu.compile.profiling import perf_counter_timer
    ctx = _node_context(node)
    if ctx is None or ctx.virtual or not ctx.stream_handle:
        return perf_counter_timer
    events: list = []

    def timer(thunk: Callable[[], None]) -> Callable[[], float]:
        if not events:
            import pycuda.driver as drv
            ctx.activate()
            events.extend([drv.Event(), drv.Event()])
        start, end = events
        start.record(ctx.stream)
        thunk()
        end.record(ctx.stream)

        def elapsed() -> float:
            end.synchronize()
            return end.time_since(start) / 1e3
        return elapsed

    return timer


def register_gpu_timers() -> None:
    """Make the profiler time Gpu* and HostFromGpu nodes with CUDA events (once)."""
    from symgpu.compile import profiling
    if any(f is _event_timer for _, f in profiling.TIMERS):
        return
    profiling.register_node_timer(_is_gpu_node, _event_timer)


_lock = threading.Lock()
with _lock:
    _register_vm_hook()
    register_gpu_timers()
