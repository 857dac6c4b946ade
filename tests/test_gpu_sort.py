"""GPU sort, argsort and topk (symgpu/gpu/ops/sort.py): the kernels and the CUB library
compile; the kernels (radix select, NaN fix, ordered keys, gathers) run on the CPU through
tests/emulated_gpu.py with CUB's sort replaced by NumPy; placement on a virtual context; and
on a real GPU, results against the host ops."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.config import config
from symgpu.gpu.ops import sort as gsort
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.runtime.codegen import text
from symgpu.tensor.sort import ScatterAlongAxis, argtopk, topk, topk_and_argtopk

from cuda_on_host import requires_gxx
from emulated_gpu import EmulatedCtx, device_array, emulate_prepared_kernels, host_view
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc

RNG = np.random.default_rng(33)
_CODE_DTYPES = ["float32", "float64", "int32", "int64", "uint32", "uint64"]


# ============================================================================ compile

@requires_nvcc
def test_sort_kernels_compile_for_sm90(tmp_path):
    cubin = compile_for_sm90(gsort.sort_source(), tmp_path)
    for name in (b"topk_hist_float32", b"topk_pick", b"sort_nan_shift_back_float64",
                 b"topk_finish_int64_uint8", b"put_last_float32_int32"):
        assert name in cubin


@requires_nvcc
def test_cub_library_builds_as_a_host_shared_library():
    """Built into the real compiledir (nvcc takes minutes: later runs read the cache)."""
    from symgpu.gpu.runtime.shared_library import compile_shared_library
    path = compile_shared_library(text("sort_lib.cu"), ("-O3",))
    lib = ctypes.CDLL(path)
    assert lib.symgpu_sort and lib.symgpu_sort_error_string
    assert compile_shared_library(text("sort_lib.cu"), ("-O3",)) == path


# ============================================================================ emulated

def _at(ptr: int, count: int, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.frombuffer((ctypes.c_uint8 * (count * dt.itemsize)).from_address(ptr), dt)


def _cub_bits(keys: np.ndarray) -> np.ndarray:
    """CUB's radix order of float keys (sign-bit NaNs first): the twiddled bits."""
    u = keys.view(np.uint32 if keys.itemsize == 4 else np.uint64)
    sign = u.dtype.type(1) << u.dtype.type(8 * keys.itemsize - 1)
    return np.where(u & sign, ~u, u | sign)


def _fake_cub_sort(calls):
    def cub_sort(op, ctx, plans, code, kin, kout, vin, vout, rows, n, descending=False):
        calls.append((code, vin is not None, rows, n, descending))
        dt = _CODE_DTYPES[code]
        keys = _at(kin, rows * n, dt).reshape(rows, n)
        order_keys = _cub_bits(keys) if dt.startswith("float") else keys
        if descending:
            order_keys = ~order_keys
        order = np.argsort(order_keys, axis=1, kind="stable")
        _at(kout, rows * n, dt).reshape(rows, n)[...] = np.take_along_axis(keys, order, 1)
        if vin is not None:
            vals = _at(vin, rows * n, "int64").reshape(rows, n)
            _at(vout, rows * n, "int64").reshape(rows, n)[...] = \
                np.take_along_axis(vals, order, 1)
    return cub_sort


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    emulate_prepared_kernels(monkeypatch, tmp_path, gsort)
    calls: list = []
    monkeypatch.setattr(gsort, "cub_sort", _fake_cub_sort(calls))
    ctx = EmulatedCtx()
    from symgpu.gpu.runtime.array import GpuArray
    monkeypatch.setattr(GpuArray, "fill", lambda self, v: host_view(self).fill(v) or self)
    return ctx, calls


def _values(dtype, shape, ties=False, nans=False):
    if dtype.startswith("int"):
        return RNG.integers(-5 if ties else -1000, 5 if ties else 1000, shape).astype(dtype)
    x = RNG.standard_normal(shape).astype(dtype)
    if ties:
        x = np.round(x * 2) / 2
    if nans:
        flat = x.reshape(-1)
        flat[::7] = np.nan
        flat[3::11] = -np.nan if dtype == "float64" else np.float32(-np.nan)
        flat[5::13] = -0.0
    return x


def _exact(x: np.ndarray) -> np.ndarray:
    """x in a dtype NumPy orders (the half types' values exactly in float32: ml_dtypes'
    bfloat16 has no NaN-aware sort of its own)."""
    return x.astype("float32") if x.dtype.name in ("float16", "bfloat16") else x


_FLOATS = ("float16", "bfloat16", "float32", "float64")


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16",
                                   "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3])
def test_sort_and_argsort_emulated(emulated, dtype, rows):
    """The half types sort as ordered 16-bit keys in uint32 (NaNs last, -0.0 tied)."""
    ctx, calls = emulated
    x = _values(dtype, (rows, 37), ties=True, nans=dtype in _FLOATS)
    gx = device_array(ctx, x)
    got = host_view(gsort.gpu_sort("GpuSort", ctx, {}, gx, 1, False))
    assert got.dtype == dtype
    np.testing.assert_array_equal(_exact(got), np.sort(_exact(x), axis=1))
    idx = host_view(gsort.gpu_sort("GpuArgSort", ctx, {}, gx, 1, True))
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, np.argsort(_exact(x), axis=1, kind="stable"))
    assert calls


@requires_gxx
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_many_rows_of_halves_sort_through_their_own_key_array_emulated(emulated, dtype):
    """A half type's keys are 32-bit, twice its items: they are sorted into an array of
    their own, not into the output (which they would overrun), then turned back into
    values; ties and a NaN as NumPy orders them, topk's largest first with the NaN."""
    ctx, calls = emulated
    x = (np.round(RNG.standard_normal((6, 1500)) * 8) / 8).astype(dtype)
    x[2, 7] = np.nan
    xs = _exact(x)
    gx = device_array(ctx, x)
    got = host_view(gsort.gpu_sort("GpuSort", ctx, {}, gx, 1, False))
    np.testing.assert_array_equal(_exact(got), np.sort(xs, axis=1))
    assert calls[-1][0] == 4                       # CUB sorted uint32 keys
    idx = host_view(gsort.gpu_sort("GpuArgSort", ctx, {}, gx, 1, True))
    np.testing.assert_array_equal(idx, np.argsort(xs, axis=1, kind="stable"))
    top = host_view(gsort.gpu_topk("GpuTopK", ctx, {}, gx, 1, 3, True, True, False,
                                   "int64")[0])
    want = -np.sort(-np.where(np.isnan(xs), np.inf, xs), axis=1)[:, :3]
    want[2, 0] = np.nan
    np.testing.assert_array_equal(_exact(top), want)


@requires_gxx
def test_one_row_float_sort_moves_sign_bit_nans_last_emulated(emulated):
    """Over several blocks: the second pass must not search a row the first blocks write."""
    ctx, _ = emulated
    x = RNG.standard_normal(700).astype("float32")
    x[::9] = np.nan
    x.view(np.uint32)[::18] |= np.uint32(1 << 31)     # sign-bit NaNs: CUB puts them first
    x[5], x[6] = np.inf, -np.inf
    assert np.signbit(x[0]) and np.isnan(x[0])
    got = host_view(gsort.gpu_sort("GpuSort", ctx, {}, device_array(ctx, x), 0, False))
    np.testing.assert_array_equal(got, np.sort(x))


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16",
                                   "bfloat16"])
@pytest.mark.parametrize("kth", [1, 4, -3, 20])
@pytest.mark.parametrize("ordered", [True, False])
def test_topk_radix_select_emulated(emulated, dtype, kth, ordered):
    ctx, _ = emulated
    x = _values(dtype, (3, 20), ties=True, nans=dtype in _FLOATS)
    gx = device_array(ctx, x)
    vals, idx = (host_view(a) for a in gsort.gpu_topk("GpuTopK", ctx, {}, gx, 1, kth, ordered,
                                                      True, True, "int32"))
    x, vals = _exact(x), _exact(vals)
    k = abs(kth)
    assert vals.shape == idx.shape == (3, k) and idx.dtype == np.int32
    np.testing.assert_array_equal(vals, np.take_along_axis(x, idx.astype(np.int64), 1))
    assert all(len(set(r)) == k for r in idx.tolist())
    ref = np.sort(x, axis=1)
    want = ref[:, ::-1][:, :k] if kth > 0 else ref[:, :k]
    got = vals if ordered else (np.sort(vals, 1)[:, ::-1] if kth > 0 else np.sort(vals, 1))
    if kth > 0 and dtype in _FLOATS:             # NaN first among the largest
        want = np.concatenate([np.sort(x, 1)[:, ::-1]], 1)[:, :k]
        nan_first = np.sort(np.where(np.isnan(x), np.inf, x), 1)[:, ::-1][:, :k]
        want = np.where(np.isinf(nan_first) & (nan_first > 0) & np.isnan(want), np.nan, want)
    np.testing.assert_array_equal(got, want)


@requires_gxx
def test_take_and_put_along_last_axis_emulated(emulated):
    ctx, _ = emulated
    v = RNG.standard_normal((4, 9)).astype("float32")
    perm = np.argsort(RNG.standard_normal((4, 9)), axis=1).astype("int64")
    got = host_view(gsort.gpu_along(ctx, "take", device_array(ctx, v),
                                    device_array(ctx, perm), 1, 9))
    np.testing.assert_array_equal(got, np.take_along_axis(v, perm, 1))
    g = RNG.standard_normal((4, 3)).astype("float32")
    idx = perm[:, :3].astype("int32")
    got = host_view(gsort.gpu_along(ctx, "put", device_array(ctx, g), device_array(ctx, idx),
                                    1, 9))
    want = np.zeros((4, 9), "float32")
    np.put_along_axis(want, idx.astype(np.int64), g, 1)
    np.testing.assert_array_equal(got, want)


# ============================================================================ placement

def _graphs():
    x = T.matrix("x")
    cost = (T.sort(x, axis=0) ** 2).sum() + (topk(x, 3) ** 2).sum()
    return x, [T.sort(x, axis=1), T.argsort(x, axis=0), argtopk(x, -2, axis=0),
               *topk_and_argtopk(x, 4), symgpu.grad(cost, x)]


def test_sort_argsort_topk_and_their_grads_are_placed_on_the_gpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, outs = _graphs()
        f = symgpu.function([x], outs)
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert {"GpuSort", "GpuArgSort", "GpuTopK", "GpuPermuteAlongAxis",
                "GpuScatterAlongAxis"} <= names, names
        host = {type(n.op).__name__ for n in cpu_nodes(f.maker.fgraph)}
        assert not host & {"Sort", "ArgSort", "TopKOp", "PermuteAlongAxis",
                           "ScatterAlongAxis"}, host


def test_unsupported_key_dtypes_stay_on_the_host():
    with virtual_context(None):
        x = T.bmatrix("x")
        f = symgpu.function([x], [T.sort(x), topk(x, 2)])
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert {"Sort", "TopKOp"} <= names and not {"GpuSort", "GpuTopK"} & names


def test_scatter_along_axis_on_the_host_and_its_gradient():
    x, idx, gz = T.matrix("x"), T.lmatrix("i"), T.matrix("g")
    out = ScatterAlongAxis(1)(x, idx, gz)
    f = symgpu.function([x, idx, gz], [out, symgpu.grad((out * x).sum(), gz)])
    xv = RNG.standard_normal((3, 5)).astype(config.floatX)
    iv = np.array([[0, 4], [2, 1], [3, 3 - 3]])
    gv = RNG.standard_normal((3, 2)).astype(config.floatX)
    got, ggz = f(xv, iv, gv)
    want = np.zeros_like(xv)
    np.put_along_axis(want, iv, gv, 1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(ggz, np.take_along_axis(xv, iv, 1))


# ============================================================================ real GPU

def _run_both(inputs, outs, values):
    f = symgpu.function(inputs, outs)
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    with on_the_cpu():
        ref = symgpu.function(inputs, outs)
    return f, names, [np.asarray(v) for v in f(*values)], [np.asarray(v) for v in ref(*values)]


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gpu_sort_and_argsort_match_numpy(cuda, dtype, axis):
    x = T.TensorType(dtype, (False,) * 3)("x")
    xv = _values(dtype, (5, 6, 70), ties=True, nans=dtype.startswith("float"))
    _, names, got, _ = _run_both([x], [T.sort(x, axis), T.argsort(x, axis, kind="stable")],
                                 [xv])
    assert {"GpuSort", "GpuArgSort"} <= names, names
    np.testing.assert_array_equal(got[0], np.sort(xv, axis))
    np.testing.assert_array_equal(got[1], np.argsort(xv, axis, kind="stable"))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_gpu_sort_one_long_row_with_nans(cuda, dtype):
    x = T.TensorType(dtype, (False,))("x")
    xv = _values(dtype, (1 << 20,), nans=dtype.startswith("float"))
    if dtype.startswith("float"):
        xv[10] = -np.abs(np.array(np.nan, dtype))   # a sign-bit NaN
        xv.view(np.uint32 if dtype == "float32" else np.uint64)[10] |= \
            np.array(1, xv.view(np.uint32 if dtype == "float32" else np.uint64).dtype) << (
                8 * xv.itemsize - 1)
    _, names, got, _ = _run_both([x], [T.sort(x), T.argsort(x, kind="stable")], [xv])
    assert {"GpuSort", "GpuArgSort"} <= names
    np.testing.assert_array_equal(got[0], np.sort(xv))
    np.testing.assert_array_equal(got[1], np.argsort(xv, kind="stable"))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("kth", [1, 5, -7, 64])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("idx_dtype", ["int64", "int32", "uint16"])
@pytest.mark.parametrize("axis", [0, -1])
def test_gpu_topk_matches_the_host(cuda, dtype, kth, ordered, idx_dtype, axis):
    x = T.TensorType(dtype, (False, False))("x")
    xv = _values(dtype, (80, 70), ties=True, nans=dtype.startswith("float"))
    vals, idx = topk_and_argtopk(x, kth, axis=axis, sorted=ordered, idx_dtype=idx_dtype)
    _, names, got, ref = _run_both([x], [vals, idx], [xv])
    assert "GpuTopK" in names, names
    assert got[1].dtype == np.dtype(idx_dtype) and got[0].shape == ref[0].shape
    np.testing.assert_array_equal(got[0], np.take_along_axis(xv, got[1].astype(np.int64),
                                                              axis))
    s = (lambda a: np.sort(a, axis)) if not ordered else (lambda a: a)
    np.testing.assert_array_equal(s(got[0]), s(ref[0]))


@requires_gpu
def test_gpu_topk_of_a_long_row_and_a_noncontiguous_input(cuda):
    x = T.vector("x", dtype="float32")
    xv = RNG.standard_normal(1 << 22).astype("float32")
    _, names, got, _ = _run_both([x], [topk(x, 100), topk(x[::2], -10, sorted=False)], [xv])
    assert "GpuTopK" in names
    np.testing.assert_array_equal(got[0], np.sort(xv)[::-1][:100])
    np.testing.assert_array_equal(np.sort(got[1]), np.sort(xv[::2])[:10])


@requires_gpu
@pytest.mark.parametrize("axis", [0, 1])
def test_gpu_sort_and_topk_gradients(cuda, axis):
    x = T.matrix("x", dtype="float64")
    xv = RNG.standard_normal((9, 11))
    w = RNG.standard_normal((9, 11))
    cost = (T.sort(x, axis) * w).sum() + (topk(x, -3, axis=axis) ** 2).sum()
    _, names, got, ref = _run_both([x], [symgpu.grad(cost, x)], [xv])
    assert {"GpuPermuteAlongAxis", "GpuScatterAlongAxis"} <= names, names
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
