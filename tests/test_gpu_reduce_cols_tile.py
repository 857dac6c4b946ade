"""GpuCAReduce's column-tile kernel (reduce.cu's sg_cols_tile, issue 34): the bias gradients
of a transformer step, ``d.sum(0)`` of a tall (8192, 768..3072) activation, as one launch
reading 4 adjacent columns per thread and access, not a split of scalar loads plus a finish.

On the CPU: which layouts take it (a fake device records launches) and which keep their paths;
the kernel run on the host emulator (tests/emulated_gpu.py) against NumPy in float32, float16
and bfloat16, widths that are not multiples of 4, misaligned views, one row, one column,
broadcast operands, fused pre-ops, leading axes collapsing to this layout, the last block's
combination of row tiles (and its counters left at zero); (``nvcc``) the modules compile for
sm_90.  On a GPU (``gpu``): the same against the CPU's answer, the kernel's use asserted.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from gpu_helpers import (compile_for_sm90, fake_gpu_array, fake_reduce_device,
                         gpu_vector_maker, on_the_cpu, requires_nvcc, thunk_over,
                         virtual_context)
from symgpu.gpu.ops.elemwise import GpuCAReduce, _ReduceThunk
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen.layout import cols_tile_grid
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, render_reduce
from symgpu.scalar.basic import SCALAR_OPS as S

CTX = "reduce-cols-tile-test"
SMS = 132

virtual_ctx = virtual_context(CTX)
gvar = gpu_vector_maker(CTX)


# ============================================================================ planning

@pytest.fixture
def fake_device(monkeypatch):
    return fake_reduce_device(monkeypatch, SMS)


def _launches(ctx, calls, arr, axis=(0,), op="add", pre=None, dtype=None):
    nd = len(arr.shape)
    node = GpuCAReduce(S[op], axis, None, pre)(gvar(dtype or arr.dtype.name, (False,) * nd)).owner
    thunk, storage = thunk_over(node, [arr])
    calls.clear()
    thunk()
    return list(calls), storage[node.outputs[0]][0]


def test_cols_tile_grid_fills_a_wave_with_lanes_of_eight_rows_or_more():
    # 18 tiles of 128 columns: 59 row tiles of 139 rows (1062 blocks of 256: 8 per SM)
    assert cols_tile_grid(2304, 8192, 4, SMS, 8) == ((18, 59, 1), 59, 139)
    # 6 tiles: lanes of 8 rows cap the split at 128 row tiles of 64 rows
    assert cols_tile_grid(768, 8192, 4, SMS, 8) == ((6, 128, 1), 128, 64)
    # enough columns to fill the GPU: one pass, no partials
    assert cols_tile_grid(200000, 4096, 4, SMS, 8)[1] == 1
    assert cols_tile_grid(400000, 4096, 4, SMS, 8)[0][0] == 16 * SMS   # (3125 tiles)
    assert cols_tile_grid(1, 1, 4, SMS, 8) == ((1, 1, 1), 1, 1)
    grid, g, chunk = cols_tile_grid(1000, 3001, 2, SMS, 8)
    assert (g - 1) * chunk < 3001 <= g * chunk and grid == (16, g, 1)


def test_bias_gradients_of_tall_activations_are_one_tile_launch(fake_device):
    ctx, calls = fake_device
    (call,), out = _launches(ctx, calls, fake_gpu_array(ctx, (8192, 2304)))
    name, grid, block, args = call
    assert name == "sg_cols_tile" and grid == (18, 59, 1) and block == (32, 8, 1)
    assert args[:3] == (2304, 8192, 139) and out.shape == (2304,)
    assert args[-1] != 0 and args[-2] != 0        # partials and the one-pass counters
    # bfloat16 summed into float32 (the mixed-precision step's pre=Cast{float32})
    from symgpu.scalar.basic import Cast
    (call,), out = _launches(ctx, calls, fake_gpu_array(ctx, (8192, 768), "bfloat16"),
                             pre=Cast("float32"))
    assert call[0] == "sg_cols_tile" and call[1] == (6, 128, 1) and out.dtype == "float32"
    # (B, S, C) over its two leading axes collapses to the same (R, C) layout
    (call,), out = _launches(ctx, calls, fake_gpu_array(ctx, (8, 1024, 3072), "bfloat16"),
                             axis=(0, 1))
    assert call[0] == "sg_cols_tile" and call[3][:2] == (3072, 8192) and out.shape == (3072,)
    # a width that is not a multiple of 4 and a view one column in: the same kernel (it
    # checks alignment itself); max too
    (call,), _ = _launches(ctx, calls, fake_gpu_array(ctx, (5000, 1030))[:, 1:],
                           op="maximum")
    assert call[0] == "sg_cols_tile" and call[3][0] == 1029


def _stat_times_grad(stat_first=True):
    """sum(stat * dy, axis=(0, 1)) as a mixed-precision layer norm's gain gradient fuses it:
    a per-row float32 statistic (B, S, 1) beside the (B, S, C) bfloat16 gradient."""
    stat = GpuArrayType("float32", (False, False, True), None)()
    dy = _gv("bfloat16", 3)
    ins = [stat, dy] if stat_first else [dy, stat]
    return GpuCAReduce(S["add"], (0, 1), None, S["mul"])(*ins).owner


def test_a_broadcast_first_operand_does_not_choose_the_walk(fake_device):
    """The walk follows the operand with the most values: following the (B, S, 1) statistic
    read first made this a row reduction striding through the gradient (the GPT step's
    gain gradients took 95 us each in sg_rows_onepass instead of one column tile)."""
    ctx, calls = fake_device
    for stat_first in (True, False):
        node = _stat_times_grad(stat_first)
        stat = fake_gpu_array(ctx, (8, 1024, 1))
        dy = fake_gpu_array(ctx, (8, 1024, 768), "bfloat16")
        thunk, storage = thunk_over(node, [stat, dy] if stat_first else [dy, stat])
        calls.clear()
        thunk()
        assert [c[0] for c in calls] == ["sg_cols_tile"]
        assert calls[0][3][:2] == (768, 8192) and storage[node.outputs[0]][0].shape == (768,)


def test_other_layouts_keep_their_paths(fake_device, monkeypatch):
    ctx, calls = fake_device
    tall = _ReduceThunk.COLS_BLOCK_ROWS_PER_LANE * 128 + 1
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (tall, 64)))     # few columns
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (512, 1024)))   # moderate height
    assert [c[0] for c in got] == ["sg_cols_block"]
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (8192, 4096))[:, ::2])   # strided
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (64, 40000)))     # no split: final
    assert [c[0] for c in got] == ["sg_cols_final"]
    # reduced axes that do not collapse to one (axes 0 and 2 of a 3-d array): other kernels
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (4, 8192, 300)), axis=(0, 2))
    assert "sg_cols_tile" not in [c[0] for c in got]
    monkeypatch.setattr(_ReduceThunk, "COLS_TILE", False)
    got, _ = _launches(ctx, calls, fake_gpu_array(ctx, (8192, 2304)))
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]


def test_the_module_renders_the_tile_kernel_with_its_column_width():
    src = render_reduce(ReduceSignature("add", None, ("bfloat16",), "bfloat16", 1, 1))
    assert "#define SG_CV 4" in src and "sg_cols_tile(SG_ARGS)" in src
    assert "struct sg_craw { __nv_bfloat16 x0[SG_CV]; };" in src
    src = render_reduce(ReduceSignature("add", S["mul"], ("float32", "float64"), "float64", 1, 1))
    assert "#define SG_CV 2" in src
    assert "m.rstride[1][0] % SG_CV != 0" in src


# ============================================================================ host emulator

@pytest.fixture
def emu(monkeypatch, tmp_path):
    from emulated_gpu import emulated_kernel_device
    import symgpu.gpu.runtime.codegen.launch as launch
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(launch, "sm_count", lambda c: 2)   # small grids: few host threads
    return ctx


def _gv(dtype, ndim):
    return GpuArrayType(dtype, (False,) * ndim, None)()


def _offset_view(ctx, host, elements):
    """A GpuArray of ``host``'s values starting ``elements`` items past an aligned block."""
    from emulated_gpu import device_array
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    raw = device_array(ctx, np.concatenate([np.zeros(elements, host.dtype), host.ravel()]))
    a = GpuArray.__new__(GpuArray)
    a._set(ctx, raw.ptr + elements * host.itemsize, host.shape,
           c_strides(host.shape, host.itemsize), host.dtype, raw)
    return a


_RTOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3, "float64": 1e-12}


def _check(got, want, dtype):
    got = np.asarray(got).astype("float64")
    np.testing.assert_allclose(got, want, rtol=_RTOL[dtype], atol=_RTOL[dtype])


def _run_thunk(node, values):
    from emulated_gpu import host_view
    thunk, storage = thunk_over(node, values)
    thunk()
    return host_view(storage[node.outputs[0]][0]).copy(), thunk, storage


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,offset,width", [
    ((700, 256), 0, 256),    # every thread's 4 columns one access a row
    ((700, 260), 0, 258),    # a view 258 wide of rows 260 apart: the last 2 columns scalar
    ((700, 260), 1, 260),    # one element off 8/16 bytes: every thread's scalar loop
    ((650, 130), 0, 130),    # rows 130 apart (not a multiple of 4): the scalar loop
])
def test_column_sums_match_numpy(emu, dtype, shape, offset, width):
    from emulated_gpu import device_array, host_view
    rng = np.random.default_rng(shape[1] + offset + width)
    full = rng.uniform(-1, 1, shape).astype(dtype)
    host = full[:, :width]
    node = GpuCAReduce(S["add"], (0,))(_gv(dtype, 2)).owner
    a = _offset_view(emu, full, offset) if offset else device_array(emu, full)
    got, thunk, storage = _run_thunk(node, [a[:, :width] if width < shape[1] else a])
    (plan,) = thunk.reduce_thunk.plans.values()
    assert plan[0].kernel == "sg_cols_tile" and plan[0].G > 1
    want = host.astype("float64").sum(0)
    assert got.dtype == dtype
    _check(got, want, dtype)
    thunk()        # again: the last block left its counters at zero, the same bits
    assert not host_view(thunk.reduce_thunk.counters).any()
    np.testing.assert_array_equal(host_view(storage[node.outputs[0]][0]), got)


@requires_gxx
def test_half_sums_accumulate_in_float32_and_a_cast_pre_op(emu):
    from emulated_gpu import device_array
    from symgpu.scalar.basic import Cast
    ones = np.ones((1030, 200), "bfloat16")         # 1030 rows: a bfloat16 sum stalls at 256
    node = GpuCAReduce(S["add"], (0,))(_gv("bfloat16", 2)).owner
    got, _, _ = _run_thunk(node, [device_array(emu, ones)])
    np.testing.assert_array_equal(got.astype("float64"), np.full(200, 1030.0).astype(
        "bfloat16").astype("float64"))
    rng = np.random.default_rng(3)
    host = rng.uniform(-1, 1, (900, 300)).astype("bfloat16")
    node = GpuCAReduce(S["add"], (0,), None, Cast("float32"))(_gv("bfloat16", 2)).owner
    got, thunk, _ = _run_thunk(node, [device_array(emu, host)])
    assert got.dtype == "float32"
    assert [p[0].kernel for p in thunk.reduce_thunk.plans.values()] == ["sg_cols_tile"]
    np.testing.assert_allclose(got, host.astype("float64").sum(0), rtol=1e-5, atol=1e-4)


@requires_gxx
def test_two_operand_pre_op_broadcast_rows_and_maximum(emu):
    """sum(dy * xhat, axis=0) (a layer norm's gain gradient) with one operand float32 and one
    bfloat16; an operand broadcast along rows (stride 0 between rows); max with a NaN."""
    from emulated_gpu import device_array
    rng = np.random.default_rng(5)
    dy = rng.uniform(-1, 1, (640, 256)).astype("bfloat16")
    xh = rng.uniform(-1, 1, (640, 256)).astype("float32")
    node = GpuCAReduce(S["add"], (0,), None, S["mul"])(_gv("bfloat16", 2),
                                                       _gv("float32", 2)).owner
    got, _, _ = _run_thunk(node, [device_array(emu, dy), device_array(emu, xh)])
    np.testing.assert_allclose(got, (dy.astype("float64") * xh).sum(0), rtol=1e-5, atol=1e-4)
    row = rng.uniform(-1, 1, (1, 256)).astype("float32")
    node = GpuCAReduce(S["add"], (0,), None, S["mul"])(
        _gv("float32", 2), GpuArrayType("float32", (True, False), None)()).owner
    got, _, _ = _run_thunk(node, [device_array(emu, xh), device_array(emu, row)])
    np.testing.assert_allclose(got, (xh.astype("float64") * row).sum(0), rtol=1e-5, atol=1e-4)
    xh[100, 7] = np.nan
    node = GpuCAReduce(S["maximum"], (0,))(_gv("float32", 2)).owner
    got, _, _ = _run_thunk(node, [device_array(emu, xh)])
    want = xh.max(0)
    assert np.isnan(got[7]) and np.array_equal(np.delete(got, 7), np.delete(want, 7))


@requires_gxx
def test_a_per_row_statistic_read_first_sums_by_columns(emu):
    from emulated_gpu import device_array
    rng = np.random.default_rng(9)
    stat = rng.uniform(-1, 1, (4, 300, 1)).astype("float32")
    dy = rng.uniform(-1, 1, (4, 300, 132)).astype("bfloat16")
    got, thunk, _ = _run_thunk(_stat_times_grad(), [device_array(emu, stat),
                                                    device_array(emu, dy)])
    (plan,) = thunk.reduce_thunk.plans.values()
    assert (plan[0].K, plan[0].R, plan[0].kernel) == (132, 1200, "sg_cols_tile")
    np.testing.assert_allclose(got, (stat * dy.astype("float64")).sum((0, 1)),
                               rtol=1e-5, atol=1e-4)


@requires_gxx
def test_leading_axes_of_three_dims_and_float64(emu):
    from emulated_gpu import device_array
    rng = np.random.default_rng(8)
    host = rng.uniform(-1, 1, (4, 200, 131)).astype("float64")
    node = GpuCAReduce(S["add"], (0, 1))(_gv("float64", 3)).owner
    got, thunk, _ = _run_thunk(node, [device_array(emu, host)])
    (plan,) = thunk.reduce_thunk.plans.values()
    assert (plan[0].K, plan[0].R, plan[0].kernel) == (131, 800, "sg_cols_tile")
    np.testing.assert_allclose(got, host.sum((0, 1)), rtol=1e-12, atol=1e-12)


@requires_gxx
def test_a_bias_update_epilogue_written_into_its_variable(emu):
    """b - lr * d.sum(0) through the reduction's epilogue (gpu_careduce_epilogue), stored by
    the last block of each column tile, into the bias's own buffer (write_into)."""
    from emulated_gpu import device_array, host_view
    from symgpu.scalar.composite import CompositeBuilder
    rng = np.random.default_rng(11)
    d = rng.standard_normal((1500, 260)).astype("float32")
    bias = rng.standard_normal(260).astype("float32")
    b = CompositeBuilder()
    db, bb = b.add_input("float32"), b.add_input("float32")
    post = b.build(b.add_op(S["sub"], [bb, b.add_op(S["mul"], [b.add_constant(0.02, "float32"),
                                                                db])[0]]))
    node = GpuCAReduce(S["add"], (0,), None, None, post)(_gv("float32", 2),
                                                           _gv("float32", 1)).owner
    b_dev = device_array(emu, bias)
    thunk, storage = thunk_over(node, [device_array(emu, d), b_dev])
    thunk.write_into[0] = b_dev
    thunk()
    (plan,) = thunk.reduce_thunk.plans.values()
    assert plan[0].kernel == "sg_cols_tile" and plan[0].G > 1
    assert storage[node.outputs[0]][0] is b_dev
    want = bias - np.float32(0.02) * d.sum(0, dtype="float64").astype("float32")
    np.testing.assert_allclose(host_view(b_dev), want, rtol=1e-5, atol=1e-5)


@requires_gxx
@pytest.mark.parametrize("shape,G", [((1, 300), 1), ((37, 1), 1), ((37, 1), 4), ((1, 5), 1),
                                     ((9, 130), 3), ((300, 4), 7)])
def test_the_kernel_at_edge_shapes(emu, shape, G):
    """One row, one column, fewer rows than row tiles, a tile wider than the array: the kernel
    launched directly (the planner gives such shapes other kernels)."""
    from emulated_gpu import device_array, host_view
    from symgpu.gpu.ops.elemwise import new_array
    from symgpu.gpu.runtime.codegen import layout
    rng = np.random.default_rng(shape[0] * 31 + shape[1])
    host = rng.uniform(-1, 1, shape).astype("float32")
    node = GpuCAReduce(S["add"], (0,))(_gv("float32", 2)).owner
    a = device_array(emu, host)
    thunk, storage = thunk_over(node, [a])
    state = thunk.reduce_thunk
    kern = state.kernels(1, 1)["sg_cols_tile"]
    R, K = shape
    p = layout.plan_reduction(shape, [[K, 1]], (0,), 2)
    chunk = -(-R // G)
    out = new_array(emu, (K,), np.dtype("float32"))
    partial = new_array(emu, (K * G,), np.dtype("float32"))
    counters = state.counter_ptr() if G > 1 else 0
    kern((1, G, 1), (32, 8, 1), K, R, chunk, *p.meta(), a.ptr, out.ptr, partial.ptr, counters)
    np.testing.assert_allclose(host_view(out), host.astype("float64").sum(0), rtol=1e-5,
                               atol=1e-5)
    if G > 1:
        assert not host_view(state.counters).any()


# ============================================================================ nvcc

@requires_nvcc
@pytest.mark.parametrize("sig", [
    ReduceSignature("add", None, ("float32",), "float32", 1, 1),
    ReduceSignature("add", None, ("bfloat16",), "bfloat16", 1, 1),
    ReduceSignature("add", S["mul"], ("bfloat16", "float32"), "float32", 1, 1),
    ReduceSignature("maximum", None, ("float64",), "float64", 1, 2),
])
def test_tile_kernels_compile_for_sm90(sig, tmp_path):
    from symgpu.scalar.basic import Cast
    if sig.in_dtypes == ("bfloat16",):
        sig = ReduceSignature("add", Cast("float32"), ("bfloat16",), "float32", 1, 1)
    assert compile_for_sm90(render_reduce(sig), tmp_path)


# ============================================================================ on a GPU

def column_sums(x, axis) -> list:
    """A sum, a sum keeping dims, a float32 sum and a max of ``x`` over ``axis`` (a 2-d ``x``:
    a sum of the column slice x[:, 1:], off the vector grid, for the max): the column
    reductions the GPU tests run (tests/test_gpu_col_group_rewrite.py too, with the groups)."""
    return [x.sum(axis=axis), x.sum(axis=axis, keepdims=True),
            x.astype("float32").sum(axis=axis), x[:, 1:].sum(axis=0) if x.ndim == 2
            else x.max(axis=axis)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,axis", [((8192, 2304), (0,)), ((8192, 771), (0,)),
                                        ((8, 1024, 768), (0, 1)), ((3001, 130), (0,))])
def test_gpu_column_sums_against_the_cpu(cuda, dtype, shape, axis):
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.runtime.array import GpuArray
    rng = np.random.default_rng(shape[-1] + len(shape))
    host = rng.uniform(-1, 1, shape).astype(dtype)
    x = T.tensor(dtype, (False,) * len(shape))
    outs = column_sums(x, axis)
    # (the column groups, which join sibling sums of x into one pass, are off: this is the
    # GpuCAReduce kernel's test; tests/test_gpu_col_group_rewrite.py runs the same with them)
    with symgpu.config.change_flags(optimizer_excluding="gpu_col_reduce_group"):
        f = symgpu.function([x], outs)
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert "GpuCAReduce" in names and "CAReduce" not in names, names
    got = f(host)
    # the GPU ran them: the reductions' thunks planned (and launched) the column tiles
    states = [t.reduce_thunk for t in f.vm.thunks if hasattr(t, "reduce_thunk")]
    used = [plan[0].kernel for s in states for plan in s.plans.values()]
    assert used.count("sg_cols_tile") >= 2, used
    with on_the_cpu():
        want = symgpu.function([x], outs)(host)
    for a, b in zip(got, want):
        a = np.asarray(a.get() if isinstance(a, GpuArray) else a).astype("float64")
        tol = 1e-4 if dtype == "float32" else 2e-2
        np.testing.assert_allclose(a, np.asarray(b).astype("float64"), rtol=tol, atol=tol * 10)
