"""Typed constructors (fmatrix, dvector, iscalar, lvector, bmatrix, ...), generated once."""
from symgpu.tensor.type import TensorType

_PREFIX = {"f": "float32", "d": "float64", "i": "int32", "l": "int64", "b": "int8",
           "w": "int16", "c": "complex64", "z": "complex128"}
_KINDS = {"scalar": (), "vector": (False,), "matrix": (False, False), "row": (True, False),
          "col": (False, True), "tensor3": (False,) * 3, "tensor4": (False,) * 4}


def _make(dtype: str, bcast: tuple):
    def constructor(name: str | None = None):
        return TensorType(dtype, bcast)(name)
    return constructor


CONSTRUCTORS = {}
for _p, _dtype in _PREFIX.items():
    for _kind, _bcast in _KINDS.items():
        _fn = _make(_dtype, _bcast)
        _fn.__name__ = _p + _kind
        _fn.__doc__ = f"A symbolic {_dtype} {_kind}."
        CONSTRUCTORS[_p + _kind] = _fn
