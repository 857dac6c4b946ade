"""gpu_col_reduce_group (symgpu/gpu/ops/col_group_rewrite.py): rewritten graphs inspected on a
virtual GPU (bias gradients beside the elementwise gradient they sum, a layer norm's gain and
bias gradients, the mixed-precision GPT block of benchmarks/half_symgpu.py), and an MLP's
gradients on the real GPU against the CPU."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import config, function, grad
from symgpu.gpu.ops.col_group import GpuColumnReduceGroup
from symgpu.graph.basic import ancestors

OFF = {"optimizer_excluding": "gpu_col_reduce_group"}


def _counts(f) -> collections.Counter:
    return collections.Counter(type(n.op).__name__ for n in f.maker.fgraph.toposort())


def _groups(f) -> list:
    return [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuColumnReduceGroup]


def _acyclic(f) -> None:
    for g in _groups(f):
        assert not set(g.outputs) & set(ancestors(g.inputs))


def _mlp(act, three_d: bool = False, **flags):
    """Two layers with biases, ``act`` between; the gradients of every parameter (the input
    of three dims, as a sequence model's (batch, time, features), with ``three_d``)."""
    x = T.tensor3("x") if three_d else T.matrix("x")
    w1, b1, w2, b2 = T.matrix("w1"), T.vector("b1"), T.matrix("w2"), T.vector("b2")
    h = act(T.dot(x, w1) + b1)
    loss = T.sqr(T.dot(h, w2) + b2).sum()
    with config.change_flags(**flags):
        return function([x, w1, b1, w2, b2], grad(loss, [w1, b1, w2, b2]))


@pytest.mark.parametrize("act", [T.tanh, T.nnet.sigmoid, lambda h: T.maximum(h, 0)],
                         ids=["tanh", "sigmoid", "relu"])
@pytest.mark.parametrize("three_d", [False, True])
def test_a_bias_gradient_is_summed_where_its_gradient_is_computed(vgpu, act, three_d):
    on, off = _mlp(act, three_d), _mlp(act, three_d, **OFF)
    c_on, c_off = _counts(on), _counts(off)
    assert "GpuColumnReduceGroup" not in c_off
    groups = _groups(on)
    assert groups and c_on["GpuCAReduce"] < c_off["GpuCAReduce"]
    # the hidden layer's bias gradient joins the map computing the activation's gradient
    mapped = [g for g in groups if g.op.map_op is not None]
    assert mapped and all(len(g.op.members) >= 1 for g in mapped)
    for g in groups:
        assert g.outputs[-1].broadcastable == (False,)
    _acyclic(on)


def test_sibling_sums_of_one_operand_and_a_written_map(vgpu):
    x, b, w = T.matrix("x"), T.vector("b"), T.matrix("w")
    d = T.tanh(x + b)
    # the pre-op fusion recomputes d in both sums: siblings reading x and b, nothing written
    f = function([x, b], [d.sum(0), (d * 2).max(0)])
    (g,) = _groups(f)
    assert g.op.map_op is None and g.op.kept == () and len(g.op.members) == 2
    assert "GpuCAReduce" not in _counts(f)
    # d is also a product's operand: the map writes it, and its sum joins the map
    f2 = function([x, b, w], [d.sum(0), T.dot(d, w)])
    (g2,) = _groups(f2)
    assert g2.op.map_op is not None and g2.op.kept == (True,) and len(g2.outputs) == 2
    assert "GpuElemwise" not in _counts(f2)


def test_a_layer_norms_gain_gradient_joins_its_backward_map(vgpu):
    x, g, b = T.matrix("x"), T.vector("g"), T.vector("b")
    mu = x.mean(-1, keepdims=True)
    xhat = (x - mu) / T.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    loss = T.sqr(xhat * g + b).sum()
    on = function([x, g, b], grad(loss, [x, g, b]))
    with config.change_flags(**OFF):
        off = function([x, g, b], grad(loss, [x, g, b]))
    # (the bias gradient keeps its epilogue, 2.0 * sum: a GpuCAReduce of its own)
    (grp,) = _groups(on)
    assert grp.op.map_op is not None and len(grp.op.members) == 1
    assert _counts(on)["GpuCAReduce"] == _counts(off)["GpuCAReduce"] - 1
    assert _counts(on)["GpuElemwise"] == _counts(off)["GpuElemwise"] - 1
    _acyclic(on)


def test_reductions_of_other_dims_stay_apart(vgpu):
    x = T.tensor3("x")
    e = T.exp(x)
    f = function([x], [e.sum(-1), e.sum((0, 2)), e.sum(0)])
    assert not _groups(f)


def test_a_reduction_reading_what_the_map_feeds_stays_apart(vgpu):
    # (e * z).sum(0) reads z, a product of the map's output: in one group with the map that
    # writes e it would wait on itself
    x, w = T.matrix("x"), T.matrix("w")
    e = T.tanh(x)
    z = T.dot(e, w)
    f = function([x, w], [e.sum(0), (e * z).sum(0), z])
    _acyclic(f)
    (g,) = _groups(f)
    assert g.op.map_op is not None and len(g.op.members) == 1     # e and e.sum(0)
    assert _counts(f)["GpuCAReduce"] == 1                           # (e * z).sum(0)


def test_the_gpt_blocks_column_sums_join_their_producers(vgpu, gpt_step):
    """The block's eight column sums, its GELU an elementwise kernel (the GELU epilogues off,
    as for GELU's erf form): the GELU backward's bias gradient with the map that computes
    it; the second layer norm's gain gradient and its bias gradient with its backward map;
    the first's gain and bias gradients as siblings (one operand); the residual's and the
    MLP output's bias gradients with the maps that write their operands.  One stays (the
    qkv bias gradient: a sum of the attention gradient's join)."""
    elementwise_gelu = "gpu_gelu_epilogue"
    on = gpt_step(optimizer_excluding=elementwise_gelu)
    off = gpt_step(optimizer_excluding=f"{OFF['optimizer_excluding']}:{elementwise_gelu}")
    c_on, c_off = _counts(on), _counts(off)
    groups = _groups(on)
    assert len(groups) == 4
    assert sorted(len(g.op.members) for g in groups) == [1, 2, 2, 2]
    assert sum(g.op.map_op is not None for g in groups) == 3
    assert c_off["GpuCAReduce"] - c_on["GpuCAReduce"] == 7
    assert c_off["GpuElemwise"] - c_on["GpuElemwise"] == 3
    _acyclic(on)


def test_with_the_gelu_in_its_products_the_other_groups_stay(vgpu, gpt_step):
    """The default: the GELU's gradient is the DGELU epilogue's, and its bias gradient a
    plain column sum of that product's half result; the layer norms' three groups stay."""
    f = gpt_step()
    groups = _groups(f)
    assert sorted(len(g.op.members) for g in groups) == [2, 2, 2]
    _acyclic(f)


@pytest.mark.gpu
def test_an_mlps_gradients_on_the_gpu(cuda):
    from gpu_helpers import on_the_cpu
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s).astype("float32") * 0.5
            for s in ((4, 50, 24), (24, 96), (96,), (96, 8), (8,))]
    f = _mlp(T.tanh, three_d=True)
    assert _groups(f), "the column group pass did not run on the GPU graph"
    got = f(*vals)
    with on_the_cpu():
        ref = _mlp(T.tanh, three_d=True)
    assert not any("Gpu" in type(n.op).__name__ for n in ref.maker.fgraph.toposort())
    for a, b in zip(got, ref(*vals)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4)
    off = _mlp(T.tanh, three_d=True, **OFF)
    for a, b in zip(got, off(*vals)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,axis", [((8192, 2304), (0,)), ((8192, 771), (0,)),
                                        ((8, 1024, 768), (0, 1)), ((3001, 130), (0,))])
def test_sibling_column_sums_on_the_gpu(cuda, dtype, shape, axis):
    """tests/test_gpu_reduce_cols_tile.py's sums, with the groups: a sum, a sum kept, a
    float32 sum of a half array and a max (or a sum of a column slice: not aligned) of one
    operand, one pass, against the CPU."""
    import symgpu
    from gpu_helpers import on_the_cpu
    rng = np.random.default_rng(shape[-1] + len(shape))
    host = rng.uniform(-1, 1, shape).astype(dtype)
    from test_gpu_reduce_cols_tile import column_sums
    x = T.tensor(dtype, (False,) * len(shape))
    outs = column_sums(x, axis)
    f = symgpu.function([x], outs)
    if dtype == "float32" and len(shape) == 2:
        # x's sum, its kept twin and its float32 sum merge into one reduction, and the slice's
        # sum has another operand: nothing to group
        assert not _groups(f)
    else:
        assert _groups(f)
    got = f(host)
    with on_the_cpu():
        want = symgpu.function([x], outs)(host)
    for a, b in zip(got, want):
        a, b = np.asarray(a).astype("float64"), np.asarray(b).astype("float64")
        tol = 1e-5 if dtype == "float32" else 1e-2
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
