"""symgpu's warp- and block-level CUDA kernels run on the CPU (tests/cuda_on_host.py: every
thread a fiber, barriers and shuffles honoured) against NumPy: the softmax rows kernels (a
warp per row and a block per row, float32 and float64, strided input, NaN rows) and the
negative log-likelihood gradient (labels checked and reported), without a GPU."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuda_on_host import build, requires_gxx
from symgpu.gpu.ops import nll_grad as ng
from symgpu.gpu.ops import softmax_rows as sr

pytestmark = requires_gxx

_CT = {"float32": "float", "float64": "double"}


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(scope="module")
def softmax_lib(tmp_path_factory):
    wraps = []
    for dtype, t in _CT.items():
        for log in (False, True):
            for wide in (False, True):
                name = sr._kernel_name(dtype, log, wide)
                wraps.append(f"EMU_WRAP(run_{name}, {name}, (const {t} *x, long long xs0, "
                             f"long long xs1, {t} *out, long long rows, long long n), "
                             f"(x, xs0, xs1, out, rows, n))")
    return build(sr.softmax_rows_source(), "\n".join(wraps), tmp_path_factory.mktemp("sr"))


def _softmax_ref(x: np.ndarray, log: bool) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return (x - m) - np.log(s) if log else e / s


@pytest.mark.parametrize("dtype", ["float32", "float64"])
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
    getattr(softmax_lib, f"run_{name}")(ctypes.c_longlong(grid), ctypes.c_longlong(block),
                                        _ptr(base), ctypes.c_longlong(x.strides[0] // it),
                                        ctypes.c_longlong(x.strides[1] // it), _ptr(out),
                                        ctypes.c_longlong(rows), ctypes.c_longlong(n))
    want = _softmax_ref(x.astype("float64"), log)
    tol = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def nll_lib(tmp_path_factory):
    wraps = []
    for dtype, t in ng.NLL_GRAD_DTYPES.items():
        for idt, it in ng.INDEX_DTYPES.items():
            name = ng._kernel_name(dtype, idt)
            wraps.append(
                f"EMU_WRAP(run_{name}, {name}, (const {t} *v, long long vs, const {t} *m, "
                f"long long ms0, long long ms1, const {it} *y, long long ys, {t} *out, "
                f"long long rows, long long cols, long long labelled, "
                f"unsigned long long *err), (v, vs, m, ms0, ms1, y, ys, out, rows, cols, "
                f"labelled, err))")
    return build(ng.nll_grad_source(), "\n".join(wraps), tmp_path_factory.mktemp("nll"))


def _error_page() -> np.ndarray:
    """A zeroed 4096-byte-aligned page of uint64 (report() also writes its page's first word)."""
    raw = np.zeros(2 * 512, dtype=np.uint64)
    start = (-raw.ctypes.data % 4096) // 8
    return raw[start:start + 512]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_nll_grad_kernel_matches_numpy_and_reports_a_bad_label(nll_lib, dtype, idt):
    rows, cols, labelled = 37, 10, 30
    rng = np.random.default_rng(5)
    m = rng.random((rows, cols)).astype(dtype)
    v = np.asarray([-1.0 / labelled], dtype=dtype)           # broadcast (stride 0)
    y = rng.integers(-cols, cols, rows).astype(idt)           # negative labels count from the end
    name = ng._kernel_name(dtype, idt)
    run = getattr(nll_lib, f"run_{name}")

    def launch(y, grid):
        out = np.full((rows, cols), 99.0, dtype=dtype)
        err = _error_page()
        slot = err[8:]                                        # a slot inside the page
        run(ctypes.c_longlong(grid), ctypes.c_longlong(64), _ptr(v), ctypes.c_longlong(0),
            _ptr(m), ctypes.c_longlong(cols), ctypes.c_longlong(1), _ptr(y),
            ctypes.c_longlong(1), _ptr(out), ctypes.c_longlong(rows), ctypes.c_longlong(cols),
            ctypes.c_longlong(labelled), _ptr(slot))
        return out, err, slot

    tol = dict(rtol=1e-5, atol=1e-7) if dtype == "float32" else dict(rtol=1e-12, atol=0)
    out, err, slot = launch(y, grid=2)                        # 2 x 64 threads stride over 370
    g = np.zeros((rows, cols))
    g[np.arange(labelled), y[:labelled] % cols] = v[0]
    want = g - m * g.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, want, **tol)
    assert slot[0] == 0 and err[0] == 0
    bad = y.copy()
    bad[4] = cols + 3
    out, err, slot = launch(bad, grid=1)
    assert slot[0] == 1 and slot[1] == cols + 3 and err[0] == 1   # reported, page flagged
    np.testing.assert_allclose(out[4], 0.0 - m[4] * 0.0)      # the row gets no one-hot term
    np.testing.assert_allclose(np.delete(out, 4, axis=0), np.delete(want, 4, axis=0), **tol)
