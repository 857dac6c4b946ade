"""symgpu's CUDA backend.

Importing this package never imports PyCUDA: names load lazily (PEP 562), and the runtime
modules import PyCUDA only once a GPU context starts.  That keeps ``import symgpu`` working on
machines with no GPU, no driver and no PyCUDA.
"""
from __future__ import annotations

import importlib
from typing import Any

# --------------------------------------------------------------------------- runtime layer
# name -> module that defines it (symgpu.gpu.<module>)
_RUNTIME = {
    "GpuArray": "array", "empty": "array", "zeros": "array", "to_gpu": "array",
    "asarray": "array", "from_dlpack": "array", "from_cuda_array_interface": "array",
    "GpuContext": "context", "get_context": "context", "gpu_available": "context",
    "why_unavailable": "context", "init_default_context": "context",
    "register_context": "context", "GpuMemoryError": "pool", "CompileError": "compiler",
}

# --------------------------------------------------------------------------- graph layer
# Types, transfer ops and rewrites (type.py, basic_ops.py, ...) register their exports here,
# in the same name -> module form, so they stay lazy too.
_GRAPH: dict[str, str] = {}

_LAZY = {**_RUNTIME, **_GRAPH}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# =========================================================================== graph section
# Owned by the placement work (type.py, basic_ops.py, rewriting.py). Importing these registers
# the GPU backend with the core: the shared-variable constructor, the transfer() handler and
# the graph-to-GPU passes. None of them imports PyCUDA.
_GRAPH.update({
    "GpuArrayType": "type", "GpuArrayVariable": "type", "GpuArrayConstant": "type",
    "GpuArraySharedVariable": "type", "gpuarray_shared_constructor": "type",
    "GpuFromHost": "basic_ops", "HostFromGpu": "basic_ops", "GpuToGpu": "basic_ops",
    "GpuContiguous": "basic_ops", "GpuAlloc": "basic_ops", "GpuDimShuffle": "basic_ops",
    "gpu_from_host": "basic_ops", "host_from_gpu": "basic_ops",
    "as_gpuarray_variable": "basic_ops", "gpu_contiguous": "basic_ops",
    "register_lifter": "rewriting", "virtual_context": "rewriting",
    "ElemwiseKernelOp": "kernel_op",
})
_LAZY.update(_GRAPH)
__all__ = sorted(_LAZY)

import symgpu.gpu.type  # noqa: E402,F401  (shared constructor)
import symgpu.gpu.basic_ops  # noqa: E402,F401  (transfer() handler)
import symgpu.gpu.rewriting  # noqa: E402,F401  (graph_to_gpu and transfer cancelling)

# Kernel modules register their lifters (register_lifter) on import; load those present.
import importlib.util as _ilu  # noqa: E402

for _mod in ("elemwise", "blas", "reduction", "reductions", "subtensor", "nnet", "advanced",
             "advanced_pairs", "crossentropy", "lifters", "graphs", "random", "random_fusion"):
    if _ilu.find_spec(f"{__name__}.{_mod}") is not None:
        importlib.import_module(f"{__name__}.{_mod}")

# Convolution and pooling (issue 17): their lifters register on import, like the kernel
# modules above.
for _mod in ("conv", "pooling", "pooling_epilogue"):
    importlib.import_module(f"{__name__}.{_mod}")

# Loops (issue 15): Scan and IfElse move to the GPU with their inner graphs.
importlib.import_module(f"{__name__}.scan_op")
importlib.import_module(f"{__name__}.scan_ifelse")
