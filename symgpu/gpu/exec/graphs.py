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
* **Keys.** A segment is keyed on its inputs' shapes and strides (their dtypes are their
  variables' types), the value of every (small) host value, except host scalars that are
  *graph parameters* (graph_params.py: an index, a learning rate, slice bounds, an arange's
  start), which each call writes into the segment's device parameter block before the launch
  and the captured kernels read there; what they change in shapes stays in the key.  Device
  pointers are not in the key.  The first call with a new key runs plainly and remembers the
  key; a repeat captures (the thunks run with the stream in capture mode and every pool block
  they take goes to the graph); later repeats replay.
* **Inputs: where a graph reads them.** A graph reads each GPU input either *in place* (at
  the address it had when captured: the graph serves a call only while the input is still
  there, one pointer comparison per input) or from a *static buffer* of its own, of the
  input's layout, that the input is copied into (one device-to-device copy, queued before the
  launch) when it is elsewhere.  A plain node whose output feeds a segment and never leaves
  the call (an upload, a convolution: known when the runner is built) owns one block and
  computes into it every call (``_OwnedPlainStep``), so its output stays put with no copy.
  Inputs the caller passes per call are staged from the start; any other input (a shared
  variable only read, an RNG state updated by a plain node, a plain node's output that is
  also returned) is read in place until it is first found
  moved, then staged for good (the graph that read it in place is dropped, the call captures
  a new one), so an input that never moves costs no copy and one that moves costs a copy of
  it, never a capture or a plain run per call.  The one exception: the shared variable an
  update is copied back into (below) is written by the graph, so it is never staged: when it
  moves (``set_value``) the graph is dropped, the call runs plainly and copies its update back
  into the new buffer, and the next call captures there; one that moves again and again
  (swapped buffers) has its pointer put in the key.
* **Updates in place.** An update's new value is copied back into the buffer of the shared
  variable it updates (in the graph, or after a plain run), so the variable stays where the
  graph reads it from call to call (the copy costs one device-to-device copy of the variable;
  the destroy handler never lets ops write into a function's inputs, so updates are computed
  into fresh memory).  Only when that buffer is pool memory never lent to the user
  (``pool.lend``: ``get_value(borrow=True, return_internal_type=True)`` and ``set_value(...,
  borrow=True)`` mark it, an explicit flag), no value the function returns may alias the new
  value, no later reader aliases the old one, and nothing that can fail runs after the segment
  (the copies are guarded by the device checks: device_checks.GuardedCopies), so a failed call
  changes nothing.  Under capture, an update computed by a GpuElemwise is written straight
  (by a GpuGemm, accumulated) into the variable's buffer instead, so the graph holds no copy
  (graph_segment.DIRECT_UPDATES, ``Segment._capture_items``), when, besides the above, the
  function has no device-checked op (nothing could then stop the write once a check
  reported), no later node of the segment reads the variable (update nodes that are sinks
  move after such readers: graph_plan.updates_last) and the node reads the variable, if at
  all, with its own layout (or as its thunk's ``aligned_read`` vouches: a reduction reading
  a bias broadcast over the rows it sums, GpuCAReduce).
* **Outputs: whose memory.** A graph owns every block allocated while it was captured:
  outputs, intermediates, reduction scratch, static input buffers.  Which of its outputs may
  leave the call is known when the runner is built (function outputs and what they may alias
  through views and in-place ops); those are handed out as arrays sharing one lease
  (graph_instance.Lease), of which the graph keeps a weak reference: while a result the
  caller kept (or a view of it) is alive, the graph does not run again (liveness of what it
  handed out, decided when the call looks for a graph, never a count of references), and the
  next call replays or captures a second graph of the same key, so ``r = f()`` in a loop
  alternates between two.  Outputs that stay inside the call are plain arrays over the
  graph's blocks.
* **Threads.** A call holds its context's ``call_lock`` (a capture records whatever reaches
  the context's one stream): :class:`Runner` takes it, and GPU functions without a graph get a
  ``_Locked`` plain run that does (docs/threads.md).
* **Several devices.** A function whose GPU values live on two devices' contexts always gets
  a Runner (graphs on or off): each segment holds one device's nodes (a graph is captured on
  one stream), each device's ready nodes are grouped, every launch on every device comes
  before the copies to the host, each step's context is made current before it runs
  (``_Activate``: a replay runs no thunk that would), and a call holds every context's call
  lock, taken in their global order.  So the host queues device 0's work, then device 1's,
  and only waits in the copies back: the devices compute at the same time.  Copies between
  them (GpuToGpu) are queued device to device, ordered by events (runtime/peer.py).
* **Checked.** Each new graph is checked once: the segment runs plainly from copies of its
  inputs, then the graph runs from the same values, and the results must agree (segments
  whose GPU inputs pass :func:`verify_limit` bytes, a sixteenth of the device's memory by
  default, are not captured at all).
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

import gc
import sys
import threading
import weakref
import warnings
from collections import Counter
from typing import Any, Callable

from symgpu.compile.sharedvalue import SharedVariable
from symgpu.config import config
from symgpu.gpu.exec import graph_segment as _graph_segment
from symgpu.gpu.exec import graph_varying as _graph_varying
from symgpu.gpu.exec.event_timers import register_gpu_timers
from symgpu.gpu.exec.graph_driver import CudaGraphDriver
from symgpu.gpu.exec.graph_instance import _bury_collected
from symgpu.gpu.exec.graph_plan import (Unkeyable, aliases as _aliases, dead_cells as _dead_cells,
                                        escaping as _escaping, make_keyer, mark_reusable_outputs,
                                        node_capturable, node_launches, parameter_nodes,
                                        plan_steps, read_later, schedule, tail_safe,
                                        updates_last)
from symgpu.gpu.exec.graph_segment import Segment
from symgpu.gpu.exec.graph_steps import _Activate, _BatchStep, _OwnedPlainStep, _PlainStep
from symgpu.gpu.exec.shape_memo import ShapeMemoStep, memo_nodes, with_shape_memo
from symgpu.gpu.ops.guarded_updates import reads_verdict
from symgpu.gpu.placement.basic_ops import GpuFromHost, HostFromGpu
from symgpu.gpu.placement.type import is_gpu_var as _is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.comm_stream import on_communicator_teardown
from symgpu.gpu.runtime.context import thread_state as _thread_state
from symgpu.gpu.runtime.host_register import deferred_waits
from symgpu.graph.basic import Constant
from symgpu.link import vm as vm_mod
from symgpu.link.token_lock import HELD_NAME, TokenLock
from symgpu.link.vm import VM

assert HELD_NAME == "_symgpu_held"   # the name Runner.entry binds while it holds the lock

__all__ = ["install", "node_capturable", "node_launches", "schedule", "plan_steps",
           "make_keyer", "Unkeyable", "Segment", "Runner", "GraphCaptureWarning", "STATS",
           "MAX_GRAPHS", "VARIED_REPEATS", "VARIED_AFTER",
           "register_gpu_timers", "driver", "node_contexts", "release_communicating_graphs"]

#: segments holding a collective (an op with ``captures_communicator``): their graphs keep
#: NCCL's communicator alive (release_communicating_graphs)
_COMMUNICATING: "weakref.WeakSet[Segment]" = weakref.WeakSet()

#: graphs kept per segment (two alternate when the caller holds the last result; a
#: sequence padded to its bucket: one per bucket, 11 for lengths 10..90, 16 for 10..160)
MAX_GRAPHS = 16
#: replays in a row a staged input that moved must arrive from one place (a shared variable
#: after set_value, a GpuArray passed for a host input after host arrays) before the graph is
#: captured again reading it there, so it is no longer copied into a static buffer before
#: each replay; GPU inputs the caller passes per call stay staged (Segment.per_call)
SETTLE_REPLAYS = 8
#: times one input is re-pinned so; past that it stays staged (values that keep moving
#: between a few places would otherwise cost a capture each time they settle)
MAX_REPINS = 2
#: keys remembered per segment before the first repeat (a bound on memory: keys are shapes
#: and small host values, so a function sees few)
MAX_SEEN = 64
#: sights of one key before a segment that has met more than VARIED_AFTER distinct keys
#: captures it (before that: the second sight).  A segment whose shapes change from call to
#: call (a new sequence length each call) then runs plainly instead of paying a checked
#: capture (tens of ms) for every length that happens to come back (a graph it keeps few
#: calls would replay), and a graph of its whose input moved is dropped, not captured again
#: at once; a shape that truly recurs is still captured, a little later.  Such a segment's
#: plain runs are watched, and the runner splits it: the nodes whose shapes follow the call
#: run plainly, the others are captured apart, keyed by what they see (graph_varying.py)
VARIED_REPEATS = 4
VARIED_AFTER = 4
#: check each key's first graph against plain launches of the same inputs (the GPU inputs are
#: copied for that; segments whose GPU inputs pass :func:`verify_limit` bytes are never
#: captured): VERIFY_LIMIT bytes where set, else VERIFY_FRACTION of the device's memory and
#: at least VERIFY_LIMIT_FLOOR.  Why relative: a training step's inputs are its parameters
#: and optimizer states, 85 MB for one GPT block with AdamW (7M parameters, two moments), so
#: a fixed 64 MB kept every real model's step plain (a copy back per update, the host's gaps
#: between launches); copying them once per captured key costs a few ms of device memory
#: traffic on a device of 80-141 GB
VERIFY = True
VERIFY_LIMIT: int | None = None
VERIFY_FRACTION = 1 / 16
VERIFY_LIMIT_FLOOR = 64 << 20
#: process-wide counters of the rare events: 'captures', 'capture_failures', 'splits'
#: (per-segment counts of plain runs and replays: ``Runner.stats()``)
STATS: Counter = Counter()
_graph_segment.read_settings_from(sys.modules[__name__])   # Segment reads the settings above

def verify_limit(ctx: Any) -> int:
    """The most bytes of GPU inputs a segment on ``ctx`` may have to be captured (its check
    copies them once): ``VERIFY_LIMIT`` where set, else ``VERIFY_FRACTION`` of the device's
    memory, at least ``VERIFY_LIMIT_FLOOR``."""
    if VERIFY_LIMIT is not None:
        return int(VERIFY_LIMIT)
    total = int(getattr(ctx, "total_memory", 0) or 0)
    return max(VERIFY_LIMIT_FLOOR, int(total * VERIFY_FRACTION))


class GraphCaptureWarning(RuntimeWarning):
    """A function's launches could not be captured into a CUDA graph; it runs them plainly."""


# ============================================================================ the driver

_driver: Any = None


def driver() -> Any:
    """The process's graph driver (tests may replace ``symgpu.gpu.exec.graphs._driver``)."""
    global _driver
    if _driver is None:
        _driver = CudaGraphDriver()
    return _driver


# ============================================================================ the runner

class Runner:
    """``vm.runner``: runs the VM's nodes as plain steps, batched copies and segments."""

    def __init__(self, vm: Any, steps: list[tuple[str, list[int]]], ctx: Any,
                 drv: Any = None, node_contexts: list | None = None,
                 forced_plain: frozenset[int] = frozenset()) -> None:
        self.vm = vm
        self.ctx = ctx
        #: each node's context, for a function on several devices (None: all on ``ctx``):
        #: segments then hold one context's nodes (plan_steps) and run on its stream, and a
        #: step switching devices makes its context current first (_Activate)
        self.node_contexts = node_contexts
        #: the contexts the runner launches on, in the global order of their call locks
        self.contexts = [ctx] if node_contexts is None else sorted(
            {id(c): c for c in node_contexts if c is not None}.values(),
            key=lambda c: _call_lock(c).order)
        #: the context's call lock (context.GpuContext.call_lock, docs/threads.md); with
        #: several contexts, ``locks``: every one, taken in that order
        self.lock: TokenLock = _call_lock(ctx)
        self.locks = [_call_lock(c) for c in self.contexts]
        self.driver = drv if drv is not None else driver()
        self.enabled = True
        #: nodes run plainly although capturable: found to follow the call in a varied
        #: segment (graph_varying.py); a runner of one context may split (``split``)
        self.forced_plain = forced_plain
        self.can_split = node_contexts is None and _graph_varying.SPLIT
        self.verify = VERIFY
        self.disabled_reason: str | None = None
        nodes, thunks, sm = vm.nodes, vm.thunks, vm.storage_map
        fg = vm.fgraph
        # update pairs (new value, updated input): fgraph.update_mapping {out idx: in idx}
        mapping = getattr(fg, "update_mapping", None) or {}
        updates = [(fg.outputs[o], fg.inputs[i]) for o, i in mapping.items()
                   if o < len(fg.outputs) and i < len(fg.inputs)]
        # with ops that report checks at the next sync, copies back into shared variables
        # are guarded: they do not land once a check has reported (graph_segment.py)
        self.device_checked = any(getattr(n.op, "device_checked", False) for n in nodes)
        #: whether the graph guards its updates itself (gpu_guarded_updates: each update is
        #: switch(verdict, old, new), its old value in a call that is about to fail): then
        #: they are written into their buffers, and copied back, as without checks
        self.updates_guarded = self.device_checked and all(
            new is old or reads_verdict(new.owner) for new, old in updates)
        #: whether updates may be written straight into their variables' buffers under
        #: capture (graph_segment.DIRECT_UPDATES, read when the runner is built)
        self.direct_updates = bool(_graph_segment.DIRECT_UPDATES) and (
            not self.device_checked or self.updates_guarded)
        # update nodes able to write into a given buffer (GpuElemwise: write_into) run after
        # the segment's readers of their variables where they can
        at = {n: i for i, n in enumerate(nodes)}
        writers = [(new, old) for new, old in updates if new.owner in at and
                   getattr(thunks[at[new.owner]], "write_into", None) is not None]
        if self.direct_updates and writers:
            steps = [(kind, updates_last(nodes, idx, writers)
                      if kind == "segment" and tail_safe(steps, s_no, nodes) else idx)
                     for s_no, (kind, idx) in enumerate(steps)]
        order = [i for _, idx in steps for i in idx]
        dead = _dead_cells(nodes, order, vm.gc_after, sm)
        protected = set(fg.outputs)
        #: outputs returned to the caller (not update values): a value copied back into a
        #: shared variable's buffer must not be one of them, nor seen through one
        self._returned = [v for k, v in enumerate(fg.outputs) if k not in mapping]
        #: what may leave a call (graph_plan.escaping): those outputs go out under a lease
        self._escaping = _escaping(fg)
        #: inputs the caller passes per call that segments may stage (Segment.staged): GPU
        #: function inputs that are not shared variables, not updated, never written in place
        updated = {fg.inputs[i] for i in mapping.values() if i < len(fg.inputs)}
        destroyed = [n.inputs[i] for n in nodes
                     for ins in (getattr(n.op, "destroy_map", None) or {}).values() for i in ins]
        self._stageable = {v for v in fg.inputs
                           if _is_gpu_var(v) and not isinstance(v, SharedVariable)
                           and v not in updated and not any(_aliases(d, v) for d in destroyed)}
        #: host arrays are uploaded (runtime/host_register.deferred_waits)
        self.uploads_arrays = any(isinstance(n.op, GpuFromHost)
                                  and not all(n.inputs[0].type.broadcastable) for n in nodes)
        self._shape_fixed = {v for i in memo_nodes(nodes, fg) for v in nodes[i].outputs}
        seg_inputs: set = set()
        for kind, idx in steps:
            if kind == "segment":
                seg_inputs.update(v for i in idx for v in nodes[i].inputs)
        self.segments: list[Segment] = []
        self.steps: list[Any] = []
        seg_out_cells: list[list] = []
        #: values that keep one place per key (Segment.steady: pinned, not staged once keys
        #: vary): earlier segments' outputs
        self._steady: set = set()
        pos = 0
        for s_no, (kind, idx) in enumerate(steps):
            my_dead = [dead[pos + k] for k in range(len(idx))]
            pos += len(idx)
            step_ctx = self._context_of(idx)
            if node_contexts is not None and step_ctx is not None and kind != "batch":
                self.steps.append(_Activate(idx[0], step_ctx))
            if kind == "plain":
                node = nodes[idx[0]]
                outs = node.outputs
                if len(outs) == 1 and outs[0] in seg_inputs and _is_gpu_var(outs[0]) and \
                        outs[0] not in self._escaping and \
                        not getattr(node.op, "view_map", None) and \
                        not getattr(node.op, "destroy_map", None):
                    self.steps.append(_OwnedPlainStep(idx[0], thunks[idx[0]], my_dead[0],
                                                      sm[outs[0]], (step_ctx or ctx).pool))
                else:
                    self.steps.append(_PlainStep(idx[0], thunks[idx[0]], my_dead[0]))
            elif kind == "batch":
                self.steps.append(_BatchStep(
                    idx[0], [sm[nodes[i].inputs[0]] for i in idx],
                    [sm[nodes[i].outputs[0]] for i in idx],
                    [c for d in my_dead for c in d], HostFromGpu.perform_many))
            else:
                seg = self._segment(idx, my_dead, nodes, thunks, sm, order, protected,
                                    updates if tail_safe(steps, s_no, nodes) else [],
                                    step_ctx or ctx)
                seg_out_cells += [c for c, v in seg._out_vars if v not in protected]
                self.segments.append(seg)
                self.steps.append(seg)
        # host arithmetic of the inputs' shapes: once per new set of shapes (shape_memo.py)
        self.steps = with_shape_memo(self.steps, _PlainStep, nodes, thunks, sm, fg)
        for memo in self.steps:
            if isinstance(memo, ShapeMemoStep):
                for seg in self.segments:
                    seg.key_memo_outputs(memo.kept)
        # without garbage collection, the cells read after a segment are emptied after the
        # call all the same: nothing keeps a graph's buffers between calls
        self.post_clear = seg_out_cells if vm.gc_after is None else []
        #: what a call runs (VM.dispatch routes generated calls to it; __call__ runs it)
        self.entry = self._entry() if node_contexts is None else self._entry_contexts()

    def _context_of(self, idx: list[int]) -> Any:
        """The context a step's nodes run on (several contexts only; else None)."""
        if self.node_contexts is None:
            return None
        return next((self.node_contexts[i] for i in idx
                     if self.node_contexts[i] is not None), None)

    def _entry_contexts(self) -> Callable[[], None]:
        """One call of a function on several devices: every context's call lock, taken in
        their global order, then the steps.  No step waits for a device but the copies to
        the host (and a GpuToGpu's fallback through the host), which the plan puts after
        every launch: each device runs its share while the host queues the next device's
        (segments replay their CUDA graphs asynchronously; _Activate makes each step's
        context current)."""
        steps, post_clear, uploads, vm = self.steps, self.post_clear, self.uploads_arrays, self.vm
        locks = self.locks
        held = tuple(locks)
        first = steps[0] if steps else None

        def entry() -> None:
            taken: list = []
            step = first
            try:
                for lock in locks:
                    lock.acquire()
                    taken.append(lock)
                _symgpu_held = held  # noqa: F841 (HELD_NAME, as in _entry)
                if uploads:
                    with deferred_waits():
                        for step in steps:
                            step.run()
                else:
                    for step in steps:
                        step.run()
                for c in post_clear:
                    c[0] = None
            except Exception as exc:   # the node's own error, named (as in _entry)
                vm.raise_with_node_info(step.current if step is not None else 0, exc)
            finally:
                for lock in reversed(taken):
                    lock.release()
        return entry

    def _entry(self) -> Callable[[], None]:
        """One call: the steps under the context's call lock, with the context current (a
        replay runs no thunk that would make it so), errors re-raised with the node named as
        the VM does.  A closure over what it reads (a one-kernel function's call is mostly
        such overhead); a runner of one segment, with no uploads to defer and no cells to
        clear after it, calls the segment's run directly.  The lock's token is taken with one
        list pop (TokenLock); when it is gone (another thread's call, or this thread's: a
        scan's inner function inside the outer call) the lock is acquired the slow way."""
        steps, post_clear, uploads, vm = self.steps, self.post_clear, self.uploads_arrays, self.vm
        lock, ctx, activate, tls = self.lock, self.ctx, self.ctx.activate, _thread_state
        take, give, waiting, wake = lock.take, lock.give, lock.waiting, lock.wake
        held = (lock,)
        first = steps[0] if steps else None
        single = first.run if (len(steps) == 1 and isinstance(first, Segment)
                               and not uploads and not post_clear) else None

        def entry() -> None:
            try:
                take()
                token = True
            except IndexError:
                lock.acquire()
                token = False
            _symgpu_held = held  # noqa: F841 (HELD_NAME: read by a callback's slow acquire)
            step = first
            try:
                if getattr(tls, "current", None) is not ctx:   # activate()'s own test, inline
                    activate()
                if single is not None:
                    single()
                    return
                if uploads:     # the kernels launch while the DMA of the data runs
                    with deferred_waits():
                        for step in steps:
                            step.run()
                else:
                    for step in steps:
                        step.run()
                for c in post_clear:
                    c[0] = None
            # any error of a node is the call's own: re-raised with the node named, as the
            # VM's own loop does (raise_with_node_info), never swallowed
            except Exception as exc:
                vm.raise_with_node_info(step.current if step is not None else 0, exc)
            finally:
                if token:
                    give(None)
                    if waiting:
                        wake()
                else:
                    lock.release()
        return entry

    def _segment(self, idx: list[int], my_dead: list[list], nodes: list, thunks: list,
                 sm: dict, order: list[int], protected: set, updates: list,
                 ctx: Any) -> Segment:
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
        direct: list = []
        readers = later | set(protected)
        for new, old in updates:
            if new in produced_set and old in inputs and _is_gpu_var(old) and \
                    sum(1 for n, _ in updates if n is new) == 1 and \
                    not any(_aliases(v, old) for v in readers if v is not new) and \
                    not any(_aliases(r, new) for r in self._returned):
                copy_back.append((sm[new], inputs.index(old)))
                if self.direct_updates:
                    self._direct_update(direct, idx, nodes, thunks, sm, new, old,
                                        inputs.index(old))
        param_thunks, param_inputs, param_inner = parameter_nodes(idx, nodes, thunks, inputs,
                                                                  self._shape_fixed)
        staged = [k for k, v in enumerate(inputs) if v in self._stageable]
        destroyed = [nodes[i].inputs[k] for i in idx
                     for ins in (getattr(nodes[i].op, "destroy_map", None) or {}).values()
                     for k in ins]
        written = [k for k, v in enumerate(inputs) if any(_aliases(d, v) for d in destroyed)]
        seg = Segment(self, [(i, thunks[i], d) for i, d in zip(idx, my_dead)],
                      [sm[v] for v in inputs], [_is_gpu_var(v) for v in inputs], consts,
                      [sm[v] for v in out_vars], [sm[v] for v in produced],
                      [sm[v] for v in internal], ctx, copy_back, param_thunks,
                      param_inputs, staged, written, direct, param_inner)
        seg.nondeterministic = any(not getattr(nodes[i].op, "deterministic", True) for i in idx)
        if any(getattr(nodes[i].op, "captures_communicator", False) for i in idx):
            _COMMUNICATING.add(seg)
        seg._out_vars = [(sm[v], v) for v in out_vars]
        # another segment's outputs are its graph's buffers, at one place per key of that
        # segment, which this one's shapes follow (a bucket's graph before it): pinned, not
        # staged; one that moves after all is staged then (Segment._moved), and stays so.
        # (An owned plain step's block is not: an upload of a new length outgrows it.)
        seg.computed = {k for k, v in enumerate(inputs) if v.owner is not None} & seg.movable
        seg.steady = {k for k in seg.computed if inputs[k] in self._steady}
        self._steady.update(out_vars)
        seg.escaping = {id(sm[v]) for v in out_vars if v in self._escaping}
        # for symgpu.explain: host inputs keyed by value, and those passed as parameters
        seg.param_vars = [v for v, p in zip(inputs, param_inputs) if p]
        seg.keyed_host_vars = [v for v, p in zip(inputs, param_inputs)
                               if not p and not _is_gpu_var(v)]
        return seg

    @staticmethod
    def _direct_update(direct: list, idx: list[int], nodes: list, thunks: list, sm: dict,
                       new: Any, old: Any, j: int) -> None:
        """Add ``(position in idx, output index, input cells, j)`` to ``direct`` when the
        update ``new`` of segment input ``j`` (``old``) may be computed straight into
        ``old``'s buffer under capture: its node is of the segment, its thunk takes a
        ``write_into`` list (GpuElemwise, GpuGemm) and no later node of the segment reads
        ``old``'s memory.  The layouts are checked on the values, at the capture
        (graph_segment.Segment._capture_items)."""
        owner = new.owner
        if owner is None:
            return
        pos = next((p for p, i in enumerate(idx) if nodes[i] is owner), None)
        if pos is None or getattr(thunks[idx[pos]], "write_into", None) is None or \
                read_later(nodes, idx, pos, old):
            return
        direct.append((pos, new.index, [sm[v] for v in owner.inputs], j))

    def __call__(self) -> None:
        self.entry()

    def split(self, varying: set[int]) -> None:
        """Plan the steps again with the nodes in ``varying`` (those of a varied segment whose
        shapes follow the call: graph_varying.py) run plainly, so that the rest form segments
        keyed by what they see (a bucket of lengths); the new runner serves the next call
        (this one finishes on this runner's steps)."""
        if self.vm.runner is not self or not self.can_split:
            return      # split already (the call that found it is still on this runner)
        new = _planned(self.vm, [self.ctx], None, self.forced_plain | frozenset(varying),
                       self.driver)
        if new is None:
            return
        new.enabled, new.verify = self.enabled, self.verify
        STATS["splits"] += 1
        self.vm.runner = new

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

def _call_lock(ctx: Any) -> TokenLock:
    """A context's call lock (a context without one, a test's fake: a lock of its own)."""
    return getattr(ctx, "call_lock", None) or TokenLock()


def _started(ctx: Any) -> bool:
    return ctx is not None and not ctx.virtual and bool(ctx.stream_handle)


def _contexts(vm: Any) -> list:
    """The started (non-virtual) contexts the GPU variables of ``vm`` live on, in device
    order (names mapped to one device share its context)."""
    names = set()
    for node in vm.nodes:
        for v in list(node.inputs) + list(node.outputs):
            if _is_gpu_var(v):
                names.add(v.type.context_name)
    out = []
    for name in sorted(names, key=str):
        ctx = gpu_context._registry.get(name)
        if _started(ctx) and ctx not in out:
            out.append(ctx)
    return sorted(out, key=lambda c: getattr(c, "ordinal", 0))


def node_contexts(nodes: list) -> list | None:
    """Each node's context: that of its first GPU output, else of its first GPU input (a
    copy to the host, a shape read), None for host nodes; None for the whole list when a
    GPU variable's context is not a started one (a virtual context beside a real one)."""
    out: list = []
    for node in nodes:
        ctx = None
        for v in list(node.outputs) + list(node.inputs):
            if _is_gpu_var(v):
                ctx = gpu_context._registry.get(v.type.context_name)
                if not _started(ctx):
                    return None
                break
        out.append(ctx)
    return out


class _Locked:
    """``vm.runner`` of a GPU function that runs no CUDA graph: its plain run, under the call
    locks of its contexts (taken in one order), as graphs' Runner runs under its own."""

    __slots__ = ("run", "locks")

    def __init__(self, vm: Any, locks: list) -> None:
        self.run, self.locks = vm.run_thunks, locks

    def __call__(self) -> None:
        if len(self.locks) == 1:
            with self.locks[0]:
                self.run()
            return
        for lock in self.locks:
            lock.acquire()
        try:
            self.run()
        finally:
            for lock in reversed(self.locks):
                lock.release()


def install(vm: Any) -> None:
    """The VM hook: give a GPU ``vm`` a :class:`Runner` when graphs are on and worth it, or
    else a :class:`_Locked` plain run (calls from several threads: docs/threads.md).

    A function on several devices always gets a Runner (graphs on or off): its plan runs
    every launch, on every device, before the copies to the host that wait for results,
    so the devices work at the same time; its segments are one device's each."""
    if type(vm) is not VM or not vm.nodes:
        return
    ctxs = _contexts(vm)
    if not ctxs:
        return
    locks = sorted((_call_lock(c) for c in ctxs), key=lambda lock: lock.order)
    vm.runner = _Locked(vm, locks)
    if any(c.pool is None for c in ctxs):
        return
    per_node = node_contexts(vm.nodes)
    if per_node is None:
        return   # a virtual context beside a real one
    several = len(ctxs) > 1
    graphs_on = bool(config.gpuarray.cuda_graphs)
    if not graphs_on and not several:
        return
    runner = _planned(vm, ctxs, per_node if several else None)
    if runner is None:
        return
    if not graphs_on:
        runner.enabled = False    # segments run their thunks plainly, in the plan's order
    vm.runner = runner


def _planned(vm: Any, ctxs: list, per_node: list | None,
             plain: frozenset[int] = frozenset(), drv: Any = None) -> Runner | None:
    """A Runner of the VM's nodes, those in ``plain`` run plainly (Runner.split), or None
    where nothing would be a segment on one device (the plain VM does as well)."""
    nodes, thunks = vm.nodes, vm.thunks
    capt = [node_capturable(n, t) and i not in plain
            for i, (n, t) in enumerate(zip(nodes, thunks))]
    several = per_node is not None
    if not any(capt) and not several:
        return None
    launches = [c and node_launches(n, t) for n, t, c in zip(nodes, thunks, capt)]
    batch = [isinstance(n.op, HostFromGpu) for n in nodes]
    devices = [c.ordinal if c is not None else -1 for c in per_node] if several else None
    steps = plan_steps(nodes, capt, launches, batch, devices)
    if not several and not any(kind != "plain" for kind, _ in steps):
        return None
    return Runner(vm, steps, ctxs[0], drv, node_contexts=per_node, forced_plain=plain)


def _register_vm_hook() -> None:
    hooks = getattr(vm_mod, "VM_HOOKS", None)
    if hooks is not None:
        for hook in (mark_reusable_outputs, install):
            if hook not in hooks:
                hooks.append(hook)


_lock = threading.Lock()
with _lock:
    _register_vm_hook()
    register_gpu_timers()


@on_communicator_teardown
def release_communicating_graphs(ctx: Any = None) -> int:
    """Destroy every CUDA graph that captured a collective (on ``ctx``'s device; None: on
    any), in the thread tearing that device's communicator down; the segments capture again
    if called later.  NCCL's ncclCommDestroy waits until every graph holding one of its
    calls is destroyed: a graph kept alive by a function past ``distributed.finalize()``
    hung it on two GPUs.  Returns how many segments were released."""
    device = getattr(ctx, "device", None)
    segments = [seg for seg in list(_COMMUNICATING)
                if device is None or getattr(seg.ctx, "device", None) == device]
    for seg in segments:
        seg.release()
    gc.collect()          # graphs caught in reference cycles too
    _bury_collected()     # and those collected during a capture
    return len(segments)
