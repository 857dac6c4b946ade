"""symgpu's warp- and block-level CUDA kernels run on the CPU (tests/cuda_on_host.py: every
thread a fiber, barriers and shuffles honoured) against NumPy: the softmax rows kernels (a
warp per row and a block per row, float32 and float64, strided input, NaN rows), the
negative log-likelihood gradient (labels checked and reported) and the Philox sampling
kernels (the CPU generator's numbers, bit for bit where the GPU's are), without a GPU."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuda_on_host import build, requires_gxx
from symgpu.gpu.ops import advanced as adv
from symgpu.gpu.ops import nll_grad as ng
from symgpu.gpu.ops import random as gr
from symgpu.gpu.ops import softmax_rows as sr
from symgpu.gpu.ops import thin_gemm as tg
from symgpu.tensor.random import philox

pytestmark = requires_gxx

_CT = {"float32": "float", "float64": "double"}
#: the softmax kernels' storage types: the half dtypes too (computed in float32)
_SOFTMAX_CT = dict(_CT, float16="__half", bfloat16="__nv_bfloat16")
#: the softmax kernels' tolerance per dtype: float32 arithmetic, then (halves) one rounding
#: of the result: 2^-11 relative for float16, 2^-8 for bfloat16 (half an ulp), with margin
_SOFTMAX_TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 1e-3, "bfloat16": 8e-3}
_ONE = ctypes.c_longlong(1)   # a block's y extent (1-d blocks)


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(scope="module")
def softmax_lib(tmp_path_factory):
    wraps = []
    for dtype, t in _SOFTMAX_CT.items():
        for log in (False, True):
            for wide in (False, True):
                name = sr._kernel_name(dtype, log, wide)
                wraps.append(f"EMU_WRAP(run_{name}, {name}, (const {t} *x, long long xs0, "
                             f"long long xs1, {t} *out, long long rows, long long n), "
                             f"(x, xs0, xs1, out, rows, n))")
                wraps.append(f"EMU_WRAP(run_{name}_bias, {name}_bias, (const {t} *x, "
                             f"long long xs0, long long xs1, const {t} *b, long long bs, "
                             f"{t} *out, long long rows, long long n), "
                             f"(x, xs0, xs1, b, bs, out, rows, n))")
    return build(sr.softmax_rows_source(), "\n".join(wraps), tmp_path_factory.mktemp("sr"))


def _softmax_ref(x: np.ndarray, log: bool) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return (x - m) - np.log(s) if log else e / s


@pytest.mark.parametrize("dtype", list(_SOFTMAX_CT))
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("rows,n,wide", [(21, 10, False), (9, 77, False), (3, 1500, True),
                                         (2, 33, True)])
def test_softmax_rows_kernels_match_numpy(softmax_lib, dtype, log, rows, n, wide):
    rng = np.random.default_rng(rows * n)
    base = (rng.standard_normal((rows, 2 * n)) * 4).astype(dtype)
    x = base[:, ::2]                       # an element stride of 2, a row stride of 2n
    if rows > 3:
        x[1, 3] = np.nan                   # a NaN row stays NaN, as NumPy's
    out = np.full((rows, n), -7.0, dtype=dtype)
    it = x.itemsize
    name = sr._kernel_name(dtype, log, wide)
    block = 256 if not wide else 128
    per_block = 1 if wide else block // 32
    grid = max(1, min(3, -(-rows // per_block)))    # fewer blocks than rows: blocks stride
    getattr(softmax_lib, f"run_{name}")(ctypes.c_longlong(grid), ctypes.c_longlong(block), _ONE,
                                        _ptr(base), ctypes.c_longlong(x.strides[0] // it),
                                        ctypes.c_longlong(x.strides[1] // it), _ptr(out),
                                        ctypes.c_longlong(rows), ctypes.c_longlong(n))
    want = _softmax_ref(x.astype("float64"), log)
    tol = _SOFTMAX_TOL[dtype]
    np.testing.assert_allclose(out.astype("float64"), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", list(_SOFTMAX_CT))
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("rows,n,wide", [(21, 10, False), (3, 1500, True)])
def test_softmax_rows_bias_kernels_add_the_vector_to_every_row(softmax_lib, dtype, log, rows,
                                                              n, wide):
    """The _bias twins: softmax of x + b (b read with an element stride), the sum rounded as
    the elementwise add rounds it; a length-1 b (stride 0) broadcasts."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((rows, n)) * 4).astype(dtype)
    bb = (rng.standard_normal(2 * n) * 4).astype(dtype)
    name = sr._kernel_name(dtype, log, wide, bias=True)
    block = 256 if not wide else 128
    grid = max(1, min(3, -(-rows // (1 if wide else block // 32))))
    for b, bs in ((bb[::2], 2), (bb[:1], 0)):
        out = np.full((rows, n), -7.0, dtype=dtype)
        getattr(softmax_lib, f"run_{name}")(
            ctypes.c_longlong(grid), ctypes.c_longlong(block), _ONE, _ptr(x),
            ctypes.c_longlong(n), ctypes.c_longlong(1), _ptr(bb), ctypes.c_longlong(bs),
            _ptr(out), ctypes.c_longlong(rows), ctypes.c_longlong(n))
        want = _softmax_ref((x + (b if bs else b[0])).astype("float64"), log)
        tol = _SOFTMAX_TOL[dtype]
        np.testing.assert_allclose(out.astype("float64"), want, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def nll_lib(tmp_path_factory):
    wraps = []
    for dtype, t in ng.NLL_GRAD_DTYPES.items():
        for idt, it in ng.INDEX_DTYPES.items():
            for exp_m in (False, True):
                name = ng._kernel_name(dtype, idt, exp_m)
                wraps.append(
                    f"EMU_WRAP(run_{name}, {name}, (const {t} *v, long long vs, double vconst, "
                    f"const {t} *m, long long ms0, long long ms1, const {it} *y, long long ys, "
                    f"{t} *out, long long rows, long long cols, long long labelled, "
                    f"unsigned long long *err), (v, vs, vconst, m, ms0, ms1, y, ys, out, rows, "
                    f"cols, labelled, err))")
    return build(ng.nll_grad_source(), "\n".join(wraps), tmp_path_factory.mktemp("nll"))


def _error_page() -> np.ndarray:
    """A zeroed 4096-byte-aligned page of uint64 (report() also writes its page's first word)."""
    raw = np.zeros(2 * 512, dtype=np.uint64)
    start = (-raw.ctypes.data % 4096) // 8
    return raw[start:start + 512]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("exp_m", [False, True])
def test_nll_grad_kernel_matches_numpy_and_reports_a_bad_label(nll_lib, dtype, idt, exp_m):
    """With exp_m the kernel is given log(m) (a log-softmax) and computes with exp of it.
    The half dtypes compute in float32 and round the result once (half an ulp: 2^-11
    relative for float16, 2^-8 for bfloat16, tolerances with margin)."""
    rows, cols, labelled = 37, 10, 30
    rng = np.random.default_rng(5)
    m = rng.random((rows, cols)).astype(dtype)
    v = np.asarray([-1.0 / labelled], dtype=dtype)           # broadcast (stride 0)
    y = rng.integers(-cols, cols, rows).astype(idt)           # negative labels count from the end
    name = ng._kernel_name(dtype, idt, exp_m)
    run = getattr(nll_lib, f"run_{name}")
    given = np.log(m) if exp_m else m
    m = np.exp(given.astype("float64")) if exp_m else m.astype("float64")   # what it reads

    def launch(y, grid, by_value=False):
        """(by_value: no v array, its one value passed as vconst, as GpuNLLGrad{v=...}.)"""
        out = np.full((rows, cols), 99.0, dtype=dtype)
        err = _error_page()
        slot = err[8:]                                        # a slot inside the page
        run(ctypes.c_longlong(grid), ctypes.c_longlong(64), _ONE,
            ctypes.c_void_p(0) if by_value else _ptr(v), ctypes.c_longlong(0),
            ctypes.c_double(float(v[0]) if by_value else 0.0), _ptr(given), ctypes.c_longlong(cols), ctypes.c_longlong(1), _ptr(y),
            ctypes.c_longlong(1), _ptr(out), ctypes.c_longlong(rows), ctypes.c_longlong(cols),
            ctypes.c_longlong(labelled), _ptr(slot))
        return out, err, slot

    tol = {"float32": dict(rtol=1e-5, atol=1e-7), "float64": dict(rtol=1e-12, atol=0),
           "float16": dict(rtol=1e-3, atol=1e-6), "bfloat16": dict(rtol=8e-3, atol=1e-6)}[dtype]
    out, err, slot = launch(y, grid=2)                        # 2 x 64 threads stride over 370
    g = np.zeros((rows, cols))
    g[np.arange(labelled), y[:labelled] % cols] = v[0]
    want = g - m * g.sum(axis=1, keepdims=True)
    out = out.astype("float64")
    np.testing.assert_allclose(out, want, **tol)
    assert slot[0] == 0 and err[0] == 0
    by_value, _, _ = launch(y, grid=2, by_value=True)
    np.testing.assert_array_equal(by_value.astype("float64"), out)
    bad = y.copy()
    bad[4] = cols + 3
    out, err, slot = launch(bad, grid=1)
    out = out.astype("float64")
    assert slot[0] == 1 and slot[1] == cols + 3 and err[0] == 1   # reported, page flagged
    np.testing.assert_allclose(out[4], 0.0 - m[4] * 0.0)      # the row gets no one-hot term
    np.testing.assert_allclose(np.delete(out, 4, axis=0), np.delete(want, 4, axis=0), **tol)


@pytest.fixture(scope="module")
def philox_lib(tmp_path_factory):
    wraps = ["EMU_WRAP(run_sg_philox_advance, sg_philox_advance, (const unsigned int *st, "
             "unsigned int *out, unsigned long long nb), (st, out, nb))"]
    for dist in philox.DISTS:
        for dtype, t in _SOFTMAX_CT.items():      # the storage types of the four float dtypes
            name = gr.sample_kernel_name(dist, dtype)
            wraps.append(f"EMU_WRAP(run_{name}, {name}, (const unsigned int *st, {t} *out, "
                         f"long long n), (st, out, n))")
    return build(gr.random_source(), "\n".join(wraps), tmp_path_factory.mktemp("philox"))


@pytest.mark.parametrize("dist", philox.DISTS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 7, 203])
def test_philox_kernels_draw_the_cpu_generators_numbers(philox_lib, dist, dtype, n):
    """Half draws are the float32 numbers rounded to nearest even, as the CPU's: uniforms
    bit for bit, normals within the float32 kernel's error and then one rounding."""
    state = np.asarray([0x12345678, 0x9ABCDEF0, 0xFFFFFFF0, 3], dtype=np.uint32)  # carries
    out = np.full(n + 3, -5.0, dtype=dtype)          # a tail the kernel must not write
    run = getattr(philox_lib, f"run_{gr.sample_kernel_name(dist, dtype)}")
    run(ctypes.c_longlong(2), ctypes.c_longlong(32), _ONE, _ptr(state), _ptr(out),
        ctypes.c_longlong(n))
    want = philox.sample(state, dist, dtype, (n,))
    if dist == "uniform" or dtype == "float64":      # exact on the GPU too
        np.testing.assert_array_equal(out[:n], want)
    else:                                            # the GPU's __sincosf is approximate
        tol = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
        np.testing.assert_allclose(out[:n].astype("float64"), want.astype("float64"),
                                   rtol=tol, atol=tol)
    assert (out[n:] == -5.0).all()
    moved = np.zeros(4, dtype=np.uint32)
    philox_lib.run_sg_philox_advance(ctypes.c_longlong(1), ctypes.c_longlong(32), _ONE, _ptr(state),
                                     _ptr(moved), ctypes.c_ulonglong(philox.blocks(n, dtype)))
    np.testing.assert_array_equal(moved, philox.advance(state, philox.blocks(n, dtype)))


_TG_ARGS = "(m, n, k, X, xs0, xs1, Y, ys0, ys1, out, os0, os1, alpha_v, alpha_p, beta_v, beta_p)"


@pytest.fixture(scope="module")
def thin_libs(tmp_path_factory):
    wraps = "\n".join(f"EMU_WRAP(run_{k}, {k}, (TG_PARAMS), {_TG_ARGS})"
                      for k in ("tg_rows", "tg_cols"))
    return {dt: build(tg.render_thin_gemm(dt), wraps, tmp_path_factory.mktemp(f"tg_{dt}"))
            for dt in ("float32", "float64")}


def _elems(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


@pytest.mark.parametrize("dtype,m,n,k,x_cols,kernel", [
    ("float32", 37, 10, 300, False, "tg_rows"),     # X = h (m x k), read along k
    ("float64", 37, 10, 300, False, "tg_rows"),
    ("float32", 6, 45, 70, False, "tg_cols"),       # a thin m: the transposed product
    ("float32", 29, 16, 700, True, "tg_cols"),      # X = h.T, read along m
])
def test_thin_gemm_kernels_match_numpy(thin_libs, dtype, m, n, k, x_cols, kernel):
    rng = np.random.default_rng(m * n + k)
    X = rng.standard_normal((k, m)).astype(dtype).T if x_cols else \
        rng.standard_normal((m, k)).astype(dtype)
    Y = rng.standard_normal((k, n)).astype(dtype)
    out0 = rng.standard_normal((m, n)).astype(dtype)
    xs, ys = _elems(X), _elems(Y)
    plan = tg.plan_thin(m, n, k, xs, ys, dtype, sms=2)
    assert plan is not None and plan.kernel == kernel
    alpha_dev = np.asarray([-0.5], dtype=dtype)
    ct = ctypes.c_float if dtype == "float32" else ctypes.c_double
    for alpha, beta, alpha_p in ((1.0, 0.0, None), (2.0, 0.25, None), (9.0, 1.0, alpha_dev)):
        out = out0.copy()
        os_ = _elems(out)
        if plan.swap:   # out.T = Y.T @ X.T, as ThinGemm passes it
            args = (n, m, k, _ptr(Y), ys[1], ys[0], _ptr(X), xs[1], xs[0], _ptr(out),
                    os_[1], os_[0])
        else:
            args = (m, n, k, _ptr(X), xs[0], xs[1], _ptr(Y), ys[0], ys[1], _ptr(out),
                    os_[0], os_[1])
        args = [a if isinstance(a, ctypes.c_void_p) else ctypes.c_longlong(a) for a in args]
        getattr(thin_libs[dtype], f"run_{plan.kernel}")(
            ctypes.c_longlong(plan.grid[0]), ctypes.c_longlong(plan.block[0]),
            ctypes.c_longlong(plan.block[1]), *args, ct(alpha),
            _ptr(alpha_p) if alpha_p is not None else ctypes.c_void_p(None), ct(beta),
            ctypes.c_void_p(None))
        a = alpha_p[0] if alpha_p is not None else alpha    # a device alpha wins
        want = a * (X.astype("float64") @ Y.astype("float64")) + beta * out0
        tol = 1e-4 if dtype == "float32" else 1e-11
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.sqrt(k))


@pytest.fixture(scope="module")
def advanced_lib(tmp_path_factory):
    wraps = []
    for dtype in ("float32", "int64", "float16", "bfloat16"):
        t = adv.ADVANCED_DTYPES[dtype]
        for idt, it in adv.INDEX_DTYPES.items():
            params = (f"(const {t} *x, {t} *out, const {it} *idx, long long n, long long row, "
                      f"long long len, unsigned long long *err)")
            name = adv._gather_name(dtype, idt)
            wraps.append(f"EMU_WRAP(run_{name}, {name}, {params}, "
                         f"(x, out, idx, n, row, len, err))")
            for set_ in (True, False):
                name = adv._scatter_name(dtype, idt, set_)
                wraps.append(f"EMU_WRAP(run_{name}, {name}, ({t} *out, const {t} *y, "
                             f"const {it} *idx, long long n, long long row, long long len, "
                             f"unsigned long long *err), (out, y, idx, n, row, len, err))")
    return build(adv.advanced_source(), "\n".join(wraps), tmp_path_factory.mktemp("adv"))


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "bfloat16"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_advanced_indexing_kernels_match_numpy(advanced_lib, dtype, idt):
    """Gathers and sets move the stored bits; increments of the half types are atomicAdd's
    (each sum rounded once, as NumPy's half add rounds it: repeats accumulate in index order
    here, in any order on a GPU, so within an ulp per repeat)."""
    rng = np.random.default_rng(3)
    rows, row = 9, 5
    x = (rng.standard_normal((rows, row)) * 10).astype(dtype)
    idx = np.asarray([3, -1, 0, 3, 8, -9, 3], dtype=idt)     # repeats, negatives
    n = len(idx)
    L = ctypes.c_longlong

    def run(name, a, b, idx):
        err = _error_page()
        getattr(advanced_lib, f"run_{name}")(L(2), L(16), _ONE, _ptr(a), _ptr(b), _ptr(idx),
                                             L(len(idx)), L(row), L(rows), _ptr(err[8:]))
        return err[8:]

    out = np.zeros((n, row), dtype=dtype)
    slot = run(adv._gather_name(dtype, idt), x, out, idx)
    np.testing.assert_array_equal(out, x[idx])
    assert slot[0] == 0
    y = (rng.standard_normal((n, row)) * 10).astype(dtype)
    acc = x.copy()
    run(adv._scatter_name(dtype, idt, False), acc, y, idx)       # inc: repeats accumulate
    want = x.copy()
    np.add.at(want, idx, y)
    tol = {"float16": 3e-3, "bfloat16": 2.4e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(acc.astype("float64"), want.astype("float64"), rtol=tol,
                               atol=tol)
    uniq = np.asarray([4, -2, 0], dtype=idt)
    put = x.copy()
    run(adv._scatter_name(dtype, idt, True), put, y[:3], uniq)
    want = x.copy()
    want[uniq] = y[:3]
    np.testing.assert_array_equal(put, want)
    bad = idx.copy()
    bad[2] = rows                                                # out of range: reported
    out = np.zeros((n, row), dtype=dtype)
    slot = run(adv._gather_name(dtype, idt), x, out, bad)
    assert slot[0] == 1 and slot[1] == rows
    np.testing.assert_array_equal(np.delete(out, 2, axis=0), np.delete(x[idx], 2, axis=0))
