"""Render a column group module (``col_group.cu``): one pass over (rows, columns) that writes an
elementwise map's outputs and reduces the leading dims of several members' values into one
value per column (a bias gradient summed while its gradient is computed).

Why apart from reduce.py: a group has several outputs of two shapes (full arrays and column
vectors) and one launch shape (column tiles, reduce.cu's ``sg_cols_tile`` layout), where
reduce.py plans every strategy for one reduction; each member's accumulator type, identity
and combine come from ``ReduceSignature``, so a member accumulates exactly as the
GpuCAReduce it replaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from symgpu.gpu.runtime.codegen import common_source, template
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, _combine, _identity
from symgpu.gpu.runtime.codegen.scalar import render_apply_function
from symgpu.gpu.runtime.codegen.types import acc_ctype_for, storage_ctype, value_ctype
from symgpu.scalar.composite import Composite, CompositeBuilder

__all__ = ["ColMember", "ColGroupSignature", "render_col_group", "col_group_formats",
           "COL_GROUP_KERNEL", "COL_GROUP_REDUCIBLE"]

COL_GROUP_KERNEL = "cg_cols"
COL_GROUP_REDUCIBLE = ("add", "mul", "maximum", "minimum")
#: blocks of 256 threads a multiprocessor the kernel's registers allow at least
MIN_BLOCKS = 4
#: adjacent columns a thread owns at most (ColGroupSignature.cols_vector)
MAX_COLS = 8


@dataclass(frozen=True)
class ColMember:
    """One column reduction of a group: ``reduce_op`` over the leading dims of the values of
    ``pre_op`` (a scalar op, or None: the one argument itself) of ``args`` (``i >= 0``: the
    group's operand i; ``-(j + 1)``: the map's output j, as stored in its dtype), its result
    of ``dtype`` (NumPy's ``dtype=``; None: the reduction's default)."""
    reduce_op: str
    pre_op: Any
    args: tuple[int, ...]
    dtype: str | None = None


@dataclass(frozen=True)
class ColGroupSignature:
    """What determines a column group module's source."""
    in_dtypes: tuple[str, ...]
    row_invariant: tuple[bool, ...]  # operands with one value per column: read once
    per_row: tuple[bool, ...]        # operands with one value per row (last dim broadcast)
    map_op: Any                      # the elementwise map's scalar op, or None
    map_args: tuple[int, ...]        # its operands
    map_dtypes: tuple[str, ...]      # its outputs' dtypes
    kept: tuple[bool, ...]           # which map outputs are written
    members: tuple[ColMember, ...]
    out_dtypes: tuple[str, ...]      # each member's result dtype
    rnd: int                         # leading dims (the operands' ndim - 1), >= 1

    @property
    def cols_vector(self) -> int:
        """Adjacent columns a thread owns: 16 bytes of the widest operand read or output
        written at every position (4 of float32, 2 of float64), at most ``MAX_COLS``."""
        written = [d for d, k in zip(self.map_dtypes, self.kept) if k]
        full = [d for d, inv, row in zip(self.in_dtypes, self.row_invariant, self.per_row)
                if not (inv or row)]
        widest = max((np.dtype(d).itemsize for d in (*full, *written)), default=4)
        return max(2, min(MAX_COLS, 16 // widest))

    def arg_dtypes(self, q: int) -> list[str]:
        """Member q's argument dtypes (a map output: its stored dtype)."""
        return [self.in_dtypes[a] if a >= 0 else self.map_dtypes[-a - 1]
                for a in self.members[q].args]

    def reduce_signature(self, q: int) -> ReduceSignature:
        """Member q as the single reduction it replaces (its accumulator, identity, combine)."""
        m = self.members[q]
        return ReduceSignature(m.reduce_op, m.pre_op, tuple(self.arg_dtypes(q)),
                               self.out_dtypes[q], 1, 1)


def col_group_formats(sig: ColGroupSignature) -> dict[str, str]:
    """name -> struct format of the kernel's arguments (cg_meta, cg_ptrs)."""
    nin, nm = len(sig.in_dtypes), len(sig.members)
    meta = "q" * (4 + sig.rnd + nin * sig.rnd + nin + 1)
    return {COL_GROUP_KERNEL: meta + "P" * (nin + sum(sig.kept) + 2 * nm + 1)}


def _ptrs(sig: ColGroupSignature) -> str:
    lines = [f"    const {storage_ctype(d)} *in{i};   /* {d} */"
             for i, d in enumerate(sig.in_dtypes)]
    written = [(j, d) for j, (d, k) in enumerate(zip(sig.map_dtypes, sig.kept)) if k]
    lines += [f"    {storage_ctype(d)} *out{n};   /* map output {j}: {d} */"
              for n, (j, d) in enumerate(written)]
    lines += [f"    {storage_ctype(d)} *res{q};   /* member {q}: {d} */"
              for q, d in enumerate(sig.out_dtypes)]
    lines += [f"    cg_acc{q}_t *part{q};   /* member {q}'s (G, K) partials */"
              for q in range(len(sig.members))]
    lines.append("    unsigned int *counters;   /* one per blockIdx.x, zero between launches */")
    return "struct cg_ptrs {\n" + "\n".join(lines) + "\n};"


def _member_functor(sig: ColGroupSignature, q: int) -> str:
    """Member q's accumulator type and combine/store functor."""
    m, rs = sig.members[q], sig.reduce_signature(q)
    if m.reduce_op not in COL_GROUP_REDUCIBLE:
        raise ValueError(f"a column group cannot reduce with {m.reduce_op}; it supports "
                         f"{', '.join(COL_GROUP_REDUCIBLE)}")
    if any(a < 0 and -a - 1 >= len(sig.map_dtypes) for a in m.args) or \
            any(a >= len(sig.in_dtypes) for a in m.args):
        raise ValueError(f"column group member {q}'s arguments {m.args} name no operand or "
                         f"map output")
    acc_c = acc_ctype_for(rs.acc_dtype)[1]
    return "\n".join([
        f"typedef {acc_c} cg_acc{q}_t;   /* {rs.acc_dtype} */", f"struct cg_op{q} {{",
        f"    {storage_ctype(sig.out_dtypes[q])} *res;",
        f"    __device__ __forceinline__ cg_acc{q}_t operator()(const cg_acc{q}_t a, "
        f"const cg_acc{q}_t b) const {{ return {_combine(rs)}; }}",
        f"    __device__ __forceinline__ void put(const long long k, const cg_acc{q}_t a) "
        "const { sg_store(res[k], a); }", "};"])


def fused_values(sig: ColGroupSignature) -> Composite | None:
    """One scalar function of every operand giving the map's outputs, then the values of the
    members with a pre-op: the builder shares the steps they have in common, so a pre-op
    recomputing the map's expression costs nothing more.  None where there is nothing to
    compute (sibling sums of the operands themselves: x.sum(0) and x.max(0))."""
    b = CompositeBuilder()
    ins = [b.add_input(d) for d in sig.in_dtypes]
    maps: list = []
    if sig.map_op is not None:
        maps = b.add_op(sig.map_op, [ins[a] for a in sig.map_args])
        if len(maps) != len(sig.map_dtypes):
            raise TypeError(f"the column group's map {sig.map_op} has {len(maps)} outputs, "
                            f"the signature {len(sig.map_dtypes)}")
    outs = list(maps)
    for q, m in enumerate(sig.members):
        if m.pre_op is not None:   # (a member without one reads its argument directly)
            got = b.add_op(m.pre_op, [ins[a] if a >= 0 else maps[-a - 1] for a in m.args])
            if len(got) != 1:
                raise TypeError(f"a column group member's pre-op must have one output, "
                                f"{m.pre_op} has {len(got)}")
            outs.append(got[0])
    return b.build(outs) if outs else None


def _member_values(sig: ColGroupSignature, n_map: int) -> list[str]:
    """Each member's value in _row_body: cg_all's output, or its argument (a map output as
    stored)."""
    out, n = [], n_map
    for m in sig.members:
        if m.pre_op is not None:
            out.append(f"v{n}")
            n += 1
        else:
            a = m.args[0]
            out.append(f"sg_load(o{-a - 1}[u])" if a < 0 else _operand_value(sig, a))
    return out


def _operand_value(sig: ColGroupSignature, i: int) -> str:
    """Operand i's value at column u of a thread's row (_row_body's names: one value a row
    where the operand has one per row, else one per column)."""
    one_a_row = sig.per_row[i] and not sig.row_invariant[i]
    return f"sg_load(x{i})" if one_a_row else f"sg_load(x{i}[u])"


def _row_body(sig: ColGroupSignature, value_dtypes: list[str]) -> str:
    """One row of a thread: the loads, cg_all, the map's outputs stored, every member's
    accumulation."""
    ind = " " * 16
    lines = []
    for i, d in enumerate(sig.in_dtypes):
        if sig.row_invariant[i]:
            continue
        if sig.per_row[i]:    # one value per row (see col_group.cu)
            lines.append(f"{ind}const {storage_ctype(d)} x{i} = p.in{i}[off[{i}]];")
        else:
            lines += [f"{ind}{storage_ctype(d)} x{i}[CG_CV];",
                      f"{ind}cg_load(p.in{i} + off[{i}] + k0 * m.cstride[{i}], m.cstride[{i}], "
                      f"vec, valid, x{i});"]
    n_map = len(sig.map_dtypes)
    lines += [f"{ind}{storage_ctype(d)} o{j}[CG_CV];" for j, d in enumerate(sig.map_dtypes)]
    args = [_operand_value(sig, i) for i in range(len(sig.in_dtypes))]
    vals = [f"v{n}" for n in range(len(value_dtypes))]
    call = [f"{ind}    cg_all({', '.join(args + vals)});"] if value_dtypes else []
    lines += ["#pragma unroll", f"{ind}for (int u = 0; u < CG_CV; ++u) {{",
              *[f"{ind}    {value_ctype(d)} v{n};" for n, d in enumerate(value_dtypes)],
              *call,
              *[f"{ind}    sg_store(o{j}[u], v{j});" for j in range(n_map)],
              *[f"{ind}    acc{q}[u] = op{q}(acc{q}[u], (cg_acc{q}_t)({value}));"
                for q, value in enumerate(_member_values(sig, n_map))],
              f"{ind}}}"]
    n = 0
    for j, k in enumerate(sig.kept):
        if k:
            lines.append(f"{ind}cg_put(p.out{n} + r * K + k0, vec, valid, o{j});")
            n += 1
    return "\n".join(lines)


def render_col_group(sig: ColGroupSignature, title: str | None = None) -> str:
    """The CUDA source of the group module for ``sig`` (see ``col_group.cu``)."""
    if not sig.members:
        raise ValueError("a column group needs at least one member")
    if len(sig.row_invariant) != len(sig.in_dtypes) or len(sig.kept) != len(sig.map_dtypes):
        raise ValueError("a column group signature needs one row_invariant flag per operand "
                         "and one kept flag per map output")
    if sig.map_op is None and sig.map_dtypes:
        raise ValueError("a column group without a map has no map outputs")
    for q, m in enumerate(sig.members):
        if m.pre_op is None and len(m.args) != 1:
            raise ValueError(f"column group member {q} without a pre-op must have one argument")
    fused = fused_values(sig)
    src, value_dtypes = ("", []) if fused is None else render_apply_function(
        fused, sig.in_dtypes, name="cg_all")
    if tuple(value_dtypes[:len(sig.map_dtypes)]) != sig.map_dtypes:
        raise TypeError(f"the column group's map {sig.map_op} gives "
                        f"{value_dtypes[:len(sig.map_dtypes)]}, the signature says "
                        f"{list(sig.map_dtypes)}")
    funcs = [src] + [_member_functor(sig, q) for q in range(len(sig.members))]
    ind = " " * 8
    acc_init, combine, gather = [], [], []
    for q in range(len(sig.members)):
        ident = _identity(sig.reduce_signature(q))
        acc_init += [f"{ind}const cg_op{q} op{q}{{p.res{q}}};",
                     f"{ind}cg_acc{q}_t acc{q}[CG_CV];",
                     "#pragma unroll", f"{ind}for (int u = 0; u < CG_CV; ++u) acc{q}[u] = {ident};"]
        combine.append(f"{ind}cg_tile_combine(reinterpret_cast<cg_acc{q}_t *>(cg_sm), acc{q}, kb, "
                       f"K, op{q}, p.part{q});")
        gather.append(f"{ind}cg_gather(reinterpret_cast<cg_acc{q}_t *>(cg_sm), kb, K, "
                      f"cg_op{q}{{p.res{q}}}, p.part{q}, ({ident}));")
    hoisted = []
    for i, d in enumerate(sig.in_dtypes):
        if sig.row_invariant[i]:
            hoisted += [f"{' ' * 12}{storage_ctype(d)} x{i}[CG_CV];",
                        f"{' ' * 12}cg_load(p.in{i} + k0 * m.cstride[{i}], m.cstride[{i}], vec, "
                        f"valid, x{i});"]
    label = title or (f"{len(sig.members)} column reductions of ({', '.join(sig.in_dtypes)})"
                      + (f" beside the map {sig.map_op}" if sig.map_op is not None else ""))
    return template("col_group.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply="\n".join(funcs),
        nin=len(sig.in_dtypes), rnd=sig.rnd, cv=sig.cols_vector, ptrs=_ptrs(sig),
        acc_init="\n".join(acc_init), hoisted="\n".join(hoisted),
        min_blocks=MIN_BLOCKS, row_body=_row_body(sig, value_dtypes),
        combine="\n".join(combine), gather="\n".join(gather))
