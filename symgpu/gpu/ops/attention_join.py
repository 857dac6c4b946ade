"""The attention gradient written straight into the join that its three gradients feed.

Why: a transformer block slices q, k and v from one product (``qkv[:, :, j*D:(j+1)*D]``,
heads split by a reshape and ``dimshuffle(0, 2, 1, 3)``), so the gradient of that product is
``join(2, merge(dq), merge(dk), merge(dv)[, zeros for the rest of qkv])`` with
``merge(x) = x.dimshuffle(0, 2, 1, 3).reshape((B, S, H * d))``. GpuAttentionGrad stores its
outputs heads-merged, so each merge is a view, but the join still copies all three into a
new array (91 us of the GPT step on the H200, a fifth of attention's own time). The kernels
take any output strides: here they write dq, dk and dv into their columns of the joined
array, and the join's other pieces are copied in.

The reshapes' target shapes are known only when the node runs: where they do not merge the
heads of (B, H, S, d) gradients into (B, S, H * d), or a size is 0, the node computes the
gradients, reshapes and joins them as the graph said.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.gpu.ops.attention import GpuAttentionGrad, _GpuAttentionBase, grads_into
from symgpu.gpu.ops.subtensor import GpuJoin, join_gpu_arrays
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuReshape, as_gpuarray_variable
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import new_array
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.basic import as_tensor_variable

__all__ = ["GpuAttentionGradJoin", "gpu_attention_grad_join"]

_HEADS_MERGE = (0, 2, 1, 3)


class GpuAttentionGradJoin(_GpuAttentionBase):
    """``join(2, *before, merge(dq), merge(dk), merge(dv), *after)`` of a GpuAttentionGrad
    with these props. Inputs: the gradient's own, the three merges' target shapes (int64
    vectors), then the ``before`` and ``after`` pieces (3-d GPU arrays)."""

    __props__ = ("causal", "scale", "has_mask", "has_dlse", "before", "after", "dropout")
    deterministic = False   # dq's float atomics, as GpuAttentionGrad

    def __init__(self, causal: bool = False, scale: float | None = None,
                 has_mask: bool = False, has_dlse: bool = False, before: int = 0,
                 after: int = 0, dropout: Any = None) -> None:
        super().__init__(causal, scale, has_mask, has_dlse, dropout)
        self.before, self.after = int(before), int(after)

    def __str__(self) -> str:
        base = GpuAttentionGrad.__str__(self)     # (Attention's: the class name and props)
        return f"{base[:-1]},before={self.before},after={self.after}}}"

    @property
    def n_grad(self) -> int:
        """How many inputs are the attention gradient's own."""
        return 6 + self.has_mask + self.has_dlse + (self.dropout is not None)

    def make_node(self, *inputs: Any) -> Apply:
        n = self.n_grad
        if len(inputs) != n + 3 + self.before + self.after:
            raise TypeError(f"{self} takes {n + 3 + self.before + self.after} inputs, got "
                            f"{len(inputs)}")
        gins, ctx = self._gpu_inputs(list(inputs[:n]))
        q = gins[0]
        if q.ndim != 4:
            raise TypeError(f"{self}: q must be 4-d (batch, heads, rows, head dim), got {q.type}")
        shapes = [as_tensor_variable(s) for s in inputs[n:n + 3]]
        if any(s.ndim != 1 or not s.dtype.startswith("int") for s in shapes):
            raise TypeError(f"{self}: the merges' shapes must be int vectors, got "
                            f"{', '.join(str(s.type) for s in shapes)}")
        pieces = [as_gpuarray_variable(p, ctx) for p in inputs[n + 3:]]
        if any(p.ndim != 3 or p.dtype != q.dtype for p in pieces):
            raise TypeError(f"{self}: the other pieces must be 3-d {q.dtype} arrays, got "
                            f"{', '.join(str(p.type) for p in pieces)}")
        out = GpuArrayType(q.dtype, (False, False, False), ctx)()
        return Apply(self, gins + shapes + pieces, [out])

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        n = self.n_grad
        merged = node.inputs[n:n + 3]
        cols = merged[0][2] + merged[1][2] + merged[2][2]
        for piece in shapes[n + 3:]:
            cols = cols + piece[2]
        return [(merged[0][0], merged[0][1], cols)]

    def _run(self, ctx: Any, *inputs: Any) -> list[Any]:
        n = self.n_grad
        grad_in = inputs[:n]
        targets = [tuple(int(x) for x in np.asarray(s).reshape(-1)) for s in inputs[n:n + 3]]
        pieces = list(inputs[n + 3:])
        before, after = pieces[:self.before], pieces[self.before:]
        q, k, v = grad_in[:3]
        B, H, S, d = q.shape
        merged = (B, S, H * d)
        direct = (q.size and k.size and k.shape == v.shape == q.shape and
                  targets == [merged] * 3 and all(p.shape[:2] == (B, S) for p in pieces))
        if not direct:
            grads = grads_into(self, ctx, grad_in)
            try:
                joined = [g.transpose(*_HEADS_MERGE).reshape(t) for g, t in zip(grads, targets)]
            except ValueError as e:
                raise ValueError(f"{self}: merging the gradients' heads: {e}") from None
            return [join_gpu_arrays(before + joined + after, 2, q.dtype)]
        start = sum(p.shape[2] for p in before)
        total = start + 3 * H * d + sum(p.shape[2] for p in after)
        res = new_array(ctx, (B, S, total), q.dtype)
        isz = res.itemsize
        strides = (S * total * isz, d * isz, total * isz, isz)   # (B, H, S, d) in the join
        outs = [res._view(res.ptr + (start + j * H * d) * isz, (B, H, S, d), strides)
                for j in range(3)]
        grads_into(self, ctx, grad_in, outs)
        col = 0
        for p in pieces:
            if col == start:
                col += 3 * H * d
            if p.size:
                res[:, :, col:col + p.shape[2]]._copy_from_device(p)
            col += p.shape[2]
        return [res]


def _merged_grad(x: Any, fgraph: FunctionGraph) -> tuple[Apply, int, Any] | None:
    """(the GpuAttentionGrad, which output, the reshape's shape) where ``x`` is
    ``GpuReshape{3}(GpuDimShuffle{0,2,1,3}(grad.outputs[j]), shape)`` read only by the join,
    its dimshuffle only by the reshape and the gradient only by the dimshuffle."""
    r = x.owner
    if r is None or not isinstance(r.op, GpuReshape) or r.op.ndim != 3:
        return None
    ds = r.inputs[0].owner
    if ds is None or not isinstance(ds.op, GpuDimShuffle) or \
            tuple(ds.op.new_order) != _HEADS_MERGE:
        return None
    g = ds.inputs[0].owner
    if g is None or type(g.op) is not GpuAttentionGrad or g.inputs[0].ndim != 4:
        return None
    if any(len(fgraph.clients.get(v, [])) != 1 for v in (x, r.inputs[0], ds.inputs[0])):
        return None
    return g, g.outputs.index(ds.inputs[0]), r.inputs[1]


def _join_replacement(fgraph: FunctionGraph, node: Apply) -> Any | None:
    """The GpuAttentionGradJoin for a GpuJoin on axis 2 of whose pieces three consecutive
    ones are one attention gradient's dq, dk and dv merged (None where there are none)."""
    if node.op.axis not in (2, -1) or len(node.inputs) < 3:
        return None
    found = [_merged_grad(x, fgraph) for x in node.inputs]
    for i in range(len(node.inputs) - 2):
        run = found[i:i + 3]
        if any(f is None for f in run) or len({f[0] for f in run}) != 1 or \
                [f[1] for f in run] != [0, 1, 2]:
            continue
        g = run[0][0]
        op = GpuAttentionGradJoin(g.op.causal, g.op.scale, g.op.has_mask, g.op.has_dlse,
                                  before=i, after=len(node.inputs) - i - 3,
                                  dropout=g.op.dropout)
        new = op(*g.inputs, *[f[2] for f in run], *node.inputs[:i], *node.inputs[i + 3:])
        return new if new.type == node.outputs[0].type else None
    return None


def gpu_attention_grad_join(fgraph: FunctionGraph) -> int:
    """Replace every such join by its GpuAttentionGradJoin; returns how many."""
    count = 0
    for node in list(fgraph.toposort()):
        if isinstance(node.op, GpuJoin) and node in fgraph.apply_nodes:
            new = _join_replacement(fgraph, node)
            if new is not None:
                fgraph.replace(node.outputs[0], new, reason="gpu_attention_grad_join")
                count += 1
    return count


optdb.register("gpu_attention_grad_join", gpu_attention_grad_join, 49.47, "fast_run", "gpu")
