"""The random ops: the raw Philox draw, the counter advance, and the discrete transforms that
turn uniforms into categories, counts and permutations.

Only `PhiloxSample` makes noise; everything users see (uniform, normal, binomial...) is built
from it with ordinary tensor ops, so gradients reach the parameters (`low + (high-low) * U`)
and never the noise: the ops here have no gradient (None for every input).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import check_dtype, is_float
from symgpu.tensor.basic import _as_int_scalar, _known_one
from symgpu.tensor.random import philox, philox_c
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable
from symgpu.tensor.type import constant

__all__ = ["PhiloxSample", "PhiloxAdvance", "CategoricalFromUniform", "MultinomialFromUniform",
           "PoissonFromUniform", "ArgsortKeys", "check_state"]


def check_state(state: Any, what: str) -> TensorVariable:
    """The generator state as a uint32 vector variable (key0, key1, ctr_lo, ctr_hi)."""
    state = as_tensor_variable(state)
    if state.dtype != "uint32" or state.ndim != 1:
        raise TypeError(f"{what}: the generator state must be a uint32 vector of 4 words "
                        f"(key0, key1, ctr_lo, ctr_hi), got {state} ({state.type})")
    return state


def _check_state_value(state: np.ndarray, what: object) -> None:
    if state.shape != (4,):
        raise ValueError(f"{what}: the generator state must hold 4 uint32 words, got shape "
                         f"{state.shape}")


def _shape_of(inputs: Sequence[Any], what: object) -> tuple[int, ...]:
    """The draw's shape from its size inputs (`what`, the op, is formatted only for an error:
    these run on every draw)."""
    shape = tuple(int(s) for s in inputs)
    if any(s < 0 for s in shape):
        raise ValueError(f"{what}: negative dimension in the size {shape}")
    return shape


class PhiloxSample(Op):
    """(state, *size) -> a draw of `dist` ('uniform' in (0, 1), standard 'normal') of `dtype`,
    laid out as symgpu/tensor/random/philox.py says (the GPU version follows it bit for bit)."""

    __props__ = ("dist", "dtype")

    def __init__(self, dist: str, dtype: str):
        philox.check_dist(dist, "PhiloxSample")
        dtype = check_dtype(dtype)
        if not is_float(dtype):
            raise TypeError(f"PhiloxSample draws floats, not {dtype}")
        self.dist, self.dtype = dist, dtype

    def make_node(self, state: Any, *size: Any) -> Apply:
        state = check_state(state, str(self))
        size = [_as_int_scalar(s, f"{self}: size entry") for s in size]
        out = TensorType(self.dtype, [_known_one(s) for s in size])()
        return Apply(self, [state, *size], [out])

    def perform(self, node, inputs, out, draw: Callable | None = None):
        """The draw: `philox.sample`, or ``draw(state, shape)`` (`philox_c.sampler`'s, bound
        to this op's dist and dtype) when the thunk gives one."""
        _check_state_value(inputs[0], self)
        shape = _shape_of(inputs[1:], self)
        if draw is None:
            out[0][0] = philox.sample(inputs[0], self.dist, self.dtype, shape)
        else:
            out[0][0] = draw(inputs[0], shape)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """`perform`'s thunk, drawing through the compiled generator (`philox_c`: the same
        numbers, several times faster) where C is allowed and the library built; the sampler
        (entry point, layout) is resolved here, once, not on every draw."""
        thunk = super().make_thunk(node, storage_map, compute_map, no_recycling, impl)
        if philox_c.enabled():
            thunk.perform = partial(self.perform, draw=philox_c.sampler(self.dist, self.dtype))
        return thunk

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(node.inputs[1:])]

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


class PhiloxAdvance(Op):
    """(state, *size) -> the state after a draw of that size: the counter moves on by the
    blocks the draw used (`philox.blocks`). This is the generator's `default_update`."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = check_dtype(dtype)

    def make_node(self, state: Any, *size: Any) -> Apply:
        state = check_state(state, str(self))
        size = [_as_int_scalar(s, f"{self}: size entry") for s in size]
        return Apply(self, [state, *size], [state.type()])

    def perform(self, node, inputs, out):
        _check_state_value(inputs[0], self)
        n = int(np.prod(_shape_of(inputs[1:], self), dtype=np.int64))
        out[0][0] = philox.advance(inputs[0], philox.blocks(n, self.dtype))

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


def _check_probs(p: np.ndarray, what: str) -> np.ndarray:
    if p.shape[-1] == 0:
        raise ValueError(f"{what}: the probabilities have no categories (shape {p.shape})")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{what}: probabilities must be finite and >= 0, got {p}")
    total = p.sum(axis=-1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError(f"{what}: probabilities sum to 0 in a row of {p}")
    return np.cumsum(p / total, axis=-1)


class CategoricalFromUniform(Op):
    """(p (k,), u (...)) -> int64 indices (...): the category whose cumulative probability
    interval holds u (inverse CDF; p is normalised)."""

    __props__ = ()

    def make_node(self, p: Any, u: Any) -> Apply:
        p, u = as_tensor_variable(p), as_tensor_variable(u)
        if p.ndim != 1 or not is_float(p.dtype) or not is_float(u.dtype):
            raise TypeError(f"{self}: p must be a float vector and u floats, got {p.type} "
                            f"and {u.type}")
        return Apply(self, [p, u], [TensorType("int64", u.broadcastable)()])

    def perform(self, node, inputs, out):
        p, u = inputs
        cdf = _check_probs(np.asarray(p, dtype=np.float64), "choice")
        idx = np.searchsorted(cdf, np.asarray(u, dtype=np.float64), side="right")
        out[0][0] = np.minimum(idx, len(cdf) - 1).astype(np.int64)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[1]]

    def grad(self, inputs, output_grads):
        return [None, None]


class MultinomialFromUniform(Op):
    """(pvals (b, k), u (n, b)) -> counts (b, k) of `dtype`: row r counts the categories of
    its n draws u[:, r] (inverse CDF of the normalised row)."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str = "int64"):
        self.dtype = check_dtype(dtype)

    def make_node(self, pvals: Any, u: Any) -> Apply:
        pvals, u = as_tensor_variable(pvals), as_tensor_variable(u)
        if pvals.ndim != 2 or u.ndim != 2 or not is_float(pvals.dtype):
            raise TypeError(f"{self}: pvals must be a float matrix (batch, k) and u a matrix "
                            f"(n, batch), got {pvals.type} and {u.type}")
        return Apply(self, [pvals, u], [TensorType(self.dtype, pvals.broadcastable)()])

    def perform(self, node, inputs, out):
        pvals, u = inputs
        if u.shape[1] != pvals.shape[0]:
            raise ValueError(f"{self}: {pvals.shape[0]} rows of pvals but draws for "
                             f"{u.shape[1]} rows")
        cdf = _check_probs(np.asarray(pvals, dtype=np.float64), "multinomial")
        b, k = cdf.shape
        counts = np.zeros((b, k), dtype=np.int64)
        rows = np.arange(b)
        for draw in np.asarray(u, dtype=np.float64):
            idx = np.minimum((draw[:, None] >= cdf).sum(axis=1), k - 1)
            np.add.at(counts, (rows, idx), 1)
        out[0][0] = counts.astype(self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [None, None]


class PoissonFromUniform(Op):
    """(lam (broadcastable to u), u (...)) -> Poisson(lam) counts (...) of `dtype`: the
    smallest k whose CDF reaches u (inverse CDF, so one uniform per draw and the Philox
    counters advance as for any other draw)."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str = "int64"):
        self.dtype = check_dtype(dtype)

    def make_node(self, lam: Any, u: Any) -> Apply:
        lam, u = as_tensor_variable(lam), as_tensor_variable(u)
        if lam.ndim > u.ndim or not is_float(u.dtype) or lam.dtype.startswith("complex"):
            raise TypeError(f"{self}: lam must be real with at most u's dimensions and u "
                            f"floats, got {lam.type} and {u.type}")
        return Apply(self, [lam, u], [TensorType(self.dtype, u.broadcastable)()])

    def perform(self, node, inputs, out):
        from scipy import stats  # deferred: scipy.stats takes a while to import; draws only
        lam, u = np.asarray(inputs[0], dtype=np.float64), np.asarray(inputs[1], dtype=np.float64)
        if np.any(np.isnan(lam)) or np.any(lam < 0):
            raise ValueError(f"poisson: lam must be >= 0 (and not NaN), got {lam}")
        lam = np.broadcast_to(lam, u.shape)  # raises where lam does not fit the draw's shape
        out[0][0] = np.asarray(stats.poisson.ppf(u, lam)).astype(self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[1]]

    def grad(self, inputs, output_grads):
        return [None, None]


class ArgsortKeys(Op):
    """keys (..., m) -> int64 (..., k): the indices of the k smallest keys of the last axis,
    smallest first (random keys give permutations and draws without replacement)."""

    __props__ = ("k",)

    def __init__(self, k: int | None = None):
        self.k = None if k is None else int(k)

    def make_node(self, keys: Any) -> Apply:
        keys = as_tensor_variable(keys)
        if keys.ndim < 1:
            raise TypeError(f"{self}: keys must have at least one dimension, got {keys.type}")
        bcast = keys.broadcastable[:-1] + ((self.k == 1) if self.k is not None else keys.broadcastable[-1],)
        return Apply(self, [keys], [TensorType("int64", bcast)()])

    def perform(self, node, inputs, out):
        keys = inputs[0]
        m = keys.shape[-1]
        if self.k is not None and self.k > m:
            raise ValueError(f"{self}: cannot take {self.k} items without replacement from {m}")
        order = np.argsort(keys, axis=-1, kind="stable")
        out[0][0] = np.ascontiguousarray(order if self.k is None else order[..., : self.k])

    def infer_shape(self, fgraph, node, input_shapes):
        shp = input_shapes[0]
        if self.k is None:
            return [shp]
        return [tuple(shp[:-1]) + (constant(self.k, dtype="int64"),)]

    def grad(self, inputs, output_grads):
        return [None]
