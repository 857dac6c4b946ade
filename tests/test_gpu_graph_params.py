"""Host scalars as CUDA-graph parameters (symgpu/gpu/runtime/graph_params.py): one capture serves
every value of an index, a learning rate or a slice offset; shapes still key graphs.

CPU tests drive the runner with the fakes of tests/graph_fakes.py (a recorded "kernel"
reads the parameter block at replay, as a real one reads device memory); the GPU tests
(``requires_gpu``) check cycling indices and learning rates against NumPy on a device.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import (FakeDynSlice, FakeHostScale, FakeKernelOp, FakeScalarUp, add1, call,
                         gvec, read, upload)
from gpu_helpers import compile_for_sm90, requires_gpu, requires_nvcc, thunk_over
from symgpu.config import config
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.exec import graphs
from symgpu.link.vm import link
from symgpu.tensor.type import TensorType


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def linked(inputs, outputs, values):
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = {}
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage, allow_gc=True)
    return vm


def iscalar():
    return TensorType("int64", ())()


def fscalar():
    return TensorType("float32", ())()


DATA = np.arange(60, dtype="float32") * 0.5


def slices_of(vm, y, i, j, starts, want):
    """Calls with y's slice bounds (i, j) = (k, k + 5) for each k, checked against want."""
    for k in starts:
        vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(k), np.int64(k + 5)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), want[k:k + 5])
        del r


@pytest.mark.parametrize("value, dtype", [
    (np.asarray(0.01, "float32"), "float32"), (np.asarray(384, "int64"), "int64"),
    (np.asarray(7, "int8"), "int8"), (np.asarray(-3, "int32"), "int32"),
    (np.asarray(2.5, ">f4"), "float32"), (np.asarray(3, "int64"), "float32"),
    (np.asarray([1.5], "float64"), "float64"), (0.01, "float32"), (5, "int64"),
    (np.float32(0.25), "float64"), (True, "int64"), (np.asarray(1e300), "float64")])
def test_parameter_slots_hold_what_numpy_makes_of_the_value(value, dtype):
    """A parameter's slot bytes: the value as NumPy casts it to the slot's dtype, padded to
    8 bytes, whether it takes the 0-d-array shortcut or not (dtype as a name or a np.dtype)."""
    from symgpu.gpu.runtime.graph_params import pack_scalar
    want = np.asarray(value, dtype=dtype).reshape(()).tobytes()
    want += b"\0" * (-len(want) % 8)
    assert pack_scalar(value, dtype) == want
    assert pack_scalar(value, np.dtype(dtype)) == want


def test_one_capture_serves_every_index_value():
    x, i, j = gvec(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(x, i, j))
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5])
    seg = vm.runner.segments[0]
    assert len(seg.param_thunks) == 1 and seg.param_size == 8
    slices_of(vm, y, i, j, [3, 17, 0, 40, 22, 9, 3, 55, 31, 12] * 3, DATA + 1)
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 1 and st["replays"] == 28, st
    assert st["graphs"] == 1
    # one parameter upload per launch of the graph, none while capturing
    assert fakes.DRV.uploads == fakes.DRV.launches == 29


def test_the_same_parameters_again_are_not_uploaded_again():
    """The block keeps the last upload: a replay with the same bytes (a start that comes
    from shapes, or an index that stays) launches without a copy; a new value uploads."""
    x, i, j = gvec(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(x, i, j))
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5])
    uploads = []
    for k in [4, 4, 4, 4, 9, 9, 4, 4]:
        before = fakes.DRV.uploads
        vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(k), np.int64(k + 5)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[k:k + 5] + 1)
        del r
        uploads.append(fakes.DRV.uploads - before)
    assert vm.runner.stats()["graphs"] == 1
    # a plain run, the capture's first replay (upload), then replays: new bytes only
    assert uploads == [0, 1, 0, 0, 1, 0, 1, 0], uploads


def test_learning_rate_and_index_together_one_graph():
    x, i, j, lr = gvec(), iscalar(), iscalar(), fscalar()
    sl = FakeDynSlice()(x, i, j)
    y = FakeKernelOp("mul", lambda a, b: a * b)(sl, FakeScalarUp(4)(lr))
    vm = linked([x, i, j, lr], [y], [upload(fakes.CTX_OBJ, DATA), 0, 4, 1.0])
    rng = np.random.default_rng(0)
    for step in range(25):
        k, rate = int(rng.integers(0, 50)), np.float32(rng.random())
        cells = vm.storage_map
        cells[i][0], cells[j][0], cells[lr][0] = np.int64(k), np.int64(k + 4), rate
        (r,) = call(vm, [y])
        np.testing.assert_allclose(read(r), DATA[k:k + 4] * rate, rtol=1e-6)
        del r
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 23 and st["graphs"] == 1, st
    assert len(vm.runner.segments[0].param_thunks) == 2


def test_a_host_scalar_also_read_as_a_kernel_argument_stays_in_the_key():
    x, i, j = gvec(), iscalar(), iscalar()
    y = FakeHostScale()(FakeDynSlice()(x, i, j), i)
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 3])
    seg = vm.runner.segments[0]
    ks = [1, 2, 3, 4] * 4
    for k in ks:
        vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(k), np.int64(k + 3)
        (r,) = call(vm, [y])
        np.testing.assert_allclose(read(r), DATA[k:k + 3] * k)
        del r
    st = vm.runner.stats()
    # i is in the key (a new value is a new graph); j only through the slice's length
    assert st["graphs"] == 4 and st["captures"] == 4 and st["plain"] == 4, st
    assert len(seg.param_thunks) == 1


def test_shapes_still_key_graphs():
    x, i, j = gvec(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(x, i, j))
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5])
    for step in range(20):
        k, n = step * 2, 3 if step % 2 else 6
        vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(k), np.int64(k + n)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[k:k + n] + 1)
        del r
    st = vm.runner.stats()
    assert st["graphs"] == 2 and st["replays"] == 16, st


def test_plain_runs_and_failed_parameters_leave_no_slot_bound():
    """A capture binds each parameter node to its slot only while recording."""
    x, i, j = gvec(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(x, i, j))
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5])
    seg = vm.runner.segments[0]
    for k in range(4):
        vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(k), np.int64(k + 5)
        call(vm, [y])
        assert all(t.param_slot is None for t in seg.param_thunks)
    vm.storage_map[i][0] = "not an index"        # param_values raises: runs plainly, raises
    with pytest.raises(Exception):
        call(vm, [y])
    vm.storage_map[i][0], vm.storage_map[j][0] = np.int64(7), np.int64(12)
    (r,) = call(vm, [y])
    np.testing.assert_array_equal(read(r), DATA[7:12] + 1)
    assert vm.runner.enabled


def test_an_index_into_an_array_the_segment_computes_is_a_parameter():
    """x + 1 computed inside the segment, then sliced at host bounds (a padded buffer read at
    the true length): the slice reads only that array's layout, so it is a parameter node
    all the same.  The first run of a key learns the layout (plainly), and from then on one
    graph serves every bound; a longer x is a new key, learnt again."""
    x, i, j = gvec(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(add1()(x), i, j))
    vm = linked([x, i, j], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5])
    seg = vm.runner.segments[0]
    assert len(seg.items) == 3 and seg.param_inner == [True]
    slices_of(vm, y, i, j, [3, 17, 0, 40, 22, 9, 3, 55, 31, 12] * 3, DATA + 2)
    st = vm.runner.stats()
    assert st["plain"] == 2 and st["captures"] == 1 and st["replays"] == 27, st
    longer = np.arange(90, dtype="float32")
    vm.storage_map[x][0] = upload(fakes.CTX_OBJ, longer)
    slices_of(vm, y, i, j, [70, 3, 84, 61, 8], longer + 2)
    st = vm.runner.stats()
    assert st["graphs"] == 2 and st["captures"] == 2 and st["plain"] == 4, st


def test_slices_of_slices_the_segment_computes_learn_their_layouts_in_one_run():
    """The second slice's array takes its length from the first slice's bounds: both
    layouts are learnt by the first plain run, each under the parts before its own."""
    x, i, j, a, b = gvec(), iscalar(), iscalar(), iscalar(), iscalar()
    y = add1()(FakeDynSlice()(add1()(FakeDynSlice()(add1()(x), i, j)), a, b))
    vm = linked([x, i, j, a, b], [y], [upload(fakes.CTX_OBJ, DATA), 0, 9, 0, 3])
    assert vm.runner.segments[0].param_inner == [True, True]
    rng = np.random.default_rng(3)
    for n in [9, 9, 9, 9, 12, 12, 12, 12]:
        k, m = int(rng.integers(0, 40)), int(rng.integers(0, 5))
        cells = vm.storage_map
        cells[i][0], cells[j][0] = np.int64(k), np.int64(k + n)
        cells[a][0], cells[b][0] = np.int64(m), np.int64(m + 3)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (DATA[k:k + n] + 2)[m:m + 3] + 1)
        del r
    st = vm.runner.stats()
    # per length of the first slice: the learning run, a first sight, a capture, a replay
    assert st["plain"] == 4 and st["captures"] == 2 and st["replays"] == 2, st


# ============================================================================ the real ops

@pytest.mark.parametrize("idx, values, shape", [
    ((slice(0, 1, None),), (4, 9), (10, 3)),              # x[a:b]
    ((slice(0, 1, None), 2), (1, 7, 3), (10, 5)),         # x[a:b, c]
    ((0,), (-2,), (6, 4)),                                 # x[a] (negative)
    ((0,), (5,), (6, 4)), ((0,), (-6,), (6, 4)),          # x[a] at both ends
    ((0,), (2,), (4, 3, 2)),                               # x[a] of a 3-d array
    ((slice(0, 1, 2),), (1, 9, 3), (12, 2)),              # x[a:b:c]
])
def test_dynamic_slice_parameters_match_numpy_views(idx, values, shape):
    """GpuSubtensor's parameter: the byte offset of the NumPy view, its shape and strides."""
    from gpu_helpers import FakeCtx, fake_gpu_array
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.type import GpuArrayType
    ctx = FakeCtx()
    syms = iter([TensorType("int64", ())() for _ in values])
    x = GpuArrayType("float32", (False,) * len(shape), fakes.CTX)()
    op = GpuSubtensor(_sym_idx(idx))
    node = op.make_node(x, *[next(syms) for _ in values])
    arr = fake_gpu_array(ctx, shape)
    thunk, _ = thunk_over(node, [arr] + [np.int64(v) for v in values])
    assert thunk.param_nbytes == 8 and thunk.capturable
    (shp, strides), raw = thunk.param_values()
    host = np.zeros(shape, "float32")
    view = host[_np_index(idx, values)]
    assert shp == view.shape and strides == view.strides
    offset = view.__array_interface__["data"][0] - host.__array_interface__["data"][0]
    assert np.frombuffer(raw, np.int64)[0] == offset


def test_slice_parameters_from_a_stand_in_of_the_layout_match_the_array_s():
    """What a segment passes for an input it computes (graph_params.layout_stand_in): the
    same key part and bytes as the array itself, and the same IndexError out of range."""
    from gpu_helpers import FakeCtx, fake_gpu_array
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime.graph_params import layout_stand_in
    from symgpu.tensor.subtensor import SYM, Slice
    ctx = FakeCtx()
    for idx, values, shape in [((SYM,), (3,), (9, 4)), ((SYM,), (-1,), (9, 4)),
                               ((Slice(SYM, SYM, None),), (2, 7), (9, 4)),
                               ((Slice(None, None, None), SYM), (1,), (5, 6))]:
        x = GpuArrayType("float32", (False,) * len(shape), fakes.CTX)()
        node = GpuSubtensor(idx).make_node(x, *[TensorType("int64", ())() for _ in values])
        arr = fake_gpu_array(ctx, shape)
        thunk, _ = thunk_over(node, [arr] + [np.int64(v) for v in values])
        assert thunk.param_layout_input == 0
        stand_in = layout_stand_in(ctx, arr.shape, arr.strides, arr.dtype)
        assert thunk.param_values(stand_in) == thunk.param_values()
    node = GpuSubtensor((SYM,)).make_node(x, TensorType("int64", ())())
    thunk, _ = thunk_over(node, [fake_gpu_array(ctx, (5, 6)), np.int64(5)])
    with pytest.raises(IndexError, match="out of bounds"):
        thunk.param_values(layout_stand_in(ctx, (5, 6), (24, 4), np.dtype("float32")))


def _sym_idx(idx):
    from symgpu.tensor.subtensor import SYM, Slice
    out = []
    for e in idx:
        if isinstance(e, slice):
            out.append(Slice(*[None if p is None else SYM for p in (e.start, e.stop, e.step)]))
        else:
            out.append(SYM)
    return tuple(out)


def _np_index(idx, values):
    it = iter(values)
    out = []
    for e in idx:
        if isinstance(e, slice):
            out.append(slice(*[None if p is None else next(it) for p in
                               (e.start, e.stop, e.step)]))
        else:
            out.append(next(it))
    return tuple(out)


def test_the_row_slice_fast_path_agrees_with_the_general_one():
    """x[a:b] (the minibatch slice) has its own quick parameters: the same as the view's."""
    from gpu_helpers import FakeCtx, fake_gpu_array
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.tensor.subtensor import SYM, Slice
    rng = np.random.default_rng(2)
    for shape in [(50, 7), (9,), (0, 3), (12, 2, 3)]:
        x = GpuArrayType("float32", (False,) * len(shape), fakes.CTX)()
        node = GpuSubtensor((Slice(SYM, SYM, None),)).make_node(
            x, TensorType("int64", ())(), TensorType("int64", ())())
        arr = fake_gpu_array(FakeCtx(), shape)
        for _ in range(40):
            a, b = (int(v) for v in rng.integers(-70, 70, 2))
            thunk, _ = thunk_over(node, [arr, np.int64(a), np.int64(b)])
            assert thunk.rows
            fast = thunk.param_values()
            thunk.rows = False
            assert fast == thunk.param_values(), (shape, a, b)
            host = np.zeros(shape, "float32")[a:b]
            assert fast[0][0] == host.shape


def test_an_out_of_range_integer_index_raises_from_the_parameters():
    from gpu_helpers import FakeCtx, fake_gpu_array
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.tensor.subtensor import SYM
    x = GpuArrayType("float32", (False, False), fakes.CTX)()
    node = GpuSubtensor((SYM,)).make_node(x, TensorType("int64", ())())
    thunk, _ = thunk_over(node, [fake_gpu_array(FakeCtx(), (4, 3)), np.int64(4)])
    with pytest.raises(IndexError, match="GpuSubtensor"):
        thunk.param_values()


def test_arange_and_scalar_upload_parameters():
    from symgpu.gpu.ops.advanced_pairs import GpuARange
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    a, b, c = (TensorType("int64", ())() for _ in range(3))
    node = GpuARange("int64", fakes.CTX).make_node(a, b, c)
    thunk, _ = thunk_over(node, [np.int64(3), np.int64(20), np.int64(4)])
    n, raw = thunk.param_values()
    assert n == len(range(3, 20, 4)) and list(np.frombuffer(raw, np.int64)) == [3, 4]
    s = TensorType("float32", ())()
    up = GpuFromHost(fakes.CTX).make_node(s)
    thunk, _ = thunk_over(up, [np.float32(0.25)])
    key, raw = thunk.param_values()
    assert key == () and len(raw) == thunk.param_nbytes == 8
    assert np.frombuffer(raw[:4], np.float32)[0] == np.float32(0.25)


@requires_nvcc
def test_parameter_kernels_compile_for_sm90(tmp_path):
    from symgpu.gpu.runtime.graph_params import PARAMS_SOURCE
    cubin = compile_for_sm90(PARAMS_SOURCE, tmp_path)
    for name in ("dyn_slice_copy_4", "dyn_slice_copy_8", "arange_dev_int64", "arange_dev_int32",
                 "table_copy"):
        assert name.encode() in cubin


# ============================================================================ on the GPU

@pytest.fixture
def real_gpu(monkeypatch):
    from gpu_helpers import real_default_gpu
    monkeypatch.setattr(graphs, "_driver", None)      # the real driver
    with config.change_flags(floatX="float32", **{"gpuarray.cuda_graphs": True}):
        with real_default_gpu() as ctx:
            yield ctx


@requires_gpu
def test_gpu_minibatch_cycling_index_and_learning_rate_one_graph(real_gpu):
    import symgpu
    import symgpu.tensor as T
    rng = np.random.default_rng(1)
    B, N = 8, 10
    X = rng.standard_normal((B * N, 6)).astype("float32")
    W = rng.standard_normal((6, 3)).astype("float32")
    sx, w = symgpu.shared(X), symgpu.shared(W)
    i, lr = T.lscalar("i"), T.fscalar("lr")
    x = T.fmatrix("x")
    cost = T.mean(T.tanh(T.dot(x, w)) ** 2)
    f = symgpu.function([i, lr], cost, updates=[(w, w - lr * T.grad(cost, w))],
                        givens={x: sx[i * B:(i + 1) * B]})
    wn = W.astype("float64")
    for step in range(3 * N):
        k, rate = (step * 7) % N, 0.05 + 0.01 * (step % 4)
        xb = X[k * B:(k + 1) * B].astype("float64")
        h = np.tanh(xb @ wn)
        want = np.mean(h ** 2)
        g = xb.T @ (2 * h * (1 - h * h)) / h.size
        got = f(k, rate)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
        wn = wn - np.float32(rate) * g
        np.testing.assert_allclose(w.get_value(), wn, rtol=2e-3, atol=1e-5)
    st = f.vm.runner.stats()
    # one capture per segment serves every index and learning rate
    assert st["replays"] >= 2 * N * st["segments"] and st["captures"] <= st["segments"], \
        (st, f.vm.runner.disabled_reason)


@requires_gpu
def test_gpu_arange_and_integer_index_follow_their_values(real_gpu):
    import symgpu
    import symgpu.tensor as T
    Y = np.arange(40, dtype="float32").reshape(10, 4)
    sy = symgpu.shared(Y)
    a = T.lscalar("a")
    f = symgpu.function([a], [sy[a] * 2, T.cast(T.arange(a, a + 5), "float32") * sy[0, 0]
                              + sy[a, 1]])
    for k in [0, 3, 9, -1, 5, 3, 0, 7, -4, 2] * 2:
        r0, r1 = f(k)
        np.testing.assert_array_equal(r0, Y[k] * 2)
        np.testing.assert_array_equal(r1, np.arange(k, k + 5) * Y[0, 0] + Y[k, 1])
    with pytest.raises(IndexError):
        f(10)
    r0, _ = f(4)
    np.testing.assert_array_equal(r0, Y[4] * 2)


def test_explain_says_which_host_scalars_are_parameters_and_which_key_graphs():
    from types import SimpleNamespace
    from symgpu.compile.explain import _graph_status
    x = gvec()
    i, j, k = TensorType("int64", ())("i"), TensorType("int64", ())("j"), fscalar()
    k.name = "k"
    y = FakeHostScale()(FakeDynSlice()(x, i, j), k)
    vm = linked([x, i, j, k], [y], [upload(fakes.CTX_OBJ, DATA), 0, 5, 1.0])
    fg = vm.fgraph
    lines = _graph_status(SimpleNamespace(vm=vm, maker=SimpleNamespace(fgraph=fg)), vm.nodes)
    text = "\n".join(lines)
    assert "'i' is a graph parameter" in text and "'j' is a graph parameter" in text, text
    assert "'k' is part of the graph key" in text, text
