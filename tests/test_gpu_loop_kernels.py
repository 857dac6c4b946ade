"""What a recurrent step costs on the GPU: the launches of its compiled bodies (issue 32).

Tests compile for a virtual GPU (`vgpu`) and inspect the rewritten graphs: an
``inc_subtensor`` into a fresh array writes in place (no copy of it first), one into a value
read afterwards does not; a write into zeros is a join; a join is one launch; ``x[:, None]``
is a DimShuffle, so a masked step's ``1 - m`` fuses.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function


def _incs(f):
    return [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuIncSubtensor"]


def test_inc_subtensor_into_a_fresh_array_writes_in_place(vgpu):
    x, y = T.matrix("x"), T.matrix("y")
    z = T.inc_subtensor(T.exp(x)[:, 1:3], y)
    f = function([x, y], z * 2)
    (inc,) = _incs(f)
    assert inc.op.inplace and inc.op.destroy_map == {0: [0]}


def test_inc_subtensor_into_a_value_read_later_copies(vgpu):
    x, y = T.matrix("x"), T.matrix("y")
    e = T.exp(x)
    g = function([x, y], [T.inc_subtensor(e[:, 1:3], y), e])
    (inc,) = _incs(g)
    assert not inc.op.inplace


def test_in_place_increments_give_numpy_results_on_the_cpu():
    """The same graphs on the host (the rule is the GPU's; the host's result must not move)."""
    x, y = T.matrix("x"), T.matrix("y")
    f = function([x, y], T.inc_subtensor(T.exp(x)[:, 1:3], y) * 2)
    xv, yv = np.ones((2, 4)), np.arange(4.).reshape(2, 2)
    want = np.exp(xv)
    want[:, 1:3] += yv
    np.testing.assert_allclose(f(xv, yv), want * 2)


# ----------------------------------------------------------------- GpuJoin in one launch

from cuda_on_host import requires_gxx  # noqa: E402
from emulated_gpu import device_array, host_view  # noqa: E402
from gpu_helpers import thunk_over  # noqa: E402
from test_gpu_kernels_emulated_more import copyk, emu  # noqa: E402,F401  (fixtures)


@requires_gxx
@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32", "float64"])
def test_strided_join_matches_numpy_concatenate(emu, copyk, dtype):  # noqa: F811
    """Inputs of any (outer, axis, inner) strides, a strided one among them, zero-length ones
    skipped: one launch writes numpy.concatenate's result."""
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((4, 10, 3)) * 20).astype(dtype)
    for axis, parts in [(1, [base[:, :2], base[:, ::3], base[:, 5:5], base[:, 1:2]]),
                        (0, [base[:1], base[1:4, :, :]]),
                        (2, [base[..., :1], base[..., 1:]])]:
        want = np.concatenate(parts, axis=axis)
        out = np.full(want.shape, 77, dtype=dtype)
        shape = want.shape
        outer = int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))
        specs, start = [], 0
        for p in parts:
            st = copyk.join_strides(p.shape, p.strides, axis)
            assert st is not None
            specs.append((p.ctypes.data, start, p.shape[axis], st))
            start += p.shape[axis]
        copyk.strided_join(emu, out.ctypes.data, out.itemsize, *outer, specs)
        np.testing.assert_array_equal(out, want, err_msg=f"axis {axis}")


def test_join_strides_declines_axes_that_do_not_merge():
    from symgpu.gpu.runtime.copykernel import join_strides
    a = np.zeros((3, 4, 5), dtype="float32")
    assert join_strides(a.shape, a.strides, 1) == (80, 20, 4)
    t = a.transpose(0, 2, 1)       # (3, 5, 4): the axes after axis 0 do not merge
    assert join_strides(t.shape, t.strides, 0) is None
    assert join_strides(t.shape, t.strides, 2) is None
    assert join_strides(t.shape, t.strides, 1) == (80, 4, 20)


@requires_gxx
def test_gpu_join_thunk_runs_one_launch_or_the_copies(emu, copyk, monkeypatch):  # noqa: F811
    from symgpu.gpu.ops import subtensor as gsub
    from symgpu.gpu.ops.subtensor import GpuJoin
    from symgpu.gpu.placement.type import GpuArrayType
    launches = []
    real = gsub.strided_join
    monkeypatch.setattr(gsub, "strided_join", lambda *a: (launches.append(a), real(*a)))
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((3, n)).astype("float32") for n in (2, 4, 1)]
    ins = [GpuArrayType("float32", (False, False), None)() for _ in xs]
    node = GpuJoin(1).make_node(*ins)
    thunk, storage = thunk_over(node, [device_array(emu, x) for x in xs])
    thunk()
    np.testing.assert_array_equal(host_view(storage[node.outputs[0]][0]),
                                  np.concatenate(xs, axis=1))
    assert len(launches) == 1
    # a transposed input: its strides are the kernel's (one launch again)
    t = device_array(emu, np.ascontiguousarray(xs[1].T)).transpose()
    thunk, storage = thunk_over(node, [device_array(emu, xs[0]), t, device_array(emu, xs[2])])
    thunk()
    np.testing.assert_array_equal(host_view(storage[node.outputs[0]][0]),
                                  np.concatenate(xs, axis=1))
    assert len(launches) == 2
    # 3-d inputs whose axes after the joined one do not merge: each copied on its own
    ys = [rng.standard_normal((2, n, 3, 4)).astype("float32") for n in (1, 2)]
    ins3 = [GpuArrayType("float32", (False,) * 4, None)() for _ in ys]
    node3 = GpuJoin(1).make_node(*ins3)
    vals = [device_array(emu, np.ascontiguousarray(y.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
            for y in ys]
    thunk, storage = thunk_over(node3, vals)
    thunk()
    np.testing.assert_array_equal(host_view(storage[node3.outputs[0]][0]),
                                  np.concatenate(ys, axis=1))
    assert len(launches) == 2


# ----------------------------------------------------------------- newaxis as a DimShuffle

def test_newaxis_indexing_becomes_a_dimshuffle():
    x, v = T.matrix("x"), T.vector("v")
    a, b = np.random.RandomState(0).rand(3, 4), np.arange(5.)
    cases = [(v[:, None], b[:, None]), (x[None, :, None], a[None, :, None]),
             (x[..., None], a[..., None]), (x[None, ...], a[None]),
             (x[:, None, :], a[:, None, :])]
    for expr, want in cases:
        f = function([x, v], expr, on_unused_input="ignore")
        names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
        assert names == ["DimShuffle"], names
        np.testing.assert_array_equal(f(a, b), want)
    f = function([x], x[1:, None])    # a real slice: indexing stays
    assert [type(n.op).__name__ for n in f.maker.fgraph.toposort()] == ["Subtensor"]
    np.testing.assert_array_equal(f(a), a[1:, None])


def test_a_masked_step_mixes_its_states_in_one_kernel(vgpu):
    """``m[:, None] * h + (1 - m)[:, None] * h_prev``: the ``1 - m`` fuses into the step's
    kernel, forward and backward."""
    from symgpu.gpu.ops.scan_op import GpuScan
    x, m, y = T.tensor3("x"), T.matrix("m"), T.matrix("y")
    W, U = T.matrix("W"), T.matrix("U")

    def step(xt, mt, hp, W, U):
        h = T.tanh(T.dot(xt, W) + T.dot(hp, U))
        return mt[:, None] * h + (1. - mt)[:, None] * hp

    h, _ = symgpu.scan(step, sequences=[x, m], outputs_info=T.zeros((4, 5), dtype="float32"),
                       non_sequences=[W, U])
    cost = ((h[-1] - y) ** 2).sum()
    f = function([x, m, y, W, U], symgpu.grad(cost, [W, U]))
    fwd, bwd = sorted((n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuScan)),
                      key=lambda n: n.op.info.name != "scan")
    for node, most in ((fwd, 1), (bwd, 2)):
        node.op.inner.compile()
        kernels = [n for n in node.op.inner.compiled_fgraph.toposort()
                   if type(n.op).__name__ == "GpuElemwise"]
        assert len(kernels) <= most, (node.op.info.name, [str(n.op)[:60] for n in kernels])


# ----------------------------------------------------------------- a write into zeros is a join

def test_a_write_into_zeros_is_a_join_of_zero_pieces_and_the_value():
    x, y = T.matrix("x"), T.matrix("y")
    rng = np.random.RandomState(1)
    xv = rng.rand(3, 7)
    for sl, width in [(slice(0, 4), 4), (slice(2, 5), 3), (slice(3, None), 4), (slice(5, 12), 2),
                      (slice(9, 12), 0)]:
        for set_ in (False, True):
            z = T.zeros_like(T.exp(x))[:, sl]
            e = T.set_subtensor(z, y) if set_ else T.inc_subtensor(z, y)
            f = function([x, y], e)
            names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
            assert "Join" in names and "IncSubtensor" not in names, names
            yv = rng.rand(3, width)
            want = np.zeros((3, 7))
            want[:, sl] = yv
            np.testing.assert_allclose(f(xv, yv), want)
    # a joined value is spliced into the one join
    a, b = T.matrix("a"), T.matrix("b")
    f = function([x, a, b], T.inc_subtensor(T.zeros_like(T.exp(x))[:, 1:4],
                                            T.concatenate([T.exp(a), T.exp(b)], axis=1)))
    joins = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "Join"]
    assert len(joins) == 1 and len(joins[0].inputs) == 4
    av, bv = rng.rand(3, 1), rng.rand(3, 2)
    want = np.zeros((3, 7))
    want[:, 1:4] = np.exp(np.concatenate([av, bv], axis=1))
    np.testing.assert_allclose(f(xv, av, bv), want)
    # a value broadcast into the region stays an increment
    r = T.row("r")
    f = function([x, r], T.inc_subtensor(T.zeros_like(T.exp(x))[:, 1:3], r))
    assert "IncSubtensor" in [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
