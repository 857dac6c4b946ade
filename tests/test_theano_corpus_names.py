"""Names Theano's own tests import from theano.compile and theano.tensor.basic."""
import numpy as np

import symgpu
import symgpu.compile as C
import symgpu.tensor.basic as B
from symgpu.compile.function import UnusedInputError


def test_compile_names():
    assert isinstance(C.get_default_mode(), C.Mode) and C.get_default_mode().name == "FAST_RUN"
    with symgpu.config.change_flags(mode="FAST_COMPILE"):
        assert C.get_default_mode().name == "FAST_COMPILE"
    assert C.config is symgpu.config and C.UnusedInputError is UnusedInputError


def test_allclose_tolerances_follow_the_dtype():
    a = np.ones(3)
    assert B._allclose(a, a + 5e-6) and not B._allclose(a, a + 5e-5)
    assert B._allclose(a.astype("float32"), a + 5e-6) and not B._allclose(a, a + 2e-3 * a)
    assert B._allclose(a.astype("float16"), a + 5e-4)
    assert not B._allclose(a.astype("float16"), a + 5e-4, atol=0, rtol=1e-6)
    assert B._get_atol_rtol(np.float32(1), np.float64(1)) == (B.float32_atol, B.float32_rtol)
