"""GpuColumnReduceGroup: an elementwise map and reductions over the leading dims of the same
(rows, columns) positions in one pass (XLA's multi-output fusion); the pass
``gpu_col_reduce_group`` building it lives in ``col_group_rewrite.py``.

Why: a transformer step's bias gradients are column sums of arrays an elementwise kernel has
just written (the GELU backward's, the layer norm backward's), or recompute that kernel's
expression from its inputs: the reduction reads again, from memory, the bytes the map read or
wrote a moment before (the GELU bias gradient: 100 MB, 56 us of the GPT step's 1.44 ms).
Summing while mapping reads them once; sibling column sums of one operand (a layer norm's gain
and bias gradients) share their reads too.

Inputs: the operands, of one ndim (two or more; broadcastable dims as in an elementwise op).
Outputs: the map's kept outputs (full arrays, C-contiguous, of its dtypes), then one per
member: its reduction over every dim but the last (a vector of the last dim's length), equal
to what each member's GpuCAReduce computes (its accumulator dtype; a member reading a map
output reads it as stored, rounded to the output's dtype).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops.careduce import _ReduceThunk
from symgpu.gpu.ops.kernel_ops import (OneModule, _capturable, _context, _pad_inputs,
                                        _virtual_thunk)
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import launch, layout
from symgpu.gpu.runtime.codegen.col_group import (COL_GROUP_KERNEL, COL_GROUP_REDUCIBLE,
                                                  ColGroupSignature, ColMember, col_group_formats,
                                                  render_col_group)
from symgpu.gpu.runtime.codegen.scalar import output_dtypes
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.elemwise import reduce_output_dtype
from symgpu.tensor.shape_rules import elemwise_shape

__all__ = ["GpuColumnReduceGroup", "ColMember"]


class GpuColumnReduceGroup(OneModule, Op):
    """``members`` (``ColMember``s) reducing every dim but the last of their values, beside an
    elementwise ``map_op`` (a scalar op, or None) of the operands ``map_args`` whose outputs
    flagged in ``kept`` are written (see the module docstring)."""

    __props__ = ("members", "map_op", "map_args", "kept")
    capturable = True
    launches = True
    MODULE = "symgpu.col_group"
    render = staticmethod(render_col_group)

    def __init__(self, members: Sequence[ColMember], map_op: Any = None,
                 map_args: Sequence[int] = (), kept: Sequence[bool] = ()):
        self.members = tuple(members)
        self.map_op = map_op
        self.map_args = tuple(int(a) for a in map_args)
        self.kept = tuple(bool(k) for k in kept)
        if not self.members:
            raise ValueError("GpuColumnReduceGroup needs at least one member")
        if map_op is None and (self.map_args or self.kept):
            raise ValueError("GpuColumnReduceGroup: map_args and kept need a map_op")
        n_map = len(self.kept)
        for q, m in enumerate(self.members):
            if m.reduce_op not in COL_GROUP_REDUCIBLE:
                raise ValueError(f"GpuColumnReduceGroup: member {q} reduces with {m.reduce_op}; "
                                 f"use one of {', '.join(COL_GROUP_REDUCIBLE)}")
            if any(a < 0 and -a - 1 >= n_map for a in m.args):
                raise ValueError(f"GpuColumnReduceGroup: member {q}'s arguments {m.args} name "
                                 f"map outputs past the {n_map} kept flags")
            if m.pre_op is None and len(m.args) != 1:
                raise ValueError(f"GpuColumnReduceGroup: member {q} has no pre-op but "
                                 f"{len(m.args)} arguments")

    def __str__(self) -> str:
        def one(m: ColMember) -> str:
            return m.reduce_op if m.pre_op is None else f"pre={m.pre_op},red={m.reduce_op}"
        head = f"map={self.map_op}; " if self.map_op is not None else ""
        return f"GpuColumnReduceGroup{{{head}{'; '.join(one(m) for m in self.members)}}}"

    # -- types
    def _dtypes(self, in_dtypes: Sequence[str]) -> tuple[list[str], list[str]]:
        """(the map's output dtypes, the members' result dtypes)."""
        maps = ([] if self.map_op is None else
                output_dtypes(self.map_op, [in_dtypes[a] for a in self.map_args]))
        if len(maps) != len(self.kept):
            raise TypeError(f"{self}: the map has {len(maps)} outputs, kept flags "
                            f"{len(self.kept)}")
        reds = []
        for m in self.members:
            args = [in_dtypes[a] if a >= 0 else maps[-a - 1] for a in m.args]
            value = args[0] if m.pre_op is None else output_dtypes(m.pre_op, args)[0]
            reds.append(m.dtype or reduce_output_dtype(m.reduce_op, value))
        return maps, reds

    def make_node(self, *inputs: Any) -> Apply:
        ins, ctx_name = _pad_inputs(inputs)
        nd = ins[0].ndim if ins else 0
        if nd < 2:
            raise TypeError(f"{self}: operands need at least 2 dims (rows by columns), got "
                            f"{[v.type for v in ins]}")
        if any(a < 0 or a >= len(ins) for a in self.map_args) or \
                any(a >= len(ins) for m in self.members for a in m.args):
            raise TypeError(f"{self}: arguments name operands past the {len(ins)} inputs")
        full = tuple(all(v.broadcastable[d] for v in ins) for d in range(nd))

        def pattern(args: Sequence[int]) -> tuple:
            pats = [ins[a].broadcastable if a >= 0 else full for a in args]
            return tuple(all(p[d] for p in pats) for d in range(nd))
        if self.map_op is not None and pattern(self.map_args) != full:
            raise TypeError(f"{self}: the map's operands must span every position, broadcast "
                            f"pattern {full}; got {pattern(self.map_args)}")
        for q, m in enumerate(self.members):
            if pattern(m.args) != full:
                raise TypeError(f"{self}: member {q}'s operands must span every position, "
                                f"broadcast pattern {full}; got {pattern(m.args)}")
        maps, reds = self._dtypes([v.dtype for v in ins])
        outs = [GpuArrayType(d, full, ctx_name)() for d, k in zip(maps, self.kept) if k]
        outs += [GpuArrayType(d, full[-1:], ctx_name)() for d in reds]
        return Apply(self, ins, outs)

    def infer_shape(self, fgraph, node, input_shapes):
        shape = elemwise_shape([v.broadcastable for v in node.inputs], input_shapes)
        return [tuple(shape)] * sum(self.kept) + [(shape[-1],)] * len(self.members)

    def signature(self, node: Apply) -> ColGroupSignature:
        dtypes = [v.dtype for v in node.inputs]
        maps, reds = self._dtypes(dtypes)
        return ColGroupSignature(tuple(dtypes),
                                 tuple(all(v.broadcastable[:-1]) for v in node.inputs),
                                 tuple(v.broadcastable[-1] for v in node.inputs),
                                 self.map_op, self.map_args, tuple(maps), self.kept,
                                 self.members, tuple(reds), node.inputs[0].ndim - 1)

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _ColGroupThunk(self, node, storage_map, ctx).thunk()


class _ColGroupThunk:
    """Plans (per input layout) and launches one GpuColumnReduceGroup node: column tiles of
    32 threads by ``cols_vector`` columns, the rows split into about a wave of 256-thread
    blocks, each of a block's 8 row lanes taking at least ``ROWS_PER_LANE`` rows."""

    ROWS_PER_LANE = 12

    def __init__(self, op: GpuColumnReduceGroup, node: Apply, storage_map: dict, ctx: Any):
        self.op, self.node, self.ctx = op, node, ctx
        self.in_cells = [storage_map[v] for v in node.inputs]
        self.out_cells = [storage_map[v] for v in node.outputs]
        self.out_dtypes = [np.dtype(v.dtype) for v in node.outputs]
        self.sig = sig = op.signature(node)
        self.acc_dtypes = [np.dtype(sig.reduce_signature(q).acc_dtype)
                           for q in range(len(sig.members))]
        ks = launch.load_kernels(ctx, (op.MODULE, sig),
                                 lambda: op.render(sig, str(op)), col_group_formats(sig))
        self.kernel = ks[COL_GROUP_KERNEL].fast_launcher()
        self.sms = launch.sm_count(ctx)
        self.plans: dict[tuple, tuple] = {}
        self.counters: Any = None

    #: the node's one-pass block counters, as GpuCAReduce's (the same zeroed-once array)
    counter_ptr = _ReduceThunk.counter_ptr

    #: row tiles at most where ``rows_per_lane`` shortens the lanes (the last block of a
    #: column tile then combines that many partials a column)
    MAX_ROW_TILES = 32

    def rows_per_lane(self, K: int, R: int) -> int:
        """``ROWS_PER_LANE``, or fewer where that leaves less than a block a multiprocessor:
        then about two (each lane down to one row, at most ``MAX_ROW_TILES`` row tiles): a
        (512, 1024) MLP layer's ReLU backward with its bias's sum ran 24 blocks of 12 rows a
        lane in 13 us on the H200, 64 row tiles of one row in 9 us (the last blocks adding
        64 partials a column, four at a time then)."""
        tiles = -(-K // (32 * self.sig.cols_vector))
        rows = self.ROWS_PER_LANE
        if tiles * -(-R // (8 * rows)) >= self.sms:
            return rows
        want = min(self.MAX_ROW_TILES, -(-2 * self.sms // max(tiles, 1)))
        return max(1, min(rows, -(-R // (8 * want))))

    def plan(self, ins: list) -> tuple:
        """(grid, G, K, full shape, meta args) for these operand arrays."""
        op, sig = self.op, self.sig
        shape = layout.broadcast_shapes([a.shape for a in ins], str(op))
        uses = ([("the map", op.map_args)] if op.map_op is not None else []) + \
            [(f"member {q}", m.args) for q, m in enumerate(op.members)]
        for who, args in uses:
            got = layout.broadcast_shapes([ins[a].shape if a >= 0 else shape for a in args],
                                          f"{op} ({who})")
            if got != shape:
                raise ValueError(f"{op}: {who}'s operands of shapes "
                                 f"{[ins[a].shape for a in args if a >= 0]} span {got}, not "
                                 f"every position {shape} of the group's operands "
                                 f"{[a.shape for a in ins]}")
        for q, m in enumerate(op.members):
            if shape[-1] and 0 in shape[:-1] and m.reduce_op in ("maximum", "minimum"):
                raise ValueError(f"{op}: member {q} cannot reduce empty columns (operands of "
                                 f"shapes {[a.shape for a in ins]}; zero-size reduction has "
                                 f"no identity)")
        strides = [layout.element_strides(a.shape, a.strides, a.dtype.itemsize, shape)
                   for a in ins]
        K, lead = shape[-1], shape[:-1]
        R = int(np.prod(lead))
        rshape, rstrides = layout.collapse(lead, [s[:-1] for s in strides])
        pad = sig.rnd - len(rshape)
        rshape = list(rshape) + [1] * pad
        rstrides = [list(s) + [0] * pad for s in rstrides]
        cstrides = [s[-1] for s in strides]
        cv = sig.cols_vector
        vec = all(c in (0, 1) for c in cstrides) and K % cv == 0 and all(
            a.ptr % (cv * a.dtype.itemsize) == 0 and all(s % cv == 0 for s in rs)
            for a, c, rs in zip(ins, cstrides, rstrides) if c == 1)
        grid, G, chunk = layout.cols_tile_grid(K, R, cv, self.sms, self.rows_per_lane(K, R))
        meta = [K, R, chunk, len(rshape) - pad, *rshape, *(s for rs in rstrides for s in rs),
                *cstrides, int(vec)]
        return grid, G, K, tuple(shape), tuple(meta)

    def thunk(self) -> Callable[[], None]:
        in_cells, out_cells, ctx, plans = self.in_cells, self.out_cells, self.ctx, self.plans
        plan_for, kern, out_dtypes, acc_dtypes = self.plan, self.kernel, self.out_dtypes, \
            self.acc_dtypes
        n_map = sum(self.op.kept)
        reuse = [False] * len(out_cells)   # graph_plan.mark_reusable_outputs sets them
        block = (32, 8, 1)

        def thunk() -> None:
            ctx.activate()
            ins = [c[0] for c in in_cells]
            # (the 16-byte alignment too: it decides whether the plan reads vectors)
            key = tuple([a.shape + a.strides + (a.ptr & 15,) for a in ins])
            got = plans.get(key)
            if got is None:
                got = plans[key] = plan_for(ins)
            grid, G, K, shape, meta = got
            outs = []
            for n, (cell, dt, keep) in enumerate(zip(out_cells, out_dtypes, reuse)):
                want = shape if n < n_map else shape[-1:]
                o = cell[0]
                if not keep or o is None or o.shape != want or o.dtype != dt:
                    o = new_array(ctx, want, dt)
                outs.append(o)
            parts = ([new_array(ctx, (G * K,), dt) for dt in acc_dtypes] if G > 1 else [])
            if K:
                kern(grid, block, *meta, *[a.ptr for a in ins], *[o.ptr for o in outs],
                     *([p.ptr for p in parts] or [0] * len(acc_dtypes)),
                     self.counter_ptr() if G > 1 else 0)
            for cell, o in zip(out_cells, outs):
                cell[0] = o

        thunk.col_group_thunk = self   # type: ignore[attr-defined]  (tests read plans)
        thunk.reuse_outputs = reuse    # type: ignore[attr-defined]
        return _capturable(thunk)
