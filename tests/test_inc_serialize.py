"""local_inc_subtensor_serialize (symgpu/tensor/rewriting/inc_serialize.py): a sum of
increments of subtensors is one chain of increments (Theano's local_IncSubtensor_serialize),
checked on the rewritten graphs and against NumPy."""
from __future__ import annotations

import numpy as np

import symgpu
import symgpu.tensor as T
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.subtensor import AdvancedIncSubtensor, IncSubtensor

INCS = (IncSubtensor, AdvancedIncSubtensor)


def _nodes(f, classes):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, classes)]


def _sums_of_incs(f):
    return [n for n in _nodes(f, Elemwise) if getattr(n.op.scalar_op, "name", "") == "add"
            and any(v.owner is not None and isinstance(v.owner.op, INCS) for v in n.inputs)]


def test_the_gradient_of_a_matrix_read_by_blocks_and_an_index_array_sums_no_increment():
    """The gates of a fused matrix (their slices joined by the canonical passes) and an
    index array into it: the index array's increment goes onto the blocks' sum, no sum
    reads an increment."""
    x = T.matrix("x")
    cost = (x[:, 0:2] ** 2).sum() + (3 * x[:, 2:4]).sum() + T.tanh(x[:, 1:3]).sum() \
        + x[[0, 2, 0], 1].sum()
    f = symgpu.function([x], T.grad(cost, x))
    assert not _sums_of_incs(f)
    (inc,) = _nodes(f, INCS)
    assert inc.outputs[0] is f.maker.fgraph.outputs[0]
    v = np.random.default_rng(0).standard_normal((3, 4)).astype(symgpu.config.floatX)
    want = np.zeros_like(v)
    want[:, 0:2] += 2 * v[:, 0:2]
    want[:, 2:4] += 3
    want[:, 1:3] += 1 - np.tanh(v[:, 1:3]) ** 2
    np.add.at(want[:, 1], [0, 2, 0], 1)
    np.testing.assert_allclose(f(v), want, rtol=1e-5, atol=1e-6)


def test_a_set_and_an_increment_read_twice_stay_in_the_sum():
    x, y = T.matrix("x"), T.matrix("y")
    shared_inc = T.inc_subtensor(x[:, 0:2], y)
    total = T.set_subtensor(x[:, 1:3], y) + shared_inc
    f = symgpu.function([x, y], [total, shared_inc * 2])
    incs = _nodes(f, INCS)      # (the sum is fused with the product later)
    assert len(incs) == 2 and all(n.inputs[0] is f.maker.fgraph.inputs[0] for n in incs)
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((3, 4)).astype(symgpu.config.floatX)
    yv = rng.standard_normal((3, 2)).astype(symgpu.config.floatX)
    a, b = xv.copy(), xv.copy()
    a[:, 1:3] = yv
    b[:, 0:2] += yv
    got = f(xv, yv)
    np.testing.assert_allclose(got[0], a + b, rtol=1e-6)
    np.testing.assert_allclose(got[1], 2 * b, rtol=1e-6)


def test_increments_of_other_bases_keep_their_sum_as_the_chains_start():
    """add(inc(a, y0), inc(b, y1), c) = inc(inc(a + b + c, y0), y1): no base is a zero fill
    here, and the result is the same."""
    a, b, c, y = (T.matrix(n) for n in "abcy")
    out = T.inc_subtensor(a[0:2], y) + T.inc_subtensor(b[1:3], y) + c
    f = symgpu.function([a, b, c, y], out)
    assert not _sums_of_incs(f)
    rng = np.random.default_rng(2)
    av, bv, cv = (rng.standard_normal((4, 3)).astype(symgpu.config.floatX) for _ in range(3))
    yv = rng.standard_normal((2, 3)).astype(symgpu.config.floatX)
    want = av + bv + cv
    want[0:2] += yv
    want[1:3] += yv
    np.testing.assert_allclose(f(av, bv, cv, yv), want, rtol=1e-5)


def test_vgpu_a_cudnn_layers_weight_gradients_are_one_join_each(vgpu):
    """scan_to_dnn_rnn unpacks cuDNN's flat weight gradient after the canonical passes: the
    late passes join each matrix's gate blocks (one launch), no zero fill copied per gate,
    no write per gate and no sum of whole matrices."""
    import os
    import sys
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import rnn_cells as rc
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.ops.subtensor import GpuIncSubtensor, GpuJoin
    for cell, gates in (("gru", 3), ("lstm", 4)):
        spec = rc.parse_key(f"{cell}-masked-last-b16-h128-fixed")
        fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec))[2]
        joins = [n for n in _nodes(fn, GpuJoin) if len(n.inputs) >= gates]
        assert len(joins) >= 4, [str(n.op) for n in joins]       # W, U, biases, cuDNN's
        writes = _nodes(fn, GpuIncSubtensor)
        assert len(writes) == 1, [str(n.op) for n in writes]     # the last state's
        assert not [n for n in _nodes(fn, GpuElemwise)
                    if getattr(n.op.scalar_op, "name", "") == "add" and n.outputs[0].ndim == 2]
