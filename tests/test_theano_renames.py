"""Theano's names that symgpu has under other names (issue 31, symgpu/theano_paths.RENAMES and
the op aliases of symgpu/graph/op_alias.py): each one used as Theano code uses it, checked
against NumPy or against the op it names (GPU names on the virtual GPU)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.config import config
from symgpu.theano_paths import RENAMES
from symgpu.tensor.nnet import abstract_conv as ac


def _ops(f):
    return [n.op for n in f.maker.fgraph.toposort()]


def test_every_rename_resolves_to_its_target():
    for path, names in RENAMES.items():
        module = importlib.import_module(path)
        for name, target in names.items():
            mod, _, attr = target.partition(":")
            assert getattr(module, name) is getattr(importlib.import_module(mod), attr)
            assert name in dir(module)


@pytest.mark.parametrize("name,np_fn,kw", [("Sum", np.sum, {}), ("Prod", np.prod, {}),
                                           ("All", np.all, {})])
def test_reduction_classes(name, np_fn, kw):
    cls = getattr(importlib.import_module("symgpu.tensor.elemwise"), name)
    x = T.matrix("x")
    a = (np.arange(6).reshape(2, 3) % 4 + 1).astype(config.floatX)
    out = cls(axis=1)(x)
    assert isinstance(out.owner.op, cls)
    np.testing.assert_allclose(symgpu.function([x], out)(a), np_fn(a, axis=1))
    others = {"Sum": T.prod(x), "Prod": T.sum(x), "All": T.sum(x)}
    assert not isinstance(others[name].owner.op, cls)


def test_careduce_dtype_and_sum_of_t_sum():
    from symgpu.tensor.elemwise import CAReduceDtype, Sum
    x = T.matrix("x")
    out = CAReduceDtype("add", (0,), "float64")(x)
    assert out.dtype == "float64" and isinstance(out.owner.op, CAReduceDtype)
    assert isinstance(T.sum(x, axis=0).owner.op, Sum)   # Theano code inspecting our graphs
    a = np.ones((2, 3), config.floatX)
    np.testing.assert_allclose(symgpu.function([x], out)(a), [2, 2, 2])


def _conv_ref(a, w, pad):
    """Cross-correlation of (N, C, H, W) by (O, C, kh, kw) with symmetric padding."""
    a = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    out = np.zeros((a.shape[0], w.shape[0], a.shape[2] - kh + 1, a.shape[3] - kw + 1))
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            out[:, :, i, j] = np.einsum("nchw,ochw->no", a[:, :, i:i + kh, j:j + kw], w)
    return out


def test_abstract_conv2d_and_its_gradients_as_theano_builds_them():
    rng = np.random.default_rng(0)
    a = rng.random((2, 3, 6, 6)).astype(config.floatX)
    w = rng.random((4, 3, 3, 3)).astype(config.floatX)
    x, k = T.tensor4("x"), T.tensor4("k")
    y = ac.AbstractConv2d(None, None, "half", (1, 1), False)(x, k)
    assert isinstance(y.owner.op, ac.AbstractConv2d) and isinstance(y.owner.op, ac.BaseAbstractConv)
    assert isinstance(y.owner.op, ac.AbstractConv) and not isinstance(y.owner.op, ac.AbstractConv3d)
    np.testing.assert_allclose(symgpu.function([x, k], y)(a, w), _conv_ref(a, w, 1), rtol=1e-4)
    g = T.tensor4("g")
    gi = ac.AbstractConv2d_gradInputs(None, None, "half", (1, 1), False)(k, g, (6, 6))
    gw = ac.AbstractConv2d_gradWeights(None, None, "half", (1, 1), False)(x, g, (3, 3))
    assert isinstance(gi.owner.op, ac.AbstractConv2d_gradInputs)
    assert isinstance(gw.owner.op, ac.AbstractConv_gradWeights)
    gx_ref, gk_ref = T.grad(None, [x, k], known_grads={y: g})
    gv = rng.random((2, 4, 6, 6)).astype(config.floatX)
    got = symgpu.function([x, k, g], [gi, gw, gx_ref, gk_ref])(a, w, gv)
    np.testing.assert_allclose(got[0], got[2], rtol=1e-4)
    np.testing.assert_allclose(got[1], got[3], rtol=1e-4)
    c3 = ac.AbstractConv(3, None, None, "valid")(T.TensorType(config.floatX, (False,) * 5)("v"),
                                                 T.TensorType(config.floatX, (False,) * 5)("f"))
    assert isinstance(c3.owner.op, ac.AbstractConv3d)
    with pytest.raises(TypeError, match="BaseAbstractConv"):
        ac.BaseAbstractConv()


@pytest.mark.parametrize("call,expected", [
    (lambda: ac.get_conv_shape_1axis(7, 3, "valid", 2), 3),
    (lambda: ac.get_conv_shape_1axis(7, 3, "full", 1, 2), 11),
    (lambda: ac.get_conv_shape_1axis(7, 3, (2, 1), 1), 8),
    (lambda: ac.get_conv_shape_1axis(None, 3, "half", 1), None),
    (lambda: ac.get_conv_gradweights_shape_1axis(7, 5, "valid", 1, 1), 3),
    (lambda: ac.get_conv_gradweights_shape_1axis(7, 5, "half", 1, 1), None),
    (lambda: ac.get_conv_gradinputs_shape_1axis(3, 5, "valid", 1, 1), 7),
    (lambda: ac.get_conv_gradinputs_shape_1axis(3, 5, 1, 2, 1), None),
    (lambda: ac.get_conv_gradweights_shape((2, 6, 7, 7), (2, 4, 5, 5), "valid", (1, 1),
                                           None, 2), (4, 3, 3, 3)),
    (lambda: ac.get_conv_gradinputs_shape((4, 3, 3, 3), (2, 4, 7, 7), "half", (1, 1)),
     (2, 3, 7, 7)),
    (lambda: ac.check_conv_gradinputs_shape((2, 3, 7, 7), (4, 3, 3, 3), (None, 4, 5, 5),
                                            "valid", (1, 1)), True),
    (lambda: ac.check_conv_gradinputs_shape((2, 3, 7, 7), (4, 3, 3, 3), (2, 4, 6, 5),
                                            "valid", (1, 1)), False),
    (lambda: ac.border_mode_to_pad("half", 2, (3, 5)), ((1, 1), (2, 2))),
    (lambda: ac.border_mode_to_pad("full", 2, (3, 5)), ((2, 2), (4, 4))),
    (lambda: ac.border_mode_to_pad((1, (0, 2)), 2, (3, 3)), ((1, 1), (0, 2))),
])
def test_conv_shape_arithmetic(call, expected):
    assert call() == expected


def test_conv_shape_arithmetic_agrees_with_the_op():
    x, k = T.tensor4("x"), T.tensor4("k")
    y = ac.conv2d(x, k, border_mode=(2, 1), subsample=(2, 1), filter_dilation=(1, 2))
    out = symgpu.function([x, k], y)(np.zeros((1, 2, 9, 8), config.floatX),
                                     np.zeros((3, 2, 3, 3), config.floatX))
    assert out.shape[2:] == (ac.get_conv_shape_1axis(9, 3, 2, 2, 1),
                             ac.get_conv_shape_1axis(8, 3, 1, 1, 2))


def test_bilinear_kernels():
    k1 = symgpu.function([], ac.bilinear_kernel_1D(3))()
    np.testing.assert_allclose(k1, np.array([1, 2, 3, 2, 1]) / 3)
    k2 = symgpu.function([], ac.bilinear_kernel_2D(2, normalize=False))()
    np.testing.assert_allclose(k2, np.outer([1, 2, 1], [1, 2, 1]))


def test_separable_conv2d_is_depthwise_then_pointwise():
    rng = np.random.default_rng(1)
    a = rng.random((1, 2, 5, 5)).astype(config.floatX)
    dw = rng.random((4, 1, 3, 3)).astype(config.floatX)     # 2 channels x depth multiplier 2
    pw = rng.random((3, 4, 1, 1)).astype(config.floatX)
    x, d, p = T.tensor4("x"), T.tensor4("d"), T.tensor4("p")
    out = symgpu.function([x, d, p], ac.separable_conv2d(x, d, p, 2, filter_flip=False))(a, dw, pw)
    depth = np.concatenate([_conv_ref(a[:, c:c + 1], dw[2 * c:2 * c + 2], 0) for c in range(2)],
                           axis=1)
    np.testing.assert_allclose(out, np.einsum("nchw,oc->nohw", depth, pw[:, :, 0, 0]), rtol=1e-4)


def test_causal_conv1d_sees_only_the_past():
    rng = np.random.default_rng(2)
    a = rng.random((2, 3, 9)).astype(config.floatX)
    f = rng.random((4, 3, 2)).astype(config.floatX)
    i, w = T.tensor3("i"), T.tensor3("w")
    out = symgpu.function([i, w], ac.causal_conv1d(i, w, (4, 3, 2), filter_flip=False,
                                                   filter_dilation=2))(a, f)
    ap = np.pad(a, ((0, 0), (0, 0), (2, 0)))
    ref = np.stack([np.einsum("nck,ock->no", ap[:, :, [t, t + 2]], f) for t in range(9)], -1)
    np.testing.assert_allclose(out, ref, rtol=1e-4)


# ------------------------------------------------------------------------- the GPU names
def test_context_functions_under_theano_names(vgpu):
    from symgpu.gpuarray import type as gt
    from symgpu.gpu.runtime import context
    assert gt.get_context(None) is vgpu and None in gt.list_contexts()
    ctx = gt.reg_context("names3_ctx", None)
    try:
        assert gt.get_context("names3_ctx") is ctx and "names3_ctx" in gt.list_contexts()
    finally:
        context.unregister_context("names3_ctx")


def test_dnn_functions_lift_to_the_ops_theano_names(vgpu):
    from symgpu.gpuarray import dnn
    x, k = T.tensor4("x"), T.tensor4("k")
    y = dnn.dnn_conv(x, k, border_mode="half", conv_mode="cross")
    assert not y.owner.op.filter_flip
    g = T.tensor4("g")
    f = symgpu.function([x, k, g], [y, dnn.dnn_gradinput(k, g, (2, 3, 6, 6)),
                                    dnn.dnn_gradweight(x, g, (4, 3, 3, 3)),
                                    dnn.dnn_pool(x, (2, 2), mode="average")])
    ops = _ops(f)
    for cls in (dnn.GpuDnnConv, dnn.GpuDnnConvGradI, dnn.GpuDnnConvGradW, dnn.GpuDnnPool):
        assert any(isinstance(op, cls) for op in ops), (cls, ops)
    pool = next(op for op in ops if isinstance(op, dnn.GpuDnnPool))
    assert pool.mode == "average_inc_pad"


def test_dnn_batch_normalization_is_ours(vgpu):
    from symgpu.gpuarray import dnn
    from symgpu.tensor.nnet import bn
    x, g, b = T.tensor4("x"), T.tensor4("g"), T.tensor4("b")
    out, mean, invstd = dnn.dnn_batch_normalization_train(x, g, b, "spatial")
    ref = bn.batch_normalization_train(x, g, b, "spatial")
    assert len(ref) == 3 and out.type == ref[0].type and mean.type == ref[1].type
    m, v = T.tensor4("m"), T.tensor4("v")
    t = dnn.dnn_batch_normalization_test(x, g, b, m, v, "spatial", 1e-3)
    assert t.type == bn.batch_normalization_test(x, g, b, m, v, "spatial", 1e-3).type


def test_dnn_functions_need_a_gpu():
    from symgpu.gpuarray import dnn
    from symgpu.gpu.runtime import context
    if None in context.context_names():
        pytest.skip("a default GPU context is registered")
    with pytest.raises(RuntimeError, match="dnn_conv runs on the GPU"):
        dnn.dnn_conv(T.tensor4(), T.tensor4())


def test_gpu_class_names_match_the_lifted_ops(vgpu):
    from symgpu.gpuarray import basic_ops, elemwise, nnet, subtensor
    x, y = T.matrix("x"), T.matrix("y")
    i = T.lvector("i")
    f = symgpu.function([x, y, i], [T.sum(x, axis=0), T.nnet.softmax(x),
                                    T.concatenate([x, y]), T.inc_subtensor(x[i], y)])
    ops = _ops(f)
    for cls in (elemwise.GpuCAReduceCuda, nnet.GpuSoftmax, basic_ops.GpuJoin,
                subtensor.GpuAdvancedIncSubtensor1_dev20):
        assert any(isinstance(op, cls) for op in ops), (cls, ops)
    assert not any(isinstance(op, nnet.GpuSoftmaxWithBias) for op in ops)
    assert basic_ops.infer_context_name(x, f.maker.fgraph.outputs[0]) is None
    gpu_var = next(v for n in f.maker.fgraph.toposort() for v in n.outputs
                   if type(v.type).__name__ == "GpuArrayType")
    assert basic_ops.infer_context_name(x, gpu_var) == gpu_var.type.context_name
    assert isinstance(basic_ops.GpuAllocEmpty("float32", None), basic_ops.GpuAllocEmpty)
    b = nnet.GpuSoftmaxWithBias()
    assert b.bias and not b.log and isinstance(b, nnet.GpuSoftmaxWithBias)
