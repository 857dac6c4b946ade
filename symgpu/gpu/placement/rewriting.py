"""The graph-to-GPU pass, transfer cancelling and the `assert_no_cpu_op` check.

Why one sweep: Theano's node-by-node GPU lifter made intermediate graphs explode with
transfer pairs; its GraphToGPU replaced it with a single topological pass that maps every
node with a GPU implementation and leaves the rest on the CPU. That is what `lift_to_gpu`
does. GPU implementations come from a registry (`register_lifter`) that the kernel modules
fill; the core never imports them.

Placement rule (Theano's): with a default GPU context in use (device=cuda, or a registered
context named None), a node moves when one of its inputs is on the GPU, is an input of the
function that is not a discrete scalar, or is a non-constant float tensor; without one, only
nodes with an input already on a GPU move (GPU shared variables, explicit transfers). Ops
registered `eager=True` (allocations) move whenever a default context is in use.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, Sequence

from symgpu.config import config
from symgpu.gpu.placement.basic_ops import (GpuAlloc, GpuDimShuffle, GpuFromHost, GpuReshape,
                                            GpuShape, GpuShape_i, GpuSpecifyBroadcastable,
                                            GpuToGpu, GpuUnbroadcast, HostFromGpu, TRANSFER_OPS,
                                            specify_gpu_broadcastable_as)
from symgpu.gpu.placement.type import (GpuArrayConstant, GpuArrayType, default_context_active,
                                       gpu_supports_dtype, is_gpu_var)
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import to_gpu
from symgpu.graph.devices import is_device_node
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting.basic import node_rewriter
from symgpu.graph.rewriting.db import POSITIONS, optdb, register_canonicalize
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.tensor.basic import Alloc as _Alloc, Reshape as _Reshape
from symgpu.tensor.elemwise import DimShuffle as _DimShuffle
from symgpu.tensor.rewriting.shape_feature import register_shape_reader, rewrite_shape_read
from symgpu.tensor.rewriting.shape_ops import (local_shape_to_shape_i,
                                               local_subtensor_of_make_vector)
from symgpu.tensor.shape import (Shape, Shape as _Shape, Shape_i, Shape_i as _Shape_i,
                                 SpecifyBroadcastable as _SpecifyBroadcastable,
                                 SpecifyShape as _SpecifyShape, Unbroadcast as _Unbroadcast)
from symgpu.tensor.type import TensorConstant, TensorType
from symgpu.scalar.dtypes import is_float

__all__ = ["register_lifter", "unregister_lifter", "lifters_for", "GpuInputs", "lift_to_gpu",
           "register_device_kind", "register_lifter_source",
           "local_cut_gpu_transfers", "local_fold_gpu_constant_upload", "cut_gpu_transfers", "check_no_cpu_op", "cpu_nodes",
           "CpuOpError", "CpuOpWarning", "virtual_context", "Lifter"]

#: fn(op, node, context_name, gpu_inputs) -> GPU output variables, or None to decline
Lifter = Callable[[Op, Apply, Any, "GpuInputs"], Sequence[Variable] | None]

_LIFTERS: dict[Any, list[Lifter]] = {}
_EAGER: set[Any] = set()


def register_lifter(*op_classes: type, eager: bool = False) -> Callable[[Lifter], Lifter]:
    """Decorator: `fn(op, node, context_name, gpu_inputs)` gives the GPU version of nodes
    whose op is an instance of one of `op_classes` (matched along the op's MRO: by type,
    never by class name). It returns one variable per output of `node` (GPU or host typed, same
    dtype and ndim) or None to leave the node on the CPU. Later registrations are tried
    first. `eager=True`: move such nodes whenever a default context is in use, even with
    only constant inputs (allocations)."""
    if not op_classes or not all(isinstance(c, type) for c in op_classes):
        raise TypeError(f"register_lifter needs op classes, got {op_classes!r}")

    def deco(fn: Lifter) -> Lifter:
        for cls in op_classes:
            _LIFTERS.setdefault(cls, []).insert(0, fn)
            if eager:
                _EAGER.add(cls)
        return fn
    return deco


def unregister_lifter(fn: Lifter) -> None:
    """Remove `fn` from every class it was registered for (tests use this)."""
    for fns in _LIFTERS.values():
        while fn in fns:
            fns.remove(fn)


def lifters_for(op: Op) -> list[Lifter]:
    """The lifters that may serve `op`, in the order they are tried."""
    found: list[Lifter] = []
    for cls in type(op).__mro__:
        found += _LIFTERS.get(cls, [])
    return found


#: fn() registering lifters for op classes of modules loaded on first use (the sparse
#: products): called before every sweep, cheap when there is nothing new to register
_LIFTER_SOURCES: list[Callable[[], None]] = []


def register_lifter_source(fn: Callable[[], None]) -> Callable[[], None]:
    """Call `fn()` before every graph-to-GPU sweep: it registers lifters for op classes of
    a module that may have loaded since (without importing it itself)."""
    _LIFTER_SOURCES.append(fn)
    return fn


class _DeviceKind:
    """A device value kind other than GpuArray (GPU sparse matrices): its type class, which
    host variables it can hold, and its transfers."""

    def __init__(self, type_cls: type, is_host: Callable[[Variable], bool],
                 upload: Callable[[Variable, Any], Variable],
                 download: Callable[[Variable], Variable], transfers: tuple):
        self.type_cls, self.is_host = type_cls, is_host
        self.upload, self.download, self.transfers = upload, download, transfers


_KINDS: list[_DeviceKind] = []


def register_device_kind(type_cls: type, is_host: Callable[[Variable], bool],
                         upload: Callable[[Variable, Any], Variable],
                         download: Callable[[Variable], Variable], transfers: tuple) -> None:
    """Make the sweep move values of device type `type_cls` (declaring `context_name`) like
    GPU arrays: `upload(host_var, context_name)` for host variables `is_host` accepts,
    `download(device_var)` for host ops; the op classes in `transfers` (declaring `transfer`
    'upload'/'download') are read through and their pairs cancelled after lifting."""
    _KINDS.append(_DeviceKind(type_cls, is_host, upload, download, tuple(transfers)))
    cancel = node_rewriter(list(transfers))(_cut_kind_transfers)
    cancel.name = f"local_cut_{type_cls.__name__}_transfers"
    optdb.register(f"{type_cls.__name__}_transfer_cancel",
                   EquilibriumRewriter([cancel], name=cancel.name),
                   POSITIONS["gpu_transfer_cancel"] + 0.1, "fast_run", "fast_compile", "gpu")


def _kind_of_device(var: Variable) -> _DeviceKind | None:
    for k in _KINDS:
        if isinstance(var.type, k.type_cls):
            return k
    return None


def _kind_of_host(var: Variable) -> _DeviceKind | None:
    for k in _KINDS:
        if k.is_host(var):
            return k
    return None


def _on_device(var: Variable) -> bool:
    return is_gpu_var(var) or (bool(_KINDS) and _kind_of_device(var) is not None)


def _cut_kind_transfers(fgraph: FunctionGraph | None, node: Apply) -> list[Variable] | None:
    """upload(download(y)) -> y on y's own context; download(upload(x)) -> x."""
    src = node.inputs[0].owner
    if src is None:
        return None
    kind, skind = getattr(node.op, "transfer", None), getattr(src.op, "transfer", None)
    if kind == "download" and skind == "upload":
        x = src.inputs[0]
        return [x] if x.type == node.outputs[0].type else None
    if kind == "upload" and skind == "download":
        y = src.inputs[0]
        return [y] if y.type == node.outputs[0].type else None
    return None


def _is_eager(op: Op) -> bool:
    return any(cls in _EAGER for cls in type(op).__mro__)


class GpuInputs(list):
    """The inputs a lifter gets: data inputs on the GPU (uploaded on demand), discrete
    scalars on the host. `host(i)` is input i on the host (e.g. a shape vector)."""

    def __init__(self, items: Sequence[Variable], host: Callable[[int], Variable],
                 was_on_gpu: Sequence[bool]):
        super().__init__(items)
        self._host = host
        self.was_on_gpu = list(was_on_gpu)

    def host(self, i: int) -> Variable:
        return self._host(i)


# ----------------------------------------------------------------------------- the sweep

def _movable(var: Variable) -> bool:
    """Host data worth putting on the GPU: tensors except discrete scalars."""
    t = var.type
    return (isinstance(t, TensorType) and gpu_supports_dtype(t.dtype)
            and (t.ndim > 0 or is_float(t.dtype)))


class _Sweep:
    """One topological pass; `cur[v]` is where v's value lives in the new graph (a host or a
    GPU variable), with memoised conversions so each transfer is made once."""

    def __init__(self, fgraph: FunctionGraph, has_target: bool):
        self.fgraph = fgraph
        self.has_target = has_target
        self.inputs = set(fgraph.inputs)
        self.cur: dict[Variable, Variable] = {}
        self.gpu: dict[tuple[Variable, Any], Variable] = {}
        self.cpu: dict[Variable, Variable] = {}

    def now(self, v: Variable) -> Variable:
        return self.cur.get(v, v)

    def on_gpu(self, v: Variable) -> bool:
        return _on_device(self.now(v))

    def gpu_version(self, v: Variable, ctx: Any) -> Variable:
        key = (v, ctx)
        res = self.gpu.get(key)
        if res is None:
            n = self.now(v)
            if is_gpu_var(n):
                res = n if n.type.context_name == ctx else GpuToGpu(ctx)(n)
            elif _KINDS and _kind_of_device(n) is not None:
                kind = _kind_of_device(n)
                res = n if n.type.context_name == ctx else \
                    kind.upload(self.cpu_version(v), ctx)
            elif _KINDS and _kind_of_host(n) is not None:
                res = _kind_of_host(n).upload(n, ctx)
            else:
                res = GpuFromHost(ctx)(n)
            self.gpu[key] = res
        return res

    def cpu_version(self, v: Variable) -> Variable:
        n = self.now(v)
        if not _on_device(n):
            return n
        res = self.cpu.get(v)
        if res is None:
            res = self.cpu[v] = HostFromGpu()(n) if is_gpu_var(n) else \
                _kind_of_device(n).download(n)
        return res

    def as_original(self, v: Variable) -> Variable:
        """`v` where the unlifted node expects it: GPU inputs of GPU ops stay on their
        context, host inputs come back to the host."""
        if isinstance(v.type, GpuArrayType):
            n = self.gpu_version(v, v.type.context_name)
            return n if n.type == v.type else specify_gpu_broadcastable_as(n, v.type)
        if _KINDS and _kind_of_device(v) is not None:
            return self.gpu_version(v, v.type.context_name)
        return self.cpu_version(v)

    # -- deciding
    def context_for(self, node: Apply) -> tuple[bool, Any]:
        for v in node.inputs:
            n = self.now(v)
            if _on_device(n):
                return True, n.type.context_name
        if not self.has_target:
            return False, None
        for v in node.inputs:
            if _movable(v) and (v in self.inputs or (not isinstance(v, Constant)
                                                     and is_float(v.type.dtype))):
                return True, None
            if _KINDS and v in self.inputs and _kind_of_host(v) is not None:
                return True, None   # a sparse input: lifted ops read it uploaded once
        if _is_eager(node.op):
            return True, None
        return False, None

    # -- one node
    def visit(self, node: Apply) -> None:
        op = node.op
        transfer = getattr(op, "transfer", None)
        if transfer == "download":
            x = node.inputs[0]
            if self.now(x) is x:
                self.cpu[node.outputs[0]] = node.outputs[0]  # keep the original node
            self.cur[node.outputs[0]] = self.now(x)
            return
        if transfer in ("upload", "device"):
            x = node.inputs[0]
            if self.now(x) is x and not _on_device(x) and transfer == "upload":
                self.gpu.setdefault((x, op.context_name), node.outputs[0])
            self.cur[node.outputs[0]] = self.gpu_version(x, op.context_name)
            return
        move, ctx = self.context_for(node)
        if move and self.lift(node, ctx):
            return
        new_inputs = [self.as_original(v) for v in node.inputs]
        if all(a is b for a, b in zip(new_inputs, node.inputs)):
            return
        new = node.clone_with_new_inputs(new_inputs)
        for old, o in zip(node.outputs, new.outputs):
            self.cur[old] = _same_type(old, o)

    def lift(self, node: Apply, ctx: Any) -> bool:
        lifters = lifters_for(node.op)
        if not lifters:
            return False
        items, was = [], []
        for v in node.inputs:
            n = self.now(v)
            was.append(_on_device(n))
            if _on_device(n) or _movable(v) or (_KINDS and _kind_of_host(n) is not None):
                items.append(self.gpu_version(v, ctx))
            else:
                items.append(n)
        idx = {i: v for i, v in enumerate(node.inputs)}
        for fn in lifters:
            gpu_inputs = GpuInputs(items, lambda i: self.cpu_version(idx[i]), was)
            outs = fn(node.op, node, ctx, gpu_inputs)
            if outs is None:
                continue
            outs = [outs] if isinstance(outs, Variable) else list(outs)
            if len(outs) != len(node.outputs):
                raise ValueError(f"the GPU lifter {getattr(fn, '__name__', fn)} returned "
                                 f"{len(outs)} outputs for {node}, which has "
                                 f"{len(node.outputs)}")
            for old, new in zip(node.outputs, outs):
                if new.owner is not None and not hasattr(new.owner.tag, "lifted_from"):
                    new.owner.tag.trace = getattr(node.tag, "trace", [])
                    new.owner.tag.lifted_from = node
                self.cur[old] = _same_value(old, new, fn)
            return True
        return False

    def final(self, old: Variable) -> Variable:
        """The new-graph variable for fgraph output `old`, with `old`'s exact type."""
        if isinstance(old.type, GpuArrayType):
            new = self.gpu_version(old, old.type.context_name)
            return specify_gpu_broadcastable_as(new, old.type)
        if _KINDS and _kind_of_device(old) is not None:
            return self.gpu_version(old, old.type.context_name)
        return _same_type(old, self.cpu_version(old))

    def run(self) -> None:
        for node in self.fgraph.toposort():
            self.visit(node)
        for i, old in enumerate(list(self.fgraph.outputs)):
            new = self.final(old)
            if new is not old:
                self.fgraph.change_node_input("output", i, new, reason="graph_to_gpu")


def _same_type(old: Variable, new: Variable) -> Variable:
    if new.type == old.type:
        return new
    converted = old.type.convert_variable(new)
    if converted is None:
        raise TypeError(f"graph_to_gpu: {new} ({new.type}) cannot stand for {old} ({old.type})")
    return converted


def _same_value(old: Variable, new: Variable, fn: Lifter) -> Variable:
    """Check a lifter's output against the CPU output it replaces (dtype and ndim)."""
    ot, nt = old.type, new.type
    if getattr(ot, "dtype", None) != getattr(nt, "dtype", None) or \
            getattr(ot, "ndim", None) != getattr(nt, "ndim", None):
        raise TypeError(f"the GPU lifter {getattr(fn, '__name__', fn)} replaced {old} ({ot}) "
                        f"by {new} ({nt}): dtype and ndim must match")
    return new


def lift_to_gpu(fgraph: FunctionGraph) -> None:
    """Move the graph to the GPU (see the module doc); then check `assert_no_cpu_op`."""
    for source in _LIFTER_SOURCES:
        source()
    has_target = default_context_active()
    if not has_target and not any(_on_device(v) for v in fgraph.variables):
        return
    _Sweep(fgraph, has_target).run()
    check_no_cpu_op(fgraph)


# ----------------------------------------------------------------------------- cancelling

@node_rewriter([GpuFromHost, HostFromGpu, GpuToGpu])
def local_cut_gpu_transfers(fgraph: FunctionGraph | None, node: Apply) -> list[Variable] | None:
    """GpuFromHost(HostFromGpu(x)) -> x (GpuToGpu across contexts),
    HostFromGpu(GpuFromHost(x)) -> x, GpuToGpu to x's own context -> x, chains collapsed."""
    op, x = node.op, node.inputs[0]
    src = x.owner
    if isinstance(op, GpuFromHost) and src is not None and isinstance(src.op, HostFromGpu):
        y = src.inputs[0]
        return [y if y.type.context_name == op.context_name else GpuToGpu(op.context_name)(y)]
    if isinstance(op, HostFromGpu) and src is not None:
        if isinstance(src.op, GpuFromHost):
            return [src.inputs[0]]
        if isinstance(src.op, GpuToGpu):
            return [HostFromGpu()(src.inputs[0])]
    if isinstance(op, GpuToGpu):
        if x.type.context_name == op.context_name:
            return [x]
        if src is not None and isinstance(src.op, GpuToGpu):
            y = src.inputs[0]
            return [y if y.type.context_name == op.context_name else GpuToGpu(op.context_name)(y)]
        if src is not None and isinstance(src.op, GpuFromHost):
            return [GpuFromHost(op.context_name)(src.inputs[0])]
    return None


@node_rewriter([GpuFromHost, HostFromGpu, GpuToGpu])
def local_cut_gpu_transfers_before_lifting(fgraph: FunctionGraph | None,
                                           node: Apply) -> list[Variable] | None:
    """The canonicalize-time cancelling: like `local_cut_gpu_transfers`, except that
    HostFromGpu(GpuFromHost(x)) stays until the lifting pass has read it: it is how an
    operator on `x.transfer('dev0')` says where its node should run."""
    if isinstance(node.op, HostFromGpu) and node.inputs[0].owner is not None and isinstance(
            node.inputs[0].owner.op, GpuFromHost):
        return None
    return local_cut_gpu_transfers.transform(fgraph, node)


@node_rewriter([GpuFromHost])
def local_fold_gpu_constant_upload(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuFromHost(constant) -> a GpuArrayConstant uploaded once at compile time: on real
    devices only, and never where a client would overwrite it in place."""
    if not isinstance(node.inputs[0], TensorConstant):
        return None
    out = node.outputs[0]
    for client, i in fgraph.clients.get(out, []):
        if client == "output":
            return None
        if any(i in ins for ins in getattr(client.op, "destroy_map", {}).values()):
            return None
    try:
        ctx = out.type.context
    except LookupError:
        return None
    if ctx.virtual:
        return None
    host = node.inputs[0].data
    return [GpuArrayConstant(out.type, to_gpu(host, ctx), host_data=host)]


def cut_gpu_transfers(fgraph: FunctionGraph) -> None:
    """Cancel transfer pairs in `fgraph` until none is left (what the passes do)."""
    EquilibriumRewriter([local_cut_gpu_transfers], name="gpu_transfer_cancel").apply(fgraph)


# ----------------------------------------------------------------------------- assert_no_cpu_op

class CpuOpError(AssertionError):
    """`assert_no_cpu_op=raise` and a function compiled for the GPU keeps float work on the
    CPU; `nodes` lists them."""

    def __init__(self, message: str, nodes: Sequence[Apply] = ()):
        super().__init__(message)
        self.nodes = list(nodes)


class CpuOpWarning(UserWarning):
    """`assert_no_cpu_op=warn`: a function compiled for the GPU keeps float work on the CPU."""


def cpu_nodes(fgraph: FunctionGraph) -> list[Apply]:
    """Nodes doing float work on the host: not a GPU op or a transfer, with a float host
    array (ndim > 0) among their inputs or outputs. Host scalar arithmetic (shape lengths,
    their casts, a mean's divisor) is cheap and is not reported, nor is an op that only
    checks a host value to choose a path (``host_check``: scan_to_dnn_rnn's PrefixMask)."""
    found = []
    for node in fgraph.toposort():
        # GPU ops, transfers, and shape reads (no transfer, no real CPU work) are not CPU work
        if (is_device_node(node) or isinstance(node.op, TRANSFER_OPS)
                or getattr(node.op, "shape_read", None) is not None
                or getattr(node.op, "host_check", False)):
            continue
        if any(isinstance(v.type, TensorType) and is_float(v.type.dtype)
               and v.type.ndim > 0 for v in node.inputs + node.outputs):
            found.append(node)
    return found


def _describe(node: Apply) -> str:
    trace = getattr(node.tag, "trace", None)
    where = f" (created at {trace[-1].filename}:{trace[-1].lineno})" if trace else ""
    return f"{node}{where}"


def check_no_cpu_op(fgraph: FunctionGraph, action: str | None = None) -> list[Apply]:
    """Act on `assert_no_cpu_op` (ignore/warn/raise/pdb) for a graph compiled for the GPU;
    returns the CPU nodes found."""
    action = action or config.assert_no_cpu_op
    if action == "ignore":
        return []
    nodes = cpu_nodes(fgraph)
    if not nodes:
        return nodes
    message = ("assert_no_cpu_op: a function compiled for the GPU keeps these nodes on the "
               "CPU (no GPU implementation is registered for them):\n  "
               + "\n  ".join(_describe(n) for n in nodes))
    if action == "warn":
        warnings.warn(message, CpuOpWarning, stacklevel=2)
    elif action == "raise":
        raise CpuOpError(message, nodes)
    elif action == "pdb":  # pragma: no cover - interactive
        import pdb
        pdb.set_trace()
    return nodes


# ----------------------------------------------------------------------------- test support

@contextlib.contextmanager
def virtual_context(name: str | None = None, device: str = "cuda0",
                    arch: str = "sm_90") -> Iterator[Any]:
    """Register a device-less context under `name` (None = the default one) for the block,
    so graphs compile for the GPU on a machine without one (they cannot run)."""
    previous = gpu_context.get_context(name) if name in gpu_context.context_names() else None
    ctx = gpu_context.register_context(name, device=device, arch=arch)
    try:
        yield ctx
    finally:
        if previous is not None:
            gpu_context.register_context(name, previous)
        else:
            gpu_context.unregister_context(name)


# ----------------------------------------------------------------------------- lifters

@register_lifter(_DimShuffle)
def _lift_dimshuffle(op, node, context_name, inputs):
    return [GpuDimShuffle(inputs[0].broadcastable, op.new_order)(inputs[0])]


@register_lifter(_Shape, _Shape_i)
def _lift_shape(op, node, context_name, inputs):
    if not inputs.was_on_gpu[0]:
        return None  # reading a host array's shape needs no upload
    x = inputs[0]
    if type(op) is Shape:
        return [GpuShape()(x)]
    return [GpuShape_i(op.i)(x)]


@register_lifter(_Reshape)
def _lift_reshape(op, node, context_name, inputs):
    if len(node.inputs) != 2 or not hasattr(op, "ndim"):
        return None
    return [GpuReshape(op.ndim).make_node(inputs[0], inputs.host(1),
                                          node.outputs[0].broadcastable).outputs[0]]


@register_lifter(_Alloc, eager=True)
def _lift_alloc(op, node, context_name, inputs):
    value = inputs[0] if inputs.was_on_gpu[0] else inputs.host(0)
    shape = [inputs.host(i) for i in range(1, len(node.inputs))]
    return [GpuAlloc(context_name).make_node(
        value, *shape, broadcastable=node.outputs[0].broadcastable).outputs[0]]


@register_lifter(_SpecifyBroadcastable)
def _lift_specify_broadcastable(op, node, context_name, inputs):
    return [GpuSpecifyBroadcastable(op.broadcastable)(inputs[0])]


@register_lifter(_Unbroadcast)
def _lift_unbroadcast(op, node, context_name, inputs):
    return [GpuUnbroadcast(op.axes)(inputs[0])]


# ----------------------------------------------------------------------------- registration

register_canonicalize(local_cut_gpu_transfers_before_lifting, "fast_run", "fast_compile", "gpu")
optdb.register("graph_to_gpu", lift_to_gpu, POSITIONS["gpu"], "fast_run", "fast_compile", "gpu")
optdb.register("gpu_transfer_cancel",
               EquilibriumRewriter([local_cut_gpu_transfers, local_fold_gpu_constant_upload],
                                   name="gpu_transfer_cancel"),
               POSITIONS["gpu_transfer_cancel"], "fast_run", "fast_compile", "gpu")


# ----------------------------------------------------------------------------- shapes on the GPU

@register_lifter(_SpecifyShape)
def _lift_specify_shape(op, node, context_name, inputs):
    if not inputs.was_on_gpu[0]:
        return None  # a host value is checked where it is
    return [op(inputs[0], *[inputs.host(i) for i in range(1, len(node.inputs))])]


def _gpu_shape_i(var: Variable, d: int) -> Variable:
    return GpuShape_i(d)(var)


def _register_shape_reads() -> None:
    """GpuShape/GpuShape_i of a computed GPU value rewrite as the host reads do (from the
    ops' infer_shape); a GPU variable's dims are read with GpuShape_i (no transfer). The pass
    runs right after the lifting, which is where GPU shape reads appear."""
    register_shape_reader(GpuArrayType, _gpu_shape_i)
    local_gpu_shape_infer = node_rewriter([GpuShape, GpuShape_i, Shape, Shape_i])(rewrite_shape_read)
    local_gpu_shape_infer.name = local_gpu_shape_infer.__name__ = "local_gpu_shape_infer"
    sweep = EquilibriumRewriter([local_gpu_shape_infer, local_shape_to_shape_i,
                                 local_subtensor_of_make_vector], name="gpu_shape_infer")

    def gpu_shape_infer(fgraph: FunctionGraph) -> None:
        if not any(type(n.op) in (GpuShape, GpuShape_i) for n in fgraph.apply_nodes):
            return
        # a second sweep sees reads whose value lost its last real client in the first
        if sweep.apply(fgraph):
            sweep.apply(fgraph)
    optdb.register("gpu_shape_infer", gpu_shape_infer, POSITIONS["gpu"] + 1, "fast_run", "gpu",
                   "shape")


_register_shape_reads()
