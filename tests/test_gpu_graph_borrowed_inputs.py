"""A GPU array passed for a host input (issue 18, "data passed per call, as GpuArrays"):
compile/function.py hands it to the input's upload (GpuFromHost.device_input_filter), whose
thunk uses it as its output, with no copy, when that was found safe when the function was
linked (``_UploadThunk.may_borrow``, graph_plan.mark_reusable_outputs): no node writes into
the upload or a view of it, and neither leaves the call (a function output or an update
value).  Otherwise it is copied on the device and the caller's array is never written.

Compiled with symgpu.function and run end to end on the fake context, pool and graph driver
of tests/graph_fakes.py (plain runs, captures and replays of the segment reading the array).
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeKernelOp, FakeReverse, FakeToHost, add1, host_view, mul2, read, upload
import symgpu
import symgpu.tensor as T
from symgpu import Out, function
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.placement.basic_ops import GpuFromHost, TRANSFER_COUNTS, reset_transfer_counts


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    from symgpu.gpu.runtime.array import GpuArray

    def copy_from_device(self, src):          # GpuArray.copy() on the fake device memory
        if src.size:
            host_view(self.ptr, self.shape, self.strides)[...] = \
                host_view(src.ptr, src.shape, src.strides)
    monkeypatch.setattr(GpuArray, "_copy_from_device", copy_from_device)
    reset_transfer_counts()
    fake = fakes.use_fake_gpu(monkeypatch)
    ctx = next(fake)
    # a graph's check reads its results, views of the caller's array among them
    fakes.DRV.to_host = lambda arrays: [look(a) for a in arrays]
    yield ctx
    next(fake, None)


def look(a) -> np.ndarray:
    """The values of a fake device array of any layout."""
    return host_view(a.ptr, a.shape, a.strides).copy()


class ToHost(FakeToHost):
    """FakeToHost for any layout (views too)."""

    def perform(self, node, inputs, out):
        out[0][0] = look(inputs[0])


class Recorder(FakeToHost):
    """A copy to the host that remembers the arrays it was given (the upload's outputs)."""

    def __init__(self):
        self.seen = []

    def perform(self, node, inputs, out):
        self.seen.append(inputs[0])
        super().perform(node, inputs, out)


class Inc(Op):
    """``x += 1`` in place, through the fake driver, for any layout (views too)."""

    __props__ = ()
    destroy_map = {0: [0]}

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        inp, out = storage_map[node.inputs[0]], storage_map[node.outputs[0]]

        def thunk():
            x = inp[0]
            lay = (x.ptr, x.shape, x.strides)

            def k():
                host_view(*lay)[...] += 1
            fakes.DRV.launch_kernel(k)
            out[0] = x
        thunk.capturable = True
        thunk.launches = True
        return thunk


def compiled(make_outputs, updates=(), **kw):
    """``function([x], make_outputs(up))`` for a host float32 vector x, up its upload to the
    fake context."""
    x = T.fvector("x")
    up = GpuFromHost(fakes.CTX)(x)
    outputs = make_outputs(up)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        return function([x], outputs, updates=[(s, new(up)) for s, new in updates], **kw)


def upload_thunk(f):
    (thunk,) = [t for n, t in zip(f.vm.nodes, f.vm.thunks) if isinstance(n.op, GpuFromHost)]
    return thunk


def gpu_shared(values, name):
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.type import GpuArraySharedVariable, GpuArrayType
    t = GpuArrayType("float32", (False,), fakes.CTX)
    arr = upload(fakes.CTX_OBJ, values)
    return GpuArraySharedVariable(t, arr, name=name, container=Container(t, arr, name))


# ----------------------------------------------------------------------------- read in place

def test_a_gpu_array_passed_is_the_uploads_output_and_the_graph_reads_it_in_place():
    rec = Recorder()
    f = compiled(lambda up: [FakeToHost()(mul2()(add1()(up))), rec(up)])
    assert upload_thunk(f).may_borrow is True
    a = upload(fakes.CTX_OBJ, [1, 2, 3])
    for i in range(6):                                     # plain, capture, replays
        r, seen = f(a)
        np.testing.assert_array_equal(r, [4, 6, 8])
        np.testing.assert_array_equal(seen, [1, 2, 3])
    assert all(s is a for s in rec.seen) and len(rec.seen) == 6
    assert TRANSFER_COUNTS["device_copy"] == 0 and TRANSFER_COUNTS["host_to_gpu"] == 0
    np.testing.assert_array_equal(read(a), [1, 2, 3])      # never written
    (seg,) = f.vm.runner.segments
    (g,) = [g for gs in seg.graphs.values() for g in gs]
    assert g.staged == () and [ptr for _, ptr in g.pinned] == [a.ptr]   # no static buffer
    assert f.vm.runner.stats()["replays"] == 4
    fakes.MEM[a.ptr][:3] = [10, 20, 30]                    # the caller refills its array:
    r, _ = f(a)                                            # the replay reads the new values
    np.testing.assert_array_equal(r, [22, 42, 62])
    assert f.vm.runner.stats()["replays"] == 5


def test_the_generated_call_takes_a_fitting_gpu_array_as_it_is():
    """The input's ``accept`` (tested first by the generated call, no filter call) passes a
    host array that needs no conversion and a GpuArray the upload takes unchanged; anything
    else goes through the filter, which converts it or names the input."""
    from symgpu.gpu.runtime.array import GpuArray
    f = compiled(lambda up: [FakeToHost()(add1()(up))])
    accept = f._filters[0].accept
    a = upload(fakes.CTX_OBJ, [1, 2, 3])
    assert accept(a) and accept(np.zeros(3, np.float32))
    assert not accept(np.zeros(3)) and not accept(a.reshape((3, 1)))
    wrong_dtype = GpuArray.__new__(GpuArray)
    wrong_dtype._set(a.context, a.ptr, a.shape, (8,), np.dtype("float64"), a)
    assert not accept(wrong_dtype) and not accept([1.0, 2.0])
    np.testing.assert_array_equal(f(a)[0], [2, 3, 4])
    with pytest.raises(TypeError, match="input"):
        f("not numbers")


def test_different_gpu_arrays_on_successive_calls_replay_with_right_results():
    f = compiled(lambda up: FakeToHost()(mul2()(add1()(up))))
    arrays = []                                            # all alive: every pointer new
    for i in range(12):
        a = upload(fakes.CTX_OBJ, [i, i + 1, i + 2])
        arrays.append(a)
        np.testing.assert_array_equal(f(a), (np.array([i, i + 1, i + 2]) + 1) * 2)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(read(a), [i, i + 1, i + 2])
    assert TRANSFER_COUNTS["device_copy"] == 0
    st = f.vm.runner.stats()
    # the first moved call stages the input (one copy into the graph's buffer per replay)
    assert st["captures"] <= 2 and st["replays"] >= 9, st


def test_a_foreign_cuda_array_is_read_through_its_view():
    class Foreign:                                         # a CuPy/Numba-like producer
        def __init__(self, arr):
            self.arr = arr
            self.__cuda_array_interface__ = {
                "shape": arr.shape, "typestr": "<f4", "data": (arr.ptr, False),
                "version": 3, "strides": None, "stream": None}

    rec = Recorder()
    f = compiled(lambda up: [FakeToHost()(add1()(up)), rec(up)])
    a = Foreign(upload(fakes.CTX_OBJ, [1, 2]))
    for _ in range(4):
        r, _ = f(a)
        np.testing.assert_array_equal(r, [2, 3])
    assert all(s.ptr == a.arr.ptr and s.base is a for s in rec.seen)
    assert TRANSFER_COUNTS["device_copy"] == 0
    np.testing.assert_array_equal(read(a.arr), [1, 2])


# ----------------------------------------------------------------------------- copied

def _check_copied_every_call(f, want, calls=5):
    a = upload(fakes.CTX_OBJ, [1, 2, 3])
    results = []
    for _ in range(calls):
        r = f(a)
        results.append(r)
        np.testing.assert_array_equal(r if isinstance(r, np.ndarray) else look(r), want)
        np.testing.assert_array_equal(read(a), [1, 2, 3])  # the caller's array unchanged
    assert TRANSFER_COUNTS["device_copy"] == calls
    return a, results


def test_an_upload_written_in_place_is_copied_and_the_callers_array_untouched():
    inc = Inc()
    f = compiled(lambda up: FakeToHost()(mul2()(inc(up))), accept_inplace=True)
    assert upload_thunk(f).may_borrow is False
    _check_copied_every_call(f, [4, 6, 8])


def test_a_view_of_the_upload_written_in_place_is_copied_too():
    inc = Inc()
    f = compiled(lambda up: ToHost()(inc(FakeReverse()(up))), accept_inplace=True)
    assert upload_thunk(f).may_borrow is False
    _check_copied_every_call(f, [4, 3, 2])


@pytest.mark.parametrize("view", [False, True])
def test_an_upload_returned_to_the_caller_is_a_copy(view):
    f = compiled(lambda up: Out(FakeReverse()(up) if view else up, borrow=True))
    assert upload_thunk(f).may_borrow is False
    a, results = _check_copied_every_call(f, [3, 2, 1] if view else [1, 2, 3])
    for r in results:
        lo = min(r.ptr, r.ptr + (r.size - 1) * r.strides[0])
        assert not (a.ptr <= lo < a.ptr + 12)              # not the caller's memory
        host_view(r.ptr, r.shape, r.strides)[...] = 99     # the caller's result is its own
    np.testing.assert_array_equal(read(a), [1, 2, 3])


@pytest.mark.parametrize("view", [False, True])
def test_an_upload_that_becomes_a_shared_value_is_a_copy(view):
    s = gpu_shared([0, 0, 0], "s")
    f = compiled(lambda up: FakeToHost()(add1()(up)),
                 updates=[(s, (lambda up: FakeReverse()(up)) if view else (lambda up: up))])
    assert upload_thunk(f).may_borrow is False
    a = upload(fakes.CTX_OBJ, [1, 2, 3])
    for k in range(4):
        np.testing.assert_array_equal(f(a), [2, 3, 4])
        value = s.get_value(borrow=True, return_internal_type=True)
        assert value.ptr != a.ptr and value.base is not a.base
        np.testing.assert_array_equal(look(value), [3, 2, 1] if view else [1, 2, 3])
        s.set_value(upload(fakes.CTX_OBJ, [k, k, k]), borrow=True)   # nothing reaches a
        np.testing.assert_array_equal(read(a), [1, 2, 3])
    assert TRANSFER_COUNTS["device_copy"] == 4


def test_an_update_computed_from_the_upload_reads_it_in_place_and_never_targets_it():
    """Updates are copied back (or, under capture, written straight) only into buffers of
    the shared variables they update (graph_segment: copy_back, DIRECT_UPDATES), never into
    an upload's output: the borrowed array is only read."""
    s = gpu_shared([1, 1, 1], "s")
    step = FakeKernelOp("step", lambda s_, u: s_ + u)
    x = T.fvector("x")
    up = GpuFromHost(fakes.CTX)(x)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        f = function([x], [], updates=[(s, step(s, up))])  # nothing after the segment
    assert upload_thunk(f).may_borrow is True
    a = upload(fakes.CTX_OBJ, [1, 2, 3])
    want = np.ones(3)
    for _ in range(6):
        f(a)
        want = want + [1, 2, 3]
        np.testing.assert_array_equal(read(s.container.storage[0]), want)
        np.testing.assert_array_equal(read(a), [1, 2, 3])
    assert TRANSFER_COUNTS["device_copy"] == 0
    (seg,) = f.vm.runner.segments
    (up_node,) = [n for n in f.vm.nodes if isinstance(n.op, GpuFromHost)]
    targets = [seg.in_cells[j] for _, j in seg.copy_back]
    s_cell, up_cell = (f.vm.storage_map[v] for v in (f.maker.fgraph.inputs[1],
                                                      up_node.outputs[0]))
    assert len(targets) == 1 and targets[0] is s_cell             # s's buffer only
    assert any(c is up_cell for c in seg.in_cells)
    assert f.vm.runner.stats()["replays"] >= 3


# ----------------------------------------------------------------------------- explain

def test_explain_says_whether_a_gpu_array_passed_is_copied():
    f = compiled(lambda up: FakeToHost()(add1()(up)))
    rep = symgpu.explain(f, file=None)
    (item,) = rep.uploads
    assert "'x'" in item and "a GPU array passed for it is read where it is, not copied" in item
    assert any("GpuFromHost" in g and "of 'x'" in g and "not copied" in g for g in rep.graphs)
    inc = Inc()
    g = compiled(lambda up: FakeToHost()(inc(up)), accept_inplace=True)
    (item,) = symgpu.explain(g, file=None).uploads
    assert "is copied on the device, as a node writes into the upload" in item
