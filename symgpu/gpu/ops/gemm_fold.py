"""``z + s * dot(x, y)`` on the GPU as one GpuGemm (pass ``gpu_gemm_fold``, position 45).

Why: a graph built on GPU variables (shared variables that live on the GPU) is made of GPU
ops from the start, so the host pass that folds scalings and sums into Gemm (``blas`` at 20,
symgpu/tensor/rewriting/blas.py) never sees it: an SGD update ``W - lr * dot(h.T, d)``
stays a GpuDot22 writing the gradient and a GpuElemwise reading it and W.  Folded, the
update is one cuBLASLt call that reads W as C and writes the new value apart
(symgpu/gpu/ops/blaslt.py): one pass over W fewer, one kernel fewer.

Runs after lifting and before GPU fusion (which would hide the pattern in a Composite),
only with ``gpuarray.cublaslt`` on (classic cuBLAS would copy z into the output first,
which costs what the elementwise kernel did).  The product and its scaling must have no
other reader, z must have the result's type (no broadcasting), the scale a constant.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.ops.blas import BLAS_DTYPES, GpuDot22, GpuGemm
from symgpu.gpu.ops.elemwise import GpuElemwise

__all__ = ["local_gpu_gemm_fold", "gpu_gemm_fold"]


def _scalar_name(node: Apply | None) -> str | None:
    if node is None or type(node.op) is not GpuElemwise or node.op.inplace_pattern:
        return None
    return getattr(node.op.scalar_op, "name", None)


def _constant_scale(var: Variable) -> float | None:
    const = constant_behind(var)
    if const is None:
        return None
    data = np.asarray(const.data)
    return float(data.reshape(())) if data.size == 1 else None


def _only_reader(fgraph: FunctionGraph, var: Variable, node: Apply) -> bool:
    clients = fgraph.clients.get(var, [])
    return len(clients) == 1 and clients[0][0] is node and var not in fgraph.outputs


def _product_term(fgraph: FunctionGraph, var: Variable, reader: Apply
                  ) -> tuple[float, Apply] | None:
    """(s, GpuDot22 node) when ``var`` is ``dot(x, y)`` or ``s * dot(x, y)`` (s a constant)
    read only by ``reader``."""
    node = var.owner
    if node is None or not _only_reader(fgraph, var, reader):
        return None
    if type(node.op) is GpuDot22:
        return 1.0, node
    if _scalar_name(node) != "mul" or len(node.inputs) != 2:
        return None
    for k in (0, 1):
        s, other = _constant_scale(node.inputs[k]), node.inputs[1 - k]
        if s is not None and other.owner is not None and type(other.owner.op) is GpuDot22 \
                and _only_reader(fgraph, other, node):
            return s, other.owner
    return None


def local_gpu_gemm_fold(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuElemwise{add|sub}(z, s * GpuDot22(x, y)) (either order) -> GpuGemm(z, +-s, x, y,
    +-1); None where ``node`` is not that."""
    name = _scalar_name(node)
    if name not in ("add", "sub") or len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    if out.ndim != 2 or out.dtype not in BLAS_DTYPES or any(out.broadcastable):
        return None
    for k in (1, 0):                      # the product second (z - s*dot) first
        term = _product_term(fgraph, node.inputs[k], node)
        z = node.inputs[1 - k]
        if term is None or z.type != out.type:
            continue
        s, dot = term
        alpha, beta = s, 1.0
        if name == "sub":
            alpha, beta = (-s, 1.0) if k == 1 else (s, -1.0)
        dtype = out.dtype
        new = GpuGemm(False)(z, np.asarray(alpha, dtype), dot.inputs[0], dot.inputs[1],
                             np.asarray(beta, dtype))
        return [new] if new.type == out.type else None
    return None


def gpu_gemm_fold(fgraph: FunctionGraph) -> None:
    """Apply `local_gpu_gemm_fold` everywhere (one sweep; with ``gpuarray.cublaslt`` on)."""
    from symgpu.config import config
    from symgpu.graph.rewriting import InconsistencyError, replace_validate
    if not config.gpuarray.cublaslt:
        return
    for node in list(fgraph.toposort()):
        if node not in fgraph.apply_nodes:
            continue
        new = local_gpu_gemm_fold(fgraph, node)
        if new is None:
            continue
        new[0].owner.tag.trace = getattr(node.tag, "trace", [])
        try:
            replace_validate(fgraph, [(node.outputs[0], new[0])], reason="gpu_gemm_fold")
        except InconsistencyError:
            continue


optdb.register("gpu_gemm_fold", gpu_gemm_fold, 45, "fast_run", "gpu")
