"""The whole-function CUDA-graph runner (symgpu/gpu/exec/graphs.py, graph_segment.py) on the CPU:
driven by the fake context, pool and driver of tests/graph_fakes.py, whose "kernels" are
Python closures over a fake device memory (a capture records them, a replay runs them), so
keys, ownership, ping-pong, updates copied back, fallbacks and results are checked without a
GPU.  The planning, the pinned pool and the real-GPU checks are in test_gpu_speed_paths.py.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import (CTX, MEM, FakeKernelOp, FakeToHost, add1, call, gvec, mul2, read,
                         upload)
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs
from symgpu.gpu.runtime.pool import lend
from symgpu.link.vm import link


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


# ============================================================================ the runner

def linked(inputs, outputs, values, allow_gc=True, updates=None):
    """Link a GPU graph as function() would; ``updates`` is the FunctionGraph's
    update_mapping {output index: input index}."""
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = dict(updates or {})
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage, allow_gc=allow_gc)
    return vm, fg


def test_check1_like_function_captures_then_replays_alternating_two_graphs():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = mul2()(add1()(x))
    xv = upload(ctx, np.arange(5))
    vm, fg = linked([x], [y], [xv])
    assert isinstance(vm.runner, graphs.Runner)
    want = (np.arange(5) + 1) * 2
    r = None
    for i in range(8):
        (r,) = call(vm, [y])               # the previous r is still held meanwhile
        np.testing.assert_array_equal(read(r), want)
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 2 and st["replays"] == 5, st
    assert st["graphs"] == 2 and st["nodes_captured"] == 2
    allocs = ctx.pool.n_device_allocs
    for i in range(10):
        (r,) = call(vm, [y])
    assert ctx.pool.n_device_allocs == allocs      # no allocation in the steady state
    assert vm.runner.stats()["replays"] == 15


def _every_slot_set(arr) -> list[str]:
    """The GpuArray slots `arr` lacks (the replay and ``_view`` set them inline, without
    ``GpuArray._set``: a slot added to the class must be set there too)."""
    from symgpu.gpu.runtime.array import GpuArray
    return [s for s in GpuArray.__slots__ if s != "__weakref__" and not hasattr(arr, s)]


def test_replayed_results_and_views_have_every_slot_of_an_array():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    vm, _ = linked([x], [y], [upload(ctx, np.arange(4))])
    for _ in range(4):
        (r,) = call(vm, [y])
    assert vm.runner.stats()["replays"] >= 1
    assert _every_slot_set(r) == [] and _every_slot_set(r._view(r.ptr, (2,), (4,))) == []


def test_results_the_caller_keeps_are_never_overwritten():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    xv = upload(ctx, np.zeros(3))
    vm, fg = linked([x], [y], [xv])
    kept = []
    calls = graphs.MAX_GRAPHS + 4
    for i in range(calls):
        MEM[xv.ptr][:3] = i
        (r,) = call(vm, [y])
        kept.append(r)
    for i, r in enumerate(kept):
        np.testing.assert_array_equal(read(r), np.full(3, i + 1))
    st = vm.runner.stats()
    assert st["graphs"] == graphs.MAX_GRAPHS and st["plain"] >= calls - graphs.MAX_GRAPHS


def test_scratch_memory_of_a_graph_is_never_handed_out():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = FakeKernelOp("sq", lambda a: a * a, scratch=True)(x)
    xv = upload(ctx, [1, 2, 3])
    vm, fg = linked([x], [y], [xv])
    users = []
    for i in range(6):
        MEM[xv.ptr][:3] = [i, i + 1, i + 2]
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), np.array([i, i + 1, i + 2]) ** 2)
        u = upload(ctx, [7, 7, 7])      # the caller's own arrays, from the same pool
        users.append(u)
        del r
    for u in users:
        np.testing.assert_array_equal(read(u), [7, 7, 7])
    assert vm.runner.stats()["replays"] >= 3


def test_new_pointers_or_shapes_run_plainly_then_get_their_own_graph():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    a, b = upload(ctx, [1, 2]), upload(ctx, [5, 6, 7])
    vm, fg = linked([x], [y], [a])
    cell = vm.storage_map[x]
    for v, want in [(a, [2, 3]), (b, [6, 7, 8]), (a, [2, 3]), (b, [6, 7, 8]), (a, [2, 3]),
                    (b, [6, 7, 8])]:
        cell[0] = v
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), want)
        del r
    st = vm.runner.stats()
    assert st["plain"] == 2 and st["captures"] == 2 and st["replays"] == 2, st


def test_in_place_update_of_an_input_keeps_its_pointer():
    ctx = fakes.CTX_OBJ
    w = gvec()
    w2 = mul2(inplace=True)(w)
    wv = upload(ctx, [1, 1])
    vm, fg = linked([w], [w2], [wv])
    for i in range(6):
        (r,) = call(vm, [w2])
        assert r is wv
    np.testing.assert_array_equal(read(wv), [64, 64])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] == 4, st


def test_feeding_a_result_back_as_the_next_input():
    """Without an update mapping (a bare VM) the new value's buffer belongs to a graph and the
    keys move with it: results stay right, graphs stay bounded."""
    ctx = fakes.CTX_OBJ
    w = gvec()
    w2 = mul2(inplace=True)(add1()(w))
    wv = upload(ctx, [1, 1])
    vm, fg = linked([w], [w2], [wv])
    for i in range(16):
        (r,) = call(vm, [w2])
        vm.storage_map[w][0] = r          # the update: the new value is the next input
    want = 1.0
    for i in range(16):
        want = 2 * (want + 1)
    np.testing.assert_array_equal(read(vm.storage_map[w][0]), [want, want])
    st = vm.runner.stats()
    assert st["graphs"] <= graphs.MAX_GRAPHS and st["replays"] >= 1, st


def function_like_updates(vm, out_var, in_var, n):
    """What Function does for ``updates={in_var: out_var}``: run, swap the new value in,
    empty the update's cell (the caller holds nothing)."""
    cell = vm.storage_map[in_var]
    for _ in range(n):
        vm()
        cell[0] = vm.storage_map[out_var][0]
        vm.storage_map[out_var][0] = None


def test_updates_are_copied_back_so_shared_pointers_never_move():
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)                         # not in place: a new buffer each call
    vm, fg = linked([b], [b2], [upload(ctx, [0, 0, 0])], updates={0: 0})
    assert vm.runner.segments[0].copy_back
    ptr = vm.storage_map[b][0].ptr
    function_like_updates(vm, b2, b, 1)        # a plain call copies back too
    assert vm.storage_map[b][0].ptr == ptr
    function_like_updates(vm, b2, b, 9)
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [10, 10, 10])
    first = id(vm.storage_map[b][0])        # (holding the array would block the copy back)
    function_like_updates(vm, b2, b, 10)
    assert id(vm.storage_map[b][0]) == first   # the same array: the graph wrote into it
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [20, 20, 20])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] >= 16, st


def test_an_update_whose_old_value_is_held_elsewhere_is_not_overwritten():
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    vm, fg = linked([b], [b2], [upload(ctx, [0])], updates={0: 0})
    function_like_updates(vm, b2, b, 4)
    # get_value(borrow=True, return_internal_type=True) lends the buffer: explicit ownership,
    # no reference counting
    borrowed = lend(vm.storage_map[b][0])
    function_like_updates(vm, b2, b, 3)
    np.testing.assert_array_equal(read(borrowed), [4])
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [7])
    del borrowed
    function_like_updates(vm, b2, b, 3)
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [10])


def test_no_copy_back_when_something_that_can_fail_runs_after_the_segment():
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)

    class HostStep(Op):   # a plain node after the segment, not a transfer
        def make_node(self, x):
            from symgpu.tensor.type import TensorType
            return Apply(self, [x], [TensorType("float32", (False,))()])

        def perform(self, node, inputs, out):
            out[0][0] = read(inputs[0])
    h = HostStep()(b2)
    vm, fg = linked([b], [b2, h], [upload(ctx, [0])], updates={0: 0})
    assert not vm.runner.segments[0].copy_back


def test_outputs_read_by_a_host_node_and_views_of_inputs():
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    ctx = fakes.CTX_OBJ
    x = gvec()
    a = add1()(x)
    v = GpuDimShuffle((False,), ("x", 0))(x)      # a view of the input, an output
    h = FakeToHost()(a)
    xv = upload(ctx, [1, 2, 3])
    vm, fg = linked([x], [h, v], [xv])
    kinds = [k for k, _ in graphs.plan_steps(vm.nodes, [True, False, True], [True, False, False],
                                             [False] * 3)]
    assert "segment" in kinds
    for i in range(5):
        MEM[xv.ptr][:3] = [i, i, i]
        hv, vv = call(vm, [h, v])
        np.testing.assert_array_equal(hv, [i + 1] * 3)
        assert vv.shape == (1, 3) and vv.ptr == xv.ptr
    assert vm.runner.stats()["replays"] == 3


def test_empty_arrays_and_views_of_constants_are_rebuilt():
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.gpu.placement.type import GpuArrayConstant, GpuArrayType
    ctx = fakes.CTX_OBJ
    x = gvec()
    c = GpuArrayConstant(GpuArrayType("float32", (False,), CTX), upload(ctx, [5, 6]))
    y = add1()(x)
    v = GpuDimShuffle((False,), ("x", 0))(c)
    z = add1()(v)
    vm, fg = linked([x], [y, v, z], [upload(ctx, np.zeros(0))])
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for i in range(6):
            yv, vv, zv = call(vm, [y, v, z])
            assert yv.shape == (0,) and vv.shape == (1, 2)
            np.testing.assert_array_equal(read(vv), [[5, 6]])
            np.testing.assert_array_equal(read(zv), [[6, 7]])
    assert vm.runner.stats()["replays"] == 3


class FakeUpload(Op):
    """GpuFromHost-like: not capturable, a fresh pool buffer every call (a constant upload)."""

    __props__ = ("value",)

    def __init__(self, value):
        self.value = value

    def make_node(self, like):
        return Apply(self, [like], [like.type()])

    def perform(self, node, inputs, out):
        from symgpu.gpu.ops.elemwise import new_array
        a = new_array(fakes.CTX_OBJ, inputs[0].shape, np.dtype("float32"))
        MEM[a.ptr][: a.size] = self.value
        out[0][0] = a


def test_update_written_in_place_into_an_upload_still_replays():
    """The logistic regression's shape on the GPU: b_new is computed in place into a buffer
    uploaded each call (GpuFromHost of a constant), the result goes to the host, and small
    intermediates share the uploads' size class.  The uploads' pointers must stay stable for
    the segment's key to repeat, whatever the captures take from the pool."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    up = FakeUpload(0.05)(b)
    t = add1()(b)                                           # an intermediate, same class
    b_new = FakeKernelOp("sub", lambda u, t_, b_: b_ - u * t_, inplace=True)(up, t, b)
    h = FakeToHost()(mul2()(t))
    bv = upload(ctx, [1.0])
    vm, fg = linked([b], [h, b_new], [bv])
    cell = vm.storage_map[b]
    want_b = 1.0
    for i in range(40):
        hv, new = call(vm, [h, b_new])
        np.testing.assert_allclose(hv, [2 * (want_b + 1)], rtol=1e-5)
        want_b = want_b - 0.05 * (want_b + 1)
        np.testing.assert_allclose(read(new), [want_b], rtol=1e-5)
        cell[0] = new                                       # the update
    st = vm.runner.stats()
    assert st["replays"] >= 30 and st["graphs"] <= 4, st


from symgpu.gpu.placement.basic_ops import HostFromGpu as _RealHostFromGpu  # noqa: E402


class HostFromGpu(FakeToHost, _RealHostFromGpu):
    """A fake copy to the host, of the real one's type (the runner lets updates be copied
    back when only such copies follow a segment); make_node and perform are the fake's."""


def test_logistic_regression_shaped_step_settles_on_one_graph():
    """The shape of the tutorial's training step on the GPU: per-call uploads (the length N
    and the constant 0.01, which b's update overwrites in place), a weight update into fresh
    memory, a reduction with scratch memory, a result copied to the host; every buffer of the
    size class the uploads use.  Keys must settle (stable uploads, updates copied back) and
    every result stay right."""
    ctx = fakes.CTX_OBJ
    w, b = gvec(), gvec()
    up_n, up_c = FakeUpload(4.0)(b), FakeUpload(0.01)(b)
    t = add1()(w)
    s_ = FakeKernelOp("scr", lambda a: a * 3, scratch=True)(t)
    w_new = FakeKernelOp("wupd", lambda w_, s2: w_ - 0.01 * s2)(w, s_)
    b_new = FakeKernelOp("bupd", lambda u, s2, b_: b_ - u * s2, inplace=True)(up_c, s_, b)
    h = HostFromGpu()(FakeKernelOp("pred", lambda s2, n: s2 / n)(s_, up_n))
    vm, fg = linked([w, b], [h, w_new, b_new], [upload(ctx, [0.5]), upload(ctx, [0.25])],
                    updates={1: 0, 2: 1})
    kinds = [type(st).__name__ for st in vm.runner.steps]
    assert kinds == ["_OwnedPlainStep", "_PlainStep", "Segment", "_PlainStep"], kinds
    hw, hb = 0.5, 0.25
    for i in range(30):
        vm()
        got = vm.storage_map[h][0]
        cells = [vm.storage_map[v] for v in (h, w_new, b_new)]
        new_w, new_b = cells[1][0], cells[2][0]
        for c in cells:
            c[0] = None
        vm.storage_map[w][0], vm.storage_map[b][0] = new_w, new_b
        s_val = (hw + 1) * 3
        np.testing.assert_allclose(got, [s_val / 4.0], rtol=1e-5)
        hw, hb = hw - 0.01 * s_val, hb - 0.01 * s_val
        np.testing.assert_allclose(read(new_w), [hw], rtol=1e-5)
        np.testing.assert_allclose(read(new_b), [hb], rtol=1e-5)
        del got, new_w, new_b, cells
    st = vm.runner.stats()
    assert st == {"segments": 1, "plain": 1, "captures": 1, "replays": 28, "graphs": 1,
                  "nodes_captured": 8}, st   # 6 kernels, 2 copies back


def test_allow_gc_false_still_replays():
    ctx = fakes.CTX_OBJ
    x = gvec()
    h = FakeToHost()(mul2()(add1()(x)))
    xv = upload(ctx, [1, 2])
    vm, fg = linked([x], [h], [xv], allow_gc=False)
    for i in range(5):
        (hv,) = call(vm, [h])
        np.testing.assert_array_equal(hv, [4, 6])
    st = vm.runner.stats()
    assert st["graphs"] == 1 and st["replays"] == 3, st


def test_a_capture_error_warns_once_and_falls_back_for_the_function():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = FakeKernelOp("bad", lambda a: a + 3, fail_when_capturing=True)(x)
    xv = upload(ctx, [1])
    vm, fg = linked([x], [y], [xv])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(5):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [4])
    msgs = [m for m in w if issubclass(m.category, graphs.GraphCaptureWarning)]
    assert len(msgs) == 1 and "capturing" in str(msgs[0].message)
    assert not vm.runner.enabled and vm.runner.stats()["plain"] == 5


def test_a_graph_that_disagrees_with_plain_launches_is_dropped():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = FakeKernelOp("liar", lambda a: a * 2, lie_when_captured=True, inplace=True)(
        add1()(x))
    xv = upload(ctx, [1, 2])
    vm, fg = linked([x], [y], [xv])
    with pytest.warns(graphs.GraphCaptureWarning, match="differ from plain"):
        for i in range(5):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [4, 6])
            np.testing.assert_array_equal(read(xv), [1, 2])
    assert not vm.runner.enabled and vm.runner.stats()["graphs"] == 0


def test_segments_with_large_inputs_are_never_captured(monkeypatch):
    monkeypatch.setattr(graphs, "VERIFY_LIMIT", 8)
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    vm, fg = linked([x], [y], [upload(ctx, [1, 2, 3])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(6):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [2, 3, 4])
    st = vm.runner.stats()
    assert st["captures"] == 0 and st["plain"] == 6 and vm.runner.enabled


def test_without_verification_the_capture_call_runs_once(monkeypatch):
    monkeypatch.setattr(graphs, "VERIFY", False)
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    vm, fg = linked([x], [y], [upload(ctx, [1])])
    for i in range(4):
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [2])
        del r
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 2 and not vm.runner.verify


def test_an_end_capture_error_falls_back_too():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    xv = upload(ctx, [1])
    vm, fg = linked([x], [y], [xv])
    fakes.DRV.fail_next_capture = True
    with pytest.warns(graphs.GraphCaptureWarning):
        for i in range(4):
            (r,) = call(vm, [y])
            np.testing.assert_array_equal(read(r), [2])
    assert not vm.runner.enabled


def test_a_users_own_error_propagates_and_leaves_graphs_on():
    ctx = fakes.CTX_OBJ
    x, z = gvec(), gvec()
    y = FakeKernelOp("add", lambda a, b: a + b)(x, z)
    a, b = upload(ctx, [1, 2]), upload(ctx, [1, 2, 3])
    vm, fg = linked([x, z], [y], [a, b])
    for _ in range(3):
        with pytest.raises(ValueError, match="shapes differ"):
            vm()
    assert vm.runner.enabled
    vm.storage_map[z][0] = upload(ctx, [10, 20])
    for _ in range(4):
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [11, 22])
    assert vm.runner.stats()["replays"] >= 1


def test_flag_off_and_profiling_use_the_plain_vm():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": False}):
        vm = link(fg, {x: [upload(ctx, [1])]})
    assert not isinstance(vm.runner, graphs.Runner)   # a plain run, under the call lock
    vm, fg = linked([x], [y], [upload(ctx, [1])])
    calls = []
    vm.profiler = lambda v: calls.append(v)
    vm()
    assert calls == [vm] and vm.runner.stats()["plain"] == 0


def test_virtual_contexts_get_no_runner():
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import GpuArrayType
    with virtual_context("virt-graphs"):
        x = GpuArrayType("float32", (False,), "virt-graphs")()
        y = add1()(x)
        vm = link(FunctionGraph([x], [y], clone=False), {x: [None]})
    assert vm.runner is None


def test_a_failing_vm_hook_never_breaks_linking(monkeypatch):
    from symgpu.link import vm as vm_mod

    def broken(vm):
        raise RuntimeError("boom")
    monkeypatch.setattr(vm_mod, "VM_HOOKS", [broken])
    x = gvec()
    with pytest.warns(RuntimeWarning, match="boom"):
        vm = link(FunctionGraph([x], [add1()(x)], clone=False), {x: [upload(fakes.CTX_OBJ, [1])]})
    assert vm.runner is None
    vm()


def test_errors_inside_a_segment_name_the_node():
    ctx = fakes.CTX_OBJ
    x, z = gvec(), gvec()
    y = FakeKernelOp("add", lambda a, b: a + b)(x, z)
    vm, fg = linked([x, z], [y], [upload(ctx, [1]), upload(ctx, [1, 2])])
    with pytest.raises(ValueError) as info:
        vm()
    assert "Apply node that caused the error: Fakeadd" in str(info.value)


class FakeView(Op):
    __props__ = ()
    view_map = {0: [0]}
    def make_node(self, x):
        return Apply(self, [x], [x.type()])
    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        i, o = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        def thunk():
            x = i[0]
            o[0] = x._view(x.ptr, x.shape, x.strides)
        thunk.capturable = True
        thunk.launches = False
        return thunk

def test_update_of_a_variable_read_through_a_plain_view_replays():
    """The training step's shape: b.dimshuffle('x') is a plain (view-only) step before the
    segment, so the view (a segment input dying in it) holds b's memory while the capture
    decides whether b's update may be copied back into b.  It must not block the copy back."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    bv = FakeView()(b)
    up = FakeUpload(0.1)(bv)
    t = add1()(bv)
    b_new = FakeKernelOp("bupd", lambda u, t_, b_: t_ - u, inplace=True)(up, t, b)
    h = HostFromGpu()(mul2()(t))
    vm, fg = linked([b], [h, b_new], [upload(ctx, [1.0])], updates={1: 0})
    ptr = vm.storage_map[b][0].ptr
    want = 1.0
    for i in range(20):
        vm()
        got = vm.storage_map[h][0]
        new = vm.storage_map[b_new][0]
        vm.storage_map[h][0] = vm.storage_map[b_new][0] = None
        vm.storage_map[b][0] = new
        np.testing.assert_allclose(got, [2 * (want + 1)], rtol=1e-5)
        want = want + 1 - 0.1
        np.testing.assert_allclose(read(new), [want], rtol=1e-5)
        del new, got
    st = vm.runner.stats()
    assert st["replays"] >= 17 and st["graphs"] == 1, st
    assert vm.storage_map[b][0].ptr == ptr     # copied back in the graph too


# ============================================================================ ownership

def test_a_kept_view_of_a_result_keeps_its_graph_busy():
    """Results leave a call under a lease that views share: a view the caller keeps is never
    overwritten by a later replay (liveness decides, not a count of references)."""
    from symgpu.gpu.exec.graph_instance import Lease
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = add1()(x)
    xv = upload(ctx, np.zeros(4))
    vm, fg = linked([x], [y], [xv])
    kept, leased = [], 0
    for i in range(10):
        MEM[xv.ptr][:4] = i
        (r,) = call(vm, [y])
        leased += type(r.base) is Lease          # a graph's hand-out (else a plain run's)
        kept.append(r._view(r.ptr, (2,), (4,)))  # keep only a view
        del r
    assert leased >= 5
    for i, v in enumerate(kept):
        np.testing.assert_array_equal(read(v), [i + 1, i + 1])
    kept.clear()
    before = vm.runner.stats()["replays"]
    for i in range(5):
        (r,) = call(vm, [y])
        del r
    st = vm.runner.stats()
    assert st["replays"] == before + 5, st      # views gone: the graphs replay again


def test_no_copy_back_when_the_function_also_returns_the_new_value():
    """A value the caller receives must not become the shared variable's buffer (a later call
    would overwrite it): decided from the graph, when the runner is built."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    vm, fg = linked([b], [b2, b2], [upload(ctx, [0, 0])], updates={1: 0})
    assert vm.runner.segments[0].copy_back == []
    got = []
    for i in range(6):
        vm()
        r = vm.storage_map[b2][0]
        vm.storage_map[b2][0] = None
        vm.storage_map[b][0] = r
        got.append(r)
    for i, r in enumerate(got):
        np.testing.assert_array_equal(read(r), [i + 1, i + 1])


def test_a_lent_shared_buffer_is_never_written_by_a_graph():
    ctx = fakes.CTX_OBJ
    b = gvec()
    b2 = add1()(b)
    vm, fg = linked([b], [b2], [lend(upload(ctx, [5, 5]))], updates={0: 0})
    mine = vm.storage_map[b][0]
    function_like_updates(vm, b2, b, 8)
    np.testing.assert_array_equal(read(mine), [5, 5])
    np.testing.assert_array_equal(read(vm.storage_map[b][0]), [13, 13])


def test_inputs_passed_per_call_replay_one_graph_whatever_their_pointers():
    """A GPU input that is not a shared variable is staged: the graph reads a static buffer
    of its own, copied into before each launch, and its key holds shapes and strides only."""
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = mul2()(add1()(x))
    vm, fg = linked([x], [y], [upload(ctx, [0, 0, 0])])
    seg = vm.runner.segments[0]
    assert seg.staged == {0}
    for i in range(12):
        vm.storage_map[x][0] = upload(ctx, [i, i + 1, i + 2])   # a new array, a new pointer
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), (np.array([i, i + 1, i + 2]) + 1) * 2)
        del r
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 1 and st["replays"] == 10, st


def test_updated_inputs_are_never_staged():
    """An update's target is read and written where it is (its new value is copied back into
    its buffer); a per-call input is staged from the start."""
    ctx = fakes.CTX_OBJ
    w, x = gvec(), gvec()
    w2 = FakeKernelOp("axpy", lambda a, b: a + b)(w, x)
    vm, fg = linked([w, x], [w2], [upload(ctx, [1, 1]), upload(ctx, [2, 2])], updates={0: 0})
    seg = vm.runner.segments[0]
    inputs = [c for c in seg.in_cells]
    staged_cells = [inputs[k] for k in seg.staged]
    assert staged_cells == [vm.storage_map[x]]
    assert [inputs[k] for k in seg.movable] == [vm.storage_map[x]]


def test_gpu_calls_hold_their_contexts_call_lock():
    """One GPU function call at a time per context, with or without graphs (a capture records
    whatever reaches the context's stream): another thread cannot take the lock meanwhile."""
    import threading
    ctx = fakes.CTX_OBJ
    seen = []

    def probe(a):
        got = []
        t = threading.Thread(target=lambda: got.append(ctx.call_lock.acquire(blocking=False)))
        t.start()
        t.join()
        seen.append(got[0])
        return a + 1
    x = gvec()
    y = FakeKernelOp("probe", probe)(x)
    for flag in (True, False):
        fg = FunctionGraph([x], [y], clone=False)
        with config.change_flags(**{"gpuarray.cuda_graphs": flag}):
            vm = link(fg, {x: [upload(ctx, [1, 2])]})
        assert vm.runner is not None
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [2, 3])
    assert seen and not any(seen)


def test_the_runners_entry_runs_under_the_call_lock_and_names_the_node_of_an_error():
    """VM.dispatch gives generated calls the runner's ``entry`` (a closure; a lone segment
    with no uploads and no cells to clear is run directly): it runs under the context's call
    lock, names the node of an error and releases the lock after it; a runner of more steps
    runs them from its entry too."""
    import threading
    ctx = fakes.CTX_OBJ
    x, z = gvec(), gvec()
    held = []

    def probe(a, b):
        got = []
        t = threading.Thread(target=lambda: got.append(ctx.call_lock.acquire(blocking=False)))
        t.start()
        t.join()
        held.append(not got[0])
        return a + b
    y = FakeKernelOp("probe", probe)(x, z)
    vm, fg = linked([x, z], [y], [upload(ctx, [1, 2]), upload(ctx, [3, 4])])
    runner = vm.runner
    assert vm.dispatch is runner.entry
    for _ in range(4):
        runner.entry()
        np.testing.assert_array_equal(read(vm.storage_map[y][0]), [4, 6])
        vm.storage_map[y][0] = None
    assert held and all(held) and runner.stats()["replays"] >= 1
    vm.storage_map[z][0] = upload(ctx, [1, 2, 3])    # mismatched shapes: the node's error
    with pytest.raises(ValueError) as info:
        runner.entry()
    assert "Apply node that caused the error: Fakeprobe" in str(info.value)
    assert ctx.call_lock.acquire(blocking=False)     # released after the error
    ctx.call_lock.release()
    w = gvec()
    h = FakeToHost()(add1()(w))                      # a segment, then a plain step
    vm2, _ = linked([w], [h], [upload(ctx, [1])])
    assert len(vm2.runner.steps) == 2 and vm2.dispatch is vm2.runner.entry
    np.testing.assert_array_equal(call(vm2, [h])[0], [2])


def test_a_runner_entered_inside_another_call_on_its_context_takes_the_lock_again():
    """A scan's inner function runs inside the outer call, which holds the context's call
    lock by its token (no owner recorded): the inner runner's entry, and a transfer's
    ``with ctx.call_lock`` inside it, find the lock held up this thread's stack and go on;
    the token is back after the outer call, and another thread still waits meanwhile."""
    import threading
    ctx = fakes.CTX_OBJ
    w = gvec()
    inner_out = add1()(w)
    inner, _ = linked([w], [inner_out], [upload(ctx, [5])])
    others = []

    def probe(a):
        with ctx.call_lock:                  # a transfer inside the call
            inner.runner.entry()             # an inner function's call
        t = threading.Thread(target=lambda: others.append(ctx.call_lock.acquire(blocking=False)))
        t.start()
        t.join()
        return a + read(inner.storage_map[inner_out][0])
    x = gvec()
    y = FakeKernelOp("probe", probe)(x)
    outer, _ = linked([x], [y], [upload(ctx, [1, 2])])
    results = []

    def calls():
        for _ in range(3):
            outer.runner.entry()
            results.append(read(outer.storage_map[y][0]))
            outer.storage_map[y][0] = None
    t = threading.Thread(target=calls, daemon=True)   # a deadlock fails, not hangs, the test
    t.start()
    t.join(30)
    assert not t.is_alive(), "the inner entry waited for the lock its own thread holds"
    np.testing.assert_array_equal(results, [[7, 8]] * 3)
    assert others and not any(others)        # held for the whole outer call
    assert not ctx.call_lock.locked() and ctx.call_lock.acquire(blocking=False)
    ctx.call_lock.release()


class FakePlainView(Op):
    """A view that is not capturable: a plain step whose output is an input's memory."""
    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        x = inputs[0]
        out[0][0] = x._view(x.ptr, x.shape, x.strides)


def test_a_plain_view_of_an_input_never_lends_the_inputs_memory_to_other_nodes():
    """A plain view of an input feeding a segment is read where it is (or staged): the
    input's memory is never written, nor handed to another node."""
    ctx = fakes.CTX_OBJ
    b = gvec()
    v = FakePlainView()(b)
    up = FakeUpload(7.0)(b)                      # same size class, allocated every call
    y = FakeKernelOp("add", lambda p, q: p + q)(v, up)
    vm, fg = linked([b], [y], [upload(ctx, [1.0, 2.0])])
    bv = vm.storage_map[b][0]
    for _ in range(12):
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), [8.0, 9.0])
        np.testing.assert_array_equal(read(bv), [1.0, 2.0])   # b's memory untouched
        del r
