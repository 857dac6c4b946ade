"""A stream's state value (`PhiloxRandomState`, symgpu/tensor/random/state.py): Theano code
that seeds, saves, restores and copies streams through ``rv.rng.get_value()`` runs unchanged
(Theano's tutorial, "Using Random Numbers", and its test_shared_randomstreams.py /
test_rng_mrg.py), with Philox numbers."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from symgpu import function, shared
from symgpu.sandbox.rng_mrg import MRG_RandomStreams
from symgpu.tensor import raw_random
from symgpu.tensor.random import philox
from symgpu.tensor.random.state import PhiloxRandomState
from symgpu.tensor.shared_randomstreams import RandomStreams


@pytest.fixture(params=[RandomStreams, MRG_RandomStreams])
def streams(request):
    return request.param


def test_the_value_is_a_random_state_over_the_plain_words(streams):
    srng = streams(seed=234)
    rv = srng.uniform((2, 2), dtype="float64")
    value = rv.rng.get_value()
    assert isinstance(value, PhiloxRandomState) and isinstance(value, np.ndarray)
    assert value.dtype == np.uint32 and value.shape == (4,)
    key = philox.stream_key(234, 0)
    assert value.tolist() == [int(key[0]), int(key[1]), 0, 0] and value.key == tuple(value[:2])
    assert value.counter == 0
    function([], rv)()
    assert rv.rng.get_value().counter == philox.blocks(4, "float64")
    # a copy unless borrowed: changing it leaves the stream alone
    value.seed(1)
    assert rv.rng.get_value().counter == philox.blocks(4, "float64")


def test_tutorial_seeding_one_stream_restarts_it_reproducibly(streams):
    # "Seeding Streams": rng_val = rv_u.rng.get_value(borrow=True); rng_val.seed(89234);
    # rv_u.rng.set_value(rng_val, borrow=True)
    srng = streams(seed=234)
    rv_u = srng.uniform((2, 2))
    rv_n = srng.normal((2, 2))
    f, g = function([], rv_u), function([], rv_n)
    f(), g()
    rng_val = rv_u.rng.get_value(borrow=True)
    rng_val.seed(89234)
    rv_u.rng.set_value(rng_val, borrow=True)
    a, b = f(), f()
    assert not np.array_equal(a, b)
    rng_val = rv_u.rng.get_value()
    rng_val.seed(89234)
    rv_u.rng.set_value(rng_val)
    np.testing.assert_array_equal(f(), a)
    np.testing.assert_array_equal(f(), b)
    # seed(n) is stream 0 of RandomStreams(n): the same numbers
    np.testing.assert_array_equal(function([], streams(seed=89234).uniform((2, 2)))(), a)
    # a different seed: different numbers; g's stream was not touched
    rng_val.seed(89235)
    rv_u.rng.set_value(rng_val)
    assert not np.array_equal(f(), a)
    assert rv_n.rng.get_value().counter == philox.blocks(4, rv_n.dtype)


def test_tutorial_sharing_streams_get_state_set_state(streams):
    # "Sharing Streams Between Functions"
    srng = streams(seed=234)
    rv_u = srng.uniform((2, 2))
    f = function([], rv_u)
    nearly_zeros = function([], rv_u + rv_u - 2 * rv_u)
    f()
    state_after_v0 = rv_u.rng.get_value().get_state()
    np.testing.assert_allclose(nearly_zeros(), 0, atol=1e-6)   # moves rv_u's stream on
    v1 = f()
    rng = rv_u.rng.get_value(borrow=True)
    rng.set_state(state_after_v0)
    rv_u.rng.set_value(rng, borrow=True)
    v2 = f()
    v3 = f()
    assert not np.array_equal(v2, v1)
    np.testing.assert_array_equal(v3, v1)


def test_get_state_set_state_round_trip():
    r = PhiloxRandomState(7)
    r.random_sample(5)
    state = r.get_state()
    assert state[0] == "Philox4x32-10" and state[1].dtype == np.uint32 and state[2] == 3
    a = r.uniform(-1, 1, size=(3,))
    r2 = PhiloxRandomState(99)
    r2.set_state(state)
    np.testing.assert_array_equal(r2.uniform(-1, 1, size=(3,)), a)
    assert r2.get_state()[2] == r.get_state()[2] and r2.key == r.key
    r3 = PhiloxRandomState()
    r3.set_state(r2)                       # another state object works too
    assert r3.tolist() == r2.tolist()
    # a counter above 2**32 round-trips through both words
    r3.set_state(("Philox4x32-10", np.array([1, 2], dtype=np.uint32), 2 ** 40 + 5))
    assert r3.tolist() == [1, 2, 5, 256] and r3.get_state()[2] == 2 ** 40 + 5
    with pytest.raises(TypeError, match="set_state"):
        r3.set_state("MT19937")
    with pytest.raises(ValueError, match="counter"):
        r3.set_state(("Philox4x32-10", np.array([1, 2], dtype=np.uint32), -1))
    with pytest.raises(TypeError, match="seed"):
        r3.seed(-3)
    with pytest.raises(TypeError, match="seed"):
        r3.seed(1.5)


def test_host_draws_are_the_graphs_float64_numbers():
    srng = RandomStreams(seed=5)
    u = srng.uniform((3, 2), low=-2.0, high=3.0, dtype="float64")
    z = srng.normal((5,), avg=1.0, std=2.0, dtype="float64")
    k = srng.integers((7,), low=3, high=11)
    us, zs, ks = u.rng.get_value(), z.rng.get_value(), k.rng.get_value()
    f = function([], [u, z, k])
    gu, gz, gk = f()
    np.testing.assert_array_equal(us.uniform(-2.0, 3.0, size=(3, 2)), gu)
    np.testing.assert_array_equal(zs.normal(1.0, 2.0, size=5), gz)
    np.testing.assert_array_equal(ks.randint(3, 11, size=7), gk)
    # and each draw moved its counter as the graph's update did
    for state, var in ((us, u), (zs, z), (ks, k)):
        assert state.tolist() == var.rng.get_value().tolist()
    r = PhiloxRandomState(1)
    assert isinstance(r.rand(), float) and r.rand(2, 3).shape == (2, 3)
    assert isinstance(r.randn(), float) and r.randn(4).shape == (4,)
    ints = r.randint(4, size=1000)
    assert ints.min() == 0 and ints.max() == 3
    assert 0 < r.random_sample() < 1 and r.standard_normal((2,)).shape == (2,)
    with pytest.raises(ValueError, match="low >= high"):
        r.randint(3, 3)


def test_state_copy_between_two_streams_gives_identical_draws():
    # Theano's test_random_state_transfer (shared_randomstreams: no rstate to copy)
    class Graph:
        def __init__(self, seed: int):
            self.rng = RandomStreams(seed)
            self.y = self.rng.uniform(size=(1,))
            self.z = self.rng.normal(size=(3,))

    g1, g2 = Graph(123), Graph(987)
    f1, f2 = function([], [g1.y, g1.z]), function([], [g2.y, g2.z])
    f1()
    assert not np.array_equal(f1()[1], f2()[1])
    for su2, su1 in zip(g2.rng.state_updates, g1.rng.state_updates):
        su2[0].set_value(su1[0].get_value())
    for _ in range(3):
        for a, b in zip(f1(), f2()):
            np.testing.assert_array_equal(a, b)


def test_srng_getitem_setitem_and_numpy_random_states():
    # test_shared_randomstreams' test_getitem / test_setitem: srng[rv.rng] is the state;
    # a NumPy RandomState sets a stream deterministically (keyed by its next two words)
    srng = RandomStreams(234)
    out = srng.uniform((2, 2))
    fn = function([], out, updates=srng.updates())
    assert isinstance(srng[out.rng], PhiloxRandomState)
    srng[out.rng] = np.random.RandomState(42)
    a = fn()
    rs = np.random.RandomState(42)
    srng[out.rng] = rs
    np.testing.assert_array_equal(fn(), a)
    assert rs.randint(2 ** 30) == np.random.RandomState(42).randint(2 ** 30)   # not advanced
    srng[out.rng] = np.random.RandomState(43)
    assert not np.array_equal(fn(), a)
    out.rng.set_value(np.random.RandomState(42).get_state())   # its state tuple: the same
    np.testing.assert_array_equal(fn(), a)
    with pytest.raises(KeyError, match="not the state"):
        srng[RandomStreams(1).uniform((2,)).rng]


def test_shared_of_a_random_state_feeds_raw_random():
    r = shared(np.random.RandomState(234))
    assert isinstance(r.get_value(), PhiloxRandomState)
    r1, u = raw_random.uniform(r, (4,), dtype="float64")
    step = function([], u, updates=[(r, r1)])
    a = step()
    r.set_value(np.random.RandomState(234))
    np.testing.assert_array_equal(step(), a)
    s = shared(PhiloxRandomState(3))
    assert s.get_value().tolist() == PhiloxRandomState(3).tolist()


def test_srng_seed_reseeds_all_and_seed_none_goes_back_to_the_constructors(streams):
    srng = streams(seed=234)
    x, y = srng.uniform((3,)), srng.normal((3,))
    f = function([], [x, y])
    first = f()
    srng.seed(902340)
    a = f()
    srng.seed(902340)
    for p, q in zip(a, f()):
        np.testing.assert_array_equal(p, q)
    srng.seed()                            # Theano: the seed given to the constructor
    for p, q in zip(first, f()):
        np.testing.assert_array_equal(p, q)


def test_pickling_and_copying_the_state_and_its_variable():
    srng = RandomStreams(seed=11)
    rv = srng.uniform((4,), dtype="float64")
    f = function([], rv)
    f()
    value = rv.rng.get_value()
    for back in (pickle.loads(pickle.dumps(value)), copy.deepcopy(value), copy.copy(value)):
        assert type(back) is PhiloxRandomState and back.tolist() == value.tolist()
    var = pickle.loads(pickle.dumps(rv.rng))
    assert isinstance(var.get_value(), PhiloxRandomState)
    assert var.get_value().tolist() == value.tolist()
    g = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(g(), f())
    reloaded = pickle.loads(pickle.dumps(srng))
    assert isinstance(reloaded.state_updates[0][0].get_value(), PhiloxRandomState)


def test_a_plain_array_still_sets_the_state_and_checks_it():
    srng = RandomStreams(seed=3)
    rv = srng.uniform((2,))
    words = np.asarray(rv.rng.get_value())
    assert type(words) is np.ndarray
    rv.rng.set_value(words)
    with pytest.raises(TypeError):
        rv.rng.set_value(np.zeros((2, 2), dtype=np.uint32))
    assert rv.rng.get_value().tolist() == words.tolist()


@pytest.mark.gpu
def test_the_state_api_on_gpu_states(cuda):
    # under device=cuda the states are GPU shared variables: get_value downloads the words as
    # a PhiloxRandomState, set_value uploads what it is given; pickling keeps the view
    from symgpu.gpu.placement.type import GpuArraySharedVariable, GpuArrayType
    srng = RandomStreams(seed=234)
    rv = srng.uniform((4, 3))
    f = function([], rv)
    assert isinstance(rv.rng, GpuArraySharedVariable) and isinstance(rv.rng.type, GpuArrayType)
    f()
    rng = rv.rng.get_value(borrow=True)
    assert isinstance(rng, PhiloxRandomState) and rng.counter == philox.blocks(12, "float32")
    rng.seed(89234)
    rv.rng.set_value(rng, borrow=True)
    a = f()
    state = rv.rng.get_value().get_state()
    b = f()
    rng = rv.rng.get_value()
    rng.set_state(state)
    rv.rng.set_value(rng)
    np.testing.assert_array_equal(f(), b)
    rng.seed(89234)
    rv.rng.set_value(rng)
    np.testing.assert_array_equal(f(), a)
    back = pickle.loads(pickle.dumps(rv.rng))
    assert isinstance(back.get_value(), PhiloxRandomState)
