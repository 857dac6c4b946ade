"""The direct filter gradient for small filters (symgpu/gpu/ops/conv_wgrad.py, codegen/
conv_wgrad.cu): its kernels compiled as host C++ and run on emulated device memory
(tests/emulated_gpu.py) against NumPy's filter gradient, 2-d and 3-d with strides, dilation,
padding, groups and flips, several chunks (the deterministic second pass); which geometries
it takes; nvcc compilation for sm_90.  The search's use of it: tests/test_cudnn_search.py;
on a GPU: tests/test_gpu_conv3d.py."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import (device_array, emulate_prepared_kernels, emulated_array_device,
                          emulated_kernel_device, host_view)
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu.gpu.ops import conv_wgrad
from symgpu.tensor.nnet import conv_numpy as cn

RNG = np.random.default_rng(331)


@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, conv_wgrad)
    return ctx


@pytest.fixture
def emu_arrays(monkeypatch, tmp_path):
    """emu whose arrays also copy (an asymmetric border's explicit padding)."""
    ctx = emulated_array_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, conv_wgrad)
    return ctx


def _out_shape(xshape, ksp, pads, s, d):
    return tuple((n + 2 * p - dd * (k - 1) - 1) // st + 1
                 for n, k, p, st, dd in zip(xshape[2:], ksp, pads, s, d))


def _direct(ctx, x, gy, wshape, pads, s, d, flip, groups):
    """The direct kernels' dW of (x, gy), run on the emulated device."""
    plan = conv_wgrad.direct_wgrad(str(x.dtype), x.shape, wshape, gy.shape, pads, s, d, flip,
                                   groups)
    assert plan is not None
    xd, gyd = device_array(ctx, x), device_array(ctx, gy)
    dw = device_array(ctx, np.full(wshape, np.nan, dtype=x.dtype))
    ws = ctx.pool.allocate(plan.workspace)
    plan.run(ctx, xd.ptr, gyd.ptr, dw.ptr, ws.ptr)
    return plan, host_view(dw).copy()


# (x shape, filters O, kernel, pads, strides, dilation, flip, groups)
CASES = [
    ((2, 1, 9, 8, 7), 3, (3, 3, 3), (0, 0, 0), (1, 1, 1), (1, 1, 1), True, 1),
    ((1, 2, 7, 6, 5), 2, (2, 3, 2), (1, 0, 1), (2, 1, 1), (1, 2, 1), False, 1),
    ((3, 4, 5, 5, 6), 4, (1, 2, 3), (0, 1, 2), (1, 2, 3), (2, 1, 1), True, 2),
    ((2, 1, 11, 9), 5, (3, 3), (0, 0), (1, 1), (1, 1), True, 1),
    ((3, 3, 7, 10), 2, (5, 3), (2, 1), (2, 3), (1, 2), False, 1),
    ((1, 6, 5, 7), 6, (3, 3), (1, 1), (1, 1), (1, 1), True, 3),
    ((2, 8, 4, 5), 3, (3, 2), (0, 1), (1, 1), (1, 1), False, 1),    # 48 taps: KMAX 64
]


@requires_gxx
@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) + str(c[2]) for c in CASES])
@pytest.mark.parametrize("chunked", [False, True])
def test_direct_filter_gradient_matches_numpy(emu, monkeypatch, case, chunked):
    """float32 and float64 against NumPy; `chunked`: the (image, position) range split into
    chunks of a length that is no multiple of the block, so the second pass sums several
    partials per element."""
    xshape, o, ksp, pads, s, d, flip, groups = case
    if chunked:
        monkeypatch.setattr(conv_wgrad, "MIN_CHUNK", 7)
    for dt, tol in (("float64", 1e-12), ("float32", 2e-5)):
        x = RNG.normal(size=xshape).astype(dt)
        wshape = (o, xshape[1] // groups, *ksp)
        gy = RNG.normal(size=(xshape[0], o, *_out_shape(xshape, ksp, pads, s, d))).astype(dt)
        plan, got = _direct(emu, x, gy, wshape, pads, s, d, flip, groups)
        assert (plan.chunks > 1) is chunked
        want = cn.conv_grad_weights(x, gy, ksp, tuple((p, p) for p in pads), s, d, flip,
                                    groups, dt)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"{case} {dt}")


@requires_gxx
def test_direct_filter_gradient_is_the_same_at_every_call(emu, monkeypatch):
    monkeypatch.setattr(conv_wgrad, "MIN_CHUNK", 50)
    x = RNG.normal(size=(2, 1, 8, 8, 8)).astype("float32")
    gy = RNG.normal(size=(2, 2, 6, 6, 6)).astype("float32")
    first = _direct(emu, x, gy, (2, 1, 3, 3, 3), (0,) * 3, (1,) * 3, (1,) * 3, True, 1)[1]
    again = _direct(emu, x, gy, (2, 1, 3, 3, 3), (0,) * 3, (1,) * 3, (1,) * 3, True, 1)[1]
    assert np.array_equal(first, again)


@requires_gxx
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_direct_filter_gradient_of_half_operands_accumulates_in_float32(emu, dt):
    """The operands rounded to the half dtype, the sums against NumPy's in float32 of those
    values, rounded once (bfloat16 has no NumPy dtype: its bits are the top half of a
    float32's)."""
    x32 = RNG.normal(size=(2, 2, 6, 7, 5)).astype("float32")
    gy32 = RNG.normal(size=(2, 3, 4, 5, 3)).astype("float32")
    if dt == "float16":
        x, gy = x32.astype("float16"), gy32.astype("float16")
        xv, gyv = x.astype("float32"), gy.astype("float32")
    else:
        def bf16(a):
            return (a.view("uint32") >> 16).astype("uint16")
        x, gy = bf16(x32), bf16(gy32)
        xv = (x.astype("uint32") << 16).view("float32")
        gyv = (gy.astype("uint32") << 16).view("float32")
    wshape = (3, 2, 3, 3, 3)
    plan = conv_wgrad.direct_wgrad(dt, x.shape, wshape, gy.shape, (0,) * 3, (1,) * 3,
                                   (1,) * 3, True, 1)
    xd, gyd = device_array(emu, x), device_array(emu, gy)
    dw = device_array(emu, np.zeros(wshape, x.dtype))
    plan.run(emu, xd.ptr, gyd.ptr, dw.ptr, emu.pool.allocate(plan.workspace).ptr)
    raw = host_view(dw).copy()
    got = raw.astype("float32") if dt == "float16" else (raw.astype("uint32") << 16).view(
        "float32")
    want = cn.conv_grad_weights(xv, gyv, (3, 3, 3), ((0, 0),) * 3, (1,) * 3, (1,) * 3, True, 1,
                                "float32")
    rel = 1e-2 if dt == "bfloat16" else 2e-3
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * np.abs(want).max())


def test_which_geometries_the_direct_kernel_takes():
    args = ((0, 0, 0), (1, 1, 1), (1, 1, 1), True, 1)
    # the 3-D CNN's first layer: 27 taps
    plan = conv_wgrad.direct_wgrad("float32", (8, 1, 32, 32, 32), (16, 1, 3, 3, 3),
                                   (8, 16, 30, 30, 30), *args)
    assert plan.taps == 27 and plan.kmax == 32 and plan.partial_name == \
        "wgrad_partial_float32_k32"
    assert plan.chunks * 16 <= conv_wgrad.TARGET_BLOCKS + 16
    assert plan.workspace == 16 * 27 * plan.chunks * 4
    # its second layer: 16 * 27 taps, more than the registers hold
    assert conv_wgrad.direct_wgrad("float32", (8, 16, 15, 15, 15), (32, 16, 3, 3, 3),
                                   (8, 32, 13, 13, 13), *args) is None
    # an index past an int
    assert conv_wgrad.direct_wgrad("float32", (4096, 1, 128, 128, 128), (4, 1, 3, 3, 3),
                                   (4096, 4, 126, 126, 126), *args) is None
    assert conv_wgrad.direct_wgrad("int32", (8, 1, 8, 8, 8), (4, 1, 3, 3, 3),
                                   (8, 4, 6, 6, 6), *args) is None
    two = conv_wgrad.direct_wgrad("float64", (2, 3, 9, 9), (4, 3, 3, 3), (2, 4, 7, 7),
                                  (0, 0), (1, 1), (1, 1), False, 1)
    assert two.taps == 27 and two.workspace == 4 * 27 * two.chunks * 8
    assert two.geo[5:8] == [1, 9, 9]       # 2-d as 3-d: one plane


@requires_nvcc
def test_direct_filter_gradient_kernels_compile(tmp_path):
    cubin = compile_for_sm90(conv_wgrad.wgrad_source(), tmp_path)
    for name in conv_wgrad.module_kernels():
        assert f"{name}\0".encode() in cubin, name


@requires_gxx
@pytest.mark.parametrize("kw, xshape, o, ksp", [
    (dict(), (2, 1, 7, 6, 8), 4, (3, 3, 3)),
    (dict(border_mode=((1, 0), (0, 2), 1), subsample=(2, 1, 1)), (1, 2, 5, 6, 4), 3,
     (2, 3, 2))])
def test_the_op_runs_the_direct_kernel_where_the_search_keeps_it(emu_arrays, monkeypatch, kw,
                                                                 xshape, o, ksp):
    """GpuConv3dGradWeights's own thunk on the emulated device, cuDNN a stand-in whose calls
    compute nothing and which the timer calls slower: the search keeps the direct kernel,
    whose dW is NumPy's (the second border is asymmetric: the op pads x explicitly)."""
    import symgpu.tensor as T
    from symgpu.gpu.ops import conv as gconv
    from symgpu.gpu.ops import cudnn as gcudnn
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import GpuArrayType
    from test_gpu_conv3d import _fake_binding
    lib = _fake_binding()
    emu = emu_arrays
    emu.pool.sink = None
    monkeypatch.setattr(gconv, "cudnn", lambda: lib)
    monkeypatch.setattr(gconv, "_context", lambda name: emu)
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    timed = []

    def event_timer(stream):
        def timer(run, n):
            before = len(lib.lib.calls)
            for _ in range(n):
                run()
            cudnn_ran = any(c[0].startswith("cudnnConvolutionBackwardFilter")
                            for c in lib.lib.calls[before:])
            timed.append("cudnn" if cudnn_ran else "direct")
            return 1e-3 if cudnn_ran else 1e-6
        return timer
    monkeypatch.setattr(gcudnn, "_event_timer", event_timer)
    op = gconv.GpuConv3dGradWeights(**kw)
    pads = op.pads(ksp)
    x = RNG.normal(size=xshape).astype("float32")
    osp = tuple((n + sum(p) - (k - 1) - 1) // s + 1
                for n, k, p, s in zip(xshape[2:], ksp, pads, op.subsample))
    gy = RNG.normal(size=(xshape[0], o, *osp)).astype("float32")
    with virtual_context(None):
        g5 = GpuArrayType("float32", (False,) * 5, None)
        node = op(g5(), g5(), T.lvector()).owner
    cells = {node.inputs[0]: [device_array(emu, x)], node.inputs[1]: [device_array(emu, gy)],
             node.inputs[2]: [np.array(ksp, dtype="int64")], node.outputs[0]: [None]}
    thunk = node.op.make_thunk(node, cells, {}, [])
    want = cn.conv_grad_weights(x, gy, ksp, pads, op.subsample, (1, 1, 1), True, 1, "float32")
    for _ in range(2):
        thunk()
        np.testing.assert_allclose(host_view(cells[node.outputs[0]][0]), want, rtol=2e-5,
                                   atol=2e-5 * np.abs(want).max())
    assert timed == ["cudnn", "direct"]     # one search, at the first call


# ============================================================================ GPU

@requires_gpu
@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("xshape, o, ksp, kw", [
    ((8, 1, 32, 32, 32), 16, (3, 3, 3), dict()),                 # the 3-D CNN's first layer
    ((2, 2, 9, 8, 7), 3, (2, 3, 2), dict(border_mode="half", subsample=(2, 1, 1),
                                         filter_dilation=(1, 2, 1))),
    ((3, 4, 6, 5, 7), 4, (1, 2, 3), dict(border_mode=((0, 1), 1, (2, 0)), num_groups=2,
                                         filter_flip=False)),
    ((4, 3, 17, 13), 8, (3, 3), dict()),
    ((2, 6, 11, 9), 6, (3, 2), dict(border_mode="full", subsample=(2, 1), num_groups=3))])
def test_gpu_direct_filter_gradient_matches_cpu(cuda, monkeypatch, dt, xshape, o, ksp, kw):
    """The direct kernel made the search's choice (its timer calls it fastest), its dW
    against the CPU's; every call after the first runs it again (counted)."""
    import symgpu
    import symgpu.tensor as T
    from symgpu import function
    from symgpu.gpu.ops import conv as gconv
    from symgpu.gpu.ops import cudnn as gcudnn
    from symgpu.tensor.nnet import conv2d, conv3d
    if not gcudnn.cudnn_available():
        pytest.skip("cuDNN is not installed")
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    monkeypatch.setattr(gconv, "ALGO_SEARCH", "time")
    ran = []
    real_run = conv_wgrad.WgradDirect.run

    def counted(self, *args):
        ran.append(self.partial_name)
        return real_run(self, *args)
    monkeypatch.setattr(conv_wgrad.WgradDirect, "run", counted)
    real_timer = gcudnn._event_timer

    def prefer_direct(stream):
        timer = real_timer(stream)

        def timed(run, n):
            before = len(ran)
            seconds = timer(run, n)
            return 0.0 if len(ran) > before else seconds + 1.0
        return timed
    monkeypatch.setattr(gcudnn, "_event_timer", prefer_direct)
    nd = len(ksp)
    ftype = T.TensorType(dt, (False,) * (nd + 2))
    x, gy = ftype("x"), ftype("gy")
    g = kw.get("num_groups", 1)
    wv = RNG.normal(size=(o, xshape[1] // g, *ksp)).astype(dt)
    w = symgpu.shared(wv)
    y = (conv3d if nd == 3 else conv2d)(x, w, **kw)
    gw = symgpu.grad((y * gy).sum(), w)
    xv = RNG.normal(size=xshape).astype(dt)
    with on_the_cpu():
        wc = symgpu.shared(wv)
        yc = (conv3d if nd == 3 else conv2d)(x, wc, **kw)
        gyv = RNG.normal(size=function([x], yc)(xv).shape).astype(dt)
        want = function([x, gy], symgpu.grad((yc * gy).sum(), wc))(xv, gyv)
    f = function([x, gy], gw)
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert f"GpuConv{nd}dGradWeights" in names, names
    tol = 1e-10 if dt == "float64" else 2e-4
    for _ in range(3):
        np.testing.assert_allclose(f(xv, gyv), want, rtol=tol, atol=tol * np.abs(want).max())
    # the search's untimed and timed runs, then the first call's own (later calls may
    # replay a captured CUDA graph, which runs no Python)
    assert len(ran) >= 1 + gcudnn.SEARCH_RUNS + 1, ran
