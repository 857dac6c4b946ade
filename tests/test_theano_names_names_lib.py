"""Theano's documented names of issue 33 made present by helper names-lib: theano.sparse.basic
(the whole sparse package), theano.sparse.sandbox.sp / sp2 / truedot, theano.sandbox.linalg.ops
(HintsFeature, HintsOptimizer), theano.sandbox.neighbours, theano.tensor.slinalg.CholeskyGrad,
theano.d3viz.d3viz.replace_patterns and theano.gpuarray.linalg — each checked for Theano's
behaviour (NumPy / SciPy references, gradients, the GPU ops' device work on fake libraries,
placement on a virtual GPU, and on the GPU machine the real thing)."""
from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import symgpu
import symgpu.sparse as S
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from test_sparse import verify_grad_sparse

RNG = np.random.default_rng(31)


def rnd(m, n, fmt="csr", seed=0, density=0.5):
    a = sp.random(m, n, density=density, format=fmt, random_state=seed)
    a.data += 0.5
    return a


# ============================================================================ theano.sparse.basic

def test_sparse_basic_path_gathers_the_package_under_the_theano_alias():
    code = ("import sys, symgpu\nsys.modules['theano'] = symgpu\n"
            "import theano.sparse.basic as B, symgpu.sparse as S\n"
            "names = ['add', 'as_sparse_or_tensor_variable', 'clean', 'col_scale', 'dot',\n"
            "         'hstack', 'mul', 'row_scale', 'sp_sum', 'structured_dot', 'sub',\n"
            "         'true_dot', 'vstack', 'CSM', 'csm_data']\n"
            "assert all(getattr(B, n) is getattr(S, n) for n in names)\n"
            "import symgpu.sparse.basic as old\n"   # our module's old path keeps its names
            "assert old.CSM is S.construct.CSM and old.remove0 is S.remove0\n"
            "from theano.sparse.sandbox.sp import convolve, max_pool, ConvolutionIndices, sp_sum\n"
            "from theano.sparse.sandbox.sp2 import Poisson, Binomial, Multinomial, HStack\n"
            "from theano.sparse.sandbox.truedot import true_dot, TrueDot\n"
            "from theano.sandbox.neighbours import images2neibs, neibs2images, Images2Neibs\n"
            "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_old_pickles_of_the_renamed_module_load():
    # a pickle written before symgpu.sparse.basic became symgpu.sparse.construct names
    # "symgpu.sparse.basic.Remove0": the path layer serves it
    import symgpu.sparse.basic as old
    data = pickle.dumps(S.Remove0(), protocol=0).replace(b"symgpu.sparse.construct",
                                                         b"symgpu.sparse.basic")
    assert b"symgpu.sparse.basic" in data and isinstance(pickle.loads(data), old.Remove0)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_clean_removes_zeros_and_sorts_indices(fmt):
    a = sp.csr_matrix((np.array([3.0, 0.0, 1.0, 2.0]), np.array([2, 0, 1, 0]),
                       np.array([0, 2, 4])), shape=(2, 3))
    a = a if fmt == "csr" else sp.csc_matrix((a.data, a.indices, a.indptr), shape=(3, 2))
    assert not a.has_sorted_indices
    x = S.matrix(fmt, dtype="float64")
    got = function([x], S.clean(x))(a)
    want = a.copy()
    want.eliminate_zeros()
    want.sort_indices()
    assert got.format == fmt and got.nnz == 3 and got.has_sorted_indices
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.toarray(), a.toarray())
    s = function([x], S.ensure_sorted_indices(x))(a)
    assert s.nnz == 4 and s.has_sorted_indices     # zeros stay; only clean drops them
    assert str(S.EnsureSortedIndices(True)) == "EnsureSortedIndices{inplace}"
    assert S.EnsureSortedIndices(True).view_map == {0: [0]}
    verify_grad_sparse(S.clean, [rnd(3, 4, fmt)])


@pytest.mark.parametrize("stack,scipy_stack", [(S.hstack, sp.hstack), (S.vstack, sp.vstack)])
def test_hstack_and_vstack_match_scipy(stack, scipy_stack):
    a, b = rnd(3, 4), rnd(3, 4, "csc", seed=1)
    if stack is S.hstack:
        b = rnd(3, 2, "csc", seed=1)
    else:
        b = rnd(2, 4, "csc", seed=1)
    x, y = S.csr_dmatrix("x"), S.csc_fmatrix("y")
    out = stack([x, y])
    assert out.type.format == "csc" and out.dtype == "float64"    # Theano's defaults
    got = function([x, y], out)(a, b.astype("float32"))
    np.testing.assert_allclose(got.toarray(), scipy_stack([a, b]).toarray(), rtol=1e-6)
    got = function([x, y], stack([x, y], format="csr", dtype="float32"))(a, b.astype("float32"))
    assert got.format == "csr" and got.dtype == np.float32
    verify_grad_sparse(lambda p, q: stack([p, q], format="csr"), [a, b])
    with pytest.raises(ValueError, match="dtype must be specified"):
        S.HStack("csr")
    with pytest.raises(ValueError, match="differ"):
        function([x, y], stack([x, y]))(a, rnd(5, 5, seed=2).astype("float32"))


def test_hstack_gives_no_gradient_to_integer_blocks():
    x, i = S.csr_dmatrix("x"), S.csr_matrix("i", dtype="int64")
    cost = S.sp_sum(S.hstack([x, i]) * 2.0)
    g = symgpu.grad(cost, x)
    a = rnd(2, 3)
    np.testing.assert_allclose(function([x, i], S.dense_from_sparse(g))(
        a, sp.csr_matrix(np.ones((2, 2), dtype="int64"))), 2 * np.ones((2, 3)))


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_col_scale_and_row_scale(fmt):
    a = rnd(4, 5, fmt)
    x, s = S.matrix(fmt, dtype="float64"), T.dvector("s")
    cs, rs = RNG.normal(size=5), RNG.normal(size=4)
    c = function([x, s], S.col_scale(x, s))(a, cs)
    r = function([x, s], S.row_scale(x, s))(a, rs)
    assert c.format == fmt and r.format == fmt
    np.testing.assert_allclose(c.toarray(), a.toarray() * cs[None, :])
    np.testing.assert_allclose(r.toarray(), a.toarray() * rs[:, None])
    verify_grad_sparse(lambda m, v: S.col_scale(m, v), [a, cs], structured=True)
    verify_grad_sparse(lambda m, v: S.row_scale(m, v), [a, rs], structured=True)
    with pytest.raises(ValueError, match="needs 5 values"):
        function([x, s], S.col_scale(x, s))(a, cs[:3])
    with pytest.raises(ValueError, match="csc"):
        S.ColScaleCSC()(S.csr_dmatrix(), s)


# ============================================================================ theano.sparse.sandbox.sp

def _ref_conv(img, kern, nf, h, w, kh, kw, dy, dx, mode):
    """Correlation of each image with each kernel, strides (dy, dx), 'full' zero-padded."""
    im = img.reshape(img.shape[0], nf, h, w)
    if mode == "full":
        im = np.pad(im, ((0, 0), (0, 0), (kh - 1, kh - 1), (kw - 1, kw - 1)))
    oh, ow = -(-(im.shape[2] - kh + 1) // dy), -(-(im.shape[3] - kw + 1) // dx)
    k = kern.reshape(-1, nf, kh, kw)
    out = np.zeros((img.shape[0], k.shape[0], oh, ow))
    for y in range(oh):
        for x in range(ow):
            patch = im[:, :, y * dy:y * dy + kh, x * dx:x * dx + kw]
            out[:, :, y, x] = np.einsum("bfij,nfij->bn", patch, k)
    return out, (oh, ow)


@pytest.mark.parametrize("nf,h,w,kh,kw,dx,dy,mode", [
    (1, 5, 6, 2, 3, 1, 1, "valid"), (2, 5, 6, 3, 2, 2, 1, "valid"),
    (2, 4, 5, 2, 3, 1, 2, "full"), (1, 4, 4, 3, 3, 1, 1, "full")])
def test_convolve_is_a_correlation_by_sparse_product(nf, h, w, kh, kw, dx, dy, mode):
    from symgpu.sparse.convolution import convolve
    img, kern = RNG.normal(size=(3, nf * h * w)), RNG.normal(size=(4, nf * kh * kw))
    bias = RNG.normal(size=4)
    x, k, b = T.dmatrix(), T.dmatrix(), T.dvector()
    imgshp = (h, w) if nf == 1 else (nf, h, w)
    out, shp = convolve(k, (kh, kw), 4, x, imgshp, step=(dx, dy), bias=b, mode=mode)
    want, oshp = _ref_conv(img, kern, nf, h, w, kh, kw, dy, dx, mode)
    want = want + bias[None, :, None, None]
    np.testing.assert_allclose(function([x, k, b], out)(img, kern, bias),
                               want.reshape(3, -1))
    assert list(shp) == [4, *oshp]
    out3, _ = convolve(k, (kh, kw), 4, x, imgshp, step=(dx, dy), mode=mode, flatten=False)
    assert out3.ndim == 3
    g = function([x, k], symgpu.grad((out3 ** 2).sum(), k))(img, kern)
    patches = _ref_patches(img, nf, h, w, kh, kw, dy, dx, mode)      # (b, p, f*k)
    o = np.einsum("bpf,nf->bnp", patches, kern)
    np.testing.assert_allclose(g, np.einsum("bnp,bpf->nf", 2 * o, patches), rtol=1e-9)


def _ref_patches(img, nf, h, w, kh, kw, dy, dx, mode):
    im = img.reshape(img.shape[0], nf, h, w)
    if mode == "full":
        im = np.pad(im, ((0, 0), (0, 0), (kh - 1, kh - 1), (kw - 1, kw - 1)))
    oh, ow = -(-(im.shape[2] - kh + 1) // dy), -(-(im.shape[3] - kw + 1) // dx)
    return np.stack([im[:, :, y * dy:y * dy + kh, x * dx:x * dx + kw].reshape(img.shape[0], -1)
                     for y in range(oh) for x in range(ow)], axis=1)


def test_convolution_indices_op_and_its_shape():
    from symgpu.sparse.convolution import ConvolutionIndices, convolution_indices
    from symgpu.tensor.rewriting.shape_feature import node_shapes
    iv, kv = T.lvector(), T.lvector()
    for op, inshp, kshp in ((convolution_indices, (2, 5, 6), (3, 2)),
                            (ConvolutionIndices((2, 1), "full"), (4, 5), (2, 3))):
        outs = op(iv, kv)
        vals = function([iv, kv], outs)(np.array(inshp), np.array(kshp))
        ind, ptr, shape, fmt, outshp = ConvolutionIndices.evaluate(inshp, kshp, op.strides,
                                                                   mode=op.mode)
        np.testing.assert_array_equal(vals[0], ind)
        np.testing.assert_array_equal(vals[1], ptr)
        assert tuple(vals[2]) == shape and fmt == "csc"
        m = sp.csc_matrix((np.ones(ind.size), ind, ptr), shape=shape)
        assert m.max() == 1 and m.sum(axis=1).max() == 1   # each row reads one pixel at most
        f = function([iv, kv], [d for s in node_shapes(outs[0].owner) for d in s])
        assert [int(v) for v in f(np.array(inshp), np.array(kshp))] == \
            [ind.size, ptr.size, 2]
    with pytest.raises(ValueError, match="ws is obsolete"):
        ConvolutionIndices.evaluate((4, 4), (2, 2), ws=False)
    with pytest.raises(ValueError, match="invalid kernel"):
        ConvolutionIndices.conv_eval((2, 2), (3, 3))


def test_max_pool_takes_the_max_of_each_window():
    from symgpu.sparse.convolution import max_pool
    img = RNG.normal(size=(2, 2 * 5 * 7))
    x = T.dmatrix()
    out, shp = max_pool(x, (2, 5, 7), (2, 3))
    want = img.reshape(2, 2, 5, 7)[:, :, :4, :6].reshape(2, 2, 2, 2, 2, 3).max(axis=(3, 5))
    np.testing.assert_allclose(function([x], out)(img), want.reshape(2, -1))
    assert tuple(shp) == (2, 2)
    out1, _ = max_pool(x, (4, 4), (2, 2))
    one = RNG.normal(size=(3, 16))
    np.testing.assert_allclose(function([x], out1)(one),
                               one.reshape(3, 2, 2, 2, 2).max(axis=(2, 4)).reshape(3, -1))


# ============================================================================ theano.sparse.sandbox.sp2

def test_poisson_draws_numpys_numbers_at_the_stored_values():
    from symgpu.sparse.sampling import poisson
    a = rnd(4, 5) * 4
    x = S.csr_dmatrix()
    f = function([x], poisson(x))
    np.random.seed(1)
    got = f(a)
    np.random.seed(1)
    want = sp.csr_matrix((np.random.poisson(a.data).astype("float64"), a.indices, a.indptr),
                         shape=a.shape)
    want.eliminate_zeros()
    assert got.format == "csr" and got.dtype == np.float64
    np.testing.assert_array_equal(got.toarray(), want.toarray())
    assert got.nnz == want.nnz      # stored zeros removed
    assert symgpu.grad(S.sp_sum(poisson(x)), x, disconnected_inputs="ignore") is not None


def test_binomial_of_a_shape():
    from symgpu.sparse.sampling import Binomial, csc_fbinomial, csr_dbinomial
    n, p, shape = T.lscalar(), T.dscalar(), T.lvector()
    for op, fmt, dtype in ((csc_fbinomial, "csc", "float32"), (csr_dbinomial, "csr", "float64")):
        f = function([n, p, shape], op(n, p, shape))
        np.random.seed(2)
        got = f(5, 0.3, [3, 4])
        np.random.seed(2)
        assert got.format == fmt and got.dtype == dtype
        np.testing.assert_array_equal(got.toarray(), np.random.binomial(5, 0.3, size=(3, 4)))
    with pytest.raises(TypeError, match="p float"):
        Binomial("csr", "float64")(n, n, shape)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_multinomial_per_row(fmt):
    from symgpu.sparse.sampling import multinomial
    q = sp.csr_matrix(np.array([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]))
    pv, nv = S.matrix(fmt, dtype="float64"), T.lvector()
    f = function([nv, pv], multinomial(nv, pv))
    np.random.seed(3)
    got = f(np.array([10, 20, 7]), q.asformat(fmt))
    np.random.seed(3)
    want = np.zeros((3, 3))
    for i, (cols, n) in enumerate((([0, 1], 10), ([1, 2], 20), ([0], 7))):
        want[i, cols] = np.random.multinomial(n, q.toarray()[i, cols])
    assert got.format == fmt
    np.testing.assert_array_equal(got.toarray(), want)
    assert (got.toarray().sum(axis=1) == [10, 20, 7]).all()
    ns = T.lscalar()
    g = function([ns, pv], multinomial(ns, pv))(4, q.asformat(fmt))
    assert (g.toarray().sum(axis=1) == 4).all()
    with pytest.raises(ValueError, match="2 values for the 3 rows"):
        f(np.array([1, 2]), q.asformat(fmt))


# ============================================================================ theano.sandbox.linalg.ops

def test_hints_feature_keeps_hints_after_the_hint_nodes_go():
    from symgpu.graph.fg import FunctionGraph
    from symgpu.sandbox.linalg import ops
    x = T.dmatrix("x")
    f = function([x], ops.psd(x) * 2)
    fg = f.maker.fgraph
    assert not any(isinstance(n.op, ops.Hint) for n in fg.toposort())
    feature = fg.hints_feature
    assert isinstance(feature, ops.HintsFeature)
    assert ops.is_psd(fg.inputs[0], fg) and ops.is_symmetric(fg.inputs[0], fg)
    assert not ops.is_psd(fg.inputs[0])             # without the graph: no Hint above it
    # the optimizer attaches the feature (once), and hints follow a replaced variable
    y = T.dmatrix("y")
    g = FunctionGraph([y], [T.exp(y)])
    opt = ops.HintsOptimizer()
    opt.apply(g)                                    # no Hint node: left alone
    assert getattr(g, "hints_feature", None) is None
    opt.add_requirements(g)
    opt.add_requirements(g)
    feat = g.hints_feature
    feat.add_hint(g.inputs[0], "psd", True)
    old = g.outputs[0]
    feat.add_hint(old, "banded", 2)
    new = T.exp(g.inputs[0]) * 1.0
    g.replace(old, new, reason="test")
    assert g.outputs[0] is new and ops.hints(new, g) == {"banded": 2}   # handed over
    assert ops.hints(g.inputs[0], g) == {"psd": True}
    with pytest.raises(ValueError, match="already has"):
        g.attach_feature(ops.HintsFeature())
    assert "HintsOpt" in repr(opt)


# ============================================================================ slinalg.CholeskyGrad, d3viz

@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_grad_is_smiths_reverse_mode(lower):
    from symgpu.tensor.slinalg import Cholesky, CholeskyGrad
    n = 4
    a = RNG.normal(size=(n, n))
    A, dz = a @ a.T + n * np.eye(n), RNG.normal(size=(n, n))
    tri = np.tril if lower else np.triu
    x, d = T.dmatrix("x"), T.dmatrix("d")
    L = Cholesky(lower)(x)
    F = function([x, d], CholeskyGrad(lower)(x, L, d))(A, dz)

    def cost(t):   # the factor of the symmetric matrix read from t's triangle
        c = np.linalg.cholesky(tri(t) + tri(t, -1 if lower else 1).T)
        return (dz * (c if lower else c.T)).sum()
    want, eps = np.zeros((n, n)), 1e-6
    for i, j in zip(*np.nonzero(tri(np.ones((n, n))))):
        e = np.zeros((n, n))
        e[i, j] = eps
        want[i, j] = (cost(A + e) - cost(A - e)) / (2 * eps)
    np.testing.assert_allclose(F, want, atol=1e-7)
    stack = function([x, d], CholeskyGrad(lower)(x, L, d))   # 2-d here; stacks below
    assert stack(A, dz).shape == (n, n)
    x3, l3, d3 = T.dtensor3(), T.dtensor3(), T.dtensor3()
    lv = np.linalg.cholesky(A) if lower else np.linalg.cholesky(A).T
    got = function([x3, l3, d3], CholeskyGrad(lower)(x3, l3, d3))(
        np.stack([A, A]), np.stack([lv, lv]), np.stack([dz, 2 * dz]))
    np.testing.assert_allclose(got, np.stack([want, 2 * want]), atol=1e-7)
    with pytest.raises(ValueError, match="lower"):
        CholeskyGrad(not lower)(x, L, d)


def test_replace_patterns():
    from symgpu.d3viz.d3viz import replace_patterns
    assert replace_patterns("a<b>&c", {"<": "&lt;", ">": "&gt;"}) == "a&lt;b&gt;&c"
    assert replace_patterns("x1 x2", {1: 2, "x2": "y"}) == "y y"     # in order, as str


# ============================================================================ theano.gpuarray.linalg

def _fake(gop, arrays):
    from test_gpu_linalg import run_fake
    return run_fake(gop, arrays)[0]


@pytest.mark.parametrize("trans", ["N", "T"])
@pytest.mark.parametrize("bshape", [(4,), (4, 3)])
def test_cusolver_and_cublas_solves_with_theanos_trans(trans, bshape):
    from symgpu.gpu.ops import theano_linalg as TL
    a, b = RNG.normal(size=(4, 4)) + 4 * np.eye(4), RNG.normal(size=bshape)
    op_a = a if trans == "N" else a.T
    for structure in ("general", "symmetric", "positive_definite"):
        m = a if structure == "general" else a @ a.T
        (x,) = _fake(TL.GpuCusolverSolve(structure, trans), [m, b])
        np.testing.assert_allclose((m if trans == "N" or structure != "general" else m.T) @ x,
                                   b, atol=1e-10)
    (x,) = _fake(TL.GpuCusolverSolve("general", trans), [a, b])
    np.testing.assert_allclose(op_a @ x, b, atol=1e-10)
    for lower in (True, False):
        tri = np.tril(a) if lower else np.triu(a)
        noise = np.triu(RNG.normal(size=(4, 4)), 1) if lower else np.tril(RNG.normal(size=(4, 4)), -1)
        (x,) = _fake(TL.GpuCublasTriangularSolve(lower, trans), [tri + noise, b])
        np.testing.assert_allclose((tri if trans == "N" else tri.T) @ x, b, atol=1e-10)
    with pytest.raises(ValueError, match="trans"):
        TL.GpuCusolverSolve(trans="X")


def test_magma_ops_give_theanos_outputs_in_theanos_order():
    from symgpu.gpu.ops import theano_linalg as TL
    m = RNG.normal(size=(5, 3))
    for full in (True, False):
        s, u, vt = _fake(TL.GpuMagmaSVD(full, True), [m])
        k = 3
        np.testing.assert_allclose((u[:, :k] * s) @ vt[:k], m, atol=1e-10)
        assert u.shape == ((5, 5) if full else (5, 3))
    (s,) = _fake(TL.GpuMagmaSVD(True, False), [m])
    np.testing.assert_allclose(s, np.linalg.svd(m, compute_uv=False))
    r, q = _fake(TL.GpuMagmaQR(True), [m])
    qn, rn = np.linalg.qr(m)
    np.testing.assert_allclose(q @ r, m, atol=1e-10)
    np.testing.assert_allclose(np.abs(r), np.abs(rn), atol=1e-10)
    (r,) = _fake(TL.GpuMagmaQR(False), [m])
    assert r.shape == (3, 3)
    a = RNG.normal(size=(4, 4))
    spd = a @ a.T + 4 * np.eye(4)
    for uplo in "LU":
        w, v = _fake(TL.GpuMagmaEigh(uplo, True), [spd])
        np.testing.assert_allclose(w, np.linalg.eigvalsh(spd))
        np.testing.assert_allclose(spd @ v, v * w, atol=1e-10)
        (w,) = _fake(TL.GpuMagmaEigh(uplo, False), [spd])
        np.testing.assert_allclose(w, np.linalg.eigvalsh(spd))
    (inv,) = _fake(TL.GpuMagmaMatrixInverse(), [spd])
    np.testing.assert_allclose(inv @ spd, np.eye(4), atol=1e-10)
    for lower in (True, False):
        (c,) = _fake(TL.GpuMagmaCholesky(lower=lower), [spd])
        np.testing.assert_allclose(c @ c.T if lower else c.T @ c, spd, atol=1e-10)
    assert isinstance(TL.GpuMagmaSVD(), TL.GpuMagmaBase)


def test_gpu_linalg_functions_build_gpu_graphs(vgpu):
    from symgpu.gpu.ops import linalg as GL
    from symgpu.gpu.ops import theano_linalg as TL
    from symgpu.gpu.placement.type import GpuArrayType
    x = T.fmatrix("x")
    u, s, vt = TL.gpu_svd(x)
    assert (u.ndim, s.ndim, vt.ndim) == (2, 1, 2)
    assert isinstance(s.owner.op, TL.GpuMagmaSVD) and s is s.owner.outputs[0]
    assert TL.gpu_svd(x, compute_uv=0).ndim == 1
    q, r = TL.gpu_qr(x)
    assert q is q.owner.outputs[1] and isinstance(q.owner.op, TL.GpuMagmaQR)
    assert TL.gpu_qr(x, complete=False).ndim == 2
    inv = TL.gpu_matrix_inverse(x)
    assert isinstance(inv.owner.op, GL.GpuMatrixInverse)
    assert all(isinstance(v.type, GpuArrayType) for v in (u, s, vt, q, r, inv))
    ch = TL.gpu_cholesky(x, lower=False)
    assert isinstance(ch.owner.op, GL.GpuCholesky) and not ch.owner.op.lower
    assert GL.GpuCholesky(lower=True, inplace=True) == GL.GpuCholesky()   # Theano's keyword
    b = T.fvector("b")
    sol = TL.gpu_solve(x, b, trans="T")
    assert isinstance(sol.owner.op, TL.GpuCusolverSolve) and sol.owner.op.transposed
    assert TL.gpu_solve_lower_triangular(x, b).owner.op.lower
    assert not TL.gpu_solve_upper_triangular(x, b).owner.op.lower
    f = function([x, b], [TL.gpu_svd(x)[1], sol, TL.gpu_qr(x)[0]])
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert {"GpuMagmaSVD", "GpuCusolverSolve", "GpuMagmaQR"} <= names
    # Theano's path, and GpuCholesky is the op the lifter makes
    import symgpu.gpuarray.linalg as TGL
    assert TGL.GpuCholesky is GL.GpuCholesky and TGL.gpu_svd is TL.gpu_svd
    assert TGL.GpuMagmaBase is GL._GpuLinalg


@pytest.mark.gpu
def test_gpu_linalg_functions_on_the_gpu(cuda):
    from symgpu.gpu.ops import theano_linalg as TL
    from symgpu.gpu.runtime.array import GpuArray
    a = RNG.normal(size=(6, 4)).astype("float32")
    x, b = T.fmatrix("x"), T.fmatrix("b")
    sq = (a.T @ a + 4 * np.eye(4)).astype("float32")
    outs = [*TL.gpu_svd(x, 0), *TL.gpu_qr(x), TL.gpu_matrix_inverse(b),
            TL.gpu_solve(b, x[:4, :2], trans="T"), TL.GpuMagmaEigh()(b)[0],
            TL.GpuMagmaCholesky()(b)]
    f = function([x, b], [symgpu.Out(o, borrow=True) for o in outs])
    got = f(a, sq)
    assert all(isinstance(g, GpuArray) for g in got)   # computed on the device
    u, s, vt, q, r, inv, sol, w, c = (np.asarray(g) for g in got)
    np.testing.assert_allclose((u * s) @ vt, a, atol=1e-4)
    np.testing.assert_allclose(q @ r, a, atol=1e-4)
    np.testing.assert_allclose(inv @ sq, np.eye(4), atol=1e-4)
    np.testing.assert_allclose(sq.T @ sol, a[:4, :2], atol=1e-4)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(sq), rtol=1e-4)
    np.testing.assert_allclose(c @ c.T, sq, rtol=1e-4, atol=1e-4)


def test_functions_of_the_new_sparse_ops_pickle():
    from symgpu.sparse.convolution import convolve
    from symgpu.sparse.sampling import Binomial
    x, y, s, k = S.csr_dmatrix("x"), S.csc_dmatrix("y"), T.dvector("s"), T.dmatrix("k")
    img = T.dmatrix("img")
    conv, _ = convolve(k, (2, 2), 2, img, (3, 3))
    outs = [S.hstack([x, y]), S.vstack([x, x]), S.col_scale(y, s), S.row_scale(x, s[:3]),
            S.clean(x), conv, Binomial("csr", "float64")(2, 0.0, [2, 2])]
    f = function([x, y, s, k, img], outs)
    g = pickle.loads(pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL))
    vals = [rnd(3, 4), rnd(3, 4, "csc", seed=1), RNG.normal(size=4), RNG.normal(size=(2, 4)),
            RNG.normal(size=(2, 9))]
    for got, want in zip(g(*vals), f(*vals)):
        got, want = (v.toarray() if sp.issparse(v) else v for v in (got, want))
        np.testing.assert_array_equal(got, want)
