"""function(), In/Out, shared variables, updates, givens, and the 'nothing is lost' rules."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import In, Out, function, shared
from symgpu.compile.function import UnusedInputError
from symgpu.graph.fg import MissingInputError


def test_single_and_list_outputs():
    x = T.dvector("x")
    f = function([x], x * 2)
    g = function([x], [x * 2, x + 1])
    h = function([x], [x * 2])
    a = np.arange(3.0)
    np.testing.assert_array_equal(f(a), a * 2)
    r = g(a)
    assert isinstance(r, list) and len(r) == 2
    np.testing.assert_array_equal(r[1], a + 1)
    assert isinstance(h(a), list)


def test_no_outputs_with_updates():
    s = shared(np.zeros(2), name="s")
    inc = function([], updates=[(s, s + 1)])
    assert inc() == []
    inc()
    np.testing.assert_array_equal(s.get_value(), [2.0, 2.0])


def test_updates_are_simultaneous():
    a = shared(1.0, name="a")
    b = shared(2.0, name="b")
    swap = function([], [], updates={a: b, b: a})
    swap()
    assert a.get_value() == 2.0 and b.get_value() == 1.0


def test_in_defaults_and_keywords():
    x, y = T.dscalar("x"), T.dscalar("y")
    f = function([x, In(y, value=10.0, name="yy")], x + y)
    assert f(1.0) == 11.0
    assert f(1.0, 2.0) == 3.0
    assert f(1.0, yy=5.0) == 6.0
    assert f(x=2.0) == 12.0
    with pytest.raises(TypeError, match="no input named"):
        f(1.0, zz=2.0)
    with pytest.raises(TypeError, match="twice"):
        f(1.0, 2.0, yy=3.0)


def test_missing_argument_named():
    x, y = T.dscalar("x"), T.dscalar("y")
    f = function([x, y], x + y)
    with pytest.raises(TypeError, match="missing argument.*y"):
        f(1.0)
    with pytest.raises(TypeError, match="takes 2 argument"):
        f(1.0, 2.0, 3.0)


def test_wrong_ndim_names_input():
    x = T.dmatrix("x")
    f = function([x], x.sum(), name="fn")
    with pytest.raises(TypeError, match=r"input 'x' \(#0\) of function 'fn'.*2 dimension"):
        f(np.ones(3))


def test_wrong_kind_names_input():
    x = T.ivector("idx")
    f = function([x], x + 1)
    with pytest.raises(TypeError, match="idx"):
        f(np.array([0.5, 1.5]))
    with pytest.raises(TypeError, match="idx"):
        f(["a", "b"])


def test_downcast_rules():
    x = T.fvector("x")
    f = function([x], x * 2)
    assert f([1.0, 2.0]).dtype == np.float32  # Python floats are accepted
    with pytest.raises(TypeError, match="x"):
        f(np.array([1.0, 2.0], dtype="float64"), ) if False else function(
            [In(x, allow_downcast=False)], x)(np.array([1.0], dtype="float64"))
    g = function([x], x, allow_input_downcast=True)
    assert g(np.array([1.0], dtype="float64")).dtype == np.float32


def test_unused_input_policy():
    x, y = T.dscalar("x"), T.dscalar("y")
    with pytest.raises(UnusedInputError, match="y"):
        function([x, y], x * 2)
    with pytest.warns(UserWarning):
        function([x, y], x * 2, on_unused_input="warn")
    f = function([x, y], x * 2, on_unused_input="ignore")
    assert f(1.0, 2.0) == 2.0


def test_missing_input_error():
    x, y = T.dscalar("x"), T.dscalar("y")
    with pytest.raises(MissingInputError, match="y"):
        function([x], x + y)


def test_bad_inputs_list():
    x = T.dscalar("x")
    s = shared(1.0)
    with pytest.raises(TypeError, match="list"):
        function(x, x)
    with pytest.raises(TypeError, match="shared"):
        function([s], s * 2)
    with pytest.raises(TypeError, match="constant"):
        function([T.constant(1.0)], x, on_unused_input="ignore")
    with pytest.raises(ValueError, match="twice"):
        function([x, x], x)


def test_givens():
    x, y = T.dscalar("x"), T.dscalar("y")
    s = shared(3.0, name="s")
    f = function([y], x * 2, givens={x: y + s})
    assert f(1.0) == 8.0


def test_update_type_mismatch_is_clear():
    s = shared(np.zeros(2, dtype="float32"), name="w")
    x = T.dvector("x")
    with pytest.raises(TypeError, match="w"):
        function([x], [], updates={s: s + x})


def test_get_value_does_not_alias():
    arr = np.zeros(3)
    s = shared(arr)
    arr[0] = 5  # the shared value was copied at creation
    assert s.get_value()[0] == 0
    v = s.get_value()
    v[1] = 7
    assert s.get_value()[1] == 0
    b = s.get_value(borrow=True)
    b[2] = 9
    assert s.get_value()[2] == 9  # borrow gives the internal buffer
    arr2 = np.ones(3)
    s2 = shared(arr2, borrow=True)
    arr2[0] = 4
    assert s2.get_value()[0] == 4


def test_set_value_copies_unless_borrow():
    s = shared(np.zeros(2))
    new = np.ones(2)
    s.set_value(new)
    new[0] = 5
    assert s.get_value()[0] == 1
    s.set_value(new, borrow=True)
    new[1] = 6
    assert s.get_value()[1] == 6


def test_set_value_refuses_bad_ndim_and_dtype():
    s = shared(np.zeros((2, 2), dtype="float32"), name="w")
    before = s.get_value()
    with pytest.raises(TypeError, match="dimension"):
        s.set_value(np.zeros(3, dtype="float32"))
    with pytest.raises(TypeError, match="float32"):
        s.set_value(np.zeros((2, 2), dtype="complex128"))
    with pytest.raises(TypeError):
        s.set_value(np.array([["a", "b"], ["c", "d"]]))
    np.testing.assert_array_equal(s.get_value(), before)


def test_failed_call_leaves_shared_untouched():
    w = shared(np.ones(3), name="w")
    n = shared(np.int64(0), name="n")
    x = T.dvector("x")
    # the update of w succeeds first; the dot with a wrongly sized x fails afterwards
    f = function([x], T.dot(x, w), updates={w: w * 2, n: n + 1})
    f(np.ones(3))
    np.testing.assert_array_equal(w.get_value(), 2 * np.ones(3))
    with pytest.raises(ValueError):
        f(np.ones(4))
    np.testing.assert_array_equal(w.get_value(), 2 * np.ones(3))
    assert n.get_value() == 1


def test_runtime_error_names_node_shapes_and_user_line():
    x, y = T.dvector("x"), T.dvector("y")
    z = x + y  # the line the error must point at
    f = function([x, y], z)
    with pytest.raises(ValueError) as info:
        f(np.ones(3), np.ones(4))
    msg = str(info.value)
    assert "Apply node that caused the error" in msg
    assert "Elemwise{add" in msg
    assert "(3,)" in msg and "(4,)" in msg
    assert "Inputs strides" in msg
    assert "test_function.py" in msg and "z = x + y" in msg


def test_outputs_do_not_alias_inputs_or_shared():
    x = T.dvector("x")
    a = np.arange(3.0)
    f = function([x], x)
    r = f(a)
    r[0] = 100
    assert a[0] == 0
    s = shared(np.arange(3.0))
    g = function([], s)
    r = g()
    r[0] = 100
    assert s.get_value()[0] == 0
    h = function([x], x.T)  # a view of the input
    r = h(a)
    r[1] = 100
    assert a[1] == 1


def test_results_are_fresh_each_call():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    r1 = f(np.zeros(2))
    r2 = f(np.ones(2))
    np.testing.assert_array_equal(r1, [1, 1])
    assert r2[0] != 1


def test_eval():
    x = T.dscalar("x")
    assert (x * 3).eval({x: 2.0}) == 6.0
    assert T.constant(4.0).eval() == 4.0


def test_shared_scalar_int_and_float_defaults():
    s = shared(0)
    assert str(s.type) == "TensorType(int64, scalar)"
    s.set_value(1)
    assert s.get_value() == 1
    with symgpu.config.change_flags(floatX="float32"):
        assert shared(0.5).dtype == "float32"


def test_fgraph_exposed():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    nodes = f.maker.fgraph.toposort()
    assert any(isinstance(n.op, T.Elemwise) for n in nodes)
    assert len(f.maker.fgraph.inputs) == 1 and len(f.maker.fgraph.outputs) == 1
