"""symgpu.sparse (Theano's theano.sparse): values against scipy.sparse / NumPy, gradients
(verify_grad through dense inputs, and Theano's verify_grad_sparse as a helper here),
shapes, errors, shared variables and pickling."""
import pickle
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import symgpu
import symgpu.tensor as T
import symgpu.sparse as S
from symgpu import function
from symgpu.gradient import verify_grad


def rnd(m, n, fmt="csr", density=0.4, seed=0, dtype="float64"):
    a = sp.random(m, n, density=density, format=fmt, random_state=seed, dtype=dtype)
    a.data += 0.5   # no stored value near zero
    return a


def dense(m, n, seed=1):
    return np.random.default_rng(seed).standard_normal((m, n))


def verify_grad_sparse(op, pt, structured=False, **kw):
    """Theano's verify_grad_sparse: sparse points are given as dense values (all positions)
    or, with `structured`, as their stored values (the pattern fixed); sparse outputs are
    compared densified."""
    conv, points = [], []
    for p in pt:
        if sp.issparse(p):
            fmt = p.format
            if structured:
                ind, ptr, shp = p.indices.copy(), p.indptr.copy(), np.asarray(p.shape)
                points.append(p.data.copy())
                conv.append(lambda d, f=fmt, i=ind, q=ptr, s=shp: S.CSM(f)(d, i, q, s))
            else:
                points.append(p.toarray())
                conv.append(S.csr_from_dense if fmt == "csr" else S.csc_from_dense)
        else:
            points.append(np.asarray(p))
            conv.append(lambda v: v)

    def wrapped(*args):
        out = op(*[c(a) for c, a in zip(conv, args)])
        outs = out if isinstance(out, (list, tuple)) else [out]
        to_dense = S.dense_from_sparse if structured else S.DenseFromSparse(structured=False)
        outs = [to_dense(o) if S._is_sparse_variable(o) else o for o in outs]
        return outs if isinstance(out, (list, tuple)) else outs[0]

    verify_grad(wrapped, points, rng=np.random.default_rng(0), **kw)


# ----------------------------------------------------------------------------- types

def test_import_symgpu_loads_neither_sparse_package():
    code = ("import sys, symgpu, symgpu.tensor; "
            "assert 'symgpu.sparse' not in sys.modules; assert 'scipy.sparse' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_type_and_constructors(fmt):
    x = S.matrix(fmt, "x", "float32")
    assert isinstance(x, S.SparseVariable) and x.type == S.SparseType(fmt, "float32")
    assert x.format == fmt and x.dtype == "float32" and x.ndim == 2
    assert S.csr_matrix("a").type.format == "csr" and S.csc_matrix("b").type.format == "csc"
    assert S.csr_matrix("a", "float64").type == S.csr_dmatrix
    assert isinstance(S.csc_dmatrix("c"), S.SparseVariable)
    a = rnd(3, 4, fmt)
    t = S.SparseType(fmt, "float64")
    assert t.filter(a) is a
    other = a.tocsc() if fmt == "csr" else a.tocsr()
    assert t.filter(other).format == fmt
    with pytest.raises(TypeError, match="expected a .* sparse matrix"):
        t.filter(other, strict=True)
    with pytest.raises(TypeError, match="cannot safely convert"):
        S.SparseType(fmt, "float32").filter(a)
    with pytest.raises(TypeError, match="expected a sparse matrix"):
        t.filter("nope")
    with pytest.raises(ValueError, match="format"):
        S.SparseType("coo", "float64")
    with pytest.raises(TypeError, match="dtype float16"):
        S.SparseType("csr", "float16")
    assert t.values_eq(a, a.copy()) and t.values_eq_approx(a, a * (1 + 1e-9))
    assert not t.values_eq(a, a * 2)


def test_as_sparse_variable_and_constants():
    a = rnd(3, 4)
    c = S.as_sparse_variable(a)
    assert isinstance(c, S.SparseConstant) and c.type == S.csr_dmatrix
    assert S.as_sparse(c) is c
    np.testing.assert_allclose(S.dense_from_sparse(c).eval(), a.toarray())
    assert isinstance(S.as_sparse_or_tensor_variable(np.ones((2, 2))), T.TensorVariable)
    assert isinstance(S.as_sparse_or_tensor_variable(a), S.SparseVariable)
    with pytest.raises(TypeError, match="expected a sparse variable.*csr_from_dense"):
        S.as_sparse_variable(T.dmatrix())
    with pytest.raises(TypeError, match="ndarray of shape"):
        S.as_sparse_variable(np.ones((2, 2)))


def test_function_inputs_are_checked_and_converted():
    x = S.csr_matrix("x", "float64")
    f = function([x], S.dense_from_sparse(x))
    a = rnd(3, 4)
    np.testing.assert_allclose(f(a), a.toarray())
    np.testing.assert_allclose(f(a.tocsc()), a.toarray())   # converted to csr
    with pytest.raises(TypeError, match="sparse"):
        f(np.float32(1.0))


# ----------------------------------------------------------------------------- operators

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_operators_match_scipy(fmt):
    x, y = S.matrix(fmt, "x", "float64"), S.matrix(fmt, "y", "float64")
    d = T.dmatrix("d")
    a, b, v = rnd(4, 5, fmt, seed=0), rnd(4, 5, fmt, seed=3), dense(4, 5)
    outs = [x + y, x - y, x * y, x * d, -x, x.T, x + d, d + x, x - d, x * 3.0,
            x.astype("float32")]
    f = function([x, y, d], [o.toarray() if S._is_sparse_variable(o) else o for o in outs]
                 + [x.shape, x.size])
    got = f(a, b, v)
    want = [a + b, a - b, a.multiply(b), a.multiply(v), -a, a.T, a + v, a + v, a - v, a * 3.0,
            a.astype("float32")]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.toarray() if sp.issparse(w) else np.asarray(w), rtol=1e-6)
    assert got[10].dtype == np.float32
    assert list(got[-2]) == [4, 5] and int(got[-1]) == a.nnz
    # sparse results have the right types
    assert (x + y).type.format == fmt and (x * d).type.format == fmt
    assert x.T.type.format == ("csc" if fmt == "csr" else "csr")
    assert isinstance((x + d).type, T.TensorType)


def test_shape_of_computed_sparse_values_computes_nothing():
    x, y = S.csr_matrix("x", "float64"), T.dmatrix("y")
    z = S.structured_dot(x, y)
    f = function([x, y], (S.csr_from_dense(z) * 2).shape)
    ops = {type(n.op) for n in f.maker.fgraph.toposort()}
    assert S.StructuredDot not in ops and S.MulSD not in ops and S.SparseFromDense not in ops
    assert list(f(rnd(3, 4), dense(4, 6))) == [3, 6]


def test_mul_broadcasts_a_dense_row_column_or_scalar():
    x, r, c, s = S.csr_matrix("x", "float64"), T.drow("r"), T.dcol("c"), T.dscalar("s")
    a = rnd(4, 5)
    rv, cv = dense(1, 5), dense(4, 1)
    f = function([x, r, c, s], [S.mul(x, r).toarray(), S.mul(x, c).toarray(),
                                (x * s).toarray(), S.mul(x, r[0]).toarray()])
    got = f(a, rv, cv, 2.5)
    for g, w in zip(got, [a.multiply(rv), a.multiply(cv), a * 2.5, a.multiply(rv)]):
        np.testing.assert_allclose(g, w.toarray())


def test_add_and_mul_errors_name_the_operands():
    x, y = S.csr_matrix("x", "float64"), S.csc_matrix("y", "float64")
    with pytest.raises(TypeError, match="same format"):
        x + y
    with pytest.raises(TypeError, match="same format"):
        x * y
    with pytest.raises(TypeError, match="one of .* must be sparse"):
        S.add(T.dmatrix(), T.dmatrix())
    with pytest.raises(TypeError, match="more than 2 dimensions"):
        S.mul_s_d(x, T.dtensor3())
    q = S.csr_matrix("q", "float64")
    k = function([x, q], [(x + q).toarray(), (x * q).toarray()])
    with pytest.raises(ValueError, match="shapes .* differ"):
        k(rnd(2, 3), rnd(3, 3))
    d = T.dmatrix("d")
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) \(sparse\) and \(3, 3\) \(dense\)"):
        function([x, d], (x * d).toarray())(rnd(2, 3), dense(3, 3))


# ----------------------------------------------------------------------------- CSM

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_csm_round_trip_and_properties(fmt):
    x = S.matrix(fmt, "x", "float64")
    data, ind, ptr, shape = S.csm_properties(x)
    y = S.CSM(fmt)(data * 2, ind, ptr, shape)
    f = function([x], [data, ind, ptr, shape, y.toarray(), S.csm_data(x), S.csm_indices(x),
                       S.csm_indptr(x), S.csm_shape(x)])
    a = rnd(4, 6, fmt)
    d, i, p, s, yd, d2, i2, p2, s2 = f(a)
    np.testing.assert_array_equal(d, a.data)
    np.testing.assert_array_equal(i, a.indices)
    np.testing.assert_array_equal(p, a.indptr)
    assert list(s) == [4, 6] and i.dtype == np.int32 and s.dtype == np.int32
    np.testing.assert_allclose(yd, 2 * a.toarray())
    np.testing.assert_array_equal(d2, d)
    ctor = S.CSR if fmt == "csr" else S.CSC
    built = ctor(T.dvector(), T.ivector(), T.ivector(), T.ivector())
    assert built.type.format == fmt


def test_csm_errors_say_what_is_wrong():
    d, i, p, s = T.dvector("d"), T.ivector("i"), T.ivector("p"), T.ivector("s")
    f = function([d, i, p, s], S.CSR(d, i, p, s).toarray())
    i32 = lambda *v: np.asarray(v, dtype="int32")
    np.testing.assert_allclose(f(np.array([1.0, 2.0]), i32(0, 1), i32(0, 1, 2), i32(2, 2)),
                               np.eye(2) * [1, 2])
    with pytest.raises(ValueError, match="same length"):
        f(np.array([1.0]), i32(0, 1), i32(0, 1, 2), i32(2, 2))
    with pytest.raises(ValueError, match="indptr of length 3"):
        f(np.array([1.0, 2.0]), i32(0, 1), i32(0, 2), i32(2, 2))
    with pytest.raises(TypeError, match="indices must be an integer vector"):
        S.CSR(d, T.dvector(), p, s)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_csm_and_properties_gradients(fmt):
    a = rnd(4, 5, fmt)
    ind, ptr, shp = a.indices, a.indptr, np.asarray(a.shape, dtype="int32")
    verify_grad(lambda d: S.dense_from_sparse(S.CSM(fmt)(d, ind, ptr, shp)) ** 2,
                [a.data.copy()], rng=np.random.default_rng(0))
    verify_grad_sparse(lambda x: S.csm_data(x) ** 2, [a], structured=True)


# ----------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_dense_sparse_conversions(fmt):
    d = T.dmatrix("d")
    v = dense(3, 4)
    v[v < 0] = 0
    conv = S.csr_from_dense if fmt == "csr" else S.csc_from_dense
    f = function([d], [conv(d), S.dense_from_sparse(conv(d))])
    s, back = f(v)
    assert sp.issparse(s) and s.format == fmt and s.nnz == np.count_nonzero(v)
    np.testing.assert_array_equal(back, v)
    verify_grad(lambda x: S.dense_from_sparse(conv(x)) * 3, [v + 0.5],
                rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="must be a matrix"):
        conv(T.dvector())
    with pytest.raises(TypeError, match="cannot be stored"):
        conv(T.matrix(dtype="bool"))


def test_dense_from_sparse_gradient_is_structured_unless_asked():
    x = S.csr_matrix("x", "float64")
    a = rnd(3, 4)
    g1 = symgpu.grad((S.dense_from_sparse(x) * 2).sum(), x)
    g2 = symgpu.grad((S.DenseFromSparse(structured=False)(x) * 2).sum(), x)
    r1, r2 = function([x], [S.dense_from_sparse(g1), S.dense_from_sparse(g2)])(a)
    np.testing.assert_allclose(r1, 2 * (a.toarray() != 0))
    np.testing.assert_allclose(r2, np.full((3, 4), 2.0))


def test_cast_transpose_neg_remove0():
    x = S.csr_matrix("x", "float64")
    a = rnd(3, 4)
    a2 = a.copy()
    a2.data[0] = 0.0
    outs = [S.cast(x, "float32"), S.fcast(x), S.transpose(x), S.neg(x), S.remove0(x)]
    got = function([x], outs)(a2)
    assert got[0].dtype == np.float32 and got[1].dtype == np.float32
    assert got[2].format == "csc"
    np.testing.assert_allclose(got[2].toarray(), a2.toarray().T)
    np.testing.assert_allclose(got[3].toarray(), -a2.toarray())
    assert got[4].nnz == a2.nnz - 1
    assert S.cast(x, "float64") is x
    for fn in (lambda v: S.transpose(v), lambda v: -v, S.remove0, lambda v: S.cast(v, "float32")):
        verify_grad_sparse(fn, [a], structured=True)
        verify_grad_sparse(fn, [a], structured=False)


def test_sp_ones_like_and_zeros_like():
    x = S.csc_matrix("x", "float64")
    a = rnd(3, 4, "csc")
    o, z = function([x], [S.sp_ones_like(x), S.sp_zeros_like(x)])(a)
    np.testing.assert_array_equal(o.toarray(), (a.toarray() != 0).astype(float))
    assert z.nnz == 0 and z.shape == (3, 4) and z.format == "csc"


# ----------------------------------------------------------------------------- elementwise

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_elementwise_gradients(fmt):
    a, b, v = rnd(3, 4, fmt, seed=0), rnd(3, 4, fmt, seed=5), dense(3, 4)
    for op in (S.add, S.sub, S.mul):
        verify_grad_sparse(op, [a, b], structured=False)
        verify_grad_sparse(op, [a, b], structured=True)
    verify_grad_sparse(S.mul, [a, v], structured=True)
    verify_grad_sparse(lambda x, d: S.mul(x, d[0]), [a, v], structured=True)
    verify_grad_sparse(S.add, [a, v], structured=True)
    verify_grad_sparse(S.sub, [v, a], structured=True)


STRUCTURED = [
    (S.structured_sigmoid, lambda d: 1 / (1 + np.exp(-d)), ()),
    (S.structured_exp, np.exp, ()),
    (S.structured_log, np.log, ()),
    (S.structured_pow, lambda d: d ** 2.5, (2.5,)),
    (S.structured_minimum, lambda d: np.minimum(d, 0.9), (0.9,)),
    (S.structured_maximum, lambda d: np.maximum(d, 0.9), (0.9,)),
    (S.structured_add, lambda d: d + 1.5, (1.5,)),
    (S.sin, np.sin, ()), (S.tanh, np.tanh, ()), (S.sqrt, np.sqrt, ()), (S.sqr, np.square, ()),
    (S.expm1, np.expm1, ()), (S.log1p, np.log1p, ()), (S.arctan, np.arctan, ()),
]


@pytest.mark.parametrize("fn,ref,args", STRUCTURED, ids=lambda v: getattr(v, "__name__", ""))
def test_structured_functions_apply_to_stored_values(fn, ref, args):
    x = S.csr_matrix("x", "float64")
    a = rnd(4, 5)
    out = function([x], fn(x, *args))(a)
    assert out.format == "csr"
    want = a.copy()
    want.data = ref(a.data)
    np.testing.assert_allclose(out.toarray(), want.toarray(), rtol=1e-12)
    verify_grad_sparse(lambda v: fn(v, *args), [a], structured=True)


def test_structured_functions_refuse_non_scalar_arguments():
    with pytest.raises(TypeError, match="argument 1 must be a scalar"):
        S.structured_pow(S.csr_matrix(), T.dvector())


# ----------------------------------------------------------------------------- products

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_structured_dot_values_and_gradients(fmt):
    x, y = S.matrix(fmt, "x", "float64"), T.dmatrix("y")
    a, b = rnd(4, 5, fmt), dense(5, 3)
    np.testing.assert_allclose(function([x, y], S.structured_dot(x, y))(a, b), a @ b)
    d = T.dmatrix("d")
    np.testing.assert_allclose(function([d, x], S.structured_dot(d, x))(dense(2, 4), a),
                               dense(2, 4) @ a.toarray())
    verify_grad_sparse(S.structured_dot, [a, b], structured=True)
    # the gradient of the sparse operand stays on its pattern
    g = symgpu.grad(S.structured_dot(x, y).sum(), x)
    assert g.type == x.type
    gv = function([x, y], g)(a, b)
    assert set(zip(*gv.nonzero())) <= set(zip(*a.nonzero()))
    with pytest.raises(ValueError, match="not aligned"):
        function([x, y], S.structured_dot(x, y))(a, dense(4, 3))
    with pytest.raises(TypeError, match="at least one sparse"):
        S.structured_dot(T.dmatrix(), T.dmatrix())
    s2 = S.matrix(fmt, "s2", "float64")
    out = function([x, s2], S.structured_dot(x, s2))(a, rnd(5, 2, fmt, seed=4))
    assert sp.issparse(out)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_dot_and_true_dot(fmt):
    x, y = S.matrix(fmt, "x", "float64"), S.matrix(fmt, "y", "float64")
    d, v = T.dmatrix("d"), T.dvector("v")
    a, b, m, vec = rnd(4, 5, fmt), rnd(5, 3, fmt, seed=2), dense(5, 3), dense(1, 5)[0]
    f = function([x, y, d, v], [S.dot(x, y), S.dot(x, d), S.dot(d.T, x.T), S.dot(x, v),
                                S.dot(v[:4], x), S.true_dot(x, y), S.true_dot(x, d),
                                S.true_dot(d.T, x.T)])
    r = f(a, b, m, vec)
    want = [(a @ b).toarray(), a @ m, m.T @ a.T.toarray(), a @ vec, vec[:4] @ a.toarray(),
            (a @ b).toarray(), a @ m, m.T @ a.T.toarray()]
    assert isinstance(r[0], np.ndarray) and sp.issparse(r[5]) and isinstance(r[6], np.ndarray)
    for g, w in zip(r, want):
        np.testing.assert_allclose(g.toarray() if sp.issparse(g) else g, w)
    for op in (S.dot, S.true_dot):
        verify_grad_sparse(op, [a, m])
        verify_grad_sparse(op, [a, b])
        verify_grad_sparse(op, [m.T, a.T.tocsr() if fmt == "csr" else a.T.tocsc()])
    verify_grad_sparse(S.dot, [a, vec])
    verify_grad_sparse(S.dot, [vec[:4], a])


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_sp_sum(axis, sparse_grad):
    x = S.csc_matrix("x", "float64")
    a = rnd(4, 5, "csc")
    got = function([x], S.sp_sum(x, axis, sparse_grad))(a)
    want = a.sum() if axis is None else np.asarray(a.sum(axis=axis)).ravel()
    np.testing.assert_allclose(got, want)
    assert x.sum(axis).owner.op == S.SpSum(axis, False)
    verify_grad_sparse(lambda v: S.sp_sum(v, axis, sparse_grad) * 2, [a], structured=sparse_grad)
    with pytest.raises(ValueError, match="axis must be None, 0 or 1"):
        S.sp_sum(x, 2)


# ----------------------------------------------------------------------------- sparse_grad

def test_sparse_grad_of_row_indexing():
    x, i = T.dmatrix("x"), T.lvector("i")
    y = S.sparse_grad(x[i])
    assert isinstance(y.owner.op, S.SparseGradSubtensor1)
    v, idx = dense(5, 3), np.array([0, 3, 3, 1])
    np.testing.assert_array_equal(function([x, i], y)(v, idx), v[idx])
    g = symgpu.grad((y ** 2).sum(), x)
    want = np.zeros_like(v)
    np.add.at(want, idx, 2 * v[idx])
    np.testing.assert_allclose(function([x, i], g)(v, idx), want)
    verify_grad(lambda m: S.sparse_grad(m[idx]) ** 2, [v], rng=np.random.default_rng(0))
    c = function([x, i], S.construct_sparse_from_list(x, x[i], i))(v, idx)
    assert c.format == "csc"
    np.testing.assert_allclose(c.toarray(), np.where(np.isin(np.arange(5), idx)[:, None], 1, 0)
                               * v * np.bincount(idx, minlength=5)[:, None])
    with pytest.raises(TypeError, match="only the result of advanced indexing"):
        S.sparse_grad(x[1:])
    with pytest.raises(IndexError, match="out of bounds|shape"):
        function([x, i], y)(v, np.array([7]))


# ----------------------------------------------------------------------------- shared variables

def test_shared_sparse_variables():
    a = rnd(3, 4, "csc")
    s = symgpu.shared(a, name="s")
    assert isinstance(s, S.SparseTensorSharedVariable) and s.type == S.csc_dmatrix
    assert s.get_value() is not a and (s.get_value() != a).nnz == 0
    f = function([], S.sp_sum(s), updates=[(s, s * 2.0)])
    assert np.isclose(f(), a.sum()) and np.isclose(f(), 2 * a.sum())
    s.set_value(rnd(3, 4, "csc", seed=9))
    assert np.isclose(f(), rnd(3, 4, "csc", seed=9).sum())
    t = S.shared_constructor(a, format="csr")
    assert t.type.format == "csr"
    with pytest.raises(TypeError, match="sparse constructor takes a scipy.sparse matrix"):
        S.sparse_constructor(np.ones((2, 2)))
    u = pickle.loads(pickle.dumps(s))
    assert u.type == s.type and (u.get_value() != s.get_value()).nnz == 0


def sparse_pickle_case():
    """(inputs, outputs, values) with every sparse op class (tests/test_pickle.py's table)."""
    x, y, d, i = S.csr_matrix("x", "float64"), S.csr_matrix("y", "float64"), T.dmatrix("d"), \
        T.lvector("i")
    data, ind, ptr, shp = S.csm_properties(x)
    s = S.structured_dot(x, d.T) + S.dot(x, d.T) + S.true_dot(x, d.T)
    z = S.add(x * y, S.CSR(data, ind, ptr, shp)) - y + S.structured_exp(x)
    cost = (S.dense_from_sparse(z.T) ** 2).sum() + (s ** 2).sum() + S.sp_sum(x, 0).sum() \
        + S.sp_sum(S.remove0(S.cast(S.csr_from_dense(d), "float32")))
    g = symgpu.grad(cost + (S.sparse_grad(d[i]) ** 2).sum() + (S.mul(x, d) + d).sum(), [x, d])
    outs = [S.dense_from_sparse(g[0]), g[1], cost, S.sparse_shape(z), S.SpNnz()(x),
            S.dense_from_sparse(S.construct_sparse_from_list(d, d[i], i)),
            S.dense_from_sparse(S.sp_zeros_like(x)),
            S.dense_from_sparse(S.true_dot(x, y.T)), S.dense_from_sparse(-S.sp_ones_like(y))]
    return [x, y, d, i], outs, [rnd(3, 4), rnd(3, 4, seed=3), dense(3, 4), np.array([0, 2, 2])]


def test_compiled_sparse_functions_pickle():
    ins, outs, vals = sparse_pickle_case()
    for mode in ("FAST_RUN", "FAST_COMPILE"):
        f = function(ins, outs, mode=mode)
        g = pickle.loads(pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL))
        for got, want in zip(g(*vals), f(*vals)):
            np.testing.assert_array_equal(got, want)
    ops = {type(n.op) for n in function(ins, outs, mode="FAST_COMPILE").maker.fgraph.toposort()}
    assert {S.CSM, S.CSMGrad, S.StructuredDotGrad, S.Dot, S.TrueDot, S.ConstructSparseFromList,
            S.SparseGradSubtensor1, S.AddSS, S.AddSD, S.MulSS, S.MulSD} <= ops


def test_gradient_of_a_sparse_variable_used_twice_sums_its_terms():
    x, y = S.csr_matrix("x", "float64"), T.dmatrix("y")
    a, b = rnd(3, 4), dense(4, 2)
    cost = S.structured_dot(x, y).sum() + S.sp_sum(x * 3.0, sparse_grad=True)
    g = symgpu.grad(cost, x)
    assert g.type == x.type
    want = (b.sum(axis=1)[None, :] + 3.0) * (a.toarray() != 0)
    np.testing.assert_allclose(function([x, y], S.dense_from_sparse(g))(a, b), want)
    # tensor functions read a sparse variable's dense form
    np.testing.assert_allclose(function([x], T.exp(x))(a), np.exp(a.toarray()))
