"""Specialize: cheaper equivalent ops, same values."""
import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, rewritten, same_values  # noqa: F401

V = np.array([0.25, 0.5, 1.5, 3.0, 7.0])


@pytest.fixture
def x():
    return T.dvector("x")


@pytest.mark.parametrize("power,op", [(2, "sqr"), (0.5, "sqrt"), (-1, "reciprocal")])
def test_pow_specialised(x, power, op):
    out = x ** power
    f = rewritten([x], out)
    assert op_names(f) == [op]
    same_values([x], out, V)


def test_pow_minus_half_and_other_powers_kept(x):
    f = rewritten([x], x ** -0.5)
    assert op_names(f) == ["sqrt", "reciprocal"]
    same_values([x], x ** -0.5, V)
    assert op_names(rewritten([x], x ** 3.7)) == ["pow"]


def test_pow_of_integer_base_keeps_the_dtype():
    i = T.ivector("i")
    out = i ** 2
    f = rewritten([i], out)
    assert f(np.arange(4, dtype="int32")).dtype == function([i], out, mode="FAST_COMPILE")(
        np.arange(4, dtype="int32")).dtype
    np.testing.assert_array_equal(f(np.arange(4, dtype="int32")), [0, 1, 4, 9])


def test_sum_of_scaled_vector(x):
    s = T.dscalar("s")
    out = (s * x * 3).sum()
    f = rewritten([x, s], out)
    names = op_names(f)
    assert names[0] in ("Sum", "CAReduce") or "Sum" in names
    sum_node = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "CAReduce"][0]
    assert sum_node.inputs[0] is f.maker.fgraph.inputs[0]  # sums x itself, scales once
    same_values([x, s], out, V, 0.5)
    m, r = T.dmatrix("m"), T.drow("r")
    out = (m * r).sum(axis=0)  # r varies along the kept axis: it cannot move out
    same_values([m, r], out, np.ones((3, 4)), np.arange(4.0).reshape(1, 4))
    out = (-m / 4.0).sum(axis=1)
    same_values([m], out, np.arange(12.0).reshape(3, 4))


def test_sum_keeps_the_scaling_when_the_scaled_value_is_needed(x):
    s = T.dscalar("s")
    y = s * x
    f = rewritten([x, s], [y, y.sum()])
    sum_node = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "CAReduce"][0]
    assert sum_node.inputs[0] is not f.maker.fgraph.inputs[0]


def test_log1p_forms(x):
    for out in (T.log(1 + x), T.log(x + 1), T.log(1 - x / 10)):
        f = rewritten([x], out)
        assert "log1p" in op_names(f) and "log" not in op_names(f)
        same_values([x], out, V)
    tiny = np.array([1e-20])
    assert function([x], T.log(1 + x))(tiny)[0] == 1e-20


def test_expm1(x):
    out = T.exp(x) - 1
    f = rewritten([x], out)
    assert op_names(f) == ["expm1"]
    same_values([x], out, V)
    assert function([x], out)(np.array([1e-20]))[0] == 1e-20
