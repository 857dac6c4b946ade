"""Graph parameters' kernels and helpers: they live in symgpu/gpu/runtime/graph_params.py
(below the ops that launch them); ``symgpu.gpu.exec.graph_params`` is their documented path."""
from symgpu.gpu.runtime.graph_params import (PARAMS_SOURCE, arange_from_params, dyn_slice_copy,
                                             load_kernels, pack_int64, pack_scalar,
                                             prefetch_request, slot_ptr)

__all__ = ["PARAMS_SOURCE", "slot_ptr", "pack_int64", "pack_scalar", "dyn_slice_copy",
           "arange_from_params", "prefetch_request", "load_kernels"]
