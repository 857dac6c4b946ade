"""theano.gpuarray.linalg's classes and functions (issue 33), with Theano's signatures and
output orders, on our cuSOLVER/cuBLAS linear algebra (ops/linalg.py): Theano's cuSOLVER and
cuBLAS ops are our solves with its parameters; its MAGMA ops (MAGMA is not used here) are
our ops with MAGMA's interface (SVD returns S, U, VT; QR returns R, Q, as Theano's do; the
`gpu_svd` / `gpu_qr` functions put them back in NumPy's order). Each takes host or GPU
inputs (uploaded to the inputs' context) and gives GPU results. `inplace` flags are accepted
and change nothing: the results always go to fresh buffers."""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops import linalg_calls as calls
from symgpu.gpu.ops.cusolver_lib import OP_N, OP_T
from symgpu.gpu.ops.linalg import (GpuCholesky, GpuEigh, GpuMatrixInverse, GpuQR, GpuSVD,
                                   GpuSolve, GpuSolveTriangular, _GpuLinalg, _describer, _bn)
from symgpu.graph.basic import Apply, Variable
from symgpu.tensor.slinalg import MATRIX_STRUCTURES

__all__ = ["GpuCusolverSolve", "GpuCublasTriangularSolve", "GpuMagmaBase", "GpuMagmaSVD",
           "GpuMagmaMatrixInverse", "GpuMagmaCholesky", "GpuMagmaQR", "GpuMagmaEigh",
           "gpu_solve", "gpu_solve_lower_triangular", "gpu_solve_upper_triangular",
           "gpu_cholesky", "gpu_svd", "gpu_matrix_inverse", "gpu_qr"]

#: Theano's base class of its MAGMA ops: here the base of our GPU linear-algebra ops
GpuMagmaBase = _GpuLinalg


def _trans(who: str, trans: str) -> bool:
    if trans not in ("N", "T", "C"):
        raise ValueError(f"{who}: trans must be 'N', 'T' or 'C', got {trans!r}")
    return trans != "N"


class GpuCusolverSolve(GpuSolve):
    """Theano's cuSOLVER solve: A x = b, or A^T x = b with trans='T' ('C' alike: real
    matrices), for A of `A_structure` (general: LU; symmetric / positive definite:
    factorisations of A; triangular: trsm)."""

    __props__ = ("A_structure", "trans", "inplace")

    def __init__(self, A_structure: str = "general", trans: str = "N", inplace: bool = False):
        if A_structure not in MATRIX_STRUCTURES:
            raise ValueError(f"GpuCusolverSolve: A_structure must be one of "
                             f"{MATRIX_STRUCTURES}, got {A_structure!r}")
        super().__init__(A_structure, lower=True)
        self.transposed = _trans("GpuCusolverSolve", trans)
        self.trans, self.inplace = trans, bool(inplace)

    def __str__(self) -> str:
        return f"GpuCusolverSolve{{{self.A_structure}, {self.trans}}}"


class GpuCublasTriangularSolve(GpuSolveTriangular):
    """Theano's cuBLAS triangular solve: A x = b (or A^T x = b, trans='T') for A lower
    (lower=True) or upper triangular; b a vector or a matrix."""

    __props__ = ("trans", "lower")

    def __init__(self, lower: bool = True, trans: str = "N"):
        super().__init__(trans=int(_trans("GpuCublasTriangularSolve", trans)), lower=lower)
        self.trans = trans

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        self._triangular(env, dtype, ins, outs[0], self.lower,
                         OP_N if self.trans == "N" else OP_T, False)


class GpuMagmaCholesky(GpuCholesky):
    """Theano's MAGMA Cholesky, `GpuMagmaCholesky(lower=True, inplace=False)`: L (L L^T = A)
    or U (U^T U = A); a matrix that is not positive definite raises LinAlgError."""

    __props__ = ("lower", "on_error", "inplace")

    def __init__(self, lower: bool = True, inplace: bool = False):
        super().__init__(lower=lower)
        self.inplace = bool(inplace)


class GpuMagmaMatrixInverse(GpuMatrixInverse):
    """Theano's MAGMA matrix inverse, `GpuMagmaMatrixInverse(inplace=False)`."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)


class GpuMagmaSVD(GpuSVD):
    """Theano's MAGMA SVD: outputs (S, U, VT) with compute_uv (Theano's order; `gpu_svd`
    gives U, S, VT), else S alone."""

    def make_node(self, x: Any) -> Apply:
        node = super().make_node(x)
        if self.compute_uv:
            u, s, vt = node.outputs
            node = Apply(self, node.inputs, [s.type(), u.type(), vt.type()])
        return node

    def out_shapes(self, shapes, dtype):
        out = super().out_shapes(shapes, dtype)
        return [out[1], out[0], out[2]] if self.compute_uv else out

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        super().compute(env, dtype, ins, [outs[1], outs[0], outs[2]] if self.compute_uv
                        else outs)

    def infer_shape(self, fgraph, node, input_shapes):
        out = GpuSVD.infer_shape(self, fgraph, node, input_shapes)
        return [out[1], out[0], out[2]] if self.compute_uv else out


class GpuMagmaQR(GpuQR):
    """Theano's MAGMA QR, `GpuMagmaQR(complete=True)`: the reduced factors as (R, Q)
    (Theano's order; `gpu_qr` gives Q, R), or R alone with complete=False."""

    __props__ = ("complete",)

    def __init__(self, complete: bool = True):
        super().__init__("reduced" if complete else "r")
        self.complete = bool(complete)

    def make_node(self, x: Any) -> Apply:
        node = super().make_node(x)
        if self.complete:
            q, r = node.outputs
            node = Apply(self, node.inputs, [r.type(), q.type()])
        return node

    def out_shapes(self, shapes, dtype):
        out = super().out_shapes(shapes, dtype)
        return out[::-1]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        super().compute(env, dtype, ins, outs[::-1])

    def infer_shape(self, fgraph, node, input_shapes):
        return GpuQR.infer_shape(self, fgraph, node, input_shapes)[::-1]


class GpuMagmaEigh(GpuEigh):
    """Theano's MAGMA eigh, `GpuMagmaEigh(UPLO='L', compute_v=True)`: the eigenvalues
    (ascending) and eigenvectors (columns) of a symmetric matrix read from its `UPLO`
    triangle, or the eigenvalues alone with compute_v=False."""

    __props__ = ("lower", "compute_v")

    def __init__(self, UPLO: str = "L", compute_v: bool = True):
        super().__init__(UPLO)
        self.lower, self.compute_v = UPLO == "L", bool(compute_v)

    def make_node(self, x: Any) -> Apply:
        node = super().make_node(x)
        return node if self.compute_v else Apply(self, node.inputs, [node.outputs[0].type()])

    def out_shapes(self, shapes, dtype):
        out = super().out_shapes(shapes, dtype)
        return out if self.compute_v else out[:1]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        if self.compute_v:
            super().compute(env, dtype, ins, outs)
            return
        (x, shape), (w,) = ins[0], outs
        batch, n = _bn(shape)
        if n * batch == 0:
            return
        size = n * n * batch * _itemsize(dtype)
        a = env.alloc(size)
        env.k.copy(a, x, size)
        info = env.alloc(4 * batch)
        calls.syev(env, dtype, a, w, n, batch, self.lower, False, info,
                   stacked=len(shape) > 2)
        env.k.check_info(info, batch, _describer(self, "did not converge", shape, dtype))

    def infer_shape(self, fgraph, node, input_shapes):
        out = GpuEigh.infer_shape(self, fgraph, node, input_shapes)
        return out if self.compute_v else out[:1]


def _itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def gpu_solve(A: Any, b: Any, A_structure: str = "general", trans: str = "N") -> Variable:
    """x with A x = b (A^T x = b for trans='T') on the GPU."""
    return GpuCusolverSolve(A_structure, trans)(A, b)


def gpu_solve_lower_triangular(A: Any, b: Any, trans: str = "N") -> Variable:
    """x with A x = b, A lower triangular, on the GPU."""
    return GpuCublasTriangularSolve(True, trans)(A, b)


def gpu_solve_upper_triangular(A: Any, b: Any, trans: str = "N") -> Variable:
    """x with A x = b, A upper triangular, on the GPU."""
    return GpuCublasTriangularSolve(False, trans)(A, b)


def gpu_cholesky(A: Any, lower: bool = True) -> Variable:
    """The Cholesky factor of A on the GPU (cuSOLVER)."""
    return GpuCholesky(lower)(A)


def gpu_svd(a: Any, full_matrices: Any = 1, compute_uv: Any = 1) -> Any:
    """The SVD of `a` on the GPU: [U, S, VT] (NumPy's order; shapes by `full_matrices`),
    or S alone without `compute_uv`."""
    out = GpuMagmaSVD(bool(full_matrices), bool(compute_uv))(a)
    if compute_uv:
        s, u, vt = out
        return [u, s, vt]
    return out


def gpu_matrix_inverse(a: Any) -> Variable:
    """The inverse of `a` on the GPU."""
    return GpuMagmaMatrixInverse()(a)


def gpu_qr(a: Any, complete: bool = True) -> Any:
    """The reduced QR of `a` on the GPU: [Q, R], or R alone with complete=False."""
    out = GpuMagmaQR(complete)(a)
    if complete:
        r, q = out
        return [q, r]
    return out
