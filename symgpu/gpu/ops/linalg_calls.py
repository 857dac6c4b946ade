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
from symgpu.gpu.ops.cusolver_lib import (CUDA_R, DIAG_NON_UNIT, DIAG_UNIT, EIG_NOVECTOR,
                                         EIG_VECTOR, FILL_LOWER, FILL_UPPER, OP_N, OP_T,
                                         SIDE_RIGHT)

__all__ = ["Env", "GETRF_BATCHED_MAX_N", "SYEVJ_BATCHED_MAX_N", "SMALL_POTRF_MAX_N",
           "POTRF_FILL_LOWER", "GESVDJ_BATCHED_MAX_N", "potrf", "lu", "lu_solve", "trsm",
           "cho_solve", "syev", "syev_batched_capturable", "eigh_grad", "lu_inverse", "qr",
           "svd"]

#: batches of matrices up to this size are factored by cuBLAS's batched LU (one launch for
#: all); larger ones by a loop of cuSOLVER getrf calls on the stream.  On the H200 a loop over
#: 64 matrices of 256^2 took 30.6 ms against CuPy's batched 1.4 ms: the loop is for few
#: large matrices only
GETRF_BATCHED_MAX_N = 1024
#: cuSOLVER's syevjBatched handles n <= 32; larger stacked matrices go through
#: cusolverDnXsyevBatched (any n; CUDA 12.6.2+), single matrices through syevd (which syncs
#: inside: it cannot be captured into a CUDA graph, and looping it over 64 matrices of 256^2
#: took 124 ms on the H200 against JAX's 3.7 ms)
SYEVJ_BATCHED_MAX_N = 32
#: XsyevBatched wants n * n * batch below 2^31: larger stacks are cut into such chunks
_SYEV_BATCHED_ELEMENTS = (1 << 31) - 1
#: matrices up to this size are factored by linalg.cu's own kernel (one thread block per
#: matrix, held in shared memory, info and the clean-up in the same launch): 1024 matrices
#: of 32^2 took 138 us through the pointer array, potrfBatched and the clean-up kernel,
#: against PyTorch's 68 us
SMALL_POTRF_MAX_N = 64
#: ask cuSOLVER's potrf for the column-major LOWER factor only, as PyTorch and JAX do (a
#: row-major lower factor is then computed on a transposed copy and transposed back): the
#: row-major lower triangle is cuSOLVER's UPPER fill, and our 4096^2 Cholesky through it took
#: 4.35 ms against JAX's 1.68 ms. False: each row-major triangle's own fill mode, no
#: transposes (for measuring one against the other)
POTRF_FILL_LOWER = True
#: gesvdjBatched handles matrices up to 32 x 32; larger ones (and single matrices) go through
#: gesvdj one by one
GESVDJ_BATCHED_MAX_N = 32

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

    def host_workspace(self, key: tuple, nbytes: int) -> int:
        """A host buffer of `nbytes` kept for `key` (the 64-bit API's host workspace), 0
        when none is asked for."""
        if not nbytes:
            return 0
        buf = self.plans.get(("host",) + key)
        if buf is None or len(buf) < nbytes:
            buf = self.plans[("host",) + key] = ctypes.create_string_buffer(int(nbytes))
        return ctypes.addressof(buf)

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

    def x_sizes(self, key: tuple, query: Any, what: str) -> tuple[int, int]:
        """(device bytes, host bytes) a 64-bit API ``*_bufferSize`` call answers
        (remembered per key)."""
        got = self.plans.get(("xsizes",) + key)
        if got is None:
            dev, host = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self.sol.check(query(ctypes.addressof(dev), ctypes.addressof(host)), what)
            got = self.plans[("xsizes",) + key] = (dev.value, host.value)
        return got


def _uplo(lower: bool) -> int:
    """cuSOLVER's fill mode for the row-major `lower` (or upper) triangle."""
    return FILL_UPPER if lower else FILL_LOWER


def potrf(env: Env, dtype: str, src: int, dst: int, n: int, batch: int, lower: bool,
          info: int, nan_fill: bool = False) -> None:
    """Cholesky factors of `batch` row-major matrices at `src` into `dst`: read from their
    row-major `lower` triangle, L (L L^T = A) or, for the upper one, U (U^T U = A), the other
    triangle zeroed; info[i] != 0: matrix i is not positive definite (its factor is NaN with
    `nan_fill`). Small matrices: our kernel; otherwise cuSOLVER on the column-major LOWER
    fill (POTRF_FILL_LOWER): the row-major upper triangle is the column-major view's lower one
    and its factor L read row-major is U; a row-major lower factor is computed on a
    transposed copy of the lower triangle (whose column-major view is A's lower triangle) and
    read back transposed (LinalgKernels.transpose_lower and factor_out)."""
    if n == 0 or batch == 0:
        return
    if n <= SMALL_POTRF_MAX_N:
        env.k.potrf_small(dtype, dst, src, n, batch, lower, info, nan_fill)
        return
    nbytes = n * n * batch * _ITEM[dtype]
    if POTRF_FILL_LOWER and lower:
        # the lower triangle transposed into w (whose column-major lower triangle it is),
        # then L read back transposed with the upper triangle zeroed in one pass: on the
        # H200 two full transposes and the clean-up took 166 us of a 4096^2 factorisation
        # (1.72 ms, JAX 1.63 ms)
        w = env.alloc(nbytes)
        env.k.transpose_lower(dtype, w, src, n, batch)
        _potrf(env, dtype, w, n, batch, FILL_LOWER, info)
        env.k.factor_out(dtype, dst, w, n, batch, info, nan_fill)
        return
    env.k.copy(dst, src, nbytes)
    _potrf(env, dtype, dst, n, batch, _uplo(lower), info)
    env.k.tri(dtype, dst, n, batch, lower, info, nan_fill)


def _potrf(env: Env, dtype: str, a: int, n: int, batch: int, uplo: int, info: int) -> None:
    """cuSOLVER's potrf in place on the column-major `uplo` triangle: cusolverDnXpotrf (the
    64-bit API, workspaces from the pool and a kept host buffer) for one matrix, the legacy
    potrf where the library lacks it, potrfBatched for stacks (which may scribble on the
    other triangle)."""
    sol, isz = env.sol, _ITEM[dtype]
    h = env.solver()
    if batch == 1 and getattr(sol, "Xpotrf", None) is not None:
        params, t = sol.params(env.ctx), CUDA_R[dtype]
        key = ("Xpotrf", dtype, n, uplo)
        dev, host = env.x_sizes(key, lambda d, hh: sol.Xpotrf_bufferSize(
            h, params, uplo, n, t, a, n, t, d, hh), "cusolverDnXpotrf_bufferSize")
        sol.check(sol.Xpotrf(h, params, uplo, n, t, a, n, t, env.workspace(key, dev), dev,
                             env.host_workspace(key, host), host, info), "cusolverDnXpotrf")
        return
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


def syev_batched_capturable(sol: Any) -> bool:
    """Whether syev() of a stack (`stacked`) queues only capturable work with `sol`: the
    batched entry points (syevjBatched, XsyevBatched) do; syevd, the fallback where the
    library lacks XsyevBatched, does not."""
    return getattr(sol, "XsyevBatched", None) is not None


def syev(env: Env, dtype: str, a: int, w: int, n: int, batch: int, lower: bool,
         vectors: bool, info: int, stacked: bool = False) -> None:
    """Eigenvalues (ascending) into w (n per matrix) of the symmetric matrices at `a` read
    from their row-major `lower` (or upper) triangle; with `vectors` the eigenvectors
    overwrite `a` as the columns of the column-major view (rows of the row-major one).
    `stacked` (the op's input has batch dimensions, whatever their size): batched entry
    points, syevjBatched up to 32 x 32 and XsyevBatched above, so that the path (and whether
    it may be captured) follows from the graph's types; otherwise syevd per matrix."""
    sol, isz = env.sol, _ITEM[dtype]
    h = env.solver()
    jobz, uplo = (EIG_VECTOR if vectors else EIG_NOVECTOR), _uplo(lower)
    if stacked and n <= SYEVJ_BATCHED_MAX_N:
        params = sol.syevj_info(env.ctx)
        key = ("syevjBatched", dtype, n, batch, jobz, uplo)
        lwork = env.lwork(key, lambda out: sol.syevjBatched_bufferSize[dtype](
            h, jobz, uplo, n, a, n, w, out, params, batch), "cusolverDnXsyevjBatched_bufferSize")
        ws = env.workspace(key, lwork * isz)
        sol.check(sol.syevjBatched[dtype](h, jobz, uplo, n, a, n, w, ws, lwork, info, params,
                                          batch), "cusolverDnXsyevjBatched")
        return
    if stacked and syev_batched_capturable(sol):
        params, t = sol.params(env.ctx), CUDA_R[dtype]
        chunk = max(1, min(batch, _SYEV_BATCHED_ELEMENTS // (n * n)))
        for start in range(0, batch, chunk):
            count = min(chunk, batch - start)
            ai, wi = a + start * n * n * isz, w + start * n * isz
            key = ("XsyevBatched", dtype, n, count, jobz, uplo)
            dev, host = env.x_sizes(key, lambda d, hh: sol.XsyevBatched_bufferSize(
                h, params, jobz, uplo, n, t, ai, n, t, wi, t, d, hh, count),
                "cusolverDnXsyevBatched_bufferSize")
            sol.check(sol.XsyevBatched(h, params, jobz, uplo, n, t, ai, n, t, wi, t,
                                       env.workspace(key, dev), dev,
                                       env.host_workspace(key, host), host,
                                       info + 4 * start, count), "cusolverDnXsyevBatched")
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


def qr(env: Env, dtype: str, x: int, m: int, n: int, batch: int, mode: str, q: int,
       r: int) -> None:
    """np.linalg.qr of `batch` row-major m x n matrices at x: geqrf on the column-major copy
    of each (a transpose: X's column-major view is X^T), then R (upper triangle, `r`: K x N
    'reduced' / M x N 'complete') and Q by orgqr on the reflectors (`q`: M x K / M x M),
    transposed back to row-major; mode 'raw' writes LAPACK's reflectors as they lie (NumPy's
    h, N x M) into `q` and tau into `r`; mode 'r' writes R alone (K x N, `q` unused).
    cuSOLVER has no batched QR: one geqrf (and orgqr) per matrix, the layout kernels once
    for all."""
    k = min(m, n)
    isz = _ITEM[dtype]
    if batch == 0:
        return
    if k == 0:
        if mode == "complete" and m:
            env.k.eye(dtype, q, m, batch)
        return
    cols = m if mode == "complete" else k       # Q's columns
    stride = m * max(n, cols)                   # one matrix's column-major buffer
    a = env.alloc(stride * batch * isz)
    env.k.transpose(dtype, a, x, m, n, batch, dst_stride=stride)
    tau = r if mode == "raw" else env.alloc(k * batch * isz)
    sol, h = env.sol, env.solver()
    lwork = env.lwork(("geqrf", dtype, m, n), lambda out: sol.geqrf_bufferSize[dtype](
        h, m, n, a, m, out), "cusolverDnXgeqrf_bufferSize")
    info = env.alloc(4 * batch)
    ws = env.workspace(("geqrf", dtype, m, n), lwork * isz)
    for i in range(batch):
        sol.check(sol.geqrf[dtype](h, m, n, a + i * stride * isz, m, tau + i * k * isz, ws,
                                   lwork, info + 4 * i), "cusolverDnXgeqrf")
    if mode == "raw":
        env.k.take(dtype, q, a, m * n, stride, batch)
        return
    env.k.qr_r(dtype, r, a, m, n, m if mode == "complete" else k, stride, batch)
    if mode == "r":
        return
    lwork = env.lwork(("orgqr", dtype, m, cols, k), lambda out: sol.orgqr_bufferSize[dtype](
        h, m, cols, k, a, m, tau, out), "cusolverDnXorgqr_bufferSize")
    ws = env.workspace(("orgqr", dtype, m, cols, k), lwork * isz)
    for i in range(batch):
        sol.check(sol.orgqr[dtype](h, m, cols, k, a + i * stride * isz, m, tau + i * k * isz,
                                   ws, lwork, info + 4 * i), "cusolverDnXorgqr")
    # Q's column-major m x cols block read row-major is Q^T (cols x m)
    env.k.transpose(dtype, q, a, cols, m, batch, src_stride=stride)


def svd(env: Env, dtype: str, x: int, m: int, n: int, batch: int, full: bool,
        compute_uv: bool, u: int, s: int, vt: int, info: int, stacked: bool = False) -> None:
    """np.linalg.svd of `batch` row-major m x n matrices at x into u, s, vt (u and vt unused
    without `compute_uv`). X's column-major view is B = X^T (n x m, lda n): the Jacobi SVD
    B = Ub S Vb^T gives X = Vb S Ub^T, so vt is Ub's column-major buffer read row-major and
    u is Vb's transposed. `stacked` matrices up to 32 x 32: gesvdjBatched (full Ub, Vb:
    the reduced ones are their leading columns); otherwise gesvdj per matrix (econ for
    reduced). Singular values come sorted descending, as NumPy's; info[i] != 0: no
    convergence."""
    k = min(m, n)
    isz = _ITEM[dtype]
    if batch == 0:
        return
    if k == 0:
        if compute_uv and full:
            if m:
                env.k.eye(dtype, u, m, batch)
            if n:
                env.k.eye(dtype, vt, n, batch)
        return
    sol, h = env.sol, env.solver()
    params = sol.gesvdj_info(env.ctx)
    jobz = EIG_VECTOR if compute_uv else EIG_NOVECTOR
    a = env.alloc(m * n * batch * isz)
    env.k.copy(a, x, m * n * batch * isz)
    if stacked and max(m, n) <= GESVDJ_BATCHED_MAX_N:
        ub, vb = env.alloc(n * n * batch * isz), env.alloc(m * m * batch * isz)
        key = ("gesvdjBatched", dtype, m, n, batch, jobz)
        lwork = env.lwork(key, lambda out: sol.gesvdjBatched_bufferSize[dtype](
            h, jobz, n, m, a, n, s, ub, n, vb, m, out, params, batch),
            "cusolverDnXgesvdjBatched_bufferSize")
        ws = env.workspace(key, lwork * isz)
        sol.check(sol.gesvdjBatched[dtype](h, jobz, n, m, a, n, s, ub, n, vb, m, ws, lwork,
                                           info, params, batch), "cusolverDnXgesvdjBatched")
        if not compute_uv:
            return
        rows = m if full else k                # u's columns = Vb's leading columns
        env.k.transpose(dtype, u, vb, rows, m, batch, src_stride=m * m)
        env.k.take(dtype, vt, ub, (n if full else k) * n, n * n, batch)
        return
    ucols, vcols = (n if full else k), (m if full else k)    # Ub n x ucols, Vb m x vcols
    ub = vt if compute_uv else env.alloc(n * ucols * isz)
    vb = env.alloc(m * vcols * batch * isz)
    econ = 0 if full else 1
    key = ("gesvdj", dtype, m, n, jobz, econ)
    lwork = env.lwork(key, lambda out: sol.gesvdj_bufferSize[dtype](
        h, jobz, econ, n, m, a, n, s, ub, n, vb, m, out, params), "cusolverDnXgesvdj_bufferSize")
    ws = env.workspace(key, lwork * isz)
    ustep = n * ucols * isz if compute_uv else 0
    for i in range(batch):
        sol.check(sol.gesvdj[dtype](h, jobz, econ, n, m, a + i * m * n * isz, n,
                                    s + i * k * isz, ub + i * ustep, n,
                                    vb + i * m * vcols * isz, m, ws, lwork, info + 4 * i,
                                    params), "cusolverDnXgesvdj")
    if compute_uv:
        env.k.transpose(dtype, u, vb, vcols, m, batch)
