"""Theano's theano.gpuarray.subtensor GpuAdvanced{,Boolean}{,Inc}Subtensor (general NumPy
advanced indexing on the GPU, symgpu/gpu/ops/advanced_general.py) and theano.gpuarray.nnet's
GpuCrossentropySoftmaxArgmax1HotWithBias / GpuCrossentropySoftmax1HotWithBiasDx with their
host ops (symgpu/tensor/nnet/xent_softmax.py): placement on a virtual GPU, the kernels
compiled by nvcc, their values against NumPy with the kernels run on the host
(tests/emulated_gpu.py), and on a real GPU (marked gpu)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import config, function
from symgpu.gpu.placement.type import GpuArrayType

HOST_INDEXING = {"AdvancedSubtensor", "AdvancedIncSubtensor"}


def _ops(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ----------------------------------------------------------------------------- the names

def test_theano_paths_name_the_gpu_indexing_classes():
    from symgpu.gpu.ops import advanced_general as ag
    import symgpu.gpuarray.subtensor as sub
    for name in ("GpuAdvancedSubtensor", "GpuAdvancedIncSubtensor",
                 "GpuAdvancedBooleanSubtensor", "GpuAdvancedBooleanIncSubtensor"):
        assert getattr(sub, name) is getattr(ag, name)


# ----------------------------------------------------------------------------- placement

def _index_graphs():
    x, a, b, mm = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.matrix("mm")
    m = mm > 0
    return [x, a, b, mm], {
        "x[a, 1:, b]": (x[a, 1:, b], "GpuAdvancedSubtensor"),
        "x[:, a]": (x[:, a], "GpuAdvancedSubtensor"),
        "x[0, :, a]": (x[0, :, a], "GpuAdvancedSubtensor"),
        "x[None, a, ..., b]": (x[None, a, ..., b], "GpuAdvancedSubtensor"),
        "x[m]": (x[m], "GpuAdvancedBooleanSubtensor"),
        "inc x[a, :, b]": (T.inc_subtensor(x[a, :, b], 1.0), "GpuAdvancedIncSubtensor"),
        "set x[m]": (T.set_subtensor(x[m], 2.0), "GpuAdvancedBooleanIncSubtensor"),
    }


@pytest.mark.parametrize("case", list(_index_graphs()[1]))
def test_general_advanced_indexing_is_placed_on_the_gpu(vgpu, case):
    inputs, graphs = _index_graphs()
    out, op_name = graphs[case]
    f = function(inputs, out, on_unused_input="ignore")
    names = _ops(f)
    assert op_name in names, names
    assert not set(names) & HOST_INDEXING, names


def test_the_gradients_of_general_indexing_run_on_the_gpu(vgpu):
    inputs, _ = _index_graphs()
    x, a, b, mm = inputs
    for cost, want in ((T.sum(x[a, 1:, b] ** 2), "GpuAdvancedIncSubtensor"),
                       (T.sum(x[mm > 0] ** 2), "GpuAdvancedBooleanIncSubtensor")):
        f = function(inputs, symgpu.grad(cost, x), on_unused_input="ignore")
        names = _ops(f)
        assert want in names and not set(names) & HOST_INDEXING, names


def test_the_specialised_forms_keep_their_own_ops(vgpu):
    x, m, i, j = T.matrix("x"), T.tensor3("m"), T.lvector("i"), T.lvector("j")
    assert "GpuAdvancedSubtensor1" in _ops(function([m, i], m[i]))
    assert "GpuAdvancedSubtensor2" in _ops(function([x, i, j], x[i, j]))


def test_make_node_checks_its_inputs(vgpu):
    from symgpu.gpu.ops.advanced_general import GpuAdvancedSubtensor
    x = GpuArrayType("float32", (False, False))("x")
    idx = T.lvector("i")[None].owner.op.idx_list if False else None
    op = T.matrix()[T.lvector(), T.lvector()].owner.op
    with pytest.raises(TypeError, match="GPU variable"):
        GpuAdvancedSubtensor(op.idx_list)(T.matrix("h"), T.lvector(), T.lvector())
    with pytest.raises(TypeError, match="int32/int64"):
        GpuAdvancedSubtensor(op.idx_list)(x, T.bvector(), T.lvector())
    with pytest.raises(TypeError, match="boolean twin"):
        GpuAdvancedSubtensor((T.matrix()[T.bmatrix() > 0].owner.op.idx_list))(
            x, T.matrix("mm") > 0)
    del idx


# ----------------------------------------------------------------------------- nvcc

@requires_nvcc
def test_the_general_indexing_module_compiles_for_sm90(tmp_path):
    from symgpu.gpu.ops.advanced_general import advanced_general_source
    assert compile_for_sm90(advanced_general_source(), tmp_path)


# ----------------------------------------------------------------------------- emulated

@pytest.fixture
def emu(monkeypatch, tmp_path):
    from emulated_gpu import emulate_prepared_kernels, emulated_array_device
    from symgpu.gpu.ops import advanced_general
    ctx = emulated_array_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, advanced_general)
    return ctx


def _gpu_node(host_out, cls, value_inputs: int):
    """The GPU op's node for the host indexing node of ``host_out``: x (and the value) and
    integer index arrays as GPU variables, scalars and masks as host variables."""
    node = host_out.owner
    ins = []
    for k, v in enumerate(node.inputs):
        on_gpu = k < value_inputs or (v.ndim and v.dtype != "bool")
        ins.append(GpuArrayType(v.dtype, v.broadcastable, None)() if on_gpu else v.type())
    args = (node.op.idx_list, node.op.set_instead_of_inc) if value_inputs == 2 else \
        (node.op.idx_list,)
    return cls(*args)(*ins).owner


def _run(emu, node, values):
    from emulated_gpu import device_array, host_view
    args = []
    for k, (v, val) in enumerate(zip(node.inputs, values)):
        if isinstance(v.type, GpuArrayType):
            arr = device_array(emu, np.ascontiguousarray(val))
            args.append(arr)
        else:
            args.append(np.asarray(val, dtype=v.dtype))
    out = [None]
    node.op.perform(node, args, [out])
    return np.array(host_view(out[0]))


def _gather_cases(rng):
    """(host graph, values of its node's index inputs in order, NumPy's result)."""
    x = rng.standard_normal((4, 5, 6)).astype("float32")
    X, a, b, c, s = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.lmatrix("c"), T.lscalar("s")
    av = np.array([3, -1, 0], dtype="int64")
    bv = np.array([[1, 5, -6]], dtype="int32")
    cv = np.array([[2], [0]], dtype="int64")
    return x, [
        (X[a, 1:, b], [av, bv], x[av, 1:, bv]),
        (X[:, a], [av], x[:, av]),
        (X[0, :, a], [av], x[0, :, av]),
        (X[None, a, ..., b], [av, bv], x[None, av, ..., bv]),
        (X[a, s:, ::-2], [av, 2], x[av, 2:, ::-2]),
        (X[:, c, b], [cv, bv], x[:, cv, bv]),                 # (2, 1) and (1, 3) broadcast
        (X[s, a, b], [1, av, bv], x[1, av, bv]),
        (X[a, :, -2], [av], x[av, :, -2]),
        (X[c, 1:3, None, b], [cv, bv], x[cv, 1:3, None, bv]),  # separated: block in front
    ]


@requires_gxx
@pytest.mark.parametrize("k", range(9))
def test_general_gather_matches_numpy(emu, k):
    from symgpu.gpu.ops.advanced_general import GpuAdvancedSubtensor
    x, cases = _gather_cases(np.random.default_rng(k))
    out, index_values, want = cases[k]
    node = _gpu_node(out, GpuAdvancedSubtensor, 1)
    got = _run(emu, node, [x] + index_values)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
