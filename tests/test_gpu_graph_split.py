"""A varied segment split by what varies, without a GPU (tests/graph_fakes.py): after a pad
to a bucket (as GpuPadSteps), the nodes that take the true length's shapes run plainly and
the bucket's nodes before and after them replay one graph per bucket
(symgpu/gpu/exec/graph_varying.py, graphs.Runner.split)."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import MEM, add1, call, gvec, mul2, read, upload
from symgpu.config import config
from symgpu.gpu.exec import graph_varying, graphs
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.link.vm import link
from test_gpu_graph_buckets import FakePadSteps


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def _kernel_thunk(ins, out, shape_of, body):
    """A capturable, launching thunk: out = body(input arrays) of shape_of(inputs)."""
    from symgpu.gpu.ops.elemwise import new_array

    def thunk():
        xs = [c[0] for c in ins]
        o = new_array(fakes.CTX_OBJ, shape_of(*xs), np.dtype("float32"))
        lays = [(x.ptr, x.size) for x in xs]
        optr, n = o.ptr, o.size

        def k():
            MEM[optr][:n] = body(*[MEM[p][:m] for p, m in lays])
        fakes.DRV.launch_kernel(k)
        out[0] = o
    thunk.capturable = True
    thunk.launches = True
    return thunk


class FakeTrim(Op):
    """padded[:len(x)]: the true length's values of a padded vector (a copy)."""

    __props__ = ()

    def make_node(self, padded, x):
        return Apply(self, [padded, x], [padded.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        return _kernel_thunk([storage_map[v] for v in node.inputs],
                             storage_map[node.outputs[0]], lambda p, x: (x.shape[0],),
                             lambda p, x: p[:x.size])


class FakeSum(Op):
    """The sum of a vector, as a vector of one element."""

    __props__ = ()

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        return _kernel_thunk([storage_map[node.inputs[0]]], storage_map[node.outputs[0]],
                             lambda x: (1,), lambda x: np.array([x.sum()], "float32"))


def _padded_graph():
    """x -> pad to 4 -> +1 (the bucket's) -> trim to len(x) -> *2 -> sum (the length's)
    -> *2 -> +1 (one element): (x, y)."""
    x = gvec()
    stable = add1()(FakePadSteps(4)(x))
    own = mul2()(FakeTrim()(stable, x))
    return x, add1()(mul2()(FakeSum()(own)))


def _expected(v):
    return [((v + 1) * 2).sum() * 2 + 1]


def _linked(n0: int):
    x, y = _padded_graph()
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(fakes.CTX_OBJ, np.zeros(n0))]})
    return vm, x, y


def test_the_nodes_of_the_true_length_run_plainly_the_buckets_replay():
    vm, x, y = _linked(5)
    cell = vm.storage_map[x]
    first = vm.runner
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(3, 17, 40)]
    splits = graphs.STATS["splits"]
    for n in lengths:
        v = rng.standard_normal(n).astype("float32")
        cell[0] = upload(fakes.CTX_OBJ, v)
        (r,) = call(vm, [y])
        np.testing.assert_allclose(read(r), _expected(v), rtol=1e-5)
        del r
    runner = vm.runner
    assert runner is not first and graphs.STATS["splits"] == splits + 1
    # the trim, the product after it and the sum reading it run plainly (their shapes, or
    # their input's, are the length's); the bucket's add and the tail of one element are
    # segments of their own
    plain = sorted(str(vm.nodes[i].op) for i in runner.forced_plain)
    assert plain == ["FakeSum", "FakeTrim", "Fakemul2"], plain
    sizes = sorted(len(s.items) for s in runner.segments)
    assert sizes == [1, 2], sizes
    tail = next(s for s in runner.segments if len(s.items) == 2)
    head = next(s for s in runner.segments if len(s.items) == 1)
    assert tail.captures == 1 and tail.replays > 10, runner.stats()
    assert head.captures >= 2 and head.replays > 5, runner.stats()


def _lengths_3_to_19(x, y, expected):
    """Link y(x), call it with x = arange(n) for n in 3..19, check each result against
    expected(v); returns the VM and its first runner."""
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(fakes.CTX_OBJ, np.zeros(3))]})
    first = vm.runner
    for n in range(3, 20):
        v = np.arange(n, dtype="float32")
        vm.storage_map[x][0] = upload(fakes.CTX_OBJ, v)
        (r,) = call(vm, [y])
        np.testing.assert_allclose(read(r), expected(v))
        del r
    return vm, first


def test_a_segment_whose_every_node_follows_the_call_is_left_whole(monkeypatch):
    monkeypatch.setattr(graph_varying, "MAX_KEYS", 8)
    x = gvec()
    vm, first = _lengths_3_to_19(x, mul2()(add1()(x)), lambda v: (v + 1) * 2)
    (seg,) = first.segments
    assert vm.runner is first and not seg.watching and seg.watch is None
    assert seg.plain_runs == 17 and seg.captures == 0


def test_no_split_where_the_repeating_nodes_launch_little():
    """One launch of the bucket's beside five of the length's: the segment stays whole (its
    replay would save one launch and cost the copies into the graph's buffers)."""
    x = gvec()
    own = FakeTrim()(add1()(FakePadSteps(4)(x)), x)
    y = FakeSum()(mul2()(mul2()(mul2()(own))))
    vm, first = _lengths_3_to_19(x, y, lambda v: [((v + 1) * 8).sum()])
    (seg,) = first.segments
    assert vm.runner is first and not seg.watching and seg.plain_runs == 17



def test_a_segment_whose_keys_are_buckets_is_not_split():
    """After a pad to buckets, every node of the segment takes the bucket's shapes or fixed
    ones: its keys come back, one graph each. Lengths met in order (as a warm-up over the
    range makes them) show each bucket first in a plain run, where the bucket's nodes seem to
    follow the call; such a segment is not watched, nor split, and replays."""
    from symgpu.tensor.nnet.pad_steps import bucket_length
    x = gvec()
    y = FakeSum()(mul2()(add1()(FakePadSteps(4)(x))))
    for _ in range(4):                 # launches of fixed shapes: most of the segment's
        y = add1()(y)
    fg = FunctionGraph([x], [y], clone=False)
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, {x: [upload(fakes.CTX_OBJ, np.zeros(3))]})
    first = vm.runner
    rng = np.random.default_rng(1)
    lengths = list(range(3, 41)) + [int(n) for n in rng.integers(3, 41, 30)]
    for k, n in enumerate(lengths):
        v = np.arange(n, dtype="float32")
        vm.storage_map[x][0] = upload(fakes.CTX_OBJ, v)
        (r,) = call(vm, [y])
        padded = np.zeros(bucket_length(n, 4) if k else n, "float32")   # StepBuckets
        padded[:n] = v
        np.testing.assert_allclose(read(r), [((padded + 1) * 2).sum() + 4])
        del r
    assert vm.runner is first and not first.forced_plain
    (seg,) = first.segments
    # a plain run at each key's first sight (the first length's and 10 buckets), a capture at
    # each bucket's second, replays since
    assert seg.plain_runs == 11 and seg.captures == seg.n_graphs == 10, first.stats()
    assert seg.replays == len(lengths) - 21
