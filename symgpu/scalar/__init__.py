"""The scalar layer: dtypes, the scalar-op table (basic.py), fused Composite programs and
their C code. Knows no graph, tensor, backend or compiler."""
from symgpu.scalar.autocast import (NumpyAutocaster, autocast_float,  # Theano's autocasters
                                    autocast_float_as, autocast_int)
from symgpu.scalar.dtypes import upcast  # Theano's theano.scalar.upcast

__all__ = ["upcast", "NumpyAutocaster", "autocast_float", "autocast_float_as", "autocast_int"]
