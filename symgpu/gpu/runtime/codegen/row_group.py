"""Render a row-reduction group module (``row_group.cu``): several reductions over the last
axis of one set of rows in one kernel, each with its own pre-op, reduce op and epilogue, later
members able to read earlier members' results (a layer norm's mean, then its variance).

Why apart from reduce.py: a group has one launch shape (a warp or a block per row, every lane
holding each result), where reduce.py plans split and column strategies for one reduction;
each member's accumulator type, identity and combine come from ``ReduceSignature``
(reduce.py), so a member accumulates exactly as the GpuCAReduce it replaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from symgpu.gpu.runtime.codegen import common_source, template
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, _combine, _identity
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.runtime.codegen.types import acc_ctype_for, storage_ctype, value_ctype

__all__ = ["RowMember", "RowGroupSignature", "render_row_group", "row_group_formats",
           "ROW_GROUP_KERNELS", "ROW_GROUP_REDUCIBLE"]

ROW_GROUP_KERNELS = ("rg_warp_rows", "rg_block_rows")
ROW_GROUP_REDUCIBLE = ("add", "mul", "maximum", "minimum")


@dataclass(frozen=True)
class RowMember:
    """One reduction of a group: ``reduce_op`` over the row values of ``pre_op`` (a scalar
    op, or None: the one argument itself) of ``args`` (``i >= 0``: the group's row operand
    i; ``-(j + 1)``: member j's stored result for the row, j before this member), its result
    (of ``dtype``, NumPy's ``dtype=``; None: the reduction's default) then through
    ``post_op`` with the group's epilogue operands ``post_args`` (one value, or one per row)."""
    reduce_op: str
    pre_op: Any
    args: tuple[int, ...]
    post_op: Any = None
    post_args: tuple[int, ...] = ()
    dtype: str | None = None


@dataclass(frozen=True)
class RowGroupSignature:
    """What determines a group module's source."""
    members: tuple[RowMember, ...]
    in_dtypes: tuple[str, ...]       # the row operands'
    ex_dtypes: tuple[str, ...]       # the epilogue operands'
    ex_scalar: tuple[bool, ...]      # which epilogue operands are one value (else one per row)
    red_dtypes: tuple[str, ...]      # each member's reduced dtype (before its epilogue)
    out_dtypes: tuple[str, ...]      # each member's output dtype
    knd: int                         # kept dims (the operands' ndim - 1), >= 1

    def arg_dtypes(self, q: int) -> list[str]:
        """Member q's argument dtypes (a chained result: that member's output dtype)."""
        return [self.in_dtypes[a] if a >= 0 else self.out_dtypes[-a - 1]
                for a in self.members[q].args]

    def reduce_signature(self, q: int) -> ReduceSignature:
        """Member q as the single reduction it replaces (its accumulator, identity, combine)."""
        m = self.members[q]
        return ReduceSignature(m.reduce_op, m.pre_op, tuple(self.arg_dtypes(q)),
                               self.out_dtypes[q], 1, 1, m.post_op,
                               tuple(self.ex_dtypes[e] for e in m.post_args),
                               tuple(self.ex_scalar[e] for e in m.post_args),
                               None if m.post_op is None else self.red_dtypes[q])


def row_group_formats(sig: RowGroupSignature) -> dict[str, str]:
    """name -> struct format of each kernel's arguments (K, rg_meta, rg_ptrs)."""
    nin, nm = len(sig.in_dtypes), len(sig.members)
    meta = "q" * (sig.knd + nin * sig.knd + nin + nm + 1)
    fmt = "q" + meta + "P" * (nin + nm + len(sig.ex_dtypes))
    return {name: fmt for name in ROW_GROUP_KERNELS}


def _ptrs(sig: RowGroupSignature) -> str:
    lines = [f"    const {storage_ctype(d)} *in{i};   /* {d} */"
             for i, d in enumerate(sig.in_dtypes)]
    lines += [f"    {storage_ctype(d)} *out{q};   /* {d} */" for q, d in enumerate(sig.out_dtypes)]
    lines += [f"    const {storage_ctype(d)} *ex{e};   /* {d} */"
              for e, d in enumerate(sig.ex_dtypes)]
    return "struct rg_ptrs {\n" + "\n".join(lines) + "\n};"


def _member(sig: RowGroupSignature, q: int) -> tuple[str, list[str]]:
    """(device functions, row-body lines) of member q."""
    m, rs = sig.members[q], sig.reduce_signature(q)
    if m.reduce_op not in ROW_GROUP_REDUCIBLE:
        raise ValueError(f"a row group cannot reduce with {m.reduce_op}; it supports "
                         f"{', '.join(ROW_GROUP_REDUCIBLE)}")
    dtypes = sig.arg_dtypes(q)
    acc, acc_c = rs.acc_dtype, acc_ctype_for(rs.acc_dtype)[1]
    funcs = [f"typedef {acc_c} rg_acc{q}_t;   /* {acc} */",
             f"struct rg_op{q} {{ __device__ __forceinline__ rg_acc{q}_t operator()("
             f"const rg_acc{q}_t a, const rg_acc{q}_t b) const {{ return {_combine(rs)}; }} }};"]
    loads = [f"sg_load(p.in{a}[koff[{a}] + j * m.cstride[{a}]])" if a >= 0 else f"res{-a - 1}"
             for a in m.args]
    vloads = [f"sg_load(x{a}.v[u])" if a >= 0 else f"res{-a - 1}" for a in m.args]
    pre_out = None
    if m.pre_op is not None:
        src, outs = render_apply_function(m.pre_op, dtypes, name=f"rg_pre{q}")
        if len(outs) != 1:
            raise TypeError(f"a row group member's pre-op must have one output, {m.pre_op} "
                            f"has {len(outs)}")
        funcs.append(src)
        pre_out = value_ctype(outs[0])

    def value(args: list[str], indent: str) -> list[str]:
        """The lines that make v, the member's value from these loads."""
        if pre_out is None:
            return [f"{indent}const rg_acc{q}_t v = (rg_acc{q}_t)({args[0]});"]
        return [f"{indent}{pre_out} r;", f"{indent}rg_pre{q}({', '.join(args + ['r'])});",
                f"{indent}const rg_acc{q}_t v = (rg_acc{q}_t)(r);"]
    vec_loads = [f"            const rg_v4<{storage_ctype(sig.in_dtypes[a])}> x{a} = "
                 f"rg_load4(p.in{a} + koff[{a}] + j * m.cstride[{a}], m.cstride[{a}]);"
                 for a in sorted({a for a in m.args if a >= 0})]
    ident = _identity(rs)
    out_st, out_v = storage_ctype(sig.out_dtypes[q]), value_ctype(sig.out_dtypes[q])
    body = [f"    /* member {q}: {m.reduce_op} of {m.pre_op or 'the values'} -> "
            f"{sig.out_dtypes[q]} */",
            f"    {out_v} res{q};", "    {",
            f"        rg_acc{q}_t acc = {ident};",
            "        if (m.vec) {",
            f"        for (long long j = 4 * lane; j < m.C[{q}]; j += 4 * lanes) {{", *vec_loads,
            "#pragma unroll",
            "            for (int u = 0; u < 4; ++u) {", *value(vloads, " " * 16),
            f"                acc = rg_op{q}()(acc, v);", "            }", "        }",
            "        } else {",
            f"        for (long long j = lane; j < m.C[{q}]; j += lanes) {{", *value(loads, " " * 12),
            f"            acc = rg_op{q}()(acc, v);", "        }", "        }",
            f"        acc = rg_all<rg_acc{q}_t, rg_op{q}, WIDE>(acc, rg_op{q}(), {ident});",
            f"        {out_st} st;"]
    if m.post_op is None:
        body.append("        sg_store(st, acc);")
    else:
        red = sig.red_dtypes[q]
        src, outs = render_apply_function(m.post_op, [red, *(sig.ex_dtypes[e] for e in m.post_args)],
                                          name=f"rg_post{q}")
        if outs != [sig.out_dtypes[q]]:
            raise TypeError(f"a row group member's epilogue must have one output of "
                            f"{sig.out_dtypes[q]}, {m.post_op} gives {outs}")
        funcs.append(src)
        ex = [f"sg_load(p.ex{e}[{'0' if sig.ex_scalar[e] else 'k'}])" for e in m.post_args]
        body += [f"        {storage_ctype(red)} red;", "        sg_store(red, acc);",
                 f"        {out_v} o;", f"        rg_post{q}({', '.join(['sg_load(red)', *ex, 'o'])});",
                 "        sg_store(st, o);"]
    body += [f"        if (lane == 0) p.out{q}[k] = st;",
             f"        res{q} = sg_load(st);   /* what a later member reads: the stored value */",
             "    }", f"    (void)res{q};"]
    return "\n".join(funcs), body


def render_row_group(sig: RowGroupSignature, title: str | None = None) -> str:
    """The CUDA source of the group module for ``sig`` (see ``row_group.cu``)."""
    if not sig.members:
        raise ValueError("a row group needs at least one member")
    for q, m in enumerate(sig.members):
        if any(a < 0 and -a - 1 >= q for a in m.args):
            raise ValueError(f"row group member {q} reads a later member's result: {m.args}")
        if m.pre_op is None and len(m.args) != 1:
            raise ValueError(f"row group member {q} without a pre-op must have one argument")
        if m.pre_op is not None:
            outs = output_dtypes(m.pre_op, sig.arg_dtypes(q))
            if len(outs) != 1:
                raise TypeError(f"row group member {q}: the pre-op {m.pre_op} must have one "
                                f"output, has {len(outs)}")
    funcs, lines = [], []
    for q in range(len(sig.members)):
        f, body = _member(sig, q)
        funcs.append(f)
        lines += body
    label = title or (f"{len(sig.members)} row reductions of "
                      f"({', '.join(sig.in_dtypes)}) -> ({', '.join(sig.out_dtypes)})")
    return template("row_group.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply="\n".join(funcs),
        knd=sig.knd, nin=len(sig.in_dtypes), nm=len(sig.members), ptrs=_ptrs(sig),
        members="\n".join(lines))
