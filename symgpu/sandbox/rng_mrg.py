"""Theano's `theano.sandbox.rng_mrg` import path: MRG_RandomStreams is symgpu's counter-based
RandomStreams (Philox4x32-10 instead of MRG31k3p; the same seed gives the same numbers on
the CPU and the GPU). MRG31k3p's jump arithmetic (DotModulo, multMatVect) and
`guess_n_streams` are Theano's, for code that uses them directly."""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.compile.function import function
from symgpu.tensor.random.mrg_math import DotModulo, guess_n_streams, matVecModM
from symgpu.tensor.random.streams import RandomStreams
from symgpu.tensor.typed_constructors import iscalar, ivector, lmatrix

MRG_RandomStreams = RandomStreams

__all__ = ["MRG_RandomStreams", "DotModulo", "multMatVect", "guess_n_streams", "matVecModM"]

_dot_modulo: list = []   # the compiled DotModulo, made on first use


def multMatVect(v: np.ndarray, A: np.ndarray, m1: Any, B: np.ndarray, m2: Any) -> np.ndarray:
    """The first half of the 6-int32 state `v` times `A` mod `m1`, the second times `B` mod
    `m2`: one jump of an MRG31k3p state (through a compiled DotModulo, as Theano's)."""
    if not _dot_modulo:
        syms = [lmatrix("A"), ivector("s"), iscalar("m"), lmatrix("A2"), ivector("s2"),
                iscalar("m2")]
        _dot_modulo.append(function(syms, DotModulo()(*syms)))
    v = np.asarray(v, dtype=np.int32)
    return _dot_modulo[0](np.asarray(A, dtype=np.int64), v[:3], np.int32(m1),
                          np.asarray(B, dtype=np.int64), v[3:], np.int32(m2))
