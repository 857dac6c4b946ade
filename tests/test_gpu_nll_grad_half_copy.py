"""GpuNLLGrad writing a half copy of its float32 gradient (``copy_dtype``): the cast a
mixed-precision classifier makes for its products, taken into the kernel by
``gpu_nll_grad_half_copy``. Rewritten graphs read on a virtual GPU, the kernel run on the
CPU emulator (tests/emulated_gpu.py) against NumPy, compiled by nvcc, and a classifier's
step on a real GPU against the CPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulate_prepared_kernels, emulated_kernel_device, host_view
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import nll_grad as ng
from symgpu.gpu.ops.nll_grad import GpuNLLGrad
from symgpu.gpu.placement.type import GpuArrayType

RNG = np.random.default_rng(3)


def _step(half: str = "bfloat16", **flags):
    """One SGD step of a mixed-precision softmax classifier with a bias (the gradient's
    float32 values feed the bias's sum, its half copy the weight's product)."""
    with config.change_flags(mixed_precision=half, **flags):
        x, y = T.matrix("x"), T.lvector("y")
        w = symgpu.shared(RNG.standard_normal((6, 5)).astype("float32"), name="w")
        b = symgpu.shared(np.zeros(5, "float32"), name="b")
        lp = T.nnet.logsoftmax(T.dot(x, w) + b)
        loss = -T.mean(lp[T.arange(y.shape[0]), y])
        gw, gb = T.grad(loss, [w, b])
        return function([x, y], loss, updates=[(w, w - 0.1 * gw), (b, b - 0.1 * gb)]), w, b


def _names(f) -> list[str]:
    return [str(n.op) for n in f.maker.fgraph.toposort()]


def _casts_of_the_gradient(f) -> list[str]:
    fg = f.maker.fgraph
    (nll,) = [n for n in fg.toposort() if isinstance(n.op, GpuNLLGrad)]
    return [str(c.op) for o in nll.outputs for c, _ in fg.clients[o]
            if "Cast" in str(getattr(c, "op", ""))]


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_the_gradients_half_cast_is_written_by_its_kernel(vgpu, half):
    f = _step(half)[0]
    assert f"GpuNLLGrad{{exp,+{half}}}" in _names(f), _names(f)
    assert not _casts_of_the_gradient(f)
    off = _step(half, optimizer_excluding="gpu_nll_grad_half_copy")[0]
    assert "GpuNLLGrad{exp}" in _names(off)
    assert _casts_of_the_gradient(off) == [f"GpuElemwise{{Cast{{{half}}},no_inplace}}"]


def test_props_and_errors():
    op = GpuNLLGrad(exp_m=True, copy_dtype="bfloat16")
    assert str(op) == "GpuNLLGrad{exp,+bfloat16}" and op != GpuNLLGrad(exp_m=True)
    assert str(GpuNLLGrad(copy_dtype="float16")) == "GpuNLLGrad{+float16}"
    with pytest.raises(ValueError, match="copy_dtype"):
        GpuNLLGrad(copy_dtype="float32")
    vec, y = GpuArrayType("float64", (True,), None)(), GpuArrayType("int64", (False,), None)()
    m = GpuArrayType("float64", (False, False), None)()
    with pytest.raises(TypeError, match="half copy is of a float32 gradient"):
        GpuNLLGrad(copy_dtype="bfloat16")(vec, m, T.lscalar(), y)


@requires_gxx
@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_values_on_the_emulator(monkeypatch, tmp_path, half):
    """Both outputs against NumPy: the float32 gradient (the exp of a log-softmax, -1/n at
    each row's label, one broadcast value) and the same values rounded to the half type."""
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, ng)
    rows, cols = 7, 9
    z = RNG.standard_normal((rows, cols))
    lp = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype("float32")
    labels = RNG.integers(0, cols, rows)
    v = np.array([-1.0 / rows], "float32")
    op = GpuNLLGrad(exp_m=True, copy_dtype=half)
    node = op.make_node(GpuArrayType("float32", (True,), None)(),
                        GpuArrayType("float32", (False, False), None)(), T.lscalar(),
                        GpuArrayType("int64", (False,), None)())
    out = [[None], [None]]
    op.perform(node, [device_array(ctx, v), device_array(ctx, lp), np.int64(rows),
                      device_array(ctx, labels)], out)
    got, copy = np.array(host_view(out[0][0])), np.array(host_view(out[1][0]))
    want = np.exp(lp) * (1.0 / rows)
    want[np.arange(rows), labels] -= 1.0 / rows
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert copy.dtype == np.dtype(half)
    np.testing.assert_array_equal(copy, got.astype(half))


@requires_nvcc
def test_the_copy_kernels_compile(tmp_path):
    src = ng.nll_grad_source()
    for half in ("bfloat16", "float16"):
        assert f"nll_grad_exp_float32_int64_copy_{half}" in src
    assert compile_for_sm90(src, tmp_path)


@pytest.mark.gpu
def test_a_mixed_precision_step_on_the_gpu(cuda):
    """Ten steps of the classifier against the same steps on the CPU."""
    from gpu_helpers import on_the_cpu
    xv = RNG.standard_normal((32, 6)).astype("float32")
    yv = RNG.integers(0, 5, 32).astype("int64")
    state = np.random.get_state()
    step, w, b = _step()
    assert "GpuNLLGrad{exp,+bfloat16}" in _names(step)
    np.random.set_state(state)
    with on_the_cpu():
        ref, w_cpu, b_cpu = _step()
    w_cpu.set_value(w.get_value())
    for _ in range(10):
        assert abs(float(np.asarray(step(xv, yv))) - float(ref(xv, yv))) < 2e-2
    np.testing.assert_allclose(np.asarray(w.get_value()), w_cpu.get_value(), atol=2e-2)
    np.testing.assert_allclose(np.asarray(b.get_value()), b_cpu.get_value(), atol=2e-2)


# ----------------------------------------------------------------------------- count_op

def _minus_reciprocal():
    """-1 / cast(n, float32), as the mean of a picked loss differentiates to."""
    from symgpu.scalar.composite import CompositeBuilder
    from symgpu.scalar.basic import SCALAR_OPS as S, Cast
    b = CompositeBuilder()
    n = b.add_input("int64")
    r = b.add_op(S["reciprocal"], b.add_op(Cast("float32"), [n]))[0]
    return b.build(b.add_op(S["neg"], [r]))


def test_the_losss_one_value_is_computed_from_the_count(vgpu):
    """A float32 classifier (no cast to group the -1/n with): the one-element kernel of the
    labels' count is gone, its scalar op computed by the gradient's node (count_op); with
    ``optimizer_excluding=gpu_nll_grad_count`` it is a launch again."""
    def nodes(**flags):
        with config.change_flags(**flags):
            x, y = T.matrix("x"), T.lvector("y")
            w = symgpu.shared(RNG.standard_normal((6, 5)).astype("float32"))
            lp = T.nnet.logsoftmax(T.dot(x, w))
            loss = -T.mean(lp[T.arange(y.shape[0]), y])
            f = function([x, y], [], updates=[(w, w - 0.1 * T.grad(loss, w))])
        return f.maker.fgraph.toposort()

    def tiny(ns):
        return [n for n in ns if type(n.op).__name__ == "GpuElemwise"
                and all(n.outputs[0].broadcastable)]
    on = nodes()
    (nll,) = [n for n in on if isinstance(n.op, GpuNLLGrad)]
    assert "v=Composite" in str(nll.op) and nll.inputs[0].dtype == "int64" and not tiny(on)
    off = nodes(optimizer_excluding="gpu_nll_grad_count")
    (nll,) = [n for n in off if isinstance(n.op, GpuNLLGrad)]
    assert nll.op.count_op is None and len(tiny(off)) == 1


def test_count_op_errors():
    m = GpuArrayType("float32", (False, False), None)()
    y = GpuArrayType("int64", (False,), None)()
    op = GpuNLLGrad(exp_m=True, count_op=_minus_reciprocal())
    assert op(T.lscalar(), m, T.lscalar(), y).type == m.type
    with pytest.raises(TypeError, match="host integer scalar"):
        op(T.dscalar(), m, T.lscalar(), y)
    with pytest.raises(TypeError, match="host integer scalar"):   # float32 values, m float64
        op(T.lscalar(), GpuArrayType("float64", (False, False), None)(), T.lscalar(), y)


@requires_gxx
@pytest.mark.parametrize("copy", [None, "bfloat16"])
def test_count_values_on_the_emulator(monkeypatch, tmp_path, copy):
    """The gradient with v = -1/c computed from the host count c (no v array), against
    NumPy; c may differ from the labelled rows (a loss averaged over another count)."""
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, ng)
    rows, cols, count = 6, 5, 8
    z = RNG.standard_normal((rows, cols))
    lp = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype("float32")
    labels = RNG.integers(0, cols, rows)
    op = GpuNLLGrad(exp_m=True, copy_dtype=copy, count_op=_minus_reciprocal())
    node = op.make_node(T.lscalar(), GpuArrayType("float32", (False, False), None)(),
                        T.lscalar(), GpuArrayType("int64", (False,), None)())
    out = [[None] for _ in node.outputs]
    op.perform(node, [np.int64(count), device_array(ctx, lp), np.int64(rows),
                      device_array(ctx, labels)], out)
    v = np.float32(-1.0) / np.float32(count)
    want = -np.exp(lp) * v
    want[np.arange(rows), labels] += v
    got = np.array(host_view(out[0][0]))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    if copy:
        np.testing.assert_array_equal(np.array(host_view(out[1][0])), got.astype(copy))


def test_a_count_the_caller_passes_stays_a_kernel(vgpu):
    """-pick.sum() / n with n an integer argument: its value would key a new CUDA graph per
    value as a host input of the node, where as the upload's graph parameter it does not; so
    the one-element kernel stays."""
    x, y, n = T.matrix("x"), T.lvector("y"), T.lscalar("n")
    w = symgpu.shared(RNG.standard_normal((6, 5)).astype("float32"))
    lp = T.nnet.logsoftmax(T.dot(x, w))
    loss = -lp[T.arange(y.shape[0]), y].sum() / n
    f = function([x, y, n], [], updates=[(w, w - 0.1 * T.grad(loss, w))])
    (nll,) = [nd for nd in f.maker.fgraph.toposort() if isinstance(nd.op, GpuNLLGrad)]
    assert nll.op.count_op is None
