"""Mixed precision as users ask for it: the policy and dynamic loss scaling.

The policy is a compile-time rewrite (symgpu/tensor/rewriting/mixed_precision.py): with the
`mixed_precision` flag set to bfloat16 or float16 -- for the process, in a `with
autocast('bfloat16'):` block around `function()`, or for one function with
`mode=Mode().including('mixed_bfloat16')` -- every float32 matrix product and convolution of
the compiled graph (its gradients included: the pass sees the whole training step) reads
half operands, and everything else (reductions, losses, updates, the float32 shared variables
that hold the master weights) stays float32. The user writes the float32 program.

float16's range is narrow (6e-8 .. 65504): small gradients underflow to zero in the half
backward products. `DynamicLossScale` (PyTorch's GradScaler, as graph updates) multiplies the
loss by a scale, divides the gradients by it, checks on the device that all are finite, and
makes every update conditional on that check; the scale halves on an overflowing step (whose
updates are skipped) and doubles after `growth_interval` good steps. The scale and the
good-step count are float32 shared variables (on the GPU under device=cuda) updated by the
same call, so no value is read back to the host per step. bfloat16 has float32's range and
needs no loss scaling.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.compile.sharedvalue import shared
from symgpu.config import config
from symgpu.gradient import grad
from symgpu.graph.basic import Variable
import symgpu.tensor as T

__all__ = ["autocast", "DynamicLossScale", "loss_scaled_updates", "all_finite"]

#: update_rule(params, grads) -> the updates: (shared variable, new value) pairs or a dict
UpdateRule = Callable[[list, list], Any]


def autocast(dtype: str = "bfloat16", enabled: bool = True):
    """Functions compiled inside the block (`with autocast('bfloat16'): f = function(...)`)
    run their float32 products in `dtype` ('bfloat16' or 'float16'). Unlike torch.autocast
    it acts when `function()` compiles, not when the graph is built, so it must enclose the
    `function()` call; also usable as a decorator. `enabled=False` compiles in float32."""
    if enabled and dtype not in ("bfloat16", "float16"):
        raise ValueError(f"autocast: dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    return config.change_flags(mixed_precision=dtype if enabled else "off")


def all_finite(values: Sequence[Variable]) -> Variable:
    """A 0-d bool, true where every element of every one of `values` is finite: one sum per
    value, their total tested once (an inf or NaN anywhere makes the total inf or NaN), so the
    check is computed where the values are, on the device under device=cuda."""
    if not values:
        raise ValueError("all_finite needs at least one value")
    total = None
    for v in values:
        s = T.sum(T.cast(v, "float32") if v.dtype in ("float16", "bfloat16") else v)
        total = s if total is None else total + s
    return T.invert(T.or_(T.isnan(total), T.isinf(total)))


def _pairs(updates: Any, who: str) -> list[tuple[Variable, Variable]]:
    items = list(updates.items()) if isinstance(updates, dict) else list(updates)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"{who}: update_rule must return (shared variable, new value) "
                            f"pairs or a dict, got {item!r}")
    return items


class DynamicLossScale:
    """PyTorch's GradScaler as graph updates: `updates(cost, params, update_rule)` returns the
    step's updates with the loss scaled, the gradients unscaled, every update taken only when
    all gradients are finite, and the scale's own updates (halved on an overflow, grown by
    `growth_factor` after `growth_interval` good steps in a row while the grown scale stays
    finite). `scale` and `good_steps` are float32 shared variables: read them with
    `get_value()`, outside the training loop's hot path."""

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"DynamicLossScale: init_scale must be a positive finite number, "
                             f"got {init_scale!r}")
        if not growth_factor > 1:
            raise ValueError(f"DynamicLossScale: growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"DynamicLossScale: backoff_factor must be in (0, 1), got "
                             f"{backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) \
                or growth_interval < 1:
            raise ValueError(f"DynamicLossScale: growth_interval must be an int >= 1, got "
                             f"{growth_interval!r}")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.enabled = growth_interval, bool(enabled)
        #: the current scale (float32 0-d; on the GPU under device=cuda)
        self.scale = shared(np.asarray(init_scale, dtype="float32"), name="loss_scale")
        #: good steps since the last change of scale (float32: exact up to 2**24)
        self.good_steps = shared(np.asarray(0, dtype="float32"), name="loss_scale_good_steps")
        #: the last `updates` call's finiteness check (a 0-d bool variable)
        self.grads_finite: Variable | None = None

    def scaled_loss(self, cost: Variable) -> Variable:
        """`cost * scale` (the loss the gradients are taken of)."""
        return cost * T.cast(self.scale, cost.dtype)

    def unscaled_grads(self, cost: Variable, params: Sequence[Variable]) -> list[Variable]:
        """The gradients of `cost` w.r.t. `params`, taken of the scaled loss and divided back."""
        grads = grad(self.scaled_loss(cost), list(params))
        return [g / T.cast(self.scale, g.dtype) for g in grads]

    def updates(self, cost: Variable, params: Sequence[Variable],
                update_rule: UpdateRule) -> list[tuple[Variable, Variable]]:
        """The training step's updates: `update_rule(params, grads)`'s, each one
        `switch(finite, new, old)`, then the scale's and the good-step count's."""
        params = list(params)
        if not self.enabled:
            return _pairs(update_rule(params, grad(cost, params)), "DynamicLossScale")
        grads = self.unscaled_grads(cost, params)
        finite = all_finite(grads)
        self.grads_finite = finite
        guarded = [(var, T.switch(finite, new, var))
                   for var, new in _pairs(update_rule(params, grads), "DynamicLossScale")]
        for var, _ in guarded:
            if var is self.scale or var is self.good_steps:
                raise ValueError("DynamicLossScale: update_rule updates the scaler's own state")
        return guarded + self._scale_updates(finite)

    def _scale_updates(self, finite: Variable) -> list[tuple[Variable, Variable]]:
        scale, good = self.scale, self.good_steps
        one = np.float32(1)
        counted = good + one
        grown = scale * np.float32(self.growth_factor)
        grow = T.and_(T.ge(counted, np.float32(self.growth_interval)),
                      T.invert(T.isinf(grown)))
        new_scale = T.switch(finite, T.switch(grow, grown, scale),
                             scale * np.float32(self.backoff_factor))
        new_good = T.switch(T.and_(finite, T.invert(grow)), counted, np.float32(0))
        return [(scale, new_scale), (good, new_good)]


def loss_scaled_updates(cost: Variable, params: Sequence[Variable], update_rule: UpdateRule,
                        init_scale: float = 2.0 ** 15, growth_factor: float = 2.0,
                        backoff_factor: float = 0.5, growth_interval: int = 2000,
                        enabled: bool = True) -> tuple[list, DynamicLossScale]:
    """`(updates, scaler)`: a new DynamicLossScale's updates of one training step
    (`function(inputs, cost, updates=updates)`); `scaler.scale.get_value()` reads the scale."""
    scaler = DynamicLossScale(init_scale, growth_factor, backoff_factor, growth_interval,
                              enabled)
    return scaler.updates(cost, params, update_rule), scaler
