"""Theano's `theano.tensor.shared_randomstreams` import path for symgpu's RandomStreams."""
from symgpu.tensor.random.streams import RandomStreams, RandomVariable

__all__ = ["RandomStreams", "RandomVariable"]
