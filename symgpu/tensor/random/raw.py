"""Theano's `raw_random` functional API on Philox states, and `RandomStreamsBase`.

Each function takes a random-state variable (a uint32 vector ``[key0, key1, ctr_lo, ctr_hi]``:
a draw's ``.rng``, a shared variable made by `philox_state`, or any symbolic uint32 vector)
and returns ``(new_state, sample)`` as Theano's do: ``new_state`` is the state moved on past
the counters the draw used (`PhiloxAdvance`), ``sample`` the draw (`PhiloxSample` and
ordinary tensor ops on it). Nothing is updated unless the caller uses ``new_state`` (as an
update, or as the state of the next draw). `RandomStreamsBase` has Theano's draw methods,
each ``self.gen(<function here>, ...)``; `RandomStreams` (streams.py) supplies `gen`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Variable
from symgpu.graph.sharedvalue import SharedVariable, register_shared_constructor, shared
from symgpu.scalar.dtypes import check_dtype, is_float, is_int, upcast
from symgpu.tensor import math as tm
from symgpu.tensor.basic import _as_int_scalar, _shape_entries, alloc, reshape
from symgpu.tensor.extra_ops import PermuteAlongAxis
from symgpu.tensor.random import philox
from symgpu.tensor.random.state import RANDOM_STATE_VIEW, PhiloxRandomState, words_of
from symgpu.tensor.random.ops import (ArgsortKeys, CategoricalFromUniform,
                                      MultinomialFromUniform, PhiloxAdvance, PhiloxSample,
                                      PoissonFromUniform, check_state)
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorConstant, TensorVariable, as_tensor_variable, constant

__all__ = ["uniform", "normal", "binomial", "poisson", "random_integers", "integers", "choice",
           "permutation", "multinomial", "philox_state", "state_variable", "randomstate_constructor",
           "RandomStreamsBase"]

DEFAULT_SEED = 12345

Draw = tuple[TensorVariable, TensorVariable]


def philox_state(seed: int = DEFAULT_SEED, stream: int = 0, name: str | None = None) -> SharedVariable:
    """A shared Philox state for the functions here: the key of stream `stream` of `seed`
    (what `RandomStreams(seed)` gives its stream number `stream`), counter 0."""
    for what, v in (("seed", seed), ("stream", stream)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
            raise TypeError(f"philox_state: the {what} must be a non-negative integer, got {v!r}")
    key = philox.stream_key(int(seed), int(stream))
    return state_variable(np.array([key[0], key[1], 0, 0], dtype=np.uint32), name=name)


def state_variable(words: np.ndarray, name: str | None = None,
                   target: Any = "default") -> SharedVariable:
    """A shared variable holding the Philox state `words` (on the GPU where shared arrays
    go), whose `get_value` gives a `PhiloxRandomState` (Theano code seeds and restores
    streams through it) and whose `set_value` takes one back (or a NumPy RandomState)."""
    var = shared(np.array(words, dtype=np.uint32), name=name, target=target)
    var.value_view = RANDOM_STATE_VIEW
    return var


@register_shared_constructor
def randomstate_constructor(value: Any, name: str | None = None, borrow: bool = False,
                            strict: bool = False, allow_downcast: bool | None = None,
                            target: Any = "default", **kwargs: Any) -> SharedVariable:
    """``shared(np.random.RandomState(s))`` (Theano's way to make a state for raw_random's
    functions) and ``shared(PhiloxRandomState(...))``: a Philox state variable, keyed by the
    words the RandomState would draw next (`state.words_of`). Raises TypeError (the next
    constructor is tried) for other values."""
    if not isinstance(value, (np.random.RandomState, PhiloxRandomState)):
        raise TypeError(f"not a random state: {type(value).__name__}")
    return state_variable(words_of(value), name=name, target=target)


def _draw(state: Any, dist: str, entries: list, dtype: str) -> Draw:
    """(state moved past the draw, the raw draw of `dist`: uniform in (0, 1) or standard normal)."""
    state = check_state(state, dist)
    return PhiloxAdvance(dtype)(state, *entries), PhiloxSample(dist, dtype)(state, *entries)


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


def _check_count(n: Any, what: str) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TypeError(f"{what}: n must be a non-negative Python int, got {n!r}")
    return int(n)


# -- continuous --------------------------------------------------------------------------------
def uniform(random_state: Any, size: Any = None, low: Any = 0.0, high: Any = 1.0,
            ndim: int | None = None, dtype: str | None = None) -> Draw:
    """Uniform on (low, high): `low + (high - low) * U`, U in (0, 1) (gradients reach low and
    high)."""
    dtype = _float_dtype(dtype, low, high)
    new, u = _draw(random_state, "uniform", _size_entries(size, ndim, [low, high], "uniform"), dtype)
    if _is_const(low, 0) and _is_const(high, 1):
        return new, u
    low, high = tm.cast(as_tensor_variable(low), dtype), tm.cast(as_tensor_variable(high), dtype)
    return new, tm.cast(low + (high - low) * u, dtype)


def normal(random_state: Any, size: Any = None, avg: Any = 0.0, std: Any = 1.0,
           ndim: int | None = None, dtype: str | None = None) -> Draw:
    """Normal with mean `avg` and deviation `std`: `avg + std * Z` (Box-Muller Z)."""
    dtype = _float_dtype(dtype, avg, std)
    new, z = _draw(random_state, "normal", _size_entries(size, ndim, [avg, std], "normal"), dtype)
    if _is_const(avg, 0) and _is_const(std, 1):
        return new, z
    avg, std = tm.cast(as_tensor_variable(avg), dtype), tm.cast(as_tensor_variable(std), dtype)
    return new, tm.cast(avg + std * z, dtype)


# -- discrete ----------------------------------------------------------------------------------
def binomial(random_state: Any, size: Any = None, n: int = 1, p: Any = 0.5,
             ndim: int | None = None, dtype: str = "int64", prob: Any = None) -> Draw:
    """Binomial(n, p) counts: the number of n uniforms below p (n a Python int; `prob` is
    Theano's old name of p)."""
    if prob is not None:
        p = prob
    n = _check_count(n, "binomial")
    dtype = check_dtype(dtype)
    entries = _size_entries(size, ndim, [p], "binomial")
    fdtype = _float_dtype(None, p)
    trials = [] if n == 1 else [constant(n, dtype="int64")]
    new, u = _draw(random_state, "uniform", [*trials, *entries], fdtype)
    hit = tm.lt(u, tm.cast(as_tensor_variable(p), fdtype))
    count = hit if n == 1 else tm.sum(hit, axis=0, dtype="int64")
    return new, tm.cast(count, dtype)


def poisson(random_state: Any, size: Any = None, lam: Any = 1.0, ndim: int | None = None,
            dtype: str = "int64") -> Draw:
    """Theano's raw_random.poisson: Poisson(lam) counts (NumPy's poisson distribution), by
    the inverse CDF of one uniform per draw; `lam` (>= 0) broadcasts to `size` (without
    `size`, the draw has lam's shape)."""
    dtype = check_dtype(dtype)
    entries = _size_entries(size, ndim, [lam], "poisson")
    lam = as_tensor_variable(lam)
    if lam.ndim > len(entries):
        raise ValueError(f"poisson: lam {lam} ({lam.type}) has more dimensions than the size "
                         f"{size}")
    new, u = _draw(random_state, "uniform", entries, "float64")
    return new, PoissonFromUniform(dtype)(tm.cast(lam, "float64"), u)


def integers(random_state: Any, size: Any = None, low: Any = 0, high: Any = 1,
             ndim: int | None = None, dtype: str = "int64") -> Draw:
    """Integers uniform on [low, high) (high excluded, NumPy's Generator.integers)."""
    return _integers(random_state, size, low, high, ndim, dtype, "integers", 0)


def random_integers(random_state: Any, size: Any = None, low: Any = 0, high: Any = 1,
                    ndim: int | None = None, dtype: str = "int64") -> Draw:
    """Integers uniform on [low, high] (high included, Theano's random_integers)."""
    return _integers(random_state, size, low, high, ndim, dtype, "random_integers", 1)


def _integers(state, size, low, high, ndim, dtype, what, inclusive) -> Draw:
    dtype = check_dtype(dtype)
    low, high = as_tensor_variable(low), as_tensor_variable(high)
    for name, v in (("low", low), ("high", high)):
        if not is_int(v.dtype):
            raise TypeError(f"{what}: {name} must be an integer, got {v} ({v.type})")
    new, u = _draw(state, "uniform", _size_entries(size, ndim, [low, high], what), "float64")
    lo, hi = tm.cast(low, "float64"), tm.cast(high, "float64") + inclusive
    val = tm.minimum(lo + tm.floor((hi - lo) * u), hi - 1)
    return new, tm.cast(val, dtype)


def multinomial(random_state: Any, size: Any = None, n: int = 1, pvals: Any = (0.5, 0.5),
                ndim: int | None = None, dtype: str = "int64") -> Draw:
    """Counts of n draws from the categories `pvals` (a vector, or a matrix with one
    distribution per row); `size` (with a vector pvals) is the number of rows: the result is
    a (rows, k) matrix."""
    if pvals is None:
        raise TypeError("multinomial: pvals is required")
    n = _check_count(n, "multinomial")
    pvals = as_tensor_variable(pvals)
    if pvals.ndim == 1:
        rows = [constant(1, dtype="int64")] if size is None else _shape_entries(size)
        if len(rows) != 1:
            raise ValueError(f"multinomial: size must be one number of rows, got {size}")
        pmat = alloc(pvals, rows[0], shape_i(pvals, 0))
    elif pvals.ndim == 2:
        if size is not None:
            raise ValueError("multinomial: with a matrix pvals the rows are its rows; "
                             "leave size=None")
        pmat = pvals
    else:
        raise TypeError(f"multinomial: pvals must be a vector or a matrix, got {pvals.type}")
    new, u = _draw(random_state, "uniform", [constant(n, dtype="int64"), shape_i(pmat, 0)],
                   "float64")
    counts = MultinomialFromUniform(dtype)(pmat, u)
    if ndim is not None and int(ndim) != 2:
        raise ValueError(f"multinomial: the result is a matrix, ndim={ndim} asked")
    return new, counts


def choice(random_state: Any, size: Any = 1, a: Any = 2, replace: bool = True, p: Any = None,
           ndim: int | None = None, dtype: str = "int64") -> Draw:
    """Draws from `a` (an int: range(a); a vector: its items), with probabilities `p`, with or
    without replacement."""
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
            new, idx = integers(random_state, size, 0, count, ndim, "int64")
        else:
            new, u = _draw(random_state, "uniform", entries, "float64")
            idx = CategoricalFromUniform()(as_tensor_variable(p), u)
    else:
        k = _static_size(entries, "choice without replacement")
        new, u = _draw(random_state, "uniform", [count], "float64")
        keys = u if p is None else -tm.log(u) / tm.cast(as_tensor_variable(p), "float64")
        idx = reshape(ArgsortKeys(k)(keys), [e for e in entries])
    return new, (tm.cast(idx, dtype) if items is None else items[idx])


def permutation(random_state: Any, size: Any = None, n: Any = 1, ndim: int | None = None,
                dtype: str = "int64") -> Draw:
    """Permutations of range(n): one per entry of `size` (the result is size + (n,))."""
    entries = [] if size is None else _shape_entries(size)
    n = _as_int_scalar(n, "permutation: n")
    new, u = _draw(random_state, "uniform", [*entries, n], "float64")
    res = ArgsortKeys(None)(u)
    if ndim is not None and int(ndim) != len(entries) + 1:
        raise ValueError(f"permutation: ndim={ndim} but the result has {len(entries) + 1} "
                         "dimensions")
    return new, tm.cast(res, dtype)


def shuffle_row_elements(random_state: Any, input: Any) -> Draw:
    """`input` with the elements of each row (its last axis) shuffled, each row its own way."""
    input = as_tensor_variable(input)
    if input.ndim < 1:
        raise TypeError(f"shuffle_row_elements: input must have rows, got {input.type}")
    lead = [shape_i(input, d) for d in range(input.ndim - 1)]
    new, perm = permutation(random_state, lead, shape_i(input, input.ndim - 1))
    return new, PermuteAlongAxis(input.ndim - 1)(input, perm)


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


class RandomStreamsBase:
    """Theano's base of random-stream factories: each method draws through
    ``self.gen(<raw function>, ...)``, which a subclass (`RandomStreams`) defines: it gives the
    function a fresh state, registers the state's update and tags the draw with ``.rng`` and
    ``.update``."""

    def gen(self, op: Any, *args: Any, **kwargs: Any) -> TensorVariable:
        raise NotImplementedError(f"{type(self).__name__} must define gen(op, *args, **kwargs)")

    def uniform(self, size: Any = None, low: Any = 0.0, high: Any = 1.0, ndim: int | None = None,
                dtype: str | None = None) -> TensorVariable:
        """Uniform on (low, high) (raw.uniform)."""
        return self.gen(uniform, size, low, high, ndim=ndim, dtype=dtype)

    def normal(self, size: Any = None, avg: Any = 0.0, std: Any = 1.0, ndim: int | None = None,
               dtype: str | None = None) -> TensorVariable:
        """Normal with mean `avg` and deviation `std` (raw.normal)."""
        return self.gen(normal, size, avg, std, ndim=ndim, dtype=dtype)

    def binomial(self, size: Any = None, n: int = 1, p: Any = 0.5, ndim: int | None = None,
                 dtype: str = "int64", prob: Any = None) -> TensorVariable:
        """Binomial(n, p) counts (raw.binomial)."""
        return self.gen(binomial, size, n, p, ndim=ndim, dtype=dtype, prob=prob)

    def poisson(self, size: Any = None, lam: Any = 1.0, ndim: int | None = None,
                dtype: str = "int64") -> TensorVariable:
        """Poisson(lam) counts (raw.poisson)."""
        return self.gen(poisson, size, lam, ndim=ndim, dtype=dtype)

    def random_integers(self, size: Any = None, low: Any = 0, high: Any = 1,
                        ndim: int | None = None, dtype: str = "int64") -> TensorVariable:
        """Integers uniform on [low, high] (raw.random_integers)."""
        return self.gen(random_integers, size, low, high, ndim=ndim, dtype=dtype)

    def choice(self, size: Any = 1, a: Any = 2, replace: bool = True, p: Any = None,
               ndim: int | None = None, dtype: str = "int64") -> TensorVariable:
        """Draws from `a` with or without replacement (raw.choice)."""
        return self.gen(choice, size, a, replace, p, ndim=ndim, dtype=dtype)

    def permutation(self, size: Any = None, n: Any = 1, ndim: int | None = None,
                    dtype: str = "int64") -> TensorVariable:
        """Permutations of range(n) (raw.permutation)."""
        return self.gen(permutation, size, n, ndim=ndim, dtype=dtype)

    def multinomial(self, size: Any = None, n: int = 1, pvals: Any = (0.5, 0.5),
                    ndim: int | None = None, dtype: str = "int64") -> TensorVariable:
        """Counts of n draws from the categories `pvals` (raw.multinomial)."""
        return self.gen(multinomial, size, n, pvals, ndim=ndim, dtype=dtype)

    def shuffle_row_elements(self, input: Any) -> TensorVariable:
        """`input` with each row's elements shuffled (raw.shuffle_row_elements)."""
        return self.gen(shuffle_row_elements, input)
