"""GpuElemwiseGroup (gpu/ops/elemwise_group.py) and the pass gpu_elemwise_group: independent
elementwise kernels run by one launch. The kernel runs on the CPU emulator
(tests/emulated_gpu.py) against NumPy (several members, scalars, a multi-output member, one in
place, a misaligned operand, an empty member, a strided layout that sends every member to its
own kernel); rewritten graphs are read on a virtual GPU (the mixed-precision MLP's casts and
SGD updates, the GPT block's casts and AdamW updates); nvcc compiles the modules; an MLP
step on the GPU equals the ungrouped one."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, record_launches, run_node
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup
from symgpu.gpu.ops.elemwise_group_rewrite import _groups
from symgpu.graph.fg import FunctionGraph
from symgpu.scalar.basic import SCALAR_OPS as S, Cast
from symgpu.scalar.composite import CompositeBuilder

OFF = {"optimizer_excluding": "gpu_elemwise_group"}
RNG = np.random.default_rng(17)


def _adam_like():
    """(m, g) -> (0.9 m + 0.1 g, m * g): a two-output member."""
    b = CompositeBuilder()
    m, g = b.add_input("float32"), b.add_input("float32")
    mix = b.add_op(S["add"], [b.add_op(S["mul"], [b.add_constant(0.9, "float32"), m])[0],
                              b.add_op(S["mul"], [b.add_constant(0.1, "float32"), g])[0]])[0]
    return b.build([mix, b.add_op(S["mul"], [m, g])[0]])


def _group():
    members = [GpuElemwise(Cast("bfloat16")), GpuElemwise(S["sub"]), GpuElemwise(_adam_like()),
               GpuElemwise(S["mul"], {0: 0})]
    return GpuElemwiseGroup(members, [(1, 1), (2, 1), (2, 2), (2, 1)])


def _node():
    return _group()(gpu_var("float32", 2), gpu_var("float32", 1), gpu_var("float32", 1, (True,)),
                    gpu_var("float32", 2), gpu_var("float32", 2),
                    gpu_var("float32", 1), gpu_var("float32", 1))[0].owner


def _expected(vals):
    w, a, s, m, g, x, y = vals
    return [w.astype("bfloat16"), a - s, 0.9 * m + 0.1 * g, m * g, x * y]


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.elemwise_group as eg
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(eg, "_context", lambda name: ctx)
    return ctx


@requires_gxx
@pytest.mark.parametrize("sizes", [(130, 1001, 64, 7), (4, 8, 4, 0)])
def test_members_in_one_launch_match_numpy(emu, monkeypatch, sizes):
    rows, n, cols, k = sizes
    vals = [RNG.standard_normal((rows, cols)).astype("float32"),
            RNG.standard_normal(n).astype("float32"), np.array([0.5], "float32"),
            RNG.standard_normal((3, cols)).astype("float32"),
            RNG.standard_normal((3, cols)).astype("float32"),
            RNG.standard_normal(k).astype("float32"), RNG.standard_normal(k).astype("float32")]
    launches = record_launches(monkeypatch)
    node = _node()
    got, _, storage = run_node(node, [device_array(emu, v) for v in vals])
    assert launches == ["hz_run"]
    for a, b in zip(got, _expected(vals)):
        np.testing.assert_allclose(a.astype("float64"), b.astype("float64"), rtol=1e-6)
    # the in-place member wrote into its first input
    assert storage[node.outputs[-1]][0] is storage[node.inputs[5]][0]


@requires_gxx
def test_a_misaligned_operand_takes_the_scalar_loop_and_a_strided_one_its_own_kernels(emu,
                                                                                 monkeypatch):
    vals = [RNG.standard_normal((9, 40)).astype("float32"),
            RNG.standard_normal(1001).astype("float32"), np.array([2.0], "float32"),
            RNG.standard_normal((3, 8)).astype("float32"),
            RNG.standard_normal((3, 8)).astype("float32"),
            RNG.standard_normal(5).astype("float32"), RNG.standard_normal(5).astype("float32")]
    arrays = [device_array(emu, v) for v in vals]
    whole = device_array(emu, RNG.standard_normal(1002).astype("float32"))
    arrays[1] = whole._view(whole.ptr + 4, (1001,), (4,))        # off the 16-byte grid
    vals[1] = np.array(emulated_host(arrays[1]))
    launches = record_launches(monkeypatch)
    got, thunk, storage = run_node(_node(), arrays)
    assert launches == ["hz_run"]
    for a, b in zip(got, _expected(vals)):
        np.testing.assert_allclose(a.astype("float64"), b.astype("float64"), rtol=1e-6)
    # a transposed member: no contiguous plan, so every member launches its own kernel
    node = _node()
    arrays = [device_array(emu, v) for v in vals]
    t = device_array(emu, np.ascontiguousarray(vals[0].T))
    arrays[0] = t._view(t.ptr, (9, 40), (4, 36))
    del launches[:]
    got, _, _ = run_node(node, arrays)
    assert "hz_run" not in launches and len(launches) == 4, launches
    for a, b in zip(got, _expected(vals)):
        np.testing.assert_allclose(a.astype("float64"), b.astype("float64"), rtol=1e-6)


def emulated_host(a):
    from emulated_gpu import host_view
    return host_view(a)


def test_props_make_node_and_errors():
    op = _group()
    assert op == _group() and op.destroy_map == {4: [5]}
    assert str(op) == "GpuElemwiseGroup{4 kernels}"
    node = _node()
    assert [o.dtype for o in node.outputs] == ["bfloat16"] + ["float32"] * 4
    # the prefetch compiles the group's module and each member's (run alone where a layout
    # has no contiguous plan)
    keys = [k for k, _, _ in op.prefetch_sources(node)]
    assert keys[0][0] == "symgpu.elemwise_group" and len(keys) == 5 and \
        all(k[0] == "symgpu.elemwise" for k in keys[1:])
    with pytest.raises(TypeError, match="takes 7 inputs"):
        op(gpu_var("float32", 1))
    with pytest.raises(ValueError, match="two or more members"):
        GpuElemwiseGroup([GpuElemwise(S["exp"])], [(1, 1)])


def _mlp_step(**flags):
    with config.change_flags(mixed_precision="bfloat16", **flags):
        x, y = T.matrix("x"), T.lvector("y")
        ws = [symgpu.shared(RNG.standard_normal(s).astype("float32")) for s in ((8, 16), (16, 5))]
        h = T.maximum(T.dot(x, ws[0]), 0)
        lp = T.nnet.logsoftmax(T.dot(h, ws[1]))
        loss = -T.mean(lp[T.arange(y.shape[0]), y])
        return function([x, y], [], updates=[(w, w - 0.1 * g)
                                             for w, g in zip(ws, T.grad(loss, ws))])


def _group_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuElemwiseGroup)]


def test_an_mlps_casts_and_updates_are_two_groups(vgpu):
    groups = _group_nodes(_mlp_step())
    # sources: the casts of x, w0 and w1; sinks: the updates of w0 and w1 (the loss
    # gradient's -1/n of the labels' count, a source too, is computed by the NLL gradient's
    # node: gpu_nll_grad_count; without that pass it joins the sources)
    assert [len(g.op.members) for g in groups] == [3, 2], groups
    sources, updates = groups
    assert all(str(m.scalar_op) == "Cast{bfloat16}" for m in sources.op.members)
    groups = _group_nodes(_mlp_step(optimizer_excluding="gpu_nll_grad_count"))
    names = sorted(str(m.scalar_op) for m in groups[0].op.members)
    assert names[:3] == ["Cast{bfloat16}"] * 3 and "reciprocal" in names[3], names
    assert all(o.dtype == "float32" for o in updates.outputs)
    assert not _group_nodes(_mlp_step(**OFF))


def test_the_gpt_blocks_casts_and_adamw_updates_are_two_groups(vgpu, gpt_step):
    f = gpt_step()
    groups = _group_nodes(f)
    # the casts to bfloat16 of the four weights and of the qkv and MLP biases (gemm_epilogue
    # and gelu_epilogue_rewrite cast them for their products' epilogues), the step counter's
    # to float32, the bias correction's terms
    assert sorted(len(g.op.members) for g in groups) == [8, 12], groups
    adamw = max(groups, key=lambda g: len(g.op.members))
    assert all(m.nout == 3 for m in adamw.op.members)     # moments and weight
    fg = f.maker.fgraph
    for g in groups:   # acyclic: no member reads a member's result
        assert not set(g.outputs) & set(g.inputs)
        assert all(c == "output" or type(c.op).__name__ == "HostFromGpu"
                   for o in adamw.outputs for c, _ in fg.clients[o])


def test_a_destroyed_input_read_by_another_member_splits_the_group(vgpu):
    a, b, c = (gpu_var("float32", 1) for _ in range(3))
    first = GpuElemwise(S["add"], {0: 0})(a, b)      # destroys a
    second = GpuElemwise(S["mul"])(a, c)             # reads a: not in first's group
    third = GpuElemwise(S["sub"])(b, c)
    fg = FunctionGraph([a, b, c], [first, second, third], clone=False)
    runs = _groups(fg)
    assert all(not ({first.owner, second.owner} <= set(r)) for r in runs), runs
    assert any(third.owner in r for r in runs)
    # the same through a view: the reader sees the destroyed memory as a dimshuffle
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    d, e = gpu_var("float32", 2), gpu_var("float32", 2)
    wrecks = GpuElemwise(S["add"], {0: 0})(d, e)
    peeks = GpuElemwise(S["exp"])(GpuDimShuffle((False, False), (1, 0))(d))
    fg = FunctionGraph([d, e], [wrecks, peeks], clone=False)
    assert not any({wrecks.owner, peeks.owner} <= set(r) for r in _groups(fg))


@requires_nvcc
def test_the_groups_modules_compile(tmp_path, vgpu, gpt_step):
    for f in (_mlp_step(), gpt_step()):
        for g in _group_nodes(f):
            ((_, src),) = g.op.kernel_sources(g)
            assert compile_for_sm90(src, tmp_path)


@pytest.mark.gpu
def test_an_mlp_step_with_groups_equals_it_without(cuda):
    state = RNG.bit_generator.state
    grouped = _mlp_step()
    assert len(_group_nodes(grouped)) == 2
    RNG.bit_generator.state = state
    plain = _mlp_step(**OFF)
    xv = RNG.standard_normal((32, 8)).astype("float32")
    yv = RNG.integers(0, 5, 32).astype("int64")
    for _ in range(12):   # captured, then replayed
        grouped(xv, yv)
        plain(xv, yv)
    for f in (grouped, plain):
        assert f.vm.runner.stats()["replays"] > 0
    ws = [[np.asarray(v.get_value()) for v in f.maker.fgraph.inputs
           if hasattr(v, "get_value")] for f in (grouped, plain)]
    for a, b in zip(*ws):
        np.testing.assert_array_equal(a, b)
