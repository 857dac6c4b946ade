"""``import symgpu.misc.pycuda_init``: PyCUDA works in symgpu's CUDA context.

The ported ``import theano.misc.pycuda_init``.  Why it exists: ``pycuda.autoinit`` makes a
private CUDA context, and kernels launched there cannot touch memory that symgpu (or PyTorch,
CuPy, JAX) allocated in the device's *primary* context.  Importing this module instead starts
symgpu's GPU (the default context when ``device=cuda``, else ``cuda0``) and makes its primary
context current in the importing thread, so ``SourceModule``, ``pycuda.gpuarray`` and kernel
launches run where symgpu's arrays live.  (``pycuda.autoprimaryctx`` is compatible too.)

Like Theano's, it never raises: where no GPU can be used it warns, and ``pycuda_available``
is False.  Other threads call ``context.activate()`` before using PyCUDA.
"""
from __future__ import annotations

import warnings
from typing import Any

from symgpu.gpu.runtime.context import init_default_context, start_device
from symgpu.gpu.runtime.libcuda import driver_errors

__all__ = ["pycuda_available", "context"]

#: True once PyCUDA is importable and symgpu's context is current in this thread
pycuda_available: bool = False
#: symgpu's GpuContext that PyCUDA now uses (None where no GPU can be used)
context: Any = None


def _start() -> None:
    global pycuda_available, context
    try:
        ctx = init_default_context() or start_device("cuda0")
        ctx.activate()
        import pycuda.driver  # noqa: F401  (symgpu started it; this only checks the import)
    # what "no GPU here" raises, said as a warning as Theano did: no PyCUDA (ImportError), a
    # GPU that cannot start (GpuUnavailableError, a RuntimeError), a virtual default context
    # (RuntimeError from activate), a bad device flag (ValueError), a driver error
    except (ImportError, RuntimeError, ValueError, *driver_errors()) as exc:
        warnings.warn(f"symgpu.misc.pycuda_init: PyCUDA cannot use a GPU here ({exc})",
                      stacklevel=3)
        return
    context = ctx
    pycuda_available = True


_start()
