"""Calls from several threads: exact results, no lost updates, safe set_value/get_value.

The interpreter's thread switch interval is made tiny (conftest's fast_thread_switching) so
that threads are interleaved inside calls."""
import threading

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function, shared
from symgpu.compile.io import Out

N_THREADS = 8

pytestmark = pytest.mark.usefixtures("fast_thread_switching")


def run_threads(target, n=N_THREADS):
    """Run target(k) in n threads started together; re-raise the first failure."""
    errors = []
    start = threading.Barrier(n)

    def body(k):
        try:
            start.wait()
            target(k)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_concurrent_calls_give_exact_results(seed):
    rng = np.random.default_rng(seed)
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], [T.exp(x) * 2 + y, (x * y).sum()])
    inputs = [(rng.standard_normal(64), rng.standard_normal(64)) for _ in range(N_THREADS)]
    expected = [[np.exp(a) * 2 + b, (a * b).sum()] for a, b in inputs]
    for k in range(N_THREADS):  # the single-threaded results are the (exact) reference
        got = f(*inputs[k])
        np.testing.assert_allclose(got[0], expected[k][0], rtol=1e-12)
        expected[k] = got
    bad = []

    def work(k):
        a, b = inputs[k]
        held = []
        for i in range(1500):
            r = f(a, b)
            if not (np.array_equal(r[0], expected[k][0]) and r[1] == expected[k][1]):
                # how far off says what went wrong: a race gives another thread's numbers,
                # a different kernel (C against NumPy) differs in the last bits
                bad.append((k, i, float(np.max(np.abs(r[0] - expected[k][0]))),
                            float(r[1] - expected[k][1])))
            if i % 100 == 0:
                held.append(r)
        # results handed out earlier were not overwritten by later calls
        for r in held:
            if not np.array_equal(r[0], expected[k][0]):
                bad.append((k, "held"))

    run_threads(work)
    assert bad == [], f"{len(bad)} wrong results (thread, call, max |error|, sum error): " \
        f"{bad[:5]}; frames {f.n_frames}"
    assert f.n_frames > 1  # contended calls ran in spare frames


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_updates_are_never_lost(seed):
    rng = np.random.default_rng(seed)
    w = shared(np.float64(0.0), name="w")
    v = shared(rng.standard_normal(5), name="v")
    x = T.dvector("x")
    f = function([], w, updates=[(w, w + 1)])
    # an input, an output and two updated shared values
    g = function([x], (v * x).sum(), updates=[(w, w + 1), (v, v + x)])
    v0 = v.get_value()
    n_f, n_g = 700, 300
    ones = np.ones(5)

    def work(k):
        for _ in range(n_f):
            f()
        for _ in range(n_g):
            g(ones)

    run_threads(work)
    assert w.get_value() == N_THREADS * (n_f + n_g)
    np.testing.assert_allclose(v.get_value(), v0 + N_THREADS * n_g)


def test_overlapping_updates_in_opposite_orders_do_not_deadlock():
    a = shared(np.int64(0), name="a")
    b = shared(np.int64(0), name="b")
    f = function([], [], updates=[(a, a + 1), (b, b + 1)])
    g = function([], [], updates=[(b, b + 2), (a, a + 2)])
    n = 400

    def work(k):
        h = f if k % 2 else g
        for _ in range(n):
            h()

    run_threads(work)
    half = N_THREADS // 2
    assert a.get_value() == b.get_value() == half * n * 3


def test_each_call_sees_one_consistent_state():
    # w's two entries are always equal: a call that read w while another call's update
    # landed between two reads would return unequal entries
    w = shared(np.zeros(2), name="w")
    f = function([], [w[0] - w[1], w + 0], updates=[(w, w + 1)])
    bad = []

    def work(k):
        for _ in range(500):
            d, value = f()
            if d != 0 or value[0] != value[1]:
                bad.append(value)

    run_threads(work)
    assert bad == []
    assert w.get_value()[0] == N_THREADS * 500


def test_set_value_from_another_thread_is_never_lost():
    # entry 0 counts calls, entry 1 is a marker only set_value changes; a call that read w
    # before a set_value and wrote its update after it would bring an old marker back
    w = shared(np.zeros(2), name="w")
    f = function([], w, updates=[(w, w + np.array([1.0, 0.0]))])
    n_sets = 300
    bad = []

    def work(k):
        if k == 0:
            for marker in range(1, n_sets + 1):
                w.set_value(np.array([0.0, marker]))
                seen = w.get_value()[1]
                if seen < marker:
                    bad.append((marker, seen))
        else:
            for _ in range(800):
                f()

    run_threads(work)
    assert bad == []
    assert w.get_value()[1] == n_sets


def test_failed_calls_in_threads_change_nothing():
    w = shared(np.ones(3), name="w")
    x = T.dvector("x")
    f = function([x], T.dot(x, w), updates=[(w, w + 1)])
    good, wrong = np.ones(3), np.ones(4)
    n = 300

    def work(k):
        for i in range(n):
            if k % 2:
                with pytest.raises(ValueError):
                    f(wrong)
            else:
                f(good)

    run_threads(work)
    np.testing.assert_array_equal(w.get_value(), np.ones(3) + N_THREADS // 2 * n)


def test_borrowed_outputs_and_reentrant_calls():
    x = T.dvector("x")
    f = function([x], Out(x * 2, borrow=True))
    a = np.arange(4.0)

    def work(k):
        for _ in range(500):
            np.testing.assert_array_equal(f(a + k), (a + k) * 2)

    run_threads(work)
    assert f.n_frames <= 1 + N_THREADS  # one frame per call in flight at most


def test_spare_frames_beyond_the_pool_are_dropped(monkeypatch):
    from symgpu.compile import frames
    monkeypatch.setattr(frames, "SPARE_FRAMES", 2)
    x = T.dvector("x")
    f = function([x], x * 3)
    f._frame.guard[0].take()  # the primary frame is busy (as while another thread is inside)
    try:
        np.testing.assert_array_equal(f(np.ones(2)), [3.0, 3.0])  # runs in a spare frame
        assert f.n_frames == 2
        taken = [f._take_spare() for _ in range(4)]  # four calls in flight at once
        assert len({id(t) for t in taken}) == 4
        for t in taken:
            np.testing.assert_array_equal(t.caller(f._filters, None)(np.ones(2)), [3.0, 3.0])
            f._give_back(t)
    finally:
        f._frame.guard[0].give(None)
    assert f.n_frames == 1 + 2  # two kept, the others dropped
    np.testing.assert_array_equal(f(np.ones(2)), [3.0, 3.0])


def test_keyword_and_trusted_calls_from_threads():
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], T.tanh(x) - y)
    g = function([x, y], T.tanh(x) - y)
    g.trust_input = True
    data = [(np.full(16, k / 8.0), np.full(16, k / 4.0)) for k in range(N_THREADS)]
    expected = [f(a, b) for a, b in data]
    bad = []

    def work(k):
        a, b = data[k]
        for _ in range(400):
            r1 = f(y=b, x=a)
            r2 = g(a, b)
            if not (np.array_equal(r1, expected[k]) and np.array_equal(r2, expected[k])):
                bad.append(k)

    run_threads(work)
    assert bad == []


def test_values_updated_together_share_one_lock():
    ws = [shared(np.zeros(2), name=f"w{k}") for k in range(5)]
    step = function([], [], updates=[(w, w + 1) for w in ws])
    assert len(step._layout.locks) == 1  # one lock per call, not one per updated value
    assert all(w.container.lock is ws[0].container.lock for w in ws)
    # a value bound to another lock first keeps it: a function updating both takes both,
    # and a fresh value updated with them joins the lowest-ordered one
    other = shared(np.zeros(2), name="other")
    function([], [], updates=[(other, other * 2)])
    fresh = shared(np.zeros(2), name="fresh")
    mixed = function([], [], updates=[(other, other + 1), (fresh, fresh + 1), (ws[2], ws[2] + 1)])
    assert len(mixed._layout.locks) == 2
    assert fresh.container.lock is ws[0].container.lock  # ws were created (ordered) first
    assert other.container.lock is not ws[0].container.lock


def test_functions_sharing_values_exclude_each_other_in_any_order():
    # a and b bound to locks of their own first; then functions updating both, listed in
    # opposite orders, and functions updating one of them, all at once: no deadlock, no
    # lost update
    a = shared(np.int64(0), name="a")
    b = shared(np.int64(0), name="b")
    only_a = function([], [], updates=[(a, a + 1)])
    only_b = function([], [], updates=[(b, b + 1)])
    ab = function([], [], updates=[(a, a + 1), (b, b + 1)])
    ba = function([], [], updates=[(b, b + 1), (a, a + 1)])
    assert a.container.lock is not b.container.lock
    assert ab._layout.locks == ba._layout.locks and len(ab._layout.locks) == 2
    fns = [only_a, only_b, ab, ba]
    n = 300

    def work(k):
        for _ in range(n):
            fns[k % 4]()

    run_threads(work)
    per_fn = N_THREADS // 4 * n
    assert a.get_value() == 3 * per_fn and b.get_value() == 3 * per_fn


def test_a_set_value_waiting_while_its_lock_is_swapped_takes_the_new_one():
    a = shared(0.0, name="a")
    c = shared(0.0, name="c")  # no function updates c yet: its lock may still change
    function([], [], updates=[(a, a + 1)])  # a's lock is bound
    old, new = c.container.lock, a.container.lock
    done = threading.Event()
    old.acquire()
    setter = threading.Thread(target=lambda: (c.set_value(5.0), done.set()))
    setter.start()  # waits for c's old lock
    new.acquire()
    f = function([], [], updates=[(a, a + 1), (c, c + 1)])  # swaps c's lock for a's
    assert c.container.lock is new and f._layout.locks == [new]
    old.release()  # the setter takes the old lock, sees it was swapped, waits for the new
    assert not done.wait(0.2)
    new.release()
    assert done.wait(10)
    setter.join()
    assert c.get_value() == 5.0
    f()
    assert c.get_value() == 6.0 and a.get_value() == 1.0
