"""scan, map/reduce/foldl/foldr and until: Theano's loop tutorial programs give Theano's
results, and every feature is checked against a NumPy loop."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.scan.op import Scan, ScanError

floatX = symgpu.config.floatX


def scan_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Scan)]


# ============================================================================ the tutorial

def test_tutorial_power_A_k():
    k = T.iscalar("k")
    A = T.vector("A")
    result, updates = symgpu.scan(fn=lambda prior_result, A: prior_result * A,
                                  outputs_info=T.ones_like(A), non_sequences=A, n_steps=k)
    final_result = result[-1]
    power = symgpu.function(inputs=[A, k], outputs=final_result, updates=updates)
    out = power(np.arange(10, dtype=floatX), 2)
    np.testing.assert_allclose(out, [0., 1., 4., 9., 16., 25., 36., 49., 64., 81.])


def test_tutorial_polynomial():
    coefficients = T.vector("coefficients")
    x = T.scalar("x")
    max_coefficients_supported = 10000
    components, updates = symgpu.scan(
        fn=lambda coefficient, power, free_variable: coefficient * (free_variable ** power),
        outputs_info=None, sequences=[coefficients, T.arange(max_coefficients_supported)],
        non_sequences=x)
    polynomial = components.sum()
    calculate_polynomial = symgpu.function(inputs=[coefficients, x], outputs=polynomial)
    test_coefficients = np.asarray([1, 0, 2], dtype=np.float32)
    assert float(calculate_polynomial(test_coefficients, 3)) == 19.0


def test_tutorial_tanh_elementwise():
    X, W, b_sym = T.matrix("X"), T.matrix("W"), T.vector("b_sym")
    results, updates = symgpu.scan(lambda v: T.tanh(T.dot(v, W) + b_sym), sequences=X)
    compute_elementwise = symgpu.function(inputs=[X, W, b_sym], outputs=results)
    x = np.eye(2, dtype=floatX)
    w = np.ones((2, 2), dtype=floatX)
    b = np.ones((2), dtype=floatX)
    b[1] = 2
    np.testing.assert_allclose(compute_elementwise(x, w, b),
                               [[0.96402758, 0.99505475], [0.96402758, 0.99505475]], rtol=1e-6)
    np.testing.assert_allclose(compute_elementwise(x, w, b), np.tanh(x.dot(w) + b), rtol=1e-6)


def test_tutorial_recurrence_with_reversed_sequence():
    X, W, U, V = T.vector("X"), T.matrix("W"), T.matrix("U"), T.matrix("V")
    Y, P = T.matrix("Y"), T.matrix("P")
    results, updates = symgpu.scan(
        lambda y, p, x_tm1: T.tanh(T.dot(x_tm1, W) + T.dot(y, U) + T.dot(p, V)),
        sequences=[Y, P[::-1]], outputs_info=[X])
    compute_seq = symgpu.function(inputs=[X, W, Y, U, P, V], outputs=results)
    x = np.zeros((2), dtype=floatX)
    x[1] = 1
    w = np.ones((2, 2), dtype=floatX)
    y = np.ones((5, 2), dtype=floatX)
    y[0, :] = -3
    u = np.ones((2, 2), dtype=floatX)
    p = np.ones((5, 2), dtype=floatX)
    p[0, :] = 3
    v = np.ones((2, 2), dtype=floatX)
    x_res = np.zeros((5, 2), dtype=floatX)
    x_res[0] = np.tanh(x.dot(w) + y[0].dot(u) + p[4].dot(v))
    for i in range(1, 5):
        x_res[i] = np.tanh(x_res[i - 1].dot(w) + y[i].dot(u) + p[4 - i].dot(v))
    np.testing.assert_allclose(compute_seq(x, w, y, u, p, v), x_res, rtol=1e-6)
    np.testing.assert_allclose(x_res[0], [-0.99505475, -0.99505475], rtol=1e-6)


def test_tutorial_norms_of_rows_and_columns():
    X = T.matrix("X")
    rows, _ = symgpu.scan(lambda x_i: T.sqrt((x_i ** 2).sum()), sequences=[X])
    cols, _ = symgpu.scan(lambda x_i: T.sqrt((x_i ** 2).sum()), sequences=[X.T])
    f = symgpu.function([X], [rows, cols])
    x = np.diag(np.arange(1, 6, dtype=floatX), 1)
    r, c = f(x)
    np.testing.assert_allclose(r, [1., 2., 3., 4., 5., 0.])
    np.testing.assert_allclose(c, [0., 1., 2., 3., 4., 5.])


def test_tutorial_trace():
    X = T.matrix("X")
    results, _ = symgpu.scan(lambda i, j, t_f: T.cast(X[i, j] + t_f, floatX),
                             sequences=[T.arange(X.shape[0]), T.arange(X.shape[1])],
                             outputs_info=np.asarray(0., dtype=floatX))
    compute_trace = symgpu.function([X], results[-1])
    x = np.eye(5, dtype=floatX)
    x[0] = np.arange(5, dtype=floatX)
    assert float(compute_trace(x)) == 4.0
    assert float(compute_trace(x)) == np.diagonal(x).sum()


def test_tutorial_two_taps_recurrence():
    X, W, b_sym, U, V = T.matrix("X"), T.matrix("W"), T.vector("b_sym"), T.matrix("U"), \
        T.matrix("V")
    n_sym = T.iscalar("n_sym")
    results, _ = symgpu.scan(
        lambda x_tm2, x_tm1: T.dot(x_tm2, U) + T.dot(x_tm1, V) + T.tanh(T.dot(x_tm1, W) + b_sym),
        n_steps=n_sym, outputs_info=[dict(initial=X, taps=[-2, -1])])
    compute_seq2 = symgpu.function([X, U, V, W, b_sym, n_sym], results)
    x = np.zeros((2, 2), dtype=floatX)
    x[1, 1] = 1
    w = 0.5 * np.ones((2, 2), dtype=floatX)
    u = 0.5 * (np.ones((2, 2), dtype=floatX) - np.eye(2, dtype=floatX))
    v = 0.5 * np.ones((2, 2), dtype=floatX)
    n = 10
    b = np.ones((2), dtype=floatX)
    x_res = np.zeros((10, 2))
    x_res[0] = x[0].dot(u) + x[1].dot(v) + np.tanh(x[1].dot(w) + b)
    x_res[1] = x[1].dot(u) + x_res[0].dot(v) + np.tanh(x_res[0].dot(w) + b)
    x_res[2] = x_res[0].dot(u) + x_res[1].dot(v) + np.tanh(x_res[1].dot(w) + b)
    for i in range(2, 10):
        x_res[i] = (x_res[i - 2].dot(u) + x_res[i - 1].dot(v) + np.tanh(x_res[i - 1].dot(w) + b))
    np.testing.assert_allclose(compute_seq2(x, u, v, w, b, n), x_res, rtol=1e-5)


def test_tutorial_jacobian_by_scan():
    v = T.vector()
    A = T.matrix()
    y = T.tanh(T.dot(v, A))
    results, updates = symgpu.scan(lambda i: T.grad(y[i], v), sequences=[T.arange(y.shape[0])])
    compute_jac_t = symgpu.function([A, v], results, allow_input_downcast=True)
    x = np.eye(5, dtype=floatX)[0]
    w = np.eye(5, 3, dtype=floatX)
    w[2] = np.ones((3), dtype=floatX)
    expected = ((1 - np.tanh(x.dot(w)) ** 2) * w).T
    np.testing.assert_allclose(compute_jac_t(w, x), expected, rtol=1e-6)
    # the same with y and v given as non-sequences, as the tutorial writes it
    results2, _ = symgpu.scan(lambda i, y, x: T.grad(y[i], x), sequences=T.arange(y.shape[0]),
                              non_sequences=[y, v])
    f2 = symgpu.function([A, v], results2)
    np.testing.assert_allclose(f2(w, x), expected, rtol=1e-6)


def test_tutorial_accumulator_shared_update():
    k = symgpu.shared(0)
    n_sym = T.iscalar("n_sym")
    results, updates = symgpu.scan(lambda: {k: (k + 1)}, n_steps=n_sym)
    accumulator = symgpu.function([n_sym], [], updates=updates, allow_input_downcast=True)
    assert k.get_value() == 0
    accumulator(5)
    assert k.get_value() == 5
    accumulator(3)
    assert k.get_value() == 8


def test_tutorial_until_power_of_2():
    def power_of_2(previous_power, max_value):
        return previous_power * 2, symgpu.scan_module.until(previous_power * 2 > max_value)

    max_value = T.scalar()
    values, _ = symgpu.scan(power_of_2, outputs_info=T.constant(1.), non_sequences=max_value,
                            n_steps=1024)
    f = symgpu.function([max_value], values)
    np.testing.assert_array_equal(f(45), [2., 4., 8., 16., 32., 64.])
    # symgpu.scan.until is the same class
    assert symgpu.scan.until is symgpu.scan_module.until


# ============================================================================ semantics

def test_sequence_taps_cut_like_theano():
    x = T.dvector("x")
    out, _ = symgpu.scan(lambda a, b, c: a + 10 * b + 100 * c,
                         sequences={"input": x, "taps": [-2, 0, 1]})
    xv = np.arange(8.0)
    res = symgpu.function([x], out)(xv)
    expected = [xv[t - 2] + 10 * xv[t] + 100 * xv[t + 1] for t in range(2, 7)]
    np.testing.assert_allclose(res, expected)


def test_go_backwards_and_negative_n_steps():
    x = T.dvector("x")
    out, _ = symgpu.scan(lambda a, acc: acc * 2 + a, sequences=x,
                         outputs_info=T.constant(0.0, dtype="float64"), go_backwards=True)
    xv = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(symgpu.function([x], out)(xv), [3.0, 8.0, 17.0])
    # a negative constant n_steps runs backwards too
    out2, _ = symgpu.scan(lambda a, acc: acc * 2 + a, sequences=x,
                          outputs_info=T.constant(0.0, dtype="float64"), n_steps=-3)
    np.testing.assert_allclose(symgpu.function([x], out2)(xv), [3.0, 8.0, 17.0])


def test_several_outputs_mixed_kinds_and_return_list():
    x = T.dvector("x")
    (s, p, d), _ = symgpu.scan(lambda a, s, p: [s + a, p * a, a * 2], sequences=x,
                               outputs_info=[T.constant(0.0, dtype="float64"),
                                             T.constant(1.0, dtype="float64"), None])
    f = symgpu.function([x], [s, p, d])
    xv = np.array([1.0, 2.0, 3.0, 4.0])
    rs, rp, rd = f(xv)
    np.testing.assert_allclose(rs, np.cumsum(xv))
    np.testing.assert_allclose(rp, np.cumprod(xv))
    np.testing.assert_allclose(rd, xv * 2)
    outs, _ = symgpu.scan(lambda a: a + 1, sequences=x, return_list=True)
    assert isinstance(outs, list) and len(outs) == 1


def test_n_steps_with_sequences_and_symbolic_n_steps():
    x = T.dvector("x")
    n = T.iscalar("n")
    out, _ = symgpu.scan(lambda a: a * 3, sequences=x, n_steps=n)
    f = symgpu.function([x, n], out)
    np.testing.assert_allclose(f(np.arange(5.0), 3), [0.0, 3.0, 6.0])
    with pytest.raises(ScanError, match="sequence 0 .* 5 entries but the loop runs 7 steps"):
        f(np.arange(5.0), 7)
    np.testing.assert_allclose(f(np.arange(5.0), 0), np.zeros(0))


def test_shared_variable_updates_are_honoured_and_read_each_step():
    s = symgpu.shared(np.zeros(2), name="s")
    x = T.dmatrix("x")
    out, updates = symgpu.scan(lambda row: (s + row, {s: s + row}), sequences=x)
    f = symgpu.function([x], out, updates=updates)
    xv = np.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(f(xv), np.cumsum(xv, axis=0))
    np.testing.assert_allclose(s.get_value(), xv.sum(0))
    np.testing.assert_allclose(f(xv)[0], xv.sum(0) + xv[0])
    assert isinstance(updates, symgpu.scan.ScanUpdates)


def test_closures_become_implicit_non_sequences_and_invariants_are_hoisted():
    W = T.dmatrix("W")
    x = T.dmatrix("x")
    Wt2 = W.T * 2
    out, _ = symgpu.scan(lambda row: T.tanh(T.dot(Wt2, row) + W.sum()), sequences=x)
    f = symgpu.function([W, x], out)
    rng = np.random.default_rng(1)
    wv, xv = rng.normal(size=(3, 3)), rng.normal(size=(4, 3))
    np.testing.assert_allclose(f(wv, xv), np.tanh(xv @ (2 * wv) + wv.sum()), rtol=1e-12)
    (node,) = scan_nodes(f)
    inner_ops = {type(n.op).__name__ for n in node.op.fgraph.toposort()}
    # W.T * 2 and W.sum() are computed once, outside the loop
    assert "CAReduce" not in inner_ops and "Sum" not in inner_ops
    assert not any(str(n.op).startswith("Sum") for n in node.op.fgraph.toposort())


def test_strict_refuses_shared_closures():
    # Theano's rule: strict=True asks for the shared variables the step reads to be passed
    # as non-sequences; other free variables become non-sequences on their own
    S = symgpu.shared(np.eye(3), name="S")
    W = T.dmatrix("W")
    x = T.dmatrix("x")
    with pytest.raises(ValueError, match="strict=True .* shared variable.* S"):
        symgpu.scan(lambda row: T.dot(S, row), sequences=x, strict=True)
    out, _ = symgpu.scan(lambda row, S: T.dot(S, row), sequences=x, non_sequences=S,
                         strict=True)
    assert out.ndim == 2
    out, _ = symgpu.scan(lambda row: T.dot(W, row), sequences=x, strict=True)
    wv, xv = np.arange(9.0).reshape(3, 3), np.ones((2, 3))
    np.testing.assert_allclose(symgpu.function([W, x], out)(wv, xv), xv @ wv.T)


def test_until_with_sequences_stops_early():
    x = T.dvector("x")
    out, _ = symgpu.scan(lambda a, acc: (acc + a, symgpu.scan.until(acc + a > 5)), sequences=x,
                         outputs_info=T.constant(0.0, dtype="float64"))
    f = symgpu.function([x], [out, out.shape[0]])
    res, n = f(np.arange(10.0))
    np.testing.assert_allclose(res, [0.0, 1.0, 3.0, 6.0])
    assert int(n) == 4


def test_map_reduce_foldl_foldr():
    x = T.dvector("x")
    sq, _ = symgpu.map(lambda a: a ** 2, sequences=x)
    total, _ = symgpu.reduce(lambda a, acc: acc + a, sequences=x,
                             outputs_info=T.constant(0.0, dtype="float64"))
    left, _ = symgpu.foldl(lambda a, acc: acc * 10 + a, sequences=x,
                           outputs_info=T.constant(0.0, dtype="float64"))
    right, _ = symgpu.foldr(lambda a, acc: acc * 10 + a, sequences=x,
                            outputs_info=T.constant(0.0, dtype="float64"))
    f = symgpu.function([x], [sq, total, left, right])
    r = f(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(r[0], [1.0, 4.0, 9.0])
    assert float(r[1]) == 6.0 and float(r[2]) == 123.0 and float(r[3]) == 321.0
    # reduce keeps no history: its state is stored as a window of one value
    node = total.owner.inputs[0].owner
    assert isinstance(node.op, Scan) and node.op.info.keep == (False,)


def test_nested_scan():
    X = T.dmatrix("X")

    def row_cumsum(row):
        out, _ = symgpu.scan(lambda a, acc: acc + a, sequences=row,
                             outputs_info=T.constant(0.0, dtype="float64"))
        return out

    out, _ = symgpu.scan(row_cumsum, sequences=X)
    xv = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(symgpu.function([X], out)(xv), np.cumsum(xv, axis=1))


# ============================================================================ errors

def test_error_output_dtype_mismatch_names_output():
    x = T.fvector("x")
    with pytest.raises(TypeError, match=r"output 0 .*float64.*float32"):
        symgpu.scan(lambda a, acc: acc + T.cast(a, "float64"), sequences=x,
                    outputs_info=T.constant(0.0, dtype="float32"))


def test_error_bad_taps_and_counts():
    x = T.dvector("x")
    with pytest.raises(ValueError, match="output 0 has taps \\[1\\]"):
        symgpu.scan(lambda a, p: a + p, sequences=x,
                    outputs_info=[dict(initial=x, taps=[1])])
    with pytest.raises(ValueError, match="returned 2 output\\(s\\) but outputs_info has 1"):
        symgpu.scan(lambda a, p: [a + p, a], sequences=x, outputs_info=[x[0]])
    with pytest.raises(ValueError, match="no sequences and no n_steps"):
        symgpu.scan(lambda p: p * 2, outputs_info=[x[0]])
    with pytest.raises(ValueError, match="sequence 0 has taps"):
        symgpu.scan(lambda a, b: a + b, sequences=dict(input=x, taps=[0, 0]))


def test_error_shape_change_names_output_and_step():
    v = T.dvector("v")
    out, _ = symgpu.scan(lambda p: T.concatenate([p, p]), outputs_info=v, n_steps=3)
    f = symgpu.function([v], out)
    with pytest.raises(ScanError, match=r"output 0 has shape \(4,\) at step 0.*\(2,\)"):
        f(np.ones(2))


def test_error_initial_too_short_for_taps():
    v = T.dvector("v")
    out, _ = symgpu.scan(lambda a, b, c: a + b + c, outputs_info=dict(initial=v, taps=[-3, -2, -1]),
                         n_steps=2)
    f = symgpu.function([v], out)
    np.testing.assert_allclose(f(np.array([1.0, 2.0, 3.0])), [6.0, 11.0])
    with pytest.raises(ScanError, match="initial value of output 0 has 2 entries.*need 3"):
        f(np.array([1.0, 2.0]))


# ============================================================================ the op

def test_inner_graph_gets_the_normal_passes():
    X, W, b = T.dmatrix("X"), T.dmatrix("W"), T.dvector("b")
    h0 = T.dvector("h0")
    out, _ = symgpu.scan(lambda x, h: T.tanh(T.dot(h, W) + T.dot(x, W) + b), sequences=X,
                         outputs_info=h0)
    f = symgpu.function([X, W, b, h0], out)
    (node,) = scan_nodes(f)
    node.op.inner.compile()
    names = [type(n.op).__name__ for n in node.op.inner.compiled_fgraph.toposort()]
    # host BLAS ops, or their GPU twins when the suite runs with device=cuda
    assert any(nm.removeprefix("Gpu") in ("Gemv", "Dot22", "Gemm") for nm in names), names
    fused = [n for n in node.op.inner.compiled_fgraph.toposort() if "Composite" in str(n.op)]
    assert fused, names


def test_infer_shape():
    x = T.dmatrix("x")
    h0 = T.dvector("h0")
    out, _ = symgpu.scan(lambda a, h: h + a, sequences=x, outputs_info=h0)
    node = out.owner.inputs[0].owner
    shapes = node.op.infer_shape(None, node, [(), tuple(x.shape[i] for i in range(2)),
                                              tuple(node.inputs[2].shape[i] for i in range(2))])
    f = symgpu.function([x, h0], [s for s in shapes[0]])
    assert [int(v) for v in f(np.ones((4, 3)), np.ones(3))] == [5, 3]


def test_constant_folding_of_a_constant_loop():
    out, _ = symgpu.scan(lambda p: p * 2, outputs_info=T.constant(np.float64(1.0)), n_steps=5)
    f = symgpu.function([], out)
    np.testing.assert_allclose(f(), [2.0, 4.0, 8.0, 16.0, 32.0])


# ============================================================================ loop rewrites

def test_save_memory_when_only_the_last_value_is_read():
    k = T.iscalar("k")
    A = T.dvector("A")
    result, _ = symgpu.scan(lambda prior, A: prior * A, outputs_info=T.ones_like(A),
                            non_sequences=A, n_steps=k)
    f = symgpu.function([A, k], result[-1])
    (node,) = scan_nodes(f)
    assert node.op.info.keep == (False,)
    np.testing.assert_allclose(f(np.arange(4.0), 3), np.arange(4.0) ** 3)
    # a 100000-step loop over a 1000-vector: the history would take 800 MB
    np.testing.assert_allclose(f(np.full(1000, 1.0), 100000), np.ones(1000))
    g = symgpu.function([A, k], [result[-1], result.sum()])
    (node,) = scan_nodes(g)
    assert node.op.info.keep == (True,)


def test_unused_outputs_and_their_inputs_are_pruned():
    x, y = T.dvector("x"), T.dvector("y")
    (a, b), _ = symgpu.scan(lambda u, v: [u * 2, T.exp(v)], sequences=[x, y])
    f = symgpu.function([x, y], a)
    (node,) = scan_nodes(f)
    assert node.op.info.n_nitsot == 1 and node.op.info.n_seqs == 1
    np.testing.assert_allclose(f(np.arange(3.0), np.arange(3.0)), [0.0, 2.0, 4.0])


def test_backward_loop_computes_no_unrequested_sequence_gradient():
    x, h0, W = T.dmatrix("x"), T.dvector("h0"), T.dmatrix("W")
    out, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                         outputs_info=h0, non_sequences=W)
    f = symgpu.function([x, h0, W], T.grad(out.sum(), W))
    back = [n for n in scan_nodes(f) if n.op.info.name.startswith("grad_of")]
    assert len(back) == 1 and back[0].op.info.n_nitsot == 0


def test_example_rnn_sequence_trains():
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SYMGPU_FLAGS="device=cpu", SYMGPURC=os.devnull,
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "rnn_sequence.py"),
                           "--epochs", "60"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = float(proc.stdout.split("initial test loss ")[1].split()[0])
    last = float(proc.stdout.split("final test loss ")[1].split()[0])
    assert last < first / 20, proc.stdout


def test_loops_over_the_same_steps_merge():
    x = T.dvector("x")
    a, _ = symgpu.scan(lambda u: u * 2, sequences=x)
    b, _ = symgpu.scan(lambda u, acc: acc + u, sequences=x,
                       outputs_info=T.constant(0.0, dtype="float64"))
    c, _ = symgpu.scan(lambda u: u + a.sum(), sequences=x)  # reads a: cannot join a's loop
    f = symgpu.function([x], [a, b, c])
    nodes = scan_nodes(f)
    assert len(nodes) == 2
    assert any(n.op.info.n_nitsot == 1 and n.op.info.n_states == 1 for n in nodes)
    xv = np.array([1.0, 2.0, 3.0])
    ra, rb, rc = f(xv)
    np.testing.assert_allclose(ra, xv * 2)
    np.testing.assert_allclose(rb, np.cumsum(xv))
    np.testing.assert_allclose(rc, xv + 12.0)


def test_gradient_of_a_last_value_loop_runs_the_forward_loop_once():
    v = T.dvector("v")
    total, _ = symgpu.reduce(lambda a, acc: acc * 0.5 + T.sin(a), sequences=v,
                             outputs_info=T.constant(0.0, dtype="float64"))
    f = symgpu.function([v], [total, T.grad(total, v)])
    forward = [n for n in scan_nodes(f) if not n.op.info.name.startswith("grad_of")]
    assert len(forward) == 1
    vv = np.array([0.3, -1.0, 2.0])
    t, g = f(vv)
    assert np.isclose(float(t), ((0 * 0.5 + np.sin(0.3)) * 0.5 + np.sin(-1.0)) * 0.5 + np.sin(2.0))
    np.testing.assert_allclose(g, np.cos(vv) * np.array([0.25, 0.5, 1.0]))


def test_inner_graph_is_compiled_with_the_outer_mode():
    x = T.dvector("x")
    out, _ = symgpu.scan(lambda u: T.exp(u) * 2 + 1, sequences=x)
    fast = symgpu.function([x], out, mode="FAST_RUN")
    quick = symgpu.function([x], out, mode="FAST_COMPILE")
    (nf,), (nq,) = scan_nodes(fast), scan_nodes(quick)
    assert nf.op.mode == "FAST_RUN" and nq.op.mode == "FAST_COMPILE"
    for node in (nf, nq):
        node.op.inner.compile()
    fused = lambda n: any("Composite" in str(m.op) for m in n.op.inner.compiled_fgraph.toposort())  # noqa: E731
    assert fused(nf) and not fused(nq)
    np.testing.assert_allclose(quick(np.zeros(2)), [3.0, 3.0])
    np.testing.assert_allclose(fast(np.zeros(2)), [3.0, 3.0])


def test_inner_graph_is_placed_on_the_gpu_by_the_normal_passes():
    """With device=cuda (a virtual context: compiled, not run) the step's graph gets the GPU
    placement like any graph (for now its inputs and outputs cross to the host each step)."""
    from symgpu.config import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        with config.change_flags(device="cuda"):
            x = T.fmatrix("x")
            W = symgpu.shared(np.ones((3, 3), dtype="float32"), name="W")
            out, _ = symgpu.scan(lambda a, h: T.tanh(T.dot(h, W) + a), sequences=x,
                                 outputs_info=T.zeros((3,), dtype="float32"))
            f = symgpu.function([x], [out, T.grad(out.sum(), W)])
    for node in scan_nodes(f):
        names = [type(n.op).__name__ for n in node.op.inner.compiled_fgraph.toposort()]
        assert "GpuGemv" in names or "GpuGer" in names, names


def test_threads_and_pickling():
    import pickle
    import threading
    x = T.dvector("x")
    out, _ = symgpu.scan(lambda a, acc: acc * 0.5 + a, sequences=x,
                         outputs_info=T.constant(0.0, dtype="float64"))
    f = symgpu.function([x], out)
    inputs = [np.full(2000, float(k)) for k in range(4)]
    want = [f(v) for v in inputs]
    errors = []

    def work(k):
        for _ in range(5):
            if not np.array_equal(f(inputs[k]), want[k]):
                errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # the symbolic graph (op, inner graph) pickles and still computes
    out2 = pickle.loads(pickle.dumps(out))
    (x2,) = [v for v in symgpu.graph.basic.graph_inputs([out2]) if v.name == "x"]
    np.testing.assert_allclose(symgpu.function([x2], out2)(np.ones(3)), [1.0, 1.5, 1.75])


def test_pushout_of_sequence_only_products_when_included():
    x, h0, W, U = T.dtensor3("x"), T.dmatrix("h0"), T.dmatrix("W"), T.dmatrix("U")
    out, _ = symgpu.scan(lambda a, h: T.tanh(T.dot(a, W) + T.dot(h, U)), sequences=x,
                         outputs_info=h0)
    rng = np.random.default_rng(3)
    vals = [rng.normal(size=(5, 2, 3)), rng.normal(size=(2, 4)), rng.normal(size=(3, 4)),
            rng.normal(size=(4, 4))]
    plain = symgpu.function([x, h0, W, U], out)
    with symgpu.config.change_flags(optimizer_including="scan_pushout_seq_dot"):
        pushed = symgpu.function([x, h0, W, U], out)
    (node,) = scan_nodes(pushed)
    assert node.op.info.n_seqs == 1
    inner = node.op.fgraph.toposort()
    products = ("Dot22", "Gemm", "Dot", "Gemv")   # host ops, or GPU twins under device=cuda
    assert sum(1 for n in inner if type(n.op).__name__.removeprefix("Gpu") in products) == 1
    outside = [n for n in pushed.maker.fgraph.toposort()
               if n.op.__class__.__name__.removeprefix("Gpu") in products]
    assert outside
    np.testing.assert_allclose(pushed(*vals), plain(*vals), rtol=1e-12)


def test_initial_value_more_broadcastable_than_the_step_result():
    W = T.dmatrix("W")
    h0 = T.zeros((1, 3), dtype="float64")  # dims of length 1 known as such
    assert h0.broadcastable[0]
    out, _ = symgpu.scan(lambda h, W: T.tanh(T.dot(h, W) + 1), outputs_info=h0,
                         non_sequences=W, n_steps=3)
    f = symgpu.function([W], out)
    h = np.zeros((1, 3))
    want = []
    for _ in range(3):
        h = np.tanh(h @ np.eye(3) + 1)
        want.append(h)
    np.testing.assert_allclose(f(np.eye(3)), np.array(want))


def test_save_memory_in_a_while_loop():
    m = T.dscalar("m")
    values, _ = symgpu.scan(lambda p, m: (p * 2, symgpu.scan.until(p * 2 > m)),
                            outputs_info=T.constant(np.float64(1.0)), non_sequences=m,
                            n_steps=1024)
    f = symgpu.function([m], values[-1])
    (node,) = scan_nodes(f)
    assert node.op.info.keep == (False,)
    assert float(f(45.0)) == 64.0
