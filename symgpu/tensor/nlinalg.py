"""Theano's `theano.tensor.nlinalg`: linear algebra computed with NumPy's `np.linalg` on the host.

Inverse, pseudo-inverse, determinant, eigen-decompositions, QR, SVD, least squares, tensor
inverse/solve, and the functions built from other ops (trace, matrix_dot, matrix_power, norm).
Where NumPy takes stacks of matrices (inv, pinv, det, eig, eigh, qr, svd), so do these ops:
the leading dimensions are a batch and the matrices are the last two. Each op knows its output
shape (`infer_shape`); inverse, pseudo-inverse, determinant and eigh have Theano's gradients
(and the inverse its R_op). Integer inputs are cast to float64 (as NumPy computes them).

The diagonal ops are `symgpu.tensor.extra_ops.AllocDiag` / `ExtractDiag`, re-exported here
under Theano's nlinalg names (`alloc_diag`, `extract_diag`, `diag`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, upcast
from symgpu.tensor.extra_ops import AllocDiag, ExtractDiag, diag, eye
from symgpu.tensor.math import (abs as _abs, cast, dot, matmul, max as _max, min as _min,
                                minimum, neq, sqrt, sum as _sum)
from symgpu.tensor.shape import shape_i, transpose
from symgpu.tensor.type import (TensorType, TensorVariable, as_tensor_variable,
                                computes_half_in_float32)

__all__ = ["MatrixInverse", "matrix_inverse", "MatrixPinv", "pinv", "Det", "det", "Eig", "eig",
           "Eigh", "EighGrad", "eigh", "QRFull", "QRIncomplete", "qr", "SVD", "svd", "Lstsq",
           "lstsq", "TensorInv", "tensorinv", "TensorSolve", "tensorsolve", "AllocDiag",
           "ExtractDiag", "alloc_diag", "extract_diag", "diag", "trace", "matrix_dot",
           "matrix_power", "norm"]


# ============================================================================ helpers

def _float_input(x: Any, what: str, name: str = "x") -> TensorVariable:
    """`x` as a real floating-point tensor (integers and bools cast to float64, NumPy's rule);
    complex inputs are refused."""
    x = as_tensor_variable(x)
    if x.dtype.startswith("complex"):
        raise TypeError(f"{what}: {name} = {x} ({x.type}) is complex; symgpu's linear algebra "
                        "takes real float32/float64 matrices")
    if not is_float(x.dtype):
        x = cast(x, "float64")
    return x


def _matrix_input(x: Any, what: str, name: str = "x", batched: bool = True) -> TensorVariable:
    """A real matrix (or, with `batched`, a stack of matrices: leading dimensions)."""
    x = _float_input(x, what, name)
    if x.ndim < 2 or (x.ndim > 2 and not batched):
        want = "a matrix or a stack of matrices" if batched else "a matrix (2 dimensions)"
        raise ValueError(f"{what}: {name} = {x} ({x.type}) must be {want}; it has "
                         f"{x.ndim} dimension(s)")
    return x


def _check_square(what: str, value: np.ndarray, name: str = "x") -> None:
    if value.shape[-1] != value.shape[-2]:
        raise ValueError(f"{what}: {name} must be square (in its last two dimensions); got "
                         f"shape {value.shape}")


def _mT(x: TensorVariable) -> TensorVariable:
    """The transpose of the last two axes (a matrix's transpose, or each of a stack's)."""
    return transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _expand2(x: TensorVariable) -> TensorVariable:
    """x[..., None, None]: a per-matrix value broadcast over its matrix."""
    return x.dimshuffle(*range(x.ndim), "x", "x")


def _batched(fn, *arrays: np.ndarray, batch_ndim: int):
    """Call `fn` on each matrix of the stacks (the first `batch_ndim` axes are the batch);
    the results stacked back (one array, or a tuple of them)."""
    if batch_ndim == 0:
        return fn(*arrays)
    batch = arrays[0].shape[:batch_ndim]
    for a in arrays[1:]:
        if a.shape[:batch_ndim] != batch:
            raise ValueError(f"the batch dimensions {batch} and {a.shape[:batch_ndim]} differ")
    results = [fn(*(a[idx] for a in arrays)) for idx in np.ndindex(*batch)]
    if not results:
        probe = fn(*(np.zeros(a.shape[batch_ndim:], a.dtype) for a in arrays))
        if isinstance(probe, tuple):
            return tuple(np.zeros(batch + np.shape(p), np.asarray(p).dtype) for p in probe)
        return np.zeros(batch + np.shape(probe), np.asarray(probe).dtype)
    if isinstance(results[0], tuple):
        return tuple(np.stack(parts).reshape(batch + np.shape(parts[0]))
                     for parts in zip(*results))
    return np.stack(results).reshape(batch + np.shape(results[0]))


def _out(value: Any, var: TensorVariable) -> np.ndarray:
    return np.asarray(value, dtype=var.dtype)


def _stack_type(x: TensorVariable, dtype: str, tail: int) -> TensorType:
    """The type of a result with x's batch dimensions and `tail` more (not broadcastable)."""
    return TensorType(dtype, x.broadcastable[:-2] + (False,) * tail)


def _matrix_dims(shape: tuple) -> tuple:
    return tuple(shape[:-2]), shape[-2], shape[-1]


# ============================================================================ inverse / pinv

class MatrixInverse(Op):
    r"""np.linalg.inv: the inverse of a square matrix (or of each matrix of a stack)."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "matrix_inverse")
        return Apply(self, [x], [x.type()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (x,) = inputs
        _check_square("matrix_inverse", x)
        out[0][0] = _out(np.linalg.inv(x), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def L_op(self, inputs, outputs, output_grads):
        # d(X^-1) = -X^-1 dX X^-1, so the gradient is -(X^-1)^T gz (X^-1)^T
        (xi,), (gz,) = outputs, output_grads
        xiT = _mT(xi)
        return [-matmul(matmul(xiT, gz), xiT)]

    def R_op(self, inputs, eval_points):
        (x,), (ev,) = inputs, eval_points
        if ev is None:
            return [None]
        xi = self(x)
        return [-matmul(matmul(xi, ev), xi)]


matrix_inverse = MatrixInverse()


class MatrixPinv(Op):
    """np.linalg.pinv: the Moore-Penrose pseudo-inverse of a matrix (or of each matrix of a
    stack), any shape (M, N) -> (N, M); `hermitian` as NumPy's."""

    __props__ = ("hermitian",)

    def __init__(self, hermitian: bool = False):
        self.hermitian = bool(hermitian)

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "pinv")
        bc = x.broadcastable
        return Apply(self, [x], [TensorType(x.dtype, bc[:-2] + (bc[-1], bc[-2]))()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        out[0][0] = _out(np.linalg.pinv(inputs[0], hermitian=self.hermitian), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        batch, m, n = _matrix_dims(input_shapes[0])
        return [batch + (n, m)]

    def L_op(self, inputs, outputs, output_grads):
        # Theano's (Wikipedia's) derivative of the pseudo-inverse, transposed for reverse mode:
        # (-Z V^T Z + Z Z^T V (I - X Z) + (I - Z X) V Z^T Z)^T with Z = pinv(X), V = gz.
        (x,), (z,), (gz,) = inputs, outputs, output_grads
        n_rows, n_cols = shape_i(x, x.ndim - 2), shape_i(x, x.ndim - 1)
        i_m = eye(n_rows, dtype=x.dtype)
        i_n = eye(n_cols, dtype=x.dtype)
        zT, gzT = _mT(z), _mT(gz)
        g = (-matmul(matmul(z, gzT), z)
             + matmul(matmul(matmul(z, zT), gz), i_m - matmul(x, z))
             + matmul(matmul(matmul(i_n - matmul(z, x), gz), zT), z))
        return [_mT(g)]


pinv = MatrixPinv()


# ============================================================================ determinant

class Det(Op):
    """np.linalg.det: the determinant of a square matrix (a scalar), or of each matrix of a
    stack (an array of the batch's shape)."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "det")
        return Apply(self, [x], [TensorType(x.dtype, x.broadcastable[:-2])()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (x,) = inputs
        _check_square("det", x)
        out[0][0] = _out(np.linalg.det(x), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0][:-2])]

    def L_op(self, inputs, outputs, output_grads):
        (x,), (d,), (gz,) = inputs, outputs, output_grads
        return [_expand2(gz * d) * _mT(matrix_inverse(x))]

    def __str__(self) -> str:
        return "Det"


det = Det()


# ============================================================================ eigen-decompositions

class Eig(Op):
    """np.linalg.eig: eigenvalues w and right eigenvectors v (columns) of a square matrix or a
    stack. A real matrix may have complex eigenvalues, so w and v are complex (complex128 for
    float64 input, complex64 for float32), as NumPy's are whenever any eigenvalue is."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "eig")
        cdtype = "complex64" if x.dtype == "float32" else "complex128"
        return Apply(self, [x], [_stack_type(x, cdtype, 1)(), _stack_type(x, cdtype, 2)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (x,) = inputs
        _check_square("eig", x)
        w, v = np.linalg.eig(x)
        out[0][0], out[1][0] = _out(w, node.outputs[0]), _out(v, node.outputs[1])

    def infer_shape(self, fgraph, node, input_shapes):
        batch, n, _ = _matrix_dims(input_shapes[0])
        return [batch + (n,), batch + (n, n)]


eig = Eig()


class Eigh(Op):
    """np.linalg.eigh(x, UPLO): ascending eigenvalues w and orthonormal eigenvectors v
    (columns) of a symmetric matrix (or stack), read from its lower ('L') or upper ('U')
    triangle."""

    __props__ = ("UPLO",)

    def __init__(self, UPLO: str = "L"):
        if UPLO not in ("L", "U"):
            raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
        self.UPLO = UPLO

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "eigh")
        return Apply(self, [x], [_stack_type(x, x.dtype, 1)(), _stack_type(x, x.dtype, 2)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (x,) = inputs
        _check_square("eigh", x)
        w, v = np.linalg.eigh(x, self.UPLO)
        out[0][0], out[1][0] = _out(w, node.outputs[0]), _out(v, node.outputs[1])

    def infer_shape(self, fgraph, node, input_shapes):
        batch, n, _ = _matrix_dims(input_shapes[0])
        return [batch + (n,), batch + (n, n)]

    def L_op(self, inputs, outputs, output_grads):
        (x,), (w, v), (gw, gv) = inputs, outputs, output_grads
        return [EighGrad(self.UPLO)(x, w, v, gw, gv)]


class EighGrad(Op):
    """The gradient of Eigh (Theano's perturbation formulas) with respect to x, from x, w, v
    and the gradients gw, gv of w and v, folded onto the triangle that eigh reads."""

    __props__ = ("UPLO",)

    def __init__(self, UPLO: str = "L"):
        if UPLO not in ("L", "U"):
            raise ValueError(f"EighGrad: UPLO must be 'L' or 'U', got {UPLO!r}")
        self.UPLO = UPLO

    def make_node(self, x: Any, w: Any, v: Any, gw: Any, gv: Any) -> Apply:
        x, w, v, gw, gv = (as_tensor_variable(a) for a in (x, w, v, gw, gv))
        nd = x.ndim
        if (w.ndim, v.ndim, gw.ndim, gv.ndim) != (nd - 1, nd, nd - 1, nd):
            raise ValueError(f"EighGrad: inputs of dimensions {x.ndim}, {w.ndim}, {v.ndim}, "
                             f"{gw.ndim}, {gv.ndim} do not fit an eigh of a {nd}-d x")
        dtype = upcast(x.dtype, w.dtype, v.dtype, gw.dtype, gv.dtype)
        return Apply(self, [x, w, v, gw, gv], [TensorType(dtype, x.broadcastable)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        x, w, v, gw, gv = inputs
        # dw_n/dA = v_n v_n^T; dv_n/dA = sum_{m != n} v_m (v_m^T dA v_n) / (w_n - w_m), so
        # g = V (diag(gw) + M) V^T with M[n, m] = (V^T gv)[m, n] / (w_n - w_m), M[n, n] = 0.
        diff = w[..., :, None] - w[..., None, :]
        n = w.shape[-1]
        off = ~np.eye(n, dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.where(off, 1.0 / np.where(off, diff, 1.0), 0.0)
        vt_gv = np.swapaxes(v, -1, -2) @ gv
        m = np.swapaxes(vt_gv, -1, -2) * f
        m[..., np.arange(n), np.arange(n)] = gw
        g = v @ m @ np.swapaxes(v, -1, -2)
        # eigh(a, 'L') reads tril(a) only: a change of a[i, j] (i > j) stands for one of both
        # a[i, j] and a[j, i] of the symmetric matrix, so the opposite triangle folds over.
        if self.UPLO == "L":
            res = np.tril(g) + np.swapaxes(np.triu(g, 1), -1, -2)
        else:
            res = np.triu(g) + np.swapaxes(np.tril(g, -1), -1, -2)
        out[0][0] = _out(res, node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


def eigh(a: Any, UPLO: str = "L") -> list[TensorVariable]:
    """[w, v] = np.linalg.eigh(a, UPLO) (a symmetric matrix or a stack of them)."""
    return Eigh(UPLO)(a)


# ============================================================================ QR / SVD

_QR_MODES = ("reduced", "complete", "r", "raw")


class QRFull(Op):
    """np.linalg.qr with two results: 'reduced' (q (M, K), r (K, N)), 'complete' (q (M, M),
    r (M, N)) or 'raw' (h (N, M), tau (K,)), K = min(M, N). Stacks too."""

    __props__ = ("mode",)

    def __init__(self, mode: str = "reduced"):
        if mode not in ("reduced", "complete", "raw"):
            raise ValueError(f"QRFull: mode must be 'reduced', 'complete' or 'raw', got {mode!r}")
        self.mode = mode

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "qr")
        second = 1 if self.mode == "raw" else 2
        return Apply(self, [x], [_stack_type(x, x.dtype, 2)(), _stack_type(x, x.dtype, second)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        q, r = np.linalg.qr(inputs[0], self.mode)
        out[0][0], out[1][0] = _out(q, node.outputs[0]), _out(r, node.outputs[1])

    def infer_shape(self, fgraph, node, input_shapes):
        batch, m, n = _matrix_dims(input_shapes[0])
        k = minimum(m, n)
        if self.mode == "reduced":
            return [batch + (m, k), batch + (k, n)]
        if self.mode == "complete":
            return [batch + (m, m), batch + (m, n)]
        return [batch + (n, m), batch + (k,)]


class QRIncomplete(Op):
    """np.linalg.qr(x, 'r'): r alone, (K, N) with K = min(M, N). Stacks too."""

    __props__ = ("mode",)

    def __init__(self, mode: str = "r"):
        if mode != "r":
            raise ValueError(f"QRIncomplete: mode must be 'r', got {mode!r}")
        self.mode = mode

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "qr")
        return Apply(self, [x], [_stack_type(x, x.dtype, 2)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        out[0][0] = _out(np.linalg.qr(inputs[0], "r"), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        batch, m, n = _matrix_dims(input_shapes[0])
        return [batch + (minimum(m, n), n)]


def qr(a: Any, mode: str = "reduced") -> Any:
    """np.linalg.qr(a, mode): mode 'reduced' (default) -> [q, r], 'complete' -> [q, r] with a
    square q, 'r' -> r, 'raw' -> [h, tau] (h transposed, as LAPACK has it)."""
    if mode not in _QR_MODES:
        raise ValueError(f"qr: mode must be one of {_QR_MODES}, got {mode!r}")
    if mode == "r":
        return QRIncomplete(mode)(a)
    return QRFull(mode)(a)


class SVD(Op):
    """np.linalg.svd: [u, s, vt] (x = u diag(s) vt; with full_matrices u is (M, M) and vt
    (N, N), else (M, K) and (K, N), K = min(M, N)), or s alone without compute_uv. Stacks
    too."""

    __props__ = ("full_matrices", "compute_uv")

    def __init__(self, full_matrices: bool = True, compute_uv: bool = True):
        self.full_matrices, self.compute_uv = bool(full_matrices), bool(compute_uv)

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "svd")
        s = _stack_type(x, x.dtype, 1)()
        if not self.compute_uv:
            return Apply(self, [x], [s])
        return Apply(self, [x], [_stack_type(x, x.dtype, 2)(), s, _stack_type(x, x.dtype, 2)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        res = np.linalg.svd(inputs[0], self.full_matrices, self.compute_uv)
        res = res if self.compute_uv else (res,)
        for cell, value, var in zip(out, res, node.outputs):
            cell[0] = _out(value, var)

    def infer_shape(self, fgraph, node, input_shapes):
        batch, m, n = _matrix_dims(input_shapes[0])
        k = minimum(m, n)
        if not self.compute_uv:
            return [batch + (k,)]
        if self.full_matrices:
            return [batch + (m, m), batch + (k,), batch + (n, n)]
        return [batch + (m, k), batch + (k,), batch + (k, n)]


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True) -> Any:
    """np.linalg.svd(a, full_matrices, compute_uv): [u, s, vt], or s alone."""
    return SVD(full_matrices, compute_uv)(a)


# ============================================================================ least squares

class Lstsq(Op):
    """np.linalg.lstsq(a, b, rcond): [x, residuals, rank, s] for a matrix `a` (M, N) and a
    right-hand side `b` (M,) or (M, K). `residuals` are always the squared 2-norms of the
    columns of b - a x (K of them, 1 for a vector b), where NumPy returns an empty array when
    `a` is rank-deficient or M <= N; `rank` is an int64 scalar, `s` a's singular values.
    Theano's name is `lstsq` (an op class: `lstsq()(a, b, rcond)`)."""

    __props__ = ()

    def make_node(self, a: Any, b: Any, rcond: Any = -1) -> Apply:
        a = _matrix_input(a, "lstsq", "a", batched=False)
        b = _float_input(b, "lstsq", "b")
        if b.ndim not in (1, 2):
            raise ValueError(f"lstsq: b = {b} ({b.type}) must be a vector or a matrix")
        rcond = cast(as_tensor_variable(rcond), "float64")
        if rcond.ndim != 0:
            raise ValueError(f"lstsq: rcond = {rcond} ({rcond.type}) must be a scalar")
        dtype = upcast(a.dtype, b.dtype)
        return Apply(self, [a, b, rcond], [TensorType(dtype, (False,) * b.ndim)(),
                                           TensorType(dtype, (False,))(),
                                           TensorType("int64", ())(),
                                           TensorType(dtype, (False,))()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        a, b, rcond = inputs
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"lstsq: a of shape {a.shape} and b of shape {b.shape} differ in "
                             "their number of rows")
        x, _, rank, s = np.linalg.lstsq(a, b, rcond=float(rcond))
        resid = b - a @ x
        res = np.sum(resid * resid, axis=0)
        outs = (x, np.atleast_1d(res), np.int64(rank), s)
        for cell, value, var in zip(out, outs, node.outputs):
            cell[0] = _out(value, var)

    def infer_shape(self, fgraph, node, input_shapes):
        (m, n), b_shape = input_shapes[0], input_shapes[1]
        k = b_shape[1] if len(b_shape) == 2 else 1
        return [(n,) + tuple(b_shape[1:]), (k,), (), (minimum(m, n),)]


lstsq = Lstsq


# ============================================================================ tensorinv / tensorsolve

class TensorInv(Op):
    """np.linalg.tensorinv(a, ind): the inverse of `a` for tensordot over `ind` axes; the
    result has the shape a.shape[ind:] + a.shape[:ind]."""

    __props__ = ("ind",)

    def __init__(self, ind: int = 2):
        if not isinstance(ind, (int, np.integer)) or ind <= 0:
            raise ValueError(f"tensorinv: ind must be a positive integer, got {ind!r}")
        self.ind = int(ind)

    def make_node(self, a: Any) -> Apply:
        a = _float_input(a, "tensorinv", "a")
        if a.ndim <= self.ind:
            raise ValueError(f"tensorinv: a = {a} ({a.type}) needs more than ind={self.ind} "
                             "dimensions")
        bc = a.broadcastable
        return Apply(self, [a], [TensorType(a.dtype, bc[self.ind:] + bc[:self.ind])()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (a,) = inputs
        if np.prod(a.shape[:self.ind]) != np.prod(a.shape[self.ind:]):
            raise ValueError(f"tensorinv: a of shape {a.shape} is not 'square' for ind="
                             f"{self.ind}: prod{a.shape[:self.ind]} != prod{a.shape[self.ind:]}")
        out[0][0] = _out(np.linalg.tensorinv(a, self.ind), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        shp = tuple(input_shapes[0])
        return [shp[self.ind:] + shp[:self.ind]]


def tensorinv(a: Any, ind: int = 2) -> TensorVariable:
    """np.linalg.tensorinv(a, ind): `tensordot(tensorinv(a, ind), a, ind)` is the identity."""
    return TensorInv(ind)(a)


class TensorSolve(Op):
    """np.linalg.tensorsolve(a, b, axes): x with tensordot(a, x, x.ndim) == b; x has the shape
    of a's trailing a.ndim - b.ndim axes (after moving `axes` of a to the end)."""

    __props__ = ("axes",)

    def __init__(self, axes: Any = None):
        self.axes = None if axes is None else tuple(int(ax) for ax in axes)

    def make_node(self, a: Any, b: Any) -> Apply:
        a, b = _float_input(a, "tensorsolve", "a"), _float_input(b, "tensorsolve", "b")
        if a.ndim <= b.ndim:
            raise ValueError(f"tensorsolve: a = {a} ({a.type}) needs more dimensions than "
                             f"b = {b} ({b.type})")
        if self.axes is not None and any(not -a.ndim <= ax < a.ndim for ax in self.axes):
            raise ValueError(f"tensorsolve: axes {self.axes} out of range for {a} ({a.type})")
        return Apply(self, [a, b], [TensorType(upcast(a.dtype, b.dtype),
                                               (False,) * (a.ndim - b.ndim))()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        a, b = inputs
        out[0][0] = _out(np.linalg.tensorsolve(a, b, self.axes), node.outputs[0])

    def _order(self, ndim: int) -> list[int]:
        if self.axes is None:
            return list(range(ndim))
        moved = [ax % ndim for ax in self.axes]
        return [k for k in range(ndim) if k not in moved] + moved

    def infer_shape(self, fgraph, node, input_shapes):
        a_shape, b_shape = input_shapes
        order = self._order(len(a_shape))
        return [tuple(a_shape[k] for k in order[len(b_shape):])]


def tensorsolve(a: Any, b: Any, axes: Any = None) -> TensorVariable:
    """np.linalg.tensorsolve(a, b, axes): solve tensordot(a, x, x.ndim) = b for x."""
    return TensorSolve(axes)(a, b)


# ============================================================================ diagonals (re-exported)

alloc_diag = AllocDiag()
"""Theano's nlinalg.alloc_diag: the square matrix with the vector on its diagonal."""
extract_diag = ExtractDiag()
"""Theano's nlinalg.extract_diag: the diagonal of a matrix (axes 0 and 1)."""


# ============================================================================ functions of other ops

def trace(X: Any) -> TensorVariable:
    """The sum of the diagonal of the matrix `X` (Theano's nlinalg.trace)."""
    X = as_tensor_variable(X)
    if X.ndim != 2:
        raise ValueError(f"trace: X = {X} ({X.type}) must be a matrix")
    return _sum(extract_diag(X))


def matrix_dot(*args: Any) -> TensorVariable:
    """args[0] . args[1] . ... . args[-1] (products of matrices, left to right)."""
    if not args:
        raise ValueError("matrix_dot needs at least one argument")
    res = as_tensor_variable(args[0])
    for a in args[1:]:
        res = dot(res, a)
    return res


def matrix_power(M: Any, n: int) -> TensorVariable:
    """M raised to the integer power n (np.linalg.matrix_power: n = 0 gives the identity,
    n < 0 a power of the inverse), by repeated squaring. Stacks of matrices too."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise TypeError(f"matrix_power: n must be a Python integer, got {n!r}")
    M = _matrix_input(M, "matrix_power", "M")
    if n < 0:
        M, n = matrix_inverse(M), -n
    if n == 0:
        ident = eye(shape_i(M, M.ndim - 1), dtype=M.dtype)
        return ident + M * 0  # the identity, broadcast over a stack (and M's dtype)
    result, base = None, M
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def _ord_value(ord: Any) -> Any:
    if isinstance(ord, str):
        named = {"inf": np.inf, "-inf": -np.inf, "fro": "fro", "nuc": "nuc"}
        if ord not in named:
            raise ValueError(f"norm: invalid ord {ord!r}")
        return named[ord]
    return ord


def norm(x: Any, ord: Any = None) -> TensorVariable:
    """np.linalg.norm(x, ord) of a vector or a matrix. Vectors: None (2-norm), inf / 'inf'
    (max |x|), -inf / '-inf' (min |x|), 0 (count of nonzeros), any other p ((sum |x|^p)^(1/p)).
    Matrices: None / 'fro' (Frobenius), inf / 'inf' (max row sum of |x|), -inf / '-inf' (min
    row sum), 1 / -1 (max / min column sum), 2 / -2 (largest / smallest singular value),
    'nuc' (sum of the singular values)."""
    x = _float_input(x, "norm")
    ord = _ord_value(ord)
    if x.ndim == 1:
        if ord is None or ord == 2:
            return sqrt(_sum(x * x))
        if isinstance(ord, str):
            raise ValueError(f"norm: ord {ord!r} is for matrices; {x} is a vector")
        if ord == np.inf:
            return _max(_abs(x))
        if ord == -np.inf:
            return _min(_abs(x))
        if ord == 0:
            return cast(_sum(neq(x, 0)), x.dtype)
        if ord == 1:
            return _sum(_abs(x))
        return _sum(_abs(x) ** ord) ** (1.0 / ord)
    if x.ndim == 2:
        if ord is None or ord == "fro":
            return sqrt(_sum(x * x))
        if ord == "nuc":
            return _sum(svd(x, compute_uv=False))
        if ord == np.inf:
            return _max(_sum(_abs(x), axis=1))
        if ord == -np.inf:
            return _min(_sum(_abs(x), axis=1))
        if ord == 1:
            return _max(_sum(_abs(x), axis=0))
        if ord == -1:
            return _min(_sum(_abs(x), axis=0))
        if ord == 2:
            return _max(svd(x, compute_uv=False))
        if ord == -2:
            return _min(svd(x, compute_uv=False))
        raise ValueError(f"norm: invalid ord {ord!r} for a matrix")
    raise ValueError(f"norm: x = {x} ({x.type}) must be a vector or a matrix; it has "
                     f"{x.ndim} dimensions")
