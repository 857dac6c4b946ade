"""Theano 1.0.5 names added for issue 31 (code written for Theano runs unchanged): each
behaves as Theano's does."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T


# --- _tensor_py_operators -------------------------------------------------------------------

def test_tensor_py_operators_is_the_mixin_of_variables_constants_and_shared():
    x = T.dmatrix("x")
    c = T.constant(np.ones(2))
    s = symgpu.shared(np.zeros(3))
    for v in (x, c, s, x + 1):
        assert isinstance(v, T._tensor_py_operators)
    from symgpu import sparse as sparse_mod
    sparse = sparse_mod.csr_matrix("s")
    assert not isinstance(sparse, T._tensor_py_operators)
    assert isinstance(T._tensor_py_operators.ndim, property)
    assert isinstance(T._tensor_py_operators.dtype, property)
    assert "TensorType" in T._tensor_py_operators.type.__doc__
    assert (x.ndim, x.dtype, x.type) == (2, "float64", T.TensorType("float64", (False, False)))
    # the operators live on the mixin, as Theano's
    assert "__add__" in vars(T._tensor_py_operators)
    import symgpu.tensor.var as var  # Theano's module path
    assert var._tensor_py_operators is T._tensor_py_operators


# --- tensor.basic.choose --------------------------------------------------------------------

def test_choose_is_importable_from_tensor_basic():
    from symgpu.tensor.basic import choose
    assert choose is T.choose
    a = T.lvector()
    c = T.dmatrix()
    f = symgpu.function([a, c], choose(a, c, mode="wrap"))
    idx, ch = np.array([0, 3, 2]), np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(f(idx, ch), np.choose(idx, ch, mode="wrap"))


# --- Mode.requiring -------------------------------------------------------------------------

@pytest.fixture
def two_passes():
    """Two passes FAST_RUN runs, one of them also tagged `s16_required`; each records its
    runs. Removed from the pass table afterwards."""
    from symgpu.graph.rewriting.db import optdb
    runs: list[str] = []
    optdb.register("s16_tagged", lambda fg: runs.append("tagged"), 49.5, "fast_run",
                   "s16_required")
    optdb.register("s16_plain", lambda fg: runs.append("plain"), 49.6, "fast_run")
    yield runs
    optdb.entries = [e for e in optdb.entries if e.name not in ("s16_tagged", "s16_plain")]


def test_mode_requiring_runs_only_the_passes_with_the_tag(two_passes):
    from symgpu.compile.mode import Mode
    x = T.dvector("x")
    mode = Mode("FAST_RUN")
    req = mode.requiring("s16_required")
    assert isinstance(req, Mode) and req is not mode
    assert [n for n, _ in req.passes()] == ["s16_tagged"]
    assert mode.requiring_tags == () and req.requiring_tags == ("s16_required",)
    f = symgpu.function([x], x * 2 + 1, mode=req)
    assert two_passes == ["tagged"]
    np.testing.assert_allclose(f(np.arange(3.0)), np.arange(3.0) * 2 + 1)
    two_passes.clear()
    symgpu.function([x], x * 3, mode=mode)  # the original mode is unchanged: both run
    assert two_passes == ["tagged", "plain"]
    # including/excluding keep what is required; excluding still wins
    assert [n for n, _ in req.including("merge").passes()] == ["s16_tagged"]
    assert req.excluding("s16_tagged").passes() == []


# --- Function.free --------------------------------------------------------------------------

def test_function_free_empties_the_computed_cells_and_the_function_still_runs():
    from symgpu.config import config
    from symgpu.graph.basic import Constant
    x = T.dvector("x")
    s = symgpu.shared(np.array(2.0), name="s")
    ys, _ = symgpu.scan(lambda v, acc: acc + T.exp(v) * s, sequences=[x],
                        outputs_info=[T.constant(0.0)])
    with config.change_flags(allow_gc=False):
        f = symgpu.function([x], [ys[-1], (x * s).sum()])
    want = [2 * np.exp([0.0, 1.0, 2.0]).sum(), 6.0]
    np.testing.assert_allclose(f(np.arange(3.0)), want)
    vm = f.vm
    inputs = set(f.maker.fgraph.inputs)
    computed = [v for v in vm.storage_map if v not in inputs and not isinstance(v, Constant)]
    assert any(vm.storage_map[v][0] is not None for v in computed)  # allow_gc off: kept
    scan_ops = [n.op for n in vm.nodes if hasattr(n.op, "inner")]
    assert scan_ops and scan_ops[0].inner.vm is not None
    inner_vm = scan_ops[0].inner.vm
    f.free()
    assert all(vm.storage_map[v][0] is None for v in computed)
    assert all(cell[0] is None for v, cell in inner_vm.storage_map.items()
               if v not in set(inner_vm.fgraph.inputs) and not isinstance(v, Constant))
    assert s.get_value() == 2.0  # shared values stay
    np.testing.assert_allclose(f(np.arange(3.0)), want)
    np.testing.assert_allclose(f(np.ones(2)), [4 * np.e, 4.0])


# --- poisson --------------------------------------------------------------------------------

def test_random_streams_poisson_shape_dtype_mean_seed_and_updates():
    from symgpu.tensor.shared_randomstreams import RandomStreams
    rs = RandomStreams(seed=7)
    x = rs.poisson((2000,), lam=4.0)
    y = rs.poisson(size=(3, 4), lam=0.5, dtype="int32")
    f = symgpu.function([], [x, y])
    state0 = x.rng.get_value().copy()
    a, b = f()
    assert a.shape == (2000,) and a.dtype == np.int64 and b.shape == (3, 4)
    assert b.dtype == np.int32
    assert abs(a.mean() - 4.0) < 0.25 and abs(a.var() - 4.0) < 0.6 and a.min() >= 0
    assert not np.array_equal(x.rng.get_value(), state0)   # the update advanced the state
    a2, _ = f()
    assert not np.array_equal(a, a2)
    again = RandomStreams(seed=7)
    g = symgpu.function([], again.poisson((2000,), lam=4.0))
    np.testing.assert_array_equal(g(), a)                    # same seed: the same numbers
    lam = T.dvector("lam")                                   # symbolic lam, no size
    h = symgpu.function([lam], RandomStreams(1).poisson(lam=lam))
    out = h(np.array([0.0, 1e-9, 50.0]))
    assert out.shape == (3,) and out[0] == 0 and abs(out[2] - 50) < 40
    with pytest.raises(ValueError):
        h(np.array([-1.0]))


def test_raw_random_poisson_returns_the_new_state_and_the_draw():
    from symgpu.tensor import raw_random
    st = raw_random.philox_state(seed=3)
    new, draw = raw_random.poisson(st, size=(5000,), lam=2.0, ndim=1)
    f = symgpu.function([], [new, draw])
    n1, d1 = f()
    n2, d2 = f()                    # no update given: the same state, the same numbers
    np.testing.assert_array_equal(d1, d2)
    assert not np.array_equal(n1, st.get_value())
    assert d1.dtype == np.int64 and abs(d1.mean() - 2.0) < 0.1
    ref = np.random.RandomState(0).poisson(2.0, 5000)       # NumPy's distribution
    assert abs(np.mean(d1 == 0) - np.mean(ref == 0)) < 0.03
    with pytest.raises(ValueError):
        raw_random.poisson(st, size=(3,), lam=1.0, ndim=2)


# --- real, imag, angle ----------------------------------------------------------------------

def test_real_imag_angle_match_numpy_for_complex_and_real_inputs():
    x = T.dvector("x")
    xf = T.fvector("xf")
    i = T.lvector("i")
    z = T.tensor(dtype="complex128", shape=(False,))
    zf = T.tensor(dtype="complex64", shape=(False,))
    outs = [T.real(z), T.imag(z), T.angle(z), T.real(zf), T.imag(zf), T.angle(zf),
            T.real(x), T.imag(x), T.angle(x), T.real(xf), T.angle(xf), T.real(i), T.imag(i),
            T.angle(i)]
    f = symgpu.function([x, xf, i, z, zf], outs)
    xv = np.array([-1.0, 0.0, -0.0, 2.5, np.nan])
    iv = np.array([-3, 0, 4])
    zv = np.array([1 + 2j, -3 - 1j, 0j, -2 + 0j, 1j])
    got = f(xv, xv.astype("float32"), iv, zv, zv.astype("complex64"))
    want = [np.real(zv), np.imag(zv), np.angle(zv), np.real(zv.astype("complex64")),
            np.imag(zv.astype("complex64")), np.angle(zv.astype("complex64")),
            xv, np.zeros(5), np.angle(xv), xv.astype("float32"), np.angle(xv), iv,
            np.zeros(3, dtype="int64"), np.angle(iv)]
    dtypes = ["float64", "float64", "float64", "float32", "float32", "float64", "float64",
              "float64", "float64", "float32", "float64", "int64", "int64", "float64"]
    for g, w, d in zip(got, want, dtypes):
        assert g.dtype == d
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert got[8][0] == np.pi and got[8][2] == np.pi  # -1 and -0.0: pi, as NumPy


def test_real_imag_angle_gradients_of_real_inputs():
    x = T.dvector("x")
    g = symgpu.function([x], T.grad((3 * T.real(x) + T.imag(x) + T.angle(x)).sum(), x))
    np.testing.assert_allclose(g(np.array([-1.0, 0.5, 2.0])), [3.0, 3.0, 3.0])
    i = T.lvector("i")
    gi = symgpu.function([x, i], T.grad((T.real(i) + T.angle(i)).sum() + x.sum(), i),
                         on_unused_input="ignore")
    np.testing.assert_array_equal(gi(np.ones(1), np.array([1, -2])), [0, 0])
