"""Thin matrix products in one launch of our own kernels (``codegen/thin_gemm.cu``).

Why: for a product with one side of at most ``THIN`` (an MLP's 10-class layer: ``h @ W3``,
``h.T @ d``) cuBLAS picks split-K kernels followed by a ``splitKreduce`` launch, a few
microseconds of a step whose work is reading one 2 MB matrix once.  Here each is one kernel
(thin_gemm.cu: ``tg_rows`` where X is read along k, ``tg_cols`` where it is read along m).
``plan_thin`` decides (plain Python, tested on the CPU); products it declines go to
cuBLAS/cuBLASLt as before (blas.py).  A product with a small k (``d @ W3.T``) stays with
cuBLAS: that is one kernel already, and measured faster than a kernel of ours.

Measured on an H100 (CUPTI kernel times, ours against classic cuBLAS, the default):
float32 512x1024 @ 1024x10 4.16 us against 7.60 + 2.03 us; 1024x512 (transposed view)
@ 512x10 5.59 us against 4.12 + 1.70 us; float64 the same: 5.41 us against 3.55 + 1.98 us,
but 6.92 us against one 5.71 us kernel, so float64 products read along m stay with cuBLAS
(``USE``).

Capture-safe: the module is loaded when the thunk is made, a launch allocates nothing, and
alpha/beta on the device are read by the kernel.  Accumulation is in the operands' dtype
with FMA (float32 products are never TF32 here: at least as accurate as cuBLAS's).
``ENABLED = False`` sends every product to cuBLAS.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from symgpu.gpu.runtime.codegen import launch, template

__all__ = ["ENABLED", "USE", "THIN", "MAX_K", "MIN_K", "ROWS_MAX_K", "ThinPlan", "plan_thin",
           "ThinGemm", "render_thin_gemm", "thin_gemm_formats", "prefetch_request", "DTYPES"]

#: products go to our kernels at all (False: cuBLAS for everything)
ENABLED = True
#: the most output columns (or rows, transposed) of a thin product: thin_gemm.cu's TG_NB
THIN = 16
#: thin products with a longer k go to cuBLAS (its split-K spreads k over the GPU; a block
#: here walks the whole of k): tg_cols (X read along m) up to MAX_K, tg_rows (X read along
#: k, Y held in registers: thin_gemm.cu's TG_RT * TG_RK) up to ROWS_MAX_K
MAX_K = 4096
ROWS_MAX_K = 1024
#: thin products with a shorter k go to cuBLAS too (one kernel there, no split-K): on the H200
#: the 3-D CNN's dense layer (benchmarks/library_gpu.py, batch 8 of 6912 features, 10
#: classes) took 30.8 us in tg_rows for d @ W3.T (k = 10) and 17.6 us in tg_cols for h.T @ d
#: (k = 8), against cuBLAS's 3.0 us each in PyTorch's step
MIN_K = 32
#: kernel -> the dtypes plans may pick it for (the others' products go to cuBLAS)
USE = {"tg_rows": ("float32", "float64"), "tg_cols": ("float32",)}
_CTYPE = {"float32": "float", "float64": "double"}
#: the dtypes the module is rendered for (half products go to cuBLASLt)
DTYPES = tuple(_CTYPE)


class ThinPlan(NamedTuple):
    """One launch: the kernel, its grid and block, and whether X and Y trade places (a thin
    m is the thin n of the transposed product)."""
    kernel: str
    grid: tuple
    block: tuple
    swap: bool


def render_thin_gemm(dtype: str) -> str:
    """The module's CUDA source for float32 or float64."""
    vec, vw = ("float4", 4) if dtype == "float32" else ("double2", 2)
    return template("thin_gemm.cu").substitute(t=_CTYPE[dtype], vec=vec, vw=vw)


def thin_gemm_formats(dtype: str) -> dict[str, str]:
    """Kernel name -> struct format of its arguments (thin_gemm.cu's TG_PARAMS)."""
    s = "f" if dtype == "float32" else "d"
    main = "qqq" + "Pqq" * 3 + s + "P" + s + "P"
    return {"tg_rows": main, "tg_cols": main}


def prefetch_request(dtype: str) -> tuple:
    """(key, source factory, options) of the module, for symgpu/gpu/exec/prefetch.py."""
    return (("symgpu.thin_gemm", dtype), lambda: render_thin_gemm(dtype), ())


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def plan_thin(m: int, n: int, k: int, xs: tuple, ys: tuple, dtype: str,
              sms: int) -> ThinPlan | None:
    """How ``out (m x n) = X (m x k) @ Y (k x n)`` of ``dtype`` runs on our kernels, X and Y
    read with element strides ``xs`` and ``ys``; None where cuBLAS should do it (k == 0,
    neither side thin, k under MIN_K or over the kernel's limit, the kernel not in ``USE``
    for dtype)."""
    if not (m and n and k) or min(m, n) > THIN or k < MIN_K:
        return None
    grid_cap = 16 * sms
    swap = n > THIN                           # m is the thin side: out.T = Y.T @ X.T
    rows, (s_row, s_k) = (n, (ys[1], ys[0])) if swap else (m, xs)
    if abs(s_k) <= abs(s_row):                # the kernel's X is read along k
        if k <= ROWS_MAX_K and dtype in USE.get("tg_rows", ()):
            return ThinPlan("tg_rows", (min(_ceil(rows, 4), grid_cap), 1, 1), (256, 1, 1), swap)
    elif k <= MAX_K and dtype in USE.get("tg_cols", ()):
        lanes = 64 if dtype == "float64" else 128
        return ThinPlan("tg_cols", (min(_ceil(rows, 8), grid_cap), 1, 1), (8, lanes, 1), swap)
    return None


def _elem_strides(a: Any) -> tuple | None:
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides):
        return None
    return tuple(s // isz for s in a.strides)


class ThinGemm:
    """The thin-product path of one GEMM thunk: its kernels (loaded now, on the thunk's
    context) and its plans per shapes and strides."""

    def __init__(self, ctx: Any, dtype: str) -> None:
        self.dtype = dtype
        self.sms = launch.sm_count(ctx)
        ks = launch.load_kernels(ctx, ("symgpu.thin_gemm", dtype), lambda: render_thin_gemm(dtype),
                          thin_gemm_formats(dtype))
        self.launch: dict[str, Callable[..., None]] = {n: k.fast_launcher() for n, k in ks.items()}
        self.plans: dict[tuple, tuple | None] = {}

    def plan(self, x: Any, y: Any, out: Any) -> tuple | None:
        """(launcher, ThinPlan, element strides of x, y, out) or None (cuBLAS)."""
        key = (x.shape, x.strides, y.shape, y.strides, out.strides)
        if key in self.plans:
            return self.plans[key]
        got = None
        xs, ys, os_ = _elem_strides(x), _elem_strides(y), _elem_strides(out)
        if xs is not None and ys is not None and os_ is not None:
            (m, k), n = x.shape, y.shape[1]
            p = plan_thin(m, n, k, xs, ys, self.dtype, self.sms)
            if p is not None:
                got = (self.launch[p.kernel], p, xs, ys, os_)
        self.plans[key] = got
        return got

    def __call__(self, x: Any, y: Any, out: Any, alpha: tuple, beta: tuple) -> bool:
        """Launch ``out = alpha x @ y + beta out`` if a plan takes it (True), else False.
        ``alpha``/``beta``: (value, device pointer or 0); a pointer wins."""
        got = self.plan(x, y, out)
        if got is None:
            return False
        go, p, xs, ys, os_ = got
        (m, k), n = x.shape, y.shape[1]
        if p.swap:
            args = (n, m, k, y.ptr, ys[1], ys[0], x.ptr, xs[1], xs[0], out.ptr, os_[1], os_[0])
        else:
            args = (m, n, k, x.ptr, xs[0], xs[1], y.ptr, ys[0], ys[1], out.ptr, os_[0], os_[1])
        go(p.grid, p.block, *args, alpha[0], alpha[1], beta[0], beta[1])
        return True
