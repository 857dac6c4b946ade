"""Theano's MPI point-to-point ops (theano.tensor.io): send and receive arrays between
processes inside a graph, over mpi4py.

Why ops: a send or receive started early and waited on late overlaps communication with
the computation between them; `isend`/`irecv` start one (an op returning an MPI request and
the buffer), `MPISendWait`/`MPIRecvWait` wait on it, and `mpi_send_wait_key`/`mpi_tag_key`
are Theano's scheduling keys (starts first, waits last, lower tags first). symgpu's own
multi-GPU exchange is NCCL collectives (symgpu.distributed); these are for code written
against Theano's MPI ops. mpi4py is needed when they run (not to build graphs); the
communicator is mpi4py's COMM_WORLD unless `set_comm` gave another (any object with
mpi4py's `Isend(buf, dest, tag)` / `Irecv(buf, source, tag)` returning requests with
`wait()`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.graph.theano_types import Generic
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["MPIRecv", "MPIRecvWait", "MPISend", "MPISendWait", "isend", "send", "irecv",
           "recv", "mpi_send_wait_key", "mpi_tag_key", "mpi_keys", "set_comm", "get_comm"]

_comm: list[Any] = []


def set_comm(comm: Any) -> None:
    """Use `comm` (an mpi4py communicator or one with its Isend/Irecv) for the MPI ops;
    None goes back to mpi4py's COMM_WORLD."""
    _comm[:] = [] if comm is None else [comm]


def get_comm() -> Any:
    """The communicator the MPI ops use (mpi4py's COMM_WORLD unless set_comm gave one)."""
    if _comm:
        return _comm[0]
    try:
        from mpi4py import MPI  # deferred: optional, only when an MPI op runs
    except ImportError as exc:
        raise ImportError("symgpu's MPI ops (theano.tensor.io MPISend/MPIRecv) need mpi4py "
                          "(pip install mpi4py) or a communicator given to set_comm") from exc
    return MPI.COMM_WORLD


class MPIRecv(Op):
    """Starts receiving an array of `shape` and `dtype` from rank `source` with `tag`:
    outputs (the request, the buffer being filled). Not differentiable."""

    __props__ = ("source", "tag", "shape", "dtype")
    _no_constant_folding = True

    def __init__(self, source: int, tag: int, shape: Sequence[int], dtype: Any):
        self.source, self.tag = int(source), int(tag)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.broadcastable = (False,) * len(self.shape)

    def make_node(self) -> Apply:
        return Apply(self, [], [Generic()(), TensorType(self.dtype.name, self.broadcastable)()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        data = np.zeros(self.shape, dtype=self.dtype)
        output_storage[0][0] = get_comm().Irecv(data, self.source, self.tag)
        output_storage[1][0] = data

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [None, self.shape]

    def __str__(self) -> str:
        return (f"MPIRecv{{source: {self.source}, tag: {self.tag}, shape: {self.shape}, "
                f"dtype: {self.dtype}}}")


class MPIRecvWait(Op):
    """Waits on an MPIRecv's request; returns its buffer, filled (a view)."""

    __props__ = ("tag",)
    view_map = {0: [1]}

    def __init__(self, tag: int):
        self.tag = int(tag)

    def make_node(self, request: Variable, data: Variable) -> Apply:
        return Apply(self, [request, data], [TensorType(data.dtype, data.broadcastable)()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        request, data = inputs
        request.wait()
        output_storage[0][0] = data

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [input_shapes[1]]


class MPISend(Op):
    """Starts sending its input to rank `dest` with `tag`: outputs (the request, the input
    as a view). Not differentiable."""

    __props__ = ("dest", "tag")
    view_map = {1: [0]}
    _no_constant_folding = True

    def __init__(self, dest: int, tag: int):
        self.dest, self.tag = int(dest), int(tag)

    def make_node(self, data: Any) -> Apply:
        data = as_tensor_variable(data)
        return Apply(self, [data], [Generic()(), data.type()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        data = inputs[0]
        output_storage[0][0] = get_comm().Isend(data, self.dest, self.tag)
        output_storage[1][0] = data

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [None, input_shapes[0]]

    def __str__(self) -> str:
        return f"MPISend{{dest: {self.dest}, tag: {self.tag}}}"


class MPISendWait(Op):
    """Waits on an MPISend's request; returns True (a Generic value) once sent."""

    __props__ = ("tag",)

    def __init__(self, tag: int):
        self.tag = int(tag)

    def make_node(self, request: Variable, data: Variable) -> Apply:
        return Apply(self, [request, data], [Generic()()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        inputs[0].wait()
        output_storage[0][0] = True

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [None]


def isend(var: Any, dest: int, tag: int) -> list[Variable]:
    """Non-blocking send: [request, var]."""
    return MPISend(dest, tag)(var)


def send(var: Any, dest: int, tag: int) -> Variable:
    """Blocking send: a Generic variable computed once `var` is sent."""
    return MPISendWait(tag)(*isend(var, dest, tag))


def irecv(shape: Sequence[int], dtype: Any, source: int, tag: int) -> list[Variable]:
    """Non-blocking receive: [request, buffer]."""
    return MPIRecv(source, tag, shape, dtype)()


def recv(shape: Sequence[int], dtype: Any, source: int, tag: int) -> Variable:
    """Blocking receive: the received array."""
    return MPIRecvWait(tag)(*irecv(shape, dtype, source, tag))


def mpi_send_wait_key(a: Apply) -> int:
    """A scheduling key: waits as late as possible (1), sends and receives early (-1)."""
    if isinstance(a.op, (MPIRecvWait, MPISendWait)):
        return 1
    if isinstance(a.op, (MPIRecv, MPISend)):
        return -1
    return 0


def mpi_tag_key(a: Apply) -> int:
    """A scheduling key breaking ties between MPI nodes: lower tags first."""
    if isinstance(a.op, (MPISend, MPIRecv, MPIRecvWait, MPISendWait)):
        return a.op.tag
    return 0


mpi_keys = (mpi_send_wait_key, mpi_tag_key)
