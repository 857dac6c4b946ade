"""Fused attention on the GPU: GpuAttention and GpuAttentionGrad, lifted from the host ops of
symgpu/tensor/nnet/attention.py (same inputs, outputs and semantics: see that module).

The kernels (runtime/codegen/attention.cu) are FlashAttention-2's: the forward keeps one
block of query rows per (batch, head) (``_TILES``: 64 rows, 4 warps), streams 64-key tiles of
K and V through shared memory (cp.async, two stages; operands read by ldmatrix), computes the
scores with mma.sync tensor-core products (m16n8k16 in float16/bfloat16, 3xTF32 m16n8k8 in
float32: float32's accuracy; 1xTF32 under ``gpuarray.allow_tf32``, PyTorch's and cuBLAS's
TF32 class), the softmax online in float32 (exp2 of pre-scaled scores), and writes o and the
rows' log-sum-exp; a causal mask skips the tiles above the diagonal and launches the longest
rows first. The backward runs one block per 64 keys, looping over the query blocks of 64 (the
next one prefetched): it recomputes P from the lse, keeps dK and dV in registers and adds dQ
into a float32 accumulator with atomics (a pre-pass computes Delta = rowsum(dO o) and zeroes
the accumulator; a last pass rounds it to the dtype, skipped in float32 where the
accumulator is dq itself).

On Hopper (a context of arch sm_90) the 16-bit module is built for sm_90a and also holds
FlashAttention-3-style kernels (runtime/codegen/attention_wgmma.cu): warpgroup products
(wgmma) on tiles stored in the 128-byte swizzle, P and dS fed from registers, dQ from dS^T in
shared memory; they take the calls without a mask, with a positive scale and d equal to the
head dim on 16-byte aligned rows (``_wgmma_runs``), the general kernels the rest.

Head dims up to 128 run (the kernels are instantiated for 64 and 128, smaller dims zero-padded
in shared memory); a larger head dim raises ValueError when the node runs (the head dim is
not part of a variable's type, so the lifter cannot know it: keep such graphs on the host
with ``optimizer_excluding=fuse_attention`` or by setting ``ENABLED = False`` here).
Every launch is on the context's stream, buffers come from the pool, nothing waits for the
device: both thunks are captured into CUDA graphs.
"""
from __future__ import annotations

import functools
import struct
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk
from symgpu.gpu.ops.random import PHILOX_CUDA
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, gpu_supports_dtype, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.wgmma import wgmma_source
from symgpu.gpu.runtime.compiler import get_kernel, get_prepared_kernel
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.nnet.attention import (DROPOUT_DRAWS, Attention, AttentionGrad, Dropout,
                                          as_dropout, check_shapes, grad_inputs)

__all__ = ["GpuAttention", "GpuAttentionGrad", "attention_source", "ATTENTION_DTYPES",
           "HEAD_DIMS", "ENABLED"]

#: dtype -> CUDA storage type of the kernels' instances
ATTENTION_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}
#: the head dims the kernels are instantiated for (a head dim runs in the smallest >= it)
HEAD_DIMS = (64, 128)
#: False: the lifter leaves attention on the host (read when a function is compiled)
ENABLED = True

_BN = 64                # attention.cu's AT_BN (the backward's keys per block); its AT_BM too
_THREADS = 128          # the backward's AT_THREADS
_CU = sections("attention.cu")
_BWD_CU = sections("attention_bwd.cu")   # the general backward, after attention.cu's code
_WG = sections("attention_wgmma.cu")
# AtArgs / AtBwdArgs of attention.cu, native alignment (the CUDA parameter layout)
_FWD = struct.Struct("@6P16q6ifiPdff")    # AtArgs, then AT_DROP_FIELDS
_BWD = struct.Struct("@10P22q6ifiPdff")   # AtBwdArgs, then AT_DROP_FIELDS
#: a dropout's draw dtype -> attention.cu's AT_DRAW_*
_DRAWS = {d: i + 1 for i, d in enumerate(DROPOUT_DRAWS)}
_PAD = 8                # shared-memory row padding in elements (attention.cu's LD = HD + 8)


class Tiles(NamedTuple):
    """One instance's tiling: the forward's query block is 16 * fwd_tiles * fwd_warps rows
    against fwd_keys keys a tile; two backward stages prefetch the next query block during the
    whole step, one during its dQ part; the min blocks are __launch_bounds__' (1: the
    compiler's choice of registers).  On Hopper 16-bit attention without a mask runs the
    wgmma kernels (attention_wgmma.cu): the forward where wg_fwd > 0 (wg_fwd warpgroups of
    64 rows against wg_keys keys a tile), the backward where wg_bwd > 0 (wg_bwd warpgroups
    of 64 keys against 64 * wg_bwd_queries queries a step: 1 or wg_bwd)."""
    fwd_warps: int
    fwd_tiles: int
    fwd_keys: int
    bwd_stages: int
    fwd_min_blocks: int = 1
    bwd_min_blocks: int = 1
    wg_fwd: int = 0
    wg_keys: int = 128
    wg_min_blocks: int = 1
    wg_bwd: int = 0
    wg_bwd_min_blocks: int = 1
    wg_bwd_queries: int = 1


#: (itemsize, head dim) -> Tiles, measured on the H200 (benchmarks/attention_variants.py,
#: B 8, H 12, S 1024, causal, bfloat16): forward 4 x 1 x 64 at 4 blocks per SM (128
#: registers) 90.5 us, against 97.5 with 153 registers and 3 blocks, 94 for 4 x 2 x 64, 92
#: for 4 x 1 x 128; backward two stages 228.5 us, one 232, two at 3 blocks per SM (170
#: registers) 243. float32 keeps one stage (two would leave one block per SM).
#: The Hopper (wgmma) kernels on the same shape: forward 2 warpgroups x 64 keys at 2 blocks
#: per SM (123 registers) 72.3 us, against 73.2 at 1, 76.4 for 2 x 128 at 2, 73.3 for 1 x 64
#: at 3, 83.9 for 3 x 128; backward 2 warpgroups against 128 queries a step 198 us (255
#: registers, no spill, 1 block per SM), against 64 queries 212-215 (204 registers), 1
#: warpgroup 221. Head dim 128 (float16, 4 x 16 x 1024 x 128): backward 2 warpgroups against
#: 64 queries 226 us, 1 260, the general kernel 309 (128 queries a step spill there); forward
#: 1 x 64 about 97, the general 113. float32 (3xTF32) on the GPT shape: forward 4 x 2 x 32
#: 406 us against 461 for 4 x 1 x 64 and 428 for 4 x 1 x 32; backward two stages 2701 us
#: against one 1592 (one block per SM); head dim 128 (4 x 16 x 1024 x 128) forward 4 x 1 x 32
#: 520 us against 669 for 4 x 1 x 64 (whose 174 KB leave one block per SM). (Measured before
#: the cheaper TF32 splits, which took the GPT shape's float32 fwd+bwd from 2.07 to 1.26 ms.)
#: All of these figures predate _grid's longest-first order: the Hopper forward 72.7 -> 59.9
#: us, backward 195 -> 172.8, float32 fwd+bwd 1.26 -> 0.93 ms.
_TILES = {(2, 64): Tiles(4, 1, 64, 2, fwd_min_blocks=4, wg_fwd=2, wg_keys=64, wg_min_blocks=2,
                         wg_bwd=2, wg_bwd_queries=2),
          (2, 128): Tiles(4, 1, 64, 2, wg_fwd=1, wg_keys=64, wg_bwd=2),
          (4, 64): Tiles(4, 2, 32, 1), (4, 128): Tiles(4, 1, 32, 1)}


def _itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _tiles(dtype: str, hd: int) -> Tiles:
    return _TILES[(_itemsize(dtype), hd)]


def _fast_tf32(dtype: str) -> bool:
    """float32 with ``gpuarray.allow_tf32``: one TF32 product instead of three (PyTorch's and
    cuBLAS's TF32 class of accuracy, as the GEMMs under that flag)."""
    return dtype == "float32" and bool(config.gpuarray.allow_tf32)


def attention_source(dtype: str, hd: int, fast_tf32: bool = False, hopper: bool = False
                     ) -> str:
    """The CUDA module of one (dtype, head dim[, 1xTF32]): its pre/dq kernels, forward and
    backward (one module per instance: a graph compiles only what it runs); ``hopper``: the
    wgmma kernels too, where the tiles enable them (``_wgmma_tiles``; the module is then
    built for sm_90a)."""
    ctype = ATTENTION_DTYPES[dtype]
    t = _tiles(dtype, hd)
    parts = [common_source(), PHILOX_CUDA, "#define AT_FAST_TF32\n" if fast_tf32 else "",
             _CU[""].substitute(), _BWD_CU[""].substitute(),
             _CU["dtype"].substitute(dtype=dtype, ctype=ctype),
             _CU["head"].substitute(dtype=dtype, ctype=ctype, hd=hd,
                                    fwd_threads=32 * t.fwd_warps,
                                    fwd_warps=t.fwd_warps, fwd_mt=t.fwd_tiles,
                                    fwd_bn=t.fwd_keys, bwd_stages=t.bwd_stages,
                                    fwd_min_blocks=t.fwd_min_blocks,
                                    bwd_min_blocks=t.bwd_min_blocks)]
    if hopper and _wgmma_tiles(dtype, hd):
        wg_bwd, qf = max(t.wg_bwd, 1), t.wg_bwd_queries
        dq_cols = hd if qf == wg_bwd > 1 else hd // wg_bwd
        parts += [wgmma_source((t.wg_keys, hd, 64 * qf, dq_cols)), _WG[""].substitute(),
                  _WG["head"].substitute(dtype=dtype, ctype=ctype, hd=hd,
                                         wg_threads=128 * max(t.wg_fwd, 1),
                                         wg_fwd=max(t.wg_fwd, 1), wg_keys=t.wg_keys,
                                         wg_min_blocks=t.wg_min_blocks,
                                         wg_bwd_threads=128 * wg_bwd, wg_bwd=wg_bwd,
                                         wg_bwd_min_blocks=t.wg_bwd_min_blocks,
                                         wg_bwd_queries=qf)]
    return "".join(parts)


def _wgmma_tiles(dtype: str, hd: int) -> bool:
    t = _tiles(dtype, hd)
    return dtype != "float32" and (t.wg_fwd > 0 or t.wg_bwd > 0)


def _wgmma_runs(arch: str | None, warpgroups: int, vec: bool, mask: Any, scale: float) -> bool:
    """Whether a wgmma kernel of ``warpgroups`` (the tiles' wg_fwd or wg_bwd) takes this
    call: a module built for Hopper (``arch``, ``_arch``'s: 16-bit on sm_90), no mask, a
    positive scale, d == hd and rows 16-byte aligned (``vec``)."""
    return (arch is not None and warpgroups > 0 and vec and mask is None and scale > 0)


def _hopper(ctx: Any) -> bool:
    """Whether ``ctx``'s modules may use sm_90a's wgmma (built for ``sm_90a``)."""
    return getattr(ctx, "arch", None) == "sm_90"


def _arch(ctx: Any, dtype: str, hd: int) -> str | None:
    """The nvcc target of (dtype, hd)'s module on ctx: sm_90a where it holds wgmma kernels."""
    return "sm_90a" if _hopper(ctx) and _wgmma_tiles(dtype, hd) else None


def _source(dtype: str, hd: int, fast: bool, hopper: bool = False) -> Callable[[], str]:
    return lambda: attention_source(dtype, hd, fast, hopper)


def _head(op: Any, d: int, shapes: str) -> int:
    for hd in HEAD_DIMS:
        if d <= hd:
            return hd
    raise ValueError(f"{op}: head dim {d} is larger than the GPU kernels' {HEAD_DIMS[-1]} "
                     f"({shapes}); compile with optimizer_excluding=fuse_attention to run the "
                     "unfused graph instead")


def _fwd_rows(dtype: str, hd: int) -> int:
    t = _tiles(dtype, hd)
    return 16 * t.fwd_tiles * t.fwd_warps


def _fwd_smem(dtype: str, hd: int) -> int:
    """Q's block and two stages of K and V tiles."""
    rows = _fwd_rows(dtype, hd) + 4 * _tiles(dtype, hd).fwd_keys
    return rows * (hd + _PAD) * _itemsize(dtype)


def _wg_fwd_smem(dtype: str, hd: int) -> int:
    """The wgmma forward's Q block and two stages of K and V tiles (unpadded: swizzled), and
    1024 bytes to align them to the swizzle's atoms."""
    t = _tiles(dtype, hd)
    return (64 * t.wg_fwd + 4 * t.wg_keys) * hd * 2 + 1024


def _wg_bwd_smem(dtype: str, hd: int) -> int:
    """The wgmma backward's K and V (64 keys a warpgroup), two stages of Q, dO, lse and Delta
    (64 * wg_bwd_queries rows), dS^T, and 1024 bytes of alignment."""
    t = _tiles(dtype, hd)
    keys, rows = 64 * t.wg_bwd, 64 * t.wg_bwd_queries
    return (2 * keys * hd + 4 * rows * hd + keys * rows) * 2 + 4 * rows * 4 + 1024


def _bwd_smem(dtype: str, hd: int) -> int:
    stages, isz = _tiles(dtype, hd).bwd_stages, _itemsize(dtype)
    return (((2 + 2 * stages) * _BN * (hd + _PAD) + _BN * (_BN + _PAD)) * isz +
            2 * stages * _BN * 4)


_big_smem: set = set()


class _Module(NamedTuple):
    """One (dtype, head dim) module on a context: its cache key, source and nvcc target."""
    key: tuple
    source: Callable[[], str]
    arch: str | None


def _module(ctx: Any, dtype: str, hd: int) -> _Module:
    return _module_of(_arch(ctx, dtype, hd), dtype, hd, _fast_tf32(dtype), _tiles(dtype, hd))


@functools.lru_cache(maxsize=None)
def _module_of(arch: str | None, dtype: str, hd: int, fast: bool, tiles: Tiles) -> _Module:
    """(memoised: a launch asks for its module on every plain call)"""
    hopper = arch is not None
    return _Module(("symgpu.attention", dtype, hd, fast, hopper, tiles),
                   _source(dtype, hd, fast, hopper), arch)


def _prepared(ctx: Any, dtype: str, hd: int, name: str, signature: str) -> Any:
    m = _module(ctx, dtype, hd)
    return get_prepared_kernel(m.key, m.source, name, signature, context=ctx, arch=m.arch)


def _kernel(ctx: Any, m: _Module, name: str, smem: int) -> Any:
    """The PyCUDA Function ``name`` of module ``m``, allowed ``smem`` bytes of dynamic shared
    memory (past 48 KB the driver wants the attribute set first)."""
    fn = get_kernel(m.key, m.source, name, context=ctx, arch=m.arch)
    key = (id(fn), smem)
    if key not in _big_smem:
        import pycuda.driver as drv   # deferred: PyCUDA loads with the GPU path only
        if smem > 48 * 1024:
            fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        # all of L1 as shared memory: else the driver may size the carveout for one block
        fn.set_attribute(drv.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
        _big_smem.add(key)
    return fn


def _grid(rows: int, per_block: int, bh: int) -> tuple[int, int, int]:
    """The forward's or backward's grid: (batch * heads, row blocks), so that every (batch,
    head)'s block 0 launches before any block 1. The kernels give block 0 the most work under
    a causal mask (the forward its last query block, the backward its first key block): the
    longest blocks start first and the shortest fill the end."""
    blocks = -(-rows // per_block)
    if blocks > 65535:
        raise ValueError(f"attention: {rows} rows make {blocks} blocks of {per_block}, past "
                         f"the 65535 a CUDA grid holds")
    return (bh, blocks, 1)


class _Launch(NamedTuple):
    """One step's kernel for a call: its Function, dynamic shared memory, query rows (forward)
    or keys (backward) per block, and threads per block."""
    fn: Any
    smem: int
    per_block: int
    threads: int


class _Plan(NamedTuple):
    """_Launch's fields that the tiles fix: the kernel's name in place of its Function."""
    name: str
    smem: int
    per_block: int
    threads: int


@functools.lru_cache(maxsize=None)
def _step_plans(dtype: str, hd: int, step: str, tiles: Tiles) -> tuple[_Plan, _Plan, _Plan]:
    """(the Hopper kernel's plan, the general kernel's, the general dropout kernel's) of
    ``step`` ("fwd" or "bwd"); memoised: a launch asks on every plain call."""
    t = tiles
    wg = max(t.wg_fwd if step == "fwd" else t.wg_bwd, 1)
    hopper = _Plan(f"attn_{step}_wg_{dtype}_{hd}",
                   (_wg_fwd_smem if step == "fwd" else _wg_bwd_smem)(dtype, hd), 64 * wg,
                   128 * wg)
    if step == "fwd":
        general = _Plan(f"attn_fwd_{dtype}_{hd}", _fwd_smem(dtype, hd), _fwd_rows(dtype, hd),
                        32 * t.fwd_warps)
    else:
        general = _Plan(f"attn_bwd_{dtype}_{hd}", _bwd_smem(dtype, hd), _BN, _THREADS)
    return hopper, general, general._replace(name=f"attn_{step}_drop_{dtype}_{hd}")


def _launch_plan(ctx: Any, dtype: str, hd: int, step: str, vec: bool, mask: Any,
                 scale: float, drop: bool = False) -> _Launch:
    """The kernel of ``step`` ("fwd" or "bwd") for a call: under a dropout the general one
    that draws it (the Hopper ones draw none), else the Hopper one where it takes the call
    (``_wgmma_runs``), else the general one."""
    t, m = _tiles(dtype, hd), _module(ctx, dtype, hd)
    hopper, general, dropout = _step_plans(dtype, hd, step, t)
    wg = t.wg_fwd if step == "fwd" else t.wg_bwd
    p = dropout if drop else hopper if _wgmma_runs(m.arch, wg, vec, mask, scale) else general
    return _Launch(_kernel(ctx, m, p.name, p.smem), p.smem, p.per_block, p.threads)


def _elem_strides(op: Any, x: Any, what: str) -> tuple[Any, tuple[int, ...]]:
    """x (copied C-contiguous where its last axis is not unit-stride) and its strides in
    elements."""
    isz = x.dtype.itemsize
    if any(s % isz for s in x.strides) or (x.shape[-1] > 1 and x.strides[-1] != isz):
        x = x.copy()
    return x, tuple(s // isz for s in x.strides)


def _heads_merged(ctx: Any, shape: tuple, dtype: np.dtype) -> Any:
    """A new (B, H, S, d) array stored as (B, S, H, d) (3-d shapes: C-contiguous).

    Why: users merge the heads with ``o.dimshuffle(0, 2, 1, 3).reshape((B, S, H * d))``
    before the output projection (and the gradients of q, k, v sliced from one product are
    merged the same way); in this layout that dimshuffle is C-contiguous, so the reshape is
    a view, not a strided copy of the whole activation (four of them in a GPT block's
    step).  The kernels take every output's strides."""
    if len(shape) != 4:
        return new_array(ctx, shape, dtype)
    _, H, S, d = shape
    isz = dtype.itemsize
    return new_array(ctx, shape, dtype, (S * H * d * isz, d * isz, H * d * isz, isz))


def _lead(strides: tuple[int, ...], ndim: int) -> tuple[int, int, int]:
    """(batch stride, head stride, row stride) of a 3-d (bh, s, d) or 4-d array."""
    if ndim == 3:
        return strides[0], 0, strides[1]
    return strides[0], strides[1], strides[2]


def _mask_strides(mask: Any, ndim: int, shape: tuple) -> tuple[Any, tuple[int, int, int, int]]:
    """The float32 mask and its (b, h, i, j) element strides, 0 along broadcast dims."""
    mask, st = _elem_strides(None, mask, "mask") if mask.size else (mask, (0,) * mask.ndim)
    full = (1,) * (ndim - mask.ndim) + tuple(mask.shape)
    st = (0,) * (ndim - mask.ndim) + st
    st = tuple(0 if n == 1 else s for n, s in zip(full, st))
    if ndim == 3:
        return mask, (st[0], 0, st[1], st[2])
    return mask, st


def _aligned(arrays: list, leads: list, itemsize: int) -> bool:
    """Whether every row of these arrays starts 16-byte aligned: aligned data and (batch,
    head, row) strides (``_lead``) of whole 16-byte chunks."""
    ch = 16 // itemsize
    return all(a.ptr % 16 == 0 for a in arrays) and all(s % ch == 0 for st in leads
                                                         for s in st)


def _row_blocks(rows: int, vec: bool) -> tuple[int, int]:
    """The grid of the pre and dq kernels (256 threads a block): a warp takes 4 rows at a
    time with 16-byte accesses (vec), else one."""
    return max(1, min(8192, -(-rows // (32 if vec else 8)))), 1


def _check(op: Any, q: Any, k: Any, v: Any, mask: Any) -> None:
    """The host op's shape checks, and the kernels' own need: v's head dim equal to q's."""
    check_shapes(op, q, k, v, mask)
    if v.shape != k.shape:
        raise ValueError(f"{op}: k {k.shape} and v {v.shape} differ; the GPU kernels need v's "
                         "head dim equal to q's")


def _scale(op: Any, d: int) -> float:
    return float(np.float32(1.0 / np.sqrt(d))) if op.scale is None else op.scale


class _GpuAttentionBase(Op):
    capturable = True   # pool allocations and launches on the stream (graphs.py)
    launches = True

    def __init__(self, causal: bool = False, scale: float | None = None,
                 has_mask: bool = False, has_dlse: bool = False,
                 dropout: Dropout | None = None) -> None:
        self.causal = bool(causal)
        self.scale = None if scale is None else float(scale)
        self.has_mask, self.has_dlse = bool(has_mask), bool(has_dlse)
        self.dropout = as_dropout(dropout)

    __str__ = Attention.__str__

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        """The head dim 64 module of the node's dtype (the common head dim; the head dim is
        known only when the node runs), for the link-time prefetch (gpu/exec/prefetch.py)."""
        m = _module(_context(node.outputs[0].type.context_name), node.inputs[0].dtype,
                    HEAD_DIMS[0])
        return [(m.key, m.source, (), m.arch)]

    def _gpu_inputs(self, inputs: list) -> tuple[list, Any]:
        ctx = next((x.type.context_name for x in inputs if is_gpu_var(x)), None)
        gins = [as_gpuarray_variable(x, ctx) for x in inputs]
        q = gins[0]
        if q.dtype not in ATTENTION_DTYPES or q.ndim not in (3, 4) or \
                any(x.dtype != q.dtype or x.ndim != q.ndim for x in gins[1:3]):
            raise TypeError(f"{self}: q, k, v must be 3-d or 4-d GPU arrays of one of "
                            f"{', '.join(ATTENTION_DTYPES)}, got "
                            f"{', '.join(str(x.type) for x in gins[:3])}")
        if self.has_mask and (gins[3].dtype != "float32" or gins[3].ndim > q.ndim):
            raise TypeError(f"{self}: the GPU kernels add a float32 mask of at most {q.ndim} "
                            f"dims, got {gins[3].type}")
        if self.dropout is not None:
            st = gins[3 + self.has_mask]
            if st.dtype != "uint32" or st.ndim != 1:
                raise TypeError(f"{self}: the dropout's generator state must be a uint32 "
                                f"vector, got {st.type}")
        return gins, ctx

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        outs = [storage_map[v] for v in node.outputs]

        def thunk() -> None:
            ctx.activate()
            results = self._run(ctx, *(c[0] for c in cells))
            for cell, value in zip(outs, results):
                cell[0] = value

        thunk.capturable = True    # type: ignore[attr-defined]
        thunk.launches = True      # type: ignore[attr-defined]
        return thunk


class GpuAttention(_GpuAttentionBase):
    """`Attention` on GPU arrays (float16, bfloat16, float32; 3-d or 4-d; a float32 mask; a
    dropout, drawn in the general kernels)."""

    __props__ = ("causal", "scale", "has_mask", "dropout")
    default_output = 0
    infer_shape = Attention.infer_shape

    def __init__(self, causal: bool = False, scale: float | None = None,
                 has_mask: bool = False, dropout: Dropout | None = None) -> None:
        super().__init__(causal, scale, has_mask, False, dropout)

    def make_node(self, q: Any, k: Any, v: Any, *extra: Any) -> Apply:
        """q, k, v, then the mask (has_mask) and the generator state (dropout)."""
        want = self.has_mask + (self.dropout is not None)
        if len(extra) != want:
            raise TypeError(f"{self} takes {3 + want} inputs, got {3 + len(extra)}")
        gins, ctx = self._gpu_inputs([q, k, v, *extra])
        q = gins[0]
        lead = q.broadcastable[:-2]
        o = GpuArrayType(q.dtype, lead + (q.broadcastable[-2], gins[2].broadcastable[-1]), ctx)()
        lse = GpuArrayType("float32", lead + (q.broadcastable[-2],), ctx)()
        return Apply(self, gins, [o, lse])

    def _run(self, ctx: Any, q: Any, k: Any, v: Any, *extra: Any) -> list[Any]:
        mask = extra[0] if self.has_mask else None
        _check(self, q, k, v, mask)
        nd, (sq, d), sk = q.ndim, q.shape[-2:], k.shape[-2]
        bh = int(np.prod(q.shape[:-2]))
        heads = q.shape[1] if nd == 4 else 1
        o = _heads_merged(ctx, q.shape, q.dtype)
        lse = new_array(ctx, q.shape[:-1], np.dtype("float32"))
        if bh == 0 or sq == 0:
            return [o, lse]
        hd = _head(self, d, f"q {q.shape}")
        q, qs = _elem_strides(self, q, "q")
        k, ks = _elem_strides(self, k, "k")
        v, vs = _elem_strides(self, v, "v")
        leads = [_lead(qs, nd), _lead(ks, nd), _lead(vs, nd)]
        if mask is not None:
            mask, ms = _mask_strides(mask, nd, mask.shape)
            mptr = mask.ptr
        else:
            ms, mptr = (0, 0, 0, 0), 0
        scale = _scale(self, d)
        vec = d == hd and _aligned([q, k, v], leads, q.dtype.itemsize)
        run = _launch_plan(ctx, q.dtype.name, hd, "fwd", vec, mask, scale,
                           self.dropout is not None)
        osz = o.dtype.itemsize
        olead = _lead(tuple(x // osz for x in o.strides), nd)
        buf = _FWD.pack(q.ptr, k.ptr, v.ptr, mptr, o.ptr, lse.ptr, *leads[0], *leads[1],
                        *leads[2], *ms, *olead, heads, sq, sk, d, int(self.causal), int(vec),
                        scale, *(_NO_DROP if self.dropout is None else
                                 _drop_fields(self, extra[-1])))
        run.fn._launch_kernel(_grid(sq, run.per_block, bh), (run.threads, 1, 1), buf,
                              run.smem, ctx.stream)
        return [o, lse]


class GpuAttentionGrad(_GpuAttentionBase):
    """`AttentionGrad` on GPU arrays: (dq, dk, dv), 4-d ones stored heads-merged
    (``_heads_merged``; a float32 dq, the kernels' accumulator, C-contiguous)."""

    __props__ = ("causal", "scale", "has_mask", "has_dlse", "dropout")
    infer_shape = AttentionGrad.infer_shape
    #: dq is summed over key tiles with float atomics, in any order: a CUDA graph of it is
    #: checked against the spread of two plain runs (graph_segment.Segment.nondeterministic)
    deterministic = False

    def make_node(self, *inputs: Any) -> Apply:
        want = 6 + self.has_mask + self.has_dlse + (self.dropout is not None)
        if len(inputs) != want:
            raise TypeError(f"{self} takes {want} inputs, got {len(inputs)}")
        gins, ctx = self._gpu_inputs(list(inputs))
        return Apply(self, gins, [x.type() for x in gins[:3]])

    def _run(self, ctx: Any, *inputs: Any) -> list[Any]:
        return grads_into(self, ctx, inputs)


def grads_into(op: Any, ctx: Any, inputs: Sequence[Any], outs: Sequence[Any] | None = None
               ) -> list[Any]:
    """[dq, dk, dv] of the attention gradient ``op`` (a GpuAttentionGrad's props) from its
    input arrays, written into ``outs`` (arrays of q's, k's and v's shapes in any layout whose
    last axis has unit stride; q and k not empty) or into new heads-merged arrays."""
    q, k, v, mask, o, lse, do, dlse = grad_inputs(op, inputs)
    _check(op, q, k, v, mask)
    nd, (sq, d), sk = q.ndim, q.shape[-2:], k.shape[-2]
    bh = int(np.prod(q.shape[:-2]))
    heads = q.shape[1] if nd == 4 else 1
    f32 = np.dtype("float32")
    if outs is not None:
        dq, dk, dv = outs
    else:
        dq = (new_array if q.dtype == f32 else _heads_merged)(ctx, q.shape, q.dtype)
        dk, dv = (_heads_merged(ctx, x.shape, x.dtype) for x in (k, v))
    if q.size == 0 or k.size == 0:
        for x in (dq, dk, dv):
            if x.size:
                x.fill(0)
        return [dq, dk, dv]
    hd = _head(op, d, f"q {q.shape}")
    q, qs = _elem_strides(op, q, "q")
    k, ks = _elem_strides(op, k, "k")
    v, vs = _elem_strides(op, v, "v")
    do, ds = _elem_strides(op, do, "do")
    o, os_ = _elem_strides(op, o, "o")
    if not lse.is_c_contiguous:
        lse = lse.copy()
    if dlse is not None and (not dlse.is_c_contiguous or dlse.dtype != f32):
        dlse = dlse.astype(f32) if dlse.dtype != f32 else dlse.copy()
    leads = [_lead(qs, nd), _lead(ks, nd), _lead(vs, nd), _lead(ds, nd)]
    if mask is not None:
        mask, ms = _mask_strides(mask, nd, mask.shape)
        mptr = mask.ptr
    else:
        ms, mptr = (0, 0, 0, 0), 0
    rows = bh * sq
    delta = new_array(ctx, (rows,), f32)
    acc = dq if q.dtype == f32 and dq.is_c_contiguous else new_array(ctx, q.shape, f32)
    name = q.dtype.name
    pre = _prepared(ctx, name, hd, f"attn_bwd_pre_{name}", "PqqqPqqqPPPiiiqi")
    isz = q.dtype.itemsize
    rows_vec = d % (16 // isz) == 0 and _aligned([o, do], [_lead(os_, nd), leads[3]], isz)
    pre.prepared_async_call(_row_blocks(rows, rows_vec), (256, 1, 1), ctx.stream, o.ptr,
                            *_lead(os_, nd), do.ptr, *leads[3],
                            dlse.ptr if dlse is not None else 0, delta.ptr, acc.ptr, heads,
                            sq, d, rows, int(rows_vec))
    vec = d == hd and _aligned([q, k, v, do], leads, q.dtype.itemsize)
    scale = _scale(op, d)
    run = _launch_plan(ctx, name, hd, "bwd", vec, mask, scale, op.dropout is not None)
    dkl, dvl = (_lead(tuple(s // isz for s in x.strides), nd) for x in (dk, dv))
    buf = _BWD.pack(q.ptr, k.ptr, v.ptr, do.ptr, mptr, lse.ptr, delta.ptr, acc.ptr, dk.ptr,
                    dv.ptr, *leads[0], *leads[1], *leads[2], *leads[3], *ms, *dkl, *dvl,
                    heads, sq, sk, d, int(op.causal), int(vec), scale,
                    *(_NO_DROP if op.dropout is None else
                      _drop_fields(op, inputs[3 + op.has_mask])))
    run.fn._launch_kernel(_grid(sk, run.per_block, bh), (run.threads, 1, 1), buf, run.smem,
                          ctx.stream)
    if acc is not dq:
        cvt = _prepared(ctx, name, hd, f"attn_bwd_dq_{name}", "PPqqqqiiii")
        dql = _lead(tuple(s // isz for s in dq.strides), nd)
        dq_vec = d % (16 // isz) == 0 and _aligned([dq], [dql], isz)
        cvt.prepared_async_call(_row_blocks(rows, dq_vec), (256, 1, 1), ctx.stream, acc.ptr,
                                dq.ptr, rows, *dql, heads, sq, d, int(dq_vec))
    return [dq, dk, dv]


_NO_DROP = (0, 0, 0.0, 0.0, 1.0)


@functools.lru_cache(maxsize=None)
def _drop_constants(dropout: Dropout) -> tuple[int, float, float, float]:
    """(AT_DRAW_*, keep, keep in the draw's type, 1 / div) of a dropout; memoised: a launch
    asks on every plain call."""
    return (_DRAWS[dropout.draw], dropout.keep, float(np.asarray(dropout.keep, dropout.draw)),
            1.0 / dropout.div)


def _drop_fields(op: Any, state: Any) -> tuple:
    """AT_DROP_FIELDS' values under ``op``'s dropout (_NO_DROP without one): (drop, state
    pointer, keep, keep in the draw's type, 1 / div)."""
    if state.shape != (4,) or not state.is_c_contiguous:
        raise ValueError(f"{op}: the generator state must hold 4 contiguous uint32 words, got "
                         f"shape {state.shape}")
    code, keep, keep_f, inv_div = _drop_constants(op.dropout)
    return (code, state.ptr, keep, keep_f, inv_div)


def _liftable(node: Apply) -> bool:
    q = node.inputs[0]
    mask_ok = not node.op.has_mask or node.inputs[3].dtype == "float32"
    return (ENABLED and q.dtype in ATTENTION_DTYPES and gpu_supports_dtype(q.dtype) and
            q.ndim in (3, 4) and mask_ok)


@register_lifter(Attention)
def lift_attention(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """Attention -> GpuAttention (float16/bfloat16/float32, 3-d or 4-d, float32 mask)."""
    if not _liftable(node):
        return None
    gin = [as_gpuarray_variable(x, context_name) for x in inputs]
    gop = GpuAttention(op.causal, op.scale, op.has_mask, op.dropout)
    return list(gop.make_node(*gin).outputs)


@register_lifter(AttentionGrad)
def lift_attention_grad(op: Any, node: Apply, context_name: Any,
                        inputs: Any) -> list[Any] | None:
    """AttentionGrad -> GpuAttentionGrad (as lift_attention; lse and dlse float32)."""
    if not _liftable(node):
        return None
    gin = [as_gpuarray_variable(x, context_name) for x in inputs]
    gop = GpuAttentionGrad(op.causal, op.scale, op.has_mask, op.has_dlse, op.dropout)
    return list(gop.make_node(*gin).outputs)
