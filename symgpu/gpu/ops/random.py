"""Philox random numbers generated on the GPU: GpuPhiloxSample and GpuPhiloxAdvance, and the
lifters that move symgpu/tensor/random's ops onto the device.

The numbers follow symgpu/tensor/random/philox.py bit for bit (uniform floats are exactly
the CPU's; normals run Box-Muller with logf/sqrtf and, in float32, the hardware sine and
cosine on an angle in (-pi, pi), so they agree within float rounding: see sg_box_muller).
The generator state (four uint32 words) stays in device memory: the sampling kernel reads key
and counter there and GpuPhiloxAdvance writes the next state with a one-thread kernel, so a
call needs no host work and both ops are CUDA-graph capturable (replaying a graph draws fresh
numbers: the counter moves on the device; the runner copies the next state back into the
state variable's own buffer, so its pointer, and the graph's key, repeat).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops import elemwise as elemwise_ops
from symgpu.gpu.ops.elemwise import _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import common_source, launch, sections
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.basic import _as_int_scalar, _known_one
from symgpu.tensor.random import philox
from symgpu.tensor.random.ops import PhiloxAdvance, PhiloxSample

__all__ = ["GpuPhiloxSample", "GpuPhiloxAdvance", "PHILOX_CUDA", "random_source",
           "sample_kernel_name", "GPU_RANDOM_DTYPES"]

#: output dtype -> (the CUDA type it is drawn in, elements per Philox block): the half types
#: are drawn in float32 and rounded on the store, as philox.sample casts them
GPU_RANDOM_DTYPES = {"float16": ("float", 4), "bfloat16": ("float", 4), "float32": ("float", 4),
                     "float64": ("double", 2)}

_BLOCK = 256

#: the generator and the word->float conversions (the contract of philox.py), as device
#: functions any kernel can include
_CU = sections("random.cu")   # Philox device functions, then the kernels
PHILOX_CUDA = _CU[""].substitute()

_KERNELS = _CU["kernels"].substitute()

_MODULE_KEY = ("symgpu.random", 2)


def random_source() -> str:
    """The CUDA module with the sampling kernels (uniform/normal x each GPU_RANDOM_DTYPES
    dtype) and the advance kernel."""
    return common_source() + PHILOX_CUDA + _KERNELS


def sample_kernel_name(dist: str, dtype: str) -> str:
    return f"sg_philox_{dist}_{dtype}"


#: kernel name -> argument format (struct syntax, the CUDA parameter layout)
_FORMATS = {sample_kernel_name(d, t): "PPq" for d in philox.DISTS for t in GPU_RANDOM_DTYPES}
_FORMATS["sg_philox_advance"] = "PPQ"


def _launcher(ctx: Any, name: str) -> Callable[..., None]:
    return launch.load_kernels(ctx, _MODULE_KEY, random_source, _FORMATS)[name].fast_launcher()


def grid_for(ctx: Any, nblocks: int) -> tuple[int, int, int]:
    """Thread blocks for `nblocks` Philox blocks: one per thread, at most 16 blocks of 256 per
    multiprocessor, two rounds of a full one (the kernels loop over the rest; on the H100 16
    per SM drew 2**26 normals 2% faster than 8, 4 or one thread per Philox block)."""
    return (max(1, min(16 * launch.sm_count(ctx), -(-nblocks // _BLOCK))), 1, 1)


def _launch_thunk(thunk: Callable[[], None]) -> Callable[[], None]:
    thunk.launches = True     # type: ignore[attr-defined]
    thunk.capturable = True   # type: ignore[attr-defined]  (device state: no host work)
    return thunk


class _RandomKernelOp(Op):
    """What both ops share: one CUDA module, offered to the link-time prefetch."""

    #: its output is a random draw: values computed from it are stored, not recomputed in
    #: other kernels (symgpu/tensor/rewriting/recompute.py), so each draw is made once
    draws_random = True

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return [(_MODULE_KEY, random_source, ())]

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


def _gpu_state(op: Op, state: Any, context_name: Any) -> Any:
    state = as_gpuarray_variable(state, context_name)
    if state.dtype != "uint32" or state.ndim != 1:
        raise TypeError(f"{op}: the generator state must be a uint32 vector of 4 words, got "
                        f"{state} ({state.type})")
    return state


def _shape(op: Op, values: Any) -> tuple[int, ...]:
    shape = tuple(int(s) for s in values)
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: negative dimension in the size {shape}")
    return shape


def _check_state_array(op: Op, st: Any) -> None:
    if tuple(st.shape) != (4,) or not st.flags.c_contiguous:
        raise ValueError(f"{op}: the generator state must be 4 contiguous uint32 words, got "
                         f"shape {tuple(st.shape)}")


class GpuPhiloxSample(_RandomKernelOp):
    """(state on the GPU, *size) -> a new C-contiguous draw of `dist` of `dtype` on the GPU,
    the same numbers as PhiloxSample."""

    __props__ = ("dist", "dtype", "context_name")

    def __init__(self, dist: str, dtype: str, context_name: Any = None):
        if dist not in philox.DISTS or dtype not in GPU_RANDOM_DTYPES:
            raise ValueError(f"GpuPhiloxSample: no kernel for {dist!r} of {dtype!r} (GPU "
                             f"dtypes: {sorted(GPU_RANDOM_DTYPES)})")
        self.dist, self.dtype, self.context_name = dist, dtype, context_name

    def make_node(self, state: Any, *size: Any) -> Apply:
        state = _gpu_state(self, state, self.context_name)
        size = [_as_int_scalar(s, f"{self}: size entry") for s in size]
        out = GpuArrayType(self.dtype, [_known_one(s) for s in size], self.context_name)()
        return Apply(self, [state, *size], [out])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(node.inputs[1:])]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = elemwise_ops._context(self.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        st_cell = storage_map[node.inputs[0]]
        size_cells = [storage_map[v] for v in node.inputs[1:]]
        out_cell = storage_map[node.outputs[0]]
        launch = _launcher(ctx, sample_kernel_name(self.dist, self.dtype))
        np_dtype = np.dtype(self.dtype)
        per = GPU_RANDOM_DTYPES[self.dtype][1]
        op, block = self, (_BLOCK, 1, 1)

        def thunk() -> None:
            ctx.activate()
            st = st_cell[0]
            _check_state_array(op, st)
            shape = _shape(op, [c[0] for c in size_cells])
            out = new_array(ctx, shape, np_dtype)
            n = int(np.prod(shape, dtype=np.int64))
            if n:
                launch(grid_for(ctx, (n + per - 1) // per), block, st.ptr, out.ptr, n)
            out_cell[0] = out

        return _launch_thunk(thunk)


class GpuPhiloxAdvance(_RandomKernelOp):
    """(state on the GPU, *size) -> the next state on the GPU (PhiloxAdvance's numbers),
    written by a one-thread kernel so the counter never visits the host."""

    __props__ = ("dtype", "context_name")

    def __init__(self, dtype: str, context_name: Any = None):
        self.dtype, self.context_name = dtype, context_name

    def make_node(self, state: Any, *size: Any) -> Apply:
        state = _gpu_state(self, state, self.context_name)
        size = [_as_int_scalar(s, f"{self}: size entry") for s in size]
        return Apply(self, [state, *size], [state.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = elemwise_ops._context(self.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        st_cell = storage_map[node.inputs[0]]
        size_cells = [storage_map[v] for v in node.inputs[1:]]
        out_cell = storage_map[node.outputs[0]]
        op, dtype = self, self.dtype
        u32 = np.dtype("uint32")
        launch = _launcher(ctx, "sg_philox_advance")

        def thunk() -> None:
            ctx.activate()
            st = st_cell[0]
            _check_state_array(op, st)
            n = int(np.prod(_shape(op, [c[0] for c in size_cells]), dtype=np.int64))
            out = new_array(ctx, (4,), u32)
            launch((1, 1, 1), (32, 1, 1), st.ptr, out.ptr, philox.blocks(n, dtype))
            out_cell[0] = out

        return _launch_thunk(thunk)


def _state_on_gpu(inputs: Any) -> bool:
    return is_gpu_var(inputs[0]) and inputs[0].dtype == "uint32" and inputs[0].ndim == 1


@register_lifter(PhiloxSample)
def lift_philox_sample(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """PhiloxSample -> GpuPhiloxSample (a float dtype of GPU_RANDOM_DTYPES; the state moves
    to the device)."""
    if op.dtype not in GPU_RANDOM_DTYPES:
        return None
    state = inputs[0] if _state_on_gpu(inputs) else as_gpuarray_variable(inputs[0], context_name)
    return [GpuPhiloxSample(op.dist, op.dtype, context_name)(state, *inputs[1:])]


@register_lifter(PhiloxAdvance)
def lift_philox_advance(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """PhiloxAdvance -> GpuPhiloxAdvance when the state lives on the GPU (a GPU shared
    variable); a host state keeps its host update."""
    if not _state_on_gpu(inputs) or not inputs.was_on_gpu[0]:
        return None
    return [GpuPhiloxAdvance(op.dtype, context_name)(inputs[0], *inputs[1:])]
