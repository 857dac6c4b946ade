"""Theano's autocasters (symgpu/scalar/autocast.py) and `symgpu.pprint`."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.scalar import autocast_float, autocast_float_as, autocast_int


@pytest.mark.parametrize("x, want", [(1.5, "float16"), (1.1, "float64"), (1e300, "float64"),
                                     (float("inf"), "float16"), (float("nan"), "float16"),
                                     (65504.0, "float16"), (2.0 ** 100, "float32")])
def test_autocast_float_takes_the_narrowest_exact_dtype(x, want):
    with symgpu.config.change_flags(floatX="float64"):
        got = autocast_float(x)
    assert got.dtype == want and (got == x or x != x)


@pytest.mark.parametrize("x, want", [(5, "int8"), (-129, "int16"), (300, "int16"),
                                     (2 ** 31, "int64"), (True, "int8")])
def test_autocast_int_takes_the_narrowest_int(x, want):
    assert autocast_int(x).dtype == want


def test_autocast_float_as_restricts_the_dtypes_in_its_block_and_floatx_goes_first():
    with autocast_float_as("float32"):
        assert autocast_float(1.1).dtype == "float32"
        assert autocast_float.dtypes == ("float32",)
    assert autocast_float.dtypes == ("float16", "float32", "float64")
    with symgpu.config.change_flags(floatX="float32"):
        assert autocast_float(1.5).dtype == "float32"   # floatX tried first, as Theano
    assert autocast_float(np.float64(2.5)).dtype == "float64"   # NumPy scalars keep theirs
    with pytest.raises(TypeError, match="not a scalar"):
        autocast_float([1.0])


def test_pprint_is_theanos_name_for_pp():
    from symgpu import pprint
    x = T.dvector("x")
    assert pprint(x + 1) == symgpu.pp(x + 1) == "(x + TensorConstant{1.0})"


def test_get_vector_length_knows_what_the_graph_tells():
    x = T.matrix("x")
    assert T.get_vector_length(x.shape) == 2
    assert T.get_vector_length(x.shape[1:]) == 1
    assert T.get_vector_length(T.constant(np.arange(4))) == 4
    assert T.get_vector_length(T.stack([x.sum(), x.max(), x.min()])) == 3
    assert T.get_vector_length(T.TensorType("float64", (True,))("b")) == 1
    with pytest.raises(ValueError, match="not known before the graph runs"):
        T.get_vector_length(T.vector("v"))
    with pytest.raises(TypeError, match="not a vector"):
        T.get_vector_length(x)


def test_underscore_shared_is_theanos_host_tensor_constructor():
    s = T._shared(np.arange(3.0), name="s")
    assert isinstance(s, T.TensorSharedVariable) and s.name == "s"
    f = symgpu.function([], s * 2)
    np.testing.assert_allclose(f(), [0.0, 2.0, 4.0])
