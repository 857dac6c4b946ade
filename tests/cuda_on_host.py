"""CUDA kernels of symgpu run on the CPU, thread by thread, for tests without a GPU.

The kernel source is compiled as host C++ after a prelude that turns CUDA's qualifiers into
nothing, ``threadIdx`` into the running thread's index and ``__shared__`` into ``static``
(one block runs at a time), and runs every thread of a block as a fiber (``ucontext``):
``__syncthreads()`` parks a thread until every live thread of its block has reached it, and
the warp intrinsics (``__shfl_xor_sync``, ``__shfl_down_sync``, ``__syncwarp``) park it until
the live lanes of its warp have. Blocks (of one or two dimensions) run one after another.
Atomics are plain operations (one thread runs at a time); the hardware's approximate
intrinsics (``__sincosf``) are the precise C functions. What this checks: a kernel's
arithmetic, indexing, barriers and shuffles against NumPy; not its speed, nor races a real
GPU's scheduling could expose.

    lib = build(source, '''
        EMU_WRAP(run_k, k, (const float *x, float *y, long long n), (x, y, n))
    ''', tmp_path)
    lib.run_k(grid, bx, by, x_ptr, y_ptr, n)     # ctypes: a 1-d grid of bx x by blocks

or ``EMU_KERNEL(k)`` for a kernel called with its parameters packed in one buffer, as
cuLaunchKernel's parameter buffer (``tests/emulated_gpu.py`` launches GPU ops' thunks so).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest

#: the C++ that makes CUDA source compile and run on the host (see the module docstring)
PRELUDE = r"""
#include <ucontext.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>
using std::min; using std::max; using std::isnan; using std::isinf;

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
struct dim3 { unsigned int x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
static inline void emu_sincosf(float a, float *s, float *c) { *s = sinf(a); *c = cosf(a); }
#define __sincosf emu_sincosf   /* glibc has a __sincosf of its own */
static const int warpSize = 32;
enum { EMU_MAX_THREADS = 1024, EMU_STACK = 256 * 1024 };
enum { EMU_RUN, EMU_AT_BLOCK, EMU_AT_WARP, EMU_DONE };
static dim3 gridDim, blockDim, blockIdx;
static dim3 emu_tid[EMU_MAX_THREADS];
static int emu_cur, emu_n;
static int emu_state[EMU_MAX_THREADS];
static ucontext_t emu_main, emu_ctx[EMU_MAX_THREADS];
static char *emu_stacks[EMU_MAX_THREADS];
static unsigned long long emu_slot[EMU_MAX_THREADS];
static std::function<void()> emu_body;
#define threadIdx (emu_tid[emu_cur])

static void emu_entry() { emu_body(); emu_state[emu_cur] = EMU_DONE; }
static void emu_park(int state)
{
    emu_state[emu_cur] = state;
    swapcontext(&emu_ctx[emu_cur], &emu_main);
}
static inline void __syncthreads() { emu_park(EMU_AT_BLOCK); }
static inline void __syncwarp(unsigned int = 0xffffffffu) { emu_park(EMU_AT_WARP); }
static inline void __threadfence() {}
static inline void __threadfence_system() {}

template <typename T> static T emu_exchange(T v, int src)
{
    static_assert(sizeof(T) <= sizeof(unsigned long long), "8 bytes at most");
    std::memcpy(&emu_slot[emu_cur], &v, sizeof(T));
    __syncwarp();                        // every lane has written
    T r;
    std::memcpy(&r, &emu_slot[src], sizeof(T));
    __syncwarp();                        // every lane has read before one writes again
    return r;
}
static inline int emu_lane() { return emu_cur & 31; }
template <typename T> static T __shfl_xor_sync(unsigned int, T v, int mask, int width = 32)
{
    const int lane = emu_lane(), base = emu_cur - lane;
    const int src = ((lane ^ mask) & ~(width - 1)) == (lane & ~(width - 1)) ? (lane ^ mask) : lane;
    return emu_exchange(v, base + src);
}
template <typename T> static T __shfl_down_sync(unsigned int, T v, unsigned int d, int width = 32)
{
    const int lane = emu_lane(), base = emu_cur - lane;
    const int src = (lane % width) + (int)d < width ? lane + (int)d : lane;
    return emu_exchange(v, base + src);
}
template <typename T> static T __shfl_sync(unsigned int, T v, int src, int width = 32)
{
    const int lane = emu_lane(), base = emu_cur - lane;
    return emu_exchange(v, base + (lane & ~(width - 1)) + (src % width));
}
template <typename T> static T __ldg(const T *p) { return *p; }
template <typename T> static T __ldcg(const T *p) { return *p; }
template <typename T> static T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
static inline unsigned int atomicInc(unsigned int *p, unsigned int limit)
{ unsigned int old = *p; *p = old >= limit ? 0 : old + 1; return old; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v)
{ double d; std::memcpy(&d, &v, 8); return d; }
static inline unsigned int __umulhi(unsigned int a, unsigned int b)
{ return (unsigned int)(((unsigned long long)a * b) >> 32); }

/* Every thread of one block as a fiber: run those that can run, then release a barrier once
   every live thread it waits for has reached it; a block whose threads all wait on barriers
   that cannot release is a deadlock (a barrier inside divergent code): abort. */
static void emu_block()
{
    for (int t = 0; t < emu_n; ++t) {
        emu_tid[t] = dim3{(unsigned)t % blockDim.x, (unsigned)t / blockDim.x, 0};
        emu_state[t] = EMU_RUN;
        if (!emu_stacks[t]) emu_stacks[t] = (char *)std::malloc(EMU_STACK);
        getcontext(&emu_ctx[t]);
        emu_ctx[t].uc_stack.ss_sp = emu_stacks[t];
        emu_ctx[t].uc_stack.ss_size = EMU_STACK;
        emu_ctx[t].uc_link = &emu_main;
        makecontext(&emu_ctx[t], emu_entry, 0);
    }
    for (;;) {
        bool ran = false;
        for (int t = 0; t < emu_n; ++t) {
            if (emu_state[t] != EMU_RUN) continue;
            emu_cur = t;
            swapcontext(&emu_main, &emu_ctx[t]);
            ran = true;
        }
        bool live = false, block_ready = true;
        for (int t = 0; t < emu_n; ++t) {
            if (emu_state[t] == EMU_DONE) continue;
            live = true;
            if (emu_state[t] != EMU_AT_BLOCK) block_ready = false;
        }
        if (!live) return;
        bool released = false;
        if (block_ready) {
            for (int t = 0; t < emu_n; ++t)
                if (emu_state[t] == EMU_AT_BLOCK) emu_state[t] = EMU_RUN;
            released = true;
        }
        for (int w = 0; w < emu_n; w += 32) {
            bool ready = true, any = false;
            for (int t = w; t < std::min(w + 32, emu_n); ++t) {
                if (emu_state[t] == EMU_DONE) continue;
                if (emu_state[t] != EMU_AT_WARP) ready = false; else any = true;
            }
            if (ready && any) {
                for (int t = w; t < std::min(w + 32, emu_n); ++t)
                    if (emu_state[t] == EMU_AT_WARP) emu_state[t] = EMU_RUN;
                released = true;
            }
        }
        if (!ran && !released) {
            std::fprintf(stderr, "cuda_on_host: deadlock at a barrier in block %u\n", blockIdx.x);
            std::abort();
        }
    }
}

static void emu_launch3(long long gx, long long gy, long long gz, long long bx, long long by,
                        std::function<void()> body)
{
    if (bx < 1 || by < 1 || bx * by > EMU_MAX_THREADS) std::abort();
    gridDim = dim3{(unsigned)gx, (unsigned)gy, (unsigned)gz};
    blockDim = dim3{(unsigned)bx, (unsigned)by, 1};
    emu_n = (int)(bx * by);
    emu_body = std::move(body);
    for (long long z = 0; z < gz; ++z)
        for (long long y = 0; y < gy; ++y)
            for (long long x = 0; x < gx; ++x) {
                blockIdx = dim3{(unsigned)x, (unsigned)y, (unsigned)z};
                emu_block();
            }
}
static void emu_launch(long long grid, long long bx, long long by, std::function<void()> body)
{ emu_launch3(grid, 1, 1, bx, by, std::move(body)); }

/* kernel(args...) from `buf`, the parameters laid out as CUDA lays them out (each at the next
   multiple of its alignment: what cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER takes) */
template <typename... A, std::size_t... I>
static void emu_call_impl(void (*k)(A...), const char *buf, std::index_sequence<I...>)
{
    constexpr std::size_t n = sizeof...(A);
    const std::size_t sizes[n + 1] = {sizeof(std::remove_cv_t<A>)..., 0};
    const std::size_t aligns[n + 1] = {alignof(std::remove_cv_t<A>)..., 1};
    std::size_t off[n + 1] = {0}, at = 0;
    for (std::size_t i = 0; i < n; ++i) {
        at = (at + aligns[i] - 1) / aligns[i] * aligns[i];
        off[i] = at;
        at += sizes[i];
    }
    alignas(64) char local[4096];
    std::memcpy(local, buf, at < sizeof(local) ? at : sizeof(local));
    k(*reinterpret_cast<const std::remove_cv_t<A> *>(local + off[I])...);
}
template <typename... A> static void emu_call(void (*k)(A...), const char *buf)
{ emu_call_impl(k, buf, std::index_sequence_for<A...>{}); }

/* extern "C" void NAME(long long grid, long long bx, long long by, PARAMS): launch
   KERNEL(ARGS) on a grid of `grid` blocks of bx x by threads (x fastest, as CUDA numbers
   them into warps) */
#define EMU_WRAP(NAME, KERNEL, PARAMS, ARGS) \
    extern "C" void NAME(long long grid_, long long bx_, long long by_, EMU_UNPAREN PARAMS) \
    { emu_launch(grid_, bx_, by_, [=]() { KERNEL ARGS; }); }
#define EMU_UNPAREN(...) __VA_ARGS__

/* extern "C" void run_NAME(long long gx, gy, gz, bx, by, const char *params): launch NAME
   with its parameters packed in one buffer, as cuLaunchKernel's parameter buffer */
#define EMU_KERNEL(NAME) \
    extern "C" void run_##NAME(long long gx_, long long gy_, long long gz_, long long bx_, \
                               long long by_, const char *params_) \
    { emu_launch3(gx_, gy_, gz_, bx_, by_, [=]() { emu_call(NAME, params_); }); }
"""

#: stands in for the toolkit's cuda_fp16.h (the kernels only convert float16 to and from float)
FP16_SHIM = r"""
#pragma once
#include <cstdint>
#include <cstring>
struct __half { std::uint16_t bits; };
static inline float __half2float(__half h)
{
    const std::uint32_t sign = (h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1fu,
                        man = h.bits & 0x3ffu;
    std::uint32_t f;
    if (exp == 0x1fu) f = sign | 0x7f800000u | (man << 13);             /* inf, NaN */
    else if (exp) f = sign | ((exp + 112u) << 23) | (man << 13);        /* normal */
    else if (!man) f = sign;                                           /* zero */
    else {                                                             /* subnormal */
        int e = -1; std::uint32_t m = man;
        do { ++e; m <<= 1; } while (!(m & 0x400u));
        f = sign | ((112u - e) << 23) | ((m & 0x3ffu) << 13);
    }
    float out; std::memcpy(&out, &f, 4); return out;
}
static inline __half __float2half_rn(float v)
{
    std::uint32_t f; std::memcpy(&f, &v, 4);
    const std::uint32_t sign = (f >> 16) & 0x8000u; f &= 0x7fffffffu;
    __half h;
    if (f > 0x7f800000u) { h.bits = (std::uint16_t)(sign | 0x7e00u); return h; }    /* NaN */
    if (f >= 0x477ff000u) { h.bits = (std::uint16_t)(sign | 0x7c00u); return h; }   /* inf */
    if (f < 0x38800000u) {                                             /* subnormal, zero */
        float a; std::memcpy(&a, &f, 4);
        const float q = a * 16777216.0f;                               /* 2^24: units of 2^-24 */
        std::uint32_t r = (std::uint32_t)q; const float rem = q - (float)r;
        if (rem > 0.5f || (rem == 0.5f && (r & 1u))) ++r;
        h.bits = (std::uint16_t)(sign | r); return h;
    }
    const std::uint32_t mant = f & 0x7fffffu, exp = (f >> 23) - 112u;
    std::uint32_t bits = (exp << 10) | (mant >> 13);
    const std::uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (bits & 1u))) ++bits;    /* to nearest even */
    h.bits = (std::uint16_t)(sign | bits); return h;
}
static inline __half atomicAdd(__half *p, __half v)     /* one thread runs at a time */
{ const __half old = *p; *p = __float2half_rn(__half2float(old) + __half2float(v)); return old; }
"""

#: stands in for the toolkit's cuda_bf16.h (bfloat16 is the top half of a float's bits)
BF16_SHIM = r"""
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { std::uint16_t bits; };
static inline float __bfloat162float(__nv_bfloat16 h)
{ const std::uint32_t f = (std::uint32_t)h.bits << 16; float out; std::memcpy(&out, &f, 4); return out; }
static inline __nv_bfloat16 __float2bfloat16_rn(float v)
{
    std::uint32_t f; std::memcpy(&f, &v, 4);
    __nv_bfloat16 h;
    if ((f & 0x7fffffffu) > 0x7f800000u) { h.bits = (std::uint16_t)((f >> 16) | 0x40u); return h; }
    f += 0x7fffu + ((f >> 16) & 1u);                                  /* to nearest even */
    h.bits = (std::uint16_t)(f >> 16); return h;
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v)
{
    const __nv_bfloat16 old = *p;
    *p = __float2bfloat16_rn(__bfloat162float(old) + __bfloat162float(v));
    return old;
}
"""


def write_shims(directory) -> None:
    """The half-precision headers the rendered kernels include, as host stand-ins."""
    for name, text in (("cuda_fp16.h", FP16_SHIM), ("cuda_bf16.h", BF16_SHIM)):
        with open(os.path.join(str(directory), name), "w") as f:
            f.write(text)


requires_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")


def build(source: str, wrappers: str, directory) -> ctypes.CDLL:
    """Compile `source` (CUDA, as the runtime renders it) with `wrappers` (EMU_WRAP lines) as
    a host shared library in `directory` and load it."""
    cpp = os.path.join(str(directory), "kernels_on_host.cpp")
    lib = os.path.join(str(directory), "kernels_on_host.so")
    with open(cpp, "w") as f:
        f.write(PRELUDE + "\n" + source + "\n" + wrappers + "\n")
    write_shims(directory)
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w",
                           "-I", str(directory), cpp, "-o", lib],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"g++ failed on the kernels:\n{proc.stderr[-4000:]}")
    return ctypes.CDLL(lib)
