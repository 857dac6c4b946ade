"""cuBLASLt matrix products (symgpu/gpu/ops/blaslt.py): the timed algorithm choice and the
routing of GpuDot22/GpuGemm onto it, checked with fakes on the CPU; on a GPU
(``pytest -m gpu``) the values of every layout routed there against NumPy, z read in place,
TF32, device scalars, and a CUDA graph that replays the chosen algorithms."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpu_helpers import FakeCtx, fake_gpu_array, requires_gpu, virtual_context
from symgpu import config
from symgpu.gpu.ops import blas, blaslt, thin_gemm

VCTX = "blaslt-virtual"
_virtual = virtual_context(VCTX)


@pytest.fixture(autouse=True)
def cublaslt_on():
    """The flag is off by default; these tests are about the path it turns on."""
    with config.change_flags(**{"gpuarray.cublaslt": True}):
        yield


# ============================================================================ the choice

def test_the_fastest_candidate_is_kept_and_timed_once():
    choice = blaslt.AlgoChoice()
    calls = []

    def time_all():
        calls.append(1)
        return [3.0, 1.0, 2.0]
    assert choice.pick("k", 3, time_all, can_time=True) == 1
    assert choice.pick("k", 3, time_all, can_time=True) == 1
    assert len(calls) == 1, "a problem is timed once"
    assert choice.timings["k"] == [3.0, 1.0, 2.0]


def test_a_candidate_that_fails_is_passed_over_and_all_failing_is_unsupported():
    choice = blaslt.AlgoChoice()
    assert choice.pick("a", 3, lambda: [None, 4.0, 3.0], can_time=True) == 2
    assert choice.timings["a"][0] is None
    with pytest.raises(blaslt.LtUnsupported):
        choice.pick("b", 2, lambda: [None, None], can_time=True)
    with pytest.raises(blaslt.LtUnsupported):
        choice.pick("c", 0, lambda: [], can_time=True)


def test_under_capture_the_heuristics_first_runs_and_nothing_is_remembered():
    choice = blaslt.AlgoChoice()

    def never():
        raise AssertionError("timed during a capture")
    assert choice.pick("k", 4, never, can_time=False) == 0
    assert "k" not in choice.chosen
    assert choice.pick("k", 4, lambda: [4.0, 3.0, 2.0, 1.0], can_time=True) == 3
    assert choice.pick("one", 1, never, can_time=True) == 0 and choice.chosen["one"] == 0


def _problem(m=512, n=128, k=800, lda=None, ldb=512, ldd=512):
    return blaslt.LtProblem("float32", False, 0, 1, m, n, k, m if lda is None else lda, ldb,
                            ldd, False, 1, 0, 0, 0, blaslt.EPILOGUE_DEFAULT, (256, 256, 256))


def test_a_size_that_changes_every_call_is_timed_at_a_few_sizes_then_borrows():
    """A product over a sequence length (k = L * batch, new each call) is timed at
    TIMED_SIZES lengths; a new length then runs the candidate chosen for the nearest timed
    one, found by its algorithm among the new problem's candidates (else the heuristic's
    first), and is never timed; another product (other m) is timed as before."""
    choice = blaslt.AlgoChoice()
    timed = []

    def time_for(best):
        def time_all():
            timed.append(best)
            return [1.0 if i == best else 2.0 for i in range(4)]
        return time_all

    def ids(k):   # the new problem's candidates: the same algorithms in another order
        return [("algo", (i + k) % 4) for i in range(4)]
    for n, k in enumerate((160, 800, 1440)):
        fams = blaslt.size_families("dev", _problem(k=k))
        assert choice.borrowed(fams, ids(k)) is None
        best = choice.pick(("dev", k), 4, time_for(n + 1), can_time=True)
        choice.note(fams, ids(k)[best])
    assert timed == [1, 2, 3]
    # k = 900: nearest timed size 800, whose winner was ("algo", (2 + 800) % 4) = ("algo", 2)
    got = choice.borrowed(blaslt.size_families("dev", _problem(k=900)), ids(900))
    assert ids(900)[got] == ("algo", 2)
    # a new problem whose candidates lack that algorithm: the heuristic's first
    assert choice.borrowed(blaslt.size_families("dev", _problem(k=900)),
                           [("other", i) for i in range(4)]) == 0
    # m differs too: another family, timed as before
    assert choice.borrowed(blaslt.size_families("dev", _problem(m=256, k=900)), ids(0)) is None
    # a transposed A's leading dimension is k: it changes with k and is left out with it
    fams = blaslt.size_families("dev", _problem(k=900, lda=900))
    assert fams[2][0] == blaslt.size_families("dev", _problem(k=64, lda=64))[2][0]
    choice.clear()
    assert not choice.sizes


def test_choose_times_new_sizes_only_until_the_family_has_enough(monkeypatch):
    """blaslt._choose: per new k one timing for the first TIMED_SIZES sizes, none after;
    each choice is remembered per problem."""
    import sys
    import types
    fake_drv = types.ModuleType("pycuda.driver")
    fake_drv.Error = RuntimeError
    fake_pkg = types.ModuleType("pycuda")
    fake_pkg.driver = fake_drv
    monkeypatch.setitem(sys.modules, "pycuda", fake_pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake_drv)
    monkeypatch.setattr(blaslt, "CHOICES", blaslt.AlgoChoice())
    monkeypatch.setattr(blaslt, "_capturing", lambda ctx: False)

    class Scratch:
        ptr = 0

        def fill(self, v):
            pass
    monkeypatch.setattr(blaslt, "new_array", lambda *a, **k: Scratch())
    timings = []

    def timer(ctx, lt, plan, args, scratch):
        def time_all():
            timings.append(plan.problem.k)
            return [2.0, 1.0, 3.0]
        return time_all
    monkeypatch.setattr(blaslt, "_timer", timer)
    algos = [((ctypes.c_uint64 * 8)(i), 0, f"heuristic #{i}") for i in range(2)] + \
        [(None, 0, "classic cuBLAS")]
    for k in (160, 320, 480, 640, 800, 960):
        p = _problem(k=k)
        plan = types.SimpleNamespace(algos=algos, problem=p)
        got = blaslt._choose(types.SimpleNamespace(), None, plan, p, ("dev", p), ())
        assert got == 1 and blaslt.CHOICES.chosen[("dev", p)] == 1
    assert timings == [160, 320, 480][:blaslt.TIMED_SIZES]


def test_alignment_of_device_addresses():
    assert blaslt.alignment(0x7f0000000000) == 256
    assert blaslt.alignment(0x7f0000000004) == 4
    assert blaslt.alignment(0x7f0000000030) == 16
    assert blaslt.alignment(0) == 256


def test_the_flag_and_a_missing_library_turn_cublaslt_off(monkeypatch):
    with config.change_flags(**{"gpuarray.cublaslt": False}):
        assert not blaslt.lt_available("float32")
    assert not blaslt.lt_available("int32")

    def missing():
        raise blas.CublasError("cuBLASLt could not be loaded (libcublasLt.so.13: not found)")
    monkeypatch.setattr(blaslt, "cublaslt", missing)
    assert not blaslt.lt_available("float32")


# ============================================================================ routing, faked

class _FakeClassic:
    """Classic cuBLAS: records each gemm's pointers."""

    def __init__(self):
        self.calls = []
        self.gemm = {"float32": self._gemm, "float64": self._gemm}

    def _gemm(self, h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self.calls.append(dict(ta=ta, tb=tb, m=m, n=n, k=k, a=a.value, lda=lda, b=b.value,
                               ldb=ldb, c=c.value, ldc=ldc))
        return 0

    def handle(self, ctx):
        return ctypes.c_void_p(1)

    def math_mode(self, h, mode):
        pass

    def pointer_mode(self, h, mode):
        pass

    check = staticmethod(blas._Cublas.check)


@pytest.fixture
def fakes(monkeypatch):
    """(ctx, classic, lt calls, copies): GpuDot22/GpuGemm thunks built on a fake context,
    classic cuBLAS and cuBLASLt recorded, device copies recorded."""
    from symgpu.gpu.runtime.array import GpuArray
    ctx, classic, lt_calls, copies = FakeCtx(), _FakeClassic(), [], []
    monkeypatch.setattr(blas, "_cublas", classic)
    monkeypatch.setattr(blaslt, "lt_available", lambda dtype: True)
    monkeypatch.setattr(thin_gemm, "ENABLED", False)   # small products: the cuBLAS path here
    lt_state = {"raise": False}

    def lt_matmul(ctx_, p, alpha, a, b, beta, d):
        lt_calls.append(dict(p=p, a=a, b=b, d=d))
        if lt_state["raise"]:
            raise blaslt.LtUnsupported("faked")
    monkeypatch.setattr(blaslt, "lt_matmul", lt_matmul)
    monkeypatch.setattr(GpuArray, "_copy_from_device",
                        lambda self, src: copies.append((self.ptr, src.ptr, src.strides)))
    return ctx, classic, lt_calls, copies, lt_state


def _gvar(ndim_or_bcast=2, dtype="float32"):
    from symgpu.gpu.placement.type import GpuArrayType
    bcast = (False,) * ndim_or_bcast if isinstance(ndim_or_bcast, int) else ndim_or_bcast
    return GpuArrayType(dtype, bcast, VCTX)()


def _thunk(node, values, ctx):
    storage = {v: [x] for v, x in zip(node.inputs, values)}
    for v in node.inputs:
        storage.setdefault(v, [None])
        if getattr(v, "data", None) is not None:
            storage[v] = [v.data]
    storage.update({v: [None] for v in node.outputs})
    return node.op._thunk(node, storage, ctx), storage


def _fortran(ctx, shape):
    return fake_gpu_array(ctx, shape, strides=(4, 4 * shape[0]))


@pytest.mark.parametrize("x_order,y_order", [("c", "c"), ("f", "c"), ("c", "f"), ("f", "f")])
def test_dot22_layouts_reach_cublaslt_as_column_major_problems(fakes, x_order, y_order):
    ctx, classic, lt_calls, copies, _ = fakes
    m, k, n = 6, 5, 7
    x = fake_gpu_array(ctx, (m, k)) if x_order == "c" else _fortran(ctx, (m, k))
    y = fake_gpu_array(ctx, (k, n)) if y_order == "c" else _fortran(ctx, (k, n))
    node = blas.GpuDot22()(_gvar(), _gvar()).owner
    thunk, storage = _thunk(node, [x, y], ctx)
    thunk()
    (call,) = lt_calls
    p = call["p"]
    # row-major out (m x n) is column-major out^T (n x m) = op(y^T) op(x^T)
    assert (p.m, p.n, p.k) == (n, m, k)
    assert p.transa == (0 if y_order == "c" else 1) and p.lda == (n if y_order == "c" else k)
    assert p.transb == (0 if x_order == "c" else 1) and p.ldb == (k if x_order == "c" else m)
    assert call["a"] == y.ptr and call["b"] == x.ptr
    out = storage[node.outputs[0]][0]
    assert call["d"] == out.ptr and p.ldd == n and not p.device_scalars
    assert not classic.calls and not copies


def test_gemm_z_is_copied_into_the_output_unless_in_place(fakes):
    """cuBLASLt runs in place on the output (D is C): a GpuGemm{no_inplace} copies z (full
    or broadcast) there first, a GpuGemm{inplace} runs on z itself."""
    ctx, classic, lt_calls, copies, _ = fakes
    z, x, y = (fake_gpu_array(ctx, s) for s in ((4, 3), (4, 2), (2, 3)))
    node = blas.GpuGemm(True)(_gvar(), 1.0, _gvar(), _gvar(), 1.0).owner
    thunk, storage = _thunk(node, [z, None, x, y, None], ctx)
    thunk()
    assert storage[node.outputs[0]][0] is z and lt_calls[-1]["d"] == z.ptr and not copies
    node = blas.GpuGemm(False)(_gvar(), -0.01, _gvar(), _gvar(), 1.0).owner
    thunk, storage = _thunk(node, [z, None, x, y, None], ctx)
    thunk()
    out = storage[node.outputs[0]][0]
    assert copies == [(out.ptr, z.ptr, z.strides)] and lt_calls[-1]["d"] == out.ptr != z.ptr
    row = fake_gpu_array(ctx, (1, 3))
    node = blas.GpuGemm(False)(_gvar((True, False)), 1.0, _gvar(), _gvar(), 1.0).owner
    thunk, storage = _thunk(node, [row, None, x, y, None], ctx)
    thunk()
    out = storage[node.outputs[0]][0]
    assert copies[-1] == (out.ptr, row.ptr, (0, 4)), "a broadcast z is copied out first"
    assert lt_calls[-1]["d"] == out.ptr
    assert not classic.calls


def test_a_problem_cublaslt_declines_runs_on_classic_cublas_from_then_on(fakes):
    ctx, classic, lt_calls, copies, lt_state = fakes
    lt_state["raise"] = True
    z, x, y = (fake_gpu_array(ctx, s) for s in ((4, 3), (4, 2), (2, 3)))
    node = blas.GpuGemm(False)(_gvar(), 0.5, _gvar(), _gvar(), 1.0).owner
    thunk, storage = _thunk(node, [z, None, x, y, None], ctx)
    thunk()
    out = storage[node.outputs[0]][0]
    assert len(lt_calls) == 1
    assert copies == [(out.ptr, z.ptr, z.strides)], "z copied in before the gemm"
    assert classic.calls[-1]["c"] == out.ptr
    thunk()
    assert len(lt_calls) == 1, "cuBLASLt is not asked again for the same problem"
    assert len(classic.calls) == 2


def test_the_thunk_memo_of_problems_follows_the_layout_and_alignment(fakes):
    """A GEMM thunk builds its LtProblem once per layout (shapes, leading dimensions,
    pointer alignments): the same object while they hold, a new one when they change."""
    ctx, classic, lt_calls, copies, lt_state = fakes
    x, y = fake_gpu_array(ctx, (4, 2)), fake_gpu_array(ctx, (2, 3))
    node = blas.GpuDot22()(_gvar(), _gvar()).owner
    thunk, storage = _thunk(node, [x, y], ctx)
    thunk()
    thunk()
    assert lt_calls[0]["p"] is lt_calls[1]["p"]
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (5, 2))       # another shape
    thunk()
    assert lt_calls[2]["p"].n == 5 and lt_calls[2]["p"] is not lt_calls[0]["p"]
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (4, 2), ptr=x.ptr + 8)   # alignment 8
    thunk()
    p = lt_calls[3]["p"]
    assert p.align == (256, 8, 256) and p[:-1] == lt_calls[0]["p"][:-1]
    assert lt_calls[3]["b"] == x.ptr + 8
    lt_state["raise"] = True      # declined: classic cuBLAS for that layout from then on
    thunk()
    thunk()
    assert len(lt_calls) == 5 and len(classic.calls) == 2
    storage[node.inputs[0]][0] = x
    thunk()
    assert len(lt_calls) == 6 and lt_calls[5]["p"] is lt_calls[0]["p"]


def test_with_the_flag_off_products_stay_on_classic_cublas(fakes, monkeypatch):
    ctx, classic, lt_calls, copies, _ = fakes
    monkeypatch.setattr(blaslt, "lt_available", lambda dtype: False)
    x, y = fake_gpu_array(ctx, (4, 2)), fake_gpu_array(ctx, (2, 3))
    node = blas.GpuDot22()(_gvar(), _gvar()).owner
    thunk, _ = _thunk(node, [x, y], ctx)
    thunk()
    assert not lt_calls and len(classic.calls) == 1


# ============================================================================ on the GPU

CTX = "blaslt-gpu-test"


@pytest.fixture(scope="module")
def gpu():
    from symgpu.gpu.runtime import context as gctx
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(CTX, c)
    yield c
    gctx.unregister_context(CTX)


@pytest.fixture
def lt_spy(monkeypatch):
    """The LtProblems launched through cuBLASLt during the test."""
    seen = []
    real = blaslt.lt_matmul

    def spy(ctx, p, *args):
        seen.append(p)
        return real(ctx, p, *args)
    monkeypatch.setattr(blaslt, "lt_matmul", spy)
    return seen


def _dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.asarray(a), get_context(CTX))


def _gpu_var(dtype, ndim_or_bcast=2):
    from symgpu.gpu.placement.type import GpuArrayType
    bcast = (False,) * ndim_or_bcast if isinstance(ndim_or_bcast, int) else ndim_or_bcast
    return GpuArrayType(dtype, bcast, CTX)()


def _operand(h, order):
    """A GpuArray holding host matrix ``h`` in the given layout: C order, Fortran order, a
    strided column slice (leading dimension above the row length), or an offset view
    (an address aligned to one element only)."""
    if order == "c":
        return _dev(h)
    if order == "f":
        return _dev(np.ascontiguousarray(h.T)).T
    if order == "sliced":
        wide = np.zeros((h.shape[0], h.shape[1] + 5), h.dtype)
        wide[:, :h.shape[1]] = h
        return _dev(wide)[:, :h.shape[1]]
    if order == "offset":
        flat = np.zeros(h.size + 1, h.dtype)
        flat[1:] = h.ravel()
        return _dev(flat)[1:].reshape(h.shape)
    raise ValueError(order)


def _run(node_out, inputs, values):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, [node_out], clone=False)
    storage = {v: [x] for v, x in zip(inputs, values)}
    link(fg, storage)()
    return storage[fg.outputs[0]][0]


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-11, atol=1e-11)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_order", ["c", "f", "sliced", "offset"])
@pytest.mark.parametrize("y_order", ["c", "f"])
def test_gpu_dot22_through_cublaslt_matches_numpy(gpu, lt_spy, dtype, x_order, y_order):
    rng = np.random.default_rng(7)
    hx = rng.standard_normal((67, 45)).astype(dtype)
    hy = rng.standard_normal((45, 33)).astype(dtype)
    x, y = _gpu_var(dtype), _gpu_var(dtype)
    got = _run(blas.GpuDot22()(x, y), [x, y], [_operand(hx, x_order), _operand(hy, y_order)])
    np.testing.assert_allclose(np.asarray(got), hx.astype("float64") @ hy, **_tol(dtype))
    assert lt_spy, "the product did not go through cuBLASLt"


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["no_inplace", "inplace", "broadcast_z", "beta_zero"])
def test_gpu_gemm_through_cublaslt_matches_numpy(gpu, lt_spy, dtype, kind):
    rng = np.random.default_rng(8)
    hz = rng.standard_normal((1, 96) if kind == "broadcast_z" else (128, 96)).astype(dtype)
    hx = rng.standard_normal((64, 128)).astype(dtype).T      # an F-ordered operand too
    hy = rng.standard_normal((64, 96)).astype(dtype)
    z = _gpu_var(dtype, (True, False) if kind == "broadcast_z" else 2)
    x, y = _gpu_var(dtype), _gpu_var(dtype)
    beta = 0.0 if kind == "beta_zero" else 0.75
    out = blas.GpuGemm(kind == "inplace")(z, -0.5, x, y, beta)
    gz = _dev(hz)
    got = _run(out, [z, x, y], [gz, _operand(np.ascontiguousarray(hx), "f"), _dev(hy)])
    want = beta * hz.astype("float64") - 0.5 * hx.astype("float64") @ hy
    np.testing.assert_allclose(np.asarray(got), want, **_tol(dtype))
    assert (got is gz) == (kind == "inplace")
    if kind == "no_inplace":
        np.testing.assert_array_equal(np.asarray(gz), hz)     # z read, not written
    assert lt_spy


@requires_gpu
def test_gpu_gemm_with_device_scalars_through_cublaslt(gpu, lt_spy):
    from symgpu.tensor.type import TensorType
    rng = np.random.default_rng(9)
    hz, hx, hy = (rng.standard_normal(s).astype("float32") for s in ((20, 30), (20, 10),
                                                                      (10, 30)))
    z, x, y = _gpu_var("float32"), _gpu_var("float32"), _gpu_var("float32")
    alpha_h, beta_d = TensorType("float32", ())(), _gpu_var("float32", ())
    out = blas.GpuGemm(False)(z, alpha_h, x, y, beta_d)
    got = _run(out, [z, alpha_h, x, y, beta_d],
               [_dev(hz), np.asarray(0.5, "float32"), _dev(hx), _dev(hy),
                _dev(np.asarray(-2.0, "float32"))])
    np.testing.assert_allclose(np.asarray(got), -2.0 * hz + 0.5 * hx @ hy, rtol=1e-4,
                               atol=1e-4)
    assert any(p.device_scalars for p in lt_spy)


@requires_gpu
def test_gpu_tf32_and_full_float32_through_cublaslt(cuda, lt_spy):
    """Full float32 keeps ~6 digits, TF32 (compute type FAST_TF32) ~3."""
    import symgpu.tensor as T
    from symgpu import function, shared
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 1024)).astype("float32")
    b = rng.standard_normal((1024, 256)).astype("float32")
    want = a.astype("float64") @ b.astype("float64")
    sa, sb = shared(a), shared(b)
    f32 = function([], gpu_from_host(T.dot(sa, sb)))
    with config.change_flags(**{"gpuarray.allow_tf32": True}):
        tf32 = function([], gpu_from_host(T.dot(sa, sb)))
    scale = np.abs(want).max()
    for _ in range(2):
        err32 = np.abs(np.asarray(f32()) - want).max() / scale
        errtf = np.abs(np.asarray(tf32()) - want).max() / scale
        assert err32 < 1e-5, err32
        assert 1e-5 < errtf < 5e-3, errtf
    assert {p.tf32 for p in lt_spy} == {False, True}


@requires_gpu
def test_gpu_sgd_steps_replayed_from_a_graph_match_numpy_and_classic_cublas(cuda, lt_spy):
    """An SGD step (products forward, transposed products backward): plain, captured and
    replayed calls give NumPy's values and classic cuBLAS's, and every product launched had
    its algorithm chosen by timing (the graph replays those)."""
    import symgpu.tensor as T
    from symgpu import function, shared
    rng = np.random.default_rng(3)
    hX = rng.standard_normal((256, 96)).astype("float32")
    hW = (rng.standard_normal((96, 128)) * 0.1).astype("float32")
    hV = (rng.standard_normal((128, 16)) * 0.1).astype("float32")

    def build():
        X, W, V = shared(hX), shared(hW.copy()), shared(hV.copy())
        h = T.maximum(T.dot(X, W), 0)
        loss = T.sum(T.dot(h, V) ** 2) / 256
        gW, gV = T.grad(loss, [W, V])
        return function([], loss, updates=[(W, W - 0.01 * gW), (V, V - 0.01 * gV)]), W, V

    with config.change_flags(**{"gpuarray.cublaslt": True}):
        f_lt, W_lt, V_lt = build()
    with config.change_flags(**{"gpuarray.cublaslt": False}):
        f_cl, W_cl, V_cl = build()
    W, V = hW.astype("float64"), hV.astype("float64")
    for step in range(5):
        h = np.maximum(hX @ W, 0)
        o = h @ V
        want_loss = np.sum(o ** 2) / 256
        d = 2 * o / 256
        gV, gh = h.T @ d, d @ V.T
        gW = hX.T @ (gh * (h > 0))
        W, V = W - 0.01 * gW, V - 0.01 * gV
        got_lt, got_cl = float(f_lt()), float(f_cl())
        np.testing.assert_allclose(got_lt, want_loss, rtol=1e-4)
        np.testing.assert_allclose(got_lt, got_cl, rtol=1e-5)
    np.testing.assert_allclose(W_lt.get_value(), W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(W_lt.get_value(), W_cl.get_value(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(V_lt.get_value(), V, rtol=1e-4, atol=1e-5)
    stats = f_lt.vm.runner.stats()
    assert stats["captures"] >= 1 and stats["replays"] >= 1, stats
    assert lt_spy
    kept = {p for (_, p) in blaslt.CHOICES.chosen}
    assert set(lt_spy) <= kept, "every problem run had its algorithm chosen (timed)"


@requires_gpu
def test_gpu_skinny_products_time_split_k_variants_and_classic_cublas(gpu, lt_spy, monkeypatch):
    """A product with few output tiles (512 x 10 from K = 1024): its candidates are the
    heuristic's, split-K variants and classic cuBLAS, all timed; the kept one is right.
    (symgpu's own thin-product kernels, which take this product first, are off here.)"""
    from symgpu.gpu.ops import thin_gemm
    monkeypatch.setattr(thin_gemm, "ENABLED", False)
    rng = np.random.default_rng(11)
    hx = rng.standard_normal((512, 1024)).astype("float32")
    hy = rng.standard_normal((1024, 10)).astype("float32")
    x, y = _gpu_var("float32"), _gpu_var("float32")
    got = _run(blas.GpuDot22()(x, y), [x, y], [_dev(hx), _dev(hy)])
    np.testing.assert_allclose(np.asarray(got), hx.astype("float64") @ hy, rtol=1e-4,
                               atol=1e-3)
    (p,) = set(lt_spy)
    plan = blaslt.cublaslt().plan(gpu, p)
    assert plan.algos[-1][0] is None, "classic cuBLAS is a candidate"
    times = blaslt.CHOICES.timings[(gpu.devname, p)]
    assert len(times) == len(plan.algos) > 2
    assert times[-1] is not None, "classic cuBLAS ran in the timing"


# ============================================================================ timing, faked

class _FakeEvent:
    """A CUDA event on a fake clock: the stream's time when recorded."""

    def __init__(self, clock):
        self.clock, self.t = clock, 0.0

    def record(self, stream):
        self.t = self.clock["now"]

    def synchronize(self):
        pass

    def time_since(self, other):
        return (self.t - other.t) * 1e3          # ms


def test_candidates_are_timed_as_replayed_graphs_failures_passed_over(monkeypatch):
    """Each candidate is warmed, captured as _REPS launches and replayed in rounds; one that
    fails at launch or whose capture the driver refuses gets None; every graph made is
    destroyed; the figure is device time per launch."""
    import sys
    import types
    clock = {"now": 0.0, "capturing": False}
    per_launch = {0: 5e-6, 1: 2e-6, 2: 3e-6, 3: 1e-6}     # candidate 2: capture refused
    fake_drv = types.ModuleType("pycuda.driver")
    fake_drv.Event = lambda: _FakeEvent(clock)
    fake_pkg = types.ModuleType("pycuda")
    fake_pkg.driver = fake_drv
    monkeypatch.setitem(sys.modules, "pycuda", fake_pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake_drv)
    graphs, destroyed = {}, []
    captured: list = []

    def begin(stream, mode):
        clock["capturing"], captured[:] = True, []
        return 0

    def end(stream, out):
        clock["capturing"] = False
        if 2 in captured:
            return 900                              # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        gid = len(graphs) + 100
        graphs[gid] = list(captured)
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = gid
        return 0

    def instantiate(out, graph, flags):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = graph.value
        return 0

    def launch_graph(g, stream):
        for i in graphs[g.value]:
            clock["now"] += per_launch[i]
        return 0
    monkeypatch.setattr(blaslt, "_graph_calls", lambda: {
        "begin": begin, "end": end, "instantiate": instantiate, "launch": launch_graph,
        "exec_destroy": lambda g: destroyed.append(g.value),
        "graph_destroy": lambda g: None})

    class Lt:
        def matmul(self, ctx, plan, i, *args):
            if i == 4:
                return 15                           # CUBLAS_STATUS_NOT_SUPPORTED
            if clock["capturing"]:
                captured.append(i)
            else:
                clock["now"] += per_launch[i] + 1e-3     # plain: the host's time dominates
            return 0
        check = staticmethod(blas._Cublas.check)

    class Stream:
        def synchronize(self):
            pass
    ctx = types.SimpleNamespace(stream=Stream(), stream_handle=7)
    plan = types.SimpleNamespace(algos=[None] * 5)
    times = blaslt._timer(ctx, Lt(), plan, (None, 1, 2, None), 3)()
    assert times[2] is None and times[4] is None
    assert times[0] == pytest.approx(5e-6) and times[1] == pytest.approx(2e-6)
    assert times[3] == pytest.approx(1e-6)
    assert all(len(g) == blaslt._REPS for g in graphs.values())
    assert sorted(destroyed) == sorted(graphs), "every instantiated graph is destroyed"
