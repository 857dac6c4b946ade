"""The compiled Philox generator (symgpu/tensor/random/philox_c.py) against the NumPy reference
(philox.sample): bitwise the same uniforms and normals for every float dtype, counters that
carry into the high word or wrap, sizes that end inside a block or a chunk; and the graph op
using it only where C kernels are enabled (a compiler, not FAST_COMPILE)."""
import warnings

import numpy as np
import pytest

import symgpu
from symgpu import function
from symgpu.link import cc
from symgpu.tensor.random import RandomStreams, philox, philox_c

needs_cc = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler (cxx flag)")

STATES = [
    np.array([0, 0, 0, 0], dtype=np.uint32),
    np.array([7, 9, 0xFFFFFFFF, 0], dtype=np.uint32),             # carry into ctr_hi
    np.array([0x12345678, 0x9ABCDEF0, 0xFFFFFFF0, 5], dtype=np.uint32),
    np.array([1, 2, 0xFFFFFFFE, 0xFFFFFFFF], dtype=np.uint32),    # wraps at 2**64
    *np.random.default_rng(0).integers(0, 2 ** 32, size=(4, 4), dtype=np.uint32),
]
SIZES = [0, 1, 2, 3, 5, 6, 7, 9, 1001, 16383, 16385, 40001]   # past a chunk of pairs too


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))


@needs_cc
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("dist", philox.DISTS)
def test_c_draws_are_bitwise_the_numpy_ones(dist, dtype):
    for state in STATES:
        for n in SIZES:
            same_bits(philox_c.sample(state, dist, dtype, (n,)),
                      philox.sample(state, dist, dtype, (n,)))


@needs_cc
def test_c_draw_shapes_and_rejects_unknown_distributions():
    state = STATES[2]
    same_bits(philox_c.sample(state, "normal", "float32", (3, 0, 2)),
              philox.sample(state, "normal", "float32", (3, 0, 2)))
    same_bits(philox_c.sample(state, "uniform", "float64", (3, 5, 7)),
              philox.sample(state, "uniform", "float64", (3, 5, 7)))
    assert philox_c.sample(state, "uniform", "float32", ()).shape == ()
    with pytest.raises(ValueError, match="unknown distribution 'gamma'"):
        philox_c.sample(state, "gamma", "float32", (3,))


@pytest.fixture
def c_calls(monkeypatch):
    """The draws made through philox_c.sample while the test runs."""
    calls, real = [], philox_c.sample

    def spy(*args):
        calls.append(args[1:])
        return real(*args)
    monkeypatch.setattr(philox_c, "sample", spy)
    return calls


def _draws(mode=None):
    srng = RandomStreams(seed=11)
    f = function([], [srng.uniform((5, 3)), srng.normal((7,), dtype="float64")], mode=mode)
    return f(), f()


@needs_cc
def test_graphs_draw_through_c_and_match_numpy(c_calls):
    c_draws = _draws()
    assert len(c_calls) == 4                                   # two draws, two calls
    with symgpu.config.change_flags(cxx=""):
        numpy_draws = _draws()
    assert len(c_calls) == 4
    for c_call, numpy_call in zip(c_draws, numpy_draws):
        for a, b in zip(c_call, numpy_call):
            same_bits(a, b)


def test_numpy_path_without_compiler_or_under_fast_compile(c_calls):
    with symgpu.config.change_flags(cxx=""):
        assert not philox_c.enabled()
        _draws()
    _draws(mode="FAST_COMPILE")
    assert c_calls == []


@needs_cc
def test_a_compile_failure_warns_once_and_numpy_draws(monkeypatch, c_calls):
    def fail(*args, **kwargs):
        raise cc.CCompileError("the C compiler failed (exit 1)")
    monkeypatch.setattr(cc, "load_library", fail)
    monkeypatch.setattr(philox_c, "_loaded", {})
    monkeypatch.setattr(philox_c, "_failed", False)
    with pytest.warns(RuntimeWarning, match="C Philox generator did not compile"):
        assert not philox_c.enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not philox_c.enabled()
        _draws()
    assert c_calls == []
