"""TypedListType: a Python list whose elements all have one symgpu Type (Theano's
``theano.typed_list.type``).

A typed list has no shape: the type has no ``ndim``, so the shape machinery
(``symgpu.tensor.rewriting.shape_feature``) gives list inputs no shape and the ops that
return lists raise ``ShapeError`` from ``infer_shape`` (the rewrite then leaves the read
alone). Only ``length``/``index``/``count`` (0-d tensors) have shapes.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from symgpu.graph.basic import Constant, Type

__all__ = ["TypedListType", "SliceType", "SliceConstant", "copy_element"]


class TypedListType(Type):
    """A list of values of `ttype`; `depth` > 0 nests it (depth 1: a list of lists...)."""

    def __init__(self, ttype: Type, depth: int = 0):
        if depth < 0:
            raise ValueError(f"TypedListType: depth must be >= 0, got {depth}")
        if not isinstance(ttype, Type):
            raise TypeError(f"TypedListType expects a symgpu Type, got {ttype!r}")
        self.ttype = ttype if depth == 0 else TypedListType(ttype, depth - 1)

    def filter(self, x: Any, strict: bool = False, allow_downcast: bool | None = None) -> list:
        """`x` as a list, each element passed through the element type's filter (strict:
        `x` must be a list already)."""
        if strict and not isinstance(x, list):
            raise TypeError(f"{self}: expected a Python list, got {type(x).__name__}")
        if not isinstance(x, (list, tuple)):
            raise TypeError(f"{self}: expected a list or tuple, got {type(x).__name__}")
        out = []
        for i, y in enumerate(x):
            try:
                out.append(self.ttype.filter(y, strict=strict, allow_downcast=allow_downcast))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{self}: element {i} is not a {self.ttype}: {exc}") from exc
        return out

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.ttype == other.ttype

    def __hash__(self) -> int:
        return hash((type(self), self.ttype))

    def __str__(self) -> str:
        return f"TypedList <{self.ttype}>"

    __repr__ = __str__

    def get_depth(self) -> int:
        """0 for a list of non-lists, 1 for a list of such lists..."""
        return self.ttype.get_depth() + 1 if isinstance(self.ttype, TypedListType) else 0

    def values_eq(self, a: Any, b: Any) -> bool:
        return len(a) == len(b) and all(self.ttype.values_eq(x, y) for x, y in zip(a, b))

    def values_eq_approx(self, a: Any, b: Any) -> bool:
        return len(a) == len(b) and all(self.ttype.values_eq_approx(x, y) for x, y in zip(a, b))

    def may_share_memory(self, a: Any, b: Any) -> bool:
        """Whether two lists (or a list and an element) may share memory."""
        if a is b:
            return True
        a = a if isinstance(a, list) else [a]
        b = b if isinstance(b, list) else [b]
        share = getattr(self.ttype, "may_share_memory", None)
        for x in a:
            for y in b:
                if x is y:
                    return True
                if share is not None:
                    if share(x, y):
                        return True
                elif isinstance(x, np.ndarray) and isinstance(y, np.ndarray) \
                        and np.may_share_memory(x, y):
                    return True
        return False


def copy_element(value: Any) -> Any:
    """A copy of a list element that shares no memory with it."""
    if isinstance(value, np.ndarray):
        return value.copy()
    return copy.deepcopy(value)


class SliceType(Type):
    """The type of a constant Python slice (the index of ``GetItem`` that returns a list;
    Theano's ``tensor.type_other.SliceType``, constant slices only here)."""

    def filter(self, x: Any, strict: bool = False, allow_downcast: bool | None = None) -> slice:
        if not isinstance(x, slice):
            raise TypeError(f"expected a slice, got {type(x).__name__}")
        for b in (x.start, x.stop, x.step):
            if b is not None and not isinstance(b, (int, np.integer)):
                raise TypeError(f"slice bounds must be Python ints or None, got {x}")
        return x

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __str__(self) -> str:
        return "slice"


class SliceConstant(Constant):
    def signature(self) -> tuple:
        s = self.data
        return (self.type, (s.start, s.stop, s.step))

    def auto_name(self) -> str:
        if self.name is not None:
            return self.name
        s = self.data
        return f"slice({s.start}, {s.stop}, {s.step})"


SliceType.constant_type = SliceConstant
