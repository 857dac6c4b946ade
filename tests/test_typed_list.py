"""symgpu.typed_list (Theano's typed_list): the type, every op against Python's list, lists
of vectors and matrices, nested lists, in-place versions, errors."""
import copy
import pickle

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
import symgpu.typed_list as tl
from symgpu import function
from symgpu.graph.op import ShapeError
from symgpu.tensor.rewriting.shape_feature import node_shapes
from symgpu.typed_list import TypedListType

rng = np.random.default_rng(0)


def vals(n, *shape):
    return [rng.standard_normal(shape) for _ in range(n)]


def same(got, want):
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


ELEM = {"vector": (T.dvector, (3,)), "matrix": (T.dmatrix, (2, 3))}


def test_import_symgpu_does_not_import_typed_list():
    import subprocess
    import sys
    code = "import sys, symgpu; print('symgpu.typed_list' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_type_filter_eq_depth():
    t = TypedListType(T.dvector)
    assert t == TypedListType(T.dvector) and hash(t) == hash(TypedListType(T.dvector))
    assert t != TypedListType(T.fvector) and t != TypedListType(T.dmatrix)
    assert str(t) == f"TypedList <{T.dvector}>"
    v = [np.ones(3), np.zeros(2)]
    assert all(a is b for a, b in zip(t.filter(v, strict=True), v))
    same(t.filter((np.ones(3),)), [np.ones(3)])
    with pytest.raises(TypeError):
        t.filter([np.ones((2, 2))])            # a matrix in a list of vectors
    with pytest.raises(TypeError):
        t.filter(np.ones(3))                    # not a list
    with pytest.raises(TypeError):
        t.filter((np.ones(3),), strict=True)    # strict: a list only
    nested = TypedListType(T.dvector, 2)
    assert nested.get_depth() == 2 and t.get_depth() == 0
    assert nested == TypedListType(TypedListType(TypedListType(T.dvector)))
    assert nested.filter([[[np.ones(2)]], []]) is not None
    with pytest.raises(TypeError):
        nested.filter([[np.ones(2)]])
    with pytest.raises(ValueError):
        TypedListType(T.dvector, -1)
    with pytest.raises(TypeError):
        TypedListType("float64")
    assert t.values_eq([np.ones(2)], [np.ones(2)]) and not t.values_eq([np.ones(2)], [])
    a = np.ones(3)
    assert t.may_share_memory([a], [a[1:]]) and not t.may_share_memory([a], [np.ones(3)])


@pytest.mark.parametrize("kind", sorted(ELEM))
def test_ops_against_python_lists(kind):
    ttype, shape = ELEM[kind]
    x, z = TypedListType(ttype)("x"), TypedListType(ttype)("z")
    e, i = ttype("e"), T.lscalar("i")
    xs, zs = vals(4, *shape), vals(2, *shape)
    ev = vals(1, *shape)[0]
    keep = [v.copy() for v in xs]
    f = function([x, z, e, i], [x[i], x[1:3], x[::-1], x[-1], x.append(e), x.extend(z),
                                x.insert(i, e), x.reverse(), tl.length(x)])
    got = f(xs, zs, ev, 2)
    np.testing.assert_array_equal(got[0], xs[2])
    same(got[1], xs[1:3])
    same(got[2], xs[::-1])
    np.testing.assert_array_equal(got[3], xs[-1])
    same(got[4], xs + [ev])
    same(got[5], xs + zs)
    py = list(xs)
    py.insert(2, ev)
    same(got[6], py)
    same(got[7], xs[::-1])
    assert int(got[8]) == len(xs) and got[8].dtype == np.int64
    same(xs, keep)                     # no input list changed
    g = function([x, e, i], x.insert(i, e))
    for j in (-1, 0, 10, -10):         # Python's insert rules outside the range
        py = list(xs)
        py.insert(j, ev)
        same(g(xs, ev, j), py)
    with pytest.raises(IndexError):
        function([x, i], x[i])(xs, 10)


@pytest.mark.parametrize("kind", sorted(ELEM))
def test_remove_index_count(kind):
    ttype, shape = ELEM[kind]
    x, e = TypedListType(ttype)(), ttype()
    a, b, c = vals(3, *shape)
    f = function([x, e], [x.remove(e), x.ind(e), x.count(e)])
    lst = [a, b, c, b.copy()]
    rem, ind, cnt = f(lst, b)
    same(rem, [a, c, b])               # the first equal element only
    assert int(ind) == 1 and int(cnt) == 2
    assert ind.dtype == cnt.dtype == np.int64
    assert len(lst) == 4
    with pytest.raises(ValueError, match="not in the list"):   # as list.index
        function([x, e], x.ind(e))([a], b)
    assert int(function([x, e], x.count(e))([a], b)) == 0
    same(function([x, e], x.remove(e))([a], b), [a])            # Theano: nothing removed


def test_nested_lists_and_make_list():
    inner = TypedListType(T.dvector)
    x = TypedListType(T.dvector, 1)()
    y = inner()
    a, b = vals(2, 2)
    f = function([x, y], [x[0], x.append(y), tl.length(x[1])])
    got = f([[a], [a, b]], [b])
    same(got[0], [a])
    assert len(got[1]) == 3 and len(got[1][2]) == 1
    assert int(got[2]) == 2
    u, v = T.dmatrix(), T.dmatrix()
    m = tl.make_list([u, v])
    assert m.type == TypedListType(T.dmatrix)
    ua, va = vals(2, 2, 2)
    out = function([u, v], m)(ua, va)
    same(out, [ua, va])
    assert not np.shares_memory(out[0], ua)
    same(function([u], tl.make_list([u, np.ones((2, 2))]))(ua), [ua, np.ones((2, 2))])
    with pytest.raises(TypeError, match="one type"):
        tl.make_list([u, T.dvector()])


def test_function_takes_and_returns_a_list():
    x = TypedListType(T.dmatrix)("x")
    f = function([x], x.append(x[0] * 2).reverse())
    a, b = vals(2, 2, 2)
    same(f([a, b]), [a * 2, b, a])
    same(f((a,)), [a * 2, a])          # a tuple is taken as a list
    with pytest.raises(TypeError):
        f([np.ones(3)])                # a vector in a list of matrices
    with pytest.raises(TypeError):
        f(a)


def test_wrong_element_types_are_refused():
    x = TypedListType(T.dvector)()
    for bad in (T.dmatrix(), T.fvector(), T.lvector()):
        for build in (lambda: x.append(bad), lambda: x.insert(0, bad), lambda: x.remove(bad),
                      lambda: x.ind(bad), lambda: x.count(bad)):
            with pytest.raises(TypeError):
                build()
    with pytest.raises(TypeError):
        x.extend(TypedListType(T.dmatrix)())
    with pytest.raises(TypeError):
        x[T.dscalar()]                 # a float index
    with pytest.raises(TypeError):
        x[T.lvector()]
    with pytest.raises(TypeError):
        tl.length(T.dvector())
    assert x[T.iscalar()].type == T.dvector    # an int32 index is cast
    same(function([x], x.append(np.ones(2)))([]), [np.ones(2)])  # a constant element


def _inplace_ops(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()
            if getattr(n.op, "destroy_map", None)]


def test_inplace_versions_declare_destroy_map_and_copy_otherwise():
    for cls in (tl.Append, tl.Extend, tl.Insert, tl.Remove, tl.Reverse):
        assert cls(inplace=True).destroy_map == {0: [0]}
        assert cls().view_map == {0: [0]} and not cls().destroy_map
        assert cls(inplace=True) != cls() and str(cls(inplace=True)).endswith("{inplace}")
    x, e = TypedListType(T.dvector)(), T.dvector()
    lst = [np.ones(2)]
    tl.Append(inplace=True).perform(None, [lst, np.zeros(2)], [[None]])
    assert len(lst) == 2               # the declared in-place version does change its input
    lst = [np.ones(2)]
    tl.Append().perform(None, [lst, np.zeros(2)], [[None]])
    assert len(lst) == 1


def test_inplace_pass():
    a, b = T.dvectors("a", "b")
    x = TypedListType(T.dvector)("x")
    f = function([a, b], tl.make_list([a, b]).append(b).reverse().extend(tl.make_list([a])))
    assert _inplace_ops(f) == ["Append", "Reverse", "Extend"]
    av, bv = np.zeros(2), np.ones(2)
    same(f(av, bv), [bv, bv, av, av])
    np.testing.assert_array_equal(av, 0)
    # never on a function input, nor on a view of one (the elements are the caller's)
    xs = [np.ones(2), np.zeros(2)]
    g = function([x, a], [x.append(a).reverse(), x.remove(a).insert(0, a)])
    assert _inplace_ops(g) == []
    g(xs, np.ones(2))
    assert len(xs) == 2
    # nor where another node reads the list
    m = tl.make_list([a, b])
    h = function([a, b], [m.append(a), tl.length(m)])
    assert _inplace_ops(h) == []
    assert [len(v) if isinstance(v, list) else int(v) for v in h(av, bv)] == [3, 2]
    # excluded with the tag
    k = function([a, b], tl.make_list([a, b]).reverse(),
                 mode=symgpu.compile.mode.get_mode(None).excluding("inplace"))
    assert _inplace_ops(k) == []


def test_extend_with_itself():
    a = T.dvector()
    m = tl.make_list([a])
    f = function([a], m.extend(m))
    same(f(np.ones(2)), [np.ones(2)] * 2)
    out = tl.Extend(inplace=True)
    lst = [np.ones(2)]
    st = [[None]]
    out.perform(None, [lst, lst], st)
    assert len(st[0][0]) == 2


def test_getitem_element_feeds_tensor_ops_and_grad_is_none_for_scalars():
    x = TypedListType(T.dmatrix)()
    i = T.lscalar()
    f = function([x, i], (x[i] ** 2).sum() + tl.length(x))
    a, b = vals(2, 2, 2)
    np.testing.assert_allclose(f([a, b], 1), (b ** 2).sum() + 2)
    assert tl.Length().grad([x], [T.dscalar()]) == [None]
    with pytest.raises(NotImplementedError):   # Theano's list ops have no gradient
        tl.GetItem().grad([x, i], [T.dmatrix()])


def test_shapes():
    x, e = TypedListType(T.dvector)(), T.dvector()
    assert node_shapes(tl.length(x).owner) == [()]
    assert node_shapes(x.ind(e).owner) == [()] and node_shapes(x.count(e).owner) == [()]
    for out in (x.append(e), x[0:1], x[0], tl.make_list([e]), x.reverse()):
        with pytest.raises(ShapeError):
            node_shapes(out.owner)
    # x[i].shape is read from the computed element; length's shape is ()
    f = function([x], [x[0].shape, tl.length(x).shape])
    s, ls = f([np.ones(4)])
    assert list(s) == [4] and list(ls) == []


def test_pickle_and_copy():
    x = TypedListType(T.dvector)("x")
    e = T.dvector("e")
    f = function([x, e], [x.append(e), x.count(e)])
    g = pickle.loads(pickle.dumps(f))
    a = [np.ones(2)]
    for h in (f, g, copy.deepcopy(f)):
        out, c = h(a, np.ones(2))
        same(out, [np.ones(2), np.ones(2)])
        assert int(c) == 1
    t = pickle.loads(pickle.dumps(TypedListType(T.dvector, 1)))
    assert t == TypedListType(T.dvector, 1)


def test_debugmode():
    x = TypedListType(T.dvector)()
    a = T.dvector()
    f = function([x, a], [x.append(a), x[0], x.reverse(), tl.make_list([a]).append(a)],
                 mode="DebugMode")
    out = f([np.ones(2), np.zeros(2)], np.ones(2))
    assert len(out[0]) == 3
