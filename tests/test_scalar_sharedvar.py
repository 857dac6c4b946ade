"""Theano's theano.scalar.sharedvar.shared: one number as a 0-d shared tensor (scan's counters)."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.tensor.scalar_sharedvar import ScalarSharedVariable, shared
from symgpu.tensor.sharedvar import TensorSharedVariable


def test_path_and_dtypes_are_theanos():
    import symgpu.scalar.sharedvar as sv
    assert sv.shared is shared and sv.ScalarSharedVariable is ScalarSharedVariable
    assert shared(1).dtype == "int64" and shared(1.5).dtype == "float64"   # not floatX
    assert shared(np.float32(2)).dtype == "float32" and shared(np.int8(3)).type.ndim == 0
    s = shared(np.int16(4), name="i")
    assert isinstance(s, TensorSharedVariable) and s.name == "i" and s.get_value() == 4
    for bad in (np.zeros(2), [1], "1", 1j):
        with pytest.raises(TypeError, match="number"):
            shared(bad)


def test_counter_indexes_and_updates_like_scans():
    r = symgpu.shared(np.arange(12.0).reshape(4, 3))
    i = shared(1)
    f = symgpu.function([], r[i] + r[i - 1], updates=[(i, i + 1)])
    np.testing.assert_array_equal(f(), [3.0, 5.0, 7.0])
    np.testing.assert_array_equal(f(), [9.0, 11.0, 13.0])
    assert i.get_value() == 3
    with pytest.raises(TypeError):
        i.set_value(np.float64(0.5))   # strict int64: a lossy value is refused
    x = T.dscalar()
    assert symgpu.function([x], x * shared(2.0))(3.0) == 6.0
