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
    # Theano's NumPy RandomState in the graph: symgpu's random state is a Philox counter
    "theano.tensor.raw_random:RandomStateType":
        "the type of a NumPy RandomState held in the graph; symgpu's random state is a uint32 "
        "Philox array in a shared variable, shown as a RandomState-like PhiloxRandomState "
        "(docs/random.md)",
    "theano.tensor.raw_random:random_state_type":
        "makes a variable of a NumPy RandomState; symgpu's random state is a uint32 Philox "
        "array in a shared variable (shared(np.random.RandomState(s)) makes one, "
        "docs/random.md)",
    "theano.tensor.raw_random:RandomFunction":
        "the op that calls a NumPy RandomState's methods; symgpu draws from Philox streams "
        "(symgpu.tensor.random: PhiloxSample and the transforms built on it, docs/random.md)",
    # libgpuarray's own kernel-writing helpers
    "theano.gpuarray.opt_util":
        "helpers for Theano's graph rewrites onto libgpuarray ops; symgpu's GPU placement has "
        "its own (symgpu.gpu.placement.rewriting)",
    "theano.gpuarray.kernel_codegen":
        "helpers that write libgpuarray kernel source; symgpu generates its CUDA kernels with "
        "its own code generator (symgpu.gpu.runtime.codegen)",
    "theano.gpuarray.fp16_help":
        "float16 load/store helpers for libgpuarray kernel source; symgpu's kernels come from "
        "its own code generator (symgpu.gpu.runtime.codegen)",
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
