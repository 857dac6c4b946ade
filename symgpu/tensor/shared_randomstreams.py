"""Theano's `theano.tensor.shared_randomstreams` import path for symgpu's RandomStreams."""
from symgpu.tensor.random.streams import RandomStreams

__all__ = ["RandomStreams"]
