"""``gpuarray.allow_tf32``: float32 matrix products on TF32 tensor cores when asked, full
float32 otherwise (the default, as in Theano)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import config, function, shared
from symgpu.gpu.placement.basic_ops import gpu_from_host
from symgpu.gpu.ops.blas import gemm_math_mode


def test_the_flag_chooses_the_math_mode_of_float32_products_only():
    assert config.gpuarray.allow_tf32 is False
    assert gemm_math_mode("float32") == 0 and gemm_math_mode("float64") == 0
    with config.change_flags(**{"gpuarray.allow_tf32": True}):
        assert gemm_math_mode("float32") == 3   # CUBLAS_TF32_TENSOR_OP_MATH
        assert gemm_math_mode("float64") == 0


@requires_gpu
@pytest.mark.gpu
def test_gpu_tf32_products_are_rounded_and_full_float32_ones_are_not(cuda):
    """The same product compiled with and without the flag: TF32 keeps ~3 decimal digits
    (the results differ from float32's, within TF32's error), float32 keeps ~6; both
    functions share one cuBLAS handle, so each call must set its own mode."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 1024)).astype("float32")
    b = rng.standard_normal((1024, 256)).astype("float32")
    want = a.astype("float64") @ b.astype("float64")
    sa, sb = shared(a), shared(b)
    f32 = function([], gpu_from_host(T.dot(sa, sb)))
    with config.change_flags(**{"gpuarray.allow_tf32": True}):
        tf32 = function([], gpu_from_host(T.dot(sa, sb)))
    assert any("Gpu" in type(n.op).__name__ for n in tf32.maker.fgraph.toposort())
    scale = np.abs(want).max()
    for _ in range(3):   # alternate: the handle's mode follows each function
        r32, rtf = np.asarray(f32()), np.asarray(tf32())
        err32 = np.abs(r32 - want).max() / scale
        errtf = np.abs(rtf - want).max() / scale
        assert err32 < 1e-5, err32
        assert 1e-5 < errtf < 5e-3, errtf
