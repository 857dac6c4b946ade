"""Interop with other GPU libraries (Theano's ``theano.misc``).

* :mod:`symgpu.misc.pycuda_utils` — ``to_gpuarray`` / ``from_gpuarray``: symgpu ``GpuArray``
  <-> PyCUDA ``GPUArray`` sharing memory;
* :mod:`symgpu.misc.pycuda_init` — ``import symgpu.misc.pycuda_init`` makes PyCUDA work in
  symgpu's CUDA context (the ported ``import theano.misc.pycuda_init``; use it instead of
  ``pycuda.autoinit``, whose private context cannot see symgpu's memory);
* :mod:`symgpu.misc.pkl_utils` — ``dump`` / ``load``: Theano's zip format for saving models
  (a pickle plus each array as an ``.npy`` member);
* :mod:`symgpu.misc.breakpoint` — ``PdbBreakpoint``: a conditional debugger stop in a
  compiled function (Theano's ``theano.tests.breakpoint``).

Nothing here imports PyCUDA at import time, so ``import symgpu.misc`` works without it.
"""
from __future__ import annotations

__all__ = ["pycuda_utils"]
