"""2-d convolution on the GPU without cuDNN: im2col / col2im kernels and cuBLAS GEMMs.

This is the fallback GpuConv2d* run when cuDNN cannot be loaded (or refuses a shape). Per
group g (Cg = C/G input channels, Og = O/G filters, K = Cg*kh*kw, P = Ho*Wo):

  forward      cols (K, N*P) = im2col(x);  out (Og, N*P) = W_g (Og, K) @ cols; y[:, g] = out^T'
  grad weights gyT (Og, N*P) = gy[:, g] transposed; dW_g (Og, K) = gyT @ cols^T
  grad inputs  dcols (K, N*P) = W_g^T @ gyT;  dx[:, g] = col2im(dcols)  (a gather: no atomics)

filter_flip is folded into the kernels (row (c, a, b) of cols holds tap (kh-1-a, kw-1-b)), so
the filters are used as stored; asymmetric padding is native (top and left offsets).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from symgpu.gpu.ops.blas import cublas, gemm_math_mode
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel

__all__ = ["conv_gemm_source", "gemm_forward", "gemm_grad_inputs", "gemm_grad_weights"]

_TYPES = {"float32": "float", "float64": "double"}
_MODULE_KEY = ("symgpu.conv_gemm",)
_BLOCK = 256

_CU = sections("conv_gemm.cu")   # im2col / col2im bodies, then the entry points

_ARGS = ("long long n, long long C, long long H, long long W, long long c0, long long cg, "
         "long long kh, long long kw, long long ho, long long wo, long long s0, long long s1, "
         "long long d0, long long d1, long long pt, long long pl, int flip")
_CALL = "n, C, H, W, c0, cg, kh, kw, ho, wo, s0, s1, d0, d1, pt, pl, flip"
_FORMAT = "PP" + "q" * 16 + "i"
#: dtype -> the kernels' names (no name is built per call)
_IM2COL = {dt: f"im2col_{dt}" for dt in _TYPES}
_COL2IM = {dt: f"col2im_{dt}" for dt in _TYPES}


def conv_gemm_source() -> str:
    parts = [_CU[""].substitute()]
    for dt, t in _TYPES.items():
        for kind in ("im2col", "col2im"):
            parts.append(_CU[kind].substitute(dt=dt, t=t, args=_ARGS, call=_CALL))
    return "".join(parts)


def prefetch_request() -> tuple:
    return (_MODULE_KEY, conv_gemm_source, ())


def _launch(ctx: Any, name: str, total: int, src: Any, dst: Any, geo: Sequence[int]) -> None:
    blocks = max(1, min(65535, -(-total // _BLOCK)))
    fn = get_prepared_kernel(_MODULE_KEY, conv_gemm_source, name, _FORMAT, context=ctx)
    fn.prepared_async_call((blocks, 1), (_BLOCK, 1, 1), ctx.stream, src.ptr, dst.ptr, *geo)


def _gemm(ctx: Any, dtype: str, ta: bool, tb: bool, m: int, n: int, k: int, a: Any, b: Any,
          c: Any, a_off: int = 0, b_off: int = 0, c_off: int = 0) -> None:
    """Row-major C (m x n) = op(A) @ op(B) with packed operands (byte offsets into each), all
    of ``dtype`` (the node's: float32 or float64)."""
    if not (m and n and k):
        return
    blas = cublas()
    h = blas.handle(ctx)
    blas.math_mode(h, gemm_math_mode(dtype))
    ctype = ctypes.c_float if dtype == "float32" else ctypes.c_double
    one, zero = ctype(1.0), ctype(0.0)
    lda = m if ta else k
    ldb = k if tb else n
    # column-major view: C^T (n x m) = op(B)^T @ op(A)^T
    status = blas.gemm[dtype](h, int(tb), int(ta), n, m, k, ctypes.byref(one),
                              ctypes.c_void_p(b.ptr + b_off), ldb,
                              ctypes.c_void_p(a.ptr + a_off), lda, ctypes.byref(zero),
                              ctypes.c_void_p(c.ptr + c_off), n)
    blas.check(status, f"conv im2col gemm ({m}x{k} @ {k}x{n})")


def _new(ctx: Any, shape: tuple, dtype: np.dtype) -> Any:
    return new_array(ctx, tuple(int(s) for s in shape), dtype)


def _geo(xshape, cg, khw, ohw, s, d, pads, flip, c0) -> list[int]:
    n, c, h, w = xshape
    return [n, c, h, w, c0, cg, khw[0], khw[1], ohw[0], ohw[1], s[0], s[1], d[0], d[1],
            pads[0][0], pads[1][0], int(flip)]


def gemm_forward(ctx: Any, dtype: str, x: Any, w: Any, out: Any, pads, s, d, flip: bool,
                 groups: int) -> None:
    """out (N, O, Ho, Wo) = conv2d(x, w); all C-contiguous, all of ``dtype`` (the node's,
    resolved when its thunk was made: it names the kernels)."""
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    ho, wo = out.shape[2:]
    og, K, P = o // groups, cg * kh * kw, ho * wo
    dt = x.dtype
    cols = _new(ctx, (K, n * P), dt)
    prod = _new(ctx, (og, n, P), dt)
    isz, im2col = dt.itemsize, _IM2COL[dtype]
    for g in range(groups):
        _launch(ctx, im2col, K * n * P, x, cols,
                _geo(x.shape, cg, (kh, kw), (ho, wo), s, d, pads, flip, g * cg))
        _gemm(ctx, dtype, False, False, og, n * P, K, w, cols, prod, a_off=g * og * K * isz)
        view = out.reshape(n, o, P)[:, g * og:(g + 1) * og, :]
        view._copy_from_device(prod.transpose(1, 0, 2))


def _gy_transposed(ctx: Any, gy: Any, g: int, og: int) -> Any:
    """gy[:, g*og:(g+1)*og] as a packed (og, N, P) array."""
    n, o, ho, wo = gy.shape
    t = _new(ctx, (og, n, ho * wo), gy.dtype)
    t._copy_from_device(gy.reshape(n, o, ho * wo)[:, g * og:(g + 1) * og, :].transpose(1, 0, 2))
    return t


def gemm_grad_weights(ctx: Any, dtype: str, x: Any, gy: Any, dw: Any, pads, s, d, flip: bool,
                      groups: int) -> None:
    """dw (O, C/g, kh, kw) = d conv2d / d w (``dtype``: as gemm_forward's)."""
    n, c = x.shape[:2]
    o, cg, kh, kw = dw.shape
    ho, wo = gy.shape[2:]
    og, K, P = o // groups, cg * kh * kw, ho * wo
    dt, im2col = x.dtype, _IM2COL[dtype]
    cols = _new(ctx, (K, n * P), dt)
    for g in range(groups):
        _launch(ctx, im2col, K * n * P, x, cols,
                _geo(x.shape, cg, (kh, kw), (ho, wo), s, d, pads, flip, g * cg))
        gyt = _gy_transposed(ctx, gy, g, og)
        _gemm(ctx, dtype, False, True, og, K, n * P, gyt, cols, dw,
              c_off=g * og * K * dt.itemsize)


def gemm_grad_inputs(ctx: Any, dtype: str, w: Any, gy: Any, dx: Any, pads, s, d, flip: bool,
                     groups: int) -> None:
    """dx (N, C, H, W) = d conv2d / d x (the transposed convolution; ``dtype``: as
    gemm_forward's)."""
    n, c = dx.shape[:2]
    o, cg, kh, kw = w.shape
    ho, wo = gy.shape[2:]
    og, K, P = o // groups, cg * kh * kw, ho * wo
    dt, col2im = dx.dtype, _COL2IM[dtype]
    dcols = _new(ctx, (K, n * P), dt)
    for g in range(groups):
        gyt = _gy_transposed(ctx, gy, g, og)
        _gemm(ctx, dtype, True, False, K, n * P, og, w, gyt, dcols,
              a_off=g * og * K * dt.itemsize)
        _launch(ctx, col2im, n * cg * dx.shape[2] * dx.shape[3], dcols, dx,
                _geo(dx.shape, cg, (kh, kw), (ho, wo), s, d, pads, flip, g * cg))
