"""Theano's raw_random functional API on Philox states (state -> (new state, sample)),
RandomStreamsBase, RandomStreams.gen and RandomVariable."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.tensor import raw_random
from symgpu.tensor.random import RandomStreams, RandomStreamsBase, philox_state
from symgpu.tensor.shared_randomstreams import RandomVariable


def _state(seed=3):
    return philox_state(seed)


def test_the_theano_path_gathers_the_functions_and_the_ops():
    for name in ("uniform", "normal", "binomial", "random_integers", "permutation",
                 "multinomial", "choice", "RandomStreamsBase", "PhiloxSample"):
        assert hasattr(raw_random, name), name
    # Theano's NumPy-RandomState ops too (symgpu/tensor/random/numpy_state.py)
    for name in ("RandomStateType", "random_state_type", "RandomFunction"):
        assert hasattr(raw_random, name), name


def test_uniform_returns_new_state_and_sample_and_chains():
    r = _state()
    r1, u = raw_random.uniform(r, (3, 4), low=-1.0, high=2.0, dtype="float64")
    r2, u2 = raw_random.uniform(r1, (3, 4), low=-1.0, high=2.0, dtype="float64")
    f = function([], [u, u2], updates=[(r, r2)])
    a, b = f()
    assert a.shape == (3, 4) and a.dtype == np.float64
    assert np.all((a > -1) & (a < 2)) and not np.allclose(a, b)
    c, d = f()
    assert not np.allclose(c, a) and not np.allclose(c, b)  # the state moved on past both


def test_without_an_update_the_state_stays():
    r = _state()
    _, u = raw_random.uniform(r, (5,))
    f = function([], u)
    assert np.array_equal(f(), f())


def test_the_same_numbers_as_a_stream_of_that_seed():
    srng = RandomStreams(seed=11)
    x = srng.normal((4,), avg=1.0, std=2.0, dtype="float64")
    _, y = raw_random.normal(philox_state(11, 0), (4,), avg=1.0, std=2.0, dtype="float64")
    assert np.array_equal(function([], x)(), function([], y)())


def test_the_state_may_be_a_draws_rng_or_a_symbolic_input():
    srng = RandomStreams(seed=5)
    d = srng.uniform((3,))
    new, u = raw_random.uniform(d.rng, (3,))
    st = T.vector("st", dtype="uint32")
    new2, u2 = raw_random.uniform(st, (3,))
    f = function([st], [u2, new2])
    val, moved = f(d.rng.get_value())
    assert np.array_equal(val, function([], u)())
    assert moved.dtype == np.uint32 and moved[:2].tolist() == d.rng.get_value()[:2].tolist()


def test_a_state_that_is_not_philox_is_refused():
    with pytest.raises(TypeError):
        raw_random.uniform(shared(np.zeros(4)), (2,))


def test_discrete_distributions():
    r = _state(9)
    _, b = raw_random.binomial(r, (2000,), n=5, p=0.3)
    _, ri = raw_random.random_integers(r, (2000,), low=2, high=4)
    _, perm = raw_random.permutation(r, (3,), n=6)
    _, mn = raw_random.multinomial(r, 4, n=10, pvals=[0.2, 0.3, 0.5])
    _, ch = raw_random.choice(r, (3,), a=5, replace=False)
    bv, riv, pv, mv, cv = function([], [b, ri, perm, mn, ch])()
    assert bv.dtype == np.int64 and bv.min() >= 0 and bv.max() <= 5
    assert abs(bv.mean() - 1.5) < 0.15
    assert set(np.unique(riv)) == {2, 3, 4}
    assert pv.shape == (3, 6) and all(sorted(row) == list(range(6)) for row in pv)
    assert mv.shape == (4, 3) and np.all(mv.sum(axis=1) == 10)
    assert len(set(cv.tolist())) == 3 and cv.max() < 5


def test_binomial_accepts_theanos_old_prob_name():
    r = _state()
    _, b = raw_random.binomial(r, (1000,), prob=0.9)
    assert function([], b)().mean() > 0.8


def test_shuffle_row_elements_keeps_each_rows_elements():
    srng = RandomStreams(seed=2)
    x = T.dmatrix("x")
    s = srng.shuffle_row_elements(x)
    assert isinstance(s, RandomVariable)
    xv = np.arange(40.0).reshape(4, 10)
    out = function([x], s)(xv)
    assert out.shape == xv.shape and not np.array_equal(out, xv)
    assert np.array_equal(np.sort(out, axis=1), xv)


def test_gen_takes_a_raw_function_and_registers_the_update():
    srng = RandomStreams(seed=4)
    u = srng.gen(raw_random.uniform, (3,), low=1.0, high=2.0)
    assert isinstance(u, RandomVariable) and isinstance(u, symgpu.Variable)
    assert u.update[0] is u.rng and srng.updates() == [u.update]
    assert u.rng.default_update is u.update[1]
    f = function([], u)
    a, b = f(), f()
    assert not np.array_equal(a, b) and np.all((a > 1) & (a < 2))
    # the same numbers as the method of the same stream number
    v = RandomStreams(seed=4).uniform((3,), low=1.0, high=2.0)
    assert np.array_equal(function([], v)(), a)


def test_random_variable_is_the_class_of_draws_only():
    assert not isinstance(T.dvector(), RandomVariable)
    assert not isinstance(3, RandomVariable)
    assert RandomVariable.rng is None and RandomVariable.update is None


def test_random_streams_base_methods_go_through_gen():
    calls = []

    class Recording(RandomStreamsBase):
        def gen(self, op, *args, **kwargs):
            calls.append(op)
            return op(philox_state(1), *args, **kwargs)[1]

    rs = Recording()
    for draw in (rs.uniform((2,)), rs.normal((2,)), rs.binomial((2,)), rs.random_integers((2,)),
                 rs.permutation(n=3), rs.multinomial(2, 3), rs.choice((2,), a=4)):
        assert isinstance(draw, symgpu.Variable)
    assert calls == [raw_random.uniform, raw_random.normal, raw_random.binomial,
                     raw_random.random_integers, raw_random.permutation,
                     raw_random.multinomial, raw_random.choice]
    assert issubclass(RandomStreams, RandomStreamsBase)
    with pytest.raises(NotImplementedError):
        RandomStreamsBase().uniform((2,))


def test_theano_code_runs_through_the_alias():
    import sys
    saved = sys.modules.get("theano")
    sys.modules["theano"] = symgpu
    try:
        from theano.tensor.raw_random import uniform  # noqa: F401  (Theano's spelling)
        from theano.tensor.shared_randomstreams import RandomStreams as RS, RandomVariable as RV
        assert uniform is raw_random.uniform and RS is RandomStreams and RV is RandomVariable
    finally:
        if saved is None:
            sys.modules.pop("theano", None)
        else:
            sys.modules["theano"] = saved
