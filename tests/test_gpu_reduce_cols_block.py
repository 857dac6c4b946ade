"""GpuCAReduce's one-launch column reductions (reduce.cu's sg_cols_block): a bias gradient
``d.sum(0)`` of a C-contiguous (512, 1024) is one kernel, not a split plus ``sg_finish``.

On the CPU (a fake device records launches): which layouts take it (leading axes of
C-contiguous arrays, moderate heights or enough column blocks to fill the GPU) and which keep
the old paths (tall arrays with few columns, strided or transposed inputs, the knob).  On a
GPU: every reduction and dtype against NumPy over odd shapes (1 row, 1 column, widths that
are not multiples of 32), fused pre-ops, and the same bits on every call.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpu_helpers import (fake_gpu_array, fake_reduce_device, gpu_vector_maker, requires_gpu,
                         thunk_over, virtual_context)
from symgpu.gpu.ops.elemwise import GpuCAReduce, _ReduceThunk
from symgpu.scalar.basic import SCALAR_OPS as S

CTX = "reduce-cols-block-test"
SMS = 132

virtual_ctx = virtual_context(CTX)
gvar = gpu_vector_maker(CTX)


@pytest.fixture
def fake_device(monkeypatch):
    return fake_reduce_device(monkeypatch, SMS)


def _launches(ctx, calls, op, axis, arr, ndim=2):
    node = GpuCAReduce(op, axis)(gvar("float32", (False,) * ndim)).owner
    thunk, storage = thunk_over(node, [arr])
    calls.clear()
    thunk()
    return list(calls), storage[node.outputs[0]][0]


def test_bias_gradients_are_one_launch(fake_device):
    ctx, calls = fake_device
    (call,), out = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 1024)))
    name, grid, block, args = call
    # 8 columns a block (32 bytes of each row): 128 blocks, nearer the 132 multiprocessors
    assert name == "sg_cols_block" and grid == (128, 1, 1) and block == (8, 128, 1)
    assert args[:3] == (1024, 512, 512) and args[-2:] == (0, 0)   # no partials, no counters
    assert out.shape == (1024,)
    (call,), out = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 10)))
    assert call[0] == "sg_cols_block" and call[1] == (2, 1, 1) and out.shape == (10,)
    # leading axes of a 3-d array collapse to one reduced dim: the same kernel
    (call,), out = _launches(ctx, calls, S["maximum"], (0, 1),
                             fake_gpu_array(ctx, (8, 64, 70)), ndim=3)
    assert call[0] == "sg_cols_block" and call[3][:2] == (70, 512) and out.shape == (70,)
    (call,), _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (200, 300)))
    assert call[0] == "sg_cols_block" and call[1] == (38, 1, 1)
    # enough columns for a block of 32 on every multiprocessor: 32 wide (512 rows: 16 a lane)
    (call,), _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 32 * SMS)))
    assert call[0] == "sg_cols_block" and call[2] == (32, 32, 1)
    # one-byte items: at least 32 bytes of a row per block
    node = GpuCAReduce(S["or_"], (0,))(gvar("bool", (False, False))).owner
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (512, 1024), "bool")])
    calls.clear()
    thunk()
    assert calls[0][0] == "sg_cols_block" and calls[0][2] == (32, 32, 1)
    # a few rows were never split: one sg_cols_final launch, as before
    (call,), _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (5, 3000)))
    assert call[0] == "sg_cols_final"


def test_tall_columns_strided_and_transposed_inputs_keep_their_paths(fake_device):
    ctx, calls = fake_device
    tall = _ReduceThunk.COLS_BLOCK_ROWS_PER_LANE * 128 + 1       # one row too many a lane
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (tall, 64)))
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]
    # however many columns: walking R alone, a block is latency-bound; at least 128
    # contiguous columns take the column tiles (test_gpu_reduce_cols_tile.py)
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (tall, 8 * SMS)))
    assert [c[0] for c in got] == ["sg_cols_tile"]
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (tall - 1, 8 * SMS)))
    assert [c[0] for c in got] == ["sg_cols_block"] and got[0][1:3] == ((SMS, 1, 1), (8, 128, 1))
    # every other column: the kept stride is 2, not the coalesced layout the kernel is for
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 2048))[:, ::2])
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]
    # a transposed view reducing axis 0 reads rows: the rows kernels
    got, _ = _launches(ctx, calls, S["add"], (0,),
                       fake_gpu_array(ctx, (1024, 512)).transpose())
    assert got[0][0].startswith(("sg_rows", "sg_vrows"))
    # wide enough for one pass per column already: unchanged
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (64, 40000)))
    assert [c[0] for c in got] == ["sg_cols_final"]


def test_knob_restores_the_split(fake_device, monkeypatch):
    ctx, calls = fake_device
    monkeypatch.setattr(_ReduceThunk, "COLS_BLOCK", False)
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 1024)))
    assert [c[0] for c in got] == ["sg_cols_tile"]
    monkeypatch.setattr(_ReduceThunk, "COLS_TILE", False)
    got, _ = _launches(ctx, calls, S["add"], (0,), fake_gpu_array(ctx, (512, 1024)))
    assert [c[0] for c in got] == ["sg_cols_partial", "sg_finish"]


# ============================================================================ on a GPU

GPU_CTX = "reduce-cols-block-gpu"
RNG = np.random.default_rng(31)


@pytest.fixture(scope="module")
def gpu_ctx():
    from symgpu.gpu.runtime import context as gctx
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(GPU_CTX, c)
    yield c
    gctx.unregister_context(GPU_CTX)


def _dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.ascontiguousarray(a), get_context(GPU_CTX))


def _run(out, inputs, values, calls=1):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, [out], clone=False)
    storage = {v: [x] for v, x in zip(inputs, values)}
    vm = link(fg, storage)
    res = []
    for _ in range(calls):
        vm()
        res.append(np.asarray(storage[fg.outputs[0]][0]))
    return res, vm


def _rand(shape, dtype):
    if dtype == "bool":
        return RNG.random(shape) < 0.7
    if dtype.startswith(("int", "uint")):
        return RNG.integers(0 if dtype.startswith("u") else -50, 50, shape).astype(dtype)
    return RNG.uniform(-1, 1, shape).astype(dtype)


NP = {"add": np.sum, "mul": np.prod, "maximum": np.max, "minimum": np.min,
      "and_": np.all, "or_": np.any}


def _gv(dtype, ndim):
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType(dtype, (False,) * ndim, GPU_CTX)()


@requires_gpu
@pytest.mark.parametrize("op,dtype", [
    ("add", "float32"), ("add", "float64"), ("add", "float16"), ("add", "int32"),
    ("add", "uint8"), ("add", "bool"), ("mul", "float32"), ("mul", "int64"),
    ("maximum", "float32"), ("maximum", "int16"), ("minimum", "float64"),
    ("minimum", "uint16"), ("and_", "bool"), ("or_", "int8"),
])
@pytest.mark.parametrize("shape", [(512, 1024), (512, 10), (1, 33), (7, 1), (2047, 31),
                                   (2048, 4229), (3, 5, 67)])
def test_column_reductions_match_numpy(gpu_ctx, op, dtype, shape):
    from symgpu.tensor.elemwise import reduce_output_dtype
    host = _rand(shape, dtype)
    if op == "mul":
        host = RNG.uniform(0.99, 1.01, shape).astype(dtype) if dtype[0] == "f" else \
            RNG.integers(1, 2, shape).astype(dtype)
    axis = tuple(range(len(shape) - 1))
    x = _gv(dtype, len(shape))
    (got,), _ = _run(GpuCAReduce(op, axis)(x), [x], [_dev(host)])
    out_dtype = reduce_output_dtype(op, dtype)
    kw = {"dtype": out_dtype} if op in ("add", "mul") else {}
    if dtype == "float16":         # NumPy adds float16 in float16; ours in float32
        kw = {"dtype": "float64"} if op in ("add", "mul") else {}
    want = np.asarray(NP[op](host, axis=axis, **kw), dtype=out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "f":
        tol = 2e-2 if dtype == "float16" else 1e-4
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
    else:
        np.testing.assert_array_equal(got, want)


@requires_gpu
def test_the_bias_gradient_ran_as_one_block_launch(gpu_ctx):
    host = _rand((512, 1024), "float32")
    node = GpuCAReduce("add", (0,))(_gv("float32", 2)).owner
    thunk, storage = thunk_over(node, [_dev(host)])
    thunk()
    (plan,) = thunk.reduce_thunk.plans.values()
    p, mode = plan[0], plan[5]
    assert p.strategy == "cols" and p.G == 1 and p.block == (8, 128, 1) and p.grid == (128, 1, 1)
    assert mode == _ReduceThunk.FINAL
    np.testing.assert_allclose(np.asarray(storage[node.outputs[0]][0]),
                               host.astype("float64").sum(0), rtol=1e-4, atol=1e-4)


@requires_gpu
def test_views_fused_pre_ops_and_the_same_bits_every_call(gpu_ctx):
    host = _rand((700, 2050), "float32")
    g = _dev(host)
    x = _gv("float32", 2)
    for view, h in ((g[:, 1:], host[:, 1:]), (g[:, ::2], host[:, ::2]),
                    (g.transpose(), host.T), (g[3:600, 5:1030], host[3:600, 5:1030])):
        (got,), _ = _run(GpuCAReduce("add", (0,))(x), [x], [view])
        np.testing.assert_allclose(got, h.astype("float64").sum(0), rtol=1e-4, atol=1e-3)
    out = GpuCAReduce("add", (0,), None, S["sqr"])(x)
    results, _ = _run(out, [x], [g], calls=4)
    np.testing.assert_allclose(results[0], (host.astype("float64") ** 2).sum(0), rtol=1e-4)
    assert all(np.array_equal(r, results[0]) for r in results[1:])
    host[100, 7] = np.nan
    (got,), _ = _run(GpuCAReduce("maximum", (0,))(x), [x], [_dev(host)])
    assert np.isnan(got[7]) and not np.isnan(np.delete(got, 7)).any()
