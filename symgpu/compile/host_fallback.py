"""Loading a GPU-compiled function where its GPU is not in use: recompile its graph for the host.

Why: a model trained and pickled on the GPU machine must load on a laptop (Theano's
``unpickle_gpu_on_cpu``). Its shared values already come back as host values (the GPU type's
``value_from_pickle``), but the compiled graph is made of GPU ops that cannot run there. So a
function compiled while a GPU could be involved keeps the graph it was given, before any
rewriting (``keep_source``, a clone: rewriting works in place), and loading it without that
GPU compiles that source again with the host's rewrites: GPU-typed inputs become host inputs
of the same dtype and pattern, GPU-typed results come back as host arrays.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.compile import devices
from symgpu.compile.io import In
from symgpu.config import config
from symgpu.graph.basic import Variable, io_toposort
from symgpu.graph.fg import FunctionGraph

__all__ = ["keep_source", "recompile_on_host", "compile_source"]


def _is_gpu(var: Variable) -> bool:
    return devices.is_device_var(var) and hasattr(var.type, "tensor_type")


def _gpu_may_be_involved(fgraph: FunctionGraph) -> bool:
    if config.device != "cpu" or any(_is_gpu(v) for v in fgraph.inputs):
        return True
    return bool(devices.contexts_in_use())


def keep_source(fgraph: FunctionGraph) -> tuple[list, list] | None:
    """(inputs, outputs) of a clone of the not-yet-rewritten `fgraph` when a GPU may take
    part in compiling it, else None (nothing to fall back from)."""
    if not _gpu_may_be_involved(fgraph):
        return None
    clone = FunctionGraph(fgraph.inputs, fgraph.outputs, clone=True)
    return list(clone.inputs), list(clone.outputs)


def _host_graph(inputs: list, outputs: list) -> tuple[list, list]:
    """The graph with every GPU-typed variable made a host one: GPU inputs become host
    inputs of the same dtype and pattern, transfers disappear, other nodes are rebuilt on
    their host inputs (a GPU op written explicitly into the graph cannot be, and says so)."""
    memo: dict = {}
    host_inputs = []
    for v in inputs:
        h = v.type.tensor_type()(v.name) if _is_gpu(v) else v
        memo[v] = h
        host_inputs.append(h)
    for node in io_toposort(inputs, outputs):
        new_inputs = [memo.get(v, v) for v in node.inputs]
        if devices.transfer_kind(node.op) is not None:
            memo[node.outputs[0]] = new_inputs[0]
            continue
        if devices.is_device_node(node):
            raise RuntimeError(f"cannot compile {node.op} for the host: the graph was built "
                               "with this GPU op explicitly; rebuild it with host ops")
        if all(a is b for a, b in zip(new_inputs, node.inputs)):
            continue
        new = node.clone_with_new_inputs(new_inputs)
        memo.update(zip(node.outputs, new.outputs))
    return host_inputs, [memo.get(o, o) for o in outputs]


def compile_source(maker: Any, inputs: list, outputs: list, mode: Any,
                   ins: Callable[[FunctionGraph], list] | None = None) -> Any:
    """A FunctionMaker like `maker` (its outputs, shared variables, updates) for the graph
    (`inputs`, `outputs`), a version of its source, rewritten by `mode`; `ins(fgraph)` its
    In inputs (default `maker`'s). It keeps `maker`'s source, to compile from again."""
    fgraph = FunctionGraph(inputs, outputs, clone=True)
    fgraph.update_mapping = dict(maker.fgraph.update_mapping)
    pass_times = mode.rewrite(fgraph)
    new = type(maker)(fgraph, mode, maker.inputs if ins is None else ins(fgraph),
                      maker.outputs, 0.0, 0.0, pass_times, maker.shared_vars, maker.updates,
                      maker.single, maker.allow_input_downcast)
    new.source = maker.source
    return new


def recompile_on_host(maker: Any) -> Any:
    """A FunctionMaker for the host, compiled from `maker.source` with `maker`'s mode."""
    def host_ins(fgraph: FunctionGraph) -> list:
        return [In(fgraph.inputs[k], name=i.name, value=i.value, mutable=i.mutable,
                   strict=i.strict, allow_downcast=i.allow_downcast, borrow=i.borrow)
                if _is_gpu(i.variable) else i for k, i in enumerate(maker.inputs)]
    return compile_source(maker, *_host_graph(*maker.source), maker.mode, host_ins)
