"""ifelse: Theano's conditions tutorial, laziness (the branch not taken never runs), several
outputs, gradients (zero for the branch not taken), shapes and errors."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient import verify_grad
from symgpu.ifelse import IfElse, ifelse
from symgpu.graph.op import Op
from symgpu.graph.basic import Apply

floatX = symgpu.config.floatX


def test_tutorial_switch_vs_lazy_ifelse():
    a, b = T.scalar("a"), T.scalar("b")
    x, y = T.matrix("x"), T.matrix("y")
    z_switch = T.switch(T.lt(a, b), T.mean(x), T.mean(y))
    z_lazy = ifelse(T.lt(a, b), T.mean(x), T.mean(y))
    f_switch = symgpu.function([a, b, x, y], z_switch)
    f_lazyifelse = symgpu.function([a, b, x, y], z_lazy)
    val1, val2 = 0., 1.
    big_mat1 = np.ones((100, 100), dtype=floatX)
    big_mat2 = np.ones((100, 100), dtype=floatX) * 3
    for f in (f_switch, f_lazyifelse):
        assert float(f(val1, val2, big_mat1, big_mat2)) == 1.0
        assert float(f(val2, val1, big_mat1, big_mat2)) == 3.0
    # each mean lives inside its branch of the lazy version
    # (with device=cuda the op is its GPU twin GpuIfElse, an IfElse, and sums GpuCAReduce)
    nodes = f_lazyifelse.maker.fgraph.toposort()
    assert any(isinstance(n.op, IfElse) for n in nodes)
    assert not any("Sum" in str(n.op) or "CAReduce" in str(n.op) or "mean" in str(n.op).lower()
                   for n in nodes if not isinstance(n.op, IfElse))


class Explode(Op):
    """Raises when it runs: proves a branch is never computed."""
    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        raise RuntimeError("the untaken branch ran")

    def grad(self, inputs, output_grads):
        return [Explode()(output_grads[0])]


def test_only_the_taken_branch_runs():
    c = T.iscalar("c")
    x = T.dvector("x")
    out = ifelse(c, x * 2, Explode()(x) + 1)
    f = symgpu.function([c, x], out)
    np.testing.assert_allclose(f(1, np.arange(3.0)), [0.0, 2.0, 4.0])
    with pytest.raises(RuntimeError, match="untaken branch ran"):
        f(0, np.arange(3.0))
    out2 = ifelse(c, Explode()(x), x - 1)
    f2 = symgpu.function([c, x], out2)
    np.testing.assert_allclose(f2(0, np.arange(3.0)), [-1.0, 0.0, 1.0])


def test_lazy_branch_that_would_fail_with_bad_index():
    v, i = T.dvector("v"), T.lscalar("i")
    f = symgpu.function([v, i], ifelse(T.lt(i, v.shape[0]), v[i] * 2,
                                       T.constant(-1.0, dtype="float64")))
    assert float(f(np.arange(3.0), 1)) == 2.0
    assert float(f(np.arange(3.0), 7)) == -1.0


def test_several_outputs_and_shared_parts_stay_outside():
    c = T.iscalar("c")
    x, y = T.dvector("x"), T.dvector("y")
    common = T.exp(x)  # needed by both branches: computed once, outside
    outs = ifelse(c, [common + y, y * 2], [common * y, y - 1])
    assert isinstance(outs, list) and len(outs) == 2
    f = symgpu.function([c, x, y], outs)
    xv, yv = np.array([0.0, 1.0]), np.array([2.0, 3.0])
    r1 = f(1, xv, yv)
    r0 = f(0, xv, yv)
    np.testing.assert_allclose(r1[0], np.exp(xv) + yv)
    np.testing.assert_allclose(r1[1], yv * 2)
    np.testing.assert_allclose(r0[0], np.exp(xv) * yv)
    np.testing.assert_allclose(r0[1], yv - 1)
    node = outs[0].owner
    inner = [str(n.op) for n in node.op.then_fn.fgraph.toposort()]
    assert not any("exp" in s for s in inner)


def test_outer_variables_stay_outside_even_when_one_branch_alone_reads_them():
    """`outer=`: a rewrite passes the graph's variables, computed anyway; without it the
    branch reading `common` alone takes a copy of its work inside."""
    c = T.iscalar("c")
    x, y = T.dvector("x"), T.dvector("y")
    common = T.exp(x)
    inside = ifelse(c, common + y, y * 2)
    outside = ifelse(c, common + y, y * 2, outer={common})
    assert any("exp" in str(n.op) for n in inside.owner.op.then_fn.fgraph.toposort())
    assert not any("exp" in str(n.op) for n in outside.owner.op.then_fn.fgraph.toposort())
    assert common in outside.owner.inputs
    f = symgpu.function([c, x, y], [outside, common])
    xv, yv = np.array([0.0, 1.0]), np.array([2.0, 3.0])
    np.testing.assert_allclose(f(1, xv, yv)[0], np.exp(xv) + yv)
    np.testing.assert_allclose(f(0, xv, yv)[0], yv * 2)


def test_output_never_aliases_an_input():
    c = T.iscalar("c")
    x = T.dvector("x")
    f = symgpu.function([c, x], ifelse(c, x, x * 2))
    xv = np.arange(3.0)
    r = f(1, xv)
    r[0] = 100.0
    assert xv[0] == 0.0


def test_grad_zero_for_the_branch_not_taken():
    def g(x, y):
        return ifelse(T.gt(x.sum(), 0), [x * y, T.sin(y)], [y ** 2, x * 3])
    verify_grad(g, [np.array([1.0, 2.0]), np.array([3.0, -1.0])])
    verify_grad(g, [np.array([-1.0, -2.0]), np.array([3.0, -1.0])])
    c = T.iscalar("c")
    x, y = T.dvector("x"), T.dvector("y")
    out = ifelse(c, x ** 2, y * 3)
    gx, gy = symgpu.function([c, x, y], T.grad(out.sum(), [x, y]))(1, np.array([1.0, 2.0]),
                                                                  np.array([5.0, 5.0]))
    np.testing.assert_allclose(gx, [2.0, 4.0])
    np.testing.assert_allclose(gy, [0.0, 0.0])


def test_grad_of_the_gradient_branch_is_lazy_too():
    c = T.iscalar("c")
    x = T.dvector("x")
    out = ifelse(c, (x ** 3).sum(), Explode()(x).sum())
    g = T.grad(out, x)
    f = symgpu.function([c, x], g)
    np.testing.assert_allclose(f(1, np.array([1.0, 2.0])), [3.0, 12.0])


def test_infer_shape():
    c = T.iscalar("c")
    x = T.dmatrix("x")
    out = ifelse(c, x[1:], x.T)
    node = out.owner
    (shape,) = node.op.infer_shape(None, node, [()] + [None] * (len(node.inputs) - 1))
    f = symgpu.function([c, x], list(shape))
    xv = np.ones((4, 3))
    assert [int(s) for s in f(1, xv)] == [3, 3]
    assert [int(s) for s in f(0, xv)] == [3, 4]


def test_errors():
    c = T.iscalar("c")
    x, m = T.dvector("x"), T.dmatrix("m")
    with pytest.raises(TypeError, match="output 0 is .*vector.* in the then branch"):
        ifelse(c, x, m)
    with pytest.raises(ValueError, match="1 output\\(s\\) and the else branch 2"):
        ifelse(c, [x], [x, x])
    with pytest.raises(TypeError, match="condition must be a scalar"):
        ifelse(x, x, x)
    f32 = T.fvector("f")
    with pytest.raises(TypeError, match="same dtype"):
        ifelse(c, x, f32)


def test_python_number_branch_adopts_dtype_and_inside_scan():
    c = T.iscalar("c")
    x = T.dscalar("x")
    f = symgpu.function([c, x], ifelse(c, x * 2, 0.0))
    assert float(f(1, 3.0)) == 6.0 and float(f(0, 3.0)) == 0.0
    v = T.dvector("v")
    out, _ = symgpu.scan(lambda a, acc: ifelse(T.gt(a, 0), acc + a, acc), sequences=v,
                         outputs_info=T.constant(0.0, dtype="float64"))
    np.testing.assert_allclose(symgpu.function([v], out)(np.array([1.0, -2.0, 3.0])),
                               [1.0, 1.0, 4.0])
