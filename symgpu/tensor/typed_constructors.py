"""Typed constructors (fmatrix, dvector, iscalar, ...) and their plurals (dmatrices, fscalars, ...).

As in Theano, a typed constructor *is* a `TensorType`: `T.dscalar('x')` makes a variable whose
`.type is T.dscalar`. The half types have prefixes of symgpu's own: `T.hmatrix` (float16),
`T.bfmatrix` (bfloat16), and their plurals (`T.bfvectors(3)`). The floatX constructors
(`scalar`, `matrix`, ..., `tensor7`) stay functions taking `(name, dtype)`. A plural takes names or a count: `a, b = T.dmatrices('a', 'b')`,
`T.dmatrices(3)`; as in Theano, one name gives one variable and a single string of several
characters gives one variable per character (`T.dscalars('xy')` is `[x, y]`).
"""
from __future__ import annotations

from typing import Callable

from symgpu.config import config
from symgpu.tensor.type import TensorType, TensorVariable
from symgpu.tensor import type as _type

#: Theano's prefixes, then symgpu's own for the half types (Theano had none): h (half) for
#: float16 (``hmatrix``), bf for bfloat16 (``bfmatrix``)
PREFIXES = {"f": "float32", "d": "float64", "i": "int32", "l": "int64", "b": "int8",
            "w": "int16", "c": "complex64", "z": "complex128", "h": "float16", "bf": "bfloat16"}
KINDS = {"scalar": (), "vector": (False,), "matrix": (False, False), "row": (True, False),
         "col": (False, True), "tensor3": (False,) * 3, "tensor4": (False,) * 4,
         "tensor5": (False,) * 5, "tensor6": (False,) * 6, "tensor7": (False,) * 7}
# English plurals; the others add an "s"
_PLURAL = {"matrix": "matrices"}


def plural_name(kind: str) -> str:
    return _PLURAL.get(kind, kind + "s")


def _floatx_constructor(kind: str, bcast: tuple) -> Callable[..., TensorVariable]:
    def constructor(name: str | None = None, dtype: str | None = None) -> TensorVariable:
        return TensorType(dtype or config.floatX, bcast)(name)
    constructor.__name__ = constructor.__qualname__ = kind
    constructor.__doc__ = f"A symbolic {kind} of `dtype` (config.floatX by default)."
    return constructor


def _plural(single: Callable[..., TensorVariable], name: str, single_name: str
            ) -> Callable[..., object]:
    def plural(*names):
        """Several variables: `(n)` makes n unnamed ones, `('a', 'b', ...)` one per name."""
        if names and isinstance(names[0], int) and not isinstance(names[0], bool):
            if len(names) != 1 or names[0] < 0:
                raise TypeError(f"{name}() takes one count >= 0 or names, got {names!r}")
            return [single() for _ in range(names[0])]
        if len(names) == 1:
            names = names[0]
        if isinstance(names, str) and len(names) == 1:
            return single(names)
        for n in names:
            if not isinstance(n, str):
                raise TypeError(f"{name}() takes names (str) or a count (int), got {n!r}")
        return [single(n) for n in names]
    plural.__name__ = plural.__qualname__ = name
    plural.__doc__ = (f"Several symbolic variables like `{single_name}`: `{name}(n)` or "
                      f"`{name}('a', 'b', ...)`.")
    return plural


CONSTRUCTORS: dict = {}
for _kind, _bcast in KINDS.items():
    if _kind not in ("scalar", "vector", "matrix", "row", "col", "tensor3", "tensor4"):
        CONSTRUCTORS[_kind] = _floatx_constructor(_kind, _bcast)  # the others are in type.py
    for _p, _dtype in PREFIXES.items():
        CONSTRUCTORS[_p + _kind] = TensorType(_dtype, _bcast)

globals().update(CONSTRUCTORS)


def _install_plurals() -> dict:
    plurals = {}
    for kind in KINDS:
        single = CONSTRUCTORS.get(kind) or getattr(_type, kind)
        plurals[plural_name(kind)] = _plural(single, plural_name(kind), kind)
        for p in PREFIXES:
            typed = CONSTRUCTORS[p + kind]
            name = p + plural_name(kind)
            plurals[name] = _plural(typed, name, p + kind)
    return plurals


PLURALS = _install_plurals()
globals().update(PLURALS)
__all__ = sorted(CONSTRUCTORS) + sorted(PLURALS)
