"""Render the module of a GpuElemwiseGroup (``elemwise_group.cu``): several independent
elementwise kernels run by one launch, each member's device code (its ``sg_apply`` and
operand functions, as codegen/elemwise.py renders them for its ElemwiseSignature) in a
namespace of its own, and one entry point ``hz_run`` whose blocks are dealt out to the
members in order.
"""
from __future__ import annotations

from typing import Sequence

from symgpu.gpu.runtime.codegen import common_source, template, text
from symgpu.gpu.runtime.codegen.elemwise import ElemwiseSignature, _operands
from symgpu.gpu.runtime.codegen.scalar import render_apply_function

__all__ = ["render_group", "GROUP_KERNEL", "group_format"]

#: the group module's one entry point
GROUP_KERNEL = "hz_run"


def group_format(sigs: Sequence[ElemwiseSignature]) -> str:
    """``hz_run``'s argument format: per member its element count, first block and vector
    flag (int64 each), then one pointer per input and output (the member's sg_ptrs)."""
    return "".join("qqq" + "P" * (len(s.in_dtypes) + len(s.out_dtypes)) for s in sigs)


def _member(k: int, sig: ElemwiseSignature) -> str:
    apply_src, _ = render_apply_function(sig.scalar_op, sig.in_dtypes, sig.scalar_inputs)
    return "\n".join([f"namespace hz{k} {{  /* {str(sig.scalar_op).replace('*/', '* /')} */",
                      apply_src, _operands(sig),
                      f"#define SG_VEC_DEPTH {sig.vec_depth}", text("elemwise_contig.cuh"),
                      "}", "#undef SG_NFULL", "#undef SG_VEC_DEPTH"])


def render_group(sigs: Sequence[ElemwiseSignature]) -> str:
    """The CUDA source of the group module for member signatures ``sigs``."""
    params = ",\n    ".join(
        f"const long long n{k}, const long long first{k}, const long long vec{k}, "
        f"const hz{k}::sg_ptrs p{k}" for k in range(len(sigs)))
    branches = []
    for k in range(len(sigs)):
        end = f"first{k + 1}" if k + 1 < len(sigs) else "(long long)gridDim.x"
        branches.append(f"    if (b < {end}) {{ hz{k}::sg_contig_run(n{k}, p{k}, b - first{k}, "
                        f"{end} - first{k}, vec{k}); return; }}")
    bounds = "__launch_bounds__(256, 4)" if any(s.vec_depth < 4 for s in sigs) else ""
    return template("elemwise_group.cu").substitute(
        common=common_source(),
        members="\n".join(_member(k, s) for k, s in enumerate(sigs)),
        params=params, branches="\n".join(branches), bounds=bounds)
