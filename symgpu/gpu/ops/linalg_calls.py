"""The device work of GPU linear algebra on raw addresses: which cuSOLVER/cuBLAS calls, with
which arguments, for row-major (C order) stacks of matrices.

Why apart from the ops (linalg.py): everything here takes integers (addresses, sizes) and an
`Env` holding the library bindings, the small kernels and an allocator, so tests run it on
host memory with fake libraries that do the arithmetic with NumPy (tests/test_gpu_linalg.py).

The layout rule: a row-major n x n matrix A is, read column-major, A^T. So the row-major
lower triangle is cuSOLVER's upper one (FILL_UPPER), a factor U^T U of the column-major view
is L L^T of the row-major matrix, and LU of the copy factors A^T (getrs with OP_T solves
A x = b). Right-hand sides: a row-major (n, k) block X is X^T column-major (k x n, ld k),
so triangular solves run from the right (X^T op(A)^T = B^T) on b's own layout, while getrs,
which solves from the left, gets b transposed.
"""
from __future__ import annotations

import ctypes
from typing import Any

from symgpu.gpu.ops.cublas_lib import DEFAULT_MATH
from symgpu.gpu.ops.cusolver_lib import (DIAG_NON_UNIT, DIAG_UNIT, EIG_NOVECTOR, EIG_VECTOR,
                                         FILL_LOWER, FILL_UPPER, OP_N, OP_T, SIDE_RIGHT)

__all__ = ["Env", "GETRF_BATCHED_MAX_N", "SYEVJ_BATCHED_MAX_N", "potrf", "lu", "lu_solve",
           "trsm", "cho_solve", "syev", "eigh_grad", "lu_inverse"]

#: batches of matrices up to this size are factored by cuBLAS's batched LU (one launch for
#: all); larger ones by a loop of cuSOLVER getrf calls on the stream.  On the H200 a loop over
#: 64 matrices of 256^2 took 30.6 ms against CuPy's batched 1.4 ms: the loop is for few
#: large matrices only
GETRF_BATCHED_MAX_N = 1024
#: cuSOLVER's syevjBatched handles n <= 32; larger matrices go through syevd one by one
SYEVJ_BATCHED_MAX_N = 32

_ONE = {"float32": ctypes.c_float(1.0), "float64": ctypes.c_double(1.0)}
_ZERO = {"float32": ctypes.c_float(0.0), "float64": ctypes.c_double(0.0)}
_ITEM = {"float32": 4, "float64": 8}


class Env:
    """One call's means: `ctx` (its stream), `sol` (cuSOLVER binding), `blas` (cuBLAS
    binding), `k` (the small kernels, linalg.LinalgKernels), `alloc(nbytes) -> address`
    (pool memory kept until the call's work is queued) and `plans` (workspaces kept per
    shape, the node's)."""

    def __init__(self, ctx: Any, sol: Any, blas: Any, kernels: Any, allocate: Any,
                 plans: dict) -> None:
        self.ctx, self.sol, self.blas, self.k = ctx, sol, blas, kernels
        self._allocate, self.plans, self.keep = allocate, plans, []

    def alloc(self, nbytes: int) -> int:
        block = self._allocate(max(int(nbytes), 8))
        self.keep.append(block)
        return int(block.ptr)

    def workspace(self, key: tuple, nbytes: int) -> int:
        """A workspace of at least `nbytes` kept for `key` (a routine and shape)."""
        block = self.plans.get(key)
        if block is None or block[0] < nbytes:
            block = self.plans[key] = (nbytes, self._allocate(max(int(nbytes), 8)))
        return int(block[1].ptr)

    def ptrs(self, base: int, stride: int, count: int) -> int:
        """A device array of `count` addresses base + i * stride (bytes)."""
        out = self.alloc(8 * count)
        self.k.ptrs(out, base, stride, count)
        return out

    def solver(self) -> Any:
        return self.sol.handle(self.ctx)

    def cublas(self) -> Any:
        """The context's cuBLAS handle in its default math mode (no TF32: the batched
        factorisations and solves are accuracy-bound, not throughput-bound)."""
        h = self.blas.handle(self.ctx)
        self.blas.math_mode(h, DEFAULT_MATH)
        return h

    def lwork(self, key: tuple, query: Any, what: str) -> int:
        """The element count a ``*_bufferSize`` call answers (remembered per key)."""
        got = self.plans.get(("lwork",) + key)
        if got is None:
            out = ctypes.c_int(0)
            self.sol.check(query(ctypes.addressof(out)), what)
            got = self.plans[("lwork",) + key] = out.value
        return got


def _uplo(lower: bool) -> int:
    """cuSOLVER's fill mode for the row-major `lower` (or upper) triangle."""
    return FILL_UPPER if lower else FILL_LOWER


def potrf(env: Env, dtype: str, a: int, n: int, batch: int, lower: bool, info: int) -> None:
    """Cholesky factors in place of `batch` row-major matrices at `a`: the row-major `lower`
    triangle becomes L (L L^T = A) or U (U^T U = A); the other triangle is left as it was
    (potrfBatched may scribble on it); info[i] != 0: matrix i is not positive definite."""
    sol, uplo, isz = env.sol, _uplo(lower), _ITEM[dtype]
    h = env.solver()
    if batch == 1:
        lwork = env.lwork(("potrf", dtype, n, uplo), lambda out: sol.potrf_bufferSize[dtype](
            h, uplo, n, a, n, out), "cusolverDnXpotrf_bufferSize")
        ws = env.workspace(("potrf", dtype, n, uplo), lwork * isz)
        sol.check(sol.potrf[dtype](h, uplo, n, a, n, ws, lwork, info), "cusolverDnXpotrf")
        return
    ptrs = env.ptrs(a, n * n * isz, batch)
    sol.check(sol.potrfBatched[dtype](h, uplo, n, ptrs, n, info, batch),
              "cusolverDnXpotrfBatched")


def lu(env: Env, dtype: str, a: int, n: int, batch: int, ipiv: int, info: int) -> int:
    """LU factors (partial pivoting) in place of the column-major views (A^T) of `batch`
    matrices at `a`; pivots (n int32 per matrix) at ipiv, info per matrix. Returns the
    pointer array of the batched path (for lu_solve / getri), 0 for the cuSOLVER loop."""
    isz = _ITEM[dtype]
    if batch > 1 and n <= GETRF_BATCHED_MAX_N:
        ptrs = env.ptrs(a, n * n * isz, batch)
        env.blas.check(env.blas.getrf_batched[dtype](env.cublas(), n, ptrs, n, ipiv, info,
                                                     batch), "cublasXgetrfBatched")
        return ptrs
    sol = env.sol
    h = env.solver()
    lwork = env.lwork(("getrf", dtype, n), lambda out: sol.getrf_bufferSize[dtype](
        h, n, n, a, n, out), "cusolverDnXgetrf_bufferSize")
    ws = env.workspace(("getrf", dtype, n), lwork * isz)
    for i in range(batch):
        sol.check(sol.getrf[dtype](h, n, n, a + i * n * n * isz, n, ws, ipiv + 4 * i * n,
                                   info + 4 * i), "cusolverDnXgetrf")
    return 0


def lu_solve(env: Env, dtype: str, a: int, a_ptrs: int, n: int, batch: int, ipiv: int,
             b: int, nrhs: int, trans: int) -> None:
    """Solve op(M) X = B in place for each matrix, M the column-major matrix lu() factored
    and B column-major n x nrhs blocks at b (one after the other)."""
    isz = _ITEM[dtype]
    if a_ptrs:
        b_ptrs = env.ptrs(b, n * nrhs * isz, batch)
        host_info = ctypes.c_int(0)
        env.blas.check(env.blas.getrs_batched[dtype](
            env.cublas(), trans, n, nrhs, a_ptrs, n, ipiv, b_ptrs, n,
            ctypes.addressof(host_info), batch), "cublasXgetrsBatched")
        if host_info.value:
            raise ValueError(f"cublasXgetrsBatched: argument {-host_info.value} was invalid "
                             f"(n={n}, nrhs={nrhs}, batch={batch})")
        return
    sol, h = env.sol, env.solver()
    scratch = env.alloc(4)
    for i in range(batch):
        sol.check(sol.getrs[dtype](h, trans, n, nrhs, a + i * n * n * isz, n, ipiv + 4 * i * n,
                                   b + i * n * nrhs * isz, n, scratch), "cusolverDnXgetrs")


def trsm(env: Env, dtype: str, a: int, b: int, n: int, k: int, batch: int, lower: bool,
         trans: int, unit: bool = False) -> None:
    """X with op(A) X = B in place of B, A row-major n x n (its `lower` or upper triangle
    read), B row-major n x k blocks at b: from the right on B's column-major view,
    X^T op(A)^T = B^T, where A's column-major view is A^T (so `trans` is passed as is)."""
    if n == 0 or k == 0 or batch == 0:
        return
    isz, blas = _ITEM[dtype], env.blas
    h = env.cublas()
    one = ctypes.addressof(_ONE[dtype])
    diag = DIAG_UNIT if unit else DIAG_NON_UNIT
    if batch == 1:
        blas.check(blas.trsm[dtype](h, SIDE_RIGHT, _uplo(lower), trans, diag, k, n, one, a,
                                    n, b, k), "cublasXtrsm")
        return
    a_ptrs = env.ptrs(a, n * n * isz, batch)
    b_ptrs = env.ptrs(b, n * k * isz, batch)
    blas.check(blas.trsm_batched[dtype](h, SIDE_RIGHT, _uplo(lower), trans, diag, k, n, one,
                                        a_ptrs, n, b_ptrs, k, batch), "cublasXtrsmBatched")


def cho_solve(env: Env, dtype: str, c: int, b: int, n: int, k: int, batch: int,
              lower: bool) -> None:
    """X = A^-1 B in place of B from A's row-major Cholesky factor c (L L^T with `lower`,
    U^T U otherwise): two triangular solves, L^T-then-L order as cho_solve's."""
    first, second = (OP_N, OP_T) if lower else (OP_T, OP_N)
    trsm(env, dtype, c, b, n, k, batch, lower, first)
    trsm(env, dtype, c, b, n, k, batch, lower, second)


def syev(env: Env, dtype: str, a: int, w: int, n: int, batch: int, lower: bool,
         vectors: bool, info: int) -> None:
    """Eigenvalues (ascending) into w (n per matrix) of the symmetric matrices at `a` read
    from their row-major `lower` (or upper) triangle; with `vectors` the eigenvectors
    overwrite `a` as the columns of the column-major view (rows of the row-major one)."""
    sol, isz = env.sol, _ITEM[dtype]
    h = env.solver()
    jobz, uplo = (EIG_VECTOR if vectors else EIG_NOVECTOR), _uplo(lower)
    if batch > 1 and n <= SYEVJ_BATCHED_MAX_N:
        params = sol.syevj_info(env.ctx)
        key = ("syevjBatched", dtype, n, batch, jobz, uplo)
        lwork = env.lwork(key, lambda out: sol.syevjBatched_bufferSize[dtype](
            h, jobz, uplo, n, a, n, w, out, params, batch), "cusolverDnXsyevjBatched_bufferSize")
        ws = env.workspace(key, lwork * isz)
        sol.check(sol.syevjBatched[dtype](h, jobz, uplo, n, a, n, w, ws, lwork, info, params,
                                          batch), "cusolverDnXsyevjBatched")
        return
    key = ("syevd", dtype, n, jobz, uplo)
    lwork = env.lwork(key, lambda out: sol.syevd_bufferSize[dtype](h, jobz, uplo, n, a, n, w,
                                                                   out),
                      "cusolverDnXsyevd_bufferSize")
    ws = env.workspace(key, lwork * isz)
    for i in range(batch):
        sol.check(sol.syevd[dtype](h, jobz, uplo, n, a + i * n * n * isz, n, w + i * n * isz,
                                   ws, lwork, info + 4 * i), "cusolverDnXsyevd")


def eigh_grad(env: Env, dtype: str, v: int, w: int, gw: int, gv: int, out: int, n: int,
              batch: int, lower: bool) -> None:
    """EighGrad on the device: P = V^T gv, M (the middle matrix, a kernel), G = V M V^T
    (cuBLAS strided-batched GEMMs on the row-major blocks: C = A B row-major is
    C^T = B^T A^T column-major), then G folded onto eigh's triangle into `out`."""
    if n == 0 or batch == 0:
        return
    isz, blas = _ITEM[dtype], env.blas
    h = env.cublas()
    nn = n * n
    p, m, q = (env.alloc(nn * batch * isz) for _ in range(3))
    one, zero = ctypes.addressof(_ONE[dtype]), ctypes.addressof(_ZERO[dtype])
    gemm = blas.gemm_strided_batched[dtype]

    def mm(ta: int, tb: int, x: int, y: int, c: int) -> None:
        blas.check(gemm(h, ta, tb, n, n, n, one, x, n, nn, y, n, nn, zero, c, n, nn, batch),
                   "cublasXgemmStridedBatched")
    mm(OP_N, OP_T, gv, v, p)            # P = V^T gv
    env.k.eighgrad_mid(dtype, m, p, w, gw, n, batch)
    mm(OP_T, OP_N, v, m, q)             # Q = M V^T
    mm(OP_N, OP_N, q, v, p)             # G = V Q
    env.k.fold(dtype, out, p, n, batch, lower)


def lu_inverse(env: Env, dtype: str, a: int, a_ptrs: int, n: int, batch: int, ipiv: int,
               out: int) -> None:
    """The inverses of the column-major matrices lu() factored at `a`, into `out`: cuBLAS's
    getriBatched on the batched path, getrs on the identity otherwise (the inverse of A^T
    read column-major is A^-1 read row-major)."""
    isz = _ITEM[dtype]
    if a_ptrs:
        c_ptrs = env.ptrs(out, n * n * isz, batch)
        info = env.alloc(4 * batch)
        env.blas.check(env.blas.getri_batched[dtype](env.cublas(), n, a_ptrs, n, ipiv, c_ptrs,
                                                     n, info, batch), "cublasXgetriBatched")
        return
    env.k.eye(dtype, out, n, batch)
    lu_solve(env, dtype, a, 0, n, batch, ipiv, out, n, OP_N)
