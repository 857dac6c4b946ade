"""Theano's `scan_module` name: `from symgpu.scan_module import until, scan`."""
from symgpu.scan import Scan, ScanUpdates, foldl, foldr, map, reduce, scan, until

__all__ = ["scan", "until", "map", "reduce", "foldl", "foldr", "Scan", "ScanUpdates"]
