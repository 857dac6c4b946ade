"""Python and NumPy scalars passed to 0-d inputs take a short path (TensorType.
make_scalar_filter): it must accept exactly what TensorType.filter accepts, with the same
value and dtype, and leave every refusal to filter's error."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.tensor.type import TensorType

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8"]
VALUES = [0.01, -2.5, 3.0, float("inf"), 1e300, 3, -7, 255, 256, 2 ** 40, 2 ** 63, -2 ** 63,
          2 ** 70, True, np.float32(0.5), np.float64(0.25), np.int64(5), np.int32(-3),
          np.uint8(200)]


def _filtered(ttype, value, allow):
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return ttype.filter(value, allow_downcast=allow)
    except TypeError:
        return TypeError


@pytest.mark.parametrize("allow", [None, True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_arguments_match_filter(dtype, allow):
    s = T.scalar("s", dtype=dtype)
    f = symgpu.function([s], s * 1, allow_input_downcast=allow)
    for value in VALUES:
        want = _filtered(TensorType(dtype, ()), value, allow)
        if want is TypeError:
            with pytest.raises(TypeError, match="input 's'"):
                f(value)
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            got = f(value)
        assert got.dtype == np.dtype(dtype), (value, dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"{value!r} into {dtype}")


def test_short_path_only_for_zero_d_types():
    assert TensorType("float32", (False,)).make_scalar_filter(None) is None
    conv = TensorType("float32", ()).make_scalar_filter(None)
    out = conv(0.1)
    assert out.dtype == np.float32 and out.shape == () and out == np.float32(0.1)
    assert conv("0.1") is None and conv([0.1]) is None and conv(1) is None


def test_strict_inputs_keep_refusing_python_scalars():
    s = T.fscalar("s")
    f = symgpu.function([symgpu.In(s, strict=True)], s * 2)
    with pytest.raises(TypeError, match="input 's'"):
        f(0.5)
    assert f(np.asarray(0.5, "float32")) == 1.0
