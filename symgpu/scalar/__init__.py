"""The scalar layer: dtypes, the scalar-op table (basic.py), fused Composite programs and
their C code. Knows no graph, tensor, backend or compiler."""
