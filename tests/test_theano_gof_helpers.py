"""Theano's theano.gof.graph walking functions and theano.gof.utils helpers (issue 31): each
through Theano's path, checked on small graphs against what Theano 1.0 returns."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gof import graph as G
from symgpu.gof import utils as U


@pytest.fixture
def g():
    x, y = T.dvector("x"), T.dvector("y")
    s = x + y
    z = s * x + 2
    return x, y, s, z


def test_inputs_variables_orphans_ops(g):
    x, y, s, z = g
    assert G.inputs([z])[:2] == [x, y] and all(v.owner is None for v in G.inputs([z]))
    assert G.inputs([z], blockers=[s]) == [x, G.orphans([x, y], [z])[0]]
    two = G.orphans([x, y], [z])
    assert len(two) == 1 and isinstance(two[0], T.TensorConstant) and two[0].data == 2
    found = G.variables([x, y], [z])
    assert {x, y, s, z} <= set(found) and found[0] is z
    assert G.variables_and_orphans([x, y], [z]) == (found, two)
    assert G.ops([x, y], [z]) == {v.owner for v in found if v.owner is not None}
    assert s.owner in G.ops([x, y], [z]) and G.ops([s, x], [z]) == {z.owner, z.owner.inputs[0].owner,
                                                                   z.owner.inputs[1].owner}
    nodes = G.list_of_nodes([x, y], [z])
    assert nodes[0] is z.owner and set(nodes) == G.ops([x, y], [z])
    assert G.list_of_nodes([s], [z]) and s.owner not in G.list_of_nodes([s], [z])


def test_stack_search_orders_and_inverse():
    graph = {1: [2, 3], 2: [4], 3: [4], 4: []}
    assert G.stack_search([1], graph.get) == [1, 2, 3, 4]
    assert G.stack_search([1], graph.get, "dfs") == [1, 3, 4, 2]
    order, inv = G.stack_search([1], graph.get, build_inv=True)
    assert order == [1, 2, 3, 4] and inv[4] == [2, 3] and inv[2] == [1]
    with pytest.raises(ValueError, match="bfs"):
        G.stack_search([1], graph.get, "sideways")


def test_clone_and_clone_get_equiv(g):
    x, y, s, z = g
    (cx, cy), (cz,) = G.clone([x, y], [z])
    assert cx is not x and cz is not z and G.inputs([cz])[:2] == [cx, cy]
    f = symgpu.function([cx, cy], cz)
    a, b = np.arange(3.0), np.ones(3)
    np.testing.assert_allclose(f(a, b), (a + b) * a + 2)
    (kx, ky), (kz,) = G.clone([x, y], [z], copy_inputs=False)
    assert (kx, ky) == (x, y) and kz is not z and G.orphans([x, y], [kz])[0] is G.orphans([x, y], [z])[0]
    equiv = G.clone_get_equiv([x, y], [z])
    assert equiv[z.owner] is equiv[z].owner and equiv[s].owner.op == s.owner.op
    const = G.orphans([x, y], [z])[0]
    assert equiv[const] is not const
    assert G.clone_get_equiv([x, y], [z], copy_orphans=False)[const] is const
    memo = {x: y}
    assert G.inputs([G.clone_get_equiv([x, y], [z], memo=memo)[z]])[:1] == [y]


def test_general_toposort_and_clients():
    deps = {"a": ["b", "c"], "b": ["c"], "c": []}
    clients: dict = {}
    order = G.general_toposort(["a"], deps.__getitem__, clients=clients)
    assert order == ["c", "b", "a"] and sorted(clients["c"]) == ["a", "b"]
    with pytest.raises(ValueError, match="cycle"):
        G.general_toposort(["a"], {"a": ["b"], "b": ["a"]}.__getitem__)


def test_is_in_ancestors_and_connection_pattern(g):
    x, y, s, z = g
    assert G.is_in_ancestors(z.owner, s.owner) and G.is_in_ancestors(z.owner, z.owner)
    assert not G.is_in_ancestors(s.owner, z.owner)
    assert G.io_connection_pattern([x, y], [s, x * 2]) == [[True, True], [True, False]]
    # an output the ops say is disconnected from an input is not connected
    from symgpu.gradient import disconnected_grad
    assert G.io_connection_pattern([x, y], [disconnected_grad(x) + y]) == [[False], [True]]


def test_is_same_graph(g):
    x, y, s, z = g
    assert G.is_same_graph(z, (x + y) * x + 2)
    assert not G.is_same_graph(z, (y + x) * x + 2) and not G.is_same_graph(z, (x + y) * x + 3)
    w = T.dvector("w")
    assert not G.is_same_graph(x + 1, w + 1)
    assert G.is_same_graph(x + 1, w + 1, givens={x: w})


def test_view_roots_and_node(g):
    x, y, s, z = g
    v = x[1:]
    assert G.view_roots(v) == [x] and G.view_roots(s) == [s] and G.view_roots(x) == [x]
    assert G.view_roots(x.dimshuffle("x", 0)) == [x]
    assert isinstance(x, G.Node) and isinstance(z.owner, G.Node) and not isinstance(1, G.Node)


def test_as_string_and_op_as_string(g):
    x, y, s, z = g
    text = G.as_string([x, y], [z])[0]
    assert text.count("add") == 2 and "x" in text and "y" in text
    assert G.as_string([x, y], [s, s * 2]) == [f"*1 -> {s.owner.op}(x, y)",
                                               f"{(s * 2).owner.op}(*1, {G.as_string([x, y], [(s * 2).owner.inputs[1]])[0]})"]
    assert G.op_as_string([x, y], s.owner) == f"{s.owner.op}(x, y)"
    m = s * x
    assert G.as_string([s, x], [m], leaf_formatter=lambda r: "L") == [f"{m.owner.op}(L, L)"]
    assert G.as_string([x, y], [m], node_formatter=lambda n, args: "+".join(args)) == ["x+y+x"]


def test_nodes_constructed(g):
    x, *_ = g
    with G.nodes_constructed() as made:
        out = T.exp(x)
    assert out in made and x not in made
    T.exp(x)
    assert len(made) == 1 and symgpu.Variable.construction_observers == []


# --- gof.utils ----------------------------------------------------------------------------

def test_sequence_helpers():
    assert U.uniq([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert U.difference([1, 2, 3, 4], [2, 4]) == [1, 3]
    assert U.remove(lambda v: v % 2, [1, 2, 3, 4]) == [2, 4]
    assert U.flatten([1, [2, (3, [4])], "ab"]) == [1, 2, 3, 4, "ab"]
    assert U.flatten(5) == [5]


def test_toposort():
    order = U.toposort({"a": ["b", "c"], "b": ["c"], "d": []})
    assert order.index("c") < order.index("b") < order.index("a") and set(order) == set("abcd")
    with pytest.raises(ValueError, match="cycle"):
        U.toposort({1: [2], 2: [1]})


def test_memoize_calls_once_per_arguments():
    calls = []

    @U.memoize
    def square(v, k=1):
        calls.append(v)
        return v * v * k
    assert square(3) == 9 and square(3) == 9 and square(3, k=2) == 18 and calls == [3, 3]


def test_deprecated_warns_once():
    @U.deprecated("mod", "use g")
    def f(v):
        return v + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(1) == 2 and f(2) == 3
    assert len(caught) == 1 and "mod.f deprecated. use g" in str(caught[0].message)
    assert caught[0].category is DeprecationWarning


def test_hashes(tmp_path):
    import hashlib
    path = tmp_path / "f.txt"
    path.write_bytes(b"kernel source")
    assert U.hash_from_file(str(path)) == "m" + hashlib.sha256(b"kernel source").hexdigest()
    assert U.hash_from_code("kernel source") == U.hash_from_file(os.fspath(path))


def test_stack_helpers_and_method_not_defined():
    stack = U.simple_extract_stack()
    assert stack[-1][2] == "test_stack_helpers_and_method_not_defined"
    assert stack[-1][0] == __file__ and "simple_extract_stack" in stack[-1][3]
    assert all(__file__ not in f for f, *_ in U.simple_extract_stack(skips=[__file__]))
    x = T.dvector("x")
    assert U.add_tag_trace(x) is x
    assert x.tag.trace[-1].name == "test_stack_helpers_and_method_not_defined"
    assert len(U.add_tag_trace(x, user_line=0).tag.trace) == 0
    assert issubclass(U.MethodNotDefined, Exception)
    with pytest.raises(U.MethodNotDefined):
        raise U.MethodNotDefined("perform")


def test_sharing_memory_walks_views_and_in_place_ops(g):
    """symgpu.graph.traversal.sharing_memory (the graph runner's outputs' memory, the
    elementwise groups' in-place rule): views and destroyed inputs, not computed values."""
    from symgpu.graph.traversal import sharing_memory
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.tensor.elemwise import Elemwise
    x, y, s, z = g
    v = x[1:].dimshuffle("x", 0)
    w = Elemwise(SCALAR_OPS["add"], {0: 0})(v, v)          # in place on its first input
    got = sharing_memory([w])
    assert {w, v, x} <= got and y not in got
    assert sharing_memory([s]) == {s}                        # a new array: itself only
