"""Test values (config.compute_test_value, tag.test_value, print_test_value), as Theano's
debugging FAQ uses them: a shape mistake fails when the graph is built, at the user's line."""
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Apply, Op, config
from symgpu.graph import basic as graph_basic
from symgpu.graph import test_value as tv


def line_of(marker: str) -> int:
    """The line of this file holding `marker` (so tests do not hard-code line numbers)."""
    with open(__file__) as fh:
        for n, text in enumerate(fh, 1):
            if marker in text and "line_of(" not in text:
                return n
    raise AssertionError(marker)


@pytest.fixture
def raise_mode():
    with config.change_flags(compute_test_value="raise"):
        yield


# ----------------------------------------------------------------------------- tag.test_value

def test_test_value_is_converted_to_the_type():
    x = T.dscalar("x")
    x.tag.test_value = 42
    assert isinstance(x.tag.test_value, np.ndarray)
    assert x.tag.test_value.dtype == np.float64 and x.tag.test_value == 42.0
    assert x.get_test_value() is x.tag.test_value


def test_wrong_ndim_test_value_is_a_clear_error():
    x = T.dmatrix("x")
    with pytest.raises(TypeError, match=r"TensorType\(float64, matrix\).*shape \(3,\).*2 dim"):
        x.tag.test_value = np.ones(3)
    assert not hasattr(x.tag, "test_value")


def test_unsafe_dtype_test_value_is_a_clear_error():
    v = T.fvector("v")
    with pytest.raises(TypeError, match=r"float32.*float64"):
        v.tag.test_value = np.ones(3)  # float64 into float32 could lose precision
    v.tag.test_value = np.ones(3, dtype="float32")
    assert v.tag.test_value.dtype == np.float32


def test_missing_test_value_raises_test_value_error():
    x = T.dvector("x")
    with pytest.raises(tv.TestValueError, match="x has no test value"):
        x.get_test_value()


def test_constants_and_shared_variables_have_their_value():
    c = T.constant(np.arange(3.0))
    assert np.array_equal(c.get_test_value(), np.arange(3.0))
    s = symgpu.shared(np.ones((2, 2)), "s")
    assert np.array_equal(s.get_test_value(), np.ones((2, 2)))
    s.set_value(np.zeros((2, 2)))
    assert np.array_equal(s.get_test_value(), np.zeros((2, 2)))


def test_clone_keeps_the_test_value_and_its_check():
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    y = x.clone()
    assert np.array_equal(y.tag.test_value, np.arange(3.0))
    with pytest.raises(TypeError):
        y.tag.test_value = np.ones((2, 2))


# ----------------------------------------------------------------------------- computing

def test_off_by_default_computes_nothing():
    assert config.compute_test_value == "off"
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    assert not hasattr((x * 2).tag, "test_value")


def test_intermediate_values_match_numpy(raise_mode):
    rng = np.random.default_rng(0)
    xv, wv = rng.random((5, 10)), rng.random((10, 3))
    x = T.dmatrix("x")
    x.tag.test_value = xv
    w = symgpu.shared(wv, "w")
    h = T.tanh(T.dot(x, w) + 1.0)
    out = h.sum(axis=1)
    np.testing.assert_allclose(h.tag.test_value, np.tanh(xv @ wv + 1.0))
    np.testing.assert_allclose(out.tag.test_value, np.tanh(xv @ wv + 1.0).sum(axis=1))


def test_shape_error_raises_at_graph_building_naming_the_line(raise_mode):
    # the debugging FAQ's example: W1 transformed to (20, 10), then dot of (5, 10) with it
    x = T.matrix("x")
    x.tag.test_value = np.random.rand(5, 10).astype(config.floatX)
    W1 = symgpu.shared(np.random.rand(2, 10, 10).astype(config.floatX), "W1")
    func_of_W1 = W1.dimshuffle(2, 0, 1).flatten(2).T
    assert func_of_W1.tag.test_value.shape == (20, 10)
    with pytest.raises(ValueError) as info:
        T.dot(x, func_of_W1)  # FAQ-LINE
    text = str(info.value)
    assert "(5, 10)" in text and "(20, 10)" in text
    assert "Test value computation failed" in text
    assert f"line {line_of('# FAQ-LINE')}" in text and __file__ in text
    assert info.value.node.op is not None


def test_elemwise_broadcast_mismatch_raises_when_built(raise_mode):
    x, y = T.dvector("x"), T.dvector("y")
    x.tag.test_value, y.tag.test_value = np.ones(2), np.ones(3)
    with pytest.raises(ValueError, match=r"shape \(2,\).*shape \(3,\)"):
        x + y


def test_undeclared_broadcast_raises_when_built_as_the_compiled_function_would(raise_mode):
    x, y = T.dvector("x"), T.dvector("y")  # length 1 is not broadcastable in a vector
    x.tag.test_value, y.tag.test_value = np.ones(1), np.ones(3)
    with pytest.raises(ValueError, match="need broadcasting along dimension 0"):
        x + y
    r = T.drow("r")
    r.tag.test_value = np.ones((1, 3))
    m = T.dmatrix("m")
    m.tag.test_value = np.ones((2, 3))
    assert (r + m).tag.test_value.shape == (2, 3)


def test_missing_input_value_raise(raise_mode):
    x, y = T.dvector("x"), T.dvector("y")
    x.tag.test_value = np.ones(2)
    with pytest.raises(tv.TestValueError, match=r"input 1 \(y.*has no test value"):
        x + y


def test_missing_input_value_warn():
    x, y = T.dvector("x"), T.dvector("y")
    with config.change_flags(compute_test_value="warn"):
        with pytest.warns(UserWarning, match="has no test value") as record:
            z = x + y  # WARN-LINE
            T.dot(x, y)  # through tensor/math.py's dot(): still the user's line
    assert not hasattr(z.tag, "test_value")
    assert [w.filename for w in record] == [__file__] * 2
    assert record[0].lineno == line_of("# WARN-LINE")
    assert record[1].lineno == line_of("# WARN-LINE") + 1


def test_missing_input_value_ignore():
    x, y = T.dvector("x"), T.dvector("y")
    with config.change_flags(compute_test_value="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            z = x + y
    assert not hasattr(z.tag, "test_value")


def test_missing_input_value_pdb(monkeypatch, capsys):
    import pdb
    calls = []
    monkeypatch.setattr(pdb, "set_trace", lambda *a, **k: calls.append(1))
    x, y = T.dvector("x"), T.dvector("y")
    with config.change_flags(compute_test_value="pdb"):
        x + y
    assert calls == [1]
    assert "has no test value" in capsys.readouterr().out


def test_assignment_sets_the_flag_too():
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    old = config.compute_test_value
    try:
        symgpu.config.compute_test_value = "warn"
        assert np.array_equal((x * 2).tag.test_value, np.arange(3.0) * 2)
    finally:
        symgpu.config.compute_test_value = old


def test_bad_flag_value_is_refused():
    from symgpu.config import ConfigError
    with pytest.raises(ConfigError, match="compute_test_value.*off, ignore, warn, raise, pdb"):
        config.change_flags(compute_test_value="always")


class ThunkOnlyDouble(Op):
    """An op with only a thunk (no perform): test values come from a one-node thunk."""
    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        cin, cout = storage_map[node.inputs[0]], storage_map[node.outputs[0]]

        def thunk():
            cout[0] = cin[0] * 2
        return thunk


def test_thunk_only_op_gets_test_values(raise_mode):
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    assert np.array_equal(ThunkOnlyDouble()(x).tag.test_value, np.arange(3.0) * 2)


def test_inplace_op_does_not_overwrite_the_input_test_value(raise_mode):
    from symgpu.tensor.elemwise import Elemwise
    from symgpu.scalar.basic import SCALAR_OPS
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    y = Elemwise(SCALAR_OPS["exp"], {0: 0})(x)
    np.testing.assert_allclose(y.tag.test_value, np.exp(np.arange(3.0)))
    assert np.array_equal(x.tag.test_value, np.arange(3.0))


def test_grad_and_compile_work_with_raise(raise_mode):
    rng = np.random.default_rng(1)
    x = T.dmatrix("x")
    x.tag.test_value = rng.random((4, 3))
    w = symgpu.shared(rng.random((3, 2)), "w")
    cost = (T.dot(x, w) ** 2).sum()
    gw = symgpu.grad(cost, w)
    assert gw.tag.test_value.shape == (3, 2)
    f = symgpu.function([x], [cost, gw])
    xv = rng.random((4, 3))
    c, g = f(xv)
    np.testing.assert_allclose(c, ((xv @ w.get_value()) ** 2).sum())
    np.testing.assert_allclose(g, 2 * xv.T @ (xv @ w.get_value()))


def test_rewrites_follow_compute_test_value_opt():
    made = []
    real = tv.compute_test_values

    def spy(node, action, base):
        made.append((node, action))
        return real(node, action, base)

    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    with config.change_flags(compute_test_value="raise"):
        out = T.log(1 + T.exp(x))  # rewritten to softplus
        import symgpu.graph.op as op_module
        op_module.compute_test_values = spy
        try:
            symgpu.function([x], out)
            assert made == []  # compute_test_value_opt is 'off'
            with config.change_flags(compute_test_value_opt="raise"):
                symgpu.function([x], out)
            assert made and {a for _, a in made} == {"raise"}
        finally:
            op_module.compute_test_values = real


# ----------------------------------------------------------------------------- printing

def test_print_test_value_repr_as_theano():
    x = T.scalar("x")
    x.tag.test_value = 42
    with config.change_flags(print_test_value=True):
        assert repr(x) == "x\n" + repr(np.asarray(42, dtype=config.floatX))
        assert str(x) == "x"
    assert repr(x) == "x"


def test_print_test_value_without_a_value_is_just_the_name():
    y = T.dvector("y")
    with config.change_flags(print_test_value=True):
        assert repr(y) == "y"


def test_graph_module_exports():
    assert graph_basic.TestValueError is tv.TestValueError


class Halves(Op):
    """Two outputs (first and second half of a vector), perform only."""
    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type(), x.type()])

    def perform(self, node, inputs, out):
        h = len(inputs[0]) // 2
        out[0][0], out[1][0] = inputs[0][:h].copy(), inputs[0][h:].copy()


def test_every_output_of_a_multi_output_node_gets_its_value(raise_mode):
    x = T.dvector("x")
    x.tag.test_value = np.arange(4.0)
    first, second = Halves()(x)
    assert np.array_equal(first.tag.test_value, [0.0, 1.0])
    assert np.array_equal(second.tag.test_value, [2.0, 3.0])


@pytest.mark.parametrize("action", ["ignore", "warn"])
def test_a_failing_computation_raises_whatever_the_action(action):
    x = T.dmatrix("x")
    x.tag.test_value = np.ones((2, 3))
    with config.change_flags(compute_test_value=action):
        with pytest.raises(ValueError, match="Test value computation failed"):
            T.dot(x, x)


def test_an_output_value_that_does_not_fit_its_type_is_named():
    class Wrong(Op):
        __props__ = ()

        def make_node(self, x):
            return Apply(self, [x], [T.dmatrix()])

        def perform(self, node, inputs, out):
            out[0][0] = inputs[0]  # a vector where a matrix was promised

    x = T.dvector("x")
    x.tag.test_value = np.ones(3)
    with config.change_flags(compute_test_value="raise"):
        with pytest.raises(TypeError, match=r"does not fit its output 0 \(TensorType\(float64, m"):
            Wrong()(x)


def test_strip_pickler_strips_variable_tags_and_keeps_their_check(tmp_path):
    import io
    import pickle
    from symgpu.misc.pkl_utils import StripPickler
    x = T.dvector("x")
    x.tag.test_value = np.arange(3.0)
    x.tag.note = "kept"
    buf = io.BytesIO()
    StripPickler(buf).dump(x)
    y = pickle.loads(buf.getvalue())
    assert not hasattr(y.tag, "trace") and not hasattr(y.tag, "test_value")
    assert y.tag.note == "kept" and hasattr(x.tag, "trace")  # the saved object is untouched
    with pytest.raises(TypeError, match="bad test value"):
        y.tag.test_value = np.ones((2, 2))
