"""Indexing against NumPy: basic (views), advanced (int arrays, masks), set/inc_subtensor,
gradients, aliasing of compiled outputs, and the errors a user sees."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.tensor.subtensor import (AdvancedIncSubtensor, AdvancedSubtensor, IncSubtensor,
                                     Subtensor, inc_subtensor, set_subtensor)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- helpers

def check_grad(fn, pts):
    """verify_grad with a fixed seed; inputs have no broadcastable dimensions."""
    verify_grad(fn, [np.asarray(p, dtype="float64") for p in pts], rng=0)


def sym_like(a, name=None):
    """A symbolic tensor of a's dtype and rank (no broadcastable dims)."""
    return T.tensor(a.dtype.name, broadcastable=(False,) * a.ndim, name=name)


def run(expr_fn, *arrays):
    syms = [sym_like(a) for a in arrays]
    return function(syms, expr_fn(*syms))(*arrays)


def data(shape, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    return (rng.standard_normal(shape) * 10).astype(dtype)


# ----------------------------------------------------------------------------- basic indexing

@st.composite
def basic_case(draw):
    """(shape, index) of ints, slices (any sign), None and Ellipsis, valid for the shape."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    nd = len(shape)
    ellipsis = draw(st.booleans())
    k1 = draw(st.integers(0, nd))
    k2 = draw(st.integers(0, nd - k1)) if ellipsis else 0
    dims = list(range(k1)) + list(range(nd - k2, nd))

    def entry(n):
        if draw(st.booleans()):
            return draw(st.integers(-n, n - 1))
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        step = st.one_of(st.none(), st.sampled_from([-3, -2, -1, 1, 2, 3]))
        return slice(draw(bound), draw(bound), draw(step))

    items = [entry(shape[d]) for d in dims]
    if ellipsis:
        items.insert(k1, Ellipsis)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    return shape, tuple(items)


@FAST
@given(basic_case(), st.sampled_from(["float64", "float32", "int32", "bool"]))
def test_basic_indexing_matches_numpy(case, dtype):
    shape, idx = case
    a = data(shape, dtype)
    x = sym_like(a)
    y = x[idx]
    assert isinstance(y.owner.op, Subtensor)
    expected = a[idx]
    got = function([x], y)(a)
    assert got.dtype == a.dtype and got.shape == np.shape(expected)
    np.testing.assert_array_equal(got, expected)
    for b, s in zip(y.broadcastable, got.shape):
        assert not b or s == 1


@FAST
@given(st.integers(1, 6), st.data())
def test_symbolic_ints_and_slice_bounds(n, draw):
    a = data((n, 3))
    x = T.matrix()
    i, lo, hi, step = T.lscalar("i"), T.iscalar("lo"), T.iscalar("hi"), T.lscalar("step")
    f = function([x, i, lo, hi, step], [x[i], x[lo:hi:step, i % 3], x[:hi, ::step]])
    iv = draw.draw(st.integers(-n, n - 1))
    lov, hiv = draw.draw(st.integers(-n - 2, n + 2)), draw.draw(st.integers(-n - 2, n + 2))
    sv = draw.draw(st.sampled_from([-2, -1, 1, 3]))
    r0, r1, r2 = f(a, iv, lov, hiv, sv)
    np.testing.assert_array_equal(r0, a[iv])
    np.testing.assert_array_equal(r1, a[lov:hiv:sv, iv % 3])
    np.testing.assert_array_equal(r2, a[:hiv, ::sv])


def test_constants_fold_into_props_and_ops_merge():
    x = T.matrix()
    a, b = x[1:, T.constant(2)], x[1:, 2]
    assert a.owner.op == b.owner.op and hash(a.owner.op) == hash(b.owner.op)
    assert len(a.owner.inputs) == 1
    i = T.lscalar()
    c = x[i:, ::-1]
    assert len(c.owner.inputs) == 2 and c.owner.op != a.owner.op
    assert "Subtensor" in str(c.owner.op)


def test_subtensor_is_a_view_and_outputs_do_not_alias_inputs():
    a = np.arange(12.0).reshape(3, 4)
    x = T.matrix()
    node = x[1:].owner
    assert node.op.view_map == {0: [0]}
    out = [[None]]
    node.op.perform(node, [a], out)
    assert np.shares_memory(out[0][0], a)
    node0 = x[1, 2].owner  # even a single element comes back as a 0-d view
    node0.op.perform(node0, [a], out)
    assert isinstance(out[0][0], np.ndarray) and np.shares_memory(out[0][0], a)
    f = function([x], [x[1:], x[:, 1], x[...], x[1, 2]])
    keep = a.copy()
    for r in f(a):
        r[...] = -1
    np.testing.assert_array_equal(a, keep)


def test_shape_indexing():
    x = T.tensor3()
    a = np.zeros((2, 3, 4))
    assert type(x.shape[0].owner.op).__name__ == "Shape_i"
    f = function([x], [x.shape[0], x.shape[-1], x.shape[1:], x.shape[::-1]])
    r = f(a)
    assert [int(v) for v in r[:2]] == [2, 4]
    np.testing.assert_array_equal(r[2], [3, 4])
    np.testing.assert_array_equal(r[3], [4, 3, 2])
    i = T.lscalar()
    assert function([x, i], x.shape[i])(a, -2) == 3
    # as in Theano, an index past ndim builds (code reads x.shape[1] before checking ndim)
    # and fails when it runs
    with pytest.raises(IndexError, match="out of bounds"):
        x.shape[3].eval({x: a})


def test_basic_index_errors():
    x = T.matrix()
    with pytest.raises(IndexError, match="too many indices"):
        x[1, 2, 3]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., 1, ...]
    with pytest.raises(TypeError, match="integer"):
        x[1.5]
    with pytest.raises(TypeError, match="integer"):
        x[T.scalar()]
    with pytest.raises(TypeError, match="slice bounds"):
        x[T.scalar():]
    with pytest.raises(TypeError, match="bool"):
        x[True]


@pytest.mark.parametrize("build,args", [
    (lambda x, i: x[5], ()),
    (lambda x, i: x[:, -9], ()),
    (lambda x, i: x[i, 1], (7,)),
    (lambda x, i: x[[0, 7]], ()),
    (lambda x, i: x[:, i:][:, [9]], (0,)),
])
def test_out_of_bounds_names_index_dimension_and_shape(build, args):
    x, i = T.matrix(), T.lscalar()
    ins = [x, i] if args else [x]
    f = function(ins, build(x, i))
    with pytest.raises(IndexError) as err:
        f(np.zeros((3, 4)), *args)
    msg = str(err.value)
    assert "out of bounds for dimension" in msg and "of an array of shape (3, 4)" in msg


def test_out_of_bounds_message_exact():
    x = T.matrix()
    f = function([x], x[:, 9])
    with pytest.raises(IndexError, match=r"index 9 is out of bounds for dimension 1 \(length 4\) "
                                         r"of an array of shape \(3, 4\)"):
        f(np.zeros((3, 4)))


# ----------------------------------------------------------------------------- advanced

A = np.arange(4 * 5 * 6, dtype="float64").reshape(4, 5, 6)
I2 = np.array([3, 0, 3])
J2 = np.array([[1, 3], [0, 0]])
ADV_CASES = [
    lambda i, j, m: [0, 2],
    lambda i, j, m: (slice(None), i),
    lambda i, j, m: (i, i),
    lambda i, j, m: (i, slice(1, None), i),
    lambda i, j, m: (slice(None), j, 1),
    lambda i, j, m: (1, slice(None), j),
    lambda i, j, m: (slice(None), None, j),
    lambda i, j, m: (j, None, j),
    lambda i, j, m: (Ellipsis, j),
    lambda i, j, m: (j[0], Ellipsis, 2),
    lambda i, j, m: (slice(None, None, -1), j, slice(4, 0, -2)),
    lambda i, j, m: m,
    lambda i, j, m: (m[:, :, 0], slice(2, 5)),
    lambda i, j, m: (slice(None), m[0, :, 0]),
    lambda i, j, m: (None, 1, m[0]),
    lambda i, j, m: (m[:, :, 0], 2),
    lambda i, j, m: (i[:, None], j[0]),
    lambda i, j, m: (slice(None), i[:, None], j[:1]),
]


@pytest.mark.parametrize("case", range(len(ADV_CASES)))
@pytest.mark.parametrize("symbolic", [False, True])
def test_advanced_indexing_matches_numpy(case, symbolic):
    mask = (A % 3 == 0)
    expected = A[ADV_CASES[case](I2, J2, mask)]
    x = T.tensor3()
    if symbolic:
        i, j, m = T.lvector("i"), T.imatrix("j"), T.tensor("bool", shape=(None,) * 3, name="m")
        y = x[ADV_CASES[case](i, j, m)]
        ins = [x, i, j, m]
        vals = (A, I2, J2.astype("int32"), mask)
        f = function(ins, y, on_unused_input="ignore")
    else:
        y = x[ADV_CASES[case](I2, J2, mask)]
        f = function([x], y)
        vals = (A,)
    assert isinstance(y.owner.op, AdvancedSubtensor)
    got = f(*vals)
    assert y.ndim == expected.ndim
    np.testing.assert_array_equal(got, expected)
    for b, s in zip(y.broadcastable, got.shape):
        assert not b or s == 1


@FAST
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(1, 2), st.data(),
       st.sampled_from(["float32", "int32", "bool"]))
def test_random_int_arrays(shape, ndim, draw, dtype):
    a = data(tuple(shape), dtype)
    n_idx = draw.draw(st.integers(1, len(shape)))
    start = draw.draw(st.integers(0, len(shape) - n_idx))
    ishape = tuple(draw.draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    arrays = [draw.draw(st.lists(st.integers(-shape[d], shape[d] - 1), min_size=int(np.prod(ishape)),
                                 max_size=int(np.prod(ishape)))) for d in range(start, start + n_idx)]
    arrays = [np.array(v, dtype="int64").reshape(ishape) for v in arrays]
    idx = (slice(None),) * start + tuple(arrays)
    x = sym_like(a)
    syms = [T.lmatrix() if ndim == 2 else T.lvector() for _ in arrays]
    f = function([x] + syms, x[(slice(None),) * start + tuple(syms)])
    np.testing.assert_array_equal(f(a, *arrays), a[idx])


def test_masks_from_comparisons_and_lists():
    a = data((3, 4))
    x = T.matrix()
    f = function([x], [x[x > 0], x[[True, False, True]], x[:, np.array([1, 0, 0, 1], bool)]])
    r = f(a)
    np.testing.assert_array_equal(r[0], a[a > 0])
    np.testing.assert_array_equal(r[1], a[[True, False, True]])
    np.testing.assert_array_equal(r[2], a[:, [True, False, False, True]])
    assert function([x], x[[]])(a).shape == (0, 4)


def test_advanced_errors():
    x = T.matrix()
    f = function([x], x[[0, 5]])
    with pytest.raises(IndexError, match=r"index 5 is out of bounds for dimension 0 \(length 3\) "
                                         r"of an array of shape \(3, 4\)"):
        f(np.zeros((3, 4)))
    m = T.tensor("bool", shape=(None,))
    g = function([x, m], x[m])
    with pytest.raises(IndexError, match=r"shape \(3, 4\)"):
        g(np.zeros((3, 4)), np.array([True, False]))
    with pytest.raises(TypeError, match="integers"):
        x[np.array([0.5])]
    with pytest.raises(TypeError, match="integer"):
        x[T.vector()]


# ----------------------------------------------------------------------------- set / inc

@FAST
@given(basic_case(), st.sampled_from(["float64", "float32", "int32"]), st.booleans(),
       st.sampled_from(["full", "scalar", "trailing", "ones"]))
def test_set_inc_basic_match_numpy(case, dtype, use_set, yform):
    shape, idx = case
    a = data(shape, dtype)
    region = a[idx]
    rshape = np.shape(region)
    if yform == "scalar" or not rshape:
        yv = np.asarray(3, dtype=dtype)
    elif yform == "trailing":
        yv = data(rshape[1:], dtype, seed=1)
    elif yform == "ones":
        yv = data((1,) * len(rshape), dtype, seed=1)
    else:
        yv = data(rshape, dtype, seed=1)
    x = sym_like(a)
    y = T.tensor(dtype, shape=yv.shape)  # length-1 dims are broadcastable
    fn = set_subtensor if use_set else inc_subtensor
    out = fn(x[idx], y)
    assert isinstance(out.owner.op, IncSubtensor) and out.type == x.type
    keep = a.copy()
    got = function([x, y], out)(a, yv)
    expected = a.copy()
    if use_set:
        expected[idx] = yv
    else:
        expected[idx] += yv
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(a, keep)  # not in place


def test_inc_repeated_indices_accumulate_and_set_last_wins():
    a = np.zeros((4, 3))
    x, y = T.matrix(), T.vector()
    idx = [0, 2, 0, 0]
    vals = np.array([1.0, 2.0, 3.0])
    inc = function([x, y], inc_subtensor(x[idx], y))(a, vals)
    expected = a.copy()
    np.add.at(expected, idx, vals)
    np.testing.assert_array_equal(inc, expected)
    assert inc[0, 0] == 3.0
    s = function([x], set_subtensor(x[[1, 1], [0, 0]], [5.0, 7.0]))(a)
    assert s[1, 0] == 7.0 and s.sum() == 7.0
    i = T.lvector()
    f = function([x, i], inc_subtensor(x[1:, i], 1.0))
    expected = a.copy()
    np.add.at(expected, (slice(1, None), np.array([2, 2, 0])), 1.0)
    np.testing.assert_array_equal(f(a, np.array([2, 2, 0])), expected)
    assert isinstance(inc_subtensor(x[1:, i], 1.0).owner.op, AdvancedIncSubtensor)


@pytest.mark.parametrize("use_set", [False, True])
def test_set_inc_with_masks(use_set):
    a = data((3, 4))
    x = T.matrix()
    m = T.tensor("bool", shape=(None, None))
    fn = set_subtensor if use_set else inc_subtensor
    f = function([x, m], [fn(x[m], 2.0), fn(x[x > 0], x[x > 0] * 0 + 1), fn(x[:, [True, False, True, True]], T.constant([[1.0], [2.0], [3.0]]))])
    mask = a < 0
    r = f(a, mask)
    e0, e1, e2 = a.copy(), a.copy(), a.copy()
    pos, cols = a > 0, [True, False, True, True]
    if use_set:
        e0[mask] = 2.0
        e1[pos] = 1
        e2[:, cols] = [[1.0], [2.0], [3.0]]
    else:
        e0[mask] += 2.0
        e1[pos] += 1
        e2[:, cols] += [[1.0], [2.0], [3.0]]
    for got, exp in zip(r, (e0, e1, e2)):
        np.testing.assert_array_equal(got, exp)


def test_set_inc_dtypes_and_casts():
    xi = T.imatrix()
    a = np.arange(6, dtype="int32").reshape(2, 3)
    r = function([xi], [set_subtensor(xi[0], 7), inc_subtensor(xi[:, [0, 0]], 1)])(a)
    assert r[0].dtype == np.int32 and list(r[0][0]) == [7, 7, 7]
    assert list(r[1][:, 0]) == [2, 5]
    xf = T.fmatrix()
    yd = T.dvector()
    out = inc_subtensor(xf[1], yd)
    assert out.dtype == "float32"
    got = function([xf, yd], out)(np.zeros((2, 3), "float32"), np.array([0.5, 1.5, 2.5]))
    np.testing.assert_allclose(got[1], [0.5, 1.5, 2.5])
    xb = T.tensor("bool", shape=(None,))
    got = function([xb], set_subtensor(xb[1:], True))(np.zeros(3, bool))
    assert got.tolist() == [False, True, True]


def test_inplace_prop_and_destroy_map():
    x = T.matrix()
    plain = set_subtensor(x[1:], 0.0).owner.op
    assert plain.inplace is False and plain.destroy_map == {}
    inpl = set_subtensor(x[1:], 0.0, inplace=True).owner.op
    assert inpl.destroy_map == {0: [0]} and inpl != plain and "inplace" in str(inpl)
    adv = inc_subtensor(x[[0]], 1.0, inplace=True).owner.op
    assert adv.destroy_map == {0: [0]}
    a = np.zeros((2, 2))
    node = set_subtensor(x[1:], 1.0, inplace=True).owner
    out = [[None]]
    node.op.perform(node, [a, np.asarray(1.0)], out)
    assert out[0][0] is a and a[1, 0] == 1.0


def test_set_inc_errors():
    x, v = T.matrix(), T.vector()
    with pytest.raises(TypeError, match="indexed tensor"):
        set_subtensor(x, 1.0)
    with pytest.raises(TypeError, match="indexed tensor"):
        inc_subtensor(x + 1, 1.0)
    with pytest.raises(ValueError, match="dimensions"):
        set_subtensor(x[0], T.matrix())
    f = function([x, v], inc_subtensor(x[1:], v))
    with pytest.raises(ValueError, match="broadcastable"):
        f(np.zeros((3, 4)), np.ones(1))  # a length-1 dim the type does not call broadcastable
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        f(np.zeros((3, 4)), np.ones(3))
    g = function([x], inc_subtensor(x[[0, 7]], 1.0))
    with pytest.raises(IndexError, match=r"index 7 is out of bounds for dimension 0 \(length 3\)"):
        g(np.zeros((3, 4)))


# ----------------------------------------------------------------------------- gradients

def test_grad_basic_subtensor():
    a = data((4, 3))
    check_grad(lambda x: x[1:, ::-1], [a])
    check_grad(lambda x: x[-1, None, 1:], [a])
    check_grad(lambda x: x[2], [a])
    check_grad(lambda x: x[2, 1], [a])
    check_grad(lambda x: x[..., 1][:3] * x[1, ...], [a])


def test_grad_symbolic_slice_and_int_index_is_none():
    x, i = T.matrix(), T.lscalar()
    y = x[i:, i]
    node = y.owner
    g = node.op.grad(node.inputs, [T.vector()])
    assert g[1] is None and g[2] is None and g[0] is not None
    gx = function([x, i], symgpu.grad(y.sum(), x))(np.zeros((3, 3)), 1)
    np.testing.assert_array_equal(gx, [[0, 0, 0], [0, 1, 0], [0, 1, 0]])


def test_grad_of_int_input_is_none():
    xi = T.imatrix()
    node = xi[1:].owner
    assert node.op.grad(node.inputs, [T.imatrix()]) == [None]
    node = xi[[0, 1]].owner
    assert node.op.grad(node.inputs, [T.imatrix()])[0] is None


def test_grad_advanced_subtensor():
    a = data((4, 3))
    check_grad(lambda x: x[[0, 2, 0, 0]], [a])
    check_grad(lambda x: x[1:, [2, 2, 0]], [a])
    check_grad(lambda x: x[[0, 3], [1, 1]], [a])
    check_grad(lambda x: x[np.array([True, False, True, True])], [a])
    check_grad(lambda x: x[a > 0] * 2, [a])


@pytest.mark.parametrize("fn", [set_subtensor, inc_subtensor])
def test_grad_inc_set_subtensor(fn):
    a, row, yv = data((4, 3)), data((1, 3), seed=1), data((2, 3), seed=2)
    check_grad(lambda x, y: fn(x[1:3], y), [a, yv])
    check_grad(lambda x, y: fn(x[1:], y.dimshuffle("x", 0)), [a, row[0]])  # grad sums over rows
    check_grad(lambda x, y: fn(x[::-2, 1], y * 3), [a, data((2,), seed=3)])
    check_grad(lambda x, y: fn(x[2, 0], y.sum()), [a, yv])


@pytest.mark.parametrize("fn", [set_subtensor, inc_subtensor])
def test_grad_advanced_inc_set(fn):
    a = data((4, 3))
    check_grad(lambda x, y: fn(x[[0, 2, 0]], y), [a, data((3, 3), seed=1)])
    check_grad(lambda x, y: fn(x[:, [1, 0]], y), [a, data((2,), seed=1)])
    check_grad(lambda x, y: fn(x[[1, 1, 3, 1], [0, 2, 0, 0]], y), [a, data((4,), seed=1)])
    check_grad(lambda x, y: fn(x[[1, 1, 3, 1]], y.sum()), [a, data((2,), seed=1)])
    check_grad(lambda x, y: fn(x[a > 0], y.sum()), [a, data((2,), seed=1)])


def test_grad_inc_wrt_y_counts_repeats():
    x, y = T.matrix(), T.vector()
    cost = inc_subtensor(x[[0, 0, 1]], y).sum()
    gy = function([x, y], symgpu.grad(cost, y))(np.zeros((2, 3)), np.zeros(3))
    np.testing.assert_array_equal(gy, [3, 3, 3])
    cost = set_subtensor(x[[0, 0, 1]], y).sum()  # the first write to row 0 is overwritten
    gy = function([x, y], symgpu.grad(cost, y))(np.zeros((2, 3)), np.zeros(3))
    np.testing.assert_array_equal(gy, [2, 2, 2])
    cost = set_subtensor(x[1:], y).sum()
    gx = function([x, y], symgpu.grad(cost, x))(np.zeros((3, 3)), np.zeros(3))
    np.testing.assert_array_equal(gx, [[1, 1, 1], [0, 0, 0], [0, 0, 0]])
