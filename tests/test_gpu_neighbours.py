"""GpuImages2Neibs and GpuImages2NeibsGrad (symgpu/gpu/ops/neighbours.py, Theano's
theano.gpuarray.neighbours): the kernels compiled for sm_90 (nvcc), the ops' own perform run
with their kernels on the host (tests/emulated_gpu.py) against the host ops in every mode and
dtype, placement and gradients on a virtual GPU, and on the GPU (``gpu``) values and gradients
against the host ops with the GPU ops asserted in the compiled graphs."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulate_prepared_kernels, emulated_kernel_device, host_view
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu.gpu.ops import neighbours as gnb
from symgpu.gpu.ops.neighbours import (NEIBS_DTYPES, GpuImages2Neibs, GpuImages2NeibsGrad,
                                       neighbours_source)
from symgpu.gpu.placement.rewriting import cpu_nodes
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet.neighbours import (MODES, Images2Neibs, Images2NeibsGrad, images2neibs,
                                           neibs2images)

RNG = np.random.default_rng(33)

#: (mode, image shape, neib_shape, neib_step): overlapping, disjoint and sparse windows,
#: padding on both axes, wrapping with steps below and above the window
CASES = [
    ("valid", (2, 3, 6, 8), (2, 4), (2, 2)),
    ("valid", (1, 2, 5, 7), (3, 3), (1, 2)),
    ("ignore_borders", (2, 2, 7, 9), (3, 2), (2, 3)),
    ("ignore_borders", (1, 1, 5, 5), (2, 2), (2, 2)),
    ("half", (1, 2, 5, 6), (3, 3), (1, 1)),
    ("half", (2, 1, 6, 7), (2, 3), (2, 2)),
    ("full", (1, 2, 4, 5), (2, 3), (1, 2)),
    ("full", (2, 1, 3, 3), (3, 3), (1, 1)),
    ("wrap_centered", (2, 2, 5, 6), (3, 3), (2, 2)),
    ("wrap_centered", (1, 1, 3, 7), (3, 5), (1, 3)),
    ("wrap_centered", (1, 2, 7, 7), (3, 3), (4, 5)),
]
#: every kind of GPU dtype: floats, halves (copied bit for bit), signed and unsigned, bool
DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int8", "uint16", "bool"]


def _values(shape: tuple, dtype: str) -> np.ndarray:
    """Small integers (so any summation order is exact) in `dtype`, distinct where it can."""
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    lo = 0 if dtype.startswith("uint") else -4
    return RNG.integers(lo, 5, shape).astype(dtype)


def _host(op, *inputs) -> np.ndarray:
    out = [None]
    op.perform(None, list(inputs), [out])
    return out[0]


def _names(f) -> set[str]:
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


# ============================================================================ nvcc

@requires_nvcc
def test_the_kernels_compile_for_sm90(tmp_path):
    src = neighbours_source()
    assert all(f"neibs_fwd_{d}" in src and f"neibs_grad_{d}" in src for d in NEIBS_DTYPES)
    assert set(NEIBS_DTYPES) >= {"float16", "bfloat16", "float32", "float64", "bool", "int8"}
    assert compile_for_sm90(src, tmp_path)


# ============================================================================ the host emulator

@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, gnb)
    return ctx


def _on_host(ctx, a: np.ndarray):
    """A GpuArray over NumPy array ``a``'s memory in its own layout (strides kept)."""
    from symgpu.gpu.runtime.array import GpuArray
    g = GpuArray.__new__(GpuArray)
    g._set(ctx, a.ctypes.data, a.shape, a.strides, a.dtype, a)
    return g


def _gpu_forward(ctx, mode, x: np.ndarray, ns, st) -> np.ndarray:
    node = GpuImages2Neibs(mode)(GpuArrayType(str(x.dtype), (False,) * 4, None)(),
                                 ns, st).owner
    xs = device_array(ctx, x) if x.flags.c_contiguous else _on_host(ctx, x)
    out = [None]
    node.op.perform(node, [xs, np.asarray(ns), np.asarray(st)], [out])
    assert out[0].shape == (out[0].shape[0], ns[0] * ns[1]) and out[0].is_c_contiguous
    return host_view(out[0]).copy()


def _gpu_backward(ctx, mode, gz: np.ndarray, shape, ns, st) -> np.ndarray:
    node = GpuImages2NeibsGrad(mode)(GpuArrayType(str(gz.dtype), (False, False), None)(),
                                     GpuArrayType(str(gz.dtype), (False,) * 4, None)(),
                                     ns, st).owner
    gs = device_array(ctx, gz) if gz.flags.c_contiguous else _on_host(ctx, gz)
    out = [None]
    node.op.perform(node, [gs, device_array(ctx, np.zeros(shape, gz.dtype)), np.asarray(ns),
                           np.asarray(st)], [out])
    assert tuple(out[0].shape) == tuple(shape)
    return host_view(out[0]).copy()


@requires_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_kernel_matches_the_host_op_in_every_mode(emu, dtype):
    for mode, shape, ns, st in CASES:
        x = _values(shape, dtype)
        want = _host(Images2Neibs(mode), x, np.array(ns), np.array(st))
        got = _gpu_forward(emu, mode, x, ns, st)
        assert got.dtype == want.dtype and got.shape == want.shape, (mode, got.shape, want.shape)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8),
                                      err_msg=f"{mode} {shape} {ns} {st}")


@requires_gxx
def test_forward_kernel_reads_strided_images_in_place(emu):
    x = _values((3, 4, 9, 8), "float32")
    for view in (x.transpose(1, 0, 3, 2), x[:, ::2, 1::2, ::-1]):   # permuted, sliced, reversed
        assert not view.flags.c_contiguous
        for mode, ns, st in (("half", (3, 2), (1, 1)), ("wrap_centered", (3, 3), (2, 3)),
                             ("ignore_borders", (2, 3), (2, 2))):
            want = _host(Images2Neibs(mode), view, np.array(ns), np.array(st))
            np.testing.assert_array_equal(_gpu_forward(emu, mode, view, ns, st), want)


@requires_gxx
def test_half_values_are_copied_bit_for_bit(emu):
    """The forward kernel copies storage: NaN payloads, -0 and subnormals survive."""
    bits = np.array([0x7e01, 0x8000, 0x0001, 0xfc00, 0x3c00, 0x7c00], np.uint16)
    x = np.resize(bits, (1, 1, 4, 6)).view(np.float16)
    got = _gpu_forward(emu, "half", x, (3, 3), (1, 1))
    want = _host(Images2Neibs("half"), x, np.array([3, 3]), np.array([1, 1]))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@requires_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_kernel_matches_the_host_op_in_every_mode(emu, dtype):
    for mode, shape, ns, st in CASES:
        x = np.zeros(shape, dtype)
        rows = _host(Images2Neibs(mode), x, np.array(ns), np.array(st)).shape
        gz = _values(rows, dtype)
        want = _host(Images2NeibsGrad(mode), gz, x, np.array(ns), np.array(st))
        got = _gpu_backward(emu, mode, gz, shape, ns, st)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64),
                                      err_msg=f"{mode} {shape} {ns} {st}")


@requires_gxx
def test_gradient_kernel_reads_a_strided_gz_and_sums_in_float32_for_halves(emu):
    shape, ns, st = (2, 1, 6, 7), (3, 3), (1, 1)
    rows = _host(Images2Neibs("half"), np.zeros(shape), np.array(ns), np.array(st)).shape
    g = RNG.standard_normal((rows[1], rows[0])).astype("float32").T   # column-major gz
    want = _host(Images2NeibsGrad("half"), np.ascontiguousarray(g), np.zeros(shape),
                 np.array(ns), np.array(st))
    np.testing.assert_allclose(_gpu_backward(emu, "half", g, shape, ns, st), want, rtol=1e-6,
                               atol=1e-6)
    for dtype, tol in (("float16", 2.0 ** -10), ("bfloat16", 2.0 ** -7)):
        gh = np.ascontiguousarray(g).astype(dtype)
        want = _host(Images2NeibsGrad("half"), gh.astype(np.float32), np.zeros(shape),
                     np.array(ns), np.array(st))        # the float32 sum, rounded once
        got = _gpu_backward(emu, "half", gh, shape, ns, st)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(dtype).astype(np.float32),
                                   rtol=tol, atol=tol)


@requires_gxx
def test_the_ops_check_geometry_and_gz_as_the_host_op(emu):
    x = _values((1, 1, 5, 5), "float32")
    with pytest.raises(ValueError, match="not consistent in mode 'valid'"):
        _gpu_forward(emu, "valid", x, (2, 2), (2, 2))
    with pytest.raises(ValueError, match="odd window shapes"):
        _gpu_forward(emu, "wrap_centered", x, (2, 3), (1, 1))
    with pytest.raises(ValueError, match="must be positive"):
        _gpu_forward(emu, "half", x, (3, 3), (0, 1))
    with pytest.raises(ValueError, match=r"gz has shape \(4, 4\).*windows of shape \(9, 4\)"):
        _gpu_backward(emu, "valid", np.zeros((4, 4), "float32"), (1, 1, 6, 6), (2, 2), (2, 2))


@requires_gxx
def test_empty_batches_give_empty_results(emu):
    x = np.zeros((0, 3, 4, 4), "float32")
    assert _gpu_forward(emu, "valid", x, (2, 2), (2, 2)).shape == (0, 4)
    assert _gpu_backward(emu, "valid", np.zeros((0, 4), "float32"), (0, 3, 4, 4), (2, 2),
                         (2, 2)).shape == (0, 3, 4, 4)


# ============================================================================ virtual GPU

def test_the_ops_build_gpu_nodes_and_check_their_inputs(vgpu):
    g = GpuArrayType("float32", (False,) * 4)("g")
    out = GpuImages2Neibs("half")(g, (3, 3), (1, 2))
    assert out.type == GpuArrayType("float32", (False, False)) and str(out.owner.op) == \
        "GpuImages2Neibs{half}"
    default_step = GpuImages2Neibs("half")(g, (2, 2)).owner
    assert default_step.inputs[2] is default_step.inputs[1]     # neib_step defaults to the shape
    assert GpuImages2Neibs("valid") == GpuImages2Neibs("valid") != GpuImages2Neibs("full")
    back = GpuImages2NeibsGrad("full")(out, g, (3, 3), (1, 2))
    assert back.type == GpuArrayType("float32", (False,) * 4)
    with pytest.raises(ValueError, match="mode must be one of"):
        GpuImages2Neibs("same")
    with pytest.raises(TypeError, match="4-d tensor"):
        GpuImages2Neibs()(GpuArrayType("float32", (False,) * 3)(), (2, 2))
    with pytest.raises(TypeError, match="integer vector"):
        GpuImages2Neibs()(g, T.dvector())
    with pytest.raises(TypeError, match="complex64 cannot live on the GPU"):
        GpuImages2Neibs()(T.TensorType("complex64", (False,) * 4)(), (2, 2))


@pytest.mark.parametrize("mode", MODES)
def test_images2neibs_and_its_gradient_are_lifted(vgpu, mode):
    x = T.ftensor4("x")
    ns, st = ((3, 3), (2, 2)) if mode == "wrap_centered" else ((2, 3), (1, 1))
    y = images2neibs(x * 2, ns, st, mode=mode)
    f = symgpu.function([x], [y + 1, T.grad((y ** 2).sum(), x)])
    nodes = f.maker.fgraph.toposort()
    names = _names(f)
    assert {"GpuImages2Neibs", "GpuImages2NeibsGrad"} <= names, names
    assert not {"Images2Neibs", "Images2NeibsGrad"} & names, names
    assert not cpu_nodes(f.maker.fgraph), [str(n.op) for n in cpu_nodes(f.maker.fgraph)]
    # one upload of x, the results' downloads: nothing goes back and forth around the ops
    assert sum(type(n.op).__name__ == "GpuFromHost" for n in nodes) == 1, names
    (fwd,) = [n for n in nodes if isinstance(n.op, GpuImages2Neibs)]
    assert fwd.op.mode == mode


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32", "uint8", "bool"])
def test_every_gpu_dtype_is_lifted(vgpu, dtype):
    x = T.TensorType(dtype, (False,) * 4)("x")
    f = symgpu.function([x], images2neibs(x, (2, 2), mode="ignore_borders"))
    assert "GpuImages2Neibs" in _names(f) and "Images2Neibs" not in _names(f)


def test_neibs2images_and_its_gradient_stay_on_the_gpu(vgpu):
    x = T.ftensor4("x")
    nb = images2neibs(x, (2, 3))
    back = neibs2images(nb * 3, (2, 3), x.shape)
    g = T.grad((back ** 2).sum(), x)
    f = symgpu.function([x], [back, g])
    assert "GpuImages2Neibs" in _names(f)
    assert not cpu_nodes(f.maker.fgraph), [str(n.op) for n in cpu_nodes(f.maker.fgraph)]


def test_gradients_of_the_gpu_ops_are_the_gpu_ops(vgpu):
    """GpuImages2Neibs' gradient is GpuImages2NeibsGrad and the other way round (what a
    graph built with the GPU op, as Theano's users did, differentiates to)."""
    x = GpuArrayType("float32", (False,) * 4)("x")
    y = GpuImages2Neibs("wrap_centered")(x, (3, 3), (1, 1))
    (g,) = symgpu.grad(symgpu.gpu.placement.basic_ops.host_from_gpu(y).sum(), [x])
    f = symgpu.function([x], g)
    assert "GpuImages2NeibsGrad" in _names(f) and not cpu_nodes(f.maker.fgraph)
    gz = GpuArrayType("float32", (False, False))("gz")
    back = GpuImages2NeibsGrad("half")(gz, x, (3, 3), (1, 1))
    (gg,) = symgpu.grad(symgpu.gpu.placement.basic_ops.host_from_gpu(back).sum(), [gz])
    assert "GpuImages2Neibs" in _names(symgpu.function([gz, x], gg, on_unused_input="ignore"))
    ints = GpuArrayType("int32", (False,) * 4)("i")
    assert GpuImages2Neibs()(ints, (2, 2)).owner.op.grad(
        [ints, T.as_tensor_variable([2, 2]), T.as_tensor_variable([2, 2])], [None]) == \
        [None, None, None]


def test_theanos_path_names_the_op():
    import symgpu.gpuarray.neighbours as theano_neighbours
    assert theano_neighbours.GpuImages2Neibs is GpuImages2Neibs


# ============================================================================ on the GPU

def _gpu_function(inputs, outputs, expect: set[str]):
    f = symgpu.function(inputs, outputs)
    names = _names(f)
    assert expect <= names, (expect - names, names)
    assert not {"Images2Neibs", "Images2NeibsGrad"} & names, names
    return f


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64",
                                   "uint8", "bool"])
def test_images2neibs_on_the_gpu_in_every_mode(cuda, dtype):
    x = T.TensorType(dtype, (False,) * 4)("x")
    for mode, shape, ns, st in CASES:
        f = _gpu_function([x], images2neibs(x, ns, st, mode=mode), {"GpuImages2Neibs"})
        v = _values(shape, dtype)
        got = np.asarray(f(v))
        want = _host(Images2Neibs(mode), v, np.array(ns), np.array(st))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8),
                                      err_msg=f"{mode} {shape} {ns} {st}")


@pytest.mark.gpu
def test_images2neibs_on_the_gpu_reads_a_gpu_array_and_runs_there(cuda):
    from symgpu.gpu.placement.type import gpuarray_shared_constructor, is_gpu_var
    v = _values((2, 3, 9, 8), "float32")
    xs = gpuarray_shared_constructor(v, name="xs")
    assert is_gpu_var(xs)
    y = images2neibs(xs[:, :, ::2, ::-1], (3, 2), (1, 2), mode="half")   # a strided view
    f = _gpu_function([], y, {"GpuImages2Neibs"})
    want = _host(Images2Neibs("half"), v[:, :, ::2, ::-1], np.array([3, 2]), np.array([1, 2]))
    for _ in range(3):   # plain, then captured and replayed
        np.testing.assert_array_equal(f(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_the_gradient_on_the_gpu_in_every_mode(cuda, dtype):
    x = T.TensorType(dtype, (False,) * 4)("x")
    for mode, shape, ns, st in CASES:
        y = images2neibs(x, ns, st, mode=mode)
        w = T.TensorType(dtype, (False, False))("w")
        g = T.grad((y * w).sum(), x)
        f = _gpu_function([x, w], g, {"GpuImages2NeibsGrad"})
        v = _values(shape, dtype)
        rows = _host(Images2Neibs(mode), v, np.array(ns), np.array(st)).shape
        wv = _values(rows, dtype)
        want = _host(Images2NeibsGrad(mode), wv.astype(np.float64), v, np.array(ns),
                     np.array(st))
        np.testing.assert_array_equal(np.asarray(f(v, wv)).astype(np.float64), want,
                                      err_msg=f"{mode} {shape} {ns} {st}")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_verify_grad_on_the_gpu(cuda, mode):
    from symgpu.gradient import verify_grad
    ns, st = ((3, 3), (2, 1)) if mode == "wrap_centered" else ((2, 3), (1, 1))
    shape = (1, 2, 5, 5) if mode != "valid" else (1, 2, 4, 5)
    x = T.dtensor4("x")
    f = symgpu.function([x], T.grad((images2neibs(x, ns, st, mode=mode) ** 2).sum(), x))
    assert {"GpuImages2Neibs", "GpuImages2NeibsGrad"} <= _names(f)
    verify_grad(lambda a: images2neibs(a, ns, st, mode=mode), [RNG.standard_normal(shape)])
    verify_grad(lambda g: Images2NeibsGrad(mode)(g, T.zeros(shape), ns, st),
                [RNG.standard_normal(_host(Images2Neibs(mode), np.zeros(shape), np.array(ns),
                                           np.array(st)).shape)])


@pytest.mark.gpu
def test_neibs2images_on_the_gpu_inverts_images2neibs(cuda):
    x = T.ftensor4("x")
    v = _values((2, 3, 6, 9), "float32")
    back = neibs2images(images2neibs(x, (2, 3)), (2, 3), x.shape)
    g = T.grad((back * x).sum(), x)
    f = _gpu_function([x], [back, g], {"GpuImages2Neibs"})
    got, got_g = f(v)
    np.testing.assert_array_equal(got, v)
    np.testing.assert_array_equal(got_g, 2 * v)


# ============================================================================ whole functions, emulated

@pytest.fixture
def emu_fn(monkeypatch, tmp_path):
    """An emulated device registered as context 'emu_neibs' (tests/emulated_gpu.py): whole
    compiled functions run there, transfers, elementwise kernels and ours included."""
    from emulated_gpu import emulated_array_device
    from symgpu.gpu.runtime.context import register_context, unregister_context
    ctx = emulated_array_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, gnb)
    register_context("emu_neibs", ctx)
    yield ctx
    unregister_context("emu_neibs")


@requires_gxx
@pytest.mark.parametrize("mode, dtype", [(m, "float32") for m in MODES] + [
    ("full", "float16"), ("wrap_centered", "bfloat16")])
def test_a_compiled_function_runs_the_ops_and_the_gradient_on_the_device(emu_fn, mode, dtype):
    from symgpu.config import config
    from symgpu.gpu.placement.type import gpuarray_shared_constructor
    ns, st = {"valid": ((3, 2), (1, 1)), "wrap_centered": ((3, 3), (2, 1))}.get(
        mode, ((3, 2), (2, 1)))
    v = _values((2, 1, 5, 6), dtype)    # small integers: every result is exact in dtype
    with config.change_flags(floatX="float32"):
        x = gpuarray_shared_constructor(v, name="x", target="emu_neibs")
        y = images2neibs(x * 2, ns, st, mode=mode)
        f = symgpu.function([], [y, T.grad((y ** 2).sum(), x)])
    names = _names(f)
    assert {"GpuImages2Neibs", "GpuImages2NeibsGrad"} <= names and "Images2Neibs" not in names
    got_y, got_g = f()
    want_y = _host(Images2Neibs(mode), v * 2, np.array(ns), np.array(st))
    want_g = 2 * _host(Images2NeibsGrad(mode), 2 * want_y, v, np.array(ns), np.array(st))
    assert got_y.dtype == got_g.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_array_equal(got_g.astype(np.float32), want_g.astype(np.float32))
