"""Theano's NumPy-RandomState graph values (theano.tensor.raw_random): `RandomStateType`,
`random_state_type` and `RandomFunction`, the op that calls one of a RandomState's methods.

symgpu's own random streams are Philox counters (raw.py, docs/random.md); these are for code
that holds a ``numpy.random.RandomState`` in the graph as Theano's raw_random did: the draw
runs on the host through NumPy, returning ``(new_state, sample)`` where ``new_state`` is the
generator moved on (a copy unless the op is in place), so the same seed gives NumPy's numbers.
"""
from __future__ import annotations

from copy import deepcopy
from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Apply, Type
from symgpu.graph.op import Op, ShapeError
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["RandomStateType", "random_state_type", "RandomFunction"]


class RandomStateType(Type):
    """The Type of a ``numpy.random.RandomState`` value. Why a Type of its own: two generators
    in the same state do not compare equal with ``==``; `values_eq` compares their states."""

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __str__(self) -> str:
        return "RandomStateType"

    __repr__ = __str__

    def filter(self, data: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        if self.is_valid_value(data):
            return data
        raise TypeError(f"RandomStateType: expected a numpy.random.RandomState, got "
                        f"{type(data).__name__}")

    def is_valid_value(self, a: Any) -> bool:
        return type(a) is np.random.RandomState

    def values_eq(self, a: Any, b: Any) -> bool:
        sa, sb = a.get_state(), b.get_state()
        # (name 'MT19937', 624 keys, pos, has_gauss, cached_gaussian: only read if has_gauss)
        return (sa[0] == sb[0] and bool(np.all(sa[1] == sb[1])) and sa[2] == sb[2]
                and sa[3] == sb[3] and (sa[3] == 0 or sa[4] == sb[4]))

    def get_shape_info(self, obj: Any) -> None:
        return None

    def get_size(self, shape_info: Any) -> int:
        """Bytes of a generator's state (it has a fixed size)."""
        size = 0
        for elem in np.random.RandomState().get_state():
            if isinstance(elem, str):
                size += len(elem)
            elif isinstance(elem, np.ndarray):
                size += elem.size * elem.itemsize
            elif isinstance(elem, int):
                size += np.dtype("int").itemsize
            else:
                size += np.dtype("float").itemsize
        return size

    @staticmethod
    def copy_value(a: Any) -> Any:
        """A generator in the same state (a function returns copies of its aliased outputs)."""
        return deepcopy(a)

    @staticmethod
    def may_share_memory(a: Any, b: Any) -> bool:
        return a is b


#: the one RandomStateType (``random_state_type()`` makes a variable of it)
random_state_type = RandomStateType()


class RandomFunction(Op):
    """``RandomFunction(fn, outtype, inplace=False, ndim_added=0)(r, shape, *args)`` ->
    ``(new_r, sample)``: ``fn`` (a RandomState method name, or a function of the same form
    taking the size last) draws a sample of `outtype` of shape `shape` (an integer vector;
    empty: NumPy's default size, from the arguments' shapes), with `ndim_added` more trailing
    dimensions (multinomial's, permutation's). In place, `r` itself moves on."""

    __props__ = ("fn", "outtype", "inplace", "ndim_added")

    def __init__(self, fn: str | Callable, outtype: TensorType, inplace: bool = False,
                 ndim_added: int = 0):
        self.fn = fn
        if isinstance(fn, str):
            if not callable(getattr(np.random.RandomState, fn, None)):
                raise ValueError(f"RandomFunction: numpy.random.RandomState has no method "
                                 f"{fn!r}")
            self.exec_fn = getattr(np.random.RandomState, fn)
        else:
            self.exec_fn = fn
        if not isinstance(outtype, TensorType):
            raise TypeError(f"RandomFunction: outtype must be a TensorType, got {outtype!r}")
        self.outtype = outtype
        self.inplace = bool(inplace)
        self.ndim_added = int(ndim_added)
        if self.inplace:
            self.destroy_map = {0: [0]}

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d.pop("exec_fn", None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        fn = d["fn"]
        self.exec_fn = getattr(np.random.RandomState, fn) if isinstance(fn, str) else fn

    def __str__(self) -> str:
        return f"RandomFunction{{{getattr(self.exec_fn, '__name__', self.fn)}}}"

    def make_node(self, r: Any, shape: Any, *args: Any) -> Apply:
        if not isinstance(getattr(r, "type", None), RandomStateType):
            raise TypeError(f"{self}: the state must be a variable of RandomStateType "
                            f"(random_state_type()), got {r!r}")
        shape_v = as_tensor_variable(shape, ndim=1)
        if isinstance(shape, (tuple, list)) and len(shape) == 0:
            shape_v = shape_v.astype("int64")
        if shape_v.dtype not in ("int32", "int64"):
            raise TypeError(f"{self}: shape must be an int32/int64 vector, got "
                            f"{shape_v.type}")
        tensors = [as_tensor_variable(a) for a in args]
        return Apply(self, [r, shape_v, *tensors], [r.type(), self.outtype()])

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        shp = node.inputs[1]
        data = getattr(shp, "data", None)
        if self.ndim_added == 0 and not (data is not None and len(data) == 0):
            return [None, [shp[i] for i in range(node.outputs[1].ndim)]]
        raise ShapeError(f"{self}: the sample's shape depends on its arguments")

    def perform(self, node: Apply, inputs: list, out_: list) -> None:
        r, shape, args = inputs[0], inputs[1], list(inputs[2:])
        if type(r) is not np.random.RandomState:
            raise TypeError(f"{self}: state is {type(r).__name__}, not a RandomState")
        size = None if len(shape) == 0 else tuple(int(s) for s in shape)
        ndim = self.outtype.ndim
        if size is not None and ndim != len(size) + self.ndim_added:
            raise ValueError(f"{self}: shape mismatch: the output has {ndim} dimensions, "
                             f"len(shape) ({len(size)}) + ndim_added ({self.ndim_added}) "
                             f"!= {ndim}")
        if not self.inplace:
            r = deepcopy(r)   # NumPy 2: copy.copy would share the bit generator
        out_[0][0] = r
        rval = np.asarray(self.exec_fn(r, *(args + [size])), dtype=self.outtype.dtype)
        if size is None and rval.ndim == 0 and ndim > 0:
            rval = rval.reshape([1] * ndim)
        if rval.ndim != ndim:
            raise ValueError(f"{self}: the output should have {ndim} dimensions, the draw "
                             f"has shape {rval.shape}")
        if size is not None:
            head = rval.shape[:rval.ndim - self.ndim_added]
            if head != size:
                raise ValueError(f"{self}: the draw has shape {rval.shape}, expected "
                                 f"{size} (plus {self.ndim_added} more dimensions)")
        out_[1][0] = rval

    def grad(self, inputs: list, output_grads: list) -> list:
        return [None] * len(inputs)   # no gradient through a random draw

    def R_op(self, inputs: list, eval_points: list) -> list:
        return [None] * len(eval_points)
