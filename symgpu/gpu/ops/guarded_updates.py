"""gpu_guarded_updates: in a function whose ops check their inputs on the device (labels,
indices: symgpu/gpu/runtime/device_checks.py), each update's value is
``switch(verdict, old, new)``, the verdict read from the checks' report words after the last
checking node (GpuCheckVerdict); a call that is about to fail computes its variables' old
values, so no copy of an update has to be guarded.

Why: a failed call must leave its shared variables untouched, and a device check reports only
at the next synchronisation. Without this pass the graph runner computes such a function's
updates into fresh buffers and copies them back with guarded copies (a check launch reading
the report words, then a copy launch that does nothing once one is set): in the dropout MLP's
step, 7.45 MB of weights copied every call (4.5 us on an H200). With the verdict in the graph,
the fused update kernels (``W - lr * dW`` with the switch folded in) write straight into the
variables' buffers (graphs.Runner's direct updates) and nothing is copied; the verdict is the
guarded copies' check kernel, writing an int of the graph. Taken when every update is of a GPU
variable and no checking node reads an update's new value (the verdict comes after the checks,
the updates after the verdict); checks made at once (``gpuarray.sync_checks``) need none.
In the default passes (``fast_run``); ``optimizer_excluding=gpu_guarded_updates`` turns it
off (the guarded copies then serve).
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.random import GpuPhiloxAdvance
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime import device_checks
from symgpu.gpu.runtime.array import GpuArray
from symgpu.graph.basic import Apply, Variable, ancestors
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder

__all__ = ["GpuCheckVerdict", "gpu_guarded_updates", "reads_verdict"]


class GpuCheckVerdict(Op):
    """A 0-d int32: 1 once a device check of the context has reported (and until the host
    raises it at a synchronisation), else 0. Its inputs are the checking nodes' results, only
    so that it runs after them."""

    __props__ = ()
    capturable = True   # a pool allocation and one launch on the stream (graphs.py)
    launches = True

    def __str__(self) -> str:
        return "GpuCheckVerdict"

    def make_node(self, *after: Any) -> Apply:
        gpu = [v for v in after if is_gpu_var(v)]
        if not gpu:
            raise TypeError(f"{self}: needs the results of GPU nodes to come after")
        ctx = gpu[0].type.context_name
        return Apply(self, list(after), [GpuArrayType("int32", (), ctx)()])

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        return device_checks.verdict_sources()

    def perform(self, node, inputs, out):
        ctx = next(v for v in inputs if hasattr(v, "context")).context
        ctx.activate()
        verdict = GpuArray((), "int32", ctx)
        device_checks.queue_verdict(ctx, verdict.ptr)
        out[0][0] = verdict


def reads_verdict(node: Apply | None) -> bool:
    """Whether `node` reads a GpuCheckVerdict (directly or broadcast by one GpuDimShuffle
    or a chain of them)."""
    if node is None:
        return False
    for v in node.inputs:
        src = v.owner
        while src is not None and type(src.op) is GpuDimShuffle:
            src = src.inputs[0].owner
        if src is not None and isinstance(src.op, GpuCheckVerdict):
            return True
    return False


def gpu_guarded_updates(fgraph: FunctionGraph) -> int:
    """Make every update ``switch(verdict, old, new)`` (all or none); returns 1 if done."""
    if not device_checks.checks_are_deferred():
        return 0
    mapping = getattr(fgraph, "update_mapping", None) or {}
    checked = [n for n in fgraph.toposort() if getattr(n.op, "device_checked", False)]
    if not mapping or not checked:
        return 0
    updates = [(k, fgraph.outputs[k], fgraph.inputs[i]) for k, i in mapping.items()]
    if any(not is_gpu_var(old) or new.type != old.type for _, new, old in updates):
        return 0
    after = [n.outputs[0] for n in checked]
    news = {new for _, new, old in updates if new is not old}
    if news & set(ancestors(after)):
        return 0
    verdict = GpuCheckVerdict()(*after)
    switch = GpuElemwise(SCALAR_OPS["switch"])
    guarded: list[tuple[int, Variable]] = []
    states = [(k, new, old) for k, new, old in updates if new is not old and _is_state(new)]
    if len(states) > 1:   # generator states, four words each: one kernel selects them all
        guarded += zip([k for k, _, _ in states], _select_states(verdict, states))
    for k, new, old in updates:
        if new is old or (len(states) > 1 and any(k == s for s, _, _ in states)):
            continue
        v = GpuDimShuffle((), ("x",) * old.ndim)(verdict) if old.ndim else verdict
        g = switch(v, old, new)
        if g.type != new.type:
            return 0
        guarded.append((k, g))
    for k, g in guarded:
        fgraph.change_node_input("output", k, g, reason="gpu_guarded_updates")
    return 1


def _is_state(new: Variable) -> bool:
    """Whether `new` is a Philox generator's next state (always four uint32 words)."""
    return new.owner is not None and type(new.owner.op) is GpuPhiloxAdvance


def _select_states(verdict: Variable, states: list) -> list[Variable]:
    """switch(verdict, old, new) of every state in one multi-output kernel (the states all
    have four words, so one launch shape serves them)."""
    b = CompositeBuilder()
    v = b.add_input(verdict.dtype)
    outs = []
    for _, new, old in states:
        o, n = b.add_input(old.dtype), b.add_input(new.dtype)
        outs += b.add_op(SCALAR_OPS["switch"], [v, o, n])
    ins = [GpuDimShuffle((), ("x",))(verdict)] + [x for _, new, old in states for x in (old, new)]
    return GpuElemwise(b.build(outs))(*ins)


# after the checking ops exist (lifted at 40; gpu_nll_grad_fusion 49.4, gpu_take_rows 49.45),
# before gpu_fusion (49.5) folds each switch into its update's kernel
optdb.register("gpu_guarded_updates", gpu_guarded_updates, 49.48, "fast_run", "gpu")
