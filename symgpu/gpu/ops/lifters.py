"""GPU versions of the CPU compute ops, registered with the placement pass, and the rewrite
that fuses an elementwise producer into the reduction that is its only client.

Lifters (``register_lifter``, see symgpu/gpu/placement/rewriting.py) map one CPU node to GPU variables
or decline (None: the node stays on the CPU).  They never make nodes in place: the placement
pass shares one upload among all readers of a host value, so only ``make_gpu_inplace`` (after
fusion, with the DestroyHandler's rules, as the CPU's in-place pass) decides what may be
overwritten.  Passes registered here, by position (see symgpu/graph/rewriting/db.py):

  41.5  gpu_scalar_uploads   host arithmetic on one-element values feeding an upload goes up;
                             an uploaded input's length is read from its upload
  49.5  gpu_fusion           the CPU fusion algorithm over GpuElemwise (one kernel per chain)
  49.55 gpu_recompute        a fused kernel's output read only by other elementwise kernels is
                             recomputed there from its inputs where that moves fewer bytes
  60    gpu_careduce_pre_op  an elementwise producer read only by a reduction joins its kernel
  76    gpu_inplace          GpuElemwise / GpuGemv / GpuGemm / GpuIncSubtensor write into
                             a dying input
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.ops.blas import (BLAS_DTYPES, GEMM_DTYPES, GpuDot22, GpuGemm, GpuGemv, GpuGer,
                                 gpu_matvec)
from symgpu.gpu.ops.careduce import GpuCAReduce, careduce_supported
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.subtensor import GpuIncSubtensor
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuFromHost, GpuShape_i
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import gpu_supports_dtype
from symgpu.gpu.runtime.codegen.scalar import supports_scalar_op
from symgpu.graph.basic import Apply, Constant, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import (InconsistencyError, attach_destroy_handler, replace_validate,
                                    sweep, why_not_destroyable)
from symgpu.graph.rewriting.basic import node_rewriter
from symgpu.graph.rewriting.db import optdb
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.printing import Print as _Print
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.blas import Dot22 as _Dot22, Gemm as _Gemm, Gemv as _Gemv
from symgpu.tensor.elemwise import (CAReduce as _CAReduce, DimShuffle as _DimShuffle,
                                    Elemwise as _Elemwise)
from symgpu.tensor.math import Dot as _Dot
from symgpu.tensor.rewriting.elemwise import fuse_elemwise
from symgpu.tensor.rewriting.leading_dims import sink_leading_dims_of
from symgpu.tensor.rewriting.recompute import recompute_exported_values
from symgpu.tensor.shape import Shape_i as _Shape_i

__all__ = ["lift_elemwise", "lift_careduce", "lift_dot", "lift_dot22", "lift_gemv",
           "lift_gemm", "fuse_careduce_pre_op", "local_careduce_pre_op", "gpu_fusion",
           "make_gpu_inplace", "local_upload_scalar_operands"]


def _dtypes(vs: Any) -> list[str]:
    return [v.dtype for v in vs]


@register_lifter(_Elemwise)
def lift_elemwise(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Elemwise -> GpuElemwise (any table row or Composite with a CUDA rendering)."""
    if not supports_scalar_op(op.scalar_op, _dtypes(node.inputs)):
        return None
    out = GpuElemwise(op.scalar_op)(*inputs)
    return out if isinstance(out, list) else [out]


@register_lifter(_CAReduce)
def lift_careduce(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """CAReduce (sum, prod, max, min, all, any) -> GpuCAReduce."""
    if not careduce_supported(op.scalar_op, None, _dtypes(node.inputs)):
        return None
    return [GpuCAReduce(op.scalar_op, op.axis, getattr(op, "dtype", None))(inputs[0])]


def _blas_ok(*vs: Variable, dtypes: tuple = BLAS_DTYPES) -> bool:
    return len({v.dtype for v in vs}) == 1 and vs[0].dtype in dtypes


def _column_product(A: Variable, x: Variable) -> Variable:
    """``dot(A, x)`` of a matrix and a vector as GpuDot22 of one column (the half dtypes:
    cuBLAS has no half gemv; cuBLASLt takes the n = 1 product)."""
    col = GpuDimShuffle(x.broadcastable, (0, "x"))(x)
    prod = GpuDot22()(A, col)
    return GpuDimShuffle(prod.broadcastable, (0,))(prod)


@register_lifter(_Dot)
def lift_dot(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Dot: matrix@matrix -> GpuDot22, matrix@vector and vector@matrix -> GpuGemv (on a
    GpuAllocEmpty, as Theano did; a GpuDot22 of one column in float16/bfloat16),
    vector@vector -> a fused multiply-sum reduction."""
    x, y = inputs
    out_dtype = node.outputs[0].dtype
    if x.ndim == 1 and y.ndim == 1:
        mul = SCALAR_OPS["mul"]
        if not careduce_supported(SCALAR_OPS["add"], mul, [x.dtype, y.dtype]):
            return None
        return [GpuCAReduce("add", None, out_dtype, mul)(x, y)]
    if _blas_ok(x, y, node.outputs[0], dtypes=GEMM_DTYPES) and x.dtype not in BLAS_DTYPES:
        if x.ndim == 2 and y.ndim == 2:
            return [GpuDot22()(x, y)]
        if x.ndim == 2:
            return [_column_product(x, y)]
        return [_column_product(GpuDimShuffle(y.broadcastable, (1, 0))(y), x)]
    if not _blas_ok(x, y, node.outputs[0]):
        return None
    if x.ndim == 2 and y.ndim == 2:
        return [GpuDot22()(x, y)]
    if x.ndim == 2:
        return [gpu_matvec(x, y)]
    return [gpu_matvec(GpuDimShuffle(y.broadcastable, (1, 0))(y), x)]


@register_lifter(_Dot22)
def lift_dot22(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    if not _blas_ok(*inputs, node.outputs[0], dtypes=GEMM_DTYPES):
        return None
    return [GpuDot22()(*inputs)]


def _scalar(inputs: Any, i: int) -> Variable:
    """BLAS alpha/beta: the GPU value when it already lived there, else the host one (host
    pointer mode; constants are read once)."""
    return inputs[i] if inputs.was_on_gpu[i] else inputs.host(i)


def _is_one(var: Variable) -> bool:
    const = constant_behind(var)
    if const is None:
        return False
    data = np.asarray(const.data)
    return data.size == 1 and data.reshape(()) == 1


def _bias_add(node: Apply, inputs: Any, product: Any) -> list[Variable] | None:
    """``dot(x, w) + b`` (a Gemm whose C is broadcast, alpha = beta = 1) as the bare
    product plus an elementwise add: on the GPU the broadcast C would cost a copy kernel
    filling the output, while the add fuses into the kernel that reads the result next
    (the ReLU, the sigmoid...). None where this is not that case."""
    acc, out = node.inputs[0], node.outputs[0]
    if acc.broadcastable == out.broadcastable or not (_is_one(node.inputs[1])
                                                      and _is_one(node.inputs[4])):
        return None
    res = GpuElemwise(SCALAR_OPS["add"])(product(), inputs[0])
    return [res] if res.broadcastable == out.broadcastable else None


@register_lifter(_Gemv)
def lift_gemv(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Gemv(y, alpha, A, x, beta) -> GpuGemv (``w - lr * dot(x.T, g)`` is one call)."""
    y, _, A, x, _ = inputs
    if not _blas_ok(y, A, x):
        return None
    return [GpuGemv(False)(y, _scalar(inputs, 1), A, x, _scalar(inputs, 4))]


@register_lifter(_Gemm)
def lift_gemm(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """Gemm(z, alpha, x, y, beta) -> GpuGemm."""
    z, _, x, y, _ = inputs
    if not _blas_ok(z, x, y):
        return None
    return _bias_add(node, inputs, lambda: GpuDot22()(x, y)) or \
        [GpuGemm(False)(z, _scalar(inputs, 1), x, y, _scalar(inputs, 4))]


# ----------------------------------------------------------------------------- fusion

def local_careduce_pre_op(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuCAReduce(GpuElemwise(f)(a, b, ..)) -> GpuCAReduce(pre=f)(a, b, ..) when the
    elementwise result has no other reader: the reduction reads a, b once and the
    intermediate array is never written."""
    op = node.op
    if not isinstance(op, GpuCAReduce) or op.pre_scalar_op is not None or \
            op.post_scalar_op is not None:
        return None
    x = node.inputs[0]
    src = x.owner
    if src is None or not isinstance(src.op, GpuElemwise) or src.op.inplace_pattern \
            or len(src.outputs) != 1 or x in fgraph.outputs:
        return None
    if len(fgraph.clients.get(x, [])) != 1:
        return None
    if not careduce_supported(op.scalar_op, src.op.scalar_op, _dtypes(src.inputs)):
        return None
    new = GpuCAReduce(op.scalar_op, op.axis, op.dtype, src.op.scalar_op)(*src.inputs)
    if new.type != node.outputs[0].type:
        return None
    return [new]


def fuse_careduce_pre_op(fgraph: FunctionGraph) -> None:
    """Apply `local_careduce_pre_op` everywhere (one sweep; fused nodes are final)."""
    sweep(fgraph, local_careduce_pre_op, "local_careduce_pre_op")


def gpu_sink_leading_dims(fgraph: FunctionGraph) -> None:
    """symgpu/tensor/rewriting/leading_dims.py over GpuElemwise/GpuDimShuffle."""
    sink_leading_dims_of(fgraph, GpuElemwise, GpuDimShuffle)


def gpu_fusion(fgraph: FunctionGraph) -> None:
    """The CPU fusion pass's algorithm over GpuElemwise nodes."""
    fuse_elemwise(fgraph, GpuElemwise, GpuElemwise, inline_lone_constants=True)


def gpu_recompute(fgraph: FunctionGraph) -> None:
    """Recompute instead of store, over GpuElemwise (symgpu/tensor/rewriting/recompute.py)."""
    recompute_exported_values(fgraph, GpuElemwise, GpuElemwise)


def _uploads_an_argument(var: Variable) -> bool:
    """Whether `var` is the upload of an array the caller passes: a device array fed there
    is read where it is only while no kernel writes into the upload (placement/basic_ops.py
    ``may_borrow``), so elementwise kernels write elsewhere (a pool block costs less than
    that copy)."""
    src = var.owner
    return src is not None and isinstance(src.op, GpuFromHost) and \
        src.inputs[0].owner is None and not isinstance(src.inputs[0], Constant) and \
        not all(var.type.broadcastable)


def _destroyable_inputs(fgraph: FunctionGraph, node: Apply, out: Variable, taken: set,
                        why_not: Any) -> list[int]:
    # an elementwise kernel may as well write into a fresh block; a BLAS accumulator not
    # written in place is copied first, which costs what a copy of the upload would
    spare_uploads = type(node.op) is GpuElemwise
    return [i for i, inp in enumerate(node.inputs)
            if i not in taken and inp.type == out.type and node.inputs.count(inp) == 1
            and not (spare_uploads and _uploads_an_argument(inp))
            and why_not(fgraph, inp, node) is None]


def make_gpu_inplace(fgraph: FunctionGraph) -> int:
    """Switch GPU nodes to in-place versions where the DestroyHandler's rules allow (an
    intermediate read by nobody else); returns how many changed."""
    nodes = [n for n in fgraph.toposort()
             if (type(n.op) is GpuElemwise and not n.op.inplace_pattern)
             or (type(n.op) in (GpuGemv, GpuGemm, GpuGer, GpuIncSubtensor)
                 and not n.op.inplace)]
    if not nodes:
        return 0
    attach_destroy_handler(fgraph)
    changed = 0
    for node in nodes:
        if node not in fgraph.apply_nodes:
            continue
        op = node.op
        if type(op) is GpuElemwise:
            pattern: dict[int, int] = {}
            for o, out in enumerate(node.outputs):
                cands = _destroyable_inputs(fgraph, node, out, set(pattern.values()),
                                            why_not_destroyable)
                if cands:
                    pattern[o] = cands[0]
            new_op = GpuElemwise(op.scalar_op, pattern, op.name) if pattern else None
        else:
            cands = _destroyable_inputs(fgraph, node, node.outputs[0], set(),
                                        why_not_destroyable)
            if cands[:1] != [0]:
                new_op = None
            elif type(op) is GpuIncSubtensor:   # writes the region into x itself: no copy
                new_op = GpuIncSubtensor(op.idx_list, op.set_instead_of_inc, True)
            else:
                new_op = type(op)(True)
        if new_op is None:
            continue
        try:
            new = new_op.make_node(*node.inputs).outputs
            new[0].owner.tag.__dict__.update(node.tag.__dict__)
            replace_validate(fgraph, list(zip(node.outputs, new)), reason="gpu_inplace")
            changed += 1
        except (InconsistencyError, TypeError):
            continue
    return changed


# ----------------------------------------------------------------------------- scalar uploads

@node_rewriter([GpuFromHost])
def local_upload_scalar_operands(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuFromHost(Elemwise(a, b)) -> GpuElemwise(GpuFromHost(a), GpuFromHost(b)) and
    GpuFromHost(DimShuffle(a)) -> GpuDimShuffle(GpuFromHost(a)), for one-element values read
    by nothing else on the host.

    Why: the placement pass keeps integer scalars on the host (they feed shapes), so a
    mean's divisor ``cast(x.shape[0], 'float32')`` is computed by host ops (a few us of
    Python each, every call) and then uploaded.  Uploading the shape itself instead (a graph
    parameter: gpu/runtime/graph_params.py) moves the cast into the GPU kernel that reads it."""
    x = node.inputs[0]
    src = x.owner
    if src is None or not all(x.type.broadcastable) or len(fgraph.clients.get(x, ())) != 1:
        return None
    ctx = node.op.context_name
    if isinstance(src.op, _DimShuffle):
        a = src.inputs[0]
        up = GpuFromHost(ctx)(a)
        return [GpuDimShuffle(a.broadcastable, src.op.new_order)(up)]
    if not isinstance(src.op, _Elemwise) or len(src.outputs) != 1 or not all(
            all(v.type.broadcastable) and gpu_supports_dtype(v.type.dtype) for v in src.inputs) \
            or not supports_scalar_op(src.op.scalar_op, _dtypes(src.inputs)):
        return None
    out = GpuElemwise(src.op.scalar_op)(*[GpuFromHost(ctx)(v) for v in src.inputs])
    return [out] if out.type == node.outputs[0].type else None


@node_rewriter([GpuFromHost])
def local_upload_shape_from_the_upload(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuFromHost(Shape_i{k}(x)) -> GpuFromHost(GpuShape_i{k}(GpuFromHost(x))) when x is
    uploaded anyway (an existing GpuFromHost(x) on the same context is read).

    Why: a host read of an uploaded input's length (the tutorials' mean over a minibatch
    passed per call) runs before the CUDA-graph segment and reaches it as a graph parameter,
    uploaded on every replay.  Read from the upload, the length is captured with the segment:
    the upload's shape already keys its graphs, so no parameter is needed."""
    src = node.inputs[0].owner
    if src is None or type(src.op) is not _Shape_i:
        return None
    x = src.inputs[0]
    ctx = node.op.context_name
    for client, _ in fgraph.clients.get(x, ()):
        if client != "output" and type(client.op) is GpuFromHost and \
                client.op.context_name == ctx:
            read = GpuShape_i(src.op.i)(client.outputs[0])
            return [GpuFromHost(ctx)(read)]
    return None


gpu_scalar_uploads = EquilibriumRewriter([local_upload_scalar_operands,
                                          local_upload_shape_from_the_upload],
                                         name="gpu_scalar_uploads")


# after lifting (40): fuse chains, absorb producers into reductions, then go in place
optdb.register("gpu_scalar_uploads", gpu_scalar_uploads, 41.5, "fast_run", "gpu")
optdb.register("gpu_sink_leading_dims", gpu_sink_leading_dims, 48.6, "fast_run", "fusion",
               "gpu")
optdb.register("gpu_fusion", gpu_fusion, 49.5, "fast_run", "fusion", "gpu")
optdb.register("gpu_recompute", gpu_recompute, 49.55, "fast_run", "fusion", "gpu")
optdb.register("gpu_careduce_pre_op", fuse_careduce_pre_op, 60, "fast_run", "gpu")
optdb.register("gpu_inplace", make_gpu_inplace, 76, "fast_run", "inplace", "gpu")


@register_lifter(_Print)
def lift_print(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Variable] | None:
    """symgpu.printing.Print takes any type: it stays where its input is (the value is
    copied to the host only to be printed), so lifting adds no transfer pair around it."""
    return [op(inputs[0])]
