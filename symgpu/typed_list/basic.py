"""Theano's typed-list ops (``theano.typed_list.basic``): GetItem, Append, Extend, Insert,
Remove, Reverse, Index, Count, Length, MakeList, and the variables' list methods.

Values are Python lists. An op that returns a list without ``inplace`` returns a new list
holding the same element objects as its input (declared ``view_map = {0: [0]}``, so an
in-place op on an element sees the list it came from); the in-place versions
(``Append(inplace=True)``...) change their input list and declare ``destroy_map = {0: [0]}``;
the pass in ``symgpu.typed_list.rewriting`` switches to them where the destroy handler
allows. Elements added to a list (append, extend, insert, make_list) are copied, so the
result shares no memory with those inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable, Constant
from symgpu.graph.op import Op, ShapeError
from symgpu.tensor.math import cast
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable
from symgpu.typed_list.type import SliceType, TypedListType, copy_element

__all__ = ["TypedListVariable", "TypedListConstant", "GetItem", "Append", "Extend", "Insert",
           "Remove", "Reverse", "Index", "Count", "Length", "MakeList", "getitem", "append",
           "extend", "insert", "remove", "reverse", "index_", "count", "length", "make_list"]


class _typed_list_py_operators:
    """The list methods of typed-list variables (Theano's names)."""

    def __getitem__(self, index):
        return getitem(self, index)

    def append(self, toAppend):
        return append(self, toAppend)

    def extend(self, toAppend):
        return extend(self, toAppend)

    def insert(self, index, toInsert):
        return insert(self, index, toInsert)

    def remove(self, toRemove):
        return remove(self, toRemove)

    def reverse(self):
        return reverse(self)

    def count(self, elem):
        return count(self, elem)

    def ind(self, elem):
        """list.index (``index`` is taken: a Variable's position among its owner's outputs)."""
        return index_(self, elem)

    def length(self):
        """len(list) as an int64 scalar (Python's ``len`` must return an int, so
        ``__len__`` cannot give a symbolic length)."""
        return length(self)

    # Python's iteration protocol would fall back on __getitem__ with 0, 1, 2... forever
    __iter__ = None

    ttype = property(lambda self: self.type.ttype)
    dtype = property(lambda self: self.type.ttype.dtype)


class TypedListVariable(_typed_list_py_operators, Variable):
    """A symbolic typed list."""


class TypedListConstant(_typed_list_py_operators, Constant):
    """A constant typed list."""

    def signature(self) -> tuple:
        return (self.type, id(self.data))


TypedListType.variable_type = TypedListVariable
TypedListType.constant_type = TypedListConstant


def _as_list(x: Any, what: str) -> Variable:
    if isinstance(x, Variable):
        if not isinstance(x.type, TypedListType):
            raise TypeError(f"{what}: expected a typed list, got {x} ({x.type})")
        return x
    raise TypeError(f"{what}: expected a typed-list variable, got {type(x).__name__}")


def _as_element(ttype: Any, e: Any, what: str) -> Variable:
    """`e` as a variable of the list's element type (TypeError if it cannot be)."""
    if not isinstance(e, Variable):
        try:
            e = ttype.make_constant(e) if not isinstance(ttype, TensorType) else \
                as_tensor_variable(ttype.filter(e, allow_downcast=False))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}: {e!r} is not a {ttype}: {exc}") from exc
    got = ttype.convert_variable(e) if e.type != ttype else e
    if got is None:
        raise TypeError(f"{what}: the element must be a {ttype}, got {e} ({e.type})")
    return got


def _as_index(i: Any, what: str) -> Variable:
    """An int64 scalar index."""
    if isinstance(i, Variable):
        if not (isinstance(i.type, TensorType) and i.ndim == 0 and i.dtype[:3] in ("int", "uin")):
            raise TypeError(f"{what}: the index must be an integer scalar, got {i} ({i.type})")
        return i if i.dtype == "int64" else cast(i, "int64")
    if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"{what}: the index must be an int, got {i!r}")
    return as_tensor_variable(np.asarray(i, dtype="int64"))


def _no_list_shape(node: Apply) -> ShapeError:
    return ShapeError(f"{node.op}: a typed list has no shape (its elements may differ in shape)")


class _ListOp(Op):
    """Common str; lists have no shape (see symgpu.typed_list.type)."""

    def __str__(self) -> str:
        inplace = getattr(self, "inplace", False)
        return f"{type(self).__name__}{{inplace}}" if inplace else type(self).__name__

    def infer_shape(self, fgraph, node, input_shapes):
        raise _no_list_shape(node)


class GetItem(_ListOp):
    """``x[i]`` (an element) or ``x[a:b:c]`` (a list); the result is a view of `x`."""
    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x, index):
        x = _as_list(x, "GetItem")
        if isinstance(index, slice):
            index = SliceType().make_constant(index)
        if isinstance(index, Variable) and isinstance(index.type, SliceType):
            return Apply(self, [x, index], [x.type()])
        index = _as_index(index, "GetItem")
        return Apply(self, [x, index], [x.ttype()])

    def perform(self, node, inputs, output_storage):
        x, index = inputs
        output_storage[0][0] = x[index if isinstance(index, slice) else int(index)]

    def infer_shape(self, fgraph, node, input_shapes):
        if isinstance(node.inputs[1].type, SliceType):
            raise _no_list_shape(node)
        raise ShapeError(f"{node.op}: an element's shape is not known from the list's type")


getitem = GetItem()


class _Mutating(_ListOp):
    """A list op with Theano's `inplace` option: in place it changes and returns input 0."""
    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        if self.inplace:
            self.destroy_map = {0: [0]}
        else:
            self.view_map = {0: [0]}

    def _start(self, x: list) -> list:
        return x if self.inplace else list(x)


class Append(_Mutating):
    """``x + [y]`` (a copy of y)."""

    def make_node(self, x, toAppend):
        x = _as_list(x, "Append")
        return Apply(self, [x, _as_element(x.ttype, toAppend, "Append")], [x.type()])

    def perform(self, node, inputs, output_storage):
        x, y = inputs
        out = self._start(x)
        out.append(copy_element(y))
        output_storage[0][0] = out


class Extend(_Mutating):
    """``x + y`` for two lists of one type (y's elements copied)."""

    def make_node(self, x, toAppend):
        x = _as_list(x, "Extend")
        if not isinstance(toAppend, Variable):
            toAppend = x.type.make_constant(toAppend)
        if toAppend.type != x.type:
            raise TypeError(f"Extend: the lists must have one type, got {x.type} and "
                            f"{toAppend.type}")
        return Apply(self, [x, toAppend], [x.type()])

    def perform(self, node, inputs, output_storage):
        x, y = inputs
        added = [copy_element(e) for e in y]   # before x changes (y may be x)
        out = self._start(x)
        out.extend(added)
        output_storage[0][0] = out


class Insert(_Mutating):
    """``x.insert(index, y)`` on a copy (Python's rules for out-of-range indices)."""

    def make_node(self, x, index, toInsert):
        x = _as_list(x, "Insert")
        return Apply(self, [x, _as_index(index, "Insert"),
                            _as_element(x.ttype, toInsert, "Insert")], [x.type()])

    def perform(self, node, inputs, output_storage):
        x, index, y = inputs
        out = self._start(x)
        out.insert(int(index), copy_element(y))
        output_storage[0][0] = out


def _find(ttype: Any, x: list, elem: Any) -> list[int]:
    """Positions of the elements equal to `elem` (the element type's values_eq: arrays
    compare as wholes, where Python's == would compare elementwise)."""
    return [i for i, v in enumerate(x) if ttype.values_eq(v, elem)]


class Remove(_Mutating):
    """Removes the first element equal to `toRemove` (Theano: nothing happens if none is)."""

    def make_node(self, x, toRemove):
        x = _as_list(x, "Remove")
        return Apply(self, [x, _as_element(x.ttype, toRemove, "Remove")], [x.type()])

    def perform(self, node, inputs, output_storage):
        x, y = inputs
        out = self._start(x)
        for i, v in enumerate(out):
            if node.inputs[0].type.ttype.values_eq(v, y):
                del out[i]
                break
        output_storage[0][0] = out


class Reverse(_Mutating):
    """The list in reverse order."""

    def make_node(self, x):
        x = _as_list(x, "Reverse")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        out = self._start(inputs[0])
        out.reverse()
        output_storage[0][0] = out


class _ScalarOfList(Op):
    """An op returning an int64 scalar about a list: its shape is ()."""
    __props__ = ()

    def __str__(self) -> str:
        return type(self).__name__

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


class Index(_ScalarOfList):
    """The position of the first element equal to `elem` (an int64 scalar; Theano gives a
    floatX one); ValueError if there is none, as Python's list.index."""

    def make_node(self, x, elem):
        x = _as_list(x, "Index")
        return Apply(self, [x, _as_element(x.ttype, elem, "Index")],
                     [TensorType("int64", ())()])

    def perform(self, node, inputs, output_storage):
        x, elem = inputs
        found = _find(node.inputs[0].type.ttype, x, elem)
        if not found:
            raise ValueError("Index: the element is not in the list")
        output_storage[0][0] = np.asarray(found[0], dtype="int64")


class Count(_ScalarOfList):
    """How many elements equal `elem` (an int64 scalar; Theano gives a floatX one)."""

    def make_node(self, x, elem):
        x = _as_list(x, "Count")
        return Apply(self, [x, _as_element(x.ttype, elem, "Count")],
                     [TensorType("int64", ())()])

    def perform(self, node, inputs, output_storage):
        x, elem = inputs
        output_storage[0][0] = np.asarray(len(_find(node.inputs[0].type.ttype, x, elem)),
                                          dtype="int64")


class Length(_ScalarOfList):
    """len(x), an int64 scalar."""

    def make_node(self, x):
        x = _as_list(x, "Length")
        return Apply(self, [x], [TensorType("int64", ())()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = np.asarray(len(inputs[0]), dtype="int64")


class MakeList(_ListOp):
    """A typed list of the given variables (all of one type; their values are copied)."""
    __props__ = ()

    def make_node(self, a):
        if not isinstance(a, (list, tuple)) or not a:
            raise TypeError("MakeList expects a non-empty list or tuple of variables")
        items = [e if isinstance(e, Variable) else as_tensor_variable(e) for e in a]
        if not all(e.type == items[0].type for e in items):
            raise TypeError("MakeList needs all its variables to have one type, got "
                            + ", ".join(str(e.type) for e in items))
        return Apply(self, items, [TypedListType(items[0].type)()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = [copy_element(v) for v in inputs]


append = Append()
extend = Extend()
insert = Insert()
remove = Remove()
reverse = Reverse()
index_ = Index()
count = Count()
length = Length()
make_list = MakeList()
