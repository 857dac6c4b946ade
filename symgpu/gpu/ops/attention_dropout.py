"""Attention with dropout in a graph compiled for the GPU: the fused kernels do not draw the
dropout yet, so `Attention` and `AttentionGrad` nodes with dropout are written out in
ordinary ops (tensor/nnet/attention_written.py: the products, the softmax's terms and the
same Philox draw) before mixed precision, blas and the move to the GPU, which take them as
they take attention written out by a user. The values are the fused ops' (the same dropped
elements); on the host the fused ops run as they are."""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import sweep
from symgpu.graph.rewriting.db import POSITIONS, optdb
from symgpu.gpu.placement.rewriting import _on_device
from symgpu.gpu.placement.type import default_context_active
from symgpu.tensor.nnet.attention import Attention, AttentionGrad
from symgpu.tensor.nnet.attention_written import written_out, written_out_grad
from symgpu.tensor.type import specify_broadcastable_as

__all__ = ["write_out_dropout_attention"]


def _written(fgraph: FunctionGraph, node: Apply) -> list[Any] | None:
    op = node.op
    if getattr(op, "dropout", None) is None:
        return None
    if isinstance(op, Attention):
        new = written_out(op, node.inputs, node.outputs[1].dtype)
    elif isinstance(op, AttentionGrad):
        new = written_out_grad(op, node.inputs)
    else:
        return None
    return [(old, specify_broadcastable_as(n, old.type)) for old, n in zip(node.outputs, new)]


def write_out_dropout_attention(fgraph: FunctionGraph) -> int:
    """Write out every attention node with dropout when the graph goes to a GPU; returns how
    many were written out."""
    if not default_context_active() and not any(_on_device(v) for v in fgraph.variables):
        return 0
    return sweep(fgraph, _written, "write_out_dropout_attention")


optdb.register("gpu_attention_dropout_written_out", write_out_dropout_attention,
               POSITIONS["mixed_precision"] - 0.5, "fast_run", "fast_compile", "gpu")
