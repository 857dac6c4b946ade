"""Theano's small graph types (theano.gof.type): a type of any Python object, types with no
attributes, and enumerations used as op parameters.

Why here: they are graph-core types (no tensors, no backend), so any op can take one as a
parameter type or hold a variable of one. Theano's C-linker halves (C declarations, C macro
constants) have no counterpart in symgpu; the Python behaviour is Theano's.
"""
from __future__ import annotations

import re
from typing import Any

from symgpu.graph.basic import Type

__all__ = ["SingletonType", "Generic", "generic", "EnumType", "EnumList", "CEnumType"]


class SingletonType(Type):
    """A Type subclass with no attributes: one instance per class, all instances equal.
    Why: saves such types writing their own __eq__/__hash__ (Theano's SingletonType)."""

    _instance: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "SingletonType":
        # the instance is stored on the class itself: a subclass does not find its parent's
        if cls.__dict__.get("_instance") is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __str__(self) -> str:
        return type(self).__name__

    def __eq__(self, other: object) -> bool:
        return self is other or type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __reduce__(self) -> Any:
        return (type(self), ())


class Generic(SingletonType):
    """The type of any Python object: `filter` returns the value unchanged."""

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        return value

    def is_valid_value(self, value: Any) -> bool:
        return True


#: the one Generic instance (Theano's ``theano.gof.type.generic``)
generic = Generic()

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


class EnumType(Type, dict):
    """Named constants as one op-parameter type: ``EnumType(A=1, B=('beta', 2.5))`` gives
    ``enum.A == 1``, ``enum.fromalias('beta') == 2.5``; a value of the type is one of the
    constants (non-strict `filter` also takes a constant's name or alias, and bools).

    Names are capitals, digits and underscores; values ints or floats (bools become ints).
    ``ctype`` (default ``'double'``) and ``cname`` are kept as Theano's (they name the C
    type of Theano's C code, part of equality here as there)."""

    def __init__(self, **kwargs: Any):
        ctype = " ".join(str(kwargs.pop("ctype", "double")).split())
        if not all(_IDENT.match(p) for p in ctype.split()):
            raise TypeError(f"{type(self).__name__}: invalid C type {ctype!r}")
        cname = kwargs.pop("cname", ctype.replace(" ", "_"))
        if not _IDENT.match(cname):
            raise TypeError(f"{type(self).__name__}: invalid C name {cname!r}")
        aliases: dict[str, str] = {}
        for k in list(kwargs):
            if _NAME.match(k) is None:
                raise AttributeError(f'{type(self).__name__}: invalid enum name: "{k}". Only '
                                     "capital letters, underscores and digits are allowed.")
            value = kwargs[k]
            if isinstance(value, (list, tuple)):
                if len(value) != 2:
                    raise TypeError(f"{type(self).__name__}: a constant given as a tuple is "
                                    f"(alias, value), got {value!r} for {k}")
                alias, value = value
                if not isinstance(alias, str):
                    raise TypeError(f"{type(self).__name__}: constant alias should be a "
                                    f"string, got {alias!r}")
                if alias == k:
                    raise TypeError(f"{type(self).__name__}: alias {alias!r} is the name of "
                                    "its own constant")
                if alias in aliases:
                    raise TypeError(f"{type(self).__name__}: constant alias {alias!r} "
                                    "already used")
                aliases[alias] = k
            if isinstance(value, bool):
                value = int(value)
            elif not isinstance(value, (int, float)):
                raise TypeError(f'{type(self).__name__}: constant "{k}": expected integer or '
                                f'floating value, got "{type(value).__name__}"')
            kwargs[k] = value
        if any(a in kwargs for a in aliases):
            raise TypeError(f"{type(self).__name__}: some aliases have same names as constants")
        dict.__init__(self, **kwargs)
        object.__setattr__(self, "ctype", ctype)
        object.__setattr__(self, "cname", cname)
        object.__setattr__(self, "aliases", aliases)

    def fromalias(self, alias: str) -> Any:
        """The constant of this alias (or, for a name that is no alias, of that name)."""
        return self[self.aliases[alias]] if alias in self.aliases else self[alias]

    def has_alias(self, alias: str) -> bool:
        return alias in self.aliases

    def get_aliases(self) -> tuple[str, ...]:
        """The sorted aliases."""
        return tuple(sorted(self.aliases))

    def __repr__(self) -> str:
        shown = {k: "" for k in self}
        for a, k in self.aliases.items():
            shown[k] = f"({a})"
        return f"{type(self).__name__}<{self.ctype}>(" + ", ".join(
            f"{k}{shown[k]}:{self[k]}" for k in sorted(self)) + ")"

    __str__ = __repr__

    def __getattr__(self, key: str) -> Any:
        if key in self:
            return self[key]
        raise AttributeError(f"{type(self).__name__} has no constant or attribute {key!r}")

    def __setattr__(self, key: str, value: Any) -> None:
        if key in self:
            raise AttributeError("constant values are immutable")
        object.__setattr__(self, key, value)

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError("constant values are immutable")

    def __delitem__(self, key: str) -> None:
        raise TypeError("constant values are immutable")

    def __hash__(self) -> int:
        return hash((type(self), self.ctype) + tuple(sorted(self.items()))
                    + tuple(sorted(self.aliases.items())))

    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and self.ctype == other.ctype
                and dict.__eq__(self, other) and self.aliases == other.aliases)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> Any:
        return (_rebuild_enum, (type(self), dict(self), self.aliases, self.ctype, self.cname))

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        if not strict:
            if isinstance(value, bool):
                value = int(value)
            elif isinstance(value, str):
                value = self.fromalias(value)
        if value not in self.values():
            raise TypeError(f"{value!r} is not a constant of {self!r}")
        return value


def _rebuild_enum(cls: type, values: dict, aliases: dict, ctype: str, cname: str) -> EnumType:
    inverse = {k: a for a, k in aliases.items()}
    obj = EnumType.__new__(cls)
    EnumType.__init__(obj, ctype=ctype, cname=cname,
                      **{k: ((inverse[k], v) if k in inverse else v) for k, v in values.items()})
    return obj


class EnumList(EnumType):
    """An EnumType of consecutive ints: ``EnumList('A', ('B', 'beta'), 'C')`` gives A=0, B=1
    (alias 'beta'), C=2; ``ctype`` defaults to ``'int'``."""

    def __init__(self, *args: Any, **kwargs: Any):
        if set(kwargs) - {"ctype", "cname"}:
            raise TypeError(f"{type(self).__name__}: only ctype and cname are keywords, got "
                            f"{sorted(kwargs)}")
        consts: dict[str, Any] = {}
        for rank, arg in enumerate(args):
            if isinstance(arg, (list, tuple)):
                if len(arg) != 2:
                    raise TypeError(f"{type(self).__name__}: a constant given as a tuple is "
                                    f"(name, alias), got {arg!r}")
                name, alias = arg
                if not isinstance(alias, str):
                    raise TypeError(f"{type(self).__name__}: constant alias should be a "
                                    f"string, got {alias!r}")
                value: Any = (alias, rank)
            else:
                name, value = arg, rank
            if not isinstance(name, str):
                raise TypeError(f"{type(self).__name__}: constant name should be a string, "
                                f"got {name!r}")
            if name in consts:
                raise TypeError(f'{type(self).__name__}: constant name already used ("{name}")')
            consts[name] = value
        super().__init__(ctype=kwargs.get("ctype", "int"),
                         **({"cname": kwargs["cname"]} if "cname" in kwargs else {}), **consts)

    def __reduce__(self) -> Any:
        return (_rebuild_enum, (type(self), dict(self), self.aliases, self.ctype, self.cname))


class CEnumType(EnumList):
    """An EnumList whose names are the names of C constants: in Python its values are the
    arbitrary ranks 0, 1, ... (to choose among the constants, as in Theano); Theano's C code
    read the C values instead, which symgpu (no per-op C code) never needs."""
