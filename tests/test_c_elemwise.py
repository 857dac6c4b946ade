"""Fused elementwise Composites as one compiled C loop on the CPU (symgpu.scalar.ccode,
symgpu.tensor.c_elemwise): every table row against NumPy on edge values (one compiled
Composite per dtype, one output per row), real fused graphs, broadcasting, the layouts that
fall back to NumPy, in-place nodes, and the bugs these tests found.

Every distinct Composite costs a C compile, so the tests batch rows into few Composites.
tests/test_c_runtime.py covers the switches, the runtime, the cache and compile failures."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.special as sps

from c_kernel_helpers import (INT_UNSAFE, RNG, ROW_DTYPES, RTOL, SIGNED_ZERO_FREE, TRANSCENDENTAL, assert_close,
                              assert_same, c_thunks, composite, fused_thunks, link_composite)
import symgpu
import symgpu.tensor as T
from symgpu.graph.fg import FunctionGraph
from symgpu.link import c_runtime
from symgpu.link.vm import link
from symgpu.scalar import ccode
from symgpu.scalar.basic import SCALAR_OPS, SCALAR_TABLE, Cast
from symgpu.scalar.composite import CompositeBuilder
from symgpu.tensor import c_elemwise
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.type import TensorType

if c_runtime.runner() is None:
    pytest.skip(f"C kernels cannot be used here: {c_runtime.unavailable_reason()}",
                allow_module_level=True)


# ----------------------------------------------------------------------------- every table row

def _grid(dtype):
    if dtype == "bool":
        return np.array([False, True])
    if dtype.startswith("float"):
        fi = np.finfo(dtype)
        vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, fi.smallest_subnormal,
                -fi.smallest_subnormal, fi.tiny, -fi.tiny, 1e-30, -1e-30, 1e30, -1e30, 100.0,
                -100.0, 1000.0, -1000.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0, 0.1, 7.0, -7.0,
                88.5, -89.5, 710.0, -745.5, fi.max, -fi.max]
        return np.array(vals, dtype)
    ii = np.iinfo(dtype)
    vals = {0, 1, 2, 3, 7, 100, ii.max, ii.max - 1, ii.min, ii.min + 1}
    if ii.min < 0:
        vals |= {-1, -2, -7, -100}
    return np.array(sorted(vals), dtype)


def _operands(dtype):
    """a, b: every pair of edge values, then random values; cond; clip bounds lo, hi."""
    g = _grid(dtype)
    a, b = (np.array(col, dtype) for col in zip(*itertools.product(g, repeat=2)))
    if dtype == "bool":
        r = RNG.rand(2, 60) < 0.5
    elif dtype.startswith("float"):
        r = (RNG.randn(2, 1500) * 10.0 ** RNG.randint(-4, 5, size=(2, 1500))).astype(dtype)
    else:
        ii = np.iinfo(dtype)
        r = RNG.randint(ii.min, int(ii.max) + 1, size=(2, 1500), dtype=dtype)
    a, b = np.concatenate([a, r[0]]), np.concatenate([b, r[1]])
    n = len(a)
    cond = RNG.rand(n) < 0.5
    bounds = {"bool": ([0, 1, 0, 0], [1, 1, 0, 1]), "uint8": ([1, 0, 2, 0], [2, 0, 1, 5])}
    lo, hi = bounds.get(dtype, ([-1, 0, -2, 0, -1.5], [2, 0, -1, 5, 1e30]))
    if not dtype.startswith("float"):
        lo, hi = lo[:4], hi[:4]
    return a, b, cond, np.resize(np.array(lo, dtype), n), np.resize(np.array(hi, dtype), n)


def _row_args(spec):
    """Which of (a, b, cond, lo, hi) a row reads."""
    if spec.name == "switch":
        return [2, 0, 1]
    if spec.name == "clip":
        return [0, 3, 4]
    return [0] if spec.nin == 1 else [0, 1]


def _row_cases(dtype):
    """(row, argument indices, output dtype) of every row that applies to dtype and that
    `ccode.supports`, and the names of the rows it refuses."""
    in_dtypes = (dtype, dtype, "bool", dtype, dtype)
    cases, refused = [], set()
    for spec in SCALAR_TABLE:
        idx = _row_args(spec)
        try:
            out = SCALAR_OPS[spec.name].output_dtype(*[in_dtypes[i] for i in idx])
        except TypeError:  # e.g. bitwise rows on floats, subtraction of booleans
            continue
        alone = composite([in_dtypes[i] for i in idx], [(spec.name, list(range(len(idx))))],
                          [len(idx)])
        if ccode.supports(alone):
            cases.append((spec, idx, out))
        else:
            refused.add(spec.name)
    return cases, refused


@pytest.mark.parametrize("dtype", ROW_DTYPES + ["int8", "int16", "uint16", "uint32", "uint64"])
def test_supports_refuses_exactly_integer_int_div_mod_pow(dtype):
    cases, refused = _row_cases(dtype)
    # rows without a C form: none on CUDA (host only), or a CUDA form C's libm lacks
    no_c = {s.name for s in SCALAR_TABLE if s.cuda is None or s.cuda_only}
    assert refused - no_c == (set() if dtype.startswith("float") else INT_UNSAFE)
    assert len(cases) >= 40
    # the same rows are fine in a float compute dtype, even with integer operands
    mixed = composite([dtype, "float64"], [("int_div", [0, 1]), ("mod", [0, 1]), ("pow", [0, 1])],
                      [2, 3, 4])
    assert ccode.supports(mixed)


@pytest.mark.parametrize("dtype", ["float16", "complex64", "complex128"])
def test_supports_refuses_float16_and_complex(dtype):
    for name, args in [("add", [0, 1]), ("mul", [0, 1]), ("exp", [0]), ("neg", [0]),
                       ("lt", [0, 1])]:
        if dtype.startswith("complex") and name == "lt":
            continue
        assert not ccode.supports(composite([dtype, dtype], [(name, args)], [2])), name
    # a float16 intermediate or output refuses the whole Composite
    assert not ccode.supports(composite(["float32"], [(Cast(dtype), [0]), ("add", [1, 1])],
                                        [2]))
    assert ccode.supports(composite(["float32"], [(Cast("float64"), [0]), ("add", [1, 1])], [2]))


@pytest.mark.parametrize("dtype", ROW_DTYPES)
def test_every_table_row_matches_numpy(dtype):
    """One Composite per dtype, one output per supported row, over every pair of edge
    values (nan, +-inf, +-0, subnormals, +-1e30, extremes of the dtype...) and random ones."""
    vals = _operands(dtype)
    in_dtypes = (dtype, dtype, "bool", dtype, dtype)
    cases, _ = _row_cases(dtype)
    builder = CompositeBuilder()
    refs = [builder.add_input(d) for d in in_dtypes]
    outs, expected = [], []
    for spec, idx, out in cases:
        outs += builder.add_op(SCALAR_OPS[spec.name], [refs[i] for i in idx])
        args = [vals[i] for i in idx]
        if spec.dtype_rule == "float":  # as Elemwise: float-valued rows compute in out dtype
            args = [x.astype(out) for x in args]
        with np.errstate(all="ignore"):
            expected.append(np.asarray(spec.numpy(*args)).astype(out))
    comp = builder.build(outs)
    assert ccode.supports(comp)
    vm, cells = link_composite(comp, list(vals))
    (thunk,) = vm.thunks
    assert thunk.c_kernel, "the Composite should run as a C loop"
    with np.errstate(all="ignore"):
        vm()
    assert len(cells) == len(cases) >= 40
    for (spec, _, out), out_dtype, cell, e in zip(cases, comp.out_dtypes, cells, expected):
        got = cell[0]
        label = f"{spec.name} [{dtype}]"
        assert got.dtype == np.dtype(out) == np.dtype(out_dtype), label
        if got.dtype.kind == "f" and spec.name in TRANSCENDENTAL:
            assert_close(got, e, label)
        else:
            assert_same(got, e, label, signed_zeros=spec.name not in SIGNED_ZERO_FREE)


def test_mixed_dtype_steps_convert_like_numpy():
    """Operands of different dtypes meet in NumPy's result dtype (int32 + float32 in
    float64, uint8 < int8 in int16...), as NumPy computes them."""
    pairs = [("int32", "float32"), ("uint8", "int8"), ("int64", "float64"), ("bool", "float32"),
             ("uint32", "int32"), ("float32", "float64"), ("int8", "uint16")]
    rows = ["add", "sub", "mul", "true_div", "maximum", "minimum", "lt"]  # <= 64 arrays
    values, in_dtypes = [], []
    for da, db in pairs:
        cols = zip(*itertools.product(_grid(da), _grid(db)))
        values += [np.resize(np.array(col, d), 1200) for col, d in zip(cols, (da, db))]
        in_dtypes += [da, db]
    prog, expected, labels = [], [], []
    for k, (da, db) in enumerate(pairs):
        for name in rows:
            if "bool" in (da, db) and name == "sub":
                continue
            prog.append((name, [2 * k, 2 * k + 1]))
            with np.errstate(all="ignore"):
                expected.append(SCALAR_OPS[name].impl(values[2 * k], values[2 * k + 1]))
            labels.append(f"{name}({da}, {db})")
    n = len(in_dtypes)
    comp = composite(in_dtypes, prog, list(range(n, n + len(prog))))
    vm, cells = link_composite(comp, values)
    assert vm.thunks[0].c_kernel
    with np.errstate(all="ignore"):
        vm()
    for label, cell, e in zip(labels, cells, expected):
        assert_same(cell[0], e, label, signed_zeros=not label.startswith(("max", "min")))


def test_constants_and_casts_are_exact():
    """Literals of every kind (nan, +-inf, -0.0, subnormal, extremes of int64/uint64) and
    in-range conversions come out bit for bit."""
    f32, f64 = np.finfo("float32"), np.finfo("float64")
    in_dtypes = ["float32", "float64", "int64", "uint64", "bool"]
    n = 9
    x32 = np.linspace(-300.0, 300.0, n).astype("float32")
    x64 = np.linspace(-1e10, 1e10, n)
    xi = np.array([-(2 ** 63), -(2 ** 53) - 1, -5, -1, 0, 1, 7, 2 ** 53 + 1, 2 ** 63 - 1], "int64")
    xu = np.array([0, 1, 7, 255, 2 ** 32, 2 ** 53 + 1, 2 ** 63, 2 ** 64 - 2, 2 ** 64 - 1], "uint64")
    xb = np.arange(n) % 2 == 0
    consts = [(np.nan, "float32"), (np.inf, "float32"), (-np.inf, "float64"), (-0.0, "float32"),
              (f32.smallest_subnormal, "float32"), (f64.smallest_subnormal, "float64"),
              (f32.max, "float32"), (0.1, "float32"), (0.1, "float64"), (-(2 ** 63), "int64"),
              (2 ** 63 - 1, "int64"), (2 ** 64 - 1, "uint64"), (True, "bool"), (-0.0, "float64"),
              (np.nan, "float64"), (np.inf, "float64"), (-np.inf, "float32"), (False, "bool")]
    nin, nc = len(in_dtypes), len(consts)
    c = {k: nin + k for k in range(nc)}
    prog = [("second", [0, c[k]]) for k in range(nc)]  # each constant, broadcast
    prog += [("add", [0, c[7]]), ("mul", [1, c[8]]), ("add", [2, c[10]]), ("sub", [3, c[11]]),
             ("and_", [4, c[12]]), ("maximum", [0, c[2]]), ("minimum", [1, c[1]]),
             ("mul", [0, c[3]])]
    prog += [(Cast(d), [src]) for src, d in [(0, "int32"), (0, "int16"), (0, "float64"),
                                             (0, "bool"), (1, "float32"),
                                             (1, "int64"), (2, "float64"), (2, "float32"),
                                             (2, "uint64"), (3, "float64"), (3, "int64"),
                                             (4, "float32"), (4, "int16"), (1, "bool")]]
    comp = composite(in_dtypes, prog, list(range(nin + nc, nin + nc + len(prog))), consts)
    values = [x32, x64, xi, xu, xb]
    with np.errstate(all="ignore"):
        expected = comp.impl(*values)
    vm, cells = link_composite(comp, values)
    assert vm.thunks[0].c_kernel
    with np.errstate(all="ignore"):
        vm()
    for k, ((op, args), cell, e) in enumerate(zip(prog, cells, expected)):
        assert_same(cell[0], e, f"step {k}: {op}{tuple(args)}")
    # float -> small integers, truncating, of values the target holds (others are UB in C)
    targets = ("int8", "uint8", "uint16", "int32", "uint32")
    inputs = [np.linspace(np.iinfo(d).min, min(np.iinfo(d).max, 2 ** 24), 13)
              .astype("float32") + np.float32(0.25) for d in targets]
    inputs = [np.minimum(x, np.float32(np.iinfo(d).max)) for x, d in zip(inputs, targets)]
    small = composite(["float32"] * len(targets),
                      [(Cast(d), [k]) for k, d in enumerate(targets)],
                      list(range(len(targets), 2 * len(targets))))
    vm2, cells2 = link_composite(small, inputs)
    vm2()
    for cell, x, d in zip(cells2, inputs, targets):
        assert_same(cell[0], x.astype(d), f"Cast{{{d}}}")


# ----------------------------------------------------------------------------- real graphs

@pytest.mark.parametrize("shape", [(7,), (40000,), (5, 6)])
def test_fused_graph_runs_in_c_and_matches_numpy(shape, spy):
    ndim = len(shape)
    x, y = (TensorType("float32", (False,) * ndim)(n) for n in "xy")
    f = symgpu.function([x, y], T.exp(x) * y + 2)
    ((node, thunk),) = fused_thunks(f)
    assert thunk.c_kernel and thunk.fallback is not None
    assert len(node.op.scalar_op.steps) >= 2
    a = RNG.randn(*shape).astype("float32")
    b = RNG.randn(*shape).astype("float32")
    a.flat[:3] = [np.nan, 100.0, -np.inf]
    got = f(a, b)
    assert spy == [True]
    with np.errstate(all="ignore"):
        expected = np.exp(a) * b + np.float32(2)
    assert got.dtype == np.float32 and got.shape == shape
    assert_close(got, expected, cancel=True)
    # a second call gets a fresh output: the first result is not overwritten
    got2 = f(b, a)
    assert got2 is not got
    assert_close(got, expected, cancel=True)


def test_scalar_inputs_broadcast_over_a_matrix(spy):
    x, s = T.matrix("x", dtype="float64"), T.scalar("s", dtype="float64")
    i = T.scalar("i", dtype="int32")
    f = symgpu.function([x, s, i], T.tanh(x * s) - i / 3 + 1.5)
    assert len(c_thunks(f)) == 1
    a = RNG.randn(4, 5)
    got = f(a, 0.75, 7)
    assert spy == [True]
    assert_close(got, np.tanh(a * 0.75) - 7 / 3 + 1.5, cancel=True)


def _logreg(mode=None, feats=20):
    x, y = T.matrix("x", dtype="float32"), T.vector("y", dtype="float32")
    w = symgpu.shared(RNG.randn(feats).astype("float32"), name="w")
    b = symgpu.shared(np.asarray(0.5, dtype="float32"), name="b")
    p_1 = 1 / (1 + T.exp(-T.dot(x, w) - b))
    xent = -y * T.log(p_1) - (1 - y) * T.log(1 - p_1)
    cost = xent.mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    f = symgpu.function([x, y], [p_1 > 0.5, xent, gw, gb], mode=mode)
    return f, w.get_value(), float(b.get_value())


def _logreg_numpy(x, y, w, b):
    x, y, w = (v.astype("float64") for v in (x, y, w))
    z = x @ w + b
    p = sps.expit(z)
    xent = np.logaddexp(0, -z) * y + np.logaddexp(0, z) * (1 - y)
    d = (p - y) / len(y)
    return p > 0.5, xent, x.T @ d + 0.02 * w, d.sum()


def test_logistic_regression_sigmoid_softplus_chain(spy):
    with symgpu.config.change_flags(floatX="float32"):
        f, w, b = _logreg()
    fused = fused_thunks(f)
    assert fused and all(t.c_kernel for _, t in fused)
    names = " ".join(str(n.op.scalar_op) for n, _ in fused)
    assert "sigmoid" in names and "softplus" in names
    assert any(n.op.inplace_pattern for n, _ in fused)  # the Gemv output is reused in place
    x = (RNG.randn(64, 20) * 3).astype("float32")
    y = (RNG.rand(64) < 0.5).astype("float32")
    x0, y0 = x.copy(), y.copy()
    got = f(x, y)
    assert spy and all(spy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    expected = _logreg_numpy(x, y, w, b)
    assert got[0].dtype == bool and got[1].dtype == got[2].dtype == np.float32
    margin = np.abs(x.astype("float64") @ w + b) > 1e-4
    np.testing.assert_array_equal(got[0][margin], expected[0][margin])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got[3], expected[3], rtol=1e-4, atol=1e-6)


def test_debugmode_on_fused_graphs():
    """DebugMode compares every call with the unrewritten graph, and checks destroy and
    view maps (the in-place C node included)."""
    with symgpu.config.change_flags(floatX="float32"):
        f, w, b = _logreg(mode="DebugMode")
    assert c_thunks(f)
    x = (RNG.randn(32, 20) * 2).astype("float32")
    y = (RNG.rand(32) < 0.5).astype("float32")
    got = f(x, y)
    np.testing.assert_allclose(got[1], _logreg_numpy(x, y, w, b)[1], rtol=1e-5, atol=1e-6)
    u, v = T.vector("u", dtype="float64"), T.vector("v", dtype="float64")
    g = symgpu.function([u, v], [T.sqrt(abs(u)) * v - T.log1p(v * v), T.maximum(u, v) // 3],
                        mode="DebugMode")
    assert c_thunks(g)
    a, c = RNG.randn(50), RNG.randn(50)
    r0, r1 = g(a, c)
    assert_close(r0, np.sqrt(np.abs(a)) * c - np.log1p(c * c), cancel=True)
    assert_same(r1, np.maximum(a, c) // 3)


# ----------------------------------------------------------------------------- fallbacks

def _exp_mul_add(ndim=1, dtype="float32"):
    x, y = (TensorType(dtype, (False,) * ndim)(n) for n in "xy")
    f = symgpu.function([x, y], T.exp(x) * y + 2)
    assert len(c_thunks(f)) == 1
    return f


def _exp_mul_add_numpy(a, b):
    return np.exp(a) * b + np.asarray(2, a.dtype)


def test_strided_inputs_are_packed_for_the_kernel(spy):
    """A strided view (a column block of a product, a transpose, a Fortran array) is copied
    C-contiguous and the kernel run on the copy, not the NumPy thunk: the first attempt
    refuses the layout (False), the packed one runs (True)."""
    f = _exp_mul_add()
    base = RNG.randn(20).astype("float32")
    other = RNG.randn(10).astype("float32")
    assert_close(f(base[::2], other), _exp_mul_add_numpy(base[::2], other), cancel=True)
    assert spy == [False, True]
    g = _exp_mul_add(ndim=2)
    m = RNG.randn(4, 6).astype("float32")
    n = RNG.randn(6, 4).astype("float32")
    assert_close(g(m.T, n), _exp_mul_add_numpy(m.T, n), cancel=True)
    assert_close(g(n, m.T), _exp_mul_add_numpy(n, m.T), cancel=True)
    fortran = np.asfortranarray(n)
    assert_close(g(fortran, n), _exp_mul_add_numpy(fortran, n), cancel=True)
    assert spy == [False, True] * 4
    assert_close(g(n, n), _exp_mul_add_numpy(n, n), cancel=True)  # C-contiguous: C at once
    assert spy[-2:] == [True, True]


def test_an_overwritten_strided_input_is_not_packed(spy):
    """A node writing its result into an input that is a strided view must write that view:
    packing it would leave it unwritten, so such a call takes the NumPy thunk."""
    from symgpu.tensor.c_elemwise import _packable_for
    a = np.ones((3, 4))[:, ::2]
    assert _packable_for(set())(a, np.ones(2)) and not _packable_for({0})(a, np.ones(2))
    assert not _packable_for(set())(np.ones(2), np.ones(2))


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0)])
def test_empty_arrays(shape):
    f = _exp_mul_add(ndim=len(shape))
    e = np.zeros(shape, "float32")
    got = f(e, e)
    assert got.shape == shape and got.dtype == np.float32


def test_zero_d_inputs():
    x, y = T.scalar("x", dtype="float64"), T.scalar("y", dtype="float64")
    f = symgpu.function([x, y], T.exp(x) * y + 2)
    got = f(0.5, -3.0)
    ref = _exp_mul_add_numpy(np.float64(0.5), np.float64(-3.0))
    assert np.ndim(got) == 0 and np.asarray(got).dtype == np.float64
    assert_close(np.asarray(got), np.asarray(ref), cancel=True)
    # a 0-d scalar with a matrix, and with an empty matrix
    m, s = T.matrix("m", dtype="float64"), T.scalar("s", dtype="float64")
    g = symgpu.function([m, s], T.exp(m) * s + 2)
    assert len(c_thunks(g)) == 1
    a = RNG.randn(3, 4)
    assert_close(g(a, 1.5), np.exp(a) * 1.5 + 2, cancel=True)
    assert g(np.zeros((0, 4)), 1.5).shape == (0, 4)


def test_partly_broadcast_inputs_run_the_broadcasting_kernel():
    r, m = T.row("r", dtype="float32"), T.matrix("m", dtype="float32")
    f = symgpu.function([r, m], T.exp(r) * m + 2)
    fused = fused_thunks(f)
    assert fused and all(getattr(t, "c_kernel", None) for _, t in fused)
    a = RNG.randn(1, 5).astype("float32")
    b = RNG.randn(3, 5).astype("float32")
    np.testing.assert_allclose(f(a, b), _exp_mul_add_numpy(a, b), rtol=RTOL["float32"])


BROADCAST_CASES = [
    # (patterns, shape): every mix of full, row, column, scalar-like in 2 to 4 dimensions
    ([(False, False), (True, False), (False, True)], (6, 37)),
    ([(False, True), (True, False)], (5, 4)),
    ([(True, False, True), (False, False, False), (False, True, False)], (3, 4, 19)),
    ([(False, False, False, True), (True, True, False, False), (True, True, True, True)],
     (2, 3, 4, 1)),
    ([(False, False, True, False), (False, True, False, False)], (2, 3, 5, 17)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("patterns,shape", BROADCAST_CASES)
def test_broadcast_patterns_match_numpy(patterns, shape, dtype):
    ins = [T.TensorType(dtype, p)(f"x{k}") for k, p in enumerate(patterns)]
    total = ins[0]
    for v in ins[1:]:
        total = total * 0.5 + T.exp(v) - v
    out = T.tanh(total) * ins[-1] + 1
    f = symgpu.function(ins, out)
    assert c_thunks(f), "the broadcasting kernel was not used"
    values = [RNG.randn(*[1 if b else n for b, n in zip(p, shape)]).astype(dtype)
              for p in patterns]
    expect = values[0]
    for v in values[1:]:
        expect = expect * 0.5 + np.exp(v) - v
    expect = np.tanh(expect) * values[-1] + 1
    np.testing.assert_allclose(f(*values), expect, rtol=RTOL[dtype] * 4, atol=1e-6)


def test_broadcast_kernel_fallbacks_and_errors(spy):
    r, m = T.row("r", dtype="float64"), T.matrix("m", dtype="float64")
    f = symgpu.function([r, m], T.exp(r) * m + 2)
    a, b = RNG.randn(1, 5), RNG.randn(3, 5)
    expect = np.exp(a) * b + 2
    calls = len(spy)
    rtol = RTOL["float64"]
    np.testing.assert_allclose(f(a, np.asfortranarray(b)), expect, rtol=rtol)   # packed
    np.testing.assert_allclose(f(np.repeat(a, 2, axis=1)[:, ::2], b), expect, rtol=rtol)
    assert spy[calls:] == [False, True, False, True]
    np.testing.assert_allclose(f(a, b), expect, rtol=RTOL["float64"])
    assert spy[-1] is True
    with pytest.raises(ValueError):                    # 5 columns against 4: the usual error
        f(a, RNG.randn(3, 4))
    assert_same(f(a, np.zeros((0, 5))), np.zeros((0, 5)))


def test_five_dimensions_stay_on_numpy():
    pat = (False, True, False, False, False)
    x, y = T.TensorType("float32", (False,) * 5)("x"), T.TensorType("float32", pat)("y")
    f = symgpu.function([x, y], T.exp(x) * y + 1)
    assert not c_thunks(f)
    a = RNG.randn(2, 3, 2, 2, 2).astype("float32")
    b = RNG.randn(2, 1, 2, 2, 2).astype("float32")
    np.testing.assert_allclose(f(a, b), np.exp(a) * b + 1, rtol=1e-6)


@pytest.mark.parametrize("shapes", [((5,), (4,)), ((1,), (4,)), ((4,), (1,)), ((0,), (3,))])
def test_shape_mismatch_raises_as_without_c(shapes, spy, monkeypatch):
    x, y = T.vector("x", dtype="float32"), T.vector("y", dtype="float32")
    out = T.exp(x) * y + 2
    f = symgpu.function([x, y], out)
    assert len(c_thunks(f)) == 1
    monkeypatch.setattr(c_elemwise, "c_kernels_enabled", lambda: False)
    ref = symgpu.function([x, y], out)
    assert fused_thunks(ref) and not c_thunks(ref)
    a, b = (np.ones(s, "float32") for s in shapes)
    with pytest.raises(Exception) as with_c:
        f(a, b)
    with pytest.raises(Exception) as without_c:
        ref(a, b)
    assert type(with_c.value) is type(without_c.value)
    assert spy == [False]


@pytest.mark.parametrize("per_input", [1, 3])
def test_fused_nodes_of_many_arrays(per_input):
    """40 inputs and 40 or 120 outputs in one fused node: more arrays than the trampoline
    took at first (64); such nodes must run (in C or on NumPy), not fail at every call."""
    xs = [T.vector(f"x{i}", dtype="float64") for i in range(40)]
    outs = []
    for i in range(40):
        y = xs[(i + 1) % 40]
        outs += [T.exp(xs[i]) * y + 1, xs[i] * 2 - y, abs(xs[i] - 3 * y)][:per_input]
    f = symgpu.function(xs, outs)
    ((node, _),) = fused_thunks(f)
    assert len(node.inputs) + len(node.outputs) == 40 * (per_input + 1)
    vals = [RNG.randn(5) for _ in range(40)]
    got = f(*vals)
    for i in range(40):
        a, b = vals[i], vals[(i + 1) % 40]
        for k, e in enumerate([np.exp(a) * b + 1, a * 2 - b, np.abs(a - 3 * b)][:per_input]):
            assert_close(got[per_input * i + k], e, f"output {per_input * i + k}", cancel=True)


# ----------------------------------------------------------------------------- in place

def test_in_place_node_is_right_and_inputs_are_kept(spy):
    x, y = T.matrix("x", dtype="float64"), T.vector("y", dtype="float64")
    f = symgpu.function([x, y], T.tanh(x.sum(axis=0)) * y + 1)
    ((node, thunk),) = fused_thunks(f)
    assert node.op.inplace_pattern and thunk.c_kernel
    a, b = RNG.randn(6, 9), RNG.randn(9)
    a0, b0 = a.copy(), b.copy()
    got = f(a, b)
    assert spy == [True]
    assert_close(got, np.tanh(a.sum(axis=0)) * b + 1, cancel=True)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    again = f(a * 2, b)
    assert_close(got, np.tanh(a.sum(axis=0)) * b + 1, cancel=True)  # the first result is kept
    assert_close(again, np.tanh((2 * a).sum(axis=0)) * b + 1, cancel=True)


def test_inputs_are_never_overwritten(spy):
    x, y = T.vector("x", dtype="float32"), T.vector("y", dtype="float32")
    f = symgpu.function([x, y], [T.exp(x) * y + 2, T.sqrt(abs(x)) - y])
    assert not any(n.op.inplace_pattern for n, _ in fused_thunks(f))
    a, b = RNG.randn(11).astype("float32"), RNG.randn(11).astype("float32")
    a0, b0 = a.copy(), b.copy()
    r0, r1 = f(a, b)
    assert spy == [True]
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    assert not np.shares_memory(r0, a) and not np.shares_memory(r1, b)
    assert_close(r0, _exp_mul_add_numpy(a, b), cancel=True)
    assert_same(r1, np.sqrt(np.abs(a)) - b)


def test_in_place_composite_node_linked_directly():
    """An Elemwise(Composite) with an inplace_pattern: the output is the input's buffer."""
    comp = composite(["float64", "float64"], [("mul", [0, 1]), ("exp", [2])], [3])
    x, y = TensorType("float64", (False,))(), TensorType("float64", (False,))()
    (out,) = [Elemwise(comp, {0: 0})(x, y)]
    fg = FunctionGraph([x, y], [out], clone=False)
    a, b = RNG.randn(8), RNG.randn(8)
    expected = np.exp(a * b)
    storage = {x: [a], y: [b]}
    vm = link(fg, storage)
    assert vm.thunks[0].c_kernel
    vm()
    assert storage[out][0] is a
    assert_close(a, expected)


# ----------------------------------------------------------------------------- bugs found and fixed

def test_clip_with_a_nan_bound():
    x, lo, hi = (T.vector(n, dtype="float64") for n in ("x", "lo", "hi"))
    f = symgpu.function([x, lo, hi], T.clip(x * 2, lo, hi) + 1)
    assert c_thunks(f)
    a = np.array([1.0, 1.0, 1.0])
    lo_v, hi_v = np.array([np.nan, 0.0, 0.0]), np.array([2.0, np.nan, 0.5])
    assert_same(f(a, lo_v, hi_v), np.clip(a * 2, lo_v, hi_v) + 1)


def test_round_of_large_int64_on_the_numpy_fallback():
    x = T.vector("x", dtype="int64")
    f = symgpu.function([x], T.round(x) + 1)
    assert c_thunks(f)
    a = np.array([2 ** 53 + 1, 2 ** 62 + 1, -(2 ** 63) + 1], "int64")
    assert_same(f(a), np.round(a) + 1)  # the C loop
    strided = np.repeat(a, 2)[::2]
    assert_same(f(strided), np.round(a) + 1)  # the NumPy fallback


def test_uint64_int64_comparison_is_exact():
    big = np.array([2 ** 53 + 1], "uint64")
    if np.equal(big, np.array([2 ** 53], "int64"))[0]:
        pytest.skip("this NumPy compares uint64 with int64 in float64 too")
    x, y = T.vector("x", dtype="uint64"), T.vector("y", dtype="int64")
    f = symgpu.function([x, y], [T.eq(x * 1, y), T.lt(y, x * 1)])
    assert not c_thunks(f)  # C would compare them as doubles: the node stays on NumPy
    a = np.array([2 ** 53 + 1, 2 ** 63 + 1], "uint64")
    b = np.array([2 ** 53, -1], "int64")
    eq, lt = f(a, b)
    assert_same(eq, np.equal(a, b))
    assert_same(lt, np.less(b, a))


def test_an_elemwise_of_constants_alone_runs():
    """Constants fused after constant folding (shape expressions a later rewrite builds) make
    an Elemwise with no inputs: it runs without the C kernel (no input to take a shape
    from; it used to fail with a NameError in the generated thunk)."""
    from symgpu.compile.mode import Mode
    one, four = T.constant(np.int64(1)), T.constant(np.int64(4))
    s = (one + four) - one
    mode = Mode(optimizer="fast_run").excluding_tags("constant_folding")
    f = symgpu.function([], [s, s + 1], mode=mode)
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Elemwise)]
    assert not node.inputs
    assert c_elemwise.c_elemwise_thunk(node, {v: [None] for v in node.outputs}, None) is None
    for _ in range(2):
        assert [int(v) for v in f()] == [4, 5]
