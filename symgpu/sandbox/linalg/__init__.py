"""Theano's `theano.sandbox.linalg`: the matrix hints and spectral_radius_bound of `ops`, and
the linear algebra Theano's sandbox re-exported."""
from symgpu.sandbox.linalg.ops import *  # noqa: F401,F403
from symgpu.sandbox.linalg.ops import __all__
