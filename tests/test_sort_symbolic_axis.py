"""Theano's SortOp / ArgSortOp: the axis as a symbolic input; isinstance covers Sort nodes."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient_check import verify_grad
from symgpu.tensor.extra_ops import ArgSort, Sort, TakeAlongAxis
from symgpu.tensor.sort import ArgSortOp, SortOp, argsort, sort

M = np.random.RandomState(3).rand(3, 4)


def test_symbolic_axis_sorts_as_numpy():
    a, ax = T.dmatrix(), T.scalar()   # Theano's tests pass a float scalar axis
    f = symgpu.function([a, ax], [sort(a, ax, "mergesort"), argsort(a, ax)])
    assert [type(n.op) for n in f.maker.fgraph.toposort()] == [SortOp, ArgSortOp]
    for v in (0, 1, -1, -2):
        s, i = f(M, v)
        np.testing.assert_array_equal(s, np.sort(M, v))
        np.testing.assert_array_equal(i, np.argsort(M, v))
        assert i.dtype == np.int64
    with pytest.raises(ValueError, match="axis 2.0 is not an axis"):
        f(M, 2)
    with pytest.raises(ValueError, match="axis 0.5 is not an axis"):
        f(M, 0.5)


def test_known_axis_makes_symgpus_node_and_isinstance_holds():
    a = T.dmatrix()
    for axis, want in ((1, Sort(1)), (-2, Sort(0)), (T.constant(0), Sort(0))):
        node = SortOp("quicksort")(a, axis).owner
        assert node.op == want and isinstance(node.op, SortOp)
    flat = SortOp("quicksort")(a, None)
    assert flat.ndim == 1 and isinstance(flat.owner.op, Sort)
    assert isinstance(argsort(a).owner.op, ArgSortOp) and isinstance(argsort(a).owner.op, ArgSort)
    assert not isinstance(argsort(a).owner.op, SortOp) and not isinstance(sort(a).owner.op, ArgSortOp)
    assert SortOp("mergesort", []) == SortOp("mergesort", []) != SortOp("quicksort", [])
    assert hash(ArgSortOp("mergesort", [])) == hash(ArgSortOp("mergesort"))
    with pytest.raises(ValueError, match="structured"):
        SortOp("quicksort", ["f0"])
    with pytest.raises(TypeError, match="real scalar"):
        SortOp("quicksort")(a, T.lvector())


def test_infer_shape_and_gradient_with_symbolic_axis():
    a, i = T.dmatrix(), T.lscalar()
    shape = symgpu.function([a, i], sort(a, i).shape)
    assert not any(isinstance(n.op, SortOp) for n in shape.maker.fgraph.toposort())
    np.testing.assert_array_equal(shape(M, 1), [3, 4])
    for v in (0, 1, -1):
        ax = symgpu.shared(np.int64(v))
        verify_grad(lambda x: SortOp("quicksort")(x, ax) ** 2, [M])
        verify_grad(lambda x: TakeAlongAxis()(x, ArgSortOp("quicksort")(x, ax), ax) * x, [M])
    w = np.arange(12.0).reshape(3, 4)
    g = symgpu.function([a, i], symgpu.grad((sort(a, i) ** 2 * w).sum(), a))
    for v in (0, 1):
        static = symgpu.function([a], symgpu.grad((sort(a, v) ** 2 * w).sum(), a))
        np.testing.assert_allclose(g(M, v), static(M))
