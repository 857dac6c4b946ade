"""GPU 3-d convolution and pooling (symgpu/gpu/ops/conv.py's GpuConv3d*, cudnn.py's N-d
descriptors, pooling.py's 3-d ops and pooling.cu's pool3_* kernels).

On the CPU: placement of a 3-D CNN training step on a virtual context (cuDNN faked: 3-d
convolutions lift only where it loads), the host fallback when it cannot load, the N-d
descriptors against a fake cuDNN library, the 3-d pooling kernels compiled as host C++ and run
through the ops' own thunks (tests/emulated_gpu.py), nvcc compilation.  On a GPU: every conv3d
and pool_3d parameter combination of the CPU tests against the CPU ops, gradients, and the 3-D
CNN step as one CUDA graph."""
from __future__ import annotations

import ctypes
import itertools
import threading

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import emulate_prepared_kernels, emulated_kernel_device, run_op_on
from gpu_helpers import (assert_one_segment, compile_for_sm90, on_the_cpu, requires_gpu,
                         requires_nvcc)
from symgpu import config, function
from symgpu.gpu.ops import conv as gconv
from symgpu.gpu.ops import cudnn as gcudnn
from symgpu.gpu.ops import pooling as gpooling
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet import conv3d, relu
from symgpu.tensor.signal import pool_numpy as pn
from symgpu.tensor.signal.pool import pool_3d
from test_conv3d import COMBOS as CONV3D_COMBOS
from test_pool3d import COMBOS as POOL3D_COMBOS

RNG = np.random.default_rng(23)
# the max-pool gradients carry relu's derivative (pooling_epilogue.py)
GPU_3D = {"GpuConv3d", "GpuConv3dGradWeights", "GpuPool3d", "GpuPoolGradEpilogue3d"}
HOST_3D = {"Conv3d", "Conv3dGradInputs", "Conv3dGradWeights", "Pool3d", "MaxPoolGrad3d",
           "AveragePoolGrad3d"}


def _names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def _cnn3d_cost(x, y, params):
    """The benchmark's small 3-D CNN: conv3d 16 3x3x3, relu, pool 2x2x2, conv3d 32 3x3x3,
    relu, pool 2x2x2, dense to 10, softmax cross-entropy against one-hot `y`."""
    w1, b1, w2, b2, wf, bf = params
    h = pool_3d(relu(conv3d(x, w1) + b1.dimshuffle("x", 0, "x", "x", "x")), (2, 2, 2))
    h = pool_3d(relu(conv3d(h, w2) + b2.dimshuffle("x", 0, "x", "x", "x")), (2, 2, 2))
    p = T.nnet.softmax(T.dot(h.flatten(2), wf) + bf)
    return T.mean(T.nnet.categorical_crossentropy(p, y))


def _shapes(side=32):
    s1 = (side - 2) // 2
    s2 = (s1 - 2) // 2
    return [(16, 1, 3, 3, 3), (16,), (32, 16, 3, 3, 3), (32,), (32 * s2 ** 3, 10), (10,)]


class _LoadedCudnn:
    """What conv_backend reads of a loaded binding (placement tests: nothing runs)."""

    version_string, path = "9.19.0", "fake-libcudnn.so.9"


@pytest.fixture
def fake_cudnn(monkeypatch):
    monkeypatch.setattr(gconv, "cudnn", lambda: _LoadedCudnn())
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)


@pytest.fixture
def no_cudnn(monkeypatch):
    def refuse():
        raise gcudnn.CudnnError("cuDNN 9 could not be loaded (faked by the test)")
    monkeypatch.setattr(gconv, "cudnn", refuse)
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)


# ============================================================================ CPU: placement

def test_whole_3d_cnn_training_step_is_placed_on_the_gpu(fake_cudnn):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, y = T.tensor5("x"), T.matrix("y")
        params = [symgpu.shared(np.zeros(s, "float32")) for s in _shapes(12)]
        cost = _cnn3d_cost(x, y, params)
        grads = T.grad(cost, params + [x])
        f = function([x, y], [cost, grads[-1]],
                     updates=[(p, p - 0.1 * gp) for p, gp in zip(params, grads)])
        names = _names(f)
        assert GPU_3D | {"GpuConv3dGradInputs"} <= names, names
        assert not names & HOST_3D, names
        assert not cpu_nodes(f.maker.fgraph)


def test_3d_cnn_step_on_gpu_values_is_one_capturable_segment(fake_cudnn):
    """The benchmark's step (batch and parameters GPU values, as GPU shared variables are on
    the GPU machine): every node on the GPU, the host shape work before the first launch, one
    CUDA-graph segment; the convolution and pooling thunks say they are capturable."""
    gpu = lambda *bc: GpuArrayType("float32", bc, None)()   # noqa: E731
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, y = gpu(*(False,) * 5), gpu(False, False)
        ps = [gpu(*(False,) * len(s)) for s in _shapes()]
        cost = _cnn3d_cost(x, y, ps)
        grads = T.grad(cost, ps)
        f = function([x, y] + ps, [cost] + [q - 0.1 * g for q, g in zip(ps, grads)])
    nodes = f.maker.fgraph.toposort()
    names = {type(n.op).__name__ for n in nodes}
    assert GPU_3D <= names and not names & HOST_3D, names
    assert not [n for n in nodes if not type(n.op).__name__.startswith("Gpu")
                and type(n.op).__name__ != "HostFromGpu"
                and any(o.dtype.startswith("float") for o in n.outputs)], names
    assert all(n.op.shape_from_inputs for n in nodes
               if isinstance(n.op, (gconv._GpuConvBase, gpooling._GpuPoolBase)))
    assert_one_segment(nodes)


def test_without_cudnn_3d_convolutions_stay_on_the_host(no_cudnn):
    """No im2col path in 3-d: without cuDNN the conv3d ops keep their host op (transfers
    around them), pooling still lifts, and the result is the CPU's."""
    with config.change_flags(floatX="float64"), virtual_context(None):
        x, w = T.dtensor5(), T.dtensor5()
        y = pool_3d(conv3d(x, w, border_mode="half"), (2, 2, 2))
        f = function([x, w], [y] + symgpu.grad(y.sum(), [x, w]))
    names = _names(f)
    assert {"Conv3d", "Conv3dGradInputs", "Conv3dGradWeights"} <= names, names
    assert not names & {"GpuConv3d", "GpuConv3dGradInputs", "GpuConv3dGradWeights"}, names
    assert "GpuPool3d" in names, names


def test_integer_3d_pooling_stays_on_the_host(fake_cudnn):
    with config.change_flags(floatX="float32"), virtual_context(None):
        i = T.itensor5()
        names = _names(function([i], pool_3d(i, (2, 2, 2))))
    assert "Pool3d" in names and "GpuPool3d" not in names


# ============================================================================ CPU: descriptors

class _FakeLib:
    """A stand-in for libcudnn: every call recorded with its arguments as plain values
    (C int arrays as lists); creations hand out handles, the algorithm query one algorithm,
    and GetConvolutionNdForwardOutputDim the shape cuDNN's formula gives for the recorded
    descriptors."""

    def __init__(self):
        self.calls, self.next, self.desc = [], 100, {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def fn(*args):
            self.calls.append((name, [_plain(a) for a in args]))
            return self._effect(name, args)
        return fn

    def _effect(self, name, args):
        if name.startswith("cudnnCreate"):
            self.next += 1
            args[0]._obj.value = self.next
        elif name in ("cudnnSetTensorNdDescriptor", "cudnnSetFilterNdDescriptor",
                      "cudnnSetConvolutionNdDescriptor"):
            self.desc[args[0].value] = [_plain(a) for a in args[1:]]
        elif name.endswith("Algorithm_v7"):
            args[-2]._obj.value = 1
            args[-1][0].algo, args[-1][0].status = 7, 0
        elif name.endswith("WorkspaceSize"):
            args[-1]._obj.value = 4096
        elif name == "cudnnGetConvolutionNdForwardOutputDim":
            conv, x, w, nb, out = args
            xd = self.desc[x.value][2]
            wd = self.desc[w.value][3]
            _, pads, strides, dil = self.desc[conv.value][:4]
            dims = [xd[0], wd[0]] + [(xd[2 + a] + 2 * pads[a] - dil[a] * (wd[2 + a] - 1) - 1)
                                     // strides[a] + 1 for a in range(nb - 2)]
            for a, v in enumerate(dims):
                out[a] = v
        return 0


def _plain(a):
    if isinstance(a, ctypes.Array):
        return list(a)
    if isinstance(a, ctypes.c_void_p):
        return a.value
    return a if isinstance(a, (int, float, str)) else type(a).__name__


def _fake_binding():
    lib = gcudnn._Cudnn.__new__(gcudnn._Cudnn)
    lib.lib, lib.path, lib.version = _FakeLib(), "fake", 91900
    lib.handles, lib.lock = {}, threading.Lock()
    return lib


class _Ctx:
    stream_handle = 0xabc

    def activate(self):
        return self


def _descs(lib, kind, xshape, wshape, yshape, pads, strides, dil, flip=True, groups=1):
    return gcudnn.ConvDescs(lib, _Ctx(), kind, "float32", xshape, wshape, yshape, pads,
                            strides, dil, flip, groups, gcudnn.FMA_MATH)


def _recorded(lib, name):
    return [args for n, args in lib.lib.calls if n == name]


def test_3d_descriptors_are_the_nd_calls_with_packed_strides():
    lib = _fake_binding()
    plan = _descs(lib, "fwd", (2, 4, 9, 8, 7), (6, 2, 3, 2, 3), (2, 6, 5, 10, 7), (1, 2, 1),
                  (2, 1, 1), (1, 2, 1), flip=False, groups=2)
    tensors = _recorded(lib, "cudnnSetTensorNdDescriptor")
    assert [t[1:] for t in tensors] == [
        [0, 5, [2, 4, 9, 8, 7], [4 * 9 * 8 * 7, 9 * 8 * 7, 8 * 7, 7, 1]],
        [0, 5, [2, 6, 5, 10, 7], [6 * 5 * 10 * 7, 5 * 10 * 7, 10 * 7, 7, 1]]]
    (filt,) = _recorded(lib, "cudnnSetFilterNdDescriptor")
    assert filt[1:] == [0, 0, 5, [6, 2, 3, 2, 3]]   # float32, NCHW, 5 dims
    (conv,) = _recorded(lib, "cudnnSetConvolutionNdDescriptor")
    assert conv[1:] == [3, [1, 2, 1], [2, 1, 1], [1, 2, 1], gcudnn.CROSS_CORRELATION, 0]
    assert _recorded(lib, "cudnnSetConvolutionGroupCount")[0][1] == 2
    assert _recorded(lib, "cudnnSetConvolutionMathType")[0][1] == gcudnn.FMA_MATH
    assert len(_recorded(lib, "cudnnGetConvolutionNdForwardOutputDim")) == 1
    assert not _recorded(lib, "cudnnSetTensor4dDescriptorEx")
    assert plan.algo == 7 and plan.workspace == 4096


def test_2d_descriptors_keep_the_4d_calls():
    lib = _fake_binding()
    _descs(lib, "bwd_filter", (2, 4, 9, 8), (6, 4, 3, 2), (2, 6, 9, 9), (1, 1), (1, 1), (1, 1))
    names = {n for n, _ in lib.lib.calls}
    assert {"cudnnSetTensor4dDescriptorEx", "cudnnSetFilter4dDescriptor",
            "cudnnSetConvolution2dDescriptor"} <= names
    assert not {n for n in names if "Nd" in n}, names
    (conv,) = _recorded(lib, "cudnnSetConvolution2dDescriptor")
    assert conv[1:] == [1, 1, 1, 1, 1, 1, gcudnn.CONVOLUTION, 0]


def test_a_3d_geometry_cudnn_disagrees_with_is_refused():
    lib = _fake_binding()
    with pytest.raises(gcudnn.CudnnError, match=r"output shape \(2, 6, 7, 6, 5\)"):
        _descs(lib, "fwd", (2, 4, 9, 8, 7), (6, 4, 3, 3, 3), (2, 6, 7, 6, 4), (0, 0, 0),
               (1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("bm,xshape,pads", [
    ("half", (1, 2, 5, 6, 7), (1, 1, 1)),
    (((1, 0), (0, 2), 1), (1, 2, 6, 8, 9), (0, 0, 0))])
def test_the_plan_gets_symmetric_pads_or_the_padded_input(monkeypatch, bm, xshape, pads):
    """cuDNN pads symmetrically: an asymmetric border runs on the zero-padded input."""
    seen = []

    def record(lib, ctx, kind, dtype, x, w, y, p, s, d, flip, groups, math):
        seen.append((kind, x, p, s, d))
        return "plan"
    monkeypatch.setattr(gconv, "ConvDescs", record)
    monkeypatch.setattr(gconv, "cudnn", lambda: None)
    op = gconv.GpuConv3d(border_mode=bm, subsample=(1, 2, 1))
    plan = op._plan(None, "cudnn", {}, np.dtype("float32"), (1, 2, 5, 6, 7), (3, 2, 3, 3, 3),
                    (1, 3, 5, 3, 7), op.pads((3, 3, 3)))
    assert plan == "plan" and seen == [("fwd", xshape, pads, (1, 2, 1), (1, 1, 1))]


def test_3d_ops_check_their_operands():
    with config.change_flags(floatX="float32"), virtual_context(None):
        g4 = GpuArrayType("float32", (False,) * 4, None)()
        g5 = GpuArrayType("float32", (False,) * 5, None)()
        with pytest.raises(TypeError, match="5-d float32/float64"):
            gconv.GpuConv3d()(g4, g5)
        with pytest.raises(TypeError, match="3 or more"):
            gpooling.GpuPool3d((2, 2, 2))(GpuArrayType("float32", (False,) * 2, None)())
        assert gconv.GpuConv3d()(g5, g5).ndim == 5


# ============================================================================ CPU: kernels

@requires_nvcc
def test_3d_pooling_kernels_compile(tmp_path):
    cubin = compile_for_sm90(gpooling.pooling3d_source(), tmp_path)
    for kind, dt, sfx in itertools.product(("fwd", "grad", "ggrad"), ("float32", "float64"),
                                           ("", "_i32")):
        assert f"pool3_{kind}_{dt}{sfx}\0".encode() in cubin


def test_3d_gradients_take_the_window_kernel_where_windows_do_not_overlap():
    cases = {((2, 2, 2), None, (0, 0, 0), True): True,
             ((2, 1, 2), (3, 1, 2), (0, 0, 0), False): True,
             ((3, 2, 1), (1, 1, 1), (0, 0, 0), True): False,      # overlapping
             ((2, 2, 2), None, (1, 0, 0), True): False,           # padded
             ((4, 2, 2), None, (0, 0, 0), True): False}           # no window along D
    for (ws, st, pad, ib), want in cases.items():
        op = gpooling.GpuMaxPoolGrad3d(ws=ws, stride=st, pad=pad, ignore_border=ib)
        assert op.tiled(op.geo((2, 3, 3, 6, 4))) is want, (ws, st, pad, ib)
    assert not gpooling.GpuMaxPoolGrad((2, 2)).tiled(gpooling.GpuMaxPoolGrad((2, 2)).geo(
        (2, 3, 6, 4)))                                           # 2-d: the element kernel


def test_3d_index_width():
    op = gpooling.GpuPool3d((2, 2, 2))
    assert gpooling.index_suffix(op.geo((8, 16, 30, 30, 30))) == "_i32"
    assert gpooling.index_suffix(op.geo((2 ** 12, 2 ** 8, 16, 16, 16))) == ""
    assert op.geo((8, 16, 30, 30, 30)) == [128, 30, 30, 30, 15, 15, 15, 2, 2, 2, 2, 2, 2,
                                           0, 0, 0]


EMU_CASES = [((2, 2, 2), None, (0, 0, 0), True), ((3, 2, 1), (1, 1, 1), (1, 1, 0), True),
             ((1, 3, 2), (2, 3, 1), (0, 0, 0), False), ((2, 2, 2), (3, 1, 2), (1, 0, 1), True),
             # windows that do not overlap, unpadded: the gradients' one-thread-per-window
             # kernel (gradt), with gaps between windows, partial windows and a remainder
             ((2, 1, 2), (3, 1, 2), (0, 0, 0), False), ((2, 4, 3), (2, 4, 3), (0, 0, 0), True)]


@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, gpooling)
    monkeypatch.setattr(gpooling, "_context", lambda name: ctx)
    return ctx


_run = run_op_on


@requires_gxx
@pytest.mark.parametrize("dt,index", list(itertools.product(["float64", "float32"],
                                                            ["int", "long long"])))
def test_3d_pooling_ops_run_their_kernels_on_the_host(emu, monkeypatch, dt, index):
    """GpuPool3d, GpuMaxPoolGrad3d, GpuAveragePoolGrad3d and GpuMaxPoolGradGrad3d, their
    thunks and kernels (both index widths) against symgpu's NumPy pooling, with ties."""
    if index == "long long":
        monkeypatch.setattr(gpooling, "_INT32_LIMIT", 0)
    x = RNG.normal(size=(2, 3, 5, 6, 4)).astype(dt)
    x[0, 0, :2, :2, :2] = 1.5
    tol = 1e-12 if dt == "float64" else 1e-5
    for (ws, st, pad, ib), mode in itertools.product(EMU_CASES, pn.MODES):
        kw = dict(ws=ws, stride=st, pad=pad, ignore_border=ib)
        op = gpooling.GpuPool3d(mode=mode, **kw)
        z = pn.pool_forward(x, op.ws, op.stride, op.pad, ib, mode)
        np.testing.assert_allclose(_run(emu, op, x), z, rtol=tol, atol=tol,
                                   err_msg=str((kw, mode)))
        gz = RNG.normal(size=z.shape).astype(dt)
        if mode == "max":
            got = _run(emu, gpooling.GpuMaxPoolGrad3d(mode=mode, **kw), x, z, gz)
            want = pn.max_pool_grad(x, z, gz, op.ws, op.stride, op.pad, ib)
            ggx = RNG.normal(size=x.shape).astype(dt)
            np.testing.assert_allclose(
                _run(emu, gpooling.GpuMaxPoolGradGrad3d(mode=mode, **kw), x, z, ggx),
                pn.max_pool_grad_grad(x, z, ggx, op.ws, op.stride, op.pad, ib),
                rtol=tol, atol=tol, err_msg=str(kw))
        else:
            got = _run(emu, gpooling.GpuAveragePoolGrad3d(mode=mode, **kw), x, gz)
            want = pn.average_pool_grad(x.shape, gz, op.ws, op.stride, op.pad, ib, mode, dt)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=str((kw, mode)))


# ============================================================================ GPU

def _needs_cudnn():
    if not gcudnn.cudnn_available():
        pytest.skip("cuDNN is not installed")


@requires_gpu
@pytest.mark.parametrize("bm,s,d,flip,g", CONV3D_COMBOS)
def test_gpu_conv3d_matches_cpu(cuda, monkeypatch, bm, s, d, flip, g):
    _needs_cudnn()
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)
    kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip, num_groups=g)
    xv = RNG.normal(size=(2, 4, 7, 8, 6))
    wv = RNG.normal(size=(6, 4 // g, 3, 2, 3))
    x, w, gy = T.dtensor5(), T.dtensor5(), T.dtensor5()
    y = conv3d(x, w, **kw)
    gx, gw = symgpu.grad((y * gy).sum(), [x, w])
    with on_the_cpu():
        gyv = RNG.normal(size=function([x, w], y)(xv, wv).shape)
        want = function([x, w, gy], [y, gx, gw])(xv, wv, gyv)
    f = function([x, w, gy], [y, gx, gw])
    names = _names(f)
    assert {"GpuConv3d", "GpuConv3dGradInputs", "GpuConv3dGradWeights"} <= names, names
    for got, ref in zip(f(xv, wv, gyv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


@requires_gpu
@pytest.mark.parametrize("kw", [dict(), dict(border_mode="half", subsample=(2, 1, 2)),
                                dict(border_mode=((0, 1), (2, 0), 1), num_groups=2)])
def test_gpu_conv3d_float32_and_second_derivative(cuda, kw):
    _needs_cudnn()
    x, w = T.ftensor5(), T.ftensor5()
    xv = RNG.normal(size=(3, 4, 6, 7, 5)).astype("float32")
    wv = RNG.normal(size=(4, 4 // kw.get("num_groups", 1), 3, 3, 2)).astype("float32")
    y = conv3d(x, w, **kw)
    gx, gw = symgpu.grad(T.sum(y ** 2), [x, w])
    outs = [y, gx, gw, symgpu.grad(T.sum(gx ** 2), w)]
    with on_the_cpu():
        want = function([x, w], outs)(xv, wv)
    f = function([x, w], outs)
    assert "GpuConv3d" in _names(f)
    for got, ref in zip(f(xv, wv), want):
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-3 * np.abs(ref).max())


@requires_gpu
@pytest.mark.parametrize("ws,stride,pad,ignore_border,mode", POOL3D_COMBOS)
def test_gpu_pool3d_matches_cpu(cuda, ws, stride, pad, ignore_border, mode):
    x, gz = T.dtensor5(), T.dtensor5()
    y = pool_3d(x, ws, ignore_border=ignore_border, stride=stride, pad=pad, mode=mode)
    gx = symgpu.grad((y * gz).sum(), x)
    xv = RNG.normal(size=(2, 3, 5, 7, 6))
    with on_the_cpu():
        yv = function([x], y)(xv)
        gzv = RNG.normal(size=yv.shape)
        want = function([x, gz], [y, gx])(xv, gzv)
    f = function([x, gz], [y, gx])
    names = _names(f)
    assert "GpuPool3d" in names and not names & HOST_3D, names
    for got, ref in zip(f(xv, gzv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@requires_gpu
@pytest.mark.parametrize("mode", ["max", "sum", "average_exc_pad"])
def test_gpu_pool3d_second_derivative(cuda, mode):
    x = T.dtensor5()
    g = symgpu.grad((pool_3d(x, (2, 3, 2), stride=(1, 2, 1), mode=mode) ** 2).sum(), x)
    h = symgpu.grad((g * T.constant(RNG.normal(size=(1, 2, 4, 5, 3)))).sum(), x)
    xv = RNG.permutation(120).reshape(1, 2, 4, 5, 3) * 0.1
    with on_the_cpu():
        want = function([x], [g, h])(xv)
    f = function([x], [g, h])
    if mode == "max":
        assert "GpuMaxPoolGradGrad3d" in _names(f)
    for got, ref in zip(f(xv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def _train_cnn3d(dev, calls=6, batch=8, side=32):
    """(costs, final parameters, function) of `calls` SGD steps of the benchmark's 3-D CNN."""
    x, y = T.tensor5("x"), T.matrix("y")
    rng = np.random.default_rng(9)
    # weights scaled by their fan-in and a small step: training stays smooth, so float32
    # rounding differences between the devices stay small instead of being amplified
    fan_in = {1: lambda s: 1, 2: lambda s: s[0], 5: lambda s: np.prod(s[1:])}
    init = [(rng.normal(size=s) / np.sqrt(fan_in[len(s)](s))).astype("float32")
            for s in _shapes(side)]
    xv = rng.normal(size=(batch, 1, side, side, side)).astype("float32")
    yv = np.eye(10, dtype="float32")[rng.integers(0, 10, batch)]
    with (on_the_cpu() if dev == "cpu" else config.change_flags(device=dev)):
        params = [symgpu.shared(v.copy()) for v in init]
        xs, ys = symgpu.shared(xv), symgpu.shared(yv)
        cost = _cnn3d_cost(x, y, params)
        grads = T.grad(cost, params)
        f = function([], cost, givens=[(x, xs), (y, ys)],
                     updates=[(p, p - 0.0005 * g) for p, g in zip(params, grads)])
        costs = [float(f()) for _ in range(calls)]
        return costs, [p.get_value() for p in params], f


@requires_gpu
def test_gpu_3d_cnn_step_is_one_cuda_graph_and_learns_like_the_cpu(cuda, monkeypatch):
    """The benchmark's step, everything in GPU shared variables: all on the GPU, captured at
    the second call and replayed after as one segment, its losses the CPU's and decreasing."""
    _needs_cudnn()
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)
    costs, params, f = _train_cnn3d("cuda", calls=8)
    names = _names(f)
    assert GPU_3D <= names and not names & HOST_3D, names
    assert not cpu_nodes(f.maker.fgraph), cpu_nodes(f.maker.fgraph)
    st = f.vm.runner.stats()
    assert st["segments"] == 1 and st["captures"] >= 1 and st["replays"] >= 5, st
    cpu_costs, cpu_params, _ = _train_cnn3d("cpu", calls=8)
    np.testing.assert_allclose(costs, cpu_costs, rtol=2e-3)
    assert costs[-1] < costs[0] and cpu_costs[-1] < cpu_costs[0]
    for a, b in zip(params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)
