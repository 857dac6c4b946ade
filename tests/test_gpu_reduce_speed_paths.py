"""GpuCAReduce's fast paths (issue 7): one-pass split reductions ("last block done" on per-node
counters) and 16-byte vector loads of contiguous rows (symgpu/gpu/runtime/codegen/reduce.cu's
sg_rows_onepass, sg_vrows_final, sg_vrows_onepass).

On the CPU: what the renderer emits, which kernel and grid each layout gets (a fake device
records the launches), and (``nvcc`` marker) that the vector kernels compile for every item
size.  On a GPU (``gpu`` marker): results against NumPy for every REDUCIBLE op over dtypes,
sizes that are not multiples of the vector width, misaligned views, mixed alignments between
operands, tiny and empty inputs, and CUDA-graph replays that must find the counters at zero.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gpu_helpers import (fake_gpu_array, fake_kernel_device, gpu_vector_maker,
                         requires_nvcc, thunk_over, virtual_context)
from symgpu.config import config
from symgpu.gpu.runtime import compiler
from symgpu.gpu.runtime.codegen.reduce import (COLS_BLOCK_KERNELS, COLS_TILE_KERNELS, KERNELS,
                                               ONEPASS_KERNELS,
                                               VECTOR_KERNELS, ReduceSignature,
                                       kernel_names, reduce_formats, render_reduce)
from symgpu.gpu.runtime.context import gpu_available, why_unavailable
from symgpu.gpu.ops.elemwise import GpuCAReduce, _order_reduced, _ReduceThunk
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scalar.basic import SCALAR_OPS as S

CTX = "reduce-paths-test"
SMS = 132


virtual_ctx = virtual_context(CTX)
gvar = gpu_vector_maker(CTX)


# ============================================================================ rendering

def test_vector_kernels_only_where_item_sizes_agree_and_reduced_dims_collapse():
    one = ReduceSignature("add", None, ("float32",), "float32", 1, 1)
    assert one.vector_width == 4
    assert ReduceSignature("add", None, ("float64",), "float64", 1, 1).vector_width == 2
    assert ReduceSignature("add", None, ("float16",), "float32", 1, 1).vector_width == 8
    assert ReduceSignature("and_", None, ("bool",), "bool", 1, 1).vector_width == 16
    assert ReduceSignature("add", S["mul"], ("float32", "int32"), "float32", 1, 1
                           ).vector_width == 4
    assert ReduceSignature("add", S["mul"], ("float32", "float64"), "float64", 1, 1
                           ).vector_width == 0
    assert ReduceSignature("add", None, ("float32",), "float32", 1, 2).vector_width == 0
    assert kernel_names(one) == (KERNELS + ONEPASS_KERNELS + COLS_BLOCK_KERNELS
                                 + COLS_TILE_KERNELS + VECTOR_KERNELS + ("sg_finish",))


@pytest.mark.parametrize("sig", [
    ReduceSignature("add", None, ("float32",), "float32", 1, 1),
    ReduceSignature("maximum", S["mul"], ("float16", "float16"), "float16", 2, 1),
    ReduceSignature("or_", S["gt"], ("float32", "float64"), "bool", 1, 1),
    ReduceSignature("mul", None, ("int8",), "int64", 2, 3),
])
def test_formats_name_exactly_the_kernels_the_source_defines(sig):
    src = render_reduce(sig)
    defined = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?'
                             r'(sg_\w+)\(', src))
    if not sig.vector_width:          # the vector kernels sit under #if SG_VW
        assert "#define SG_VW 0" in src
        defined -= set(VECTOR_KERNELS)
    assert defined == set(reduce_formats(sig))
    nin = len(sig.in_dtypes)
    meta = sig.knd + sig.rnd + nin * (sig.knd + sig.rnd)
    assert reduce_formats(sig)["sg_rows_onepass"] == "qqq" + "q" * meta + "P" * (nin + 3)


def test_one_pass_counters_wrap_with_atomicinc_and_vector_loads_are_16_bytes():
    src = render_reduce(ReduceSignature("add", S["mul"], ("float32", "float32"), "float32", 1, 1))
    assert "atomicInc(counters + blockIdx.x, gridDim.y - 1)" in src
    assert "__threadfence();" in src and "__ldcg(p.partial" in src
    assert "v.a0 = __ldg(b.in0 + j);" in src and "v.a1 = __ldg(b.in1 + j);" in src
    assert "if (((unsigned int)reinterpret_cast<unsigned long long>(p.in1 + koff[1]) & 15u)" \
        " != a0) return 16u;" in src


# ============================================================================ planning

def test_order_reduced_puts_the_smallest_stride_innermost():
    # x.T of a C-contiguous (4, 6): reduced dims (6, 4) with strides (1, 6) -> (4, 6), (6, 1)
    shape, strides = _order_reduced((6, 4), [[1, 6]], (0, 1))
    assert shape == (4, 6) and strides == [[6, 1]]
    # kept dims stay where they are; broadcast reduced dims go outermost
    shape, strides = _order_reduced((5, 3, 7, 2), [[1, 70, 10, 0]], (1, 2, 3))
    assert shape == (5, 2, 3, 7) and strides == [[1, 0, 70, 10]]
    assert _order_reduced((3, 4), [[4, 1]], (0, 1)) == ((3, 4), [[4, 1]])
    assert _order_reduced((3, 4), [[1, 3]], (0,)) == ((3, 4), [[1, 3]])


@pytest.fixture
def fake_device(monkeypatch):
    """Reduction thunks against a context whose kernels record their launches (and whose
    memsets record their arrays)."""
    import symgpu.gpu.runtime.codegen.launch as launch
    from symgpu.gpu.runtime.array import GpuArray
    calls, fills = [], []
    ctx = fake_kernel_device(monkeypatch, calls)
    monkeypatch.setattr(launch, "sm_count", lambda c: SMS)
    monkeypatch.setattr(GpuArray, "fill", lambda self, v: fills.append((self.ptr, v)) or self)
    return ctx, calls, fills



def test_full_reduction_is_one_vector_launch_sized_from_the_sm_count(fake_device):
    ctx, calls, fills = fake_device
    node = GpuCAReduce(S["add"], None)(gvar("float32", (False, False))).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (8192, 8192))])
    thunk()
    assert len(calls) == 1
    name, grid, block, args = calls[0]
    assert name == "sg_vrows_onepass"
    assert grid == (1, _ReduceThunk.ONEPASS_BLOCKS_PER_SM * SMS, 1) and block == (256, 1, 1)
    assert args[:2] == (1, 8192 * 8192)
    counters = args[-1]
    assert counters and fills == [(counters, 0)]                 # zeroed once, when made
    assert storage[node.outputs[0]][0].shape == ()
    thunk()
    assert calls[1][-1][-1] == counters and len(fills) == 1      # the same counters reused
    state = thunk.reduce_thunk
    assert state.counters.size == 16 * SMS and state.counters.dtype == np.uint32


@pytest.mark.parametrize("case,kernel", [
    ("contiguous", "sg_vrows_onepass"),
    ("misaligned", "sg_vrows_onepass"),         # x[1:]: the kernel peels the head
    ("transposed", "sg_vrows_onepass"),         # x.T: reduced dims reordered, then collapsed
    ("strided", "sg_rows_onepass"),             # x[:, ::2]: the generic indexed path
    ("tiny", "sg_rows_final"),                 # one block, no vectors for 15 values
    ("odd", "sg_vrows_onepass"),
])
def test_full_reduction_layouts(fake_device, case, kernel):
    ctx, calls, fills = fake_device
    base = fake_gpu_array(ctx, (1000, 1003))
    x = {"contiguous": base, "misaligned": base[1:], "transposed": base.transpose(),
         "strided": base[:, ::2], "tiny": fake_gpu_array(ctx, (3, 5)), "odd": fake_gpu_array(ctx, (1000003,))}[case]
    node = GpuCAReduce(S["maximum"], None)(gvar("float32", (False,) * x.ndim)).owner
    thunk, storage = thunk_over(node, [x])
    thunk()
    assert [c[0] for c in calls] == [kernel]
    name, grid, block, args = calls[0]
    assert args[0] == 1 and args[1] == x.size
    if kernel.endswith("onepass"):
        assert grid[1] > 1 and args[-1] and args[-2]              # partials and counters
    else:
        assert grid == (1, 1, 1) and args[-2:] == (0, 0)


def test_rows_vector_path_for_long_rows_and_onepass_for_few_rows(fake_device):
    ctx, calls, fills = fake_device
    x = gvar("float32", (False, False))
    node = GpuCAReduce(S["add"], (1,))(x).owner
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (8192, 8192))])
    thunk()
    assert calls[-1][0] == "sg_vrows_final" and calls[-1][2] == (256, 1, 1)
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (4, 1 << 20))])           # 4 long rows: split, one pass
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "sg_vrows_onepass" and grid[0] == 4 and grid[1] > 1 and args[-1]
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (100000, 64))])           # short rows: warp per row
    thunk()
    assert calls[-1][0] == "sg_rows_final"
    n = len(calls)
    node = GpuCAReduce(S["add"], (0,))(x).owner          # tall columns: unchanged, 2 passes
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (100000, 64))])
    thunk()
    assert [c[0] for c in calls[n:]] == ["sg_cols_partial", "sg_finish"]


def test_mixed_item_sizes_and_broadcast_operands_take_the_indexed_kernels(fake_device):
    ctx, calls, fills = fake_device
    node = GpuCAReduce(S["add"], None, None, S["mul"])(
        gvar("float32", (False,)), gvar("float64", (False,))).owner
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (100000,)), fake_gpu_array(ctx, (100000,), "float64")])
    thunk()
    assert calls[-1][0] == "sg_rows_onepass"
    node = GpuCAReduce(S["add"], None, None, S["mul"])(
        gvar("float32", (False, False)), gvar("float32", (True, False))).owner
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (300, 1000)), fake_gpu_array(ctx, (1, 1000))])
    thunk()
    assert calls[-1][0] == "sg_rows_onepass"                    # the row is broadcast


def test_knobs_restore_the_two_pass_and_scalar_paths(fake_device, monkeypatch):
    ctx, calls, fills = fake_device
    monkeypatch.setattr(_ReduceThunk, "USE_ONEPASS", False)
    monkeypatch.setattr(_ReduceThunk, "VEC", False)
    node = GpuCAReduce(S["add"], None)(gvar("float32", (False,))).owner
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (1 << 20,))])
    thunk()
    assert [c[0] for c in calls] == ["sg_rows_partial", "sg_finish"] and not fills


def test_empty_and_zero_size_inputs_launch_nothing_or_the_identity(fake_device):
    ctx, calls, fills = fake_device
    node = GpuCAReduce(S["add"], None)(gvar("float32", (False,))).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (0,))])
    thunk()
    assert [c[0] for c in calls] == ["sg_rows_final"] and calls[0][3][:2] == (1, 0)
    node = GpuCAReduce(S["add"], (1,))(gvar("float32", (False, False))).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (0, 5))])
    thunk()
    assert len(calls) == 1 and storage[node.outputs[0]][0].shape == (0,)


# ============================================================================ nvcc

@pytest.fixture(scope="module")
def cachedir(tmp_path_factory):
    root = tmp_path_factory.mktemp("reduce-cache")
    compiler.clear_memory_cache()
    with config.change_flags(compiledir=str(root), compile_log=False, **{"nvcc.flags": ""}):
        yield root
    compiler.clear_memory_cache()


@requires_nvcc
def test_vector_kernels_compile_for_every_item_size_and_two_operands(cachedir):
    """Item sizes 1, 2, 4 and 8 (the shifts that take elements out of a 16-byte load), and
    two operands of one item size but different dtypes (test_gpu_codegen compiles the rest)."""
    import concurrent.futures
    sigs = [ReduceSignature("and_", None, ("bool",), "bool", 1, 1),
            ReduceSignature("maximum", None, ("int16",), "int16", 1, 1),
            ReduceSignature("add", None, ("uint32",), "uint64", 1, 1),
            ReduceSignature("minimum", None, ("float64",), "float64", 2, 1),
            ReduceSignature("add", S["mul"], ("float32", "int32"), "float32", 1, 1)]

    def build(sig):
        try:
            compiler.compile_to_cubin(render_reduce(sig), (), "sm_90")
        except compiler.CompileError as exc:
            return f"{sig}: {exc}"
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(build, sigs) if f]
    assert not failures, "\n\n".join(failures[:2])


# ============================================================================ on a GPU

gpu = pytest.mark.skipif(not gpu_available(),
                         reason=f"needs a usable NVIDIA GPU: {why_unavailable() or 'unknown'}")
GPU_CTX = "reduce-paths-gpu"
RNG = np.random.default_rng(77)


@pytest.fixture(scope="module")
def gpu_ctx():
    from symgpu.gpu.runtime import context as gctx
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(GPU_CTX, c)
    yield c
    gctx.unregister_context(GPU_CTX)


def _gvar(dtype, ndim):
    return GpuArrayType(dtype, (False,) * ndim, GPU_CTX)()


def _dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.ascontiguousarray(a), get_context(GPU_CTX))


def _run(node_out, inputs, values, calls=1):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, [node_out], clone=False)
    storage = {v: [x] for v, x in zip(inputs, values)}
    vm = link(fg, storage)
    res = []
    for _ in range(calls):
        vm()
        res.append(np.asarray(storage[fg.outputs[0]][0]))
    return res


def _rand(shape, dtype):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return RNG.uniform(-1, 1, shape).astype(dtype)


NP = {"add": np.sum, "mul": np.prod, "maximum": np.max, "minimum": np.min,
      "and_": np.all, "or_": np.any}
VIEWS = {
    "c": lambda a: a,
    "x[1:]": lambda a: a[1:],                      # misaligned by one item
    "x[3:-2]": lambda a: a[3:-2],
    "x[::2]": lambda a: a[::2],                    # strided: indexed path
}


def _check(got, want, dtype):
    if dtype == "float16" or np.asarray(want).dtype == np.float16:
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1.0)
    elif np.asarray(want).dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-3)
    else:
        np.testing.assert_array_equal(got, want)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("op,dtype", [
    ("add", "float32"), ("add", "float64"), ("add", "float16"), ("add", "int8"),
    ("add", "uint16"), ("add", "int32"), ("add", "uint64"), ("add", "bool"),
    ("mul", "float64"), ("maximum", "float32"), ("maximum", "int16"), ("minimum", "uint8"),
    ("minimum", "float64"), ("and_", "bool"), ("or_", "int8"),
])
@pytest.mark.parametrize("n", [1, 7, 4097, 1000003])
def test_full_reduction_matches_numpy(gpu_ctx, op, dtype, n):
    from symgpu.tensor.elemwise import reduce_output_dtype
    host = _rand(n + 8, dtype)
    if op == "mul":
        host = RNG.uniform(0.999, 1.001, n + 8).astype(dtype)
    if op == "and_":
        host[:] = True
        host[RNG.integers(0, n + 8)] = n < 100       # one False somewhere in big inputs
    g = _dev(host)
    out_dtype = reduce_output_dtype(op, dtype)
    for label, view in VIEWS.items():
        h, d = view(host[:n + 5]), view(g[:n + 5])
        x = _gvar(dtype, 1)
        (got,) = _run(GpuCAReduce(op, None)(x), [x], [d])
        want = NP[op](h, **({"dtype": out_dtype} if op in ("add", "mul") else {}))
        _check(got, np.asarray(want, dtype=out_dtype), dtype)


@gpu
@pytest.mark.gpu
def test_nan_wins_and_empty_sums_are_zero(gpu_ctx):
    host = _rand(300001, "float32")
    host[123457] = np.nan
    x = _gvar("float32", 1)
    for op in ("maximum", "minimum", "add"):
        (got,) = _run(GpuCAReduce(op, None)(x), [x], [_dev(host)])
        assert np.isnan(got), op
    (got,) = _run(GpuCAReduce("add", None)(x), [x], [_dev(np.zeros(0, "float32"))])
    assert got == 0
    m = _gvar("float32", 2)
    (got,) = _run(GpuCAReduce("add", (1,))(m), [m], [_dev(np.zeros((5, 0), "float32"))])
    np.testing.assert_array_equal(got, np.zeros(5, "float32"))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape,axis,view", [
    ((4, 1 << 20), (1,), "c"),           # few long rows: vector one pass per row
    ((4, 1000001), (1,), "c"),           # each row starts at a different alignment
    ((2000, 4099), (1,), "c"),           # block per row, vector, odd rows
    ((3, 300001), (1,), "x[:, 1:]"),
    ((700, 900), None, "x.T"),           # reduced dims reordered, then vector one pass
    ((700, 900), None, "x[:, ::3]"),     # generic one pass
    ((50, 60, 70), (0, 2), "c"),
])
def test_rows_and_full_reductions_of_2d_and_3d_layouts(gpu_ctx, shape, axis, view):
    host = _rand(shape, "float32")
    g = _dev(host)
    sel = {"c": lambda a: a, "x[:, 1:]": lambda a: a[:, 1:], "x.T": lambda a: a.transpose(),
           "x[:, ::3]": lambda a: a[:, ::3]}[view]
    x = _gvar("float32", len(shape))
    for op in ("add", "maximum"):
        (got,) = _run(GpuCAReduce(op, axis)(x), [x], [sel(g)])
        want = NP[op](sel(host).astype("float64"), axis=axis)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-2)


@gpu
@pytest.mark.gpu
def test_fused_pre_ops_with_aligned_and_misaligned_operand_pairs(gpu_ctx):
    a, b = _rand(2000003, "float32"), _rand(2000003, "float32")
    da, db = _dev(a), _dev(b)
    for sa, sb in [(slice(0, -3), slice(0, -3)), (slice(1, -2), slice(1, -2)),
                   (slice(1, -2), slice(0, -3)), (slice(2, -1), slice(3, None))]:
        x, y = _gvar("float32", 1), _gvar("float32", 1)
        out = GpuCAReduce("add", None, None, S["mul"])(x, y)
        (got,) = _run(out, [x, y], [da[sa], db[sb]])
        want = np.dot(a[sa].astype("float64"), b[sb].astype("float64"))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-2)
    (got,) = _run(GpuCAReduce("add", None, None, S["sqr"])(x), [x], [da[1:]])
    np.testing.assert_allclose(got, np.sum(a[1:].astype("float64") ** 2), rtol=1e-5)


@gpu
@pytest.mark.gpu
def test_repeated_launches_are_deterministic_and_leave_the_counters_at_zero(gpu_ctx):
    host = _rand(5000011, "float32")
    x = _gvar("float32", 1)
    out = GpuCAReduce("add", None)(x)
    results = _run(out, [x], [_dev(host)], calls=5)
    assert all(r.tobytes() == results[0].tobytes() for r in results)
    np.testing.assert_allclose(results[0], host.astype("float64").sum(), rtol=1e-5, atol=1e-2)


@gpu
@pytest.mark.gpu
def test_cuda_graph_replays_of_one_pass_reductions(gpu_ctx, monkeypatch):
    """A captured one-pass launch replays with the counters it found: each replay must find
    them back at zero, or the wrong block would gather (or none would)."""
    import warnings

    import symgpu
    import symgpu.tensor as T
    from symgpu import Out, shared
    from symgpu.gpu.exec import graphs
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    monkeypatch.setattr(graphs, "_driver", None)          # the real driver
    host, rows = _rand((1500, 1001), "float32"), _rand((4, 300001), "float32")
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        xs, ys = shared(host, target=GPU_CTX), shared(rows, target=GPU_CTX)
        f = symgpu.function([], [Out(gpu_from_host(T.sum(xs), GPU_CTX), borrow=True),
                                 Out(gpu_from_host(T.max(xs[:, 1:]), GPU_CTX), borrow=True),
                                 Out(gpu_from_host(T.sum(ys ** 2, axis=1), GPU_CTX),
                                     borrow=True)])
    want = [host.astype("float64").sum(), host[:, 1:].max(),
            (rows.astype("float64") ** 2).sum(axis=1)]
    first = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for _ in range(8):
            got = [np.asarray(r) for r in f()]
            for g_, w_ in zip(got, want):
                np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-2)
            if first is None:
                first = got
            for g_, f_ in zip(got, first):
                assert g_.tobytes() == f_.tobytes()       # plain runs and replays agree exactly
    st = f.vm.runner.stats()
    assert st["replays"] >= 4, st
    states = [t.reduce_thunk for t in f.vm.thunks if hasattr(t, "reduce_thunk")]
    assert states and any(s.counters is not None for s in states)
    for s in states:
        if s.counters is not None:
            assert not s.counters.get().any()
