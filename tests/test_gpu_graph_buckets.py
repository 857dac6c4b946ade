"""Length buckets on the CUDA-graph runner, without a GPU (tests/graph_fakes.py): a pad to a
bucket that is not captured (as GpuPadSteps) ends the graph before it, so the graph after it
is keyed by the bucket: one capture serves every length of a bucket (issue 32)."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import MEM, add1, call, gvec, mul2, read, upload
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.link.vm import link
from symgpu.tensor.nnet.pad_steps import StepBuckets


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


class FakePadSteps(Op):
    """GpuPadSteps on the fake device: StepBuckets' length, zero steps after the input; the
    thunk is not marked capturable."""

    __props__ = ("q",)

    def __init__(self, q):
        self.q = q

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        src, dst = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        buckets, ctx = StepBuckets(self.q), fakes.CTX_OBJ

        def thunk():
            x = src[0]
            n = x.shape[0]
            out = new_array(ctx, (buckets.steps(n),), np.dtype("float32"))
            MEM[out.ptr][:out.size] = 0
            MEM[out.ptr][:n] = MEM[x.ptr][:n]
            dst[0] = out
        return thunk


def test_one_capture_serves_every_length_of_a_bucket():
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = mul2()(add1()(FakePadSteps(4)(x)))
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(ctx, np.zeros(5))]})
    cell = vm.storage_map[x]
    rng = np.random.default_rng(0)
    padded = []
    for n in (5, 6, 5, 7, 8, 6, 9, 10, 6):
        v = rng.standard_normal(n).astype("float32")
        cell[0] = upload(ctx, v)
        (r,) = call(vm, [y])
        got = read(r)
        padded.append(got.shape[0])
        np.testing.assert_allclose(got[:n], (v + 1) * 2, rtol=1e-6)
        assert (got[n:] == 2).all()          # the zero steps, through the same kernels
        del r
    assert padded == [5, 8, 8, 8, 8, 8, 12, 12, 8]   # unpadded until the length varied
    st = vm.runner.stats()
    # the graph after the pad: length 5 once (plain), bucket 8 six times (plain, captured,
    # four replays), bucket 12 twice (plain, captured)
    assert st["captures"] == 2 and st["replays"] == 4, st
