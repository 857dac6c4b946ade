"""The pooling gradients' elementwise epilogue (symgpu/gpu/ops/pooling_epilogue.py): which graphs
fuse (CPU, virtual context), that the kernels compile (nvcc), and on a GPU that the fused
kernels give the CPU's values for max and average pooling, float32 and float64, both index
widths."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import pooling as gpooling
from symgpu.gpu.ops.pooling_epilogue import MAX_EXTRA, GpuPoolGradEpilogue, epilogue_source
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.tensor.signal.pool import pool_2d

RNG = np.random.default_rng(171)


def _tanh_pool_grad(x, gz, mode="max", **kw):
    """d/dx of <pool(tanh(x)), gz>: the pooling's gradient times tanh's derivative, which
    reads the pooling's input a = tanh(x)."""
    a = T.tanh(x)
    return symgpu.grad((pool_2d(a, (2, 2), mode=mode, **kw) * gz).sum(), x)


def _nodes(f, name):
    return [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == name]


@pytest.mark.parametrize("mode", ["max", "average_exc_pad", "sum"])
def test_activation_derivative_fuses_into_the_pooling_gradient(mode):
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, gz = T.tensor4("x"), T.tensor4("gz")
        f = function([x, gz], _tanh_pool_grad(x, gz, mode))
    fused = _nodes(f, "GpuPoolGradEpilogue")
    assert len(fused) == 1, f.maker.fgraph.toposort()
    assert fused[0].op.mode == mode and set(fused[0].op.roles) == {"g", "x"}
    assert not _nodes(f, "GpuMaxPoolGrad") and not _nodes(f, "GpuAveragePoolGrad")
    # the epilogue reads the pooling's input, tanh's output: nothing but the copy to the
    # host comes after it
    out = f.maker.fgraph.outputs[0]
    assert type(out.owner.op).__name__ == "HostFromGpu" and out.owner.inputs[0].owner is fused[0]


def test_no_fusion_where_the_gradient_is_read_elsewhere_or_other_operands_come_in():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, gz, s = T.tensor4("x"), T.tensor4("gz"), T.tensor4("s")
        a = T.tanh(x)
        gp = symgpu.grad((pool_2d(a, (2, 2)) * gz).sum(), a)
        # the pooling gradient itself is an output too
        f = function([x, gz], [gp * (1 - a * a), gp])
        assert not _nodes(f, "GpuPoolGradEpilogue") and _nodes(f, "GpuMaxPoolGrad")
        # a broadcast operand: two kernels stay
        b = T.TensorType("float32", (True, False, True, True))("b")
        f = function([x, gz, b], gp * (1 - a * a) * b)
        assert not _nodes(f, "GpuPoolGradEpilogue") and _nodes(f, "GpuMaxPoolGrad")
        # four more full operands than the gradient and x: more than MAX_EXTRA
        more = [T.tensor4(f"s{k}") for k in range(MAX_EXTRA + 1)]
        f = function([x, gz] + more, gp * (1 - a * a) * sum(more[1:], more[0]))
        assert not _nodes(f, "GpuPoolGradEpilogue") and _nodes(f, "GpuMaxPoolGrad")


def test_a_full_operand_besides_x_is_read_by_the_epilogue():
    """gx * (1 - a * a) * s with s of x's shape: s is the epilogue's extra array e0."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, gz, s = T.tensor4("x"), T.tensor4("gz"), T.tensor4("s")
        a = T.tanh(x)
        gp = symgpu.grad((pool_2d(a, (2, 2)) * gz).sum(), a)
        f = function([x, gz, s], gp * (1 - a * a) * s)
    (fused,) = _nodes(f, "GpuPoolGradEpilogue")
    assert set(fused.op.roles) == {"g", "x", "e0"} and fused.op.extra_dtypes == ("float32",)
    assert len(fused.inputs) == 4 and not _nodes(f, "GpuMaxPoolGrad")


@requires_nvcc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_epilogue_kernels_compile(tmp_path, dtype):
    with config.change_flags(floatX=dtype), virtual_context(None):
        x, gz = T.tensor4("x"), T.tensor4("gz")
        f = function([x, gz], _tanh_pool_grad(x, gz))
    op = _nodes(f, "GpuPoolGradEpilogue")[0].op
    cubin = compile_for_sm90(epilogue_source(op.scalar_op, op.roles, dtype), tmp_path / "m")
    for sfx in ("", "_i32"):
        assert f"pool_grad_epi{sfx}\0".encode() in cubin


@requires_gpu
@pytest.mark.parametrize("mode,kw", [("max", {}), ("max", dict(stride=(1, 1))),
                                     ("max", dict(ignore_border=False)),
                                     ("average_exc_pad", dict(pad=(1, 1))),
                                     ("average_inc_pad", dict(stride=(1, 2))), ("sum", {})])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index", ["int", "long long"])
def test_gpu_fused_pooling_gradient_matches_cpu(cuda, monkeypatch, mode, kw, dtype, index):
    if index == "long long":
        monkeypatch.setattr(gpooling, "_INT32_LIMIT", 0)
    x, gz = T.tensor4("x", dtype=dtype), T.tensor4("gz", dtype=dtype)
    gx = _tanh_pool_grad(x, gz, mode, **kw)
    xv = RNG.normal(size=(3, 4, 7, 9)).astype(dtype)
    with on_the_cpu():
        shape = function([x], pool_2d(T.tanh(x), (2, 2), mode=mode, **kw))(xv).shape
        gzv = RNG.normal(size=shape).astype(dtype)
        want = function([x, gz], gx)(xv, gzv)
    f = function([x, gz], gx)
    assert len(_nodes(f, "GpuPoolGradEpilogue")) == 1
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(f(xv, gzv), want, rtol=tol, atol=tol)
    assert isinstance(_nodes(f, "GpuPoolGradEpilogue")[0].op, GpuPoolGradEpilogue)
