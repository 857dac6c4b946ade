"""The VM: runs a function's thunks in order over storage cells, with errors a user can act on.

Each variable of the graph owns one storage cell (a one-element list). Thunks read their
inputs' cells and write their outputs' cells. With `allow_gc`, a cell is emptied right after
its last reader ran, so intermediates do not outlive their use.
"""
from __future__ import annotations

import io
from typing import Any, Callable, Sequence

from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.link.order import hinted_order

__all__ = ["VM", "link", "describe_failure", "VM_HOOKS", "LINK_HOOKS"]

#: callables(vm) run on every new VM; a backend may set ``vm.runner``, a zero-argument
#: callable that then runs the thunks instead of the loop below (symgpu/gpu/exec/graphs.py uses it
#: for CUDA graphs).  The profiler's hook (``vm.profiler``) takes precedence over a runner.
VM_HOOKS: list[Callable[["VM"], None]] = []

#: callables(fgraph, nodes) run by `link` before it makes any thunk (``nodes`` in run order):
#: a backend may prepare what the thunks will need, e.g. compile their kernels in parallel
#: (symgpu/gpu/exec/prefetch.py).  A hook that fails only warns; the thunks then do the work.
LINK_HOOKS: list[Callable[[FunctionGraph, list[Apply]], None]] = []

#: ``debugprint(outputs, file=...)`` for failure reports at exception_verbosity=high;
#: symgpu.printing (a layer above this one) installs it when imported
GRAPH_PRINTER: list[Callable[..., None]] = []


class VM:
    """Callable that runs the thunks once; `thunks[i]` computes `nodes[i]`."""

    def __init__(self, fgraph: FunctionGraph, nodes: list[Apply], thunks: list[Callable[[], None]],
                 storage_map: dict[Variable, list], gc_after: list[list[list]] | None):
        self.fgraph = fgraph
        self.nodes = nodes
        self.thunks = thunks
        self.storage_map = storage_map
        self.gc_after = gc_after
        #: the thunks and cell clearing as straight-line code (no loop, no per-node unpacking)
        self.run_thunks = _straight_line(self)
        #: namespaces of generated call code whose `run` is kept equal to `dispatch` (route)
        self._routes: list[dict] = []
        self._profiler = None
        self._runner = None
        for hook in VM_HOOKS:
            try:
                hook(self)
            except Exception as exc:  # a backend's optimisation must never break linking
                import warnings
                warnings.warn(f"VM hook {getattr(hook, '__qualname__', hook)} failed "
                              f"({type(exc).__name__}: {exc}); running the plain VM",
                              RuntimeWarning, stacklevel=2)
                self.runner = None

    @property
    def profiler(self) -> Callable[["VM"], None] | None:
        """Set by the profiler: a callable(vm) that runs and times the thunks instead."""
        return self._profiler

    @profiler.setter
    def profiler(self, value: Callable[["VM"], None] | None) -> None:
        self._profiler = value
        self._reroute()

    @property
    def runner(self) -> Callable[[], None] | None:
        """Set by a VM hook (VM_HOOKS), or by MonitorMode (compile/monitormode.py) to call its
        pre/post functions around each node: a callable() that runs the thunks instead."""
        return self._runner

    @runner.setter
    def runner(self, value: Callable[[], None] | None) -> None:
        self._runner = value
        self._reroute()

    @property
    def dispatch(self) -> Callable[[], None]:
        """What one run of this VM calls: `run_thunks` itself while no profiler or runner is
        set; the runner itself, or its ``entry`` (a shorter path it may offer), while only a
        runner is (a GPU function's: one call less per call), when the class runs as VM
        does; else the VM (its `__call__` dispatches)."""
        if self._profiler is None and type(self).__call__ is VM.__call__:
            if self._runner is None:
                return self.run_thunks
            return getattr(self._runner, "entry", self._runner)
        return self

    def route(self, namespace: dict) -> None:
        """Keep `namespace["run"]` equal to `dispatch` from now on, and `namespace["plain"]`
        True while that is `run_thunks`: generated call code (compile/frames.py) runs the
        thunks' straight line itself while `plain`, else calls `run`, without looking for a
        profiler or runner on every call."""
        self._routes.append(namespace)
        self._reroute()

    def _reroute(self) -> None:
        run = self.dispatch
        for namespace in self._routes:
            namespace["run"], namespace["plain"] = run, run is self.run_thunks

    def __call__(self) -> None:
        if self.profiler is not None:
            self.profiler(self)
            return
        if self.runner is not None:
            self.runner()
            return
        self.run_thunks()

    def clear_intermediates(self) -> None:
        """Empty every cell that is not an input or a constant (after an error)."""
        inputs = set(self.fgraph.inputs)
        for var, cell in self.storage_map.items():
            if var not in inputs and not isinstance(var, Constant):
                cell[0] = None

    def raise_with_node_info(self, index: int, exc: BaseException) -> None:
        """Re-raise `exc` (same class where possible) with the failing node described."""
        node = self.nodes[index]
        message = f"{exc}\n{describe_failure(node, self.storage_map, index, self.fgraph)}"
        self.clear_intermediates()
        try:
            new = type(exc)(message)
        except Exception:  # exception classes with unusual constructors
            new = RuntimeError(message)
        new.__dict__.update(getattr(exc, "__dict__", {}))
        new.node = node
        raise new.with_traceback(exc.__traceback__) from exc


def straight_line(vm: VM, ns: dict[str, Any], indent: str) -> list[str]:
    """Source lines (at `indent`) that call each thunk in turn and empty the cells of values
    read for the last time (with allow_gc), noting the index so an error names the failing
    node; the names they use (t<i>, d<i>_<j>, fail, i, exc) are put in `ns`. What a loop
    over (thunk, dead cells) does, a few tenths of a microsecond a node faster: the body of
    `run_thunks`, and of a Function's generated call (compile/frames.py), which runs it
    without calling `run_thunks`."""
    ns["fail"] = vm.raise_with_node_info
    if not vm.thunks:
        return [f"{indent}pass"]
    lines = [f"{indent}try:"]  # each thunk's `i = ...` comes first: set when read
    for i, thunk in enumerate(vm.thunks):
        ns[f"t{i}"] = thunk
        lines.append(f"{indent}    i = {i}")
        lines.append(f"{indent}    t{i}()")
        for j, cell in enumerate(vm.gc_after[i] if vm.gc_after is not None else ()):
            ns[f"d{i}_{j}"] = cell
            lines.append(f"{indent}    d{i}_{j}[0] = None")
    lines += [f"{indent}except Exception as exc:", f"{indent}    fail(i, exc)"]
    return lines


def _straight_line(vm: VM) -> Callable[[], None]:
    ns: dict[str, Any] = {}
    lines = ["def run():"] + straight_line(vm, ns, "    ")
    exec(compile("\n".join(lines), "<symgpu VM>", "exec"), ns)
    return ns["run"]


def _value_info(value: Any) -> tuple[str, str, str]:
    if value is None:
        return "(not computed)", "", ""
    shape = getattr(value, "shape", None)
    strides = getattr(value, "strides", None)
    return str(tuple(shape) if shape is not None else "scalar"), str(strides), str(getattr(value, "dtype", type(value).__name__))


def describe_failure(node: Apply, storage_map: dict, index: int | None = None,
                     fgraph: FunctionGraph | None = None) -> str:
    """The node, its inputs' types, shapes and strides, and the user's line that built it."""
    lines = [f"Apply node that caused the error: {node}"]
    if index is not None:
        lines.append(f"Toposort index: {index}")
    lines.append("Inputs types: [" + ", ".join(str(v.type) for v in node.inputs) + "]")
    infos = [_value_info(storage_map.get(v, [None])[0]) for v in node.inputs]
    lines.append("Inputs shapes: [" + ", ".join(i[0] for i in infos) + "]")
    lines.append("Inputs strides: [" + ", ".join(i[1] for i in infos) + "]")
    lines.append("Inputs dtypes: [" + ", ".join(i[2] for i in infos) + "]")
    trace = getattr(node.tag, "trace", None) or []
    if trace:
        lines.append("The node was created at (the last frames of your code):")
        for frame in trace[-3:]:
            lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
            if frame.line:
                lines.append(f"    {frame.line}")
    else:
        lines.append("The node has no recorded creation trace.")
    if config.exception_verbosity == "high" and fgraph is not None and GRAPH_PRINTER:
        buf = io.StringIO()
        GRAPH_PRINTER[0](node.outputs, file=buf)
        lines.append("The node and what feeds it:")
        lines.append(buf.getvalue().rstrip())
    else:
        lines.append("Use exception_verbosity=high to see the graph around this node.")
    return "\n".join(lines)


def link(fgraph: FunctionGraph, storage_map: dict[Variable, list] | None = None,
         allow_gc: bool | None = None, keep: Sequence[Variable] = ()) -> VM:
    """Make a cell per variable and a thunk per node; returns the VM.

    Cells already in `storage_map` (inputs, shared values) are used as they are. Variables
    in `keep` (outputs) are never garbage-collected by the VM.
    """
    storage_map = {} if storage_map is None else storage_map
    allow_gc = config.allow_gc if allow_gc is None else allow_gc
    nodes = hinted_order(fgraph.toposort())   # collectives early, their joins late
    for var in fgraph.variables:
        if var not in storage_map:
            storage_map[var] = [var.data if isinstance(var, Constant) else None]
    compute_map = {v: [v.owner is None] for v in storage_map}
    for hook in LINK_HOOKS:
        try:
            hook(fgraph, nodes)
        except Exception as exc:  # preparation only: the thunks below still do the work
            import warnings
            warnings.warn(f"link hook {getattr(hook, '__qualname__', hook)} failed "
                          f"({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=2)
    thunks = []
    for node in nodes:
        node.op.prepare_node(node, storage_map, compute_map, None)
        thunks.append(node.op.make_thunk(node, storage_map, compute_map, []))
    gc_after = None
    if allow_gc:
        protected = set(fgraph.inputs) | set(fgraph.outputs) | set(keep)
        last_use: dict[Variable, int] = {}
        for i, node in enumerate(nodes):
            for v in node.inputs:
                last_use[v] = i
            for v in node.outputs:
                last_use.setdefault(v, i)
        gc_after = [[] for _ in nodes]
        for v, i in last_use.items():
            if v not in protected and v.owner is not None:
                gc_after[i].append(storage_map[v])
    return VM(fgraph, nodes, thunks, storage_map, gc_after)
