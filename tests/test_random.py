"""RandomStreams on Philox4x32-10: the generator against Random123's known answers, the
distributions against scipy.stats (fixed seeds: deterministic), streams, seeding, default
updates, gradients through the parameters only."""
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient_check import verify_grad
from symgpu.sandbox.rng_mrg import MRG_RandomStreams
from symgpu.tensor.random import PhiloxAdvance, PhiloxSample, RandomStreams
from symgpu.tensor.random import philox
from symgpu.tensor.shared_randomstreams import RandomStreams as SharedRandomStreams

P = 1e-3  # a fixed seed either passes or fails for ever; this keeps false alarms unlikely


# ----------------------------------------------------------------------------- the generator

@pytest.mark.parametrize("ctr, key, want", [
    ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    ([0xffffffff] * 4, [0xffffffff] * 2, [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
    ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
     [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
])
def test_philox_known_answers(ctr, key, want):
    # Random123's kat_vectors for philox4x32 10 (the constants of cuRAND too)
    got = philox.philox4x32(np.array(ctr, dtype=np.uint32), key)
    assert [int(x) for x in got] == want


def test_philox_vectorised_equals_one_at_a_time():
    ctr = np.random.default_rng(0).integers(0, 2 ** 32, size=(7, 4), dtype=np.uint32)
    key = [0x12345678, 0x9abcdef0]
    whole = philox.philox4x32(ctr, key)
    for row, out in zip(ctr, whole):
        np.testing.assert_array_equal(philox.philox4x32(row, key), out)


def test_uniform_conversion_is_exact_and_open():
    w = np.array([[0, 0xffffffff, 0x80000000, 511]], dtype=np.uint32)
    u32 = philox.uniform_from_words(w, "float32")
    assert u32.dtype == np.float32
    np.testing.assert_array_equal(u32[0], np.float32([0.5, 2 ** 23 - 0.5, 2 ** 22 + 0.5, 0.5]) * np.float32(2 ** -23))
    assert 0 < u32.min() and u32.max() < 1
    u64 = philox.uniform_from_words(w, "float64")
    assert u64.shape == (1, 2) and 0 < u64.min() and u64.max() < 1
    assert u64[0, 0] == ((0xffffffff >> 12) + 0.5) * 2.0 ** -52


def test_layout_counter_blocks_and_advance():
    state = np.array([7, 9, 0xffffffff, 0], dtype=np.uint32)
    a = philox.sample(state, "uniform", "float32", (10,))      # 3 blocks
    after = philox.advance(state, philox.blocks(10, "float32"))
    assert list(after) == [7, 9, 2, 1]                          # carry into the high word
    b = philox.sample(after, "uniform", "float32", (4,))
    whole = philox.sample(state, "uniform", "float32", (16,))
    np.testing.assert_array_equal(whole[:10], a)
    np.testing.assert_array_equal(whole[12:], b)                # next draw starts a new block


# ----------------------------------------------------------------------------- distributions

def draw(var, n_calls=1):
    f = function([], var)
    return np.concatenate([np.ravel(f()) for _ in range(n_calls)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_uniform_ks(dtype):
    srng = RandomStreams(seed=1)
    x = draw(srng.uniform((100, 50), low=-2.0, high=3.0, dtype=dtype), 2)
    assert x.dtype == dtype and x.size == 10000
    assert x.min() > -2 and x.max() < 3
    assert stats.kstest(x, stats.uniform(-2, 5).cdf).pvalue > P


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_normal_ks_and_moments(dtype):
    srng = RandomStreams(seed=2)
    x = draw(srng.normal((4001,), avg=1.5, std=2.0, dtype=dtype), 3)
    assert x.dtype == dtype
    assert stats.kstest(x, stats.norm(1.5, 2.0).cdf).pvalue > P
    assert abs(x.mean() - 1.5) < 0.1 and abs(x.std() - 2.0) < 0.1


def test_binomial_chi_square():
    srng = RandomStreams(seed=3)
    x = draw(srng.binomial((5000,), n=6, p=0.3))
    assert x.dtype == np.int64
    observed = np.bincount(x, minlength=7)
    expected = stats.binom(6, 0.3).pmf(np.arange(7)) * x.size
    assert stats.chisquare(observed, expected).pvalue > P


def test_bernoulli_matches_p_per_element():
    srng = RandomStreams(seed=4)
    p = np.array([0.1, 0.5, 0.9])
    x = function([], srng.binomial((4000, 3), p=p, dtype="int8"))()
    assert x.dtype == np.int8 and set(np.unique(x)) <= {0, 1}
    np.testing.assert_allclose(x.mean(axis=0), p, atol=0.03)


@pytest.mark.parametrize("method, inclusive", [("integers", 0), ("random_integers", 1)])
def test_integers_chi_square(method, inclusive):
    srng = RandomStreams(seed=5)
    x = draw(getattr(srng, method)((6000,), low=-3, high=4))
    assert x.min() == -3 and x.max() == 3 + inclusive
    observed = np.bincount(x + 3)
    assert stats.chisquare(observed).pvalue > P


def test_multinomial_counts():
    srng = RandomStreams(seed=6)
    pv = np.array([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]])
    c = function([], srng.multinomial(n=3000, pvals=pv))()
    assert c.shape == (2, 3) and list(c.sum(axis=1)) == [3000, 3000] and c[1, 2] == 0
    for row, p in zip(c, pv):
        keep = p > 0
        assert stats.chisquare(row[keep], p[keep] * 3000).pvalue > P
    rows = function([], srng.multinomial(size=(4,), n=1, pvals=np.array([0.5, 0.5])))()
    assert rows.shape == (4, 2) and (rows.sum(axis=1) == 1).all()


def test_choice_with_and_without_replacement():
    srng = RandomStreams(seed=7)
    p = np.array([0.1, 0.2, 0.7])
    x = function([], srng.choice((6000,), a=3, p=p))()
    assert stats.chisquare(np.bincount(x, minlength=3), p * 6000).pvalue > P
    y = function([], srng.choice((5,), a=10, replace=False))()
    assert len(set(y)) == 5 and y.min() >= 0 and y.max() < 10
    items = np.array([10.0, 20.0, 30.0])
    z = function([], srng.choice((2, 2), a=items))()
    assert z.shape == (2, 2) and set(np.unique(z)) <= set(items)
    w = function([], srng.choice((3,), a=3, replace=False, p=np.array([0.2, 0.3, 0.5])))()
    assert sorted(w) == [0, 1, 2]


def test_permutation_is_a_permutation_and_uniform():
    srng = RandomStreams(seed=8)
    f = function([], srng.permutation((3000,), n=3))
    x = f()
    assert x.shape == (3000, 3) and (np.sort(x, axis=1) == np.arange(3)).all()
    codes = x[:, 0] * 9 + x[:, 1] * 3 + x[:, 2]
    assert stats.chisquare(np.unique(codes, return_counts=True)[1]).pvalue > P
    n = T.lscalar("n")
    assert sorted(function([n], srng.permutation(n=n))(6)) == list(range(6))


# ----------------------------------------------------------------------------- streams, state

def test_tutorial_programs():
    srng = SharedRandomStreams(seed=234)
    rv_u = srng.uniform((2, 2))
    rv_n = srng.normal((2, 2))
    f = function([], rv_u)
    g = function([], rv_n, no_default_updates=True)
    nearly_zeros = function([], rv_u + rv_u - 2 * rv_u)
    a, b = f(), f()
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(g(), g())
    np.testing.assert_allclose(nearly_zeros(), np.zeros((2, 2)), atol=1e-12)
    before = rv_u.rng.get_value()
    f()
    assert int(rv_u.rng.get_value()[2]) == int(before[2]) + philox.blocks(4, rv_u.dtype)


def test_copying_rstate_and_state_updates_syncs_two_graphs():
    # Theano's tutorial "Copying Random State Between Theano Graphs"; T.shared_randomstreams
    # is reachable as an attribute, as in Theano
    assert T.shared_randomstreams.RandomStreams is SharedRandomStreams
    g1, g2 = MRG_RandomStreams(123), MRG_RandomStreams(987)
    f1, f2 = function([], g1.uniform((1,))), function([], g2.uniform((1,)))
    assert f1()[0] != f2()[0]
    g2.rstate = g1.rstate
    assert g2.rstate == 123
    for su1, su2 in zip(g1.state_updates, g2.state_updates):
        su2[0].set_value(su1[0].get_value())
    np.testing.assert_array_equal(f1(), f2())
    # the next streams made follow g1's too
    np.testing.assert_array_equal(function([], g1.normal((3,)))(), function([], g2.normal((3,)))())
    with pytest.raises(TypeError):
        g2.rstate = -1


def test_default_update_counts_blocks_and_explicit_updates_win():
    srng = RandomStreams(seed=9)
    n = T.lscalar("n")
    x = srng.uniform((n,), dtype="float64")
    f = function([n], x)
    f(5)                                      # 3 blocks of 2 float64
    assert list(x.rng.get_value()[2:]) == [3, 0]
    frozen = function([n], x, updates=[(x.rng, x.rng)])
    np.testing.assert_array_equal(frozen(4), frozen(4))
    assert list(x.rng.get_value()[2:]) == [3, 0]
    listed = function([n], x, no_default_updates=[x.rng])
    np.testing.assert_array_equal(listed(4), listed(4))


def test_same_draw_reused_in_one_call_and_streams_independent():
    srng = RandomStreams(seed=10)
    a, b = srng.normal((5000,)), srng.normal((5000,))
    va, vb = function([], [a, b])()
    assert abs(np.corrcoef(va, vb)[0, 1]) < 0.05
    assert stats.ks_2samp(va, vb).pvalue > P
    u = function([], [a, a * 1.0])()
    np.testing.assert_array_equal(u[0], u[1])


def test_seed_reseeds_every_stream_and_is_reproducible():
    srng = RandomStreams(seed=11)
    u, z = srng.uniform((3,)), srng.normal((3,))
    f = function([], [u, z])
    first = f()
    f()
    srng.seed(11)
    np.testing.assert_array_equal(f()[0], first[0])
    srng.seed(12)
    assert not np.allclose(f()[0], first[0])
    other = MRG_RandomStreams(seed=11)
    np.testing.assert_array_equal(function([], other.uniform((3,), nstreams=60))(), first[0])


def test_same_numbers_in_another_process():
    prog = ("import numpy as np, symgpu\n"
            "from symgpu.tensor.random import RandomStreams\n"
            "s = RandomStreams(seed=99)\n"
            "f = symgpu.function([], [s.uniform((6,), dtype='float32'), s.normal((6,))])\n"
            "f(); a, b = f(); print(a.tobytes().hex(), b.tobytes().hex())\n")
    here = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    s = RandomStreams(seed=99)
    f = function([], [s.uniform((6,), dtype="float32"), s.normal((6,))])
    f()
    a, b = f()
    assert here.stdout.split() == [a.tobytes().hex(), b.tobytes().hex()]


def test_copying_state_between_streams():
    a, b = RandomStreams(seed=1), RandomStreams(seed=2)
    xa, xb = a.uniform((4,)), b.uniform((4,))
    fa, fb = function([], xa), function([], xb)
    fa()
    for (sa, _), (sb, _) in zip(a.state_updates, b.state_updates):
        sb.set_value(sa.get_value())
    np.testing.assert_array_equal(fa(), fb())


# ----------------------------------------------------------------------------- gradients, errors

def test_gradients_reach_parameters_not_noise():
    srng = RandomStreams(seed=13)
    lo, hi = T.dvector("lo"), T.dvector("hi")
    u = srng.uniform((3,), low=lo, high=hi)
    g_lo, g_hi = T.grad(T.sum(u), [lo, hi])
    f = function([lo, hi], [u, g_lo, g_hi], no_default_updates=True)
    val, glo, ghi = f(np.zeros(3), np.full(3, 2.0))
    frac = val / 2.0
    np.testing.assert_allclose(ghi, frac)
    np.testing.assert_allclose(glo, 1 - frac)

    def fixed_noise(avg, std):
        z = RandomStreams(seed=14).normal((4,), avg=avg, std=std)
        z.rng.default_update = None     # the same noise at every evaluation
        return z
    verify_grad(fixed_noise, [np.arange(4.0), np.full(4, 1.5)])
    state = srng.state_updates[0][0]
    assert PhiloxSample("normal", "float64").grad([state], [None]) == [None]


def test_bad_arguments_name_the_problem():
    srng = RandomStreams(seed=1)
    with pytest.raises(TypeError, match="seed"):
        RandomStreams(seed=-1)
    with pytest.raises(TypeError, match="float dtype"):
        srng.uniform((2,), dtype="int32")
    with pytest.raises(ValueError, match="ndim=3"):
        srng.normal((2, 2), ndim=3)
    with pytest.raises(TypeError, match="binomial: n"):
        srng.binomial((2,), n=T.lscalar())
    with pytest.raises(TypeError, match="integers: low"):
        srng.integers((2,), low=0.5, high=3)
    with pytest.raises(TypeError, match="uint32 vector"):
        PhiloxSample("uniform", "float32")(T.dvector(), 3)
    with pytest.raises(ValueError, match="probabilities"):
        function([], srng.choice((2,), a=2, p=np.array([-1.0, 2.0])))()
    with pytest.raises(ValueError, match="without replacement"):
        function([], srng.choice((5,), a=3, replace=False))()


def test_infer_shape_of_the_ops():
    srng = RandomStreams(seed=1)
    n = T.lscalar("n")
    x = srng.normal((n, 3))
    node = x.owner
    assert node.op.infer_shape(None, node, [(4,), (), ()]) == [tuple(node.inputs[1:])]
    adv = x.rng.default_update.owner
    assert isinstance(adv.op, PhiloxAdvance)
    assert adv.op.infer_shape(None, adv, [(4,), (), ()]) == [(4,)]


def test_mlp_dropout_example_trains():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SYMGPU_FLAGS="device=cpu,floatX=float32", SYMGPURC=os.devnull,
               PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "examples/mlp_dropout.py", "6"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Used the cpu"
    losses = [float(l.split()[-1]) for l in lines if l.startswith("step ")]
    assert losses[-1] < losses[0]
