"""Function.copy: Theano's tutorial accumulator, swap, delete_updates, share_memory."""
import copy
import threading

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function, shared


def accumulator_setup():
    state = shared(0)
    inc = T.iscalar("inc")
    accumulator = function([inc], state, updates=[(state, state + inc)], name="acc")
    return state, inc, accumulator


def test_tutorial_accumulator_copies():
    # Theano's "Copying functions" tutorial, with its results
    state, inc, accumulator = accumulator_setup()
    assert accumulator(10) == 0
    assert state.get_value() == 10
    new_state = shared(0)
    new_accumulator = accumulator.copy(swap={state: new_state})
    assert new_accumulator(100) == 0
    assert new_state.get_value() == 100
    assert state.get_value() == 10
    null_accumulator = accumulator.copy(delete_updates=True)
    assert null_accumulator(9000) == 10
    assert state.get_value() == 10
    assert null_accumulator.maker.fgraph.update_mapping == {}
    assert len(null_accumulator.maker.fgraph.outputs) == 1


def test_copy_without_swap_shares_the_state():
    state, _, accumulator = accumulator_setup()
    twin = accumulator.copy()
    accumulator(1)
    twin(2)
    assert state.get_value() == 3
    assert accumulator(0) == 3 and twin(0) == 3
    assert twin.name == "acc copy"
    assert accumulator.copy(name="other").name == "other"
    # the copy has its own graph
    assert twin.maker.fgraph is not accumulator.maker.fgraph
    assert not (set(twin.maker.fgraph.variables) & set(accumulator.maker.fgraph.variables))
    assert copy.copy(accumulator).maker.fgraph is not accumulator.maker.fgraph


@pytest.mark.parametrize("share_memory", [False, True])
def test_share_memory_gives_the_same_results(share_memory):
    x = T.dmatrix("x")
    w = shared(np.arange(6.0).reshape(3, 2), name="w")
    f = function([x], [T.tanh(T.dot(x, w)) * 2 + 1, (x ** 2).sum()])
    g = f.copy(share_memory=share_memory)
    a = np.random.default_rng(0).standard_normal((4, 3))
    expected = f(a)
    for r, e in zip(g(a), expected):
        np.testing.assert_array_equal(r, e)
    shared_cells = {id(c) for c in f._frame.storage_map.values()} & \
        {id(c) for c in g._frame.storage_map.values()}
    assert bool(shared_cells) == share_memory
    if share_memory:  # intermediates only: never the inputs' or the outputs' cells
        ends = [g._frame.storage_map[v] for v in g.maker.fgraph.inputs + g.maker.fgraph.outputs]
        assert not ({id(c) for c in ends} & shared_cells)
    # results held from one function are not overwritten by calls of the other
    r1 = f(a)
    g(a * 3)
    np.testing.assert_array_equal(r1[0], expected[0])


def test_share_memory_copies_are_safe_together_in_threads():
    x = T.dvector("x")
    f = function([x], T.exp(x) * 2 + x)
    g = f.copy(share_memory=True)
    data = [np.random.default_rng(k).standard_normal(32) for k in range(4)]
    expected = [f(d) for d in data]
    bad = []

    def work(k):
        h = f if k % 2 else g
        for _ in range(300):
            if not np.array_equal(h(data[k]), expected[k]):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_swap_with_an_input_and_several_shared():
    x = T.dvector("x")
    w = shared(np.ones(3), name="w")
    b = shared(np.float64(0.5), name="b")
    f = function([x], T.dot(x, w) + b, updates=[(w, w * 2)])
    w2 = shared(np.full(3, 10.0), name="w2")
    g = f.copy(swap={w: w2})
    assert g(np.ones(3)) == 30.5
    np.testing.assert_array_equal(w2.get_value(), np.full(3, 20.0))
    np.testing.assert_array_equal(w.get_value(), np.ones(3))
    assert f(np.ones(3)) == 3.5
    assert g.get_shared() == [w2, b] or set(map(id, g.get_shared())) == {id(w2), id(b)}


def test_swap_errors_name_the_variables():
    state, _, accumulator = accumulator_setup()
    unused = shared(0, name="unused")
    with pytest.raises(ValueError, match="unused"):
        accumulator.copy(swap={unused: shared(0)})
    with pytest.raises(TypeError, match="same type"):
        accumulator.copy(swap={state: shared(np.zeros(2))})
    with pytest.raises(TypeError, match="shared variable"):
        accumulator.copy(swap={state: 3})


def test_copy_keeps_defaults_names_and_profile():
    from symgpu.compile.io import In
    x = T.dscalar("x")
    y = T.dscalar("y")
    from symgpu.compile.profiling import ProfileStats
    f = function([x, In(y, value=2.0)], x * y)
    stats = ProfileStats(atexit_print=False, message="copy")
    g = f.copy(profile=stats)
    assert g(3.0) == 6.0 and g(x=1.0, y=5.0) == 5.0
    assert g.profile is stats and stats.fct_callcount == 2
    assert f.profile is None
