"""float16/bfloat16 convolutions on cuDNN (gpu/ops/conv.py, cudnn.py): dnn.conv.precision with
Theano's rule, the half ops' lifting (where cuDNN loads), the descriptors they build (a fake
libcudnn); on a GPU (``pytest -m gpu``) forward and both gradients against float32 NumPy."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import FakeCtx, requires_gpu
from symgpu import config, function
from symgpu.gpu.ops import conv as gconv
from symgpu.gpu.ops import cudnn as gcudnn
from symgpu.tensor.nnet import conv2d


@pytest.mark.parametrize("flag,dtype,fwd,grad", [
    ("as_input_f32", "float16", "float32", "float32"),
    ("as_input_f32", "bfloat16", "float32", "float32"),
    ("as_input_f32", "float32", "float32", "float32"),
    ("as_input_f32", "float64", "float64", "float64"),
    ("as_input", "float16", "float16", TypeError),
    ("as_input", "bfloat16", "float32", "float32"),
    ("float32", "float16", "float32", "float32"),
    ("float16", "float16", "float16", TypeError),
    ("float16", "float32", TypeError, TypeError),
    ("float64", "float32", TypeError, TypeError),
    ("float32", "float64", TypeError, TypeError),
])
def test_conv_precision_follows_theanos_rule(flag, dtype, fwd, grad):
    with config.change_flags(**{"dnn.conv.precision": flag}):
        for for_grad, want in ((False, fwd), (True, grad)):
            if want is TypeError:
                with pytest.raises(TypeError, match="precision"):
                    gconv.conv_precision(dtype, for_grad)
            else:
                assert gconv.conv_precision(dtype, for_grad) == want


@pytest.fixture
def cudnn_loads(monkeypatch):
    """Lifting as where cuDNN loads (half convolutions lift only there)."""
    monkeypatch.setattr(gconv, "conv_backend", lambda: ("cudnn", "faked"))


def _conv_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, gconv._GpuConvBase)]


def test_half_convolution_and_its_gradients_lift_with_their_precision(vgpu, cudnn_loads):
    x = T.tensor4("x", dtype="float16")
    w = T.tensor4("w", dtype="float16")
    y = conv2d(x, w, border_mode="half")
    gx, gw = T.grad(y.sum(), [x, w])
    f = function([x, w], [y, gx, gw])
    nodes = _conv_nodes(f)
    assert {type(n.op).__name__ for n in nodes} == {"GpuConv2d", "GpuConv2dGradInputs",
                                                    "GpuConv2dGradWeights"}
    assert all(n.outputs[0].dtype == "float16" and n.op.precision == "float32"
               for n in nodes)
    assert not [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "Conv2d"]
    with config.change_flags(**{"dnn.conv.precision": "as_input"}):
        f = function([x, w], y)
        (node,) = _conv_nodes(f)
        assert node.op.precision == "float16"
        with pytest.raises(TypeError, match="backward"):
            function([x, w], gx)


def test_half_convolution_stays_on_the_host_without_cudnn(vgpu, monkeypatch):
    monkeypatch.setattr(gconv, "conv_backend", lambda: ("gemm", "no cuDNN here"))
    x, w = T.tensor4("x", dtype="float16"), T.tensor4("w", dtype="float16")
    f = function([x, w], conv2d(x, w))
    assert not _conv_nodes(f)
    assert [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "Conv2d"]


def test_half_op_props_and_compute_dtype():
    a, b = gconv.GpuConv2d(precision="float32"), gconv.GpuConv2d(precision="float16")
    assert a != b and a == gconv.GpuConv2d(precision="float32")
    assert gconv.GpuConv2d().compute_dtype("bfloat16") == "float32"
    assert gconv.GpuConv2d().compute_dtype("float64") == "float64"
    assert b.compute_dtype("float16") == "float16"


class _FakeCudnnLib:
    """libcudnn's entry points: records (name, values), offers one algorithm."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, [getattr(getattr(a, "_obj", a), "value",
                                              getattr(a, "_obj", a)) for a in args]))
            if name.endswith("Algorithm_v7"):
                count, perf = args[-2], args[-1]
                count._obj.value = 1
                perf[0].algo, perf[0].status = 1, 0
            return 0
        return call


@pytest.mark.parametrize("dtype,code", [("float16", 2), ("bfloat16", 9)])
def test_half_descriptors_hold_half_data_and_compute_in_float(dtype, code):
    lib = gcudnn._Cudnn.__new__(gcudnn._Cudnn)
    lib.lib, lib.handles, lib.lock = _FakeCudnnLib(), {}, threading.Lock()
    lib.handle = lambda ctx: ctypes.c_void_p(5)
    descs = gcudnn.ConvDescs(lib, FakeCtx(), "fwd", dtype, (2, 3, 8, 8), (4, 3, 3, 3),
                             (2, 4, 6, 6), (0, 0), (1, 1), (1, 1), True, 1,
                             gconv._math_mode(dtype), compute="float32")
    calls = lib.lib.calls
    (tensors,) = [a for n, a in calls if n == "cudnnSetTensor4dDescriptorEx"][:1]
    assert tensors[1] == code
    (filt,) = [a for n, a in calls if n == "cudnnSetFilter4dDescriptor"]
    assert filt[1] == code
    (conv,) = [a for n, a in calls if n == "cudnnSetConvolution2dDescriptor"]
    assert conv[-1] == 0, "CUDNN_DATA_FLOAT compute type"
    math = [a[1] for n, a in calls if n == "cudnnSetConvolutionMathType"]
    assert math == [1], "CUDNN_TENSOR_OP_MATH"
    assert isinstance(descs.one, ctypes.c_float)


# ============================================================================ on a GPU

RTOL = {"float16": 3e-3, "bfloat16": 2e-2}


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_half_convolution_and_gradients_match_float32_numpy(cuda, dtype):
    import ml_dtypes  # noqa: F401
    from gpu_helpers import on_the_cpu
    from symgpu.gpu.placement.type import gpu_supports_dtype
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"the GPU placement does not take {dtype} yet")
    if not gcudnn.cudnn_available():
        pytest.skip("cuDNN does not load here: half convolutions stay on the host")
    rng = np.random.default_rng(4)
    hx = rng.standard_normal((4, 8, 12, 12)).astype(dtype)
    hw = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(dtype)
    hg = rng.standard_normal((4, 16, 12, 12)).astype(dtype)

    def graph(dt):
        x, w = T.tensor4("x", dtype=dt), T.tensor4("w", dtype=dt)
        g = T.tensor4("g", dtype=dt)
        y = conv2d(x, w, border_mode="half")
        gx, gw = T.grad((y * g).sum(), [x, w])
        return [x, w, g], [y, gx, gw]

    ins, outs = graph(dtype)
    f = function(ins, outs)
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert {"GpuConv2d", "GpuConv2dGradInputs", "GpuConv2dGradWeights"} <= names, names
    got = f(hx, hw, hg)
    with on_the_cpu():
        ins32, outs32 = graph("float32")
        want = function(ins32, outs32)(*(a.astype("float32") for a in (hx, hw, hg)))
    for g, wv in zip(got, want):
        assert np.asarray(g).dtype == np.dtype(dtype)
        g64, w64 = np.asarray(g).astype("float64"), np.asarray(wv).astype("float64")
        err = np.abs(g64 - w64).max() / max(np.abs(w64).max(), 1.0)
        assert err < RTOL[dtype], (dtype, err)
