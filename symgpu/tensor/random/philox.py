"""Philox4x32-10 (Salmon et al., SC'11; the constants of Random123 and cuRAND) in vectorised
NumPy, and the one definition of how its 32-bit words become floats.

The GPU kernels (symgpu/gpu/ops/random.py) implement the same functions in CUDA; the layout here
is the contract both follow, so one seed gives the same numbers on the CPU and the GPU:

* the state is four uint32 words ``[key0, key1, ctr_lo, ctr_hi]``; block ``b`` of a draw is
  ``philox(counter=(lo, hi, 0, 0) of ctr + b, key=(key0, key1))`` (four words);
* a 32-bit element ``i`` (float16/bfloat16/float32) reads block ``i // 4``, a float64 element block
  ``i // 2``, so a draw of ``n`` elements uses ``ceil(n / per_block)`` blocks and the
  counter advances by that much;
* uniform float32 ``((w >> 9) + 0.5) * 2**-23`` (exact, in (0, 1)); uniform float64 from two
  words ``((w0 << 20 | w1 >> 12) + 0.5) * 2**-52`` (exact, in (0, 1));
* normal: Box-Muller on the pairs (u1, u2) of a block, ``r = sqrt(-2 log u1)``,
  ``z_even = r cos(2 pi u2)``, ``z_odd = r sin(2 pi u2)``, computed in the output's float type;
* float16 and bfloat16 draws are the float32 ones rounded to nearest, a uniform kept at or
  below the largest value under 1 (``as_draw_dtype``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["M0", "M1", "W0", "W1", "philox4x32", "blocks", "per_block", "uniform_from_words",
           "check_dist", "sample", "advance", "stream_key", "DISTS", "as_draw_dtype"]

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
ROUNDS = 10
DISTS = ("uniform", "normal")
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


_CHUNK = 8192   # blocks per pass: the eight uint64 work arrays stay in the L2 cache


def philox4x32(ctr: np.ndarray, key: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x32 of counters `ctr` (uint32, shape (..., 4)) under `key` (two uint32 words).

    The 32x32->64 multiplies run in uint64, in place, a cache-sized chunk at a time;
    returns uint32 of the same shape."""
    ctr = np.asarray(ctr, dtype=np.uint32)
    if ctr.shape[-1:] != (4,):
        raise ValueError(f"philox4x32: counters must have a last axis of 4 words, got {ctr.shape}")
    key = np.asarray(key, dtype=np.uint32).reshape(2)
    flat = ctr.reshape(-1, 4)
    out = np.empty_like(flat)
    for start in range(0, len(flat), _CHUNK):
        words = _rounds(*(flat[start:start + _CHUNK, j].astype(np.uint64) for j in range(4)),
                        int(key[0]), int(key[1]), rounds)
        for j, w in enumerate(words):
            out[start:start + _CHUNK, j] = w
    return out.reshape(ctr.shape)


def _rounds(c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, c3: np.ndarray, k0: int, k1: int,
            rounds: int = ROUNDS) -> tuple[np.ndarray, ...]:
    """The rounds on four uint64 arrays of 32-bit words (overwritten); returns the words."""
    p0, p1 = np.empty_like(c0), np.empty_like(c0)
    for r in range(rounds):
        if r:
            k0 = (k0 + int(W0)) & 0xFFFFFFFF
            k1 = (k1 + int(W1)) & 0xFFFFFFFF
        np.multiply(c0, M0, out=p0)
        np.multiply(c2, M1, out=p1)
        np.right_shift(p1, _S32, out=c0)
        c0 ^= c1
        c0 ^= np.uint64(k0)
        np.right_shift(p0, _S32, out=c2)
        c2 ^= c3
        c2 ^= np.uint64(k1)
        np.bitwise_and(p1, _MASK, out=c1)
        np.bitwise_and(p0, _MASK, out=c3)
    return c0, c1, c2, c3


def per_block(dtype: str) -> int:
    """Elements of `dtype` one 128-bit block serves (4 for 32-bit floats, 2 for float64)."""
    return 2 if np.dtype(dtype).itemsize == 8 else 4


def blocks(n: int, dtype: str) -> int:
    """Blocks (counter steps) a draw of `n` elements of `dtype` uses."""
    k = per_block(dtype)
    return (int(n) + k - 1) // k


def _key_counter(state: np.ndarray) -> tuple[int, int, int]:
    """`state`'s key words and 64-bit counter: (key0, key1, ctr_hi << 32 | ctr_lo)."""
    key0, key1, lo, hi = np.asarray(state, dtype=np.uint32)[:4].tolist()
    return key0, key1, (hi << 32) | lo


def _block_words(state: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, ...]:
    """The four words (uint64 arrays) of blocks start..stop-1 of a draw from `state`."""
    key0, key1, base = _key_counter(state)
    idx = np.arange(start, stop, dtype=np.uint64) + np.uint64(base)   # wraps at 2**64
    zero = np.zeros(stop - start, dtype=np.uint64)
    return _rounds(idx & _MASK, idx >> _S32, zero, zero.copy(), key0, key1)


def _u01_f32(w: np.ndarray) -> np.ndarray:
    return ((w >> np.uint64(9)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -23)


def _u01_f64(w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    m = (w0 << np.uint64(20)) | (w1 >> np.uint64(12))
    return (m.astype(np.float64) + 0.5) * 2.0 ** -52


def uniform_from_words(words: np.ndarray, dtype: str) -> np.ndarray:
    """Uniform (0, 1) floats from a block's words: (..., 4) -> (..., per_block(dtype))."""
    w = np.asarray(words, dtype=np.uint32).astype(np.uint64)
    if np.dtype(dtype).itemsize == 8:
        return _u01_f64(w[..., 0::2], w[..., 1::2])
    return as_draw_dtype(_u01_f32(w), "uniform", dtype)


#: the largest value below 1 of each half type: float32 uniforms above 1 - 2**-12 (float16)
#: or 1 - 2**-9 (bfloat16) round to 1.0, outside the (0, 1) a uniform promises
_BELOW_ONE = {"float16": 1 - 2.0 ** -11, "bfloat16": 1 - 2.0 ** -8}


def as_draw_dtype(vals: np.ndarray, dist: str, dtype: str) -> np.ndarray:
    """float32/float64 draws `vals` as `dtype`: rounded to nearest, and for a half-type
    uniform kept below 1 (its smallest float32 value, 2**-24, is a float16 subnormal, so
    none rounds to 0)."""
    out = vals.astype(dtype, copy=False)
    top = _BELOW_ONE.get(np.dtype(dtype).name)
    if top is not None and dist == "uniform":
        out = np.minimum(out, np.asarray(top, dtype=out.dtype))
    return out


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """r cos(2 pi u2), r sin(2 pi u2) with r = sqrt(-2 log u1), in the inputs' float type."""
    ftype = u1.dtype.type
    r = np.sqrt(ftype(-2.0) * np.log(u1))
    theta = ftype(2.0 * np.pi) * u2
    return r * np.cos(theta), r * np.sin(theta)


def check_dist(dist: str, what: str = "philox sample") -> None:
    """Raise ValueError, naming `what`, unless `dist` is one of DISTS."""
    if dist not in DISTS:
        raise ValueError(f"{what}: unknown distribution {dist!r}; expected one of {DISTS}")


def sample(state: np.ndarray, dist: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The draw of `dist` ('uniform' in (0, 1) or standard 'normal') of `shape` from `state`,
    made a cache-sized chunk of blocks at a time."""
    check_dist(dist)
    n = int(np.prod(shape, dtype=np.int64))
    wide = np.dtype(dtype).itemsize == 8
    per = 2 if wide else 4
    nb = blocks(n, dtype)
    vals = np.empty((nb, per), dtype=np.float64 if wide else np.float32)
    for start in range(0, nb, _CHUNK):
        stop = min(start + _CHUNK, nb)
        w = _block_words(state, start, stop)
        if wide:
            us = [_u01_f64(w[0], w[1]), _u01_f64(w[2], w[3])]
        else:
            us = [_u01_f32(x) for x in w]
        if dist == "normal":
            us = [z for k in range(0, per, 2) for z in _box_muller(us[k], us[k + 1])]
        for j, u in enumerate(us):
            vals[start:stop, j] = u
    return as_draw_dtype(vals.reshape(-1)[:n], dist, dtype).reshape(shape)


def advance(state: np.ndarray, nblocks: int) -> np.ndarray:
    """`state` with its 64-bit counter moved on by `nblocks` (wrapping at 2**64)."""
    key0, key1, base = _key_counter(state)
    base = (base + int(nblocks)) & ((1 << 64) - 1)
    return np.array([key0, key1, base & 0xFFFFFFFF, base >> 32], dtype=np.uint32)


def stream_key(seed: int, index: int) -> np.ndarray:
    """The key of stream `index` of a generator seeded with `seed`: the first two words of
    philox(counter=(index, 0, 0, 0), key=seed's two words), so streams do not overlap."""
    seed = int(seed) & ((1 << 64) - 1)
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)
    ctr = np.array([[index & 0xFFFFFFFF, (index >> 32) & 0xFFFFFFFF, 0x5EED, 0]], dtype=np.uint32)
    return philox4x32(ctr, key)[0, :2]
