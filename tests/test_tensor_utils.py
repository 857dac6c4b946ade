"""theano.tensor.utils: hash_from_ndarray and shape_of_variables, as Theano's own tests
(theano/tensor/tests/test_utils.py) plus the cases symgpu adds."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.utils import hash_from_ndarray, shape_of_variables


def test_hash_from_ndarray():
    rng = np.random.rand(5, 5)
    hashs = [hash_from_ndarray(np.asarray(d)) for d in [
        -2, -1, 0, 1, 2, np.zeros((1, 5)), np.zeros((1, 6)),
        np.zeros((1, 0)), np.zeros((2, 0)),                    # empty buffer, other shapes
        np.arange(25).reshape(5, 5), np.arange(25).reshape(5, 5).T,  # other strides
        np.zeros((5, 5), dtype="uint32"), np.zeros((5, 5), dtype="int32"),  # other dtypes
        rng, rng[1:], rng[:4], rng[1:3], rng[::2], rng[::-1]]]
    assert len(set(hashs)) == len(hashs)
    for view in (rng[1:], rng[1:3], rng[:4], rng[::2], rng[::-1]):
        assert hash_from_ndarray(view) == hash_from_ndarray(view.copy())
    assert hash_from_ndarray(rng) == hash_from_ndarray(rng.copy())
    assert len(hash_from_ndarray(rng)) == 64


def test_shape_of_variables_simple():
    x = T.matrix("x")
    y = x + x
    fgraph = FunctionGraph([x], [y], clone=False)
    assert shape_of_variables(fgraph, {x: (5, 5)}) == {x: (5, 5), y: (5, 5)}

    x = T.matrix("x")
    xt = x.T
    y = T.dot(x, xt)
    fgraph = FunctionGraph([x], [y], clone=False)
    shapes = shape_of_variables(fgraph, {x: (5, 1)})
    assert shapes[x] == (5, 1) and shapes[xt] == (1, 5) and shapes[y] == (5, 5)


def test_shape_of_variables_subtensor():
    x = T.matrix("x")
    subx = x[1:]
    fgraph = FunctionGraph([x], [subx], clone=False)
    assert shape_of_variables(fgraph, {x: (10, 10)})[subx] == (9, 10)


def test_shape_of_variables_several_inputs_and_constants():
    x, v = T.matrix("x"), T.vector("v")
    y = (x * v).sum(axis=0) + T.constant(np.ones(3))
    fgraph = FunctionGraph([x, v], [y], clone=False)
    shapes = shape_of_variables(fgraph, {x: (4, 3), v: (3,)})
    assert shapes[y] == (3,) and shapes[v] == (3,)


def test_shape_of_variables_errors():
    x = T.matrix("x")
    fgraph = FunctionGraph([x], [x[1:]])  # cloned: x is not its input
    with pytest.raises(ValueError, match="fgraph.inputs"):
        shape_of_variables(fgraph, {x: (10, 10)})
    fgraph = FunctionGraph([x], [x[1:]], clone=False)
    with pytest.raises(ValueError, match="entries"):
        shape_of_variables(fgraph, {x: (10,)})
    i = T.lscalar("i")
    fgraph = FunctionGraph([x, i], [x[:i]], clone=False)
    with pytest.raises(ValueError, match="no shape given for the input i"):
        shape_of_variables(fgraph, {x: (10, 10)})
    with pytest.raises(ValueError, match="depend on values"):
        shape_of_variables(fgraph, {x: (10, 10), i: ()})


def test_the_theano_path_imports(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "theano", symgpu)
    from theano.tensor.utils import shape_of_variables as sov  # noqa: PLC0415
    assert sov is shape_of_variables
