"""Theano's `ParamsType`/`Params` (theano.gof.params_type): many op parameters bundled into one
typed, hashable, immutable value.

Theano uses them to hand an op's parameters to its C code as one struct; here they are the
Python side of that contract: a `ParamsType(name=Type, ...)` whose values are `Params` (a
read-only dict with attribute access), filtered field by field through each field's Type,
compared with the fields' `values_eq` and hashed through their constants' signatures, so a
`Params` can be an op's property (symgpu's ops compare and merge by their props). Enumeration
constants of `EnumType` fields are reachable through the `ParamsType` as Theano's are.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from symgpu.graph.basic import Type
from symgpu.graph.theano_types import EnumType

__all__ = ["ParamsType", "Params"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: names Theano refuses as fields (they would be C/C++ keywords in its struct)
C_CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t
class compl const constexpr const_cast continue decltype default delete do double dynamic_cast
else enum explicit export extern false float for friend goto if inline int long mutable
namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual
void volatile wchar_t while xor xor_eq""".split())


class Params(dict):
    """The value of a `ParamsType`: each field's value, read as ``params.field`` or
    ``params["field"]``; immutable, so that it can be hashed and serve as an op property."""

    def __init__(self, params_type: "ParamsType", **kwargs: Any):
        if not isinstance(params_type, ParamsType):
            raise TypeError("Params: 1st constructor argument should be a ParamsType, got "
                            f"{type(params_type).__name__}")
        for field in params_type.fields:
            if field not in kwargs:
                raise TypeError(f'Params: ParamsType attribute "{field}" not in Params args '
                                f"(given: {sorted(kwargs)})")
        super().__init__(**kwargs)
        self.__dict__.update(__params_type__=params_type, __signatures__=None)

    def __repr__(self) -> str:
        return "Params(%s)" % ", ".join(f"{k}:{type(self[k]).__name__}:{self[k]}"
                                        for k in sorted(self.keys()))

    def __getattr__(self, key: str) -> Any:
        if key not in self:
            raise AttributeError(f'Params: attribute "{key}" does not exist')
        return self[key]

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Params is immutable")

    __setattr__ = __setitem__ = __delitem__ = _immutable
    update = pop = popitem = clear = setdefault = _immutable

    def __reduce__(self) -> tuple:
        return (_rebuild_params, (self.__params_type__, dict(self)))

    def __hash__(self) -> int:  # type: ignore[override]
        pt = self.__params_type__
        if self.__signatures__ is None:   # values are immutable: computed once
            self.__dict__["__signatures__"] = tuple(_value_key(self[f]) for f in pt.fields)
        return hash((type(self), pt) + self.__signatures__)

    def __eq__(self, other: Any) -> bool:
        pt = self.__params_type__
        return (type(self) is type(other) and pt == other.__params_type__
                and all(t.values_eq(self[f], other[f]) for f, t in zip(pt.fields, pt.types)))

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)


def _value_key(value: Any) -> Any:
    """A hashable key of a field's value that equal values share (arrays by content)."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        a = np.asarray(value)
        return (str(a.dtype), a.shape, a.tobytes())
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _rebuild_params(params_type: "ParamsType", values: dict) -> Params:
    return Params(params_type, **values)


class ParamsType(Type):
    """A struct of Types: ``ParamsType(attr1=TensorType('int32', (False,)), attr2=Scalar(...))``
    (fields sorted by name). Its values are `Params`; `get_params(op)` collects them from an
    op's attributes. Not for ordinary graph inputs: it types op parameters."""

    def __init__(self, **kwargs: Type):
        if not kwargs:
            raise ValueError("Cannot create ParamsType from empty data.")
        for name, t in kwargs.items():
            if _IDENTIFIER.match(name) is None:
                raise AttributeError(f'ParamsType: attribute "{name}" should be a valid '
                                     "identifier.")
            if name in C_CPP_KEYWORDS:
                raise SyntaxError(f'ParamsType: "{name}" is a potential C/C++ keyword and '
                                  "should not be used as attribute name.")
            if not isinstance(t, Type):
                raise TypeError(f'ParamsType: attribute "{name}" should inherit from Type, '
                                f'got "{type(t).__name__}".')
        self.length = len(kwargs)
        self.fields = tuple(sorted(kwargs))
        self.types = tuple(kwargs[f] for f in self.fields)
        self.name = self.generate_struct_name()
        enums = [t for t in self.types if isinstance(t, EnumType)]
        names = [k for t in enums for k in t]
        aliases = [a for t in enums for a in t.aliases]
        if len(names) != len(set(names)):
            raise AttributeError("ParamsType: found different enum types with common "
                                 "constants names.")
        if len(aliases) != len(set(aliases)):
            raise AttributeError("ParamsType: found different enum types with common "
                                 "constants aliases.")
        if set(aliases) & set(names):
            raise AttributeError("ParamsType: found aliases that have same names as constants.")
        self._const_to_enum = {k: t for t in enums for k in t}
        self._alias_to_enum = {a: t for t in enums for a in t.aliases}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)   # before __getattr__ can look for the enum tables

    def __getattr__(self, key: str) -> Any:
        enums = self.__dict__.get("_const_to_enum", {})
        if key in enums:
            return enums[key][key]
        raise AttributeError(f"{type(self).__name__} has no attribute or enum constant {key!r}")

    def __repr__(self) -> str:
        return "ParamsType<%s>" % ", ".join(f"{f}:{t}" for f, t in zip(self.fields, self.types))

    def __eq__(self, other: Any) -> bool:
        return (type(self) is type(other) and self.fields == other.fields
                and self.types == other.types)

    def __hash__(self) -> int:
        return hash((type(self),) + self.fields + self.types)

    def generate_struct_name(self) -> str:
        """A name unique to these fields and types (Theano names its C struct with it)."""
        fields = hashlib.sha256(",".join(self.fields).encode()).hexdigest()
        types = hashlib.sha256(",".join(str(t) for t in self.types).encode()).hexdigest()
        return f"_Params_{fields}_{types}"

    def has_type(self, theano_type: Type) -> bool:
        """Whether one of the fields has this Type."""
        return theano_type in self.types

    def get_type(self, field_name: str) -> Type:
        """The Type of field `field_name`."""
        return self.types[self.fields.index(field_name)]

    def get_field(self, theano_type: Type) -> str:
        """The first field (in sorted order) of this Type (ValueError when none has it)."""
        return self.fields[self.types.index(theano_type)]

    def get_enum(self, key: str) -> Any:
        """The value of the enumeration constant `key` of one of the EnumType fields."""
        return self._const_to_enum[key][key]

    def enum_from_alias(self, alias: str) -> Any:
        """The value of the enumeration constant with this alias (or this name)."""
        if alias in self._alias_to_enum:
            return self._alias_to_enum[alias].fromalias(alias)
        return self._const_to_enum[alias][alias]

    def get_params(self, *objects: Any, **kwargs: Any) -> Params:
        """A `Params` from the attributes of `objects` (later ones win) and then `kwargs`,
        each filtered (non-strict, downcasting) by its field's Type."""
        values: dict[str, Any] = {}
        for obj in objects:
            for field in self.fields:
                if hasattr(obj, field):
                    values[field] = getattr(obj, field)
        values.update((f, kwargs[f]) for f in self.fields if f in kwargs)
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise TypeError(f"{self}.get_params: no value for field(s) {missing}")
        return Params(self, **{f: t.filter(values[f], strict=False, allow_downcast=True)
                               for f, t in zip(self.fields, self.types)})

    def extended(self, **kwargs: Type) -> "ParamsType":
        """This ParamsType with more (or replaced) fields."""
        fields = dict(zip(self.fields, self.types))
        fields.update(kwargs)
        return ParamsType(**fields)

    def filter(self, data: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        if strict and not isinstance(data, Params):
            raise TypeError(f"{self}: strict mode: data should be an instance of Params, got "
                            f"{type(data).__name__}")
        filtered = {f: t.filter(getattr(data, f), strict, allow_downcast)
                    for f, t in zip(self.fields, self.types)}
        return data if (strict or isinstance(data, Params)) else Params(self, **filtered)

    def values_eq(self, a: Any, b: Any) -> bool:
        return all(t.values_eq(getattr(a, f), getattr(b, f))
                   for f, t in zip(self.fields, self.types))

    def values_eq_approx(self, a: Any, b: Any) -> bool:
        return all(t.values_eq_approx(getattr(a, f), getattr(b, f))
                   for f, t in zip(self.fields, self.types))
