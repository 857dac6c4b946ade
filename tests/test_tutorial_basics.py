"""Theano's tutorial pages, ported: `theano` -> `symgpu`, results as the tutorial prints them.

Pages: "Baby steps - algebra" (adding two scalars/matrices), "More examples" (logistic
function, several outputs, default values, shared variables, givens), "Derivatives",
"Conditions", and the typed/plural constructors the first page starts with. Where `pytensor`
is importable, the same programs are also compared with it.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import In, function, shared

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ============================================================================ constructors

def test_plural_constructors_take_names():
    a, b = T.dmatrices("a", "b")
    assert (a.name, b.name) == ("a", "b")
    assert a.type == T.dmatrix and a.type is T.dmatrix and b.type is T.dmatrix
    x, y, z = T.fscalars("x", "y", "z")
    assert [v.dtype for v in (x, y, z)] == ["float32"] * 3 and x.ndim == 0


def test_plural_constructors_take_a_count():
    vs = T.ivectors(3)
    assert len(vs) == 3 and all(v.type is T.ivector and v.name is None for v in vs)
    assert len({id(v) for v in vs}) == 3
    assert T.lrows(1)[0].type is T.lrow
    assert T.dmatrices(0) == []


def test_plural_constructors_follow_theano_on_one_argument():
    single = T.dscalars("x")  # one name: one variable, not a list
    assert single.name == "x" and single.type is T.dscalar
    x, y = T.dscalars("xy")   # one string of several characters: one variable per character
    assert (x.name, y.name) == ("x", "y")
    p, q = T.zcols(["p", "q"])
    assert p.type is T.zcol and q.name == "q"


def test_plural_constructors_reject_bad_arguments():
    with pytest.raises(TypeError, match="dmatrices"):
        T.dmatrices(2, "a")
    with pytest.raises(TypeError, match="dmatrices"):
        T.dmatrices(-1)
    with pytest.raises(TypeError, match="names"):
        T.dmatrices("a", 3.5)


@pytest.mark.parametrize("kind,ndim,bcast", [
    ("scalar", 0, ()), ("vector", 1, (False,)), ("matrix", 2, (False, False)),
    ("row", 2, (True, False)), ("col", 2, (False, True)), ("tensor3", 3, (False,) * 3),
    ("tensor4", 4, (False,) * 4), ("tensor5", 5, (False,) * 5), ("tensor6", 6, (False,) * 6),
    ("tensor7", 7, (False,) * 7)])
def test_every_dtype_and_rank_has_a_type_and_a_plural(kind, ndim, bcast):
    plural = "matrices" if kind == "matrix" else kind + "s"
    for prefix, dtype in [("f", "float32"), ("d", "float64"), ("i", "int32"), ("l", "int64"),
                          ("b", "int8"), ("w", "int16"), ("c", "complex64"),
                          ("z", "complex128")]:
        typed = getattr(T, prefix + kind)
        assert isinstance(typed, T.TensorType), prefix + kind
        assert (typed.dtype, typed.ndim, typed.broadcastable) == (dtype, ndim, bcast)
        v = typed("v")
        assert v.type is typed and v.name == "v"
        many = getattr(T, prefix + plural)("a", "b")
        assert [m.type for m in many] == [typed, typed]
    # the floatX constructors stay functions of (name, dtype)
    generic = getattr(T, kind)
    assert not isinstance(generic, T.TensorType)
    assert generic("g").dtype == symgpu.config.floatX
    assert generic("g", dtype="int16").type == T.TensorType("int16", bcast)
    assert [v.dtype for v in getattr(T, plural)(2)] == [symgpu.config.floatX] * 2


def test_typed_constructors_pickle_across_processes(tmp_path):
    """A TensorType's hash mixes in string hashes, which differ between processes: an
    unpickled type must still be found in sets and dicts of its own process."""
    path = tmp_path / "types.pkl"
    code = ("import pickle, sys; import symgpu.tensor as T; "
            f"pickle.dump([T.dmatrix, T.fvector, T.ltensor5], open({str(path)!r}, 'wb'))")
    env = dict(os.environ, PYTHONHASHSEED="12345",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=120)
    with open(path, "rb") as fh:
        types = pickle.load(fh)
    assert types == [T.dmatrix, T.fvector, T.ltensor5]
    assert {T.dmatrix: 1}.get(types[0]) == 1 and T.ltensor5 in set(types)
    assert pickle.loads(pickle.dumps(T.dmatrix("x"))).type == T.dmatrix
