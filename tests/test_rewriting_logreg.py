"""The GPU tutorial's logistic regression: Gemv on the CPU, a small training graph, finite
and correct training, same values in DebugMode, quick compile."""
import time

import numpy as np
import pytest
from scipy.special import expit

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from test_rewriting_helpers import raise_on_rewrite_errors  # noqa: F401

N, FEATS = 400, 784


def build(mode=None, seed=0):
    rng = np.random.RandomState(seed)
    D = (rng.randn(N, FEATS).astype("float32"), rng.randint(size=N, low=0, high=2).astype("float32"))
    x, y = T.matrix("x"), T.vector("y")
    w = shared(rng.randn(FEATS).astype("float32"), name="w")
    b = shared(np.asarray(0.0, dtype="float32"), name="b")
    p_1 = 1 / (1 + T.exp(-T.dot(x, w) - b))
    prediction = p_1 > 0.5
    xent = -y * T.log(p_1) - (1 - y) * T.log(1 - p_1)
    cost = xent.mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    t0 = time.perf_counter()
    train = function([x, y], [prediction, xent], updates={w: w - 0.01 * gw, b: b - 0.01 * gb},
                     name="train", mode=mode)
    compile_s = time.perf_counter() - t0
    predict = function([x], prediction, name="predict", mode=mode)
    return train, predict, D, w, b, compile_s


@pytest.fixture
def floatx32():
    with symgpu.config.change_flags(floatX="float32"):
        yield


def test_used_the_cpu_and_at_most_12_nodes(floatx32):
    train, predict, D, w, b, _ = build()
    topo = train.maker.fgraph.toposort()
    assert any(n.op.__class__.__name__ in ["Gemv", "CGemv", "Gemm", "CGemm"] for n in topo)
    assert len(topo) <= 12, [str(n) for n in topo]
    assert any(isinstance(n.op, T.Elemwise) for n in topo)


def test_training_matches_float64_numpy(floatx32):
    train, predict, D, w, b, _ = build()
    x, yv = D[0].astype("float64"), D[1].astype("float64")
    wv, bv = w.get_value().astype("float64"), 0.0
    for _ in range(25):
        pred, err = train(*D)
        assert np.all(np.isfinite(err))
        p = expit(x @ wv + bv)
        g = (p - yv) / N
        wv, bv = wv - 0.01 * (x.T @ g + 0.02 * wv), bv - 0.01 * g.sum()
    np.testing.assert_allclose(w.get_value(), wv, atol=2e-4)
    assert abs(float(b.get_value()) - bv) < 1e-5
    z = x @ wv + bv
    np.testing.assert_array_equal(predict(D[0]), z > 0)


def test_debugmode_agrees(floatx32):
    train, predict, D, w, b, _ = build(mode="DebugMode")
    for _ in range(3):
        train(*D)
    train2, _, D2, w2, b2, _ = build()
    for _ in range(3):
        train2(*D2)
    np.testing.assert_allclose(w.get_value(), w2.get_value(), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # FAST_COMPILE keeps the unstable log(p)
def test_fast_compile_also_trains(floatx32):
    train, predict, D, w, b, _ = build(mode="FAST_COMPILE", seed=1)
    assert not any(n.op.__class__.__name__ == "Gemv" for n in train.maker.fgraph.toposort())
    train(*D)
