"""Batch normalisation with Theano's interface (`symgpu.tensor.nnet.bn`).

Built from mean/var reductions and elementwise ops rather than one opaque Op: the gradients
are the ordinary graph gradients, the elementwise tail fuses into one kernel, and the GPU
runs it with no extra code.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from symgpu.tensor import math as _m
from symgpu.tensor.shape import SpecifyBroadcastable, shape_i
from symgpu.tensor.type import TensorVariable, as_tensor_variable
from symgpu.tensor.shape import specify_broadcastable_as

__all__ = ["batch_normalization_train", "batch_normalization_test", "batch_normalization"]


def _prepare_axes(axes: Any, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if isinstance(axes, str):
        if axes == "per-activation":
            axes = (0,)
        elif axes == "spatial":
            axes = (0,) + tuple(range(2, ndim))
        else:
            raise ValueError(f"batch normalisation: axes must be 'per-activation', 'spatial' or "
                             f"a tuple of ints, got {axes!r}")
    elif isinstance(axes, (tuple, list, np.ndarray)):
        axes = tuple(int(a) for a in axes)
    else:
        raise ValueError(f"batch normalisation: axes must be 'per-activation', 'spatial' or a "
                         f"tuple of ints, got {axes!r}")
    axes = tuple(sorted(set(axes)))
    if not axes:
        raise ValueError("batch normalisation: there must be at least one normalisation axis")
    if min(axes) < 0 or max(axes) >= ndim:
        raise ValueError(f"batch normalisation: axes {axes} out of range for {ndim}-d inputs")
    return axes, tuple(i for i in range(ndim) if i not in axes)


def _params_layout(ndim: int, axes: Sequence[int], non_bc: Sequence[int], gamma: Any):
    """(params_ndim, to_full): params either have the inputs' ndim (length 1 on `axes`) or
    only the non-normalised axes, which `to_full` dimshuffles into place."""
    params_ndim = ndim if gamma.ndim == ndim else len(non_bc)
    if params_ndim == ndim:
        pattern = tuple(i in axes for i in range(ndim))

        def to_full(p: TensorVariable) -> TensorVariable:
            need = tuple(b and not pb for b, pb in zip(pattern, p.broadcastable))
            return SpecifyBroadcastable(need)(p) if any(need) else p
    else:
        shuffle: list[Any] = ["x"] * ndim
        for i, a in enumerate(non_bc):
            shuffle[a] = i

        def to_full(p: TensorVariable) -> TensorVariable:
            return p.dimshuffle(shuffle)
    return params_ndim, to_full


def _check_params(named: dict, params_ndim: int, ndim: int) -> None:
    for name, p in named.items():
        if p.ndim != params_ndim:
            raise ValueError(f"batch normalisation: {name} has {p.ndim} dimensions; the "
                             f"parameters must have the inputs' {ndim} dimensions or one per "
                             f"non-normalised axis ({params_ndim}), all alike (got {p.type})")


def _epsilon(epsilon: float, dtype: str) -> float:
    eps = float(np.asarray(epsilon, dtype=dtype))
    if eps < 1e-5:
        raise ValueError(f"batch normalisation: epsilon must be at least 1e-5 (as cuDNN "
                         f"requires), got {epsilon!r}")
    return eps


def batch_normalization_train(inputs: Any, gamma: Any, beta: Any, axes: Any = "per-activation",
                              epsilon: float = 1e-4, running_average_factor: float = 0.1,
                              running_mean: Any = None, running_var: Any = None) -> tuple:
    """Normalise `inputs` with the batch's own mean and variance over `axes`.

    Returns (out, mean, invstd), plus (new_running_mean, new_running_var) when both running
    values are given: running * (1 - factor) + batch * factor, where the variance term is the
    unbiased batch variance (m / (m - 1), m = the number of values averaged)."""
    x = as_tensor_variable(inputs)
    gamma, beta = as_tensor_variable(gamma), as_tensor_variable(beta)
    axes, non_bc = _prepare_axes(axes, x.ndim)
    params_ndim, to_full = _params_layout(x.ndim, axes, non_bc, gamma)
    named = {"gamma": gamma, "beta": beta}
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_normalization_train: running_mean and running_var must both "
                         "be given or both be None")
    if running_mean is not None:
        running_mean, running_var = as_tensor_variable(running_mean), as_tensor_variable(running_var)
        named.update(running_mean=running_mean, running_var=running_var)
    _check_params(named, params_ndim, x.ndim)
    eps = _epsilon(epsilon, x.dtype)
    mean = _m.mean(x, axis=axes, keepdims=True)
    var = _m.var(x, axis=axes, keepdims=True)
    invstd = _m.reciprocal(_m.sqrt(var + eps))
    out = (x - mean) * (to_full(gamma) * invstd) + to_full(beta)
    results = [out, mean, invstd]
    if running_mean is not None:
        f = running_average_factor
        m = _m.cast(functools.reduce(_m.mul, [shape_i(x, a) for a in axes]), var.dtype)
        rm, rv = to_full(running_mean), to_full(running_var)
        results.append(rm * (1 - f) + mean * f)
        results.append(rv * (1 - f) + (m / (m - 1)) * var * f)
    if params_ndim != x.ndim:
        results[1:] = [r.dimshuffle(non_bc) for r in results[1:]]
    else:
        ref = {3: running_mean, 4: running_var}
        results[1:] = [_keep_broadcastable(r, ref.get(i, gamma)) for i, r in
                       enumerate(results[1:], start=1)]
    return tuple(results)


def _keep_broadcastable(r: TensorVariable, like: TensorVariable) -> TensorVariable:
    """Theano's patternbroadcast: the result has the parameters' broadcastable pattern."""
    bc = tuple(a or b for a, b in zip(r.broadcastable, like.broadcastable))
    return specify_broadcastable_as(r, r.type.clone(broadcastable=bc))


def batch_normalization_test(inputs: Any, gamma: Any, beta: Any, mean: Any, var: Any,
                             axes: Any = "per-activation", epsilon: float = 1e-4) -> TensorVariable:
    """Normalise `inputs` with given statistics (usually the running averages):
    (inputs - mean) * gamma / sqrt(var + epsilon) + beta."""
    x = as_tensor_variable(inputs)
    gamma, beta = as_tensor_variable(gamma), as_tensor_variable(beta)
    mean, var = as_tensor_variable(mean), as_tensor_variable(var)
    axes, non_bc = _prepare_axes(axes, x.ndim)
    params_ndim, to_full = _params_layout(x.ndim, axes, non_bc, gamma)
    _check_params({"gamma": gamma, "beta": beta, "mean": mean, "var": var}, params_ndim, x.ndim)
    eps = _epsilon(epsilon, x.dtype)
    return ((x - to_full(mean)) * (to_full(gamma) / _m.sqrt(to_full(var) + eps))
            + to_full(beta))


def batch_normalization(inputs: Any, gamma: Any, beta: Any, mean: Any, std: Any,
                        mode: str = "low_mem") -> TensorVariable:
    """Theano's older helper: (inputs - mean) * (gamma / std) + beta, all broadcasting.
    `mode` is accepted for compatibility; fusion makes both of Theano's modes one kernel."""
    if mode not in ("low_mem", "high_mem"):
        raise ValueError(f"batch_normalization: mode must be 'low_mem' or 'high_mem', got {mode!r}")
    x, gamma, beta, mean, std = _m.as_operands(inputs, gamma, beta, mean, std)
    return (x - mean) * (gamma / std) + beta
