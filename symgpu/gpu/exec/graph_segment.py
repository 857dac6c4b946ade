"""One segment of a whole-function CUDA graph (the design is in symgpu/gpu/exec/graphs.py's
docstring): per call, plain launches, a capture or a replay, and all a capture needs.

Holds :class:`Segment` (key its inputs by shape and strides, write its graph parameters,
capture on a repeated key, copy inputs that moved into the graph's static buffers or stage
them once found moved, replay while nothing handed out of an earlier call uses the graph's
blocks, check each new
graph against plain launches, copy updates back into the buffers of the variables they update
(or, under capture, have an elemwise compute them there: ``DIRECT_UPDATES``),
fall back to plain launches on anything unexpected). The instantiated graph, the lease of
what it hands out and the graveyard of collected graphs are in graph_instance.py; how its
outputs are described and rebuilt on replay, in graph_outputs.py.

Why apart from graphs.py: this is the machinery behind one segment, whose ownership,
parameter and error-path rules must be read together (the parameters' own bookkeeping is in
graph_segment_params.py); graphs.py keeps the entry points (the VM hook, ``Runner`` and its
other steps, the driver) and the settings.  The settings
(``MAX_GRAPHS``, ``MAX_SEEN``, ``VERIFY_LIMIT``, ``STATS``) stay in graphs.py and are read here
through that module at call time, so setting or patching ``symgpu.gpu.exec.graphs.VERIFY_LIMIT``
(as tests do) keeps taking effect: graphs.py hands itself over when it loads
(:func:`read_settings_from`), so this module does not import the one above it.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from symgpu.gpu.exec.graph_instance import (Lease, _bury_collected, _Graph, _GRAVEYARD,
                                            results_differ)
from symgpu.gpu.exec.graph_outputs import hand_out, output_specs
from symgpu.gpu.exec.graph_plan import Unkeyable, make_fetcher, node_launches
from symgpu.gpu.exec.graph_segment_params import SegmentParams
from symgpu.gpu.exec.graph_varying import ShapeWatch
from symgpu.gpu.runtime.array import GpuArray as _GpuArray, byte_extent, new_array
from symgpu.gpu.runtime.comm_stream import join_pending
from symgpu.gpu.runtime.compiler import CompileError
from symgpu.gpu.runtime.device_checks import GuardedCopies, is_device_check_error
from symgpu.gpu.runtime.libcuda import driver_errors
from symgpu.gpu.runtime.pool import Block as _Block

if TYPE_CHECKING:
    from symgpu.gpu.exec.graphs import Runner

__all__ = ["Segment", "DIRECT_UPDATES", "read_settings_from"]

#: under capture, compute an update straight into its shared variable's buffer when it is
#: safe (Segment._capture_items), instead of into a fresh buffer copied back after: one
#: device-to-device copy of the variable less per replay.  Read when a runner is built
#: (graphs.Runner) and at each capture.
DIRECT_UPDATES = True

_new_object = object.__new__
_weak = weakref.ref


class Segment(SegmentParams):
    """A run of capturable nodes: plain launches, a capture, or a replay per call."""

    def __init__(self, runner: "Runner", items: list[tuple[int, Callable, list]],
                 in_cells: list[list], in_gpu: list[bool], const_values: list[Any],
                 out_cells: list[list], produced_cells: list[list],
                 internal_cells: list[list], ctx: Any,
                 copy_back: Sequence[tuple[list, int]] = (),
                 param_thunks: Sequence[Any] = (),
                 param_inputs: Sequence[bool] | None = None,
                 staged: Sequence[int] = (), written: Sequence[int] = (),
                 direct: Sequence[tuple[int, int, list, int]] = (),
                 param_inner: Sequence[bool] = ()) -> None:
        self.runner = runner
        self.items = items                   # (node index, thunk, cells dead after it)
        self.in_cells, self.in_gpu = in_cells, in_gpu
        self.const_ids = {id(c): c for c in const_values}
        self.out_cells = out_cells           # read after the segment (or function outputs)
        #: ids of the out cells whose values may leave the call (function outputs, or values
        #: a function output may alias): handed out under a lease (Lease)
        self.escaping: set[int] = set()
        self.produced_cells = produced_cells  # every output cell of the segment's nodes
        self.internal_cells = internal_cells  # produced and read only inside the segment
        #: (update output cell, index of the updated input): a graph may copy the new value
        #: back into the input's buffer, so shared variables keep their pointers
        self.copy_back = list(copy_back)
        #: copy-back pairs whose node may compute the new value straight into the input's
        #: buffer under capture (no copy in the graph): item position -> [(output index,
        #: the node's input cells, updated input index)] (graphs.Runner._direct_update)
        self.direct: dict[int, list[tuple[int, list, int]]] = {}
        for pos, k, node_in, j in direct:
            self.direct.setdefault(pos, []).append((k, node_in, j))
        self._back_cell = {j: cell for cell, j in self.copy_back}
        #: inputs whose cells empty inside the segment: their memory is scratch after it
        dead_ids = {id(c) for _, _, d in items for c in d}
        self.dying_inputs = [k for k, c in enumerate(in_cells) if id(c) in dead_ids]
        self.dead = [c for _, _, d in items for c in d]
        self.first = items[0][0]             # the node a replay's errors are reported at
        #: GPU inputs a graph reads from static buffers of its own, copied into before a
        #: launch when the caller's value is elsewhere: those the caller passes per call from
        #: the start, and every other one (but an update's target) once it has moved
        self.staged = set(staged)
        #: inputs a graph may stage once they moved: GPU inputs no update is copied back into
        targets = {j for _, j in copy_back}
        self.movable = {k for k, g in enumerate(in_gpu) if g and k not in targets}
        #: movable inputs the call computes before the segment (not variables, not function
        #: inputs): never read in place again once staged; staged once the keys vary but
        #: for the ``steady`` ones, which keep one place per key (another segment's graph
        #: outputs) (graphs.Runner._segment sets both)
        self.computed: set[int] = set()
        self.steady: set[int] = set()
        #: inputs a node of the segment writes in place: a staged one's outputs are the graph's
        self.written = set(written)
        #: staged input -> [the pointer its last replays read it from, how many in a row],
        #: and how many times it was re-pinned (``_settled``); inputs the caller passes per
        #: call (staged from the start) stay staged
        self.per_call = frozenset(staged)
        self.settling: dict[int, list[int]] = {}
        self.repins: dict[int, int] = {}
        #: times each input was found moved; an input that cannot be staged and keeps moving
        #: gets its pointer into the key (``by_pointer``) instead of a capture per move
        self.moves: dict[int, int] = {}
        self.param_inputs = param_inputs
        self.by_pointer = [False] * len(in_gpu)
        #: host inputs the runner's shape memo writes (``key_memo_outputs``)
        self.memoised: list[bool] | None = None
        self.fetch = make_fetcher(self.in_cells, in_gpu, param_inputs)
        self._init_params(param_thunks, param_inner)
        self.ctx = ctx
        self.graphs: dict[tuple, list[_Graph]] = {}
        self.n_graphs = 0
        #: key -> times met (0: never captured, e.g. inputs too large to check)
        self.seen: dict[tuple, int] = {}
        #: distinct keys met: past VARIED_AFTER (shapes that change from call to call: a new
        #: sequence length each call), a key is captured only at its VARIED_REPEATS-th sight
        self.keys_met = 0
        #: keys met a second time: where they are at least half of the keys met, up to
        #: MAX_GRAPHS of them, the keys repeat (a bucket's, whatever pads to it) and the
        #: segment captures as one with few keys (``_few_keys``)
        self.repeated_keys = 0
        #: past VARIED_AFTER keys, the plain runs are watched node by node (graph_varying.py)
        #: where the runner can split the segment by what varies; False once decided
        self.watching = runner.can_split
        self.watch: ShapeWatch | None = None
        #: a segment of a runner planned again by a split (Runner.split): its keys were
        #: seen to repeat (a bucket), so a key's second sight captures however many it met
        self.split_off = bool(runner.forced_plain)
        self.current = items[0][0]
        self.plain_runs = self.captures = self.replays = self.verified = 0
        #: keys whose graph was checked against plain launches: captured again (an input
        #: moved or settled: the same nodes and shapes, only where inputs are read differs),
        #: a key's graph is not checked again (the check costs a plain run, copies of every
        #: input and a read-back: most of a capture's milliseconds)
        self.checked: set[tuple] = set()
        #: whether a node of the segment may give other bits from the same inputs (an op with
        #: ``deterministic = False``: float atomics, as fused attention's dq): a new graph is
        #: then checked against the spread of two plain runs (graphs.Runner._segment sets it)
        self.nondeterministic = False
        self.nodes_captured = 0

    # -- the per-call path
    def run(self) -> None:
        if self.runner.enabled:
            try:
                vals, key = self.fetch()
                if self.param_thunks:
                    key = (key, self._param_key(key))
            except (Unkeyable, AttributeError, TypeError, ValueError):
                # unkeyable or bad input: the plain run raises the node's error
                vals, key = [c[0] for c in self.in_cells], None
            if key is not None:
                graphs = self.graphs.get(key)
                if graphs is not None:
                    for g in graphs:
                        lease = g.lease    # idle: nothing handed out still uses its memory
                        if (lease is None or lease() is None) and \
                                (not g.backs or self._overwritable(vals, g.backs)):
                            for j, ptr in g.pinned:
                                if vals[j].ptr != ptr:
                                    self._moved(key, g, vals)
                                    return
                            break
                    else:
                        g = None
                    if g is not None:   # replay (inline: a call less on the fastest path)
                        quick = g.quick   # the launch and the hand-out alone (_Graph.quick)
                        if not quick:
                            if g.settle and self._settled(g.settle, vals):
                                self._repin(key, g, vals)
                                return
                            self.current = self.first
                            if self.param_thunks:
                                self._upload_params()
                            for j, buf in g.staged:
                                v = vals[j]
                                if v.ptr != buf.ptr:
                                    g.drv.copy(buf, v)
                        status = g.launch()
                        if status:
                            self.current = self.first
                            g.drv.check(status, "cuGraphLaunch")
                        fresh = g.fresh
                        if fresh is not None:   # hand_out's common case, inline
                            lease = _new_object(Lease)   # Lease(g.owned) without __init__
                            lease.blocks = g.owned
                            g.lease = _weak(lease)
                            for cell, ctx, ptr, shape, strides, dtype in fresh:
                                arr = _gpuarray_new(_GpuArray)   # GpuArray._set, inline
                                arr.context, arr.ptr, arr.shape = ctx, ptr, shape
                                arr.strides, arr.dtype, arr.base = strides, dtype, lease
                                arr._gpudata = None
                                cell[0] = arr
                        else:
                            hand_out(g, vals)
                        if not quick:
                            for c in self.dead:
                                c[0] = None
                        self.replays += 1
                        return
                sights = self.seen.get(key)
                if sights is None:
                    if len(self.seen) >= _graphs.MAX_SEEN:
                        self.seen.clear()
                    self.seen[key] = 1
                    self.keys_met += 1
                elif sights:
                    sights += 1
                    if sights == 2:
                        self.repeated_keys += 1
                    if self.n_graphs < _graphs.MAX_GRAPHS and sights >= (
                            2 if self._few_keys() else _graphs.VARIED_REPEATS):
                        self._capture(key, vals)
                        return
                    self.seen[key] = sights
            self._plain_call(vals, key)
            if self.learning is not None:
                self._learn_layouts()
            return
        self._plain()

    def key_memo_outputs(self, cells: Sequence[list]) -> None:
        """Key the host inputs that are in ``cells`` (the shape memo's outputs) by the
        object's identity first (graph_plan.make_keyer's ``memoised``)."""
        ids = {id(c) for c in cells}
        memoised = [not g and id(c) in ids for c, g in zip(self.in_cells, self.in_gpu)]
        if any(memoised):
            self.memoised = memoised
            self.fetch = make_fetcher(self.in_cells, self.in_gpu, self.param_inputs,
                                      self.by_pointer, memoised)

    def _moved(self, key: tuple, g: _Graph, vals: list) -> None:
        """Inputs ``g`` reads in place are elsewhere this call: drop ``g``; inputs that may be
        staged are from now on (and this call captures), others run this call plainly (its
        update is copied back into the moved buffer) and are captured where they now are at
        the next call, or keyed by pointer once they have moved twice.  A segment whose keys
        vary (past VARIED_AFTER) runs this call plainly and captures the key again at its
        next sight (its VARIED_REPEATS-th when an input that moved cannot be staged); one
        split off a varied segment (``split_off``: its keys repeat) captures at once."""
        moved = [j for j, ptr in g.pinned if vals[j].ptr != ptr]
        self._drop(key, g)
        capture = True
        for j in moved:
            n = self.moves[j] = self.moves.get(j, 0) + 1
            if j in self.movable and _stageable(vals[j]):
                self.staged.add(j)
                continue
            capture = False
            if n >= 2 and not self.by_pointer[j]:
                self.by_pointer[j] = True
                self.fetch = make_fetcher(self.in_cells, self.in_gpu, self.param_inputs,
                                          self.by_pointer, self.memoised)
                self.release()
                self.seen.clear()
        if not self._few_keys():
            # shapes that vary: no capture at once for a key that may not come back soon; the
            # next sight captures it (staging what moved), or, when what moved cannot be
            # staged, the VARIED_REPEATS-th
            self.seen[key] = _graphs.VARIED_REPEATS - 1 if capture else 1
            capture = False
        if capture and self.n_graphs < _graphs.MAX_GRAPHS:
            self._capture(key, vals)
        else:
            self._plain_call(vals)

    def _few_keys(self) -> bool:
        """Whether a key's second sight captures: up to VARIED_AFTER distinct keys, or up to
        MAX_GRAPHS where the keys repeat: a segment split off a varied one, or one whose
        keys came back (at least half of them: lengths padded to a few buckets)."""
        met = self.keys_met
        return met <= _graphs.VARIED_AFTER or met <= _graphs.MAX_GRAPHS and (
            self.split_off or 2 * self.repeated_keys >= met)

    def _past_varied(self) -> bool:
        """Whether the keys have varied (split off a varied segment, or more of them than
        VARIED_AFTER): pinning what moves with them would cost a capture each time."""
        return self.split_off or self.keys_met > _graphs.VARIED_AFTER

    def _settled(self, settle: tuple, vals: list) -> bool:
        """Count, for each staged input that may be read in place again (``_Graph.settle``),
        the replays in a row that found it at one pointer; whether one of them may now be
        (``_ready``)."""
        settled = False
        for j in settle:
            ptr = vals[j].ptr
            seen = self.settling.get(j)
            if seen is None or seen[0] != ptr:
                self.settling[j] = [ptr, 1]
                continue
            seen[1] += 1
            settled = settled or self._ready(j)
        return settled

    def _ready(self, j: int) -> bool:
        """Whether input ``j`` has been at one pointer for SETTLE_REPLAYS replays and has not
        been re-pinned MAX_REPINS times already."""
        seen = self.settling.get(j)
        return seen is not None and seen[1] >= _graphs.SETTLE_REPLAYS and \
            self.repins.get(j, 0) < _graphs.MAX_REPINS

    def _repin(self, key: tuple, g: _Graph, vals: list) -> None:
        """Drop ``g`` and capture this call reading its settled staged inputs in place (where
        they have been for SETTLE_REPLAYS replays): no copy before each replay from then on.
        If one moves again, ``_moved`` stages it again."""
        for j in g.settle:
            if self._ready(j):
                self.staged.discard(j)
                self.repins[j] = self.repins.get(j, 0) + 1
                del self.settling[j]
        self._drop(key, g)
        self._capture(key, vals)

    def _drop(self, key: tuple, g: _Graph) -> None:
        graphs = self.graphs.get(key)
        if graphs is not None and g in graphs:
            graphs.remove(g)
            self.n_graphs -= 1
            if not graphs:
                del self.graphs[key]

    def _plain_call(self, vals: list, key: tuple | None = None) -> None:
        # keys that come back (a bucket's) are served by a graph each: only a segment whose
        # keys keep coming new is watched (each of a bucket's nodes would seem to follow the
        # call over the first sights of its buckets, the only plain runs it makes)
        if self.watching and key is not None and self.keys_met > _graphs.VARIED_AFTER and \
                not self._few_keys():
            self._watched(key)
        else:
            self._plain()
        if self.copy_back:
            self._plain_copy_back(vals)

    def _watched(self, key: tuple) -> None:
        """A plain run of a varied segment, its nodes' shapes kept (graph_varying.py); once
        the watch names the nodes that follow the call, the runner plans again with them
        run plainly (Runner.split), from the next call on."""
        watch = self.watch
        if watch is None:
            vm = self.runner.vm
            watch = self.watch = ShapeWatch(
                self.items, vm.nodes, vm.storage_map, {id(t) for t in self.param_thunks},
                [node_launches(vm.nodes[i], t) for i, t, _ in self.items])
        self.plain_runs += 1
        watch.run(key, self._set_current)
        varying = watch.verdict()
        if varying is not None:
            self.watching, self.watch = False, None
            if varying:
                self.runner.split(varying)

    def _set_current(self, idx: int) -> None:
        self.current = idx

    def _plain(self, count: bool = True) -> None:
        if count:   # the reference run of a capture being verified is not counted
            self.plain_runs += 1
        for idx, thunk, dead in self.items:
            self.current = idx
            thunk()
            for c in dead:
                c[0] = None

    @staticmethod
    def _overwritable(vals: list, inputs: Sequence[int]) -> bool:
        """Whether a graph may overwrite the arrays ``vals[j]`` (the buffers of the shared
        variables an update is copied back into): pool memory never lent to the user (a
        GpuArray handed out by ``get_value(borrow=True)`` or taken by
        ``set_value(..., borrow=True)`` is marked lent: symgpu.gpu.runtime.pool.lend).  Which other
        values of the function may alias them is decided when the runner is built
        (graphs.Runner._segment), not here."""
        for j in inputs:
            v = vals[j]
            base = getattr(v, "base", None)
            if type(base) is not _Block or base.lent or v._gpudata is not None:
                return False
        return True

    # -- capture
    def _snapshot(self, vals: list) -> list | None:
        """Device copies of the GPU inputs (to run the segment twice from the same values),
        or None when they are too large to copy (the key is then never captured)."""
        total = 0
        for v, g in zip(vals, self.in_gpu):
            if g:
                total += v.nbytes
        if total > _graphs.verify_limit(self.ctx):
            return None
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
        ref = snap = spread = None
        if runner.verify and key not in self.checked:
            # run plainly first: the graph must give the same values (checked below)
            try:
                snap = self._snapshot(vals)
            except (MemoryError, *driver_errors()) as exc:   # no memory for the copies:
                # no graphs, no harm
                self.runner.disable(f"copying the inputs to check a graph failed "
                                    f"({type(exc).__name__}: {exc})", self)
                snap = None
            if snap is None:
                self.seen[key] = 0
                self._plain_call(vals)
                return
            self._plain(count=False)   # a thunk's error is the call's own: it propagates
            try:
                ref = self._host_values()
                if self.nondeterministic:   # a second plain run: how far they may differ
                    self._restore(vals, snap)
                    self._plain(count=False)
                    spread = self._host_values()
            except (MemoryError, *driver_errors()) as exc:   # the plain results stand
                if is_device_check_error(exc):
                    raise               # a bad index of the call itself
                self.runner.disable(f"reading results to check a graph failed "
                                    f"({type(exc).__name__}: {exc})", self)
                return
            self._restore(vals, snap)
        backs = [j for _, j in self.copy_back if self._overwritable(vals, (j,))]
        if self.param_thunks:
            try:
                if self.param_block is None:
                    self.param_block = pool.allocate(self.param_size)
                for t in self.param_thunks:    # load kernels now: no module loads under capture
                    prepare = getattr(t, "param_prepare", None)
                    if prepare is not None:
                        prepare()
            except (MemoryError, CompileError, *driver_errors()) as exc:
                self._give_up(exc, vals, snap)
                return
        if self.computed and (self.keys_met > 1 or self.split_off):
            # shapes that change: what the call computes before the segment by plain steps (a
            # padded input) takes a new place with them (another size class of the pool),
            # and pinned it would cost a capture per move; staged, a device copy per replay.
            # (One key: pinned until it moves.)
            self.staged |= self.computed - self.steady
        staged: list = []
        cap_vals = vals
        if self.staged:
            try:
                cap_vals = list(vals)
                for j in sorted(self.staged):
                    v = vals[j]
                    if _stageable(v):   # else read in place (pinned)
                        # the input's own layout, so offsets and strides read from it hold
                        extent = v.itemsize + sum((n - 1) * st for n, st in
                                                  zip(v.shape, v.strides))
                        buf = new_array(ctx, v.shape, v.dtype, v.strides, extent)
                        drv.copy(buf, v)
                        staged.append((j, buf))
                        cap_vals[j] = buf
                        self.in_cells[j][0] = buf
            except (MemoryError, *driver_errors()) as exc:
                self._give_up(exc, vals, snap)
                return
        for c in self.produced_cells:
            c[0] = None
        sink: list = []
        try:
            ctx.activate()
            # a fork still pending (a plain run's, joined in a later step) is joined before
            # the capture: a capture never waits on an event recorded outside it
            join_pending(ctx)
            pool.begin_sink(sink, drv.relaxed)
            began = False
            try:
                drv.begin(stream)
                began = True
            finally:
                if not began:
                    pool.end_sink()
        except driver_errors() as exc:
            self._give_up(exc, vals, snap)
            return
        err: BaseException | None = None
        copied: list[int] = []
        direct: list[int] = []
        try:
            for t, off in zip(self.param_thunks, self.param_offsets):
                t.param_slot = (self.param_block, off)
            direct = self._capture_items(vals, backs)
            scratch = {id(b) for b in sink}
            scratch.update(id(cap_vals[k]) for k in self.dying_inputs)
            guarded = self._guarded()   # one check and one copy launch for them all
            for cell, j in self.copy_back:
                if j in backs and self._copy_back(cell, vals[j], scratch, guarded):
                    copied.append(j)
            if guarded is not None:
                guarded.launch()
        # broad on purpose: the stream capture must end whatever a thunk raised.  Nothing is
        # swallowed: below, a BaseException that is not an Exception is raised again, and an
        # Exception either re-runs the segment plainly (_retry_after_thunk_error: the node
        # raises its own error there) or is reported by _give_up (GraphCaptureWarning)
        except BaseException as exc:  # noqa: B902
            err = exc
        finally:
            for t in self.param_thunks:
                t.param_slot = None
            try:
                try:   # every fork of the capture joins the capturing stream (CUDA requires it)
                    join_pending(ctx)
                except driver_errors() as exc:   # the capture must end all the same
                    err = err or exc
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
        except driver_errors() as exc:
            drv.destroy(None, graph)
            self._give_up(exc, vals, snap)
            return
        # an output that is a staged input or a view of one is rebuilt over the caller's
        # array when nothing writes into either (the static buffer has the input's layout);
        # over the static buffer when a node of the segment writes into it
        owned = tuple(b for b in sink if b is not None)
        del sink
        written = tuple(b.base for j, b in staged if j in self.written)
        outs = output_specs(self, cap_vals, owned + written,
                                  {j for j, _ in staged if j in self.written})
        owned += tuple(b.base for j, b in staged if j not in self.written) + written
        for j, _ in staged:
            self.in_cells[j][0] = vals[j]
        if outs is None:
            drv.destroy(exe, graph)
            del owned
            self._give_up(None, vals, snap, why="an output the graph cannot rebuild")
            return
        launch = drv.launcher(exe, stream)
        self._upload_params()
        status = launch()
        if status:
            drv.check(status, "cuGraphLaunch (first replay)")
        g = _Graph(drv, exe, graph, owned, outs, launch, ctx)
        g.backs = tuple(direct + copied)
        g.direct = tuple(direct)
        g.staged = tuple(staged)
        # (never once the keys vary, nor what the call computes before the segment: that
        # moves with the call's shapes and with other functions' calls between this one's
        # (the pool's blocks change hands), and each re-pin costs a capture)
        g.settle = () if self._past_varied() else \
            tuple(j for j, _ in staged if j not in self.per_call and j not in self.written
                  and j not in self.computed)
        g.quick = g.fresh is not None and not (staged or self.param_thunks or self.dead)
        in_static = {j for j, _ in staged}
        g.pinned = tuple((j, v.ptr) for j, (v, gpu) in enumerate(zip(vals, self.in_gpu))
                         if gpu and j not in in_static and v.size)
        hand_out(g, vals)   # the capture run's own arrays are not handed out
        if ref is not None:
            try:
                why = results_differ(ref, self._host_values(), spread)
            except (MemoryError, *driver_errors()) as exc:
                if is_device_check_error(exc):
                    raise
                why = f"reading them failed: {type(exc).__name__}: {exc}"
            if why is not None:
                del g, owned
                self._give_up(None, vals, snap, why=f"the graph's results differ from plain "
                                                   f"launches ({why})")
                return
            self.verified += 1
            if len(self.checked) >= _graphs.MAX_SEEN:
                self.checked.clear()
            self.checked.add(key)
        try:
            self.nodes_captured = drv.node_count(graph)
        except driver_errors():
            pass   # a statistic only
        self.graphs.setdefault(key, []).append(g)
        self.n_graphs += 1
        self.captures += 1
        _graphs.STATS["captures"] += 1
        for c in self.internal_cells:
            c[0] = None
        for c in self.dead:
            c[0] = None

    def _capture_items(self, vals: list, backs: list[int]) -> list[int]:
        """Run the thunks under capture (cells die at the end: a failed capture runs again
        plainly from the same inputs).  A node with direct updates (``self.direct``) is told
        to compute each into its variable's buffer (its thunk's ``write_into``) when that
        is safe on this call's values (:meth:`_direct_target`); returns the inputs so
        written, whose cells then hold the variable's array, as after :meth:`_copy_back`."""
        written: list[int] = []
        direct = self.direct if DIRECT_UPDATES else {}
        for pos, (idx, thunk, _dead) in enumerate(self.items):
            self.current = idx
            wants = direct.get(pos)
            if not wants:
                thunk()
                continue
            into = thunk.write_into
            aimed = []
            for k, node_in, j in wants:
                target = self._direct_target(vals, j, node_in, backs,
                                             getattr(thunk, "aligned_read", None))
                if target is not None and into[k] is None:
                    into[k] = target
                    aimed.append((k, j))
            try:
                thunk()
            finally:
                for k, _ in aimed:
                    into[k] = None
            for _, j in aimed:   # the thunk may decline (a layout its plan cannot write)
                if self._back_cell[j][0] is vals[j]:
                    written.append(j)
        return written

    @staticmethod
    def _direct_target(vals: list, j: int, node_in: list, backs: list[int],
                       aligned_read: Callable[[Any, Any], bool] | None = None) -> Any:
        """The array an update of input ``j`` may be computed into, or None: the input is
        overwritable (``backs``), not empty, C-contiguous, and every input of the node that
        shares its memory reads it with its own layout (an elementwise kernel reading and
        writing the same element is safe; a transposed, shifted or broadcast read is not),
        or in a way the thunk's ``aligned_read(a, t)`` vouches for (a reduction reading
        the target broadcast along its reduced axes: GpuCAReduce)."""
        if j not in backs:
            return None
        t = vals[j]
        if not isinstance(t, _GpuArray) or not t.size or not t.is_c_contiguous:
            return None
        lo, hi = byte_extent(t)
        for c in node_in:
            a = c[0]
            if not isinstance(a, _GpuArray) or not a.size:
                continue
            a_lo, a_hi = byte_extent(a)
            if a_lo < hi and lo < a_hi and (a.ptr != t.ptr or a.shape != t.shape or
                                            a.strides != t.strides or a.dtype != t.dtype) \
                    and not (aligned_read is not None and aligned_read(a, t)):
                return None
        return t

    def _copy_back(self, cell: list, target: Any, scratch: set,
                   guarded: GuardedCopies | None) -> bool:
        """Under capture: copy an update's new value into the buffer of the variable it
        updates, and hand that variable's array on as the new value.  The new value must be
        scratch: a buffer of the graph, or a segment input that dies in the segment."""
        new = cell[0]
        if not isinstance(new, _GpuArray) or new is target or not _same_layout(new, target):
            return False
        if id(new) not in scratch and (new.base is None or id(new.base) not in scratch):
            return False
        if not self._copy(target, new, guarded):
            return False
        cell[0] = target
        return True

    def _guarded(self) -> GuardedCopies | None:
        """Where this call's copies back go when the function has ops whose checks are read
        at the next sync (a copy must not land in a call that is about to fail) and its
        graph does not guard its updates itself (Runner.updates_guarded), else None."""
        runner = self.runner
        return GuardedCopies(self.ctx) if getattr(runner, "device_checked", False) and \
            not getattr(runner, "updates_guarded", False) else None

    def _copy(self, dst: Any, src: Any, guarded: GuardedCopies | None) -> bool:
        """dst[...] = src on the stream, or added to `guarded` (queued by its launch)."""
        if guarded is not None:
            return guarded.add(dst, src)
        self.runner.driver.copy(dst, src)
        return True

    def _plain_copy_back(self, vals: list) -> None:
        """After a plain run: copy each update's new value into the updated variable's
        buffer when nobody else holds either, so shared variables keep their pointers (and
        the keys of later calls repeat) from the first call on."""
        guarded = self._guarded()
        done = []
        for cell, j in self.copy_back:
            new = cell[0]
            if not isinstance(new, _GpuArray) or new is vals[j] or \
                    not _same_layout(new, vals[j]) or not self._overwritable(vals, (j,)):
                continue
            if self._copy(vals[j], new, guarded):
                done.append((cell, j))
        if guarded is not None:
            guarded.launch()
        for cell, j in done:
            cell[0] = vals[j]

    def _retry_after_thunk_error(self, err: Exception, vals: list) -> None:
        """A thunk raised under capture: run plainly.  If the plain run raises too, the error
        is the call's own (bad shapes...) and propagates with graphs left on; otherwise the
        capture was at fault and graphs are turned off for the function."""
        for c in self.produced_cells:
            c[0] = None
        for c, v in zip(self.in_cells, vals):
            c[0] = v
        self._plain()
        _graphs.STATS["capture_failures"] += 1
        self.runner.disable(f"{type(err).__name__}: {err}", self)

    def _give_up(self, exc: BaseException | None, vals: list, snap: list | None = None,
                 why: str | None = None) -> None:
        """A capture failed: warn once, turn graphs off for the function, and compute the
        call plainly (from the snapshot of the inputs when one was taken: a graph that ran may
        have written into them)."""
        _graphs.STATS["capture_failures"] += 1
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


#: graphs.py, whose settings (MAX_GRAPHS, MAX_SEEN, SETTLE_REPLAYS, MAX_REPINS, VERIFY_LIMIT,
#: STATS) are read as ``_graphs.NAME`` when used, so setting or patching them there takes
#: effect; graphs.py imports this module and fills this in as it loads (a Segment is only
#: ever made by graphs.Runner, after that)
_graphs: Any = None


def read_settings_from(module: Any) -> None:
    """Read the settings from ``module`` (graphs.py calls it with itself on import)."""
    global _graphs
    _graphs = module

_gpuarray_new = _GpuArray.__new__


def _stageable(v: Any) -> bool:
    """Whether a GPU value can be copied into a static buffer of its own layout: not empty
    (an empty input is never read) and no negative stride."""
    return bool(v.size) and min(v.strides, default=0) >= 0


def _same_layout(a: Any, b: Any) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.size > 0 and \
        a.is_c_contiguous and b.is_c_contiguous
