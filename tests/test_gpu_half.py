"""float16 and bfloat16 on the GPU (issue 34): half storage, float32 arithmetic inside kernels
(load, compute, round on store), float32 accumulation in reductions and in the softmax
family's kernels.

Three layers, as everywhere in symgpu's GPU tests:

* here, without a GPU: the dtype facts (bfloat16 is ml_dtypes' type, which NumPy files under
  kind 'V'), DLPack's codes, the graph check's tolerance, and, on a virtual context, that half
  graphs are placed on the GPU (no float work left on the host) and that the kernels they
  launch are rendered (and, ``nvcc``, compiled for sm_90);
* ``gpu`` tests (``pytest -m gpu tests/test_gpu_half.py`` on the GPU machine): results
  against NumPy computed in float32 and rounded to the half dtype once, within the stated
  number of the dtype's ulps, each asserting that the GPU ran it (Gpu ops in the compiled
  graph, no float op on the host, results of the half dtype);
* the kernels themselves run on the host in test_kernels_on_host.py, test_gpu_ops_emulated.py,
  test_gpu_kernels_emulated_more.py and test_gpu_sort.py (half cases there).

Tolerances: one ulp of the dtype relative is 2^-10 for float16 and 2^-7 for bfloat16
(``ULP``). A kernel computing in float32 and rounding once is within half an ulp of the exact
value, and within one ulp of NumPy's float32 answer rounded (the two float32 values may lie
on either side of a rounding boundary); each test says how many roundings its graph makes.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_gpu, requires_nvcc
from symgpu import function, grad, shared
from symgpu.config import config
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context

HALVES = ["float16", "bfloat16"]
#: one ulp (relative) of each half dtype at 1.0
ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
RNG = np.random.default_rng(34)


def _names(f) -> set[str]:
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def _on_gpu(inputs, outputs, expect: set[str]):
    """Compile; assert the ops in `expect` run and no float work stays on the host."""
    f = function(inputs, outputs, on_unused_input="ignore")
    names = _names(f)
    assert expect <= names, (expect - names, names)
    host = cpu_nodes(f.maker.fgraph)
    assert not host, [str(n.op) for n in host]
    return f


def _close(got, want32, dtype: str, ulps: float = 1, atol: float = 0.0) -> None:
    """`got` (of `dtype`) against `want32` (NumPy's float32 answer) rounded to `dtype`,
    within `ulps` ulps of the dtype (relative) and `atol`."""
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    want = np.asarray(want32, dtype=np.float32).astype(dtype).astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=ulps * ULP[dtype], atol=atol)


def _half(a, dtype: str) -> np.ndarray:
    return np.asarray(a).astype(dtype)


# ============================================================================ CPU: dtype facts

def test_bfloat16_is_accepted_by_name_not_as_any_two_byte_blob():
    from symgpu.gpu.placement.type import GpuArrayType, gpu_supports_dtype, move_to_gpu
    from symgpu.gpu.runtime.dtypes import BFLOAT16, SUPPORTED_DTYPES, check_dtype
    assert BFLOAT16.kind == "V" and BFLOAT16.itemsize == 2
    assert check_dtype("bfloat16") is BFLOAT16 and BFLOAT16 in SUPPORTED_DTYPES
    with pytest.raises(TypeError, match="cannot live on the GPU"):
        check_dtype("V2")
    assert gpu_supports_dtype("bfloat16") and GpuArrayType("bfloat16", (False,)).ndim == 1
    # a 0-d bfloat16 value is a float: it goes to the device like a float32 one
    assert move_to_gpu(np.asarray(1.5, "bfloat16")) and not move_to_gpu(np.asarray(3, "int8"))


def test_dlpack_codes_of_the_half_types():
    """bfloat16 is kDLBfloat (4) of 16 bits, float16 kDLFloat (2) of 16: both ways."""
    from symgpu.gpu.runtime import dlpack
    for dtype, code in (("bfloat16", 4), ("float16", 2)):
        dt = dlpack._dl_dtype(np.dtype(dtype))
        assert (dt.code, dt.bits, dt.lanes) == (code, 16, 1)
        assert dlpack._np_dtype(dt) == np.dtype(dtype)
    with pytest.raises(TypeError, match="not supported"):
        dlpack._np_dtype(dlpack._DataType(4, 32, 1))           # no 32-bit bfloat


def test_dlpack_bfloat16_code_is_pytorchs():
    """PyTorch's own capsule of a bfloat16 tensor (on the CPU: its dtype field is the same)
    reads back as ml_dtypes' bfloat16."""
    torch = pytest.importorskip("torch")
    from symgpu.gpu.runtime import dlpack
    t = torch.arange(6, dtype=torch.float32).to(torch.bfloat16)
    capsule = t.__dlpack__()
    name = dlpack._api.PyCapsule_GetName(capsule)
    ptr = dlpack._api.PyCapsule_GetPointer(
        dlpack.ctypes.c_void_p(id(capsule)), name)
    versioned = name == b"dltensor_versioned"
    struct = (dlpack._ManagedVersioned if versioned else dlpack._Managed).from_address(ptr)
    assert dlpack._np_dtype(struct.dl_tensor.dtype) == np.dtype("bfloat16")


def test_a_graphs_check_allows_two_ulps_of_a_half_result():
    from symgpu.gpu.exec.graph_instance import results_differ
    for dtype in HALVES:
        a = np.linspace(1, 2, 64).astype(dtype)
        one_ulp = (a.astype(np.float32) * (1 + ULP[dtype])).astype(dtype)
        assert results_differ([a], [one_ulp]) is None
        assert results_differ([a], [(a.astype(np.float32) * 1.1).astype(dtype)]) is not None
        with_nan = a.copy()
        with_nan[3] = np.nan
        assert results_differ([with_nan], [with_nan.copy()]) is None


# ============================================================================ virtual context

def _placement_cases(dtype: str):
    """name -> (inputs, output, GPU ops expected)"""
    from symgpu.tensor.shared_randomstreams import RandomStreams
    from symgpu.tensor.sort import topk
    x, v = T.matrix("x", dtype=dtype), T.vector("v", dtype=dtype)
    y = T.lvector("y")
    z32 = T.matrix("z32", dtype="float32")
    p = T.nnet.softmax(x)
    nll = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    srng = RandomStreams(seed=3)
    return {
        "chain": ([x, v], T.tanh(x) * v + T.exp(-abs(x)), {"GpuElemwise"}),
        "sum": ([x], x.sum(axis=1), {"GpuCAReduce"}),
        "mean": ([x], x.mean(), {"GpuCAReduce"}),
        "max": ([x], x.max(axis=0), {"GpuCAReduce"}),
        "cast_in": ([z32], T.cast(z32, dtype) * 2, {"GpuElemwise"}),
        "softmax": ([x], p, {"GpuSoftmaxRows"}),
        "log_softmax": ([x], T.nnet.log_softmax(x), {"GpuSoftmaxRows"}),
        "softmax_vector": ([v], T.nnet.softmax(v), {"GpuSoftmaxRows"}),   # a 1 x n row
        "softmax_grad": ([x], grad((p * x).sum(), x), {"GpuSoftmaxRows", "GpuElemwise"}),
        "nll": ([x, y], nll, {"GpuSoftmaxRows", "GpuTakeRows"}),
        "nll_grad": ([x, y], grad(nll, x), {"GpuNLLGrad"}),
        "crossentropy": ([x, y], T.nnet.categorical_crossentropy(x, y),
                         {"GpuCrossentropyCategorical1Hot"}),
        "crossentropy_grad": ([x, y], grad(T.nnet.categorical_crossentropy(x, y).sum(), x),
                              {"GpuCrossentropyCategorical1HotGrad"}),
        "argmax": ([x], T.argmax(x, axis=1), {"GpuArgmax"}),
        "draw": ([], srng.normal((5, 7), dtype=dtype), {"GpuPhiloxSample"}),
        "fused_draw": ([x], x * srng.uniform(x.shape, dtype=dtype), {"GpuPhiloxElemwise"}),
        "gather": ([x, y], x[y], {"GpuAdvancedSubtensor1"}),
        "inc": ([x, y], T.inc_subtensor(x[y], 1.0), {"GpuAdvancedIncSubtensor1"}),
        "gather_grad": ([x, y], grad((x[y] ** 2).sum(), x), {"GpuAdvancedIncSubtensor1"}),
        "pairs": ([x, y], T.inc_subtensor(x[y, y], 2.0), {"GpuAdvancedIncSubtensor2"}),
        "basic_inc": ([x, v], T.inc_subtensor(x[1:3, ::2], 1.0), {"GpuIncSubtensor"}),
        "set": ([x], T.set_subtensor(x[1:3], 0), {"GpuIncSubtensor"}),
        "sort": ([x], T.sort(x), {"GpuSort"}),
        "argsort": ([x], T.argsort(x, axis=0), {"GpuArgSort"}),
        "topk": ([x], topk(x, 3), {"GpuTopK"}),
        "join": ([x], T.concatenate([x, x[::2]]), {"GpuJoin"}),
    }


_CASES = list(_placement_cases("float16"))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("case", _CASES)
def test_half_graphs_are_placed_on_the_gpu(dtype, case):
    """Every op of issue 34 takes the half dtypes on the device: no float array is computed
    on the host in the compiled graph (cpu_nodes), and the results keep the half dtype."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        inputs, out, expect = _placement_cases(dtype)[case]
        f = _on_gpu(inputs, out, expect)
        if case not in ("argmax", "argsort"):
            assert f.maker.fgraph.outputs[0].dtype == dtype


def test_an_op_without_half_kernels_stays_on_the_host_with_transfers():
    """Linear algebra has no half kernels: it runs on the host, between transfers, and the
    elementwise work around it stays on the GPU."""
    from symgpu.tensor.slinalg import cholesky
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.matrix("x", dtype="bfloat16")
        f = function([x], T.exp(cholesky(x)) * 2)
        names = _names(f)
        assert "GpuCholesky" not in names and "GpuElemwise" in names
        assert {"HostFromGpu", "GpuFromHost"} <= names, names


def _kernel_names_of(node) -> list[str]:
    args = node.op.perform_args(node)
    flat = []
    for a in args:
        flat += list(a) if isinstance(a, tuple) else [a]
    return [a for a in flat if isinstance(a, str)]


@requires_nvcc
@pytest.mark.parametrize("dtype", HALVES)
def test_half_kernels_render_and_compile(dtype, tmp_path):
    """Every module a half training graph launches is rendered: the generated ones
    (elementwise, reductions, fused draws) compile for sm_90 here; the fixed ones hold the
    kernels the nodes will launch (they are compiled by their own tests)."""
    from symgpu.gpu.runtime import compiler
    cases = _placement_cases(dtype)
    outs = [cases[k][1] for k in ("chain", "sum", "mean", "softmax_vector", "softmax_grad",
                                  "nll_grad", "crossentropy_grad", "fused_draw",
                                  "gather_grad", "argmax", "sort")]
    ins = [v for v in cases["nll"][0] + cases["chain"][0] if v.name != "y"] + [cases["nll"][0][1]]
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function(list(dict.fromkeys(ins)), outs, on_unused_input="ignore")
        generated, checked = {}, 0
        for node in f.maker.fgraph.toposort():
            sources = getattr(node.op, "prefetch_sources", None)
            if sources is None:
                continue
            for key, factory, _ in sources(node):
                kind = key[0] if isinstance(key, tuple) and key else key
                if kind in ("symgpu.elemwise", "symgpu.reduce", "symgpu.philox_elemwise"):
                    generated.setdefault(factory(), str(node.op))
                elif hasattr(node.op, "perform_args"):
                    text = factory()
                    for name in _kernel_names_of(node):
                        assert f"void {name}(" in text, (name, node.op)
                        checked += 1
    assert checked >= 6 and len(generated) >= 5
    compiler.clear_memory_cache()
    try:
        with config.change_flags(compiledir=str(tmp_path), compile_log=False,
                                 **{"nvcc.flags": ""}):
            for src, label in generated.items():
                assert "__nv_bfloat16" in src or "__half" in src, label
                try:
                    compiler.compile_to_cubin(src, (), "sm_90")
                except compiler.CompileError as exc:
                    pytest.fail(f"{label}: {exc}")
    finally:
        compiler.clear_memory_cache()


# ============================================================================ GPU

@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_fused_elementwise_chain(cuda, dtype):
    """tanh(x) * v + exp(-|x|) * 0.5: one fused kernel (computed in float32, one rounding:
    within 2 ulps of NumPy's float32 rounded), contiguous and with a broadcast row."""
    x, v = T.matrix("x", dtype=dtype), T.vector("v", dtype=dtype)
    out = T.tanh(x) * v + T.exp(-abs(x)) * 0.5
    assert out.dtype == dtype
    f = _on_gpu([x, v], out, {"GpuElemwise"})
    xv = _half(RNG.uniform(-3, 3, (257, 129)), dtype)
    vv = _half(RNG.uniform(-2, 2, 129), dtype)
    xs, vs = xv.astype(np.float32), vv.astype(np.float32)
    want = np.tanh(xs) * vs + np.exp(-np.abs(xs)) * np.float32(0.5)
    _close(f(xv, vv), want, dtype, ulps=2, atol=2 * ULP[dtype])


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_long_sum_accumulates_in_float32(cuda, dtype):
    """100000 sixteenths: a half accumulator stalls (float16 near 128, bfloat16 near 16); in
    float32 every partial sum is exact, so the result is exactly 6250 rounded once."""
    x = T.vector("x", dtype=dtype)
    f = _on_gpu([x], [x.sum(), x.mean()], {"GpuCAReduce"})
    s, m = f(np.full(100_000, 0.0625, dtype))
    assert s.dtype == dtype and m.dtype == dtype
    assert s.astype(np.float64) == np.float32(6250).astype(dtype).astype(np.float64)
    assert m.astype(np.float64) == 0.0625


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_reductions_along_axes(cuda, dtype):
    """Row and column sums of positive values (float32 sums rounded once: 2 ulps), max and
    min (exact)."""
    x = T.matrix("x", dtype=dtype)
    # (the column sum and min share a pass, the row sum and max another)
    f = _on_gpu([x], [x.sum(axis=0), x.sum(axis=1), x.max(axis=1), x.min(axis=0)],
                {"GpuColumnReduceGroup", "GpuRowReduceGroup"})
    xv = _half(RNG.uniform(0, 1, (300, 700)), dtype)
    xs = xv.astype(np.float32)
    s0, s1, mx, mn = f(xv)
    _close(s0, xs.sum(axis=0), dtype, ulps=2)
    _close(s1, xs.sum(axis=1), dtype, ulps=2)
    np.testing.assert_array_equal(mx.astype(np.float32), xs.max(axis=1))
    np.testing.assert_array_equal(mn.astype(np.float32), xs.min(axis=0))


def _softmax32(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("n", [10, 2000])
def test_gpu_softmax_and_log_softmax_rows(cuda, dtype, n):
    """GpuSoftmaxRows (a warp per row, a block past 1024): loaded, summed and computed in
    float32, rounded once (2 ulps)."""
    x = T.matrix("x", dtype=dtype)
    f = _on_gpu([x], [T.nnet.softmax(x), T.nnet.log_softmax(x)], {"GpuSoftmaxRows"})
    xv = _half(RNG.standard_normal((37, n)) * 4, dtype)
    xs = xv.astype(np.float32)
    sm, lsm = f(xv)
    tiny = 2.0 ** -23 if dtype == "float16" else 0.0   # 2 of float16's subnormal steps
    _close(sm, _softmax32(xs), dtype, ulps=2, atol=tiny)
    lwant = (xs - xs.max(axis=1, keepdims=True)) - np.log(
        np.exp(xs - xs.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True))
    _close(lsm, lwant, dtype, ulps=2, atol=1e-5)


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_softmax_of_a_vector_and_the_softmax_gradient(cuda, dtype):
    """A vector's softmax is a 1 x n row, as in Theano 1.0 (one GpuSoftmaxRows row: 4 ulps
    are ample); the gradient of
    sum(softmax(x) * c), s * (c - rowsum(s * c)), cancels, so its tolerance is absolute:
    s, the row sum and the result rounded (|c| <= 1), 4 ulps of the largest s."""
    v, x = T.vector("v", dtype=dtype), T.matrix("x", dtype=dtype)
    c = _half(RNG.uniform(-1, 1, (16, 50)), dtype)
    g = grad((T.nnet.softmax(x) * T.constant(c)).sum(), x)
    f = _on_gpu([v, x], [T.nnet.softmax(v), g], {"GpuSoftmaxRows", "GpuCAReduce"})
    vv = _half(RNG.standard_normal(3000) * 3, dtype)
    xv = _half(RNG.standard_normal((16, 50)) * 2, dtype)
    sv, gx = f(vv, xv)
    assert sv.shape == (1, vv.size)
    _close(sv, _softmax32(vv.astype(np.float32)[None]), dtype, ulps=4, atol=2.0 ** -23)
    s, cs = _softmax32(xv.astype(np.float32)), c.astype(np.float32)
    want = s * (cs - (s * cs).sum(axis=1, keepdims=True))
    _close(gx, want, dtype, ulps=4, atol=4 * ULP[dtype] * float(s.max()))


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_negative_log_likelihood_and_its_gradient(cuda, dtype):
    """The tutorials' loss, -mean(log(softmax(z))[arange(n), y]): log-softmax kernel, the
    row gather, a float32 mean (2 ulps); its gradient is GpuNLLGrad, (softmax - onehot) / n
    in one kernel from exp of the rounded log-softmax (whose rounding error, up to
    |log p| ulps/2, the exp turns into a relative one: 8 ulps, and 1 ulp of the scale)."""
    z, y = T.matrix("z", dtype=dtype), T.lvector("y")
    loss = -T.mean(T.log(T.nnet.softmax(z))[T.arange(y.shape[0]), y])
    f = _on_gpu([z, y], [loss, grad(loss, z)], {"GpuSoftmaxRows", "GpuNLLGrad"})
    zv = _half(RNG.standard_normal((64, 10)), dtype)
    yv = RNG.integers(0, 10, 64).astype("int64")
    lv, gv = f(zv, yv)
    zs = zv.astype(np.float32)
    s = _softmax32(zs)
    _close(lv, -np.log(s[np.arange(64), yv]).mean(), dtype, ulps=2)
    onehot = np.zeros_like(s)
    onehot[np.arange(64), yv] = 1
    want = (s - onehot) / np.float32(64)
    _close(gv, want, dtype, ulps=8, atol=ULP[dtype] / 64)


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_crossentropy_of_probabilities_and_its_gradient(cuda, dtype):
    """-log p[i, y_i] and -1 / p[i, y_i] at (i, y_i): one float32 operation, one rounding."""
    p, y = T.matrix("p", dtype=dtype), T.ivector("y")
    ce = T.nnet.categorical_crossentropy(p, y)
    f = _on_gpu([p, y], [ce, grad(ce.sum(), p)],
                {"GpuCrossentropyCategorical1Hot", "GpuCrossentropyCategorical1HotGrad"})
    pv = _half(RNG.uniform(0.05, 1.0, (300, 7)), dtype)
    yv = RNG.integers(0, 7, 300).astype("int32")
    cv, gv = f(pv, yv)
    ps = pv.astype(np.float32)
    picked = ps[np.arange(300), yv]
    _close(cv, -np.log(picked), dtype, ulps=1)
    want = np.zeros_like(ps)
    want[np.arange(300), yv] = -1 / picked
    _close(gv, want, dtype, ulps=1)


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_random_draws_are_the_cpu_generators(cuda, dtype):
    """Half draws are the float32 numbers rounded on the store, as the CPU casts them:
    uniforms bit for bit, normals within an ulp (the GPU's float32 sine is approximate); a
    draw fused into its reader (2 + 2u) within an ulp; the counter moves as for float32."""
    from symgpu.tensor.random import philox
    from symgpu.tensor.shared_randomstreams import RandomStreams
    srng = RandomStreams(seed=5)
    outs = [srng.uniform((1001, 3), dtype=dtype), srng.normal((7, 333), dtype=dtype),
            srng.uniform((5,), low=2.0, high=4.0, dtype=dtype)]
    f = function([], outs)
    names = _names(f)
    assert names & {"GpuPhiloxSample", "GpuPhiloxElemwise"} and "PhiloxSample" not in names

    def reference(stream, dist, shape, call):
        state = RandomStreams(seed=5)._initial_state(stream)
        state = philox.advance(state, call * philox.blocks(int(np.prod(shape)), dtype))
        return philox.sample(state, dist, dtype, shape)

    for call in range(3):
        u, z, w = f()
        assert u.dtype == z.dtype == w.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(u.view(np.uint16),
                                      reference(0, "uniform", (1001, 3), call).view(np.uint16))
        _close(z, reference(1, "normal", (7, 333), call).astype(np.float32), dtype, ulps=1,
               atol=ULP[dtype] * 0.01)
        want = 2 + 2 * reference(2, "uniform", (5,), call).astype(np.float32)
        _close(w, want, dtype, ulps=1)


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_indexing_and_increments(cuda, dtype):
    """Gathers and sets move the stored bits (exact); a basic increment adds in float32 and
    rounds once, as NumPy's half add (exact); increments at repeated indices are atomicAdd's,
    each sum rounded, in any order (an ulp per repeat of NumPy's sequential half sums)."""
    x, y = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype)
    idx = T.lvector("idx")
    outs = [x[idx], T.inc_subtensor(x[idx], y), T.set_subtensor(x[1:3], y[:2]),
            T.inc_subtensor(x[1:4, ::2], y[:3, ::2]), grad((x[idx] ** 2).sum(), x)]
    f = _on_gpu([x, y, idx], outs, {"GpuAdvancedSubtensor1", "GpuAdvancedIncSubtensor1",
                                     "GpuIncSubtensor"})
    xv = _half(RNG.uniform(-4, 4, (9, 6)), dtype)
    iv = np.asarray([3, -1, 0, 3, 8, 3, 5], dtype="int64")   # 3 three times
    yv = _half(RNG.uniform(-4, 4, (7, 6)), dtype)
    gathered, inc, setv, basic, gx = f(xv, yv, iv)
    np.testing.assert_array_equal(gathered.view(np.uint16), xv[iv].view(np.uint16))
    want = xv.copy()
    np.add.at(want, iv, yv)                          # NumPy's half sums, in index order
    # three roundings on either side at magnitudes below 16 (half an ulp there: 4 ULP)
    _close(inc, want.astype(np.float32), dtype, ulps=4, atol=32 * ULP[dtype])
    want = xv.copy()
    want[1:3] = yv[:2]
    np.testing.assert_array_equal(setv.view(np.uint16), want.view(np.uint16))
    want = xv.copy()
    want[1:4, ::2] += yv[:3, ::2]
    np.testing.assert_array_equal(basic.astype(np.float32), want.astype(np.float32))
    g = np.zeros((9, 6), np.float32)
    np.add.at(g, iv, 2 * xv[iv].astype(np.float32))
    # two atomic roundings below 32 (8 ULP each), the reference's one: 24 ULP at most
    _close(gx, g, dtype, ulps=4, atol=32 * ULP[dtype])


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_sort_argsort_topk_and_argmax(cuda, dtype):
    """Ordered 16-bit keys: NumPy's order of the values (NaNs last, ties stable)."""
    from symgpu.tensor.sort import topk
    x = T.matrix("x", dtype=dtype)
    vals = topk(x, 3)
    f = _on_gpu([x], [T.sort(x), T.argsort(x), vals, T.argmax(x, axis=1)],
                {"GpuSort", "GpuArgSort", "GpuTopK", "GpuArgmax"})
    xv = _half(np.round(RNG.standard_normal((6, 1500)) * 8) / 8, dtype)   # many ties
    xv[2, 7] = np.nan
    xs = xv.astype(np.float32)
    s, a, t, am = f(xv)
    np.testing.assert_array_equal(s.astype(np.float32), np.sort(xs, axis=1))
    np.testing.assert_array_equal(a, np.argsort(xs, axis=1, kind="stable"))
    want = -np.sort(-np.where(np.isnan(xs), np.inf, xs), axis=1)[:, :3]
    want[2, 0] = np.nan
    np.testing.assert_array_equal(t.astype(np.float32), want)
    np.testing.assert_array_equal(am, np.argmax(xs, axis=1))


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_arrays_transfers_and_shared_values(cuda, dtype):
    """Uploads, downloads, fills, strided copies and shared variables keep the bits."""
    from symgpu.gpu import GpuArray, to_gpu
    host = _half(RNG.standard_normal((33, 17)), dtype)
    g = to_gpu(host)
    assert g.dtype == np.dtype(dtype) and isinstance(g, GpuArray)
    np.testing.assert_array_equal(g.get().view(np.uint16), host.view(np.uint16))
    np.testing.assert_array_equal(g[:, ::3].copy().get().view(np.uint16),
                                  host[:, ::3].view(np.uint16))
    np.testing.assert_array_equal(np.asarray(g.T).view(np.uint16), host.T.view(np.uint16))
    g.fill(1.5)
    assert (g.get().astype(np.float32) == 1.5).all()
    w = shared(host, name="w")
    assert isinstance(w.get_value(borrow=True, return_internal_type=True), GpuArray)
    s0 = shared(np.asarray(0.25, dtype), name="s0")           # a 0-d float lives there too
    assert isinstance(s0.get_value(borrow=True, return_internal_type=True), GpuArray)
    f = function([], [], updates=[(w, w * s0 + 1)])
    assert "GpuElemwise" in _names(f) and not cpu_nodes(f.maker.fgraph)
    f()
    want = (host.astype(np.float32) * np.float32(0.25) + 1).astype(dtype)
    np.testing.assert_array_equal(w.get_value().view(np.uint16), want.view(np.uint16))
    w.set_value(host)
    np.testing.assert_array_equal(w.get_value().view(np.uint16), host.view(np.uint16))


@requires_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_gpu_dlpack_with_torch(cuda, dtype):
    """torch.from_dlpack of a half GpuArray and symgpu's from_dlpack / asarray of a half
    torch tensor share memory, the dtype carried (bfloat16 as kDLBfloat)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch is installed without CUDA")
    from symgpu.gpu import asarray, from_dlpack, to_gpu
    tdtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    host = _half(np.arange(24).reshape(4, 6) / 4, dtype)
    g = to_gpu(host)
    t = torch.from_dlpack(g)
    assert t.dtype == tdtype and t.is_cuda and t.data_ptr() == g.ptr
    np.testing.assert_array_equal(t.float().cpu().numpy(), host.astype(np.float32))
    t.mul_(2)                                        # torch writes, symgpu sees it
    torch.cuda.synchronize()
    np.testing.assert_array_equal(g.get().astype(np.float32), 2 * host.astype(np.float32))
    src = (torch.arange(30, device="cuda", dtype=torch.float32) / 8).to(tdtype).reshape(5, 6)
    for back in (from_dlpack(src), asarray(src), from_dlpack(src[:, 1::2])):
        assert back.dtype == np.dtype(dtype)
    back = from_dlpack(src)
    assert back.ptr == src.data_ptr()
    np.testing.assert_array_equal(back.get().astype(np.float32), src.float().cpu().numpy())
    x = T.matrix("x", dtype=dtype)
    f = _on_gpu([x], T.exp(x), {"GpuElemwise"})
    _close(f(back), np.exp(src.float().cpu().numpy()), dtype, ulps=2)
