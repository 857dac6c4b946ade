"""The `partial_sums` pass (symgpu/tensor/rewriting/partial_sums.py): a flat add reads a
partial sum computed anyway, so products fold into one Gemm; elementwise work read through
disjoint slices is computed per slice, so it fuses into each slice's reader."""
from __future__ import annotations

import collections

import numpy as np

import symgpu
import symgpu.tensor as T

OFF = {"optimizer_excluding": "partial_sums"}


def kinds(f) -> collections.Counter:
    return collections.Counter(type(n.op).__name__ for n in f.maker.fgraph.toposort())


def rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape)


def test_a_sum_read_twice_is_computed_once_and_its_products_fold_into_a_gemm():
    x, h, W, U, b = T.dmatrix("x"), T.dmatrix("h"), T.dmatrix("W"), T.dmatrix("U"), T.dvector("b")
    s = T.dot(x, W) + T.dot(h, U)
    f = symgpu.function([x, h, W, U, b], [T.tanh(s + b), s])
    k = kinds(f)
    assert k["Dot22"] == 1 and k["Gemm"] == 1 and k["Elemwise"] == 1, k
    with symgpu.config.change_flags(**OFF):
        off = kinds(symgpu.function([x, h, W, U, b], [T.tanh(s + b), s]))
    assert off["Dot22"] == 2 and "Gemm" not in off, off
    xv, hv, Wv, Uv, bv = rand(3, 4), rand(3, 5), rand(4, 6), rand(5, 6), rand(6)
    sv = xv @ Wv + hv @ Uv
    got = f(xv, hv, Wv, Uv, bv)
    np.testing.assert_allclose(got[0], np.tanh(sv + bv))
    np.testing.assert_allclose(got[1], sv)


def _gates(pre, H):
    i, f = T.nnet.sigmoid(pre[:, :H]), T.nnet.sigmoid(pre[:, H:2 * H])
    return i * T.tanh(pre[:, 2 * H:3 * H]) + f


def test_elementwise_work_read_through_disjoint_slices_fuses_into_their_readers():
    z, b = T.dmatrix("z"), T.dvector("b")
    f = symgpu.function([z, b], _gates(z + b, 4))
    k = kinds(f)
    assert k["Elemwise"] == 1, f.maker.fgraph.toposort()     # the add went into the one kernel
    zv, bv = rand(3, 12), rand(12)
    pv = zv + bv
    sig = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    np.testing.assert_allclose(f(zv, bv), sig(pv[:, :4]) * np.tanh(pv[:, 8:]) + sig(pv[:, 4:8]))


def test_slices_that_overlap_or_feed_a_product_leave_the_result_whole():
    z, b, W = T.dmatrix("z"), T.dvector("b"), T.dmatrix("W")
    pre = z + b
    overlap = symgpu.function([z, b], T.tanh(pre[:, :6]) + T.exp(pre[:, 3:9]))
    subs = [n for n in overlap.maker.fgraph.toposort() if type(n.op).__name__ == "Subtensor"]
    assert len(subs) == 2 and subs[0].inputs[0] is subs[1].inputs[0]   # of one whole sum
    product = symgpu.function([z, b, W], T.dot(pre[:, :4], W) + T.tanh(pre[:, 4:]).sum())
    subs = [n for n in product.maker.fgraph.toposort() if type(n.op).__name__ == "Subtensor"]
    assert len(subs) == 2 and subs[0].inputs[0] is subs[1].inputs[0]   # of one whole sum
    zv, bv, Wv = rand(2, 9), rand(9), rand(4, 3)
    pv = zv + bv
    np.testing.assert_allclose(overlap(zv, bv), np.tanh(pv[:, :6]) + np.exp(pv[:, 3:9]))
    np.testing.assert_allclose(product(zv, bv, Wv), pv[:, :4] @ Wv + np.tanh(pv[:, 4:]).sum())


def test_a_strided_slice_or_a_result_also_returned_stays_whole():
    z, b = T.dmatrix("z"), T.dvector("b")
    pre = z + b
    strided = symgpu.function([z, b], T.tanh(pre[:, ::2]))
    returned = symgpu.function([z, b], [T.tanh(pre[:, :3]), pre])
    for f in (strided, returned):
        subs = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "Subtensor"]
        assert subs and all(s.inputs[0].owner is not None for s in subs), f
        assert all(type(s.inputs[0].owner.op).__name__ == "Elemwise" for s in subs)


def test_an_lstm_step_is_one_product_one_gemm_and_one_kernel_forward(vgpu):
    """The backward loop saves the step's pre-activation sum; the forward step computes it
    as Dot22 + Gemm writing into the first product, and the bias and the four gates are one
    kernel; the backward step reads the saved sum, with no add of its own."""
    H = 8
    x, h0 = T.tensor3("x"), T.matrix("h0")
    W = symgpu.shared(rand(4, 4 * H).astype("float32"))
    U = symgpu.shared(rand(H, 4 * H).astype("float32"))
    b = symgpu.shared(rand(4 * H).astype("float32"))

    def step(x_t, h, c):
        pre = T.dot(x_t, W) + T.dot(h, U) + b
        i, f, o = (T.nnet.sigmoid(pre[:, k * H:(k + 1) * H]) for k in range(3))
        c = f * c + i * T.tanh(pre[:, 3 * H:])
        return o * T.tanh(c), c
    (hs, _), _ = symgpu.scan(step, sequences=x, outputs_info=[h0, h0])
    fn = symgpu.function([x, h0], T.grad((hs[-1] ** 2).sum(), [W, U, b]))
    bodies = {n.op.inner.name: collections.Counter(type(m.op).__name__ for m in
                                                   n.op.inner.rewritten().toposort())
              for n in fn.maker.fgraph.toposort() if hasattr(n.op, "inner")}
    fwd, bwd = bodies["scan body"], bodies["grad_of_scan body"]
    assert fwd["GpuDot22"] == 1 and fwd["GpuGemm"] == 1 and fwd["GpuElemwise"] == 1, fwd
    assert bwd["GpuDot22"] + bwd["GpuGemm"] == 1, bwd


def test_a_cast_under_a_distributed_bias_add_goes_into_the_slices_too():
    """(cast(a) + b)[s_k]: once the add is per slice, so is the cast (tried again from the new
    slices), so no float32 copy of the whole half-precision product is written."""
    a, b = T.matrix("a", dtype="float16"), T.vector("b", dtype="float32")
    z = T.cast(a, "float32") + b
    f = symgpu.function([a, b], [T.tanh(z[:, :4]), T.exp(z[:, 4:8])])
    nodes = f.maker.fgraph.toposort()
    assert not any(type(n.op).__name__ == "Elemwise" and n.inputs[0] is f.maker.fgraph.inputs[0]
                   for n in nodes), [str(n.op) for n in nodes]
    av, bv = rand(3, 8).astype("float16"), rand(8).astype("float32")
    zv = av.astype("float32") + bv
    got = f(av, bv)
    np.testing.assert_allclose(got[0], np.tanh(zv[:, :4]), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.exp(zv[:, 4:8]), rtol=1e-6)
