"""What a call does with the data it uploads (issue 18, the spelling "data passed per call"):
shape-derived scalars go up with their arithmetic in the kernel that reads them (an uploaded
input's length read from its upload, captured with the graph); a device array fed to a host input is read where it is unless something would
overwrite it; copies from registered host memory are waited for at the end of the call.

CPU tests inspect graphs built for a virtual context and drive ``deferred_waits`` with
stand-in events; GPU tests (``pytest -m gpu``) check values, copies and the caller's arrays.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import planned_step_kinds, requires_gpu
from symgpu import function
from symgpu.gpu.placement.basic_ops import GpuFromHost, TRANSFER_COUNTS, reset_transfer_counts
from symgpu.gpu.runtime import host_register
from symgpu.gpu.runtime.host_register import deferred_waits
from symgpu.tensor.elemwise import DimShuffle, Elemwise


def _logreg_step(x, y, w, b):
    p = 1 / (1 + T.exp(-(T.dot(x, w) + b)))
    xent = -y * T.log(p) - (1 - y) * T.log(1 - p)
    cost = xent.mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    return [p > 0.5, xent], [(w, w - 0.1 * gw), (b, b - 0.1 * gb)]


# ----------------------------------------------------------------------------- scalar uploads

def test_a_means_divisor_is_uploaded_as_the_shape_and_cast_in_the_kernel(vgpu):
    x, y = T.fmatrix("x"), T.fvector("y")
    w = symgpu.shared(np.zeros(5, np.float32), name="w")
    b = symgpu.shared(np.float32(0), name="b")
    outs, updates = _logreg_step(x, y, w, b)
    f = function([x, y], outs, updates=updates)
    nodes = f.maker.fgraph.toposort()
    host_math = [n for n in nodes if isinstance(n.op, (Elemwise, DimShuffle))]
    assert host_math == [], host_math                  # no Cast/DimShuffle left on the host
    scalar_uploads = [n for n in nodes if isinstance(n.op, GpuFromHost)
                      and n.inputs[0].owner is not None]
    # the length is read from y's own upload (the one upload of y), not from y on the host:
    # captured with the segment, whose key holds that upload's shape (no graph parameter)
    assert [type(n.inputs[0].owner.op).__name__ for n in scalar_uploads] == ["GpuShape_i"]
    (read,) = [n.inputs[0].owner for n in scalar_uploads]
    y_in = f.maker.fgraph.inputs[1]
    y_uploads = [n for n in nodes if isinstance(n.op, GpuFromHost) and n.inputs[0] is y_in]
    assert read.inputs[0].owner is y_uploads[0] and len(y_uploads) == 1
    assert any("Cast{float32}" in str(n.op) for n in nodes), "the cast runs in a GPU kernel"
    assert "plain" not in planned_step_kinds(nodes)   # no host read before the segment
    rep = symgpu.explain(f, file=None)
    assert rep.cpu_ops == []


def test_a_host_length_is_read_from_the_upload_only_when_there_is_one(vgpu):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.placement.basic_ops import GpuShape_i
    from symgpu.gpu.ops.lifters import local_upload_shape_from_the_upload
    from symgpu.tensor.shape import Shape_i
    v = T.fvector("v")
    length = GpuFromHost(None)(Shape_i(0)(v))
    alone = FunctionGraph([v], [length], clone=False)          # v itself is never uploaded
    assert local_upload_shape_from_the_upload.transform(alone, length.owner) is None
    data = GpuFromHost(None)(v)
    both = FunctionGraph([v], [length, data], clone=False)
    (new,) = local_upload_shape_from_the_upload.transform(both, length.owner)
    read = new.owner.inputs[0].owner
    assert isinstance(new.owner.op, GpuFromHost) and isinstance(read.op, GpuShape_i)
    assert read.op.i == 0 and read.inputs[0] is data


def test_host_scalar_arithmetic_read_on_the_host_too_stays_there(vgpu):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.ops.lifters import local_upload_scalar_operands
    s = T.lscalar("s")
    c = T.cast(s, "float32")
    up = GpuFromHost(None)(c)
    shared_cast = FunctionGraph([s], [up, c], clone=False)      # c is also returned
    assert local_upload_scalar_operands.transform(shared_cast, up.owner) is None
    alone = FunctionGraph([s], [GpuFromHost(None)(T.cast(s, "float32"))], clone=False)
    (new,) = local_upload_scalar_operands.transform(alone, alone.outputs[0].owner)
    assert isinstance(new.owner.op, GpuElemwise)
    assert isinstance(new.owner.inputs[0].owner.op, GpuFromHost)
    assert new.owner.inputs[0].owner.inputs[0] is s


def test_scalar_uploads_match_numpy_on_the_cpu_path():
    # the rewrite only runs with a GPU context; the same program on the CPU is the reference
    x, y = T.fmatrix("x"), T.fvector("y")
    w = symgpu.shared(np.zeros(3, np.float32), name="w")
    b = symgpu.shared(np.float32(0), name="b")
    outs, updates = _logreg_step(x, y, w, b)
    f = function([x, y], outs, updates=updates)
    X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    Y = np.array([0, 1, 1, 0], np.float32)
    pred, xent = f(X, Y)
    np.testing.assert_allclose(xent, np.log(2) * np.ones(4), rtol=1e-6)


# ----------------------------------------------------------------------------- borrowed inputs

def _upload_thunks(f, name="x"):
    vm = f.vm
    return [t for n, t in zip(vm.nodes, vm.thunks) if isinstance(n.op, GpuFromHost)
            and n.inputs[0].name == name]


def test_an_upload_only_read_may_borrow_a_device_array(vgpu):
    x = T.fmatrix("x")
    w = symgpu.shared(np.ones((3, 2), np.float32), name="w")
    f = function([x], T.dot(x, w).sum())
    (thunk,) = _upload_thunks(f)
    assert thunk.may_borrow is True


def _overwrites_its_upload(x):
    """exp written in place into a view of x's upload (no rewrite makes this for an argument's
    upload: gpu_inplace leaves those alone; an op of a user's may)."""
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.placement.basic_ops import HostFromGpu
    from symgpu.scalar.basic import SCALAR_OPS
    up = GpuFromHost(None)(x)
    return HostFromGpu()(GpuElemwise(SCALAR_OPS["exp"], {0: 0})(up.T))


def test_an_upload_overwritten_in_place_copies(vgpu):
    x = T.fmatrix("x")
    f = function([x], _overwrites_its_upload(x))
    assert any(getattr(n.op, "destroy_map", None) for n in f.maker.fgraph.toposort())
    (thunk,) = _upload_thunks(f)
    assert thunk.may_borrow is False


def test_kernels_do_not_write_into_an_arguments_upload(vgpu):
    x = T.fmatrix("x")
    f = function([x], T.exp(x) * 2)                  # would be in place on the upload
    assert not any(getattr(n.op, "destroy_map", None) for n in f.maker.fgraph.toposort())
    (thunk,) = _upload_thunks(f)
    assert thunk.may_borrow is True
    w = symgpu.shared(np.ones((2, 2), np.float32), name="w")
    g = function([x], T.exp(T.dot(x, w)) * 2)        # an intermediate is still overwritten
    assert any(getattr(n.op, "destroy_map", None) for n in g.maker.fgraph.toposort())


def test_an_upload_returned_to_the_caller_copies(vgpu):
    from types import SimpleNamespace
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.exec.graph_plan import mark_reusable_outputs
    x = T.fmatrix("x")
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle, HostFromGpu
    g = GpuFromHost(None)(x)
    view = GpuDimShuffle(g.broadcastable, (1, 0))(g)
    for outputs, borrow in (([view], False), ([HostFromGpu()(view)], True)):  # a view leaves
        fg = FunctionGraph([x], outputs, clone=False)
        nodes = fg.toposort()
        thunk = SimpleNamespace(may_borrow=False)
        vm = SimpleNamespace(nodes=nodes, fgraph=fg,
                             thunks=[thunk if n is g.owner else object() for n in nodes])
        mark_reusable_outputs(vm)
        assert thunk.may_borrow is borrow


# ----------------------------------------------------------------------------- deferred waits

class _Event:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append(self)


def test_deferred_waits_wait_for_every_copy_at_the_end_of_the_outer_block():
    log: list = []
    with deferred_waits():
        events = host_register._deferred.events
        events.append(_Event(log))
        with deferred_waits():                       # a nested call: no wait at its end
            events.append(_Event(log))
        assert log == []
    assert len(log) == 2
    assert host_register._deferred.events is None   # outside a block, uploads wait at once


def test_deferred_waits_wait_also_when_the_call_raises():
    log: list = []
    with pytest.raises(RuntimeError):
        with deferred_waits():
            host_register._deferred.events.append(_Event(log))
            raise RuntimeError("a failing node")
    assert len(log) == 1 and host_register._deferred.events is None


def test_deferred_waits_are_per_thread():
    import threading
    seen = []
    with deferred_waits():
        t = threading.Thread(target=lambda: seen.append(host_register._deferred.events))
        t.start()
        t.join()
    assert seen == [None]


# ----------------------------------------------------------------------------- on the GPU

@requires_gpu
def test_a_device_array_fed_per_call_is_read_in_place_and_left_unchanged(cuda):
    from symgpu.gpu.runtime.array import to_gpu
    x = T.fmatrix("x")
    w = symgpu.shared(np.arange(6, dtype=np.float32).reshape(3, 2), name="w")
    f = function([x], T.dot(x, w))
    rng = np.random.default_rng(0)
    for _ in range(4):                               # plain runs, a capture, replays
        X = rng.standard_normal((5, 3)).astype(np.float32)
        Xd = to_gpu(X)
        reset_transfer_counts()
        np.testing.assert_allclose(f(Xd), X @ w.get_value(), rtol=1e-5)
        assert TRANSFER_COUNTS["device_copy"] == 0 and TRANSFER_COUNTS["host_to_gpu"] == 0
        np.testing.assert_array_equal(Xd.get(), X)


@requires_gpu
def test_a_device_array_an_in_place_kernel_would_overwrite_is_copied_first(cuda):
    from symgpu.gpu.runtime.array import to_gpu
    x = T.fmatrix("x")
    f = function([x], _overwrites_its_upload(x))
    X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    Xd = to_gpu(X)
    for _ in range(3):
        reset_transfer_counts()
        np.testing.assert_allclose(f(Xd), np.exp(X).T, rtol=1e-5)
        assert TRANSFER_COUNTS["device_copy"] == 1
        np.testing.assert_array_equal(Xd.get(), X)   # the caller's array is untouched


@requires_gpu
def test_logreg_fed_host_data_per_call_matches_shared_data(cuda):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 64)).astype(np.float32)
    Y = (rng.random(400) > 0.5).astype(np.float32)
    results = []
    for per_call in (False, True):
        w = symgpu.shared(np.zeros(64, np.float32), name="w")
        b = symgpu.shared(0., name="b")
        if per_call:
            x, y = T.fmatrix("x"), T.fvector("y")
            args = (X, Y)
        else:
            x, y = symgpu.shared(X), symgpu.shared(Y)
            args = ()
        outs, updates = _logreg_step(x, y, w, b)
        f = function([x, y] if per_call else [], outs, updates=updates)
        for _ in range(5):
            pred, xent = f(*args)
        results.append((pred, xent, w.get_value(), float(b.get_value())))
    for a, b_ in zip(*results):
        np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-6)
