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


def test_searchsorted_with_sorter_and_theanos_op_name():
    import symgpu.tensor as T
    from symgpu.tensor.extra_ops import SearchSorted, SearchsortedOp, searchsorted
    assert SearchsortedOp is SearchSorted and SearchsortedOp() == SearchSorted("left")
    a, v, s = T.dvector(), T.dmatrix(), T.lvector()
    f = symgpu.function([a, v, s], [searchsorted(a, v, "right", sorter=s), searchsorted(a, v)])
    x = np.array([3.0, 1.0, 2.0, 5.0])
    q = np.array([[0.5, 2.0], [4.0, 6.0]])
    r = f(x, q, np.argsort(x))
    np.testing.assert_array_equal(r[0], np.searchsorted(x, q, "right", sorter=np.argsort(x)))
    np.testing.assert_array_equal(r[1], np.searchsorted(x, q))
    shape = symgpu.function([a, v, s], searchsorted(a, v, sorter=s).shape)
    np.testing.assert_array_equal(shape(x, q, np.argsort(x)), [2, 2])


def test_theanos_dtype_lists():
    import symgpu.tensor as T
    assert T.integer_dtypes == T.int_dtypes + T.uint_dtypes and "bool" in T.discrete_dtypes
    assert T.all_dtypes == T.discrete_dtypes + T.float_dtypes + T.complex_dtypes
    assert T.continuous_dtypes == ["float16", "float32", "float64", "complex64", "complex128"]
    for d in T.all_dtypes:
        assert T.TensorType(d, ()).dtype == d
