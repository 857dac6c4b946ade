"""One segment of a whole-function CUDA graph (the design is in symgpu/gpu/graphs.py's
docstring): per call, plain launches, a capture or a replay, and all a capture needs.

Holds :class:`Segment` (key its inputs, capture on a repeated key, replay while no one else
holds the graph's blocks, check each new graph against plain launches, copy updates back into
the buffers of the variables they update, fall back to plain launches on anything unexpected),
``_Graph`` (one instantiated graph: the pool blocks it owns and how its outputs are rebuilt on
replay) and the graveyard (graphs collected while a capture runs are destroyed once it has
ended, since no stream sync may run during a capture).

Why apart from graphs.py: this is the machinery behind one segment, whose reference-count,
ownership and error-path rules must be read together; graphs.py keeps the entry points (the
VM hook, ``Runner`` and its other steps, the driver) and the settings.  The settings
(``MAX_GRAPHS``, ``MAX_SEEN``, ``VERIFY_LIMIT``, ``STATS``) stay in graphs.py and are read here
through that module at call time, so setting or patching ``symgpu.gpu.graphs.VERIFY_LIMIT``
(as tests do) keeps taking effect.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from symgpu.gpu.graph_plan import make_keyer
from symgpu.gpu.device_checks import guarded_copy, is_device_check_error

if TYPE_CHECKING:
    from symgpu.gpu.graphs import Runner

__all__ = ["Segment"]

_getrefcount = sys.getrefcount


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
                    if self.n_graphs < _graphs.MAX_GRAPHS:
                        self._capture(key, vals)
                        return
                elif ok is None:
                    if len(self.seen) >= _graphs.MAX_SEEN:
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
        if total > _graphs.VERIFY_LIMIT:
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
                if is_device_check_error(exc):
                    raise               # a bad index of the call itself
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
                if is_device_check_error(exc):
                    raise
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
        _graphs.STATS["captures"] += 1
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
        if not self._copy(target, new):
            return False
        cell[0] = target
        return True

    def _copy(self, dst: Any, src: Any) -> bool:
        """dst[...] = src on the stream; guarded when the function has ops whose checks are
        read at the next sync (the copy must not land in a call that is about to fail)."""
        if getattr(self.runner, "device_checked", False):
            return guarded_copy(self.ctx, dst, src)
        self.runner.driver.copy(dst, src)
        return True

    def _plain_copy_back(self, vals: list) -> None:
        """After a plain run: copy each update's new value into the updated variable's
        buffer when nobody else holds either, so shared variables keep their pointers (and
        the keys of later calls repeat) from the first call on."""
        for cell, j in self.copy_back:
            new = cell[0]
            if not isinstance(new, _GpuArray) or new is vals[j] or \
                    not _same_layout(new, vals[j]) or \
                    not _sole(new, sum(1 for v in vals if v is new)) or \
                    not self._exclusive(vals, (j,)):
                continue
            if self._copy(vals[j], new):
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


from symgpu.gpu.array import GpuArray as _GpuArray  # noqa: E402  (no PyCUDA import)
from symgpu.gpu.pool import Block as _Block  # noqa: E402
# the settings, read at call time as ``_graphs.NAME``: imported last, since graphs.py imports
# Segment from here (either module may then be imported first)
from symgpu.gpu import graphs as _graphs  # noqa: E402

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
