"""Data-parallel training: gradients averaged across ranks, in buckets; parameters broadcast.

Why buckets: one collective per gradient costs a launch and a latency each; PyTorch's DDP
flattens gradients into ~25 MB buckets, one all-reduce each.  Here a bucket is a graph
expression: the gradients flattened and concatenated, one AllReduce, then slices reshaped
back, all of which the GPU pass lifts (the all-reduce to NCCL).  Buckets are filled in reverse
parameter order, the order a backward pass produces gradients (last layer first), so the
first bucket depends only on the last layers' gradients and its collective can run while
earlier layers' gradients are still being computed: on the GPU each all-reduce runs on the
context's communication stream, started right after its bucket's gradients and joined back
right before its slices are read (symgpu/gpu/runtime/comm_stream.py, symgpu/link/order.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.compile.function import clone_replace, function
from symgpu.distributed.communicator import communicator
from symgpu.distributed.ops import AllReduce, Broadcast
from symgpu.graph.basic import Variable
from symgpu.tensor.basic import concatenate
from symgpu.tensor.type import as_tensor_variable

__all__ = ["data_parallel", "broadcast_parameters", "broadcast_function", "plan_buckets",
           "DEFAULT_BUCKET_BYTES"]

#: PyTorch DDP's default bucket_cap_mb
DEFAULT_BUCKET_BYTES = 25 << 20


def _nbytes(param: Any, grad: Variable) -> int | None:
    if param is None:
        return None
    value = param.get_value(borrow=True) if hasattr(param, "get_value") else param
    return int(np.prod(np.shape(value), dtype=np.int64)) * np.dtype(grad.dtype).itemsize


def plan_buckets(grads: Sequence[Variable], sizes: Sequence[int | None],
                 bucket_bytes: int) -> list[list[int]]:
    """Indices of ``grads`` per bucket: reverse order, one dtype per bucket, a bucket closed
    when the next gradient would pass ``bucket_bytes`` (a gradient of unknown size is a
    bucket of its own)."""
    buckets: list[list[int]] = []
    cur: list[int] = []
    used, dtype = 0, None
    for i in reversed(range(len(grads))):
        n = sizes[i]
        if cur and (n is None or sizes[cur[-1]] is None or grads[i].dtype != dtype
                    or used + n > bucket_bytes):
            buckets.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n or 0
        dtype = grads[i].dtype
    if cur:
        buckets.append(cur)
    return buckets


def _reduce_bucket(grads: list[Variable], op: str, group: str) -> list[Variable]:
    if len(grads) == 1:
        return [AllReduce(op, group)(grads[0])]
    flat = concatenate([g.flatten() for g in grads])
    total = AllReduce(op, group)(flat)
    out, offset = [], 0
    for g in grads:
        size = g.size
        out.append(total[offset:offset + size].reshape(g.shape, ndim=g.ndim))
        offset = offset + size
    return out


def data_parallel(grads_or_updates: Any, grads: Sequence[Variable] | None = None,
                  params: Sequence[Any] | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                  op: str = "avg", group: str = "world") -> Any:
    """Make gradients (or the updates built from them) data-parallel.

    - ``data_parallel(grads, params=params)``: the gradients reduced across the ranks of
      ``group`` (``op='avg'``: each rank computed its shard's mean gradient, so the average
      is the full batch's), as a list in the same order;
    - ``data_parallel(updates, grads=grads, params=params)``: the updates (pairs or a dict,
      as given to ``function``) with every gradient of ``grads`` replaced by its reduced one.

    ``params`` (shared variables or arrays, one per gradient) give the sizes that fill
    buckets of ``bucket_bytes``; without them each gradient is reduced alone."""
    if grads is None:
        if isinstance(grads_or_updates, dict) or any(
                isinstance(u, (tuple, list)) for u in grads_or_updates):
            raise TypeError("data_parallel: updates need grads= (the gradient variables "
                            "they are built from)")
        return _reduced(list(grads_or_updates), params, bucket_bytes, op, group)
    reduced = _reduced(list(grads), params, bucket_bytes, op, group)
    pairs = list(grads_or_updates.items()) if isinstance(grads_or_updates, dict) \
        else [tuple(u) for u in grads_or_updates]
    new = clone_replace([as_tensor_variable(v) for _, v in pairs], dict(zip(grads, reduced)))
    out = [(k, v) for (k, _), v in zip(pairs, new)]
    return type(grads_or_updates)(out) if isinstance(grads_or_updates, dict) else out


def _reduced(grads: list[Variable], params: Sequence[Any] | None, bucket_bytes: int, op: str,
             group: str) -> list[Variable]:
    given = list(grads)
    grads = [as_tensor_variable(g) for g in grads]
    if params is not None and len(params) != len(grads):
        raise ValueError(f"data_parallel: {len(params)} params for {len(grads)} gradients")
    sizes = [_nbytes(p, g) for p, g in zip(params or [None] * len(grads), grads)]
    out: list[Variable | None] = [None] * len(grads)
    for bucket in plan_buckets(grads, sizes, bucket_bytes):
        for i, r in zip(bucket, _reduce_bucket([grads[i] for i in bucket], op, group)):
            # the type of the gradient it replaces: a GPU parameter's gradient is a GPU
            # variable, read on the host through HostFromGpu by the collectives' host ops
            # (lifted back to the GPU with them), and uploaded again here
            same = r if r.type == given[i].type else given[i].type.convert_variable(r)
            out[i] = r if same is None else same
    return out   # type: ignore[return-value]


def broadcast_parameters(shared_vars: Sequence[Any], root: int = 0,
                         group: str = "world") -> None:
    """Give every rank rank ``root``'s values of ``shared_vars`` (call once at start, after
    each rank initialised them, so every replica starts from the same point).

    Why two paths: on a communicator that runs device collectives (NCCL) the values never
    leave the GPU: one compiled function of Broadcast ops updates the variables
    (``broadcast_function``; the lifting pass makes them ncclBroadcast on the context's
    stream).  A host communicator broadcasts each value through its host channel."""
    comm = communicator(group)
    shared_vars = list(shared_vars)
    if not shared_vars:
        return
    if getattr(comm, "supports_device", False):
        broadcast_function(shared_vars, root, group)()
        return
    for sv in shared_vars:
        value = np.asarray(sv.get_value())
        sv.set_value(comm.broadcast(value, root))


def broadcast_function(shared_vars: Sequence[Any], root: int = 0,
                       group: str = "world") -> Any:
    """The compiled function (no inputs, no outputs) whose updates set each of
    ``shared_vars`` to rank ``root``'s value: one Broadcast collective per variable, in the
    order given (every rank must pass the same variables in the same order)."""
    return function([], [], updates=[(sv, Broadcast(root, group)(sv)) for sv in shared_vars],
                    name="broadcast_parameters")
