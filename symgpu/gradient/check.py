"""verify_grad: compare a graph's symbolic gradient with central finite differences."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import symgpu.tensor as T
from symgpu.compile.function import function
from symgpu.compile.sharedvalue import shared
from symgpu.gradient.core import grad
from symgpu.tensor.type import TensorType

__all__ = ["verify_grad", "numeric_grad", "GradientError"]


class GradientError(Exception):
    """The symbolic gradient disagrees with finite differences (see the message for where)."""

    def __init__(self, arg: int, err_pos: tuple, shape: tuple, val1: float, val2: float,
                 abs_err: float, rel_err: float, abs_tol: float, rel_tol: float,
                 detail: str = ""):
        super().__init__()
        self.arg, self.err_pos, self.shape = arg, err_pos, shape
        self.val1, self.val2 = val1, val2
        self.abs_err, self.rel_err = abs_err, rel_err
        self.abs_tol, self.rel_tol = abs_tol, rel_tol
        self.detail = detail

    def __str__(self) -> str:
        return (f"the symbolic gradient does not match finite differences\n"
                f"  worst element: input {self.arg} (shape {self.shape}), position {self.err_pos}\n"
                f"  analytic (symbolic) gradient: {self.val1!r}\n"
                f"  numeric (finite-difference) gradient: {self.val2!r}\n"
                f"  abs error {self.abs_err:.3g} (tolerance {self.abs_tol:.3g}), "
                f"rel error {self.rel_err:.3g} (tolerance {self.rel_tol:.3g})"
                + (f"\n  {self.detail}" if self.detail else ""))


_EPS = {"float64": 1e-7, "float32": 1e-3, "float16": 1e-1, "bfloat16": 1e-1}
_TOL = {"float64": 1e-4, "float32": 1e-2, "float16": 5e-2, "bfloat16": 1e-1}


def numeric_grad(f: Callable[..., Any], points: Sequence[np.ndarray],
                 eps: float | None = None) -> list[np.ndarray]:
    """Central finite differences of the scalar function `f(*points)` with respect to every
    element of every point (float64 results). The actual perturbation is measured after
    rounding to the point's dtype, so float32 steps are exact."""
    pts = [np.array(p, copy=True, order="C") for p in points]  # reshape(-1) must be a view
    out = []
    for k, p in enumerate(pts):
        step = eps if eps is not None else _EPS.get(p.dtype.name, 1e-7)
        g = np.zeros(p.shape, dtype="float64")
        flat, gflat = p.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            x0 = flat[i]
            flat[i] = x0 + step
            hi_x = float(flat[i])
            hi = float(np.asarray(f(*pts), dtype="float64"))
            flat[i] = x0 - step
            lo_x = float(flat[i])
            lo = float(np.asarray(f(*pts), dtype="float64"))
            flat[i] = x0
            gflat[i] = (hi - lo) / (hi_x - lo_x)
        out.append(g)
    return out


def _projection(rng: Any, shape: tuple, dtype: str) -> np.ndarray:
    # elements in [0.5, 1.5): not too small, so little precision is lost in the sum
    r = rng.random(shape) if hasattr(rng, "random") and not hasattr(rng, "rand") else rng.rand(*shape)
    return np.asarray(np.asarray(r) + 0.5, dtype=dtype)


def verify_grad(fun: Callable[..., Any], points: Sequence[Any], n_tests: int = 2, rng: Any = None,
                eps: float | None = None, abs_tol: float | None = None,
                rel_tol: float | None = None, mode: Any = None,
                cast_to_output_type: bool = False) -> None:
    """Check `grad` of `sum(fun(*inputs) * r)` (r a random projection, redrawn each test)
    against central finite differences at `points`; raise GradientError on a mismatch.

    `fun` receives one symbolic input per point (same dtype and ndim, no broadcastable dims)
    and returns a variable (or a list: each gets its own projection). Tolerances follow the
    least precise dtype involved (float64: eps 1e-7, tol 1e-4; float32: eps 1e-3, tol 1e-2;
    float16: eps 1e-1, tol 5e-2; bfloat16: eps 1e-1, tol 1e-1);
    an element fails only if both its absolute and its relative error exceed them.
    """
    pts = [np.array(p) for p in points]
    for i, p in enumerate(pts):
        if p.dtype.name not in _EPS:
            raise TypeError(f"verify_grad works with floating-point inputs only; point {i} has "
                            f"dtype {p.dtype.name}")
    if rng is None:
        rng = np.random.default_rng(20240607)
    elif isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(int(rng))
    inputs = [TensorType(p.dtype.name, (False,) * p.ndim)(f"input {i}") for i, p in enumerate(pts)]
    outs = fun(*inputs)
    outs = [T.as_tensor_variable(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
    dtypes = [p.dtype.name for p in pts] + [o.dtype for o in outs if o.dtype in _TOL]
    abs_tol = abs_tol if abs_tol is not None else max(_TOL[d] for d in dtypes)
    rel_tol = rel_tol if rel_tol is not None else max(_TOL[d] for d in dtypes)
    # a float32 output of float64 inputs cannot see a 1e-7 step: use the coarsest dtype's eps
    eps = eps if eps is not None else max(_EPS[d] for d in dtypes)
    values = function(inputs, outs, mode=mode, on_unused_input="ignore")(*[p.copy() for p in pts])
    proj_dtypes = [o.dtype if cast_to_output_type and o.dtype in _TOL else "float64" for o in outs]
    projections = [shared(_projection(rng, np.shape(v), d), name=f"random_projection_{k}")
                   for k, (v, d) in enumerate(zip(values, proj_dtypes))]
    terms = [(r * o).sum() for r, o in zip(projections, outs)]
    cost = terms[0] if len(terms) == 1 else T.add(*terms)
    cost_fn = function(inputs, cost, mode=mode, on_unused_input="ignore", name="verify_grad cost")
    sym = grad(cost, inputs, disconnected_inputs="ignore")
    grad_fn = function(inputs, sym, mode=mode, on_unused_input="ignore", name="verify_grad grad")
    for test in range(n_tests):
        analytic = grad_fn(*[p.copy() for p in pts])
        numeric = numeric_grad(cost_fn, pts, eps)
        worst = None
        for k, (a, nmr) in enumerate(zip(analytic, numeric)):
            a = np.asarray(a)
            if a.shape != nmr.shape:
                raise GradientError(k, (), nmr.shape, float("nan"), float("nan"), float("inf"),
                                    float("inf"), abs_tol, rel_tol,
                                    f"the symbolic gradient has shape {a.shape}, the input "
                                    f"has shape {nmr.shape}")
            a64 = a.astype("float64")
            abs_err = np.abs(a64 - nmr)
            denom = np.abs(a64) + np.abs(nmr)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel_err = np.where(denom > 0, abs_err / np.where(denom > 0, denom, 1), 0.0)
            abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
            rel_err = np.where(np.isnan(rel_err), np.inf, rel_err)
            bad = (abs_err > abs_tol) & (rel_err > rel_tol)
            if bad.any():
                score = np.where(bad, np.minimum(abs_err / abs_tol, rel_err / rel_tol), -1.0)
                pos = np.unravel_index(int(np.argmax(score)), a.shape) if a.ndim else ()
                cand = (float(score[pos]), k, tuple(int(i) for i in pos), a.shape,
                        float(a64[pos]), float(nmr[pos]), float(abs_err[pos]),
                        float(rel_err[pos]))
                if worst is None or cand[0] > worst[0]:
                    worst = cand
        if worst is not None:
            _, k, pos, shape, v1, v2, ae, re_ = worst
            raise GradientError(k, pos, shape, v1, v2, ae, re_, abs_tol, rel_tol,
                                f"test {test + 1} of {n_tests}; input dtypes "
                                f"{[p.dtype.name for p in pts]}")
        if test < n_tests - 1:
            for r, v, d in zip(projections, values, proj_dtypes):
                r.set_value(_projection(rng, np.shape(v), d), borrow=True)


verify_grad.E_grad = GradientError  # Theano's spelling
