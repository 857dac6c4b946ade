"""Random numbers: `RandomStreams` on the counter-based Philox4x32-10 generator.

See docs/random.md; `philox.py` defines the numbers (`philox_c.py` draws the same ones in
C), `ops.py` the graph ops, `raw.py` Theano's functional `raw_random` API on Philox states
(each function: state -> (new state, sample)), `streams.py` the user-facing factory."""
from symgpu.tensor.random.ops import (ArgsortKeys, CategoricalFromUniform,
                                      MultinomialFromUniform, PhiloxAdvance, PhiloxSample)
from symgpu.tensor.random.raw import RandomStreamsBase, philox_state
from symgpu.tensor.random.state import PhiloxRandomState
from symgpu.tensor.random.streams import RandomStreams, RandomVariable

__all__ = ["RandomStreams", "RandomStreamsBase", "PhiloxRandomState", "RandomVariable", "philox_state", "PhiloxSample",
           "PhiloxAdvance", "CategoricalFromUniform", "MultinomialFromUniform", "ArgsortKeys"]
