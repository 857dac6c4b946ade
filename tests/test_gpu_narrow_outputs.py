"""gpu_narrow_bool_outputs (symgpu/gpu/ops/narrow_outputs.py): a float-cast comparison a
kernel stores for later kernels (a dropout mask) is stored as the bool and cast by its
readers. The rewritten graphs on a virtual GPU context; the rewritten kernels' values on the
CPU through the kernel emulator (tests/emulated_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, host_view
from gpu_helpers import example_module, gpu_vector_maker, thunk_over
from symgpu import config
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.narrow_outputs import narrow_bool_outputs
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.composite import CompositeBuilder

def _dropout_step_nodes(**flags):
    mlp_dropout = example_module("mlp_dropout")
    with config.change_flags(floatX="float32", device="cuda", **flags), virtual_context(None):
        train, _, _ = mlp_dropout.build(64, on_device=True)
    return train.maker.fgraph.toposort()


def _philox_output_dtypes(nodes):
    return [[o.dtype for o in n.outputs] for n in nodes
            if type(n.op).__name__ == "GpuPhiloxElemwise"]


def test_the_dropout_masks_are_stored_as_bools_and_cast_by_the_backward_kernels():
    fused = _dropout_step_nodes()                  # by default (fast_run)
    plain = _dropout_step_nodes(optimizer_excluding="gpu_narrow_bool_outputs")
    assert len(_philox_output_dtypes(fused)) == len(_philox_output_dtypes(plain)) == 2
    for narrow, wide in zip(_philox_output_dtypes(fused), _philox_output_dtypes(plain)):
        assert narrow.count("float32") == wide.count("float32") - 1, (narrow, wide)
        assert narrow.count("bool") == wide.count("bool") + 1
    readers = [str(n.op) for n in fused if type(n.op) is GpuElemwise and "switch(i2" in str(n.op)]
    assert len(readers) == 2 and all("Cast{float32}" in r for r in readers), readers
    assert len(fused) == len(plain)


gvar = gpu_vector_maker(None)


def _mask_and_product():
    """One kernel computing (x * m, m) with m = cast(x > 0, float32)."""
    b = CompositeBuilder()
    x = b.add_input("float32")
    m = b.add_op(Cast("float32"), [b.add_op(SCALAR_OPS["gt"], [x, b.add_constant(0.0,
                                                                           "float32")])[0]])[0]
    return b.build([b.add_op(SCALAR_OPS["mul"], [x, m])[0], m])


@requires_gxx
def test_a_narrowed_mask_gives_its_readers_the_same_values(monkeypatch, tmp_path):
    emu = emulated_kernel_device(monkeypatch, tmp_path)
    x, y = gvar("float32"), gvar("float32")
    h, m = GpuElemwise(_mask_and_product())(x)
    out = GpuElemwise(SCALAR_OPS["mul"])(y, m)
    fg = FunctionGraph([x, y], [h, out], clone=False)
    assert narrow_bool_outputs(fg, h.owner)
    producer = fg.outputs[0].owner
    assert [o.dtype for o in producer.outputs] == ["float32", "bool"]
    assert "Cast{float32}" in str(fg.outputs[1].owner.op)
    xs = np.array([-2.0, -0.0, 0.0, 0.5, 3.0, np.nan, -np.inf], "float32")
    ys = np.arange(1.0, 8.0, dtype="float32")
    values = {x: device_array(emu, xs), y: device_array(emu, ys)}
    for node in fg.toposort():
        thunk, storage = thunk_over(node, [values[v] for v in node.inputs])
        thunk()
        values.update({o: storage[o][0] for o in node.outputs})
    mask = (xs > 0).astype("float32")
    with np.errstate(invalid="ignore"):                     # -inf * 0 is NaN, as the kernel's
        np.testing.assert_array_equal(host_view(values[fg.outputs[0]]), xs * mask)
    np.testing.assert_array_equal(host_view(values[fg.outputs[1]]), ys * mask)


def test_outputs_of_the_function_and_non_elementwise_readers_stay_float():
    from symgpu.gpu.ops.elemwise import GpuCAReduce
    x, y = gvar("float32"), gvar("float32")
    h, m = GpuElemwise(_mask_and_product())(x)
    fg = FunctionGraph([x, y], [h, m], clone=False)          # m is a result of the function
    assert not narrow_bool_outputs(fg, h.owner)
    h, m = GpuElemwise(_mask_and_product())(x)
    fg = FunctionGraph([x], [h, GpuCAReduce(SCALAR_OPS["add"], None, "float32")(m)],
                       clone=False)                         # a reduction reads it
    assert not narrow_bool_outputs(fg, h.owner)
