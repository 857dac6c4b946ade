"""GPU real FFTs (symgpu/gpu/ops/fft.py, cufft_lib.py, codegen/fft.cu).

On the CPU: the ops' own thunks run on the emulated device (tests/emulated_gpu.py: device
memory is host memory, the pack/Hermitian kernels run as host C++) against a fake cuFFT that
records every plan's parameters (rank, n, inembed/onembed, strides, distances, batch, type)
and computes with NumPy on the host buffers; placement of rfft/irfft and their gradients on a
virtual context; nvcc compiles the module. On a GPU (``requires_gpu``): rfft/irfft against
the CPU ops for several shapes, norms, parities, dtypes, views, and gradients."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, host_view
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import cufft_lib
from symgpu.gpu.ops import fft as gfft
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor import fft

RNG = np.random.default_rng(5)
_CPLX = {"float32": np.complex64, "float64": np.complex128}


# ============================================================================ fake cuFFT

class FakeCufftLib:
    """cuFFT's C entry points over host memory: plans are recorded, executions are NumPy's
    (unnormalised), C2R scribbles over its input as cuFFT may, and records what it was given."""

    def __init__(self) -> None:
        self.plans: dict[int, dict] = {}
        self.destroyed: list[int] = []
        self.c2r_inputs: list[np.ndarray] = []
        self.work_areas: list[int] = []

    def cufftCreate(self, ref) -> int:
        ref._obj.value = len(self.plans) + 1
        self.plans[ref._obj.value] = {"auto": 1}
        return 0

    def cufftSetAutoAllocation(self, h, auto) -> int:
        self.plans[h.value]["auto"] = auto
        return 0

    def cufftMakePlanMany(self, h, rank, n, inembed, istride, idist, onembed, ostride, odist,
                          typ, batch, size_ref) -> int:
        self.plans[h.value].update(rank=rank, n=list(n), inembed=list(inembed),
                                   istride=istride, idist=idist, onembed=list(onembed),
                                   ostride=ostride, odist=odist, type=typ, batch=batch)
        size_ref._obj.value = 4096
        return 0

    def cufftSetStream(self, h, stream) -> int:
        self.plans[h.value]["stream"] = stream.value
        return 0

    def cufftSetWorkArea(self, h, ptr) -> int:
        self.work_areas.append(ptr.value)
        return 0

    def cufftDestroy(self, h) -> int:
        self.destroyed.append(h.value)
        return 0

    def _exec(self, h, src, dst, forward: bool, dtype: str) -> int:
        p = self.plans[h.value]
        assert p["auto"] == 0 and p["istride"] == p["ostride"] == 1
        real_t, cplx_t = np.dtype(dtype), np.dtype(_CPLX[dtype])
        ishape = (p["batch"], *p["inembed"])
        oshape = (p["batch"], *p["onembed"])
        axes = tuple(range(1, p["rank"] + 1))
        if forward:
            x = _at(src.value, ishape, real_t)
            _at(dst.value, oshape, cplx_t)[...] = np.fft.rfftn(x, axes=axes)
        else:
            c = _at(src.value, ishape, cplx_t)
            self.c2r_inputs.append(c.copy())
            _at(dst.value, oshape, real_t)[...] = \
                np.fft.irfftn(c, s=p["n"], axes=axes) * np.prod(p["n"])
            c[...] = np.nan                       # C2R destroys its input
        return 0

    def cufftExecR2C(self, h, src, dst):
        return self._exec(h, src, dst, True, "float32")

    def cufftExecD2Z(self, h, src, dst):
        return self._exec(h, src, dst, True, "float64")

    def cufftExecC2R(self, h, src, dst):
        return self._exec(h, src, dst, False, "float32")

    def cufftExecZ2D(self, h, src, dst):
        return self._exec(h, src, dst, False, "float64")


def _at(ptr: int, shape, dtype) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))
    return raw.view(dtype).reshape(shape)


@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    fake = FakeCufftLib()
    lib = cufft_lib.Cufft(fake)
    monkeypatch.setattr(gfft, "_context", lambda name: ctx)
    monkeypatch.setattr(gfft, "cufft", lambda: lib)
    return ctx, fake


def _on_host(ctx, a: np.ndarray):
    """A GpuArray over NumPy array ``a``'s memory in its own layout (strides kept)."""
    from symgpu.gpu.runtime.array import GpuArray
    g = GpuArray.__new__(GpuArray)
    g._set(ctx, a.ctypes.data, a.shape, a.strides, a.dtype, a)
    return g


def _run(ctx, op, a: np.ndarray, s) -> np.ndarray:
    """op's thunk on the emulated device: `a` (a host array, its strides kept) and `s`."""
    x = GpuArrayType(str(a.dtype), (False,) * a.ndim, None)()
    node = op(x, T.as_tensor_variable(np.asarray(s, dtype="int64"))).owner
    storage = {v: [None] for v in node.inputs + node.outputs}
    storage[node.inputs[0]][0] = device_array(ctx, a) if a.flags.c_contiguous \
        else _on_host(ctx, a)
    storage[node.inputs[1]][0] = np.asarray(s, dtype="int64")
    thunk = node.op.make_thunk(node, storage, {}, [])
    assert thunk.capturable
    thunk()
    return host_view(storage[node.outputs[0]][0]).copy()


def _pairs(c: np.ndarray, dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


SHAPES = [(3, 8), (2, 7), (1, 1), (2, 4, 6), (2, 3, 5), (2, 3, 4, 6), (1, 3, 2, 5)]


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES)
def test_rfft_plan_geometry_and_values(emu, shape, dtype):
    ctx, fake = emu
    x = RNG.standard_normal(shape).astype(dtype)
    got = _run(ctx, gfft.GpuRFFT(), x, shape[1:])
    n, half = list(shape[1:]), list(shape[1:-1]) + [shape[-1] // 2 + 1]
    (plan,) = fake.plans.values()
    assert plan == {"auto": 0, "rank": len(n), "n": n, "inembed": n, "istride": 1,
                    "idist": int(np.prod(n)), "onembed": half, "ostride": 1,
                    "odist": int(np.prod(half)), "batch": shape[0], "stream": None,
                    "type": 0x2a if dtype == "float32" else 0x6a}
    want = np.fft.rfftn(x.astype("float64"), axes=tuple(range(1, len(shape))))
    assert got.shape == tuple(shape[:-1]) + (shape[-1] // 2 + 1, 2) and got.dtype == dtype
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=tol, atol=tol)
    assert fake.work_areas                                   # a pool block, set per call
    _run(ctx, gfft.GpuRFFT(), x, shape[1:])
    assert len(fake.plans) == 1                              # the plan is cached


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES)
def test_irfft_plan_geometry_values_and_hermitian_planes(emu, shape, dtype):
    ctx, fake = emu
    axes = tuple(range(1, len(shape)))
    spec = np.fft.rfftn(RNG.standard_normal(shape), axes=axes)
    spec = spec + 0.3 * RNG.standard_normal(spec.shape) + 0.2j * RNG.standard_normal(spec.shape)
    a = _pairs(spec, dtype)
    before = a.copy()
    got = _run(ctx, gfft.GpuIRFFT(), a, shape[1:])
    np.testing.assert_array_equal(a, before)                 # the user's input is untouched
    n, half = list(shape[1:]), list(shape[1:-1]) + [shape[-1] // 2 + 1]
    (plan,) = fake.plans.values()
    assert {k: plan[k] for k in ("rank", "n", "inembed", "idist", "onembed", "odist",
                                 "batch", "type")} == {
        "rank": len(n), "n": n, "inembed": half, "idist": int(np.prod(half)), "onembed": n,
        "odist": int(np.prod(n)), "batch": shape[0], "type": 0x2c if dtype == "float32" else 0x6c}
    want = np.fft.irfftn(spec, s=shape[1:], axes=axes) * np.prod(shape[1:])
    tol = 2e-4 * np.prod(shape[1:]) if dtype == "float32" else 1e-9
    assert got.shape == shape and got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # what C2R was given: the input, its k = 0 (and n/2) planes Hermitian over the other axes
    (given,) = fake.c2r_inputs
    sa = spec.astype(_CPLX[dtype])
    for k in {0, shape[-1] // 2} if shape[-1] % 2 == 0 else {0}:
        plane = sa[..., k]
        mirror = plane
        for ax in range(1, plane.ndim):
            mirror = np.roll(np.flip(mirror, axis=ax), 1, axis=ax)
        np.testing.assert_allclose(given[..., k], (plane + np.conj(mirror)) / 2, rtol=1e-6)
    middle = [k for k in range(spec.shape[-1]) if k != 0 and not (shape[-1] % 2 == 0
                                                                 and k == shape[-1] // 2)]
    np.testing.assert_array_equal(given[..., middle], sa[..., middle])


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_views_are_packed_before_cufft(emu, dtype):
    ctx, fake = emu
    base = RNG.standard_normal((6, 10, 12)).astype(dtype)
    x = base[::2, 1:9, ::-2]                                 # strided, offset, reversed
    got = _run(ctx, gfft.GpuRFFT(), x, x.shape[1:])
    want = np.fft.rfftn(x.astype("float64"), axes=(1, 2))
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=tol, atol=tol)
    spec = _pairs(np.fft.rfftn(RNG.standard_normal((5, 4, 6)), axes=(1, 2)), dtype)
    view = np.asfortranarray(spec)[1:4]                      # non-C-contiguous pairs
    assert not view.flags.c_contiguous
    got = _run(ctx, gfft.GpuIRFFT(), view, (4, 6))
    want = np.fft.irfftn(view[..., 0] + 1j * view[..., 1], s=(4, 6), axes=(1, 2)) * 24
    np.testing.assert_allclose(got, want, rtol=tol * 24, atol=tol * 24)


@requires_gxx
def test_wrong_shapes_are_reported_with_the_node(emu):
    ctx, _ = emu
    with pytest.raises(ValueError, match=r"GpuRFFT.*s=\(5,\).*\(3, 4\)"):
        _run(ctx, gfft.GpuRFFT(), np.zeros((3, 4), "float32"), (5,))
    with pytest.raises(ValueError, match=r"GpuIRFFT.*s=\(9,\).*\(2, 3, 2\)"):
        _run(ctx, gfft.GpuIRFFT(), np.zeros((2, 3, 2), "float32"), (9,))


def test_plans_are_destroyed_with_the_binding_and_errors_name_the_call():
    fake = FakeCufftLib()
    lib = cufft_lib.Cufft(fake)

    class Ctx:
        stream_handle = 1234

        def activate(self):
            return self
    ctx = Ctx()
    p = lib.plan(ctx, "c2r", "float64", 4, (3, 8))
    assert lib.plan(ctx, "c2r", "float64", 4, (3, 8)) is p
    assert lib.plan(ctx, "c2r", "float64", 5, (3, 8)) is not p
    assert fake.plans[p.handle.value]["stream"] == 1234
    h = p.handle.value
    del p
    lib.plans.clear()
    assert h in fake.destroyed
    with pytest.raises(cufft_lib.CufftError, match="cufftExecR2C.*CUFFT_INVALID_SIZE"):
        cufft_lib.check(8, "cufftExecR2C")


# ============================================================================ placement

def _names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
def test_rfft_irfft_and_their_gradients_are_placed_on_the_gpu(norm):
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.ftensor3("x")
        y = fft.rfft(x, norm=norm)
        z = fft.irfft(y, norm=norm, is_odd=True)
        g = T.grad((z * z).sum() + (y * y).sum(), x)
        f = function([x], [y, z, g])
    names = _names(f)
    assert {"GpuRFFT", "GpuIRFFT"} <= names, names
    assert not names & {"RFFTOp", "IRFFTOp"}, names
    floats = [n for n in cpu_nodes(f.maker.fgraph)
              if any(o.dtype.startswith("float") for o in n.outputs)]
    assert not floats, floats


def test_plain_rfft_is_one_node_and_scaling_is_gpu_elementwise():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fmatrix("x")
        f = function([x], fft.rfft(x))
        g = function([x], fft.irfft(x.dimshuffle(0, 1, "x") * T.ones((1, 1, 2)), norm=None))
    gpu_work = [type(n.op).__name__ for n in f.maker.fgraph.toposort()
                if type(n.op).__name__ not in ("GpuFromHost", "HostFromGpu")]
    assert gpu_work.count("GpuRFFT") == 1 and not [n for n in gpu_work if "Elemwise" in n]
    assert "GpuIRFFT" in _names(g)
    scaling = [str(n.op) for n in g.maker.fgraph.toposort() if type(n.op).__name__ == "GpuElemwise"]
    assert any("true_div" in s or " / " in s for s in scaling)   # alone or fused


def test_transforms_of_four_axes_and_integers_stay_on_the_cpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.tensor(dtype="float32", shape=(False,) * 5)
        assert "RFFTOp" in _names(function([x], fft.rfft(x)))


@requires_nvcc
def test_fft_module_compiles_for_sm90(tmp_path):
    assert compile_for_sm90(gfft.fft_source(), tmp_path)


# ============================================================================ GPU

def _gpu_and_cpu(build, *values):
    """(values on the GPU function, values on the CPU one, op names of the GPU one)."""
    with on_the_cpu():
        ins = [T.tensor(dtype=str(v.dtype), shape=(False,) * v.ndim) for v in values]
        cpu = function(ins, build(*ins))(*values)
    ins = [T.tensor(dtype=str(v.dtype), shape=(False,) * v.ndim) for v in values]
    f = function(ins, build(*ins))
    return f(*values), cpu, _names(f)


GPU_SHAPES = [(4, 1000), (3, 999), (2, 16, 18), (2, 15, 9), (2, 6, 5, 8), (1, 1 << 16)]


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_rfft_irfft_match_the_cpu(cuda, shape, norm, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    odd = shape[-1] % 2 == 1
    got, want, names = _gpu_and_cpu(
        lambda v: [fft.rfft(v, norm=norm), fft.irfft(fft.rfft(v, norm=norm), norm=norm,
                                                     is_odd=odd)], x)
    assert {"GpuRFFT", "GpuIRFFT"} <= names, names
    tol = (2e-4 if dtype == "float32" else 1e-10) * \
        (1 if norm == "ortho" else np.sqrt(x[0].size))   # unnormalised: errors grow with n
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(got[1]), want[1], rtol=tol * 10, atol=tol * 10)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 10), (3, 9), (2, 4, 6), (2, 3, 5), (2, 3, 4, 5)])
def test_gpu_irfft_of_any_half_spectrum_matches_the_cpu(cuda, shape, dtype):
    """Non-Hermitian planes (imaginary DC parts...): NumPy's result, as the gradients need."""
    half = shape[:-1] + (shape[-1] // 2 + 1, 2)
    a = RNG.standard_normal(half).astype(dtype)
    got, want, names = _gpu_and_cpu(
        lambda v: fft.irfft(v, norm="ortho", is_odd=shape[-1] % 2 == 1), a)
    assert "GpuIRFFT" in names
    tol = 2e-5 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


@requires_gpu
def test_gpu_fft_of_views_leaves_the_input_alone(cuda):
    x = RNG.standard_normal((6, 40, 33)).astype("float32")
    got, want, names = _gpu_and_cpu(lambda v: fft.rfft(v[::2, 3:, ::-1]), x)
    assert "GpuRFFT" in names
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-3)
    spec = RNG.standard_normal((4, 8, 2)).astype("float64")
    xs = symgpu.shared(spec)
    f = function([], fft.irfft(xs.dimshuffle(0, 1, 2)[:, :, :]))
    f()
    np.testing.assert_array_equal(xs.get_value(), spec)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(2, 9), (2, 10), (2, 4, 6), (2, 3, 3, 4)])
def test_gpu_fft_gradients_match_the_cpu(cuda, shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    odd = shape[-1] % 2 == 1

    def build(v):
        y = fft.rfft(v, norm="ortho")
        z = fft.irfft(y * y, norm=None, is_odd=odd)
        return T.grad((z * T.sin(v)).sum() + (y ** 3).sum(), v)
    got, want, names = _gpu_and_cpu(build, x)
    assert {"GpuRFFT", "GpuIRFFT"} <= names, names
    tol = 1e-3 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


@requires_gpu
def test_gpu_rfft_of_2_26_floats_is_one_cufft_call(cuda):
    """The benchmark's case: (1, 2^26) float32, one GpuRFFT, no other device work."""
    x = symgpu.shared(RNG.standard_normal((1, 1 << 26)).astype("float32"))
    f = function([], fft.rfft(x))
    nodes = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert [n for n in nodes if n.startswith("Gpu") and n != "GpuFromHost"
            and not n.startswith("GpuShape")] == ["GpuRFFT"], nodes
    got = np.asarray(f())
    want = np.fft.rfft(x.get_value()[0].astype("float64"))
    np.testing.assert_allclose(got[0, :, 0] + 1j * got[0, :, 1], want, rtol=1e-2, atol=1e-1)


def test_theanos_curfft_and_cuirfft_return_gpu_variables_of_the_gpu_ops():
    """theano.gpuarray.fft's names: the host functions' graphs with the input moved to the GPU
    and the result left there (a GPU variable), so nothing comes back to the host."""
    from symgpu.gpu.placement.type import GpuArrayType
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fmatrix("x")
        y = gfft.curfft(x, norm="ortho")
        z = gfft.cuirfft(y, norm="ortho", is_odd=True)
        assert isinstance(y.type, GpuArrayType) and isinstance(z.type, GpuArrayType)
        f = function([x], [y, z])
    names = _names(f)
    assert {"GpuRFFT", "GpuIRFFT"} <= names and "HostFromGpu" not in names, names
    import symgpu.theano_paths as tp
    assert tp.PATHS["symgpu.gpuarray.fft"] == "symgpu.gpu.ops.fft"
