"""gpu_guarded_updates (symgpu/gpu/ops/guarded_updates.py): in a function with device-checked
ops each update is switch(verdict, old, new), so the runner writes updates straight into their
buffers with no guarded copy. The rewritten graph on a virtual context; the verdict kernel and
a guarded update kernel on the CPU through the kernel emulator (a real checking kernel
reporting a bad label); the runner's choices with the fake driver of tests/graph_fakes.py."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from cuda_on_host import requires_gxx
from emulated_gpu import (device_array, emulate_prepared_kernels, emulated_kernel_device,
                          host_view)
from gpu_helpers import example_module, thunk_over
from graph_fakes import FakeElemwise, gvec, read, upload
from symgpu import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.guarded_updates import GpuCheckVerdict, reads_verdict
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.link.vm import link

OFF = {"optimizer_excluding": "gpu_guarded_updates"}   # the pass is in fast_run


def _checked_step(**flags):
    """A classifier's SGD step on a virtual context: the weights a GPU shared variable, the
    labels' pairs gather and the NLL gradient device-checked."""
    import symgpu.tensor as T
    from symgpu import function
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    with config.change_flags(floatX="float32", **flags), virtual_context(None):
        t = GpuArrayType("float32", (False, False), None)
        w = GpuArraySharedVariable(t, None, name="w",
                                   container=Container(t, np.zeros((5, 3), "float32"), "w"))
        x = GpuArrayType("float32", (False, False), None)("x")
        y = GpuArrayType("int64", (False,), None)("y")
        p = T.nnet.softmax(T.dot(x, w))
        cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
        f = function([x, y], cost, updates=[(w, w - 0.1 * T.grad(cost, w))])
    return f.maker.fgraph


def test_every_update_of_a_checked_step_selects_its_old_value_by_the_verdict():
    fg = _checked_step()                                       # by default (fast_run)
    nodes = fg.toposort()
    verdicts = [n for n in nodes if type(n.op) is GpuCheckVerdict]
    assert len(verdicts) == 1, [str(n.op) for n in nodes]
    checked = [n for n in nodes if getattr(n.op, "device_checked", False)]
    assert checked and all(nodes.index(n) < nodes.index(verdicts[0]) for n in checked)
    updates = [fg.outputs[k] for k in fg.update_mapping]
    assert len(updates) == 1 and all(reads_verdict(u.owner) for u in updates)
    assert "switch" in str(updates[0].owner.op)          # folded into the update's kernel
    plain = _checked_step(**OFF)                               # excluded: guarded copies
    assert not any(type(n.op) is GpuCheckVerdict for n in plain.toposort())
    assert not reads_verdict(plain.outputs[list(plain.update_mapping)[0]].owner)
    sync = _checked_step(**{"gpuarray.sync_checks": True})     # checks raise at once
    assert not any(type(n.op) is GpuCheckVerdict for n in sync.toposort())


@requires_gxx
@pytest.mark.parametrize("quiet_pages", [None, "before", "after"])
def test_a_reported_check_makes_the_update_kernel_keep_the_old_values(monkeypatch, tmp_path,
                                                                       quiet_pages):
    """As a call runs it: a cross-entropy with a bad label reports, the verdict kernel reads
    the report words, the fused SGD update selects the old weights; once the error is raised
    and the labels are good, the update lands. With five quiet report pages before or after
    the real one, the verdict takes two launches (four words each): a later launch raises it
    and never lowers what an earlier one found."""
    from symgpu.gpu.ops import crossentropy
    from symgpu.gpu.runtime import device_checks
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.scalar.composite import CompositeBuilder
    emu = emulated_kernel_device(monkeypatch, tmp_path)
    for module in (crossentropy, device_checks):
        emulate_prepared_kernels(monkeypatch, tmp_path, module)
    if quiet_pages:
        checks = device_checks.checks_of(emu)
        quiet = [device_array(emu, np.zeros(1, "uint64")).ptr for _ in range(5)]
        words = checks.report_words
        monkeypatch.setattr(checks, "report_words", (lambda: quiet + words()) if
                            quiet_pages == "before" else (lambda: words() + quiet))
    p = device_array(emu, np.full((4, 3), 0.5, dtype="float32"))
    xent = crossentropy.GpuCrossentropyCategorical1Hot()(
        GpuArrayType("float32", (False, False), None)(),
        GpuArrayType("int64", (False,), None)()).owner
    verdict = GpuCheckVerdict()(xent.outputs[0]).owner
    b = CompositeBuilder()
    w, g, v = b.add_input("float32"), b.add_input("float32"), b.add_input("int32")
    new = b.add_op(SCALAR_OPS["sub"], [w, b.add_op(SCALAR_OPS["mul"], [
        b.add_constant(0.5, "float32"), g])[0]])[0]
    sgd = GpuElemwise(b.build(b.add_op(SCALAR_OPS["switch"], [v, w, new])))(
        GpuArrayType("float32", (False,), None)(), GpuArrayType("float32", (False,), None)(),
        GpuArrayType("int32", (True,), None)()).owner
    ws, gs = np.arange(1.0, 6.0, dtype="float32"), np.full(5, 2.0, "float32")
    for labels, lands in (([0, 1, 3, 2], False), ([0, 1, 2, 2], True)):
        xent.op.perform(xent, [p, device_array(emu, np.asarray(labels, "int64"))], [[None]])
        out = [[None]]
        verdict.op.perform(verdict, [p], out)
        assert int(host_view(out[0][0])) == (0 if lands else 1)
        flag = out[0][0]
        flag1 = flag._view(flag.ptr, (1,), (4,))
        thunk, storage = thunk_over(sgd, [device_array(emu, ws), device_array(emu, gs), flag1])
        thunk()
        got = host_view(storage[sgd.outputs[0]][0])
        np.testing.assert_array_equal(got, ws - 1.0 if lands else ws)
        if not lands:
            with pytest.raises(ValueError, match="got label 3"):
                raise_device_errors(emu)


# ============================================================================ the runner

@pytest.fixture
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


class FakeVerdict(GpuCheckVerdict):
    """GpuCheckVerdict on the fake driver: its "kernel" writes ``FLAG[0]`` (float32 0-d)."""

    FLAG = [0.0]

    def make_node(self, *after):
        return Apply(self, list(after), [GpuArrayType("float32", (), fakes.CTX)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        out = storage_map[node.outputs[0]]
        ctx, drv, flag = fakes.CTX_OBJ, fakes.DRV, self.FLAG

        def thunk():
            o = new_array(ctx, (), np.dtype("float32"))
            ptr = o.ptr
            drv.launch_kernel(lambda: fakes.MEM[ptr].__setitem__(0, flag[0]))
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


def test_guarded_updates_are_written_in_place_and_copy_nothing(monkeypatch, fake_gpu):
    """A checked function whose update reads the verdict: the runner writes it straight into
    the variable (no guarded copy launched); a reported check keeps the old value."""
    ctx = fakes.CTX_OBJ
    guarded = fakes.FakeGuardedCopies().install(monkeypatch, ctx)
    w, g = gvec(), gvec()
    checked = FakeElemwise("idx", lambda a: a * 1, device_checked=True)(g)
    verdict = FakeVerdict()(checked)
    new = FakeElemwise("guarded_sgd", lambda a, b, v: np.where(v, a, a - 0.5 * b))(
        w, checked, verdict)
    fg = FunctionGraph([w, g], [new], clone=False)
    fg.update_mapping = {0: 0}
    storage = {w: [upload(ctx, [0.0])], g: [upload(ctx, [1.0])]}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage)
    runner = vm.runner
    assert runner.device_checked and runner.updates_guarded and runner.direct_updates
    assert runner.segments[0].direct
    w_ptr = vm.storage_map[w][0].ptr
    for flag, want in ((0.0, -3.0), (1.0, -3.0), (0.0, -4.0)):
        FakeVerdict.FLAG[0] = flag
        for _ in range(6 if flag == 0.0 and want == -3.0 else 2):
            vm()
            vm.storage_map[w][0] = vm.storage_map[new][0]
            vm.storage_map[new][0] = None
        np.testing.assert_allclose(read(vm.storage_map[w][0]), [want])
    assert vm.storage_map[w][0].ptr == w_ptr
    assert runner.stats()["replays"] >= 4 and not guarded.launches


def test_the_dropout_steps_generator_states_are_selected_by_one_kernel(monkeypatch):
    """examples/mlp_dropout.py with its shared variables on a virtual GPU: eight updates,
    the six weights' selections folded into their update kernels, the two generator states'
    into one two-output kernel (the weights' and the states' kernels one elementwise group,
    the hidden biases' updates in their layers' column groups: gpu_elemwise_group,
    gpu_col_reduce_group)."""
    from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup
    from symgpu.graph import sharedvalue as sv
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.type import GpuArraySharedVariable, move_to_gpu

    def virtual_gpu_shared(value, name=None, borrow=False, strict=False, allow_downcast=None,
                           target="default", broadcastable=None, **kw):
        if not isinstance(value, np.ndarray) or not move_to_gpu(value):
            raise TypeError("host")
        t = GpuArrayType(str(value.dtype), tuple(broadcastable) if broadcastable is not None
                         else (False,) * value.ndim, None)
        return GpuArraySharedVariable(t, None, name=name, container=Container(t, value, name))
    monkeypatch.setattr(sv, "_CONSTRUCTORS", [virtual_gpu_shared] + list(sv._CONSTRUCTORS))
    mlp_dropout = example_module("mlp_dropout")
    with config.change_flags(floatX="float32", device="cuda"), virtual_context(None):
        train, _, _ = mlp_dropout.build(64, on_device=True)
    fg = train.maker.fgraph
    writers = {fg.outputs[k].owner for k in fg.update_mapping}
    assert len(fg.update_mapping) == 8 and len(writers) < 7
    assert all(reads_verdict(w) for w in writers)
    kernels = [(op, w) for w in writers for op in (
        w.op.members if isinstance(w.op, GpuElemwiseGroup) else [w.op])]
    (states,) = [op for op, _ in kernels if getattr(op, "nout", 1) == 2]
    (owner,) = [w for op, w in kernels if op is states]
    outs = owner.outputs if owner.op is states else owner.op.slices(
        owner.outputs, True)[owner.op.members.index(states)]
    assert [o.dtype for o in outs] == ["uint32", "uint32"]


def test_grouped_updates_of_a_checked_step_read_the_verdict():
    """A ReLU layer with a bias: its bias's update is stored by its sum's kernel (an
    epilogue), the weights' updates by one elementwise group; every update still selects by
    the verdict, so the runner writes them into their buffers (Runner.updates_guarded)."""
    import symgpu.tensor as T
    from symgpu import function
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.ops.careduce import GpuCAReduce
    from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup
    from symgpu.gpu.placement.type import GpuArraySharedVariable

    def shared(shape, name):
        t = GpuArrayType("float32", (False,) * len(shape), None)
        return GpuArraySharedVariable(t, None, name=name,
                                      container=Container(t, np.zeros(shape, "float32"), name))
    with config.change_flags(floatX="float32"), virtual_context(None):
        w0, b0, w1 = shared((5, 4), "w0"), shared((4,), "b0"), shared((4, 3), "w1")
        x = GpuArrayType("float32", (False, False), None)("x")
        y = GpuArrayType("int64", (False,), None)("y")
        p = T.nnet.softmax(T.dot(T.maximum(T.dot(x, w0) + b0, 0), w1))
        cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
        ps = [w0, b0, w1]
        f = function([x, y], cost, updates=[(v, v - 0.1 * g)
                                            for v, g in zip(ps, T.grad(cost, ps))])
    fg = f.maker.fgraph
    owners = {fg.outputs[k].owner for k in fg.update_mapping}
    assert {type(n.op) for n in owners} == {GpuCAReduce, GpuElemwiseGroup}, owners
    assert all(reads_verdict(n) for n in owners)
