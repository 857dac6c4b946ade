"""GpuSoftmaxRows reading a half array as float32 (``x_dtype``): the cast of a mixed-precision
classifier's half logits taken into the row kernel by ``gpu_softmax_rows_bias``. Rewritten
graphs read on a virtual GPU, the kernels run on the CPU emulator (tests/emulated_gpu.py)
against NumPy, compiled by nvcc, and on a real GPU against the CPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulate_prepared_kernels, emulated_kernel_device, host_view
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import softmax_rows as sr
from symgpu.gpu.ops.softmax_rows import WIDE_ROW, GpuSoftmaxRows
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType

RNG = np.random.default_rng(11)


def _names(f) -> list[str]:
    return [str(n.op) for n in f.maker.fgraph.toposort()]


def _classifier(half: str, bias: bool = True, extra: bool = False, **flags) -> list[str]:
    """log_softmax(cast(h, 'float32') (+ b)) of a half matrix h, as mixed precision leaves a
    classifier's logits; ``extra``: the float32 logits are returned too."""
    with config.change_flags(floatX="float32", **flags), virtual_context(None):
        h, b = T.matrix("h", dtype=half), T.vector("b")
        z = h.astype("float32") + b if bias else h.astype("float32")
        outs = [T.nnet.log_softmax(z)] + ([z] if extra else [])
        return _names(function([h, b], outs, on_unused_input="ignore"))


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_the_cast_of_half_logits_is_read_by_the_row_kernel(half):
    names = _classifier(half)
    assert f"GpuSoftmaxRows{{log,bias,from {half}}}" in names, names
    assert not any("Cast{float32}" in n or "add" in n for n in names), names
    names = _classifier(half, bias=False)
    assert f"GpuSoftmaxRows{{log,from {half}}}" in names, names
    assert not any("Cast{float32}" in n for n in names), names


def test_a_cast_read_elsewhere_stays_and_the_switch_turns_it_off():
    names = _classifier("bfloat16", extra=True)          # the float32 logits are an output
    assert "GpuSoftmaxRows{log,bias,from bfloat16}" not in names, names
    assert any("Cast{float32}" in n for n in names), names
    names = _classifier("bfloat16", optimizer_excluding="gpu_softmax_rows_bias")
    assert not any("from bfloat16" in n for n in names) and \
        any("Cast{float32}" in n for n in names), names


def test_props_and_errors():
    op = GpuSoftmaxRows(log=True, bias=True, x_dtype="bfloat16")
    assert op != GpuSoftmaxRows(log=True, bias=True)
    assert str(op) == "GpuSoftmaxRows{log,bias,from bfloat16}"
    with pytest.raises(ValueError, match="x_dtype"):
        GpuSoftmaxRows(x_dtype="float32")
    h = GpuArrayType("bfloat16", (False, False), None)()
    out = op(h, GpuArrayType("float32", (False,), None)())
    assert out.dtype == "float32" and out.broadcastable == (False, False)
    with pytest.raises(TypeError, match="reads an array of bfloat16"):
        op(GpuArrayType("float16", (False, False), None)(),
           GpuArrayType("float32", (False,), None)())
    with pytest.raises(TypeError, match="bias must be a GPU vector of float32"):
        op(h, GpuArrayType("bfloat16", (False,), None)())


def _softmax(a: np.ndarray, log: bool) -> np.ndarray:
    s = a - a.max(axis=-1, keepdims=True)
    if log:
        return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


@requires_gxx
@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [10, WIDE_ROW + 3])
def test_values_on_the_emulator(monkeypatch, tmp_path, half, n):
    """Against NumPy's softmax of the cast values (plus the bias, added in float32): warp
    and block rows, with and without a bias, log and not."""
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, sr)
    a = (RNG.standard_normal((5, n)) * 4).astype(half)
    bias = RNG.standard_normal(n).astype("float32")
    for log in (False, True):
        for with_bias in (False, True):
            op = GpuSoftmaxRows(log, with_bias, x_dtype=half)
            xs = [GpuArrayType(half, (False, False), None)()]
            vals = [device_array(ctx, a)]
            if with_bias:
                xs.append(GpuArrayType("float32", (False,), None)())
                vals.append(device_array(ctx, bias))
            node = op.make_node(*xs)
            out = [[None]]
            op.perform(node, vals, out)
            got = np.array(host_view(out[0][0]))
            assert got.dtype == np.float32
            want = _softmax(a.astype("float32") + (bias if with_bias else 0), log)
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@requires_nvcc
def test_the_half_input_kernels_compile(tmp_path):
    src = sr.softmax_rows_source()
    for half in ("bfloat16", "float16"):
        for name in ("softmax_warp_rows", "log_softmax_block_rows"):
            assert f"{name}_float32_from_{half}_bias" in src
    assert compile_for_sm90(src, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_mixed_precision_classifier_on_the_gpu(cuda, half):
    """The loss and gradient of a bf16/fp16 classifier's log-softmax, against the CPU."""
    from gpu_helpers import on_the_cpu
    h, b = T.matrix("h", dtype=half), T.vector("b")
    z = h.astype("float32") + b
    outs = [T.nnet.log_softmax(z), T.nnet.softmax(z)]
    f = function([h, b], outs)
    assert f"GpuSoftmaxRows{{log,bias,from {half}}}" in _names(f)
    with on_the_cpu():
        ref = function([h, b], outs)
    for n in (10, WIDE_ROW + 3):
        args = [(RNG.standard_normal((37, n)) * 4).astype(half),
                RNG.standard_normal(n).astype("float32")]
        for got, want in zip(f(*args), ref(*args)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6)
