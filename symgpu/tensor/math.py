"""Elementwise functions (generated from the scalar table), casts, reductions and dot."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.dtypes import (HALF_DTYPES, check_dtype, in_value_dtype, is_float, is_int,
                                  upcast, value_dtype)
from symgpu.tensor.elemwise import (CAReduce, DimShuffle, Elemwise, _sum_to_broadcast_pattern,
                                    keepdims_order)
from symgpu.tensor.shape import shape_i, transpose
from symgpu.tensor.shape_rules import dot_shape as _dot_shape, matmul_shape as _matmul_shape
from symgpu.tensor.type import (TensorType, TensorVariable, as_tensor_variable, constant,
                                specify_broadcastable_as)

_ELEMWISE: dict[str, Elemwise] = {name: Elemwise(op) for name, op in SCALAR_OPS.items()}


# ----------------------------------------------------------------------------- operands

def _is_python_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _weak_dtype(value: Any, strong: list[str]) -> str:
    """NumPy 2's rule for Python numbers meeting tensors: they take the tensors' kind."""
    if isinstance(value, bool):
        return "bool"
    floats = [d for d in strong if is_float(d)]
    if isinstance(value, float):
        return upcast(*floats) if floats else config.floatX
    ints = [d for d in strong if is_int(d)]
    if floats:
        return upcast(*floats)
    if ints:
        dtype = upcast(*ints)
        info = np.iinfo(dtype)
        if info.min <= value <= info.max:
            return dtype
    return "int64"


def as_operands(*args: Any, promote: bool | Sequence[int] = False) -> list[TensorVariable]:
    """Convert arguments of an elementwise op; Python numbers adopt the tensors' dtype.

    With `promote` (arithmetic rows; a sequence names the operands it applies to), a Python
    float meeting only integer/bool tensors makes those operands floatX: NumPy 2 gives its
    default float there, and symgpu's default float is floatX (`int32_vector + 1.5` stays
    float32 on the GPU instead of becoming float64)."""
    strong = [a.dtype for a in args if isinstance(a, Variable)]
    strong += [np.asarray(a).dtype.name for a in args
               if not isinstance(a, Variable) and not _is_python_scalar(a)]
    out = []
    for a in args:
        if _is_python_scalar(a):
            out.append(constant(a, dtype=_weak_dtype(a, strong)))
        else:
            out.append(as_tensor_variable(a))
    if promote and config.floatX != "float64" and not builtins.any(is_float(d) for d in strong) \
            and builtins.any(isinstance(a, float) for a in args):
        idx = range(len(out)) if promote is True else promote
        for i in idx:
            if not is_float(out[i].dtype):
                out[i] = cast(out[i], config.floatX)
    return out


#: rows whose result dtype follows their operands (see `as_operands`), and which operands
_PROMOTING: dict[str, bool | tuple[int, ...]] = {
    **{n: True for n in ("add", "sub", "mul", "true_div", "int_div", "mod", "pow", "maximum",
                         "minimum", "clip")},
    "switch": (1, 2),
}


def _make_elemwise(name: str, doc: str):
    op = _ELEMWISE[name]
    promote = _PROMOTING.get(name, False)

    def fn(*args):
        return op(*as_operands(*args, promote=promote))

    fn.__name__ = name
    fn.__doc__ = doc
    return fn


# ----------------------------------------------------------------------------- elementwise
add = _make_elemwise("add", "Elementwise sum (any number of arguments).")
sub = _make_elemwise("sub", "Elementwise difference.")
mul = _make_elemwise("mul", "Elementwise product (any number of arguments).")
true_div = _make_elemwise("true_div", "Elementwise division (integers give floats).")
floor_div = _make_elemwise("int_div", "Elementwise floor division, like Python's //.")
int_div = floor_div
mod = _make_elemwise("mod", "Elementwise modulo, like Python's %.")
pow = _make_elemwise("pow", "Elementwise power.")
maximum = _make_elemwise("maximum", "Elementwise maximum.")
minimum = _make_elemwise("minimum", "Elementwise minimum.")
neg = _make_elemwise("neg", "Elementwise negation.")
abs = _make_elemwise("abs", "Elementwise absolute value.")
abs_ = abs
sgn = _make_elemwise("sgn", "Elementwise sign (-1, 0 or 1).")
sign = sgn
sqr = _make_elemwise("sqr", "Elementwise square.")
square = sqr  # Theano's other name (T.square)
reciprocal = _make_elemwise("reciprocal", "Elementwise 1/x.")
inv = reciprocal
identity = _make_elemwise("identity", "The input itself, as a new node.")
real = _make_elemwise("real", "Elementwise real part (a real x itself; complex64 gives float32).")
imag = _make_elemwise("imag", "Elementwise imaginary part (zeros for a real x).")
angle = _make_elemwise("angle", "Elementwise argument of a complex number, in float64 as "
                                "Theano's (a real x: 0 where x >= 0, pi where x < 0).")
exp = _make_elemwise("exp", "Elementwise e**x.")
exp2 = _make_elemwise("exp2", "Elementwise 2**x.")
expm1 = _make_elemwise("expm1", "Elementwise exp(x) - 1, accurate near 0.")
log = _make_elemwise("log", "Elementwise natural logarithm.")
log2 = _make_elemwise("log2", "Elementwise base-2 logarithm.")
log10 = _make_elemwise("log10", "Elementwise base-10 logarithm.")
log1p = _make_elemwise("log1p", "Elementwise log(1 + x), accurate near 0.")
sqrt = _make_elemwise("sqrt", "Elementwise square root.")
sigmoid = _make_elemwise("sigmoid", "Elementwise logistic function 1/(1+exp(-x)).")
softplus = _make_elemwise("softplus", "Elementwise log(1+exp(x)), computed without overflow.")
sin = _make_elemwise("sin", "Elementwise sine.")
cos = _make_elemwise("cos", "Elementwise cosine.")
tan = _make_elemwise("tan", "Elementwise tangent.")
arctan = _make_elemwise("arctan", "Elementwise arc tangent.")
tanh = _make_elemwise("tanh", "Elementwise hyperbolic tangent.")
sinh = _make_elemwise("sinh", "Elementwise hyperbolic sine.")
cosh = _make_elemwise("cosh", "Elementwise hyperbolic cosine.")
erf = _make_elemwise("erf", "Elementwise error function.")
erfc = _make_elemwise("erfc", "Elementwise complementary error function 1 - erf(x).")
erfinv = _make_elemwise("erfinv", "Elementwise inverse error function.")
erfcinv = _make_elemwise("erfcinv", "Elementwise inverse complementary error function.")
gamma = _make_elemwise("gamma", "Elementwise gamma function.")
gammaln = _make_elemwise("gammaln", "Elementwise log of the absolute value of the gamma function.")
psi = _make_elemwise("psi", "Elementwise digamma function (derivative of gammaln); host only.")
tri_gamma = _make_elemwise("tri_gamma", "Elementwise trigamma function (derivative of psi); "
                           "host only.")
chi2sf = _make_elemwise("chi2sf", "Elementwise chi-squared survival function of x with k "
                        "degrees of freedom (scipy.stats.chi2.sf(x, k)); host only.")
floor = _make_elemwise("floor", "Elementwise floor.")
trunc = _make_elemwise("trunc", "Elementwise truncation towards zero.")
erfcx = _make_elemwise("erfcx", "Elementwise scaled complementary error function "
                       "exp(x**2) * erfc(x).")
j0 = _make_elemwise("j0", "Elementwise Bessel function of the first kind of order 0.")
j1 = _make_elemwise("j1", "Elementwise Bessel function of the first kind of order 1.")
jv = _make_elemwise("jv", "Elementwise Bessel function of the first kind of real order v "
                    "(jv(v, x)); host only.")
i0 = _make_elemwise("i0", "Elementwise modified Bessel function of the first kind of order 0.")
i1 = _make_elemwise("i1", "Elementwise modified Bessel function of the first kind of order 1.")
iv = _make_elemwise("iv", "Elementwise modified Bessel function of the first kind of real "
                    "order v (iv(v, x)); host only.")
ceil = _make_elemwise("ceil", "Elementwise ceiling.")
round = _make_elemwise("round", "Elementwise rounding, half to even (like NumPy).")
lt = _make_elemwise("lt", "Elementwise a < b (bool).")
le = _make_elemwise("le", "Elementwise a <= b (bool).")
gt = _make_elemwise("gt", "Elementwise a > b (bool).")
ge = _make_elemwise("ge", "Elementwise a >= b (bool).")
eq = _make_elemwise("eq", "Elementwise a == b (bool).")
neq = _make_elemwise("neq", "Elementwise a != b (bool).")
isnan = _make_elemwise("isnan", "Elementwise test for NaN.")
isinf = _make_elemwise("isinf", "Elementwise test for infinity.")
and_ = _make_elemwise("and_", "Elementwise logical/bitwise and.")
or_ = _make_elemwise("or_", "Elementwise logical/bitwise or.")
xor = _make_elemwise("xor", "Elementwise logical/bitwise xor.")
invert = _make_elemwise("invert", "Elementwise logical/bitwise not.")
bitwise_and, bitwise_or, bitwise_xor, bitwise_not = and_, or_, xor, invert
switch = _make_elemwise("switch", "Elementwise `a if cond else b`.")
clip = _make_elemwise("clip", "Elementwise clip of x into [lo, hi].")


def where(cond: Any, a: Any, b: Any) -> TensorVariable:
    """Elementwise `a if cond else b` (NumPy's name for switch)."""
    return switch(cond, a, b)


def second(a: Any, b: Any) -> TensorVariable:
    """`b` broadcast to the shape of `a` (Theano's `fill`/`second`)."""
    a, b = as_operands(a, b)
    return _SECOND(a, b)


fill = second


def cast(x: Any, dtype: str) -> TensorVariable:
    """`x` converted to `dtype` (a no-op when it already has it)."""
    x = as_tensor_variable(x)
    dtype = config.floatX if dtype == "floatX" else check_dtype(dtype)
    if x.dtype == dtype:
        return x
    return Elemwise(Cast(dtype))(x)


def zeros_like(x: Any, dtype: str | None = None) -> TensorVariable:
    """Zeros of the shape (and dtype) of `x`."""
    x = as_tensor_variable(x)
    return second(x, constant(0, dtype=dtype or x.dtype))


def ones_like(x: Any, dtype: str | None = None) -> TensorVariable:
    """Ones of the shape (and dtype) of `x`."""
    x = as_tensor_variable(x)
    return second(x, constant(1, dtype=dtype or x.dtype))


# ----------------------------------------------------------------------------- reductions

def _norm_axis(x: TensorVariable, axis: Any) -> tuple[int, ...] | None:
    if axis is None:
        return None
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    out = []
    for a in axis:
        a = int(a)
        if not -x.ndim <= a < builtins.max(x.ndim, 1):
            raise ValueError(f"axis {a} is out of range for {x} with {x.ndim} dimensions")
        out.append(a % x.ndim if x.ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis} repeats a dimension")
    return tuple(sorted(out)) if x.ndim else ()  # a scalar's axis 0: nothing to reduce


def _keep(x: TensorVariable, r: TensorVariable, axis: tuple[int, ...] | None) -> TensorVariable:
    return DimShuffle(r.broadcastable, keepdims_order(x.ndim, axis))(r)


def _reduce(name: str, x: Any, axis: Any, keepdims: bool, dtype: str | None = None) -> TensorVariable:
    x = as_tensor_variable(x)
    ax = _norm_axis(x, axis)
    if ax is not None and len(ax) == x.ndim:
        ax = None
    if ax == ():
        r = x if dtype is None else cast(x, dtype)
        return r
    r = CAReduce(SCALAR_OPS[name], ax, check_dtype(dtype) if dtype else None)(x)
    return _keep(x, r, ax) if keepdims else r


def sum(x: Any, axis: Any = None, dtype: str | None = None, keepdims: bool = False,
        acc_dtype: str | None = None) -> TensorVariable:
    """Sum over `axis` (all axes by default)."""
    r = _reduce("add", x, axis, keepdims, acc_dtype or dtype)
    return cast(r, dtype) if dtype else r


def prod(x: Any, axis: Any = None, dtype: str | None = None, keepdims: bool = False) -> TensorVariable:
    """Product over `axis` (all axes by default)."""
    return _reduce("mul", x, axis, keepdims, dtype)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """Maximum over `axis` (all axes by default)."""
    return _reduce("maximum", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """Minimum over `axis` (all axes by default)."""
    return _reduce("minimum", x, axis, keepdims)


def all(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """True where every element over `axis` is true."""
    return _reduce("and_", cast(x, "bool"), axis, keepdims)


def any(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """True where some element over `axis` is true."""
    return _reduce("or_", cast(x, "bool"), axis, keepdims)


def _count(x: TensorVariable, axis: tuple[int, ...] | None) -> TensorVariable:
    axes = range(x.ndim) if axis is None else axis
    n = None
    for a in axes:
        s = constant(1, dtype="int64") if x.broadcastable[a] else shape_i(x, a)
        n = s if n is None else n * s
    return n if n is not None else constant(1, dtype="int64")


def mean(x: Any, axis: Any = None, dtype: str | None = None, keepdims: bool = False) -> TensorVariable:
    """Arithmetic mean over `axis`; integers average in float64 like NumPy."""
    x = as_tensor_variable(x)
    ax = _norm_axis(x, axis)
    out_dtype = dtype or (x.dtype if is_float(x.dtype) else "float64")
    # half sums lose precision and float16's overflow at 65504: accumulate and divide in float32
    acc = value_dtype(out_dtype)
    s = sum(x, axis=ax, keepdims=keepdims, acc_dtype=acc if acc != x.dtype else None)
    return cast(true_div(s, cast(_count(x, ax), acc)), out_dtype)


def var(x: Any, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> TensorVariable:
    """Variance over `axis` with `ddof` delta degrees of freedom."""
    x = as_tensor_variable(x)
    ax = _norm_axis(x, axis)
    centred = x - mean(x, ax, keepdims=True)
    v = mean(sqr(centred), ax, keepdims=keepdims)
    if ddof:
        n = cast(_count(x, ax), v.dtype)
        v = v * n / (n - ddof)
    return v


def std(x: Any, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> TensorVariable:
    """Standard deviation over `axis`."""
    return sqrt(var(x, axis, ddof, keepdims))


class Argmax(Op):
    """Index of the max (or min, `kind='min'`) over one axis or the flattened array."""

    __props__ = ("axis", "kind")

    def __init__(self, axis: int | None, kind: str = "max"):
        self.axis = axis
        self.kind = kind

    def __str__(self) -> str:
        return f"Arg{self.kind}{{axis={self.axis}}}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        bcast = () if self.axis is None else tuple(
            b for d, b in enumerate(x.broadcastable) if d != self.axis)
        return Apply(self, [x], [TensorType("int64", bcast)()])

    def perform(self, node, inputs, out):
        fn = np.argmax if self.kind == "max" else np.argmin
        out[0][0] = np.asarray(fn(inputs[0], axis=self.axis), dtype="int64")

    def grad(self, inputs, output_grads):
        return [None]

    def infer_shape(self, fgraph, node, input_shapes):
        """() for the flattened array, else the input's shape without `axis` (GpuArgmax's
        too)."""
        if self.axis is None:
            return [()]
        return [tuple(s for d, s in enumerate(input_shapes[0]) if d != self.axis)]


def _arg(kind: str, x: Any, axis: Any, keepdims: bool) -> TensorVariable:
    x = as_tensor_variable(x)
    ax = _norm_axis(x, axis)
    if ax is not None and len(ax) > 1:
        raise ValueError(f"arg{kind} takes one axis or None, got {axis}")
    a = None if ax is None or x.ndim <= 1 else ax[0]
    r = Argmax(a, kind)(x)
    if keepdims:
        r = _keep(x, r, None if a is None else (a,))
    return r


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """Index of the maximum over `axis` (of the flattened array if None)."""
    return _arg("max", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> TensorVariable:
    """Index of the minimum over `axis` (of the flattened array if None)."""
    return _arg("min", x, axis, keepdims)


def prod_grad(x: TensorVariable, axis: tuple[int, ...], gz_b: TensorVariable) -> TensorVariable:
    """Gradient of prod(x, axis), exact when x has zeros: for each element, the product of the
    others (one zero: only its position gets a gradient; two or more: all zero)."""
    is_zero = eq(x, 0)
    nonzero_x = switch(is_zero, ones_like(x), x)
    prod_nz = _keep(x, prod(nonzero_x, axis if len(axis) < x.ndim else None), axis)
    n_zero = _keep(x, sum(cast(is_zero, "int64"), axis if len(axis) < x.ndim else None), axis)
    others = switch(eq(n_zero, 0), prod_nz / nonzero_x,
                    switch(and_(eq(n_zero, 1), is_zero), prod_nz, zeros_like(x)))
    return gz_b * others


# ----------------------------------------------------------------------------- linear algebra

def _product_operands(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The operands of a matrix product as computed: half ones in float32 (the product then
    accumulates in float32 and rounds once to the output dtype). Why: NumPy's float16 matmul
    is an unblocked loop (100 times slower than sgemm) and ml_dtypes' bfloat16 has no BLAS."""
    if x.dtype.name in HALF_DTYPES or y.dtype.name in HALF_DTYPES:
        return in_value_dtype(x), in_value_dtype(y)
    return x, y


class Dot(Op):
    """np.dot for vectors and matrices (the BLAS rewrites specialise it); half operands
    are multiplied in float32 and the result rounded once."""

    __props__ = ()

    def __str__(self) -> str:
        return "dot"  # Theano's name for it in printed graphs

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_tensor_variable(x), as_tensor_variable(y)
        if x.ndim not in (1, 2) or y.ndim not in (1, 2):
            raise TypeError(f"Dot takes vectors and matrices, got {x.type} and {y.type}; "
                            "use tensordot or matmul for more dimensions")
        if not (is_float(x.dtype) or is_int(x.dtype)) or not (is_float(y.dtype) or is_int(y.dtype)):
            raise TypeError(f"dot needs numeric inputs, got {x.dtype} and {y.dtype}")
        bcast = x.broadcastable[:-1] + y.broadcastable[1:] if y.ndim == 2 else x.broadcastable[:-1]
        if y.ndim == 1 and x.ndim == 1:
            bcast = ()
        return Apply(self, [x, y], [TensorType(upcast(x.dtype, y.dtype), bcast)()])

    def perform(self, node, inputs, out):
        x, y = inputs
        if x.shape[-1] != y.shape[0]:
            raise ValueError(f"dot: shapes {x.shape} and {y.shape} are not aligned "
                             f"({x.shape[-1]} != {y.shape[0]})")
        out[0][0] = np.asarray(np.dot(*_product_operands(x, y)), dtype=node.outputs[0].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [_dot_shape(*input_shapes)]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        if x.ndim == 1 and y.ndim == 1:
            gx, gy = gz * y, gz * x
        elif x.ndim == 2 and y.ndim == 1:
            gx, gy = outer(gz, y), dot(x.T, gz)
        elif x.ndim == 1 and y.ndim == 2:
            gx, gy = dot(y, gz), outer(x, gz)
        else:
            gx, gy = dot(gz, y.T), dot(x.T, gz)
        return [cast(gx, x.dtype) if is_float(x.dtype) else None,
                cast(gy, y.dtype) if is_float(y.dtype) else None]

    def R_op(self, inputs, eval_points):
        (x, y), (ex, ey) = inputs, eval_points
        terms = []
        if ex is not None:
            terms.append(dot(ex, y))
        if ey is not None:
            terms.append(dot(x, ey))
        if not terms:
            return [None]
        return [terms[0] if len(terms) == 1 else terms[0] + terms[1]]


_dot = Dot()


class MatMul(Op):
    """np.matmul for stacks of matrices (ndim > 2 on either side); half operands are
    multiplied in float32 and the result rounded once."""

    __props__ = ()

    def make_node(self, x: Any, y: Any) -> Apply:
        x, y = as_tensor_variable(x), as_tensor_variable(y)
        if x.ndim < 2 or y.ndim < 2:
            raise TypeError("MatMul needs at least 2 dimensions on each side")
        nd = builtins.max(x.ndim, y.ndim)
        xb = (True,) * (nd - x.ndim) + x.broadcastable
        yb = (True,) * (nd - y.ndim) + y.broadcastable
        bcast = tuple(a and b for a, b in zip(xb[:-2], yb[:-2])) + (xb[-2], yb[-1])
        return Apply(self, [x, y], [TensorType(upcast(x.dtype, y.dtype), bcast)()])

    def perform(self, node, inputs, out):
        x, y = inputs
        if x.shape[-1] != y.shape[-2]:
            raise ValueError(f"matmul: shapes {x.shape} and {y.shape} are not aligned "
                             f"({x.shape[-1]} != {y.shape[-2]})")
        try:
            np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: the batch dimensions of shapes {x.shape} and {y.shape} "
                             "do not broadcast") from None
        out[0][0] = np.asarray(np.matmul(*_product_operands(x, y)), dtype=node.outputs[0].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        """The stacks broadcast (NumPy's rule, at run time), then rows of x by columns of y
        (GpuBatchedDot shares it)."""
        return [_matmul_shape(*input_shapes)]

    def grad(self, inputs, output_grads):
        (x, y), (gz,) = inputs, output_grads
        swap = lambda v: transpose(v, tuple(range(v.ndim - 2)) + (v.ndim - 1, v.ndim - 2))
        gx = _sum_to_broadcast_pattern(matmul(gz, swap(y)), x)
        gy = _sum_to_broadcast_pattern(matmul(swap(x), gz), y)
        return [gx, gy]


def dot(x: Any, y: Any) -> TensorVariable:
    """Matrix/vector product; scalars multiply; more dimensions contract the last axis of x
    with the second-to-last of y (like np.dot)."""
    x, y = as_tensor_variable(x), as_tensor_variable(y)
    if x.ndim == 0 or y.ndim == 0:
        return mul(x, y)
    if x.ndim <= 2 and y.ndim <= 2:
        return _dot(x, y)
    return tensordot(x, y, [[x.ndim - 1], [builtins.max(y.ndim - 2, 0)]])


def matmul(x: Any, y: Any) -> TensorVariable:
    """The `@` operator: np.matmul semantics."""
    x, y = as_tensor_variable(x), as_tensor_variable(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError("matmul does not take scalars; use *")
    if x.ndim <= 2 and y.ndim <= 2:
        return _dot(x, y)
    if y.ndim == 2 and x.ndim > 2:
        # a stack times one matrix (a linear layer over a batch of sequences, ``x @ W``):
        # np.dot's contraction of x's last axis with W's first, the same values; as dot it
        # is one product of the stack's rows (reshape, GEMM, reshape) on every backend, where
        # MatMul broadcast W over the stack (on the GPU it stayed on the host)
        return dot(x, y)
    if x.ndim == 2 and y.ndim > 2:
        # one matrix times a stack, A @ y = (y^T @ A^T)^T per stack entry: the stack-times-
        # matrix product above, between two transposes (MatMul had no GPU form for it)
        swap = tuple(range(y.ndim - 2)) + (y.ndim - 1, y.ndim - 2)
        return dot(y.dimshuffle(*swap), x.T).dimshuffle(*swap)
    if x.ndim == 1:
        return _squeeze_axis(matmul(x.dimshuffle("x", 0), y), -2)
    if y.ndim == 1:
        return _squeeze_axis(matmul(x, y.dimshuffle(0, "x")), -1)
    nd = builtins.max(x.ndim, y.ndim)
    xb, yb = ((True,) * (nd - v.ndim) + v.broadcastable for v in (x, y))
    if xb[:-2] != yb[:-2]:
        x, y = (v.dimshuffle(*(["x"] * (nd - v.ndim) + list(range(v.ndim)))) for v in (x, y))
        return _folded_matmul(x, y)
    return MatMul()(x, y)


def _folded_matmul(x: TensorVariable, y: TensorVariable) -> TensorVariable:
    """np.matmul of two stacks of one rank whose batch dims are declared broadcast on one side
    only (keys shared by every head, ``(B, H, S, d) @ (B, 1, d, S)``; a mask or bias stack): a
    dim broadcast in y is folded into x's rows, one broadcast in x into y's columns, so one
    product of stacks with the same batch dims remains (a GEMM or one batched GEMM on the GPU,
    where MatMul had no GPU form for broadcast batches), and the result is put back in
    np.matmul's order.  The values are np.matmul's; the dims both sides have stay batch dims
    (broadcast at run time as MatMul does)."""
    nb = x.ndim - 2
    xb, yb = x.broadcastable[:nb], y.broadcastable[:nb]
    both = [i for i in range(nb) if not xb[i] and not yb[i]]
    x_only = [i for i in range(nb) if not xb[i] and yb[i]]
    y_only = [i for i in range(nb) if xb[i] and not yb[i]]
    ns, nx, ny = len(both), len(x_only), len(y_only)
    # x as (both..., x_only..., m, k) and y as (both..., k, y_only..., n), broadcast dims
    # dropped; then x's x_only dims joined with m, y's y_only dims with n
    xt = x.dimshuffle(*(both + x_only + [nb, nb + 1]))
    yt = y.dimshuffle(*(both + [nb] + y_only + [nb + 1]))
    x_dims = [xt.shape[ns + j] for j in range(nx)]
    y_dims = [yt.shape[ns + 1 + j] for j in range(ny)]
    m, k, n = xt.shape[ns + nx], xt.shape[ns + nx + 1], yt.shape[ns + 1 + ny]
    rows = m
    for d in x_dims:
        rows = rows * d
    cols = n
    for d in y_dims:
        cols = cols * d
    x2 = xt.reshape([xt.shape[j] for j in range(ns)] + [rows, k], ndim=ns + 2)
    y2 = yt.reshape([yt.shape[j] for j in range(ns)] + [k, cols], ndim=ns + 2)
    r = MatMul()(x2, y2) if ns else _dot(x2, y2)
    r = r.reshape([r.shape[j] for j in range(ns)] + x_dims + [m] + y_dims + [n],
                  ndim=ns + nx + ny + 2)
    order: list = []
    for i in range(nb):
        if i in both:
            order.append(both.index(i))
        elif i in x_only:
            order.append(ns + x_only.index(i))
        elif i in y_only:
            order.append(ns + nx + 1 + y_only.index(i))
        else:
            order.append("x")
    r = r.dimshuffle(*(order + [ns + nx, ns + nx + 1 + ny]))
    bcast = tuple(a and b for a, b in zip(xb, yb)) + (x.broadcastable[-2], y.broadcastable[-1])
    return specify_broadcastable_as(r, r.type.clone(broadcastable=bcast))


def _squeeze_axis(r: TensorVariable, axis: int) -> TensorVariable:
    axis %= r.ndim
    pattern = [d for d in range(r.ndim) if d != axis]
    bc = list(r.broadcastable)
    bc[axis] = True
    r = specify_broadcastable_as(r, r.type.clone(broadcastable=bc))
    return DimShuffle(r.broadcastable, pattern)(r)


def outer(x: Any, y: Any) -> TensorVariable:
    """Outer product of two vectors."""
    x, y = as_tensor_variable(x), as_tensor_variable(y)
    if x.ndim != 1 or y.ndim != 1:
        x, y = x.flatten(), y.flatten()
    return _dot(x.dimshuffle(0, "x"), y.dimshuffle("x", 0))


def tensordot(a: Any, b: Any, axes: Any = 2) -> TensorVariable:
    """np.tensordot: contract `axes` of a with those of b, through one matrix product."""
    a, b = as_tensor_variable(a), as_tensor_variable(b)
    if isinstance(axes, (int, np.integer)):
        a_axes = list(range(a.ndim - int(axes), a.ndim))
        b_axes = list(range(int(axes)))
    else:
        a_axes, b_axes = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
                          [axes[1]] if isinstance(axes[1], int) else list(axes[1]))
    a_axes = [x % a.ndim for x in a_axes]
    b_axes = [x % b.ndim for x in b_axes]
    if len(a_axes) != len(b_axes):
        raise ValueError(f"tensordot: {len(a_axes)} axes of a against {len(b_axes)} of b")
    a_free = [d for d in range(a.ndim) if d not in a_axes]
    b_free = [d for d in range(b.ndim) if d not in b_axes]
    at = transpose(a, a_free + a_axes)
    bt = transpose(b, b_axes + b_free)
    a_shape = [shape_i(a, d) for d in a_free]
    b_shape = [shape_i(b, d) for d in b_free]
    k = _prod_of([shape_i(a, d) for d in a_axes])
    k_b = _prod_of([shape_i(b, d) for d in b_axes])  # b's own: a mismatch then fails in Dot
    m = _prod_of(a_shape)
    n = _prod_of(b_shape)
    r = _dot(at.reshape([m, k], ndim=2), bt.reshape([k_b, n], ndim=2))
    return r.reshape(a_shape + b_shape, ndim=len(a_free) + len(b_free))


def _prod_of(dims: Sequence[TensorVariable]) -> TensorVariable:
    out = constant(1, dtype="int64")
    for d in dims:
        out = out * d
    return out


_SECOND = _ELEMWISE["second"]
