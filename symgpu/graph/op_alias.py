"""Theano's op class names for ops symgpu has under another class (issue 31): an alias is a
class only in name. Calling it builds our op from Theano's constructor arguments, and
``isinstance`` accepts our op where it is the one Theano's class would be, so code that
builds ``Sum(axis=0)(x)`` or tests ``isinstance(node.op, AbstractConv2d)`` runs unchanged
while graphs hold one op per operation (no twin classes for rewrites to miss)."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["op_alias"]


class _OpAliasMeta(type):
    """The metaclass of an alias: construction builds our op; isinstance asks `accepts`."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._build(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return bool(cls._accepts(obj))

    def __subclasscheck__(cls, sub: type) -> bool:
        return sub is cls


def op_alias(name: str, module: str, build: Callable[..., Any], accepts: Callable[[Any], bool],
             doc: str) -> type:
    """A Theano class name `name` (shown as `module`.`name`): `build(*args, **kwargs)` makes our
    op from Theano's constructor arguments, `accepts(op)` says which of our ops it names."""
    return _OpAliasMeta(name, (), {"__module__": module, "__doc__": doc, "__qualname__": name,
                                   "_build": staticmethod(build),
                                   "_accepts": staticmethod(accepts)})
