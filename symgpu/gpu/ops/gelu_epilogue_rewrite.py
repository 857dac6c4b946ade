"""gpu_gelu_epilogue: a layer's GELU, and its gradient, inside the matrix products that feed
them (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues: GpuGemmEpilogue, gemm_epilogue.py).

Why: a transformer's MLP computes ``gelu(dot(a, W) + b)``: the product writes its result,
an elementwise kernel reads it back with the bias and writes the GELU (the GPT block of
benchmarks/half_symgpu.py in bf16 on an H200: 50 us product, 40 us kernel).  cuBLASLt's
GELU_AUX_BIAS epilogue adds the bias, applies the GELU and also writes the pre-activation
(``aux``, what the gradient needs) from the product's float32 accumulator: about 80 us for
both.  In the gradient, ``g * gelu'(z)`` of the next layer's input gradient ``g`` (a product)
is an elementwise kernel reading the product and z again (fused with the bias gradient's
column sums: 78 us, plus the product's 51); DGELU applies ``gelu'(aux)`` in that product's
epilogue (77 us timed alone, 86 inside the step), the bias gradient then summing the result
(20 us).  The step's device time went from 1.165 to 1.127 ms.

What is recognised (evaluation, not spelling: elemwise_region.py), in the products' dtypes
that ``gpuarray.gemm_epilogue`` names:

* forward: a GpuElemwise result ``r`` in the product's dtype (mixed precision's
  ``Cast{half}`` of a float32 expression, or the expression itself) that equals, as a
  function, ``gelu(z)`` of the tanh form (cuBLASLt's: ``0.5 z (1 + tanh(sqrt(2/pi) (z +
  0.044715 z^3)))``) of ``z = p + b`` for a product ``p = dot(x, W)`` (a GpuDot22, or a
  reshape of one keeping its columns last; mixed precision's ``Cast{float32}(p)``) that
  nothing else reads and a broadcast bias vector ``b``.  ``r`` becomes the epilogue's first
  output (reshaped as ``p`` was); every other reader of the arithmetic on the way
  (the gradient reads ``z`` and ``tanh(...)``) gets it recomputed from ``aux`` (the
  pre-activation rounded to the product's dtype, as PyTorch's autocast rounds a linear
  layer's output; a float32 bias of a half product is rounded to half first, as for the bias
  epilogue).  Where such a reader needs ``p`` other than through ``z``, nothing changes.
* backward: a GpuElemwise result in a product's dtype that equals ``g * gelu'(a)`` for ``g``
  a product (as above, through any reshape: nothing else reads it) and ``a`` an ``aux``
  output (or a reshape of one) becomes GpuGemmEpilogue{dgelu} of g's factors and ``aux``,
  which it reads in C order as the product's shape (the elementwise node paired them
  position by position); a float32 reader
  of the unrounded value (the bias gradient's sum in mixed precision) reads the result cast
  to float32.

Where nothing reads ``aux`` (inference), the forward becomes GpuGemmEpilogue{gelu_bias}
(cuBLASLt's GELU_BIAS), which does not write it.

In ``fast_run`` at 49.455, before ``gpu_gemm_epilogue`` (49.46) and ``gpu_fusion`` (49.5);
``optimizer_excluding=gpu_gelu_epilogue`` turns it off.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.ops.blas import GpuDot22
from symgpu.gpu.ops.elemwise import GpuElemwise, cast_target
from symgpu.gpu.ops.elemwise_region import Region, region
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue, bias_vector, epilogue_dtypes, \
    keeps_columns, moved_pairs, shape_readers
from symgpu.gpu.placement.basic_ops import GpuReshape
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.basic import Cast
from symgpu.scalar.dtypes import HALF_DTYPES

__all__ = ["gelu_tanh", "gelu_tanh_grad", "gpu_gelu_epilogue", "local_gelu_forward",
           "local_gelu_backward", "local_gelu_without_aux"]

_K0, _K1 = float(np.sqrt(2.0 / np.pi)), 0.044715


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    """GELU's tanh form (cuBLASLt's), in float64."""
    z = np.asarray(z, np.float64)
    return 0.5 * z * (1.0 + np.tanh(_K0 * (z + _K1 * z ** 3)))


def gelu_tanh_grad(z: np.ndarray) -> np.ndarray:
    """Its derivative, in float64."""
    z = np.asarray(z, np.float64)
    t = np.tanh(_K0 * (z + _K1 * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _K0 * (1.0 + 3.0 * _K1 * z * z)


# --- samples and the comparison

_RNG_SEED = 20261130
#: pre-activations over GELU's bend, its tails and a few large values
_Z = np.concatenate([np.linspace(-7.0, 7.0, 113), [-30.0, -12.0, 12.0, 30.0],
                     np.random.default_rng(_RNG_SEED).standard_normal(64) * 2.0])


def _samples(dtype: str, values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float64).astype(dtype)


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    """The same function (elemwise_region evaluates in float64): within what rounding a
    float32 graph's constants to float32 makes (about 1e-8), far tighter than the 5e-4 by
    which GELU's erf form differs or the 4e-6 of 0.0447 for 0.044715."""
    got = np.asarray(got, np.float64)
    return bool(np.all(np.isfinite(got)) and
                np.all(np.abs(got - want) <= 2e-7 * (1.0 + np.abs(want))))


# --- the products

def _product(var: Variable, fgraph: FunctionGraph, readers: set,
             columns: bool = True) -> tuple | None:
    """``(p, reshape, moved_p, moved_r)`` where ``var`` is a GpuDot22 output ``p`` or a
    reshape of one (``reshape``: that node; keeping p's columns last, when ``columns``), read
    only by ``readers`` besides readers of its shape alone (of p: ``moved_p``, of the
    reshape: ``moved_r``; they move onto the fused result); else None."""
    node = var.owner
    reshape = node if node is not None and type(node.op) is GpuReshape else None
    pn = node.inputs[0].owner if reshape is not None else node
    if pn is None or type(pn.op) is not GpuDot22 or pn.outputs[0].dtype not in \
            epilogue_dtypes():
        return None
    p = pn.outputs[0]
    if reshape is None:
        moved = shape_readers(fgraph, p, readers)
        return None if moved is None else (p, None, moved, [])
    moved_r = shape_readers(fgraph, var, readers)
    moved_p = shape_readers(fgraph, p, {reshape})
    if moved_r is None or moved_p is None or \
            columns and not keeps_columns(fgraph, reshape, p):
        return None
    return p, reshape, moved_p, moved_r


def _value_root(node: Apply) -> tuple[Variable, Variable] | None:
    """``(r, y)``: the node's result ``r`` and the expression ``y`` to evaluate: the float32
    input of a Cast{half} (mixed precision), else ``r`` itself."""
    if type(node.op) is not GpuElemwise or node.op.inplace_pattern or len(node.outputs) != 1:
        return None
    r = node.outputs[0]
    if cast_target(node) in HALF_DTYPES and node.inputs[0].dtype == "float32" and \
            node.inputs[0].owner is not None:
        return r, node.inputs[0]
    return (r, r) if r.dtype in epilogue_dtypes() else None


def _clients(fgraph: FunctionGraph, var: Variable) -> list:
    return fgraph.clients.get(var, [])


def _outside_readers(fgraph: FunctionGraph, reg: Region, var: Variable, root: Apply) -> list:
    """The clients of region variable ``var`` besides the region's nodes and ``root`` (the
    candidate node the rewrite replaces: mixed precision's Cast{half} of the region)."""
    return [c for c, _ in _clients(fgraph, var)
            if c == "output" or c is not root and c not in reg.nodes]


def _rebuild(var: Variable, old: Variable, new: Variable, memo: dict) -> Variable:
    """``var`` (computed from ``old`` by GpuElemwise nodes) computed from ``new`` instead."""
    if var is old:
        return new
    got = memo.get(var)
    if got is not None:
        return got
    node = var.owner
    if node is None or type(node.op) is not GpuElemwise:
        return var
    ins = [_rebuild(v, old, new, memo) for v in node.inputs]
    out = var if all(a is b for a, b in zip(ins, node.inputs)) else \
        node.clone_with_new_inputs(ins).outputs[node.outputs.index(var)]
    memo[var] = out
    return out


def _reshaped(reshape: Apply | None, var: Variable) -> Variable:
    return var if reshape is None else \
        reshape.clone_with_new_inputs([var] + reshape.inputs[1:]).outputs[0]


def _moved(prod: tuple, leaf: Variable, out: Variable, new_r: Variable) -> list:
    """Pairs moving the shape-only readers of the product (``_product``'s) onto the fused
    result ``out`` (those of its reshape ``leaf`` onto ``new_r``)."""
    p, _, moved_p, moved_r = prod
    return moved_pairs(((moved_p, p, out), (moved_r, leaf, new_r)))


def _two_leaf_region(node: Apply) -> tuple[Variable, Variable, Region] | None:
    """``(r, y, region of y)`` of a candidate result (``_value_root``) whose arithmetic has
    two leaves besides constants (a product and a bias, or a product and aux)."""
    roots = _value_root(node)
    if roots is None:
        return None
    r, y = roots
    reg = region(y)
    return None if reg is None or len(reg.leaves) != 2 else (r, y, reg)


# --- forward

def _forward_match(fgraph: FunctionGraph, node: Apply) -> tuple | None:
    """(r, y, reg, z, p_leaf, b) of a GELU of a product plus a bias, or None."""
    got = _two_leaf_region(node)
    if got is None:
        return None
    r, y, reg = got
    for p_leaf, d in (reg.leaves, reg.leaves[::-1]):
        if p_leaf.dtype not in epilogue_dtypes() or p_leaf.owner is None:
            continue
        b = bias_vector(d, p_leaf.ndim)
        if b is None:
            continue
        p_samples = _samples(p_leaf.dtype, _Z)
        b_samples = _samples(d.dtype, np.linspace(-1.5, 1.5, _Z.size))
        z_want = p_samples.astype(np.float64) + b_samples.astype(np.float64)
        values = {p_leaf: p_samples, d: b_samples}
        internal = [n.outputs[0] for n in reg.nodes]
        got = reg.evaluate(values, internal)
        by_var = dict(zip(internal, got))
        if not _close(by_var[y], gelu_tanh(z_want)):
            continue
        zs = [v for v in internal if v.dtype == y.dtype and _close(by_var[v], z_want)]
        if len(zs) != 1:
            continue
        return r, y, reg, zs[0], p_leaf, b
    return None


def local_gelu_forward(fgraph: FunctionGraph, node: Apply) -> list | None:
    """``r = gelu(p + b)`` of a product p -> GpuGemmEpilogue{gelu_aux_bias}; the
    arithmetic's other readers recompute it from the aux output."""
    m = _forward_match(fgraph, node)
    if m is None:
        return None
    r, y, reg, z, p_leaf, b = m
    cast_p = [n for n in reg.nodes if p_leaf in n.inputs]
    prod = _product(p_leaf, fgraph, set(cast_p))
    if prod is None:
        return None
    p, reshape = prod[:2]
    # the values other nodes read must come from z alone (p is not written any more)
    rewire = []
    for n in reg.nodes:
        v = n.outputs[0]
        if v is r or not _outside_readers(fgraph, reg, v, node):
            continue
        if reg.depends_on(v, p_leaf, besides=z):
            return None
        rewire.append(v)
    dtype = p.dtype
    if b.dtype != dtype:
        if dtype not in HALF_DTYPES or b.dtype != "float32":
            return None
        b = GpuElemwise(Cast(dtype))(b)        # autocast's half bias (gemm_epilogue.py)
    x, w = p.owner.inputs
    out, aux = GpuGemmEpilogue("gelu_aux_bias")(x, w, b)
    new_r, aux_r = _reshaped(reshape, out), _reshaped(reshape, aux)
    if new_r.type != r.type:
        return None
    z_new = aux_r if z.dtype == aux_r.dtype else GpuElemwise(Cast(z.dtype))(aux_r)
    if z_new.type != z.type:
        return None
    for v in (out, new_r, aux_r, z_new):
        v.owner.tag.trace = getattr(node.tag, "trace", [])
    pairs = [(r, new_r)]
    memo: dict = {}
    for v in rewire:
        pairs.append((v, _rebuild(v, z, z_new, memo)))
    return pairs + _moved(prod, p_leaf, out, new_r)


# --- backward

def _aux_of(var: Variable) -> Variable | None:
    """The gelu_aux_bias epilogue's aux output that ``var`` is (or a reshape of), else None."""
    node = var.owner
    reshape = node if node is not None and type(node.op) is GpuReshape else None
    src = node.inputs[0] if reshape is not None else var
    en = src.owner
    if en is None or type(en.op) is not GpuGemmEpilogue or en.op.epilogue != \
            "gelu_aux_bias" or src is not en.outputs[1]:
        return None
    return src


def local_gelu_backward(fgraph: FunctionGraph, node: Apply) -> list | None:
    """``g * gelu'(a)`` of a product g and an aux output a -> GpuGemmEpilogue{dgelu}."""
    got = _two_leaf_region(node)
    if got is None:
        return None
    r, y, reg = got
    for g_leaf, a_leaf in (reg.leaves, reg.leaves[::-1]):
        got = _aux_of(a_leaf)
        if got is None or g_leaf.dtype != a_leaf.dtype or g_leaf.type != a_leaf.type:
            continue
        aux = got
        g_samples = _samples(g_leaf.dtype, np.linspace(-2.0, 2.0, _Z.size))
        a_samples = _samples(a_leaf.dtype, _Z)
        (val,) = reg.evaluate({g_leaf: g_samples, a_leaf: a_samples})
        want = g_samples.astype(np.float64) * gelu_tanh_grad(a_samples)
        if not _close(val, want):
            continue
        readers = {n for n in reg.nodes if g_leaf in n.inputs}
        prod = _product(g_leaf, fgraph, readers, columns=False)
        if prod is None:
            continue
        p, reshape = prod[:2]
        if p.type != aux.type:
            continue
        # values other nodes read that need g cannot be kept (y's readers: below)
        if any(_outside_readers(fgraph, reg, n.outputs[0], node) and
               reg.depends_on(n.outputs[0], g_leaf)
               for n in reg.nodes if n.outputs[0] is not r and n.outputs[0] is not y):
            continue
        x, w = p.owner.inputs
        # the elementwise product pairs g and a position by position (neither broadcast),
        # and reshapes keep C order: dgelu reads aux in C order as the product's shape, so
        # the pairs are the same whatever shapes the reshapes gave (no shape computed here:
        # a host node reading a GPU value's shape mid-step would split the step's graph)
        out = GpuGemmEpilogue("dgelu")(x, w, aux)
        new_r = _reshaped(reshape, out)
        if new_r.type != r.type:
            continue
        for v in (out, new_r):
            v.owner.tag.trace = getattr(node.tag, "trace", [])
        pairs = [(r, new_r)]
        if r is not y and _outside_readers(fgraph, reg, y, node):
            y_new = GpuElemwise(Cast(y.dtype))(new_r)    # the float32 readers: rounded once
            if y_new.type != y.type:
                continue
            pairs.append((y, y_new))
        return pairs + _moved(prod, g_leaf, out, new_r)
    return None


def local_gelu_without_aux(fgraph: FunctionGraph, node: Apply) -> list | None:
    """GpuGemmEpilogue{gelu_aux_bias} whose aux nothing reads (inference, or a gradient
    that needs no GELU) -> GpuGemmEpilogue{gelu_bias}, which does not write it (63 us
    against 80 for the GPT block's bf16 MLP product on an H200)."""
    if type(node.op) is not GpuGemmEpilogue or node.op.epilogue != "gelu_aux_bias" or \
            _clients(fgraph, node.outputs[1]):
        return None
    return [GpuGemmEpilogue("gelu_bias")(*node.inputs)]


def gpu_gelu_epilogue(fgraph: FunctionGraph) -> int:
    """Fold GELUs into their products, then their gradients; how many were folded."""
    if not epilogue_dtypes():
        return 0
    return sweep(fgraph, local_gelu_forward, "gpu_gelu_epilogue") + \
        sweep(fgraph, local_gelu_backward, "gpu_gelu_epilogue") + \
        sweep(fgraph, local_gelu_without_aux, "gpu_gelu_epilogue")


# before gpu_gemm_epilogue (49.46), which would take the bias of a product whose sum only a
# GELU reads, and gpu_fusion (49.5)
optdb.register("gpu_gelu_epilogue", gpu_gelu_epilogue, 49.455, "fast_run", "fusion", "gpu")
