"""TensorType and the symbolic tensor variables and constants."""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Type, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import (HALF_DTYPES, approx_tolerance, check_dtype, dtype_kind,
                                  in_value_dtype, is_float)

__all__ = ["TensorType", "TensorVariable", "TensorConstant", "as_tensor_variable", "constant",
           "tensor", "scalar", "vector", "matrix", "row", "col", "tensor3", "tensor4",
           "Float64Warning", "ArrayVariableMixin", "python_number_array",
           "SpecifyBroadcastable", "Unbroadcast", "specify_broadcastable_as",
           "check_declared_broadcastable"]

_NDIM_NAMES = {0: "scalar", 1: "vector", 2: "matrix", 3: "tensor3", 4: "tensor4"}


class Float64Warning(UserWarning):
    """A float64 variable was created while `warn_float64=warn`."""


class TensorType(Type):
    """An n-dimensional array type: a dtype and, per dimension, whether it is broadcastable
    (known to have length 1)."""

    def __init__(self, dtype: str, broadcastable: Sequence[bool] = (), name: str | None = None,
                 shape: Sequence | None = None):
        """``name`` (Theano's): how the type prints, e.g. ``TensorType('float64', (False,),
        name='Vec')``; it does not take part in equality."""
        self.dtype = check_dtype(dtype)
        self.name = name
        if shape is not None:
            broadcastable = tuple(s == 1 for s in shape)
        self.broadcastable = tuple(bool(b) for b in broadcastable)
        self.ndim = len(self.broadcastable)
        self._hash = hash((TensorType, self.dtype, self.broadcastable))

    # -- identity ---------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and self.dtype == other.dtype
                and self.broadcastable == other.broadcastable)

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        # the hash mixes in string and class hashes, which differ between processes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._hash = hash((TensorType, self.dtype, self.broadcastable))

    def clone(self, dtype: str | None = None, broadcastable: Sequence[bool] | None = None) -> "TensorType":
        return type(self)(dtype or self.dtype,
                          self.broadcastable if broadcastable is None else broadcastable)

    @property
    def shape(self) -> tuple:
        return tuple(1 if b else None for b in self.broadcastable)

    def __str__(self) -> str:
        if getattr(self, "name", None):
            return self.name
        kind = _NDIM_NAMES.get(self.ndim, f"{self.ndim}D")
        if self.ndim == 2 and self.broadcastable == (True, False):
            kind = "row"
        elif self.ndim == 2 and self.broadcastable == (False, True):
            kind = "col"
        return f"TensorType({self.dtype}, {kind})"

    __repr__ = __str__

    # -- values -----------------------------------------------------------------------------
    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> np.ndarray:
        """Return `value` as an ndarray of this type, or raise a TypeError saying why."""
        if isinstance(value, np.ndarray) and value.dtype.name == self.dtype:
            arr = value
        elif strict:
            raise TypeError(f"expected an ndarray of dtype {self.dtype}, got "
                            f"{type(value).__name__} of dtype {getattr(value, 'dtype', '?')}")
        else:
            if hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray):
                value = np.asarray(value)
            arr = np.asarray(value)
            if arr.dtype.name != self.dtype:
                arr = self._convert_dtype(arr, value, allow_downcast)
        if arr.ndim != self.ndim:
            raise TypeError(f"expected {self.ndim} dimension(s) ({self}), got {arr.ndim} "
                            f"(shape {arr.shape})")
        for i, (b, s) in enumerate(zip(self.broadcastable, arr.shape)):
            if b and s != 1:
                raise TypeError(f"dimension {i} is broadcastable in {self} and must have length 1, "
                                f"got shape {arr.shape}")
        return arr

    def _convert_dtype(self, arr: np.ndarray, original: Any, allow_downcast: bool | None) -> np.ndarray:
        kind = dtype_kind(arr.dtype)   # 'f' for bfloat16, which NumPy calls 'V'
        if kind in "OUSV" or (kind == "c" and not self.dtype.startswith("complex")):
            raise TypeError(f"cannot convert a {arr.dtype} value to {self.dtype}")
        if np.can_cast(arr.dtype, self.dtype, casting="safe"):
            return arr.astype(self.dtype)
        is_python_scalar = isinstance(original, (int, float, bool)) or (
            isinstance(original, (list, tuple)) and kind in "biuf")
        converted = arr.astype(self.dtype)
        if allow_downcast:
            return converted
        if allow_downcast is None and (is_python_scalar or arr.dtype.name == "float64"
                                       and self.dtype == config.floatX):
            # Python numbers and floatX-casts of float64 data are accepted when exact enough
            if np.all(np.asarray(converted, dtype=arr.dtype) == arr) or (
                    is_float(self.dtype) and kind == "f"):
                return converted
        raise TypeError(
            f"cannot safely convert a {arr.dtype} value to {self.dtype} (it could lose "
            f"precision); cast it yourself (e.g. numpy.asarray(v, dtype='{self.dtype}')) "
            "or pass allow_input_downcast=True")

    def make_fast_filter(self):
        """A predicate true for values that need no conversion (the hot path of a call)."""
        dtype, ndim, ndarray = np.dtype(self.dtype), self.ndim, np.ndarray
        ones = [d for d, b in enumerate(self.broadcastable) if b]
        if ones:
            return lambda v: (v.__class__ is ndarray and v.dtype == dtype and v.ndim == ndim
                              and all(v.shape[d] == 1 for d in ones))
        return lambda v: v.__class__ is ndarray and v.dtype == dtype and v.ndim == ndim

    def make_scalar_filter(self, allow_downcast: bool | None) -> Callable[[Any], Any] | None:
        """For a 0-d type: a converter of the Python ints and floats (and NumPy scalars of the
        dtype) that :meth:`filter` accepts (an index, a learning rate), giving their 0-d
        array, or None for any other value (filter then decides); None for other types.  A
        call's hot path: ``filter`` goes through ``np.asarray``, ``can_cast`` and an
        exactness test for these."""
        if self.ndim:
            return None
        dtype = np.dtype(self.dtype)
        asarray, own = np.asarray, dtype.type   # a NumPy scalar of the dtype itself
        if dtype_kind(dtype) == "f" and (allow_downcast is not False or dtype.itemsize >= 8):
            # filter takes a Python float for any float type, unless downcasts are refused
            return lambda v: asarray(v, dtype) if v.__class__ is float or v.__class__ is own \
                else None
        if dtype.kind in "iu" and (allow_downcast is not False or dtype == np.int64):
            info = np.iinfo(dtype)
            lo, hi = int(info.min), int(info.max)
            # exactly representable ints only: filter refuses the others
            return lambda v: asarray(v, dtype) if (v.__class__ is int and lo <= v <= hi) \
                or v.__class__ is own else None
        return None

    def values_eq(self, a: Any, b: Any) -> bool:
        return a.shape == b.shape and bool(np.all(a == b))

    def values_eq_approx(self, a: Any, b: Any, rtol: float | None = None, atol: float | None = None) -> bool:
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype.kind in "biu":
            return bool(np.all(a == b))
        tol = approx_tolerance(a.dtype)   # a few ulp of a half type, 1e-4 / 1e-8 otherwise
        return bool(np.allclose(a, b, rtol=rtol or tol, atol=atol or tol, equal_nan=True))

    def make_variable(self, name: str | None = None) -> "TensorVariable":
        return TensorVariable(self, None, None, name)

    def convert_variable(self, var: Variable) -> Variable | None:
        """A variable of this type from `var`: same dtype, and broadcastable dims only
        relaxed (a known-1 dim may stand where any length is allowed)."""
        vt = var.type
        if vt == self:
            return var
        to_host = getattr(vt, "as_tensor", None)  # a device variable: its host form
        if (to_host is not None and not isinstance(vt, TensorType)
                and getattr(vt, "dtype", None) == self.dtype and getattr(vt, "ndim", None) == self.ndim):
            var = to_host(var)
            vt = var.type
            if vt == self:
                return var
        if (isinstance(vt, TensorType) and vt.dtype == self.dtype and vt.ndim == self.ndim
                and all(vb or not sb for vb, sb in zip(vt.broadcastable, self.broadcastable))):
            return specify_broadcastable_as(var, self)
        return None


def _warn_float64(dtype: str) -> None:
    if dtype != "float64":
        return
    action = config.warn_float64
    if action == "ignore":
        return
    message = "a float64 variable was created (warn_float64); use floatX=float32 for the GPU"
    if action == "warn":
        # point at the user's line: skip every frame inside the symgpu package (the depth
        # differs between constructors, operators and constants)
        import os
        import sys
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        frame, level = sys._getframe(0), 1
        while frame is not None and frame.f_code.co_filename.startswith(package):
            frame, level = frame.f_back, level + 1
        warnings.warn(message, Float64Warning, stacklevel=level)
    elif action == "raise":
        raise TypeError(message)
    elif action == "pdb":  # pragma: no cover - interactive
        import pdb
        pdb.set_trace()


class ArrayVariableMixin:
    """dtype/ndim/broadcastable read from the type: shared by host and device array
    variables (symgpu.gpu.placement.type.GpuArrayVariable uses it too)."""

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return self.type.ndim

    @property
    def broadcastable(self) -> tuple[bool, ...]:
        return self.type.broadcastable


class _InstanceAttribute:
    """Documents on a class an attribute every instance sets in ``__init__``: reading it on
    the class gives this descriptor (so ``Class.attr`` exists, as Theano's reference lists
    it); an instance's own value shadows it at no cost (no ``__set__``: a non-data
    descriptor)."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__} has no {self.name!r} yet (set in __init__)")


class _tensor_py_operators(ArrayVariableMixin):
    """Theano's operator mixin of TensorVariable, TensorConstant and TensorSharedVariable
    (``theano.tensor.var._tensor_py_operators``): ``isinstance(x, _tensor_py_operators)``
    tells a symbolic tensor. symgpu.tensor.variable installs the Python operators and methods
    here (they build with modules above this one)."""

    type = _InstanceAttribute("The TensorType of this variable (dtype and broadcastable "
                              "pattern), set by Variable.__init__.")

    @property
    def dtype(self) -> str:
        """The element type, a NumPy dtype name (e.g. 'float64'): ``self.type.dtype``."""
        return self.type.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions: ``self.type.ndim``."""
        return self.type.ndim


class TensorVariable(_tensor_py_operators, Variable):
    """A symbolic tensor; operators and methods come from `_tensor_py_operators`."""

    def __init__(self, type: TensorType, owner=None, index=None, name=None):
        super().__init__(type, owner, index, name)
        _warn_float64(type.dtype)


class TensorConstant(Constant, TensorVariable):
    """A tensor with a fixed value (merged with equal constants by the optimizer)."""

    def __init__(self, type: TensorType, data: Any, name: str | None = None):
        Constant.__init__(self, type, type.filter(data), name)

    def signature(self) -> tuple:
        d = self.data
        return (self.type, d.shape, d.tobytes() if d.size <= 1024 else id(d))

    def auto_name(self) -> str:
        """Theano's text: the value (``TensorConstant{2.0}``, ``TensorConstant{[0 1 2]}``), an
        array of one repeated value as ``TensorConstant{(2,) of 2}``, and a text longer than
        20 characters cut to its first and last 10 (printed graphs stay readable and compare
        with Theano's)."""
        if self.name is not None:
            return self.name
        d = self.data
        flat = d.reshape(-1)
        if d.ndim and flat.size and bool((flat == flat[0]).all()):
            text = f"{d.shape} of {flat[0]}"
        else:
            text = str(d)
        if len(text) > 20:
            text = text[:10] + ".." + text[-10:]
        return f"TensorConstant{{{text}}}"


def tensor(dtype: str | None = None, shape: Sequence | None = None, name: str | None = None,
           broadcastable: Sequence[bool] | None = None) -> TensorVariable:
    """A symbolic tensor of the given dtype (floatX by default) and static shape/broadcast."""
    dtype = dtype or config.floatX
    if broadcastable is None:
        broadcastable = tuple(s == 1 for s in (shape or ()))
    return TensorType(dtype, broadcastable)(name)


def _constructor(bcast: tuple[bool, ...], default_dtype: str | None):
    def make(name: str | None = None, dtype: str | None = None) -> TensorVariable:
        return TensorType(dtype or default_dtype or config.floatX, bcast)(name)
    return make


scalar = _constructor((), None)
vector = _constructor((False,), None)
matrix = _constructor((False, False), None)
row = _constructor((True, False), None)
col = _constructor((False, True), None)
tensor3 = _constructor((False,) * 3, None)
tensor4 = _constructor((False,) * 4, None)


def constant(value: Any, name: str | None = None, ndim: int | None = None,
             dtype: str | None = None) -> TensorConstant:
    """A TensorConstant; Python floats take floatX, Python ints the narrowest int dtype that
    holds them (Theano's autocast_int: `T.constant(1)` is int8), unless dtype says."""
    if isinstance(value, TensorConstant):
        return value
    arr = _as_array(value, dtype)
    if ndim is not None:
        if arr.ndim > ndim:
            raise ValueError(f"constant {value!r} has {arr.ndim} dimensions, more than {ndim}")
        arr = arr.reshape((1,) * (ndim - arr.ndim) + arr.shape)
    ttype = TensorType(arr.dtype.name, tuple(s == 1 for s in arr.shape))
    cacheable = (name is None and arr.size == 1 and arr.dtype.kind in "iuf"
                 and -10 <= arr.reshape(-1)[0] <= 10
                 and (arr.dtype.kind != "f" or len(_SMALL_CONSTANTS) < _MAX_CACHED))
    if not cacheable:
        return TensorConstant(ttype, arr, name)
    key = (arr.dtype.name, arr.shape, arr.tobytes())
    const = _SMALL_CONSTANTS.get(key)
    if const is None:
        const = _SMALL_CONSTANTS[key] = TensorConstant(ttype, arr.copy(), None)
    return const


#: Theano's constant cache: an unnamed one-element number in [-10, 10] is one shared
#: TensorConstant, so `1 / (1 + e)` holds a single `TensorConstant{1}` (printed graphs show
#: it once, as Theano's do)
_SMALL_CONSTANTS: dict[tuple, TensorConstant] = {}
#: floats in [-10, 10] are many: past this many cached constants new ones are not kept
_MAX_CACHED = 10000


def python_number_array(value: Any) -> np.ndarray | None:
    """A Python bool, float or int as a 0-d array of symgpu's dtype for it (bool, floatX,
    int64); None for anything else. Shared values follow this rule; constants too, except
    that a Python int constant takes the narrowest int that holds it (`_as_array`)."""
    if isinstance(value, bool):
        return np.asarray(value)
    if isinstance(value, float):
        return np.asarray(value, dtype=config.floatX)
    if isinstance(value, int):
        return np.asarray(value, dtype="int64")
    return None


def computes_half_in_float32(perform: Callable) -> Callable:
    """Decorate an Op's `perform` built on a library with no half-precision kernels (LAPACK
    through NumPy or SciPy, pocketfft): float16/bfloat16 inputs reach it as float32 copies,
    and each output is rounded to its declared dtype. (NumPy's linalg refuses float16.)"""
    @functools.wraps(perform)
    def wrapper(self, node, inputs, output_storage):
        if not any(isinstance(i, np.ndarray) and i.dtype.name in HALF_DTYPES for i in inputs):
            return perform(self, node, inputs, output_storage)
        perform(self, node, [in_value_dtype(i) if isinstance(i, np.ndarray) else i
                             for i in inputs], output_storage)
        for cell, var in zip(output_storage, node.outputs):
            want = getattr(var.type, "dtype", None)
            if isinstance(cell[0], np.ndarray) and want and cell[0].dtype.name != want:
                cell[0] = cell[0].astype(want)
    return wrapper


def _as_array(value: Any, dtype: str | None) -> np.ndarray:
    if dtype is not None:
        return np.asarray(value, dtype=check_dtype(dtype))
    if isinstance(value, int) and not isinstance(value, bool):
        # Theano's autocast_int: the narrowest int that holds it (T.constant(1) is int8, so
        # `T.constant(1) - x` keeps a float32 x float32)
        for name in ("int8", "int16", "int32", "int64"):
            if np.iinfo(name).min <= value <= np.iinfo(name).max:
                return np.asarray(value, dtype=name)
    arr = python_number_array(value)
    if arr is not None:
        return arr
    arr = np.asarray(value)
    if dtype_kind(arr.dtype) == "f" and not isinstance(value, (np.ndarray, np.generic)):
        arr = arr.astype(config.floatX)
    return arr


#: how a list or tuple holding symbolic values becomes a tensor (their stack): tensor.basic,
#: which defines stack above this module, installs it when it loads
_SEQUENCES: list[Callable[[Sequence], "TensorVariable"]] = []


def as_tensor_variable(x: Any, name: str | None = None, ndim: int | None = None,
                       dtype: str | None = None) -> TensorVariable:
    """`x` as a symbolic tensor: variables pass through, values become constants."""
    if isinstance(x, TensorVariable):
        if ndim is not None and x.ndim != ndim:
            if x.ndim < ndim:
                return x.dimshuffle(*(("x",) * (ndim - x.ndim) + tuple(range(x.ndim))))
            raise ValueError(f"{x} has {x.ndim} dimensions, expected {ndim}")
        return x
    if isinstance(x, Variable):
        converted = getattr(x.type, "as_tensor", None)
        if converted is not None:
            return converted(x)
        raise TypeError(f"{x} ({x.type}) is not a tensor variable")
    if hasattr(x, "owner") and hasattr(x, "type"):
        raise TypeError(f"cannot use {x!r} as a tensor")
    if isinstance(x, (list, tuple)) and _SEQUENCES and any(isinstance(e, Variable) for e in x):
        # a sequence holding symbolic values ([x.shape[0], 3]): their stack, as Theano's
        out = _SEQUENCES[0](x)
        return out if ndim is None else as_tensor_variable(out, name, ndim, dtype)
    try:
        return constant(x, name=name, ndim=ndim, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot convert {x!r} ({type(x).__name__}) to a tensor: {exc}") from None


# ----------------------------------------------------------------------------- broadcast patterns
# The two ops that change only a variable's broadcast pattern live with the type: its
# conversions (filter_variable) insert them.

def check_declared_broadcastable(x: Any, broadcastable: Sequence[bool]) -> Any:
    """``x`` (a host or device array) after checking that each dim declared broadcastable has
    length 1 (SpecifyBroadcastable and its GPU twin)."""
    for d, b in enumerate(broadcastable):
        if b and x.shape[d] != 1:
            raise ValueError(f"dimension {d} of an array of shape {x.shape} was declared "
                             "broadcastable (length 1)")
    return x


class SpecifyBroadcastable(Op):
    """Asserts at run time that some dimensions have length 1, so the type can say so."""

    __props__ = ("broadcastable",)
    view_map = {0: [0]}

    def __init__(self, broadcastable: Sequence[bool]):
        self.broadcastable = tuple(bool(b) for b in broadcastable)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim != len(self.broadcastable):
            raise TypeError(f"{self}: {x} has {x.ndim} dimensions")
        bcast = tuple(a or b for a, b in zip(x.broadcastable, self.broadcastable))
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        out[0][0] = check_declared_broadcastable(inputs[0], self.broadcastable)

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def infer_shape(self, fgraph, node, input_shapes):
        """The input's shape with 1 where the op checks it (GpuSpecifyBroadcastable too)."""
        return [tuple(1 if b else s for b, s in zip(self.broadcastable, input_shapes[0]))]


def specify_broadcastable_as(x: Any, ttype: TensorType) -> TensorVariable:
    """`x` with the broadcastable pattern of `ttype` (dims may only become broadcastable
    if `x` is checked to have length 1 there; dims that `x` knows are 1 are relaxed)."""
    x = as_tensor_variable(x)
    if x.broadcastable == ttype.broadcastable:
        return x
    needed = tuple(b and not xb for b, xb in zip(ttype.broadcastable, x.broadcastable))
    if any(needed):
        x = SpecifyBroadcastable(needed)(x)
    if x.broadcastable != ttype.broadcastable:
        # only relaxation remains: a known-1 dim stands where any length is allowed
        x = Unbroadcast(tuple(xb and not b for xb, b in zip(x.broadcastable, ttype.broadcastable)))(x)
    return x


class Unbroadcast(Op):
    """Forget that some dimensions are known to have length 1 (a view, no run-time cost)."""

    __props__ = ("axes",)
    view_map = {0: [0]}

    def __init__(self, axes: Sequence[bool]):
        self.axes = tuple(bool(a) for a in axes)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        bcast = tuple(b and not a for b, a in zip(x.broadcastable, self.axes))
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        g = output_grads[0]
        return [specify_broadcastable_as(g, inputs[0].type.clone(dtype=g.dtype))]
