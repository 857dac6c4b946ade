"""Random numbers: `RandomStreams` on the counter-based Philox4x32-10 generator.

See docs/random.md; `philox.py` defines the numbers (`philox_c.py` draws the same ones in
C), `ops.py` the graph ops, `streams.py` the user-facing factory."""
from symgpu.tensor.random.ops import (ArgsortKeys, CategoricalFromUniform,
                                      MultinomialFromUniform, PhiloxAdvance, PhiloxSample)
from symgpu.tensor.random.streams import RandomStreams

__all__ = ["RandomStreams", "PhiloxSample", "PhiloxAdvance", "CategoricalFromUniform",
           "MultinomialFromUniform", "ArgsortKeys"]
