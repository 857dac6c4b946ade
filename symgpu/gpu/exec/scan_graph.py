"""A GPU loop of known length as one CUDA graph: capture the whole loop once, replay it.

Why this shape (see docs/loops.md, "On the GPU"): a loop step is a handful of small kernels
(the RNN step: a GEMM, a bias+tanh, the copy into the state buffer), ~5 us of Python and
driver work each when launched one by one, which is far more than the GPU time.  Capturing
one step and replaying it per step still costs a launch and a Python round trip per step, and
changing the per-step pointers (cuGraphExecKernelNodeSetParams) costs a driver call per
kernel node per step.  Capturing the *unrolled* loop (all n steps, the state copies and the
per-step views included) costs one capture of n steps the second time a layout is seen, then a
single ``cuGraphLaunch`` per call: the loop's per-step host overhead is gone entirely.

Layout and memory.  A graph replays on fixed pointers, so the loop runs on *staging* copies of
its inputs that the graph owns: each call copies its GPU inputs into them (device-to-device,
on the stream), launches, and copies the results (state buffers, per-step outputs) out into
arrays of their own, so no caller ever holds the graph's memory.  Those output arrays come
from a few blocks per result that the graph recycles (so the pointers the caller's own
graphs are keyed on repeat from call to call): each array handed out has a lease for its
``base`` (graph_instance's ``Lease``; views share it), the graph keeps only a weak reference
to it, and a block is reused only once its lease is dead, i.e. once the caller dropped every
array over it.  Liveness decides, never a count of references.  A graph is keyed on the inputs'
shapes and dtypes, n_steps and the values of the host inputs (small integer non-sequences).
Every pool block taken while capturing belongs to the graph (the pool's capture sink); steps
do not share scratch inside one graph, so a graph holds O(n_steps) of per-step intermediates:
graphs over ``MEMORY_LIMIT`` bytes are launched once and dropped.

When.  The first call with a new key runs the loop plainly (it compiles kernels and warms the
pool); the second captures and replays from then on; a loop's first graph is checked once
against a plain run of the same inputs (``VERIFY``; its graphs of other lengths unroll the
same body).  A loop whose length changes from call to call runs as power-of-two chunks
(``CHUNKS``), each a graph of its own length, so a new length costs no capture.  While loops, loops whose body has a node that cannot
be captured (a host transfer, a CPU op), virtual contexts and ``gpuarray.cuda_graphs=False``
always run plainly.  A capture the driver refuses warns once and turns graphs off for that op.
"""
from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections import Counter, OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.config import config
from symgpu.gpu.exec import graphs
from symgpu.gpu.exec.graph_instance import Lease, results_differ
from symgpu.gpu.exec.graph_plan import node_capturable
from symgpu.gpu.ops import scan_op
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen.layout import c_contiguous
from symgpu.gpu.runtime.graph_params import TABLE_ENTRY_BYTES, pack_table
from symgpu.gpu.runtime.libcuda import driver_errors

__all__ = ["LoopGraphs", "ENABLED", "VERIFY", "MEMORY_LIMIT", "MAX_GRAPHS", "SPARE_OUTPUTS", "STATS",
           "LoopGraphWarning", "body_capturable", "LOOP_CAPTURABLE", "CHUNKS", "chunk_lengths",
           "CHUNK_AFTER", "TABLE_COPIES", "WARM_CHUNKS"]

#: capture loops of known length (tests and benchmarks switch it off to compare)
ENABLED = True
#: check a loop's first graph once against a plain run of the same inputs (its graphs of
#: other lengths unroll the same body and are not checked again)
VERIFY = True
#: a graph owning more pool bytes than this is launched once and not kept
MEMORY_LIMIT = 2 << 30
#: graphs kept per op (one per input layout), least recently used dropped first
MAX_GRAPHS = 4
#: output arrays kept per result of a graph, reused once the caller dropped them
SPARE_OUTPUTS = 3
#: process-wide counters: 'captures', 'replays', 'plain', 'capture_failures', 'too_big',
#: 'chunks', 'checks', 'warm captures'
STATS: Counter = Counter()
#: a loop that has met more lengths than this runs every call as chunks (CHUNKS): before,
#: each new length cost a plain step-by-step run and each length met twice the capture of a
#: whole-loop graph that a loop meeting many lengths seldom replays
CHUNK_AFTER = 3
#: the loop lengths a loop whose length changes from call to call is cut into (largest first;
#: the 1 makes every length reachable); () turns chunking off
CHUNKS: tuple[int, ...] = (64, 32, 16, 8, 4, 2, 1)
#: the first call that runs as chunks also captures the chunk lengths up to the longest
#: length met so far (a loop whose length varies will meet them: one warm-up call)
WARM_CHUNKS = True
#: a chunk graph copies its inputs into its staging buffers and its results into the call's
#: arrays itself, from a table of pointers uploaded before each launch (graph_params'
#: table_copy): one upload and one launch per chunk instead of a copy per input and result
#: (~10 us of Python each: most of a variable-length call's host time, issue 32)
TABLE_COPIES = True


def chunk_lengths(n: int) -> list[int]:
    """n as a sum of CHUNKS, greedily from the largest: 50 -> [32, 16, 2]."""
    out = []
    for c in CHUNKS:
        while n >= c:
            out.append(c)
            n -= c
    return out

class LoopGraphWarning(RuntimeWarning):
    """A GPU loop could not be captured into a CUDA graph; it runs step by step."""


#: op classes a loop body may capture beyond those whose thunks say ``capturable``:
#: GpuSubtensor is a view (host bookkeeping) or, for a negative step, a pool allocation and a
#: copy on the stream; its index errors depend only on shapes and host indices, which are
#: part of a loop graph's key, so the plain first run reports them
LOOP_CAPTURABLE: tuple[type, ...] = (GpuSubtensor,)


def body_capturable(vm: Any) -> bool:
    """Whether every node of a compiled loop body may run inside a stream capture."""
    loop_capturable = LOOP_CAPTURABLE

    def ok(node: Any, thunk: Any) -> bool:
        if node_capturable(node, thunk):
            return True
        return type(node.op) in loop_capturable and all(
            v.type.ndim == 0 for v in node.inputs[1:])
    return bool(vm.nodes) and all(ok(n, t) for n, t in zip(vm.nodes, vm.thunks))


class _LoopGraph:
    """One instantiated loop: its staging inputs, its results and every block it owns."""

    def __init__(self, drv: Any, exe: Any, graph: Any, owned: tuple, staging: list,
                 results: list, ctx: Any) -> None:
        self.drv, self.exe, self.graph, self.owned = drv, exe, graph, owned
        self.staging, self.results, self.ctx = staging, results, ctx
        self.launch = drv.launcher(exe, ctx.stream_handle)
        self.nbytes = sum(getattr(b, "size", 0) for b in owned)
        #: per result: [block, weak reference to the lease of the array last made over it]
        self.spare: list[list[list]] = [[] for _ in results]
        self.checked = False   # run once against plain launches (VERIFY)
        #: (input index, pointer) of the inputs the graph reads where they were when captured
        #: (a chunk's non-sequences: no staging copy); it serves a call only while each is
        #: still there
        self.pinned: tuple = ()
        #: a chunk graph's copy table (TABLE_COPIES): a device block of table_copy entries,
        #: the staging copies first (``table_in``: (input index, staging buffer)) then the
        #: results' copies out (``table_out``: (result index, first row)); None: no table
        self.table: Any = None
        self.table_in: list[tuple[int, Any]] = []
        self.table_out: list[tuple[int, int]] = []

    def launch_table(self, inputs: Sequence[Any], dsts: Sequence[Any]) -> None:
        """One chunk as one upload and one launch: the table names where this call's inputs
        are (copied into the staging buffers inside the graph) and where the results go
        (``dsts[m]`` receives ``table_out[m]``'s rows).  An input or destination a byte
        copy cannot serve (not C-contiguous) is copied explicitly instead (its entry is
        empty)."""
        vals: list[int] = []
        late: list[tuple[Any, Any]] = []
        drv = self.drv
        for i, buf in self.table_in:
            v = inputs[i]
            if c_contiguous(v.shape, v.strides, v.dtype.itemsize):
                vals += (buf.ptr, v.ptr, buf.nbytes)
            else:
                drv.copy(buf, v)
                vals += (0, 0, 0)
        results = self.results
        for (r, row), d in zip(self.table_out, dsts):
            src = results[r]
            if row:
                src = src._view(src.ptr + row * src.strides[0], (src.shape[0] - row,)
                                + src.shape[1:], src.strides)
            if c_contiguous(d.shape, d.strides, d.dtype.itemsize) and \
                    c_contiguous(src.shape, src.strides, src.dtype.itemsize):
                vals += (d.ptr, src.ptr, d.nbytes)
            else:
                late.append((d, src))
                vals += (0, 0, 0)
        drv.upload(self.table.ptr, pack_table(vals), self.ctx.stream_handle)
        self.replay()
        for d, src in late:
            drv.copy(d, src)

    def run(self, inputs: Sequence[Any], output_storage: list[list]) -> None:
        self.stage(inputs)
        self.replay()
        self.emit(output_storage)

    def stage(self, inputs: Sequence[Any]) -> None:
        """Copy the call's GPU inputs into the graph's staging buffers."""
        drv = self.drv
        for dst, src in zip(self.staging, inputs):
            if dst is not None:
                drv.copy(dst, src)

    def replay(self) -> None:
        status = self.launch()
        if status:
            self.drv.check(status, "cuGraphLaunch (a captured loop)")

    def emit(self, output_storage: list[list]) -> None:
        """Copy the results out of the graph's memory into arrays the caller may keep."""
        drv = self.drv
        for k, (cell, r) in enumerate(zip(output_storage, self.results)):
            out = self._output(k, r)
            drv.copy(out, r)
            cell[0] = out

    def _output(self, k: int, r: Any) -> Any:
        """A fresh array for result k: over one of this graph's few output blocks whose last
        array nobody holds any more (its lease is dead), else over a new pool block, which
        becomes one of those few while there are fewer than ``SPARE_OUTPUTS``."""
        spare = self.spare[k]
        for entry in spare:
            if entry[1]() is None:
                block = entry[0]
                lease = Lease((block,))
                entry[1] = weakref.ref(lease)
                return GpuArray._from_pointer(self.ctx, block.ptr, r.shape, r.dtype, None, lease)
        out = GpuArray(r.shape, r.dtype, self.ctx)
        block = out.base
        if block is None or len(spare) >= SPARE_OUTPUTS:
            return out
        lease = Lease((block,))
        spare.append([block, weakref.ref(lease)])
        return GpuArray._from_pointer(self.ctx, block.ptr, r.shape, r.dtype, None, lease)

    def free(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        if self.exe is None:
            self.spare = [[] for _ in self.results]
            return
        # no synchronisation (as graph_instance._bury): a graph still running is freed when it
        # completes, its blocks' reuse is ordered on the same stream, and a synchronize here
        # would consume a failing call's pending device check
        if not _finalizing():   # at interpreter exit the driver may be gone
            self.drv.destroy(self.exe, self.graph)
        self.exe = self.graph = None
        self.owned = ()
        # the blocks stay alive through the leases of arrays still held, and return to the
        # pool when those are dropped
        self.spare = [[] for _ in self.results]

    def __del__(self) -> None:
        self.free()


class LoopGraphs:
    """The captured loops of one GpuScan op, keyed on their inputs' layout."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.seen: set = set()
        self.graphs: OrderedDict = OrderedDict()   # key -> _LoopGraph, or None: plain
        self.disabled: str | None = None
        self.capturable: bool | None = None
        self.lengths: set[int] = set()   # the n_steps met, until chunking starts
        self.verified = False             # a captured graph of this body matched plain runs
        self.chunking = False
        #: chunk graphs read the loop's non-sequences (weights) in place, not from staging
        #: copies made per chunk, until one is found moved (then they are staged for good)
        self.pin_rest = True
        #: the first chunked call also captures every chunk length up to the longest length
        #: met (WARM_CHUNKS): one warm-up call, not a capture in each of the next few
        self.warm_pending = False
        self.lock = threading.RLock()

    # -- deciding
    def _usable(self, ctx: Any) -> bool:
        if not ENABLED or self.disabled is not None or not config.gpuarray.cuda_graphs:
            return False
        if ctx.virtual or not ctx.stream_handle:
            return False
        vm = self.op.inner.vm
        if vm is None or vm.profiler is not None:
            return False
        if self.capturable is None:
            self.capturable = body_capturable(vm)
        return self.capturable

    @staticmethod
    def key(inputs: Sequence[Any]) -> tuple | None:
        """(n_steps, per input: shape and dtype of a GpuArray, the value of a small host
        value); None when some input cannot be keyed."""
        parts: list = [int(inputs[0])]
        for v in inputs[1:]:
            if isinstance(v, GpuArray):
                parts.append(("g", v.shape, v.dtype.str))
                continue
            a = np.asarray(v)
            if a.size > 64 or a.dtype == object:
                return None
            parts.append(("h", a.shape, a.dtype.str, a.tobytes()))
        return tuple(parts)

    # -- calling
    def call(self, node: Any, inputs: Sequence[Any], output_storage: list[list]) -> bool:
        """Run the loop as a graph (True) or leave it to the plain loop (False)."""
        ctx = self.op._context()
        n = int(inputs[0])
        if n <= 0 or not self._usable(ctx):
            return False
        key = self.key(inputs)
        if key is None:
            return False
        with self.lock:
            if self._chunked(n):
                self._call_chunked(node, inputs, output_storage, n)
                return True
            return self._call_whole(node, key, inputs, output_storage, ctx)

    def _call_whole(self, node: Any, key: tuple, inputs: Sequence[Any],
                    output_storage: list[list], ctx: Any) -> bool:
        """The loop as one graph of its n steps (True), or the plain loop's turn (False)."""
        if key in self.graphs:
            g = self.graphs[key]
            if g is None:
                STATS["plain"] += 1
                return False
            self.graphs.move_to_end(key)
            g.run(inputs, output_storage)
            STATS["replays"] += 1
            return True
        if key not in self.seen:
            if len(self.seen) > 64:
                self.seen.clear()
            self.seen.add(key)
            STATS["plain"] += 1
            return False
        g = self._capture(node, inputs, ctx)
        if g is None:
            self._keep(key, None)
            return False
        if g.checked:   # the check ran the graph on this call's inputs already
            g.emit(output_storage)
        else:
            g.run(inputs, output_storage)
        if g.nbytes > MEMORY_LIMIT:
            STATS["too_big"] += 1
            g.free()
            self._keep(key, None)
        else:
            self._keep(key, g)
        return True

    # -- lengths that change from call to call
    def _chunked(self, n: int) -> bool:
        """Whether this call runs as chunks: once the loop has met more than CHUNK_AFTER
        lengths (variable-length minibatches), every call does, so each new length costs
        no capture; a loop of one length keeps its single whole-loop graph."""
        if not CHUNKS or self.op.info.truncate_gradient >= 0:
            return False
        if self.chunking:
            return True
        self.lengths.add(n)
        self.chunking = self.warm_pending = len(self.lengths) > CHUNK_AFTER
        return self.chunking

    def _call_chunked(self, node: Any, inputs: Sequence[Any], output_storage: list[list],
                      n: int) -> None:
        """Run the n steps as a few loops of power-of-two lengths (50 = 32 + 16 + 2), each a
        graph captured once and replayed for any n: chunk c reads the sequences' rows
        [off, off + k) and starts from the states chunk c - 1 ended with; its per-step
        outputs and state histories are copied into the call's own result arrays.  With a
        copy table (TABLE_COPIES) those copies run inside the chunk's graph, from the
        pointers one upload names: a chunk costs an upload and a launch."""
        info = self.op.info
        ctx = self.op._context()
        S, M, K = info.n_seqs, info.n_states, info.n_nitsot
        seqs = list(inputs[1:1 + S])
        inits = list(inputs[1 + S:1 + S + M])
        rest = list(inputs[1 + S + M:])
        n_init = [info.n_init(j) for j in range(M)]
        if any(s.shape[0] < n for s in seqs) or not all(
                isinstance(v, GpuArray) for v in seqs + inits):
            return self._run_plain(node, inputs, output_storage)   # raises, in context
        rest_key = self.key([0] + rest)
        kept: list[Any] = []
        for j in range(M):
            if info.keep[j]:
                buf = GpuArray((n_init[j] + n,) + tuple(inits[j].shape[1:]),
                               node.outputs[j].dtype, ctx)
                _driver_copy(buf[:n_init[j]], inits[j][:n_init[j]])
                kept.append(buf)
            else:
                kept.append(None)
        nitsot: list[Any] = [None] * K
        state = list(inits)
        in_graph = [False] * M     # a last-values state read from a graph's own memory
        off = 0
        for k in chunk_lengths(n):
            sub = [k] + [_rows(s, off, k) for s in seqs] + state + rest
            g = None
            if rest_key is not None:
                key = (k,) + tuple(("g", v.shape, v.dtype.str) for v in sub[1:1 + S + M]) \
                    + rest_key[1:]
                g = self._chunk_graph(node, key, sub, ctx)
            if g is None:
                cells = [[None] for _ in node.outputs]
                self._run_plain(node, sub, cells)
                res = [c[0] for c in cells]
                graph_memory = False
                for j in range(M):
                    if info.keep[j]:
                        _driver_copy(_rows(kept[j], n_init[j] + off, k), res[j][n_init[j]:])
                for i in range(K):
                    r = res[M + i]
                    if nitsot[i] is None:
                        nitsot[i] = GpuArray((n,) + tuple(r.shape[1:]), r.dtype, ctx)
                    _driver_copy(_rows(nitsot[i], off, k), r)
            else:
                res = g.results
                graph_memory = True
                for i in range(K):
                    if nitsot[i] is None:
                        r = res[M + i]
                        nitsot[i] = GpuArray((n,) + tuple(r.shape[1:]), r.dtype, ctx)
                dsts = [_rows(kept[j], n_init[j] + off, k) for j in range(M) if info.keep[j]] \
                    + [_rows(nitsot[i], off, k) for i in range(K)]
                if g.table is not None:
                    g.launch_table(sub, dsts)
                else:
                    g.stage(sub)
                    g.replay()
                    srcs = [res[j][n_init[j]:] for j in range(M) if info.keep[j]] + res[M:]
                    for d, r in zip(dsts, srcs):
                        _driver_copy(d, r)
                STATS["replays"] += 1
            for j in range(M):
                in_graph[j] = graph_memory and not info.keep[j]
                if info.keep[j]:
                    state[j] = _rows(kept[j], off + k, n_init[j])
                else:
                    state[j] = res[j]
            off += k
            STATS["chunks"] += 1
        for j in range(M):
            out = kept[j] if info.keep[j] else state[j]
            if in_graph[j]:    # the last chunk's graph memory: the caller gets its own copy
                out = GpuArray(state[j].shape, state[j].dtype, ctx)
                _driver_copy(out, state[j])
            output_storage[j][0] = out
        for i in range(K):
            output_storage[M + i][0] = nitsot[i]
        if self.warm_pending:
            self.warm_pending = False
            if WARM_CHUNKS and rest_key is not None:
                self._warm_chunks(node, seqs, inits, rest, n_init, ctx)

    def _warm_chunks(self, node: Any, seqs: list, inits: list, rest: list,
                     n_init: list[int], ctx: Any) -> None:
        """Capture the graph of every chunk length up to the longest length the loop has met
        that has none yet, on inputs of those shapes (sequences as fresh buffers: a capture
        runs nothing, each launch copies the call's own rows in).  Only once the loop body's
        graph has been checked against plain launches (a check would run on those buffers)."""
        if not self.verified:
            return
        longest = max(self.lengths)
        states = [_rows(v, 0, n_init[j]) for j, v in enumerate(inits)]
        for c in CHUNKS:
            if c > longest:
                continue
            sub = [c] + [GpuArray((c,) + tuple(s.shape[1:]), s.dtype, ctx) for s in seqs] \
                + states + rest
            key = self.key(sub)
            if key is not None and key not in self.graphs:
                self._chunk_graph(node, key, sub, ctx)
                STATS["warm captures"] += 1

    def _chunk_graph(self, node: Any, key: tuple, sub: list, ctx: Any) -> _LoopGraph | None:
        """The graph of one chunk (found, or captured now: no plain first run, a chunk length
        comes back whatever the lengths and the body's kernels were compiled by the loop's
        first calls), not yet launched; None: run the chunk plainly.  The caller launches it
        and copies its results (graph memory, read before its next launch, which comes
        after every copy out of them is queued) into the call's arrays."""
        if key in self.graphs:
            g = self.graphs[key]
            if g is None:
                STATS["plain"] += 1
                return None
            for i, ptr in g.pinned:
                if sub[i].ptr != ptr:   # a non-sequence moved: stage them from now on
                    del self.graphs[key]
                    g.free()
                    self.pin_rest = False
                    STATS["plain"] += 1
                    return None
            self.graphs.move_to_end(key)
            return g
        info = self.op.info
        first = 1 + info.n_seqs + info.n_states
        # with a copy table the non-sequences are copied in by the graph itself (device
        # time only): no pins, so a non-sequence that moves from call to call (a value the
        # function computes before the loop) costs no dropped graph and no recapture
        tables = TABLE_COPIES and hasattr(graphs.driver(), "copy_table")
        pinned = [i for i in range(first, len(sub)) if isinstance(sub[i], GpuArray)
                  and sub[i].size] if self.pin_rest and not tables else []
        outs = [(j, info.n_init(j)) for j in range(info.n_states) if info.keep[j]] + \
            [(info.n_states + i, 0) for i in range(info.n_nitsot)]
        g = self._capture(node, sub, ctx, pinned, outs)
        if g is None:
            self._keep(key, None)
            return None
        if g.nbytes > MEMORY_LIMIT:   # not kept: this chunk runs plainly
            STATS["too_big"] += 1
            g.free()
            self._keep(key, None)
            return None
        self._keep(key, g)
        return g

    def _keep(self, key: tuple, g: Any) -> None:
        self.graphs[key] = g
        limit = MAX_GRAPHS + len(CHUNKS) if self.chunking else MAX_GRAPHS
        while len(self.graphs) > limit:
            _, old = self.graphs.popitem(last=False)
            if old is not None:
                old.free()

    def _staging(self, inputs: Sequence[Any], ctx: Any, pinned: Sequence[int] = ()) -> list:
        return [GpuArray(v.shape, v.dtype, ctx) if isinstance(v, GpuArray) and i not in pinned
                else None for i, v in enumerate(inputs)]

    def _capture(self, node: Any, inputs: Sequence[Any], ctx: Any,
                 pinned: Sequence[int] = (),
                 outs: Sequence[tuple[int, int]] | None = None) -> _LoopGraph | None:
        """Capture the loop on staging copies of its GPU inputs, but the ``pinned`` ones,
        read where they are (``_LoopGraph.pinned``); None when it cannot be.  ``outs`` (a
        chunk's results copied out: (result index, first row)) asks for a copy table
        (TABLE_COPIES, where the driver has ``copy_table``): the graph begins with the
        staging copies and ends with those copies out, both read from its table."""
        drv = graphs.driver()
        table = outs is not None and TABLE_COPIES and hasattr(drv, "copy_table")
        if table:
            drv.prepare_table(ctx)
        # a block the function runner hinted for this node's output must not go to the graph
        # unowned (a hinted allocation bypasses the capture sink)
        ctx.pool.hint = None
        staging = self._staging(inputs, ctx, pinned)
        for dst, src in zip(staging, inputs):
            if dst is not None:
                drv.copy(dst, src)
        args = [s if s is not None else v for s, v in zip(staging, inputs)]
        table_in = [(i, b) for i, b in enumerate(staging) if b is not None] if table else []
        tbl = None
        if table:
            entries = len(table_in) + len(outs)
            tbl = GpuArray((max(1, entries) * TABLE_ENTRY_BYTES,), "uint8", ctx)
            # an empty table (every length 0) while the check replays the graph below
            drv.upload(tbl.ptr, bytes(tbl.nbytes), ctx.stream_handle)
        ref = None
        # one check per loop body: a graph of another length (a chunk, a new layout) unrolls
        # the same checked body, and each check costs a plain run and a synchronisation,
        # which a loop meeting many lengths would otherwise pay per length
        if VERIFY and not self.verified:
            plain = [[None] for _ in node.outputs]
            self._run_plain(node, args, plain)
            ref = drv.to_host([c[0] for c in plain])
            del plain
        out = [[None] for _ in node.outputs]
        sink: list = []
        pool, stream = ctx.pool, ctx.stream_handle
        ctx.activate()
        pool.begin_sink(sink, drv.relaxed)
        try:
            drv.begin(stream)
        except driver_errors() as exc:
            pool.end_sink()
            self._give_up(f"cuStreamBeginCapture failed ({exc})")
            return None
        err: BaseException | None = None
        graph = None
        end_err = None
        try:
            if table_in:
                drv.copy_table(ctx, tbl.ptr, len(table_in), max(b.nbytes for _, b in table_in))
            self._run_plain(node, args, out)
            if table and outs:
                sizes = [out[r][0].nbytes - row * out[r][0].strides[0] for r, row in outs]
                drv.copy_table(ctx, tbl.ptr + len(table_in) * TABLE_ENTRY_BYTES, len(outs),
                               max(sizes))
        # broad on purpose: the stream capture must end whatever the loop raised.  Nothing is
        # swallowed: below, a BaseException that is not an Exception is raised again, the
        # loop's own error is raised by the plain run that follows, and a capture fault is
        # reported by _give_up (LoopGraphWarning)
        except BaseException as exc:  # noqa: B902
            err = exc
        finally:
            try:
                graph, end_err = drv.end(stream)
            finally:
                pool.end_sink()
        if err is not None and not isinstance(err, Exception):
            drv.destroy(None, graph)
            raise err
        if err is not None or end_err is not None:
            drv.destroy(None, graph)
            if err is not None and end_err is None:
                # the loop's own error: the plain run raises it with context
                STATS["capture_failures"] += 1
                return None
            self._give_up(end_err or f"{type(err).__name__}: {err}")   # counts it
            return None
        try:
            exe = drv.instantiate(graph)
        except driver_errors() as exc:   # out of memory, a node the driver refuses
            drv.destroy(None, graph)
            self._give_up(f"cuGraphInstantiate failed ({exc})")
            return None
        g = _LoopGraph(drv, exe, graph, tuple(b for b in sink if b is not None), staging,
                       [c[0] for c in out], ctx)
        g.pinned = tuple((i, inputs[i].ptr) for i in pinned)
        if table:
            g.table, g.table_in, g.table_out = tbl, table_in, list(outs)
        del sink
        STATS["captures"] += 1
        try:
            STATS[f"graph nodes ({self.op.info.name})"] = drv.node_count(graph)
        except driver_errors():   # statistics only
            pass
        if ref is not None:
            STATS["checks"] += 1
            g.replay()
            g.checked = True
            got = drv.to_host(g.results)
            why = results_differ(ref, got)
            if why is not None:
                g.free()
                self._give_up(f"the captured loop's results differ from plain launches ({why})")
                return None
            self.verified = True
        return g

    def _run_plain(self, node: Any, args: Sequence[Any], out: list[list]) -> None:
        inner = self.op.inner
        try:
            self.op._loop(node, args, out)
        finally:
            for cell in inner.input_cells:
                cell[0] = None
            for cell in inner.clear_cells:
                cell[0] = None

    def _give_up(self, why: str) -> None:
        STATS["capture_failures"] += 1
        self.disabled = why
        warnings.warn(f"{self.op}: the loop runs step by step, not as a CUDA graph: {why}",
                      LoopGraphWarning, stacklevel=4)


def _rows(a: Any, start: int, count: int) -> Any:
    """``a[start:start + count]`` as a view, without the general indexing path (a chunk takes
    a few per input every call)."""
    return a._view(a.ptr + start * a.strides[0], (count,) + a.shape[1:], a.strides)


def _driver_copy(dst: Any, src: Any) -> None:
    graphs.driver().copy(dst, src)


scan_op.use_exec(LoopGraphs, _driver_copy)  # GpuScan captures loops and copies through us
