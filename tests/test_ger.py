"""Ger (A + alpha * outer(x, y), BLAS ger) on the CPU and GpuGer (cuBLAS ger) on the GPU: the
ops against NumPy on every layout, the gradient, the rewrite from `A + alpha * outer(x, y)`
and from shared-variable updates, placement on a virtual context (CPU), and GPU values
against the CPU op (``pytest -m gpu``, skipped without a GPU)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import config, function
from symgpu.compile.mode import Mode
from symgpu.gradient_check import verify_grad
from symgpu.tensor.blas import Dot22, Gemm, Ger, _blas, ger_value
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, rewritten, same_values  # noqa: F401

rng = np.random.RandomState(11)
DTYPES = ["float32", "float64"]
TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12)}
NO_FUSION = Mode("FAST_RUN").excluding_tags("fusion")


def _data(dtype, m=5, n=4):
    return (rng.randn(m, n).astype(dtype), rng.randn(m).astype(dtype),
            rng.randn(n).astype(dtype))


def _arrange(a, layout):
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "strided":
        big = np.zeros((a.shape[0] * 2, a.shape[1] * 3), dtype=a.dtype)
        big[::2, ::3] = a
        return big[::2, ::3]
    return a.copy()


def ger_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Ger)]


# ============================================================================ the CPU op
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ger_value_against_numpy(dtype, layout, inplace):
    a, x, y = _data(dtype)
    want = a + np.asarray(0.75, dtype) * np.outer(x, y)
    arg = _arrange(a, layout)
    before = arg.copy()
    got = ger_value(_blas("ger", dtype), arg, 0.75, x, y, inplace, dtype)
    assert got.dtype == np.dtype(dtype) and got.shape == (5, 4)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    if inplace and layout != "strided":
        assert np.shares_memory(got, arg)              # written into A itself
        np.testing.assert_allclose(arg, want, **TOL[dtype])
    else:
        assert not np.shares_memory(got, arg)          # A is left as it was
        np.testing.assert_array_equal(arg, before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ger_value_broadcast_a_strided_vectors_and_empty(dtype):
    fn = _blas("ger", dtype)
    a, x, y = _data(dtype)
    np.testing.assert_allclose(ger_value(fn, a[:1], -2.0, x, y, False, dtype),
                               a[:1] - 2.0 * np.outer(x, y), **TOL[dtype])
    np.testing.assert_allclose(ger_value(fn, a[:1, :1], 1.0, x, y, False, dtype),
                               a[0, 0] + np.outer(x, y), **TOL[dtype])
    xs, ys = np.repeat(x, 2)[::2], y[::-1]
    np.testing.assert_allclose(ger_value(fn, a, 0.5, xs, ys, False, dtype),
                               a + 0.5 * np.outer(x, y[::-1]), **TOL[dtype])
    assert ger_value(fn, a[:0], 1.0, x[:0], y, False, dtype).shape == (0, 4)
    np.testing.assert_array_equal(ger_value(fn, a[:, :0], 1.0, x, y[:0], True, dtype),
                                  np.zeros((5, 0), dtype))


def test_ger_value_errors_name_the_shapes():
    fn = _blas("ger", "float64")
    a, x, y = _data("float64")
    with pytest.raises(ValueError, match=r"Ger: A of shape \(5, 4\) .* x \(5,\) and y \(3,\)"):
        ger_value(fn, a, 1.0, x, y[:3], False, "float64")
    with pytest.raises(ValueError, match=r"shape \(4, 4\)"):
        ger_value(fn, a, 1.0, x[:4], y, True, "float64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_ger_node_through_function(dtype):
    A, x, y = T.matrix("A", dtype=dtype), T.vector("x", dtype=dtype), T.vector("y", dtype=dtype)
    alpha = T.scalar("alpha", dtype=dtype)
    av, xv, yv = _data(dtype)
    f = function([A, alpha, x, y], Ger(False)(A, alpha, x, y))        # alpha read each call
    np.testing.assert_allclose(f(av, 1.5, xv, yv), av + 1.5 * np.outer(xv, yv), **TOL[dtype])
    np.testing.assert_allclose(f(np.asfortranarray(av), -1.0, xv, yv), av - np.outer(xv, yv),
                               **TOL[dtype])
    g = function([A, x, y], Ger(False)(A, 0.25, x, y))                 # constant alpha
    assert ger_nodes(g)[0].inputs[1].dtype == dtype
    np.testing.assert_allclose(g(av, xv, yv), av + 0.25 * np.outer(xv, yv), **TOL[dtype])
    with pytest.raises(ValueError, match=r"Ger: A of shape \(5, 4\)"):
        g(av, xv[:2], yv)


def test_ger_make_node_checks_types():
    A, x, y = T.dmatrix("A"), T.dvector("x"), T.dvector("y")
    out = Ger(False)(A, 1.0, x, y)
    assert out.type == A.type and str(out.owner.op) == "Ger{no_inplace}"
    assert Ger(True)(A, 1.0, x, y).owner.op.destroy_map == {0: [0]}
    assert str(Ger(True)) == "Ger{inplace}"
    with pytest.raises(TypeError, match="float32"):
        Ger(False)(A, 1.0, T.fvector("xf"), y)
    with pytest.raises(TypeError, match="dimensions"):
        Ger(False)(A, 1.0, A, y)
    with pytest.raises(TypeError, match="float32 or float64"):
        Ger(False)(T.lmatrix("l"), 1, T.lvector("lx"), T.lvector("ly"))
    row = T.drow("row")
    assert Ger(False)(row, 1.0, x, y).broadcastable == (False, False)
    with pytest.raises(TypeError, match="in place"):
        Ger(True)(row, 1.0, x, y)


# ============================================================================ gradient
@pytest.mark.parametrize("dtype", DTYPES)
def test_ger_verify_grad(dtype):
    av, xv, yv = _data(dtype, 3, 4)
    verify_grad(lambda A, alpha, x, y: Ger(False)(A, alpha, x, y),
                [av, np.asarray(0.7, dtype), xv, yv], rng=3)


def test_ger_grad_of_a_broadcast_a():
    row, x, y = T.drow("row"), T.dvector("x"), T.dvector("y")
    g = T.grad(Ger(False)(row, 2.0, x, y).sum(), row)
    assert g.broadcastable == row.broadcastable
    got = function([row, x, y], g)(np.ones((1, 4)), np.ones(3), np.ones(4))
    np.testing.assert_array_equal(got, np.full((1, 4), 3.0))


# ============================================================================ the rewrite
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plus_alpha_outer_is_one_ger(dtype):
    A, x, y = T.matrix("A", dtype=dtype), T.vector("x", dtype=dtype), T.vector("y", dtype=dtype)
    lr = T.scalar("lr", dtype=dtype)
    av, xv, yv = _data(dtype)
    tol = TOL[dtype] if dtype == "float64" else dict(rtol=1e-5, atol=1e-5)
    for out, n_ops in [(A + lr * T.outer(x, y), 1), (A + T.outer(x, y), 1),
                       (T.outer(x, y) * 0.5 + A, 1), (A - lr * T.outer(x, y), 2)]:
        f = rewritten([A, x, y, lr], out)
        names = op_names(f)
        assert "Ger" in names and not {"Gemm", "Dot22", "Dot", "DimShuffle"} & set(names), names
        assert len(names) == n_ops, names      # (the minus: one mul for -lr)
        (node,) = ger_nodes(f)
        assert node.inputs[0] is f.maker.fgraph.inputs[0]
        assert node.inputs[2] is f.maker.fgraph.inputs[1]      # x and y themselves
        assert node.inputs[3] is f.maker.fgraph.inputs[2]
        same_values([A, x, y, lr], out, av, xv, yv, np.asarray(0.3, dtype), **tol)


def test_a_minus_alpha_outer_scales_alpha():
    A, x, y = T.dmatrix("A"), T.dvector("x"), T.dvector("y")
    f = rewritten([A, x, y], A - 0.01 * T.outer(x, y))
    (node,) = ger_nodes(f)
    assert op_names(f) == ["Ger"] and np.isclose(float(node.inputs[1].data), -0.01)
    av, xv, yv = _data("float64")
    same_values([A, x, y], A - 0.01 * T.outer(x, y), av, xv, yv)


def test_broadcast_a_and_non_rank1_stay_correct():
    row, A, B = T.drow("row"), T.dmatrix("A"), T.dmatrix("B")
    x, y = T.dvector("x"), T.dvector("y")
    av, xv, yv = _data("float64")
    f = rewritten([row, x, y], row + T.outer(x, y))
    assert "Ger" in op_names(f)
    same_values([row, x, y], row + T.outer(x, y), av[:1], xv, yv)
    col, r = T.dcol("col"), T.drow("r")              # any (m, 1) @ (1, n) product
    f = rewritten([A, col, r], A + 3.0 * T.dot(col, r))
    assert "Ger" in op_names(f) and "Gemm" not in op_names(f)
    same_values([A, col, r], A + 3.0 * T.dot(col, r), av, xv[:, None], yv[None, :])
    # beta != 1 and true matrix products stay Gemm
    f = rewritten([A, x, y], 0.9 * A + T.outer(x, y))
    assert "Gemm" in op_names(f) and "Ger" not in op_names(f)
    same_values([A, x, y], 0.9 * A + T.outer(x, y), av, xv, yv)
    f = rewritten([A, B], A + T.dot(A, B.T))
    assert "Gemm" in op_names(f) and "Ger" not in op_names(f)
    # a plain outer product keeps its Dot22 (nothing to update)
    assert "Ger" not in op_names(rewritten([x, y], T.outer(x, y)))
    # integers have no BLAS
    lx, lm = T.lvector("lx"), T.lmatrix("lm")
    assert "Ger" not in op_names(rewritten([lm, lx], lm + T.outer(lx, lx)))


def test_ger_inplace_on_an_intermediate_only():
    A, x, y = T.dmatrix("A"), T.dvector("x"), T.dvector("y")
    out = T.exp(A) + 2.0 * T.outer(x, y)   # exp(A) is an intermediate: may be overwritten
    f = function([A, x, y], out, mode=NO_FUSION)
    (node,) = ger_nodes(f)
    assert node.op.inplace and node.op.destroy_map == {0: [0]}
    av, xv, yv = _data("float64")
    np.testing.assert_allclose(f(av, xv, yv), np.exp(av) + 2.0 * np.outer(xv, yv))
    g = function([A, x, y], A + 2.0 * T.outer(x, y))   # A is the caller's: never overwritten
    (node,) = ger_nodes(g)
    assert not node.op.inplace
    before = av.copy()
    g(av, xv, yv)
    np.testing.assert_array_equal(av, before)
    h = function([A, x, y], out, mode=NO_FUSION.excluding_tags("inplace"))
    assert not ger_nodes(h)[0].op.inplace


@pytest.mark.parametrize("dtype", DTYPES)
def test_shared_update_is_one_ger_node(dtype):
    w0 = rng.randn(6, 3).astype(dtype)
    W = symgpu.shared(w0.copy(), name="W")
    x, y = T.vector("x", dtype=dtype), T.vector("y", dtype=dtype)
    lr = T.scalar("lr", dtype=dtype)
    f = function([x, y, lr], [], updates={W: W + lr * T.outer(x, y)})
    topo = f.maker.fgraph.toposort()
    assert len(topo) == 1 and isinstance(topo[0].op, Ger), [str(n) for n in topo]
    node = topo[0]
    assert node.inputs[0].name == "W" and node.inputs[0] in f.maker.fgraph.inputs
    # the destroy handler never lets an op overwrite a shared variable (a call that raises
    # must leave it as it was): the update's Ger copies W, like Gemv does for `w - lr*g`
    assert not node.op.inplace
    xv, yv = rng.randn(6).astype(dtype), rng.randn(3).astype(dtype)
    want = w0.copy()
    for step in (0.5, -0.25, 1.0):
        f(xv, yv, step)
        want = want + np.asarray(step, dtype) * np.outer(xv, yv)
    np.testing.assert_allclose(W.get_value(), want, **TOL[dtype])
    with pytest.raises(ValueError, match="Ger"):
        f(xv[:2], yv, 1.0)
    np.testing.assert_allclose(W.get_value(), want, **TOL[dtype])   # untouched by the failure


# ============================================================================ placement (no GPU)
def _gpu_names(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ger_lifts_to_gpu_ger_on_a_virtual_context(dtype):
    from symgpu.gpu.ops.blas import GpuGer
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        A, x, y = (T.matrix("A", dtype=dtype), T.vector("x", dtype=dtype),
                   T.vector("y", dtype=dtype))
        lr = T.scalar("lr", dtype=dtype)
        f = function([A, x, y, lr], A - lr * T.outer(x, y))
        names = _gpu_names(f)
        assert "GpuGer" in names and not {"Ger", "Gemm", "GpuGemm", "Dot22"} & set(names), names
        (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuGer)]
        # A is an upload (an intermediate): the in-place pass lets GpuGer write into it
        assert node.op.inplace
        g = function([A, x, y], T.exp(A) + T.outer(x, y), mode=NO_FUSION)
        (node,) = [n for n in g.maker.fgraph.toposort() if isinstance(n.op, GpuGer)]
        assert node.op.inplace and type(node.inputs[0].owner.op).__name__ == "GpuElemwise"
        h = function([A, x, y], T.exp(A) + T.outer(x, y), mode=NO_FUSION.excluding_tags("inplace"))
        assert not [n for n in h.maker.fgraph.toposort() if isinstance(n.op, GpuGer)][0].op.inplace


def test_gpu_ger_make_node_checks_types():
    from symgpu.gpu.ops.blas import GpuGer
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import GpuArrayType
    with virtual_context("ger-virtual"):
        m = GpuArrayType("float32", (False, False), "ger-virtual")()
        v = GpuArrayType("float32", (False,), "ger-virtual")()
        row = GpuArrayType("float32", (True, False), "ger-virtual")()
        out = GpuGer(False)(m, 1.0, v, v)
        assert out.type == m.type and str(out.owner.op) == "GpuGer{no_inplace}"
        assert GpuGer(True)(m, 1.0, v, v).owner.op.destroy_map == {0: [0]}
        assert str(GpuGer(True)) == "GpuGer{inplace}"
        assert GpuGer(False)(row, 1.0, v, v).type == m.type
        with pytest.raises(TypeError, match="in place"):
            GpuGer(True)(row, 1.0, v, v)
        with pytest.raises(TypeError, match="float64"):
            GpuGer(False)(m, 1.0, v, GpuArrayType("float64", (False,), "ger-virtual")())
        with pytest.raises(TypeError, match="1-d"):
            GpuGer(False)(m, 1.0, m, v)


def _colmajor_ger(rows, cols, alpha, u, v, mem, ld):
    """What BLAS ger does to column-major memory: mem[i + j*ld] += alpha * u[i] * v[j]."""
    for j in range(cols):
        mem[j * ld:j * ld + rows] += alpha * u * v[j]


@pytest.mark.parametrize("layout", ["C", "F", "sliced", "row", "col"])
def test_gpu_ger_row_major_arguments_on_host_memory(layout):
    """GpuGer's call (``_colmajor`` layout, ``_ger_operands`` swap, ld) replayed with NumPy
    on views of one flat buffer: the GPU's row-major handling checked without a GPU."""
    from symgpu.gpu.ops.blas import _colmajor, _ger_operands
    m, n = {"row": (1, 6), "col": (5, 1)}.get(layout, (5, 6))
    mem = np.arange(400, dtype="float64")
    if layout == "F":
        a = mem[:m * n].reshape(n, m).T
    elif layout == "sliced":
        a = mem[:m * 9].reshape(m, 9)[:, :n]
    elif layout == "col":
        a = mem[:m * 4].reshape(m, 4)[:, :1]
    else:
        a = mem[:m * n].reshape(m, n)
    x, y = rng.randn(m), rng.randn(n)
    want = a + 0.5 * np.outer(x, y)
    got = _colmajor(a)
    assert got is not None
    op_, ld = got
    rows, cols, u, v = _ger_operands(op_, m, n, x, y)
    assert ld >= max(rows, 1)                       # cuBLAS's requirement on lda
    _colmajor_ger(rows, cols, 0.5, u, v, mem, ld)
    np.testing.assert_allclose(a, want)


# ============================================================================ GPU
def _gpu_graph_run(out, inputs, values):
    """Link the GPU graph and run it once (values: GpuArrays for GPU inputs, NumPy for host
    ones); returns (result GpuArray, storage)."""
    from symgpu.gpu.runtime.array import GpuArray
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, [out], clone=False)
    storage = {v: [x] for v, x in zip(inputs, values)}
    link(fg, storage)()
    res = storage[out][0]
    assert isinstance(res, GpuArray), f"{res!r} did not come from the GPU"
    return res, storage


def _gpu_types(dtype, a_bcast=(False, False)):
    from symgpu.gpu.placement.type import GpuArrayType
    return (GpuArrayType(dtype, a_bcast, None)(), GpuArrayType(dtype, (False,), None)(),
            GpuArrayType(dtype, (False,), None)())


def _dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.ascontiguousarray(a), get_context(None))


@requires_gpu
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("layout", ["C", "F", "sliced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_ger_against_the_cpu_op(cuda, dtype, layout, inplace):
    from symgpu.gpu.ops.blas import GpuGer
    from symgpu.tensor.type import TensorType
    ha, hx, hy = _data(dtype, 37, 23)
    want = ger_value(_blas("ger", dtype), ha, 0.5, hx, hy, False, dtype)   # the CPU op
    if layout == "F":
        ga = _dev(ha.T).T                           # F-contiguous device matrix
    elif layout == "sliced":
        big = np.zeros((37, 50), dtype)
        big[:, :23] = ha
        ga = _dev(big)[:, :23]                      # row stride 50 (lda 50)
    else:
        ga = _dev(ha)
    A, x, y = _gpu_types(dtype)
    alpha = TensorType(dtype, ())()
    out = GpuGer(inplace)(A, alpha, x, y)
    res, storage = _gpu_graph_run(out, [A, alpha, x, y],
                                  [ga, np.asarray(0.5, dtype), _dev(hx), _dev(hy)])
    np.testing.assert_allclose(np.asarray(res), want, **TOL[dtype])
    assert (res is ga) == inplace                  # every layout here is cuBLAS-readable
    if not inplace:
        np.testing.assert_array_equal(np.asarray(ga), ha)   # A untouched


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_ger_device_alpha_broadcast_a_strided_vectors_and_empty(cuda, dtype):
    from symgpu.gpu.ops.blas import GpuGer
    from symgpu.gpu.placement.type import GpuArrayType
    fn = _blas("ger", dtype)
    ha, hx, hy = _data(dtype, 9, 7)
    A, x, y = _gpu_types(dtype)
    alpha_d = GpuArrayType(dtype, (), None)()
    res, _ = _gpu_graph_run(GpuGer(False)(A, alpha_d, x, y), [A, alpha_d, x, y],
                            [_dev(ha), _dev(np.asarray(-1.5, dtype)), _dev(hx), _dev(hy)])
    np.testing.assert_allclose(np.asarray(res), ger_value(fn, ha, -1.5, hx, hy, False, dtype),
                               **TOL[dtype])
    row, _, _ = _gpu_types(dtype, (True, False))
    res, _ = _gpu_graph_run(GpuGer(False)(row, 2.0, x, y), [row, x, y],
                            [_dev(ha[:1]), _dev(hx), _dev(hy)])
    np.testing.assert_allclose(np.asarray(res), ger_value(fn, ha[:1], 2.0, hx, hy, False, dtype),
                               **TOL[dtype])
    gx = _dev(np.repeat(hx, 3))[::3]                # incx = 3
    gy = _dev(np.repeat(hy, 2))[::2]                # incy = 2
    res, _ = _gpu_graph_run(GpuGer(True)(A, 1.0, x, y), [A, x, y], [_dev(ha), gx, gy])
    np.testing.assert_allclose(np.asarray(res), ger_value(fn, ha, 1.0, hx, hy, False, dtype),
                               **TOL[dtype])
    res, _ = _gpu_graph_run(GpuGer(False)(A, 1.0, x, y), [A, x, y],
                            [_dev(ha[:0]), _dev(hx[:0]), _dev(hy)])
    assert res.shape == (0, 7)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_ger_through_function_matches_cpu(cuda, dtype):
    A, x, y = T.matrix("A", dtype=dtype), T.vector("x", dtype=dtype), T.vector("y", dtype=dtype)
    lr = T.scalar("lr", dtype=dtype)
    ha, hx, hy = _data(dtype, 40, 30)
    cpu_mode = Mode("FAST_RUN").excluding_tags("gpu")
    for out in (A - lr * T.outer(x, y), T.exp(A) + lr * T.outer(x, y)):
        f = function([A, x, y, lr], out.transfer(None), mode=NO_FUSION)
        names = _gpu_names(f)
        assert "GpuGer" in names and "Ger" not in names and "HostFromGpu" not in names, names
        c = function([A, x, y, lr], out, mode=cpu_mode)
        assert "Ger" in _gpu_names(c) and "GpuGer" not in _gpu_names(c)
        got = f(ha, hx, hy, np.asarray(0.3, dtype))
        assert type(got).__name__ == "GpuArray"
        np.testing.assert_allclose(np.asarray(got), c(ha, hx, hy, np.asarray(0.3, dtype)),
                                   **TOL[dtype])
    (node,) = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuGer"]
    assert node.op.inplace          # into exp(A), an intermediate


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_shared_update_is_one_gpu_ger(cuda, dtype):
    from symgpu.gpu.runtime.array import GpuArray
    w0 = rng.randn(64, 48).astype(dtype)
    W = symgpu.shared(w0.copy(), name="W", target=None)          # on the GPU
    assert isinstance(W.get_value(borrow=True, return_internal_type=True), GpuArray)
    x, y = T.vector("x", dtype=dtype), T.vector("y", dtype=dtype)
    lr = T.scalar("lr", dtype=dtype)
    f = function([x, y, lr], [], updates={W: W + lr * T.outer(x, y)})
    gers = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuGer"]
    names = _gpu_names(f)
    assert len(gers) == 1 and not {"Ger", "Gemm", "GpuGemm", "GpuDot22"} & set(names), names
    assert gers[0].inputs[0].name == "W"              # reads W itself on the device
    xv, yv = rng.randn(64).astype(dtype), rng.randn(48).astype(dtype)
    want = w0.copy()
    for step in (0.5, -0.25, 1.0):
        f(xv, yv, step)
        want = want + np.asarray(step, dtype) * np.outer(xv, yv)
    assert isinstance(W.get_value(borrow=True, return_internal_type=True), GpuArray)
    np.testing.assert_allclose(W.get_value(), want, **TOL[dtype])
    with pytest.raises(ValueError, match="GpuGer"):
        f(xv[:5], yv, 1.0)
    np.testing.assert_allclose(W.get_value(), want, **TOL[dtype])   # untouched by the failure
