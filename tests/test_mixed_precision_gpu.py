"""Mixed precision on the GPU: the rewritten training step on a virtual context (elementwise
work and casts fused into GpuElemwise kernels, reductions and updates float32, the loss
scaler's state and check on the device, no synchronisation per call), and on the GPU machine
a training step with loss scaling whose host synchronisations and device-to-host copies are
counted (none per step after the first calls).

float16 is the half dtype tested on the virtual context: GPU elementwise kernels accept it
today. Until half matrix products are placed on the GPU (cuBLASLt, the halfblas work), the
half products of a float16 graph stay on the CPU with transfers around them; the tests here
check what the policy itself must guarantee, so they hold before and after."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import assert_one_segment, requires_gpu
from symgpu import config, function
from symgpu.compile.sharedvalue import Container
from symgpu.graph import sharedvalue as sv
from symgpu.graph.rewriting import settings
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArraySharedVariable, GpuArrayType, move_to_gpu
from symgpu.mixed_precision import autocast, loss_scaled_updates
from symgpu.scalar.basic import Cast


@pytest.fixture(autouse=True)
def rewrites_raise(monkeypatch):
    monkeypatch.setattr(settings, "on_error", "raise")


@pytest.fixture
def virtual_gpu(monkeypatch):
    """device=cuda on a virtual default context, shared() making GPU shared variables there
    (as it does on the GPU machine): graphs compile for the GPU, nothing runs."""
    def virtual_gpu_shared(value, name=None, borrow=False, strict=False, allow_downcast=None,
                           target="default", broadcastable=None, **kw):
        if not isinstance(value, np.ndarray) or not move_to_gpu(value):
            raise TypeError("host")
        t = GpuArrayType(str(value.dtype), tuple(broadcastable) if broadcastable is not None
                         else (False,) * value.ndim, None)
        return GpuArraySharedVariable(t, None, name=name, container=Container(t, value, name))
    monkeypatch.setattr(sv, "_CONSTRUCTORS", [virtual_gpu_shared] + list(sv._CONSTRUCTORS))
    with config.change_flags(floatX="float32", device="cuda"), virtual_context(None) as ctx:
        yield ctx


def _sgd(lr):
    return lambda ps, gs: [(p, p - lr * g) for p, g in zip(ps, gs)]


def _mlp_step(policy, scaled, outputs=True, d=784, hdim=256, k=10, data=None):
    """The MLP training step (the data inputs, or `data`'s shared variables; the weights
    shared variables): the loss as output (or none), plain SGD or loss-scaled SGD, compiled
    under `policy`."""
    rng = np.random.default_rng(0)
    x, y = data or (T.fmatrix("x"), T.ivector("y"))
    w1 = symgpu.shared((rng.standard_normal((d, hdim)) * 0.03).astype("float32"), name="w1")
    b1 = symgpu.shared(np.zeros(hdim, "float32"), name="b1")
    w2 = symgpu.shared((rng.standard_normal((hdim, k)) * 0.06).astype("float32"), name="w2")
    b2 = symgpu.shared(np.zeros(k, "float32"), name="b2")
    params = [w1, b1, w2, b2]
    p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, w1) + b1), w2) + b2)
    cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    scaler = None
    if scaled:
        updates, scaler = loss_scaled_updates(cost, params, _sgd(0.1), init_scale=256.0,
                                              growth_interval=4)
    else:
        updates = _sgd(0.1)(params, T.grad(cost, params))
    with autocast(policy, enabled=policy != "off"):
        f = function([] if data else [x, y], cost if outputs else [], updates=updates)
    return f, params, scaler


def _standalone_casts_where_fusion_applies(fg):
    """Cast kernels with an elementwise producer or a lone elementwise reader: fusion should
    have merged them into it."""
    bad = []
    for n in fg.toposort():
        if not (isinstance(n.op, GpuElemwise) and isinstance(n.op.scalar_op, Cast)):
            continue
        src = n.inputs[0].owner
        readers = [c for c, _ in fg.clients[n.outputs[0]] if c != "output"]
        if (src is not None and isinstance(src.op, GpuElemwise)) or \
                (len(readers) == 1 and isinstance(readers[0].op, GpuElemwise)):
            bad.append(n)
    return bad


def test_the_float16_step_fuses_its_casts_and_keeps_reductions_and_updates_float32(
        virtual_gpu):
    f, params, _ = _mlp_step("float16", scaled=False)
    fg = f.maker.fgraph
    nodes = fg.toposort()
    kernels = [n for n in nodes if isinstance(n.op, GpuElemwise)]
    assert any("Cast{float16}" in str(n.op) and "tanh" in str(n.op) for n in kernels), \
        [str(n.op) for n in kernels]           # the bias add, tanh and cast: one kernel
    assert not _standalone_casts_where_fusion_applies(fg)
    for n in nodes:
        if isinstance(n.op, GpuCAReduce) or "Softmax" in type(n.op).__name__:
            assert n.outputs[0].dtype == "float32", n
    for out_index, in_index in fg.update_mapping.items():
        assert fg.outputs[out_index].dtype == "float32"
        assert isinstance(fg.inputs[in_index], GpuArraySharedVariable)
        assert fg.inputs[in_index].dtype == "float32"          # master weights
    products = [n for n in nodes if "Dot" in type(n.op).__name__ or "Gemm" in type(n.op).__name__]
    assert products and all(v.dtype == "float16" for n in products for v in n.inputs
                            if v.ndim == 2), [(str(n.op), [v.type for v in n.inputs])
                                              for n in products]


def test_the_loss_scalers_state_check_and_updates_live_on_the_device(virtual_gpu):
    f, params, scaler = _mlp_step("float16", scaled=True)
    fg = f.maker.fgraph
    assert isinstance(scaler.scale, GpuArraySharedVariable)
    assert isinstance(scaler.good_steps, GpuArraySharedVariable)
    written = {fg.inputs[i].name: fg.outputs[o] for o, i in fg.update_mapping.items()}
    assert set(written) == {"w1", "b1", "w2", "b2", "loss_scale", "loss_scale_good_steps"}
    from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup

    def kernel(new):   # the GpuElemwise computing `new` (alone, or a group's member)
        node = new.owner
        if isinstance(node.op, GpuElemwiseGroup):
            outs = node.op.slices(node.outputs, True)
            return next(m for m, o in zip(node.op.members, outs) if new in o)
        return node.op
    for var, new in written.items():      # each update a GPU kernel selecting by the check
        assert isinstance(kernel(new), GpuElemwise), (var, new.owner.op)
    assert sum("switch" in str(kernel(new)) for new in written.values()) == len(written)


def test_a_float32_loss_scaled_step_waits_for_nothing(virtual_gpu):
    f, _, _ = _mlp_step("off", scaled=True, outputs=False)
    rep = symgpu.explain(f, file=None)
    assert rep.on_gpu and rep.syncs_per_call == 0, rep.syncs
    assert not rep.cpu_ops, rep.cpu_ops
    assert_one_segment(f.maker.fgraph.toposort())


def test_loss_scaling_adds_no_wait_to_the_float16_step(virtual_gpu):
    """Under the float16 policy the loss-scaled step waits exactly as often as the plain one
    (not at all once half products run on the GPU): the check and the scale's updates add
    no read-back."""
    counts = []
    for scaled in (False, True):
        rep = symgpu.explain(_mlp_step("float16", scaled, outputs=False)[0], file=None)
        counts.append(rep.syncs_per_call)
    assert counts[1] == counts[0], counts


# ----------------------------------------------------------------------------- GPU machine

@requires_gpu
@pytest.mark.parametrize("policy", ["off", "float16", "bfloat16"])
def test_a_loss_scaled_training_step_never_waits_for_the_gpu(cuda, monkeypatch, policy):
    """The host's waits (stream/context/event synchronize) and device-to-host copies counted
    through PyCUDA's driver module: none in steps 4..10 of the loss-scaled MLP step (the first
    calls may time GEMM algorithms and capture the CUDA graph). The step ran on the GPU: its
    graph is GPU kernels with no transfer, its weights GPU arrays, and it trained."""
    import pycuda.driver as drv
    rng = np.random.default_rng(1)
    data = (symgpu.shared(rng.standard_normal((128, 64)).astype("float32"), name="x"),
            symgpu.shared(rng.integers(0, 10, 128).astype("int32"), name="y"))
    f, params, scaler = _mlp_step(policy, scaled=True, outputs=False, d=64, hdim=32,
                                  data=data)
    nodes = f.maker.fgraph.toposort()
    names = {type(n.op).__name__ for n in nodes}
    # nothing is read back; what goes up is at most the batch's row count (int scalars of
    # the shapes, computed on the host: the mean's divisor), never a float value
    uploads = [n.inputs[0].type for n in nodes if type(n.op).__name__ == "GpuFromHost"]
    assert "GpuElemwise" in names and "HostFromGpu" not in names, names
    assert all(t.ndim == 0 and t.dtype.startswith("int") for t in uploads), uploads
    assert all(isinstance(v, GpuArraySharedVariable) for v in params + list(data))
    w_before = params[0].get_value()
    for _ in range(3):
        f()
    waits = []

    def counting(name, real):
        def wrapper(*args, **kwargs):
            waits.append(name)
            return real(*args, **kwargs)
        return wrapper
    for owner, attr in ((drv.Stream, "synchronize"), (drv.Context, "synchronize"),
                        (drv.Event, "synchronize"), (drv, "memcpy_dtoh"),
                        (drv, "memcpy_dtoh_async")):
        monkeypatch.setattr(owner, attr, counting(f"{getattr(owner, '__name__', owner)}."
                                                  f"{attr}", getattr(owner, attr)))
    for _ in range(7):
        f()
    assert waits == [], waits
    monkeypatch.undo()
    assert scaler.good_steps.get_value() > 0                 # steps were taken, not skipped
    assert not np.array_equal(params[0].get_value(), w_before)
