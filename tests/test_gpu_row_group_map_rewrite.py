"""gpu_row_group_map (symgpu/gpu/ops/row_group_map_rewrite.py): layer norms written as users
write them become one GpuRowReduceGroup with its per-row applies and row map on a virtual GPU
(float32 and bfloat16 mixed precision, the two spellings of benchmarks/half_symgpu.py's GPT
block), the rewritten node's values on the host emulator against NumPy; consumers that must
stay apart do; and a layer norm with its gradient on the real GPU against the CPU."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function, grad
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.row_group import GpuRowReduceGroup

OFF = {"optimizer_excluding": "gpu_row_group_map"}
EPS = 1e-5


def _layer_norm(a, g, b, eps=1e-5):
    """As benchmarks/half_symgpu.py writes it."""
    mu = a.mean(axis=-1, keepdims=True)
    var = T.sqr(a - mu).mean(axis=-1, keepdims=True)
    return (a - mu) / T.sqrt(var + eps) * g + b


def _counts(f) -> collections.Counter:
    return collections.Counter(type(n.op).__name__ for n in f.maker.fgraph.toposort())


def _groups(f) -> list:
    return [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuRowReduceGroup]


def _np_ln(x, g, b):
    x64 = x.astype("float64")
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return (x64 - mu) / np.sqrt(var + EPS) * g + b, var


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.row_group as rg
    from emulated_gpu import emulated_kernel_device
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(rg, "_context", lambda name: ctx)
    return ctx


def _dimshuffle(a: np.ndarray, order: tuple) -> np.ndarray:
    keep = [d for d in order if d != "x"]
    a = a.reshape([a.shape[d] for d in sorted(keep)])
    a = a.transpose([sorted(keep).index(d) for d in keep])
    return a.reshape([1 if d == "x" else a.shape[keep.index(d)] for d in order])


def _host_values(fgraph, wanted: list, given: dict) -> list:
    """The values of ``wanted`` (variables of ``fgraph``) from its inputs' ``given`` values:
    transfers, shapes, dimshuffles and elementwise ops evaluated on the host (what a layer
    norm group's operands are made of)."""
    memo = dict(given)

    def value(v):
        if v in memo:
            return memo[v]
        if getattr(v, "data", None) is not None:
            return np.asarray(v.data)
        node, op = v.owner, v.owner.op
        name = type(op).__name__
        ins = [value(i) for i in node.inputs]
        if name in ("GpuFromHost", "HostFromGpu", "GpuContiguous"):
            out = ins[0]
        elif name in ("GpuShape_i", "Shape_i"):
            out = np.int64(ins[0].shape[op.i])
        elif name == "GpuDimShuffle":
            out = _dimshuffle(np.asarray(ins[0]), op.new_order)
        elif name in ("GpuElemwise", "Elemwise") and len(node.outputs) == 1:
            out = np.asarray(op.scalar_op.impl(*ins)).astype(v.dtype)
        else:
            raise NotImplementedError(f"the test evaluates no {op}")
        memo[v] = out
        return out
    return [value(v) for v in wanted]


def _run_group(emu, f, node, given: dict) -> list:
    """``node``'s outputs on the emulator, its inputs computed on the host from ``given``
    (input name -> value)."""
    from emulated_gpu import device_array, run_node
    fg = f.maker.fgraph
    feed = {v: given[v.name] for v in fg.inputs if v.name in given}
    for v in fg.inputs:    # shared variables
        c = getattr(v, "container", None)
        if v not in feed and c is not None and c.value is not None:
            feed[v] = np.asarray(c.value.get() if hasattr(c.value, "get") else c.value)
    vals = _host_values(fg, node.inputs, feed)
    got, _, _ = run_node(node, [device_array(emu, np.asarray(a, dtype=v.dtype))
                                for a, v in zip(vals, node.inputs)])
    return got


def _ln_function(mixed: bool, with_grad: bool, product: bool | None = None, **flags):
    """y = layer_norm(x) (or its product with w, as the GPT block feeds its layer norms to
    products: by default in mixed precision); with the gradient of a loss of it (the backward
    reads the forward's std: LN2's spelling)."""
    x, w = T.tensor3("x"), T.matrix("w")
    g = symgpu.shared(np.linspace(0.5, 1.5, 16).astype("float32"), name="g")
    b = symgpu.shared(np.linspace(-1, 1, 16).astype("float32"), name="b")
    a = _layer_norm(x, g, b)
    y = T.dot(a, w) if (mixed if product is None else product) else a
    outs = [y] + (grad(T.mean(T.sqr(y)), [x, g, b]) if with_grad else [])
    mp = {"mixed_precision": "bfloat16"} if mixed else {}
    with config.change_flags(**mp, **flags):
        return function([x, w], outs, on_unused_input="ignore")


def _forward_group(f):
    """The group reducing x's rows (the forward's: its first member is x's row sum)."""
    return _groups(f)[0]


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((3, 5, 16)) * 2 + 1).astype("float32"), \
        rng.standard_normal((16, 8)).astype("float32")


def test_the_gpu_tests_graph_has_its_map(vgpu):
    """The graph of the GPU test below (float32, through a product, with its gradient): the
    forward's map and per-row apply are in the group; a loss of the layer norm itself leaves
    its forward node to the column group of its bias gradient."""
    node = _forward_group(_ln_function(False, True, product=True))
    assert node.op.row_map is not None and node.op.per_row
    assert _forward_group(_ln_function(False, True)).op.row_map is None


def test_a_float32_layer_norm_forward_is_one_launch(vgpu, emu):
    f, off = _ln_function(False, False), _ln_function(False, False, **OFF)
    c, c_off = _counts(f), _counts(off)
    assert c_off["GpuRowReduceGroup"] == 1 and c_off["GpuElemwise"] == 1
    assert c["GpuRowReduceGroup"] == 1 and not c.get("GpuElemwise") and not c.get("GpuCAReduce")
    node = _forward_group(f)
    assert node.op.row_map is not None and not node.op.per_row
    x, w = _data()
    got = _run_group(emu, f, node, {"x": x, "w": w})
    gv, bv = np.linspace(0.5, 1.5, 16), np.linspace(-1, 1, 16)
    want, var = _np_ln(x, gv, bv)
    np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1] / 16, var[..., 0], rtol=1e-4)   # the members stay


@pytest.mark.parametrize("with_grad", [False, True], ids=["ln1", "ln2"])
def test_the_mixed_precision_layer_norms_are_one_launch(vgpu, emu, with_grad):
    """LN1: the normalised bf16 output is the map (its std computed in it); LN2: with the
    backward reading the std, the std node is a per-row apply the map reads."""
    f, off = _ln_function(True, with_grad), _ln_function(True, with_grad, **OFF)
    node = _forward_group(f)
    op = node.op
    assert op.row_map is not None and node.outputs[-1].dtype == "bfloat16"
    assert bool(op.per_row) == with_grad
    elem = [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuElemwise]
    elem_off = [n for n in off.maker.fgraph.toposort() if type(n.op) is GpuElemwise]
    assert len(elem_off) - len(elem) == (2 if with_grad else 1)
    assert not any("sqrt" in str(n.op) for n in elem)       # no std, no normalisation apart
    # nothing else reads the group's rows as a separate bf16 output of x's shape
    assert not any(n.outputs[0].dtype == "bfloat16" and "sqrt" in str(n.op) for n in elem)
    x, w = _data(1)
    # (the host evaluator of the operands reads no GpuElemwiseGroup: the same group node)
    f = _ln_function(True, with_grad, optimizer_excluding="gpu_elemwise_group")
    node = _forward_group(f)
    got = _run_group(emu, f, node, {"x": x, "w": w})
    want, var = _np_ln(x, np.linspace(0.5, 1.5, 16), np.linspace(-1, 1, 16))
    np.testing.assert_allclose(got[-1].astype("float64"), want, rtol=1e-2, atol=2e-2)
    if with_grad:
        std = got[len(op.members)]
        assert std.shape == (3, 5, 1)
        np.testing.assert_allclose(std, np.sqrt(var + EPS), rtol=1e-5)


def test_the_gpt_blocks_layer_norms(vgpu, monkeypatch):
    """benchmarks/half_symgpu.py's GPT step: both layer norms' forwards are one group each,
    with their maps, and no GpuElemwise normalises apart."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))
    import half_symgpu
    with config.change_flags(mixed_precision="bfloat16"):
        step, _, _ = half_symgpu.gpt({})
    nodes = step.maker.fgraph.toposort()
    maps = [n for n in nodes if type(n.op) is GpuRowReduceGroup and n.op.row_map is not None]
    assert len(maps) == 2 and [bool(n.op.per_row) for n in maps] == [False, True]
    assert all(n.outputs[-1].dtype == "bfloat16" for n in maps)
    assert not any(type(n.op) is GpuElemwise and "sqrt((9.99" in str(n.op) for n in nodes)


def _one_member_graph(inplace: bool):
    """A group of one member (x's row sums) and a consumer of it, ``s[:, None] * x``, in
    place on x (which the group reads too) or not."""
    from emulated_gpu import gpu_var
    from symgpu.gpu.ops.row_group import RowMember
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.graph.fg import FunctionGraph
    from symgpu.scalar.basic import SCALAR_OPS
    x = gpu_var("float32", 2)
    s = GpuRowReduceGroup([RowMember("add", None, (0,))], 1)(x)
    sd = GpuDimShuffle((False,), (0, "x"))(s)
    out = GpuElemwise(SCALAR_OPS["mul"], {0: 1} if inplace else None)(sd, x)
    return FunctionGraph([x], [out, s], clone=False), out


def test_a_group_of_one_member_takes_its_consumer(vgpu, emu):
    from symgpu.gpu.ops import row_group_map_rewrite as R
    from emulated_gpu import device_array, run_node
    fg, _ = _one_member_graph(False)
    assert R.gpu_row_group_map(fg) == 1
    (node,) = [n for n in fg.toposort()]
    assert type(node.op) is GpuRowReduceGroup and len(node.op.members) == 1
    xv = np.random.default_rng(2).standard_normal((7, 40)).astype("float32")
    got, _, _ = run_node(node, [device_array(emu, xv)])
    np.testing.assert_allclose(got[1], xv.sum(-1, keepdims=True) * xv, rtol=1e-5)


def test_a_lone_reduction_keeps_its_consumer_apart(vgpu):
    """A lone GpuCAReduce is no group: its consumer stays a GpuElemwise (other passes, the
    softmax gradient's, expect it)."""
    x = T.matrix("x")
    c = _counts(function([x], x - x.max(-1, keepdims=True)))
    assert c["GpuCAReduce"] == 1 and c["GpuElemwise"] == 1 and not c.get("GpuRowReduceGroup")


def test_consumers_that_must_not_join_stay_apart(vgpu):
    from symgpu.graph.basic import ancestors
    x, z = T.matrix("x"), T.matrix("z")

    def check(f, n_elemwise: int) -> None:
        (g,) = _groups(f)
        assert g.op.row_map is None and _counts(f)["GpuElemwise"] == n_elemwise
        assert not any(o in set(ancestors(g.inputs)) for o in g.outputs)
    # rows the graph cannot prove to be the group's (z is another matrix)
    s, mx = x.sum(-1, keepdims=True), x.max(-1, keepdims=True)
    check(function([x, z], (s - mx) * z), 1)
    # the group's results seen through a transpose are no per-row values
    check(function([x], (s - mx).T * x.T), 1)


def test_a_consumer_reading_a_product_of_the_groups_result_stays_apart(vgpu):
    """``s[:, None] * (P @ s[:, None])``: the consumer's second operand is computed from the
    group's result through a product, so absorbing it would make a cycle."""
    from emulated_gpu import gpu_var
    from symgpu.gpu.ops import row_group_map_rewrite as R
    from symgpu.gpu.ops.blas import GpuDot22
    from symgpu.gpu.ops.row_group import RowMember
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.graph.fg import FunctionGraph
    from symgpu.scalar.basic import SCALAR_OPS
    x, p = gpu_var("float32", 2), gpu_var("float32", 2)
    s = GpuRowReduceGroup([RowMember("add", None, (0,))], 1)(x)
    sd = GpuDimShuffle((False,), (0, "x"))(s)
    out = GpuElemwise(SCALAR_OPS["mul"])(sd, GpuDot22()(p, sd))
    fg = FunctionGraph([x, p], [out], clone=False)
    assert R.gpu_row_group_map(fg) == 0
    assert type(fg.outputs[0].owner.op) is GpuElemwise


def test_a_destructive_consumer_of_a_shared_operand_stays_apart(vgpu):
    """An in-place consumer overwriting an operand that another node (the group) reads."""
    from symgpu.gpu.ops import row_group_map_rewrite as R
    fg, out = _one_member_graph(True)
    assert R._destroys_shared(fg, out.owner)
    assert R.gpu_row_group_map(fg) == 0
    assert out.owner in fg.apply_nodes


@pytest.mark.gpu
def test_a_layer_norm_and_its_gradient_on_the_gpu(cuda, monkeypatch):
    from gpu_helpers import on_the_cpu
    x, w = _data(3)
    # (a loss of the layer norm itself: its bias gradient sums what the forward's elementwise
    # node writes, and gpu_col_reduce_group takes that node; through a product it is the map)
    f = _ln_function(False, True, product=True)
    node = _forward_group(f)
    assert node.op.row_map is not None, "the map pass did not run on the GPU graph"
    ran = []
    import symgpu.gpu.ops.row_group as rg
    real = rg._RowGroupThunk.thunk

    def thunk(self):
        t = real(self)

        def run():
            ran.append(self.op)
            t()
        run.__dict__.update(t.__dict__)
        return run
    monkeypatch.setattr(rg._RowGroupThunk, "thunk", thunk)
    f = _ln_function(False, True, product=True)
    got = f(x, w)
    assert any(op.row_map is not None for op in ran), "the group with its map did not run"
    with on_the_cpu():
        ref = _ln_function(False, True, product=True)
    assert not any("Gpu" in type(n.op).__name__ for n in ref.maker.fgraph.toposort())
    want = ref(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-3, atol=1e-4)
    y, _ = _np_ln(x, np.linspace(0.5, 1.5, 16), np.linspace(-1, 1, 16))
    np.testing.assert_allclose(np.asarray(got[0]), y @ w, rtol=1e-4, atol=1e-3)
