"""The scalar-op table: one row per elementwise operation.

Each row says, in one place, everything the compiler needs to know about a scalar function:
its NumPy implementation (CPU thunks), its CUDA C expression (GPU kernels and fusion), its
gradient (autodiff) and its output-dtype rule. Elemwise, Composite, the GPU code generator,
the gradient and the printer all read this table; adding an op is adding a row.

Gradient rules receive `T` (the tensor namespace, so this layer needs no tensor import), the
input variables, the output variable and the output gradient, and return one gradient (or
None: no gradient flows, e.g. through comparisons) per input.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from symgpu.scalar.dtypes import (C_TYPES, FLOAT_DTYPES, HALF_DTYPES, in_value_dtype, is_bool,
                                  is_float, is_int, upcast, upgrade_to_float)

__all__ = ["ScalarOp", "Cast", "SCALAR_OPS", "get_scalar_op", "cuda_expression"]


# ----------------------------------------------------------------------------- dtype rules

def _upcast(*d: str) -> str:
    return upcast(*d)


def _float(*d: str) -> str:
    return upgrade_to_float(upcast(*d))


def _bool(*d: str) -> str:
    return "bool"


def _int_or_bool(*d: str) -> str:
    out = upcast(*d)
    if not (is_int(out) or is_bool(out)):
        raise TypeError(f"bitwise operations need integer or bool inputs, got {', '.join(d)}")
    return out


def _switch(cond: str, a: str, b: str) -> str:
    return upcast(a, b)


def _int_div(*d: str) -> str:
    out = upcast(*d)
    return "int8" if out == "bool" else out


def _true_div(*d: str) -> str:
    # NumPy: integers and bools divide in float64, whatever their width (int8/int8 -> float64)
    out = upcast(*d)
    return out if is_float(out) or out.startswith("complex") else "float64"


def _numeric(*d: str) -> str:
    # NumPy refuses `-` and sign on booleans; say so when the graph is built, not at run time
    out = upcast(*d)
    if is_bool(out):
        raise TypeError("boolean subtract/negative/sign are not supported (as in NumPy); use "
                        "xor (^) or invert (~), or cast to an integer dtype first")
    return out


def _real_out(d: str) -> str:
    # Theano's real_out: a complex dtype's component dtype; any other dtype as it is
    return {"complex64": "float32", "complex128": "float64"}.get(d, d)


DTYPE_RULES: dict[str, Callable[..., str]] = {
    "upcast": _upcast, "float": _float, "bool": _bool, "int_or_bool": _int_or_bool,
    "switch": _switch, "int_div": _int_div, "second": lambda a, b: b,
    "true_div": _true_div, "numeric": _numeric, "real_out": _real_out,
    "float64": lambda *d: "float64",
}


# ----------------------------------------------------------------------------- numpy helpers

def _special():
    """scipy.special, imported on first use: it costs about 0.2 s of `import symgpu`, and
    only the sigmoid and erf rows need it (on the host)."""
    import scipy.special  # not a symgpu module: loads on first use to keep start-up short
    return scipy.special


def _sigmoid(x):
    return _special().expit(x)


def _erf(x):
    return _special().erf(x)


def _special_row(name):
    """The NumPy form of a row that is scipy.special's ufunc `name` (loaded on first call)."""
    def impl(*args):
        return getattr(_special(), name)(*args)
    impl.__name__ = name
    return impl


def _tri_gamma(x):
    # scipy's polygamma computes in float64: keep the input's float dtype
    x = np.asarray(x)
    out = _special().polygamma(1, x)
    return out.astype(x.dtype) if is_float(x.dtype.name) else out


def _angle(x):
    # the row's dtype is float64 (Theano's): compute in it, or a float16 angle of -1 would be
    # float16's pi, 3.140625
    x = np.asarray(x)
    return np.angle(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))


def _chi2sf(x, k):
    # scipy.stats.chi2.sf(x, k) is scipy.special.chdtrc(k, x), without importing scipy.stats
    return _special().chdtrc(k, x)


def _softplus(x):
    # log(1+exp(x)) without overflow, the identity log1p(exp(-|x|)) + max(x, 0)
    return np.logaddexp(np.zeros((), dtype=np.asarray(x).dtype), x)


def _xlogy0(x, y):
    # Theano's xlogy0: x * log(y), 0 wherever x == 0 (whatever y is: 0 * log(0) counts as 0)
    x, y = np.asarray(x), np.asarray(y)
    dtype = np.result_type(x, y)
    with np.errstate(divide="ignore", invalid="ignore"):   # half: in float32, one rounding
        prod = in_value_dtype(x) * np.log(in_value_dtype(y))
    if dtype.name in HALF_DTYPES:
        prod = prod.astype(dtype)
    return np.where(x == 0, np.zeros((), dtype=prod.dtype), prod)


def _xlogx(x):
    return _xlogy0(x, x)


def _round_half_even(x):
    return np.round(x)


def _round_half_away(x):
    # C's round(): x - trunc(x) is exact, so halves are found without the error that
    # floor(x + 0.5) makes at 0.49999999999999994
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        return x
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):  # inf - inf
        return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t).astype(x.dtype)


def _sqr(x):
    return np.multiply(x, x)


def _int_div_np(a, b):
    return np.floor_divide(a, b)


def _switch_np(c, a, b):
    return np.where(c, a, b)


def _true_div(a, b):
    return np.true_divide(a, b)


# ----------------------------------------------------------------------------- gradients
# g(T, inputs, output, gz) -> list of gradients, one per input (None: no gradient).

def _g_add(T, ins, out, gz):
    return [gz for _ in ins]


def _g_sub(T, ins, out, gz):
    return [gz, -gz]


def _g_mul(T, ins, out, gz):
    grads = []
    for i in range(len(ins)):
        others = [x for j, x in enumerate(ins) if j != i]
        prod = others[0]
        for o in others[1:]:
            prod = prod * o
        grads.append(gz * prod)
    return grads


def _g_true_div(T, ins, out, gz):
    a, b = ins
    return [gz / b, -gz * a / (b * b)]


def _g_pow(T, ins, out, gz):
    a, b = ins
    ga = gz * b * a ** (b - 1)
    gb = gz * out * T.log(T.switch(T.eq(a, 0), T.ones_like(a), a))
    return [ga, gb]


def _g_maximum(T, ins, out, gz):
    # the same masks as eq(out, a) and (1 - eq(out, a)) * eq(out, b) (a tie goes to a, a NaN
    # to neither), without reading the output: a ReLU's backward pass reads z, not max(z, 0)
    a, b = ins
    return [gz * T.ge(a, b), gz * T.lt(a, b)]


def _g_minimum(T, ins, out, gz):
    a, b = ins
    return [gz * T.le(a, b), gz * T.gt(a, b)]


def _g_switch(T, ins, out, gz):
    c, a, b = ins
    zero = T.zeros_like(gz)
    return [None, T.switch(c, gz, zero), T.switch(c, zero, gz)]


def _g_clip(T, ins, out, gz):
    x, lo, hi = ins
    inside = T.and_(T.ge(x, lo), T.le(x, hi))
    return [gz * inside, gz * T.lt(x, lo), gz * T.gt(x, hi)]


def _g_arctan2(T, ins, out, gz):
    y, x = ins
    r2 = x * x + y * y
    return [gz * x / r2, -gz * y / r2]


def _unary(rule):
    def g(T, ins, out, gz):
        return [rule(T, ins[0], out, gz)]
    return g


def _g_not_implemented(what):
    def g(T, ins, out, gz):
        raise NotImplementedError(f"the gradient of {what} is not implemented (as in Theano)")
    return g


_SQRT_PI_2 = float(np.sqrt(np.pi) / 2)
_TWO_SQRT_PI = float(2 / np.sqrt(np.pi))


def _not_float_zeros(T, x):
    """Theano's gradient for an integer input of real/imag/angle: zeros of floatX."""
    return T.zeros_like(x, dtype=T.config.floatX)


def _g_real(T, x, out, gz):
    # complex inputs are not reached: T.grad treats complex values as constants (see
    # docs/from_theano.md); an integer input gets Theano's floatX zeros
    return gz if is_float(x.dtype) else _not_float_zeros(T, x)


def _g_imag(T, x, out, gz):
    # the imaginary part of a real x is constant 0
    return T.zeros_like(x) if is_float(x.dtype) else _not_float_zeros(T, x)


def _g_angle(T, x, out, gz):
    # the angle of a real x is piecewise constant (0 or pi)
    return T.zeros_like(x) if is_float(x.dtype) else _not_float_zeros(T, x)


def _no_grad(T, ins, out, gz):
    return [None for _ in ins]


def _zero_grad(T, ins, out, gz):
    return [T.zeros_like(x) for x in ins]


# ----------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class ScalarOpSpec:
    """One row of the table. `cuda` formats with {0},{1},.. for operands and {f} for the
    float-suffix of the compute type ('f' for float, '' for double); an entry may also be
    a dict keyed by 'float'/'int'/'bool' when the expression differs by kind."""
    name: str
    nin: int
    numpy: Callable
    cuda: Any
    grad: Callable
    dtype_rule: str = "upcast"
    commutative: bool = False
    associative: bool = False
    symbol: str | None = None  # infix spelling for pp
    # `cuda` None: the row has no CUDA form and its nodes stay on the host (psi, chi2sf);
    # cuda_only: the CPU C kernels (scalar/ccode.py) leave the row to NumPy: its CUDA form
    # calls functions C's libm lacks (erfinv), or libm's differs from scipy.special by more
    # than a few ulp (erfc's far tail, gamma)
    cuda_only: bool = False


# Float // and % on the GPU follow NumPy's npy_divmod (fmod, then Python's sign convention, then
# snapping the quotient to an integer): floor(a / b) gives 1.0 // 0.1 == 10 where NumPy (and
# Python) give 9, and a - floor(a/b)*b gives nan for 7 % inf where NumPy gives 7.
_FMOD = "fmod{f}(({0}), ({1}))"
_FMOD_ADJUST = f"({_FMOD} != 0 && ((({{1}}) < 0) != ({_FMOD} < 0)))"
_FDIV_RAW = f"((({{0}}) - {_FMOD}) / ({{1}}) - ({_FMOD_ADJUST} ? 1 : 0))"
_CUDA_FLOAT_FLOORDIV = (
    f"(({{1}}) == 0 ? ({{0}}) / ({{1}}) : ({_FDIV_RAW} == 0 ? copysign{{f}}(0.0{{f}}, ({{0}}) / ({{1}})) : "
    f"floor{{f}}({_FDIV_RAW}) + (({_FDIV_RAW} - floor{{f}}({_FDIV_RAW})) > 0.5{{f}} ? 1 : 0)))")
_CUDA_FLOAT_MOD = (f"({_FMOD} != 0 ? ({_FMOD_ADJUST} ? {_FMOD} + ({{1}}) : {_FMOD}) : "
                   f"copysign{{f}}(0.0{{f}}, ({{1}})))")

# clip is NumPy's minimum(maximum(x, lo), hi): a nan in x or in either bound gives nan
_FLOAT_MAX = "((({0}) > ({1}) || isnan({0})) ? ({0}) : ({1}))"
_FLOAT_CLIP = f"((({_FLOAT_MAX}) < ({{2}}) || isnan({_FLOAT_MAX})) ? ({_FLOAT_MAX}) : ({{2}}))"

_F = "float"
SCALAR_TABLE: list[ScalarOpSpec] = [
    # arithmetic
    ScalarOpSpec("add", -1, np.add, "({0} + {1})", _g_add, "upcast", True, True, "+"),
    ScalarOpSpec("sub", 2, np.subtract, "({0} - {1})", _g_sub, "numeric", symbol="-"),
    ScalarOpSpec("mul", -1, np.multiply, "({0} * {1})", _g_mul, "upcast", True, True, "*"),
    ScalarOpSpec("true_div", 2, _true_div, "({0} / {1})", _g_true_div, "true_div", symbol="/"),
    ScalarOpSpec("int_div", 2, _int_div_np,
                 {"float": _CUDA_FLOAT_FLOORDIV,
                  "int": "(({1}) == 0 ? 0 : (({0}) / ({1}) - ((({0}) % ({1}) != 0) && ((({0}) < 0) != (({1}) < 0)))))"},
                 _no_grad, "int_div", symbol="//"),
    ScalarOpSpec("mod", 2, np.mod,
                 {"float": _CUDA_FLOAT_MOD,
                  "int": "(({1}) == 0 ? 0 : (((({0}) % ({1})) + ({1})) % ({1})))"},
                 lambda T, ins, out, gz: [gz, -gz * T.floor_div(ins[0], ins[1])], "int_div",
                 symbol="%"),
    # integer powers in double, rounded to the nearest integer: powf loses results above
    # 2**24 (7**9 gave 40353608), and CUDA's pow is not exact (3**1 truncated to 2)
    ScalarOpSpec("pow", 2, np.power, {"float": "pow{f}({0}, {1})",
                                      "int": "rint(pow((double)({0}), (double)({1})))"},
                 _g_pow, "int_div", symbol="**"),
    ScalarOpSpec("maximum", 2, np.maximum, {"float": _FLOAT_MAX,
                                            "int": "max({0}, {1})",
                                            "bool": "({0} || {1})"},
                 _g_maximum, "upcast", True, True),
    ScalarOpSpec("minimum", 2, np.minimum, {"float": "((({0}) < ({1}) || isnan({0})) ? ({0}) : ({1}))",
                                            "int": "min({0}, {1})",
                                            "bool": "({0} && {1})"},
                 _g_minimum, "upcast", True, True),
    ScalarOpSpec("neg", 1, np.negative, "(-{0})", _unary(lambda T, x, o, gz: -gz), "numeric",
                 symbol="-"),
    ScalarOpSpec("abs", 1, np.abs, {"float": "fabs{f}({0})", "int": "(({0}) < 0 ? -({0}) : ({0}))",
                                    "bool": "{0}"},
                 _unary(lambda T, x, o, gz: gz * T.sgn(x))),
    ScalarOpSpec("sgn", 1, np.sign, {"float": "(isnan({0}) ? ({0}) : (({0}) > 0 ? 1 : (({0}) < 0 ? -1 : 0)))",
                                     "int": "(({0}) > 0 ? 1 : (({0}) < 0 ? -1 : 0))"}, _zero_grad,
                 "numeric"),
    ScalarOpSpec("sqr", 1, _sqr, "(({0}) * ({0}))", _unary(lambda T, x, o, gz: gz * 2 * x)),
    ScalarOpSpec("reciprocal", 1, np.reciprocal, "(1 / {0})",
                 _unary(lambda T, x, o, gz: -gz * o * o), "float"),
    ScalarOpSpec("second", 2, lambda a, b: b, "{1}", lambda T, ins, out, gz: [None, gz], "second"),
    ScalarOpSpec("identity", 1, lambda x: x, "{0}", _unary(lambda T, x, o, gz: gz)),
    # complex parts (Theano's real/imag/angle): host only (no complex dtypes on the GPU or in
    # the CPU C kernels); for a real x: x, 0 and 0 or pi (as NumPy)
    ScalarOpSpec("real", 1, np.real, None, _unary(_g_real), "real_out"),
    ScalarOpSpec("imag", 1, np.imag, None, _unary(_g_imag), "real_out"),
    ScalarOpSpec("angle", 1, _angle, None, _unary(_g_angle), "float64"),
    # exponentials and logarithms
    ScalarOpSpec("exp", 1, np.exp, "exp{f}({0})", _unary(lambda T, x, o, gz: gz * o), "float"),
    ScalarOpSpec("exp2", 1, np.exp2, "exp2{f}({0})",
                 _unary(lambda T, x, o, gz: gz * o * float(np.log(2.0))), "float"),
    ScalarOpSpec("expm1", 1, np.expm1, "expm1{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (o + 1)), "float"),
    ScalarOpSpec("log", 1, np.log, "log{f}({0})", _unary(lambda T, x, o, gz: gz / x), "float"),
    ScalarOpSpec("log2", 1, np.log2, "log2{f}({0})",
                 _unary(lambda T, x, o, gz: gz / (x * float(np.log(2.0)))), "float"),
    ScalarOpSpec("log10", 1, np.log10, "log10{f}({0})",
                 _unary(lambda T, x, o, gz: gz / (x * float(np.log(10.0)))), "float"),
    ScalarOpSpec("log1p", 1, np.log1p, "log1p{f}({0})",
                 _unary(lambda T, x, o, gz: gz / (1 + x)), "float"),
    ScalarOpSpec("sqrt", 1, np.sqrt, "sqrt{f}({0})",
                 _unary(lambda T, x, o, gz: gz * 0.5 / o), "float"),
    ScalarOpSpec("sigmoid", 1, _sigmoid, "(1 / (1 + exp{f}(-({0}))))",
                 _unary(lambda T, x, o, gz: gz * o * (1 - o)), "float"),
    ScalarOpSpec("softplus", 1, _softplus,
                 "(({0}) > 0 ? ({0}) + log1p{f}(exp{f}(-({0}))) : log1p{f}(exp{f}({0})))",
                 _unary(lambda T, x, o, gz: gz * T.sigmoid(x)), "float"),
    # trigonometric and hyperbolic
    ScalarOpSpec("sin", 1, np.sin, "sin{f}({0})", _unary(lambda T, x, o, gz: gz * T.cos(x)), "float"),
    ScalarOpSpec("cos", 1, np.cos, "cos{f}({0})", _unary(lambda T, x, o, gz: -gz * T.sin(x)), "float"),
    ScalarOpSpec("tan", 1, np.tan, "tan{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (1 + o * o)), "float"),
    ScalarOpSpec("arctan", 1, np.arctan, "atan{f}({0})",
                 _unary(lambda T, x, o, gz: gz / (1 + x * x)), "float"),
    ScalarOpSpec("tanh", 1, np.tanh, "tanh{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (1 - o * o)), "float"),
    ScalarOpSpec("sinh", 1, np.sinh, "sinh{f}({0})", _unary(lambda T, x, o, gz: gz * T.cosh(x)), "float"),
    ScalarOpSpec("cosh", 1, np.cosh, "cosh{f}({0})", _unary(lambda T, x, o, gz: gz * T.sinh(x)), "float"),
    ScalarOpSpec("erf", 1, _erf, "erf{f}({0})",
                 _unary(lambda T, x, o, gz: gz * float(2 / np.sqrt(np.pi)) * T.exp(-x * x)), "float"),
    # special functions (scipy.special on the host, loaded on first use; Theano's gradients)
    ScalarOpSpec("erfc", 1, _special_row("erfc"), "erfc{f}({0})",
                 _unary(lambda T, x, o, gz: -gz * _TWO_SQRT_PI * T.exp(-x * x)), "float",
                 cuda_only=True),
    ScalarOpSpec("erfinv", 1, _special_row("erfinv"), "erfinv{f}({0})",
                 _unary(lambda T, x, o, gz: gz * _SQRT_PI_2 * T.exp(o * o)), "float",
                 cuda_only=True),
    ScalarOpSpec("erfcinv", 1, _special_row("erfcinv"), "erfcinv{f}({0})",
                 _unary(lambda T, x, o, gz: -gz * _SQRT_PI_2 * T.exp(o * o)), "float",
                 cuda_only=True),
    ScalarOpSpec("gamma", 1, _special_row("gamma"), "tgamma{f}({0})",
                 _unary(lambda T, x, o, gz: gz * o * T.psi(x)), "float",
                 cuda_only=True),
    ScalarOpSpec("gammaln", 1, _special_row("gammaln"),
                 # scipy's gammaln(-inf) is -inf, libm's lgamma(-inf) +inf
                 "((isinf({0}) && ({0}) < 0) ? ({0}) : lgamma{f}({0}))",
                 _unary(lambda T, x, o, gz: gz * T.psi(x)), "float",
                 cuda_only=True),
    ScalarOpSpec("psi", 1, _special_row("psi"), None,
                 _unary(lambda T, x, o, gz: gz * T.tri_gamma(x)), "float"),
    ScalarOpSpec("tri_gamma", 1, _tri_gamma, None, _g_not_implemented("tri_gamma"), "float"),
    ScalarOpSpec("chi2sf", 2, _chi2sf, None, _g_not_implemented("chi2sf"), "float"),
    # Theano's tensor.xlogx: x log x and x log y with 0 log 0 = 0 (entropies, cross-entropies
    # of binary units); Theano's gradients, which are -inf at 0 as log is
    ScalarOpSpec("xlogx", 1, _xlogx, "((({0}) == 0) ? 0 : ({0}) * log{f}({0}))",
                 _unary(lambda T, x, o, gz: gz * (1 + T.log(x))), "float"),
    ScalarOpSpec("xlogy0", 2, _xlogy0, "((({0}) == 0) ? 0 : ({0}) * log{f}({1}))",
                 lambda T, ins, o, gz: [gz * T.log(ins[1]), gz * ins[0] / ins[1]], "float"),
    # Bessel functions and erfcx (scipy.special on the host, CUDA's math library on the GPU;
    # Theano's gradients). jv and iv take the order first; the order is a constant to the
    # gradient (as in Theano, where its gradient is not implemented)
    ScalarOpSpec("erfcx", 1, _special_row("erfcx"), "erfcx{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (2 * x * o - _TWO_SQRT_PI)), "float",
                 cuda_only=True),
    ScalarOpSpec("j0", 1, _special_row("j0"), "j0{f}({0})",
                 _unary(lambda T, x, o, gz: -gz * T.j1(x)), "float", cuda_only=True),
    ScalarOpSpec("j1", 1, _special_row("j1"), "j1{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (T.j0(x) - T.jv(2, x)) / 2), "float",
                 cuda_only=True),
    ScalarOpSpec("jv", 2, _special_row("jv"), None,
                 lambda T, ins, o, gz: [None, gz * (T.jv(ins[0] - 1, ins[1])
                                                     - T.jv(ins[0] + 1, ins[1])) / 2], "float"),
    ScalarOpSpec("i0", 1, _special_row("i0"), "cyl_bessel_i0{f}({0})",
                 _unary(lambda T, x, o, gz: gz * T.i1(x)), "float", cuda_only=True),
    ScalarOpSpec("i1", 1, _special_row("i1"), "cyl_bessel_i1{f}({0})",
                 _unary(lambda T, x, o, gz: gz * (T.i0(x) + T.iv(2, x)) / 2), "float",
                 cuda_only=True),
    ScalarOpSpec("iv", 2, _special_row("iv"), None,
                 lambda T, ins, o, gz: [None, gz * (T.iv(ins[0] - 1, ins[1])
                                                     + T.iv(ins[0] + 1, ins[1])) / 2], "float"),
    ScalarOpSpec("arcsin", 1, np.arcsin, "asin{f}({0})",
                 _unary(lambda T, x, o, gz: gz / T.sqrt(1 - x * x)), "float"),
    ScalarOpSpec("arccos", 1, np.arccos, "acos{f}({0})",
                 _unary(lambda T, x, o, gz: -gz / T.sqrt(1 - x * x)), "float"),
    ScalarOpSpec("arcsinh", 1, np.arcsinh, "asinh{f}({0})",
                 _unary(lambda T, x, o, gz: gz / T.sqrt(x * x + 1)), "float"),
    ScalarOpSpec("arccosh", 1, np.arccosh, "acosh{f}({0})",
                 _unary(lambda T, x, o, gz: gz / T.sqrt(x * x - 1)), "float"),
    ScalarOpSpec("arctanh", 1, np.arctanh, "atanh{f}({0})",
                 _unary(lambda T, x, o, gz: gz / (1 - x * x)), "float"),
    ScalarOpSpec("arctan2", 2, np.arctan2, "atan2{f}({0}, {1})", _g_arctan2, "float"),
    # NumPy's constants: pi/180 and 180/pi divided in the compute precision
    ScalarOpSpec("deg2rad", 1, np.deg2rad, "(({0}) * (3.14159265358979323846{f} / 180.0{f}))",
                 _unary(lambda T, x, o, gz: gz * float(np.pi / 180)), "float"),
    ScalarOpSpec("rad2deg", 1, np.rad2deg, "(({0}) * (180.0{f} / 3.14159265358979323846{f}))",
                 _unary(lambda T, x, o, gz: gz * float(180 / np.pi)), "float"),
    # rounding: piecewise constant, so the gradient is zero
    ScalarOpSpec("floor", 1, np.floor, {"float": "floor{f}({0})", "int": "{0}", "bool": "{0}"},
                 _zero_grad),
    ScalarOpSpec("trunc", 1, np.trunc, {"float": "trunc{f}({0})", "int": "{0}", "bool": "{0}"},
                 _zero_grad),
    ScalarOpSpec("ceil", 1, np.ceil, {"float": "ceil{f}({0})", "int": "{0}", "bool": "{0}"},
                 _zero_grad),
    ScalarOpSpec("round", 1, _round_half_even, {"float": "rint{f}({0})", "int": "{0}", "bool": "{0}"},
                 _zero_grad),
    ScalarOpSpec("round_half_away_from_zero", 1, _round_half_away,
                 {"float": "round{f}({0})", "int": "{0}", "bool": "{0}"}, _zero_grad),
    # comparisons and logic: integer-valued, no gradient path
    ScalarOpSpec("lt", 2, np.less, "({0} < {1})", _no_grad, "bool", symbol="<"),
    ScalarOpSpec("le", 2, np.less_equal, "({0} <= {1})", _no_grad, "bool", symbol="<="),
    ScalarOpSpec("gt", 2, np.greater, "({0} > {1})", _no_grad, "bool", symbol=">"),
    ScalarOpSpec("ge", 2, np.greater_equal, "({0} >= {1})", _no_grad, "bool", symbol=">="),
    ScalarOpSpec("eq", 2, np.equal, "({0} == {1})", _no_grad, "bool", True, symbol="=="),
    ScalarOpSpec("neq", 2, np.not_equal, "({0} != {1})", _no_grad, "bool", True, symbol="!="),
    ScalarOpSpec("isnan", 1, np.isnan, {"float": "isnan({0})", "int": "false", "bool": "false"},
                 _no_grad, "bool"),
    ScalarOpSpec("isinf", 1, np.isinf, {"float": "isinf({0})", "int": "false", "bool": "false"},
                 _no_grad, "bool"),
    ScalarOpSpec("and_", 2, np.bitwise_and, {"bool": "({0} && {1})", "int": "({0} & {1})"},
                 _no_grad, "int_or_bool", True, True, "&"),
    ScalarOpSpec("or_", 2, np.bitwise_or, {"bool": "({0} || {1})", "int": "({0} | {1})"},
                 _no_grad, "int_or_bool", True, True, "|"),
    ScalarOpSpec("xor", 2, np.bitwise_xor, {"bool": "({0} != {1})", "int": "({0} ^ {1})"},
                 _no_grad, "int_or_bool", True, True, "^"),
    ScalarOpSpec("invert", 1, np.invert, {"bool": "(!{0})", "int": "(~{0})"},
                 _no_grad, "int_or_bool", symbol="~"),
    # selection
    ScalarOpSpec("switch", 3, _switch_np, "(({0}) ? ({1}) : ({2}))", _g_switch, "switch"),
    ScalarOpSpec("clip", 3, np.clip,
                 {"float": _FLOAT_CLIP, "int": "min(max({0}, {1}), {2})"},
                 _g_clip, "upcast"),
]


class ScalarOp:
    """An operation on scalars, defined by one table row. Instances are shared singletons."""

    __props__ = ("name",)

    def __init__(self, spec: ScalarOpSpec):
        self.spec = spec
        self.name = spec.name
        self.nin = spec.nin
        self.nout = 1
        self.impl = spec.numpy
        self.commutative = spec.commutative
        self.associative = spec.associative

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.name == other.name

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def __reduce__(self):
        # a row's functions are lambdas: pickle the singleton by its name in the table
        return (get_scalar_op, (self.name,))

    def output_dtype(self, *in_dtypes: str) -> str:
        if self.nin > 0 and len(in_dtypes) != self.nin:
            raise TypeError(f"{self.name} takes {self.nin} inputs, got {len(in_dtypes)}")
        return DTYPE_RULES[self.spec.dtype_rule](*in_dtypes)

    def grad(self, T, inputs, output, gz) -> list:
        return self.spec.grad(T, inputs, output, gz)

    def cuda(self, compute_dtype: str, operands: list[str]) -> str:
        """The CUDA C expression of this op over operand expressions."""
        if self.spec.cuda is None:
            raise NotImplementedError(f"{self.name} has no CUDA form: it runs on the host")
        return cuda_expression(self.spec.cuda, compute_dtype, operands, self.nin < 0)


class Cast(ScalarOp):
    """Conversion to a fixed dtype: a parametrised row."""

    __props__ = ("dtype",)

    def __init__(self, dtype: str):
        spec = ScalarOpSpec(f"cast_{dtype}", 1, None, None, self._grad)
        super().__init__(spec)
        self.dtype = dtype
        self.impl = lambda x: np.asarray(x).astype(dtype)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash((Cast, self.dtype))

    def __reduce__(self):
        return (Cast, (self.dtype,))

    def __str__(self) -> str:
        return f"Cast{{{self.dtype}}}"

    def output_dtype(self, *in_dtypes: str) -> str:
        return self.dtype

    def _grad(self, T, inputs, output, gz):
        (x,) = inputs
        if is_float(x.dtype) and is_float(self.dtype):
            return [T.cast(gz, x.dtype)]
        return [None]

    def cuda(self, compute_dtype: str, operands: list[str]) -> str:
        if self.dtype == "bool":
            return f"(({operands[0]}) != 0)"
        if self.dtype in HALF_DTYPES:
            # computed in float, but rounded to the half type: a cast inside a fused kernel
            # rounds as the host's (and an unfused graph's stored value) does
            to, back = _HALF_ROUND_TRIP[self.dtype]
            return f"{back}({to}((float)({operands[0]})))"
        return f"(({C_TYPES[self.dtype]})({operands[0]}))"


#: CUDA's round-to-nearest conversions to each half type and back to float
_HALF_ROUND_TRIP = {"float16": ("__float2half_rn", "__half2float"),
                    "bfloat16": ("__float2bfloat16_rn", "__bfloat162float")}


def _kind(dtype: str) -> str:
    return "bool" if is_bool(dtype) else ("float" if dtype in FLOAT_DTYPES else "int")


def cuda_expression(template: Any, compute_dtype: str, operands: list[str], variadic: bool) -> str:
    """Fill a row's CUDA template; variadic (n-ary) ops fold left over their operands."""
    if isinstance(template, dict):
        kind = _kind(compute_dtype)
        template = template.get(kind) or template.get("int" if kind == "bool" else "float")
    suffix = "" if compute_dtype == "float64" else "f"
    if variadic:
        acc = operands[0]
        for op in operands[1:]:
            acc = template.format(acc, op, f=suffix)
        return acc
    return template.format(*operands, f=suffix)


SCALAR_OPS: dict[str, ScalarOp] = {spec.name: ScalarOp(spec) for spec in SCALAR_TABLE}


def get_scalar_op(name: str) -> ScalarOp:
    try:
        return SCALAR_OPS[name]
    except KeyError:
        raise KeyError(f"no scalar op named {name!r}; known: {', '.join(sorted(SCALAR_OPS))}") from None
