"""Column-group members with an epilogue (ColMember.post_op): a bias's SGD update
``b - lr * (dy * (x + b > 0)).sum(0)`` stored by the group that computes the ReLU backward
(what a GpuCAReduce with an epilogue stored alone). The kernel on the CPU emulator against
NumPy (row tiles combined by the last block, and one row tile), into a write_into target (the
bias's own buffer, as a direct update writes it); the rewrite on a virtual GPU (an MLP's
hidden biases); nvcc; an MLP step on the GPU against the CPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, host_view, run_node
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.col_group import ColMember, GpuColumnReduceGroup
from symgpu.scalar.basic import SCALAR_OPS as S, Cast
from symgpu.scalar.composite import CompositeBuilder

LR = 0.01


def _relu_grad(cast: bool):
    """(x bf16, b f32, dy bf16) -> dy * (x + b >= 0) (``cast``: stored as bfloat16)."""
    c = CompositeBuilder()
    x, b, dy = c.add_input("bfloat16"), c.add_input("float32"), c.add_input("bfloat16")
    on = c.add_op(S["ge"], [c.add_op(S["add"], [c.add_op(Cast("float32"), [x])[0], b])[0],
                            c.add_constant(0.0, "float32")])[0]
    d = c.add_op(S["mul"], [c.add_op(Cast("float32"), [dy])[0], on])
    return c.build(c.add_op(Cast("bfloat16"), d) if cast else d)


def _sgd():
    """(sum, b) -> b - LR * sum"""
    c = CompositeBuilder()
    s, b = c.add_input("float32"), c.add_input("float32")
    return c.build(c.add_op(S["sub"], [b, c.add_op(S["mul"], [c.add_constant(LR, "float32"),
                                                               s])[0]]))


def _group():
    member = ColMember("add", _relu_grad(False), (0, 1, 2), "float32", _sgd(), (1,))
    return GpuColumnReduceGroup([member], _relu_grad(True), (0, 1, 2), (True,))


def _node():
    return _group()(gpu_var("bfloat16", 2), gpu_var("float32", 2, (True, False)),
                    gpu_var("bfloat16", 2))[0].owner


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.col_group as cg
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(cg, "_context", lambda name: ctx)
    return ctx


def _arrays(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)).astype("bfloat16"),
            rng.standard_normal((1, cols)).astype("float32"),
            rng.standard_normal((rows, cols)).astype("bfloat16"))


def _want(x, b, dy):
    d = dy.astype("float32") * (x.astype("float32") + b >= 0)
    return d, (b[0] - np.float32(LR) * d.sum(0, dtype="float64").astype("float32"))


@requires_gxx
@pytest.mark.parametrize("rows,cols,rows_per_lane", [(512, 96, 1), (40, 130, 1000)])
def test_the_update_is_stored_by_the_group(emu, monkeypatch, rows, cols, rows_per_lane):
    import symgpu.gpu.ops.col_group as cg
    monkeypatch.setattr(cg._ColGroupThunk, "rows_per_lane", lambda self, K, R: rows_per_lane)
    node = _node()
    assert str(node.op).endswith("post=Composite{(i1 - (0.009999999776482582 * i0))}}")
    x, b, dy = _arrays(rows, cols)
    (d, b_new), thunk, _ = run_node(node, [device_array(emu, a) for a in (x, b, dy)])
    want_d, want_b = _want(x, b, dy)
    np.testing.assert_allclose(d.astype("float32"), want_d, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(b_new, want_b, rtol=1e-5, atol=1e-5)
    G = next(iter(thunk.col_group_thunk.plans.values()))[1]
    assert (G > 1) == (rows_per_lane == 1)


@requires_gxx
def test_the_update_goes_into_a_write_into_target_the_group_reads(emu):
    """The bias's own buffer as the member's target (graph_segment's direct update), read by
    the group as its (1, cols) operand: every column's pre-op reads the old values, its
    result lands in place; the thunk vouches for that read (aligned_read)."""
    from gpu_helpers import thunk_over
    node = _node()
    x, b, dy = _arrays(300, 64, seed=1)
    bias = device_array(emu, b[0])
    vals = [device_array(emu, x), bias._view(bias.ptr, (1, 64), (0, 4)), device_array(emu, dy)]
    thunk, storage = thunk_over(node, vals)
    assert thunk.aligned_read(vals[1], bias)
    assert not thunk.aligned_read(vals[0], bias)
    thunk.write_into[1] = bias
    thunk()
    assert storage[node.outputs[1]][0] is bias
    np.testing.assert_allclose(host_view(bias), _want(x, b, dy)[1], rtol=1e-5, atol=1e-5)


def test_epilogue_errors():
    with pytest.raises(ValueError, match="does not take the result and 0 operands"):
        GpuColumnReduceGroup([ColMember("add", None, (0,), "float32", _sgd(), ())])
    with pytest.raises(ValueError, match="give its reduction's own dtype"):
        GpuColumnReduceGroup([ColMember("add", None, (0,), None, _sgd(), (0,))])
    bad = GpuColumnReduceGroup([ColMember("add", None, (0,), "float32", _sgd(), (0,))])
    with pytest.raises(TypeError, match="one value per column"):
        bad(gpu_var("float32", 2))


def _mlp(**flags):
    """Two ReLU layers with biases, SGD: the hidden biases' updates join the groups of their
    layers' backward maps; the last layer's (a sum of the loss's gradient) stays."""
    rng = np.random.default_rng(4)
    with config.change_flags(mixed_precision="bfloat16", **flags):
        x, y = T.matrix("x"), T.lvector("y")
        ps = [symgpu.shared(rng.standard_normal(s).astype("float32") * 0.3, name=n)
              for s, n in (((12, 16), "w0"), ((16,), "b0"), ((16, 16), "w1"), ((16,), "b1"),
                           ((16, 5), "w2"), ((5,), "b2"))]
        h = x
        for k in range(3):
            h = T.dot(h, ps[2 * k]) + ps[2 * k + 1]
            if k < 2:
                h = T.maximum(h, 0)
        lp = T.nnet.logsoftmax(h)
        loss = -T.mean(lp[T.arange(y.shape[0]), y])
        f = function([x, y], loss, updates=[(p, p - LR * g)
                                            for p, g in zip(ps, T.grad(loss, ps))])
    return f, ps


def _groups(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuColumnReduceGroup)]


def test_an_mlps_hidden_bias_updates_join_their_groups(vgpu):
    on, off = _mlp()[0], _mlp(optimizer_excluding="gpu_col_reduce_group")[0]
    groups = _groups(on)
    assert len(groups) == 2 and all(g.op.members[0].post_op is not None for g in groups)
    names = [type(n.op).__name__ for n in on.maker.fgraph.toposort()]
    off_names = [type(n.op).__name__ for n in off.maker.fgraph.toposort()]
    assert names.count("GpuCAReduce") == off_names.count("GpuCAReduce") - 2


@requires_nvcc
def test_the_epilogue_module_compiles(tmp_path, vgpu):
    node = _node()
    ((_, src),) = node.op.kernel_sources(node)
    assert "cg_post0" in src
    assert compile_for_sm90(src, tmp_path)


@pytest.mark.gpu
def test_an_mlp_step_on_the_gpu_against_the_cpu(cuda):
    from gpu_helpers import on_the_cpu
    rng = np.random.default_rng(9)
    xv = rng.standard_normal((64, 12)).astype("float32")
    yv = rng.integers(0, 5, 64).astype("int64")
    f, ps = _mlp()
    assert len(_groups(f)) == 2
    with on_the_cpu():
        ref, ps_cpu = _mlp()
    for _ in range(10):   # captured, then replayed: the biases updated in place
        got, want = float(np.asarray(f(xv, yv))), float(ref(xv, yv))
        assert abs(got - want) < 3e-2 * max(1.0, abs(want))
    assert f.vm.runner.stats()["replays"] > 0
    for p, q in zip(ps, ps_cpu):
        np.testing.assert_allclose(np.asarray(p.get_value()), q.get_value(), atol=3e-2)


def test_small_groups_take_more_row_tiles():
    """Rows a lane: 12 where the column tiles and row tiles fill the GPU (the GPT block's
    (8192, 768) layer norm groups), fewer where they would leave multiprocessors idle (an
    MLP's (512, 1024) ReLU backward: 24 blocks at 12 rows a lane; then 32 row tiles, the
    most MAX_ROW_TILES allows)."""
    from symgpu.gpu.ops.col_group import _ColGroupThunk
    from symgpu.gpu.runtime.codegen import layout
    thunk = _ColGroupThunk.__new__(_ColGroupThunk)
    thunk.sig, thunk.sms = _group().signature(_node()), 132
    assert thunk.sig.cols_vector == 8
    assert thunk.rows_per_lane(768, 8192) == 12
    rows = thunk.rows_per_lane(1024, 512)
    grid, G, _ = layout.cols_tile_grid(1024, 512, 8, 132, rows)
    assert rows == 2 and G == 32 and grid[0] * G >= 66
