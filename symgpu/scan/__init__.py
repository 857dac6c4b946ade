"""Loops: `scan` (Theano's), `until` for while-loops, and map/reduce/foldl/foldr.

`symgpu.scan` is this module and is also callable: `symgpu.scan(fn, ...)` calls
`symgpu.scan.basic.scan`, and `symgpu.scan.until` is the loop-ending condition, as in Theano.
"""
import sys
import types

from symgpu.scan.basic import ScanUpdates, scan, until
from symgpu.scan.checkpoints import scan_checkpoints
from symgpu.scan.info import ScanGradOf
from symgpu.scan.op import Scan, ScanError, ScanInfo
from symgpu.scan.views import foldl, foldr, map, reduce

__all__ = ["scan", "until", "map", "reduce", "foldl", "foldr", "Scan", "ScanInfo", "ScanError",
           "ScanUpdates", "scan_checkpoints", "ScanGradOf"]


class _CallableModule(types.ModuleType):
    """The package itself calls `scan`, so `symgpu.scan(...)` works like Theano's."""

    def __call__(self, *args, **kwargs):
        return scan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

import symgpu.scan.rewriting  # noqa: E402,F401  (registers the loop rewrites)
import symgpu.scan.pushout_acc  # noqa: E402,F401  (registers scan_pushout_acc)
import symgpu.scan.pushout_shapes  # noqa: E402,F401  (registers scan_pushout_shapes)
import symgpu.scan.dnn_rnn_match  # noqa: E402,F401  (registers scan_to_dnn_rnn, opt-in)
