"""gpu_row_reduce_group (symgpu/gpu/ops/row_group_rewrite.py): rewritten graphs inspected on
a virtual GPU (layer norms forward and backward, the layer-normalised LSTM step of
benchmarks/rnn.py), and a layer norm with its gradient on the real GPU against NumPy."""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import config, function, grad
from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.row_group import GpuRowReduceGroup

OFF = {"optimizer_excluding": "gpu_row_reduce_group"}
H = 8


def _ln(z):
    mu = z.mean(-1, keepdims=True)
    return (z - mu) / T.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def _gates_ln(gates: int, with_grad: bool, **flags):
    """Layer norms of ``gates`` column slices of one matrix (an LSTM's gates), summed, and
    optionally the gradient of a weighted sum of them."""
    x, w = T.matrix("x"), T.vector("w")
    y = sum(_ln(x[:, k * H:(k + 1) * H]) for k in range(gates)) if gates > 1 else _ln(x)
    outs = [y, grad((y * w).sum(), x)] if with_grad else [y]
    with config.change_flags(**flags):
        return function([x, w], outs, on_unused_input="ignore")


def _counts(f) -> collections.Counter:
    return collections.Counter(type(n.op).__name__ for n in f.maker.fgraph.toposort())


def _groups(f) -> list:
    return [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuRowReduceGroup]


def test_a_layer_norms_mean_and_variance_become_one_chained_group(vgpu):
    on, off = _counts(_gates_ln(1, False)), _counts(_gates_ln(1, False, **OFF))
    assert off["GpuCAReduce"] == 2 and "GpuRowReduceGroup" not in off
    assert on["GpuCAReduce"] == 0 and on["GpuRowReduceGroup"] == 1
    (g,) = _groups(_gates_ln(1, False))
    assert len(g.op.members) == 2
    assert g.op.members[1].pre_op is not None and -1 in g.op.members[1].args   # the chain


def test_gate_layer_norms_and_their_gradient_take_fewer_launches(vgpu):
    on, off = _gates_ln(2, True), _gates_ln(2, True, **OFF)
    c_on, c_off = _counts(on), _counts(off)
    assert c_off["GpuCAReduce"] == 10 and "GpuRowReduceGroup" not in c_off
    assert c_on["GpuCAReduce"] + c_on["GpuRowReduceGroup"] < c_off["GpuCAReduce"]
    groups = _groups(on)
    assert groups and sum(len(g.op.members) for g in groups) + c_on["GpuCAReduce"] == 10
    # every group's members reduce the last axis of slices of x's rows (a group's row map,
    # gpu_row_group_map's, writes full rows after them)
    for g in groups:
        assert all(o.broadcastable == (False,) for o in g.outputs[:len(g.op.members)])


def test_reductions_that_depend_on_each_other_stay_apart(vgpu):
    # a single layer norm's gradient reads the variance through elementwise ops: no group
    # may contain a member and a reduction of something computed from its result
    from symgpu.graph.basic import ancestors
    f = _gates_ln(1, True)
    for g in _groups(f):
        above = set(ancestors(g.inputs))
        assert not any(o in above for o in g.outputs)
    assert _counts(f)["GpuCAReduce"] + sum(len(g.op.members) for g in _groups(f)) == 5


def test_rows_known_to_be_long_are_left_to_the_planner(vgpu):
    from symgpu.gpu.ops import row_group_rewrite as R

    def count(n: int) -> collections.Counter:
        v = T.vector("v")
        x = T.exp(v.reshape((4, n)))     # a row length the shape inference knows
        return _counts(function([v], x.sum(-1) + x.max(-1)))
    long_rows = count(R.MAX_ROW + 8)
    assert "GpuRowReduceGroup" not in long_rows and long_rows["GpuCAReduce"] == 2
    short_rows = count(64)
    assert short_rows["GpuRowReduceGroup"] == 1 and not short_rows.get("GpuCAReduce")


@pytest.fixture
def lnlstm(monkeypatch):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))
    import symgpu
    import rnn_cells as rc

    def bodies(**flags):
        spec = rc.parse_key("lnlstm-masked-last-b16-h128-fixed")
        with config.change_flags(**flags):
            _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec))
        return [n.op.inner.rewritten().toposort() for n in fn.maker.fgraph.toposort()
                if hasattr(n.op, "inner")]
    return bodies


def test_the_lnlstm_step_bodies(vgpu, lnlstm):
    fwd, bwd = lnlstm()
    kinds = lambda nodes: collections.Counter(type(n.op) for n in nodes)   # noqa: E731
    # forward: the 4 gates' means and (chained) variances, 8 launches -> 1
    assert kinds(fwd)[GpuCAReduce] == 0 and kinds(fwd)[GpuRowReduceGroup] == 1
    (g,) = [n for n in fwd if type(n.op) is GpuRowReduceGroup]
    assert len(g.op.members) == 8
    # backward: the recomputed forward (8) and the gradient's 12 row sums: 20 -> 3
    off_fwd, off_bwd = lnlstm(**OFF)
    assert kinds(off_fwd)[GpuCAReduce] == 8 and kinds(off_bwd)[GpuCAReduce] == 20
    assert kinds(bwd)[GpuCAReduce] == 0 and kinds(bwd)[GpuRowReduceGroup] == 3


@pytest.mark.gpu
def test_a_layer_norm_and_its_gradient_on_the_gpu(cuda):
    from gpu_helpers import on_the_cpu
    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 4 * H)).astype("float32") * 3 + 1
    w = rng.standard_normal(H).astype("float32")
    f = _gates_ln(4, True)
    assert _groups(f), "the group pass did not run on the GPU graph"
    # the gradient's sums that read the variance through elementwise work stay apart
    on, off = _counts(f), _counts(_gates_ln(4, True, **OFF))
    assert on["GpuCAReduce"] + on["GpuRowReduceGroup"] < off["GpuCAReduce"], (on, off)
    y, gx = f(x, w)
    with on_the_cpu():
        ref = _gates_ln(4, True)
    assert not any("Gpu" in type(n.op).__name__ for n in ref.maker.fgraph.toposort())
    ry, rgx = ref(x, w)
    np.testing.assert_allclose(np.asarray(y), ry, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gx), rgx, rtol=1e-3, atol=1e-4)
    xs = x.astype("float64").reshape(33, 4, H)
    mu = xs.mean(-1, keepdims=True)
    want = ((xs - mu) / np.sqrt(((xs - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).sum(1)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)
