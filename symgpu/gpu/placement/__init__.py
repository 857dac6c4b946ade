"""Putting graphs on the GPU: GPU types and shared variables, transfer ops, the
graph-to-GPU sweep (``register_lifter``) and the GPU fusion / in-place passes.
"""
