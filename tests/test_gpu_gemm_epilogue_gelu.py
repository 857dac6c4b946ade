"""GpuGemmEpilogue's GELU epilogues (gpu/ops/gemm_epilogue.py, blas.py, blaslt.py):
``gelu_aux_bias`` (``gelu(x @ W + b)`` and the pre-activation ``aux = x @ W + b``:
CUBLASLT_EPILOGUE_GELU_AUX_BIAS) and ``dgelu`` (``(x @ W) * gelu'(aux)``:
CUBLASLT_EPILOGUE_DGELU), GELU always in cuBLASLt's tanh form.

Why: a GPT block's MLP runs its GELU inside its first product and the GELU's gradient inside
the product of its backward pass (the rewrite that makes these nodes,
gelu_epilogue_rewrite.py, is tested on its own); where cuBLASLt is off, missing or declines
(an aux leading dimension not a multiple of 8), classic cuBLAS and ``ge_gelu_<dtype>`` must
give the same values.

On the CPU: the fallback module compiled by nvcc for sm_90 in every dtype and its GELU kernel
run on the host (tests/cuda_on_host.py) against float64 NumPy; the nodes (outputs, types,
errors, shapes); the cuBLASLt descriptors and calls (a fake libcublasLt); the thunks' routing
(fake cuBLASLt and classic cuBLAS).  On a GPU (``pytest -m gpu``): one node linked and run
through its thunk in bfloat16, float16 and float32, at the GPT's MLP shape (8192 x 768 @
768 x 3072) and an odd one (33 x 17 @ 17 x 29: cuBLASLt declines it, the fallback runs), with
cuBLASLt on and off, against float64 NumPy.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

import symgpu.tensor as T
from cuda_on_host import build, requires_gxx
from gpu_helpers import (FakeCtx, compile_for_sm90, fake_gpu_array, requires_gpu,
                         requires_nvcc, virtual_context)
from symgpu import config
from symgpu.gpu.ops import blaslt, gemm_epilogue
from symgpu.gpu.ops.gemm_epilogue import EPILOGUES, GpuGemmEpilogue, epilogue_source
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen.types import storage_ctype
from test_gpu_half_blas import RTOL, _fake_lt, _rounded, _thunk, fakes  # noqa: F401

DTYPES = ["float16", "bfloat16", "float32", "float64"]
VCTX = "gelu-epilogue"
_virtual = virtual_context(VCTX)

K0, K1 = np.sqrt(2 / np.pi), 0.044715


def gelu(z):
    """cuBLASLt's GELU, the tanh form, in float64."""
    return 0.5 * z * (1 + np.tanh(K0 * (z + K1 * z ** 3)))


def dgelu(z):
    """Its derivative, in float64."""
    t = np.tanh(K0 * (z + K1 * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * K0 * (1 + 3 * K1 * z * z)


def _g(dtype, *bcast):
    """A GPU variable on the virtual context (a matrix unless ``bcast`` says)."""
    return GpuArrayType(dtype, bcast or (False, False), VCTX)()


# ============================================================================ the table

def test_the_table_matches_the_cublaslt_codes():
    """An epilogue has a bias input exactly where its code has the bias bit, and an aux (in
    or out) exactly where it has the aux bit: lt_matmul sets the pointers by those bits."""
    assert (blaslt.EPILOGUE_GELU_AUX_BIAS, blaslt.EPILOGUE_DGELU, blaslt.EPILOGUE_AUX) == \
        (164, 192, 128)
    for name, f in EPILOGUES.items():
        assert (f.bias is not None) == bool(f.code & blaslt.EPILOGUE_BIAS), name
        assert (f.aux_in is not None or f.aux_out) == bool(f.code & blaslt.EPILOGUE_AUX), name
        assert f.kernel in gemm_epilogue._KERNELS
    assert EPILOGUES["gelu_aux_bias"].aux_out and EPILOGUES["dgelu"].aux_in == 2


# ============================================================================ the nodes

@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_aux_bias_has_two_outputs_of_the_products_type(dtype):
    x, w, b = _g(dtype, True, False), _g(dtype), _g(dtype, False)
    outs = GpuGemmEpilogue("gelu_aux_bias")(x, w, b)
    assert isinstance(outs, list) and len(outs) == 2
    node = outs[0].owner
    assert node.outputs == outs and node.inputs == [x, w, b]
    for o in outs:
        assert o.type == GpuArrayType(dtype, (True, False), VCTX)
    assert str(node.op) == "GpuGemmEpilogue{gelu_aux_bias}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_dgelu_has_one_output_and_reads_an_aux_matrix(dtype):
    x, w, aux = _g(dtype), _g(dtype, False, True), _g(dtype)
    out = GpuGemmEpilogue("dgelu")(x, w, aux)
    assert len(out.owner.outputs) == 1 and out.owner.inputs == [x, w, aux]
    assert out.type == GpuArrayType(dtype, (False, True), VCTX)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_bias_has_one_output_and_a_bias(dtype):
    """Inference's GELU (nothing reads the pre-activation): cuBLASLt's GELU_BIAS."""
    x, w, b = _g(dtype), _g(dtype), _g(dtype, False)
    out = GpuGemmEpilogue("gelu_bias")(x, w, b)
    assert len(out.owner.outputs) == 1 and out.owner.inputs == [x, w, b]
    facts = EPILOGUES["gelu_bias"]
    assert (facts.code, facts.bias, facts.aux_in, facts.aux_out) == (36, 2, None, False)


def test_the_gelu_epilogues_check_their_operands_by_name():
    gab, dg = GpuGemmEpilogue("gelu_aux_bias"), GpuGemmEpilogue("dgelu")
    m16 = _g("float16")
    with pytest.raises(TypeError, match=r"GpuGemmEpilogue\{gelu_aux_bias\}'s bias must be a "
                                        r"1-d"):
        gab(m16, m16, m16)
    with pytest.raises(TypeError, match=r"GpuGemmEpilogue\{dgelu\}'s aux must be a 2-d"):
        dg(m16, m16, _g("float16", False))
    with pytest.raises(TypeError, match=r"GpuGemmEpilogue\{gelu_aux_bias\} needs one dtype, "
                                        r"got x float16, y float16, bias float32"):
        gab(m16, m16, _g("float32", False))
    with pytest.raises(TypeError, match=r"GpuGemmEpilogue\{dgelu\} needs one dtype, got x "
                                        r"float16, y bfloat16, aux float16"):
        dg(m16, _g("bfloat16"), m16)
    with pytest.raises(TypeError, match=r"GpuGemmEpilogue\{dgelu\}'s aux must be a 2-d "
                                        r"float16/bfloat16/float32/float64"):
        dg(m16, m16, _g("int32"))


def test_infer_shape_gives_every_output_the_products_shape():
    m, k, n = T.lscalar("m"), T.lscalar("k"), T.lscalar("n")
    node = GpuGemmEpilogue("gelu_aux_bias")(_g("float16"), _g("float16"),
                                            _g("float16", False))[0].owner
    shapes = node.op.infer_shape(None, node, [(m, k), (k, n), (n,)])
    assert len(shapes) == 2 and all(s[0] is m and s[1] is n for s in shapes)
    node = GpuGemmEpilogue("dgelu")(_g("float32", True, False), _g("float32"),
                                    _g("float32")).owner
    (shape,) = node.op.infer_shape(None, node, [(1, k), (k, n), (m, n)])
    assert shape[0] == 1 and shape[1] is n, "a broadcastable row: length 1"


# ============================================================================ the fallback kernels

@requires_nvcc
@pytest.mark.parametrize("dtype", DTYPES)
def test_fallback_module_compiles_for_sm90(dtype, tmp_path):
    cubin = compile_for_sm90(epilogue_source(dtype), tmp_path)
    for kernel in gemm_epilogue._KERNELS:
        assert f"{kernel}_{dtype}".encode() in cubin


#: host tolerances of ge_gelu: the result rounded once to the dtype (one of its ulps,
#: relative: float16 10 mantissa bits, bfloat16 7; float32 and float64 a few ulps of the
#: value type's arithmetic), plus the value type's cancellation in 1 + tanh for negative z
#: (a few ulps of 1, times |z|, or times |product| for gelu'), plus float16's subnormal step
_HOST_RTOL = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -20,
              "float64": 2.0 ** -49}
_HOST_VEPS = {"float16": 2.0 ** -21, "bfloat16": 2.0 ** -21, "float32": 2.0 ** -21,
              "float64": 2.0 ** -50}
_HOST_TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126,
              "float64": 2.0 ** -1022}
#: values where tanh saturates (z^3, and z^2 for gelu', overflow in float where the dtype
#: holds 3e19), zeros and NaN
_SPECIAL = {"float16": [0.0, -0.0, 3e4, -3e4, 30.0, -30.0, 1e-5, np.nan],
            "bfloat16": [0.0, -0.0, 3e19, -3e19, 30.0, -30.0, 1e-5, np.nan],
            "float32": [0.0, -0.0, 3e19, -3e19, 30.0, -30.0, 1e-5, np.nan],
            "float64": [0.0, -0.0, 1e100, -1e100, 30.0, -30.0, 1e-5, np.nan]}


def _host_kernel(dtype, tmp_path):
    t = storage_ctype(dtype)
    return build(epilogue_source(dtype),
                 f"EMU_WRAP(run, ge_gelu_{dtype}, ({t} *o, {t} *a, const {t} *b, long long r, "
                 f"long long c, int grad), (o, a, b, r, c, grad))", tmp_path)


def _host_values(dtype, rows, cols, seed):
    """Random values of ``dtype`` (about -4..4), the special ones down the first column."""
    import ml_dtypes  # noqa: F401
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((rows, cols)) * 2
    if rows >= len(_SPECIAL[dtype]):
        v[:len(_SPECIAL[dtype]), 0] = _SPECIAL[dtype]
    return v.astype(dtype)


def _within(got, want, tol):
    got = got.astype("float64")
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), "NaN where NumPy has NaN, and only there"
    err = np.abs(got - want)[~nan]
    assert (err <= tol[~nan]).all(), float((err / tol[~nan]).max())


@requires_gxx
@pytest.mark.parametrize("grad", [0, 2], ids=["gelu_aux_bias", "gelu_bias"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fallback_gelu_on_the_host(dtype, grad, tmp_path):
    """ge_gelu, grad 0: v = out + bias in the value type, aux = v rounded (exactly), out =
    gelu(v) rounded once; grad 2: the same without aux (a null pointer, nothing written);
    against float64 NumPy's tanh form within _HOST_* tolerances."""
    lib = _host_kernel(dtype, tmp_path)
    rows, cols = 9, 7
    prod = _host_values(dtype, rows, cols, 0)
    bias = _host_values(dtype, 1, cols, 1)[0]
    bias[0] = 0                             # the special values reach gelu as they are
    out, aux = prod.copy(), np.zeros_like(prod)
    lib.run(ctypes.c_longlong(1), ctypes.c_longlong(32), ctypes.c_longlong(1),  # 1 block: strides
            ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(aux.ctypes.data if grad == 0 else 0),
            ctypes.c_void_p(bias.ctypes.data), ctypes.c_longlong(rows),
            ctypes.c_longlong(cols), ctypes.c_int(grad))
    vt = "float64" if dtype == "float64" else "float32"
    v = prod.astype(vt) + bias.astype(vt)             # the kernel's sum, in its value type
    if grad == 0:
        np.testing.assert_array_equal(aux.astype("float64"), v.astype(dtype).astype("float64"))
    z = v.astype("float64")
    want = gelu(z)
    _within(out, want, _HOST_RTOL[dtype] * np.abs(want) + _HOST_VEPS[dtype] * (1 + np.abs(z)) +
            _HOST_TINY[dtype])


@requires_gxx
@pytest.mark.parametrize("dtype", DTYPES)
def test_fallback_dgelu_on_the_host(dtype, tmp_path):
    """ge_gelu (grad 1): out = out * gelu'(aux), computed in the value type and rounded once,
    bias unread (a null pointer), against float64 NumPy within _HOST_* tolerances."""
    lib = _host_kernel(dtype, tmp_path)
    rows, cols = 10, 11
    prod = _host_values(dtype, rows, cols, 2)
    prod[:, 0] = 1.5                                # the special values in aux only
    aux = _host_values(dtype, rows, cols, 3)
    out = prod.copy()
    lib.run(ctypes.c_longlong(3), ctypes.c_longlong(32), ctypes.c_longlong(1),
            ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(aux.ctypes.data),
            ctypes.c_void_p(0), ctypes.c_longlong(rows), ctypes.c_longlong(cols),
            ctypes.c_int(1))
    p, z = prod.astype("float64"), aux.astype("float64")
    want = p * dgelu(z)
    assert want[2, 0] == 1.5 and want[3, 0] == 0, "gelu' saturates at 1 and 0"
    _within(out, want, _HOST_RTOL[dtype] * np.abs(want) + 8 * _HOST_VEPS[dtype] * np.abs(p) +
            _HOST_TINY[dtype])


# ============================================================================ cuBLASLt, faked

def _lt_problem(code, m):
    """A column-major bfloat16 product of m rows (ldd m) with epilogue ``code``."""
    return blaslt.LtProblem("bfloat16", False, 0, 0, m, 32, 16, m, 16, m, False, 1, 0, 0, 0,
                            code, (256, 256, 256))


def _desc_sets(calls):
    return [a[1:4] for n, a in calls if n == "cublasLtMatmulDescSetAttribute"]


@pytest.mark.parametrize("code", [blaslt.EPILOGUE_GELU_AUX_BIAS, blaslt.EPILOGUE_DGELU])
def test_an_aux_plan_sets_the_aux_ld_before_the_heuristic(monkeypatch, code):
    lt = _fake_lt(monkeypatch)
    plan = lt.plan(FakeCtx(), _lt_problem(code, 72))
    calls = lt.lib.calls
    sets = _desc_sets(calls)
    assert [7, code, 4] in sets, "CUBLASLT_MATMUL_DESC_EPILOGUE (int32)"
    assert [12, 72, 8] in sets, "EPILOGUE_AUX_LD = ldd, an int64"
    assert not [s for s in sets if s[0] in (8, 11)], "pointers are set per call, not here"
    at_ld = next(i for i, (n, a) in enumerate(calls)
                 if n == "cublasLtMatmulDescSetAttribute" and a[1] == 12)
    heuristic = next(i for i, (n, _) in enumerate(calls)
                     if n == "cublasLtMatmulAlgoGetHeuristic")
    assert at_ld < heuristic
    assert all(algo is not None for algo, _, _ in plan.algos), "no classic candidate"


@pytest.mark.parametrize("code", [blaslt.EPILOGUE_GELU_AUX_BIAS, blaslt.EPILOGUE_DGELU])
def test_an_aux_ld_not_a_multiple_of_8_is_declined_before_any_descriptor(monkeypatch, code):
    lt = _fake_lt(monkeypatch)
    with pytest.raises(blaslt.LtUnsupported, match="not a multiple of 8"):
        lt.plan(FakeCtx(), _lt_problem(code, 29))
    assert not lt.lib.calls and not lt.plans
    lt.plan(FakeCtx(), _lt_problem(blaslt.EPILOGUE_BIAS, 29))   # no aux: any ld
    assert not [s for s in _desc_sets(lt.lib.calls) if s[0] == 12]


def test_lt_matmul_points_gelu_at_bias_and_aux_and_dgelu_at_aux_only(monkeypatch):
    lt = _fake_lt(monkeypatch)
    monkeypatch.setattr(blaslt, "cublaslt", lambda: lt)
    monkeypatch.setattr(blaslt, "CHOICES", blaslt.AlgoChoice())
    ctx = FakeCtx()
    for code, want in ((blaslt.EPILOGUE_GELU_AUX_BIAS, {8: 0xB00, 11: 0xA00}),
                       (blaslt.EPILOGUE_DGELU, {11: 0xA00})):
        lt.lib.calls.clear()
        blaslt.lt_matmul(ctx, _lt_problem(code, 64), None, 0x1000, 0x2000, None, 0x3000,
                         0xB00, 0xA00)
        calls = lt.lib.calls
        pointers = {s[0]: s[1] for s in _desc_sets(calls) if s[0] in (8, 11)}
        assert pointers == want, "DGELU has no bias bit: no bias pointer"
        assert calls[-1][0] == "cublasLtMatmul"
    with pytest.raises(ValueError, match="aux matrix's address"):
        blaslt.lt_matmul(ctx, _lt_problem(blaslt.EPILOGUE_DGELU, 64), None, 1, 2, None, 3)


# ============================================================================ the thunks, faked

@pytest.fixture
def lt_fakes(fakes, monkeypatch):
    """test_gpu_half_blas's fakes (ctx, classic calls, cuBLASLt calls, state, launches), its
    fake lt_matmul taking the aux address too."""
    ctx, classic, lt_calls, state, launches = fakes

    def lt_matmul(ctx_, p, alpha, a, b, beta, d, bias=0, aux=0):
        lt_calls.append(dict(p=p, a=a, b=b, d=d, bias=bias, aux=aux))
        if state["raise"]:
            raise blaslt.LtUnsupported("faked")
    monkeypatch.setattr(blaslt, "lt_matmul", lt_matmul)
    return fakes


def _outs(node, storage):
    return [storage[o][0] for o in node.outputs]


@pytest.mark.parametrize("declined", [False, True])
def test_gelu_aux_bias_thunk_writes_aux_through_cublaslt_or_the_kernel(lt_fakes, declined):
    ctx, classic, lt_calls, state, launches = lt_fakes
    state["raise"] = declined
    x, w = fake_gpu_array(ctx, (6, 5), "float16"), fake_gpu_array(ctx, (5, 8), "float16")
    b = fake_gpu_array(ctx, (8,), "float16")
    node = GpuGemmEpilogue("gelu_aux_bias")(_g("float16"), _g("float16"),
                                            _g("float16", False))[0].owner
    thunk, storage = _thunk(node, [x, w, b], ctx)
    thunk()
    out, aux = _outs(node, storage)
    assert out.shape == aux.shape == (6, 8) and aux.dtype == np.float16
    assert aux.is_c_contiguous and aux.ptr != out.ptr
    (call,) = lt_calls
    p = call["p"]
    assert p.epilogue == blaslt.EPILOGUE_GELU_AUX_BIAS and (p.m, p.n, p.k, p.ldd) == (8, 6, 5, 8)
    assert (call["d"], call["bias"], call["aux"]) == (out.ptr, b.ptr, aux.ptr)
    if declined:
        assert [c[0] for c in classic.calls] == ["gemm"]
        (name, _, _, args), = launches
        assert name == "ge_gelu_float16" and args == (out.ptr, aux.ptr, b.ptr, 6, 8, 0)
    else:
        assert not classic.calls and not launches


@pytest.mark.parametrize("declined", [False, True])
def test_dgelu_thunk_reads_aux_and_sets_no_bias(lt_fakes, declined):
    ctx, classic, lt_calls, state, launches = lt_fakes
    state["raise"] = declined
    x, w = fake_gpu_array(ctx, (6, 5), "bfloat16"), fake_gpu_array(ctx, (5, 8), "bfloat16")
    aux = fake_gpu_array(ctx, (6, 8), "bfloat16")
    node = GpuGemmEpilogue("dgelu")(_g("bfloat16"), _g("bfloat16"), _g("bfloat16")).owner
    thunk, storage = _thunk(node, [x, w, aux], ctx)
    thunk()
    (out,) = _outs(node, storage)
    (call,) = lt_calls
    assert call["p"].epilogue == blaslt.EPILOGUE_DGELU
    assert (call["d"], call["bias"], call["aux"]) == (out.ptr, 0, aux.ptr), "aux read in place"
    if declined:
        (name, _, _, args), = launches
        assert name == "ge_gelu_bfloat16" and args == (out.ptr, aux.ptr, 0, 6, 8, 1)
    else:
        assert not classic.calls and not launches
    for bad, what in ((fake_gpu_array(ctx, (8, 5), "bfloat16"), r"shape \(8, 5\) and dtype "
                                                                  r"bfloat16"),
                      (fake_gpu_array(ctx, (6, 8), "float32"), r"shape \(6, 8\) and dtype "
                                                                r"float32")):
        storage[node.inputs[2]][0] = bad
        with pytest.raises(ValueError, match=r"GpuGemmEpilogue\{dgelu\}: aux of " + what +
                           r" does not match the product of x \(6, 5\) and y \(5, 8\), of "
                           r"shape \(6, 8\) and dtype bfloat16"):
            thunk()


def test_a_strided_or_misaligned_aux_is_copied_first(lt_fakes, monkeypatch):
    from symgpu.gpu.runtime.array import GpuArray
    ctx, *_ = lt_fakes
    copies = []
    monkeypatch.setattr(GpuArray, "copy", lambda self: copies.append(self) or
                        fake_gpu_array(ctx, self.shape, self.dtype))
    epi = gemm_epilogue._Epilogue(ctx, "float16", "dgelu")
    x, y = fake_gpu_array(ctx, (6, 5), "float16"), fake_gpu_array(ctx, (5, 8), "float16")
    ok = fake_gpu_array(ctx, (6, 8), "float16")
    assert epi.aux_operand(ok, x, y, "t") is ok and not copies
    strided = fake_gpu_array(ctx, (6, 8), "float16", strides=(32, 2))   # rows 16 apart
    fortran = fake_gpu_array(ctx, (6, 8), "float16", strides=(2, 12))
    odd = fake_gpu_array(ctx, (6, 8), "float16", ptr=ok.ptr + 8)       # 8-byte aligned
    for a in (strided, fortran, odd):
        assert epi.aux_operand(a, x, y, "t") is not a and copies[-1] is a
    assert len(copies) == 3
    # the rewrite pairs aux and the product element by element through their reshapes: an
    # aux of the product's size is read in C order as the product's shape (a view)
    other = fake_gpu_array(ctx, (4, 12), "float16")
    seen = epi.aux_operand(other, x, y, "t")
    assert seen.shape == (6, 8) and seen.ptr == other.ptr and len(copies) == 3


def test_the_memo_of_problems_keys_on_the_aux_address_low_byte(lt_fakes):
    """The thunk's LtProblem memo: the same problem while aux's low byte holds, a new one
    when it changes, and a decline remembered for that byte only."""
    ctx, classic, lt_calls, state, _ = lt_fakes
    x, w = fake_gpu_array(ctx, (6, 5), "float16"), fake_gpu_array(ctx, (5, 8), "float16")
    aux = fake_gpu_array(ctx, (6, 8), "float16")
    node = GpuGemmEpilogue("dgelu")(_g("float16"), _g("float16"), _g("float16")).owner
    thunk, storage = _thunk(node, [x, w, aux], ctx)
    thunk()
    thunk()
    assert lt_calls[0]["p"] is lt_calls[1]["p"]
    storage[node.inputs[2]][0] = fake_gpu_array(ctx, (6, 8), "float16", ptr=aux.ptr + 16)
    thunk()
    p0, p2 = lt_calls[0]["p"], lt_calls[2]["p"]
    assert lt_calls[2]["aux"] == aux.ptr + 16 and p2 == p0 and p2 is not p0
    state["raise"] = True       # declined for this aux byte: classic cuBLAS from then on
    thunk()
    thunk()
    assert len(lt_calls) == 4 and len(classic.calls) == 2
    storage[node.inputs[2]][0] = aux
    thunk()
    assert len(lt_calls) == 5 and lt_calls[4]["p"] is p0


def test_an_empty_product_still_gives_both_outputs_and_k0_runs_the_kernel(lt_fakes):
    ctx, classic, lt_calls, state, launches = lt_fakes
    node = GpuGemmEpilogue("gelu_aux_bias")(_g("float32"), _g("float32"),
                                            _g("float32", False))[0].owner
    b = fake_gpu_array(ctx, (8,), "float32")
    thunk, storage = _thunk(node, [fake_gpu_array(ctx, (0, 5)), fake_gpu_array(ctx, (5, 8)),
                                   b], ctx)
    thunk()
    assert [a.shape for a in _outs(node, storage)] == [(0, 8), (0, 8)]
    assert not lt_calls and not classic.calls and not launches
    thunk, storage = _thunk(node, [fake_gpu_array(ctx, (6, 0)), fake_gpu_array(ctx, (0, 8)),
                                   b], ctx)
    thunk()             # no terms: the product is 0 (classic cuBLAS), gelu(b) by the kernel
    out, aux = _outs(node, storage)
    assert not lt_calls and [c[0] for c in classic.calls] == ["gemm"]
    (name, _, _, args), = launches
    assert name == "ge_gelu_float32" and args == (out.ptr, aux.ptr, b.ptr, 6, 8, 0)


# ============================================================================ on a GPU

#: a GPU result's tolerance: the product's (test_gpu_half_blas.RTOL of the scale, as its
#: _close) plus the activation's: cuBLASLt may evaluate tanh with the hardware's
#: approximation (about 2^-11 relative), so 2^-10 of (1 + |z|) for gelu, of |p| (1 + z^2)
#: for p * gelu'(z)
_ACT_TOL = 2.0 ** -10
#: |out - gelu(aux)| of one result: both rounded to the dtype from one float32 value (half
#: an ulp each, gelu' up to 1.13), plus an approximate tanh's share
_CONSISTENT = {"float16": 2.0 ** -9, "bfloat16": 2.0 ** -6, "float32": 2.0 ** -10}
_SHAPES = {"gpt": (8192, 768, 3072), "odd": (33, 17, 29)}


@functools.lru_cache(maxsize=6)
def _gpu_inputs(dtype, m, k, n):
    """(x, W, b, aux) rounded to ``dtype`` (products of order 1) and the float64 product."""
    rng = np.random.default_rng(7)
    (hx, fx), (hw, fw) = _rounded(rng, (m, k), dtype), _rounded(rng, (k, n), dtype,
                                                                1 / np.sqrt(k))
    (hb, _), (ha, _) = _rounded(rng, (n,), dtype, 0.5), _rounded(rng, (m, n), dtype, 1.5)
    return hx, hw, hb, ha, fx.astype("float64") @ fw.astype("float64")


def _assert_close(got, want, dtype, k, act_tol):
    got = np.asarray(got).astype("float64")
    assert got.shape == want.shape
    tol = RTOL[dtype] * max(1.0, np.sqrt(k) / 8) * max(np.abs(want).max(), 1.0) + act_tol
    err = np.abs(got - want)
    assert (err <= tol).all(), (dtype, float((err / tol).max()))


@pytest.fixture
def lt_seen(monkeypatch):
    """(LtProblem, whether cuBLASLt ran it) for each product asked of cuBLASLt."""
    seen = []
    real = blaslt.lt_matmul

    def spy(ctx, p, *args):
        try:
            real(ctx, p, *args)
        except blaslt.LtUnsupported:
            seen.append((p, False))
            raise
        seen.append((p, True))
    monkeypatch.setattr(blaslt, "lt_matmul", spy)
    return seen


def _run_node(ctx, epilogue, values, lt):
    """GpuGemmEpilogue{epilogue} of ``values`` as the one node of a graph, linked (its thunk
    made with ``gpuarray.cublaslt`` = lt) and run twice (the first call times cuBLASLt's
    candidates); the host copies of each run's outputs."""
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.link.vm import link
    ins = [GpuArrayType(str(v.dtype), (False,) * v.ndim, None)() for v in values]
    outs = GpuGemmEpilogue(epilogue)(*ins)
    fg = FunctionGraph(ins, outs if isinstance(outs, list) else [outs], clone=False)
    (node,) = fg.toposort()
    assert type(node.op) is GpuGemmEpilogue and node.op.epilogue == epilogue
    assert not ctx.virtual and ctx.stream_handle, "a real GPU runs it"
    storage = {v: [to_gpu(x, ctx)] for v, x in zip(ins, values)}
    with config.change_flags(**{"gpuarray.cublaslt": lt}):
        vm = link(fg, storage)
    runs = []
    for _ in range(2):
        vm()
        got = [storage[o][0] for o in fg.outputs]
        assert all(g.context is ctx for g in got)
        runs.append([np.asarray(g.get()) for g in got])
    return runs


def _check_path(seen, code, n, lt):
    """cuBLASLt ran the epilogue where it is on and aux's ld (n) is a multiple of 8; else the
    fallback (after classic cuBLAS) did."""
    if not lt:
        assert not seen, "gpuarray.cublaslt off: never asked"
    elif n % blaslt.AUX_LD_MULTIPLE:
        assert seen and not any(ok for _, ok in seen), "declined: the fallback ran"
    else:
        assert any(ok and p.epilogue == code for p, ok in seen), "cuBLASLt declined"


@requires_gpu
@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "fallback"])
@pytest.mark.parametrize("shape", list(_SHAPES), ids=list(_SHAPES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_gelu_aux_bias_matches_numpy(cuda, lt_seen, dtype, shape, lt):
    m, k, n = _SHAPES[shape]
    hx, hw, hb, _, p = _gpu_inputs(dtype, m, k, n)
    z = p + hb.astype("float64")
    want = gelu(z)
    for out, aux in _run_node(cuda, "gelu_aux_bias", [hx, hw, hb], lt):
        assert out.dtype == aux.dtype == np.dtype(dtype)
        _assert_close(aux, z, dtype, k, 0.0)
        _assert_close(out, want, dtype, k, _ACT_TOL * (1 + np.abs(z)))
        a = aux.astype("float64")
        g = gelu(a)           # out is gelu of the aux this very call returned
        err = np.abs(out.astype("float64") - g)
        assert (err <= _CONSISTENT[dtype] * (np.abs(g) + np.abs(a)) + 2.0 ** -24).all()
    _check_path(lt_seen, blaslt.EPILOGUE_GELU_AUX_BIAS, n, lt)


@requires_gpu
@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "fallback"])
@pytest.mark.parametrize("shape", list(_SHAPES), ids=list(_SHAPES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_dgelu_matches_numpy(cuda, lt_seen, dtype, shape, lt):
    m, k, n = _SHAPES[shape]
    hx, hw, _, ha, p = _gpu_inputs(dtype, m, k, n)
    z = ha.astype("float64")
    want = p * dgelu(z)
    for (out,) in _run_node(cuda, "dgelu", [hx, hw, ha], lt):
        assert out.dtype == np.dtype(dtype)
        _assert_close(out, want, dtype, k, _ACT_TOL * np.abs(p) * (1 + z * z))
    _check_path(lt_seen, blaslt.EPILOGUE_DGELU, n, lt)


@requires_gpu
@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "fallback"])
@pytest.mark.parametrize("shape", list(_SHAPES), ids=list(_SHAPES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_gelu_bias_matches_numpy(cuda, lt_seen, dtype, shape, lt):
    """Inference's GELU_BIAS (no aux, so no leading-dimension rule): cuBLASLt runs the GPT
    shape where it is on."""
    m, k, n = _SHAPES[shape]
    hx, hw, hb, _, p = _gpu_inputs(dtype, m, k, n)
    z = p + hb.astype("float64")
    for (out,) in _run_node(cuda, "gelu_bias", [hx, hw, hb], lt):
        assert out.dtype == np.dtype(dtype)
        _assert_close(out, gelu(z), dtype, k, _ACT_TOL * (1 + np.abs(z)))
    if not lt:
        assert not lt_seen
    elif n % blaslt.AUX_LD_MULTIPLE == 0:
        assert any(ok and p.epilogue == blaslt.EPILOGUE_GELU_BIAS for p, ok in lt_seen)
