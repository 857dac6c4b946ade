"""Theano's ``theano.tensor.inplace``: each elementwise function as a version that overwrites
its first input (``exp_inplace(x)`` is an Elemwise whose output 0 destroys input 0).

Why: Theano's code and tests build these by name; here each is our Elemwise of the same
scalar op with the inplace pattern {0: 0}, so the destroy handler, rewrites and the GPU lifter
see the one Elemwise op they already know."""
from __future__ import annotations

from typing import Any, Callable

from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.math import _PROMOTING, as_operands
from symgpu.tensor.type import TensorVariable

#: Theano's name (before ``_inplace``) -> our scalar op's name, where they differ
_THEANO_NAMES = {"abs_": "abs", "inv": "reciprocal", "round_half_to_even": "round"}
#: Theano's inplace functions: its names, each one of our scalar ops
_NAMES = ("lt gt le ge eq neq and_ or_ xor invert abs_ exp exp2 expm1 neg inv log log1p log2 "
          "log10 sgn ceil floor round_half_to_even round_half_away_from_zero sqr sqrt deg2rad "
          "rad2deg cos arccos sin arcsin tan arctan arctan2 cosh arccosh sinh arcsinh tanh "
          "arctanh erf erfc gamma gammaln psi tri_gamma chi2sf second maximum minimum add sub "
          "mul true_div int_div mod pow trunc erfcx j0 j1 jv i0 i1 iv").split()


def _inplace(theano_name: str) -> Callable[..., TensorVariable]:
    op_name = _THEANO_NAMES.get(theano_name, theano_name)
    op = Elemwise(SCALAR_OPS[op_name], {0: 0})
    promote = _PROMOTING.get(op_name, False)

    def fn(*args: Any) -> TensorVariable:
        # the Elemwise refuses an output that input 0 cannot hold (dtype, broadcasting)
        return op(*as_operands(*args, promote=promote))

    fn.__name__ = fn.__qualname__ = f"{theano_name}_inplace"
    fn.__doc__ = f"{theano_name}(*inputs), written over its first input (Theano's inplace op)."
    return fn


__all__ = [f"{n}_inplace" for n in _NAMES]
globals().update({f"{n}_inplace": _inplace(n) for n in _NAMES})
