"""Signal-processing ops in Theano's layout: `symgpu.tensor.signal.pool` (2-d and 3-d pooling)
and `symgpu.tensor.signal.conv` (Theano's single-channel 2-d conv2d)."""
from symgpu.tensor.signal import conv, pool  # noqa: F401
