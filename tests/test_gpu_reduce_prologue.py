"""A reduction computes its input itself (symgpu/gpu/ops/reduce_prologue.py): an output of a
fused GPU kernel that only a reduction reads becomes the reduction's pre-op, recomputed from
the kernel's inputs, where that moves fewer bytes (a bias gradient's float32 copy of a
half-precision training step's gradient).

Checked on a virtual GPU (the rewritten graphs) and on the CPU (the reduction's program
gives the values the kernel's output had); the reduction kernel with a pre-op is run against
NumPy on the host emulator by tests/test_gpu_reduce_cols_tile.py."""
from __future__ import annotations

import numpy as np

import symgpu.tensor as T
from symgpu import Mode, function
from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.reduce_prologue import gpu_reduce_prologue
from symgpu.tensor.rewriting.recompute import program


def _half_dot(a, c):
    return T.cast(T.dot(T.cast(a, "bfloat16"), T.cast(c, "bfloat16")), "float32")


def _bias_step():
    """A layer's loss and the gradients of its weight and bias, products in bfloat16: the
    backward activation kernel writes the gradient as bfloat16 (for the weight's product)
    and as float32 (for the bias's column sum)."""
    x, w, v = T.fmatrix("x"), T.fmatrix("w"), T.fmatrix("v")
    b = T.fvector("b")
    h = T.tanh(_half_dot(x, w) + b)
    loss = T.sum(T.sqr(_half_dot(h, v)))
    return [x, w, b, v], [loss] + list(T.grad(loss, [w, b]))


def _float32_outputs_read_by_a_sum_alone(f):
    fg = f.maker.fgraph
    found = []
    for n in fg.toposort():
        if type(n.op) is not GpuElemwise:
            continue
        for o in n.outputs:
            readers = [c for c, _ in fg.clients.get(o, [])]
            if o.dtype == "float32" and o.ndim == 2 and len(readers) == 1 and \
                    readers[0] != "output" and type(readers[0].op) is GpuCAReduce:
                found.append(o)
    return found


def test_the_bias_gradient_sum_computes_its_input_from_the_half_gradient(vgpu):
    ins, outs = _bias_step()
    # (the column groups, which would take the sums into their producers, are off)
    without = function(ins, outs, mode=Mode().excluding("gpu_reduce_prologue",
                                                         "gpu_col_reduce_group"))
    assert _float32_outputs_read_by_a_sum_alone(without)      # the copy the pass removes
    f = function(ins, outs, mode=Mode().excluding("gpu_col_reduce_group"))
    assert not _float32_outputs_read_by_a_sum_alone(f)
    sums = [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuCAReduce
            and n.outputs[0].ndim == 1]
    assert any(n.op.pre_scalar_op is not None and "bfloat16" in {v.dtype for v in n.inputs}
               for n in sums)


def _value(rng, var):
    shape = tuple(1 if b else 5 + k for k, b in enumerate(var.type.broadcastable))
    return rng.uniform(-1, 1, shape).astype(var.dtype)


def test_the_reductions_program_gives_the_values_the_kernel_wrote(vgpu):
    """Each rewritten reduction's pre-op, over the inputs it reads, equals the output of the
    kernel it replaces (NumPy evaluation of both scalar programs)."""
    ins, outs = _bias_step()
    f = function(ins, outs, mode=Mode().excluding("gpu_reduce_prologue", "inplace"))
    fg = f.maker.fgraph.clone()
    before = {}
    for n in fg.toposort():
        if type(n.op) is GpuElemwise and program(n.op) is not None:
            for j, o in enumerate(n.outputs):
                readers = [c for c, _ in fg.clients.get(o, [])]
                if len(readers) == 1 and readers[0] != "output" and \
                        type(readers[0].op) is GpuCAReduce:
                    before[readers[0].outputs[0]] = (n, j)
    assert gpu_reduce_prologue(fg) >= 1
    rng = np.random.default_rng(0)
    checked = 0
    for producer, j in before.values():
        reduced = [n for n in fg.toposort() if type(n.op) is GpuCAReduce and
                   n.op.pre_scalar_op is not None and
                   set(n.inputs) <= set(producer.inputs)]
        vals = {v: _value(rng, v) for v in producer.inputs}
        want = program(producer.op).impl(*[vals[v] for v in producer.inputs])
        want = want[j] if isinstance(want, (list, tuple)) else want
        for n in reduced:
            got = n.op.pre_scalar_op.impl(*[vals[v] for v in n.inputs])
            if np.shape(got) == np.shape(want) and np.allclose(
                    np.asarray(got, "float64"), np.asarray(want, "float64"), rtol=1e-6):
                checked += 1
                break
    assert checked >= 1


def test_a_value_cheaper_to_store_than_to_recompute_stays(vgpu):
    """v = x * y (two full float32 inputs) read by a column sum and, cast to half, by a
    product: recomputing it would read 8 bytes per element, storing it costs 8 (write and
    read): it stays an output of the kernel."""
    x, y, w = T.fmatrix("x"), T.fmatrix("y"), T.fmatrix("w")
    v = x * y
    outs = [v.sum(axis=0), _half_dot(v + 1, w)]
    f = function([x, y, w], outs, mode=Mode().excluding("gpu_col_reduce_group"))
    sums = [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuCAReduce]
    assert sums and all(n.op.pre_scalar_op is None for n in sums)
