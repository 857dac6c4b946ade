"""symgpu's CUDA backend.

The package is laid out by concern (docs/internals.md):

- ``runtime/``: driver, contexts and streams, pools, GpuArray, DLPack, the kernel compiler,
  code generation, device-side checks. It imports nothing from ``symgpu.graph``,
  ``symgpu.tensor`` or ``symgpu.compile``.
- ``placement/``: GPU types and shared variables, transfers, the graph-to-GPU sweep, lifters.
- ``ops/``: the GPU ops; their lifters register on import.
- ``exec/``: running functions: CUDA-graph planning, capture and replay, graph parameters,
  node timers, parallel cold compiles.

Importing this package never imports PyCUDA: names load lazily (PEP 562), and the runtime
modules import PyCUDA only once a GPU context starts.  That keeps ``import symgpu`` working on
machines with no GPU, no driver and no PyCUDA.
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it (under symgpu.gpu), imported on first use (PEP 562)
_LAZY: dict[str, str] = {
    "ElemwiseKernelOp": "ops.kernel_op",
    "StepInterval": "exec.timeline",
    "overlap_ms": "exec.timeline",
    "step_intervals": "exec.timeline",
    "GpuAlloc": "placement.basic_ops",
    "GpuContiguous": "placement.basic_ops",
    "GpuDimShuffle": "placement.basic_ops",
    "GpuFromHost": "placement.basic_ops",
    "GpuToGpu": "placement.basic_ops",
    "HostFromGpu": "placement.basic_ops",
    "as_gpuarray_variable": "placement.basic_ops",
    "gpu_contiguous": "placement.basic_ops",
    "gpu_from_host": "placement.basic_ops",
    "host_from_gpu": "placement.basic_ops",
    "register_lifter": "placement.rewriting",
    "virtual_context": "placement.rewriting",
    "GpuArrayConstant": "placement.type",
    "GpuArraySharedVariable": "placement.type",
    "GpuArrayType": "placement.type",
    "GpuArrayVariable": "placement.type",
    "gpuarray_shared_constructor": "placement.type",
    "GpuArray": "runtime.array",
    "asarray": "runtime.array",
    "empty": "runtime.array",
    "from_cuda_array_interface": "runtime.array",
    "from_dlpack": "runtime.array",
    "to_gpu": "runtime.array",
    "zeros": "runtime.array",
    "CompileError": "runtime.compiler",
    "GpuContext": "runtime.context",
    "device_count": "runtime.context",
    "get_context": "runtime.context",
    "gpu_available": "runtime.context",
    "init_default_context": "runtime.context",
    "register_context": "runtime.context",
    "why_unavailable": "runtime.context",
    "GpuMemoryError": "runtime.pool",
}

__all__ = sorted(_LAZY)


#: Theano's flags saying its GPU back end is in use (theano.gpuarray.pygpu_activated, the old
#: theano.sandbox.cuda.cuda_enabled): libraries written for Theano test them before building
#: GPU layers. Read on each access, never cached: True once the default context is a real GPU.
_IN_USE_FLAGS = ("pygpu_activated", "cuda_enabled")


def _gpu_in_use() -> bool:
    """Whether the default context is a started, real GPU (device=cuda and a usable GPU);
    with device=cpu nothing is started."""
    return _context.context_in_use(None) is not None


def __getattr__(name: str) -> Any:
    if name in _IN_USE_FLAGS:
        return _gpu_in_use()
    module = _LAZY.get(name)
    if module is None:
        # a submodule path not imported yet (Theano's `gpuarray.dnn`, served by the path
        # layer's import hook when the façade installed it)
        try:
            # deferred: a submodule named by attribute, imported on first use
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # deferred: public names resolve lazily (PEP 562): importing the package stays cheap
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_IN_USE_FLAGS))


# Importing these registers the GPU backend with the core (none imports PyCUDA): the shared
# variable constructor (placement.type), the transfer() handler (placement.basic_ops), the
# graph-to-GPU passes (placement.rewriting), and the lifters of every op module.
from symgpu.gpu.runtime import context as _context  # noqa: E402
import symgpu.gpu.placement.type  # noqa: E402,F401
import symgpu.gpu.placement.basic_ops  # noqa: E402,F401
import symgpu.gpu.placement.rewriting  # noqa: E402,F401
import symgpu.gpu.ops.elemwise  # noqa: E402,F401
import symgpu.gpu.ops.array_math  # noqa: E402,F401  (GpuArray's operators, reductions and ufuncs)
import symgpu.gpu.ops.blas  # noqa: E402,F401
import symgpu.gpu.ops.subtensor  # noqa: E402,F401
import symgpu.gpu.ops.nnet  # noqa: E402,F401
import symgpu.gpu.ops.advanced  # noqa: E402,F401
import symgpu.gpu.ops.advanced_pairs  # noqa: E402,F401
import symgpu.gpu.ops.index_uploads  # noqa: E402,F401  (integer index arithmetic on the GPU)
import symgpu.gpu.ops.advanced_general  # noqa: E402,F401
import symgpu.gpu.ops.crossentropy  # noqa: E402,F401
import symgpu.gpu.ops.xent_softmax  # noqa: E402,F401
import symgpu.gpu.ops.nll_grad  # noqa: E402,F401
import symgpu.gpu.ops.reduce_epilogue  # noqa: E402,F401
import symgpu.gpu.ops.reduce_prologue  # noqa: E402,F401
import symgpu.gpu.ops.attention_join  # noqa: E402,F401
import symgpu.gpu.ops.row_group_rewrite  # noqa: E402,F401
import symgpu.gpu.ops.row_group_map_rewrite  # noqa: E402,F401  (elementwise consumers join row groups)
import symgpu.gpu.ops.col_group_rewrite  # noqa: E402,F401
import symgpu.gpu.ops.elemwise_group_rewrite  # noqa: E402,F401
import symgpu.gpu.ops.producer_copies  # noqa: E402,F401
import symgpu.gpu.ops.narrow_outputs  # noqa: E402,F401
import symgpu.gpu.ops.guarded_updates  # noqa: E402,F401
import symgpu.gpu.ops.take_rows  # noqa: E402,F401
import symgpu.gpu.ops.gemm_epilogue  # noqa: E402,F401
import symgpu.gpu.ops.gelu_epilogue_rewrite  # noqa: E402,F401  (GELU and its gradient in epilogues)
import symgpu.gpu.ops.lifters  # noqa: E402,F401
import symgpu.gpu.exec.graphs  # noqa: E402,F401
import symgpu.gpu.exec.backend  # noqa: E402,F401  (the compiler's view of the GPU)
import symgpu.gpu.exec.prefetch  # noqa: E402,F401  (registers the pre-link parallel kernel compile)
import symgpu.gpu.ops.random  # noqa: E402,F401
import symgpu.ifelse  # noqa: E402,F401  (the lazy branch scan_to_dnn_rnn's masked loops take)
import symgpu.gpu.ops.random_fusion  # noqa: E402,F401
import symgpu.gpu.ops.conv  # noqa: E402,F401
import symgpu.gpu.ops.pooling  # noqa: E402,F401
import symgpu.gpu.ops.pooling_epilogue  # noqa: E402,F401
import symgpu.gpu.ops.scan_op  # noqa: E402,F401
import symgpu.gpu.exec.scan_graph  # noqa: E402,F401  (GpuScan captures whole loops through it)
import symgpu.gpu.ops.scan_ifelse  # noqa: E402,F401
import symgpu.gpu.ops.builders  # noqa: E402,F401  (OpFromGraph -> GpuOpFromGraph)
import symgpu.gpu.ops.ctc  # noqa: E402,F401
import symgpu.gpu.ops.cudnn_rnn  # noqa: E402,F401  (DnnRNN/DnnRNNGrad -> cuDNN's RNN API)
import symgpu.gpu.ops.pad_steps  # noqa: E402,F401  (PadSteps -> GpuPadSteps, GpuPadPrefix)
import symgpu.gpu.ops.linalg  # noqa: E402,F401  (cuSOLVER/cuBLAS linear algebra)
import symgpu.gpu.placement.sparse_type  # noqa: E402,F401  (GPU sparse matrices: type, shared variables, transfers)
import symgpu.gpu.ops.sparse  # noqa: E402,F401  (sparse x dense products through cuSPARSE)
import symgpu.gpu.ops.fft  # noqa: E402,F401  (RFFTOp/IRFFTOp -> GpuRFFT/GpuIRFFT through cuFFT)
import symgpu.gpu.ops.sort  # noqa: E402,F401  (sort, argsort, topk: CUB and a radix select)
import symgpu.gpu.ops.collectives  # noqa: E402,F401  (NCCL collectives, the distributed nccl backend)
import symgpu.gpu.ops.comm_join  # noqa: E402,F401  (collectives joined back from their stream)
import symgpu.gpu.ops.attention  # noqa: E402,F401  (fused attention: FlashAttention-2 kernels)
import symgpu.gpu.ops.constructors  # noqa: E402,F401  (Eye -> GpuEye, Split -> GpuSplit; GpuTri)
import symgpu.gpu.ops.neighbours  # noqa: E402,F401  (Images2Neibs -> GpuImages2Neibs, its gradient)
