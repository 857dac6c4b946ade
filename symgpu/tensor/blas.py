"""BLAS ops: Gemv, Gemm, Dot22 and Ger, run by scipy.linalg.blas (s/d gemv, gemm, ger).

The BLAS rewrites (tensor/rewriting/blas.py) turn `dot` into these and fold scalings and
additive terms into them, so `w - lr * (dot(x.T, g) + c*w)` is one `Gemv(w, -lr, x.T, g,
1 - lr*c)` call.

BLAS is Fortran-ordered while our arrays are C-ordered: a C-contiguous matrix M is the
Fortran matrix M^T without a copy, so A @ v is `gemv(alpha, A.T, v, trans=1)` and the C-order
product Z = A @ B is computed as the Fortran product Z^T = B^T A^T. (Passing a C array as
is would make the wrapper copy it to Fortran order: ten times slower for a 400x784 gemv.)
Likewise the rank-1 update A + alpha*outer(x, y) of a C-ordered A is the Fortran update of
A^T with x and y swapped.

`y` of Gemv (and `C` of Gemm) may be broadcastable (length-1 dimensions): the output is then
allocated and filled with it, which lets `dot(x, w) + b` be a single Gemv. With `inplace=True`
the op overwrites `y`/`C` (declared in destroy_map), which the in-place pass allows only for
intermediates. Ger's `A` follows the same rules.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Apply, Constant
from symgpu.graph.op import Op
from symgpu.tensor.type import TensorType, as_tensor_variable
from symgpu.tensor.shape_rules import pick_dim
from symgpu.tensor.math import dot

__all__ = ["Gemv", "Gemm", "Dot22", "Ger", "gemv_inplace", "gemv_no_inplace", "gemm_inplace",
           "gemm_no_inplace", "dot22", "ger_inplace", "ger_no_inplace", "BLAS_DTYPES"]

BLAS_DTYPES = ("float32", "float64")
_FUNCS: dict[tuple[str, str], Callable] = {}


def _blas(kind: str, dtype: str) -> Callable:
    fn = _FUNCS.get((kind, dtype))
    if fn is None:
        from scipy.linalg import blas
        fn = getattr(blas, ("s" if dtype == "float32" else "d") + kind)
        _FUNCS[(kind, dtype)] = fn
    return fn


def _check(op: Op, inputs: list, ndims: tuple[int, ...]) -> str:
    dtype = inputs[0].dtype
    for v, nd in zip(inputs, ndims):
        if v.ndim != nd:
            raise TypeError(f"{op}: expected inputs of {ndims} dimensions, got "
                            f"{[w.type for w in inputs]}")
    if dtype not in BLAS_DTYPES:     # first: an integer matrix is the real mistake
        raise TypeError(f"{op}: BLAS computes in {' or '.join(BLAS_DTYPES)}, not {dtype}")
    if any(v.dtype != dtype for v in inputs):
        raise TypeError(f"{op}: all inputs must have one dtype, got {[w.dtype for w in inputs]}")
    return dtype


def _fortran(m: np.ndarray) -> tuple[np.ndarray, int]:
    """(F-contiguous array, trans flag) such that op(array) is m^T, without copying when
    m is contiguous either way."""
    if m.flags.c_contiguous:
        return m.T, 0
    if m.flags.f_contiguous:
        return m, 1
    return np.ascontiguousarray(m).T, 0


def gemv_value(fn: Callable, y, alpha, a, x, beta, inplace: bool, dtype: str) -> np.ndarray:
    """beta*y + alpha*(a @ x) with y broadcast to the result (a: C- or F-ordered)."""
    m, k = a.shape
    if x.shape[0] != k:
        raise ValueError(f"Gemv (dot): shapes {a.shape} and {x.shape} are not aligned "
                         f"({k} != {x.shape[0]})")
    if y.shape[0] not in (m, 1):
        raise ValueError(f"Gemv: y of shape {y.shape} does not match the {m} rows of the matrix")
    alpha, beta = float(alpha), float(beta)
    if m == 0 or k == 0:
        res = np.zeros(m, dtype=dtype) if beta == 0 else np.broadcast_to(beta * y, (m,)).astype(dtype)
        return res
    flags = a.flags
    if flags.c_contiguous:
        f, trans = a.T, 1
    elif flags.f_contiguous:
        f, trans = a, 0
    else:
        f, trans = np.ascontiguousarray(a).T, 1
    # positional arguments (alpha, a, x, beta, y, offx, incx, offy, incy, trans, overwrite_y):
    # f2py parses keywords about a microsecond slower
    if beta == 0:
        return fn(alpha, f, x, 0.0, None, 0, 1, 0, 1, trans, 0)
    if y.shape[0] != m:
        # a broadcast y (the bias of dot(x, w) + b): a filled buffer BLAS accumulates into,
        # cheaper than adding the bias to BLAS's result afterwards
        buf = np.empty(m, dtype=dtype)
        buf.fill(y[0])
    else:
        buf = y if inplace and y.flags.c_contiguous else y.copy()
    return fn(alpha, f, x, beta, buf, 0, 1, 0, 1, trans, 1)


def gemm_value(fn: Callable, c, alpha, a, b, beta, inplace: bool, dtype: str) -> np.ndarray:
    """beta*c + alpha*(a @ b) with c broadcast to the result, as a C-ordered array."""
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"Gemm/Dot22 (dot): shapes {a.shape} and {b.shape} are not aligned "
                         f"({k} != {k2})")
    alpha, beta = float(alpha), float(beta)
    if m == 0 or n == 0 or k == 0:
        res = np.zeros((m, n), dtype=dtype)
        if beta != 0:
            res[...] = beta * c
        return res
    bt, tb = _fortran(b)
    at, ta = _fortran(a)
    if beta == 0:
        return fn(alpha, bt, at, trans_a=tb, trans_b=ta).T
    if inplace and c.shape == (m, n) and c.flags.c_contiguous:
        buf = c
    else:
        buf = np.empty((m, n), dtype=dtype)
        buf[...] = c
    return fn(alpha, bt, at, beta=beta, c=buf.T, trans_a=tb, trans_b=ta, overwrite_c=True).T


def ger_value(fn: Callable, a, alpha, x, y, inplace: bool, dtype: str) -> np.ndarray:
    """a + alpha*outer(x, y) with a broadcast to the result; written into `a` itself when
    `inplace` and a is contiguous either way (BLAS updates its matrix in place)."""
    m, n = x.shape[0], y.shape[0]
    if a.ndim != 2 or a.shape[0] not in (m, 1) or a.shape[1] not in (n, 1):
        raise ValueError(f"Ger: A of shape {a.shape} does not match outer(x, y) of x {x.shape} "
                         f"and y {y.shape} (A must have shape {(m, n)} or broadcast to it)")
    if inplace and a.shape == (m, n) and (a.flags.c_contiguous or a.flags.f_contiguous):
        buf = a
    else:
        buf = np.empty((m, n), dtype=dtype)
        buf[...] = a
    if m == 0 or n == 0:
        return buf
    alpha = float(alpha)
    if buf.flags.c_contiguous:   # buf^T is Fortran (n, m): buf^T += alpha * y x^T
        return fn(alpha, y, x, a=buf.T, overwrite_a=True).T
    return fn(alpha, x, y, a=buf, overwrite_a=True)


def _scalar_or_cell(var, cell):
    """A constant's float value (fixed at link time) or the cell to read each call."""
    if isinstance(var, Constant):
        return float(var.data), None
    return None, cell


def _dim_of(node: Apply, input_shapes, *places: tuple[int, int]):
    """One output length that several (input, dim) places all have (BLAS checks they
    agree): the first not broadcastable, else 1."""
    cands = [input_shapes[i][d] for i, d in places if not node.inputs[i].broadcastable[d]]
    return pick_dim(cands) if cands else 1


def check_accumulator(op: Any, acc: Any, product_broadcastable: tuple) -> None:
    """Refuse an accumulator that the product would have to broadcast into: BLAS writes the
    product over the accumulator's copy, so wherever the product may have length 1 (a
    broadcastable dimension) the accumulator must too (it may broadcast, the product may not)."""
    for d, (acc_b, prod_b) in enumerate(zip(acc.broadcastable, product_broadcastable)):
        if prod_b and not acc_b:
            raise TypeError(f"{op}: the accumulator {acc} ({acc.type}) is not broadcastable in "
                            f"dimension {d} but the product is (broadcastable "
                            f"{tuple(product_broadcastable)}): beta*y + alpha*dot(...) would "
                            "broadcast the product into y, which BLAS cannot do")


class Gemv(Op):
    """z = beta * y + alpha * dot(A, x); inputs (y, alpha, A, x, beta), alpha/beta 0-d."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"Gemv{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def make_node(self, y: Any, alpha: Any, A: Any, x: Any, beta: Any) -> Apply:
        y, alpha, A, x, beta = (as_tensor_variable(v) for v in (y, alpha, A, x, beta))
        dtype = _check(self, [y, alpha, A, x, beta], (1, 0, 2, 1, 0))
        check_accumulator(self, y, (A.broadcastable[0],))
        out = TensorType(dtype, (A.broadcastable[0] and y.broadcastable[0],))
        if self.inplace and y.type != out:
            raise TypeError(f"{self}: y ({y.type}) cannot hold the output ({out}) in place")
        return Apply(self, [y, alpha, A, x, beta], [out()])

    def perform(self, node, inputs, out):
        y, alpha, A, x, beta = inputs
        dtype = node.outputs[0].dtype
        out[0][0] = gemv_value(_blas("gemv", dtype), y, alpha, A, x, beta, self.inplace, dtype)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        cy, ca, cA, cx, cb = (storage_map[v] for v in node.inputs)
        out = storage_map[node.outputs[0]]
        dtype = node.outputs[0].dtype
        fn = _blas("gemv", dtype)
        inplace = self.inplace
        alpha, ca = _scalar_or_cell(node.inputs[1], ca)
        beta, cb = _scalar_or_cell(node.inputs[4], cb)
        if ca is None and cb is None:
            def thunk():
                out[0] = gemv_value(fn, cy[0], alpha, cA[0], cx[0], beta, inplace, dtype)
        else:
            def thunk():
                out[0] = gemv_value(fn, cy[0], alpha if ca is None else ca[0], cA[0], cx[0],
                                    beta if cb is None else cb[0], inplace, dtype)
        return _annotate(thunk, self, node, storage_map)

    def infer_shape(self, fgraph, node, input_shapes):
        """y's length, which is A's rows (GpuGemv shares it)."""
        return [(_dim_of(node, input_shapes, (0, 0), (2, 0)),)]

    def grad(self, inputs, output_grads):
        raise NotImplementedError("Gemv comes from the BLAS rewrites; differentiate the dot")


class Gemm(Op):
    """Z = beta * C + alpha * dot(A, B); inputs (C, alpha, A, B, beta), alpha/beta 0-d."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"Gemm{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def make_node(self, C: Any, alpha: Any, A: Any, B: Any, beta: Any) -> Apply:
        C, alpha, A, B, beta = (as_tensor_variable(v) for v in (C, alpha, A, B, beta))
        dtype = _check(self, [C, alpha, A, B, beta], (2, 0, 2, 2, 0))
        check_accumulator(self, C, (A.broadcastable[0], B.broadcastable[1]))
        out = TensorType(dtype, (A.broadcastable[0] and C.broadcastable[0],
                                 B.broadcastable[1] and C.broadcastable[1]))
        if self.inplace and C.type != out:
            raise TypeError(f"{self}: C ({C.type}) cannot hold the output ({out}) in place")
        return Apply(self, [C, alpha, A, B, beta], [out()])

    def perform(self, node, inputs, out):
        C, alpha, A, B, beta = inputs
        dtype = node.outputs[0].dtype
        out[0][0] = gemm_value(_blas("gemm", dtype), C, alpha, A, B, beta, self.inplace, dtype)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        cc, ca, cA, cB, cb = (storage_map[v] for v in node.inputs)
        out = storage_map[node.outputs[0]]
        dtype = node.outputs[0].dtype
        fn = _blas("gemm", dtype)
        inplace = self.inplace

        def thunk():
            out[0] = gemm_value(fn, cc[0], ca[0], cA[0], cB[0], cb[0], inplace, dtype)
        return _annotate(thunk, self, node, storage_map)

    def infer_shape(self, fgraph, node, input_shapes):
        """C's shape: A's rows by B's columns (GpuGemm shares it)."""
        return [(_dim_of(node, input_shapes, (0, 0), (2, 0)),
                 _dim_of(node, input_shapes, (0, 1), (3, 1)))]

    def grad(self, inputs, output_grads):
        raise NotImplementedError("Gemm comes from the BLAS rewrites; differentiate the dot")


class Dot22(Op):
    """dot of two matrices through gemm (no scaling, no accumulation)."""

    __props__ = ()

    def make_node(self, A: Any, B: Any) -> Apply:
        A, B = as_tensor_variable(A), as_tensor_variable(B)
        dtype = _check(self, [A, B], (2, 2))
        return Apply(self, [A, B], [TensorType(dtype, (A.broadcastable[0], B.broadcastable[1]))()])

    def perform(self, node, inputs, out):
        A, B = inputs
        dtype = node.outputs[0].dtype
        out[0][0] = gemm_value(_blas("gemm", dtype), None, 1.0, A, B, 0.0, False, dtype)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        cA, cB = (storage_map[v] for v in node.inputs)
        out = storage_map[node.outputs[0]]
        dtype = node.outputs[0].dtype
        fn = _blas("gemm", dtype)

        def thunk():
            out[0] = gemm_value(fn, None, 1.0, cA[0], cB[0], 0.0, False, dtype)
        return _annotate(thunk, self, node, storage_map)

    def infer_shape(self, fgraph, node, input_shapes):
        """A's rows by B's columns (GpuDot22 shares it)."""
        return [(_dim_of(node, input_shapes, (0, 0)), _dim_of(node, input_shapes, (1, 1)))]

    def grad(self, inputs, output_grads):
        (a, b), (gz,) = inputs, output_grads
        return [dot(gz, b.T), dot(a.T, gz)]


class Ger(Op):
    """Z = A + alpha * outer(x, y) (BLAS ger, the rank-1 update); inputs (A, alpha, x, y),
    alpha 0-d. The BLAS rewrites make it from `A + alpha * outer(x, y)`."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"Ger{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def make_node(self, A: Any, alpha: Any, x: Any, y: Any) -> Apply:
        A = as_tensor_variable(A)
        if isinstance(alpha, (int, float)) and A.dtype in BLAS_DTYPES:
            alpha = np.asarray(alpha, dtype=A.dtype)   # a Python number takes A's dtype
        alpha, x, y = (as_tensor_variable(v) for v in (alpha, x, y))
        dtype = _check(self, [A, alpha, x, y], (2, 0, 1, 1))
        out = TensorType(dtype, (A.broadcastable[0] and x.broadcastable[0],
                                 A.broadcastable[1] and y.broadcastable[0]))
        if self.inplace and A.type != out:
            raise TypeError(f"{self}: A ({A.type}) cannot hold the output ({out}) in place")
        return Apply(self, [A, alpha, x, y], [out()])

    def perform(self, node, inputs, out):
        A, alpha, x, y = inputs
        dtype = node.outputs[0].dtype
        out[0][0] = ger_value(_blas("ger", dtype), A, alpha, x, y, self.inplace, dtype)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        cA, ca, cx, cy = (storage_map[v] for v in node.inputs)
        out = storage_map[node.outputs[0]]
        dtype = node.outputs[0].dtype
        fn = _blas("ger", dtype)
        inplace = self.inplace
        alpha, ca = _scalar_or_cell(node.inputs[1], ca)
        if ca is None:
            def thunk():
                out[0] = ger_value(fn, cA[0], alpha, cx[0], cy[0], inplace, dtype)
        else:
            def thunk():
                out[0] = ger_value(fn, cA[0], ca[0], cx[0], cy[0], inplace, dtype)
        return _annotate(thunk, self, node, storage_map)

    def infer_shape(self, fgraph, node, input_shapes):
        """A's shape: len(x) by len(y) (GpuGer shares it)."""
        return [(_dim_of(node, input_shapes, (0, 0), (2, 0)),
                 _dim_of(node, input_shapes, (0, 1), (3, 0)))]

    def grad(self, inputs, output_grads):
        A, alpha, x, y = inputs
        (gz,) = output_grads
        axes = [d for d in range(2) if A.broadcastable[d] and not gz.broadcastable[d]]
        gA = gz.sum(axis=axes, keepdims=True) if axes else gz
        gzy = dot(gz, y)
        return [gA, dot(x, gzy), alpha * gzy, alpha * dot(x, gz)]


def _annotate(thunk, op: Op, node: Apply, storage_map: dict):
    """Give a closure thunk the attributes the VM and profiler read from PerformThunk."""
    thunk.op, thunk.node = op, node
    thunk.inputs = [storage_map[v] for v in node.inputs]
    thunk.outputs = [storage_map[v] for v in node.outputs]
    thunk.lazy = False
    return thunk


gemv_inplace, gemv_no_inplace = Gemv(True), Gemv(False)
gemm_inplace, gemm_no_inplace = Gemm(True), Gemm(False)
dot22 = Dot22()
ger_inplace, ger_no_inplace = Ger(True), Ger(False)
