"""theano.tests.breakpoint.PdbBreakpoint: the monitored values pass through; the debugger is
entered (with them in `monitored`) only when the condition holds; edits made there flow on;
gradients pass through; shapes; pickling."""
from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient import DisconnectedType
from symgpu.misc import breakpoint as bp


def _graph():
    x, t = T.dvector("x"), T.dvector("t")
    mse = (x - t) ** 2
    out, mx, mt = bp.PdbBreakpoint("MSE too high")(T.gt(mse.sum(), 100), mse, x, t)
    return x, t, out, mx, mt


def test_the_debugger_is_entered_only_when_the_condition_holds(monkeypatch):
    seen = []

    def hook():  # stands for pdb: reads (and edits) `monitored` in the frame that stopped
        frame = sys._getframe(1)
        seen.append([a.copy() for a in frame.f_locals["monitored"]])
        frame.f_locals["monitored"][0][:] = -1

    monkeypatch.setattr(sys, "breakpointhook", hook)
    x, t, out, mx, mt = _graph()
    f = symgpu.function([x, t], [out, mx])
    got, gx = f([10.0, 0.0], [10.0, 5.0])
    assert seen == [] and got.tolist() == [0.0, 25.0] and gx.tolist() == [10.0, 0.0]
    got, _ = f([0.0, 0.0], [10.0, 5.0])
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0][0], [100.0, 25.0])   # mse
    np.testing.assert_array_equal(seen[0][1], [0.0, 0.0])      # x
    np.testing.assert_array_equal(seen[0][2], [10.0, 5.0])     # t
    assert got.tolist() == [-1.0, -1.0]  # what was edited in the debugger flows on


def test_the_hook_is_replaceable(monkeypatch):
    calls = []
    monkeypatch.setattr(bp, "enter_debugger", lambda name, mon: calls.append((name, mon)))
    x = T.dscalar("x")
    y = bp.PdbBreakpoint("neg")(T.lt(x, 0), x)
    f = symgpu.function([x], y * 2)
    assert f(3.0) == 6.0 and calls == []
    assert f(-2.0) == -4.0 and calls[0][0] == "neg" and calls[0][1][0] == -2.0


def test_grad_passes_through():
    x = T.dvector("x")
    c = T.dscalar("c")
    y = bp.PdbBreakpoint("b")(T.gt(c, 0), x)
    g = T.grad((y ** 2).sum(), x)
    np.testing.assert_allclose(symgpu.function([x, c], g)([1.0, 2.0], -1.0), [2.0, 4.0])
    node = y.owner
    assert isinstance(node.op.grad(node.inputs, [y])[0].type, DisconnectedType)
    assert node.op.connection_pattern(node) == [[False], [True]]


def test_shape_and_views():
    x, m = T.dvector("x"), T.dmatrix("m")
    op = bp.PdbBreakpoint("b")
    a, b = op(T.constant(0), x, m)
    assert a.owner.op.view_map == {0: [1], 1: [2]} and a.owner.op == op
    f = symgpu.function([x, m], [a.shape, b.shape])
    sa, sb = f(np.zeros(3), np.zeros((2, 5)))
    assert tuple(sa) == (3,) and tuple(sb) == (2, 5)
    with pytest.raises(TypeError, match="scalar"):
        op(x, m)


def test_pickle():
    x, t, out, mx, mt = _graph()
    op = out.owner.op
    op2 = pickle.loads(pickle.dumps(op))
    assert op2 == op and op2.view_map == op.view_map
    f = pickle.loads(pickle.dumps(symgpu.function([x, t], out)))
    assert f([1.0], [2.0]).tolist() == [1.0]


def test_the_theano_path(monkeypatch):
    monkeypatch.setitem(sys.modules, "theano", symgpu)
    from theano.tests.breakpoint import PdbBreakpoint  # noqa: PLC0415
    assert PdbBreakpoint is bp.PdbBreakpoint
