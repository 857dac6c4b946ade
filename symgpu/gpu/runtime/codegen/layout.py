"""Index geometry for launches, in plain Python (tested on the CPU): broadcasting operand
shapes, collapsing dimensions, and casting a reduction as (K kept, R reduced) positions.

Why collapse: a kernel's per-element cost is one division per dimension; merging dimensions
that are contiguous in every operand (and dropping length-1 ones) turns most real layouts into
one or two dimensions, and C-contiguous ones into the contiguous fast path.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["broadcast_shapes", "element_strides", "collapse", "ReducePlan", "plan_reduction",
           "c_contiguous", "fits_32bit", "row_col", "cols_tile_grid"]


def broadcast_shapes(shapes: Sequence[tuple[int, ...]], what: str = "elementwise op") -> tuple[int, ...]:
    """The common shape of same-ndim operands (each dim: equal, or 1); ValueError naming all
    shapes otherwise."""
    nd = len(shapes[0]) if shapes else 0
    out = []
    for d in range(nd):
        size = 1
        for s in shapes:
            n = s[d]
            if n != 1:
                if size != 1 and n != size:
                    raise ValueError(f"{what}: input shapes {', '.join(map(str, shapes))} do not "
                                     f"broadcast (dimension {d}: {size} vs {n})")
                size = n
        out.append(size)
    return tuple(out)


def element_strides(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
                    out_shape: tuple[int, ...]) -> list[int]:
    """Strides in elements of an operand read at ``out_shape``: 0 where it is broadcast."""
    res = []
    for n, s, o in zip(shape, strides, out_shape):
        if n == 1 and o != 1:
            res.append(0)
        else:
            if s % itemsize:
                raise ValueError(f"byte stride {s} is not a multiple of the item size {itemsize}")
            res.append(s // itemsize if n != 1 else 0)
    return res


def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """NumPy's C-contiguity (length-1 dims may have any stride)."""
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 0:
            return True
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]
             ) -> tuple[list[int], list[list[int]]]:
    """Drop length-1 dims and merge neighbours contiguous in every operand.

    ``strides[k]`` are operand k's element strides.  Returns (shape, strides) with at least
    one dimension (``[1]`` and zero strides for a single element)."""
    out_shape: list[int] = []
    out_str: list[list[int]] = [[] for _ in strides]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if out_shape and all(os[-1] == n * s[d] for os, s in zip(out_str, strides)):
            out_shape[-1] *= n
            for os, s in zip(out_str, strides):
                os[-1] = s[d]
        else:
            out_shape.append(n)
            for os, s in zip(out_str, strides):
                os.append(s[d])
    if not out_shape:
        return [1], [[0] for _ in strides]
    return out_shape, out_str


def fits_32bit(n: int, step: int, shape: Sequence[int], strides: Sequence[Sequence[int]]) -> bool:
    """Whether unsigned 32-bit index arithmetic is exact: the loop index (plus one grid step)
    and every operand's largest offset stay below 2**32."""
    limit = 1 << 32
    if n + step >= limit or any(x >= limit for x in shape):
        return False
    for st in strides:
        if any(s < 0 or s >= limit for s in st):
            return False
        if sum((sz - 1) * s for sz, s in zip(shape, st)) >= limit:
            return False
    return True


def row_col(shape: Sequence[int], strides: Sequence[Sequence[int]], n_out: int
            ) -> tuple[int, int, list[int], list[int]] | None:
    """The (R, C) view of a collapsed iteration space for the row/column kernels
    (elemwise.cu's ``sg_rowcol*``), or None where it does not fit.

    ``strides`` are the collapsed element strides of every full operand, the last ``n_out``
    of them the outputs'.  Fits: two dimensions (R, C) whose outputs are C-contiguous
    (strides (C, 1)) and whose inputs are each C-contiguous, a row vector (0, 1), a column
    vector (1, 0) or one value (0, 0); or one dimension (R = 1) whose outputs have stride 1
    and inputs stride 1 or 0.  Returns (R, C, rs, cs): per operand, the elements between
    rows and between columns."""
    if len(shape) == 1:
        R, C = 1, shape[0]
        pairs = [(C * s[0], s[0]) for s in strides]
        if any(s[0] not in (0, 1) for s in strides):
            return None
    elif len(shape) == 2:
        R, C = shape
        pairs = [(s[0], s[1]) for s in strides]
        if any(pr not in ((C, 1), (0, 1), (1, 0), (0, 0)) for pr in pairs):
            return None
    else:
        return None
    if any(pr != (C, 1) for pr in pairs[len(pairs) - n_out:]):
        return None
    return R, C, [pr[0] for pr in pairs], [pr[1] for pr in pairs]


class ReducePlan:
    """How one reduction launch looks: K kept positions of R values each, the collapsed
    kept/reduced shapes and per-operand strides, the strategy and the launch geometry."""

    __slots__ = ("K", "R", "kshape", "rshape", "kstrides", "rstrides", "strategy", "grid",
                 "block", "chunk", "G", "finish_grid", "out_shape", "kernel", "lead")

    def __repr__(self) -> str:
        return (f"ReducePlan(K={self.K}, R={self.R}, kshape={self.kshape}, rshape={self.rshape}, "
                f"strategy={self.strategy}, grid={self.grid}, block={self.block}, G={self.G}, "
                f"kernel={self.kernel})")

    @property
    def knd(self) -> int:
        return len(self.kshape)

    @property
    def rnd(self) -> int:
        return len(self.rshape)

    def meta(self) -> list[int]:
        """kshape, rshape, kstride[op][d], rstride[op][d] flattened (reduce.cu's sg_rmeta)."""
        out = list(self.kshape) + list(self.rshape)
        for s in self.kstrides:
            out += s
        for s in self.rstrides:
            out += s
        return out


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def lead_operand(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> int:
    """The operand whose memory order a reduction follows: the one holding the most distinct
    values (the fewest broadcast dims), the first of equals.  A fused pre-op may read a
    per-row statistic first, say ``(8, 1024, 1)`` beside the ``(8, 1024, 768)`` gradient;
    walking that one's order would stride through the big one."""
    def values(s: Sequence[int]) -> int:
        n = 1
        for d, e in enumerate(shape):
            if s[d] != 0:
                n *= e
        return n
    sizes = [values(s) for s in strides]
    return sizes.index(max(sizes)) if sizes else 0


def plan_reduction(shape: tuple[int, ...], strides: Sequence[Sequence[int]],
                   axes: Sequence[int], sm_count: int, lead: int = 0) -> ReducePlan:
    """Plan reducing ``axes`` of an iteration space ``shape`` read by operands with element
    ``strides`` (0 where broadcast), coalescing the reads of operand ``lead``."""
    kept = [d for d in range(len(shape)) if d not in axes]
    red = [d for d in range(len(shape)) if d in axes]
    kshape, kstr = collapse([shape[d] for d in kept], [[s[d] for d in kept] for s in strides])
    rshape, rstr = collapse([shape[d] for d in red], [[s[d] for d in red] for s in strides])
    p = ReducePlan()
    p.K = 1
    for d in kept:
        p.K *= shape[d]
    p.R = 1
    for d in red:
        p.R *= shape[d]
    p.kshape, p.rshape, p.kstrides, p.rstrides = kshape, rshape, kstr, rstr
    p.out_shape = tuple(shape[d] for d in kept)
    # operand ``lead`` decides which axis the threads of a warp walk along (coalescing)
    p.lead = lead
    k_inner = abs(kstr[lead][-1]) if p.K > 1 else None
    r_inner = abs(rstr[lead][-1]) if p.R > 1 else None
    if r_inner == 1 or k_inner is None:
        strategy = "rows"
    elif k_inner == 1:
        strategy = "cols"
    else:
        strategy = "rows" if (r_inner or 0) <= k_inner else "cols"
    target = 8 * sm_count      # a full wave of 256-thread blocks
    if strategy == "rows":
        tx, ty = (256, 1) if p.R >= 4096 or p.K < 2 * sm_count else (32, 8)
        kb = _ceil(p.K, ty)
        per_block = tx * 16
        p.block = (tx, ty, 1)
    else:
        kb = _ceil(p.K, 32)
        per_block = 8 * 16
        p.block = (32, 8, 1)
    g = 1 if kb >= target else max(1, min(_ceil(target, max(kb, 1)), _ceil(p.R, per_block), 65535))
    p.chunk = _ceil(p.R, g) if p.R else 0
    p.G = _ceil(p.R, p.chunk) if p.chunk else 1
    p.strategy = strategy
    p.kernel = None      # set by the thunk that launches the plan
    p.grid = (max(1, min(kb, 16 * sm_count)), p.G, 1)
    p.finish_grid = (max(1, min(_ceil(p.K, 8), 16 * sm_count)), 1, 1)
    return p


def cols_tile_grid(K: int, R: int, cols_vector: int, sm_count: int, min_rows_per_lane: int
                   ) -> tuple[tuple[int, int, int], int, int]:
    """(grid, G, chunk) of reduce.cu's ``sg_cols_tile`` over K columns of R rows: blocks of
    32 x 8 threads over tiles of ``32 * cols_vector`` columns, R split into G row tiles of
    ``chunk`` rows so that about a full wave of 256-thread blocks (8 per multiprocessor)
    runs, each of the 8 row lanes of a block taking at least ``min_rows_per_lane`` rows
    (fewer, longer lanes where the columns alone fill the GPU); the grid's x is capped at 16
    blocks per multiprocessor (the one-pass counters: one per blockIdx.x)."""
    tiles = _ceil(K, 32 * cols_vector)
    g = max(1, min(_ceil(8 * sm_count, tiles), _ceil(R, 8 * max(1, min_rows_per_lane)), 65535))
    chunk = _ceil(R, g) if R else 0
    g = _ceil(R, chunk) if chunk else 1
    return (max(1, min(tiles, 16 * sm_count)), g, 1), g, chunk
