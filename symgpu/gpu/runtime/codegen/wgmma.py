"""Hopper's warpgroup products (``wgmma.mma_async``, sm_90a) as CUDA device functions.

``wgmma_source(ns)`` renders, for float16 and bfloat16 operands with float32 accumulators,
``Wg<T>::ss<TA, TB>(d, desc_a, desc_b, acc)`` (A and B in shared memory) and
``Wg<T>::rs<TB>(d, a, desc_b, acc)`` (A in registers, the mma.sync A layout) for m64nNk16
with N in ``ns`` (the accumulator ``float d[N / 2]`` picks the shape), and the helpers every
caller needs: the fences, commit and wait, and the shared-memory matrix descriptor of the
128-byte swizzle.  Rendered, not written out, because each shape's inline PTX names every
accumulator register.

Semantics a caller relies on (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply"):
all 128 threads of a warpgroup issue each call together; the accumulators and A registers
belong to the product until ``wg_wait``; shared memory written by ordinary stores or cp.async
needs ``wg_proxy_fence`` before a product reads it; ``acc`` 0 overwrites ``d``.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["wgmma_source", "WGMMA_TYPES"]

#: CUDA storage type -> wgmma operand type
WGMMA_TYPES = {"__half": "f16", "__nv_bfloat16": "bf16"}

_HELPERS = r"""
#define SG_WGMMA 1
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
/* shared memory written through the generic proxy (st.shared, cp.async), visible to wgmma */
__device__ __forceinline__ void wg_proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* registers a product owns: the compiler may neither read them earlier nor reuse them */
template <int R> __device__ __forceinline__ void wg_keep(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
template <int R> __device__ __forceinline__ void wg_keep(unsigned (&a)[R][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j]) :: "memory");
}
/* The descriptor of a matrix at shared address `addr` in the 128-byte swizzle: rows of 128
   bytes, 8-row atoms of 1024 bytes (`sbo` apart), 64-value panels `lbo` bytes apart where the
   product's non-K extent spans several (MN-major operands only). */
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) |
           ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
template <typename T> struct Wg;
"""


def _regs(first: int, count: int) -> str:
    return ", ".join(f"%{i}" for i in range(first, first + count))


def _outs(count: int) -> str:
    return ", ".join(f'"+f"(d[{i}])' for i in range(count))


def _ss(ptx: str, n: int) -> str:
    r = n // 2
    return f"""    template <int TA, int TB>
    static __device__ __forceinline__ void ss(float (&d)[{r}], unsigned long long da,
                                              unsigned long long db, int acc) {{
        asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
                     "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
                     "{{{_regs(0, r)}}}, %{r}, %{r + 1}, p, 1, 1, %{r + 3}, %{r + 4};\\n}}\\n"
                     : {_outs(r)}
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    }}
"""


def _rs(ptx: str, n: int) -> str:
    r = n // 2
    return f"""    template <int TB>
    static __device__ __forceinline__ void rs(float (&d)[{r}], const unsigned (&a)[4],
                                              unsigned long long db, int acc) {{
        asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 5}, 0;\\n"
                     "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
                     "{{{_regs(0, r)}}}, {{{_regs(r, 4)}}}, %{r + 4}, p, 1, 1, %{r + 6};\\n}}\\n"
                     : {_outs(r)}
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc),
                       "n"(TB));
    }}
"""


def wgmma_source(ns: Sequence[int]) -> str:
    """The helpers and ``Wg<T>`` of every 16-bit type for the products m64nNk16, N in ns."""
    parts = [_HELPERS]
    for ctype, ptx in WGMMA_TYPES.items():
        parts.append(f"template <> struct Wg<{ctype}> {{\n")
        for n in sorted(set(ns)):
            if n % 8 or not 8 <= n <= 256:
                raise ValueError(f"wgmma has no m64n{n}k16")
            parts.append(_ss(ptx, n))
            parts.append(_rs(ptx, n))
        parts.append("};\n")
    return "".join(parts)
