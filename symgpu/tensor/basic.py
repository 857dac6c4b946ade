"""Shape and construction ops: reshape, flatten, concatenate, stack, alloc, zeros, arange...

(This module is being filled by the shape/indexing work; it re-exports the shape helpers.)
"""
from symgpu.tensor.math import cast, ones_like, second, zeros_like
from symgpu.tensor.shape import (dimshuffle, shape, shape_i, specify_broadcastable_as,
                                 transpose)
