"""The scalar layer: dtypes, the scalar-op table (basic.py), fused Composite programs and
their C code. Knows no graph, tensor, backend or compiler."""
from symgpu.scalar.dtypes import upcast  # Theano's theano.scalar.upcast

__all__ = ["upcast"]
