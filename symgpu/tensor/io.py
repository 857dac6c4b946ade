"""Theano's `theano.tensor.io` disk access: `load(path, dtype, broadcastable, mmap_mode=None)`
reads an ``.npy`` file when the function runs (the `LoadFromDisk` op), so a graph can take a
file name as its input. The path is a Python string: a constant, or a variable of `PathType`
(Theano's ``Variable(Generic())``) given at call time.

Theano's MPI ops of this module (MPIRecv, MPISend, MPIRecvWait, MPISendWait, isend, irecv,
send, recv, mpi_send_wait_key, mpi_tag_key) are in symgpu/tensor/mpi.py (over mpi4py), served
here too.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Type, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import TensorType, TensorVariable

__all__ = ["PathType", "LoadFromDisk", "load"]


class PathType(Type):
    """The type of a file name (a str; an os.PathLike is turned into one)."""

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> str:
        if isinstance(value, str):
            return value
        if not strict and isinstance(value, os.PathLike):
            return os.fspath(value)
        raise TypeError(f"expected a file name (str), got {type(value).__name__}: {value!r}")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __str__(self) -> str:
        return "path"


class LoadFromDisk(Op):
    """Reads the ``.npy`` file named by its input; the array must have the op's dtype and fit
    its broadcastable pattern (checked: a mismatch names the file). Not differentiable; no
    infer_shape (the shape is the file's, known once it is read: the shape rewrite leaves
    reads of it alone, as Theano's)."""

    __props__ = ("dtype", "broadcastable", "mmap_mode")

    def __init__(self, dtype: Any, broadcastable: Sequence[bool], mmap_mode: str | None = None):
        self.dtype = np.dtype(dtype)
        self.broadcastable = tuple(bool(b) for b in broadcastable)
        if mmap_mode not in (None, "c"):
            raise ValueError(f"LoadFromDisk: the only supported values for mmap_mode are None "
                             f"and 'c' (a copy-on-write map: the graph may not write to the "
                             f"file), got {mmap_mode!r}")
        self.mmap_mode = mmap_mode

    def make_node(self, path: Any) -> Apply:
        if isinstance(path, (str, os.PathLike)):
            path = Constant(PathType(), os.fspath(path))
        if not isinstance(path, Variable) or not isinstance(path.type, PathType):
            raise TypeError(f"load: the path must be a str or a PathType variable, got {path!r}")
        out = TensorType(str(self.dtype), self.broadcastable)()
        return Apply(self, [path], [out])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        path = inputs[0]
        if path.endswith(".npz"):
            raise ValueError(f"load: expected a .npy file, got {path!r}")
        result = np.load(path, mmap_mode=self.mmap_mode, allow_pickle=False)
        if result.dtype != self.dtype:
            raise TypeError(f"load: {path!r} holds an array of dtype {result.dtype}, expected "
                            f"{self.dtype}")
        bc = self.broadcastable
        if result.ndim != len(bc) or any(b and n != 1 for b, n in zip(bc, result.shape)):
            raise ValueError(f"load: {path!r} holds an array of shape {result.shape}, which does "
                             f"not fit the broadcastable pattern {bc}")
        output_storage[0][0] = result

    def __str__(self) -> str:
        return (f"Load{{dtype: {self.dtype}, broadcastable: {self.broadcastable}, "
                f"mmap: {self.mmap_mode}}}")


def load(path: Any, dtype: Any, broadcastable: Sequence[bool],
         mmap_mode: str | None = None) -> TensorVariable:
    """An array read from the ``.npy`` file `path` (a str, or a PathType variable given when
    the function is called) each time the function runs. mmap_mode None copies the file into
    memory; 'c' maps it copy-on-write, so only what the graph reads comes from disk."""
    return LoadFromDisk(dtype, broadcastable, mmap_mode)(path)


from symgpu.tensor.mpi import (MPIRecv, MPIRecvWait, MPISend, MPISendWait, irecv,  # noqa: E402
                               isend, mpi_send_wait_key, mpi_tag_key, recv, send)

__all__ += ["MPIRecv", "MPIRecvWait", "MPISend", "MPISendWait", "isend", "send", "irecv",
            "recv", "mpi_send_wait_key", "mpi_tag_key"]
