"""What a recurrent step costs on the GPU: the launches of its compiled bodies (issue 32).

Tests compile for a virtual GPU (`vgpu`) and inspect the rewritten graphs: a gradient's
``inc_subtensor`` into a fresh zeros array writes in place (no copy of the zeros first),
while one into a value that is read afterwards does not.
"""
from __future__ import annotations

import numpy as np

import symgpu
import symgpu.tensor as T
from symgpu import function


def _incs(f):
    return [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuIncSubtensor"]


def test_inc_subtensor_into_a_fresh_array_writes_in_place(vgpu):
    x, y = T.matrix("x"), T.matrix("y")
    z = T.inc_subtensor(T.zeros_like(T.exp(x))[:, 1:3], y)
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
    f = function([x, y], T.inc_subtensor(T.zeros_like(T.exp(x))[:, 1:3], y) * 2)
    xv, yv = np.ones((2, 4)), np.arange(4.).reshape(2, 2)
    want = np.zeros((2, 4))
    want[:, 1:3] += yv
    np.testing.assert_allclose(f(xv, yv), want * 2)
