"""Theano behaviours the classic Theano programs (lisa-lab's DeepLearningTutorials, run by
tools/theano_programs.py) rely on: each test is one fix that a program needed to run unchanged.
"""
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad

RNG = np.random.default_rng(31)


# ------------------------------------------------------- theano.tensor.xlogx (rnnrbm.py)

def test_xlogx_module_is_theanos_path():
    """rnnrbm.py calls ``T.xlogx.xlogy0`` after ``import theano.tensor as T``: the attribute
    is Theano's module, and ``import theano.tensor.xlogx`` gives the same module."""
    import importlib
    saved = sys.modules.get("theano")
    sys.modules["theano"] = symgpu
    try:
        module = importlib.import_module("theano.tensor.xlogx")
    finally:
        if saved is None:
            sys.modules.pop("theano", None)
        else:
            sys.modules["theano"] = saved
    assert module is T.xlogx
    assert callable(T.xlogx.xlogx) and callable(T.xlogx.xlogy0)
    assert T.xlogx.scalar_xlogy0.spec.name == "xlogy0"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_xlogx_and_xlogy0_values_have_zero_log_zero(dtype):
    x, y = T.vector(dtype=dtype), T.vector(dtype=dtype)
    X = np.array([0.0, 0.0, 0.25, 1.0, 3.0, 0.5], dtype=dtype)
    Y = np.array([0.0, 0.7, 0.5, 2.0, 0.1, 0.0], dtype=dtype)
    f = function([x, y], [T.xlogx.xlogx(x), T.xlogx.xlogy0(x, y)])
    got_xx, got_xy = f(X, Y)
    with np.errstate(divide="ignore", invalid="ignore"):
        want_xx = np.where(X == 0, 0, X * np.log(X)).astype(dtype)
        want_xy = np.where(X == 0, 0, X * np.log(Y)).astype(dtype)
    assert got_xx.dtype == got_xy.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got_xx, want_xx, rtol=1e-6)
    np.testing.assert_allclose(got_xy, want_xy, rtol=1e-6)   # 0 * log(0) is 0, x log 0 -inf
    assert got_xy[0] == 0 and got_xy[-1] == -np.inf


def test_xlogx_of_integers_is_float():
    i = T.ivector()
    out = T.xlogx.xlogx(i)
    assert out.dtype == "float64"
    np.testing.assert_allclose(function([i], out)(np.array([0, 1, 2], dtype="int32")),
                               [0.0, 0.0, 2 * np.log(2)])


def test_xlogx_and_xlogy0_gradients():
    """Theano's gradients: d xlogx = 1 + log x; d xlogy0 = (log y, x / y)."""
    X = RNG.uniform(0.2, 2.0, 6)
    Y = RNG.uniform(0.2, 2.0, 6)
    verify_grad(T.xlogx.xlogx, [X])
    verify_grad(T.xlogx.xlogy0, [X, Y])
    x, y = T.dvector(), T.dvector()
    gx, gy = symgpu.grad(T.xlogx.xlogy0(x, y).sum(), [x, y])
    vx, vy = function([x, y], [gx, gy])(np.array([0.0, 2.0]), np.array([0.5, 4.0]))
    np.testing.assert_allclose(vx, np.log([0.5, 4.0]))
    np.testing.assert_allclose(vy, [0.0, 0.5])


def test_rnnrbm_pseudo_likelihood_monitor():
    """rnnrbm.py's monitor: xlogy0(v, p) + xlogy0(1 - v, 1 - p) of binary v, where p can be
    exactly 0 or 1 on the units v does not take: finite, the Bernoulli log-likelihood."""
    v, p = T.dmatrix(), T.dmatrix()
    monitor = (T.xlogx.xlogy0(v, p) + T.xlogx.xlogy0(1 - v, 1 - p)).sum() / v.shape[0]
    V = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    P = np.array([[1.0, 0.0, 0.3], [0.2, 0.0, 0.9]])
    got = function([v, p], monitor)(V, P)
    want = (np.log(0.3) + np.log(0.8) + np.log(0.9)) / 2
    np.testing.assert_allclose(got, want)


def test_xlogy0_lifts_to_the_gpu(vgpu):
    """A row of the scalar table: fused into a GPU elementwise kernel, no host node."""
    from symgpu.config import config
    x, y = T.fvector("x"), T.fvector("y")
    with config.change_flags(assert_no_cpu_op="raise"):
        f = function([x, y], T.xlogx.xlogy0(x, y) + T.xlogx.xlogx(y))
    names = {type(n.op).__name__ for n in f.maker.fgraph.apply_nodes}
    assert "GpuElemwise" in names, names
    assert "Elemwise" not in names, names


# ------------------------------------------------ softmax of a vector is a row (rnnslu.py)

@pytest.mark.parametrize("fn,ref", [
    (lambda v: T.nnet.softmax(v), lambda a: np.exp(a) / np.exp(a).sum()),
    (lambda v: T.nnet.log_softmax(v), lambda a: a - np.log(np.exp(a).sum())),
])
def test_softmax_of_a_vector_is_a_row(fn, ref):
    """Theano 1.0 pads a vector to a 1 x n row, and Theano code relies on it."""
    v = T.dvector()
    out = fn(v)
    assert out.ndim == 2 and out.broadcastable == (True, False)
    V = RNG.normal(size=7)
    got = function([v], out)(V)
    assert got.shape == (1, 7)
    np.testing.assert_allclose(got[0], ref(V), rtol=1e-12)


def test_softmax_of_a_vector_over_all_elements_stays_a_vector():
    v = T.dvector()
    assert T.nnet.softmax(v, axis=None).ndim == 1
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        T.nnet.softmax(v, axis=1)


def test_softmax_of_a_vector_gradient():
    w = RNG.normal(size=(1, 5))
    verify_grad(lambda v: (T.nnet.softmax(v) * T.constant(w)).sum(), [RNG.normal(size=5)])


def test_scan_step_returning_softmax_of_a_vector_stacks_rows():
    """rnnslu.py's Elman network: the step returns softmax(dot(h_t, w) + b) of a vector h_t,
    scan stacks (n, 1, classes) and the program reads ``s[:, 0, :]``."""
    x = T.dmatrix("x")
    wx, wh = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 4))
    w, h0 = RNG.normal(size=(4, 2)), np.zeros(4)

    def recurrence(x_t, h_tm1):
        h_t = T.nnet.sigmoid(T.dot(x_t, wx) + T.dot(h_tm1, wh))
        s_t = T.nnet.softmax(T.dot(h_t, w))
        return [h_t, s_t]

    [h, s], _ = symgpu.scan(fn=recurrence, sequences=x, outputs_info=[T.constant(h0), None],
                            n_steps=x.shape[0])
    p = s[:, 0, :]
    y = T.argmax(p, axis=1)
    X = RNG.normal(size=(5, 3))
    got_p, got_y = function([x], [p, y])(X)
    hs, want = h0, []
    for row in X:
        hs = 1 / (1 + np.exp(-(row @ wx + hs @ wh)))
        e = np.exp(hs @ w)
        want.append(e / e.sum())
    np.testing.assert_allclose(got_p, np.array(want), rtol=1e-10)
    np.testing.assert_array_equal(got_y, np.argmax(want, axis=1))


# ------------------------- emb[idxs] with an integer matrix (rnnslu.py's word windows)

def test_nd_integer_index_gathers_like_numpy():
    """rnnslu.py's ``emb[idxs].reshape((n, de * cs))`` for an int matrix of word windows, -1
    (the padding word) included."""
    emb, idxs = T.dmatrix("emb"), T.imatrix("idxs")
    f = function([emb, idxs], [emb[idxs].reshape((idxs.shape[0], -1)), emb[idxs]])
    E = RNG.normal(size=(6, 3))
    I = np.array([[0, 5, -1], [2, 2, 3]], dtype="int32")
    got_flat, got = f(E, I)
    np.testing.assert_array_equal(got, E[I])
    np.testing.assert_array_equal(got_flat, E[I].reshape(2, -1))


@pytest.mark.parametrize("set_instead_of_inc", [False, True])
def test_nd_integer_index_inc_and_set_match_numpy(set_instead_of_inc):
    """inc (np.add.at: repeated indices add up) and set (the last write wins) through an int
    matrix, with values given in the index's shape or broadcast."""
    x, y, r, idxs = T.dmatrix("x"), T.dtensor3("y"), T.drow("r"), T.imatrix("idxs")
    write = T.set_subtensor if set_instead_of_inc else T.inc_subtensor
    f = function([x, y, r, idxs], [write(x[idxs], y), write(x[idxs], r)])
    X, I = RNG.normal(size=(5, 3)), np.array([[1, 4], [1, 0], [4, 4]], dtype="int32")
    Y, R = RNG.normal(size=(3, 2, 3)), RNG.normal(size=(1, 3))
    want_y, want_r = X.copy(), X.copy()
    if set_instead_of_inc:
        for k, i in enumerate(I.ravel()):
            want_y[i] = Y.reshape(-1, 3)[k]
            want_r[i] = R[0]
    else:
        np.add.at(want_y, I, Y)
        np.add.at(want_r, I, R)
    got_y, got_r = f(X, Y, R, I)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-14)
    np.testing.assert_allclose(got_r, want_r, rtol=1e-14)


def test_gradient_of_an_embedding_lookup_by_word_windows():
    emb, idxs = T.dmatrix("emb"), T.imatrix("idxs")
    w = T.constant(RNG.normal(size=(2, 6)))
    cost = (emb[idxs].reshape((idxs.shape[0], 6)) * w).sum()
    g = function([emb, idxs], symgpu.grad(cost, emb))
    E, I = RNG.normal(size=(4, 3)), np.array([[0, 3], [3, 3]], dtype="int32")
    want = np.zeros_like(E)
    np.add.at(want, I, w.data.reshape(2, 2, 3))
    np.testing.assert_allclose(g(E, I), want, rtol=1e-14)


def test_rnnslu_embedding_step_runs_on_the_gpu(vgpu):
    """rnnslu.py's lookup ``emb[idxs].reshape((n, de * cs))`` and its SGD update: gathered
    and scattered on the device, no host advanced-indexing node."""
    from symgpu.config import config
    emb = symgpu.shared(np.zeros((30, 4), dtype="float32"), name="emb")
    idxs = T.imatrix("idxs")
    x = emb[idxs].reshape((idxs.shape[0], 4 * 3))
    cost = T.sqr(x).sum()
    with config.change_flags(assert_no_cpu_op="raise"):
        f = function([idxs], cost, updates={emb: emb - 0.1 * symgpu.grad(cost, emb)})
    names = {type(n.op).__name__ for n in f.maker.fgraph.apply_nodes}
    assert any(n.startswith("GpuAdvancedSubtensor") for n in names), names
    assert any(n.startswith("GpuAdvancedIncSubtensor") for n in names), names
    assert not names & {"AdvancedSubtensor", "AdvancedIncSubtensor"}, names
