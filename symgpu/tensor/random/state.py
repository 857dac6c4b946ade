"""`PhiloxRandomState`: what ``rv.rng.get_value()`` returns, a NumPy-RandomState-like view
of a stream's Philox state.

Theano's streams hold a NumPy ``RandomState``, and Theano code re-seeds or copies it through
the value: ``rng = rv.rng.get_value(); rng.seed(5); rv.rng.set_value(rng)``,
``rng.get_state()`` / ``rng.set_state(s)``. Here a stream's state is four uint32 words
``[key0, key1, ctr_lo, ctr_hi]``, so the value is those words as an ndarray subclass (it
still reads, compares, pickles and sets as the plain array it was) with RandomState's methods
on top. Seeding maps onto the key deterministically: ``seed(n)`` gives the key of stream 0 of
``RandomStreams(n)`` (`philox.stream_key`) and counter 0, so a re-seeded value set back
restarts the stream reproducibly. Its host draws (``uniform``, ``normal``, ``randint``...)
are the numbers a float64 draw of the graph would take from the same state, and move the
counter on by what they use, as the graph's update does.

`RANDOM_STATE_VIEW` is the adapter a shared state variable presents its value with
(`SharedVariable.value_view`): words -> `PhiloxRandomState` on `get_value`, and on
`set_value` a `PhiloxRandomState`, a state tuple of ``get_state()`` or a NumPy
``RandomState`` (its key: two words it would draw next) -> words.
"""
from __future__ import annotations

import copy
import secrets
from typing import Any

import numpy as np

from symgpu.tensor.random import philox

__all__ = ["PhiloxRandomState", "RANDOM_STATE_VIEW", "STATE_NAME", "words_of"]

#: the name `get_state()` gives its tuples (NumPy's say 'MT19937')
STATE_NAME = "Philox4x32-10"


def _check_seed(seed: Any, what: str) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TypeError(f"{what}: the seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def _seeded_words(seed: int) -> np.ndarray:
    key = philox.stream_key(seed, 0)
    return np.array([key[0], key[1], 0, 0], dtype=np.uint32)


def words_of(value: Any) -> Any:
    """The uint32 state words for `value`: a `PhiloxRandomState`, the tuple its `get_state()`
    returns, or a NumPy ``RandomState`` (NumPy's 'MT19937' state tuple too), whose key is the
    two 32-bit words it would draw next (the same RandomState state, the same stream; it is
    not advanced). Anything else (a plain array) is returned as it is, for the type to check."""
    if isinstance(value, PhiloxRandomState):
        return value.view(np.ndarray)
    if isinstance(value, np.random.RandomState):
        key = copy.deepcopy(value).randint(0, 2 ** 32, size=2, dtype=np.uint64)
        return np.array([key[0], key[1], 0, 0], dtype=np.uint32)
    if isinstance(value, tuple) and value and value[0] == "MT19937":
        rs = np.random.RandomState()
        rs.set_state(value)
        return words_of(rs)
    if isinstance(value, tuple) and value and value[0] == STATE_NAME:
        if len(value) != 3:
            raise ValueError(f"a {STATE_NAME} state is ({STATE_NAME!r}, key, counter), got "
                             f"{len(value)} items")
        key = np.asarray(value[1])
        counter = int(value[2])
        if key.shape != (2,) or not 0 <= counter < 2 ** 64:
            raise ValueError(f"a {STATE_NAME} state needs a key of two uint32 words and a counter "
                             f"in [0, 2**64), got key shape {key.shape}, counter {counter}")
        return np.array([key[0], key[1], counter & 0xFFFFFFFF, counter >> 32], dtype=np.uint32)
    return value


class PhiloxRandomState(np.ndarray):
    """A stream's state ``[key0, key1, ctr_lo, ctr_hi]`` (uint32, shape (4,)) with NumPy
    RandomState's methods, so Theano code that seeds, saves and restores a stream's value
    runs unchanged. Methods change the words in place (a value got with ``borrow=True`` on
    the host is the stream's own state); `set_value` it back to move the stream."""

    def __new__(cls, seed: int | None = None) -> "PhiloxRandomState":
        """A state seeded like ``RandomState(seed)``: see `seed`."""
        self = np.zeros(4, dtype=np.uint32).view(cls)
        self.seed(seed)
        return self

    @classmethod
    def present(cls, words: np.ndarray) -> "PhiloxRandomState":
        """`words` (a uint32 4-vector) seen as a PhiloxRandomState (a view: no copy)."""
        words = np.asarray(words)
        if words.dtype != np.uint32 or words.shape != (4,):
            raise TypeError(f"a Philox state is 4 uint32 words, got {words.dtype} {words.shape}")
        return words.view(cls)

    accept = staticmethod(words_of)

    def _check_words(self) -> None:
        if self.dtype != np.uint32 or self.shape != (4,):
            raise TypeError(f"PhiloxRandomState: a state is 4 uint32 words, this is "
                            f"{self.dtype} {self.shape} (an array computed from one)")

    # -- seeding and state ---------------------------------------------------------------------
    def seed(self, seed: int | None = None) -> None:
        """Re-seed: the key of stream 0 of ``RandomStreams(seed)`` (the same seed, the same
        numbers, in every process), counter 0; None takes a seed from the OS's entropy."""
        self._check_words()
        seed = secrets.randbits(63) if seed is None else _check_seed(seed, "PhiloxRandomState.seed")
        self[...] = _seeded_words(seed)

    def get_state(self) -> tuple[str, np.ndarray, int]:
        """``('Philox4x32-10', key (2 uint32 words), counter (an int below 2**64))``, a copy
        that `set_state` takes back (NumPy's says 'MT19937' and holds its 624 words)."""
        self._check_words()
        k0, k1, lo, hi = (int(w) for w in self)
        return (STATE_NAME, np.array([k0, k1], dtype=np.uint32), (hi << 32) | lo)

    def set_state(self, state: Any) -> None:
        """Take a state from `get_state()` (or another PhiloxRandomState, or a NumPy
        RandomState's 'MT19937' tuple, whose stream is keyed by the words it would draw)."""
        self._check_words()
        words = words_of(state)
        if words is state and not isinstance(state, np.ndarray):
            raise TypeError(f"PhiloxRandomState.set_state: expected a state tuple of get_state() "
                            f"or a PhiloxRandomState, got {type(state).__name__}")
        words = np.asarray(words)
        if words.shape != (4,) or words.dtype != np.uint32:
            raise TypeError(f"PhiloxRandomState.set_state: a state is 4 uint32 words, got "
                            f"{words.dtype} {words.shape}")
        self[...] = words

    @property
    def key(self) -> tuple[int, int]:
        """The two key words."""
        return int(self[0]), int(self[1])

    @property
    def counter(self) -> int:
        """The 64-bit block counter (what the stream's draws have used so far)."""
        return (int(self[3]) << 32) | int(self[2])

    # -- host draws: the graph's float64 numbers from this state --------------------------------
    def _take(self, dist: str, size: Any) -> np.ndarray:
        self._check_words()
        shape = () if size is None else tuple(np.atleast_1d(np.asarray(size, dtype=np.int64)))
        out = philox.sample(self.view(np.ndarray), dist, "float64", shape)
        n = int(np.prod(shape, dtype=np.int64))
        self[...] = philox.advance(self.view(np.ndarray), philox.blocks(n, "float64"))
        return out

    @staticmethod
    def _out(vals: np.ndarray, size: Any) -> Any:
        return vals[()] if size is None else vals

    def random_sample(self, size: Any = None) -> Any:
        """Uniform floats in (0, 1): a float64 ``uniform`` draw of the graph from this state."""
        return self._out(self._take("uniform", size), size)

    random = random_sample
    sample = random_sample
    ranf = random_sample

    def rand(self, *dims: int) -> Any:
        """``random_sample(dims)``."""
        return self.random_sample(dims or None)

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: Any = None) -> Any:
        """``low + (high - low) * U``, as the graph's ``uniform`` computes it."""
        if size is None:
            size = np.broadcast(np.asarray(low), np.asarray(high)).shape or None
        low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        return self._out(low + (high - low) * self._take("uniform", size), size)

    def standard_normal(self, size: Any = None) -> Any:
        """Standard normals (Box-Muller): a float64 ``normal`` draw of the graph."""
        return self._out(self._take("normal", size), size)

    def randn(self, *dims: int) -> Any:
        """``standard_normal(dims)``."""
        return self.standard_normal(dims or None)

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Any:
        """``loc + scale * Z``, as the graph's ``normal`` computes it."""
        if size is None:
            size = np.broadcast(np.asarray(loc), np.asarray(scale)).shape or None
        loc, scale = np.asarray(loc, dtype=np.float64), np.asarray(scale, dtype=np.float64)
        return self._out(loc + scale * self._take("normal", size), size)

    def randint(self, low: int, high: int | None = None, size: Any = None,
                dtype: Any = int) -> Any:
        """Integers in [low, high) (NumPy's argument order: ``randint(n)`` is [0, n)), as the
        graph's ``integers`` computes them: ``low + floor((high - low) * U)``."""
        if high is None:
            low, high = 0, low
        if not int(low) < int(high):
            raise ValueError(f"PhiloxRandomState.randint: low >= high ({low} >= {high})")
        lo, hi = float(low), float(high)
        u = self._take("uniform", size)
        vals = np.minimum(lo + np.floor((hi - lo) * u), hi - 1).astype(dtype)
        return self._out(vals, size)

    def __reduce__(self):
        # pickled as the class and its four words (no ndarray subclass state to carry)
        return (_rebuild, (self.view(np.ndarray).copy(),))


def _rebuild(words: np.ndarray) -> PhiloxRandomState:
    return words.view(PhiloxRandomState)


#: what a shared random-state variable presents its value with (SharedVariable.value_view)
RANDOM_STATE_VIEW = PhiloxRandomState
