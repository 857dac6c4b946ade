"""GpuElemwise: generated CUDA kernels for elementwise graphs (GpuCAReduce, the reductions, is in
careduce.py and still importable from here).

Why it looks like this (precompute each launch): compiling a node renders and
loads its module once; each call then only reads the input arrays' shapes and strides, looks
up a *plan* cached for exactly that layout (kernel, grid, fixed arguments), takes its output
from the pool (or reuses the one still in its cell when nobody else holds it) and launches on
the context's stream.  Kernel source comes from ``symgpu/gpu/runtime/codegen`` (templates filled from
the scalar table), never from strings here.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops.kernel_ops import (_as_gpu, _capturable, _context,  # noqa: F401
                                      _pad_inputs, _virtual_thunk)
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, host_from_gpu  # noqa: F401 (Theano's
# theano.gpuarray.elemwise.GpuDimShuffle: symgpu.gpuarray.elemwise is this module)
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import c_strides, new_array
from symgpu.gpu.runtime.codegen import launch, layout
from symgpu.gpu.runtime.codegen.elemwise import (ElemwiseSignature, render_elemwise,
                                                 rowcol_kernel_name, strided_kernel_name)
from symgpu.gpu.runtime.codegen.scalar import output_dtypes
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.composite import Composite
from symgpu.tensor.elemwise import Elemwise as _Elemwise
from symgpu.tensor.rewriting.elemwise import MAX_FUSED_INPUTS

__all__ = ["GpuElemwise", "GpuCAReduce", "gpu_elemwise", "cast_target", "new_array",
           "BLOCK", "max_inputs_to_GpuElemwise", "KERNEL_PARAM_BYTES"]

BLOCK = 256                 # threads per block of elementwise kernels
MAX_GRID = (1 << 31) - 1    # blocks of a contiguous kernel (gridDim.x's limit; loops beyond)
#: blocks per multiprocessor of the vector kernel (sg_contig_vec: a grid-stride loop, four
#: vectors in flight): four waves of 256-thread blocks at full occupancy on Hopper
VEC_BLOCKS_PER_SM = 32


# ----------------------------------------------------------------------------- GpuElemwise

#: the bytes of kernel parameters a launch may pass (CUDA 12.1+ on sm_70 and later)
KERNEL_PARAM_BYTES = 32764


def max_inputs_to_GpuElemwise(node_or_outputs: Apply | Sequence[Variable]) -> int:
    """The most inputs one GpuElemwise kernel with these outputs (an Apply's, or a list of
    variables) takes (Theano's rule of the same name): what fits the strided kernel's
    parameters -- an index, the shape, and per operand a pointer and its strides, all 8-byte
    (codegen/elemwise.cu) -- capped by the fusion's MAX_FUSED_INPUTS."""
    outputs = node_or_outputs.outputs if isinstance(node_or_outputs, Apply) \
        else list(node_or_outputs)
    nd = outputs[0].type.ndim
    per_operand = 8 + 8 * nd                       # pointer + strides
    mandatory = 8 + 8 * nd + len(outputs) * per_operand   # n, shape, the outputs
    return max(0, min(MAX_FUSED_INPUTS, (KERNEL_PARAM_BYTES - mandatory) // per_operand))


class GpuElemwise(Op):
    """A scalar op (table row or fused Composite) over broadcast GPU arrays, as one kernel.

    ``inplace_pattern`` maps an output index to the input it overwrites."""

    __props__ = ("scalar_op", "inplace_pattern")

    def __init__(self, scalar_op: Any, inplace_pattern: dict[int, int] | None = None,
                 name: str | None = None):
        self.scalar_op = scalar_op
        self.inplace_pattern = tuple(sorted(dict(inplace_pattern or {}).items()))
        self.destroy_map = {o: [i] for o, i in self.inplace_pattern}
        self.name = name
        self.nout = getattr(scalar_op, "nout", 1)

    def __str__(self) -> str:
        if self.name:
            return self.name
        if self.inplace_pattern:
            return f"GpuElemwise{{{self.scalar_op}}}{list(self.inplace_pattern)}"
        if isinstance(self.scalar_op, Composite):   # a fused graph: as Elemwise's
            return f"GpuElemwise{{{self.scalar_op}}}"
        return f"GpuElemwise{{{self.scalar_op},no_inplace}}"

    infer_shape = _Elemwise.infer_shape

    def make_node(self, *inputs: Any) -> Apply:
        padded, ctx_name = _pad_inputs(inputs)
        nd = padded[0].ndim if padded else 0
        bcast = tuple(all(p.broadcastable[d] for p in padded) for d in range(nd))
        outs = output_dtypes(self.scalar_op, [p.dtype for p in padded])
        for o, i in self.inplace_pattern:
            inp = padded[i]
            if inp.dtype != outs[o] or inp.broadcastable != bcast:
                raise TypeError(f"{self}: input {i} ({inp.type}) cannot hold output {o} "
                                f"({outs[o]}, broadcastable {bcast}) in place")
        return Apply(self, padded, [GpuArrayType(d, bcast, ctx_name)() for d in outs])

    def signature(self, node: Apply) -> ElemwiseSignature:
        """The key of this node's kernel module."""
        return ElemwiseSignature(self.scalar_op, tuple(v.dtype for v in node.inputs),
                                 tuple(all(v.broadcastable) for v in node.inputs),
                                 node.outputs[0].ndim)

    def kernel_sources(self, node: Apply) -> list[tuple[Any, str]]:
        """(key, CUDA source) of every module this node can launch (CI compiles them)."""
        sig = self.signature(node)
        return [(("symgpu.elemwise", sig), render_elemwise(sig, str(self)))]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """(key, source factory, options) of the module make_thunk loads, so symgpu/gpu/
        prefetch.py can compile it in parallel with the function's other kernels."""
        sig = self.signature(node)
        return [(("symgpu.elemwise", sig), lambda: render_elemwise(sig, str(self)), ())]

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _ElemwiseThunk(self, node, storage_map, ctx).thunk()

    def grad(self, inputs, output_grads):
        host_in = [host_from_gpu(x) for x in inputs]
        grads = _Elemwise(self.scalar_op).grad(host_in, [host_from_gpu(g) for g in output_grads])
        return [None if g is None else _as_gpu(g, x.type.context_name)
                for g, x in zip(grads, inputs)]


def cast_target(node: Any) -> str | None:
    """The dtype a GpuElemwise cast node (not in place, one input, no broadcast added) casts
    to, or None for any other node (the GPU rewrites that fold a cast into a kernel)."""
    if not isinstance(node, Apply) or type(node.op) is not GpuElemwise or \
            node.op.inplace_pattern or not isinstance(node.op.scalar_op, Cast) or \
            len(node.inputs) != 1 or \
            node.inputs[0].broadcastable != node.outputs[0].broadcastable:
        return None
    return node.outputs[0].dtype


def gpu_elemwise(scalar_op: Any, *inputs: Any) -> Variable:
    """Build ``GpuElemwise(scalar_op)(*inputs)`` (a table name works for ``scalar_op``)."""
    if isinstance(scalar_op, str):
        scalar_op = SCALAR_OPS[scalar_op]
    return GpuElemwise(scalar_op)(*inputs)


class _ElemwisePlan:
    """One layout's launch: kernel(s), grid, fixed argument prefix, output shape/strides."""

    __slots__ = ("out_shape", "out_strides", "n", "contig", "rowcol", "grid", "grid_vec",
                 "prefix", "launch", "launch_vec", "align_mask", "inplace_ok", "checked")


class _ElemwiseThunk:
    """Builds and runs the plans of one GpuElemwise node."""

    #: tuning knob (read when a plan is made): False sends row/column layouts to the strided
    #: kernel (benchmarks/gpu_rowcol.py times both)
    ROWCOL = True

    def __init__(self, op: GpuElemwise, node: Apply, storage_map: dict, ctx: Any) -> None:
        self.op, self.node, self.ctx = op, node, ctx
        self.sig = sig = op.signature(node)
        self.in_cells = [storage_map[v] for v in node.inputs]
        self.out_cells = [storage_map[v] for v in node.outputs]
        self.in_dtypes = [np.dtype(v.dtype) for v in node.inputs]
        self.out_dtypes = [np.dtype(v.dtype) for v in node.outputs]
        self.scalar = list(sig.scalar_inputs)
        self.inplace = dict(op.inplace_pattern)
        self.max_blocks = 8 * launch.sm_count(ctx)  # strided kernels: a wave at 256 threads/block
        self.max_vec_blocks = VEC_BLOCKS_PER_SM * launch.sm_count(ctx)
        nd = max(sig.ndim, 1)
        formats = {"sg_contig": "q" + "P" * (len(self.in_cells) + len(self.out_cells))}
        formats["sg_contig_vec"] = formats["sg_contig"]
        nfull = sig.n_full
        for d in range(1, nd + 1):
            ptrs = "P" * (len(self.in_cells) + len(self.out_cells))
            formats[strided_kernel_name(d, False)] = "I" * (1 + d + nfull * d) + ptrs
            formats[strided_kernel_name(d, True)] = "q" * (1 + d + nfull * d) + ptrs
        for wide, c in ((False, "I"), (True, "q")):   # R, C, rs[nfull], cs[nfull], pointers
            for vec in (False, True):
                formats[rowcol_kernel_name(vec, wide)] = c * (2 + 2 * nfull) + ptrs
        self.kernels = launch.load_kernels(ctx, ("symgpu.elemwise", sig),
                                    lambda: render_elemwise(sig, str(op)), formats)
        self.launchers = {name: k.fast_launcher() for name, k in self.kernels.items()}
        self.plans: dict[tuple, _ElemwisePlan] = {}

    # -- planning (once per layout)
    def plan(self, ins: list) -> _ElemwisePlan:
        shapes = [a.shape for a in ins]
        out_shape = layout.broadcast_shapes(shapes, str(self.op))
        n = 1
        for s in out_shape:
            n *= s
        p = _ElemwisePlan()
        p.out_shape, p.n = out_shape, n
        p.out_strides = tuple(layout_c_strides(out_shape, self.out_dtypes[0].itemsize))
        # in-place only where the destroyed input has exactly the output's shape and no
        # broadcast (zero) strides over a dimension longer than one
        p.inplace_ok = all(ins[i].shape == out_shape and all(
            s != 0 or n_ == 1 for n_, s in zip(ins[i].shape, ins[i].strides))
            for i in self.inplace.values())
        full = [i for i in range(len(ins)) if not self.scalar[i]]
        contig = all(ins[i].shape == out_shape and layout.c_contiguous(
            ins[i].shape, ins[i].strides, ins[i].dtype.itemsize) for i in full)
        if self.inplace and p.inplace_ok:
            contig = contig and all(
                layout.c_contiguous(ins[i].shape, ins[i].strides, ins[i].dtype.itemsize)
                for i in self.inplace.values())
        p.rowcol = False
        if contig or n <= 1:
            p.contig = True
            p.prefix = (n,)
            # the scalar kernel: a thread per element, the grid covering the array (a
            # one-wave grid-stride grid left an H100 at 2.49 TB/s on the fused chain, 2.99
            # with this one); the vector kernel: a vector per thread up to four waves of
            # blocks, then each thread loops with four vectors in flight (the H200 ran the
            # chain at 3.39 TB/s with a vector per thread over the whole array, 3.91 with
            # this: benchmarks/gpu_kernels.py --chain)
            p.grid = (max(1, min(MAX_GRID, -(-n // BLOCK))), 1, 1)
            p.grid_vec = (max(1, min(self.max_vec_blocks, -(-n // (4 * BLOCK)))), 1, 1)
            p.launch = self.launchers["sg_contig"]
            p.launch_vec = self.launchers["sg_contig_vec"]
            masks = [4 * d.itemsize - 1 for i, d in enumerate(self.in_dtypes) if not self.scalar[i]]
            masks += [4 * d.itemsize - 1 for d in self.out_dtypes]
            p.align_mask = max(masks) if masks else 0
            p.checked = tuple(full) + tuple(range(len(ins), len(ins) + len(self.out_dtypes)))
            return p
        strides = [layout.element_strides(ins[i].shape, ins[i].strides, ins[i].dtype.itemsize,
                                          out_shape) for i in full]
        for j, d in enumerate(self.out_dtypes):
            src = ins[self.inplace[j]] if j in self.inplace and p.inplace_ok else None
            if src is not None:
                strides.append(layout.element_strides(src.shape, src.strides, d.itemsize,
                                                      out_shape))
            else:
                strides.append([s // d.itemsize for s in layout_c_strides(out_shape, d.itemsize)])
        cshape, cstr = layout.collapse(out_shape, strides)
        p.contig = False
        rc = layout.row_col(cshape, cstr, len(self.out_dtypes)) if self.ROWCOL else None
        if rc is not None:
            return self._plan_row_col(p, rc, full, len(ins), cshape, cstr)
        nd = len(cshape)
        grid = max(1, min(self.max_blocks, -(-n // BLOCK)))
        wide = not layout.fits_32bit(n, grid * BLOCK, cshape, cstr)
        p.grid = (grid, 1, 1)
        p.prefix = (n, *cshape, *[s for st in cstr for s in st])
        p.launch = self.launchers[strided_kernel_name(nd, wide)]
        return p

    def _plan_row_col(self, p: _ElemwisePlan, rc: tuple, full: list[int], n_in: int,
                      cshape: list[int], cstr: list[list[int]]) -> _ElemwisePlan:
        """A layout of (R, C) row/column broadcasts (layout.row_col): sg_rowcol_vec where
        C % 4 == 0 (when, at the call, every vector operand is aligned), else sg_rowcol;
        grids as sg_contig_vec's, at most VEC_BLOCKS_PER_SM blocks per SM (each thread
        divides once, then steps through its positions)."""
        R, C, rs, cs = rc
        n = p.n
        wide = not layout.fits_32bit(n, 4 * self.max_vec_blocks * BLOCK, cshape, cstr)
        p.rowcol = True
        p.prefix = (R, C, *rs, *cs)
        p.grid = (max(1, min(self.max_vec_blocks, -(-n // BLOCK))), 1, 1)
        p.launch = self.launchers[rowcol_kernel_name(False, wide)]
        n_full_in = len(full)
        # pointers read or written as vectors: inputs along C (cs 1), every output
        p.checked = tuple(full[k] for k in range(n_full_in) if cs[k]) + \
            tuple(range(n_in, n_in + len(self.out_dtypes)))
        if C % 4:
            p.grid_vec, p.launch_vec, p.align_mask = p.grid, p.launch, 0
            return p
        p.grid_vec = (max(1, min(self.max_vec_blocks, -(-n // (4 * BLOCK)))), 1, 1)
        p.launch_vec = self.launchers[rowcol_kernel_name(True, wide)]
        masks = [4 * self.in_dtypes[full[k]].itemsize - 1 for k in range(n_full_in) if cs[k]]
        p.align_mask = max(masks + [4 * d.itemsize - 1 for d in self.out_dtypes])
        return p

    # -- the per-call path
    def thunk(self) -> Callable[[], None]:
        in_cells, out_cells, ctx = self.in_cells, self.out_cells, self.ctx
        plans, plan_for, out_dtypes = self.plans, self.plan, self.out_dtypes
        inplace = self.inplace
        activate = ctx.activate
        n_out = len(out_cells)
        reuse = [False] * n_out   # graph_plan.mark_reusable_outputs sets them
        into = [None] * n_out     # graph_segment sets them for one capture (write_into)

        def thunk() -> None:
            activate()
            ins = [c[0] for c in in_cells]
            key = tuple([a.shape + a.strides for a in ins])
            p = plans.get(key)
            if p is None:
                p = plans[key] = plan_for(ins)
            if p.n == 0 and not inplace:
                for cell, dt in zip(out_cells, out_dtypes):
                    cell[0] = new_array(ctx, p.out_shape, dt)
                return
            outs = []
            for j in range(n_out):
                cell = out_cells[j]
                target = into[j]
                if target is not None and _fits(target, p, out_dtypes[j],
                                                j in inplace and p.inplace_ok):
                    out = target
                elif j in inplace and p.inplace_ok:
                    out = ins[inplace[j]]
                elif reuse[j] and cell[0] is not None and cell[0].shape == p.out_shape and \
                        cell[0].dtype == out_dtypes[j]:
                    out = cell[0]
                else:
                    out = new_array(ctx, p.out_shape, out_dtypes[j], p.out_strides
                                    if out_dtypes[j].itemsize == out_dtypes[0].itemsize else None)
                outs.append(out)
            if p.n:
                ptrs = [a.ptr for a in ins] + [o.ptr for o in outs]
                if p.contig or p.rowcol:
                    mask = p.align_mask
                    aligned = True
                    for k in p.checked:
                        if ptrs[k] & mask:
                            aligned = False
                            break
                    if aligned:
                        p.launch_vec(p.grid_vec, (BLOCK, 1, 1), *p.prefix, *ptrs)
                    else:
                        p.launch(p.grid, (BLOCK, 1, 1), *p.prefix, *ptrs)
                else:
                    p.launch(p.grid, (BLOCK, 1, 1), *p.prefix, *ptrs)
            for j in range(n_out):
                out_cells[j][0] = outs[j]

        if len(in_cells) == 1 and n_out == 1 and not inplace and not self.scalar[0]:
            return _capturable(self._unary_thunk())
        thunk.reuse_outputs = reuse   # type: ignore[attr-defined]
        thunk.write_into = into       # type: ignore[attr-defined]
        return _capturable(thunk)

    def _unary_thunk(self) -> Callable[[], None]:
        """The common one-input, one-output case with every lookup hoisted (check1's exp)."""
        (in_cell,), (out_cell,) = self.in_cells, self.out_cells
        ctx, plans, plan_for = self.ctx, self.plans, self.plan
        out_dtype = self.out_dtypes[0]
        activate = ctx.activate
        block = (BLOCK, 1, 1)
        # the last layout seen: shape, strides, then the plan's fields
        last: list = [None, None, None, None, 0, 0]
        reuse = [False]   # graph_plan.mark_reusable_outputs sets it
        into = [None]     # graph_segment sets it for one capture (write_into)

        def replan(x: Any) -> None:
            key = (x.shape + x.strides,)
            p = plans.get(key)
            if p is None:
                p = plans[key] = plan_for([x])
            last[:] = [x.shape, x.strides, p, p.out_shape, p.out_strides,
                       p.n * out_dtype.itemsize]

        def thunk() -> None:
            activate()
            x = in_cell[0]
            if x.shape != last[0] or x.strides != last[1]:
                replan(x)
            p = last[2]
            target = into[0]
            if target is not None and _fits(target, p, out_dtype, False):
                out = target
            else:
                out = out_cell[0]
                if not reuse[0] or out is None or out.shape != last[3]:
                    out = new_array(ctx, last[3], out_dtype, last[4], last[5])
            if p.n:
                xp, op_ = x.ptr, out.ptr
                if not (p.contig or p.rowcol):
                    p.launch(p.grid, block, *p.prefix, xp, op_)
                elif (xp | op_) & p.align_mask:
                    p.launch(p.grid, block, *p.prefix, xp, op_)
                else:
                    p.launch_vec(p.grid_vec, block, *p.prefix, xp, op_)
            out_cell[0] = out

        thunk.reuse_outputs = reuse   # type: ignore[attr-defined]
        thunk.write_into = into       # type: ignore[attr-defined]
        return thunk


def _fits(target: Any, p: _ElemwisePlan, dtype: np.dtype, inplace: bool) -> bool:
    """Whether an output of plan ``p`` may be computed into ``target`` (a ``write_into``
    entry: graph_segment.Segment writes an update straight into its variable's buffer): the
    output's shape and dtype, and C-contiguous, the layout the plan writes (a strided plan
    writes an in-place output with its input's strides, so then only a contiguous or a
    row/column plan, whose outputs are C-contiguous)."""
    return target.shape == p.out_shape and target.dtype == dtype and \
        target.is_c_contiguous and p.n > 0 and (p.contig or p.rowcol or not inplace)


def layout_c_strides(shape: tuple, itemsize: int) -> tuple:
    return c_strides(shape, itemsize)


# GpuCAReduce lives in careduce.py; its old path stays (symgpu.gpuarray.elemwise is this module)
from symgpu.gpu.ops.careduce import GpuCAReduce, careduce_supported  # noqa: E402,F401
from symgpu.gpu.ops.careduce import _order_reduced, _ReduceThunk  # noqa: E402,F401
