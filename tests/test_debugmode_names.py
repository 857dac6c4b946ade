"""DebugMode's Theano settings (stability_patience, check_c_code, check_py_code,
check_isfinite, require_matching_strides) and exception classes (BadThunkOutput,
StochasticOrder, InvalidValueError)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.compile import debugmode as dm
from symgpu.compile.debugmode import (BadThunkOutput, DebugMode, DebugModeError,
                                      InvalidValueError, StochasticOrder)
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.c_elemwise import c_kernels_allowed


def test_exception_classes_are_debugmode_errors():
    for cls in (BadThunkOutput, StochasticOrder, InvalidValueError):
        assert issubclass(cls, DebugModeError)
        assert issubclass(cls, AssertionError)


def test_settings_defaults_and_arguments():
    m = DebugMode()
    assert (m.stability_patience, m.check_c_code, m.check_py_code, m.check_isfinite,
            m.require_matching_strides) == (1, True, True, True, 0)
    m = DebugMode(stability_patience=3, check_c_code=False, check_py_code=False,
                  check_isfinite=False, require_matching_strides=2)
    assert (m.stability_patience, m.check_c_code, m.check_py_code, m.check_isfinite,
            m.require_matching_strides) == (3, False, False, False, 2)
    # copies made by including/excluding keep the settings
    m2 = m.excluding("fusion")
    assert isinstance(m2, DebugMode) and m2.stability_patience == 3 and not m2.check_isfinite
    with pytest.raises(ValueError):
        DebugMode(stability_patience=0)


def test_check_isfinite_raises_invalid_value_error():
    x = T.dvector()
    f = symgpu.function([x], T.log(x), mode=DebugMode())
    np.testing.assert_allclose(f(np.array([1.0, 2.0])), np.log([1.0, 2.0]))
    with pytest.raises(InvalidValueError, match="Inf"):
        f(np.array([0.0, 1.0]))
    with pytest.raises(InvalidValueError, match="NaN"):
        f(np.array([-1.0, 1.0]))
    g = symgpu.function([x], T.log(x), mode=DebugMode(check_isfinite=False))
    out = g(np.array([0.0, 1.0]))
    assert np.isneginf(out[0])


def _debug_vm(mode, inputs, outputs, values):
    fg = FunctionGraph(inputs, outputs)
    mode.rewrite(fg)
    storage = {v: [val] for v, val in zip(fg.inputs, values)}
    vm = mode.link(fg, storage)
    return fg, vm


def test_check_py_code_compares_the_c_kernel_with_numpy():
    if not c_kernels_allowed():
        pytest.skip("no C compiler: every node runs on NumPy")
    x = T.dvector()
    vals = [np.linspace(0.1, 2, 16)]
    fg, vm = _debug_vm(DebugMode(), [x], [T.exp(x) * 2 + T.sin(x)], vals)
    assert vm.py_twin is not None
    vm()  # the two implementations agree
    np.testing.assert_allclose(vm.storage_map[fg.outputs[0]][0],
                               np.exp(vals[0]) * 2 + np.sin(vals[0]))
    # a NumPy twin that disagrees (as a buggy kernel would) is caught
    idx = [i for i, n in enumerate(vm.nodes) if n.outputs[0] is fg.outputs[0]][0]
    node = vm.nodes[idx]
    real = vm.py_twin.thunks[idx]

    def wrong():
        real()
        vm.py_twin.storage_map[node.outputs[0]][0] = vm.py_twin.storage_map[node.outputs[0]][0] + 1

    vm.py_twin.thunks[idx] = wrong
    with pytest.raises(BadThunkOutput, match="disagree"):
        vm()
    # check_py_code=False or check_c_code=False: no twin
    assert _debug_vm(DebugMode(check_py_code=False), [x], [T.exp(x) * 2], vals)[1].py_twin is None
    assert _debug_vm(DebugMode(check_c_code=False), [x], [T.exp(x) * 2], vals)[1].py_twin is None


def test_require_matching_strides():
    x = T.dmatrix()
    vals = [np.arange(12.0).reshape(3, 4)]
    for level in (1, 2):
        fg, vm = _debug_vm(DebugMode(require_matching_strides=level), [x], [T.exp(x) + 1], vals)
        if vm.py_twin is None:
            pytest.skip("no C kernels here")
        idx = [i for i, n in enumerate(vm.nodes) if n.outputs[0] is fg.outputs[0]][0]
        out = vm.nodes[idx].outputs[0]
        real = vm.py_twin.thunks[idx]

        def fortran(real=real, out=out, vm=vm):
            real()
            vm.py_twin.storage_map[out][0] = np.asfortranarray(vm.py_twin.storage_map[out][0])

        vm.py_twin.thunks[idx] = fortran
        if level == 1:
            with pytest.warns(UserWarning, match="strides"):
                vm()
        else:
            with pytest.raises(BadThunkOutput, match="strides"):
                vm()


def test_stability_patience_detects_a_stochastic_rewrite(monkeypatch):
    x = T.dvector()
    f = symgpu.function([x], T.exp(x) + 1, mode=DebugMode(stability_patience=3))
    np.testing.assert_allclose(f(np.zeros(2)), [2.0, 2.0])

    calls = []

    def flaky(fgraph):  # rewrites differently on every other run
        calls.append(1)
        if len(calls) % 2 == 0:
            out = fgraph.outputs[0]
            fgraph.replace(out, T.mul(out, 1.0), reason="flaky")

    real_passes = DebugMode.passes
    monkeypatch.setattr(DebugMode, "passes",
                        lambda self: list(real_passes(self)) + [("flaky", flaky)])
    with pytest.raises(StochasticOrder):
        symgpu.function([x], T.exp(x) + 1, mode=DebugMode(stability_patience=2))
    # with patience 1 the graph is rewritten once: nothing to compare
    symgpu.function([x], T.exp(x) + 1, mode=DebugMode())


def test_graph_signature_tells_graphs_apart():
    x = T.dvector()
    a = FunctionGraph([x], [T.exp(x) + 1])
    b = FunctionGraph([x], [T.exp(x) + 1])
    c = FunctionGraph([x], [T.exp(x) + 2])
    assert dm.graph_signature(a) == dm.graph_signature(b)
    assert dm.graph_signature(a) != dm.graph_signature(c)
