"""The GPU ops (elementwise, BLAS, indexing, nnet, convolution, pooling, random, loops)
and their lifters, which register on import (``symgpu/gpu/__init__.py`` imports them).
"""
