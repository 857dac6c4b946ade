"""Sparse x dense products on the GPU through cuSPARSE (symgpu/gpu/ops/cusparse_lib.py):
GpuSpMM (SpMM), GpuSpMV (SpMV: a sparse matrix and a dense vector, either side),
GpuSparseTranspose (a view) and GpuStructuredDotGrad (SDDMM), with lifters from
symgpu.sparse's StructuredDot, Dot, TrueDot, Transpose and StructuredDotGrad.

Layout: whatever the format, cuSPARSE sees the stored arrays as one CSR matrix R (a csr S is
R, a csc S is R^T: the transpose of a CSR is the CSC with the same arrays), and the wanted
sparse operand op(S) is R (opA = N) or R^T (opA = T). Dense operands are our row-major
arrays: ORDER_ROW where the product is sparse-left; a dense-left product D op(S) is computed
as its transpose op(S)^T D^T, reading D and writing the result as column-major matrices (a
row-major matrix is its transpose in column-major). Descriptors, the chosen algorithm and
the workspace (a pool block) are kept per thunk and per (sparse arrays' addresses, shapes),
so a call with a shared sparse matrix only points the dense descriptors at this call's
buffers and queues cusparseSpMM: no allocation outside the pool, no sync.

Other sparse ops stay on the host; the placement sweep inserts the transfers. symgpu.sparse
is never imported here: its op classes get their lifters once it is loaded
(`register_lifter_source`).
"""
from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops import cusparse_lib as _lib
from symgpu.gpu.ops.cusparse_lib import (NOT_SUPPORTED, OP_N, OP_T, ORDER_COL, ORDER_ROW,
                                         CusparseError)
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, gpu_contiguous
from symgpu.gpu.placement.rewriting import register_lifter, register_lifter_source
from symgpu.gpu.placement.sparse_type import is_gpu_sparse_var
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.shape_rules import dot_shape
from symgpu.tensor.type import TensorType

__all__ = ["GpuSpMM", "GpuSpMV", "GpuSparseTranspose", "GpuStructuredDotGrad", "SPMM_ROW_ALGS",
           "SPMM_OTHER_ALGS", "SPARSE_DTYPES", "spmm_geometry", "sddmm_geometry"]

SPARSE_DTYPES = ("float32", "float64")
#: SpMM algorithms tried, in order, for op(S) = R with row-major operands (the products of
#: a sparse-left dot); the first cuSPARSE accepts is kept per geometry
SPMM_ROW_ALGS = (_lib.SPMM_CSR_ALG2, _lib.SPMM_ALG_DEFAULT)
#: for the other cases (R^T, or column-major operands)
SPMM_OTHER_ALGS = (_lib.SPMM_ALG_DEFAULT, _lib.SPMM_CSR_ALG1)
#: SpMV algorithms tried, in order (the first accepted is kept per plan)
SPMV_ALGS = (_lib.SPMV_ALG_DEFAULT, _lib.SPMV_CSR_ALG1)
_MAX_PLANS = 4


def _stored(s: Any) -> tuple[int, int]:
    """(rows, cols) of the CSR matrix R that S's arrays describe."""
    return tuple(s.shape) if s.format == "csr" else tuple(s.shape[::-1])


def spmm_geometry(fmt: str, shape: tuple, transpose: bool, sparse_left: bool,
                  dshape: tuple) -> dict:
    """What cusparseSpMM is asked for op(S) . D (sparse_left) or D . op(S): opA on the
    stored CSR matrix R, the dense descriptors (rows, cols, ld, order) of B and C, and the
    output's shape. Raises ValueError for unaligned shapes."""
    mshape = tuple(shape[::-1]) if transpose else tuple(shape)   # op(S)
    m_is_r = (fmt == "csr") != transpose
    if sparse_left:
        if mshape[1] != dshape[0]:
            raise ValueError(f"op(S) of shape {mshape} and the dense {dshape} are not aligned")
        n = dshape[1]
        return {"op_a": OP_N if m_is_r else OP_T, "order": ORDER_ROW,
                "b": (dshape[0], n, max(n, 1)), "c": (mshape[0], n, max(n, 1)),
                "out": (mshape[0], n)}
    if dshape[1] != mshape[0]:
        raise ValueError(f"the dense {dshape} and op(S) of shape {mshape} are not aligned")
    n = dshape[0]   # out^T (mshape[1] x n) = op(S)^T D^T, column-major
    return {"op_a": OP_T if m_is_r else OP_N, "order": ORDER_COL,
            "b": (dshape[1], n, max(dshape[1], 1)), "c": (mshape[1], n, max(mshape[1], 1)),
            "out": (n, mshape[1])}


def sddmm_geometry(fmt: str, shape: tuple, bshape: tuple, gshape: tuple) -> dict:
    """cusparseSDDMM for (gz . b^T) at S's stored positions: C (the CSR matrix R's
    pattern) = A . B with A, B dense (rows, cols, ld, order). For csr S (m x k): A = gz
    (m x n, row-major), B = b^T (n x k: b read column-major); for csc S, R = S^T: A = b,
    B = gz^T."""
    m, k = shape
    if gshape[0] != m or bshape[0] != k or gshape[1] != bshape[1]:
        raise ValueError(f"S {tuple(shape)}, b {bshape} and gz {gshape} do not fit "
                         "(gz . b^T must have S's shape)")
    n = gshape[1]
    ld = max(n, 1)
    if fmt == "csr":
        return {"a": (m, n, ld, ORDER_ROW, "gz"), "b": (n, k, ld, ORDER_COL, "b")}
    return {"a": (k, n, ld, ORDER_ROW, "b"), "b": (n, m, ld, ORDER_COL, "gz")}


def _c_contiguous(ctx: Any, x: Any) -> Any:
    if x.is_c_contiguous:
        return x
    out = new_array(ctx, x.shape, x.dtype)
    out._copy_from_device(x)
    return out



def _dense_operand(op: Any, s: Any, d: Any, ndim: int) -> Any:
    """`d` as a GPU variable on S's context, checked to be the float32/float64 matrix
    (`ndim` 2) or vector (1) of S's dtype that a sparse product takes; S checked sparse."""
    if not is_gpu_sparse_var(s):
        raise TypeError(f"{op}: S must be a GPU sparse matrix, got {s} "
                        f"({getattr(s, 'type', type(s))})")
    d = as_gpuarray_variable(d, s.type.context_name)
    if d.ndim != ndim or d.dtype != s.dtype or d.dtype not in SPARSE_DTYPES:
        raise TypeError(f"{op}: the dense operand must be a float32/float64 "
                        f"{'matrix' if ndim == 2 else 'vector'} of S's dtype {s.dtype}, "
                        f"got {d.type}")
    return d

class _Plan:
    """Descriptors, algorithm and workspace of one geometry (destroyed when dropped)."""

    def __init__(self, lib: Any) -> None:
        self.lib, self.sparse, self.dense, self.alg, self.block = lib, None, [], 0, None
        self.vectors: list = []
        #: the sparse pattern's indices array the plan (and its preprocessing) was made
        #: for: a new matrix whose buffers land at the same addresses gets a new plan
        self.pattern: Any = None

    def drop(self) -> None:
        if self.sparse is not None:
            self.lib.destroy_sparse(self.sparse)
        for d in self.dense:
            self.lib.destroy_dense(d)
        for d in self.vectors:
            self.lib.destroy_vector(d)
        self.sparse, self.dense, self.vectors, self.block = None, [], [], None


def _plan_for(plans: dict, key: tuple, pattern: Any, make: Callable[[], "_Plan"]) -> "_Plan":
    plan = plans.get(key)
    if plan is not None and plan.pattern() is not pattern:
        plans.pop(key).drop()     # same addresses, another matrix (set_value): plan anew
        plan = None
    if plan is None:
        if len(plans) >= _MAX_PLANS:
            plans.pop(next(iter(plans))).drop()
        plan = plans[key] = make()
        plan.pattern = weakref.ref(pattern)
    return plan


def _pick(lib: Any, ctx: Any, what: str, h: int, plan: _Plan, ops: tuple, dtype: str,
          algs: tuple, node: Any) -> None:
    """The first algorithm cuSPARSE accepts for the plan, its workspace from the pool and
    the optional preprocessing (once per plan)."""
    if what == "SpMV":
        a, b, c = plan.sparse, plan.vectors[0], plan.vectors[1]
    elif what == "SpMM":
        a, b, c = plan.sparse, plan.dense[0], plan.dense[1]
    else:
        a, b, c = plan.dense[0], plan.dense[1], plan.sparse
    refused = []
    for alg in algs:
        try:
            size = lib.buffer_size(what, h, ops[0], ops[1], a, b, c, dtype, alg)
        except CusparseError as exc:
            if exc.status != NOT_SUPPORTED:
                raise
            refused.append(alg)
            continue
        plan.alg = alg
        plan.block = ctx.pool.allocate(size) if size else None
        lib.preprocess(what, h, ops[0], ops[1], a, b, c, dtype, alg,
                       plan.block.ptr if plan.block is not None else 0)
        return
    raise CusparseError(f"{node}: cuSPARSE supports none of the {what} algorithms {refused} "
                        f"for opA={ops[0]}, opB={ops[1]}, {dtype}", NOT_SUPPORTED)


class GpuSpMM(Op):
    """op(S) . D (`sparse_left`) or D . op(S), op(S) = S or S^T (`transpose`): a dense
    GPU matrix, through cusparseSpMM."""

    __props__ = ("transpose", "sparse_left")

    def __init__(self, transpose: bool = False, sparse_left: bool = True):
        self.transpose, self.sparse_left = bool(transpose), bool(sparse_left)

    def make_node(self, s: Any, d: Any) -> Apply:
        d = _dense_operand(self, s, d, 2)
        bcast = (False, d.broadcastable[1]) if self.sparse_left else (d.broadcastable[0], False)
        return Apply(self, [s, d], [GpuArrayType(s.dtype, bcast, s.type.context_name)()])

    def infer_shape(self, fgraph, node, input_shapes):
        s, d = input_shapes
        s = s[::-1] if self.transpose else s
        return [dot_shape(s, d) if self.sparse_left else dot_shape(d, s)]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        s_cell, d_cell = (storage_map[v] for v in node.inputs)
        out_cell = storage_map[node.outputs[0]]
        dtype_name = node.outputs[0].dtype
        dtype = np.dtype(dtype_name)
        plans: dict = {}

        def thunk() -> None:
            s, d = s_cell[0], d_cell[0]
            ctx.activate()
            out_cell[0] = self._run(ctx, plans, s, d, dtype, dtype_name, node)

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        thunk.plans = plans       # type: ignore[attr-defined]
        return thunk

    def _run(self, ctx: Any, plans: dict, s: Any, d: Any, dtype: np.dtype, name: str,
             node: Any) -> Any:
        try:
            g = spmm_geometry(s.format, s.shape, self.transpose, self.sparse_left, d.shape)
        except ValueError as exc:
            raise ValueError(f"{node}: {exc} (S: {s})") from None
        out = new_array(ctx, g["out"], dtype)
        if out.size == 0:
            return out
        if s.nnz == 0 or d.size == 0:
            return out.fill(0)
        d = _c_contiguous(ctx, d)
        lib = _lib.cusparse()
        h = lib.handle(ctx)
        rows, cols = _stored(s)
        key = (s.data.ptr, s.indices.ptr, s.indptr.ptr, rows, cols, s.nnz, g["b"], g["c"])

        def make() -> _Plan:
            plan = _Plan(lib)
            plan.sparse = lib.csr(rows, cols, s.nnz, s.indptr.ptr, s.indices.ptr, s.data.ptr,
                                  name)
            plan.dense = [lib.dense(*g["b"], d.ptr, name, g["order"]),
                          lib.dense(*g["c"], out.ptr, name, g["order"])]
            algs = SPMM_ROW_ALGS if (g["op_a"] == OP_N and g["order"] == ORDER_ROW) \
                else SPMM_OTHER_ALGS
            _pick(lib, ctx, "SpMM", h, plan, (g["op_a"], OP_N), name, algs, node)
            return plan

        plan = _plan_for(plans, key, s.indices, make)
        lib.set_dense_values(plan.dense[0], d.ptr)
        lib.set_dense_values(plan.dense[1], out.ptr)
        lib.run("SpMM", h, g["op_a"], OP_N, plan.sparse, plan.dense[0], plan.dense[1], name,
                plan.alg, plan.block.ptr if plan.block is not None else 0)
        return out


class GpuSpMV(Op):
    """S . v (`sparse_left`) or v . S = S^T v for a dense GPU vector v, through
    cusparseSpMV on the stored CSR matrix R (S = R for csr, R^T for csc): a dense vector."""

    __props__ = ("sparse_left",)

    def __init__(self, sparse_left: bool = True):
        self.sparse_left = bool(sparse_left)

    def make_node(self, s: Any, v: Any) -> Apply:
        v = _dense_operand(self, s, v, 1)
        return Apply(self, [s, v], [GpuArrayType(s.dtype, (False,), s.type.context_name)()])

    def infer_shape(self, fgraph, node, input_shapes):
        s, _ = input_shapes
        return [(s[0],) if self.sparse_left else (s[1],)]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        s_cell, v_cell = (storage_map[v] for v in node.inputs)
        out_cell = storage_map[node.outputs[0]]
        name = node.outputs[0].dtype
        plans: dict = {}

        def thunk() -> None:
            ctx.activate()
            out_cell[0] = self._run(ctx, plans, s_cell[0], v_cell[0], name, node)

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        thunk.plans = plans       # type: ignore[attr-defined]
        return thunk

    def _run(self, ctx: Any, plans: dict, s: Any, v: Any, name: str, node: Any) -> Any:
        m, k = s.shape if self.sparse_left else s.shape[::-1]     # op(S) is m x k
        if v.shape[0] != k:
            raise ValueError(f"{node}: S of shape {tuple(s.shape)} ({s.format}) and the vector "
                             f"of shape {tuple(v.shape)} are not aligned")
        out = new_array(ctx, (m,), np.dtype(name))
        if m == 0:
            return out
        if s.nnz == 0 or k == 0:
            return out.fill(0)
        v = _c_contiguous(ctx, v)
        lib = _lib.cusparse()
        h = lib.handle(ctx)
        rows, cols = _stored(s)
        # op(S) is R where the stored matrix is S (csr, S . v) or S^T (csc, v . S)
        op_a = OP_N if (s.format == "csr") == self.sparse_left else OP_T
        key = (s.data.ptr, s.indices.ptr, s.indptr.ptr, rows, cols, s.nnz, op_a)

        def make() -> _Plan:
            plan = _Plan(lib)
            plan.sparse = lib.csr(rows, cols, s.nnz, s.indptr.ptr, s.indices.ptr, s.data.ptr,
                                  name)
            plan.vectors = [lib.vector(k, v.ptr, name), lib.vector(m, out.ptr, name)]
            _pick(lib, ctx, "SpMV", h, plan, (op_a, OP_N), name, SPMV_ALGS, node)
            return plan

        plan = _plan_for(plans, key, s.indices, make)
        lib.set_vector_values(plan.vectors[0], v.ptr)
        lib.set_vector_values(plan.vectors[1], out.ptr)
        lib.run("SpMV", h, op_a, OP_N, plan.sparse, plan.vectors[0], plan.vectors[1], name,
                plan.alg, plan.block.ptr if plan.block is not None else 0)
        return out


class GpuSparseTranspose(Op):
    """The transpose of a GPU sparse matrix: the same arrays in the other format (a view)."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_sparse_var(x):
            raise TypeError(f"GpuSparseTranspose: {x} is not a GPU sparse matrix")
        t = x.type
        return Apply(self, [x], [t.clone(format="csc" if t.format == "csr" else "csr")()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0].T

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0][::-1])]


class GpuStructuredDotGrad(Op):
    """`(gz . b^T)` at sparse a's stored positions (a's pattern and format; its indices and
    indptr are shared with a, read-only), through cusparseSDDMM."""

    __props__ = ()

    def make_node(self, a: Any, b: Any, gz: Any) -> Apply:
        if not is_gpu_sparse_var(a):
            raise TypeError(f"GpuStructuredDotGrad: a must be a GPU sparse matrix, got {a}")
        ctx = a.type.context_name
        b, gz = as_gpuarray_variable(b, ctx), as_gpuarray_variable(gz, ctx)
        for what, v in (("b", b), ("gz", gz)):
            if v.ndim != 2 or v.dtype != a.dtype or v.dtype not in SPARSE_DTYPES:
                raise TypeError(f"GpuStructuredDotGrad: {what} must be a float32/float64 "
                                f"matrix of a's dtype {a.dtype}, got {v.type}")
        return Apply(self, [a, b, gz], [a.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        out_cell = storage_map[node.outputs[0]]
        name = node.outputs[0].type.dtype
        plans: dict = {}

        def thunk() -> None:
            ctx.activate()
            out_cell[0] = self._run(ctx, plans, *[c[0] for c in cells], name, node)

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        thunk.plans = plans       # type: ignore[attr-defined]
        return thunk

    def _run(self, ctx: Any, plans: dict, a: Any, b: Any, gz: Any, name: str, node: Any) -> Any:
        try:
            g = sddmm_geometry(a.format, a.shape, tuple(b.shape), tuple(gz.shape))
        except ValueError as exc:
            raise ValueError(f"{node}: {exc}") from None
        vals = new_array(ctx, (a.nnz,), np.dtype(name))
        res = type(a)(a.format, a.shape, vals, a.indices, a.indptr)
        if a.nnz == 0:
            return res
        if gz.shape[1] == 0:
            vals.fill(0)
            return res
        dense = {"b": _c_contiguous(ctx, b), "gz": _c_contiguous(ctx, gz)}
        lib = _lib.cusparse()
        h = lib.handle(ctx)
        rows, cols = _stored(a)
        key = (a.indices.ptr, a.indptr.ptr, rows, cols, a.nnz, g["a"], g["b"])

        def make() -> _Plan:
            plan = _Plan(lib)
            plan.sparse = lib.csr(rows, cols, a.nnz, a.indptr.ptr, a.indices.ptr, vals.ptr,
                                  name)
            plan.dense = [lib.dense(*g[k][:3], dense[g[k][4]].ptr, name, g[k][3])
                          for k in ("a", "b")]
            _pick(lib, ctx, "SDDMM", h, plan, (OP_N, OP_N), name, (_lib.SDDMM_ALG_DEFAULT,),
                  node)
            return plan

        plan = _plan_for(plans, key, a.indices, make)
        lib.set_sparse_values(plan.sparse, vals.ptr)
        lib.set_dense_values(plan.dense[0], dense[g["a"][4]].ptr)
        lib.set_dense_values(plan.dense[1], dense[g["b"][4]].ptr)
        lib.run("SDDMM", h, OP_N, OP_N, plan.dense[0], plan.dense[1], plan.sparse, name,
                plan.alg, plan.block.ptr if plan.block is not None else 0)
        return res


# ----------------------------------------------------------------------------- lifters

def _dense_ok(v: Any, dtype: str) -> bool:
    return is_gpu_var(v) and v.ndim == 2 and v.dtype == dtype


def _vector_ok(v: Any, dtype: str) -> bool:
    return is_gpu_var(v) and v.ndim == 1 and v.dtype == dtype


def _lift_product(op, node, context_name, inputs):
    """StructuredDot / Dot / TrueDot of a sparse and a dense matrix -> GpuSpMM; sparse Dot
    with a dense vector -> GpuSpMV."""
    x, y = inputs
    out = node.outputs[0]
    if not isinstance(out.type, TensorType) or out.dtype not in SPARSE_DTYPES:
        return None
    if is_gpu_sparse_var(x) and _vector_ok(y, out.dtype) and x.dtype == out.dtype:
        return [GpuSpMV(True)(x, y)]
    if is_gpu_sparse_var(y) and _vector_ok(x, out.dtype) and y.dtype == out.dtype:
        return [GpuSpMV(False)(y, x)]
    if is_gpu_sparse_var(x) and _dense_ok(y, out.dtype) and x.dtype == out.dtype:
        return [GpuSpMM(False, True)(x, gpu_contiguous(y))]
    if is_gpu_sparse_var(y) and _dense_ok(x, out.dtype) and y.dtype == out.dtype:
        return [GpuSpMM(False, False)(y, gpu_contiguous(x))]
    return None


def _lift_transpose(op, node, context_name, inputs):
    if not is_gpu_sparse_var(inputs[0]):
        return None
    return [GpuSparseTranspose()(inputs[0])]


def _lift_structured_dot_grad(op, node, context_name, inputs):
    a, b, gz = inputs
    dtype = node.outputs[0].dtype
    if not (is_gpu_sparse_var(a) and a.dtype == dtype and _dense_ok(b, dtype)
            and _dense_ok(gz, dtype) and dtype in SPARSE_DTYPES):
        return None
    return [GpuStructuredDotGrad()(a, gpu_contiguous(b), gpu_contiguous(gz))]


_REGISTERED: list = []


@register_lifter_source
def _register_sparse_lifters() -> None:
    """Lifters for symgpu.sparse's products, once that module is loaded (it is not imported
    here: it loads SciPy, and a graph can only hold its ops once it is loaded)."""
    if _REGISTERED:
        return
    products = sys.modules.get("symgpu.sparse.products")
    basic = sys.modules.get("symgpu.sparse.construct")
    if products is None or basic is None:
        return
    register_lifter(products.StructuredDot, products.Dot, products.TrueDot)(_lift_product)
    register_lifter(basic.Transpose)(_lift_transpose)
    register_lifter(products.StructuredDotGrad)(_lift_structured_dot_grad)
    _REGISTERED.append(True)
