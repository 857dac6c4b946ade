"""`RandomStreams`: Theano's random-variable factory on the Philox generator.

Each draw method makes one new stream: a shared uint32 state ``[key0, key1, ctr_lo, ctr_hi]``
(key from the streams' seed and the stream's number, counter 0) whose `default_update`
advances the counter by the blocks one draw uses, so `function` moves every stream on after
each call without the user writing updates (`no_default_updates` turns that off).
The result variable carries `.rng` (the state) and `.update` (state, new state), as in Theano.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.sharedvalue import SharedVariable, shared
from symgpu.config import config
from symgpu.graph.basic import Variable
from symgpu.scalar.dtypes import check_dtype, is_float, is_int, upcast
from symgpu.tensor import math as tm
from symgpu.tensor.basic import _as_int_scalar, _shape_entries, alloc, reshape
from symgpu.tensor.random import philox
from symgpu.tensor.random.ops import (ArgsortKeys, CategoricalFromUniform,
                                      MultinomialFromUniform, PhiloxAdvance, PhiloxSample)
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorConstant, TensorVariable, as_tensor_variable, constant

__all__ = ["RandomStreams"]

DEFAULT_SEED = 12345


def _float_dtype(dtype: str | None, *params: Any) -> str:
    """`dtype` as asked, else the upcast of the symbolic float parameters, else floatX."""
    if dtype not in (None, "floatX"):
        dtype = check_dtype(dtype)
        if not is_float(dtype):
            raise TypeError(f"a continuous distribution needs a float dtype, not {dtype}")
        return dtype
    floats = [p.dtype for p in params if isinstance(p, Variable) and is_float(p.dtype)]
    return upcast(config.floatX, *floats) if floats else config.floatX


def _size_entries(size: Any, ndim: int | None, params: list[Any], what: str) -> list[TensorVariable]:
    """The draw's shape as int64 scalars: from `size`, or broadcast from the parameters."""
    if size is None:
        ps = [as_tensor_variable(p) for p in params if isinstance(p, Variable)]
        nd = max([p.ndim for p in ps], default=0)
        entries = []
        for d in range(nd):
            dims = [p for p in ps if p.ndim == nd and not p.broadcastable[d]]
            entries.append(shape_i(dims[0], d) if dims else constant(1, dtype="int64"))
        if any(0 < p.ndim < nd for p in ps):
            raise ValueError(f"{what}: without size, the parameters must all have the same "
                             f"number of dimensions, got {[p.type for p in ps]}")
    else:
        entries = _shape_entries(size)
    if ndim is not None and int(ndim) != len(entries):
        raise ValueError(f"{what}: ndim={ndim} but the size {size} has {len(entries)} dimensions")
    return entries


class RandomStreams:
    """A family of random streams with one seed (Theano's RandomStreams / MRG_RandomStreams).

    The same seed gives the same numbers on the CPU and the GPU, in every process.
    `nstreams` (MRG_RandomStreams' parallel-stream count) is accepted and has no effect:
    every element of a Philox draw already has its own counter."""

    def __init__(self, seed: int | None = None):
        self.state_updates: list[tuple[SharedVariable, Variable]] = []
        self.default_instance_seed = DEFAULT_SEED if seed is None else self._check_seed(seed)

    @staticmethod
    def _check_seed(seed: Any) -> int:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise TypeError(f"RandomStreams: the seed must be a non-negative integer, got {seed!r}")
        return int(seed)

    def seed(self, seed: int | None = None) -> None:
        """Re-seed every stream made so far (and the later ones): counters go back to 0."""
        self.default_instance_seed = DEFAULT_SEED if seed is None else self._check_seed(seed)
        for j, (state, _) in enumerate(self.state_updates):
            state.set_value(self._initial_state(j))

    def updates(self) -> list[tuple[SharedVariable, Variable]]:
        """The (state, new state) pairs of every stream (what the default updates do)."""
        return list(self.state_updates)

    def _initial_state(self, index: int) -> np.ndarray:
        key = philox.stream_key(self.default_instance_seed, index)
        return np.array([key[0], key[1], 0, 0], dtype=np.uint32)

    def _stream(self, entries: list[TensorVariable], dtype: str) -> tuple[SharedVariable, Variable]:
        index = len(self.state_updates)
        state = shared(self._initial_state(index), name=f"philox_state_{index}")
        new = PhiloxAdvance(dtype)(state, *entries)
        state.default_update = new
        self.state_updates.append((state, new))
        return state, new

    def _raw(self, dist: str, entries: list[TensorVariable], dtype: str) -> TensorVariable:
        """A fresh stream's draw of `dist` in (0, 1) / standard normal, tagged like Theano's."""
        state, new = self._stream(entries, dtype)
        out = PhiloxSample(dist, dtype)(state, *entries)
        out.rng, out.update = state, (state, new)
        return out

    @staticmethod
    def _tag(out: TensorVariable, raw: TensorVariable) -> TensorVariable:
        out.rng, out.update = raw.rng, raw.update
        return out

    # -- continuous ---------------------------------------------------------------------------
    def uniform(self, size: Any = None, low: Any = 0.0, high: Any = 1.0, ndim: int | None = None,
                dtype: str | None = None, nstreams: int | None = None) -> TensorVariable:
        """Uniform on (low, high): `low + (high - low) * U`, U in (0, 1) (gradients reach
        low and high)."""
        dtype = _float_dtype(dtype, low, high)
        u = self._raw("uniform", _size_entries(size, ndim, [low, high], "uniform"), dtype)
        if _is_const(low, 0) and _is_const(high, 1):
            return u
        low, high = tm.cast(as_tensor_variable(low), dtype), tm.cast(as_tensor_variable(high), dtype)
        return self._tag(tm.cast(low + (high - low) * u, dtype), u)

    def normal(self, size: Any = None, avg: Any = 0.0, std: Any = 1.0, ndim: int | None = None,
               dtype: str | None = None, nstreams: int | None = None) -> TensorVariable:
        """Normal with mean `avg` and deviation `std`: `avg + std * Z` (Box-Muller Z)."""
        dtype = _float_dtype(dtype, avg, std)
        z = self._raw("normal", _size_entries(size, ndim, [avg, std], "normal"), dtype)
        if _is_const(avg, 0) and _is_const(std, 1):
            return z
        avg, std = tm.cast(as_tensor_variable(avg), dtype), tm.cast(as_tensor_variable(std), dtype)
        return self._tag(tm.cast(avg + std * z, dtype), z)

    # -- discrete ------------------------------------------------------------------------------
    def binomial(self, size: Any = None, n: int = 1, p: Any = 0.5, ndim: int | None = None,
                 dtype: str = "int64", nstreams: int | None = None) -> TensorVariable:
        """Binomial(n, p) counts: the number of n uniforms below p (n a Python int)."""
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise TypeError(f"binomial: n must be a non-negative Python int, got {n!r}")
        dtype = check_dtype(dtype)
        entries = _size_entries(size, ndim, [p], "binomial")
        fdtype = _float_dtype(None, p)
        trials = [] if n == 1 else [constant(int(n), dtype="int64")]
        u = self._raw("uniform", [*trials, *entries], fdtype)
        hit = tm.lt(u, tm.cast(as_tensor_variable(p), fdtype))
        count = hit if n == 1 else tm.sum(hit, axis=0, dtype="int64")
        return self._tag(tm.cast(count, dtype), u)

    def integers(self, size: Any = None, low: Any = 0, high: Any = 1, ndim: int | None = None,
                 dtype: str = "int64") -> TensorVariable:
        """Integers uniform on [low, high) (high excluded, NumPy's Generator.integers)."""
        return self._integers(size, low, high, ndim, dtype, "integers", 0)

    def random_integers(self, size: Any = None, low: Any = 0, high: Any = 1,
                        ndim: int | None = None, dtype: str = "int64") -> TensorVariable:
        """Integers uniform on [low, high] (high included, Theano's random_integers)."""
        return self._integers(size, low, high, ndim, dtype, "random_integers", 1)

    def _integers(self, size, low, high, ndim, dtype, what, inclusive):
        dtype = check_dtype(dtype)
        low, high = as_tensor_variable(low), as_tensor_variable(high)
        for name, v in (("low", low), ("high", high)):
            if not is_int(v.dtype):
                raise TypeError(f"{what}: {name} must be an integer, got {v} ({v.type})")
        u = self._raw("uniform", _size_entries(size, ndim, [low, high], what), "float64")
        lo, hi = tm.cast(low, "float64"), tm.cast(high, "float64") + inclusive
        val = tm.minimum(lo + tm.floor((hi - lo) * u), hi - 1)
        return self._tag(tm.cast(val, dtype), u)

    def multinomial(self, size: Any = None, n: int = 1, pvals: Any = None, ndim: int | None = None,
                    dtype: str = "int64", nstreams: int | None = None) -> TensorVariable:
        """Counts of n draws from the categories `pvals` (a vector, or a matrix with one
        distribution per row); `size` (with a vector pvals) is the number of rows."""
        if pvals is None:
            raise TypeError("multinomial: pvals is required")
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise TypeError(f"multinomial: n must be a non-negative Python int, got {n!r}")
        pvals = as_tensor_variable(pvals)
        if pvals.ndim == 1:
            rows = [constant(1, dtype="int64")] if size is None else _shape_entries(size)
            if len(rows) != 1:
                raise ValueError(f"multinomial: size must be one number of rows, got {size}")
            pmat = _tile_rows(pvals, rows[0])
        elif pvals.ndim == 2:
            if size is not None:
                raise ValueError("multinomial: with a matrix pvals the rows are its rows; "
                                 "leave size=None")
            pmat = pvals
        else:
            raise TypeError(f"multinomial: pvals must be a vector or a matrix, got {pvals.type}")
        u = self._raw("uniform", [constant(int(n), dtype="int64"), shape_i(pmat, 0)], "float64")
        counts = MultinomialFromUniform(dtype)(pmat, u)
        if ndim is not None and int(ndim) != 2:
            raise ValueError(f"multinomial: the result is a matrix, ndim={ndim} asked")
        return self._tag(counts, u)

    def choice(self, size: Any = 1, a: Any = 2, replace: bool = True, p: Any = None,
               ndim: int | None = None, dtype: str = "int64") -> TensorVariable:
        """Draws from `a` (an int: range(a); a vector: its items), with probabilities `p`,
        with or without replacement."""
        entries = _size_entries(size, ndim, [], "choice")
        items = None
        if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
            count = constant(int(a), dtype="int64")
        else:
            av = as_tensor_variable(a)
            if av.ndim == 0 and is_int(av.dtype):
                count = _as_int_scalar(av)
            elif av.ndim == 1:
                items, count = av, shape_i(av, 0)
            else:
                raise TypeError(f"choice: a must be an int or a vector, got {av.type}")
        if replace:
            if p is None:
                idx = self.integers(size, 0, count, ndim, "int64")
            else:
                u = self._raw("uniform", entries, "float64")
                idx = self._tag(CategoricalFromUniform()(as_tensor_variable(p), u), u)
        else:
            k = _static_size(entries, "choice without replacement")
            u = self._raw("uniform", [count], "float64")
            keys = u if p is None else -tm.log(u) / tm.cast(as_tensor_variable(p), "float64")
            idx = self._tag(reshape(ArgsortKeys(k)(keys), [e for e in entries]), u)
        res = idx if items is None else self._tag(items[idx], idx)
        return self._tag(tm.cast(res, dtype) if items is None else res, idx)

    def permutation(self, size: Any = None, n: Any = 1, ndim: int | None = None,
                    dtype: str = "int64") -> TensorVariable:
        """Permutations of range(n): one per entry of `size` (the result is size + (n,))."""
        entries = [] if size is None else _shape_entries(size)
        n = _as_int_scalar(n, "permutation: n")
        u = self._raw("uniform", [*entries, n], "float64")
        res = ArgsortKeys(None)(u)
        if ndim is not None and int(ndim) != len(entries) + 1:
            raise ValueError(f"permutation: ndim={ndim} but the result has {len(entries) + 1} "
                             "dimensions")
        return self._tag(tm.cast(res, dtype), u)


def _is_const(x: Any, value: float) -> bool:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x == value
    return isinstance(x, TensorConstant) and x.data.ndim == 0 and float(x.data) == value


def _static_size(entries: list[TensorVariable], what: str) -> int:
    """The number of items of a size made of constants (a top-k needs it when compiling)."""
    total = 1
    for e in entries:
        if not isinstance(e, TensorConstant):
            raise TypeError(f"{what}: the size must be made of constants, got {e}")
        total *= int(e.data)
    return total


def _tile_rows(pvals: TensorVariable, rows: TensorVariable) -> TensorVariable:
    """`pvals` (k,) repeated as `rows` rows (k broadcast along a new first axis)."""
    return alloc(pvals, rows, shape_i(pvals, 0))
