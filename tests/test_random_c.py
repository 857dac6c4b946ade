"""The compiled Philox generator (symgpu/tensor/random/philox_c.py) against the NumPy reference
(philox.sample): bitwise the same uniforms and normals for every float dtype, counters that
carry into the high word or wrap, sizes that end inside a block or a chunk; and the graph op
using it only where C is allowed (a compiler, not FAST_COMPILE), with or without the Python-C
runtime of the elemwise kernels; `sample` falling back to NumPy without the library."""
import warnings

import numpy as np
import pytest

import symgpu
from symgpu import function
from symgpu.link import c_runtime, cc
from symgpu.tensor import c_elemwise
from symgpu.tensor.random import PhiloxSample, RandomStreams, philox, philox_c

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
    """The draws made through philox_c's samplers (`sampler`, which `sample` and the op's C
    thunks bind) while the test runs: (dist, dtype, shape) each."""
    calls, real = [], philox_c.sampler

    def spy(dist, dtype):
        draw = real(dist, dtype)

        def spied(state, shape):
            calls.append((dist, dtype, shape))
            return draw(state, shape)
        return spied
    monkeypatch.setattr(philox_c, "sampler", spy)
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


@needs_cc
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("dist", philox.DISTS)
def test_a_sampler_bound_once_draws_every_state_and_shape(dist, dtype):
    draw = philox_c.sampler(dist, dtype)
    for state in STATES[:4]:
        for shape in [(0,), (), (1,), (3, 5), (2, 0, 4), (16385,)]:
            same_bits(draw(state, shape), philox.sample(state, dist, dtype, shape))


def test_unknown_distributions_are_refused_once_where_the_op_or_sampler_is_made():
    with pytest.raises(ValueError, match="PhiloxSample: unknown distribution 'gamma'"):
        PhiloxSample("gamma", "float32")
    with pytest.raises(ValueError, match="philox sample: unknown distribution 'gamma'"):
        philox_c.sampler("gamma", "float32")
    with pytest.raises(ValueError, match="philox sample: unknown distribution 'gamma'"):
        philox.sample(STATES[0], "gamma", "float32", (3,))


def test_key_counter_is_what_the_draws_and_the_advance_read():
    state = np.array([0x12345678, 0x9ABCDEF0, 0xFFFFFFF0, 5], dtype=np.uint32)
    assert philox._key_counter(state) == (0x12345678, 0x9ABCDEF0, (5 << 32) | 0xFFFFFFF0)
    assert philox._key_counter(list(state)) == philox._key_counter(state)
    np.testing.assert_array_equal(philox.advance(state, 0x11),
                                  np.array([0x12345678, 0x9ABCDEF0, 1, 6], dtype=np.uint32))
    np.testing.assert_array_equal(philox.advance(STATES[3], 2),          # wraps at 2**64
                                  np.array([1, 2, 0, 0], dtype=np.uint32))
    # block b of a draw is philox(counter = ctr + b): the words _block_words gives
    words = np.stack([w.astype(np.uint32) for w in philox._block_words(STATES[1], 0, 2)], axis=-1)
    ctrs = np.array([[0xFFFFFFFF, 0, 0, 0], [0, 1, 0, 0]], dtype=np.uint32)
    np.testing.assert_array_equal(words, philox.philox4x32(ctrs, STATES[1][:2]))


@pytest.mark.parametrize("why", ["no compiler", "did not compile"])
def test_sample_without_the_library_is_the_numpy_draw(monkeypatch, why):
    """`philox_c.sample` is public: without the library it draws through philox.sample (the
    same numbers), and still refuses unknown distributions."""
    monkeypatch.setattr(philox_c, "_loaded", {})
    monkeypatch.setattr(philox_c, "_failed", why == "did not compile")
    with symgpu.config.change_flags(cxx="" if why == "no compiler" else symgpu.config.cxx):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert philox_c._kernels() is None
            for dist in philox.DISTS:
                for dtype in ["float16", "float32", "float64"]:
                    for state in STATES[:4]:
                        same_bits(philox_c.sample(state, dist, dtype, (3, 7)),
                                  philox.sample(state, dist, dtype, (3, 7)))
            with pytest.raises(ValueError, match="unknown distribution 'gamma'"):
                philox_c.sample(STATES[0], "gamma", "float32", (3,))
    assert philox_c._loaded == {}          # nothing was built


@needs_cc
def test_the_c_generator_needs_no_python_c_runtime(monkeypatch, c_calls):
    """A compiler without Python.h (no trampoline for the elemwise kernels) still draws
    through C: the library is plain C loaded with ctypes, so the runtime is not asked for."""
    asked = []

    def no_runtime():
        asked.append(True)
        return None
    monkeypatch.setattr(c_runtime, "runner", no_runtime)
    assert c_elemwise.c_kernels_allowed() and not c_elemwise.c_kernels_enabled()
    asked.clear()
    assert philox_c.enabled()
    c_draws = _draws()
    assert len(c_calls) == 4 and asked == []
    with symgpu.config.change_flags(cxx=""):
        assert not c_elemwise.c_kernels_allowed()
        numpy_draws = _draws()
    assert len(c_calls) == 4
    for c_call, numpy_call in zip(c_draws, numpy_draws):
        for a, b in zip(c_call, numpy_call):
            same_bits(a, b)
    with c_elemwise.allow_c_kernels(False):
        assert not c_elemwise.c_kernels_allowed() and not philox_c.enabled()


@needs_cc
def test_a_first_link_of_draws_does_not_build_the_runtime():
    """In a fresh process, compiling and running a graph of draws loads the Philox library
    only, not the Python-C trampoline of the elemwise kernels."""
    import os
    import subprocess
    import sys
    code = ("import functools, numpy as np, symgpu\n"
            "from symgpu.link import c_runtime\n"
            "from symgpu.tensor.random import RandomStreams, philox\n"
            "srng = RandomStreams(seed=11)\n"
            "f = symgpu.function([], srng.uniform((5, 3), dtype='float32'))\n"
            "draw = [t for t in f.vm.thunks if type(t.op).__name__ == 'PhiloxSample']\n"
            "assert len(draw) == 1 and 'draw' in draw[0].perform.keywords\n"
            "f()\n"
            "assert not c_runtime.is_loaded()\n"
            "print('ok')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(symgpu.__file__)))
    env = dict(os.environ, PYTHONPATH=root)   # not sys.path: a test may have put benchmarks/ on it
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
