"""The single-threaded call path: a VM hook set after compiling is seen by the generated call
(the VM routes its `run`), and the ufunc thunk's one-element constants (held as 0-d arrays)
give NumPy's results, shapes and dtypes."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import config, function, shared
from symgpu.compile.debugmode import DebugVM
from symgpu.compile.mode import Mode
from symgpu.graph.basic import Constant

NO_REWRITES = Mode("FAST_RUN").excluding_tags("fast_run", "fast_compile")


def test_runner_and_profiler_set_after_compiling_are_called():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    vm = f.vm
    assert vm.dispatch == vm.run_thunks  # no hook: the generated call runs the thunks
    ran = []

    def runner():
        ran.append("runner")
        vm.run_thunks()

    vm.runner = runner
    assert vm.dispatch is runner   # called directly: no VM.__call__ in between
    np.testing.assert_allclose(f(np.zeros(2)), [1.0, 1.0])
    vm.profiler = lambda v: (ran.append("profiler"), v.run_thunks())
    np.testing.assert_allclose(f(np.ones(2)), np.exp([1.0, 1.0]))
    assert ran == ["runner", "profiler"]  # the profiler takes precedence, as in VM.__call__
    vm.profiler = None
    vm.runner = None
    f(np.ones(2))
    assert ran == ["runner", "profiler"]
    assert vm.dispatch == vm.run_thunks


def test_hooks_reach_the_trusted_and_spare_frame_calls():
    x = T.dvector("x")
    f = function([x], x * 2)
    f.trust_input = True
    f(np.ones(2))  # generates the trusted call
    calls = []
    f.vm.runner = lambda: (calls.append(1), f.vm.run_thunks())
    np.testing.assert_array_equal(f(np.ones(2)), [2.0, 2.0])
    assert calls == [1]
    spare = f._take_spare()  # a spare frame has its own VM and routes it the same way
    ran = []
    spare.vm.runner = lambda: (ran.append(1), spare.vm.run_thunks())
    np.testing.assert_array_equal(spare.caller(f._filters, None)(np.ones(2)), [2.0, 2.0])
    assert ran == [1]


def test_a_checking_vm_is_always_called_through_its_own_call():
    x = T.dvector("x")
    f = function([x], x + 1, mode="DebugMode")
    assert isinstance(f.vm, DebugVM)
    assert f.vm.dispatch is f.vm
    np.testing.assert_array_equal(f(np.zeros(3)), np.ones(3))


def test_function_without_nodes_still_calls_its_hooks():
    x = T.dvector("x")
    f = function([x], x)
    assert f.vm.thunks == []
    seen = []
    f.vm.runner = lambda: seen.append(1)
    f(np.ones(1))
    assert seen == [1]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(4,), (1,), (0,), (3, 5), (1, 1)])
def test_one_element_constants_give_numpy_results(dtype, shape):
    x = T.TensorType(dtype, (False,) * len(shape))("x")
    value = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    one = np.ones((1,) * len(shape), dtype=dtype)
    for expr, expected in [(x + 1, value + one), (1 - x, one - value),
                           (T.maximum(x, 2), np.maximum(value, 2 * one)),
                           (x * np.asarray([[3]], dtype=dtype).reshape((1,) * len(shape)),
                            value * 3)]:
        f = function([x], expr, mode="FAST_COMPILE")
        got = f(value)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_a_one_element_constant_is_held_as_a_0d_array():
    x = T.fvector("x")
    f = function([x], x + 1, mode="FAST_COMPILE")
    node = f.vm.nodes[0]
    const = [v for v in node.inputs if isinstance(v, Constant)]
    assert const and const[0].data.shape == (1,)
    f(np.ones(4, "float32"))
    # the thunk's closure holds the 0-d value in a cell of its own; the graph is unchanged
    cells = [c.cell_contents for c in f.vm.thunks[0].__closure__]
    held = [c for c in cells if isinstance(c, list) and len(c) == 1
            and isinstance(c[0], np.ndarray) and c[0].shape == ()]
    assert len(held) == 1 and held[0][0] == 1.0
    assert const[0].data.shape == (1,)


def test_constants_of_another_dtype_keep_their_shape_and_promotion():
    x = T.fvector("x")
    with config.change_flags(floatX="float32"):
        c = T.constant(np.ones(1, dtype="float64"))
    f = function([x], x + c, mode="FAST_COMPILE")
    got = f(np.full(2, 0.1, dtype="float32"))
    expected = np.full(2, 0.1, dtype="float32") + np.ones(1)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    cells = [c.cell_contents for c in f.vm.thunks[0].__closure__]
    assert not any(isinstance(c, list) and len(c) == 1 and isinstance(c[0], np.ndarray)
                   and c[0].shape == () for c in cells)


def test_a_node_of_constants_only_keeps_its_shape():
    a = T.constant(np.ones((1, 1)))
    b = T.constant(np.full((1, 1), 2.0))
    f = function([], a + b, mode=NO_REWRITES)
    assert [type(v) for v in f.vm.nodes[0].inputs] == [type(a), type(b)]  # not folded
    got = f()
    assert got.shape == (1, 1)
    np.testing.assert_array_equal(got, [[3.0]])


def test_updates_with_constants_in_threads_are_exact():
    # the update-only function of benchmarks/cpu_overhead.py, from several threads
    import threading
    u = shared(np.zeros(4, dtype="float32"))
    f = function([], updates=[(u, u + 1)])
    threads = [threading.Thread(target=lambda: [f() for _ in range(300)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(u.get_value(), np.full(4, 1200.0, dtype="float32"))


def test_trust_input_switches_the_call_path_both_ways():
    x = T.dvector("x")
    f = function([x], x * 2)
    with pytest.raises(TypeError, match=r"bad argument for input 'x' \(#0\)"):
        f([1, "a"])
    f.trust_input = True
    assert f.trust_input is True
    np.testing.assert_array_equal(f(np.ones(2)), [2.0, 2.0])
    np.testing.assert_array_equal(f(x=np.ones(2)), [2.0, 2.0])  # bound, then trusted
    f.trust_input = False
    np.testing.assert_array_equal(f([1, 2]), [2.0, 4.0])  # converted by the filter again
    with pytest.raises(TypeError, match=r"bad argument for input 'x' \(#0\)"):
        f(np.ones((2, 2)))


def test_values_needing_conversion_take_the_filter():
    x = T.fvector("x")
    f = function([x], x + 1, allow_input_downcast=True)
    got = f(np.arange(3.0))  # float64 -> float32: the filter converts
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0])
    ok = np.arange(3, dtype="float32")
    assert f._filters[0].accept(ok) and not f._filters[0].accept(np.arange(3.0))


def test_errors_in_the_thunks_run_by_the_call_name_the_node_and_free_the_frame():
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], T.exp(x) + y)
    with pytest.raises(ValueError, match="Apply node that caused the error"):
        f(np.ones(2), np.ones(3))
    np.testing.assert_allclose(f(np.zeros(2), np.ones(2)), [2.0, 2.0])
    assert f.n_frames == 1  # the primary frame was given back: no spare was needed
