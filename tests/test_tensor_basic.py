"""Shape and construction ops against NumPy: MakeVector, reshape, flatten, squeeze,
concatenate/join, stack, alloc, zeros/ones, arange; their gradients and errors."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symgpu
import symgpu.tensor as T
import symgpu.tensor.basic as B
from symgpu import function
from symgpu.config import config
from symgpu.gradient import verify_grad

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


def check_grad(fn, pts):
    """verify_grad with a fixed seed; inputs have no broadcastable dimensions."""
    verify_grad(fn, [np.asarray(p, dtype="float64") for p in pts], rng=0)


def sym_like(a, name=None):
    return T.tensor(a.dtype.name, broadcastable=(False,) * a.ndim, name=name)


def data(shape, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    return (rng.standard_normal(shape) * 10).astype(dtype)


# ----------------------------------------------------------------------------- exports

def test_exports_and_namespace():
    for name in B.__all__:
        assert hasattr(B, name), name
        assert hasattr(T, name), name
    for name in ("fill", "second", "zeros_like", "ones_like", "cast", "shape", "transpose",
                 "dimshuffle", "shape_i", "specify_broadcastable_as"):
        assert name in B.__all__
    assert T.reshape is B.reshape and T.set_subtensor is B.set_subtensor
    assert T.fill is T.second


# ----------------------------------------------------------------------------- MakeVector

def test_make_vector():
    i, j = T.lscalar(), T.iscalar()
    v = B.MakeVector("int64")(i, j)
    assert v.type == T.lvector().type
    np.testing.assert_array_equal(function([i, j], v)(3, -2), [3, -2])
    assert function([], B.MakeVector("int64")())().shape == (0,)
    assert B.MakeVector("int64")(i).broadcastable == (True,)
    with pytest.raises(TypeError, match="does not fit"):
        B.MakeVector("int32")(i)
    with pytest.raises(TypeError, match="scalar"):
        B.MakeVector("int64")(T.lvector())
    mv = B.make_vector(T.dscalar(), 2)
    assert mv.dtype == "float64"
    check_grad(lambda a, b: B.MakeVector("float64")(a, b * 2), [np.array(1.5), np.array(-0.5)])
    node = v.owner
    assert node.op.grad(node.inputs, [T.lvector()]) == [None, None]


# ----------------------------------------------------------------------------- reshape

@st.composite
def reshape_case(draw):
    """A shape and a target of the same size: permuted, adjacent dims merged, maybe one -1."""
    shape = draw(shapes)
    dims = list(draw(st.permutations(list(shape)))) if shape else []
    target = []
    for d in dims:
        if target and draw(st.booleans()):
            target[-1] *= d
        else:
            target.append(d)
    if target and all(t > 0 for t in target) and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    if not target and draw(st.booleans()):
        target = [1]
    return shape, tuple(target)


@FAST
@given(reshape_case(), st.sampled_from(["float64", "float32", "int32", "bool"]))
def test_reshape_matches_numpy(case, dtype):
    shape, target = case
    a = data(shape, dtype)
    x = sym_like(a)
    y = B.reshape(x, target)
    got = function([x], y)(a)
    expected = a.reshape(target)
    assert got.shape == expected.shape and got.dtype == a.dtype
    np.testing.assert_array_equal(got, expected)
    for b, t in zip(y.broadcastable, target):
        assert b == (t == 1)


def test_reshape_symbolic_shapes():
    a = np.arange(24.0).reshape(2, 3, 4)
    x, n = T.tensor3(), T.iscalar("n")
    f = function([x, n], [x.reshape((n, -1)), B.reshape(x, [x.shape[0], n // 2, 4]),
                          B.reshape(x, x.shape[::-1]), x.reshape(x.shape[1:] * [2, 1], ndim=2)])
    r = f(a, 6)
    np.testing.assert_array_equal(r[0], a.reshape(6, -1))
    np.testing.assert_array_equal(r[1], a.reshape(2, 3, 4))
    np.testing.assert_array_equal(r[2], a.reshape(4, 3, 2))
    np.testing.assert_array_equal(r[3], a.reshape(6, 4))
    s = T.lvector()
    assert B.reshape(x, s, ndim=2).ndim == 2
    np.testing.assert_array_equal(function([x, s], B.reshape(x, s, ndim=2))(a, np.array([4, 6])),
                                  a.reshape(4, 6))
    assert x.reshape(2, 12).ndim == 2  # varargs spelling


def test_reshape_view_and_no_alias():
    a = np.arange(6.0)
    x = T.vector()
    node = x.reshape((2, 3)).owner
    assert node.op.view_map == {0: [0]}
    out = [[None]]
    node.op.perform(node, [a, np.array([2, 3])], out)
    assert np.shares_memory(out[0][0], a)
    r = function([x], x.reshape((2, 3)))(a)
    r[...] = 0
    assert a.sum() == 15.0


def test_reshape_errors():
    x = T.matrix()
    f = function([x], x.reshape((4, -1)))
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*shape \(4, -1\)"):
        f(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="one -1"):
        x.reshape((-1, -1))
    with pytest.raises(ValueError, match="ndim"):
        B.reshape(x, (2, 3), ndim=3)
    with pytest.raises(ValueError, match="ndim="):
        B.reshape(x, T.lvector())
    with pytest.raises(TypeError, match="integer"):
        B.reshape(x, (2.5, 2))
    with pytest.raises(TypeError, match="integer"):
        B.reshape(x, T.vector(), ndim=1)


def test_reshape_grad():
    check_grad(lambda x: x.reshape((3, 2)) * np.arange(6.0).reshape(3, 2), [data((2, 3))])
    check_grad(lambda x: x.reshape((-1,)), [data((2, 1, 3))])
    xi = T.imatrix()
    node = xi.reshape((-1,)).owner
    assert node.op.grad(node.inputs, [T.ivector()]) == [None, None]
    r = T.row()
    g = symgpu.grad((r.reshape((-1,)) ** 2).sum(), r)
    assert g.broadcastable == r.broadcastable


# ----------------------------------------------------------------------------- flatten / squeeze

@FAST
@given(st.lists(st.integers(0, 3), min_size=1, max_size=4).map(tuple), st.data())
def test_flatten_matches_numpy(shape, draw):
    ndim = draw.draw(st.integers(1, len(shape)))
    a = data(shape)
    x = sym_like(a)
    got = function([x], B.flatten(x, ndim))(a)
    expected = a.reshape(shape[:ndim - 1] + (int(np.prod(shape[ndim - 1:])),))
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_flatten_misc():
    a = data((2, 3, 4))
    x = T.tensor3()
    np.testing.assert_array_equal(function([x], x.flatten())(a), a.ravel())
    assert function([], B.flatten(T.constant(2.0)))().shape == (1,)
    assert B.flatten(T.row(), 1).broadcastable == (False,)
    assert B.flatten(T.tensor(shape=(None, 1, 1)), 2).broadcastable == (False, True)
    with pytest.raises(ValueError, match="ndim"):
        B.flatten(x, 4)
    with pytest.raises(ValueError, match="ndim"):
        B.flatten(x, 0)
    check_grad(lambda v: B.flatten(v, 2) * 3, [a])


def test_squeeze():
    x = T.tensor(shape=(1, None, 1))
    a = data((1, 3, 1))
    f = function([x], [B.squeeze(x), x.squeeze(axis=0), B.squeeze(x, axis=-1)])
    r = f(a)
    np.testing.assert_array_equal(r[0], np.squeeze(a))
    np.testing.assert_array_equal(r[1], np.squeeze(a, 0))
    np.testing.assert_array_equal(r[2], np.squeeze(a, -1))
    m = T.matrix()
    g = function([m], B.squeeze(m, 1))
    np.testing.assert_array_equal(g(np.ones((3, 1))), np.ones(3))
    with pytest.raises(ValueError, match="dimension 1"):
        g(np.ones((3, 2)))
    with pytest.raises(ValueError, match="out of range"):
        B.squeeze(m, 2)
    check_grad(lambda v: B.squeeze(v, 1) * 2, [data((3, 1))])


# ----------------------------------------------------------------------------- join / stack

@FAST
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple), st.data(),
       st.lists(st.sampled_from(["float64", "float32", "int32", "bool"]), min_size=1, max_size=3))
def test_concatenate_matches_numpy(shape, draw, dtypes):
    axis = draw.draw(st.integers(-len(shape), len(shape) - 1))
    arrays = []
    for k, dt in enumerate(dtypes):
        s = list(shape)
        s[axis] = draw.draw(st.integers(0, 3))
        arrays.append(data(tuple(s), dt, seed=k))
    syms = [sym_like(a) for a in arrays]
    out = T.concatenate(syms, axis=axis)
    got = function(syms, out)(*arrays)
    expected = np.concatenate(arrays, axis=axis)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_join_misc():
    x, r = T.matrix(), T.row()
    j = B.join(0, x, r)
    assert isinstance(j.owner.op, B.Join) and j.broadcastable == (False, False)
    assert B.concatenate([r, r], axis=1).broadcastable == (True, False)
    assert T.concatenate([x]) is x
    a = data((2, 3))
    np.testing.assert_array_equal(function([x], T.concatenate([x, [[1.0, 2.0, 3.0]]]))(a),
                                  np.concatenate([a, [[1.0, 2.0, 3.0]]]))
    f = function([x, r], j)
    with pytest.raises(ValueError, match=r"\(2, 3\), \(1, 4\)"):
        f(a, np.ones((1, 4)))
    with pytest.raises(TypeError, match="same number of dimensions"):
        T.concatenate([x, T.vector()])
    with pytest.raises(ValueError, match="out of range"):
        T.concatenate([x, x], axis=2)
    with pytest.raises(ValueError, match="zero-dimensional"):
        T.concatenate([T.scalar(), T.scalar()])


def test_join_grad():
    check_grad(lambda a, b: T.concatenate([a, b * 2], axis=1), [data((2, 3)), data((2, 1), seed=1)])
    check_grad(lambda a, b, c: T.concatenate([a, b, c]), [data((2, 2)), data((1, 2), seed=1),
                                                          data((3, 2), seed=2)])
    x, r = T.matrix(), T.row()
    gx, gr = symgpu.grad((T.concatenate([x, r]) ** 2).sum(), [x, r])
    assert gr.broadcastable == r.broadcastable
    a, rv = data((2, 3)), data((1, 3), seed=1)
    g = function([x, r], [gx, gr])(a, rv)
    np.testing.assert_allclose(g[0], 2 * a)
    np.testing.assert_allclose(g[1], 2 * rv)
    xi = T.imatrix()
    node = T.concatenate([xi, xi]).owner
    assert node.op.grad(node.inputs, [T.imatrix()]) == [None, None]
    node = T.concatenate([xi, x]).owner
    gi, gd = node.op.grad(node.inputs, [T.matrix()])
    assert gi is None and gd is not None


@FAST
@given(st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple), st.integers(1, 3), st.data())
def test_stack_matches_numpy(shape, n, draw):
    axis = draw.draw(st.integers(-len(shape) - 1, len(shape)))
    arrays = [data(shape, seed=k) for k in range(n)]
    syms = [sym_like(a) for a in arrays]
    got = function(syms, T.stack(syms, axis=axis))(*arrays)
    np.testing.assert_array_equal(got, np.stack(arrays, axis=axis))


def test_stack_misc():
    i, j = T.iscalar(), T.lscalar()
    v = T.stack([i, j, 3])
    assert isinstance(v.owner.op, B.MakeVector) and v.dtype == "int64"
    np.testing.assert_array_equal(function([i, j], v)(1, 2), [1, 2, 3])
    with pytest.raises(ValueError, match="same number"):
        T.stack([T.vector(), T.matrix()])
    with pytest.raises(ValueError, match="out of range"):
        T.stack([T.vector(), T.vector()], axis=2)
    check_grad(lambda a, b: T.stack([a, b], axis=1), [data((2, 3)), data((2, 3), seed=1)])
    check_grad(lambda a, b: T.stack([a.sum(), b[0]]), [data((2,)), data((2,), seed=1)])


# ----------------------------------------------------------------------------- alloc / zeros / ones

def test_alloc():
    v, n = T.vector(), T.lscalar()
    s = T.scalar()
    a = data((3,))
    f = function([v, s, n], [T.alloc(v, 2, 3), T.alloc(s, n, 2), T.alloc(v, (n, 3)),
                             T.alloc(T.constant([[1.0], [2.0]]), 2, n)])
    r = f(a, 1.5, 4)
    np.testing.assert_array_equal(r[0], np.broadcast_to(a, (2, 3)))
    np.testing.assert_array_equal(r[1], np.full((4, 2), 1.5))
    np.testing.assert_array_equal(r[2], np.broadcast_to(a, (4, 3)))
    np.testing.assert_array_equal(r[3], np.broadcast_to([[1.0], [2.0]], (2, 4)))
    assert r[1].flags.writeable and r[1].flags.c_contiguous
    assert T.alloc(s, 1, n).broadcastable == (True, False)
    g = function([v, n], T.alloc(v, n, 3))
    with pytest.raises(ValueError, match=r"\(2,\) to the shape \(4, 3\)"):
        g(np.ones(2), 4)
    with pytest.raises(ValueError, match="broadcastable"):
        function([v], T.alloc(v, 2, 3))(np.ones(1))
    with pytest.raises(ValueError, match="negative"):
        g(a, -1)
    with pytest.raises(ValueError, match="more than"):
        T.alloc(T.matrix(), 3)
    check_grad(lambda x: T.alloc(x, 4, 3) * np.arange(12.0).reshape(4, 3), [a])
    check_grad(lambda x: T.alloc(x.dimshuffle(0, "x"), 3, 4), [a])
    check_grad(lambda x: T.alloc(x.sum(), 2, 2), [a])


@pytest.mark.parametrize("fn,value", [(T.zeros, 0), (T.ones, 1)])
def test_zeros_ones(fn, value):
    x, n = T.tensor3(), T.lscalar()
    a = np.empty((2, 3, 4))
    f = function([x, n], [fn(3), fn((2, n)), fn(x.shape), fn([n, 2], dtype="int32"), fn(()),
                          fn(x.shape[1:], dtype="bool")])
    r = f(a, 5)
    assert r[0].shape == (3,) and r[0].dtype == config.floatX and (r[0] == value).all()
    assert r[1].shape == (2, 5)
    assert r[2].shape == (2, 3, 4)
    assert r[3].dtype == np.int32 and r[3].shape == (5, 2)
    assert r[4].shape == ()
    assert r[5].dtype == np.bool_ and r[5].shape == (3, 4) and (r[5] == bool(value)).all()
    r2 = f(a, 5)
    r2[0][...] = 7  # every call returns a fresh array
    assert (f(a, 5)[0] == value).all()
    with config.change_flags(floatX="float32"):
        assert fn((2, 2)).dtype == "float32"
    assert fn(T.row().shape).broadcastable == (True, False)
    with pytest.raises(TypeError, match="tuple"):
        fn(T.lvector())
    with pytest.raises(TypeError, match="integer"):
        fn((2.0, 3))


# ----------------------------------------------------------------------------- arange

@FAST
@given(st.integers(-6, 6), st.one_of(st.none(), st.integers(-6, 6)),
       st.sampled_from([1, 2, 3, -1, -2]))
def test_arange_ints_match_numpy(start, stop, step):
    got = function([], T.arange(start, stop, step))()
    expected = np.arange(start, stop, step) if stop is not None else np.arange(0, start, step)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_arange_symbolic_and_dtypes():
    a, b, c = T.iscalar(), T.lscalar(), T.dscalar()
    f = function([a, b], [T.arange(a), T.arange(a, b, 2), T.arange(b, a, -3)])
    r = f(7, 1)
    np.testing.assert_array_equal(r[0], np.arange(7))
    np.testing.assert_array_equal(r[1], np.arange(7, 1, 2))
    np.testing.assert_array_equal(r[2], np.arange(1, 7, -3))
    assert T.arange(a).dtype == "int32" and T.arange(a, b).dtype == "int64"
    g = function([c], T.arange(0.5, c, 0.25))
    np.testing.assert_allclose(g(2.0), np.arange(0.5, 2.0, 0.25))
    assert T.arange(0, 1, 0.1).dtype == config.floatX
    assert T.arange(5, dtype="float32").dtype == "float32"
    assert T.arange(T.fscalar()).dtype == "float32"
    np.testing.assert_allclose(function([], T.arange(1.0, -1.0, -0.5))(), np.arange(1.0, -1.0, -0.5))
    assert T.arange(3, 4).broadcastable == (True,)
    with pytest.raises(ValueError, match="step must not be zero"):
        function([b], T.arange(0, 5, b))(0)
    with pytest.raises(TypeError, match="scalar"):
        T.arange(T.lvector())


def test_arange_grad():
    check_grad(lambda s, d: T.arange(s, 3.0, d) ** 2, [np.array(0.25), np.array(0.5)])
    n = T.lscalar()
    node = T.arange(n).owner
    assert node.op.grad(node.inputs, [T.lvector()]) == [None, None, None]
