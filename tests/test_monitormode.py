"""MonitorMode / NanGuardMode: functions called around each node (the debugging FAQ)."""
import numpy
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.compile import MonitorMode, NanGuardMode
from symgpu.compile.mode import Mode
from symgpu.compile.monitormode import detect_nan as library_detect_nan


def test_faq_step_through_example(capsys):
    def inspect_inputs(i, node, fn):
        print(i, node, "input(s) value(s):", [input[0] for input in fn.inputs], end='')

    def inspect_outputs(i, node, fn):
        print(" output(s) value(s):", [output[0] for output in fn.outputs])

    x = symgpu.tensor.dscalar('x')
    f = symgpu.function([x], [5 * x],
                        mode=symgpu.compile.MonitorMode(
                            pre_func=inspect_inputs,
                            post_func=inspect_outputs))
    assert f(3) == [15.0]
    assert capsys.readouterr().out == (
        "0 Elemwise{mul,no_inplace}(TensorConstant{5.0}, x) input(s) value(s): "
        "[array(5.), array(3.)] output(s) value(s): [array(15.)]\n")


# the FAQ's detect_nan, word for word with theano -> symgpu
def detect_nan(i, node, fn):
    for output in fn.outputs:
        if (not isinstance(output[0], numpy.random.RandomState) and
                numpy.isnan(output[0]).any()):
            print('*** NaN detected ***')
            symgpu.printing.debugprint(node)
            print('Inputs : %s' % [input[0] for input in fn.inputs])
            print('Outputs: %s' % [output[0] for output in fn.outputs])
            break


@pytest.mark.parametrize("post", [detect_nan, library_detect_nan])
def test_faq_nan_detector_default_optimizer(post, capsys):
    x = symgpu.tensor.dscalar('x')
    f = symgpu.function([x], [symgpu.tensor.log(x) * x],
                        mode=symgpu.compile.MonitorMode(post_func=post))
    with np.errstate(all="ignore"):
        assert np.isnan(f(0)[0])  # log(0) * 0 = -inf * 0 = NaN
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "*** NaN detected ***"
    assert out[1].startswith("Elemwise{Composite{") and "log" in out[1] and out[1].endswith("''")
    assert out[2] == " |x [id B]"
    assert out[3:] == ["Inputs : [array(0.)]", "Outputs: [array(nan)]"]
    with np.errstate(all="ignore"):
        f(2.0)
    assert capsys.readouterr().out == ""


def test_faq_nan_detector_without_fusion_and_inplace(capsys):
    x = symgpu.tensor.dscalar('x')
    mode = symgpu.compile.MonitorMode(post_func=detect_nan).excluding(
        'local_elemwise_fusion', 'inplace')
    f = symgpu.function([x], [symgpu.tensor.log(x) * x], mode=mode)
    assert isinstance(mode, MonitorMode) and mode.post_func is detect_nan
    with np.errstate(all="ignore"):
        f(0)
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["*** NaN detected ***", "Elemwise{mul,no_inplace} [id A] ''",
                       " |Elemwise{log,no_inplace} [id B] ''", " | |x [id C]", " |x [id C]"]
    assert out[5:] == ["Inputs : [array(-inf), array(0.)]", "Outputs: [array(nan)]"]


@pytest.mark.parametrize("optimizer", ["fast_compile", None])
def test_other_optimizers(optimizer, capsys):
    x = T.dscalar("x")
    f = function([x], [T.log(x) * x], mode=MonitorMode(post_func=detect_nan, optimizer=optimizer))
    assert [type(n.op).__name__ for n in f.maker.fgraph.toposort()] == ["Elemwise", "Elemwise"]
    with np.errstate(all="ignore"):
        f(0)
    assert capsys.readouterr().out.count("*** NaN detected ***") == 1


def test_hooks_see_every_node_in_order_with_inputs_kept_by_gc():
    seen = []

    def pre(i, node, fn):
        seen.append(("pre", i, node, [c[0] for c in fn.inputs], [c[0] for c in fn.outputs]))

    def post(i, node, fn):
        seen.append(("post", i, node, [np.copy(c[0]) for c in fn.inputs],
                     [np.copy(c[0]) for c in fn.outputs]))

    x = T.dvector("x")
    mode = MonitorMode(pre, post).excluding("fusion", "inplace")
    with config.change_flags(allow_gc=True):
        f = function([x], T.exp(T.sin(x)) * 2)
        fm = function([x], T.exp(T.sin(x)) * 2, mode=mode)
    xv = np.arange(3.0)
    np.testing.assert_allclose(fm(xv), f(xv))
    nodes = fm.maker.fgraph.toposort()
    assert [(k, i) for k, i, *_ in seen] == [(k, i) for i in range(len(nodes))
                                            for k in ("pre", "post")]
    assert [s[2] for s in seen[::2]] == nodes
    for kind, i, node, ins, outs in seen:
        assert all(v is not None for v in ins)  # allow_gc empties cells only after post_func
        if kind == "post":
            assert all(v is not None for v in outs)
    np.testing.assert_allclose(seen[1][4][0], np.sin(xv))


def test_plain_functions_keep_the_straight_line_vm():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    assert f.vm.runner is None and f.vm.profiler is None
    fm = function([x], T.exp(x), mode=MonitorMode())
    assert fm.vm.runner is not None
    np.testing.assert_allclose(fm(np.arange(2.0)), np.exp(np.arange(2.0)))


def test_fn_is_the_thunk_with_its_cells():
    got = []
    x = T.dvector("x")
    f = function([x], T.exp(x), mode=MonitorMode(post_func=lambda i, n, fn: got.append(fn)))
    f(np.zeros(2))
    fn = got[0]
    assert fn.inputs == [[fn.inputs[0][0]]] and isinstance(fn.outputs[0], list)
    fn.outputs[0][0] = None
    fn()  # runs the node again
    np.testing.assert_allclose(fn.outputs[0][0], np.ones(2))


def test_error_in_a_node_names_the_node():
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], x + y, mode=MonitorMode(pre_func=lambda *a: None))
    with pytest.raises(ValueError, match="Apply node that caused the error"):
        f(np.ones(2), np.ones(3))


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="pre_func must be callable"):
        MonitorMode(pre_func=3)
    with pytest.raises(ValueError, match="unknown optimizer 'fastest'"):
        MonitorMode(optimizer="fastest")
    with pytest.raises(ValueError, match="unknown linker"):
        MonitorMode(linker="jit")


def test_py_linker_runs_without_c_kernels():
    x, y = T.dvector("x"), T.dvector("y")
    f = function([x, y], T.exp(x) * y + 1, mode=MonitorMode(linker="py"))
    np.testing.assert_allclose(f(np.ones(2), np.ones(2)), np.e + 1)


def test_theano_excluding_spelling_on_any_mode():
    m = Mode("FAST_RUN").excluding("local_elemwise_fusion")
    assert "fusion" in m.tags()[1]
    x = T.dvector("x")
    f = function([x], T.exp(T.sin(x)), mode=m)
    assert len(f.maker.fgraph.toposort()) == 2
    assert Mode("FAST_RUN").including("a").including == ("a",)


# ----------------------------------------------------------------------------- NanGuardMode

def test_nanguard_raises_at_the_first_bad_node():
    x = T.dvector("x")
    f = function([x], T.log(x) * 2 + 1, mode=NanGuardMode())
    np.testing.assert_allclose(f(np.ones(2)), [1.0, 1.0])
    with np.errstate(all="ignore"), pytest.raises(AssertionError, match="NaN detected in output 0"):
        f(np.array([-1.0, 1.0]))


def test_nanguard_inf_and_big_switches():
    x = T.dvector("x")
    expr = T.exp(x) + 0.0
    with np.errstate(all="ignore"):
        with pytest.raises(AssertionError, match="Inf detected"):
            function([x], expr, mode=NanGuardMode())(np.array([1000.0]))
        function([x], expr, mode=NanGuardMode(inf_is_error=False, big_is_error=False))(
            np.array([1000.0]))
        with pytest.raises(AssertionError, match="big value"):
            function([x], expr, mode=NanGuardMode())(np.array([30.0]))
    with pytest.raises(AssertionError, match="NaN detected in input 0"):
        function([x], expr, mode=NanGuardMode())(np.array([np.nan]))


def test_nanguard_ignores_integers():
    i = T.lvector("i")
    f = function([i], i * 2, mode=NanGuardMode())
    assert list(f(np.array([1, 2]))) == [2, 4]


# ----------------------------------------------------------------------------- on a real GPU
from gpu_helpers import requires_gpu  # noqa: E402


@requires_gpu
def test_monitor_sees_gpu_nodes_and_nan(cuda, capsys):
    from symgpu.gpu.placement.type import is_gpu_var
    seen = []
    x = T.fvector("x")

    def post(i, node, fn):
        seen.append(type(node.op).__name__)
        library_detect_nan(i, node, fn)

    f = function([x], T.log(x) * x, mode=MonitorMode(post_func=post))
    assert any(is_gpu_var(v) for n in f.maker.fgraph.toposort() for v in n.outputs)
    with np.errstate(all="ignore"):
        out = f(np.array([0.0, 1.0], dtype="float32"))
    assert np.isnan(out[0]) and out[1] == 0.0
    assert seen == [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuElemwise" in seen
    assert capsys.readouterr().out.startswith("*** NaN detected ***\nGpuElemwise")


def test_compile_package_exports():
    import symgpu.compile as compile_pkg
    from symgpu.compile import DebugMode, In, Mode as M, MonitorMode as MM, NanGuardMode as NG
    from symgpu.compile.debugmode import DebugMode as DM
    assert MM is MonitorMode and NG is NanGuardMode and M is Mode and DebugMode is DM
    assert In is symgpu.In and compile_pkg.shared is symgpu.shared
    assert set(compile_pkg.__all__) <= set(dir(compile_pkg))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        compile_pkg.nope


def test_monitoring_survives_pickling_and_copy(capsys):
    import pickle
    x = T.dvector("x")
    f = function([x], T.log(x) * x, mode=MonitorMode(post_func=library_detect_nan))
    for g in (pickle.loads(pickle.dumps(f)), f.copy()):
        with np.errstate(all="ignore"):
            g(np.zeros(1))
        assert capsys.readouterr().out.startswith("*** NaN detected ***\n")
