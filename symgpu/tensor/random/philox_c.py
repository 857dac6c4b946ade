"""`philox.sample` through a compiled C Philox4x32-10: the same numbers, several times faster.

Why: the NumPy generator (philox.py) runs each of the ten rounds as a dozen ufunc passes over
uint64 arrays; one C loop over the blocks keeps the words in vector registers and draws
uniforms faster than NumPy's own PCG64. philox.py stays the one definition of the numbers and
the reference the tests compare with; the C below mirrors `philox._rounds`, `_u01_f32` and
`_u01_f64` and the layout of its docstring, bit for bit. Normal draws take their uniform pairs
from C and run `philox._box_muller` itself on them (NumPy's float32/float64 log, sqrt, cos,
sin), so they are bitwise those of the NumPy path too; float16 and bfloat16 are drawn in
float32 and rounded, as there (`philox.as_draw_dtype`).

The library is built once per machine with `symgpu.link.cc` (the ``cxx`` flag); `enabled`
says whether a thunk made now may use it (C allowed, so not under FAST_COMPILE, and a compiler
that built it; the Python-C runtime of the elemwise kernels is not needed). A PhiloxSample thunk
binds `sampler(dist, dtype)` once; without the library, it and `sample` run `philox.sample`.
"""
from __future__ import annotations

import ctypes
import math
import warnings
from typing import Callable

import numpy as np

from symgpu.link import cc
from symgpu.tensor.random import philox
from symgpu.tensor.c_elemwise import c_kernels_allowed

__all__ = ["SOURCE", "enabled", "sample", "sampler"]

SOURCE = r"""
#include <stdint.h>

#ifdef __AVX512F__
typedef uint64_t lane;  /* 32-bit words in 64-bit lanes: AVX-512 multiplies them unwidened */
#else
typedef uint32_t lane;  /* AVX2 and others: 32-bit lanes, widened for the multiplies */
#endif

/* philox._rounds on counter (ctr lo, ctr hi, 0, 0) and key (key0, key1) */
static inline void philox(uint32_t key0, uint32_t key1, uint64_t ctr, uint32_t w[4]) {
    lane k0 = key0, k1 = key1, c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 = (uint32_t)(k0 + 0x9E3779B9u);
            k1 = (uint32_t)(k1 + 0xBB67AE85u);
        }
        uint64_t p0 = (uint64_t)(c0 & 0xFFFFFFFFu) * 0xD2511F53u;
        uint64_t p1 = (uint64_t)(c2 & 0xFFFFFFFFu) * 0xCD9E8D57u;
        c0 = (lane)(p1 >> 32) ^ c1 ^ k0;
        c2 = (lane)(p0 >> 32) ^ c3 ^ k1;
        c1 = (lane)(p1 & 0xFFFFFFFFu);
        c3 = (lane)(p0 & 0xFFFFFFFFu);
    }
    w[0] = (uint32_t)c0; w[1] = (uint32_t)c1; w[2] = (uint32_t)c2; w[3] = (uint32_t)c3;
}

/* philox._u01_f32 and _u01_f64: exact, in (0, 1) */
static inline float u01_f32(uint32_t w) { return ((float)(int32_t)(w >> 9) + 0.5f) * 0x1p-23f; }

static inline double u01_f64(uint32_t w0, uint32_t w1) {
    return ((double)(int64_t)(((uint64_t)w0 << 20) | (w1 >> 12)) + 0.5) * 0x1p-52;
}

/* symgpu_philox_<layout>(key0, key1, ctr, blocks, ...): what blocks ctr, ctr + 1, ... (the
   counter wraps at 2**64) give: the uniform draw's elements (4 float32 or 2 float64 a block)
   in `out`; or its Box-Muller pairs (elements 2k, 2k + 1; 2 pairs a block, 1 of float64), the
   first of each in `u1`, the second in `u2` */
void symgpu_philox_uniform_f32(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t blocks,
                               float *out) {
    for (int64_t i = 0; i < blocks; i++) {
        uint32_t w[4];
        philox(k0, k1, ctr + (uint64_t)i, w);
        for (int j = 0; j < 4; j++) out[4 * i + j] = u01_f32(w[j]);
    }
}

void symgpu_philox_uniform_f64(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t blocks,
                               double *out) {
    for (int64_t i = 0; i < blocks; i++) {
        uint32_t w[4];
        philox(k0, k1, ctr + (uint64_t)i, w);
        out[2 * i] = u01_f64(w[0], w[1]);
        out[2 * i + 1] = u01_f64(w[2], w[3]);
    }
}

void symgpu_philox_pairs_f32(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t blocks,
                             float *u1, float *u2) {
    for (int64_t i = 0; i < blocks; i++) {
        uint32_t w[4];
        philox(k0, k1, ctr + (uint64_t)i, w);
        u1[2 * i] = u01_f32(w[0]);
        u2[2 * i] = u01_f32(w[1]);
        u1[2 * i + 1] = u01_f32(w[2]);
        u2[2 * i + 1] = u01_f32(w[3]);
    }
}

void symgpu_philox_pairs_f64(uint32_t k0, uint32_t k1, uint64_t ctr, int64_t blocks,
                             double *u1, double *u2) {
    for (int64_t i = 0; i < blocks; i++) {
        uint32_t w[4];
        philox(k0, k1, ctr + (uint64_t)i, w);
        u1[i] = u01_f64(w[0], w[1]);
        u2[i] = u01_f64(w[2], w[3]);
    }
}
"""

_PAIR_CHUNK = 8192      # Box-Muller pairs per pass (even): NumPy's temporaries stay in L2
_MASK64 = (1 << 64) - 1
_LAYOUTS = ("uniform_f32", "uniform_f64", "pairs_f32", "pairs_f64")
_loaded: dict[str, Callable[..., None]] = {}
_failed = False         # the source did not compile in this process (warned once)


def _kernels() -> dict[str, Callable[..., None]] | None:
    """The entry points by layout, or None when no compiler built them. Loaded once: the
    ``cxx`` flag is asked (a PATH search) only until then; `enabled` asks it at link time."""
    global _failed
    if not _loaded and not _failed and cc.compiler() is not None:
        try:
            lib = cc.load_library(SOURCE)
        except cc.CCompileError as exc:
            _failed = True
            warnings.warn(f"symgpu: the C Philox generator did not compile, so random draws "
                          f"run on NumPy: {exc}", RuntimeWarning, stacklevel=3)
            return None
        for name in _LAYOUTS:
            fn = getattr(lib, f"symgpu_philox_{name}")
            fn.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64,
                           *[ctypes.c_void_p] * (2 if name.startswith("pairs") else 1)]
            fn.restype = None
            _loaded[name] = fn
    return _loaded or None


def enabled() -> bool:
    """Whether a thunk made now may draw through C: C allowed here (a compiler, not
    FAST_COMPILE: `symgpu.tensor.c_elemwise.c_kernels_allowed`; the library is plain C loaded
    with ctypes, so the Python-C runtime is not asked for) and the library built."""
    return c_kernels_allowed() and _kernels() is not None


def sampler(dist: str, dtype: str) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    """``draw(state, shape)``: `philox.sample(state, dist, dtype, shape)`, bitwise, with `dist`
    checked and the entry point and layout chosen once. Through the C generator where it is
    built, else `philox.sample` itself. `state` must hold the 4 words (unchecked here)."""
    philox.check_dist(dist)
    kernels = _kernels()
    if kernels is None:
        def numpy_draw(state: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
            return philox.sample(state, dist, dtype, shape)
        return numpy_draw
    # float64 has its own layout; float16/bfloat16 are drawn in float32 and rounded, as
    # philox.sample does (philox.as_draw_dtype)
    per_block = philox.per_block(dtype)
    suffix, ftype = ("f64", np.float64) if per_block == 2 else ("f32", np.float32)
    dtype = np.dtype(dtype)
    if dist == "uniform":
        uniform = kernels["uniform_" + suffix]

        def draw(state: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
            key0, key1, ctr = philox._key_counter(state)
            n = math.prod(shape)
            nb = -(-n // per_block)
            vals = np.empty(nb * per_block, dtype=ftype)
            if nb:
                uniform(key0, key1, ctr, nb, _address(vals))
            return philox.as_draw_dtype(vals[:n], "uniform", dtype).reshape(shape)
    else:
        pairs = kernels["pairs_" + suffix]

        def draw(state: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
            key0, key1, ctr = philox._key_counter(state)
            n = math.prod(shape)
            vals = _normal(pairs, key0, key1, ctr, n, ftype)
            return philox.as_draw_dtype(vals[:n], "normal", dtype).reshape(shape)
    return draw


def sample(state: np.ndarray, dist: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """`philox.sample(state, dist, dtype, shape)`, bitwise: through the C generator where it
    is built, else `philox.sample` itself (`sampler`, resolved on every call: a graph's op
    binds its sampler once)."""
    return sampler(dist, dtype)(state, shape)


def _address(a: np.ndarray) -> int:
    """The data address of `a`, a writable contiguous array of at least one byte: what
    `a.ctypes.data` says, in a third of its time (this runs on every draw)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a))


def _normal(pairs: Callable[..., None], key0: int, key1: int, ctr: int, n: int,
            ftype: type) -> np.ndarray:
    """At least n normals of `ftype` (float32, float64): elements 2k and 2k + 1 are
    `philox._box_muller` of pair k (the uniforms 2k and 2k + 1 of the draw), computed a chunk
    of pairs at a time."""
    per_block = 1 if ftype is np.float64 else 2   # pairs a block gives
    npairs = (n + 1) // 2
    vals = np.empty(2 * npairs, dtype=ftype)
    chunk = min(_PAIR_CHUNK, -(-npairs // per_block) * per_block)   # whole blocks
    if not npairs:
        return vals
    u1, u2 = np.empty(chunk, dtype=ftype), np.empty(chunk, dtype=ftype)
    a1, a2 = _address(u1), _address(u2)
    for start in range(0, npairs, chunk):
        m = min(chunk, npairs - start)
        pairs(key0, key1, (ctr + start // per_block) & _MASK64, -(-m // per_block), a1, a2)
        vals[2 * start:2 * (start + m):2], vals[2 * start + 1:2 * (start + m):2] = \
            philox._box_muller(u1[:m], u2[:m])
    return vals
