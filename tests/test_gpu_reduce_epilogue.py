"""gpu_careduce_epilogue (symgpu/gpu/ops/reduce_epilogue.py): an elementwise op of a
reduction's result fused into the reduction's launch. The rewritten graphs are checked here on
a virtual GPU context; the fused kernels' values in tests/test_gpu_ops_emulated.py (run on the
CPU) and, compiled by nvcc, below."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, example_module, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.gpu.runtime.codegen.reduce import ReduceSignature, render_reduce

OFF = {"optimizer_excluding": "gpu_careduce_epilogue"}


def _mlp_step(**flags):
    mlp_dropout = example_module("mlp_dropout")
    with config.change_flags(**flags):
        train, _, _ = mlp_dropout.build(64, on_device=True, p_drop=0)
    return train.maker.fgraph.toposort()


def _epilogues(nodes):
    return [n for n in nodes if type(n.op) is GpuCAReduce and n.op.post_scalar_op is not None]


def test_the_mlps_bias_updates_and_mean_go_into_their_reductions_by_default(vgpu):
    # (the column groups, which take the sums the epilogue leaves, and the elementwise
    # groups, which take the update kernels it leaves, are off on both sides)
    plain = _mlp_step(optimizer_excluding="gpu_careduce_epilogue:gpu_col_reduce_group:"
                                          "gpu_elemwise_group")
    assert not _epilogues(plain)
    fused = _mlp_step(optimizer_excluding="gpu_col_reduce_group:gpu_elemwise_group")
    eps = _epilogues(fused)
    assert len(eps) == 4
    biases = [n for n in eps if n.op.axis == (0,)]
    assert len(biases) == 3               # one per bias: b - lr * d.sum(0)
    (mean,) = [n for n in eps if n.op.axis is None]
    assert "(i0 / " in str(mean.op.post_scalar_op)   # and the loss: sum / n
    assert len(fused) == len(plain) - 4   # the three update kernels and the division are gone
    updates = [n for n in plain if type(n.op) is GpuElemwise
               and "(i1 - (" in str(n.op.scalar_op)]
    assert len(updates) == 3


def test_what_the_epilogue_leaves_alone(vgpu):
    d, b, m = T.fmatrix("d"), T.fvector("b"), T.fmatrix("m")
    s = d.sum(axis=0)
    f = function([d, b], [b - 0.1 * s, b * s])          # the sum read twice: stored anyway
    g = function([d, b], [s, b - 0.1 * s])              # the sum is an output
    h = function([d, m], m - d.sum(axis=0))             # a matrix operand: broadcasts the sum
    k = function([d, b], b - 0.1 * s)                   # fused (the default passes)
    assert not _epilogues(f.maker.fgraph.toposort())
    assert not _epilogues(g.maker.fgraph.toposort())
    assert not _epilogues(h.maker.fgraph.toposort())
    (node,) = _epilogues(k.maker.fgraph.toposort())
    assert "post=" in str(node.op)


@requires_nvcc
def test_reduction_modules_with_an_epilogue_compile(tmp_path):
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.scalar.composite import CompositeBuilder
    def update(red_dtype):
        b = CompositeBuilder()
        db, bias, lr = b.add_input(red_dtype), b.add_input("float32"), b.add_input("float32")
        return b.build(b.add_op(SCALAR_OPS["sub"],
                                [bias, b.add_op(SCALAR_OPS["mul"], [lr, db])[0]]))
    post = update("float32")
    for knd, rnd in ((1, 1), (2, 1), (1, 2)):
        sig = ReduceSignature("add", None, ("float32",), "float32", knd, rnd, post,
                              ("float32", "float32"), (False, True), "float32")
        assert compile_for_sm90(render_reduce(sig), tmp_path)
    half = ReduceSignature("maximum", None, ("float16",), "float32", 1, 1, update("float16"),
                           ("float32", "float32"), (False, True), "float16")
    assert compile_for_sm90(render_reduce(half), tmp_path)
    assert np.dtype(half.acc_dtype) == np.float32


def test_an_epilogue_is_a_composite_and_its_operands_fit_the_output(vgpu):
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.scalar.composite import CompositeBuilder
    with pytest.raises(ValueError, match="fixed number of inputs"):
        GpuCAReduce(SCALAR_OPS["add"], (0,), post_scalar_op=SCALAR_OPS["mul"])
    b = CompositeBuilder()
    x, y = b.add_input("float32"), b.add_input("float32")
    times = b.build(b.add_op(SCALAR_OPS["mul"], [x, y]))
    op = GpuCAReduce(SCALAR_OPS["add"], (0,), post_scalar_op=times)
    m = GpuArrayType("float32", (False, False), None)
    with pytest.raises(TypeError, match="output's broadcast pattern"):
        op(m(), m())                                      # a matrix against a vector result
    with pytest.raises(TypeError, match="takes 2 input"):
        op(m())
    node = op(m(), GpuArrayType("float32", (True,), None)()).owner   # one value: fine
    assert node.outputs[0].type.broadcastable == (False,)
