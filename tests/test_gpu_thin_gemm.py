"""Thin matrix products on our own kernels (symgpu/gpu/ops/thin_gemm.py, codegen/thin_gemm.cu).

On the CPU: which kernel and grid ``plan_thin`` picks (the MLP's 10-wide products among
them), which products it leaves to cuBLAS (the MLP's small-k one among them), and what the GpuDot22/GpuGemm thunks launch
(a fake device records the launches: strides, swapped operands, alpha/beta by value or
address); with nvcc (``nvcc``), that the module compiles for both dtypes and its entry
points are the ones the formats name.  On a GPU (``gpu``): products against NumPy for every
transpose combination and thin side, fp32 and fp64, alpha/beta (host, device, in place,
beta 0 over a NaN output), TF32 mode and CUDA-graph replays through ``function()``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gpu_helpers import (FakeCtx, fake_gpu_array, recording_loader, requires_gpu,
                         requires_nvcc, virtual_context)
from symgpu.config import config
from symgpu.gpu.ops import blas, blaslt, thin_gemm
from symgpu.gpu.ops.thin_gemm import (MAX_K, MIN_K, ROWS_MAX_K, THIN, ThinPlan, plan_thin,
                                      render_thin_gemm, thin_gemm_formats)

VCTX = "thin-gemm-test"
SMS = 132

virtual_ctx = virtual_context(VCTX)


# ============================================================================ planning

def test_the_mlp_products_each_get_one_kernel():
    # h2 (512 x 1024, C order) @ W3 (1024 x 10): W3 in registers, 4 rows of h2 a step
    p = plan_thin(512, 10, 1024, (1024, 1), (10, 1), "float32", SMS)
    assert p == ThinPlan("tg_rows", (128, 1, 1), (256, 1, 1), False)
    # h2.T (1024 x 512, a transposed view) @ d (512 x 10): 8 columns of h2 x 128 lanes down k
    p = plan_thin(1024, 10, 512, (1, 1024), (10, 1), "float32", SMS)
    assert p == ThinPlan("tg_cols", (128, 1, 1), (8, 128, 1), False)
    # d (512 x 10) @ W3.T (10 x 1024): k = 10, nothing thin: cuBLAS's one kernel
    assert plan_thin(512, 1024, 10, (10, 1), (1, 10), "float32", SMS) is None


def test_a_thin_m_is_the_thin_n_of_the_transposed_product():
    # W3.T (10 x 1024) @ h2.T (1024 x 512): out.T = h2 @ W3, whose X (h2) is read along k
    p = plan_thin(10, 512, 1024, (1, 10), (1, 1024), "float32", SMS)
    assert p.kernel == "tg_rows" and p.swap and p.grid == (128, 1, 1)
    # d.T (10 x 512) @ h2 (512 x 1024): out.T = h2.T @ d, X (h2.T) read along m
    p = plan_thin(10, 1024, 512, (1, 10), (1024, 1), "float32", SMS)
    assert p.kernel == "tg_cols" and p.swap and p.grid == (128, 1, 1)


def test_products_left_to_cublas():
    f32 = "float32"
    assert plan_thin(512, 512, 512, (512, 1), (512, 1), f32, SMS) is None    # nothing thin
    assert plan_thin(512, THIN + 1, 8, (8, 1), (17, 1), f32, SMS) is None
    assert plan_thin(512, 10, MAX_K + 1, (1, 512), (10, 1), f32, SMS) is None
    assert plan_thin(512, 10, ROWS_MAX_K + 1, (ROWS_MAX_K + 1, 1), (10, 1), f32, SMS) is None
    assert plan_thin(512, 10, 0, (0, 1), (10, 1), f32, SMS) is None          # k = 0: beta only
    # a short k (the 3-D CNN's dense layer, batch 8): cuBLAS's one kernel is faster
    assert plan_thin(8, 6912, 10, (10, 1), (1, 10), f32, SMS) is None        # d @ W3.T
    assert plan_thin(6912, 10, 8, (1, 6912), (10, 1), f32, SMS) is None      # h.T @ d
    assert plan_thin(6912, 10, MIN_K, (1, 6912), (10, 1), f32, SMS).kernel == "tg_cols"
    assert plan_thin(0, 10, 5, (5, 1), (10, 1), f32, SMS) is None
    assert plan_thin(512, 10, ROWS_MAX_K, (ROWS_MAX_K, 1), (10, 1), f32, SMS).kernel == "tg_rows"
    assert plan_thin(512, 10, MAX_K, (1, 512), (10, 1), f32, SMS).kernel == "tg_cols"
    # a broadcast X (stride 0 along k) and a huge row count: the grid is capped
    p = plan_thin(10 ** 6, 4, 64, (64, 0), (4, 1), f32, SMS)
    assert p.kernel == "tg_rows" and p.grid == (16 * SMS, 1, 1)


def test_float64_reads_along_k_only_and_use_turns_kernels_off(monkeypatch):
    assert plan_thin(512, 10, 1024, (1024, 1), (10, 1), "float64", SMS).kernel == "tg_rows"
    assert plan_thin(1024, 10, 512, (1, 1024), (10, 1), "float64", SMS) is None   # measured
    monkeypatch.setitem(thin_gemm.USE, "tg_cols", ("float32", "float64"))
    p = plan_thin(1024, 10, 512, (1, 1024), (10, 1), "float64", SMS)
    assert p.kernel == "tg_cols" and p.block == (8, 64, 1)                  # registers
    monkeypatch.setitem(thin_gemm.USE, "tg_rows", ())
    assert plan_thin(512, 10, 1024, (1024, 1), (10, 1), "float32", SMS) is None
    assert plan_thin(1024, 10, 512, (1, 1024), (10, 1), "float32", SMS).kernel == "tg_cols"


# ============================================================================ thunks (fake device)

class _NoCublas:
    """Fails the test if a product reaches classic cuBLAS."""

    def handle(self, ctx):
        return None

    def math_mode(self, h, mode):
        pass

    def pointer_mode(self, h, mode):
        pass

    check = staticmethod(blas._Cublas.check)
    gemm = {"float32": None, "float64": None}


@pytest.fixture
def fake(monkeypatch):
    """(ctx, kernel launches, cuBLASLt calls): GEMM thunks on a fake context whose kernels
    record their launches; cuBLASLt recorded."""
    import symgpu.gpu.runtime.codegen.launch as launch
    calls, lt_calls = [], []
    monkeypatch.setattr(launch, "load_kernels", recording_loader(calls))
    monkeypatch.setattr(launch, "sm_count", lambda c: SMS)
    monkeypatch.setattr(blas, "_cublas", _NoCublas())
    monkeypatch.setattr(blaslt, "lt_available", lambda dtype: True)
    monkeypatch.setattr(blaslt, "lt_matmul", lambda ctx, p, *a: lt_calls.append(p))
    return FakeCtx(), calls, lt_calls


def _gvar(bcast=(False, False), dtype="float32"):
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType(dtype, bcast, VCTX)()


def _thunk(node, values, ctx):
    storage = {v: [x] for v, x in zip(node.inputs, values)}
    for v in node.inputs:
        storage.setdefault(v, [None])
        if getattr(v, "data", None) is not None:
            storage[v] = [v.data]
    storage.update({v: [None] for v in node.outputs})
    return node.op._thunk(node, storage, ctx), storage


def test_dot22_thunk_launches_the_thin_kernels_with_element_strides(fake):
    ctx, calls, lt_calls = fake
    node = blas.GpuDot22()(_gvar(), _gvar()).owner
    h = fake_gpu_array(ctx, (512, 1024))
    w = fake_gpu_array(ctx, (1024, 10))
    thunk, storage = _thunk(node, [h, w], ctx)
    thunk()
    name, grid, block, args = calls[-1]
    out = storage[node.outputs[0]][0]
    assert name == "tg_rows" and grid == (128, 1, 1) and out.shape == (512, 10)
    assert args == (512, 10, 1024, h.ptr, 1024, 1, w.ptr, 10, 1, out.ptr, 10, 1,
                    1.0, 0, 0.0, 0)
    hT = h.transpose()                                   # (1024 x 512), strides (1, 1024)
    d = fake_gpu_array(ctx, (512, 10))
    storage[node.inputs[0]][0], storage[node.inputs[1]][0] = hT, d
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "tg_cols" and block == (8, 128, 1) and args[3:9] == (h.ptr, 1, 1024,
                                                                           d.ptr, 10, 1)
    wT = w.transpose()                                   # (10 x 1024): k = 10, cuBLAS's
    storage[node.inputs[0]][0], storage[node.inputs[1]][0] = d, wT
    n = len(calls)
    thunk()
    assert len(calls) == n and len(lt_calls) == 1
    assert storage[node.outputs[0]][0].shape == (512, 1024)
    storage[node.inputs[0]][0], storage[node.inputs[1]][0] = wT, hT   # m = 10: swapped
    thunk()
    name, grid, block, args = calls[-1]
    out = storage[node.outputs[0]][0]
    assert name == "tg_rows" and out.shape == (10, 512)
    # out.T (512 x 10) = h2 @ W3: X = hT.T = h (1024, 1), Y = wT.T = w (10, 1), out.T (1, 512)
    assert args[:12] == (512, 10, 1024, h.ptr, 1024, 1, w.ptr, 10, 1, out.ptr, 1, 512)
    n = len(calls)
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (64, 64))     # nothing thin: cuBLASLt
    storage[node.inputs[1]][0] = fake_gpu_array(ctx, (64, 64))
    thunk()
    assert len(calls) == n and len(lt_calls) == 2


def test_gemm_thunk_passes_alpha_and_beta_by_value_or_address(fake):
    from symgpu.tensor.type import TensorType
    ctx, calls, _ = fake
    z, x, y = (fake_gpu_array(ctx, s) for s in ((600, 8), (600, 300), (300, 8)))
    node = blas.GpuGemm(True)(_gvar(), -0.5, _gvar(), _gvar(), 1.0).owner
    thunk, storage = _thunk(node, [z, None, x, y, None], ctx)
    thunk()
    name, _, _, args = calls[-1]
    assert storage[node.outputs[0]][0] is z and args[9] == z.ptr
    assert name == "tg_rows" and args[12:] == (-0.5, 0, 1.0, 0)
    alpha_h, beta_d = TensorType("float32", ())(), _gvar(())
    node = blas.GpuGemm(True)(_gvar(), alpha_h, _gvar(), _gvar(), beta_d).owner
    b = fake_gpu_array(ctx, ())
    thunk, storage = _thunk(node, [z, np.asarray(2.0, "float32"), x, y, b], ctx)
    thunk()
    assert calls[-1][3][12:] == (2.0, 0, 0.0, b.ptr)     # the kernel reads beta itself


def test_knob_sends_every_product_to_cublas(fake, monkeypatch):
    ctx, calls, lt_calls = fake
    monkeypatch.setattr(thin_gemm, "ENABLED", False)
    node = blas.GpuDot22()(_gvar(), _gvar()).owner
    thunk, _ = _thunk(node, [fake_gpu_array(ctx, (512, 1024)), fake_gpu_array(ctx, (1024, 10))],
                      ctx)
    thunk()
    assert not calls and len(lt_calls) == 1
    assert blas.GpuDot22().prefetch_sources(node) == []


def test_prefetch_names_the_module_the_thunk_loads():
    node = blas.GpuDot22()(_gvar(dtype="float64"), _gvar(dtype="float64")).owner
    (key, factory, options), = node.op.prefetch_sources(node)
    assert key == ("symgpu.thin_gemm", "float64") and "typedef double T;" in factory()


# ============================================================================ nvcc

@requires_nvcc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_module_compiles_and_defines_the_formatted_kernels(dtype, tmp_path):
    from gpu_helpers import compile_for_sm90
    src = render_thin_gemm(dtype)
    defined = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?'
                             r'(tg_\w+)\(', src))
    assert defined == set(thin_gemm_formats(dtype))
    assert compile_for_sm90(src, tmp_path)


# ============================================================================ on a GPU

GPU_CTX = "thin-gemm-gpu"
RNG = np.random.default_rng(2024)


@pytest.fixture(scope="module")
def gpu_ctx():
    from symgpu.gpu.runtime import context as gctx
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(GPU_CTX, c)
    yield c
    gctx.unregister_context(GPU_CTX)


def _gv(dtype, bcast=(False, False)):
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType(dtype, bcast, GPU_CTX)()


def _dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.ascontiguousarray(a), get_context(GPU_CTX))


def _layout(host, order):
    """A device matrix equal to ``host``: C order, F order (a transposed view), or every
    other column of a wider array (a strided view)."""
    if order == "c":
        return _dev(host)
    if order == "f":
        return _dev(host.T).transpose()
    wide = np.repeat(host, 2, axis=1)
    return _dev(wide)[:, ::2]


def _link(out, inputs, values):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, [out], clone=False)
    storage = {v: [x] for v, x in zip(inputs, values)}
    vm = link(fg, storage)
    return vm, storage, fg.outputs[0]


def _close(got, want, dtype):
    tol = 2e-5 if dtype == "float32" else 1e-12
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


SHAPES = [(512, 1024, 10), (1024, 512, 10), (512, 10, 1024), (10, 1024, 512), (10, 512, 1024),
          (7, 33, 5), (1000, 4096, 16), (333, 2000, 1), (1, 700, 300), (129, 16, 130),
          (600, 17, 3), (1, 1, 1), (70, 3, 2)]


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_dot22_matches_numpy_for_every_layout(gpu_ctx, dtype, m, k, n):
    hx, hy = RNG.standard_normal((m, k)).astype(dtype), RNG.standard_normal((k, n)).astype(dtype)
    want = hx.astype("float64") @ hy.astype("float64")
    x, y = _gv(dtype), _gv(dtype)
    for xo in ("c", "f", "s"):
        for yo in ("c", "f", "s"):
            vm, storage, out = _link(blas.GpuDot22()(x, y), [x, y],
                                     [_layout(hx, xo), _layout(hy, yo)])
            vm()
            _close(np.asarray(storage[out][0]), want, dtype)


@requires_gpu
def test_the_thin_kernels_really_ran(gpu_ctx, monkeypatch):
    """The MLP's thin products went through plans of ours; its small-k one, d @ W3.T, to
    cuBLAS (declined)."""
    seen = []
    real = thin_gemm.ThinGemm.__call__

    def spy(self, x, y, out, alpha, beta):
        ran = real(self, x, y, out, alpha, beta)
        seen.append((self.plan(x, y, out)[1].kernel if ran else None))
        return ran
    monkeypatch.setattr(thin_gemm.ThinGemm, "__call__", spy)
    h, w, d = (RNG.standard_normal(s).astype("float32") for s in ((512, 1024), (1024, 10),
                                                                    (512, 10)))
    x, y = _gv("float32"), _gv("float32")
    for a, b in ((h, w), (h.T, d), (d, w.T)):
        vm, storage, out = _link(blas.GpuDot22()(x, y), [x, y],
                                 [_layout(a, "f" if a.base is not None else "c"),
                                  _layout(b, "f" if b.base is not None else "c")])
        vm()
        _close(np.asarray(storage[out][0]), a.astype("float64") @ b, "float32")
    assert seen == ["tg_rows", "tg_cols", None]


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,k,n", [(512, 1024, 10), (300, 7, 900), (12, 800, 640)])
def test_gemm_alpha_beta_in_place_and_device_scalars(gpu_ctx, dtype, m, k, n):
    from symgpu.tensor.type import TensorType
    hz, hx, hy = (RNG.standard_normal(s).astype(dtype) for s in ((m, n), (m, k), (k, n)))
    want = -2.0 * hz.astype("float64") + 0.5 * (hx.astype("float64") @ hy)
    for inplace in (False, True):
        z, x, y = _gv(dtype), _gv(dtype), _gv(dtype)
        alpha_h, beta_d = TensorType(dtype, ())(), _gv(dtype, ())
        out = blas.GpuGemm(inplace)(z, alpha_h, x, y, beta_d)
        gz = _dev(hz)
        vm, storage, o = _link(out, [z, alpha_h, x, y, beta_d],
                               [gz, np.asarray(0.5, dtype), _layout(hx, "f"), _dev(hy),
                                _dev(np.asarray(-2.0, dtype))])
        vm()
        _close(np.asarray(storage[o][0]), want, dtype)
        assert (storage[o][0] is gz) == inplace


@requires_gpu
def test_beta_zero_never_reads_the_output_and_a_broadcast_z_adds(gpu_ctx):
    hx, hy = RNG.standard_normal((256, 64)).astype("float32"), \
        RNG.standard_normal((64, 4)).astype("float32")
    z, x, y = _gv("float32"), _gv("float32"), _gv("float32")
    vm, storage, o = _link(blas.GpuGemm(True)(z, 1.0, x, y, 0.0), [z, x, y],
                           [_dev(np.full((256, 4), np.nan, "float32")), _dev(hx), _dev(hy)])
    vm()
    _close(np.asarray(storage[o][0]), hx.astype("float64") @ hy, "float32")
    zb = _gv("float32", (True, False))
    hz = RNG.standard_normal((1, 4)).astype("float32")
    vm, storage, o = _link(blas.GpuGemm(False)(zb, 1.0, x, y, 1.0), [zb, x, y],
                           [_dev(hz), _dev(hx), _dev(hy)])
    vm()
    _close(np.asarray(storage[o][0]), hz + hx.astype("float64") @ hy, "float32")


@requires_gpu
def test_tf32_mode_keeps_thin_products_at_float32_accuracy_and_bits_repeat(gpu_ctx):
    hx, hy = RNG.standard_normal((512, 1024)).astype("float32"), \
        RNG.standard_normal((1024, 10)).astype("float32")
    x, y = _gv("float32"), _gv("float32")
    with config.change_flags(**{"gpuarray.allow_tf32": True}):
        vm, storage, o = _link(blas.GpuDot22()(x, y), [x, y], [_dev(hx), _dev(hy)])
    vm()
    first = np.asarray(storage[o][0]).copy()
    _close(first, hx.astype("float64") @ hy, "float32")      # TF32 would miss by ~1e-3
    for _ in range(3):
        vm()
        assert np.array_equal(np.asarray(storage[o][0]), first)   # the same bits each call


@requires_gpu
def test_mlp_products_replayed_from_a_cuda_graph(gpu_ctx):
    """Through function() (placement, graphs): the three thin products of an MLP layer's
    forward and backward, called again with new values (graph replays)."""
    import symgpu.tensor as T
    from gpu_helpers import real_default_gpu
    from symgpu import function
    with real_default_gpu():
        h, w, d = T.fmatrix("h"), T.fmatrix("w"), T.fmatrix("d")
        f = function([h, w, d], [T.dot(h, w), T.dot(h.T, d), T.dot(d, w.T)])
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert "GpuDot22" in names and "Dot22" not in names, names
        for _ in range(3):
            hv, wv, dv = (RNG.standard_normal(s).astype("float32")
                          for s in ((512, 1024), (1024, 10), (512, 10)))
            a, b, c = f(hv, wv, dv)
            _close(np.asarray(a), hv.astype("float64") @ wv, "float32")
            _close(np.asarray(b), hv.T.astype("float64") @ dv, "float32")
            _close(np.asarray(c), dv.astype("float64") @ wv.T, "float32")
