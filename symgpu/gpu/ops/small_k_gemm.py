"""A matrix product with a small inner dimension (k <= ``SMALL_K_MAX``) in one plain kernel,
offered to symgpu/gpu/ops/blaslt.py's timed choice beside cuBLASLt's and classic cuBLAS's
algorithms (it runs only where it timed fastest).

Why: cuBLAS tiles a product such as the input gradient of a 10-class output layer
(``d @ W.T``: 512 x 1024 from k = 10) like a deep one; the work is writing D, which one
thread per element of D does at the memory's speed (runtime/codegen/small_k_gemm.cu).
Column-major as cuBLAS: D (m x n, ldd) = alpha op(A) op(B) + beta D, alpha and beta host
values (device scalars are not offered to it).
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.runtime.codegen import sections

__all__ = ["SMALL_K_MAX", "small_k_source", "small_k_gemm", "KERNEL_DTYPES"]

#: the largest inner dimension offered to the kernel
SMALL_K_MAX = 32
KERNEL_DTYPES = {"float32": ("float", "f"), "float64": ("double", "d")}
_BLOCK = 256
_MAX_GRID = 8192
_CU = sections("small_k_gemm.cu")
_prepared: dict[tuple[int, str], Any] = {}


def _name(dtype: str) -> str:
    return f"small_k_gemm_{dtype}"


def small_k_source() -> str:
    """The CUDA module with ``small_k_gemm_<dtype>`` for float32 and float64."""
    return _CU[""].substitute() + "".join(
        _CU["gemm"].substitute(name=_name(dt), ctype=ct) for dt, (ct, _) in
        KERNEL_DTYPES.items())


def _kernel(ctx: Any, dtype: str) -> Any:
    key = (id(ctx), dtype)
    fn = _prepared.get(key)
    if fn is None:
        from symgpu.gpu.runtime.compiler import get_kernel
        fn = get_kernel(("symgpu.small_k_gemm",), small_k_source, _name(dtype), context=ctx)
        fn.prepare("PPPqqiqqqqq" + KERNEL_DTYPES[dtype][1] * 2)
        _prepared[key] = fn
    return fn


def strides(trans_a: int, trans_b: int, lda: int, ldb: int) -> tuple[int, int, int, int]:
    """(sai, sal, sbl, sbj): element strides of A'(i, l) and B'(l, j) for cuBLAS's
    column-major operands (op N: A stored m x k, B stored k x n; op T: their transposes)."""
    sai, sal = (1, lda) if trans_a == 0 else (lda, 1)
    sbl, sbj = (1, ldb) if trans_b == 0 else (ldb, 1)
    return sai, sal, sbl, sbj


def small_k_gemm(ctx: Any, dtype: str, trans_a: int, trans_b: int, m: int, n: int, k: int,
                 a: int, lda: int, b: int, ldb: int, d: int, ldd: int, alpha: float,
                 beta: float) -> None:
    """Launch the kernel on ``ctx``'s stream (captured when it is capturing)."""
    if not 0 < k <= SMALL_K_MAX:
        raise ValueError(f"small_k_gemm: k = {k} is outside 1..{SMALL_K_MAX}")
    total = m * n
    if total == 0:
        return
    grid = max(1, min(-(-total // _BLOCK), _MAX_GRID))
    _kernel(ctx, dtype).prepared_async_call(
        (grid, 1), (_BLOCK, 1, 1), ctx.stream, a, b, d, m, n, k,
        *strides(trans_a, trans_b, lda, ldb), ldd, alpha, beta)
