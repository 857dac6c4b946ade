"""Signal-processing ops in Theano's layout: `symgpu.tensor.signal.pool` (2-d and 3-d pooling)."""
from symgpu.tensor.signal import pool  # noqa: F401
