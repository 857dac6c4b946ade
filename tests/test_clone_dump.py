"""Theano's theano.clone, function_dump and theano.dot."""
import pickle
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.compile.function import function_dump


def test_clone_replaces_and_leaves_the_original_alone():
    x, y = T.dvectors("x", "y")
    z = T.exp(x) * 2 + x.sum()
    w = symgpu.clone(z, replace={x: y})
    xv = np.array([0.5, -1.0, 2.0])
    assert np.allclose(function([y], w)(xv), np.exp(xv) * 2 + xv.sum())
    assert np.allclose(function([x], z)(xv), np.exp(xv) * 2 + xv.sum())
    assert x not in symgpu.graph.basic.graph_inputs([w])


def test_clone_of_a_list_and_replacement_pairs():
    x = T.dscalar("x")
    a, b = x + 1, x * 3
    ca, cb = symgpu.clone([a, b], replace=[(x, T.constant(2.0))])
    assert (ca.eval(), cb.eval()) == (3.0, 6.0)
    ct = symgpu.clone((a, b))
    assert isinstance(ct, tuple) and ct[0] is not a


def test_share_inputs():
    x = T.dvector("x")
    s = shared(np.ones(3), name="s")
    z = x + s
    shared_copy = symgpu.clone(z)
    own_copy = symgpu.clone(z, share_inputs=False)
    ins = symgpu.graph.basic.graph_inputs([shared_copy])
    assert x in ins and s in ins and shared_copy is not z
    ins2 = symgpu.graph.basic.graph_inputs([own_copy])
    assert x not in ins2 and s in ins2  # shared variables stay shared
    x2 = [v for v in ins2 if v.name == "x"][0]
    assert np.allclose(function([x2], own_copy)(np.arange(3.0)), np.arange(3.0) + 1)


def test_strict_replacement_types():
    x = T.dvector("x")
    z = x * 2
    with pytest.raises(TypeError):
        symgpu.clone(z, replace={x: T.ivector("i")})
    loose = symgpu.clone(z, replace={x: T.ivector("i")}, strict=False)
    assert loose.ndim == 1
    m = symgpu.clone(z, replace={x: T.dmatrix("m")}, strict=False)
    assert m.ndim == 2


def test_clone_with_a_replacement_graph():
    x, y = T.dscalars("x", "y")
    z = x ** 2
    w = symgpu.clone(z, replace={x: y + 1})
    assert function([y], w)(2.0) == 9.0


def test_function_dump_reproduces_the_function(tmp_path):
    x = T.dmatrix("x")
    s = shared(np.zeros(()), name="acc")
    out = T.tanh(x).sum()
    fname = tmp_path / "fn.pkl"
    function_dump(fname, [x], out, updates=[(s, s + out)], name="dumped")
    with open(fname, "rb") as f:
        d = pickle.load(f)
    assert d["name"] == "dumped" and "rebuild_strict" not in d
    g = function(**d)
    xv = np.arange(6.0).reshape(2, 3) / 6
    assert np.allclose(g(xv), np.tanh(xv).sum())
    assert np.allclose(d["updates"][0][0].get_value(), np.tanh(xv).sum())
    assert np.allclose(s.get_value(), 0)  # the pickle's shared variable, not ours
    assert getattr(x.tag, "trace", None) is not None  # the originals keep their tags
    assert "trace" not in d["inputs"][0].tag.__dict__


def test_function_dump_to_an_open_file_and_extra_tags(tmp_path):
    x = T.dvector("x")
    x.tag.note = "drop me"
    fname = tmp_path / "f2.pkl"
    with open(fname, "wb") as f:
        function_dump(f, [x], x * 2, extra_tag_to_remove=["note"])
    d = pickle.load(open(fname, "rb"))
    assert not hasattr(d["inputs"][0].tag, "note") and x.tag.note == "drop me"
    assert np.allclose(function(**d)(np.ones(2)), 2)
    with pytest.raises(ValueError):
        function_dump(fname, [x], x, rebuild_strict=False)


def test_theano_dot_and_names_through_the_alias():
    a, b = T.dmatrix("a"), T.dvector("b")
    av, bv = np.arange(6.0).reshape(2, 3), np.arange(3.0)
    assert np.allclose(function([a, b], symgpu.dot(a, b))(av, bv), av @ bv)
    saved = sys.modules.get("theano")
    sys.modules["theano"] = symgpu
    try:
        import theano
        assert theano.clone is symgpu.clone and theano.function_dump is function_dump
        from theano.compile.function import function_dump as fd
        assert fd is function_dump
    finally:
        if saved is None:
            sys.modules.pop("theano", None)
        else:
            sys.modules["theano"] = saved
