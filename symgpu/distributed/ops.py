"""Collectives as graph ops: AllReduce, Broadcast, AllGather, ReduceScatter.

Why ops: a training step is one compiled function; the gradients' reduction belongs in its
graph, where the GPU lifting pass replaces each host op by its NCCL twin
(symgpu/gpu/ops/collectives.py) and the step's CUDA graph captures it.  The host versions
(NumPy through the group's communicator) run CPU data parallel.

Each op names a *group*; its communicator is looked up when the function is linked
(communicator.communicator), so one graph serves every rank.  Ops that change shapes carry the
world size they were built for (checked against the communicator at link time).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.distributed.communicator import (REDUCE_OPS, Communicator, DistributedError,
                                             communicator)
from symgpu.distributed.schedule import raise_schedule_error
from symgpu.gradient.core import grad_not_implemented
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["Collective", "AllReduce", "Broadcast", "AllGather", "ReduceScatter", "all_reduce",
           "broadcast", "all_gather", "reduce_scatter", "group_communicator"]


def group_communicator(op: Any, node: Apply) -> Communicator:
    """The communicator of ``op.group`` for this thread, checked against the world size the
    op was built for and against the ranks' schedules (schedule.py)."""
    comm = communicator(op.group)
    want = getattr(op, "world_size", None)
    if want is not None and comm.world_size != want:
        raise DistributedError(f"{op} was built for a world of {want} ranks; the communicator "
                               f"of group {op.group!r} has {comm.world_size}")
    raise_schedule_error(node)
    return comm


class Collective(Op):
    """Base of the collective ops: one tensor in, one out; a host thunk calling the group's
    communicator.  ``collective_kind`` names it in schedules and errors."""

    collective_kind = "collective"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        self.check_input(x)
        return Apply(self, [x], [self.output_type(x)()])

    def check_input(self, x: Variable) -> None:
        """Raise for inputs this collective cannot take (TypeError/ValueError)."""

    def output_type(self, x: Variable) -> TensorType:
        return TensorType(x.dtype, x.broadcastable)

    def compute(self, comm: Communicator, x: np.ndarray) -> np.ndarray:
        raise TypeError(f"{type(self).__name__} is an abstract collective")

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Any, impl: str | None = None) -> Callable[[], None]:
        comm = group_communicator(self, node)
        cell, out = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        out_compute = compute_map.get(node.outputs[0])
        dtype = node.outputs[0].dtype

        def thunk() -> None:
            out[0] = np.asarray(self.compute(comm, np.asarray(cell[0])), dtype=dtype)
            if out_compute is not None:
                out_compute[0] = True
        return thunk

    def perform(self, node: Apply, inputs: list, output_storage: list) -> None:
        output_storage[0][0] = self.compute(group_communicator(self, node), inputs[0])

    def schedule_entry(self, node: Apply) -> str:
        """How the schedule check (schedule.py) names this node: op, dtype, dims."""
        x = node.inputs[0].type
        return f"{self} of {x.dtype} {len(x.broadcastable)}-d {tuple(x.broadcastable)}"


def _check_reduce_op(op: str, dtype: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {sorted(REDUCE_OPS)}")
    if op == "avg" and not dtype.startswith(("float", "bfloat")):
        raise TypeError(f"the 'avg' reduction needs floats, got {dtype}: use 'sum' and divide")


class AllReduce(Collective):
    """Every rank gets the reduction (sum, prod, max, min, avg) of every rank's array."""

    __props__ = ("op", "group")
    collective_kind = "all_reduce"

    def __init__(self, op: str = "sum", group: str = "world") -> None:
        if op not in REDUCE_OPS:
            raise ValueError(f"AllReduce: unknown reduce op {op!r}; expected one of "
                             f"{sorted(REDUCE_OPS)}")
        self.op, self.group = op, group

    def __str__(self) -> str:
        return f"AllReduce{{{self.op}, {self.group}}}"

    def check_input(self, x: Variable) -> None:
        _check_reduce_op(self.op, x.dtype)

    def compute(self, comm: Communicator, x: np.ndarray) -> np.ndarray:
        return comm.all_reduce(x, self.op)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [tuple(input_shapes[0])]

    def grad(self, inputs: list, output_grads: list) -> list:
        """d(sum over ranks of each rank's cost)/dx: the same reduction of the output grads
        (sum -> sum, avg -> avg); the other reductions are not implemented."""
        if self.op in ("sum", "avg"):
            return [AllReduce(self.op, self.group)(output_grads[0])]
        return [grad_not_implemented(self, 0, inputs[0], f"only sum and avg are ({self.op})")]


class Broadcast(Collective):
    """Every rank gets rank ``root``'s array (the others' input gives shape and dtype)."""

    __props__ = ("root", "group")
    collective_kind = "broadcast"

    def __init__(self, root: int = 0, group: str = "world") -> None:
        self.root, self.group = int(root), group

    def __str__(self) -> str:
        return f"Broadcast{{root={self.root}, {self.group}}}"

    def compute(self, comm: Communicator, x: np.ndarray) -> np.ndarray:
        return comm.broadcast(x, self.root)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [tuple(input_shapes[0])]

    def grad(self, inputs: list, output_grads: list) -> list:
        return [grad_not_implemented(self, 0, inputs[0], "broadcast parameters with "
                                     "broadcast_parameters() before building the cost")]


class AllGather(Collective):
    """Every rank's array concatenated along axis 0, in rank order."""

    __props__ = ("world_size", "group")
    collective_kind = "all_gather"

    def __init__(self, world_size: int, group: str = "world") -> None:
        self.world_size, self.group = int(world_size), group

    def __str__(self) -> str:
        return f"AllGather{{{self.world_size}, {self.group}}}"

    def check_input(self, x: Variable) -> None:
        if x.ndim == 0:
            raise ValueError(f"{self}: needs at least one dimension to concatenate along "
                             f"(got a scalar {x.type})")

    def output_type(self, x: Variable) -> TensorType:
        first = x.broadcastable[0] and self.world_size == 1
        return TensorType(x.dtype, (first,) + tuple(x.broadcastable[1:]))

    def compute(self, comm: Communicator, x: np.ndarray) -> np.ndarray:
        return comm.all_gather(x)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        s = input_shapes[0]
        return [(s[0] * self.world_size,) + tuple(s[1:])]

    def grad(self, inputs: list, output_grads: list) -> list:
        return [ReduceScatter("sum", self.world_size, self.group)(output_grads[0])]


class ReduceScatter(Collective):
    """Part ``rank`` (axis 0 split in world_size equal parts) of the reduction."""

    __props__ = ("op", "world_size", "group")
    collective_kind = "reduce_scatter"

    def __init__(self, op: str = "sum", world_size: int = 1, group: str = "world") -> None:
        if op not in REDUCE_OPS:
            raise ValueError(f"ReduceScatter: unknown reduce op {op!r}; expected one of "
                             f"{sorted(REDUCE_OPS)}")
        self.op, self.world_size, self.group = op, int(world_size), group

    def __str__(self) -> str:
        return f"ReduceScatter{{{self.op}, {self.world_size}, {self.group}}}"

    def check_input(self, x: Variable) -> None:
        if x.ndim == 0:
            raise ValueError(f"{self}: needs at least one dimension to split (got {x.type})")
        _check_reduce_op(self.op, x.dtype)

    def output_type(self, x: Variable) -> TensorType:
        first = x.broadcastable[0] and self.world_size == 1
        return TensorType(x.dtype, (first,) + tuple(x.broadcastable[1:]))

    def compute(self, comm: Communicator, x: np.ndarray) -> np.ndarray:
        return comm.reduce_scatter(x, self.op)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        s = input_shapes[0]
        return [(s[0] // self.world_size,) + tuple(s[1:])]

    def grad(self, inputs: list, output_grads: list) -> list:
        if self.op not in ("sum", "avg"):
            return [grad_not_implemented(self, 0, inputs[0], f"only sum and avg are "
                                         f"({self.op})")]
        g = AllGather(self.world_size, self.group)(output_grads[0])
        return [g / np.asarray(self.world_size, dtype=g.dtype) if self.op == "avg" else g]


# ----------------------------------------------------------------------------- functions

def all_reduce(x: Any, op: str = "sum", group: str = "world") -> Variable:
    """Symbolic all-reduce of ``x`` over the ranks of ``group`` (op: sum, prod, max, min, avg)."""
    return AllReduce(op, group)(x)


def broadcast(x: Any, root: int = 0, group: str = "world") -> Variable:
    """Symbolic broadcast of rank ``root``'s ``x`` to every rank of ``group``."""
    return Broadcast(root, group)(x)


def all_gather(x: Any, group: str = "world") -> Variable:
    """Symbolic all-gather: every rank's ``x`` concatenated along axis 0 (the group's
    communicator must exist: its world size fixes the output shape)."""
    return AllGather(communicator(group).world_size, group)(x)


def reduce_scatter(x: Any, op: str = "sum", group: str = "world") -> Variable:
    """Symbolic reduce-scatter: this rank's part (axis 0 split in world_size parts) of the
    reduction of every rank's ``x``."""
    return ReduceScatter(op, communicator(group).world_size, group)(x)
