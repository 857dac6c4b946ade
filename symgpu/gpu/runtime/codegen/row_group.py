"""Render a row-reduction group module (``row_group.cu``): several reductions over the last
axis of one set of rows in one kernel, each with its own pre-op, reduce op and epilogue, later
members able to read earlier members' results (a layer norm's mean, then its variance).

Why apart from reduce.py: a group has one launch shape (a warp or a block per row, every lane
holding each result), where reduce.py plans split and column strategies for one reduction;
each member's accumulator type, identity and combine come from ``ReduceSignature``
(reduce.py), so a member accumulates exactly as the GpuCAReduce it replaces.

After the members a group may compute ``RowApply``s: per-row applies (elementwise ops of the
members' results, one value a row, a layer norm's ``sqrt(var / n + eps)``) and one row map
(an elementwise op at every element of the row, a layer norm's ``(x - mean) / std * g + b``),
so a layer norm's forward is one launch.  The map reads the row again (from L1/L2: a warp
has just read it) and writes full-shape C-contiguous outputs, 4 values a lane where the
members read 4 (rg_v4 stores for 2- and 4-byte floats).  A group without them renders the
source it rendered before they existed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from symgpu.gpu.runtime.codegen import common_source, template
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, _combine, _identity
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.runtime.codegen.types import acc_ctype_for, storage_ctype, value_ctype

__all__ = ["RowMember", "RowApply", "RowGroupSignature", "render_row_group", "row_group_formats",
           "ROW_GROUP_KERNELS", "ROW_GROUP_REDUCIBLE", "ROW_ARG_KINDS"]

ROW_GROUP_KERNELS = ("rg_warp_rows", "rg_block_rows")
ROW_GROUP_REDUCIBLE = ("add", "mul", "maximum", "minimum")
#: what a RowApply argument ``(kind, i)`` names (see RowApply)
ROW_ARG_KINDS = ("row", "res", "app", "ex")
#: output dtypes a map stores 4 at a time (one 16- or 8-byte store)
_VEC_STORE = ("float32", "float16", "bfloat16")


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
class RowApply:
    """An elementwise ``scalar_op`` a group computes after its members, on ``args``, each
    ``(kind, i)``: ``("row", i)`` row operand i (in the map, its value at the element; in a
    per-row apply, its one value for the row: its last dim is 1), ``("res", q)`` member q's
    stored result, ``("app", j)`` per-row output j (the per-row applies' outputs counted in
    order, each stored and re-read in its dtype as a separate node's would be), ``("ex", e)``
    epilogue operand e (one value, or one per row).  A per-row apply's outputs have the kept
    shape, plus a last dim of 1 where ``keep_axis``; a map's outputs, the rows' full shape."""
    scalar_op: Any
    args: tuple[tuple[str, int], ...]
    keep_axis: bool = True


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
    per_row: tuple[RowApply, ...] = ()   # per-row applies, after the members
    row_map: RowApply | None = None      # the row map, after them

    def value_dtype(self, arg: tuple[str, int], apps: list[str]) -> str:
        """The dtype of a RowApply argument (``apps``: the per-row outputs' dtypes so far)."""
        kind, i = arg
        table = {"row": self.in_dtypes, "res": self.out_dtypes, "app": apps, "ex": self.ex_dtypes}
        if kind not in table or not 0 <= i < len(table[kind]):
            raise ValueError(f"a row group apply's argument {arg} names nothing: {kind} "
                             f"has {len(table.get(kind, ()))} value(s)")
        return table[kind][i]

    def app_dtypes(self) -> list[list[str]]:
        """Each per-row apply's output dtypes."""
        flat: list[str] = []
        outs: list[list[str]] = []
        for a in self.per_row:
            got = output_dtypes(a.scalar_op, [self.value_dtype(x, flat) for x in a.args])
            outs.append(got)
            flat += got
        return outs

    def map_dtypes(self) -> list[str]:
        """The row map's output dtypes (none without a map)."""
        if self.row_map is None:
            return []
        apps = [d for ds in self.app_dtypes() for d in ds]
        return output_dtypes(self.row_map.scalar_op,
                             [self.value_dtype(x, apps) for x in self.row_map.args])

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
    meta = "q" * (sig.knd + nin * sig.knd + nin + nm + 1 + (sig.row_map is not None))
    nout = nm + sum(len(d) for d in sig.app_dtypes()) + len(sig.map_dtypes())
    fmt = "q" + meta + "P" * (nin + nout + len(sig.ex_dtypes))
    return {name: fmt for name in ROW_GROUP_KERNELS}


def _ptrs(sig: RowGroupSignature) -> str:
    lines = [f"    const {storage_ctype(d)} *in{i};   /* {d} */"
             for i, d in enumerate(sig.in_dtypes)]
    lines += [f"    {storage_ctype(d)} *out{q};   /* {d} */" for q, d in enumerate(sig.out_dtypes)]
    lines += [f"    const {storage_ctype(d)} *ex{e};   /* {d} */"
              for e, d in enumerate(sig.ex_dtypes)]
    apps = [d for ds in sig.app_dtypes() for d in ds]
    lines += [f"    {storage_ctype(d)} *aout{j};   /* {d}, per-row output {j} */"
              for j, d in enumerate(apps)]
    lines += [f"    {storage_ctype(d)} *mout{j};   /* {d}, the map's output {j} */"
              for j, d in enumerate(sig.map_dtypes())]
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


def _per_row_value(sig: RowGroupSignature, arg: tuple[str, int]) -> str:
    """A RowApply argument's one value for row k (a map's row operands are read per element)."""
    kind, i = arg
    if kind == "row":
        return f"sg_load(p.in{i}[koff[{i}]])"
    if kind == "ex":
        return f"sg_load(p.ex{i}[{'0' if sig.ex_scalar[i] else 'k'}])"
    return f"{kind}{i}"


def _per_row(sig: RowGroupSignature) -> tuple[list[str], list[str]]:
    """(device functions, row-body lines) of the per-row applies: every lane computes them,
    lane 0 stores, and later applies and the map read the stored values (app<j>)."""
    funcs: list[str] = []
    lines: list[str] = []
    apps: list[str] = []
    for t, a in enumerate(sig.per_row):
        dtypes = [sig.value_dtype(x, apps) for x in a.args]
        src, outs = render_apply_function(a.scalar_op, dtypes, name=f"rg_app{t}")
        funcs.append(src)
        base = len(apps)
        apps += outs
        names = [f"o{j}" for j in range(len(outs))]
        call = ", ".join([_per_row_value(sig, x) for x in a.args] + names)
        lines += [f"    /* per-row apply {t}: {a.scalar_op} -> {', '.join(outs)} */",
                  *(f"    {value_ctype(d)} app{base + j};" for j, d in enumerate(outs)),
                  "    {",
                  *(f"        {value_ctype(d)} {n};" for n, d in zip(names, outs)),
                  f"        rg_app{t}({call});"]
        for j, (n, d) in enumerate(zip(names, outs)):
            lines += [f"        {storage_ctype(d)} st{j};", f"        sg_store(st{j}, {n});",
                      f"        if (lane == 0) p.aout{base + j}[k] = st{j};",
                      f"        app{base + j} = sg_load(st{j});"]
        lines += ["    }", *(f"    (void)app{base + j};" for j in range(len(outs)))]
    return funcs, lines


#: whether an output pointer takes a map's 4-value stores (the pool aligns; a check is cheap)
_ALIGNED4 = """template <typename T>
__device__ __forceinline__ bool rg_aligned4(const T *x)
{
    return !(reinterpret_cast<unsigned long long>(x) % (4 * sizeof(T)));
}
"""


def _row_map(sig: RowGroupSignature) -> tuple[list[str], list[str]]:
    """(device functions, row-body lines) of the row map: every element of row k, the
    outputs C-contiguous (row k's at k * CM); 4 values a lane where the plan reads 4."""
    rm = sig.row_map
    if rm is None:
        return [], []
    apps = [d for ds in sig.app_dtypes() for d in ds]
    dtypes = [sig.value_dtype(x, apps) for x in rm.args]
    src, outs = render_apply_function(rm.scalar_op, dtypes, name="rg_map")
    if not any(kind == "row" for kind, _ in rm.args):
        raise ValueError(f"a row group's map {rm.scalar_op} reads no row operand")
    funcs = [src, _ALIGNED4]
    rows = sorted({i for kind, i in rm.args if kind == "row"})
    per = {x: f"mv{n}" for n, x in enumerate(dict.fromkeys(x for x in rm.args if x[0] == "ex"))}
    names = [f"o{j}" for j in range(len(outs))]
    vec_out = [j for j, d in enumerate(outs) if d in _VEC_STORE]

    def arg(x: tuple[str, int], vec: bool) -> str:
        if x[0] == "row":
            i = x[1]
            return f"sg_load(x{i}.v[u])" if vec else \
                f"sg_load(p.in{i}[koff[{i}] + j * m.cstride[{i}]])"
        return per.get(x, f"{x[0]}{x[1]}")

    def call(vec: bool, indent: str) -> list[str]:
        return [*(f"{indent}{value_ctype(d)} {n};" for n, d in zip(names, outs)),
                f"{indent}rg_map({', '.join([arg(x, vec) for x in rm.args] + names)});"]
    aligned = " && ".join(["m.vec"] + [f"rg_aligned4(p.mout{j})" for j in vec_out])
    lines = [f"    /* the row map: {rm.scalar_op} -> {', '.join(outs)}, at each of the row's "
             f"m.CM elements */", "    {",
             "        const long long mbase = k * m.CM;",
             *(f"        const {value_ctype(sig.value_dtype(x, apps))} {n} = "
               f"{_per_row_value(sig, x)};" for x, n in per.items()),
             f"        if ({aligned}) {{",
             "        for (long long j = 4 * lane; j < m.CM; j += 4 * lanes) {",
             *(f"            const rg_v4<{storage_ctype(sig.in_dtypes[i])}> x{i} = rg_load4("
               f"p.in{i} + koff[{i}] + j * m.cstride[{i}], m.cstride[{i}]);" for i in rows),
             *(f"            rg_v4<{storage_ctype(outs[j])}> y{j};" for j in vec_out),
             "#pragma unroll", "            for (int u = 0; u < 4; ++u) {", *call(True, " " * 16),
             *(f"                sg_store(y{j}.v[u], o{j});" if j in vec_out else
               f"                sg_store(p.mout{j}[mbase + j + u], o{j});"
               for j in range(len(outs))),
             "            }",
             *(f"            *reinterpret_cast<rg_v4<{storage_ctype(outs[j])}> *>"
               f"(p.mout{j} + mbase + j) = y{j};" for j in vec_out),
             "        }", "        } else {",
             "        for (long long j = lane; j < m.CM; j += lanes) {", *call(False, " " * 12),
             *(f"            sg_store(p.mout{j}[mbase + j], o{j});" for j in range(len(outs))),
             "        }", "        }", "    }"]
    return funcs, lines


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
    for f, body in (_per_row(sig), _row_map(sig)):
        funcs += f
        lines += body
    label = title or (f"{len(sig.members)} row reductions of "
                      f"({', '.join(sig.in_dtypes)}) -> ({', '.join(sig.out_dtypes)})")
    return template("row_group.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply="\n".join(funcs),
        knd=sig.knd, nin=len(sig.in_dtypes), nm=len(sig.members), ptrs=_ptrs(sig),
        members="\n".join(lines),
        map_meta="\n    long long CM;                        /* the map's row length */"
        if sig.row_map is not None else "")
