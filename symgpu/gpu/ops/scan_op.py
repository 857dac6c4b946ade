"""Scan on the GPU: the loop's buffers live on the device, its body is a GPU graph.

Why: the CPU Scan placed on a GPU function runs its body with an upload of every input and a
download of every output at each step (a stream sync per step).  `GpuScan` is the same loop
(symgpu/scan/op.py: same inputs, outputs, taps and `ScanInfo`) with GPU-typed sequences,
states and per-step outputs: the state buffers and the per-step outputs are preallocated from
the context's pool, each step's inputs are views into them, and the inner graph (lifted by the
usual placement pass, because its inputs are GPU placeholders) reads and writes device memory
only.  Nothing is synchronised per step, except the `until` condition of a while loop, which
is read on the host.

With a known number of steps the whole loop is captured once as a CUDA graph and replayed
(symgpu/gpu/exec/scan_graph.py).  The lifter is registered for `Scan` (so backward scans, which are
Scans, move the same way) and for `IfElse` (its branches lifted the same way; its condition is
read on the host, one sync per call).
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

from symgpu.gpu.runtime.compiler import RENDER_ERRORS
from symgpu.gpu.placement.basic_ops import GpuFromHost, GpuShape_i, HostFromGpu, maybe_strided
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, gpu_supports_dtype, is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.copykernel import prefetch_request
from symgpu.graph.basic import Apply, Variable
from symgpu.link.vm import VM
from symgpu.scan.inner import clone_with
from symgpu.scan.body_lengths import per_step_dims
from symgpu.scan.op import Scan, ScanError, ScanInfo, _simple
import symgpu.tensor as T

__all__ = ["GpuScan", "lift_scan", "gpu_inner_graph"]


def gpu_inner_graph(inner_inputs: Sequence[Variable], inner_outputs: Sequence[Variable],
                    on_gpu_in: Sequence[bool], on_gpu_out: Sequence[bool], ctx: Any,
                    scratch: Sequence[int] = ()) -> tuple[list[Variable], list[Variable]]:
    """The inner graph with GPU placeholders for the inputs flagged in `on_gpu_in` and GPU
    results for the outputs flagged in `on_gpu_out`: the body is written with transfers at
    its edges, which the placement pass of the inner compile turns into GPU ops throughout
    (and the transfer-cancelling pass removes).  The placeholders of the input positions in
    `scratch` are tagged ``loop_scratch``: the body may overwrite them (see `scratch_states`)."""
    new_inputs: list[Variable] = []
    replace: dict[Variable, Variable] = {}
    for k, (v, gpu) in enumerate(zip(inner_inputs, on_gpu_in)):
        if gpu and not is_gpu_var(v):
            ph = GpuArrayType(v.type.dtype, v.type.broadcastable, ctx)(v.name)
            if k in scratch:
                ph.tag.loop_scratch = True
            new_inputs.append(ph)
            replace[v] = HostFromGpu()(ph)
        else:   # host values, and GPU ones already (GPU shared variables, user transfers)
            new_inputs.append(v)
    outs = clone_with(inner_outputs, replace) if replace else list(inner_outputs)
    new_outputs = [GpuFromHost(ctx)(o) if gpu and not is_gpu_var(o) else o
                   for o, gpu in zip(outs, on_gpu_out)]
    return new_inputs, new_outputs


def scratch_states(info: ScanInfo) -> tuple[int, ...]:
    """States whose one tap the loop body may overwrite in place: those that keep only their
    last value (``keep`` False, taps ``(-1,)``: a gradient's accumulators, an RNN's carry).
    The loop owns their memory: it copies the initial value once into a block of its own,
    then each step's tap is the previous step's result, which nobody else holds; so
    ``acc + x.T @ g`` becomes one in-place GEMM instead of a copy and a GEMM per step."""
    return tuple(j for j in range(info.n_states)
                 if not info.keep[j] and tuple(info.state_taps[j]) == (-1,))


def _tap_position(info: ScanInfo, j: int) -> int:
    """The inner input index of state j's first tap."""
    return info.n_seqs + sum(len(info.state_taps[i]) for i in range(j))


def _root(v: Variable) -> Variable:
    """The variable whose memory `v` is (through views and in-place results)."""
    while v.owner is not None:
        op = v.owner.op
        idx = v.owner.outputs.index(v)
        src = None
        for mapping in (getattr(op, "view_map", None) or {}, getattr(op, "destroy_map", None) or {}):
            if mapping.get(idx):
                src = v.owner.inputs[mapping[idx][0]]
                break
        if src is None:
            return v
        v = src
    return v


def scratch_needing_copy(fg: Any, info: ScanInfo, scratch: Sequence[int]) -> frozenset:
    """The scratch states whose step result, in the compiled body `fg`, is memory the loop
    does not own alone (a view of another input, or shared with another output): those are
    copied into a block of the loop's own after each step, so the next step may still
    overwrite its tap."""
    roots = [_root(o) for o in fg.outputs]
    inputs = list(fg.inputs)
    bad = set()
    for j in scratch:
        r = roots[j]
        own = inputs[_tap_position(info, j)]
        if r.owner is None and r is not own:
            bad.add(j)
        elif sum(1 for q in roots if q is r) > 1:
            bad.add(j)
    return frozenset(bad)


class GpuScan(Scan):
    """`Scan` over device buffers (see the module doc); `context_name` is where it runs."""

    #: its lengths are host arithmetic on its inputs' (n_steps, the initial values', the
    #: body's shapes: ``infer_shape``), so reads of them are answered so even though the
    #: loop runs anyway: a read of the result would be a host step after the loop, between
    #: two CUDA graphs (shape_feature._sliced); while loops' lengths stay reads
    shape_from_inputs = True

    def __init__(self, inner_inputs: Sequence[Variable], inner_outputs: Sequence[Variable],
                 info: ScanInfo, mode: Any = None, context_name: Any = None,
                 scratch: Sequence[int] = ()):
        super().__init__(inner_inputs, inner_outputs, info, mode)
        self.context_name = context_name
        self.loop_graphs = None   # scan_graph.LoopGraphs, made on the first real call
        #: states whose tap the body may overwrite (their placeholders are loop_scratch)
        self.scratch = tuple(scratch)
        self._scratch_copy: frozenset | None = None

    def __str__(self) -> str:
        kind = "while" if self.info.as_while else "for"
        return f"GpuScan{{{self.info.name}, {kind}}}"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["loop_graphs"] = None
        return state

    def make_node(self, n_steps: Any, *outer: Variable) -> Apply:
        node = super().make_node(n_steps, *outer)
        ctx = self.context_name
        outs = [GpuArrayType(o.type.dtype, o.type.broadcastable, ctx)()
                for o in node.outputs]
        return Apply(self, node.inputs, outs)

    def infer_shape(self, fgraph, node: Apply, input_shapes: list) -> list[tuple]:
        """Scan's rule; the lengths only a run knows (while loops) and the per-step dims
        the body's shapes do not give (scan.body_lengths.per_step_dims) are read with
        GpuShape_i, which the shape rewrite leaves alone."""
        info = self.info
        n = node.inputs[0]
        out = []
        for j in range(info.n_states):
            init_shape = input_shapes[1 + info.n_seqs + j]
            if info.as_while:
                lead = GpuShape_i(0)(node.outputs[j])
            elif info.keep[j]:
                lead = T.constant(info.n_init(j), dtype="int64") + n
            else:
                lead = T.constant(info.n_init(j), dtype="int64")
            out.append((lead,) + tuple(init_shape[1:]))
        for i in range(info.n_nitsot):
            o = node.outputs[info.n_states + i]
            lead = GpuShape_i(0)(o) if info.as_while else n
            rest = per_step_dims(node, info.n_states + i)
            out.append((lead,) + (rest if rest is not None else
                                  tuple(GpuShape_i(d)(o) for d in range(1, o.ndim))))
        return out

    # -- running
    def _compiled(self) -> Any:
        inner = self.inner
        if inner.vm is None:
            inner.compile()
        vm = inner.vm
        # the thunks directly: the function-level CUDA-graph runner would key every step on
        # new view pointers; the loop is captured whole instead (scan_graph.py).  Only when
        # calling the VM would do nothing else: no profiler, and VM's own __call__ (a subclass
        # such as DebugVM checks each node in its own)
        if vm.profiler is None and type(vm).__call__ is VM.__call__:
            inner._run = vm.run_thunks
        if self._scratch_copy is None:
            self._scratch_copy = scratch_needing_copy(inner.compiled_fgraph, self.info,
                                                      getattr(self, "scratch", ()))
        return inner

    def prepare_node(self, node: Apply, storage_map: dict, compute_map: dict, impl: Any) -> None:
        self._compiled()

    def prefetch_sources(self, node: Apply) -> list:
        """The kernel modules of the body (symgpu/gpu/exec/prefetch.py): the outer function's
        prefetch compiles them with its own, in one parallel nvcc batch, instead of one
        batch per loop body when each body is linked.  With them the strided-copy module
        when an input may be a strided view (a reversed sequence, a transposed weight): the
        captured loop copies its inputs into its own contiguous buffers (scan_graph.py)."""
        out: list = []
        if not self.info.as_while and any(is_gpu_var(v) and maybe_strided(v)
                                          for v in node.inputs[1:]):
            out.append(prefetch_request())
        if self.inner.vm is not None:
            return out
        for n in self.inner.rewritten().toposort():
            ask = getattr(n.op, "prefetch_sources", None)
            if ask is not None:
                try:
                    out.extend(ask(n))
                except RENDER_ERRORS:   # the node's own thunk reports what is wrong with it
                    continue
        return out

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        inner = self._compiled()
        with inner.lock:
            try:
                if not self._run_graph(node, inputs, output_storage):
                    self._loop(node, inputs, output_storage)
            finally:
                for cell in inner.input_cells:
                    cell[0] = None
                for cell in inner.clear_cells:
                    cell[0] = None

    def _run_graph(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> bool:
        """Run the loop as a CUDA graph when it can be one; False: run it plainly."""
        if self.info.as_while:
            return False
        if self.loop_graphs is None:
            self.loop_graphs = _EXEC["loop_graphs"](self)
        return self.loop_graphs.call(node, inputs, output_storage)

    def _context(self) -> Any:
        return gpu_context.get_context(self.context_name)

    def _loop(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        info = self.info
        inner = self.inner
        ctx = self._context()
        n, seqs, inits = self._begin_loop(node, inputs)
        S, M, K = info.n_seqs, info.n_states, info.n_nitsot
        cells = inner.input_cells
        seq_cells = cells[:S]
        tap_cells = cells[S:S + info.n_taps]
        out_cells = inner.output_cells
        clear = inner.clear_cells
        bufs: list[Any] = []
        scratch = getattr(self, "scratch", ())
        recopy = self._scratch_copy or frozenset()
        for j in range(M):
            n_init = info.n_init(j)
            init = inits[j]
            if info.keep[j]:
                buf = GpuArray((n_init + n,) + tuple(init.shape[1:]), node.outputs[j].dtype, ctx)
                _copy(buf[:n_init], init[:n_init])
                bufs.append(buf)
            elif j in scratch:   # a block of the loop's own: the body overwrites it
                own = GpuArray(tuple(init.shape[1:]), node.outputs[j].dtype, ctx)
                _copy(own, init[0])
                bufs.append([own])
            else:   # the last n_init values: views of the initial value, then step results
                bufs.append([init[i] for i in range(n_init)])
        nitsot: list[Any] = [None] * K
        n_inits = [info.n_init(j) for j in range(M)]
        keep = info.keep
        tap_plan = []
        for cell, (j, tap) in zip(tap_cells, [(j, tap) for j in range(M)
                                              for tap in info.state_taps[j]]):
            tap_plan.append((cell, bufs[j], n_inits[j] + tap if keep[j] else tap, keep[j]))
        state_plan = [(out_cells[j], bufs[j], n_inits[j], keep[j], j) for j in range(M)]
        seq_plan = list(zip(seq_cells, seqs))
        cond_cell = out_cells[M + K] if info.as_while else None
        run = inner._run
        direct = direct_outputs(inner) if DIRECT_OUTPUTS else [None] * (M + K)
        aim_states = [(direct[j], bufs[j], n_inits[j]) for j in range(M)
                      if keep[j] and direct[j] is not None]
        aim_nitsot = [(direct[M + i], i) for i in range(K) if direct[M + i] is not None]
        steps_done = n
        for t in range(n):
            for cell, s in seq_plan:
                cell[0] = s[t]
            for cell, buf, off, kept in tap_plan:
                cell[0] = buf[t + off] if kept else buf[off]
            # outputs computed straight into their slot of the loop's buffers where the
            # thunk can (see direct_outputs): no copy after the step
            aimed = [(into, k) for (into, k), buf, n_init in aim_states
                     if _aim(into, k, buf[t + n_init])]
            aimed += [(into, k) for (into, k), i in aim_nitsot
                      if nitsot[i] is not None and _aim(into, k, nitsot[i][t])]
            try:
                run()
            # any error of the body is the loop's own: re-raised, with the step named where
            # the exception class allows it (_simple), never swallowed
            except Exception as exc:
                if not _simple(exc):
                    raise
                raise type(exc)(f"{exc}\n(in {info.name}, step {t} of {n})") from exc
            finally:
                for into, k in aimed:
                    into[k] = None
            for cell, buf, n_init, kept, j in state_plan:
                val = cell[0]
                if kept:
                    dst = buf[t + n_init]
                    if val.shape != dst.shape:
                        raise ScanError(self._shape_msg(info.state_label(j), t, val.shape,
                                                        dst.shape))
                    if not _same_place(val, dst):   # (not computed there)
                        _copy(dst, val)
                else:
                    if val.shape != buf[-1].shape:
                        raise ScanError(self._shape_msg(info.state_label(j), t, val.shape,
                                                        buf[-1].shape))
                    if j in recopy:   # memory the loop does not own alone
                        own = GpuArray(tuple(val.shape), node.outputs[j].dtype, ctx)
                        _copy(own, val)
                        val = own
                    buf.append(val)   # the step's own result: the clear below drops the cell
                    del buf[0]
            for i in range(K):
                val = out_cells[M + i][0]
                arr = nitsot[i]
                if arr is None:
                    arr = nitsot[i] = GpuArray((n,) + tuple(val.shape),
                                               node.outputs[M + i].dtype, ctx)
                elif val.shape != arr.shape[1:]:
                    raise ScanError(self._shape_msg(info.nitsot_label(i), t, val.shape,
                                                    arr.shape[1:]))
                dst = arr[t]
                if not _same_place(val, dst):
                    _copy(dst, val)
            stop = bool(cond_cell[0]) if cond_cell is not None else False
            for c in clear:
                c[0] = None
            if stop:
                steps_done = t + 1
                break
        for cell in cells:
            cell[0] = None
        for j in range(M):
            if info.keep[j]:
                out = bufs[j][:info.n_init(j) + steps_done]
            else:
                win = bufs[j]
                out = GpuArray((len(win),) + tuple(win[0].shape), node.outputs[j].dtype, ctx)
                for i, w in enumerate(win):
                    _copy(out[i], w)
            output_storage[j][0] = out
        for i in range(K):
            arr = nitsot[i]
            if arr is None:
                o = node.outputs[M + i]
                arr = GpuArray((0,) * o.ndim, o.dtype, ctx)
            output_storage[M + i][0] = arr[:steps_done]


#: False: every step's outputs are copied into the loop's buffers (the tests compare the two)
DIRECT_OUTPUTS = True


def direct_outputs(inner: Any) -> list:
    """Per output of the compiled body: ``(write_into, k)`` of the thunk computing it where
    that thunk can compute its output k into an array it is given (GpuElemwise's
    ``write_into``, as graph_segment's direct updates use it), else None.

    Why: a loop keeping every step's state (an LSTM whose states feed its gradient) copied
    each step's results into its buffers: two device copies a step, about 1 us each in a
    captured graph, 200 a step of half.py's LSTM step (length 50, forward and backward)."""
    got = inner.__dict__.get("_direct_outputs")
    if got is None:
        fg, vm = inner.compiled_fgraph, inner.vm
        # (a linker whose VM does not list its thunks by node: every output is copied)
        thunk_of = dict(zip(getattr(vm, "nodes", ()), getattr(vm, "thunks", ())))
        inputs = set(fg.inputs)
        got = []
        for v in fg.outputs:
            into = getattr(thunk_of.get(v.owner), "write_into", None)
            # (an output listed twice, or a graph input passed through, keeps its copies)
            once = fg.outputs.count(v) == 1 and v not in inputs
            got.append((into, v.owner.outputs.index(v)) if into is not None and once else None)
        inner._direct_outputs = got
    return got


def _aim(into: list, k: int, target: Any) -> bool:
    """Ask a thunk to compute its output k into ``target`` (it may decline: a layout its plan
    cannot write); False where another request holds the slot."""
    if into[k] is not None:
        return False
    into[k] = target
    return True


def _same_place(a: Any, b: Any) -> bool:
    """Whether two arrays of one shape are the same memory in the same layout (a step's
    output computed into its slot: nothing to copy)."""
    return a.ptr == b.ptr and a.strides == b.strides


def _copy(dst: Any, src: Any) -> None:
    """``dst[...] = src`` on the device's stream (the lifter checked that dtypes match), through
    the graph driver (captured while a loop is captured; tests replace the driver)."""
    _EXEC["copy"](dst, src)


#: what running a loop needs from gpu/exec, the layer above this one, which installs it when
#: it loads (use_exec): "loop_graphs" (scan_graph.LoopGraphs: the loop captured whole) and
#: "copy" (a device copy through the graph driver)
_EXEC: dict[str, Any] = {}


def use_exec(loop_graphs: Any, copy: Any) -> None:
    """Run loops with gpu/exec's captured loop graphs and its driver's copies."""
    _EXEC.update(loop_graphs=loop_graphs, copy=copy)


# ----------------------------------------------------------------------------- the lifter

#: CPU op -> {layout: GPU op}; weak, and outside the op so pickling a host function does not
#: carry its GPU twins along
_GPU_COPIES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _cache(op: Any, key: Any, make: Any) -> Any:
    """One GPU op per (CPU op, layout): its inner graph is compiled once, not per function."""
    cache = _GPU_COPIES.setdefault(op, {})
    new = cache.get(key)
    if new is None:
        new = cache[key] = make()
    return new


@register_lifter(Scan)
def lift_scan(op: Scan, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Scan -> GpuScan: sequences, initial states and per-step outputs on the device; the
    non-sequences where the placement pass put them (weights on the GPU, integers on the
    host)."""
    if isinstance(op, GpuScan):
        return None
    info = op.info
    S, M, K, N = info.n_seqs, info.n_states, info.n_nitsot, info.n_nonseqs
    outer = list(inputs)[1:]
    for v in outer[:S + M]:
        if not gpu_supports_dtype(v.type.dtype):
            return None
    for o in node.outputs:
        if not gpu_supports_dtype(o.type.dtype):
            return None
    for o, io in zip(node.outputs, op.inner_outputs):
        if o.type.dtype != io.type.dtype:
            return None   # a step result cast into its buffer: the host loop does that
    for k in range(S + M):
        if not is_gpu_var(outer[k]):
            outer[k] = GpuFromHost(context_name)(outer[k])
    nonseq_gpu = tuple(is_gpu_var(v) for v in outer[S + M:])
    n_in = S + info.n_taps
    on_in = [True] * n_in + list(nonseq_gpu)
    on_out = [True] * (M + K) + [False] * (len(op.inner_outputs) - M - K)

    def make() -> GpuScan:
        scratch = scratch_states(info)
        ins, outs = gpu_inner_graph(op.inner_inputs, op.inner_outputs, on_in, on_out,
                                    context_name, [_tap_position(info, j) for j in scratch])
        return GpuScan(ins, outs, info, op.mode, context_name, scratch)

    gop = _cache(op, (context_name, nonseq_gpu), make)
    assert len(outer) == S + M + N
    return gop.make_node(inputs.host(0), *outer).outputs
