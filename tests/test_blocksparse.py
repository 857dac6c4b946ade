"""symgpu.tensor.nnet.blocksparse (Theano's block-sparse products): values against direct
NumPy loops, gradients, the in-place variants and the errors."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.compile.mode import Mode
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet.blocksparse import (SparseBlockGemv, SparseBlockOuter, sparse_block_dot,
                                            sparse_block_gemv, sparse_block_gemv_inplace,
                                            sparse_block_outer, sparse_block_outer_inplace)

N_IN, N_OUT, I_SIZE, O_SIZE, I_WIN, O_WIN, BATCH = 8, 7, 6, 5, 4, 3, 2


def gemv_data(dtype="float64", seed=0, repeat=False):
    r = np.random.default_rng(seed)
    h = r.standard_normal((BATCH, I_WIN, I_SIZE)).astype(dtype)
    if repeat:  # blocks chosen with repetition
        iIdx = r.integers(0, N_IN, (BATCH, I_WIN)).astype("int32")
        oIdx = r.integers(0, N_OUT, (BATCH, O_WIN)).astype("int32")
    else:
        iIdx = np.stack([r.permutation(N_IN)[:I_WIN] for _ in range(BATCH)]).astype("int32")
        oIdx = np.stack([r.permutation(N_OUT)[:O_WIN] for _ in range(BATCH)]).astype("int32")
    W = r.standard_normal((N_IN, N_OUT, I_SIZE, O_SIZE)).astype(dtype)
    b = r.standard_normal((N_OUT, O_SIZE)).astype(dtype)
    return W, h, iIdx, b, oIdx


def outer_data(dtype="float64", seed=1):
    r = np.random.default_rng(seed)
    o = r.standard_normal((N_IN, N_OUT, I_SIZE, O_SIZE)).astype(dtype)
    x = r.standard_normal((BATCH, I_WIN, I_SIZE)).astype(dtype)
    y = r.standard_normal((BATCH, O_WIN, O_SIZE)).astype(dtype)
    xIdx = r.integers(0, N_IN, (BATCH, I_WIN)).astype("int32")    # with repetition
    yIdx = r.integers(0, N_OUT, (BATCH, O_WIN)).astype("int32")
    return o, x, y, xIdx, yIdx


def gemv_loop(o, W, h, iIdx, oIdx):
    o = np.array(o, dtype="float64")
    for b in range(o.shape[0]):
        for j in range(o.shape[1]):
            for i in range(h.shape[1]):
                o[b, j] += h[b, i].astype("float64") @ W[iIdx[b, i], oIdx[b, j]]
    return o


def outer_loop(o, x, y, xIdx, yIdx, alpha=1.0):
    o = np.array(o, dtype="float64")
    for b in range(x.shape[0]):
        for i in range(xIdx.shape[1]):
            for j in range(yIdx.shape[1]):
                o[xIdx[b, i], yIdx[b, j]] += alpha * np.outer(x[b, i], y[b, j])
    return o


def gemv_vars(dtype="float64"):
    return (T.tensor3("o", dtype=dtype), T.tensor4("W", dtype=dtype), T.tensor3("h", dtype=dtype),
            T.imatrix("iIdx"), T.imatrix("oIdx"))


def ops_of(f):
    return [n.op for n in f.maker.fgraph.toposort()]


# ---------------------------------------------------------------------------- values

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("repeat", [False, True])
def test_sparse_block_dot_matches_loop(dtype, repeat):
    W, h, iIdx, b, oIdx = gemv_data(dtype, repeat=repeat)
    Wv, hv, bv = T.tensor4(dtype=dtype), T.tensor3(dtype=dtype), T.matrix(dtype=dtype)
    iv, ov = T.imatrix(), T.imatrix()
    out = sparse_block_dot(Wv, hv, iv, bv, ov)
    assert out.dtype == dtype and out.ndim == 3
    got = function([Wv, hv, iv, bv, ov], out)(W, h, iIdx, b, oIdx)
    tol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, gemv_loop(b[oIdx], W, h, iIdx, oIdx), rtol=tol, atol=tol)


def test_sparse_block_dot_one_example():
    W, h, iIdx, b, oIdx = gemv_data()
    Wv, hv, bv, iv, ov = T.dtensor4(), T.dmatrix(), T.dmatrix(), T.ivector(), T.ivector()
    out = sparse_block_dot(Wv, hv, iv, bv, ov)
    got = function([Wv, hv, iv, bv, ov], out)(W, h[0], iIdx[0], b, oIdx[0])
    want = gemv_loop(b[oIdx[:1]], W, h[:1], iIdx[:1], oIdx[:1])
    assert got.shape == (1, O_WIN, O_SIZE)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_sparse_block_gemv_matches_loop_and_keeps_o():
    W, h, iIdx, b, oIdx = gemv_data(repeat=True)
    o = np.random.default_rng(3).standard_normal((BATCH, O_WIN, O_SIZE))
    ins = gemv_vars()
    f = function(list(ins), sparse_block_gemv(*ins))
    o_before = o.copy()
    np.testing.assert_allclose(f(o, W, h, iIdx, oIdx), gemv_loop(o, W, h, iIdx, oIdx),
                               rtol=1e-12)
    np.testing.assert_array_equal(o, o_before)   # a graph input is never overwritten


def test_sparse_block_outer_matches_loop():
    o, x, y, xIdx, yIdx = outer_data()
    ov, xv, yv = T.dtensor4(), T.dtensor3(), T.dtensor3()
    xi, yi = T.imatrix(), T.imatrix()
    f = function([ov, xv, yv, xi, yi], sparse_block_outer(ov, xv, yv, xi, yi))
    np.testing.assert_allclose(f(o, x, y, xIdx, yIdx), outer_loop(o, x, y, xIdx, yIdx),
                               rtol=1e-12)
    a = T.dscalar()
    g = function([ov, xv, yv, xi, yi, a], sparse_block_outer(ov, xv, yv, xi, yi, a))
    np.testing.assert_allclose(g(o, x, y, xIdx, yIdx, -0.5),
                               outer_loop(o, x, y, xIdx, yIdx, -0.5), rtol=1e-12)


# ---------------------------------------------------------------------------- in place

def test_inplace_ops_overwrite_o_and_declare_it():
    assert sparse_block_gemv_inplace.destroy_map == {0: [0]}
    assert sparse_block_outer_inplace.destroy_map == {0: [0]}
    assert sparse_block_gemv.destroy_map == {} and sparse_block_outer.destroy_map == {}
    assert SparseBlockGemv(True) == sparse_block_gemv_inplace != sparse_block_gemv
    W, h, iIdx, b, oIdx = gemv_data()
    o = np.random.default_rng(4).standard_normal((BATCH, O_WIN, O_SIZE))
    want = gemv_loop(o, W, h, iIdx, oIdx)
    node = sparse_block_gemv_inplace.make_node(*gemv_vars())
    store = [[None]]
    sparse_block_gemv_inplace.perform(node, [o, W, h, iIdx, oIdx], store)
    assert store[0][0] is o
    np.testing.assert_allclose(o, want, rtol=1e-12)

    o4, x, y, xIdx, yIdx = outer_data()
    want = outer_loop(o4, x, y, xIdx, yIdx)
    node = sparse_block_outer_inplace.make_node(T.dtensor4(), T.dtensor3(), T.dtensor3(),
                                                T.imatrix(), T.imatrix())
    sparse_block_outer_inplace.perform(node, [o4, x, y, xIdx, yIdx, np.float32(1)], store)
    assert store[0][0] is o4
    np.testing.assert_allclose(o4, want, rtol=1e-12)


def test_inplace_pass_uses_inplace_variants_where_safe():
    W, h, iIdx, b, oIdx = gemv_data()
    Wv, hv, bv, iv, ov = T.dtensor4(), T.dtensor3(), T.dmatrix(), T.imatrix(), T.imatrix()
    out = sparse_block_dot(Wv, hv, iv, bv, ov)          # o = b[oIdx]: an intermediate
    f = function([Wv, hv, iv, bv, ov], out)
    assert sparse_block_gemv_inplace in ops_of(f)
    np.testing.assert_allclose(f(W, h, iIdx, b, oIdx), gemv_loop(b[oIdx], W, h, iIdx, oIdx),
                               rtol=1e-12)
    # o read again by another output: kept out of place, both results right
    o = b[oIdx]
    ins = gemv_vars()
    o2 = ins[0] * 2
    g = function(list(ins), [sparse_block_gemv(o2, *ins[1:]), o2])
    assert sparse_block_gemv_inplace not in ops_of(g)
    r1, r2 = g(o, W, h, iIdx, oIdx)
    np.testing.assert_allclose(r1, gemv_loop(2 * o, W, h, iIdx, oIdx), rtol=1e-12)
    np.testing.assert_allclose(r2, 2 * o)
    # without the inplace tag: the plain op
    m = Mode("FAST_RUN").excluding_tags("inplace")
    assert sparse_block_gemv_inplace not in ops_of(function([Wv, hv, iv, bv, ov], out, mode=m))


# ---------------------------------------------------------------------------- gradients

def test_verify_grad_sparse_block_dot_W_h_b():
    W, h, iIdx, b, oIdx = gemv_data(repeat=True)
    iv, ov = T.constant(iIdx), T.constant(oIdx)
    verify_grad(lambda W_, h_, b_: sparse_block_dot(W_, h_, iv, b_, ov), [W, h, b])


def test_verify_grad_sparse_block_gemv_o():
    W, h, iIdx, b, oIdx = gemv_data()
    o = np.random.default_rng(5).standard_normal((BATCH, O_WIN, O_SIZE))
    iv, ov = T.constant(iIdx), T.constant(oIdx)
    verify_grad(lambda o_, W_, h_: sparse_block_gemv(o_, W_, h_, iv, ov), [o, W, h])


def test_gradient_graph_is_theanos():
    o, W, h, iIdx, oIdx = gemv_vars()
    out = sparse_block_gemv(o, W, h, iIdx, oIdx)
    gW, gh = T.grad(out.sum(), [W, h])
    assert isinstance(gW.owner.op, SparseBlockOuter)
    assert gW.owner.inputs[1] is h and gW.owner.inputs[3] is iIdx and gW.owner.inputs[4] is oIdx
    assert isinstance(gh.owner.op, SparseBlockGemv)
    assert gh.owner.inputs[3] is oIdx and gh.owner.inputs[4] is iIdx
    assert gh.owner.inputs[1].owner.op.new_order == (1, 0, 3, 2)
    # values of the W gradient: the outer products of h with the ones of the output grad
    Wn, hn, iIn, _, oIn = gemv_data(repeat=True)
    on = np.zeros((BATCH, O_WIN, O_SIZE))
    gWv = function([o, W, h, iIdx, oIdx], gW)(on, Wn, hn, iIn, oIn)
    np.testing.assert_allclose(gWv, outer_loop(np.zeros_like(Wn), hn, np.ones_like(on), iIn, oIn),
                               rtol=1e-12)


def test_no_gradient_flows_to_the_indices():
    o, W, h, iIdx, oIdx = gemv_vars()
    out = sparse_block_gemv(o, W, h, iIdx, oIdx)
    assert out.owner.op.grad(out.owner.inputs, [out])[3:] == [None, None]
    g = T.grad(out.sum(), iIdx)   # integer input: zeros, as for any integer input
    Wn, hn, iIn, _, oIn = gemv_data()
    on = np.zeros((BATCH, O_WIN, O_SIZE))
    gv = function([o, W, h, iIdx, oIdx], g, on_unused_input="ignore")(on, Wn, hn, iIn, oIn)
    assert not np.any(gv)


# ---------------------------------------------------------------------------- shapes, errors

def test_infer_shape_needs_no_product():
    o, W, h, iIdx, oIdx = gemv_vars()
    out = sparse_block_gemv(o, W, h, iIdx, oIdx)
    f = function([o, W, h, iIdx, oIdx], out.shape, on_unused_input="ignore")
    assert not any(isinstance(op, SparseBlockGemv) for op in ops_of(f))
    Wn, hn, iIn, _, oIn = gemv_data()
    assert tuple(f(np.zeros((BATCH, O_WIN, O_SIZE)), Wn, hn, iIn, oIn)) == (BATCH, O_WIN, O_SIZE)


def test_make_node_type_errors():
    o, W, h, iIdx, oIdx = gemv_vars()
    with pytest.raises(TypeError, match="4-d"):
        sparse_block_gemv(o, T.dtensor3(), h, iIdx, oIdx)
    with pytest.raises(TypeError, match="3-d"):
        sparse_block_gemv(T.dmatrix(), W, h, iIdx, oIdx)
    with pytest.raises(TypeError, match="integers"):
        sparse_block_gemv(o, W, h, T.dmatrix(), oIdx)
    with pytest.raises(TypeError, match="2-d"):
        sparse_block_gemv(o, W, h, T.ivector(), oIdx)
    with pytest.raises(TypeError, match="alpha"):
        sparse_block_outer(W, h, h, iIdx, oIdx, T.dvector())
    with pytest.raises(TypeError, match="one dimension fewer"):
        sparse_block_dot(W, h, T.ivector(), T.dmatrix(), oIdx)


def _gemv_fn():
    ins = gemv_vars()
    return function(list(ins), sparse_block_gemv(*ins))


@pytest.mark.parametrize("change, err, match", [
    (lambda a: a.update(h=a["h"][:, :, :-1]), ValueError, "block size"),
    (lambda a: a.update(o=a["o"][:, :, :-1]), ValueError, "block size"),
    (lambda a: a.update(iIdx=a["iIdx"][:, :-1]), ValueError, "inputIdx"),
    (lambda a: a.update(oIdx=a["oIdx"][:1]), ValueError, "batch sizes"),
    (lambda a: a["iIdx"].__setitem__((0, 0), N_IN), IndexError, "inputIdx"),
    (lambda a: a["oIdx"].__setitem__((1, 2), -1), IndexError, "outputIdx"),
])
def test_gemv_runtime_errors(change, err, match):
    W, h, iIdx, b, oIdx = gemv_data()
    a = dict(o=np.zeros((BATCH, O_WIN, O_SIZE)), W=W, h=h, iIdx=iIdx, oIdx=oIdx)
    change(a)
    with pytest.raises(err, match=match):
        _gemv_fn()(a["o"], a["W"], a["h"], a["iIdx"], a["oIdx"])


def test_outer_runtime_errors():
    o, x, y, xIdx, yIdx = outer_data()
    ov, xv, yv, xi, yi = T.dtensor4(), T.dtensor3(), T.dtensor3(), T.imatrix(), T.imatrix()
    f = function([ov, xv, yv, xi, yi], sparse_block_outer(ov, xv, yv, xi, yi))
    with pytest.raises(ValueError, match="xSize, ySize"):
        f(o, x[:, :, :-1], y, xIdx, yIdx)
    with pytest.raises(ValueError, match="yIdx"):
        f(o, x, y, xIdx, yIdx[:, :-1])
    bad = yIdx.copy()
    bad[0, 0] = N_OUT
    with pytest.raises(IndexError, match="yIdx"):
        f(o, x, y, xIdx, bad)


def test_theano_path():
    import symgpu.tensor.nnet.blocksparse as bs
    assert bs.sparse_block_dot is sparse_block_dot
    assert symgpu.tensor.nnet.blocksparse is bs
