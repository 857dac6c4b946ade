"""Theano's small general helpers (theano.gof.utils): sequences, a topological sort of a
prerequisite table, memoizing, the creation traceback of a variable, deprecations. Kept
because code written for Theano uses them; nothing of symgpu's own depends on them."""
from __future__ import annotations

import functools
import hashlib
import sys
import traceback
import warnings
from typing import Any, Callable, Hashable, Iterable, Sequence

from symgpu.graph.basic import user_stack

__all__ = ["MethodNotDefined", "add_tag_trace", "deprecated", "difference", "flatten",
           "hash_from_code", "hash_from_file", "memoize", "remove", "simple_extract_stack",
           "toposort", "uniq"]


class MethodNotDefined(Exception):
    """Raised by a method an interface declares and a subclass did not define (Theano's)."""


def simple_extract_stack(f: Any = None, limit: int | None = None,
                         skips: Sequence[str] = ()) -> list[tuple[str, int, str, str]]:
    """The call stack as (filename, line number, function, source line) tuples, oldest first,
    as `traceback.extract_stack` gives it, but without reading files for frames whose path
    contains one of `skips` (why: Theano's cheap trace of where a variable was made)."""
    frame = sys._getframe(1) if f is None else f
    out: list[tuple[str, int, str, str]] = []
    while frame is not None and (limit is None or len(out) < limit):
        code = frame.f_code
        filename = code.co_filename
        if not any(s in filename for s in skips):
            line = traceback.linecache.getline(filename, frame.f_lineno).strip()
            out.append((filename, frame.f_lineno, code.co_name, line))
        frame = frame.f_back
    return out[::-1]


def add_tag_trace(thing: Any, user_line: int = 8) -> Any:
    """Record in `thing.tag.trace` where `thing` (a variable or node) was made: the caller's
    `user_line` frames outside symgpu, innermost last (the form symgpu's own variables carry
    and its error messages print); returns `thing`."""
    thing.tag.trace = user_stack(limit=max(int(user_line), 0))
    return thing


def deprecated(filename: str, msg: str = "") -> Callable[[Callable], Callable]:
    """A decorator: the function warns (DeprecationWarning, once) that it is deprecated."""
    def decorator(f: Callable) -> Callable:
        warned = []

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not warned:
                warnings.warn(f"{filename}.{f.__name__} deprecated. {msg}".rstrip(),
                              DeprecationWarning, stacklevel=2)
                warned.append(True)
            return f(*args, **kwargs)
        return wrapper
    return decorator


def uniq(seq: Iterable[Any]) -> list[Any]:
    """The elements of `seq` without repeats, in first-seen order."""
    out: list[Any] = []
    for x in seq:
        if x not in out:
            out.append(x)
    return out


def difference(seq1: Iterable[Any], seq2: Iterable[Any]) -> list[Any]:
    """The elements of `seq1` not in `seq2`, in order."""
    seq2 = list(seq2)
    return [x for x in seq1 if x not in seq2]


def remove(predicate: Callable[[Any], bool], coll: Iterable[Any]) -> list[Any]:
    """The elements of `coll` for which `predicate` is false."""
    return [x for x in coll if not predicate(x)]


def flatten(a: Any) -> list[Any]:
    """Nested lists and tuples as one flat list (anything else is one element)."""
    if isinstance(a, (list, tuple)):
        return [y for x in a for y in flatten(x)]
    return [a]


def memoize(f: Callable) -> Callable:
    """`f` caching its result per (positional, keyword) arguments (they must be hashable)."""
    cache: dict[Hashable, Any] = {}

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = f(*args, **kwargs)
        return cache[key]
    return wrapper


def toposort(prereqs_d: dict[Any, Iterable[Any]]) -> list[Any]:
    """The keys and prerequisites of `prereqs_d` ({x: [what x needs]}), each after what it
    needs; ValueError on a cycle (naming an element on it)."""
    order: list[Any] = []
    state: dict[Any, int] = {}   # 1: being visited, 2: done

    def visit(x: Any) -> None:
        stack = [(x, iter(prereqs_d.get(x, ())))]
        state[x] = 1
        while stack:
            node, it = stack[-1]
            for p in it:
                if state.get(p) == 1:
                    raise ValueError(f"toposort: the prerequisites have a cycle through {p!r}")
                if p not in state:
                    state[p] = 1
                    stack.append((p, iter(prereqs_d.get(p, ()))))
                    break
            else:
                stack.pop()
                state[node] = 2
                order.append(node)

    for x in prereqs_d:
        if x not in state:
            visit(x)
    return order


def hash_from_code(msg: str | bytes) -> str:
    """Theano's hash of source text: 'm' and the SHA-256 hex digest of its bytes."""
    if isinstance(msg, str):
        msg = msg.encode()
    return "m" + hashlib.sha256(msg).hexdigest()


def hash_from_file(file_path: str) -> str:
    """The SHA-256 hex digest of a file's bytes, as `hash_from_code` gives it."""
    with open(file_path, "rb") as fh:
        return hash_from_code(fh.read())
