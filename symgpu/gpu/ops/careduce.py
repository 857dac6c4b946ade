"""GpuCAReduce: reductions over axes as generated CUDA kernels, optionally over a fused
elementwise prologue and through an elementwise epilogue (a bias's update in the reduction's
launch).  Each call reads the input's layout and looks up a plan cached for it (kernel, grid,
fixed arguments), as GpuElemwise does; kernel source comes from
``symgpu/gpu/runtime/codegen/reduce.py`` and ``reduce.cu``.

Why apart from elemwise.py (which still serves ``GpuCAReduce`` under its old path): the
reduction's planner (one pass, split, column blocks and tiles, vector loads) is a concern of
its own, and the two together passed 800 lines.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops.kernel_ops import _capturable, _context, _pad_inputs, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import launch, layout
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, reduce_formats, render_reduce
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, supports_scalar_op
from symgpu.gpu.runtime.codegen.types import SUPPORTED
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.elemwise import reduce_output_dtype
from symgpu.tensor.shape_rules import elemwise_shape, reduce_shape

__all__ = ["GpuCAReduce", "careduce_supported", "reads_aligned"]

_REDUCE_NAMES = {"add": "add", "mul": "mul", "maximum": "maximum", "minimum": "minimum",
                 "and_": "and", "or_": "or"}


class GpuCAReduce(Op):
    """Reduce ``axis`` (None: all) with add/mul/maximum/minimum/and_/or_, optionally over an
    elementwise ``pre_scalar_op`` of the inputs fused into the same kernel (``sum(x**2)``
    reads x once) and through an elementwise ``post_scalar_op`` of each result (``b - lr *
    d.sum(0)``, a bias's update, in the reduction's launch: the gpu_careduce_epilogue pass).
    ``dtype`` is the reduction's accumulator/output dtype (NumPy's ``dtype=``).

    Inputs: the reduction's (one, or the pre-op's), then the epilogue's other operands (the
    post op's inputs after its first, the reduced value): each of the output's shape or a
    single value (every dim broadcastable)."""

    __props__ = ("scalar_op", "axis", "dtype", "pre_scalar_op", "post_scalar_op")

    def __init__(self, scalar_op: Any, axis: Sequence[int] | None = None,
                 dtype: str | None = None, pre_scalar_op: Any = None,
                 post_scalar_op: Any = None):
        if isinstance(scalar_op, str):
            scalar_op = SCALAR_OPS[scalar_op]
        if scalar_op.name not in _REDUCE_NAMES:
            raise ValueError(f"cannot reduce with {scalar_op}; use one of "
                             f"{', '.join(_REDUCE_NAMES)}")
        self.scalar_op = scalar_op
        self.axis = None if axis is None else tuple(sorted(int(a) for a in axis))
        self.dtype = dtype
        self.pre_scalar_op = pre_scalar_op
        if post_scalar_op is not None and getattr(post_scalar_op, "nin", -1) < 1:
            raise ValueError(f"GpuCAReduce: an epilogue needs a fixed number of inputs (a "
                             f"Composite), got {post_scalar_op}")
        self.post_scalar_op = post_scalar_op

    def __str__(self) -> str:
        red = _REDUCE_NAMES[self.scalar_op.name]
        head = red if self.pre_scalar_op is None else f"pre={self.pre_scalar_op},red={red}"
        if self.post_scalar_op is not None:
            head += f",post={self.post_scalar_op}"
        axes = "all" if self.axis is None else ",".join(str(a) for a in self.axis)
        acc = f", acc_dtype={self.dtype}" if self.dtype else ""
        return f"GpuCAReduce{{{head}}}{{{axes}{acc}}}"

    def n_reduced_inputs(self, n_inputs: int) -> int:
        """How many of ``n_inputs`` inputs the reduction reads (the rest: the epilogue's)."""
        if self.post_scalar_op is None:
            return n_inputs
        return n_inputs - (self.post_scalar_op.nin - 1)

    def infer_shape(self, fgraph, node, input_shapes):
        """The (broadcast) shape of the reduction's inputs without the reduced axes."""
        n = self.n_reduced_inputs(len(node.inputs))
        shape = elemwise_shape([v.broadcastable for v in node.inputs[:n]], input_shapes[:n])
        return [reduce_shape(shape, self.axis)]

    def make_node(self, *inputs: Any) -> Apply:
        n_post = 0 if self.post_scalar_op is None else self.post_scalar_op.nin - 1
        want = 1 if self.pre_scalar_op is None else getattr(self.pre_scalar_op, "nin", len(inputs))
        if want > 0 and len(inputs) != want + n_post:
            raise TypeError(f"{self} takes {want + n_post} input(s), got {len(inputs)}")
        red_inputs, extra = inputs[:len(inputs) - n_post], inputs[len(inputs) - n_post:]
        padded, ctx_name = _pad_inputs(red_inputs)
        nd = padded[0].ndim
        axis = tuple(range(nd)) if self.axis is None else self.axis
        for a in axis:
            if not 0 <= a < max(nd, 1) or (nd == 0 and a != 0):
                raise ValueError(f"{self}: axis {a} is out of range for {padded[0].type}")
        value = padded[0].dtype if self.pre_scalar_op is None else output_dtypes(
            self.pre_scalar_op, [p.dtype for p in padded])[0]
        red_dtype = self.dtype or reduce_output_dtype(self.scalar_op.name, value)
        bcast = tuple(all(p.broadcastable[d] for p in padded) for d in range(nd)
                      if d not in axis)
        out_dtype = red_dtype
        extra = [as_gpuarray_variable(v, ctx_name) for v in extra]
        if self.post_scalar_op is not None:
            for v in extra:
                if not (all(v.broadcastable) or (v.ndim == len(bcast)
                                                 and v.broadcastable == bcast)):
                    raise TypeError(f"{self}: an epilogue operand must be one value or of the "
                                    f"output's broadcast pattern {bcast}, got {v.type}")
            outs = output_dtypes(self.post_scalar_op, [red_dtype, *(v.dtype for v in extra)])
            if len(outs) != 1:
                raise TypeError(f"{self}: the epilogue must have one output, got {len(outs)}")
            out_dtype = outs[0]
        return Apply(self, [*padded, *extra], [GpuArrayType(out_dtype, bcast, ctx_name)()])

    def reduced_dtype(self, node: Apply) -> str:
        """The reduction's own result dtype (before the epilogue)."""
        if self.post_scalar_op is None:
            return node.outputs[0].dtype
        red = node.inputs[:self.n_reduced_inputs(len(node.inputs))]
        value = red[0].dtype if self.pre_scalar_op is None else output_dtypes(
            self.pre_scalar_op, [v.dtype for v in red])[0]
        return self.dtype or reduce_output_dtype(self.scalar_op.name, value)

    def _axes(self, ndim: int) -> tuple[int, ...]:
        return tuple(range(ndim)) if self.axis is None else tuple(a for a in self.axis if a < ndim)

    def signature(self, node: Apply, knd: int, rnd: int) -> ReduceSignature:
        n = self.n_reduced_inputs(len(node.inputs))
        extra = node.inputs[n:]
        return ReduceSignature(self.scalar_op.name, self.pre_scalar_op,
                               tuple(v.dtype for v in node.inputs[:n]), node.outputs[0].dtype,
                               knd, rnd, self.post_scalar_op, tuple(v.dtype for v in extra),
                               tuple(all(v.broadcastable) for v in extra),
                               None if self.post_scalar_op is None else self.reduced_dtype(node))

    def kernel_sources(self, node: Apply) -> list[tuple[Any, str]]:
        """(key, source) of every module this node can launch: one per count of collapsed
        kept/reduced dimensions (CI compiles them all)."""
        nd = node.inputs[0].ndim
        nred = len(self._axes(nd)) if nd else 1   # (dims reduced; the epilogue's are kept)
        nkept = nd - nred if nd else 0
        out = []
        for knd in range(1, max(nkept, 1) + 1):
            for rnd in range(1, max(nred, 1) + 1):
                sig = self.signature(node, knd, rnd)
                out.append((("symgpu.reduce", sig), render_reduce(sig, str(self))))
        return out

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """(key, source factory, options) of the module make_thunk loads (the 1 kept / 1
        reduced dims one; others compile on first use), for symgpu/gpu/exec/prefetch.py."""
        sig = self.signature(node, 1, 1)
        return [(("symgpu.reduce", sig), lambda: render_reduce(sig, str(self)), ())]

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _ReduceThunk(self, node, storage_map, ctx).thunk()


class _ReduceThunk:
    """Plans (per input layout) and launches one GpuCAReduce node.

    Launch shapes (reduce.cu names the kernels): enough kept positions to fill the GPU -> one
    ``final`` launch; otherwise R is split over G blocks per position and, for the rows
    strategy, combined in the same launch (``onepass``: the last block of each column reduces
    the partials, counted on ``counters``); the cols strategy still finishes in a second launch
    (``sg_finish``).  Where every operand's reduced values of a row are contiguous and the
    module has vector kernels, rows read 16-byte vectors (``sg_vrows_*``): always when R is
    split, and for whole rows of at least ``VEC_MIN_ROW`` values (a block per row).  A full
    reduction (K == 1) gets its own one-pass grid: ``ONEPASS_BLOCKS_PER_SM`` blocks of 256 per
    multiprocessor, fewer where R is short.  Columns (every operand's kept axis contiguous,
    as in a bias gradient ``d.sum(0)``) that would be split are one ``sg_cols_block`` launch
    instead: blocks of 1024 threads, C columns x 1024 / C row lanes walking the whole of R (C
    is 32, or 16 or 8 where fewer columns per block fill more multiprocessors, and at least
    32 bytes of a row), where each lane takes at most ``COLS_BLOCK_ROWS_PER_LANE`` rows
    (taller arrays keep the split: a lane walking R alone is latency-bound; measured on an
    H100, float32 sums: (512, 1024) 2.59 us against 3.36 us of split + finish kernels,
    (2048, 1024) at 16 rows a lane 4.40 against 4.31, (3072, 1024) 5.53 against 4.85,
    (4096, 4224) with 132 blocks of 32 columns 34.4 against 26.3).  Taller arrays of at
    least ``COLS_TILE_MIN_K`` contiguous columns (a transformer's bias gradients: 22 us each
    on the H200 through the split) are one ``sg_cols_tile`` launch (reduce.cu)."""

    #: tuning knobs (class attributes, read when a plan is made)
    USE_ONEPASS = True      # False: rows split over blocks finish in a second launch
    VEC = True
    VEC_MIN_ROW = 4096
    ONEPASS_BLOCKS_PER_SM = 4
    #: values a thread of a one-pass full reduction takes at least: 4 vectors of 16 bytes
    ONEPASS_MIN_BYTES_PER_THREAD = 64
    COLS_BLOCK = True       # False: split columns always finish in a second launch
    COLS_BLOCK_ROWS_PER_LANE = 16
    COLS_TILE, COLS_TILE_MIN_K, COLS_TILE_ROWS_PER_LANE = True, 128, 8   # (False: the split)
    FINAL, SPLIT, ONEPASS = 0, 1, 2

    def __init__(self, op: GpuCAReduce, node: Apply, storage_map: dict, ctx: Any) -> None:
        self.op, self.node, self.ctx = op, node, ctx
        n = op.n_reduced_inputs(len(node.inputs))
        self.in_cells = [storage_map[v] for v in node.inputs[:n]]
        #: the epilogue's operands (post_scalar_op): one value each, or one per output element
        self.ex_cells = [storage_map[v] for v in node.inputs[n:]]
        self.out_cell = storage_map[node.outputs[0]]
        self.out_dtype = np.dtype(node.outputs[0].dtype)
        self.axes = op._axes(node.inputs[0].ndim)
        self.sms = launch.sm_count(ctx)
        self.modules: dict[tuple[int, int], dict] = {}
        self.plans: dict[tuple, tuple] = {}
        self.is_minmax = op.scalar_op.name in ("maximum", "minimum")
        self.counters: Any = None    # one-pass launches' block counters (made on first need)
        self.kernels(1, 1)   # the common module, compiled (or fetched) now

    def kernels(self, knd: int, rnd: int) -> dict:
        got = self.modules.get((knd, rnd))
        if got is None:
            sig = self.op.signature(self.node, knd, rnd)
            ks = launch.load_kernels(self.ctx, ("symgpu.reduce", sig),
                              lambda: render_reduce(sig, str(self.op)), reduce_formats(sig))
            got = self.modules[(knd, rnd)] = {n: k.fast_launcher() for n, k in ks.items()}
            got["acc_dtype"] = np.dtype(sig.acc_dtype)
        return got

    def counter_ptr(self) -> int:
        """The device address of this node's one-pass block counters: one per possible
        blockIdx.x (the layout caps the grid at 16 blocks per multiprocessor), allocated and
        zeroed once, kept for the node's life (CUDA graphs captured from its launches point at
        them) and left at zero by every launch."""
        if self.counters is None:
            counters = new_array(self.ctx, (16 * self.sms,), np.dtype("uint32"))
            counters.fill(0)
            self.counters = counters
        return self.counters.ptr

    def plan(self, ins: list) -> tuple:
        shape = layout.broadcast_shapes([a.shape for a in ins], str(self.op))
        strides = [layout.element_strides(a.shape, a.strides, a.dtype.itemsize, shape)
                   for a in ins]
        if not shape:          # a 0-d input: one position, one value
            shape, strides = (1,), [[0] for _ in ins]
            axes, lead = (0,), 0
        else:
            axes = self.axes
            lead = layout.lead_operand(shape, strides)
            shape, strides = _order_reduced(shape, strides, axes, lead)
        p = layout.plan_reduction(shape, strides, axes, self.sms, lead)
        itemsize = ins[lead].dtype.itemsize
        if not ins[0].shape:
            p.out_shape = ()
        if p.R == 0 and self.is_minmax and p.K:
            raise ValueError(f"{self.op}: cannot reduce an empty array of shape "
                             f"{ins[0].shape} (zero-size reduction has no identity)")
        ks = self.kernels(p.knd, p.rnd)
        mode, counters = (self.FINAL if p.G == 1 else self.SPLIT), 0
        name = f"sg_{p.strategy}_{'final' if p.G == 1 else 'partial'}"
        if p.strategy == "rows" and p.K and p.R:
            vec = (self.VEC and "sg_vrows_final" in ks and p.rnd == 1
                   and all(s[-1] == 1 for s in p.rstrides))
            if p.G == 1:
                if vec and p.R >= self.VEC_MIN_ROW:
                    name = "sg_vrows_final"
            elif self.USE_ONEPASS:
                mode, counters = self.ONEPASS, self.counter_ptr()
                name = "sg_vrows_onepass" if vec else "sg_rows_onepass"
                if p.K == 1:
                    per_thread = max(1, self.ONEPASS_MIN_BYTES_PER_THREAD // itemsize)
                    g = min(max(1, self.ONEPASS_BLOCKS_PER_SM) * self.sms,
                            -(-p.R // (256 * per_thread)), 65535)
                    if g == 1:
                        mode, counters = self.FINAL, 0
                        name = "sg_vrows_final" if vec else "sg_rows_final"
                    p.G, p.chunk = g, -(-p.R // g)
                    p.block, p.grid = (256, 1, 1), (1, g, 1)
        else:
            cw = self.cols_block_width(p, itemsize)
            if not cw and self.cols_tile_fits(p, ks):
                p.grid, p.G, p.chunk = layout.cols_tile_grid(
                    p.K, p.R, self.op.signature(self.node, 1, 1).cols_vector, self.sms,
                    self.COLS_TILE_ROWS_PER_LANE)
                p.block, name = (32, 8, 1), "sg_cols_tile"
                mode, counters = ((self.FINAL, 0) if p.G == 1 else
                                  (self.ONEPASS, self.counter_ptr()))
            elif cw:
                name, mode = "sg_cols_block", self.FINAL
                p.G, p.chunk = 1, p.R
                p.block = (cw, 1024 // cw, 1)
                p.grid = (min(-(-p.K // cw), 16 * self.sms), 1, 1)
        p.kernel = name     # (the launch's kernel, for tests and explain)
        return p, ks[name], ks["sg_finish"], ks["acc_dtype"], tuple(p.meta()), mode, counters

    def cols_tile_fits(self, p: Any, ks: dict) -> bool:
        """Whether the columns plan ``p`` takes ``sg_cols_tile``: one kept and one reduced dim,
        every operand's columns contiguous (or one value), at least ``COLS_TILE_MIN_K``, and
        R tall enough to be split with no one-launch column block."""
        return (self.COLS_TILE and p.strategy == "cols" and p.G > 1 and p.K and p.R
                and p.K >= self.COLS_TILE_MIN_K and p.knd == 1 and p.rnd == 1
                and "sg_cols_tile" in ks and p.kstrides[p.lead][-1] == 1
                and all(s[-1] in (0, 1) for s in p.kstrides))

    def cols_block_width(self, p: Any, itemsize: int) -> int:
        """The columns per block of ``sg_cols_block`` for the columns plan ``p`` (split over
        G > 1 blocks per column), or 0 where the split stays (see the class docstring)."""
        if not (self.COLS_BLOCK and p.strategy == "cols" and p.G > 1 and p.K and p.R):
            return 0
        if any(s[-1] not in (0, 1) for s in p.kstrides):   # strided columns: the split path
            return 0
        cw = 32
        while cw > max(8, 32 // itemsize) and -(-p.K // cw) < self.sms:
            cw //= 2
        return cw if -(-p.R // (1024 // cw)) <= self.COLS_BLOCK_ROWS_PER_LANE else 0

    def thunk(self) -> Callable[[], None]:
        in_cells, out_cell, ctx = self.in_cells, self.out_cell, self.ctx
        plans, plan_for, out_dtype = self.plans, self.plan, self.out_dtype
        activate = ctx.activate
        finish_block = (32, 8, 1)
        FINAL, ONEPASS = self.FINAL, self.ONEPASS
        reuse = [False]   # graph_plan.mark_reusable_outputs sets it

        ex_cells, op = self.ex_cells, self.op
        ex_scalar = [all(v.broadcastable) for v in self.node.inputs[len(in_cells):]]
        into = [None]     # graph_segment sets it for one capture (write_into)

        def thunk() -> None:
            activate()
            ins = [c[0] for c in in_cells]
            key = tuple([a.shape + a.strides for a in ins])
            got = plans.get(key)
            if got is None:
                got = plans[key] = plan_for(ins)
            p, main, finish, acc_dtype, meta, mode, counters = got
            out = out_cell[0]
            target = into[0]
            if target is not None and target.shape == tuple(p.out_shape) and \
                    target.dtype == out_dtype and target.is_c_contiguous:
                out = target     # an update computed in its variable's buffer (write_into)
            elif not reuse[0] or out is None or out.shape != p.out_shape or \
                    out.dtype != out_dtype:
                out = new_array(ctx, p.out_shape, out_dtype)
            ex: Any = ()
            if ex_cells:   # (the arrays stay referenced here until the launches are queued)
                ex_arrays = [_epilogue_operand(op, c[0], p.out_shape, sc)
                             for c, sc in zip(ex_cells, ex_scalar)]
                ex = [a.ptr for a in ex_arrays]
            if p.K:
                ptrs = [a.ptr for a in ins]
                if mode == FINAL:
                    main(p.grid, p.block, p.K, p.R, p.chunk, *meta, *ptrs, out.ptr, 0, 0, *ex)
                else:
                    partial = new_array(ctx, (p.K * p.G,), acc_dtype)
                    main(p.grid, p.block, p.K, p.R, p.chunk, *meta, *ptrs, out.ptr, partial.ptr,
                         counters, *ex)
                    if mode != ONEPASS:
                        finish(p.finish_grid, finish_block, p.K, p.G, partial.ptr, out.ptr, *ex)
            out_cell[0] = out

        thunk.reduce_thunk = self   # type: ignore[attr-defined]  (tests read plans, counters)
        thunk.reuse_outputs = reuse   # type: ignore[attr-defined]
        if ex_cells:
            # with an epilogue (a bias's update b - lr * d.sum(0)) the result may be computed
            # in the updated variable's own buffer under capture (graph_segment's direct
            # updates): each kept position's thread reads its operands' values there, then
            # stores its result
            thunk.write_into = into   # type: ignore[attr-defined]
            axes = self.op._axes
            thunk.aligned_read = (   # type: ignore[attr-defined]
                lambda a, t: reads_aligned(axes(len(a.shape)), a, t))
        return _capturable(thunk)


def reads_aligned(reduced_axes: Sequence[int], a: Any, target: Any) -> bool:
    """Whether a reduction's input ``a`` (over ``reduced_axes``) reads ``target``'s memory
    only where it reads the element of ``target`` at the kept position it contributes to:
    its reduced axes have length 1 or stride 0, and its kept axes are ``target``'s
    (pointer, lengths, strides). Then an update may be computed into ``target`` under capture
    (graph_segment's direct updates, a thunk's ``aligned_read``): a kept position's result
    is stored after its whole reduction, and no other position's reduction reads it (a
    bias's update ``b - lr * (g * f(b)).sum(0)`` reading b broadcast over the rows)."""
    if a.dtype != target.dtype or a.ptr != target.ptr:
        return False
    reduced = set(reduced_axes)
    kept = [(n, s) for d, (n, s) in enumerate(zip(a.shape, a.strides)) if d not in reduced]
    return all(a.shape[d] == 1 or a.strides[d] == 0 for d in reduced) and \
        kept == list(zip(target.shape, target.strides))


def _epilogue_operand(op: GpuCAReduce, a: Any, out_shape: tuple, scalar: bool) -> Any:
    """An epilogue operand as the kernel reads it: one value (``scalar``: every dim
    broadcastable), or a C-contiguous array of the output's shape (a strided one copied)."""
    if scalar:
        return a
    if a.shape != tuple(out_shape):
        raise ValueError(f"{op}: an epilogue operand of shape {a.shape} does not match the "
                         f"output's shape {tuple(out_shape)}")
    return a if a.is_c_contiguous else a.copy()


def _order_reduced(shape: tuple, strides: list, axes: Sequence[int],
                   lead: int = 0) -> tuple[tuple, list]:
    """The same iteration space with the reduced dims (their order does not change a
    commutative reduction) sorted by operand ``lead``'s stride, largest outside and broadcast
    ones outermost, so that ``x.T.sum()`` walks memory in order (and collapses like
    ``x.sum()``)."""
    red = [d for d in range(len(shape)) if d in axes]
    if len(red) < 2:
        return shape, strides
    s0 = strides[lead]
    order = sorted(red, key=lambda d: float("inf") if s0[d] == 0 else abs(s0[d]), reverse=True)
    if order == red:
        return shape, strides
    perm = list(range(len(shape)))
    for pos, d in zip(red, order):
        perm[pos] = d
    return tuple(shape[d] for d in perm), [[s[d] for d in perm] for s in strides]


def careduce_supported(scalar_op: Any, pre_scalar_op: Any, in_dtypes: Sequence[str]) -> bool:
    """Whether GpuCAReduce can generate this reduction."""
    if scalar_op.name not in _REDUCE_NAMES or any(d not in SUPPORTED for d in in_dtypes):
        return False
    return pre_scalar_op is None or supports_scalar_op(pre_scalar_op, in_dtypes)

