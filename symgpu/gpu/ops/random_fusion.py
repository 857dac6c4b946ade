"""Random numbers generated inside the elementwise kernel that consumes them.

`GpuPhiloxElemwise` is a GpuElemwise one of whose inputs is a Philox draw: each thread
computes one Philox block in registers and applies the fused scalar op to its 4 (float32,
float16, bfloat16: drawn in float32 and rounded to the draw's dtype) or 2 (float64) elements, so a dropout mask or a noise term costs no pass over memory. The pass
`gpu_philox_fusion` (position 62: after gpu_fusion and the reduction fusion, before the
in-place pass) rewrites every GpuElemwise that reads a GpuPhiloxSample output of its own
shape into one; a draw read by several kernels (dropout's forward and backward) is generated
again by each, the same numbers every time (the counter is a pure function of the state).

The numbers are those of symgpu/gpu/ops/random.py (element i of the output reads element i of
the draw). Layouts the kernel does not take (a draw smaller than the output, broadcast at run
time; strides that are not whole elements) fall back to the draw kernel plus the plain
GpuElemwise, with the same results.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops import elemwise as elemwise_ops
from symgpu.gpu.ops.elemwise import GpuElemwise, _virtual_thunk
from symgpu.gpu.ops.random import (GPU_RANDOM_DTYPES, GpuPhiloxAdvance, GpuPhiloxSample,
                                   PHILOX_CUDA, _MODULE_KEY, grid_for, random_source,
                                   sample_kernel_name)
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import common_source, launch, layout, sections
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.basic import _as_int_scalar

__all__ = ["GpuPhiloxElemwise", "render_philox_elemwise", "gpu_philox_fusion"]

_BLOCK = 256

#: one Philox block's elements of an operand, moved as one aligned access
_CU = sections("random_fusion.cu")   # packing helpers, then the entry point
_PACK_CUDA = _CU[""].substitute()


#: the largest value below 1 of each half dtype (as float literals; philox.py's _BELOW_ONE)
HALF_BELOW_ONE = {"float16": 1 - 2.0 ** -11, "bfloat16": 1 - 2.0 ** -8}


def render_philox_elemwise(scalar_op: Any, in_dtypes: Sequence[str], scalar_inputs: Sequence[bool],
                           sample_pos: int, dist: str, ndim: int, advance: bool = False) -> str:
    """The CUDA module of a GpuPhiloxElemwise: `sg_philox_ew_contig` (every full operand
    C-contiguous in the output's shape; a thread's 4 (float32 draws) or 2 (float64) elements
    are loaded and stored as one aligned access per operand where the pointers allow) and
    `sg_philox_ew_strided` (element strides, 0 where broadcast, over `ndim` dimensions).

    `in_dtypes`/`scalar_inputs` describe the elementwise op's inputs, the draw included at
    `sample_pos` (its dtype is the draw's). With `advance` the kernels take a last argument
    `st_next`, where one thread writes the state after the draw (GpuPhiloxAdvance's numbers:
    the counter moved on by the draw's blocks), into a buffer of its own: other threads still
    read `st`."""
    in_dtypes, scalar_inputs = list(in_dtypes), list(scalar_inputs)
    dtype = in_dtypes[sample_pos]
    vt, per = GPU_RANDOM_DTYPES[dtype]
    apply_src, outs = render_apply_function(scalar_op, in_dtypes, scalar_inputs)
    others = [i for i in range(len(in_dtypes)) if i != sample_pos]
    full = [i for i in others if not scalar_inputs[i]]
    nd = max(ndim, 1)
    ptrs = [f"const {storage_ctype(in_dtypes[i])} *in{i}" for i in others]
    ptrs += [f"{storage_ctype(d)} *out{j}" for j, d in enumerate(outs)]
    dims = [f"long long d{k}" for k in range(nd)]
    strides = [f"long long s{i}_{k}" for i in full for k in range(nd)]
    hoist = [f"    const {value_ctype(in_dtypes[i])} c{i} = sg_load(in{i}[0]);"
             for i in others if scalar_inputs[i]]

    # a half draw is made in float32 and rounded, as the draw kernel stores it: the fused op
    # reads the numbers the unfused graph (and the CPU) would
    # (a half uniform kept at its largest value below 1, as the draw kernel and the CPU keep it)
    drawn = "v[u]" if value_ctype(dtype) == storage_ctype(dtype) else \
        f"sg_round<{storage_ctype(dtype)}>(v[u])"
    if drawn != "v[u]" and dist == "uniform":
        drawn = f"fminf({drawn}, {HALF_BELOW_ONE[dtype]!r}f)"

    def args_with(load: Callable[[int], str]) -> str:
        args = []
        for i in range(len(in_dtypes)):
            if i == sample_pos:
                args.append(drawn)
            elif scalar_inputs[i]:
                args.append(f"c{i}")
            else:
                args.append(load(i))
        return ", ".join(args + [f"r{j}" for j in range(len(outs))])

    def vector_step() -> list[str]:
        """A whole Philox block's elements moved as one aligned access per operand (the
        contiguous kernel, when every pointer is aligned to it): thread b's elements
        b*per .. b*per+per-1 are adjacent in every operand."""
        pack = [f"sg_rpack<{storage_ctype(in_dtypes[i])}, {per}>" for i in range(len(in_dtypes))]
        opack = [f"sg_rpack<{storage_ctype(d)}, {per}>" for d in outs]
        return [
            f"        const long long i0 = b * {per};",
            f"        if (vec && i0 + {per} <= n) {{",
            *[f"            const {pack[i]} p{i} = "
              f"*reinterpret_cast<const {pack[i]} *>(in{i} + i0);" for i in full],
            *[f"            {opack[j]} q{j};" for j in range(len(outs))],
            "#pragma unroll",
            f"            for (int u = 0; u < {per}; ++u) {{",
            *[f"                {value_ctype(d)} r{j};" for j, d in enumerate(outs)],
            f"                sg_apply({args_with(lambda i: f'sg_load(p{i}.v[u])')});",
            *[f"                sg_store(q{j}.v[u], r{j});" for j in range(len(outs))],
            "            }",
            *[f"            *reinterpret_cast<{opack[j]} *>(out{j} + i0) = q{j};"
              for j in range(len(outs))],
            "            continue;",
            "        }"]

    def body(offset_of: Callable[[int], str], prologue: list[str], vector: bool) -> str:
        aligned = [f"sg_rp_aligned<{per}>(in{i})" for i in full] + \
            [f"sg_rp_aligned<{per}>(out{j})" for j in range(len(outs))]
        lines = [*hoist,
                 *([f"    const bool vec = {' && '.join(aligned)};"] if vector else []),
                 *block_loop_head(),
                 *(vector_step() if vector else row_step()),
                 *element_step(offset_of, prologue), "    }"]
        return "\n".join(lines)

    def block_loop_head() -> list[str]:
        return [f"    const long long nb = (n + {per} - 1) / {per};",
                "    const long long step = (long long)gridDim.x * blockDim.x;",
                "    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb;"
                " b += step) {",
                f"        {vt} v[{per}];",
                f"        sg_philox_values(st, (unsigned long long)b, "
                f"{'true' if dist == 'normal' else 'false'}, v);"]

    def element_step(offset_of: Callable[[int], str], prologue: list[str]) -> list[str]:
        """Each element on its own: the part block at the end, or (strided kernel) a block
        that runs across the end of the last dimension."""
        return ["#pragma unroll",
                f"        for (int u = 0; u < {per}; ++u) {{",
                f"            const long long i = b * {per} + u;",
                "            if (i < n) {",
                *["            " + p for p in prologue],
                *[f"            {value_ctype(d)} r{j};" for j, d in enumerate(outs)],
                f"            sg_apply({args_with(lambda i: f'sg_load(in{i}[{offset_of(i)}])')});",
                *[f"            sg_store(out{j}[i], r{j});" for j in range(len(outs))],
                "            }", "        }"]

    last = nd - 1

    def unravel(index: str, first: str) -> list[str]:
        """Offsets o<i> of element `index` in every full operand, from its coordinates (the
        outermost one needs no division; sg_rdiv divides in 32 bits where the values fit);
        `first` is the statement run with x = the coordinate along the last dimension."""
        code = [f"long long rem = {index};", *[f"long long o{i} = 0;" for i in full]]
        for k in reversed(range(nd)):
            coord = "rem" if k == 0 else f"rem - q * d{k}"
            step = "" if k == 0 else f"const long long q = sg_rdiv(rem, d{k}); "
            code.append(f"{{ {step}const long long x = {coord};"
                        + ("" if k == 0 else " rem = q;")
                        + "".join(f" o{i} += x * s{i}_{k};" for i in full)
                        + (f" {first}" if k == last and first else "") + " }")
        return code

    def row_step() -> list[str]:
        """The strided kernel's common case: a thread's block lies along the last dimension
        (the offsets of i0 computed once, element u at o + u * the last stride), operands
        with unit last stride read as one aligned access where the address allows (a
        row-broadcast bias: strides (0, 1)), outputs (C-contiguous) written as one."""
        pack = [f"sg_rpack<{storage_ctype(in_dtypes[i])}, {per}>" for i in range(len(in_dtypes))]
        opack = [f"sg_rpack<{storage_ctype(d)}, {per}>" for d in outs]
        loads = []
        for i in full:
            loads += [f"            {pack[i]} p{i};",
                      f"            if (s{i}_{last} == 1 && sg_rp_aligned<{per}>(in{i} + o{i})) {{",
                      f"                p{i} = *reinterpret_cast<const {pack[i]} *>(in{i} + o{i});",
                      "            } else {",
                      "#pragma unroll",
                      f"                for (int u = 0; u < {per}; ++u) "
                      f"p{i}.v[u] = in{i}[o{i} + u * s{i}_{last}];",
                      "            }"]
        stores = []
        for j in range(len(outs)):
            stores += [
                "            if (ovec) {",
                f"                *reinterpret_cast<{opack[j]} *>(out{j} + i0) = q{j};",
                "            } else {",
                "#pragma unroll",
                f"                for (int u = 0; u < {per}; ++u) out{j}[i0 + u] = q{j}.v[u];",
                "            }"]
        return [
            f"        const long long i0 = b * {per};",
            "        long long xl;",
            *["        " + c for c in unravel("i0", "xl = x;")],
            f"        if (i0 + {per} <= n && xl + {per} <= d{last}) {{",
            *loads,
            *[f"            {opack[j]} q{j};" for j in range(len(outs))],
            "#pragma unroll",
            f"            for (int u = 0; u < {per}; ++u) {{",
            *[f"                {value_ctype(d)} r{j};" for j, d in enumerate(outs)],
            f"                sg_apply({args_with(lambda i: f'sg_load(p{i}.v[u])')});",
            *[f"                sg_store(q{j}.v[u], r{j});" for j in range(len(outs))],
            "            }",
            *stores,
            "            continue;",
            "        }"]

    next_state = [
        "    if (blockIdx.x == 0 && threadIdx.x == 0) {",
        f"        const unsigned long long c = ((((unsigned long long)st[3]) << 32) | st[2]) "
        f"+ (unsigned long long)((n + {per} - 1) / {per});",
        "        st_next[0] = st[0]; st_next[1] = st[1];",
        "        st_next[2] = (unsigned int)c; st_next[3] = (unsigned int)(c >> 32);",
        "    }"] if advance else []
    tail = ["unsigned int *st_next"] if advance else []
    contig = "\n".join([*next_state, body(lambda i: "i", [], vector=True)])
    oaligned = [f"sg_rp_aligned<{per}>(out{j})" for j in range(len(outs))]
    strided = "\n".join([*next_state, f"    const bool ovec = {' && '.join(oaligned)};",
                         body(lambda i: f"o{i}", unravel("i", ""), vector=False)])
    sig_contig = ", ".join(["const unsigned int *st", "long long n", *ptrs, *tail])
    sig_strided = ", ".join(["const unsigned int *st", "long long n", *dims, *strides, *ptrs,
                             *tail])
    return "\n".join([
        f"/* symgpu: Philox {dist} {dtype} draw fused into {str(scalar_op).replace('*/', '* /')} */",
        common_source(), PHILOX_CUDA, _PACK_CUDA, apply_src,
        _entry("contig", sig_contig), "{", contig, "}",
        _entry("strided", sig_strided), "{", strided, "}"])


def _entry(kind: str, signature: str) -> str:
    return _CU["entry"].substitute(kind=kind, signature=signature).rstrip("\n")


class GpuPhiloxElemwise(Op):
    """GpuElemwise(scalar_op) with input `sample_pos` a Philox draw made in the kernel.

    Inputs: (state, *size (ndim int scalars), *the elementwise op's other inputs)."""

    __props__ = ("scalar_op", "sample_pos", "dist", "dtype", "ndim", "advance")

    def __init__(self, scalar_op: Any, sample_pos: int, dist: str, dtype: str, ndim: int,
                 advance: bool = False):
        if dtype not in GPU_RANDOM_DTYPES:
            raise ValueError(f"GpuPhiloxElemwise: no kernel for draws of {dtype}")
        self.scalar_op, self.sample_pos = scalar_op, int(sample_pos)
        self.dist, self.dtype, self.ndim = dist, dtype, int(ndim)
        #: a last output, the state after the draw (GpuPhiloxAdvance's), written by the kernel
        self.advance = bool(advance)

    def __str__(self) -> str:
        adv = ",advance" if self.advance else ""
        return f"GpuPhiloxElemwise{{{self.dist},{self.dtype},{self.scalar_op}{adv}}}"

    def make_node(self, state: Any, *rest: Any) -> Apply:
        size = [_as_int_scalar(s, f"{self}: size entry") for s in rest[: self.ndim]]
        others = list(rest[self.ndim:])
        draw = GpuPhiloxSample(self.dist, self.dtype, state.type.context_name)(state, *size)
        ins = others[: self.sample_pos] + [draw] + others[self.sample_pos:]
        for v in others:
            if not isinstance(v.type, GpuArrayType) or v.ndim != self.ndim:
                raise TypeError(f"{self}: every other input must be a GPU array of "
                                f"{self.ndim} dimensions, got {v} ({v.type})")
        outs = output_dtypes(self.scalar_op, [v.dtype for v in ins])
        bcast = draw.broadcastable
        ctx_name = state.type.context_name
        state = draw.owner.inputs[0]
        extra = [state.type()] if self.advance else []
        return Apply(self, [state, *size, *others],
                     [GpuArrayType(d, bcast, ctx_name)() for d in outs] + extra)

    def _layout(self, node: Apply) -> tuple[list[str], list[bool]]:
        others = node.inputs[1 + self.ndim:]
        dtypes = [v.dtype for v in others]
        scal = [all(v.broadcastable) for v in others]
        dtypes.insert(self.sample_pos, self.dtype)
        scal.insert(self.sample_pos, False)
        return dtypes, scal

    def _key(self, node: Apply) -> tuple:
        dtypes, scal = self._layout(node)
        return ("symgpu.philox_elemwise", self.scalar_op, tuple(dtypes), tuple(scal),
                self.sample_pos, self.dist, self.ndim, self.advance)

    def _source(self, node: Apply) -> Callable[[], str]:
        dtypes, scal = self._layout(node)
        return lambda: render_philox_elemwise(self.scalar_op, dtypes, scal, self.sample_pos,
                                              self.dist, self.ndim, self.advance)

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return [(self._key(node), self._source(node), ()), (_MODULE_KEY, random_source, ())]

    def infer_shape(self, fgraph, node, input_shapes):
        n_ew = len(node.outputs) - self.advance
        return [tuple(node.inputs[1:1 + self.ndim])] * n_ew + \
            ([input_shapes[0]] if self.advance else [])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = elemwise_ops._context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        return _PhiloxElemwiseThunk(self, node, storage_map, ctx).thunk()


class _PhiloxElemwiseThunk:
    """The per-call path of one GpuPhiloxElemwise node, with its fallback."""

    def __init__(self, op: GpuPhiloxElemwise, node: Apply, storage_map: dict, ctx: Any):
        self.op, self.ctx = op, ctx
        nd = op.ndim
        self.st_cell = storage_map[node.inputs[0]]
        self.size_cells = [storage_map[v] for v in node.inputs[1:1 + nd]]
        self.other_cells = [storage_map[v] for v in node.inputs[1 + nd:]]
        n_ew = len(node.outputs) - op.advance
        self.out_cells = [storage_map[v] for v in node.outputs[:n_ew]]
        self.out_dtypes = [np.dtype(v.dtype) for v in node.outputs[:n_ew]]
        #: the state after the draw (op.advance), else None
        self.next_cell = storage_map[node.outputs[-1]] if op.advance else None
        dtypes, scal = op._layout(node)
        # indices (among the other inputs) of those read per element, not as one scalar
        self.full = [k for k in range(len(self.other_cells))
                     if not scal[k if k < op.sample_pos else k + 1]]
        nptr = len(self.other_cells) + len(self.out_cells) + op.advance
        formats = {"sg_philox_ew_contig": "Pq" + "P" * nptr,
                   "sg_philox_ew_strided": "Pq" + "q" * (max(nd, 1) * (1 + len(self.full)))
                   + "P" * nptr}
        kernels = launch.load_kernels(ctx, op._key(node), op._source(node), formats)
        self.contig = kernels["sg_philox_ew_contig"].fast_launcher()
        self.strided = kernels["sg_philox_ew_strided"].fast_launcher()
        self.per = GPU_RANDOM_DTYPES[op.dtype][1]
        self.fallback = _Fallback(op, node, ctx)

    def thunk(self) -> Callable[[], None]:
        op, ctx, per, full = self.op, self.ctx, self.per, self.full
        st_cell, size_cells, other_cells = self.st_cell, self.size_cells, self.other_cells
        out_cells, out_dtypes, nd = self.out_cells, self.out_dtypes, max(op.ndim, 1)
        contig_launch, strided_launch, fallback = self.contig, self.strided, self.fallback
        block = (_BLOCK, 1, 1)
        next_cell, u32 = self.next_cell, np.dtype("uint32")

        def thunk() -> None:
            ctx.activate()
            st = st_cell[0]
            shape = tuple(int(c[0]) for c in size_cells)
            others = [c[0] for c in other_cells]
            out_shape = layout.broadcast_shapes([shape] + [a.shape for a in others], str(op))
            if out_shape != shape or any(s % a.dtype.itemsize for a in others for s in a.strides) \
                    or any(s < 0 for s in shape) or tuple(st.shape) != (4,):
                fallback(st, shape, others, out_cells, next_cell)
                return
            n = 1
            for s in shape:
                n *= s
            outs = [new_array(ctx, shape, d) for d in out_dtypes]
            nxt = []
            if next_cell is not None:
                nxt = [new_array(ctx, (4,), u32)]
                next_cell[0] = nxt[0]
                if not n:                # no kernel runs: the state does not move
                    nxt[0]._copy_from_device(st)
            if n:
                ptrs = [a.ptr for a in others] + [o.ptr for o in outs] + [a.ptr for a in nxt]
                grid = grid_for(ctx, -(-n // per))
                if all(others[k].shape == shape and layout.c_contiguous(
                        others[k].shape, others[k].strides, others[k].dtype.itemsize)
                        for k in full):
                    contig_launch(grid, block, st.ptr, n, *ptrs)
                else:
                    dims = list(shape) if shape else [1]
                    strides = []
                    for k in full:
                        a = others[k]
                        strides += layout.element_strides(a.shape, a.strides, a.dtype.itemsize,
                                                          shape) or [0]
                    strided_launch(grid, block, st.ptr, n, *dims[:nd], *strides, *ptrs)
            for cell, o in zip(out_cells, outs):
                cell[0] = o

        thunk.launches = True     # type: ignore[attr-defined]
        thunk.capturable = True   # type: ignore[attr-defined]
        return thunk


class _Fallback:
    """The draw into a temporary array, then the plain GpuElemwise (built on first use)."""

    def __init__(self, op: GpuPhiloxElemwise, node: Apply, ctx: Any):
        self.op, self.node, self.ctx = op, node, ctx
        self.run: Callable[..., None] | None = None

    def __call__(self, st: Any, shape: tuple, others: list, out_cells: list,
                 next_cell: list | None = None) -> None:
        if self.run is None:
            self.run = self._build()
        self.run(st, shape, others, out_cells, next_cell)

    def _build(self) -> Callable[..., None]:
        op, node = self.op, self.node
        nd = op.ndim
        state = node.inputs[0].type()
        size = [v.type() for v in node.inputs[1:1 + nd]]
        others = [v.type() for v in node.inputs[1 + nd:]]
        draw = GpuPhiloxSample(op.dist, op.dtype, state.type.context_name)(state, *size)
        ins = others[: op.sample_pos] + [draw] + others[op.sample_pos:]
        ew = GpuElemwise(op.scalar_op)(*ins)
        outs = ew if isinstance(ew, list) else [ew]
        storage: dict[Variable, list] = {v: [None] for v in [state, *size, *others, draw, *outs]}
        draw_thunk = draw.owner.op.make_thunk(draw.owner, storage, {}, [])
        ew_thunk = outs[0].owner.op.make_thunk(outs[0].owner, storage, {}, [])
        adv_thunk = adv = None
        if op.advance:
            adv = GpuPhiloxAdvance(op.dtype, state.type.context_name)(state, *size)
            storage[adv] = [None]
            adv_thunk = adv.owner.op.make_thunk(adv.owner, storage, {}, [])

        def run(st: Any, shape: tuple, vals: list, out_cells: list,
                next_cell: list | None) -> None:
            storage[state][0] = st
            for v, s in zip(size, shape):
                storage[v][0] = np.int64(s)
            for v, a in zip(others, vals):
                storage[v][0] = a
            draw_thunk()
            ew_thunk()
            if adv_thunk is not None and next_cell is not None:
                adv_thunk()
                next_cell[0], storage[adv][0] = storage[adv][0], None
            for cell, o in zip(out_cells, outs):
                cell[0] = storage[o][0]
                storage[o][0] = None
            storage[draw][0] = None
        return run


# ----------------------------------------------------------------------------- the pass

def _fusable(fgraph: FunctionGraph, draw: Variable, client: Any) -> bool:
    if client == "output" or type(client.op) is not GpuElemwise or client.op.inplace_pattern:
        return False
    return (client.inputs.count(draw) == 1 and client.outputs[0].broadcastable == draw.broadcastable
            and all(v.ndim == draw.ndim for v in client.inputs))


def gpu_philox_fusion(fgraph: FunctionGraph) -> int:
    """Replace each GpuElemwise reading a GpuPhiloxSample of its own shape by a
    GpuPhiloxElemwise generating the draw in its kernel; returns how many were replaced."""
    changed = 0
    for node in list(fgraph.toposort()):
        if type(node.op) is not GpuPhiloxSample or node not in fgraph.apply_nodes:
            continue
        draw = node.outputs[0]
        for client, _ in list(fgraph.clients.get(draw, [])):
            if not _fusable(fgraph, draw, client):
                continue
            pos = client.inputs.index(draw)
            others = [v for k, v in enumerate(client.inputs) if k != pos]
            new = GpuPhiloxElemwise(client.op.scalar_op, pos, node.op.dist, node.op.dtype,
                                    draw.ndim)(node.inputs[0], *node.inputs[1:], *others)
            new = new if isinstance(new, list) else [new]
            fgraph.replace_all(list(zip(client.outputs, new)), reason="gpu_philox_fusion")
            changed += 1
    return changed


optdb.register("gpu_philox_fusion", gpu_philox_fusion, 62, "fast_run", "fusion", "gpu")


# ----------------------------------------------------------------------------- the advance

def _same_size(a: Variable, b: Variable) -> bool:
    """Whether two size entries are one variable, or equal constants."""
    if a is b:
        return True
    ca, cb = getattr(a, "data", None), getattr(b, "data", None)
    return ca is not None and cb is not None and np.array_equal(ca, cb)


def local_philox_advance_fusion(fgraph: FunctionGraph,
                                node: Apply) -> list[tuple[Variable, Variable]] | None:
    """GpuPhiloxAdvance(st, *size) beside GpuPhiloxElemwise(st, *size, ..) of the same draw:
    the fused kernel writes the next state too (one launch less). Returns the replacements
    of both nodes' outputs by the new node's."""
    if type(node.op) is not GpuPhiloxAdvance:
        return None
    st, size = node.inputs[0], node.inputs[1:]
    for client, _ in fgraph.clients.get(st, []):
        if client == "output" or type(client.op) is not GpuPhiloxElemwise:
            continue
        op = client.op
        if op.advance or op.dtype != node.op.dtype or client.inputs[0] is not st or \
                op.ndim != len(size) or \
                not all(_same_size(a, b) for a, b in zip(client.inputs[1:1 + op.ndim], size)):
            continue
        new = GpuPhiloxElemwise(op.scalar_op, op.sample_pos, op.dist, op.dtype, op.ndim,
                                advance=True)(*client.inputs)
        return list(zip(client.outputs, new[:-1])) + [(node.outputs[0], new[-1])]
    return None


def gpu_philox_advance_fusion(fgraph: FunctionGraph) -> int:
    """Fold each GpuPhiloxAdvance into the fused draw of the same state and size; returns how
    many. In the default passes (fast_run): measured on an H200 (a dropout MLP's step 237.9 ->
    227.0 us, with gpu_careduce_epilogue and gpu_take_rows);
    ``optimizer_excluding=gpu_philox_advance_fusion`` turns it off."""
    return sweep(fgraph, local_philox_advance_fusion, "gpu_philox_advance_fusion")


# after gpu_philox_fusion (62), which makes the fused draws
optdb.register("gpu_philox_advance_fusion", gpu_philox_advance_fusion, 62.5, "fast_run", "gpu")
