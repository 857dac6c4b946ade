"""`symgpu.explain(f)`: what will cost a user time on every call of a compiled function.

Why a report of its own: the profiler says where time went after the fact; this says, from the
compiled graph alone and before any call, which per-call costs the graph carries — host<->device
transfers and the stream synchronisations they force, ops left on the CPU in a GPU function,
float64 work, and whether calls can replay a CUDA graph or run node by node, and why.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from symgpu.compile import devices
from symgpu.compile.function import _device_input_filter
from symgpu.config import config
from symgpu.graph.basic import ancestors
from symgpu.graph.sharedvalue import SharedVariable
from symgpu.tensor.elemwise import Elemwise

__all__ = ["explain", "Explanation"]


@dataclass
class Explanation:
    """The findings of :func:`explain`; ``str()`` gives the report."""

    name: str
    contexts: list = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)
    downloads: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    cpu_ops: list[str] = field(default_factory=list)
    float64: list[str] = field(default_factory=list)
    graphs: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return bool(self.contexts)

    @property
    def syncs_per_call(self) -> int:
        """Stream synchronisations a call makes at least (downloads of one batch share one)."""
        return len(self.syncs)

    def __str__(self) -> str:
        names = ["the default GPU context" if c is None else f"GPU context {c!r}"
                 for c in self.contexts]
        where = ", ".join(names) if self.on_gpu else "the CPU (no GPU value in the graph)"
        lines = [f"symgpu.explain: {self.name} runs on {where}"]

        def section(title: str, items: list[str], empty: str) -> None:
            lines.append(f"{title}: {len(items) if items else empty}")
            lines.extend(f"  - {item}" for item in items)

        if self.on_gpu:
            section("host->device transfers per call", self.uploads, "none")
            section("device->host transfers per call", self.downloads, "none")
            section("stream synchronisations per call", self.syncs,
                    "none (the call returns without waiting for the GPU)")
            section("ops left on the CPU", self.cpu_ops, "none")
        section("float64 nodes", self.float64, "none")
        if self.on_gpu:
            lines.append("CUDA graphs:")
            lines.extend(f"  - {g}" for g in self.graphs)
        return "\n".join(lines)


def _describe(var: Any) -> str:
    name = getattr(var, "name", None)
    if name:
        return repr(name)
    owner = getattr(var, "owner", None)
    return f"the output of {owner.op}" if owner is not None else str(var)


_is_gpu = devices.is_device_var
_is_gpu_node = devices.is_device_node


def _shape_work(node: Any) -> bool:
    """Host arithmetic on shapes and integer scalars: cheap, and expected on the host."""
    if getattr(node.op, "reads_only_shape", False):
        return True
    return all(v.ndim == 0 and v.dtype.startswith(("int", "uint")) for v in node.outputs)


def explain(f: Any, file: TextIO | None = sys.stdout) -> Explanation:
    """Report the per-call costs of the compiled function `f` (printed to `file`, None for
    no printing) and return them as an :class:`Explanation`."""
    fgraph = f.maker.fgraph
    nodes = fgraph.toposort()
    report = Explanation(name=f"function {f.name!r}" if getattr(f, "name", None) else "the function")
    report.contexts = sorted({v.type.context_name for n in nodes for v in n.outputs + n.inputs
                              if _is_gpu(v)}, key=str)
    inputs = set(fgraph.inputs)
    passed = _device_arrays_passed(f)
    n_final = 0
    for node in nodes:
        kind = devices.transfer_kind(node.op)
        if kind == "upload":
            src = node.inputs[0]
            origin = "an input" if src in inputs else "a CPU op's result"
            note = passed.get(node)
            report.uploads.append(f"{_describe(src)} ({origin}, {src.type}"
                                  + (f"; a GPU array passed for it {note}" if note else "")
                                  + ")")
        elif kind == "download":
            src = node.inputs[0]
            report.downloads.append(f"{_describe(src)} ({src.type})")
            readers = [c for c, _ in fgraph.clients.get(node.outputs[0], ()) if c != "output"]
            if readers:   # a round trip in the middle of the call: the host waits for it
                report.syncs.append(f"{_describe(src)} is copied to the host for "
                                    f"{', '.join(sorted({str(c.op) for c in readers}))}")
            else:
                n_final += 1
        elif report.on_gpu and not _is_gpu_node(node) and not _shape_work(node):
            report.cpu_ops.append(f"{node.op} (no GPU implementation for these inputs: "
                                  f"{', '.join(str(v.type) for v in node.inputs)})")
        why = getattr(node.op, "host_sync", None)
        if why:
            report.syncs.append(f"{node.op} {why}")
        if any(getattr(v, "dtype", None) == "float64" for v in node.outputs) and \
                (report.on_gpu or isinstance(node.op, Elemwise)):
            report.float64.append(f"{node.op} -> float64"
                                  + (" (float64 is many times slower on most GPUs)"
                                     if _is_gpu_node(node) else ""))
    if n_final:
        report.syncs.insert(0, f"the {n_final} result(s) copied to the host at the end "
                               "(batched into one wait)")
    if report.on_gpu:
        report.graphs = _graph_status(f, nodes, passed)
    if file is not None:
        print(report, file=file)
    return report


def _device_arrays_passed(f: Any) -> dict:
    """What a call does with a GPU array passed for a host input (compile/function.py takes
    one there when the input's only reader is its upload): upload node -> how it is read.
    It is used as it is when the upload's thunk may borrow it (decided when the function was
    linked: graph_plan.mark_reusable_outputs), else copied on the device."""
    vm = getattr(f, "vm", None)
    if vm is None:
        return {}
    fgraph = f.maker.fgraph
    inputs = set(fgraph.inputs)
    out = {}
    for node, thunk in zip(getattr(vm, "nodes", ()), getattr(vm, "thunks", ())):
        src = node.inputs[0] if node.inputs else None
        if devices.transfer_kind(node.op) != "upload" or src not in inputs or \
                isinstance(src, SharedVariable) or _device_input_filter(src, fgraph) is None:
            continue
        if getattr(thunk, "may_borrow", False):
            out[node] = "is read where it is, not copied"
        else:
            why = "a node writes into the upload or it leaves the call" \
                if hasattr(thunk, "may_borrow") else "it is a one-element value"
            out[node] = f"is copied on the device, as {why}"
    return out


def _graph_status(f: Any, nodes: list, passed: dict | None = None) -> list[str]:
    """Whether calls replay CUDA graphs, what splits them, what re-captures them."""
    if not config.gpuarray.cuda_graphs:
        return ["off (flag gpuarray.cuda_graphs=False): every node launches from Python"]
    vm = getattr(f, "vm", None)
    if vm is None:
        return ["unknown (the function has no VM)"]
    if getattr(vm, "profiler", None) is not None:
        return ["not used: profiled functions run node by node"]
    runner = getattr(vm, "runner", None)
    if runner is None or not hasattr(runner, "segments"):
        return ["not used: no run of capturable GPU nodes (transfers and CPU ops only, "
                "or GPU values on more than one context)"]
    if not getattr(runner, "enabled", True):
        return [f"turned off for this function: {runner.disabled_reason}"]
    out = []
    segments = [s for s in runner.segments]
    out.append(f"{len(segments)} captured segment(s); the first call with a new key (input "
               "shapes, shared variables' buffers, host values that are not graph parameters) "
               "runs plainly, a repeat captures, later repeats replay")
    breaking = [n for n, t in zip(vm.nodes, vm.thunks) if not devices.node_capturable(n, t)
                and devices.transfer_kind(n.op) != "download" and _is_gpu_node(n)]
    for n in breaking:
        why = getattr(n.op, "host_sync", None) or "not capturable"
        what = str(n.op)
        note = (passed or {}).get(n)
        if note is not None:   # an input's upload: a host array goes up, a GPU array...
            what = f"{n.op} of {_describe(n.inputs[0])}"
            why = f"{why}: uploads a host array; a GPU array passed {note}"
        out.append(f"runs plainly between segments: {what} ({why})")
    keyed = [v for v in f.maker.fgraph.inputs
             if not _is_gpu(v) and getattr(v, "ndim", None) == 0
             and any(_is_gpu_node(c) for c, _ in f.maker.fgraph.clients.get(v, ())
                     if c != "output")]
    by_value = [w for s in segments for w in getattr(s, "keyed_host_vars", ())]
    as_param = [w for s in segments for w in getattr(s, "param_vars", ())]
    feeds_key = set(ancestors(by_value)) if by_value else set()
    feeds_params = set(ancestors(as_param)) if as_param else set()
    for v in keyed:
        if v in feeds_key:
            out.append(f"host scalar {_describe(v)} is part of the graph key: each new value "
                       "runs plainly once, then captures a graph of its own")
        elif v in feeds_params:
            out.append(f"host scalar {_describe(v)} is a graph parameter: each call writes it "
                       "to the graph's parameter block, every value replays the same graph "
                       "(values that change a shape still key graphs)")
    return out
