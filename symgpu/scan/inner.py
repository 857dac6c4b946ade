"""Inner-graph machinery shared by Scan and IfElse.

An op that runs a graph of its own (a loop body, a branch) keeps it as a `FunctionGraph` that
gets the same rewrite passes as any compiled function (so a later GPU placement pass can lift
it), and runs it through the VM directly on its storage cells: one call costs the thunks, not
the argument checks of `Function.__call__`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from symgpu.compile.function import clone_replace
from symgpu.compile.mode import get_mode
from symgpu.graph.basic import Constant, Variable, ancestors, io_toposort
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op

__all__ = ["InnerFunction", "hoist_invariants", "clone_with", "inner_mode_pass"]


def clone_with(outputs: Sequence[Variable], replace: dict[Variable, Variable]) -> list[Variable]:
    """Copies of `outputs` with the keys of `replace` (free or computed) replaced."""
    return clone_replace(list(outputs), dict(replace))


class InnerFunction:
    """A graph `inputs -> outputs` compiled once with a mode, callable on a list of values.

    `fgraph` is the graph before compilation (what printing and rewrites of the outer graph
    see); `compiled_fgraph` the rewritten one, after the first `compile()`.
    """

    def __init__(self, inputs: Sequence[Variable], outputs: Sequence[Variable], mode: Any = None,
                 name: str = "inner graph"):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.mode = mode
        self.name = name
        self.fgraph = FunctionGraph(self.inputs, self.outputs, clone=True)
        self.compiled_fgraph: FunctionGraph | None = None
        self.vm = None
        #: held while a call uses the cells: one compiled function may run in several threads
        self.lock = threading.RLock()

    def compile(self) -> None:
        """Rewrite a copy of the inner graph with the mode's passes and link it (once)."""
        if self.vm is not None:
            return
        with self.lock:
            if self.vm is None:
                self._compile()

    def rewritten(self) -> FunctionGraph:
        """The inner graph after the mode's passes, before linking: what `compile()` links.
        Rewriting early lets the outer function's kernel prefetch (symgpu/gpu/exec/prefetch.py)
        compile the body's kernels in the same parallel batch as its own."""
        with self.lock:
            if self.compiled_fgraph is not None:
                return self.compiled_fgraph
            fg = self.__dict__.get("_rewritten")
            if fg is None:
                fg = self.fgraph.clone()
                get_mode(self.mode).rewrite(fg)
                self._rewritten = fg
            return fg

    def _compile(self) -> None:
        mode = get_mode(self.mode)
        fg = self.rewritten()
        self.__dict__.pop("_rewritten", None)
        storage_map: dict[Variable, list] = {}
        self.input_cells = []
        for v in fg.inputs:
            cell = [None]
            storage_map[v] = cell
            self.input_cells.append(cell)
        self.vm = mode.link(fg, storage_map)
        self.output_cells = [storage_map[v] for v in fg.outputs]
        inputs = set(fg.inputs)
        # computed outputs are emptied after reading so no thunk writes into an array we keep
        self.clear_cells = [storage_map[v] for v in set(fg.outputs)
                            if v.owner is not None and v not in inputs]
        self.compiled_fgraph = fg
        vm = self.vm
        # VM.dispatch: the thunks' straight line itself while nothing wraps them (no profiler,
        # a VM class that runs as VM does, not DebugMode's); the VM while a runner is set (it
        # calls the runner)
        self._run = vm.dispatch if vm.runner is None else vm

    def free(self) -> None:
        """Empty the compiled body's intermediate cells (Function.free: with allow_gc off
        they keep the last call's arrays)."""
        if self.vm is not None:
            with self.lock:
                self.vm.clear_intermediates()

    def run(self) -> None:
        """Run the thunks on whatever the input cells hold."""
        self._run()

    def __call__(self, *values: Any) -> list:
        self.compile()
        with self.lock:
            for cell, v in zip(self.input_cells, values):
                cell[0] = v
            try:
                self._run()
                out = [c[0] for c in self.output_cells]
            finally:
                for c in self.clear_cells:
                    c[0] = None
                for cell in self.input_cells:
                    cell[0] = None
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("vm", "_run", "input_cells", "output_cells", "clear_cells", "compiled_fgraph",
                  "lock", "_rewritten", "_direct_outputs"):
            state.pop(k, None)
        state["vm"] = None
        state["compiled_fgraph"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()


def variant_set(outputs: Sequence[Variable], sources: Sequence[Variable]) -> set[Variable]:
    """Variables (between the graph's free inputs and `outputs`) computed from `sources`."""
    dep = set(sources)
    for node in io_toposort(set(), list(outputs)):
        if any(v in dep for v in node.inputs):
            dep.update(node.outputs)
    return dep


def hoist_invariants(outputs: Sequence[Variable], variant_sources: Sequence[Variable],
                     inner_to_outer: dict[Variable, Variable], allowed: Sequence[Variable] = ()
                     ) -> tuple[list[Variable], list[tuple[Variable, Variable]], list[Variable]]:
    """Split an inner graph at the loop-invariant frontier.

    Everything in `outputs`' graph that does not depend on `variant_sources` (closures over
    outer variables, shared variables, work on non-sequences only) is computed once outside:
    it becomes an explicit input of the inner graph. `inner_to_outer` maps inner placeholders
    (non-sequences) to the outer values they stand for.

    Returns (new inner outputs, [(inner placeholder, outer value)], free outer variables that
    reached the frontier without being placeholders or `allowed`: closures)."""
    outputs = list(outputs)
    variant = variant_set(outputs, variant_sources)
    frontier: list[Variable] = []
    seen: set[Variable] = set()

    # expressions of constants only (``dimshuffle(0.0)``, a gradient's fills) stay inside,
    # where constant folding and the rewrites that look for constants see them: one pass
    constant_only: set[Variable] = set()
    for node in io_toposort([], outputs):
        if node.inputs and all(isinstance(i, Constant) or i in constant_only
                               for i in node.inputs):
            constant_only.update(node.outputs)

    def add(v: Variable) -> None:
        if v in variant or v in seen or isinstance(v, Constant) or v in constant_only:
            return
        seen.add(v)
        frontier.append(v)

    for node in io_toposort(set(variant_sources), outputs):
        if any(o in variant for o in node.outputs):
            for v in node.inputs:
                add(v)
    for o in outputs:
        add(o)
    stop = set(inner_to_outer) | set(allowed)
    closures = [v for v in ancestors(frontier, blockers=stop)
                if v not in stop and v.owner is None and not isinstance(v, Constant)]
    # outer values: the frontier with placeholders replaced by the outer variables
    direct = [v for v in frontier if v in inner_to_outer]
    computed = [v for v in frontier if v not in inner_to_outer]
    outer_computed = clone_with(computed, inner_to_outer) if computed else []
    pairs: list[tuple[Variable, Variable]] = [(v, inner_to_outer[v]) for v in direct]
    replace: dict[Variable, Variable] = {}
    for v, ov in zip(computed, outer_computed):
        ph = v.type(v.name)
        replace[v] = ph
        pairs.append((ph, ov))
    new_outputs = clone_with(outputs, replace) if replace else outputs
    return new_outputs, pairs, closures


def inner_mode_pass(op_type: type[Op], with_mode: Callable[[Any, str], Op], mode: str
                    ) -> Callable[[FunctionGraph], None]:
    """A pass that gives every `op_type` node built without ``mode=`` (a loop, a branch) a copy
    of its op for the outer function's `mode` (``with_mode(op, mode)``), so its inner graphs
    are rewritten and compiled like the function around them. One copy per op and mode: each
    inner graph is compiled once per mode. scan/rewriting.py and ifelse.py register one each."""
    def set_inner_mode(fgraph: FunctionGraph) -> None:
        for node in list(fgraph.toposort()):
            op = node.op
            if isinstance(op, op_type) and op.mode is None:
                new = _mode_copy(op, mode, with_mode)
                outs = new.make_node(*node.inputs).outputs
                for o, n in zip(node.outputs, outs):
                    fgraph.replace(o, n, reason="scan_inner_mode")
    set_inner_mode.__name__ = f"{op_type.__name__.lower()}_inner_mode_{mode.lower()}"
    return set_inner_mode


def _mode_copy(op: Op, mode: str, with_mode: Callable[[Any, str], Op]) -> Op:
    cache = op.__dict__.setdefault("_mode_copies", {})
    if mode not in cache:
        new = with_mode(op, mode)
        new.__dict__["_mode_copies"] = cache
        cache[mode] = new
    return cache[mode]
