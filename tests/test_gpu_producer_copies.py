"""gpu_producer_copies (symgpu/gpu/ops/producer_copies.py): a cheap elementwise result
read by several kernels is recomputed in each of them. The rewritten graphs are checked on a
virtual GPU context; the rewritten kernels' values on the CPU through the kernel emulator
(tests/emulated_gpu.py), against the kernels they replace."""
from __future__ import annotations

import numpy as np

import symgpu.tensor as T
from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, host_view
from gpu_helpers import example_module, gpu_vector_maker, thunk_over
from symgpu import config, function
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.gpu.placement.basic_ops import gpu_from_host
from symgpu.gpu.ops.producer_copies import copy_producer_into_readers
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scalar.basic import SCALAR_OPS

OFF = {"optimizer_excluding": "gpu_producer_copies"}


def _softmax_xent_nodes(**flags):
    """The MLP benchmark's output layer: logits z = h w + b, a row max, exp(z - m) summed,
    and the loss and the logits' gradient reading z, m and the sum."""
    h, w, y = T.matrix("h"), T.matrix("w"), T.matrix("y")
    b = T.vector("b")
    z = T.dot(h, w) + b
    m = T.max(z, axis=1, keepdims=True)
    e = T.exp(z - m)
    s = T.sum(e, axis=1, keepdims=True)
    loss = T.sum(y * (z - m - T.log(s)))
    dz = e / s - y
    with config.change_flags(**flags):
        f = function([h, w, b, y], [gpu_from_host(loss), gpu_from_host(dz)])
    return f.maker.fgraph.toposort()


def _launching(nodes):
    return [n for n in nodes if type(n.op) in (GpuElemwise, GpuCAReduce)]


#: the row max and the exp-sum would become one GpuRowReduceGroup (row_group_rewrite.py):
#: these tests look at the GpuCAReduce nodes this pass leaves
NO_GROUP = "gpu_row_reduce_group"


def test_the_logits_bias_add_and_exp_are_recomputed_by_their_readers(vgpu):
    plain = _softmax_xent_nodes(optimizer_excluding="gpu_producer_copies:" + NO_GROUP)
    copied = _softmax_xent_nodes(optimizer_excluding=NO_GROUP)
    assert len(_launching(copied)) == len(_launching(plain)) - 2, \
        ([str(n.op) for n in _launching(plain)], [str(n.op) for n in _launching(copied)])
    # no elementwise result is read by a reduction and by another kernel any more
    for node in copied:
        if type(node.op) is GpuCAReduce and node.op.axis == (1,):
            assert node.op.pre_scalar_op is not None, node.op
    producers = [n for n in plain if type(n.op) is GpuElemwise
                 and any(type(c.op) is GpuCAReduce for c in _readers(plain, n))]
    assert producers, "the unrewritten graph has the producers this test is about"


def _readers(nodes, node):
    return [n for n in nodes if any(v in node.outputs for v in n.inputs)]


def test_a_producer_of_two_full_arrays_is_not_copied(vgpu):
    """Recomputing a * b in each of its two reductions would load two arrays twice where
    the product is loaded once each; a + row (one full array) is copied into both."""
    a, b, r = T.matrix("a"), T.matrix("b"), T.vector("r")
    for p, copied in ((a * b, False), (a + r, True)):
        with config.change_flags(optimizer_excluding=NO_GROUP):
            f = function([a, b, r], [gpu_from_host(p.sum(axis=1)),
                                     gpu_from_host(p.max(axis=1))], on_unused_input="ignore")
        nodes = f.maker.fgraph.toposort()
        reductions = [n for n in nodes if type(n.op) is GpuCAReduce]
        assert len(reductions) == 2
        assert all((n.op.pre_scalar_op is not None) == copied for n in reductions), \
            [str(n.op) for n in nodes]
        assert any(type(n.op) is GpuElemwise for n in nodes) != copied


gvar = gpu_vector_maker(None)


@requires_gxx
def test_copied_kernels_match_the_kernels_they_replace(monkeypatch, tmp_path):
    """z = x + b (b a row) read by a row max and by exp(z - m): after the rewrite the max
    reads x and b through its pre-op and the exp recomputes x + b; the values are those of
    the kernels before it."""
    emu = emulated_kernel_device(monkeypatch, tmp_path)
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((37, 10)).astype("float32")
    bs = rng.standard_normal((1, 10)).astype("float32")
    ms = rng.standard_normal((37, 1)).astype("float32")
    x, b, m = (gvar("float32", bc) for bc in ((False, False), (True, False), (False, True)))
    z = GpuElemwise(SCALAR_OPS["add"])(x, b)
    mx = GpuCAReduce(SCALAR_OPS["maximum"], (1,), "float32")(z)
    ez = GpuElemwise(SCALAR_OPS["exp"])(GpuElemwise(SCALAR_OPS["sub"])(z, m))
    fg = FunctionGraph([x, b, m], [mx, ez], clone=False)
    sub = fg.outputs[1].owner.inputs[0].owner
    assert copy_producer_into_readers(fg, sub.inputs[0].owner)   # z into max and sub
    red, new_sub = fg.outputs[0].owner, fg.outputs[1].owner.inputs[0].owner
    assert str(red.op.pre_scalar_op) == "add" and set(red.inputs) == {x, b}
    assert z.owner not in fg.apply_nodes and set(new_sub.inputs) == {x, b, m}
    values = {x: device_array(emu, xs), b: device_array(emu, bs), m: device_array(emu, ms)}

    def run(node):
        thunk, storage = thunk_over(node, [values[v] for v in node.inputs])
        thunk()
        values[node.outputs[0]] = storage[node.outputs[0]][0]
        return host_view(storage[node.outputs[0]][0]).copy()

    np.testing.assert_array_equal(run(red), (xs + bs).max(axis=1))
    np.testing.assert_array_equal(run(new_sub), (xs + bs) - ms)


@requires_gxx
def test_a_cast_read_through_a_broadcast_is_made_by_each_reader(monkeypatch, tmp_path):
    """A mean's divisor, the batch's length cast to float32 (a 0-d kernel of its own), read
    as a scalar by one kernel and broadcast (GpuDimShuffle{x}) by another: after the rewrite
    both read the int64 length and cast it themselves, with the values of the kernels before."""
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.scalar.basic import Cast
    emu = emulated_kernel_device(monkeypatch, tmp_path)
    n = GpuArrayType("int64", (), None)()
    x, s = gvar("float32"), GpuArrayType("float32", (), None)()
    divisor = GpuElemwise(Cast("float32"))(n)
    scaled = GpuElemwise(SCALAR_OPS["mul"])(x, GpuDimShuffle((), ("x",))(divisor))
    mean = GpuElemwise(SCALAR_OPS["true_div"])(s, divisor)
    fg = FunctionGraph([n, x, s], [scaled, mean], clone=False)
    assert copy_producer_into_readers(fg, divisor.owner)
    assert divisor.owner not in fg.apply_nodes
    for out in fg.outputs:     # each reads the length itself (the vector one through {x})
        ins = out.owner.inputs
        assert n in ins or any(i.owner is not None and i.owner.inputs == [n] for i in ins)
    xs = np.arange(1.0, 8.0, dtype="float32")
    values = {n: device_array(emu, np.array(7, "int64")), x: device_array(emu, xs),
              s: device_array(emu, np.array(35.0, "float32"))}
    for node in fg.toposort():
        thunk, storage = thunk_over(node, [values[v] for v in node.inputs])
        thunk()
        values[node.outputs[0]] = storage[node.outputs[0]][0]
    np.testing.assert_array_equal(host_view(values[fg.outputs[0]]), xs * np.float32(7))
    np.testing.assert_array_equal(host_view(values[fg.outputs[1]]), np.float32(5))


def test_the_dropout_mlps_mean_divisor_launches_no_kernel_of_its_own(vgpu):
    """examples/mlp_dropout.py's loss, -mean of the taken log-probabilities: its divisor,
    cast(x.shape[0], float32), was a 0-d kernel read by the gradient's kernel and by the
    mean's reduction; now each of them casts the uploaded length."""
    mlp_dropout = example_module("mlp_dropout")

    def zero_d_kernels(**flags):
        with config.change_flags(**flags):
            train, _, _ = mlp_dropout.build(64, on_device=True)
        return [n for n in train.maker.fgraph.toposort() if type(n.op) is GpuElemwise
                and all(all(o.broadcastable) for o in n.outputs)]
    assert len(zero_d_kernels(**OFF)) == 1
    assert not zero_d_kernels()
