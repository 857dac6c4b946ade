"""A reduction's update computed straight into its variable's buffer under capture although
the reduction also reads that variable broadcast along its reduced axes (a bias's SGD update
``b - lr * (g * f(b)).sum(0)``, as a ReLU layer's bias gradient reads b): the thunk's
``aligned_read`` (GpuCAReduce: careduce.reads_aligned) vouches for the read, so the graph
records no copy back; without it the copy back stays. Driven by the fake context, pool and
driver of tests/graph_fakes.py."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import host_view, read, upload
from symgpu.config import config
from symgpu.gpu.ops.careduce import reads_aligned
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.link.vm import link


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


class FakeRowView(Op):
    """``b.dimshuffle('x', 0)``: a (1, n) view of a vector."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, b):
        return Apply(self, [b], [GpuArrayType("float32", (True, False), fakes.CTX)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        inp, out = storage_map[node.inputs[0]], storage_map[node.outputs[0]]

        def thunk():
            b = inp[0]
            out[0] = b._view(b.ptr, (1,) + b.shape, (0,) + b.strides)
        thunk.capturable = True
        thunk.launches = False
        return thunk


class FakeBiasUpdate(Op):
    """``b - 0.5 * (g * bv).sum(0)`` (bv: b as a row), computed into ``write_into[0]`` when
    set; with ``aligned``, its thunk has GpuCAReduce's ``aligned_read``."""

    __props__ = ("aligned",)

    def __init__(self, aligned):
        self.aligned = aligned

    def make_node(self, bv, g, b):
        return Apply(self, [bv, g, b], [b.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        ins, out = [storage_map[v] for v in node.inputs], storage_map[node.outputs[0]]
        into = [None]

        def thunk():
            bv, g, b = (c[0] for c in ins)
            t = into[0]
            o = t if t is not None and t.shape == b.shape else \
                new_array(fakes.CTX_OBJ, b.shape, np.dtype("float32"))
            lays = [(x.ptr, x.shape, x.strides) for x in (bv, g, b)]

            def k():
                v_bv, v_g, v_b = (host_view(*lay) for lay in lays)
                host_view(o.ptr, o.shape, o.strides)[...] = v_b - 0.5 * (v_g * v_bv).sum(0)
            fakes.DRV.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        thunk.write_into = into
        if self.aligned:
            thunk.aligned_read = lambda a, t: reads_aligned((0,), a, t)
        return thunk


def _captured_copies(monkeypatch) -> dict:
    counts = {"captured": 0}
    orig = fakes.DRV.copy

    def copy(dst, src):
        if fakes.DRV.capturing:
            counts["captured"] += 1
        orig(dst, src)
    monkeypatch.setattr(fakes.DRV, "copy", copy)
    return counts


@pytest.mark.parametrize("aligned", [True, False])
def test_a_bias_update_reading_its_bias_as_a_row(monkeypatch, aligned):
    copies = _captured_copies(monkeypatch)
    ctx = fakes.CTX_OBJ
    b, g = GpuArrayType("float32", (False,), fakes.CTX)(), \
        GpuArrayType("float32", (False, False), fakes.CTX)()
    b_new = FakeBiasUpdate(aligned)(FakeRowView()(b), g, b)
    fg = FunctionGraph([b, g], [b_new], clone=False)
    fg.update_mapping = {0: 0}
    gv = np.arange(6, dtype="float32").reshape(2, 3) / 10
    storage = {b: [upload(ctx, [1, 2, 3])], g: [upload(ctx, gv)]}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage)
    want = np.array([1, 2, 3], "float32")
    first = vm.storage_map[b][0]
    for _ in range(8):
        vm()
        vm.storage_map[b][0] = vm.storage_map[b_new][0]
        vm.storage_map[b_new][0] = None
        want = want - 0.5 * (gv * want).sum(0)
    np.testing.assert_allclose(read(vm.storage_map[b][0]), want, rtol=1e-5)
    assert vm.runner.stats()["replays"] == 6
    (graph,) = [gr for grs in vm.runner.segments[0].graphs.values() for gr in grs]
    if aligned:          # written where b lives: no copy recorded
        assert vm.storage_map[b][0] is first and copies["captured"] == 0 and graph.direct
    else:                # the broadcast read is refused: the update is copied back
        assert copies["captured"] == 1 and graph.direct == () and graph.backs == (0,)


def test_reads_aligned_cases():
    class A:   # an array's layout, as reads_aligned sees it
        def __init__(self, shape, strides, ptr=1000, dtype="float32"):
            self.shape, self.strides, self.ptr, self.dtype = shape, strides, ptr, np.dtype(dtype)
    t = A((3,), (4,))
    assert reads_aligned((0,), A((1, 3), (12, 4)), t)          # b as a row
    assert reads_aligned((0,), A((5, 3), (0, 4)), t)           # ... broadcast over 5 rows
    assert reads_aligned((0, 2), A((5, 3, 1), (0, 4, 4)), t)
    assert not reads_aligned((0,), A((1, 3), (12, -4), ptr=1008), t)   # reversed
    assert not reads_aligned((0,), A((5, 3), (4, 0)), t)       # other positions' elements
    assert not reads_aligned((1,), A((3, 1), (4, 4)), A((3,), (4,), ptr=1004))  # shifted
    assert not reads_aligned((0,), A((1, 3), (12, 4), dtype="int32"), t)
