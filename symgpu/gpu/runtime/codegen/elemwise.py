"""Render one elementwise module (``elemwise.cu``) for a scalar op over typed operands.

A module is determined by: the scalar op (table row or Composite), the input dtypes, which
inputs are *scalars* (every dimension broadcastable: read once per thread), and the number of
dimensions; ``ElemwiseSignature`` is that key, so the hot path never touches source text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from symgpu.gpu.runtime.codegen import common_source, template, text
from symgpu.gpu.runtime.codegen.scalar import output_dtypes, render_apply_function
from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype

#: bytes and values a thread of the vector kernels keeps in flight at most
#: (ElemwiseSignature.vec_depth)
VEC_BYTES_IN_FLIGHT, VEC_VALUES_IN_FLIGHT = 256, 64

__all__ = ["ElemwiseSignature", "render_elemwise", "strided_kernel_name", "rowcol_kernel_name",
           "kernel_names"]


@dataclass(frozen=True)
class ElemwiseSignature:
    """What determines an elementwise module's source."""
    scalar_op: Any
    in_dtypes: tuple[str, ...]
    scalar_inputs: tuple[bool, ...]   # per input: size 1 (all dims broadcastable)
    ndim: int

    @property
    def out_dtypes(self) -> tuple[str, ...]:
        return tuple(output_dtypes(self.scalar_op, list(self.in_dtypes)))

    @property
    def n_full(self) -> int:
        """Operands indexed per element: non-scalar inputs, then every output."""
        return sum(1 for s in self.scalar_inputs if not s) + len(self.out_dtypes)

    @property
    def vec_depth(self) -> int:
        """Vectors of every operand the vector kernels keep in flight per thread, 1 to 4:
        about VEC_BYTES_IN_FLIGHT bytes, and at most VEC_VALUES_IN_FLIGHT values (a half
        operand's vector takes 2 registers loaded, 4 once converted) so that the kernels'
        64 registers hold them without spilling.  Four vectors of a light operand list keep
        the memory busy; four of a long one only take registers from other warps."""
        full = [d for d, s in zip(self.in_dtypes, self.scalar_inputs) if not s]
        full += list(self.out_dtypes)
        per_vector = sum(4 * np.dtype(d).itemsize for d in full)
        return max(1, min(4, VEC_BYTES_IN_FLIGHT // max(per_vector, 1),
                          VEC_VALUES_IN_FLIGHT // max(4 * len(full), 1)))


def strided_kernel_name(nd: int, wide: bool) -> str:
    return f"sg_strided_{nd}_{64 if wide else 32}"


def rowcol_kernel_name(vec: bool, wide: bool) -> str:
    """The row/column-broadcast kernel (elemwise.cu): 4-wide (``vec``) or a scalar at a time,
    with 64-bit (``wide``) or 32-bit index arithmetic."""
    return f"sg_rowcol{'_vec' if vec else ''}_{64 if wide else 32}"


def kernel_names(sig: ElemwiseSignature) -> list[str]:
    """Every kernel the module for ``sig`` defines."""
    names = ["sg_contig", "sg_contig_vec"]
    for nd in range(1, max(sig.ndim, 1) + 1):
        names += [strided_kernel_name(nd, False), strided_kernel_name(nd, True)]
    for wide in (False, True):
        names += [rowcol_kernel_name(True, wide), rowcol_kernel_name(False, wide)]
    return names


def _operands(sig: ElemwiseSignature) -> str:
    """sg_ptrs, sg_scalars and the three element functions for ``sig``."""
    ins, outs = list(sig.in_dtypes), list(sig.out_dtypes)
    ptrs, scal, load = [], [], []
    for i, d in enumerate(ins):
        ptrs.append(f"    const {storage_ctype(d)} *in{i};   /* {d}{' scalar' if sig.scalar_inputs[i] else ''} */")
        if sig.scalar_inputs[i]:
            scal.append(f"    {value_ctype(d)} in{i};")
            load.append(f"    s.in{i} = sg_load(p.in{i}[0]);")
    for j, d in enumerate(outs):
        ptrs.append(f"    {storage_ctype(d)} *out{j};   /* {d} */")
    if not scal:
        scal.append("    char unused;")
    # full operand index of each input/output in off[] (strided kernels)
    full_index, k = {}, 0
    for i in range(len(ins)):
        if not sig.scalar_inputs[i]:
            full_index[("in", i)] = k
            k += 1
    for j in range(len(outs)):
        full_index[("out", j)] = k
        k += 1

    def call(arg_of_input: Any, store_of_output: Any, indent: str) -> list[str]:
        lines = [f"{indent}{value_ctype(d)} r{j};" for j, d in enumerate(outs)]
        args = [f"s.in{i}" if sig.scalar_inputs[i] else arg_of_input(i) for i in range(len(ins))]
        args += [f"r{j}" for j in range(len(outs))]
        lines.append(f"{indent}sg_apply({', '.join(args)});")
        lines += [f"{indent}{store_of_output(j)}" for j in range(len(outs))]
        return lines

    contig = call(lambda i: f"sg_load(p.in{i}[i])", lambda j: f"sg_store(p.out{j}[i], r{j});", "    ")
    off = call(lambda i: f"sg_load(p.in{i}[off[{full_index[('in', i)]}]])",
               lambda j: f"sg_store(p.out{j}[off[{full_index[('out', j)]}]], r{j});", "    ")
    vin, vload, rcload = [], [], []
    for i, d in enumerate(ins):
        if not sig.scalar_inputs[i]:
            t = storage_ctype(d)
            k = full_index[("in", i)]
            vin.append(f"    sg_vec4<{t}> a{i};")
            vload.append(f"    v.a{i} = reinterpret_cast<const sg_vec4<{t}> *>(p.in{i})[j];")
            # a C-contiguous input or a row vector: a vector (rs / 4 vectors between rows);
            # a column vector (or one value): its value at row r, four times
            rcload += [f"    if (cs[{k}]) {{",
                       f"        v.a{i} = reinterpret_cast<const sg_vec4<{t}> *>(p.in{i})"
                       f"[r * (rs[{k}] >> 2) + c];",
                       "    } else {",
                       f"        const {t} x = p.in{i}[r * rs[{k}]];",
                       f"        v.a{i}.v[0] = x; v.a{i}.v[1] = x; v.a{i}.v[2] = x; v.a{i}.v[3] = x;",
                       "    }"]
    if not vin:
        vin.append("    char unused;")
    vec = [f"    sg_vec4<{storage_ctype(d)}> b{j};" for j, d in enumerate(outs)]
    vec.append("#pragma unroll")
    vec.append("    for (int u = 0; u < 4; ++u) {")
    vec += call(lambda i: f"sg_load(v.a{i}.v[u])", lambda j: f"sg_store(b{j}.v[u], r{j});",
                "        ")
    vec.append("    }")
    for j, d in enumerate(outs):
        t = storage_ctype(d)
        vec.append(f"    reinterpret_cast<sg_vec4<{t}> *>(p.out{j})[j] = b{j};")
    lines = ["struct sg_ptrs {", *ptrs, "};", "struct sg_scalars {", *scal, "};",
             f"#define SG_NFULL {max(sig.n_full, 1)}",
             "__device__ __forceinline__ sg_scalars sg_load_scalars(const sg_ptrs &p)",
             "{", "    sg_scalars s = {};", *load, "    return s;", "}",
             "__device__ __forceinline__ void sg_elem_contig(const sg_ptrs &p, const sg_scalars &s,"
             " const long long i)", "{", *contig, "}",
             "struct sg_vin {", *vin, "};",
             "__device__ __forceinline__ sg_vin sg_vec_load(const sg_ptrs &p, const long long j)",
             "{", "    sg_vin v;", *vload, "    return v;", "}",
             "template <typename I>",
             "__device__ __forceinline__ sg_vin sg_rc_load(const sg_ptrs &p, const I *rs,"
             " const I *cs, const I r, const I c)",
             "{", "    sg_vin v;", *rcload, "    return v;", "}",
             "__device__ __forceinline__ void sg_vec_store(const sg_ptrs &p, const sg_scalars &s,"
             " const long long j, const sg_vin &v)", "{", *vec, "}",
             "template <typename I>",
             "__device__ __forceinline__ void sg_elem_off(const sg_ptrs &p, const sg_scalars &s,"
             " const I *off)", "{", *off, "}"]
    return "\n".join(lines)


def render_elemwise(sig: ElemwiseSignature, title: str | None = None) -> str:
    """The CUDA source of the module for ``sig`` (see ``elemwise.cu``)."""
    apply_src, _ = render_apply_function(sig.scalar_op, sig.in_dtypes, sig.scalar_inputs)
    instances = []
    for nd in range(1, max(sig.ndim, 1) + 1):
        instances.append(f"SG_STRIDED({nd}, unsigned int, {strided_kernel_name(nd, False)})")
        instances.append(f"SG_STRIDED({nd}, long long, {strided_kernel_name(nd, True)})")
    rowcol = [f"SG_ROWCOL({t}, {rowcol_kernel_name(False, wide)}, {rowcol_kernel_name(True, wide)})"
              for t, wide in (("unsigned int", False), ("long long", True))]
    label = title or f"{sig.scalar_op} over ({', '.join(sig.in_dtypes)}), ndim {sig.ndim}"
    return template("elemwise.cu").substitute(
        title=label.replace("*/", "* /"), common=common_source(), apply=apply_src,
        operands=_operands(sig), instances="\n".join(instances),
        rowcol_instances="\n".join(rowcol), vec_depth=sig.vec_depth,
        contig_loop=text("elemwise_contig.cuh"),
        vec_bounds="__launch_bounds__(256, 4)" if sig.vec_depth < 4 else "")
