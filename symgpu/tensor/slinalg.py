"""Theano's `theano.tensor.slinalg`: linear algebra computed with SciPy on the host.

Cholesky factors, linear solves (general, symmetric, triangular, from a Cholesky factor),
generalized symmetric eigenvalues, the matrix exponential and the Kronecker product. SciPy
(`scipy.linalg`) loads on first use, inside the ops' `perform`. Cholesky, the solves and expm
also take stacks of matrices (leading dimensions are a batch; the solves' batches must match).
Each op knows its output shape and its gradient (Theano's formulas); integer inputs are cast
to float64.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import upcast
from symgpu.tensor.basic import concatenate, flatten, reshape
from symgpu.tensor.extra_funcs import tril, triu
from symgpu.tensor.extra_ops import eye
from symgpu.tensor.math import any as _any, isnan, matmul, outer, switch
from symgpu.tensor.nlinalg import (_batched, _check_square, _float_input, _matrix_input, _mT,
                                   _out)
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import (TensorType, TensorVariable, as_tensor_variable,
                                computes_half_in_float32)

__all__ = ["MATRIX_STRUCTURES", "Cholesky", "CholeskyGrad", "cholesky", "Solve", "solve",
           "solve_lower_triangular", "solve_upper_triangular", "solve_symmetric", "SolveTriangular", "solve_triangular",
           "CholeskySolve", "cho_solve", "Eigvalsh", "EigvalshGrad", "eigvalsh", "Expm",
           "ExpmGrad", "expm", "kron"]

#: Theano's names for what a Solve may assume about A ('banded', 'diagonal' and 'toeplitz'
#: are accepted and solved as general matrices, as Theano does).
MATRIX_STRUCTURES = ("general", "symmetric", "lower_triangular", "upper_triangular",
                     "hermitian", "banded", "diagonal", "toeplitz", "positive_definite")

# scipy.linalg.solve's assume_a for each structure Solve passes on
_ASSUME_A = {"general": "gen", "banded": "gen", "diagonal": "gen", "toeplitz": "gen",
             "symmetric": "sym", "hermitian": "her", "positive_definite": "pos"}
_FROM_ASSUME_A = {"gen": "general", "general": "general", "sym": "symmetric",
                  "symmetric": "symmetric", "her": "hermitian", "hermitian": "hermitian",
                  "pos": "positive_definite", "positive definite": "positive_definite",
                  "lower triangular": "lower_triangular", "upper triangular": "upper_triangular"}


def _scipy_linalg():
    import scipy.linalg  # not a symgpu module: loads on first use
    return scipy.linalg


def _tril_and_halve_diagonal(m: TensorVariable) -> TensorVariable:
    """tril(m) with its diagonal halved (last two axes)."""
    n = shape_i(m, m.ndim - 1)
    return tril(m) - 0.5 * m * eye(n, dtype=m.dtype)


def _sym_fold(g: TensorVariable, lower: bool) -> TensorVariable:
    """tril(g + g^T) - diag(g) (triu for upper): the gradient of a function of one triangle
    of a symmetric matrix."""
    n = shape_i(g, g.ndim - 1)
    full = g + _mT(g)
    return (tril(full) if lower else triu(full)) - g * eye(n, dtype=g.dtype)


# ============================================================================ Cholesky

class Cholesky(Op):
    """The Cholesky factor of a symmetric positive-definite matrix (or of each of a stack):
    L with L L^T = x (lower=True) or U with U^T U = x. A matrix that is not positive definite
    raises scipy.linalg.LinAlgError (on_error='raise') or gives a matrix of NaNs
    (on_error='nan')."""

    __props__ = ("lower", "destructive", "on_error")

    def __init__(self, lower: bool = True, on_error: str = "raise"):
        if on_error not in ("raise", "nan"):
            raise ValueError(f"Cholesky: on_error must be 'raise' or 'nan', got {on_error!r}")
        self.lower, self.destructive, self.on_error = bool(lower), False, on_error

    def make_node(self, x: Any) -> Apply:
        x = _matrix_input(x, "cholesky")
        return Apply(self, [x], [x.type()])

    def _one(self, a: np.ndarray) -> np.ndarray:
        sl = _scipy_linalg()
        try:
            return sl.cholesky(a, lower=self.lower)
        except sl.LinAlgError:
            if self.on_error == "raise":
                raise
            return np.full(a.shape, np.nan)

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (x,) = inputs
        _check_square("cholesky", x)
        out[0][0] = _out(_batched(self._one, x, batch_ndim=x.ndim - 2), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def L_op(self, inputs, outputs, output_grads):
        """Murray's reverse-mode rule ("Differentiation of the Cholesky decomposition",
        arXiv:1602.07527), Theano's formula."""
        (x,), (chol_x,), (dz,) = inputs, outputs, output_grads
        if self.on_error == "nan":
            # a NaN factor: a placeholder of ones keeps the solves finite; the result is NaN
            ok = ~_any(isnan(chol_x))
            chol_x = switch(ok, chol_x, 1)
            dz = switch(ok, dz, 1)
        if not self.lower:
            chol_x, dz = _mT(chol_x), _mT(dz)
        # s = L^-T P L^-1 with P = Phi(L^T dz)
        p = _tril_and_halve_diagonal(matmul(_mT(chol_x), dz))
        upper = _mT(chol_x)
        inner = _mT(solve_upper_triangular(upper, _mT(p)))
        s = solve_upper_triangular(upper, inner)
        grad = _sym_fold(s, self.lower)
        if self.on_error == "nan":
            grad = switch(ok, grad, np.nan)
        return [grad]


cholesky = Cholesky()


# ============================================================================ solves

class CholeskyGrad(Op):
    """Theano's reverse-mode Cholesky gradient op, `CholeskyGrad(lower)(x, L, dz)` (S. P.
    Smith, "Differentiation of the Cholesky Algorithm", 1995): the gradient with respect to
    the triangle of x that the factorisation reads (lower, or upper with lower=False) of a
    cost whose gradient at the factor L = cholesky(x) is dz; the other triangle is zero.
    (Cholesky's own gradient is the symmetric formula of its L_op.) Stacks of matrices too."""

    __props__ = ("lower", "destructive")

    def __init__(self, lower: bool = True):
        self.lower, self.destructive = bool(lower), False

    def make_node(self, x: Any, l: Any, dz: Any) -> Apply:
        x = _matrix_input(x, "CholeskyGrad")
        l, dz = as_tensor_variable(l), as_tensor_variable(dz)
        for v, name in ((l, "L"), (dz, "dz")):
            if v.ndim != x.ndim:
                raise TypeError(f"CholeskyGrad: {name} = {v} ({v.type}) must have x's "
                                f"{x.ndim} dimensions ({x.type})")
        if l.owner is not None and isinstance(l.owner.op, Cholesky) and \
                l.owner.op.lower != self.lower:
            raise ValueError(f"CholeskyGrad: lower={self.lower} but L comes from "
                             f"{l.owner.op} (lower={l.owner.op.lower})")
        return Apply(self, [x, l, dz], [x.type()])

    def _one(self, x: np.ndarray, L: np.ndarray, dz: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        if L.shape != x.shape or dz.shape != x.shape:
            raise ValueError(f"CholeskyGrad: x {x.shape}, L {L.shape} and dz {dz.shape} must "
                             "be square matrices of one shape")
        if self.lower:
            F = np.tril(dz).astype(np.result_type(x, L, dz), copy=True)
        else:   # the upper case is the lower one transposed
            F, L = np.tril(dz.T).astype(np.result_type(x, L, dz), copy=True), L.T
        for k in range(n - 1, -1, -1):
            for j in range(k + 1, n):
                F[j:, k] -= F[j:, j] * L[j, k]
                F[j, k] -= F[j:, j] @ L[j:, k]
            F[k + 1:, k] /= L[k, k]
            F[k, k] -= L[k + 1:, k] @ F[k + 1:, k]
            F[k, k] /= 2 * L[k, k]
        return F if self.lower else F.T

    def perform(self, node, inputs, out):
        x, L, dz = inputs
        _check_square("CholeskyGrad", x)
        out[0][0] = _out(_batched(self._one, x, L, dz, batch_ndim=x.ndim - 2), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


def _rhs_check(what: str, a: TensorVariable, b: TensorVariable) -> None:
    if b.ndim not in (a.ndim - 1, a.ndim):
        raise ValueError(f"{what}: b = {b} ({b.type}) must have {a.ndim - 1} dimensions (a "
                         f"vector per matrix of a) or {a.ndim} (a matrix per matrix of a) "
                         f"for a = {a} ({a.type})")


def _solve_shape(a_shape: tuple, b_shape: tuple) -> tuple:
    # x has the rows of a's columns and b's columns, batch as b's
    rows = a_shape[-1]
    if len(b_shape) == len(a_shape):
        return tuple(b_shape[:-2]) + (rows, b_shape[-1])
    return tuple(b_shape[:-1]) + (rows,)


def _solve_grad_a(b_bar: TensorVariable, c: TensorVariable, a: TensorVariable) -> TensorVariable:
    """-b_bar c^T (an outer product per vector when c holds vectors)."""
    if c.ndim == a.ndim - 1:
        if c.ndim == 1:
            return -outer(b_bar, c)
        return -(b_bar.dimshuffle(*range(c.ndim), "x") * c.dimshuffle(*range(c.ndim - 1), "x",
                                                                     c.ndim - 1))
    return -matmul(b_bar, _mT(c))


class _SolveBase(Op):
    """make_node, infer_shape and the batch loop of the solves."""

    _what = "solve"

    def make_node(self, A: Any, b: Any) -> Apply:
        A = _matrix_input(A, self._what, "A")
        b = _float_input(b, self._what, "b")
        _rhs_check(self._what, A, b)
        dtype = upcast(A.dtype, b.dtype)
        return Apply(self, [A, b], [TensorType(dtype, (False,) * b.ndim)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        A, b = inputs
        _check_square(self._what, A, "A")
        if A.shape[:-2] != b.shape[:A.ndim - 2]:
            raise ValueError(f"{self._what}: the batch dimensions of A {A.shape} and b "
                             f"{b.shape} differ")
        if b.shape[A.ndim - 2] != A.shape[-1]:
            raise ValueError(f"{self._what}: A of shape {A.shape} and b of shape {b.shape} do "
                             "not fit (b needs as many rows as A)")
        res = _batched(self._solve_one, A, b, batch_ndim=A.ndim - 2)
        out[0][0] = _out(res, node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [_solve_shape(*input_shapes)]


class Solve(_SolveBase):
    """x = A^-1 b for a square A (or a stack) and b a vector or matrix per matrix of A.
    `A_structure` (Theano's name; `assume_a` is SciPy's spelling) says what A is: 'general',
    'symmetric', 'hermitian', 'positive_definite' (scipy.linalg.solve's assume_a),
    'lower_triangular' or 'upper_triangular' (scipy.linalg.solve_triangular, which reads that
    triangle only); 'banded', 'diagonal', 'toeplitz' are solved as general."""

    __props__ = ("A_structure", "lower", "overwrite_A", "overwrite_b")

    def __init__(self, A_structure: str = "general", lower: bool = False,
                 overwrite_A: bool = False, overwrite_b: bool = False,
                 assume_a: str | None = None):
        if assume_a is not None:
            if assume_a not in _FROM_ASSUME_A:
                raise ValueError(f"Solve: assume_a must be one of {sorted(_FROM_ASSUME_A)}, "
                                 f"got {assume_a!r}")
            A_structure = _FROM_ASSUME_A[assume_a]
        if A_structure not in MATRIX_STRUCTURES:
            raise ValueError(f"Solve: A_structure must be one of {MATRIX_STRUCTURES}, got "
                             f"{A_structure!r}")
        self.A_structure, self.lower = A_structure, bool(lower)
        self.overwrite_A, self.overwrite_b = bool(overwrite_A), bool(overwrite_b)

    def __str__(self) -> str:
        return f"Solve{{{self.A_structure}}}"

    def _solve_one(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        sl = _scipy_linalg()
        if self.A_structure == "lower_triangular":
            return sl.solve_triangular(a, b, lower=True)
        if self.A_structure == "upper_triangular":
            return sl.solve_triangular(a, b, lower=False)
        if self.A_structure == "general" and np.isfinite(a).all() and np.isfinite(b).all():
            # LAPACK's gesv, as scipy.linalg.solve's general case, without its condition
            # estimate (gecon) and the Python layers around it: twice as fast at 256x256
            # (benchmarks/library_cpu.py). A singular A raises LinAlgError as SciPy's does
            # (one class); non-finite inputs take SciPy's path and its ValueError
            return np.linalg.solve(a, b)
        return sl.solve(a, b, assume_a=_ASSUME_A[self.A_structure], lower=self.lower)

    def L_op(self, inputs, outputs, output_grads):
        """Giles' rule (c = A^-1 b): b_bar = A^-T c_bar, A_bar = -b_bar c^T, on the triangle
        a triangular solve reads."""
        (A, b), (c,), (c_bar,) = inputs, outputs, output_grads
        trans = {"lower_triangular": "upper_triangular",
                 "upper_triangular": "lower_triangular"}
        structure = trans.get(self.A_structure, self.A_structure)
        b_bar = Solve(structure, not self.lower)(_mT(A), c_bar)
        A_bar = _solve_grad_a(b_bar, c, A)
        if self.A_structure == "lower_triangular":
            A_bar = tril(A_bar)
        elif self.A_structure == "upper_triangular":
            A_bar = triu(A_bar)
        return [A_bar, b_bar]


def solve(a: Any, b: Any, assume_a: str = "gen", lower: bool = False) -> TensorVariable:
    """x = a^-1 b (scipy.linalg.solve): `a` a square matrix (or a stack), `b` a vector or a
    matrix (per matrix of a). assume_a: 'gen', 'sym', 'her', 'pos' (SciPy's), or Theano's
    A_structure names ('general', 'symmetric', 'lower_triangular', 'upper_triangular', ...)."""
    if assume_a in MATRIX_STRUCTURES:
        return Solve(assume_a, lower)(a, b)
    return Solve(lower=lower, assume_a=assume_a)(a, b)


solve_lower_triangular = Solve(A_structure="lower_triangular", lower=True)
"""solve for a lower-triangular A (only its lower triangle is read)."""
solve_upper_triangular = Solve(A_structure="upper_triangular", lower=False)
"""solve for an upper-triangular A (only its upper triangle is read)."""
solve_symmetric = Solve(A_structure="symmetric")
"""solve for a symmetric A (scipy's assume_a='sym': its upper triangle is read)."""


class SolveTriangular(_SolveBase):
    """scipy.linalg.solve_triangular(A, b, trans, lower, unit_diagonal): x with op(A) x = b,
    op(A) = A (trans 0 / 'N') or A^T (trans 1 / 'T'), reading only the `lower` (or upper)
    triangle of A (and not its diagonal with unit_diagonal)."""

    __props__ = ("trans", "lower", "unit_diagonal")
    _what = "solve_triangular"

    def __init__(self, trans: Any = 0, lower: bool = False, unit_diagonal: bool = False):
        codes = {0: 0, 1: 1, "N": 0, "T": 1, "C": 1}
        if trans not in codes:
            raise ValueError(f"solve_triangular: trans must be 0, 1, 'N', 'T' or 'C', got "
                             f"{trans!r}")
        self.trans, self.lower, self.unit_diagonal = codes[trans], bool(lower), bool(unit_diagonal)

    def _solve_one(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _scipy_linalg().solve_triangular(a, b, trans=self.trans, lower=self.lower,
                                                unit_diagonal=self.unit_diagonal)

    def L_op(self, inputs, outputs, output_grads):
        (A, b), (c,), (c_bar,) = inputs, outputs, output_grads
        b_bar = SolveTriangular(1 - self.trans, self.lower, self.unit_diagonal)(A, c_bar)
        # op(A)_bar = -b_bar c^T; A_bar is it, transposed when op(A) = A^T
        A_bar = _solve_grad_a(b_bar, c, A) if self.trans == 0 else \
            _mT(_solve_grad_a(b_bar, c, A))
        A_bar = tril(A_bar, -1 if self.unit_diagonal else 0) if self.lower else \
            triu(A_bar, 1 if self.unit_diagonal else 0)
        return [A_bar, b_bar]


def solve_triangular(a: Any, b: Any, trans: Any = 0, lower: bool = False,
                     unit_diagonal: bool = False) -> TensorVariable:
    """scipy.linalg.solve_triangular(a, b, trans, lower, unit_diagonal)."""
    return SolveTriangular(trans, lower, unit_diagonal)(a, b)


class CholeskySolve(_SolveBase):
    """scipy.linalg.cho_solve((c, lower), b): x = A^-1 b where c is A's Cholesky factor
    (lower or upper)."""

    __props__ = ("lower",)
    _what = "cho_solve"

    def __init__(self, lower: bool = True):
        self.lower = bool(lower)

    def _solve_one(self, c: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _scipy_linalg().cho_solve((c, self.lower), b)

    def L_op(self, inputs, outputs, output_grads):
        # x = L^-T L^-1 b (lower): b_bar = A^-1 x_bar; with A = L L^T, A_bar = -b_bar x^T, so
        # L_bar = (A_bar + A_bar^T) L on the lower triangle (U = L^T for an upper factor)
        (c, b), (x,), (x_bar,) = inputs, outputs, output_grads
        b_bar = CholeskySolve(self.lower)(c, x_bar)
        a_bar = _solve_grad_a(b_bar, x, c)
        sym = a_bar + _mT(a_bar)
        if self.lower:
            return [tril(matmul(sym, c)), b_bar]
        return [triu(matmul(c, sym)), b_bar]


def cho_solve(c_and_lower: tuple, b: Any) -> TensorVariable:
    """scipy.linalg.cho_solve((c, lower), b): solve A x = b from A's Cholesky factor c."""
    c, lower = c_and_lower
    return CholeskySolve(lower)(c, b)


# ============================================================================ generalized eigenvalues

class Eigvalsh(Op):
    """scipy.linalg.eigvalsh(a, b, lower): the ascending eigenvalues of the symmetric matrix
    a, or of the generalized problem a v = w b v (b symmetric positive definite), read from
    the lower (or upper) triangles."""

    __props__ = ("lower",)

    def __init__(self, lower: bool = True):
        if lower not in (True, False):
            raise ValueError(f"Eigvalsh: lower must be True or False, got {lower!r}")
        self.lower = bool(lower)

    def make_node(self, a: Any, b: Any = None) -> Apply:
        a = _matrix_input(a, "eigvalsh", "a", batched=False)
        if b is None or (hasattr(b, "data") and b.data is None):
            return Apply(self, [a], [TensorType(a.dtype, (False,))()])
        b = _matrix_input(b, "eigvalsh", "b", batched=False)
        return Apply(self, [a, b], [TensorType(upcast(a.dtype, b.dtype), (False,))()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        _check_square("eigvalsh", inputs[0], "a")
        b = inputs[1] if len(inputs) == 2 else None
        if b is not None and b.shape != inputs[0].shape:
            raise ValueError(f"eigvalsh: a of shape {inputs[0].shape} and b of shape {b.shape} "
                             "differ")
        w = _scipy_linalg().eigh(inputs[0], b, lower=self.lower, eigvals_only=True)
        out[0][0] = _out(w, node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [(input_shapes[0][0],)]

    def grad(self, inputs, output_grads):
        grads = EigvalshGrad(self.lower)(*inputs, output_grads[0])
        return grads if isinstance(grads, list) else [grads]


class EigvalshGrad(Op):
    """The gradient of Eigvalsh: gA = V diag(gw) V^T and (with b) gB = -V diag(gw w) V^T, V the
    b-orthonormal eigenvectors, each folded onto the triangle eigvalsh reads."""

    __props__ = ("lower",)

    def __init__(self, lower: bool = True):
        self.lower = bool(lower)

    def make_node(self, *args: Any) -> Apply:
        if len(args) not in (2, 3):
            raise TypeError(f"EigvalshGrad takes (a, gw) or (a, b, gw), got {len(args)} inputs")
        ins = [as_tensor_variable(v) for v in args]
        if any(v.ndim != 2 for v in ins[:-1]) or ins[-1].ndim != 1:
            raise ValueError(f"EigvalshGrad: matrices and a vector expected, got "
                             f"{[str(v.type) for v in ins]}")
        dtype = upcast(*[v.dtype for v in ins])
        return Apply(self, ins, [TensorType(dtype, (False, False))() for _ in ins[:-1]])

    def _fold(self, g: np.ndarray) -> np.ndarray:
        if self.lower:
            return np.tril(g) + np.triu(g, 1).T
        return np.triu(g) + np.tril(g, -1).T

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        a, gw = inputs[0], inputs[-1]
        b = inputs[1] if len(inputs) == 3 else None
        w, v = _scipy_linalg().eigh(a, b, lower=self.lower)
        out[0][0] = _out(self._fold((v * gw) @ v.T), node.outputs[0])
        if b is not None:
            out[1][0] = _out(self._fold(-(v * (gw * w)) @ v.T), node.outputs[1])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(s) for s in input_shapes[:-1]]


def eigvalsh(a: Any, b: Any = None, lower: bool = True) -> TensorVariable:
    """scipy.linalg.eigvalsh(a, b, lower): eigenvalues of a symmetric matrix `a`, or of the
    generalized problem with a symmetric positive-definite `b`."""
    return Eigvalsh(lower)(a, b)


# ============================================================================ expm

class Expm(Op):
    """scipy.linalg.expm: the matrix exponential of a square matrix (or of each of a stack)."""

    __props__ = ()

    def make_node(self, A: Any) -> Apply:
        A = _matrix_input(A, "expm", "A")
        return Apply(self, [A], [A.type()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        (A,) = inputs
        _check_square("expm", A, "A")
        out[0][0] = _out(_batched(_scipy_linalg().expm, A, batch_ndim=A.ndim - 2),
                         node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        return [ExpmGrad()(inputs[0], output_grads[0])]


class ExpmGrad(Op):
    """The gradient of Expm: the adjoint of expm's Frechet derivative at A applied to gA,
    L(A^T, gA) (scipy.linalg.expm_frechet; Theano computed the same through an
    eigendecomposition, which this does not need)."""

    __props__ = ()

    def make_node(self, A: Any, gA: Any) -> Apply:
        A, gA = as_tensor_variable(A), as_tensor_variable(gA)
        if A.ndim < 2 or gA.ndim != A.ndim:
            raise ValueError(f"ExpmGrad: A ({A.type}) and gA ({gA.type}) must be matrices "
                             "(or stacks) of the same dimensions")
        return Apply(self, [A, gA], [TensorType(upcast(A.dtype, gA.dtype), A.broadcastable)()])

    @computes_half_in_float32
    def perform(self, node, inputs, out):
        A, gA = inputs
        sl = _scipy_linalg()

        def one(a, g):
            return sl.expm_frechet(a.T.astype("float64"), g.astype("float64"),
                                   compute_expm=False)
        out[0][0] = _out(_batched(one, A, gA, batch_ndim=A.ndim - 2), node.outputs[0])

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


expm = Expm()


# ============================================================================ kron

def kron(a: Any, b: Any) -> TensorVariable:
    """The Kronecker product, as Theano's slinalg.kron (old scipy.linalg.kron's layout): the
    result has a.ndim + b.ndim - 2 dimensions (flattened to a vector when that is 1); the
    dimensions must sum to 3 or more. For two matrices it is np.kron(a, b)."""
    a, b = as_tensor_variable(a), as_tensor_variable(b)
    if a.ndim + b.ndim <= 2:
        raise TypeError(f"kron: the inputs' dimensions must sum to 3 or more; got {a} "
                        f"({a.type}) and {b} ({b.type})")
    o = outer(flatten(a, 1), flatten(b, 1))
    o = reshape(o, concatenate([a.shape, b.shape]), a.ndim + b.ndim)
    if o.ndim == 3:
        return flatten(o.dimshuffle(1, 0, 2), 1)
    shf = o.dimshuffle(0, 2, 1, *range(3, o.ndim))
    dims = [shape_i(o, k) for k in range(o.ndim)]
    new_shape = [dims[0] * dims[2], dims[1] * dims[3]] + dims[4:]
    return reshape(shf, new_shape, o.ndim - 2)

