"""GpuCommJoin and the pass that puts one behind every GPU collective (gpu_comm_joins).

Why: a collective queued on the context's communication stream (runtime/comm_stream.py) runs
beside the kernels queued after it on the compute stream; whoever reads its result must
first make the compute stream wait for it.  That wait is a node of the graph, so the VM and
the CUDA-graph runner place it like any other: as late as the graph allows (its op's
``schedule_hint`` is "late", the collective's "early": symgpu/link/order.py), right before
the first node that reads the result, or before the function returns when only an output
does.  The join also takes the collective's *input*: the VM then keeps that buffer (and the
memory pool, ordered on the compute stream, does not hand its block out) until the join,
while NCCL may still read it, and no in-place op overwrites it before (a variable with two
readers is never destroyed: graph/rewriting/destroy.py).

The pass runs after the in-place passes, in fast_run and fast_compile, while
``distributed.comm_stream`` is on and device checks report at the next synchronisation
(``gpuarray.sync_checks`` reads each check back at once, on the compute stream).  A
collective without a join (the pass excluded, the flag off) runs on the compute stream, as
before: its thunk forks only when its join was linked (comm_stream.ForkSlot).
"""
from __future__ import annotations

from typing import Any

from symgpu.config import config
from symgpu.gpu.ops.collectives import _GpuCollective
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.gpu.runtime.comm_stream import Fork, comm_stream_of, slot_of
from symgpu.gpu.runtime.device_checks import checks_are_deferred
from symgpu.gradient.core import DisconnectedType
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting.db import optdb

__all__ = ["GpuCommJoin", "gpu_comm_joins", "comm_join"]


class GpuCommJoin(Op):
    """``GpuCommJoin(y, *keep)``: ``y`` (a GPU collective's result) once the compute stream
    has waited for the collective queued on the communication stream; ``keep`` (the
    collective's input) only stays alive until then.  The output is ``y`` itself (a view)."""

    __props__ = ()
    view_map = {0: [0]}
    capturable = True    # a cross-stream wait: captured as the graph's join edge (graphs.py)
    launches = True      # it queues device work (a wait), so the runner places it by index
    schedule_hint = "late"

    def __str__(self) -> str:
        return "GpuCommJoin"

    def make_node(self, y: Any, *keep: Any) -> Apply:
        if not is_gpu_var(y) or y.owner is None or not isinstance(y.owner.op, _GpuCollective):
            owner = getattr(getattr(y, "owner", None), "op", None)
            raise TypeError(f"{self}: the first input must be a GPU collective's result, got "
                            f"{y} of type {getattr(y, 'type', type(y).__name__)} computed by "
                            f"{owner}")
        for k in keep:
            if not is_gpu_var(k) or k.type.context_name != y.type.context_name:
                raise TypeError(f"{self}: kept inputs must be GPU variables of {y}'s context "
                                f"{y.type.context_name!r}, got {k} of {getattr(k, 'type', None)}")
        return Apply(self, [y, *keep], [y.type()])

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [tuple(input_shapes[0])]

    def grad(self, inputs: list, output_grads: list) -> list:
        return [output_grads[0]] + [DisconnectedType()() for _ in inputs[1:]]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        in_cell, out_cell = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        slot = slot_of(in_cell)       # None: the collective's thunk was not linked here
        fork: Fork | None = None
        if slot is not None:
            if slot.fork is None:
                slot.fork = Fork(comm_stream_of(ctx))
            fork = slot.fork

        def thunk() -> None:
            if fork is not None and fork.pending:
                fork.join()
            out_cell[0] = in_cell[0]

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        return thunk

    def perform(self, node: Apply, inputs: list, output_storage: list) -> None:
        """The result itself: a collective forks only through the thunks the linker makes
        (make_thunk above joins it), so a run through perform has nothing to wait for."""
        output_storage[0][0] = inputs[0]


def comm_join(y: Variable) -> Variable:
    """``y`` (a GPU collective's result) read through its join, keeping its input alive."""
    return GpuCommJoin()(y, y.owner.inputs[0])


def _joined(fgraph: FunctionGraph, y: Variable) -> bool:
    clients = fgraph.clients.get(y, [])
    return bool(clients) and all(c != "output" and isinstance(c.op, GpuCommJoin)
                                 for c, _ in clients)


def gpu_comm_joins(fgraph: FunctionGraph) -> int:
    """Read every GPU collective's result through a GpuCommJoin; returns how many joined."""
    if not config.distributed.comm_stream or not checks_are_deferred():
        return 0
    n = 0
    for node in fgraph.toposort():
        if not isinstance(node.op, _GpuCollective):
            continue
        y = node.outputs[0]
        if _joined(fgraph, y) or not fgraph.clients.get(y):
            continue
        fgraph.replace(y, comm_join(y), reason="gpu_comm_joins")
        n += 1
    return n


# after the in-place passes (inplace 75, gpu_inplace 76): nothing rewrites a join, and the
# join's extra reader of the collective's input keeps it from being overwritten in place
optdb.register("gpu_comm_joins", gpu_comm_joins, 80, "fast_run", "fast_compile", "gpu")
