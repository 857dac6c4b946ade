"""Theano behaviours that a Theano-based library (Lasagne) and its test suite rely on
(issue 31; tools/theano_library_suite.py runs Lasagne's own suite). Each test here stands
for a group of Lasagne tests that passed with Theano 1.0.5 and failed on symgpu, without
needing Lasagne."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T


@pytest.fixture
def theano_alias():
    """`theano` is symgpu for the test (as code written for Theano runs it)."""
    before = {k: v for k, v in sys.modules.items() if k == "theano" or k.startswith("theano.")}
    sys.modules["theano"] = symgpu
    yield symgpu
    for k in [k for k in sys.modules if k == "theano" or k.startswith("theano.")]:
        del sys.modules[k]
    sys.modules.update(before)


# -- the GPU back end's "in use" flags (test_conv.py, layers/dnn.py, layers/corrmm.py) --------

def test_gpu_in_use_flags_are_false_on_the_cpu(theano_alias):
    from theano import gpuarray
    from theano.sandbox import cuda
    assert symgpu.config.device == "cpu"
    assert gpuarray.pygpu_activated is False and cuda.cuda_enabled is False
    assert "pygpu_activated" in dir(gpuarray)


def test_dnn_present_says_why_not(theano_alias):
    # Lasagne: `from theano import gpuarray as gpu; gpu.dnn.dnn_present()`, and the old
    # back end's `theano.sandbox.cuda.dnn.dnn_available`
    from theano import gpuarray as gpu
    assert gpu.dnn.dnn_present() is False
    assert "device flag is 'cpu'" in gpu.dnn.dnn_present.msg
    from theano.gpuarray import dnn
    assert dnn.dnn_present is gpu.dnn.dnn_present
    from theano.sandbox.cuda import dnn as old_dnn
    assert old_dnn.dnn_available() is False and "default GPU context" in old_dnn.dnn_available.msg
    assert old_dnn.dnn_available("dev7") is False and "'dev7'" in old_dnn.dnn_available.msg


def test_gpu_package_attribute_is_a_submodule_path_or_an_attribute_error():
    # Lasagne's layers/corrmm.py: `from theano import gpuarray as gpu; gpu.blas.GpuCorrMM`
    import symgpu.gpu as gpu
    assert gpu.blas.GpuCorrMM is not None and gpu.basic_ops.gpu_contiguous is not None
    assert not hasattr(gpu, "no_such_module")


def test_dnn_available_on_a_virtual_context_is_false(vgpu):
    # a virtual context compiles graphs for the GPU but runs nothing: no dnn functions run
    from symgpu.gpu.ops.theano_dnn import dnn_available
    assert dnn_available(None) is False


# -- graph walking order (utils.collect_shared_vars, get_all_params, get_params) --------------

def test_graph_inputs_in_theanos_order(theano_alias):
    import theano
    x, y, z = T.scalars("x", "y", "z")
    inputs = theano.gof.graph.inputs
    assert inputs([x, y, z]) == [z, y, x]      # the last of the list is walked first
    assert inputs([x + y, z]) == [z, x, y]
    assert inputs([x * (y + z)]) == [x, y, z]  # each node's inputs left to right
    # Lasagne lists parameters in their order by walking them reversed
    a = symgpu.shared(np.zeros(2), name="a")
    b = symgpu.shared(np.zeros(2), name="b")
    shared = [v for v in inputs(reversed([a * 2, b + x])) if isinstance(v, type(a))]
    assert shared == [a, b]


def test_equal_computations(theano_alias):
    from theano.scan_module.scan_utils import equal_computations
    x, y = T.vectors("x", "y")
    assert equal_computations([(x ** 2).sum()], [(x ** 2).sum()])
    assert not equal_computations([(x ** 2).sum()], [(y ** 2).sum()])
    assert equal_computations([(x ** 2).sum()], [(y ** 2).sum()], [x], [y])
    assert not equal_computations([(x ** 2).sum()], [(x ** 3).sum()])
    assert not equal_computations([x], [T.matrix()])
    assert not equal_computations([x.sum()], [x.sum()], [x], [T.matrix()])
    with pytest.raises(ValueError, match="1 graphs to compare with 2"):
        equal_computations([x], [x, y])


# -- relu of NumPy values (test_objectives.py compares with rectify(numpy array)) -------------

def test_relu_of_numpy_values_is_numpy():
    from symgpu.tensor.nnet import relu
    a = np.array([-1.5, 0.0, 2.0], dtype="float32")
    r = relu(a)
    assert isinstance(r, np.ndarray) and r.dtype == np.float32
    np.testing.assert_array_equal(r, [0, 0, 2])
    np.testing.assert_allclose(relu(a, 0.1), [-0.15, 0, 2], rtol=1e-6)
    assert relu(-3.0) == 0.0
    assert isinstance(relu(T.vector()), symgpu.graph.basic.Variable)
    alpha = T.scalar("alpha")
    assert isinstance(relu(a, alpha), symgpu.graph.basic.Variable)


# -- indexing (layers/merge.py autocrop, objectives.categorical_accuracy) ---------------------

def test_list_of_slices_is_a_tuple_index():
    m = T.matrix("m")
    v = np.arange(12.0).reshape(3, 4).astype(m.dtype)
    np.testing.assert_array_equal(m[[slice(None), slice(-2, None)]].eval({m: v}), v[:, -2:])
    n = m.shape[1]
    np.testing.assert_array_equal(m[[slice(None, 2), slice(n // 2, None)]].eval({m: v}),
                                  v[:2, 2:])
    i = T.ivector("i")   # a list of integers stays an integer-array index
    np.testing.assert_array_equal(m[[0, 2]].eval({m: v}), v[[0, 2]])
    np.testing.assert_array_equal(m[i].eval({m: v, i: np.array([2, 0], "int32")}), v[[2, 0]])


def test_shape_index_past_ndim_fails_when_run():
    # objectives.multiclass_hinge_loss reads predictions.shape[1] before checking ranks
    x = T.vector("x")
    n = x.shape[1]
    with pytest.raises(IndexError, match="out of bounds"):
        n.eval({x: np.ones(3, dtype=x.dtype)})
    assert type(T.matrix().shape[1].owner.op).__name__ == "Shape_i"


# -- computed variables as function inputs (test_recurrent.py: out.eval({out: value})) ---------

def test_function_of_a_computed_input():
    x = T.vector("x")
    y = T.exp(x)
    z = y * 2
    one = np.ones(3, dtype=x.dtype)
    np.testing.assert_allclose(symgpu.function([y], z)(one), 2 * one)
    np.testing.assert_allclose(z.eval({y: one}), 2 * one)
    np.testing.assert_allclose(y.eval({y: one}), one)
    # both a computed input and one of its own inputs: the output reads x directly
    np.testing.assert_allclose(symgpu.function([y, x], z + x)(one, 3 * one), 5 * one)
    with pytest.raises(ValueError, match="both an input and replaced by givens"):
        symgpu.function([y], z, givens={y: x})


# -- scan: strict=True is about shared variables (CustomRecurrentLayer's step) -----------------

def test_strict_scan_takes_free_variables_as_non_sequences():
    W = T.matrix("W")
    x = T.matrix("x")
    out, _ = symgpu.scan(lambda row: T.dot(W, row), sequences=x, strict=True)
    wv = np.arange(4.0).reshape(2, 2).astype(W.dtype)
    xv = np.ones((3, 2), dtype=x.dtype)
    np.testing.assert_allclose(symgpu.function([W, x], out)(wv, xv), xv @ wv.T)
    S = symgpu.shared(wv, name="S")
    with pytest.raises(ValueError, match="shared variable"):
        symgpu.scan(lambda row: T.dot(S, row), sequences=x, strict=True)


# -- the tool's bookkeeping (tools/theano_library_suite.py; needs neither Lasagne nor Theano) --

def _suite():
    from pathlib import Path
    tools = str(Path(__file__).resolve().parent.parent / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import theano_library_suite
    return theano_library_suite


def test_suite_outcomes_from_log_records():
    suite = _suite()
    records = [{"id": "lasagne/tests/test_a.py::t1", "outcome": "collected", "first": ""},
               {"id": "lasagne/tests/test_a.py::t2", "outcome": "collected", "first": ""},
               {"id": "lasagne/tests/test_a.py::t3", "outcome": "collected", "first": ""},
               {"id": "lasagne/tests/test_a.py::t1", "outcome": "passed", "first": ""},
               {"id": "lasagne/tests/test_a.py::t2", "outcome": "failed", "first": "E: x"},
               {"id": "lasagne/tests/test_a.py::t2", "outcome": "error", "first": "teardown"}]
    out = suite.outcomes(records, timed_out=True, timeout=5)
    assert out["lasagne/tests/test_a.py::t1"]["outcome"] == "passed"
    assert out["lasagne/tests/test_a.py::t2"] == {"outcome": "failed", "first": "E: x"}
    assert out["lasagne/tests/test_a.py::t3"]["first"].startswith("timeout")


def test_suite_report_lists_what_passes_only_with_theano():
    suite = _suite()
    ours = {"lasagne/tests/test_a.py::t1": {"outcome": "passed", "first": ""},
            "lasagne/tests/test_a.py::t2": {"outcome": "failed", "first": "TypeError: at 0x7f1"},
            "lasagne/tests/layers/test_b.py": {"outcome": "error", "first": "ImportError: b"}}
    theirs = {"lasagne/tests/test_a.py::t1": {"outcome": "failed", "first": "boom"},
              "lasagne/tests/test_a.py::t2": {"outcome": "passed", "first": ""},
              "lasagne/tests/layers/test_b.py::u1": {"outcome": "passed", "first": "",
                                                     "mode": "no C"},
              "lasagne/tests/layers/test_b.py::u2": {"outcome": "skipped", "first": "gpu"}}
    text = suite.report(ours, theirs)
    # the file that did not import counts its tests (as Theano collected them) as errors
    assert "layers/test_b.py                 0     0     2     0       1     0     0     1" \
        in text
    assert "passed with Theano, not with symgpu: 2; passed with symgpu, not with Theano: 1" \
        in text
    assert "TypeError: at 0x…" in text and "ImportError: b" in text
    assert "from a run without its C code" in text


def test_suite_report_under_cuda_lists_failures_theano_skipped():
    suite = _suite()
    ours = {"lasagne/tests/layers/test_dnn.py::t1": {"outcome": "passed", "first": ""},
            "lasagne/tests/layers/test_dnn.py::t2": {"outcome": "failed", "first": "E: dnn"}}
    theirs = {"lasagne/tests/layers/test_dnn.py::t1": {"outcome": "skipped", "first": "gpu"},
              "lasagne/tests/layers/test_dnn.py::t2": {"outcome": "skipped", "first": "gpu"}}
    text = suite.report(ours, theirs, device="cuda")
    assert "under device=cuda (Theano's column: its CPU run" in text
    assert "failed with symgpu, which Theano skipped or did not run: 1" in text
    assert "test_dnn.py::t2  (E: dnn)" in text
    assert "On this machine (no GPU)" not in text and "test_import_without_gpu_" in text
    assert "On this machine (no GPU)" in suite.report(ours, theirs)


def test_suite_parallel_run_deals_every_file_once_and_merges(tmp_path, monkeypatch):
    suite = _suite()
    for rel, size in (("test_a.py", 30), ("layers/test_b.py", 10), ("test_c.py", 20)):
        path = tmp_path / "lasagne/tests" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#" * size)
    assert suite.test_files(tmp_path) == ["test_a.py", "test_c.py", "test_b.py"]
    seen = []

    def fake_run(scratch, timeout, deps, oracle, files, extra_env=None):
        seen.append((tuple(files), extra_env))
        return {f"{f}::t": {"outcome": "passed", "first": ""} for f in files}
    monkeypatch.setattr(suite, "run_suite", fake_run)
    env = {"SYMGPU_FLAGS": "device=cuda"}
    merged = suite.run_parallel(tmp_path, 10, None, None, 2, env)
    assert sorted(f for files, _ in seen for f in files) == ["test_a.py", "test_b.py",
                                                              "test_c.py"]
    assert all(e == env for _, e in seen) and len(merged) == 3


def test_suite_without_a_checkout_runs_nothing(tmp_path, capsys):
    suite = _suite()
    assert suite.main(["--mirror", str(tmp_path), "--no-save"]) == 0
    assert "nothing run" in capsys.readouterr().out


# -- Python int constants (lasagne.updates.adam: `one = T.constant(1)` "to prevent upcasting of
# float32", with floatX=float32) ----------------------------------------------------------------

def test_int_constant_is_the_narrowest_int_and_keeps_float32():
    assert [T.constant(v).dtype for v in (1, -128, 300, 70000, 2 ** 40)] == \
        ["int8", "int8", "int16", "int32", "int64"]
    t = T.fscalar("t")
    one = T.constant(1)
    assert (one - 0.999 ** t).dtype == "float32" and (one - T.fvector()).dtype == "float32"
    assert (T.constant(1000) + T.bvector()).dtype == "int16"
    assert T.as_tensor_variable(1).dtype == "int8"
    with symgpu.config.change_flags(floatX="float32"):
        # adam's step size, kept float32 as in Theano
        t_prev = symgpu.shared(np.float32(0.0))
        tt = t_prev + 1
        a_t = 0.01 * T.sqrt(one - 0.999 ** tt) / (one - 0.9 ** tt)
        assert a_t.dtype == "float32"
        np.testing.assert_allclose(a_t.eval(), 0.01 * np.sqrt(1 - 0.999) / (1 - 0.9), rtol=1e-4)


@pytest.mark.gpu
def test_on_a_gpu_the_in_use_flags_and_dnn_checks_are_true(cuda, theano_alias):
    # what lasagne.layers.dnn checks before building cuDNN layers
    from theano import gpuarray as gpu
    assert gpu.pygpu_activated is True and gpu.cuda_enabled is True
    assert gpu.dnn.dnn_present() is True and gpu.dnn.dnn_present.msg is None
    x = T.ftensor4("x")
    f = symgpu.function([x], gpu.dnn.dnn_pool(T.exp(x), (2, 2)))
    assert any(type(n.op).__name__ == "GpuPool" for n in f.maker.fgraph.toposort())
    xv = np.random.default_rng(3).standard_normal((2, 3, 4, 6)).astype("float32")
    want = np.exp(xv).reshape(2, 3, 2, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_allclose(f(xv), want, rtol=1e-5)
