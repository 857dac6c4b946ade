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

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.tensor.basic import _as_int_scalar, _known_one
from symgpu.tensor.random import philox
from symgpu.tensor.random.ops import PhiloxAdvance, PhiloxSample

__all__ = ["GpuPhiloxSample", "GpuPhiloxAdvance", "PHILOX_CUDA", "random_source",
           "sample_kernel_name", "GPU_RANDOM_DTYPES"]

#: output dtype -> (CUDA type, elements per Philox block)
GPU_RANDOM_DTYPES = {"float32": ("float", 4), "float64": ("double", 2)}

_BLOCK = 256

#: the generator and the word->float conversions (the contract of philox.py), as device
#: functions any kernel can include
PHILOX_CUDA = r"""
/* Philox4x32-10 (Random123 / cuRAND constants): c <- philox(c, (k0, k1)). */
__device__ __forceinline__ void sg_philox4x32_10(unsigned int c[4], unsigned int k0,
                                                 unsigned int k1)
{
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        const unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

/* The words of block b of the draw whose state is st = {key0, key1, ctr_lo, ctr_hi}. */
__device__ __forceinline__ void sg_philox_block(const unsigned int *st, unsigned long long b,
                                                unsigned int w[4])
{
    const unsigned long long c = ((((unsigned long long)st[3]) << 32) | st[2]) + b;
    w[0] = (unsigned int)c; w[1] = (unsigned int)(c >> 32); w[2] = 0u; w[3] = 0u;
    sg_philox4x32_10(w, st[0], st[1]);
}

/* uniform (0, 1), exact: ((w >> 9) + 0.5) * 2^-23 and ((w0 << 20 | w1 >> 12) + 0.5) * 2^-52 */
__device__ __forceinline__ float sg_u01_f32(unsigned int w)
{ return __fmul_rn(__fadd_rn((float)(w >> 9), 0.5f), 1.1920928955078125e-07f); }
__device__ __forceinline__ double sg_u01_f64(unsigned int w0, unsigned int w1)
{
    const unsigned long long m = (((unsigned long long)w0) << 20) | (w1 >> 12);
    return __dmul_rn(__dadd_rn((double)m, 0.5), 2.220446049250313e-16);
}

/* Box-Muller: (u1, u2) -> r cos(2 pi u2), r sin(2 pi u2), r = sqrt(-2 log u1).
   float: logf is the precise one (near u1 = 1 the fast __logf's absolute error would be of
   the order of log(u1) itself, and r's error its square root); the angle goes through the
   hardware __sincosf on theta - pi, in (-pi, pi) where its absolute error is at most
   2^-21.4, and cos(t + pi) = -cos(t), sin(t + pi) = -sin(t). The numbers stay within a few
   ulp of the exact Box-Muller value, as close as the CPU's float32 NumPy ones, and the
   kernel runs a quarter faster than with the precise sincosf. */
__device__ __forceinline__ void sg_box_muller(float u1, float u2, float *z0, float *z1)
{
    const float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
    float s, c;
    __sincosf(__fmaf_rn(6.2831854820251465f, u2, -3.1415927410125732f), &s, &c);
    *z0 = -__fmul_rn(r, c); *z1 = -__fmul_rn(r, s);
}
__device__ __forceinline__ void sg_box_muller(double u1, double u2, double *z0, double *z1)
{
    const double r = sqrt(__dmul_rn(-2.0, log(u1)));
    double s, c;
    sincos(__dmul_rn(6.283185307179586, u2), &s, &c);
    *z0 = __dmul_rn(r, c); *z1 = __dmul_rn(r, s);
}

/* The 4 (float32) or 2 (float64) values of block b of a uniform or normal draw. */
__device__ __forceinline__ void sg_philox_values(const unsigned int *st, unsigned long long b,
                                                 bool normal, float v[4])
{
    unsigned int w[4];
    sg_philox_block(st, b, w);
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = sg_u01_f32(w[u]);
    if (normal) { sg_box_muller(v[0], v[1], &v[0], &v[1]); sg_box_muller(v[2], v[3], &v[2], &v[3]); }
}
__device__ __forceinline__ void sg_philox_values(const unsigned int *st, unsigned long long b,
                                                 bool normal, double v[2])
{
    unsigned int w[4];
    sg_philox_block(st, b, w);
    v[0] = sg_u01_f64(w[0], w[1]); v[1] = sg_u01_f64(w[2], w[3]);
    if (normal) sg_box_muller(v[0], v[1], &v[0], &v[1]);
}
"""

_KERNELS = r"""
template <typename T, int K> struct sg_vec;
template <> struct sg_vec<float, 4> { typedef float4 type; };
template <> struct sg_vec<double, 2> { typedef double2 type; };

/* out[0:n] = the draw from state st; one thread per Philox block, one vector store. */
template <typename T, int K>
__device__ __forceinline__ void sg_philox_fill(const unsigned int *st, T *out, long long n,
                                               bool normal)
{
    const long long nb = (n + K - 1) / K;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += step) {
        T v[K];
        sg_philox_values(st, (unsigned long long)b, normal, v);
        const long long i = b * K;
        if (i + K <= n) {
            typedef typename sg_vec<T, K>::type V;
            V x;
            T *xs = reinterpret_cast<T *>(&x);
#pragma unroll
            for (int u = 0; u < K; ++u) xs[u] = v[u];
            reinterpret_cast<V *>(out)[b] = x;
        } else {
#pragma unroll
            for (int u = 0; u < K; ++u)
                if (i + u < n) out[i + u] = v[u];
        }
    }
}

extern "C" __global__ void sg_philox_uniform_float32(const unsigned int *st, float *out, long long n)
{ sg_philox_fill<float, 4>(st, out, n, false); }
extern "C" __global__ void sg_philox_normal_float32(const unsigned int *st, float *out, long long n)
{ sg_philox_fill<float, 4>(st, out, n, true); }
extern "C" __global__ void sg_philox_uniform_float64(const unsigned int *st, double *out, long long n)
{ sg_philox_fill<double, 2>(st, out, n, false); }
extern "C" __global__ void sg_philox_normal_float64(const unsigned int *st, double *out, long long n)
{ sg_philox_fill<double, 2>(st, out, n, true); }

/* out = st with the 64-bit counter moved on by nblocks (one thread). */
extern "C" __global__ void sg_philox_advance(const unsigned int *st, unsigned int *out,
                                             unsigned long long nblocks)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned long long c = ((((unsigned long long)st[3]) << 32) | st[2]) + nblocks;
        out[0] = st[0]; out[1] = st[1];
        out[2] = (unsigned int)c; out[3] = (unsigned int)(c >> 32);
    }
}
"""

_MODULE_KEY = ("symgpu.random", 2)


def random_source() -> str:
    """The CUDA module with the sampling kernels (uniform/normal x float32/float64) and the
    advance kernel."""
    return PHILOX_CUDA + _KERNELS


def sample_kernel_name(dist: str, dtype: str) -> str:
    return f"sg_philox_{dist}_{dtype}"


#: kernel name -> argument format (struct syntax, the CUDA parameter layout)
_FORMATS = {sample_kernel_name(d, t): "PPq" for d in philox.DISTS for t in GPU_RANDOM_DTYPES}
_FORMATS["sg_philox_advance"] = "PPQ"


def _launcher(ctx: Any, name: str) -> Callable[..., None]:
    from symgpu.gpu.runtime.codegen.launch import load_kernels
    return load_kernels(ctx, _MODULE_KEY, random_source, _FORMATS)[name].fast_launcher()


def grid_for(ctx: Any, nblocks: int) -> tuple[int, int, int]:
    """Thread blocks for `nblocks` Philox blocks: one per thread, at most 16 blocks of 256 per
    multiprocessor, two rounds of a full one (the kernels loop over the rest; on the H100 16
    per SM drew 2**26 normals 2% faster than 8, 4 or one thread per Philox block)."""
    from symgpu.gpu.runtime.codegen.launch import sm_count
    return (max(1, min(16 * sm_count(ctx), -(-nblocks // _BLOCK))), 1, 1)


def _launch_thunk(thunk: Callable[[], None]) -> Callable[[], None]:
    thunk.launches = True     # type: ignore[attr-defined]
    thunk.capturable = True   # type: ignore[attr-defined]  (device state: no host work)
    return thunk


class _RandomKernelOp(Op):
    """What both ops share: one CUDA module, offered to the link-time prefetch."""

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
        from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
        ctx = _context(self.context_name)
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
        from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
        ctx = _context(self.context_name)
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
    """PhiloxSample -> GpuPhiloxSample (float32/float64; the state moves to the device)."""
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
