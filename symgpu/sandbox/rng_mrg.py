"""Theano's `theano.sandbox.rng_mrg` import path: MRG_RandomStreams is symgpu's counter-based
RandomStreams (Philox4x32-10 instead of MRG31k3p; the same seed gives the same numbers on
the CPU and the GPU)."""
from symgpu.tensor.random.streams import RandomStreams

MRG_RandomStreams = RandomStreams

__all__ = ["MRG_RandomStreams"]
