"""MRG31k3p's stream-jumping arithmetic (Theano's theano.sandbox.rng_mrg helpers).

Why: symgpu's random streams are Philox counters (jumping is adding to a counter), but code
written for Theano's MRG generator jumps its 6-int32 states with these modular products and
sizes its stream counts with `guess_n_streams`; they are plain integer arithmetic, so they
are here as Theano had them (`multMatVect`, which compiles a function, is in
symgpu/sandbox/rng_mrg.py, above the compiler).
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable

__all__ = ["matVecModM", "DotModulo", "guess_n_streams"]


def matVecModM(A: np.ndarray, s: np.ndarray, m: Any) -> np.ndarray:
    """``(A @ s) mod m`` for an int64 matrix, every product reduced first (no overflow)."""
    A = np.asarray(A)
    if A.dtype != np.int64:
        raise TypeError(f"matVecModM: A must be int64, got {A.dtype}")
    return np.int32(np.sum((A * np.asarray(s, dtype=np.int64)) % m, 1) % m)


class DotModulo(Op):
    """``concatenate([(A @ s) mod m, (A2 @ s2) mod m2])``: one MRG31k3p jump of the two
    3-int32 halves of a state (Theano's DotModulo)."""

    __props__ = ()

    def make_node(self, A: Any, s: Any, m: Any, A2: Any, s2: Any, m2: Any) -> Apply:
        ins = [as_tensor_variable(v) for v in (A, s, m, A2, s2, m2)]
        for k, want in zip(range(6), (2, 1, 0, 2, 1, 0)):
            if ins[k].ndim != want:
                raise TypeError(f"DotModulo: input {k} must have {want} dimensions, got "
                                f"{ins[k].ndim} ({ins[k].type})")
        return Apply(self, ins, [ins[1].type()])

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        A, s, m, A2, s2, m2 = inputs
        for a, v, name in ((A, s, "A, s"), (A2, s2, "A2, s2")):
            if a.shape[1] != v.shape[0]:
                raise ValueError(f"DotModulo: shapes of {name} do not agree: {a.shape}, "
                                 f"{v.shape}")
        out = np.concatenate((matVecModM(A.astype(np.int64), s, m),
                              matVecModM(A2.astype(np.int64), s2, m2)))
        output_storage[0][0] = out.astype(node.outputs[0].dtype)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        return [(input_shapes[0][0] + input_shapes[3][0],)]


def guess_n_streams(size: Any, warn: bool = False) -> int:
    """How many streams to draw `size` numbers from: a sixth of the count (for counts above
    6), at most 60 * 256; 60 * 256 where `size` is not a tuple or list of ints (with a
    warning if `warn`)."""
    if isinstance(size, (tuple, list)) and all(isinstance(i, (int, np.integer)) for i in size):
        r = 1
        for s in size:
            r *= int(s)
        if r > 6:
            r = r // 6
        return min(r, 60 * 256)
    if warn:
        warnings.warn(f"MRG_RandomStreams Can't determine #streams from size ({size}), "
                      "guessing 60*256", stacklevel=3)
    return 60 * 256
