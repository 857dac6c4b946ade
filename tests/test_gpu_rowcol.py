"""The row/column-broadcast elementwise kernels (issue 34) on a real GPU (``pytest -m gpu``):
a bias add and a layer norm's (x - mean) * rstd * g + b compiled through ``function()`` run
``sg_rowcol_vec_*`` (asserted from the launches), on the GPU, and match NumPy.  The same
kernels are checked thread by thread on the CPU in test_gpu_kernels_emulated_rowcol.py."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import function

RNG = np.random.default_rng(34)


@pytest.fixture
def launched(monkeypatch):
    """The names of the elementwise kernels launched by thunks built in the test."""
    import symgpu.gpu.runtime.codegen.launch as launch
    names: list[str] = []
    load = launch.load_kernels

    def recording(*args, **kwargs):
        kernels = load(*args, **kwargs)
        for name, k in kernels.items():
            go = k.fast_launcher()
            monkeypatch.setattr(k, "fast_launcher", lambda go=go, name=name: (
                lambda *a: (names.append(name), go(*a))))
        return kernels
    monkeypatch.setattr(launch, "load_kernels", recording)
    return names


def _on_gpu(f) -> None:
    ops = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuElemwise" in ops, ops


@requires_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_bias_add_runs_the_row_kernel_on_the_gpu(cuda, launched, dtype):
    x = T.tensor(dtype, broadcastable=(False, False, False), name="x")
    b = T.tensor(dtype, broadcastable=(False,), name="b")
    f = function([x, b], x + b)
    _on_gpu(f)
    hx = RNG.standard_normal((4, 64, 2304)).astype(dtype)
    hb = RNG.standard_normal(2304).astype(dtype)
    got = f(hx, hb)
    assert any(n.startswith("sg_rowcol_vec_") for n in launched), launched
    vt = "float64" if dtype == "float64" else "float32"
    want = (hx.astype(vt) + hb.astype(vt)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(got).astype("float64"), want.astype("float64"))


@requires_gpu
@pytest.mark.parametrize("dtype,C", [("bfloat16", 768), ("float32", 768), ("float32", 50257)])
def test_layer_norm_rows_and_columns_on_the_gpu(cuda, launched, dtype, C):
    """C = 50257 (a vocabulary): C % 4 != 0, the scalar row/column kernel."""
    x = T.tensor(dtype, broadcastable=(False, False, False), name="x")
    m = T.tensor(dtype, broadcastable=(False, False, True), name="mean")
    r = T.tensor(dtype, broadcastable=(False, False, True), name="rstd")
    g = T.tensor(dtype, broadcastable=(False,), name="g")
    b = T.tensor(dtype, broadcastable=(False,), name="b")
    f = function([x, m, r, g, b], (x - m) * r * g + b)
    _on_gpu(f)
    hx = RNG.standard_normal((2, 16, C)).astype(dtype)
    hm = RNG.standard_normal((2, 16, 1)).astype(dtype)
    hr = RNG.uniform(0.5, 2, (2, 16, 1)).astype(dtype)
    hg = RNG.standard_normal(C).astype(dtype)
    hb = RNG.standard_normal(C).astype(dtype)
    got = np.asarray(f(hx, hm, hr, hg, hb)).astype("float64")
    kind = "sg_rowcol_vec_" if C % 4 == 0 else "sg_rowcol_"
    assert any(n.startswith(kind) for n in launched), launched
    f64 = lambda a: a.astype("float64")
    want = (f64(hx) - f64(hm)) * f64(hr) * f64(hg) + f64(hb)
    tol = 3e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
