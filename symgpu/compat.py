"""Theano's ``theano.compat``: the Python 2/3 helpers that code written for Theano imports
(``from theano.compat import OrderedDict, izip, PY3``), in their Python 3 form.

symgpu runs on Python 3 only, so each name is the standard library's own (``izip`` is
``zip``); the module exists so that such imports keep working unchanged.
"""
from __future__ import annotations

import configparser
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, MutableMapping as DictMixin, ValuesView
from importlib import reload
from io import BytesIO
from operator import truediv as operator_div
from typing import Any, Iterator

__all__ = ["PY3", "b", "BytesIO", "Callable", "next", "configparser", "reload", "cmp",
           "operator_div", "DictMixin", "Iterable", "Mapping", "OrderedDict", "ValuesView",
           "decode", "decode_iter", "decode_with", "get_unbound_function", "imap", "izip",
           "ifilter", "exc_message", "DefaultOrderedDict", "maybe_add_to_os_environ_pathlist"]

PY3 = True
next = next  # noqa: PLW0127 - Theano re-exported six's `next`, the builtin on Python 3
izip, imap, ifilter = zip, map, filter


def b(s: str) -> bytes:
    """A str literal as bytes (six.b): Latin-1, byte for character."""
    return s.encode("latin-1")


def exc_message(e: BaseException) -> Any:
    """The message of `e`, unpacking exceptions re-raised as another's first argument."""
    msg = e.args[0]
    return exc_message(msg) if isinstance(msg, BaseException) else msg


def cmp(x: Any, y: Any) -> int:
    """Python 2's cmp: -1 if x < y, 0 if x == y, 1 if x > y."""
    return (x > y) - (x < y)


def get_unbound_function(unbound: Any) -> Any:
    """The function under a bound or unbound method (the object itself for a function)."""
    return getattr(unbound, "__func__", unbound)


def decode(x: bytes) -> str:
    return x.decode()


def decode_iter(itr: Iterable) -> Iterator[str]:
    for x in itr:
        yield x.decode()


def decode_with(x: bytes, encoding: str) -> str:
    return x.decode(encoding)


class DefaultOrderedDict(OrderedDict):
    """An OrderedDict with a default factory, as collections.defaultdict has."""

    def __init__(self, default_factory: Callable | None = None, *a: Any, **kw: Any):
        if default_factory is not None and not callable(default_factory):
            raise TypeError("DefaultOrderedDict: first argument must be callable, got "
                            f"{type(default_factory).__name__}")
        super().__init__(*a, **kw)
        self.default_factory = default_factory

    def __missing__(self, key: Any) -> Any:
        if self.default_factory is None:
            raise KeyError(key)
        self[key] = value = self.default_factory()
        return value

    def __reduce__(self):
        args = () if self.default_factory is None else (self.default_factory,)
        return type(self), args, None, None, iter(list(self.items()))

    def copy(self) -> "DefaultOrderedDict":
        return type(self)(self.default_factory, self)

    __copy__ = copy


def maybe_add_to_os_environ_pathlist(var: str, newpath: str) -> None:
    """Put absolute `newpath` at the front of the path list in environment variable `var`
    unless it is there already."""
    if os.path.isabs(newpath):
        old = [p for p in os.environ.get(var, "").split(os.pathsep) if p]
        if newpath not in old:
            os.environ[var] = os.pathsep.join([newpath] + old)
