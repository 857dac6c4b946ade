"""GPU sparse matrices (symgpu/gpu/placement/sparse_type.py, symgpu/gpu/ops/sparse.py,
cusparse_lib.py): on the CPU, the ops' own thunks against a fake cuSPARSE that records the
calls and computes with SciPy on host memory (descriptors, orders, transposes, algorithm
choice, workspaces, plan reuse), and placement on a virtual context; on a real GPU every
lifted product for csr/csc and float32/float64, a sparse logistic regression's gradients
against the CPU, and shared-variable round trips."""
from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
import scipy.sparse as ssp

import symgpu
import symgpu.sparse as sp
import symgpu.tensor as T
from emulated_gpu import EmulatedCtx, device_array, host_view
from gpu_helpers import on_the_cpu, requires_gpu
from symgpu import config, function
from symgpu.gpu.ops import cusparse_lib as lib_mod
from symgpu.gpu.ops import sparse as gsparse
from symgpu.gpu.ops.cusparse_lib import (NOT_SUPPORTED, OP_N, OP_T, ORDER_COL, ORDER_ROW,
                                         CusparseError)
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.sparse_type import (GpuSparseFromHost, GpuSparseMatrix,
                                              GpuSparseType, HostFromGpuSparse)
from symgpu.gpu.placement.type import GpuArrayType

RNG = np.random.default_rng(5)


def _rand_sparse(m, n, fmt, dtype, density=0.3):
    return ssp.random(m, n, density=density, format=fmt, dtype=dtype, random_state=7)


def _names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


# ============================================================================ fake cuSPARSE

def _host_array(ptr, count, dtype):
    dtype = np.dtype(dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype)


class FakeCusparse:
    """The Cusparse API over host memory: records every call, computes with SciPy."""

    def __init__(self, refuse=()):
        self.calls, self.descr, self.refuse, self.next = [], {}, set(refuse), 1

    def _new(self, what):
        self.next += 1
        self.descr[self.next] = what
        return self.next

    def handle(self, ctx):
        self.calls.append(("handle",))
        return 7

    def csr(self, rows, cols, nnz, indptr, indices, data, dtype):
        self.calls.append(("csr", rows, cols, nnz, dtype))
        return self._new({"kind": "csr", "rows": rows, "cols": cols, "nnz": nnz,
                          "indptr": indptr, "indices": indices, "data": data, "dtype": dtype})

    def dense(self, rows, cols, ld, ptr, dtype, order):
        self.calls.append(("dense", rows, cols, ld, dtype, order))
        return self._new({"kind": "dense", "rows": rows, "cols": cols, "ld": ld, "ptr": ptr,
                          "dtype": dtype, "order": order})

    def vector(self, size, ptr, dtype):
        self.calls.append(("vector", size, dtype))
        return self._new({"kind": "vector", "size": size, "ptr": ptr, "dtype": dtype})

    def set_vector_values(self, d, ptr):
        self.calls.append(("set_vector", d))
        self.descr[d]["ptr"] = ptr

    def destroy_vector(self, d):
        self.calls.append(("destroy_vector", d))

    def _vector(self, d):
        x = self.descr[d]
        return _host_array(x["ptr"], x["size"], x["dtype"])

    def set_dense_values(self, d, ptr):
        self.calls.append(("set_dense", d))
        self.descr[d]["ptr"] = ptr

    def set_sparse_values(self, d, ptr):
        self.calls.append(("set_sparse", d))
        self.descr[d]["data"] = ptr

    def destroy_sparse(self, d):
        self.calls.append(("destroy_sparse", d))

    def destroy_dense(self, d):
        self.calls.append(("destroy_dense", d))

    def buffer_size(self, what, h, op_a, op_b, a, b, c, dtype, alg):
        self.calls.append(("buffer_size", what, op_a, op_b, alg))
        if (what, alg) in self.refuse:
            raise CusparseError("refused", NOT_SUPPORTED)
        return 4096

    def preprocess(self, what, h, op_a, op_b, a, b, c, dtype, alg, buf):
        self.calls.append(("preprocess", what, alg, buf))

    def _dense(self, d):
        x = self.descr[d]
        n_major = x["rows"] if x["order"] == ORDER_ROW else x["cols"]
        flat = _host_array(x["ptr"], n_major * x["ld"], x["dtype"]).reshape(n_major, x["ld"])
        if x["order"] == ORDER_ROW:
            return flat[:, :x["cols"]]
        return flat[:, :x["rows"]].T

    def _csr(self, d):
        x = self.descr[d]
        return ssp.csr_matrix((_host_array(x["data"], x["nnz"], x["dtype"]),
                               _host_array(x["indices"], x["nnz"], "int32"),
                               _host_array(x["indptr"], x["rows"] + 1, "int32")),
                              shape=(x["rows"], x["cols"]))

    def run(self, what, h, op_a, op_b, a, b, c, dtype, alg, buf):
        self.calls.append(("run", what, op_a, op_b, alg, buf))
        assert buf, "the workspace is passed"
        if what == "SpMV":
            A = self._csr(a)
            A = A.T if op_a == OP_T else A
            assert self.descr[b]["kind"] == self.descr[c]["kind"] == "vector"
            self._vector(c)[...] = A @ self._vector(b)
            return
        if what == "SpMM":
            A = self._csr(a)
            A = A.T if op_a == OP_T else A
            self._dense(c)[...] = A @ self._dense(b)
            return
        full = self._dense(a) @ self._dense(b)
        x = self.descr[c]
        coo = self._csr(c).tocoo()
        _host_array(x["data"], x["nnz"], x["dtype"])[...] = full[coo.row, coo.col] \
            if coo.nnz else []


@pytest.fixture
def fake(monkeypatch):
    """An emulated context (device memory is host memory) and a fake cuSPARSE."""
    ctx = EmulatedCtx()
    ctx.activate = lambda: ctx
    f = FakeCusparse()
    monkeypatch.setattr(lib_mod, "_cusparse", f)
    monkeypatch.setattr(gsparse, "_context", lambda name: ctx)
    return ctx, f


def _gpu_sparse(ctx, value):
    return GpuSparseMatrix(value.format, value.shape, device_array(ctx, value.data),
                           device_array(ctx, value.indices.astype("int32")),
                           device_array(ctx, value.indptr.astype("int32")))


def _thunk(node, values):
    storage = {v: [None] for v in node.inputs + node.outputs}
    for v, x in zip(node.inputs, values):
        storage[v][0] = x
    th = node.op.make_thunk(node, storage, {}, [])
    return th, storage[node.outputs[0]]


@pytest.mark.parametrize("fmt,transpose,sparse_left,dtype",
                         list(itertools.product(["csr", "csc"], [False, True], [True, False],
                                                ["float32", "float64"])))
def test_spmm_thunk_against_scipy(fake, fmt, transpose, sparse_left, dtype):
    ctx, f = fake
    S = _rand_sparse(5, 4, fmt, dtype)
    M = (S.T if transpose else S).toarray()
    dshape = (M.shape[1], 3) if sparse_left else (2, M.shape[0])
    D = RNG.standard_normal(dshape).astype(dtype)
    node = gsparse.GpuSpMM(transpose, sparse_left)(GpuSparseType(fmt, dtype)(),
                                                   GpuArrayType(dtype, (False, False))()).owner
    th, out = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, D)])
    th()
    want = M @ D if sparse_left else D @ M
    np.testing.assert_allclose(host_view(out[0]), want, rtol=1e-5)
    # one CSR descriptor over the stored arrays, opA from the format and the transpose
    g = gsparse.spmm_geometry(fmt, S.shape, transpose, sparse_left, dshape)
    stored = S.shape if fmt == "csr" else S.shape[::-1]
    assert ("csr", stored[0], stored[1], S.nnz, dtype) in f.calls
    order = ORDER_ROW if sparse_left else ORDER_COL
    assert [c[-1] for c in f.calls if c[0] == "dense"] == [order, order]
    run = [c for c in f.calls if c[0] == "run"][0]
    assert run[2] == g["op_a"] and run[3] == OP_N
    # the fast row-major algorithm where opA = N and the operands are row-major
    want_alg = lib_mod.SPMM_CSR_ALG2 if (g["op_a"] == OP_N and sparse_left) else \
        lib_mod.SPMM_ALG_DEFAULT
    assert run[4] == want_alg
    # a workspace from the context's pool, of the size cuSPARSE asked for, preprocessed once
    assert [c for c in f.calls if c[0] == "preprocess"][0][3] == run[5]
    # a second call reuses the plan: no new descriptor, only the dense pointers move
    n_descr = sum(c[0] in ("csr", "dense") for c in f.calls)
    th()
    assert sum(c[0] in ("csr", "dense") for c in f.calls) == n_descr
    assert [c[0] for c in f.calls[-3:]] == ["set_dense", "set_dense", "run"]
    np.testing.assert_allclose(host_view(out[0]), want, rtol=1e-5)


def test_a_new_matrix_at_the_same_addresses_gets_a_new_plan(fake):
    """set_value may put a new pattern where the old one was: the preprocessed plan of the
    old one must not serve it."""
    ctx, f = fake
    S = _rand_sparse(6, 5, "csr", "float32")
    D = RNG.standard_normal((5, 2)).astype("float32")
    node = gsparse.GpuSpMM()(GpuSparseType("csr", "float32")(),
                             GpuArrayType("float32", (False, False))()).owner
    gs = _gpu_sparse(ctx, S)
    storage = {v: [None] for v in node.inputs + node.outputs}
    storage[node.inputs[0]][0], storage[node.inputs[1]][0] = gs, device_array(ctx, D)
    th = node.op.make_thunk(node, storage, {}, [])
    th()
    # another indices array object over the same memory: what a new value in the same
    # pool blocks looks like to the thunk
    storage[node.inputs[0]][0] = GpuSparseMatrix("csr", gs.shape, gs.data, gs.indices[:],
                                                 gs.indptr)
    n_csr = sum(c[0] == "csr" for c in f.calls)
    th()
    assert sum(c[0] == "csr" for c in f.calls) == n_csr + 1
    assert any(c[0] == "destroy_sparse" for c in f.calls)
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]), S @ D, rtol=1e-5)


@pytest.mark.parametrize("fmt,sparse_left,dtype",
                         list(itertools.product(["csr", "csc"], [True, False],
                                                ["float32", "float64"])))
def test_spmv_thunk_against_scipy(fake, fmt, sparse_left, dtype):
    ctx, f = fake
    S = _rand_sparse(5, 4, fmt, dtype)
    v = RNG.standard_normal(4 if sparse_left else 5).astype(dtype)
    node = gsparse.GpuSpMV(sparse_left)(GpuSparseType(fmt, dtype)(),
                                        GpuArrayType(dtype, (False,))()).owner
    th, out = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, v)])
    th()
    want = S @ v if sparse_left else v @ S
    np.testing.assert_allclose(host_view(out[0]), want, rtol=1e-5)
    stored = S.shape if fmt == "csr" else S.shape[::-1]
    assert ("csr", stored[0], stored[1], S.nnz, dtype) in f.calls
    assert [c[1] for c in f.calls if c[0] == "vector"] == [len(v), len(want)]
    run = [c for c in f.calls if c[0] == "run"][0]
    # opA: the stored CSR matrix itself where op(S) is it (csr S . v, csc v . S)
    assert run[1] == "SpMV" and run[2] == (OP_N if (fmt == "csr") == sparse_left else OP_T)
    assert run[4] == lib_mod.SPMV_ALG_DEFAULT
    n_descr = sum(c[0] in ("csr", "vector") for c in f.calls)
    th()      # the plan is reused: only the vectors' pointers move
    assert sum(c[0] in ("csr", "vector") for c in f.calls) == n_descr
    assert [c[0] for c in f.calls[-3:]] == ["set_vector", "set_vector", "run"]
    np.testing.assert_allclose(host_view(out[0]), want, rtol=1e-5)


def test_spmv_refused_algorithm_falls_back_and_misfit_names_the_node(fake):
    ctx, f = fake
    f.refuse = {("SpMV", lib_mod.SPMV_ALG_DEFAULT)}
    S = _rand_sparse(6, 5, "csr", "float64")
    v = RNG.standard_normal(5)
    node = gsparse.GpuSpMV()(GpuSparseType("csr", "float64")(),
                             GpuArrayType("float64", (False,))()).owner
    th, out = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, v)])
    th()
    assert [c[4] for c in f.calls if c[0] == "buffer_size"] == list(gsparse.SPMV_ALGS)
    np.testing.assert_allclose(host_view(out[0]), S @ v)
    th, _ = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, np.ones(4))])
    with pytest.raises(ValueError, match=r"GpuSpMV.*\(6, 5\).*\(4,\)"):
        th()


def test_spmm_geometry_by_hand():
    g = gsparse.spmm_geometry("csr", (5, 4), False, True, (4, 3))
    assert g == {"op_a": OP_N, "order": ORDER_ROW, "b": (4, 3, 3), "c": (5, 3, 3),
                 "out": (5, 3)}
    # D (2x5) . S (5x4) = (S^T D^T)^T: S^T is R^T for csr, column-major operands
    g = gsparse.spmm_geometry("csr", (5, 4), False, False, (2, 5))
    assert g == {"op_a": OP_T, "order": ORDER_COL, "b": (5, 2, 5), "c": (4, 2, 4),
                 "out": (2, 4)}
    # a csc S^T is the stored CSR matrix itself
    assert gsparse.spmm_geometry("csc", (5, 4), True, True, (5, 3))["op_a"] == OP_N
    with pytest.raises(ValueError, match="not aligned"):
        gsparse.spmm_geometry("csr", (5, 4), False, True, (5, 3))


def test_refused_algorithm_falls_back(fake):
    ctx, f = fake
    f.refuse = {("SpMM", lib_mod.SPMM_CSR_ALG2)}
    S = _rand_sparse(6, 5, "csr", "float32")
    D = RNG.standard_normal((5, 2)).astype("float32")
    node = gsparse.GpuSpMM()(GpuSparseType("csr", "float32")(),
                             GpuArrayType("float32", (False, False))()).owner
    th, out = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, D)])
    th()
    tried = [c[4] for c in f.calls if c[0] == "buffer_size"]
    assert tried == [lib_mod.SPMM_CSR_ALG2, lib_mod.SPMM_ALG_DEFAULT]
    np.testing.assert_allclose(host_view(out[0]), S @ D, rtol=1e-5)
    f.refuse = {("SpMM", a) for a in gsparse.SPMM_ROW_ALGS}
    th.plans.clear()
    with pytest.raises(CusparseError, match="supports none of the SpMM algorithms"):
        th()


def test_spmm_unaligned_names_the_node(fake):
    ctx, _ = fake
    S = _rand_sparse(6, 5, "csr", "float32")
    node = gsparse.GpuSpMM()(GpuSparseType("csr", "float32")(),
                             GpuArrayType("float32", (False, False))()).owner
    th, _ = _thunk(node, [_gpu_sparse(ctx, S), device_array(ctx, np.ones((4, 2), "float32"))])
    with pytest.raises(ValueError, match=r"GpuSpMM.*\(6, 5\).*\(4, 2\)"):
        th()


@pytest.mark.parametrize("fmt,dtype", list(itertools.product(["csr", "csc"],
                                                              ["float32", "float64"])))
def test_sddmm_thunk_against_structured_dot_grad(fake, fmt, dtype):
    ctx, f = fake
    a = _rand_sparse(5, 4, fmt, dtype, density=0.4)
    b = RNG.standard_normal((4, 3)).astype(dtype)
    gz = RNG.standard_normal((5, 3)).astype(dtype)
    node = gsparse.GpuStructuredDotGrad()(GpuSparseType(fmt, dtype)(),
                                          GpuArrayType(dtype, (False, False))(),
                                          GpuArrayType(dtype, (False, False))()).owner
    ga = _gpu_sparse(ctx, a)
    th, out = _thunk(node, [ga, device_array(ctx, b), device_array(ctx, gz)])
    th()
    res = out[0]
    assert res.format == fmt and res.indices is ga.indices and res.indptr is ga.indptr
    host = sp.StructuredDotGrad()(sp.SparseType(fmt, dtype)(), T.matrix(dtype=dtype),
                                  T.matrix(dtype=dtype)).owner
    cell = [[None]]
    host.op.perform(host, [a, b, gz], cell)
    want = cell[0][0]
    np.testing.assert_allclose(host_view(res.data), want.data, rtol=1e-5)
    orders = [c[-1] for c in f.calls if c[0] == "dense"]
    assert orders == [ORDER_ROW, ORDER_COL]
    assert [c for c in f.calls if c[0] == "run"][0][1] == "SDDMM"


def test_sddmm_geometry_checks_shapes():
    with pytest.raises(ValueError, match="do not fit"):
        gsparse.sddmm_geometry("csr", (5, 4), (4, 3), (5, 2))


def test_library_declares_every_entry_point():
    assert {"cusparseCreateCsr", "cusparseCreateDnMat", "cusparseSpMM_bufferSize",
            "cusparseSpMM_preprocess", "cusparseSpMM", "cusparseSDDMM",
            "cusparseDnMatSetValues"} <= set(lib_mod._SIGNATURES)
    for name, args in lib_mod._SIGNATURES.items():
        if name.startswith(("cusparseSpMM", "cusparseSDDMM")):
            assert len(args) == 11, name


# ============================================================================ placement

def _placed(outputs_fn, *inputs):
    f = function(list(inputs), outputs_fn(*inputs))
    return f, _names(f)


def test_products_are_lifted_on_a_virtual_context():
    with config.change_flags(floatX="float32"), virtual_context(None):
        S = GpuSparseType("csr", "float32")("S")
        D = T.matrix("D")
        f, names = _placed(lambda s, d: [sp.structured_dot(s, d), sp.dot(s, d),
                                         sp.true_dot(s, d), sp.dot(d.T, s),
                                         sp.structured_dot(d.T, s)], S, D)
        assert "GpuSpMM" in names and "GpuSparseTranspose" in names
        assert not {"StructuredDot", "Dot", "TrueDot", "HostFromGpuSparse"} & names
        assert not cpu_nodes(f.maker.fgraph)


def test_sparse_dense_vector_products_and_their_gradient_are_lifted_to_spmv():
    with config.change_flags(floatX="float32"), virtual_context(None):
        S = GpuSparseType("csc", "float32")("S")
        v, w = T.vector("v"), T.vector("w")
        y = sp.dot(S, v)
        z = sp.dot(w, S)
        cost = (y ** 2).sum() + (z ** 2).sum()
        gv, gw = symgpu.grad(cost, [v, w])
        f = function([S, v, w], [y, z, gv, gw])
        nodes = f.maker.fgraph.toposort()
        spmv = [n for n in nodes if isinstance(n.op, gsparse.GpuSpMV)]
        # y, z and the two gradients (S^T (2 y) and S (2 z)) each one SpMV
        assert len(spmv) == 4, [type(n.op).__name__ for n in nodes]
        assert {n.op.sparse_left for n in spmv} == {True, False}
        assert not {"Dot", "HostFromGpuSparse"} & _names(f)
        assert not cpu_nodes(f.maker.fgraph)


def test_a_host_sparse_op_gets_transfers_beside_a_lifted_product():
    """S's product runs on the GPU, sp_sum of S on the host through a download; a host
    sparse input is uploaded once for the lifted product."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        S = GpuSparseType("csc", "float32")("S")
        x = sp.csr_matrix("x", dtype="float32")
        W = T.matrix("W")
        f = function([S, x, W], [sp.structured_dot(S, W).sum() + sp.sp_sum(S),
                                 sp.structured_dot(x, W)])
        nodes = f.maker.fgraph.toposort()
        kinds = [type(n.op).__name__ for n in nodes]
        assert kinds.count("GpuSpMM") == 2
        assert kinds.count("HostFromGpuSparse") == 1
        assert kinds.count("GpuSparseFromHost") == 1
        down = next(n for n in nodes if isinstance(n.op, HostFromGpuSparse))
        assert down.inputs[0] in f.maker.fgraph.inputs
        from symgpu.sparse.reductions import SpSum
        assert any(isinstance(c.op, SpSum) for c, _ in f.maker.fgraph.clients[down.outputs[0]])


def test_sparse_logistic_regression_gradients_are_lifted():
    with config.change_flags(floatX="float32"), virtual_context(None):
        X = GpuSparseType("csr", "float32")("X")
        y, W, b = T.vector("y"), T.matrix("W"), T.vector("b")
        p = T.nnet.sigmoid(sp.structured_dot(X, W)[:, 0] + b[0])
        cost = T.nnet.binary_crossentropy(p, y).mean()
        gX, gW = symgpu.grad(cost, [X, W])
        f = function([X, y, W, b], [gW, sp.csm_data(gX)])
        names = _names(f)
        assert {"GpuSpMM", "GpuSparseTranspose", "GpuStructuredDotGrad"} <= names
        assert not {"StructuredDot", "StructuredDotGrad"} & names


def test_transfer_pairs_cancel():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = sp.csr_matrix("x", dtype="float32")
        y = HostFromGpuSparse()(GpuSparseFromHost(None)(x))
        f = function([x], sp.sp_sum(y))
        assert not {"HostFromGpuSparse", "GpuSparseFromHost"} & _names(f)


def test_host_sparse_functions_read_gpu_sparse_variables():
    """symgpu.sparse functions take GPU sparse variables (through their host form) and the
    operators of sparse variables are theirs too."""
    S = GpuSparseType("csr", "float64", "dev7")("S")
    assert isinstance(sp.transpose(S).owner.inputs[0].owner.op, HostFromGpuSparse)
    assert S.T.type.format == "csc"
    assert sp.as_sparse_variable(S).type == sp.SparseType("csr", "float64")
    g = GpuSparseType("csr", "float64", "dev7")
    assert g.convert_variable(sp.csr_matrix(dtype="float64")).owner.op == GpuSparseFromHost("dev7")


def test_shared_on_the_cpu_device_is_unchanged():
    with config.change_flags(device="cpu"):
        s = symgpu.shared(ssp.csr_matrix(np.eye(3, dtype="float32")))
        assert type(s).__name__ == "SparseTensorSharedVariable"
        s2 = sp.shared(ssp.csc_matrix(np.eye(3)), format="csr")
        assert type(s2).__name__ == "SparseTensorSharedVariable" and s2.type.format == "csr"
    with pytest.raises(TypeError, match="scipy.sparse"):
        sp.shared(np.eye(3))


def test_virtual_context_cannot_hold_sparse_values():
    with virtual_context("vs"):
        with pytest.raises(TypeError):
            symgpu.shared(ssp.csr_matrix(np.eye(2, dtype="float32")), target="vs")


def test_infer_shapes_of_the_gpu_sparse_ops():
    from symgpu.tensor.rewriting.shape_feature import node_shapes
    S = GpuSparseType("csr", "float32")()
    D = GpuArrayType("float32", (False, False))()
    node = gsparse.GpuSpMM(True, False)(S, D).owner
    shapes = node_shapes(node)
    assert len(shapes) == 1 and len(shapes[0]) == 2


# ============================================================================ on a GPU

def _gpu_names(f):
    return _names(f)


@requires_gpu
@pytest.mark.parametrize("fmt,dtype", list(itertools.product(["csr", "csc"],
                                                              ["float32", "float64"])))
def test_every_lifted_product_on_the_gpu(cuda, fmt, dtype):
    Sv = _rand_sparse(40, 30, fmt, dtype, density=0.1)
    Dv = RNG.standard_normal((30, 8)).astype(dtype)
    Lv = RNG.standard_normal((6, 40)).astype(dtype)
    S = symgpu.shared(Sv, name="S")
    assert S.type == GpuSparseType(fmt, dtype)
    D, L = symgpu.shared(Dv, name="D"), symgpu.shared(Lv, name="L")
    f = function([], [sp.structured_dot(S, D), sp.dot(S, D), sp.true_dot(S, D),
                      sp.dot(L, S), sp.structured_dot(L, S), sp.structured_dot(S.T, L.T)])
    assert "GpuSpMM" in _gpu_names(f)
    tol = 1e-4 if dtype == "float32" else 1e-10
    outs = f()
    for got, want in zip(outs, [Sv @ Dv, Sv @ Dv, Sv @ Dv, Lv @ Sv, Lv @ Sv, Sv.T @ Lv.T]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
    f()  # a second call reuses the plans


@requires_gpu
@pytest.mark.parametrize("fmt,dtype", list(itertools.product(["csr", "csc"],
                                                              ["float32", "float64"])))
def test_sparse_times_vector_on_the_gpu(cuda, fmt, dtype):
    Sv = _rand_sparse(41, 29, fmt, dtype, density=0.1)
    vv = RNG.standard_normal(29).astype(dtype)
    wv = RNG.standard_normal(41).astype(dtype)
    S = symgpu.shared(Sv, name="S")
    uv = RNG.standard_normal(58).astype(dtype)
    v, w, u = (T.TensorType(dtype, (False,))() for _ in range(3))
    y, z = sp.dot(S, v), sp.dot(w, S)
    gv = symgpu.grad((y ** 2).sum() + (z ** 2).sum(), v)
    f = function([v, w, u], [y, z, gv, sp.dot(S, u[::2])])     # a strided vector too
    assert "GpuSpMV" in _gpu_names(f)
    tol = 1e-4 if dtype == "float32" else 1e-10
    want_y, want_z = Sv @ vv, wv @ Sv
    wants = [want_y, want_z, 2 * (Sv.T @ want_y), Sv @ uv[::2]]
    for _ in range(2):      # the second call reuses the plans (or replays the graph)
        for got, want in zip(f(vv, wv, uv), wants):
            np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


@requires_gpu
def test_benchmark_api_shape(cuda):
    """What benchmarks/library_gpu.py calls: shared csr S and dense D under device=cuda."""
    Sv = ssp.random(2000, 1500, density=0.01, format="csr", dtype="float32", random_state=1)
    Dv = RNG.standard_normal((1500, 64)).astype("float32")
    S, D = symgpu.shared(Sv, name="S"), symgpu.shared(Dv)
    from symgpu.gpu.placement.basic_ops import TRANSFER_COUNTS, reset_transfer_counts
    for expr in (sp.structured_dot(S, D), sp.dot(S, D)):
        f = function([], expr)
        assert "GpuSpMM" in _gpu_names(f)
        f()
        reset_transfer_counts()
        np.testing.assert_allclose(np.asarray(f()), Sv @ Dv, rtol=1e-4, atol=1e-4)
        assert TRANSFER_COUNTS["host_to_gpu"] == 0   # the matrix is never uploaded again


@requires_gpu
def test_sparse_logistic_regression_trains_like_the_cpu(cuda):
    Xv = ssp.random(64, 20, density=0.2, format="csr", dtype="float32", random_state=3)
    yv = (RNG.random(64) > 0.5).astype("float32")
    W0 = (RNG.standard_normal((20, 1)) * 0.1).astype("float32")

    def train(on_gpu):
        X = symgpu.shared(Xv, name="X")
        W = symgpu.shared(W0.copy(), name="W")
        b = symgpu.shared(np.float32(0.0), name="b")
        y = T.vector("y")
        p = T.nnet.sigmoid(sp.structured_dot(X, W)[:, 0] + b)
        cost = T.nnet.binary_crossentropy(p, y).mean()
        gW, gb, gX = symgpu.grad(cost, [W, b, X])
        step = function([y], [cost, sp.csm_data(gX)],
                        updates=[(W, W - 0.5 * gW), (b, b - 0.5 * gb)])
        if on_gpu:
            assert {"GpuSpMM", "GpuStructuredDotGrad"} <= _gpu_names(step)
        hist = [step(yv) for _ in range(5)]
        return [np.asarray(c) for c, _ in hist], np.asarray(hist[-1][1]), W.get_value()

    gpu = train(True)
    with on_the_cpu():
        cpu = train(False)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gpu[2], cpu[2], rtol=1e-4, atol=1e-6)


@requires_gpu
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_shared_round_trips(cuda, fmt):
    Sv = _rand_sparse(7, 5, fmt, "float32")
    S = symgpu.shared(Sv)
    assert isinstance(S.type, GpuSparseType)
    got = S.get_value()
    assert got.format == fmt and (got != Sv).nnz == 0
    inner = S.get_value(borrow=True, return_internal_type=True)
    assert isinstance(inner, GpuSparseMatrix) and inner.shape == Sv.shape
    new = _rand_sparse(7, 5, fmt, "float32", density=0.5)
    S.set_value(new)
    assert (S.get_value() != new).nnz == 0
    S2 = sp.shared(Sv, format="csr")
    assert isinstance(S2.type, GpuSparseType) and S2.type.format == "csr"
    # a host sparse op reads the GPU matrix through a download
    f = function([], sp.sp_sum(S))
    np.testing.assert_allclose(f(), new.sum(), rtol=1e-5)
    with pytest.raises(TypeError):
        S.set_value(object())
    assert (S.get_value() != new).nnz == 0     # a refused value changes nothing
