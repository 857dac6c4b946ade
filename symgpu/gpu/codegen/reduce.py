"""Render one reduction module (``reduce.cu``): a commutative-associative reduction of a
scalar table op (add, mul, maximum, minimum, and_, or_), optionally over the result of a fused
elementwise pre-op, for a fixed number of collapsed kept/reduced dimensions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from symgpu.gpu.codegen import common_source, template
from symgpu.gpu.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.codegen.types import (acc_ctype_for, is_float_dtype, literal, storage_ctype,
                                      value_ctype)

__all__ = ["ReduceSignature", "render_reduce", "REDUCIBLE", "KERNELS", "reduce_formats"]

#: reductions the generator knows: name -> (identity kind, combine template by kind)
REDUCIBLE = ("add", "mul", "maximum", "minimum", "and_", "or_")
KERNELS = ("sg_rows_final", "sg_rows_partial", "sg_cols_final", "sg_cols_partial")


@dataclass(frozen=True)
class ReduceSignature:
    """What determines a reduction module's source."""
    reduce_op: str                 # a REDUCIBLE name
    pre_op: Any                    # scalar op applied to the inputs first, or None
    in_dtypes: tuple[str, ...]
    out_dtype: str
    knd: int                       # kept dims after collapsing (>= 1)
    rnd: int                       # reduced dims after collapsing (>= 1)

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
        return acc_ctype_for(self.out_dtype)[0]


def reduce_formats(sig: ReduceSignature) -> dict[str, str]:
    """name -> struct format of each kernel's arguments."""
    nin = len(sig.in_dtypes)
    meta = "q" * (sig.knd + sig.rnd + nin * (sig.knd + sig.rnd))
    main = "qqq" + meta + "P" * (nin + 2)
    formats = {name: main for name in KERNELS}
    formats["sg_finish"] = "qqPP"
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
    ptrs = [f"    const {storage_ctype(d)} *in{i};   /* {d} */" for i, d in enumerate(sig.in_dtypes)]
    ptrs += [f"    out_t *out;", "    acc_t *partial;"]
    loads = [f"sg_load(p.in{i}[off[{i}]])" for i in range(len(sig.in_dtypes))]
    if sig.pre_op is None:
        body = [f"    const {value_ctype(sig.in_dtypes[0])} r0 = {loads[0]};"]
    else:
        body = [f"    {value_ctype(sig.value_dtype)} r0;",
                f"    sg_apply({', '.join(loads + ['r0'])});"]
    if sig.reduce_op in ("and_", "or_"):
        body.append("    return (acc_t)((r0) != 0);")
    else:
        body.append("    return (acc_t)(r0);")
    return "\n".join(["struct sg_rptrs {", *ptrs, "};",
                      "__device__ __forceinline__ acc_t sg_value(const sg_rptrs &p, "
                      "const long long *off)", "{", *body, "}"])


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
    acc = sig.acc_dtype
    pre = f"{sig.pre_op}, " if sig.pre_op is not None else ""
    label = title or (f"{sig.reduce_op} of {pre}({', '.join(sig.in_dtypes)}) -> {sig.out_dtype}, "
                      f"{sig.knd} kept / {sig.rnd} reduced dims")
    return template("reduce.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply=apply_src,
        acc_ctype=acc_ctype_for(acc)[1] if acc != "int32" else "int", acc_dtype=acc,
        out_ctype=storage_ctype(sig.out_dtype), out_dtype=sig.out_dtype,
        nin=len(sig.in_dtypes), knd=sig.knd, rnd=sig.rnd, identity=_identity(sig),
        combine=_combine(sig), operands=_operands(sig))
