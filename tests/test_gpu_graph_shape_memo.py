"""The runner's shape memo (symgpu/gpu/exec/shape_memo.py): host nodes that compute only from
the shapes of a call's inputs run once per new set of shapes; a replay with the last call's
shapes restores their outputs.

CPU tests drive the runner with the fakes of tests/graph_fakes.py: a host matrix ``h`` whose
shape (not values) gives a slice's bounds, ``x[2 * rows : 2 * rows + cols]``, the slice a
recorded fake kernel reading its start from the graph's parameter block.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeDynSlice, add1, call, gvec, read, upload
from symgpu.config import config
from symgpu.gpu.exec import shape_memo
from symgpu.gpu.exec.shape_memo import ShapeMemoStep, memo_nodes
from symgpu.graph.basic import Constant
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import link
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.shape import Shape_i
from symgpu.tensor.type import TensorType, as_tensor_variable

DATA = np.arange(60, dtype="float32") * 0.5


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def _int(value: int) -> Constant:
    c = as_tensor_variable(np.asarray(value, "int64"))
    assert isinstance(c, Constant)
    return c


def _bounds(h, extra=None):
    """(start, stop) = (2 * rows, 2 * rows + cols (+ extra)) of host matrix h's shape."""
    rows, cols = Shape_i(0)(h), Shape_i(1)(h)
    start = Elemwise(SCALAR_OPS["mul"])(rows, _int(2))
    stop = Elemwise(SCALAR_OPS["add"])(start, cols)
    if extra is not None:
        stop = Elemwise(SCALAR_OPS["add"])(stop, extra)
    return start, stop


def _linked(inputs, outputs, values):
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = {}
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        return link(fg, storage, allow_gc=True)


def _counting(monkeypatch, op_class: type = Shape_i) -> list:
    """Record every run of a thunk of ``op_class`` (host Shape_i by default)."""
    runs: list = []
    real = op_class.make_thunk

    def make_thunk(self, node, *args, **kw):
        inner = real(self, node, *args, **kw)

        def thunk():
            runs.append(node)
            inner()
        return thunk
    monkeypatch.setattr(op_class, "make_thunk", make_thunk, raising=False)
    return runs


def test_the_shape_arithmetic_runs_once_per_set_of_shapes(monkeypatch):
    runs = _counting(monkeypatch)
    x, h = gvec(), TensorType("float64", (False, False))()
    y = add1()(FakeDynSlice()(x, *_bounds(h)))
    vm = _linked([x, h], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4))])
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    assert len(memo.indices) == 4, "two lengths, a product and a sum"
    assert not [st for st in vm.runner.steps if type(st).__name__ == "_PlainStep"]
    rng = np.random.default_rng(0)
    shapes = [(3, 4)] * 6 + [(5, 2)] * 6 + [(3, 4)] * 3
    for rows, cols in shapes:      # new values every call: only the shapes count
        vm.storage_map[h][0] = rng.standard_normal((rows, cols))
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[2 * rows:2 * rows + cols] + 1)
        del r
    assert len(runs) == 2 * 2, "two reads for each of two sets of shapes ((3, 4) is kept)"
    st = vm.runner.stats()
    assert st["graphs"] == 2 and st["captures"] == 2, st


def test_a_value_another_set_of_shapes_computes_again_is_the_same_object():
    """h of (3, 4) then (3, 5): the slice's start (2 * rows) is the same value, so the second
    set keeps the first one's object (a segment keys memo values by identity first: a length that
    changes every call must not make a weight's shape a new key part each time)."""
    x, h = gvec(), TensorType("float64", (False, False))()
    y = add1()(FakeDynSlice()(x, *_bounds(h)))
    vm = _linked([x, h], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4))])
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    for cols in (4, 5, 4):
        vm.storage_map[h][0] = np.zeros((3, cols))
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[6:6 + cols] + 1)
        del r
    first, second = memo.memo[((3, 4),)], memo.memo[((3, 5),)]
    same = [a is b for a, b in zip(first, second)]
    equal = [bool(np.array_equal(a, b)) for a, b in zip(first, second)]
    assert same == equal and any(same) and not all(same), (first, second)


def test_a_host_value_read_as_a_value_keeps_its_node_apart(monkeypatch):
    """stop = 2 * rows + cols + k for a host scalar k: the sum reading k runs every call
    (the shape arithmetic before it stays in the memo)."""
    x, h, k = gvec(), TensorType("float64", (False, False))(), TensorType("int64", ())()
    y = add1()(FakeDynSlice()(x, *_bounds(h, k)))
    vm = _linked([x, h, k], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4)), 0])
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    assert len(memo.indices) == 4
    for extra in (0, 3, 1, 3, 0, 5):
        vm.storage_map[k][0] = np.int64(extra)
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[6:10 + extra] + 1)
        del r


def test_outputs_of_the_function_and_overwritten_values_are_not_taken():
    h = TensorType("float64", (False, False))()
    rows = Shape_i(0)(h)
    twice = Elemwise(SCALAR_OPS["mul"])(rows, _int(2))
    fg = FunctionGraph([h], [twice], clone=False)
    nodes = fg.toposort()
    assert memo_nodes(nodes, fg) == [0], "the length, not the returned product"
    # a later node overwriting the product in place: the product is not taken
    inc = Elemwise(SCALAR_OPS["add"], {0: 0})(twice, _int(1))
    fg = FunctionGraph([h], [inc], clone=False)
    assert memo_nodes(fg.toposort(), fg) == [0]


def test_a_failed_call_computes_again_and_names_its_node(monkeypatch):
    x, h = gvec(), TensorType("float64", (False, False))()
    y = add1()(FakeDynSlice()(x, *_bounds(h)))
    vm = _linked([x, h], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4))])
    (r,) = call(vm, [y])
    del r
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    vm.storage_map[h][0] = np.zeros(4)      # a vector: Shape_i{1} fails
    with pytest.raises(Exception) as err:
        call(vm, [y])
    assert "Shape_i{1}" in str(err.value) or "Shape_i{1}" in "".join(
        getattr(err.value, "__notes__", [])), err.value
    assert list(memo.memo) == [((3, 4),)]      # nothing kept for the failed shapes
    vm.storage_map[h][0] = np.zeros((3, 4))
    (r,) = call(vm, [y])
    np.testing.assert_array_equal(read(r), DATA[6:10] + 1)


def test_turned_off_every_node_is_a_plain_step(monkeypatch):
    monkeypatch.setattr(shape_memo, "ENABLED", False)
    x, h = gvec(), TensorType("float64", (False, False))()
    y = add1()(FakeDynSlice()(x, *_bounds(h)))
    vm = _linked([x, h], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4))])
    assert not [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    (r,) = call(vm, [y])
    np.testing.assert_array_equal(read(r), DATA[6:10] + 1)


def test_a_value_another_node_reads_in_between_is_not_freed_early():
    """The memo runs where its first node was.  A memo value whose last reader is a later memo
    node (freed after it) but that a host node between the two places reads as well (a host
    scalar k added to a length, as images2neibs' shape arithmetic did on the H200) stays
    alive for that node, on every call."""
    x, h, k = gvec(), TensorType("float64", (False, False))(), TensorType("int64", ())()
    rows = Shape_i(0)(h)
    start = Elemwise(SCALAR_OPS["add"])(rows, k)             # reads k's value: not the memo's
    stop = Elemwise(SCALAR_OPS["add"])(start, _int(2))
    twice = Elemwise(SCALAR_OPS["mul"])(rows, _int(2))       # a memo node, after `start`
    y = add1()(FakeDynSlice()(x, start, stop))
    z = add1()(FakeDynSlice()(x, twice, Elemwise(SCALAR_OPS["add"])(twice, _int(1))))
    vm = _linked([x, h, k], [y, z], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4)), 0])
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    assert len(memo.indices) == 3, "the length, twice it and that plus one"
    for rows_, extra in ((3, 0), (3, 1), (4, 1), (4, 1), (3, 2)):
        vm.storage_map[h][0] = np.zeros((rows_, 2))
        vm.storage_map[k][0] = np.int64(extra)
        ry, rz = call(vm, [y, z])
        np.testing.assert_array_equal(read(ry), DATA[rows_ + extra:rows_ + extra + 2] + 1)
        np.testing.assert_array_equal(read(rz), DATA[2 * rows_:2 * rows_ + 1] + 1)
        del ry, rz


def test_the_lengths_of_a_gpu_input_are_memo_nodes_too(monkeypatch):
    """A GPU step reads its inputs' lengths with GpuShape_i (the half.py GPT step's reshapes:
    43 host nodes a call before the memo took them): x[n - 10 : n - 7] for n = len(x)."""
    from symgpu.gpu.placement.basic_ops import GpuShape_i
    runs = _counting(monkeypatch, GpuShape_i)
    x = gvec()
    n = GpuShape_i(0)(x)
    start = Elemwise(SCALAR_OPS["sub"])(n, _int(10))
    y = add1()(FakeDynSlice()(x, start, Elemwise(SCALAR_OPS["add"])(start, _int(3))))
    vm = _linked([x], [y], [upload(fakes.CTX_OBJ, DATA)])
    (memo,) = [st for st in vm.runner.steps if isinstance(st, ShapeMemoStep)]
    assert len(memo.indices) == 3, "the length, a difference and a sum"
    # bounds from shapes alone are fixed by the key: no graph parameter (a real slice
    # stays a view rather than a parameterised copy)
    assert not vm.runner.segments[0].param_thunks
    assert not [st for st in vm.runner.steps if type(st).__name__ == "_PlainStep"]
    for length in (60, 60, 60, 40, 40, 40, 60):
        vm.storage_map[x][0] = upload(fakes.CTX_OBJ, DATA[:length])
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA[length - 10:length - 7] + 1)
        del r
    assert len(runs) == 2, "read once for each of the two lengths"


def test_a_segment_keys_the_memos_outputs_by_identity(monkeypatch):
    """x * (2 * rows) for the rows of a host matrix h: the factor, a memo output, reaches the
    segment as a host value keyed by value (its bytes); the memo restores the same object on a
    call with the last shapes, so its key part is not computed again; a new shape gives a new
    object, a new key and a new graph."""
    from graph_fakes import FakeHostScale
    from symgpu.gpu.exec import graph_plan
    keyed: list = []
    real = graph_plan._host_key
    monkeypatch.setattr(graph_plan, "_host_key", lambda v: keyed.append(v) or real(v))
    x, h = gvec(), TensorType("float64", (False, False))()
    y = FakeHostScale()(x, Elemwise(SCALAR_OPS["mul"])(Shape_i(0)(h), _int(2)))
    vm = _linked([x, h], [y], [upload(fakes.CTX_OBJ, DATA), np.zeros((3, 4))])
    (seg,) = vm.runner.segments
    assert seg.memoised == [False, True], seg.memoised
    counts = []
    for rows in [3] * 3 + [5] * 3 + [3] * 2:
        vm.storage_map[h][0] = np.zeros((rows, 2))
        keyed.clear()
        (r,) = call(vm, [y])
        np.testing.assert_array_equal(read(r), DATA * (2 * rows))
        del r
        counts.append(len(keyed))
    assert counts == [1, 0, 0, 1, 0, 0, 1, 0], counts
    assert vm.runner.stats()["graphs"] == 2


def test_a_host_view_is_taken_unless_something_changes_it():
    """A DimShuffle of a length (the GPT step's mean divisor, rows as a broadcastable block)
    is a memo node; where a later node overwrites the view, neither it nor the length it
    views is taken."""
    from symgpu.tensor.elemwise import DimShuffle

    def taken(inplace: bool) -> set:
        h = TensorType("float64", (False, False))()
        rows = Shape_i(0)(h)
        block = DimShuffle((), ["x", "x"])(rows)
        out = Elemwise(SCALAR_OPS["add"], {0: 0} if inplace else None)(block, _int(1))
        fg = FunctionGraph([h], [out], clone=False)
        nodes = fg.toposort()
        mine = {rows.owner, block.owner}
        return {str(nodes[i].op) for i in memo_nodes(nodes, fg) if nodes[i] in mine}
    assert taken(False) == {"Shape_i{0}", "InplaceDimShuffle{x,x}"}
    assert taken(True) == set()
