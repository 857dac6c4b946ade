"""symgpu.tensor.nnet.ctc: Theano's CTC test cases (warp-ctc's values), a brute-force sum over
every alignment on tiny cases, PyTorch's ctc_loss where torch is importable, verify_grad,
the no-gradient rewrite, infer_shape, errors and pickling."""
from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet.ctc import (ConnectionistTemporalClassification, ctc, ctc_available,
                                    ctc_cost_and_grad, ctc_present)
from symgpu.tensor.rewriting.shape_feature import node_shapes

RNG = np.random.RandomState(33)


def torch_case():
    """Theano's test_torch_case (warp-ctc's Torch tutorial): costs and gradients."""
    acts = np.asarray([[[0, 0, 0, 0, 0], [1, 2, 3, 4, 5], [-5, -4, -3, -2, -1]],
                       [[0, 0, 0, 0, 0], [6, 7, 8, 9, 10], [-10, -9, -8, -7, -6]],
                       [[0, 0, 0, 0, 0], [11, 12, 13, 14, 15], [-15, -14, -13, -12, -11]]],
                      dtype=np.float32)
    lengths = np.asarray([1, 3, 3], dtype=np.int32)
    labels = np.asarray([[1, -1], [3, 3], [2, 3]], dtype=np.int32)
    costs = np.asarray([1.609437943, 7.355742931, 4.938849926], dtype=np.float32)
    grads = np.asarray(
        [[[0.2, -0.8, 0.2, 0.2, 0.2],
          [0.01165623125, 0.03168492019, 0.08612854034, -0.7658783197, 0.636408627],
          [-0.02115798369, 0.03168492019, -0.8810571432, 0.2341216654, 0.636408627]],
         [[0, 0, 0, 0, 0],
          [-0.9883437753, 0.03168492019, 0.08612854034, 0.2341216654, 0.636408627],
          [-0.02115798369, 0.03168492019, -0.1891518533, -0.4577836394, 0.636408627]],
         [[0, 0, 0, 0, 0],
          [0.01165623125, 0.03168492019, 0.08612854034, -0.7658783197, 0.636408627],
          [-0.02115798369, 0.03168492019, 0.08612854034, -0.7330639958, 0.636408627]]],
        dtype=np.float32)
    return acts, labels, lengths, costs, grads


def ctc_case():
    """Theano's test_ctc."""
    acts = np.asarray([[[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1]],
                       [[0.6, 0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.5, 0.2, 0.1]]], dtype=np.float32)
    lengths = np.asarray([2, 2], dtype=np.int32)
    labels = np.asarray([[1, 2], [1, 2]], dtype=np.int32)
    costs = np.asarray([2.962858438, 3.053659201], dtype=np.float32)
    grads = np.asarray(
        [[[0.177031219, -0.7081246376, 0.177031219, 0.177031219, 0.177031219],
          [0.177031219, -0.8229685426, 0.291875124, 0.177031219, 0.177031219]],
         [[0.291875124, 0.177031219, -0.8229685426, 0.177031219, 0.177031219],
          [0.1786672771, 0.1786672771, -0.7334594727, 0.1974578798, 0.1786672771]]],
        dtype=np.float32)
    return acts, labels, lengths, costs, grads


def brute_force(acts, labels, lengths):
    """-log of the sum over every path of length T_b whose collapse (merge repeats, drop
    blanks) is the label sequence; float64."""
    t_max, nb, na = acts.shape
    x = acts.astype(np.float64)
    p = np.exp(x - x.max(2, keepdims=True))
    p /= p.sum(2, keepdims=True)
    out = []
    for b in range(nb):
        want = [int(v) for v in labels[b] if v >= 0]
        total = 0.0
        for path in itertools.product(range(na), repeat=int(lengths[b])):
            collapsed = [k for i, k in enumerate(path) if k != 0 and (i == 0 or path[i - 1] != k)]
            if collapsed == want:
                total += np.prod([p[t, b, k] for t, k in enumerate(path)])
        out.append(-np.log(total) if total > 0 else np.inf)
    return np.array(out)


def compiled(dtype="float32", **kw):
    a = T.tensor3("acts", dtype=dtype)
    lab, ln = T.imatrix("labels"), T.ivector("lengths")
    cost = ctc(a, lab, ln)
    w = T.vector("w", dtype=dtype)
    g = T.grad((cost * w).sum(), a)
    return function([a, lab, ln, w], [cost, g], **kw)


@pytest.mark.parametrize("make", [torch_case, ctc_case], ids=["torch_case", "ctc_case"])
def test_theano_cases_costs_and_gradients(make):
    acts, labels, lengths, costs, grads = make()
    a, lab, ln = symgpu.shared(acts), symgpu.shared(labels), symgpu.shared(lengths)
    cost = ctc(a, lab, ln)
    f = function([], [cost, T.grad(T.mean(cost), a)])
    got_cost, got_grad = f()
    assert got_cost.dtype == got_grad.dtype == np.float32
    np.testing.assert_allclose(got_cost, costs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_grad, grads / len(costs), rtol=1e-4, atol=1e-6)


def test_unused_gradient_is_not_computed():
    acts, labels, lengths, costs, _ = ctc_case()
    f = function([], ctc(symgpu.shared(acts), symgpu.shared(labels), symgpu.shared(lengths)))
    ops = [n.op for n in f.maker.fgraph.apply_nodes
           if isinstance(n.op, ConnectionistTemporalClassification)]
    assert ops == [ConnectionistTemporalClassification(compute_grad=False)]
    np.testing.assert_allclose(f(), costs, rtol=1e-5)
    assert ctc_available() and ctc_present()


def random_case(t_max, nb, na, max_len, rng, dtype="float64"):
    acts = rng.standard_normal((t_max, nb, na)).astype(dtype) * 2
    lengths = rng.randint(0, t_max + 1, size=nb).astype(np.int32)
    labels = np.full((nb, max_len), -1, np.int32)
    for b in range(nb):
        n = rng.randint(0, max_len + 1)
        slots = np.sort(rng.choice(max_len, size=n, replace=False))   # padding anywhere
        labels[b, slots] = rng.randint(1, na, size=n)
    return acts, labels, lengths


@pytest.mark.parametrize("seed", range(6))
def test_costs_equal_a_sum_over_every_alignment(seed):
    rng = np.random.RandomState(seed)
    acts, labels, lengths = random_case(5, 6, 3, 3, rng)
    labels[0] = [1, 1, -1]          # a repeat needs a blank between: T >= 3
    lengths[0] = 3
    labels[1] = [2, 2, 2]           # three equal labels need 5 steps: exactly feasible
    lengths[1] = 5
    labels[2] = [1, 2, 1]
    lengths[2] = 2                  # infeasible: +inf
    got, grad = ctc_cost_and_grad(acts, labels, lengths)
    want = brute_force(acts, labels, lengths)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert np.isinf(got[2]) and not grad[:, 2].any()
    for b, n in enumerate(lengths):
        assert not grad[n:, b].any()   # nothing past an element's length


def test_empty_input_and_empty_label():
    acts = RNG.standard_normal((3, 3, 4))
    labels = np.array([[-1, -1], [2, -1], [-1, -1]], np.int32)
    lengths = np.array([0, 0, 3], np.int32)
    cost, grad = ctc_cost_and_grad(acts, labels, lengths)
    assert cost[0] == 0 and np.isinf(cost[1])
    # only blanks: -sum_t log softmax(x_t)[0]
    x = acts[:, 2]
    ls = x - np.log(np.exp(x).sum(1, keepdims=True))
    np.testing.assert_allclose(cost[2], -ls[:, 0].sum())
    assert not grad[:, :2].any()
    cost, grad = ctc_cost_and_grad(acts[:0], labels, np.zeros(3, np.int32))   # no time axis
    assert cost.tolist() == [0.0, np.inf, 0.0] and grad.shape == (0, 3, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradient_scales_with_the_output_gradient(dtype):
    acts, labels, lengths = random_case(6, 4, 5, 3, np.random.RandomState(3), dtype)
    lengths[:] = 6
    w = np.array([1.0, -2.0, 0.5, 3.0], dtype)
    cost, grad = compiled(dtype)(acts, labels, lengths, w)
    ref_cost, ref_grad = ctc_cost_and_grad(acts, labels, lengths)
    assert cost.dtype == grad.dtype == dtype
    np.testing.assert_allclose(cost, ref_cost)
    np.testing.assert_allclose(grad, ref_grad * w[None, :, None], rtol=1e-5, atol=1e-6)


def test_verify_grad():
    acts, labels, lengths = random_case(6, 3, 4, 3, np.random.RandomState(5))
    lengths[:] = [6, 4, 5]
    labels[:] = [[1, 2, 1], [3, -1, 3], [-1, 2, -1]]
    verify_grad(lambda a: ctc(a, symgpu.shared(labels), symgpu.shared(lengths)), [acts])


def test_verify_grad_theano_float32_case():
    acts, labels, lengths, _, _ = ctc_case()
    verify_grad(lambda a: ctc(a, symgpu.shared(labels), symgpu.shared(lengths)), [acts])


def test_gradient_of_a_node_built_without_gradient():
    a = T.dtensor3()
    lab, ln = T.imatrix(), T.ivector()
    cost = ConnectionistTemporalClassification(compute_grad=False)(a, lab, ln)
    assert len(cost.owner.outputs) == 1
    g = T.grad(cost.sum(), a)
    acts, labels, lengths = random_case(4, 2, 3, 2, np.random.RandomState(8))
    got = function([a, lab, ln], g)(acts, labels, lengths)
    np.testing.assert_allclose(got, ctc_cost_and_grad(acts, labels, lengths)[1])


def test_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.RandomState(9)
    acts, labels, lengths = random_case(12, 7, 6, 5, rng)
    lengths = rng.randint(5, 13, size=7).astype(np.int32)      # torch: no empty input
    x = torch.tensor(acts, requires_grad=True)
    lp = torch.log_softmax(x, dim=2)
    targets = [torch.tensor([v for v in row if v >= 0], dtype=torch.long) for row in labels]
    tl = torch.tensor([len(t) for t in targets])
    flat = torch.cat(targets) if int(tl.sum()) else torch.zeros(0, dtype=torch.long)
    loss = torch.nn.functional.ctc_loss(lp, flat, torch.tensor(lengths, dtype=torch.long), tl,
                                        blank=0, reduction="none", zero_infinity=False)
    w = torch.tensor(rng.uniform(0.5, 1.5, size=7))
    (loss * w).sum().backward()
    cost, grad = compiled("float64")(acts, labels, lengths, w.numpy())
    np.testing.assert_allclose(cost, loss.detach().numpy(), rtol=1e-9)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-7, atol=1e-10)


def test_infer_shape_needs_no_computation():
    a, lab, ln = T.ftensor3(), T.imatrix(), T.ivector()
    node = ctc(a, lab, ln).owner
    shapes = node_shapes(node)
    f = function([a], [d for s in shapes for d in s])
    assert [int(v) for v in f(np.zeros((7, 3, 5), np.float32))] == [3, 7, 3, 5]
    assert not any(isinstance(n.op, ConnectionistTemporalClassification)
                   for n in f.maker.fgraph.apply_nodes)


def test_type_errors():
    with pytest.raises(TypeError, match="activations must be a 3-d float32/float64"):
        ctc(T.imatrix(), T.imatrix(), T.ivector())
    with pytest.raises(TypeError, match="activations must be a 3-d"):
        ctc(T.itensor3(), T.imatrix(), T.ivector())
    with pytest.raises(TypeError, match="labels must be an int32 matrix"):
        ctc(T.ftensor3(), T.lmatrix(), T.ivector())
    with pytest.raises(TypeError, match="input_lengths must be an int32 vector"):
        ctc(T.ftensor3(), T.imatrix(), T.imatrix())


@pytest.mark.parametrize("labels, lengths, match", [
    ([[1, 2], [1, 1]], [3], r"need 2 rows of labels and 2 input lengths.*\(1,\)"),
    ([[1, 2]], [3, 3], r"need 2 rows of labels.*\(1, 2\)"),
    ([[1, 2], [1, 1]], [3, 4], r"input_lengths must lie in \[0, 3\].*input_lengths\[1\] = 4"),
    ([[1, 2], [1, 1]], [-1, 3], r"input_lengths\[0\] = -1"),
    ([[1, 2], [0, 1]], [3, 3], r"labels must lie in \[1, 4\).*labels\[1, 0\] = 0"),
    ([[1, 4], [1, 1]], [3, 3], r"labels\[0, 1\] = 4"),
])
def test_value_errors_name_shapes_and_values(labels, lengths, match):
    f = compiled("float64")
    acts = np.zeros((3, 2, 4))
    with pytest.raises(ValueError, match=match):
        f(acts, np.array(labels, np.int32), np.array(lengths, np.int32), np.ones(2))


def test_pickling_op_and_function(tmp_path):
    op = ConnectionistTemporalClassification(compute_grad=False)
    assert pickle.loads(pickle.dumps(op)) == op
    f = compiled("float64")
    g = pickle.loads(pickle.dumps(f))
    acts, labels, lengths = random_case(4, 3, 4, 2, np.random.RandomState(2))
    w = np.ones(3)
    for x, y in zip(f(acts, labels, lengths, w), g(acts, labels, lengths, w)):
        np.testing.assert_array_equal(x, y)


def test_theano_path():
    import importlib
    mod = importlib.import_module("symgpu.tensor.nnet.ctc")
    assert mod.ctc is ctc
