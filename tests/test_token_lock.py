"""TokenLock (symgpu/graph/token_lock.py): the token lock a call takes for the shared
values it updates. Its fast path (a list pop and append in generated code) records no owner,
so these tests check what must still hold: waiting without lost wake-ups, re-entry from a
callback inside a call (get_value, another function, the same function), and release only by
the holder."""
import threading

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function, shared
from symgpu.graph.token_lock import TokenLock
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op


class Callback(Op):
    """Identity on a vector that calls `hook()` when it runs (a Python op inside a call)."""
    __props__ = ("hook",)   # ops with different hooks must not be merged

    def __init__(self, hook):
        self.hook = hook

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        self.hook()
        out[0][0] = inputs[0].copy()


pytestmark = pytest.mark.usefixtures("fast_thread_switching")


def within(seconds: float, call, *args):
    """call(*args) in a worker thread: a deadlock fails the test after `seconds` (a re-entry
    that waited for the lock its own thread holds would hang it instead)."""
    result, errors = [], []

    def run():
        try:
            result.append(call(*args))
        except BaseException as exc:   # re-raised in the test's thread
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{call} did not return within {seconds} s: a deadlock"
    if errors:
        raise errors[0]
    return result[0]


def test_acquire_is_reentrant_and_release_belongs_to_the_holder():
    lock = TokenLock()
    lock.acquire()
    lock.acquire()
    lock.release()
    assert lock.locked()  # one acquire is still held
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, lock.release)))
    t.start()
    t.join()
    assert errors and "does not hold" in str(errors[0].value)
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()


def test_waiters_are_woken_and_every_increment_counts():
    # the fast path (take/give, as generated code does) and acquire/release mixed, from 8
    # threads: exclusion holds (a read-modify-write with a thread switch inside it) and no
    # waiter is left asleep (the test would hang)
    lock = TokenLock()
    count = [0]
    n = 2000

    def fast():
        try:
            lock.take()
        except IndexError:
            lock.acquire()
            bump()
            lock.release()
            return
        bump()
        lock.give(None)
        if lock.waiting:
            lock.wake()

    def bump():
        v = count[0]
        for _ in range(3):
            pass
        count[0] = v + 1

    def work(k):
        for _ in range(n):
            if k % 2:
                fast()
            else:
                lock.acquire()
                bump()
                lock.release()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a waiter was never woken"
    assert count[0] == 8 * n
    assert not lock.locked() and lock.waiting == []


def test_a_call_waits_for_the_thread_holding_its_lock():
    w = shared(np.zeros(3), name="w")
    step = function([], [], updates=[(w, w + 1)])
    lock = w.container.lock
    lock.acquire()
    done = threading.Event()
    t = threading.Thread(target=lambda: (step(), done.set()))
    t.start()
    assert not done.wait(0.2)  # the call waits: its update would be lost otherwise
    w.container.storage[0] = np.full(3, 10.0)  # what the holder writes
    lock.release()
    assert done.wait(10)
    t.join()
    np.testing.assert_array_equal(w.get_value(), np.full(3, 11.0))


def test_get_value_inside_a_call_that_updates_the_value():
    w = shared(np.arange(3.0), name="w")
    seen = []
    x = T.dvector("x")
    step = function([x], Callback(lambda: seen.append(w.get_value()))(x),
                    updates=[(w, w + 1)])
    np.testing.assert_array_equal(within(30, step, np.ones(3)), np.ones(3))
    np.testing.assert_array_equal(seen[0], np.arange(3.0))  # the value before the update
    np.testing.assert_array_equal(w.get_value(), np.arange(3.0) + 1)
    w.set_value(np.zeros(3))
    step(np.ones(3))   # and again, with the lock given back in between
    np.testing.assert_array_equal(w.get_value(), np.ones(3))


def test_a_callback_calls_another_function_updating_the_same_value():
    w = shared(np.zeros(2), name="w")
    other = function([], [], updates=[(w, w + 10)])
    x = T.dvector("x")
    outer = function([x], Callback(other)(x), updates=[(w, w + 1)])
    within(30, outer, np.ones(2))  # re-enters the lock: no deadlock
    # outer reads w in place, before or after the callback's update by the graph's order
    assert w.get_value()[0] in (1.0, 11.0)
    w.set_value(np.zeros(2))
    other()
    np.testing.assert_array_equal(w.get_value(), np.full(2, 10.0))
    assert not w.container.lock.locked()


def test_a_callback_calls_its_own_function_again():
    w = shared(np.zeros(2), name="w")
    depth = [0]
    x = T.dvector("x")

    def hook():
        if depth[0] == 0:
            depth[0] += 1
            f(np.ones(2))   # the primary frame is busy: a spare one, the lock re-entered

    f = function([x], Callback(hook)(x) * 2, updates=[(w, w + 1)])
    np.testing.assert_array_equal(within(30, f, np.ones(2)), [2.0, 2.0])
    assert f.n_frames == 2
    assert w.get_value()[0] in (1.0, 2.0)  # as above: w read before or after the inner call
    assert not w.container.lock.locked()
    f(np.ones(2))
    assert f.n_frames == 2


def test_a_failed_call_gives_its_lock_back():
    w = shared(np.zeros(2), name="w")

    def hook():
        raise ValueError("boom")

    x = T.dvector("x")
    f = function([x], Callback(hook)(x), updates=[(w, w + 1)])
    with pytest.raises(ValueError, match="boom"):
        f(np.ones(2))
    assert not w.container.lock.locked()
    np.testing.assert_array_equal(w.get_value(), np.zeros(2))
    with pytest.raises(TypeError):
        f("not a vector")   # a bad argument, before anything ran
    assert not w.container.lock.locked()


def test_a_shared_memory_copy_without_updates_excludes_the_original():
    # the copy reuses the original's intermediate cells: it takes the original's update lock
    # too (as its frame guard), and goes to a spare frame while the original runs
    w = shared(np.ones(4), name="w")
    x = T.dvector("x")
    f = function([x], T.tanh(x * w) + w, updates=[(w, w * 1.0)])
    g = f.copy(share_memory=True, delete_updates=True)
    assert w.container.lock in g._frame.guard
    data = [np.full(4, k / 8.0) for k in range(8)]
    expected = [g(d) for d in data]   # alone (a fused C kernel may round unlike NumPy)
    np.testing.assert_allclose(expected, [np.tanh(d) + 1 for d in data], rtol=1e-15)
    bad = []

    def work(k):
        fn = f if k % 2 else g
        for _ in range(300):
            if not np.array_equal(fn(data[k]), expected[k]):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
