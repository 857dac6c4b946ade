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

This module holds the entry points: the settings below (read at call time, also by
graph_segment.py, so setting ``graphs.VERIFY_LIMIT`` and the like takes effect), the driver
(:func:`driver`), :class:`Runner` with its plain and batched-copy steps, and :func:`install`.
Beside it: graph_segment.py (one segment's capture, check, replay and fallback: ``Segment`` and
the graphs it keeps), graph_plan.py (which nodes, in which order, keys: pure functions),
graph_driver.py (the driver calls through ctypes) and event_timers.py (the profiler's
CUDA-event timers, which importing this module registers).
"""
from __future__ import annotations

import sys
import threading
import warnings
from collections import Counter
from typing import Any, Callable

from symgpu.gpu.event_timers import register_gpu_timers
from symgpu.gpu.graph_plan import (Unkeyable, aliases as _aliases, dead_cells as _dead_cells,
                                   make_keyer, node_capturable, node_launches, plan_steps,
                                   schedule)
from symgpu.gpu.graph_segment import Segment
from symgpu.gpu.pool import Block as _Block
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
        # with ops that report checks at the next sync, copies back into shared variables
        # are guarded: they do not land once a check has reported (graph_segment.py)
        self.device_checked = any(getattr(n.op, "device_checked", False) for n in nodes)
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
                # (a check they raise stops the copy itself: device_checks.guarded_copy)
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
