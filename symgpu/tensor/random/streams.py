"""`RandomStreams`: Theano's random-variable factory on the Philox generator.

Each draw method makes one new stream: a shared uint32 state ``[key0, key1, ctr_lo, ctr_hi]``
(key from the streams' seed and the stream's number, counter 0) whose `default_update`
advances the counter by the blocks one draw uses, so `function` moves every stream on after
each call without the user writing updates (`no_default_updates` turns that off).
The result variable carries `.rng` (the state) and `.update` (state, new state), as in Theano
(`RandomVariable` is the name `isinstance` knows such a draw by). Every draw goes through
`gen(op, ...)` with one of raw.py's functions, Theano's generic entry point.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.sharedvalue import SharedVariable
from symgpu.graph.basic import Variable
from symgpu.tensor.random import philox, raw
from symgpu.tensor.random.raw import DEFAULT_SEED, RandomStreamsBase, state_variable
from symgpu.tensor.random.state import PhiloxRandomState
from symgpu.tensor.type import TensorVariable

__all__ = ["RandomStreams", "RandomVariable"]


class _RandomVariableMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Variable) and hasattr(obj, "rng") and hasattr(obj, "update")


class RandomVariable(metaclass=_RandomVariableMeta):
    """Theano's name for a random draw: a variable with `.rng`, the shared Philox state it is
    drawn from, and `.update`, the pair (state, state after the draw). symgpu's draws are
    ordinary TensorVariables carrying both; ``isinstance(x, RandomVariable)`` tells them."""

    #: the shared generator state the draw reads
    rng: SharedVariable | None = None
    #: (rng, the state after the draw): the update that moves the stream on
    update: tuple[SharedVariable, Variable] | None = None


class RandomStreams(RandomStreamsBase):
    """A family of random streams with one seed (Theano's RandomStreams / MRG_RandomStreams).

    The same seed gives the same numbers on the CPU and the GPU, in every process.
    `nstreams` (MRG_RandomStreams' parallel-stream count) is accepted and has no effect:
    every element of a Philox draw already has its own counter."""

    def __init__(self, seed: int | None = None):
        self.state_updates: list[tuple[SharedVariable, Variable]] = []
        #: the constructor's seed: `seed()` without one goes back to it (as Theano's does)
        self.default_instance_seed = DEFAULT_SEED if seed is None else self._check_seed(seed)
        self._seed = self.default_instance_seed

    @staticmethod
    def _check_seed(seed: Any) -> int:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise TypeError(f"RandomStreams: the seed must be a non-negative integer, got {seed!r}")
        return int(seed)

    def seed(self, seed: int | None = None) -> None:
        """Re-seed every stream made so far (and the later ones): counters go back to 0;
        without a seed, the constructor's seed again."""
        self._seed = self.default_instance_seed if seed is None else self._check_seed(seed)
        for j, (state, _) in enumerate(self.state_updates):
            state.set_value(self._initial_state(j))

    def __getitem__(self, item: SharedVariable) -> PhiloxRandomState:
        """Theano's ``srng[rv.rng]``: the stream's state (``item.get_value(borrow=True)``)."""
        self._check_own(item)
        return item.get_value(borrow=True)

    def __setitem__(self, item: SharedVariable, value: Any) -> None:
        """Theano's ``srng[rv.rng] = state``: a `PhiloxRandomState`, its `get_state()` tuple
        or a NumPy RandomState (``item.set_value(value, borrow=True)``)."""
        self._check_own(item)
        item.set_value(value, borrow=True)

    def _check_own(self, item: Any) -> None:
        if not any(item is state for state, _ in self.state_updates):
            raise KeyError(f"RandomStreams: {item} is not the state of one of this "
                           f"RandomStreams' streams (use a draw's .rng)")

    @property
    def rstate(self) -> int:
        """MRG_RandomStreams' state that seeds the streams made next: here the seed, since a
        stream's key comes from (seed, its number); ``g2.rstate = g1.rstate`` makes g2's next
        streams g1's (Theano's tutorial copies it so)."""
        return self._seed

    @rstate.setter
    def rstate(self, value: int) -> None:
        self._seed = self._check_seed(value)

    def updates(self) -> list[tuple[SharedVariable, Variable]]:
        """The (state, new state) pairs of every stream (what the default updates do)."""
        return list(self.state_updates)

    def _initial_state(self, index: int) -> np.ndarray:
        key = philox.stream_key(self._seed, index)
        return np.array([key[0], key[1], 0, 0], dtype=np.uint32)

    def gen(self, op: Any, *args: Any, **kwargs: Any) -> TensorVariable:
        """Theano's generic draw: ``op(state, *args, **kwargs)`` (a function of raw.py, or
        any function returning (new state, sample)) on a new stream's state; the sample comes
        back with `.rng` and `.update` set, and the state's update is registered (its
        `default_update` and `state_updates`)."""
        index = len(self.state_updates)
        state = state_variable(self._initial_state(index), name=f"philox_state_{index}")
        new, out = op(state, *args, **kwargs)
        state.default_update = new
        self.state_updates.append((state, new))
        out.rng, out.update = state, (state, new)
        return out

    # -- continuous ---------------------------------------------------------------------------
    def uniform(self, size: Any = None, low: Any = 0.0, high: Any = 1.0, ndim: int | None = None,
                dtype: str | None = None, nstreams: int | None = None) -> TensorVariable:
        """Uniform on (low, high): `low + (high - low) * U`, U in (0, 1) (gradients reach
        low and high)."""
        return self.gen(raw.uniform, size, low, high, ndim=ndim, dtype=dtype)

    def normal(self, size: Any = None, avg: Any = 0.0, std: Any = 1.0, ndim: int | None = None,
               dtype: str | None = None, nstreams: int | None = None) -> TensorVariable:
        """Normal with mean `avg` and deviation `std`: `avg + std * Z` (Box-Muller Z)."""
        return self.gen(raw.normal, size, avg, std, ndim=ndim, dtype=dtype)

    # -- discrete ------------------------------------------------------------------------------
    def binomial(self, size: Any = None, n: int = 1, p: Any = 0.5, ndim: int | None = None,
                 dtype: str = "int64", nstreams: int | None = None,
                 prob: Any = None) -> TensorVariable:
        """Binomial(n, p) counts: the number of n uniforms below p (n a Python int)."""
        return self.gen(raw.binomial, size, n, p, ndim=ndim, dtype=dtype, prob=prob)

    def integers(self, size: Any = None, low: Any = 0, high: Any = 1, ndim: int | None = None,
                 dtype: str = "int64") -> TensorVariable:
        """Integers uniform on [low, high) (high excluded, NumPy's Generator.integers)."""
        return self.gen(raw.integers, size, low, high, ndim=ndim, dtype=dtype)

    def multinomial(self, size: Any = None, n: int = 1, pvals: Any = None, ndim: int | None = None,
                    dtype: str = "int64", nstreams: int | None = None) -> TensorVariable:
        """Counts of n draws from the categories `pvals` (a vector, or a matrix with one
        distribution per row); `size` (with a vector pvals) is the number of rows."""
        return self.gen(raw.multinomial, size, n, pvals, ndim=ndim, dtype=dtype)


