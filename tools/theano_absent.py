"""Theano 1.0's documented names that symgpu leaves out on purpose, each with its reason.

Keys: ``module:name`` for one name (``module:Class`` covers the class's members too), or
``module`` for a whole module (and those below it). tools/theano_names.py counts these as
deliberately absent; its test checks that each has a reason, names something the data file
documents, and does not resolve after all (an absence that became present is taken out).
"""
from __future__ import annotations

ABSENT: dict[str, str] = {
    # pages of Theano 1.0's reference for what Theano 1.0 itself no longer has
    "theano.compile.profilemode":
        "removed from Theano before 1.0 (its page only says so); profiling is config.profile, "
        "which symgpu has",
    "theano.tensor.signal.downsample":
        "removed from Theano before 1.0 (its page only points to theano.tensor.signal.pool)",
    "theano.tensor.signal.conv:fft":
        "a placeholder of Theano's reference (`fft(*todo)`): Theano 1.0 has no such function",
    "theano.tensor:_tensor_py_operators.conf":
        "a misprint of Theano's reference for `conj`: Theano 1.0's variables have no `conf`",
    "theano.tensor:_tensor_py_operators.__div__":
        "Python 2's division operator; on Python 3 division is __truediv__ / __floordiv__",
    # --- names2 (issue 31): Theano internals documented by a bare `:members:` that have no
    # meaning in symgpu, each for its own reason
    # Theano's C linker: per-Type C snippets for its compiled-C ops
    "theano.compile.ops:register_deep_copy_op_c_code":
        "registers C code for Theano's DeepCopyOp on a new Type for its C linker; symgpu copies "
        "outputs in the function's Python/GPU output handling, with no per-Type C snippets",
    "theano.compile.ops:register_rebroadcast_c_code":
        "registers C code for Theano's Rebroadcast on a new Type; symgpu's broadcast checks "
        "(SpecifyBroadcastable/Unbroadcast) are Python/GPU ops with no per-Type C snippets",
    "theano.compile.ops:register_shape_c_code":
        "registers C code for Theano's Shape op on a new Type; symgpu's Shape reads the "
        "shape in Python (and GpuShape on the device) for every type",
    "theano.compile.ops:register_shape_i_c_code":
        "registers C code for Theano's Shape_i on a new Type; symgpu's Shape_i needs no "
        "per-Type C code",
    "theano.compile.ops:register_specify_shape_c_code":
        "registers C code for Theano's SpecifyShape on a new Type; symgpu's SpecifyShape "
        "checks in Python for every type",
    "theano.compile.ops:register_view_op_c_code":
        "registers C code for Theano's ViewOp on a new Type for its C linker; symgpu has no "
        "per-Type C snippets to register",
    "theano.gof.type:CLinkerType":
        "the interface of Types that emit C declarations for Theano's C linker; symgpu's "
        "types have no C-code interface",
    "theano.gof.type:CDataType":
        "the type of an opaque C pointer passed between Theano's C ops; symgpu's ops pass "
        "Python objects and device pointers",
    # libgpuarray / Theano GPU back-end plumbing
    "theano.gpuarray.basic_ops:GpuKernelBase":
        "the mixin by which Theano's GPU ops hand libgpuarray kernel source to its C code; "
        "symgpu's GPU ops launch their .cu kernels through symgpu.gpu.ops.kernel_op",
    "theano.gpuarray.basic_ops:CGpuKernelBase":
        "GpuKernelBase for ops whose C code is read from .c files by Theano's C linker; "
        "symgpu's GPU kernels are .cu sources compiled by NVRTC/nvcc (symgpu.gpu.runtime)",
    "theano.gpuarray.basic_ops:Kernel":
        "libgpuarray's description of one kernel for Theano's generated C code; symgpu's "
        "launcher has its own (symgpu.gpu.runtime.codegen.launch.Kernel, not this interface)",
    "theano.gpuarray.elemwise:SupportCodeError":
        "raised when a scalar op's C support code cannot go into a libgpuarray kernel; "
        "symgpu's kernel code generator renders every scalar op it lifts",
    "theano.gpuarray.elemwise:GpuCAReduceCPY":
        "libgpuarray's generic Python-generated reduction, Theano's fallback beside "
        "GpuCAReduceCuda; symgpu has one GPU reduction op (GpuCAReduce) with its own kernels",
    "theano.gpuarray.dnn:DnnBase":
        "the base class giving Theano's cuDNN ops their C handle and headers; symgpu's ops "
        "call cuDNN through ctypes (symgpu.gpu.ops.cudnn)",
    "theano.gpuarray.dnn:GpuDnnConvDesc":
        "an op that builds a cuDNN convolution descriptor as a graph value for Theano's C "
        "code; symgpu builds descriptors inside its conv ops (symgpu.gpu.ops.cudnn.ConvDescs)",
    "theano.gpuarray.dnn:GpuDnnPoolDesc":
        "an op that builds a cuDNN pooling descriptor as a graph value (deprecated in Theano "
        "1.0); symgpu's pooling kernels need no descriptor",
    # --- end of names2's block
    # --- names3 (issue 31): Theano names of its GPU ops and rewrite internals with no
    # counterpart here, each for its own reason (the ones symgpu has under other names are in
    # symgpu/theano_paths.py's RENAMES)
    "theano.gpuarray.dnn:GpuDnnBatchNorm":
        "cuDNN's batch-norm op; symgpu's batch_normalization_train is a graph of elementwise "
        "ops and reductions that the GPU placement fuses (dnn_batch_normalization_train builds it)",
    "theano.gpuarray.dnn:GpuDnnBatchNormInference":
        "cuDNN's batch-norm inference op; symgpu's batch_normalization_test is one fused "
        "elementwise graph on the GPU (dnn_batch_normalization_test builds it)",
    "theano.gpuarray.dnn:GpuDnnSoftmaxGrad":
        "cuDNN's softmax gradient op; symgpu's softmax gradient is an elementwise graph that "
        "the GPU placement fuses",
    "theano.gpuarray.dnn:GpuDnnTransformerGrid":
        "cuDNN's spatial transformer; symgpu has no spatial transformer op (dnn_spatialtf)",
    "theano.gpuarray.dnn:GpuDnnTransformerSampler":
        "cuDNN's spatial transformer sampler; symgpu has no spatial transformer op",
    "theano.gpuarray.dnn:GpuDnnTransformerGradI":
        "the gradient of cuDNN's spatial transformer, which symgpu does not have",
    "theano.gpuarray.dnn:GpuDnnTransformerGradT":
        "the gradient of cuDNN's spatial transformer, which symgpu does not have",
    "theano.gpuarray.dnn:dnn_spatialtf":
        "cuDNN's spatial transformer network layer; symgpu has no spatial transformer op",
    "theano.gpuarray.type:GpuContextType":
        "the Type of a GPU context passed as a graph input to Theano's C ops; symgpu's GPU "
        "ops hold their context name as a property and look the context up when they run",
    # --- end of names3's block
    # the other issue's
    "theano.sparse.tests":
        "a helper of Theano's own test suite, not of its library",
}


def reason(module: str, qualname: str) -> str | None:
    """Why Theano's `module`:`qualname` is left out, or None where it is not."""
    parts = qualname.split(".") if qualname else []
    for k in range(len(parts), 0, -1):
        key = f"{module}:{'.'.join(parts[:k])}"
        if key in ABSENT:
            return ABSENT[key]
    while module:
        if module in ABSENT:
            return ABSENT[module]
        module = module.rpartition(".")[0]
    return None
