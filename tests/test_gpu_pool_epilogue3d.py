"""The pooling gradients' epilogue in 3-d and with extra arrays (symgpu/gpu/ops/
pooling_epilogue.py's GpuPoolGradEpilogue3d): relu's derivative (a mask its forward kernel
stored) fuses into the 3-d max-pool gradient (virtual context), the fused kernels run as host
C++ through the op's own thunk (tests/emulated_gpu.py) against NumPy, both gradient kernels
(per element, per window) and index widths, nvcc compilation; on a GPU, against the CPU."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import emulate_prepared_kernels, emulated_kernel_device, run_op_on
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import pooling as gpooling
from symgpu.gpu.ops import pooling_epilogue as gepi
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet import relu
from symgpu.tensor.signal import pool_numpy as pn
from symgpu.tensor.signal.pool import pool_2d, pool_3d

RNG = np.random.default_rng(1733)


def _relu_pool_grad(x, b, gz, nd=3, **kw):
    """d/dx of <pool(relu(x + b)), gz>: the pooling's gradient then relu's, switch(x + b < 0,
    0, g), whose mask the forward kernel stores."""
    pool = pool_3d if nd == 3 else pool_2d
    bias = b.dimshuffle(*(["x", 0] + ["x"] * nd))
    return symgpu.grad((pool(relu(x + bias), (2,) * nd, **kw) * gz).sum(), x)


def _nodes(f, name):
    return [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == name]


@pytest.mark.parametrize("nd", [3, 2])
def test_relu_derivative_fuses_into_the_max_pool_gradient(vgpu, nd):
    x = T.TensorType("float32", (False,) * (nd + 2))("x")
    gz = T.TensorType("float32", (False,) * (nd + 2))("gz")
    b = T.vector("b")
    f = function([x, b, gz], _relu_pool_grad(x, b, gz, nd))
    name = "GpuPoolGradEpilogue3d" if nd == 3 else "GpuPoolGradEpilogue"
    (fused,) = _nodes(f, name)
    assert not _nodes(f, "GpuMaxPoolGrad3d") and not _nodes(f, "GpuMaxPoolGrad")
    assert fused.op.mode == "max" and "e0" in fused.op.roles and "g" in fused.op.roles
    assert fused.op.extra_dtypes == ("bool",)
    # the mask is an output of relu's forward kernel
    mask = fused.inputs[-1]
    assert mask.dtype == "bool" and type(mask.owner.op).__name__ == "GpuElemwise"
    out = f.maker.fgraph.outputs[0]
    assert out.owner.inputs[0].owner is fused


def test_the_3d_cnn_step_fuses_both_pooling_gradients(vgpu, monkeypatch):
    from symgpu.gpu.ops import conv as gconv
    from test_gpu_conv3d import _cnn3d_cost, _LoadedCudnn, _shapes
    monkeypatch.setattr(gconv, "cudnn", lambda: _LoadedCudnn())
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)
    gpu = lambda *bc: GpuArrayType("float32", bc, None)()   # noqa: E731
    x, y = gpu(*(False,) * 5), gpu(False, False)
    ps = [gpu(*(False,) * len(s)) for s in _shapes()]
    cost = _cnn3d_cost(x, y, ps)
    f = function([x, y] + ps, [cost] + T.grad(cost, ps))
    assert len(_nodes(f, "GpuPoolGradEpilogue3d")) == 2
    assert not _nodes(f, "GpuMaxPoolGrad3d")


@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, gepi)
    monkeypatch.setattr(gpooling, "_context", lambda name: ctx)
    return ctx


_run = run_op_on


def _scalar_op(nd, dtype="float32"):
    """relu's derivative as the rewrite makes it (switch(mask, 0, g), roles ('e0', 'g'))."""
    with config.change_flags(floatX=dtype), virtual_context(None):
        x = T.TensorType(dtype, (False,) * (nd + 2))("x")
        b, gz = T.vector("b"), x.type("gz")
        f = function([x, b, gz], _relu_pool_grad(x, b, gz, nd))
    name = "GpuPoolGradEpilogue3d" if nd == 3 else "GpuPoolGradEpilogue"
    return _nodes(f, name)[0].op


# (ws, stride, pad, ignore_border): per-window kernel (first two), per-element (the rest)
CASES3 = [((2, 2, 2), None, (0, 0, 0), True), ((2, 1, 2), (3, 1, 2), (0, 0, 0), False),
          ((3, 2, 1), (1, 1, 1), (1, 1, 0), True), ((2, 2, 2), (3, 1, 2), (1, 0, 1), True)]


@requires_gxx
@pytest.mark.parametrize("dt,index", list(itertools.product(["float64", "float32"],
                                                            ["int", "long long"])))
def test_fused_3d_gradient_runs_its_kernels_on_the_host(emu, monkeypatch, dt, index):
    """GpuPoolGradEpilogue3d's thunk: the max-pool gradient where the mask is false, 0 where
    it is true, with ties; and tanh's form (an x operand) for the average modes."""
    if index == "long long":
        monkeypatch.setattr(gpooling, "_INT32_LIMIT", 0)
    base = _scalar_op(3, dt)
    x = RNG.normal(size=(2, 3, 5, 6, 4)).astype(dt)
    x[0, 0, :2, :2, :2] = 1.5
    mask = RNG.random(size=x.shape) < 0.4
    tol = 1e-12 if dt == "float64" else 1e-5
    for ws, st, pad, ib in CASES3:
        kw = dict(ws=ws, stride=st, pad=pad, ignore_border=ib)
        plain = gpooling.GpuPool3d(**kw)
        z = pn.pool_forward(x, plain.ws, plain.stride, plain.pad, ib, "max")
        gz = RNG.normal(size=z.shape).astype(dt)
        op = gepi.GpuPoolGradEpilogue3d(**kw, mode="max", scalar_op=base.scalar_op,
                                        roles=base.roles, extra_dtypes=("bool",))
        assert op.tiled(op.geo(x.shape)) is (ws == (2, 2, 2) and pad == (0, 0, 0)
                                             or st == (3, 1, 2) and pad == (0, 0, 0))
        got = _run(emu, op, x, z, gz, mask)
        want = np.where(mask, 0, pn.max_pool_grad(x, z, gz, plain.ws, plain.stride,
                                                  plain.pad, ib))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str(kw))


@requires_gxx
def test_fused_3d_average_gradient_with_an_x_operand(emu):
    """tanh's form, (1 - x * x) * g, on the per-window and the per-element kernels."""
    with config.change_flags(floatX="float64"), virtual_context(None):
        a = T.tanh(T.tensor5("x", dtype="float64"))
        gz = T.tensor5("gz", dtype="float64")
        gp = symgpu.grad((pool_3d(a, (2, 2, 2), mode="average_exc_pad") * gz).sum(), a)
        f = function([a.owner.inputs[0], gz], gp * (1 - a * a))
    (fused,) = _nodes(f, "GpuPoolGradEpilogue3d")
    x = RNG.normal(size=(2, 2, 5, 4, 6))
    for ws, st, pad, ib in CASES3:
        kw = dict(ws=ws, stride=st, pad=pad, ignore_border=ib)
        op = gepi.GpuPoolGradEpilogue3d(**kw, mode="average_exc_pad",
                                        scalar_op=fused.op.scalar_op, roles=fused.op.roles)
        gz = RNG.normal(size=(2, 2) + op.out_dims(op.geo(x.shape)))
        want = (1 - x * x) * pn.average_pool_grad(x.shape, gz, op.ws, op.stride, op.pad, ib,
                                                  "average_exc_pad", "float64")
        np.testing.assert_allclose(_run(emu, op, x, gz), want, rtol=1e-12, atol=1e-12,
                                   err_msg=str(kw))


def test_an_extra_array_of_another_shape_is_refused(emu):
    base = _scalar_op(3)
    op = gepi.GpuPoolGradEpilogue3d(ws=(2, 2, 2), mode="max", scalar_op=base.scalar_op,
                                    roles=base.roles, extra_dtypes=("bool",))
    x = np.zeros((1, 1, 4, 4, 4), "float32")
    z = np.zeros((1, 1, 2, 2, 2), "float32")
    with pytest.raises(ValueError, match=r"e0 has shape \(1, 1, 4, 4, 2\)"):
        _run(emu, op, x, z, z, np.zeros((1, 1, 4, 4, 2), bool))
    with pytest.raises(ValueError, match="extra_dtypes"):
        gepi.GpuPoolGradEpilogue3d(ws=(2, 2, 2), scalar_op=base.scalar_op, roles=base.roles)


@requires_nvcc
@pytest.mark.parametrize("nd", [3, 2])
def test_fused_kernels_with_a_mask_compile(tmp_path, nd):
    op = _scalar_op(nd)
    src = gepi.epilogue_source(op.scalar_op, op.roles, "float32", ("bool",), nd)
    cubin = compile_for_sm90(src, tmp_path / "m")
    names = ("pool3_grad_epi", "pool3_gradt_epi") if nd == 3 else ("pool_grad_epi",)
    for name, sfx in itertools.product(names, ("", "_i32")):
        assert f"{name}{sfx}\0".encode() in cubin


@requires_gpu
@pytest.mark.parametrize("kw", [dict(), dict(ignore_border=False), dict(stride=(1, 2, 1)),
                                dict(pad=(1, 0, 1))])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_fused_relu_pool_gradient_3d_matches_cpu(cuda, kw, dtype):
    x = T.TensorType(dtype, (False,) * 5)("x")
    b, gz = T.TensorType(dtype, (False,))("b"), T.TensorType(dtype, (False,) * 5)("gz")
    gx = _relu_pool_grad(x, b, gz, 3, **kw)
    xv = RNG.normal(size=(2, 3, 7, 6, 8)).astype(dtype)
    bv = RNG.normal(size=3).astype(dtype) * 0.1
    with on_the_cpu():
        bias = b.dimshuffle("x", 0, "x", "x", "x")
        shape = function([x, b], pool_3d(relu(x + bias), (2, 2, 2), **kw))(xv, bv).shape
        gzv = RNG.normal(size=shape).astype(dtype)
        want = function([x, b, gz], gx)(xv, bv, gzv)
    f = function([x, b, gz], gx)
    assert len(_nodes(f, "GpuPoolGradEpilogue3d")) == 1
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(f(xv, bv, gzv), want, rtol=tol, atol=tol)
