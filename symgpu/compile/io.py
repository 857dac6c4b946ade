"""In and Out: how a compiled function takes its arguments and returns its results."""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Variable

__all__ = ["In", "Out"]


class In:
    """A function input with options.

    `value` is a default used when the argument is omitted; `name` allows keyword calls;
    `mutable=True` lets the function overwrite the argument in place; `strict=True` refuses
    values that would need a conversion; `allow_downcast` accepts lossy conversions.
    """

    def __init__(self, variable: Variable, name: str | None = None, value: Any = None,
                 mutable: bool = False, strict: bool = False, allow_downcast: bool | None = None,
                 borrow: bool = False, implicit: bool = False, update: Variable | None = None,
                 autoname: bool = True):
        """`autoname` (Theano's): without a `name`, take the variable's name (False: none)."""
        if not isinstance(variable, Variable):
            raise TypeError(f"In() takes a symbolic variable, got {type(variable).__name__}")
        self.variable = variable
        self.autoname = autoname
        self.name = name if name is not None or not autoname else variable.name
        self.value = value
        self.has_default = value is not None
        self.mutable = mutable
        self.strict = strict
        self.allow_downcast = allow_downcast
        self.borrow = borrow
        self.implicit = implicit
        self.update = update

    def __repr__(self) -> str:
        return f"In({self.variable})"


class Out:
    """A function output; `borrow=True` returns the internal buffer (no copy; a GPU result
    stays a GpuArray) and lets the next call overwrite it."""

    def __init__(self, variable: Variable, borrow: bool = False):
        if not isinstance(variable, Variable):
            raise TypeError(f"Out() takes a symbolic variable, got {type(variable).__name__}")
        self.variable = variable
        self.borrow = borrow

    def __repr__(self) -> str:
        return f"Out({self.variable}, borrow={self.borrow})"
