"""Render one reduction module (``reduce.cu``): a commutative-associative reduction of a
scalar table op (add, mul, maximum, minimum, and_, or_), optionally over the result of a fused
elementwise pre-op and through a fused elementwise epilogue (``post_op``: the reduced value,
then operands of the output's shape or scalars), for a fixed number of collapsed kept/reduced
dimensions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from symgpu.gpu.runtime.codegen import common_source, template
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.runtime.codegen.types import (acc_ctype_for, is_float_dtype, literal, storage_ctype,
                                      value_ctype)

__all__ = ["ReduceSignature", "render_reduce", "REDUCIBLE", "KERNELS", "ONEPASS_KERNELS",
           "COLS_BLOCK_KERNELS", "COLS_TILE_KERNELS", "VECTOR_KERNELS", "reduce_formats",
           "kernel_names"]

#: reductions the generator knows: name -> (identity kind, combine template by kind)
REDUCIBLE = ("add", "mul", "maximum", "minimum", "and_", "or_")
KERNELS = ("sg_rows_final", "sg_rows_partial", "sg_cols_final", "sg_cols_partial")
#: kernels every module also has: the one-pass rows kernel (partials + "last block done")
ONEPASS_KERNELS = ("sg_rows_onepass",)
#: and the one-launch columns kernel (a block finishes its 32 columns over the whole of R)
COLS_BLOCK_KERNELS = ("sg_cols_block",)
#: and the column-tile kernel for tall arrays of many contiguous columns (a bias gradient of an
#: (8192, 2304) activation): each thread owns ``ReduceSignature.cols_vector`` adjacent columns
#: read as one access, a block a tile of rows, row tiles combined by the last block (one launch)
COLS_TILE_KERNELS = ("sg_cols_tile",)
#: kernels of modules whose operands share one item size and whose reduced dims collapse to one
#: (``ReduceSignature.vector_width`` > 0): 16-byte loads of contiguous rows
VECTOR_KERNELS = ("sg_vrows_final", "sg_vrows_onepass")


@dataclass(frozen=True)
class ReduceSignature:
    """What determines a reduction module's source."""
    reduce_op: str                 # a REDUCIBLE name
    pre_op: Any                    # scalar op applied to the inputs first, or None
    in_dtypes: tuple[str, ...]
    out_dtype: str
    knd: int                       # kept dims after collapsing (>= 1)
    rnd: int                       # reduced dims after collapsing (>= 1)
    #: scalar op applied to each result with the epilogue operands (its input 0 is the reduced
    #: value, of ``red_dtype``), or None; out_dtype is then its output's dtype
    post_op: Any = None
    post_dtypes: tuple[str, ...] = ()      # the epilogue operands' dtypes
    post_scalar: tuple[bool, ...] = ()     # which of them are one value (else one per output)
    red_dtype: str | None = None           # the reduction's own dtype (None: out_dtype)

    @property
    def reduced_dtype(self) -> str:
        """The dtype of the reduction's result (before any epilogue)."""
        return self.red_dtype or self.out_dtype

    @property
    def value_dtype(self) -> str:
        """The dtype of the values being reduced (the pre-op's output, else the input's)."""
        if self.pre_op is None:
            return self.in_dtypes[0]
        return output_dtypes(self.pre_op, list(self.in_dtypes))[0]

    @property
    def acc_dtype(self) -> str:
        """The accumulator: the output dtype (NumPy's `dtype=` rule), widened to a type that
        warp shuffles move; all/any count in int."""
        if self.reduce_op in ("and_", "or_"):
            return "int32"
        return acc_ctype_for(self.reduced_dtype)[0]

    @property
    def vector_width(self) -> int:
        """Elements per 16-byte vector load when every operand has the same item size and the
        reduced dims collapse to one (the module then has VECTOR_KERNELS); 0 otherwise."""
        sizes = {np.dtype(d).itemsize for d in self.in_dtypes}
        if self.rnd != 1 or len(sizes) != 1:
            return 0
        return 16 // sizes.pop()

    @property
    def cols_vector(self) -> int:
        """Adjacent columns a thread of ``sg_cols_tile`` owns and loads as one access per
        operand: 4 (2 where an operand has 8-byte items: a 16-byte access at most)."""
        return 2 if max(np.dtype(d).itemsize for d in self.in_dtypes) >= 8 else 4


def kernel_names(sig: ReduceSignature) -> tuple[str, ...]:
    """Every kernel of ``sig``'s module."""
    vec = VECTOR_KERNELS if sig.vector_width else ()
    return (KERNELS + ONEPASS_KERNELS + COLS_BLOCK_KERNELS + COLS_TILE_KERNELS + vec
            + ("sg_finish",))


def reduce_formats(sig: ReduceSignature) -> dict[str, str]:
    """name -> struct format of each kernel's arguments."""
    nin = len(sig.in_dtypes)
    meta = "q" * (sig.knd + sig.rnd + nin * (sig.knd + sig.rnd))
    nex = len(sig.post_dtypes)
    main = "qqq" + meta + "P" * (nin + 3 + nex)   # inputs, out, partial, counters, epilogue's
    formats = {name: main for name in kernel_names(sig)}
    formats["sg_finish"] = "qqPP" + "P" * nex
    return formats


def _identity(sig: ReduceSignature) -> str:
    acc = sig.acc_dtype
    op = sig.reduce_op
    if op == "add":
        return literal(0, acc)
    if op == "mul":
        return literal(1, acc)
    if op == "and_":
        return "1"
    if op == "or_":
        return "0"
    low = op == "maximum"
    if is_float_dtype(acc):
        return literal(-np.inf if low else np.inf, acc)
    info = np.iinfo(acc)
    return literal(info.min if low else info.max, acc)


def _combine(sig: ReduceSignature) -> str:
    op, acc = sig.reduce_op, sig.acc_dtype
    if op == "add":
        return "a + b"
    if op == "mul":
        return "a * b"
    if op == "and_":
        return "a & b"
    if op == "or_":
        return "a | b"
    cmp = ">" if op == "maximum" else "<"
    if is_float_dtype(acc):  # NaN wins, as in NumPy
        return f"(a {cmp} b || a != a) ? a : b"
    return f"(a {cmp} b) ? a : b"


def _operands(sig: ReduceSignature) -> str:
    """sg_rptrs (the pointers), sg_valv (stored operand values -> accumulator value: the
    pre-op, the cast) and sg_value (the same at element offsets); where the module has vector
    kernels, their per-operand helpers too (see reduce.cu's sg_vrows)."""
    nin = len(sig.in_dtypes)
    st = [storage_ctype(d) for d in sig.in_dtypes]
    ptrs = [f"    const {t} *in{i};   /* {d} */" for i, (t, d) in enumerate(zip(st, sig.in_dtypes))]
    ptrs += ["    out_t *out;", "    acc_t *partial;     /* G per kept position */",
             "    unsigned int *counters;   /* one per blockIdx.x, zero between launches */"]
    ptrs += [f"    const {storage_ctype(d)} *ex{i};   /* epilogue operand: {d} */"
             for i, d in enumerate(sig.post_dtypes)]
    params = ", ".join(f"const {t} x{i}" for i, t in enumerate(st))
    loads = [f"sg_load(x{i})" for i in range(nin)]
    if sig.pre_op is None:
        body = [f"    const {value_ctype(sig.in_dtypes[0])} r0 = {loads[0]};"]
    else:
        body = [f"    {value_ctype(sig.value_dtype)} r0;",
                f"    sg_apply({', '.join(loads + ['r0'])});"]
    if sig.reduce_op in ("and_", "or_"):
        body.append("    return (acc_t)((r0) != 0);")
    else:
        body.append("    return (acc_t)(r0);")
    at = ", ".join(f"p.in{i}[off[{i}]]" for i in range(nin))
    out = ["struct sg_rptrs {", *ptrs, "};",
           f"__device__ __forceinline__ acc_t sg_valv({params})", "{", *body, "}",
           "__device__ __forceinline__ acc_t sg_value(const sg_rptrs &p, const long long *off)",
           "{", f"    return sg_valv({at});", "}", *_put(sig), *_column_vectors(sig)]
    if not sig.vector_width:
        return "\n".join(out)
    item = np.dtype(sig.in_dtypes[0]).itemsize
    addr = [f"(unsigned int)reinterpret_cast<unsigned long long>(p.in{i} + koff[{i}]) & 15u"
            for i in range(nin)]
    out += [f"#define SG_ITEM {item}",
            "struct sg_vbase { " + " ".join(f"const uint4 *in{i};" for i in range(nin)) + " };",
            "struct sg_vraw { " + " ".join(f"uint4 a{i};" for i in range(nin)) + " };",
            "/* the byte offset of a row's operands from a 16-byte boundary; 16 where they differ",
            " * (or an operand is not element-aligned): no common vector grid */",
            "__device__ __forceinline__ unsigned int sg_misalign(const sg_rptrs &p, "
            "const long long *koff)", "{",
            f"    const unsigned int a0 = {addr[0]};",
            "    if (a0 % SG_ITEM) return 16u;",
            *[f"    if (({a}) != a0) return 16u;" for a in addr[1:]],
            "    return a0;", "}",
            "__device__ __forceinline__ sg_vbase sg_vbase_at(const sg_rptrs &p, "
            "const long long *koff, const long long head)", "{", "    sg_vbase b;",
            *[f"    b.in{i} = reinterpret_cast<const uint4 *>(p.in{i} + koff[{i}] + head);"
              for i in range(nin)],
            "    return b;", "}",
            "__device__ __forceinline__ sg_vraw sg_vload(const sg_vbase &b, const long long j)",
            "{", "    sg_vraw v;", *[f"    v.a{i} = __ldg(b.in{i} + j);" for i in range(nin)],
            "    return v;", "}",
            "__device__ __forceinline__ acc_t sg_vreduce(const sg_vraw &v)", "{",
            "    acc_t t[SG_VW];", "#pragma unroll",
            "    for (int u = 0; u < SG_VW; ++u) t[u] = sg_valv("
            + ", ".join(f"sg_velem<{t}>(v.a{i}, u)" for i, t in enumerate(st)) + ");",
            *[line for w in (8, 4, 2, 1) if w < 16 // item for line in (
                "#pragma unroll",
                f"    for (int u = 0; u < {w}; ++u) t[u] = sg_combine(t[u], t[u + {w}]);")],
            "    return t[0];", "}"]
    return "\n".join(out)


def _column_vectors(sig: ReduceSignature) -> list[str]:
    """sg_ctile's per-operand helpers (reduce.cu): whether a thread's SG_CV columns can be
    read as one aligned access of every operand (kept stride 1, or 0: one value repeated),
    the raw values of one row (sg_craw, sg_cload) and their accumulation (sg_cadd)."""
    nin = len(sig.in_dtypes)
    st = [storage_ctype(d) for d in sig.in_dtypes]
    ok = []
    for i, t in enumerate(st):
        ok += [f"    if (m.kstride[{i}][0] != 0) {{",
               f"        if (m.kstride[{i}][0] != 1 || m.rstride[{i}][0] % SG_CV != 0) "
               "return false;",
               f"        if (reinterpret_cast<unsigned long long>(p.in{i} + koff[{i}]) % "
               f"(SG_CV * sizeof({t})) != 0) return false;", "    }"]
    loads = [f"    sg_cvec_load(p.in{i} + koff[{i}] + r * m.rstride[{i}][0], "
             f"m.kstride[{i}][0], c.x{i});" for i in range(nin)]
    args = ", ".join(f"c.x{i}[u]" for i in range(nin))
    return ["struct sg_craw { " + " ".join(f"{t} x{i}[SG_CV];" for i, t in enumerate(st)) + " };",
            "__device__ __forceinline__ bool sg_cvec_ok(const sg_rmeta &m, const sg_rptrs &p, "
            "const long long *koff)", "{", *ok, "    return true;", "}",
            "__device__ __forceinline__ sg_craw sg_cload(const sg_rmeta &m, const sg_rptrs &p, "
            "const long long *koff, const long long r)", "{", "    sg_craw c;", *loads,
            "    return c;", "}",
            "__device__ __forceinline__ void sg_cadd(acc_t *acc, const sg_craw &c)", "{",
            "#pragma unroll", f"    for (int u = 0; u < SG_CV; ++u) "
            f"acc[u] = sg_combine(acc[u], sg_valv({args}));", "}"]


def _put(sig: ReduceSignature) -> list[str]:
    """sg_put (store kept position k's result, through the epilogue where there is one) and
    sg_put_p (the same from the kernels' sg_rptrs)."""
    ex = [f", const {storage_ctype(d)} *ex{i}" for i, d in enumerate(sig.post_dtypes)]
    head = ("__device__ __forceinline__ void sg_put(out_t *out, const long long k, "
            f"const acc_t acc{''.join(ex)})")
    if sig.post_op is None:
        body = ["    sg_store(out[k], acc);"]
    else:
        red = sig.reduced_dtype
        loads = [f"sg_load(ex{i}[{'0' if scalar else 'k'}])"
                 for i, scalar in enumerate(sig.post_scalar)]
        body = [f"    {storage_ctype(red)} red;", "    sg_store(red, acc);",
                f"    {value_ctype(sig.out_dtype)} o;",
                f"    sg_post({', '.join(['sg_load(red)'] + loads + ['o'])});",
                "    sg_store(out[k], o);"]
    args = "".join(f", p.ex{i}" for i in range(len(sig.post_dtypes)))
    return [head, "{", *body, "}",
            "__device__ __forceinline__ void sg_put_p(const sg_rptrs &p, const long long k, "
            "const acc_t acc)", "{", f"    sg_put(p.out, k, acc{args});", "}"]


def render_reduce(sig: ReduceSignature, title: str | None = None) -> str:
    """The CUDA source of the module for ``sig`` (see ``reduce.cu``)."""
    if sig.reduce_op not in REDUCIBLE:
        raise ValueError(f"cannot reduce with {sig.reduce_op}; GPU reductions support "
                         f"{', '.join(REDUCIBLE)}")
    apply_src = ""
    if sig.pre_op is not None:
        apply_src, outs = render_apply_function(sig.pre_op, sig.in_dtypes)
        if len(outs) != 1:
            raise TypeError(f"a reduction pre-op must have one output, {sig.pre_op} has {len(outs)}")
    if sig.post_op is not None:
        if len(sig.post_dtypes) != len(sig.post_scalar):
            raise ValueError("post_dtypes and post_scalar must have one entry per operand")
        post_src, outs = render_apply_function(
            sig.post_op, [sig.reduced_dtype, *sig.post_dtypes], name="sg_post")
        if outs != [sig.out_dtype]:
            raise TypeError(f"a reduction epilogue must have one output of {sig.out_dtype}, "
                            f"{sig.post_op} gives {outs}")
        apply_src += post_src
    acc = sig.acc_dtype
    pre = f"{sig.pre_op}, " if sig.pre_op is not None else ""
    post = f", then {sig.post_op}" if sig.post_op is not None else ""
    label = title or (f"{sig.reduce_op} of {pre}({', '.join(sig.in_dtypes)}){post} -> "
                      f"{sig.out_dtype}, {sig.knd} kept / {sig.rnd} reduced dims")
    nex = len(sig.post_dtypes)
    return template("reduce.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply=apply_src,
        acc_ctype=acc_ctype_for(acc)[1] if acc != "int32" else "int", acc_dtype=acc,
        out_ctype=storage_ctype(sig.out_dtype), out_dtype=sig.out_dtype,
        nin=len(sig.in_dtypes), knd=sig.knd, rnd=sig.rnd, vw=sig.vector_width,
        cv=sig.cols_vector,
        identity=_identity(sig),
        combine=_combine(sig), operands=_operands(sig),
        finish_params="".join(f", const {storage_ctype(d)} *ex{i}"
                              for i, d in enumerate(sig.post_dtypes)),
        finish_args="".join(f", ex{i}" for i in range(nex)))
