"""GPU linear algebra (symgpu/gpu/ops/linalg.py, linalg_calls.py, cusolver_lib.py).

On the CPU: every GPU op's device work runs against fake cuSOLVER/cuBLAS bindings and fake
kernels that do the arithmetic with NumPy on host memory at the addresses the ops pass, so
the column-major mapping (fill modes, trans flags, leading dimensions, batch counts, pointer
arrays, workspace sizes) is checked against the host ops' results; placement of training
graphs on a virtual context; nvcc compiles linalg.cu. On a GPU: each lifted op against the
host op (batched or not, float32/float64, non-contiguous inputs, gradients)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import scipy.linalg as sla

import symgpu
import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import linalg as gl
from symgpu.gpu.ops import linalg_calls as calls
from symgpu.gpu.ops.cublas_lib import Cublas
from symgpu.gpu.ops.cusolver_lib import (CUDA_R, FILL_LOWER, FILL_UPPER, OP_N, OP_T,
                                         SIDE_RIGHT, Cusolver)
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.tensor import nlinalg as NL
from symgpu.tensor import slinalg as SL

RNG = np.random.default_rng(3)

# ============================================================================ fakes


class Mem:
    """Host buffers standing for device memory: addresses are the buffers' own."""

    def __init__(self) -> None:
        self.bufs: dict[int, np.ndarray] = {}

    def allocate(self, nbytes: int):
        buf = np.zeros(max(int(nbytes), 8) + 64, np.uint8)
        ptr = buf.ctypes.data
        self.bufs[ptr] = buf
        return type("Block", (), {"ptr": ptr, "size": nbytes})()

    def size_at(self, ptr: int) -> int:
        return max(b.nbytes - 64 - (ptr - p) for p, b in self.bufs.items()
                   if p <= ptr < p + b.nbytes)

    def view(self, ptr: int, count: int, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        assert self.size_at(ptr) >= count * dt.itemsize, "access past an allocation"
        return np.frombuffer((ctypes.c_char * (count * dt.itemsize)).from_address(ptr), dt)

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        ptr = self.allocate(a.nbytes).ptr
        self.view(ptr, a.size, a.dtype)[:] = a.ravel()
        return ptr

    def colmajor(self, ptr: int, rows: int, cols: int, ld: int, dtype) -> np.ndarray:
        """The column-major rows x cols matrix at ptr (leading dimension ld), a view."""
        return self.view(ptr, ld * cols, dtype).reshape(cols, ld).T[:rows]

    def ptr_array(self, ptr: int, count: int) -> list[int]:
        return [int(p) for p in self.view(ptr, count, np.uint64)]


def _sym(m: np.ndarray, uplo: int) -> np.ndarray:
    t = np.triu(m) if uplo == FILL_UPPER else np.tril(m)
    return t + t.T - np.diag(np.diag(m))


class FakeSolver:
    """cuSOLVER's entry points used by linalg_calls, doing the math with NumPy/SciPy."""

    check = staticmethod(Cusolver.check)

    def __init__(self, mem: Mem, dtype: str) -> None:
        self.mem, self.dt, self.calls = mem, np.dtype(dtype), []
        for name in ("potrf_bufferSize", "potrf", "potrfBatched", "getrf_bufferSize", "getrf",
                     "getrs", "syevd_bufferSize", "syevd", "syevjBatched_bufferSize",
                     "syevjBatched", "geqrf_bufferSize", "geqrf", "orgqr_bufferSize", "orgqr",
                     "gesvdj_bufferSize", "gesvdj", "gesvdjBatched_bufferSize",
                     "gesvdjBatched"):
            setattr(self, name, {dtype: self._rec(name, getattr(self, "_" + name))})
        # the 64-bit API: one entry point for every dtype (None where the library lacks it)
        for name in ("Xpotrf_bufferSize", "Xpotrf", "XsyevBatched_bufferSize", "XsyevBatched"):
            setattr(self, name, self._rec(name, getattr(self, "_" + name)))

    def _rec(self, name, fn):
        def call(*args):
            self.calls.append((name, args))
            return fn(*args)
        return call

    def handle(self, ctx):
        return "solver-handle"

    def syevj_info(self, ctx):
        return "syevj-params"

    def gesvdj_info(self, ctx):
        return "gesvdj-params"

    def params(self, ctx):
        return "x-params"

    def _sizes(self, dev_out, host_out, dev, host):
        ctypes.c_size_t.from_address(dev_out).value = dev     # host size_t, as cuSOLVER's
        ctypes.c_size_t.from_address(host_out).value = host
        return 0

    def _types(self, *types):
        assert set(types) == {CUDA_R[self.dt.name]}, types

    def _Xpotrf_bufferSize(self, h, params, uplo, n, ta, a, lda, tc, dev, host):
        assert params == "x-params"
        self._types(ta, tc)
        return self._sizes(dev, host, 5 * n * self.dt.itemsize, 16)

    def _Xpotrf(self, h, params, uplo, n, ta, a, lda, tc, ws, dev, hws, host, info):
        self._types(ta, tc)
        assert dev == 5 * n * self.dt.itemsize and self.mem.size_at(ws) >= dev
        assert host == 16 and hws and (ctypes.c_char * 16).from_address(hws)
        self._chol(self._m(a, n, lda), uplo, info, scribble=False)
        return 0

    def _XsyevBatched_bufferSize(self, h, params, jobz, uplo, n, ta, a, lda, tw, w, tc, dev,
                                 host, batch):
        assert params == "x-params"
        self._types(ta, tw, tc)
        return self._sizes(dev, host, 3 * n * batch * self.dt.itemsize, 0)

    def _XsyevBatched(self, h, params, jobz, uplo, n, ta, a, lda, tw, w, tc, ws, dev, hws,
                      host, info, batch):
        self._types(ta, tw, tc)
        assert dev == 3 * n * batch * self.dt.itemsize and self.mem.size_at(ws) >= dev
        assert host == 0
        isz = self.dt.itemsize
        for i in range(batch):
            self._eig(self._m(a + i * n * n * isz, n, lda), uplo, jobz, w + i * n * isz, n,
                      info + 4 * i)
        return 0

    def _geqrf_bufferSize(self, h, m, n, a, lda, out):
        return self._lwork(out, 2 * n + 1)

    def _geqrf(self, h, m, n, a, lda, tau, ws, lwork, info):
        assert lwork == 2 * n + 1 and self.mem.size_at(ws) >= lwork * self.dt.itemsize
        v = self.mem.colmajor(a, m, n, lda, self.dt)
        (h_, t_), _ = sla.qr(v.astype(np.float64), mode="raw")
        v[:] = h_
        self.mem.view(tau, min(m, n), self.dt)[:] = t_
        self.mem.view(info, 1, np.int32)[0] = 0
        return 0

    def _orgqr_bufferSize(self, h, m, n, k, a, lda, tau, out):
        return self._lwork(out, 3 * n + 1)

    def _orgqr(self, h, m, n, k, a, lda, tau, ws, lwork, info):
        assert m >= n >= k and lwork == 3 * n + 1
        v = self.mem.colmajor(a, m, n, lda, self.dt)
        t_ = self.mem.view(tau, k, self.dt).astype(np.float64)
        q, _, inf = sla.lapack.dorgqr(v.astype(np.float64), t_)
        v[:] = q
        self.mem.view(info, 1, np.int32)[0] = inf
        return 0

    def _gesvdj_bufferSize(self, h, jobz, econ, m, n, a, lda, s, u, ldu, v, ldv, out,
                           params):
        assert params == "gesvdj-params" and lda == m and ldu == m and ldv == n
        return self._lwork(out, 4 * (m + n))

    def _svd_one(self, jobz, full, m, n, a, s, u, ldu, v, ldv, info):
        x = self.mem.colmajor(a, m, n, m, self.dt).astype(np.float64)
        uu, ss, vh = np.linalg.svd(x, full_matrices=full)
        k = min(m, n)
        self.mem.view(s, k, self.dt)[:] = ss
        if jobz:
            self.mem.colmajor(u, m, uu.shape[1], ldu, self.dt)[:] = uu
            self.mem.colmajor(v, n, vh.shape[0], ldv, self.dt)[:] = vh.T
        self.mem.view(info, 1, np.int32)[0] = 0

    def _gesvdj(self, h, jobz, econ, m, n, a, lda, s, u, ldu, v, ldv, ws, lwork, info,
                params):
        assert lwork == 4 * (m + n) and params == "gesvdj-params"
        self._svd_one(jobz, not econ, m, n, a, s, u, ldu, v, ldv, info)
        return 0

    def _gesvdjBatched_bufferSize(self, h, jobz, m, n, a, lda, s, u, ldu, v, ldv, out, params,
                                  batch):
        assert max(m, n) <= 32 and lda == m and ldu == m and ldv == n
        return self._lwork(out, 5 * (m + n) * batch)

    def _gesvdjBatched(self, h, jobz, m, n, a, lda, s, u, ldu, v, ldv, ws, lwork, info,
                       params, batch):
        assert lwork == 5 * (m + n) * batch and params == "gesvdj-params"
        isz, k = self.dt.itemsize, min(m, n)
        for i in range(batch):
            self._svd_one(jobz, True, m, n, a + i * lda * n * isz, s + i * k * isz,
                          u + i * ldu * m * isz, ldu, v + i * ldv * n * isz, ldv, info + 4 * i)
        return 0

    def _lwork(self, out, value):
        ctypes.c_int.from_address(out).value = value    # a host int, as cuSOLVER's
        return 0

    def _m(self, ptr, n, lda):
        assert lda == n
        return self.mem.colmajor(ptr, n, n, lda, self.dt)

    def _potrf_bufferSize(self, h, uplo, n, a, lda, out):
        return self._lwork(out, 3 * n + 1)

    def _potrf(self, h, uplo, n, a, lda, ws, lwork, info):
        assert lwork == 3 * n + 1 and self.mem.size_at(ws) >= lwork * self.dt.itemsize
        self._chol(self._m(a, n, lda), uplo, info, scribble=False)
        return 0

    def _chol(self, m, uplo, info, scribble):
        try:
            low = np.linalg.cholesky(_sym(m.astype(np.float64), uplo))
        except np.linalg.LinAlgError:
            self.mem.view(info, 1, np.int32)[0] = 1
            return
        self.mem.view(info, 1, np.int32)[0] = 0
        f = low.T if uplo == FILL_UPPER else low
        keep = np.triu(np.ones_like(m, bool)) if uplo == FILL_UPPER else \
            np.tril(np.ones_like(m, bool))
        m[keep] = f[keep]
        if scribble:   # potrfBatched uses the other triangle as a workspace
            m[~keep] = 777.0

    def _potrfBatched(self, h, uplo, n, ptrs, lda, info, batch):
        for i, p in enumerate(self.mem.ptr_array(ptrs, batch)):
            self._chol(self._m(p, n, lda), uplo, info + 4 * i, scribble=True)
        return 0

    def _getrf_bufferSize(self, h, m, n, a, lda, out):
        return self._lwork(out, 2 * n)

    def _getrf(self, h, m, n, a, lda, ws, ipiv, info):
        assert m == n and self.mem.size_at(ws) >= 2 * n * self.dt.itemsize
        lu_(self.mem, self._m(a, n, lda), ipiv, info)
        return 0

    def _getrs(self, h, trans, n, nrhs, a, lda, ipiv, b, ldb, info):
        getrs_(self.mem, self._m(a, n, lda), ipiv, self.mem.colmajor(b, n, nrhs, ldb, self.dt),
               trans)
        return 0

    def _syevd_bufferSize(self, h, jobz, uplo, n, a, lda, w, out):
        return self._lwork(out, 5 * n)

    def _syevd(self, h, jobz, uplo, n, a, lda, w, ws, lwork, info):
        assert lwork == 5 * n and self.mem.size_at(ws) >= lwork * self.dt.itemsize
        self._eig(self._m(a, n, lda), uplo, jobz, w, n, info)
        return 0

    def _eig(self, m, uplo, jobz, w, n, info):
        vals, vecs = np.linalg.eigh(_sym(m.astype(np.float64), uplo))
        self.mem.view(w, n, self.dt)[:] = vals
        if jobz:
            m[:] = vecs
        self.mem.view(info, 1, np.int32)[0] = 0

    def _syevjBatched_bufferSize(self, h, jobz, uplo, n, a, lda, w, out, params, batch):
        assert params == "syevj-params"
        return self._lwork(out, 7 * n * batch)

    def _syevjBatched(self, h, jobz, uplo, n, a, lda, w, ws, lwork, info, params, batch):
        assert lwork == 7 * n * batch and params == "syevj-params"
        for i in range(batch):
            isz = self.dt.itemsize
            self._eig(self._m(a + i * n * n * isz, n, lda), uplo, jobz, w + i * n * isz, n,
                      info + 4 * i)
        return 0


def lu_(mem, m, ipiv, info):
    lu, piv = sla.lu_factor(m.astype(np.float64), check_finite=False)
    m[:] = lu
    n = m.shape[0]
    mem.view(ipiv, n, np.int32)[:] = piv + 1
    zero = np.nonzero(np.diag(lu) == 0)[0]
    mem.view(info, 1, np.int32)[0] = zero[0] + 1 if len(zero) else 0


def getrs_(mem, lu, ipiv, b, trans):
    n = lu.shape[0]
    piv = mem.view(ipiv, n, np.int32) - 1
    b[:] = sla.lu_solve((lu.astype(np.float64), piv), b.astype(np.float64), trans=trans)


class FakeBlas:
    check = staticmethod(Cublas.check)

    def __init__(self, mem: Mem, dtype: str) -> None:
        self.mem, self.dt, self.calls, self.modes = mem, np.dtype(dtype), [], []
        for name in ("trsm", "trsm_batched", "getrf_batched", "getrs_batched",
                     "getri_batched", "gemm_strided_batched"):
            fn = getattr(self, "_" + name)
            setattr(self, name, {dtype: (lambda fn, name: lambda *a: (
                self.calls.append((name, a)), fn(*a))[1])(fn, name)})

    def handle(self, ctx):
        return "blas-handle"

    def math_mode(self, h, mode):
        self.modes.append(mode)

    def _alpha(self, p):
        return float(np.frombuffer((ctypes.c_char * self.dt.itemsize).from_address(p),
                                   self.dt)[0])     # a host scalar (pointer mode host)

    def _trsm(self, h, side, uplo, trans, diag, m, n, alpha, a, lda, b, ldb):
        assert side == SIDE_RIGHT and self._alpha(alpha) == 1.0
        t = self.mem.colmajor(a, n, n, lda, self.dt).astype(np.float64)
        t = np.triu(t) if uplo == FILL_UPPER else np.tril(t)
        if diag:
            np.fill_diagonal(t, 1.0)
        op = t if trans == OP_N else t.T
        bv = self.mem.colmajor(b, m, n, ldb, self.dt)
        try:
            bv[:] = np.linalg.solve(op.T, bv.astype(np.float64).T).T    # X op = B
        except np.linalg.LinAlgError:   # a zero on the diagonal: cuBLAS divides by it
            bv[:] = np.nan
        return 0

    def _trsm_batched(self, h, side, uplo, trans, diag, m, n, alpha, ap, lda, bp, ldb, batch):
        for pa, pb in zip(self.mem.ptr_array(ap, batch), self.mem.ptr_array(bp, batch)):
            self._trsm(h, side, uplo, trans, diag, m, n, alpha, pa, lda, pb, ldb)
        return 0

    def _getrf_batched(self, h, n, ap, lda, ipiv, info, batch):
        for i, p in enumerate(self.mem.ptr_array(ap, batch)):
            lu_(self.mem, self.mem.colmajor(p, n, n, lda, self.dt), ipiv + 4 * n * i,
                info + 4 * i)
        return 0

    def _getrs_batched(self, h, trans, n, nrhs, ap, lda, ipiv, bp, ldb, host_info, batch):
        for i, (pa, pb) in enumerate(zip(self.mem.ptr_array(ap, batch),
                                         self.mem.ptr_array(bp, batch))):
            getrs_(self.mem, self.mem.colmajor(pa, n, n, lda, self.dt), ipiv + 4 * n * i,
                   self.mem.colmajor(pb, n, nrhs, ldb, self.dt), trans)
        ctypes.c_int.from_address(host_info).value = 0
        return 0

    def _getri_batched(self, h, n, ap, lda, ipiv, cp, ldc, info, batch):
        for i, (pa, pc) in enumerate(zip(self.mem.ptr_array(ap, batch),
                                         self.mem.ptr_array(cp, batch))):
            c = self.mem.colmajor(pc, n, n, ldc, self.dt)
            c[:] = np.eye(n)
            getrs_(self.mem, self.mem.colmajor(pa, n, n, lda, self.dt), ipiv + 4 * n * i, c,
                   0)
        return 0

    def _gemm_strided_batched(self, h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta,
                              c, ldc, sc, batch):
        isz = self.dt.itemsize
        for i in range(batch):
            am = self.mem.colmajor(a + i * sa * isz, k if ta else m, m if ta else k, lda,
                                   self.dt)
            bm = self.mem.colmajor(b + i * sb * isz, n if tb else k, k if tb else n, ldb,
                                   self.dt)
            cm = self.mem.colmajor(c + i * sc * isz, m, n, ldc, self.dt)
            cm[:] = (am.T if ta else am) @ (bm.T if tb else bm)
        return 0


class FakeKernels:
    """linalg.LinalgKernels in NumPy; checks record their exceptions (as a sync would)."""

    def __init__(self, mem: Mem) -> None:
        self.mem, self.errors, self.launches = mem, [], []

    def _mats(self, ptr, n, batch, dtype, rows=None):
        rows = n if rows is None else rows
        return self.mem.view(ptr, rows * n * batch, dtype).reshape(batch, rows, n)

    def copy(self, dst, src, nbytes):
        self.mem.view(dst, nbytes, np.uint8)[:] = self.mem.view(src, nbytes, np.uint8)

    def ptrs(self, out, base, stride, count):
        self.launches.append("ptrs")
        self.mem.view(out, count, np.uint64)[:] = base + stride * np.arange(count,
                                                                            dtype=np.uint64)

    def check_info(self, info, count, describe):
        vals = self.mem.view(info, count, np.int32)
        for i, v in enumerate(vals):
            if v:
                self.errors.append(describe((i << 32) | (int(v) & 0xFFFFFFFF)))

    def check_diag(self, dtype, a, n, batch, describe):
        for i, m in enumerate(self._mats(a, n, batch, dtype)):
            zero = np.nonzero(np.diag(m) == 0)[0]
            if len(zero):
                self.errors.append(describe((i << 32) | int(zero[0] + 1)))

    def _blocks(self, ptr, per, stride, batch, dtype):
        """Views of `batch` blocks of `per` elements, one every `stride` elements."""
        return [self.mem.view(ptr + b * stride * np.dtype(dtype).itemsize, per, dtype)
                for b in range(batch)]

    def transpose(self, dtype, dst, src, rows, cols, batch, dst_stride=None, src_stride=None):
        self.launches.append("transpose")
        per = rows * cols
        for d, s in zip(self._blocks(dst, per, dst_stride or per, batch, dtype),
                        self._blocks(src, per, src_stride or per, batch, dtype)):
            d[:] = s.reshape(rows, cols).T.ravel()

    def transpose_lower(self, dtype, dst, src, n, batch):
        self.launches.append("transpose_lower")
        for d, s in zip(self._mats(dst, n, batch, dtype), self._mats(src, n, batch, dtype)):
            lower = np.tril(np.ones((n, n), bool))
            d[lower.T] = s.T[lower.T]       # src's lower triangle, transposed
            d[~lower.T] = 555.0             # the rest is never written: never read either

    def factor_out(self, dtype, dst, w, n, batch, info, nan_fill):
        self.launches.append("factor_out")
        inf = self.mem.view(info, batch, np.int32)
        for d, s, v in zip(self._mats(dst, n, batch, dtype), self._mats(w, n, batch, dtype),
                           inf):
            d[:] = np.nan if nan_fill and v else np.tril(s.T)

    def take(self, dtype, dst, src, per, src_stride, batch):
        for d, s in zip(self._blocks(dst, per, per, batch, dtype),
                        self._blocks(src, per, src_stride, batch, dtype)):
            d[:] = s

    def qr_r(self, dtype, r, a, m, n, rows_out, stride, batch):
        for d, s in zip(self._blocks(r, rows_out * n, rows_out * n, batch, dtype),
                        self._blocks(a, m * n, stride, batch, dtype)):
            full = np.zeros((rows_out, n))
            top = np.triu(s.reshape(n, m).T)[:rows_out]
            full[:top.shape[0]] = top
            d[:] = full.ravel()

    def potrf_small(self, dtype, dst, src, n, batch, lower, info, nan_fill):
        self.launches.append("potrf_small")
        xs, os_ = self._mats(src, n, batch, dtype), self._mats(dst, n, batch, dtype)
        inf = self.mem.view(info, batch, np.int32)
        for x, o, i in zip(xs, os_, range(batch)):
            t = np.tril(x) if lower else np.triu(x).T       # the lower triangle read
            try:
                low = np.linalg.cholesky(t + np.tril(t, -1).T)
            except np.linalg.LinAlgError:
                inf[i] = 1
                o[:] = np.nan if nan_fill else 0
                continue
            inf[i] = 0
            o[:] = low if lower else low.T

    def tri(self, dtype, a, n, batch, keep_lower, info, nan_fill):
        ms, inf = self._mats(a, n, batch, dtype), self.mem.view(info, batch, np.int32)
        drop = np.triu(np.ones((n, n), bool), 1) if keep_lower else np.tril(np.ones((n, n),
                                                                                    bool), -1)
        for m, v in zip(ms, inf):
            if nan_fill and v:
                m[:] = np.nan
            else:
                m[drop] = 0

    def symm(self, dtype, dst, src, n, batch, from_lower):
        s = self._mats(src, n, batch, dtype)
        d = self._mats(dst, n, batch, dtype)
        for i in range(batch):
            d[i] = _sym(s[i].T, FILL_UPPER if from_lower else FILL_LOWER).T

    def eye(self, dtype, a, n, batch):
        self._mats(a, n, batch, dtype)[:] = np.eye(n)

    def det(self, dtype, out, lu, ipiv, n, batch):
        o = self.mem.view(out, batch, dtype)
        for i in range(batch):
            m = self.mem.view(lu + i * n * n * np.dtype(dtype).itemsize, n * n, dtype)
            piv = self.mem.view(ipiv + 4 * n * i, n, np.int32) if n else np.zeros(0)
            sign = (-1) ** int(np.sum(piv != np.arange(1, n + 1)))
            o[i] = sign * np.prod(m.reshape(n, n).diagonal()) if n else 1.0

    def eighgrad_mid(self, dtype, m, p, w, gw, n, batch):
        mm, pp = self._mats(m, n, batch, dtype), self._mats(p, n, batch, dtype)
        ww, gg = (self.mem.view(x, n * batch, dtype).reshape(batch, n) for x in (w, gw))
        with np.errstate(divide="ignore"):
            for b in range(batch):
                d = ww[b][:, None] - ww[b][None, :]
                np.fill_diagonal(d, 1)
                mm[b] = pp[b].T / d
                np.fill_diagonal(mm[b], gg[b])

    def fold(self, dtype, out, g, n, batch, lower):
        gg, oo = self._mats(g, n, batch, dtype), self._mats(out, n, batch, dtype)
        for b in range(batch):
            oo[b] = (np.tril(gg[b]) + np.triu(gg[b], 1).T) if lower else \
                (np.triu(gg[b]) + np.tril(gg[b], -1).T)


def run_fake(gop, arrays, dtype="float64"):
    """(outputs, solver, blas, kernels) of `gop`'s device work on host memory."""
    mem = Mem()
    arrays = [np.asarray(a, dtype) for a in arrays]
    ins = [(mem.put(a), a.shape) for a in arrays]
    shapes = gop.out_shapes([a.shape for a in arrays], dtype)
    outs = [mem.allocate(max(int(np.prod(s)), 1) * np.dtype(dtype).itemsize).ptr
            for s in shapes]
    sol, blas, k = FakeSolver(mem, dtype), FakeBlas(mem, dtype), FakeKernels(mem)
    env = calls.Env("ctx", sol, blas, k, mem.allocate, {})
    gop.compute(env, dtype, ins, outs)
    res = [mem.view(p, int(np.prod(s)), dtype).reshape(s).copy() for p, s in zip(outs, shapes)]
    return res, sol, blas, k


def host(op_fn, arrays):
    vs = [T.TensorType("float64", (False,) * np.ndim(a))() for a in arrays]
    out = op_fn(*vs)
    return function(vs, out)(*arrays)


def spd(*batch, n=4):
    a = RNG.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def near(got, want, tol=1e-9):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ============================================================================ CPU: device work

def _garbage_in_the_ignored_triangle(a, lower):
    """a with noise in the triangle a factor of its `lower` (or upper) one never reads."""
    noise = RNG.normal(size=a.shape)
    return a + (np.triu(noise, 1) if lower else np.tril(noise, -1))


@pytest.mark.parametrize("fill_lower", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_cholesky_through_cusolver_maps_triangles_and_zeroes_the_other(lower, batch,
                                                                       fill_lower,
                                                                       monkeypatch):
    monkeypatch.setattr(calls, "SMALL_POTRF_MAX_N", 0)     # 4 x 4 through cuSOLVER
    monkeypatch.setattr(calls, "POTRF_FILL_LOWER", fill_lower)
    a = _garbage_in_the_ignored_triangle(spd(*batch), lower)
    (got,), sol, _, k = run_fake(gl.GpuCholesky(lower), [a])
    near(got, host(SL.Cholesky(lower), [a]))
    name, args = sol.calls[-1]
    assert name == ("potrfBatched" if batch else "Xpotrf") and not k.errors
    uplo = args[1] if batch else args[2]
    # the column-major LOWER fill always with fill_lower (a transposed copy for a row-major
    # lower factor); otherwise the row-major triangle's own fill
    assert uplo == (FILL_LOWER if fill_lower or not lower else FILL_UPPER)
    transposed = fill_lower and lower
    assert k.launches.count("transpose_lower") == k.launches.count("factor_out") == transposed
    assert "transpose" not in k.launches
    if batch:
        assert args[-1] == int(np.prod(batch))
    else:
        assert [c[0] for c in sol.calls] == ["Xpotrf_bufferSize", "Xpotrf"]


def test_cholesky_falls_back_to_the_legacy_potrf_without_the_64_bit_api(monkeypatch):
    monkeypatch.setattr(calls, "SMALL_POTRF_MAX_N", 0)
    a = spd(n=5)
    mem = Mem()
    sol = FakeSolver(mem, "float64")
    sol.Xpotrf = None
    out = mem.allocate(a.nbytes).ptr
    env = calls.Env("ctx", sol, FakeBlas(mem, "float64"), FakeKernels(mem), mem.allocate, {})
    gl.GpuCholesky(True).compute(env, "float64", [(mem.put(a), a.shape)], [out])
    near(mem.view(out, 25, np.float64).reshape(5, 5), np.linalg.cholesky(a))
    assert [c[0] for c in sol.calls] == ["potrf_bufferSize", "potrf"]


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("batch,n", [((), 4), ((5,), 32), ((2, 3), 33), ((2,), 64)])
def test_small_cholesky_is_one_kernel_launch(lower, batch, n):
    a = _garbage_in_the_ignored_triangle(spd(*batch, n=n), lower)
    (got,), sol, _, k = run_fake(gl.GpuCholesky(lower), [a])
    near(got, host(SL.Cholesky(lower), [a]))
    assert not sol.calls and k.launches == ["potrf_small"] and not k.errors


def test_cholesky_not_positive_definite_raises_or_gives_nan():
    a = spd(3)
    a[1] = -np.eye(4)
    _, _, _, k = run_fake(gl.GpuCholesky(True, "raise"), [a])
    assert len(k.errors) == 1 and "matrix 1" in str(k.errors[0]) and \
        "not positive definite" in str(k.errors[0])
    (got,), _, _, k = run_fake(gl.GpuCholesky(True, "nan"), [a])
    assert not k.errors and np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


STRUCTS = [("general", False), ("symmetric", False), ("symmetric", True),
           ("positive_definite", False), ("positive_definite", True),
           ("lower_triangular", True), ("upper_triangular", False), ("banded", False)]


@pytest.mark.parametrize("structure,lower", STRUCTS)
@pytest.mark.parametrize("batch,bshape", [((), (4,)), ((), (4, 3)), ((5,), (5, 4)),
                                          ((5,), (5, 4, 2))])
def test_solve_every_structure(structure, lower, batch, bshape):
    a = spd(*batch) + 0.3 * RNG.normal(size=batch + (4, 4)) * (structure == "general")
    b = RNG.normal(size=bshape)
    (got,), sol, blas, k = run_fake(gl.GpuSolve(structure, lower), [a, b])
    near(got, host(SL.Solve(structure, lower), [a, b]), 1e-8)
    assert not k.errors


def test_solve_large_batches_loop_cusolver_small_ones_use_cublas_batched(monkeypatch):
    a, b = spd(3), RNG.normal(size=(3, 4, 2))
    _, sol, blas, _ = run_fake(gl.GpuSolve(), [a, b])
    assert [c[0] for c in blas.calls] == ["getrf_batched", "getrs_batched"]
    assert blas.calls[1][1][1] == OP_T and blas.calls[1][1][2:4] == (4, 2)
    monkeypatch.setattr(calls, "GETRF_BATCHED_MAX_N", 2)
    (got,), sol, blas, _ = run_fake(gl.GpuSolve(), [a, b])
    assert [c[0] for c in sol.calls] == ["getrf_bufferSize"] + ["getrf"] * 3 + ["getrs"] * 3
    near(got, np.linalg.solve(a, b))


def test_singular_solve_and_inverse_report():
    a = spd(2)
    a[0] = 0
    _, _, _, k = run_fake(gl.GpuSolve(), [a, RNG.normal(size=(2, 4))])
    assert len(k.errors) == 1 and "matrix 0" in str(k.errors[0]) and "singular" in str(k.errors[0])
    _, _, _, k = run_fake(gl.GpuMatrixInverse(), [a])
    assert len(k.errors) == 1
    t = np.tril(spd())
    t[2, 2] = 0
    _, _, _, k = run_fake(gl.GpuSolveTriangular(0, True), [t, RNG.normal(size=4)])
    assert "row 2" in str(k.errors[0])


@pytest.mark.parametrize("trans,lower,unit", [(0, True, False), (1, True, False),
                                              (0, False, True), (1, False, False)])
@pytest.mark.parametrize("batch,bshape", [((), (4, 3)), ((3,), (3, 4))])
def test_solve_triangular_uses_right_side_trsm(trans, lower, unit, batch, bshape):
    a = spd(*batch)
    b = RNG.normal(size=bshape)
    (got,), _, blas, _ = run_fake(gl.GpuSolveTriangular(trans, lower, unit), [a, b])
    near(got, host(SL.SolveTriangular(trans, lower, unit), [a, b]), 1e-8)
    name, args = blas.calls[-1]
    assert name == ("trsm_batched" if batch else "trsm")
    k = 1 if len(bshape) == len(batch) + 1 else bshape[-1]
    assert args[1:7] == (SIDE_RIGHT, FILL_UPPER if lower else FILL_LOWER,
                         OP_T if trans else OP_N, int(unit), k, 4)
    assert blas.modes and set(blas.modes) == {0}


@pytest.mark.parametrize("lower", [True, False])
def test_cho_solve(lower):
    a = spd(3)
    c = np.linalg.cholesky(a)
    c = c if lower else np.swapaxes(c, -1, -2)
    b = RNG.normal(size=(3, 4, 2))
    (got,), _, _, _ = run_fake(gl.GpuCholeskySolve(lower), [c, b])
    near(got, np.linalg.solve(a, b), 1e-8)


@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize("batch,n", [((), 5), ((4,), 5), ((2, 3), 3), ((3,), 40), ((1,), 40),
                                     ((2, 2), 33)])
def test_eigh_paths_follow_the_input_type(uplo, batch, n):
    """A stack (batch dimensions, even of size 1): syevjBatched up to 32 x 32, XsyevBatched
    above; one matrix: syevd. The op is captured exactly when it takes a batched path."""
    a = spd(*batch, n=n)
    a = a + (np.triu if uplo == "L" else np.tril)(RNG.normal(size=a.shape), 1)
    (w, v), sol, _, _ = run_fake(gl.GpuEigh(uplo), [a])
    w_want, _ = np.linalg.eigh(a, uplo)
    near(w, w_want, 1e-8)
    s = np.tril(a) if uplo == "L" else np.triu(a)
    s = s + np.swapaxes(s, -1, -2) - np.eye(n) * a   # the symmetric matrix eigh reads
    near(v @ (w[..., None] * np.swapaxes(v, -1, -2)), s, 1e-8)
    kinds = {c[0] for c in sol.calls}
    want = ("syevd" if not batch else "syevjBatched" if n <= 32 else "XsyevBatched")
    assert want in kinds and not ({"syevd", "syevjBatched", "XsyevBatched"} - {want}) & kinds
    fill = FILL_UPPER if uplo == "L" else FILL_LOWER
    assert all(c[1][3 if c[0].startswith("X") else 2] == fill for c in sol.calls)
    if want == "XsyevBatched":
        assert sol.calls[-1][1][-1] == int(np.prod(batch))   # one call for the stack


def test_eigh_xsyev_batched_is_cut_into_chunks_under_2_to_the_31_elements(monkeypatch):
    monkeypatch.setattr(calls, "_SYEV_BATCHED_ELEMENTS", 40 * 40 * 2)
    a = spd(5, n=40)
    (w, _), sol, _, _ = run_fake(gl.GpuEigh("L"), [a])
    near(w, np.linalg.eigvalsh(a), 1e-8)
    assert [c[1][-1] for c in sol.calls if c[0] == "XsyevBatched"] == [2, 2, 1]


def test_eigh_is_captured_only_for_stacks_with_a_batched_library():
    from symgpu.gpu.placement.type import GpuArrayType
    m, t = GpuArrayType("float32", (False,) * 2)(), GpuArrayType("float32", (False,) * 3)()
    sol = FakeSolver(Mem(), "float32")
    import symgpu.gpu.ops.cusolver_lib as cl
    old = cl._cusolver
    try:
        cl._cusolver = sol
        assert gl.GpuEigh().calls_capturable(gl.GpuEigh()(t)[0].owner)
        assert not gl.GpuEigh().calls_capturable(gl.GpuEigh()(m)[0].owner)
        sol.XsyevBatched = None           # an older cuSOLVER: syevd, never captured
        assert not gl.GpuEigh().calls_capturable(gl.GpuEigh()(t)[0].owner)
    finally:
        cl._cusolver = old


def test_eigvalsh():
    a = spd(n=6)
    (w,), sol, _, _ = run_fake(gl.GpuEigvalsh(True), [a])
    near(w, sla.eigvalsh(a))
    assert sol.calls[-1][0] == "syevd" and sol.calls[-1][1][1] == 0   # no vectors


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_grad(uplo):
    a = spd(2, n=5)
    w, v = np.linalg.eigh(a, uplo)
    gw, gv = RNG.normal(size=w.shape), RNG.normal(size=v.shape)
    (got,), _, blas, _ = run_fake(gl.GpuEighGrad(uplo), [a, w, v, gw, gv])
    want = host(lambda *x: NL.EighGrad(uplo)(*x), [a, w, v, gw, gv])
    near(got, want, 1e-8)
    assert [c[0] for c in blas.calls] == ["gemm_strided_batched"] * 3
    assert all(c[1][-1] == 2 for c in blas.calls)


@pytest.mark.parametrize("batch,n", [((), 4), ((3,), 4), ((3,), 200), ((2, 2), 1)])
def test_inverse_and_det(batch, n, monkeypatch):
    from symgpu.gpu.ops import linalg_calls
    monkeypatch.setattr(linalg_calls, "GETRF_BATCHED_MAX_N", 128)   # n = 200: the loop path
    a = RNG.normal(size=batch + (n, n)) / np.sqrt(n) + 2 * np.eye(n)
    (inv,), _, blas, _ = run_fake(gl.GpuMatrixInverse(), [a])
    near(inv, np.linalg.inv(a), 1e-8)
    assert ("getri_batched" in [c[0] for c in blas.calls]) == (bool(batch) and n <= 128)
    (d,), _, _, _ = run_fake(gl.GpuDet(), [a])
    near(d, np.linalg.det(a), 1e-8)


def test_det_of_empty_matrices_is_one_and_of_singular_ones_zero():
    (d,), _, _, _ = run_fake(gl.GpuDet(), [np.zeros((3, 0, 0))])
    near(d, np.ones(3))
    a = np.ones((2, 3, 3))
    (d,), _, _, _ = run_fake(gl.GpuDet(), [a])
    near(d, np.zeros(2))


def test_shape_errors_name_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"GpuSolve\{general\}.*\(2, 3, 3\).*\(3, 3\)"):
        gl.GpuSolve().out_shapes([(2, 3, 3), (3, 3)], "float32")
    with pytest.raises(ValueError, match="square.*\\(3, 4\\)"):
        gl.GpuCholesky().out_shapes([(3, 4)], "float32")


def test_float32_entry_points_are_used_for_float32():
    a = spd(3).astype("float32")
    (got,), sol, _, _ = run_fake(gl.GpuCholesky(), [a], "float32")
    near(got, np.linalg.cholesky(a), 1e-4)
    assert "float32" in sol.potrfBatched


@pytest.mark.parametrize("mode", ["reduced", "complete", "r", "raw"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 6, 4), (2, 2, 3, 5), (0, 3),
                                   (3, 0)])
def test_qr_every_mode_matches_numpy(mode, shape):
    x = RNG.normal(size=shape)
    gop = gl.GpuQR(mode)
    got, sol, _, _ = run_fake(gop, [x])
    want = np.linalg.qr(x, mode)
    want = [want] if mode == "r" else list(want)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        near(g, w, 1e-9)
    batch = int(np.prod(shape[:-2]))
    names = [c[0] for c in sol.calls]
    if min(shape[-2:]):
        assert names.count("geqrf") == batch
        assert names.count("orgqr") == (batch if mode in ("reduced", "complete") else 0)


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("compute_uv", [True, False])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (3, 6, 4), (2, 2, 3, 5), (2, 40, 7),
                                   (1, 33, 33), (0, 3), (2, 3, 0)])
def test_svd_matches_numpy_on_the_batched_and_looped_paths(full, compute_uv, shape):
    x = RNG.normal(size=shape)
    got, sol, _, k = run_fake(gl.GpuSVD(full, compute_uv), [x])
    want = np.linalg.svd(x, full, compute_uv)
    want = list(want) if compute_uv else [want]
    assert [g.shape for g in got] == [w.shape for w in want] and not k.errors
    if not compute_uv:
        near(got[0], want[0])
    else:
        u, s_, vt = got
        near(s_, want[1])
        kk = min(shape[-2:])
        near((u[..., :, :kk] * s_[..., None, :]) @ vt[..., :kk, :], x)   # x = u s vt
        eye = np.eye(u.shape[-1])
        near(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(eye, u.shape[:-2] + eye.shape))
        eye = np.eye(vt.shape[-2])
        near(vt @ np.swapaxes(vt, -1, -2), np.broadcast_to(eye, vt.shape[:-2] + eye.shape))
        if full:   # NumPy's complete bases span the same spaces: compare the projections
            near(u @ np.swapaxes(u, -1, -2), np.broadcast_to(np.eye(shape[-2]), u.shape))
    names = {c[0] for c in sol.calls}
    if min(shape[-2:]):
        batched = len(shape) > 2 and max(shape[-2:]) <= 32
        assert ("gesvdjBatched" in names) == batched and ("gesvdj" in names) == (not batched)
        jobz = [c[1][1] for c in sol.calls if c[0] in ("gesvdj", "gesvdjBatched")]
        assert set(jobz) == {int(compute_uv)}
    else:
        assert not names


def test_svd_no_convergence_is_reported():
    mem = Mem()
    x = RNG.normal(size=(2, 4, 3))
    sol = FakeSolver(mem, "float64")
    real = sol.gesvdjBatched["float64"]

    def failing(*args):
        real(*args)
        mem.view(args[13] + 4, 1, np.int32)[0] = 4    # matrix 1: info = min(m, n) + 1
        return 0
    sol.gesvdjBatched["float64"] = failing
    k = FakeKernels(mem)
    env = calls.Env("ctx", sol, FakeBlas(mem, "float64"), k, mem.allocate, {})
    gop = gl.GpuSVD()
    outs = [mem.allocate(int(np.prod(s)) * 8).ptr for s in gop.out_shapes([x.shape], "float64")]
    gop.compute(env, "float64", [(mem.put(x), x.shape)], outs)
    assert len(k.errors) == 1 and "matrix 1" in str(k.errors[0]) and \
        "did not converge" in str(k.errors[0])


# ============================================================================ placement

def _gpu_names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def test_linalg_training_graph_is_placed_on_the_gpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, b = T.tensor3("x"), T.matrix("b")
        a = T.matmul(x, x.dimshuffle(0, 2, 1)) + 4 * T.eye(4, dtype="float32")
        c = SL.cholesky(a)
        s = SL.solve(a, b)
        w, v = NL.eigh(a)
        cost = c.sum() + (s ** 2).sum() + w.sum() + (v[..., 0] ** 2).sum() + \
            SL.solve_triangular(c, b, lower=True).sum() + NL.det(a).sum() + \
            NL.matrix_inverse(a).sum() + SL.cho_solve((c, True), b).sum()
        g = symgpu.grad(cost, x)
        f = function([x, b], [cost, g])
        names = _gpu_names(f)
        assert {"GpuCholesky", "GpuSolve", "GpuEigh", "GpuEighGrad", "GpuSolveTriangular",
                "GpuDet", "GpuMatrixInverse", "GpuCholeskySolve"} <= names, names
        assert not cpu_nodes(f.maker.fgraph), cpu_nodes(f.maker.fgraph)


def test_qr_and_svd_are_placed_on_the_gpu_and_eig_stays_on_the_host():
    """Eig's results are complex and GPU arrays have no complex dtype: it runs on the host,
    with the transfers placed around it."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.tensor3("x")
        q, r = NL.qr(x)
        h, tau = NL.qr(x, "raw")
        u, s, vt = NL.svd(x, full_matrices=False)
        outs = [q, r, NL.qr(x, "r"), NL.qr(x, "complete")[0], h, tau, u, s, vt,
                NL.svd(x, compute_uv=False), NL.eig(x[:, :2, :2])[0]]
        f = function([x], outs)
        names = _gpu_names(f)
        assert {"GpuQR", "GpuSVD", "Eig"} <= names and not {"QRFull", "QRIncomplete",
                                                             "SVD"} & names, names
        modes = {n.op.mode for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuQR"}
        assert modes == {"reduced", "raw", "r", "complete"}
        assert [type(n.op).__name__ for n in cpu_nodes(f.maker.fgraph)] == ["Eig"]


def test_mixed_dtypes_and_generalized_eigvalsh_stay_on_the_host():
    with config.change_flags(floatX="float32"), virtual_context(None):
        a, b = T.matrix("a"), T.dmatrix("b")
        f = function([a, b], [SL.solve(a, b), SL.eigvalsh(a, a), SL.eigvalsh(a)])
        names = _gpu_names(f)
        assert {"Solve", "Eigvalsh", "GpuEigvalsh"} <= names, names


@requires_nvcc
def test_linalg_kernels_compile(tmp_path):
    assert compile_for_sm90(gl.linalg_source(), tmp_path)


# ============================================================================ GPU

def _compare(build, values, gpu_name, tol):
    ins = [T.TensorType(np.asarray(v).dtype.name, (False,) * np.ndim(v))() for v in values]
    outs = build(*ins)
    with on_the_cpu():
        want = function(ins, outs)(*values)
    f = function(ins, outs)
    assert gpu_name in _gpu_names(f), _gpu_names(f)
    got = f(*values)
    for g_, w_ in zip(got if isinstance(got, list) else [got],
                      want if isinstance(want, list) else [want]):
        np.testing.assert_allclose(np.asarray(g_), w_, rtol=tol, atol=tol)


TOL = {"float32": 2e-3, "float64": 1e-9}
SHAPES = [(), (3,), (40,)]


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch", SHAPES)
@pytest.mark.parametrize("n", [4, 33, 130])
def test_gpu_cholesky_solve_inverse_det(cuda, dtype, batch, n):
    a = spd(*batch, n=n).astype(dtype)
    b = RNG.normal(size=batch + (n, 3)).astype(dtype)
    _compare(lambda x: SL.cholesky(x), [a], "GpuCholesky", TOL[dtype])
    _compare(lambda x: SL.Cholesky(lower=False)(x), [a], "GpuCholesky", TOL[dtype])
    for st, lo in STRUCTS:
        _compare(lambda x, y: SL.Solve(st, lo)(x, y), [a, b], "GpuSolve", TOL[dtype] * n)
        _compare(lambda x, y: SL.Solve(st, lo)(x, y[..., 0]), [a, b], "GpuSolve",
                 TOL[dtype] * n)
    _compare(lambda x, y: SL.solve_triangular(x, y, 1, True), [a, b], "GpuSolveTriangular",
             TOL[dtype] * n)
    _compare(lambda x, y: SL.cho_solve((SL.cholesky(x), True), y), [a, b], "GpuCholeskySolve",
             TOL[dtype] * n)
    _compare(NL.matrix_inverse, [a], "GpuMatrixInverse", TOL[dtype] * n)
    _compare(lambda x: T.log(abs(NL.det(x))), [a], "GpuDet", TOL[dtype] * n)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch,n", [((), 5), ((7,), 5), ((7,), 32), ((3,), 50), ((), 300)])
def test_gpu_eigh_and_eigvalsh(cuda, dtype, batch, n):
    a = spd(*batch, n=n).astype(dtype)
    tol = TOL[dtype] * n
    # eigenvectors up to sign: compare w and |v|
    _compare(lambda x: [NL.eigh(x)[0], abs(NL.eigh(x, "U")[1])], [a], "GpuEigh", tol)
    if not batch:
        _compare(SL.eigvalsh, [a], "GpuEigvalsh", tol)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_non_contiguous_inputs(cuda, dtype):
    a = spd(4, n=6).astype(dtype)
    b = RNG.normal(size=(4, 6, 6)).astype(dtype)
    tol = TOL[dtype] * 10
    _compare(lambda x: SL.cholesky(x.dimshuffle(0, 2, 1)[::2]), [a], "GpuCholesky", tol)
    _compare(lambda x, y: SL.solve(x[1:], y.dimshuffle(0, 2, 1)[1:]), [a, b], "GpuSolve", tol)
    _compare(lambda x: NL.eigh(x[::-1].dimshuffle(0, 2, 1))[0], [a], "GpuEigh", tol)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_gradients_match_the_host(cuda, dtype):
    xv = RNG.normal(size=(3, 5, 5)).astype(dtype)
    bv = RNG.normal(size=(3, 5, 2)).astype(dtype)

    def build(x, b):
        a = T.matmul(x, x.dimshuffle(0, 2, 1)) + 5 * T.eye(5, dtype=dtype)
        c = SL.cholesky(a)
        w, v = NL.eigh(a)
        cost = (c ** 2).sum() + (SL.solve(a, b) ** 2).sum() + (w ** 2).sum() + \
            (v[..., 0] ** 2 * w[..., 0].dimshuffle(0, "x")).sum() + T.log(NL.det(a)).sum()
        return [cost] + symgpu.grad(cost, [x, b])
    _compare(build, [xv, bv], "GpuEighGrad", TOL[dtype] * 20)


@requires_gpu
def test_gpu_cholesky_errors_reach_the_host(cuda):
    x = T.tensor3()
    f = function([x], SL.cholesky(x))
    a = spd(3)
    a[2] = -np.eye(4)
    with pytest.raises(np.linalg.LinAlgError, match="matrix 2.*not positive definite"):
        f(a)
    g = function([x], SL.Cholesky(on_error="nan")(x))
    got = g(a)
    assert np.isnan(got[2]).all() and np.isfinite(got[:2]).all()


@requires_gpu
def test_gpu_linalg_graph_replays(cuda):
    """Run a call twice (the second replays the captured CUDA graph where the runner
    captures) and get the same values."""
    x, b = T.tensor3(), T.tensor3()
    f = function([x, b], [SL.solve(x, b), SL.cholesky(x), NL.eigh(x)[0]])
    a, bv = spd(64, n=16), RNG.normal(size=(64, 16, 2))
    first = [np.asarray(r).copy() for r in f(a, bv)]
    for r, s in zip(f(a, bv), first):
        np.testing.assert_array_equal(r, s)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch,n", [((), 1), ((), 17), ((9,), 32), ((5,), 33), ((2, 3), 64),
                                     ((3,), 65), ((), 300)])
def test_gpu_cholesky_small_kernel_and_cusolver_sizes(cuda, dtype, batch, n):
    """The small-matrix kernel (n <= 64) and cuSOLVER's paths (Xpotrf, potrfBatched) against
    the host, both triangles (garbage in the one not read), and a failing matrix."""
    tol = TOL[dtype] * max(n, 10)
    for lower in (True, False):
        a = _garbage_in_the_ignored_triangle(spd(*batch, n=n), lower).astype(dtype)
        _compare(lambda x: SL.Cholesky(lower)(x), [a], "GpuCholesky", tol)
        if batch:
            bad = a.copy()
            bad[(0,) * len(batch)] = -np.eye(n, dtype=dtype)
            x = T.TensorType(dtype, (False,) * bad.ndim)()
            got = function([x], SL.Cholesky(lower, "nan")(x))(bad)
            assert np.isnan(got[(0,) * len(batch)]).all()
            assert np.isfinite(got.reshape(-1, n, n)[1:]).all()
            with pytest.raises(np.linalg.LinAlgError, match="matrix 0.*not positive definite"):
                function([x], SL.Cholesky(lower)(x))(bad)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch,n", [((1,), 40), ((6,), 64), ((2, 2), 129)])
def test_gpu_eigh_of_stacks_above_32_is_batched_and_captured(cuda, dtype, batch, n):
    a = spd(*batch, n=n).astype(dtype)
    tol = TOL[dtype] * n
    _compare(lambda x: [NL.eigh(x)[0], abs(NL.eigh(x, "U")[1])], [a], "GpuEigh", tol)
    x = T.TensorType(dtype, (False,) * a.ndim)()
    f = function([x], NL.eigh(x)[0] * 2)
    first = np.asarray(f(a)).copy()
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(f(a)), first)
    st = f.vm.runner.stats()
    assert st["captures"] >= 1 and st["replays"] >= 1, st
    np.testing.assert_allclose(first, 2 * np.linalg.eigvalsh(a.astype(np.float64)), rtol=tol,
                               atol=tol)


def _qr_canonical(q, r):
    """q, r with R's diagonal made non-negative (QR is unique up to those signs)."""
    k = min(r.shape[-2:])      # R's diagonal (complete mode: q is m x m, r m x n)
    d = np.sign(np.diagonal(r[..., :k, :k], axis1=-2, axis2=-1))
    d = np.where(d == 0, 1, d)
    q = q.copy()
    q[..., :k] *= d[..., None, :]
    r = r.copy()
    r[..., :k, :] *= d[..., :, None]
    return q, r


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (33, 33), (3, 5, 2), (2, 2, 40, 9)])
def test_gpu_qr_every_mode(cuda, dtype, shape):
    xv = RNG.normal(size=shape).astype(dtype)
    tol = TOL[dtype] * 10
    x = T.TensorType(dtype, (False,) * len(shape))()
    for mode in ("reduced", "complete"):
        f = function([x], NL.qr(x, mode))
        assert "GpuQR" in _gpu_names(f)
        q, r = (np.asarray(v) for v in f(xv))
        wq, wr = np.linalg.qr(xv.astype(np.float64), mode)
        assert q.shape == wq.shape and r.shape == wr.shape
        k = min(shape[-2:])
        near_ = lambda g, w: np.testing.assert_allclose(g, w, rtol=tol, atol=tol)  # noqa: E731
        near_(q[..., :k] @ r[..., :k, :], xv)
        gq, gr = _qr_canonical(q, r)
        cq, cr = _qr_canonical(wq, wr)
        near_(gr, cr)
        near_(gq[..., :k], cq[..., :k])
    f = function([x], NL.qr(x, "r"))
    r = np.asarray(f(xv))
    np.testing.assert_allclose(abs(r), abs(np.linalg.qr(xv.astype(np.float64), "r")),
                               rtol=tol, atol=tol)
    h, tau = (np.asarray(v) for v in function([x], NL.qr(x, "raw"))(xv))
    wh, wt = np.linalg.qr(xv.astype(np.float64), "raw")
    assert h.shape == wh.shape and tau.shape == wt.shape
    np.testing.assert_allclose(abs(np.triu(np.swapaxes(h, -1, -2))),
                               abs(np.triu(np.swapaxes(wh, -1, -2))), rtol=tol, atol=tol)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (50, 50), (6, 5, 3), (2, 3, 32, 17),
                                   (3, 40, 33)])
def test_gpu_svd(cuda, dtype, shape):
    xv = RNG.normal(size=shape).astype(dtype)
    tol = TOL[dtype] * 20
    x = T.TensorType(dtype, (False,) * len(shape))()
    k = min(shape[-2:])
    want_s = np.linalg.svd(xv.astype(np.float64), compute_uv=False)
    for full in (True, False):
        f = function([x], NL.svd(x, full))
        assert "GpuSVD" in _gpu_names(f)
        u, s_, vt = (np.asarray(v) for v in f(xv))
        wu, _, wvt = np.linalg.svd(xv, full)
        assert u.shape == wu.shape and vt.shape == wvt.shape
        np.testing.assert_allclose(s_, want_s, rtol=tol, atol=tol)
        np.testing.assert_allclose((u[..., :k] * s_[..., None, :]) @ vt[..., :k, :], xv,
                                   rtol=tol, atol=tol)
        for m_ in (u, np.swapaxes(vt, -1, -2)):
            eye = np.eye(m_.shape[-1])
            np.testing.assert_allclose(np.swapaxes(m_, -1, -2) @ m_,
                                       np.broadcast_to(eye, m_.shape[:-2] + eye.shape),
                                       rtol=tol, atol=tol)
    f = function([x], NL.svd(x, compute_uv=False))
    assert "GpuSVD" in _gpu_names(f)
    np.testing.assert_allclose(np.asarray(f(xv)), want_s, rtol=tol, atol=tol)


def test_one_library_handle_per_context_bound_to_its_stream():
    """cublas_lib.context_handle (cuSOLVER's and cuSPARSE's handles): created once per
    context, bound to the context's stream, failures named by the library's prefix."""
    import threading
    from symgpu.gpu.ops.cublas_lib import context_handle

    class Ctx:
        stream_handle = 1234
        activated = 0

        def activate(self):
            self.activated += 1
    made, bound = [], []

    def create(ref):
        ref._obj.value = 77 + len(made)
        made.append(ref._obj.value)
        return 0

    def set_stream(h, stream):
        bound.append((h.value, stream.value))
        return 0

    def check(status, what):
        if status:
            raise RuntimeError(what)
    handles, lock, ctx = {}, threading.Lock(), Ctx()
    h1 = context_handle(handles, lock, ctx, create, set_stream, check, "lib")
    h2 = context_handle(handles, lock, ctx, create, set_stream, check, "lib")
    assert h1 is h2 and made == [77] and bound == [(77, 1234)] and ctx.activated == 1
    with pytest.raises(RuntimeError, match="libCreate"):
        context_handle({}, lock, Ctx(), lambda ref: 3, set_stream, check, "lib")
