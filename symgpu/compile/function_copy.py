"""`Function.copy`: the same compiled graph as a new function, optionally on other shared
variables (`swap`), without updates, or sharing intermediate storage (Theano's semantics)."""
from __future__ import annotations

from typing import Any

from symgpu.compile.profiling import attach_profile
from symgpu.graph.sharedvalue import SharedVariable
from symgpu.graph.basic import clone_graph
from symgpu.graph.fg import FunctionGraph

__all__ = ["copy_function"]


def _check_swap(fn: Any, swap: dict) -> None:
    used = fn.maker.shared_vars
    for old, new in swap.items():
        if not isinstance(old, SharedVariable):
            raise TypeError(f"swap: keys must be shared variables, got {type(old).__name__} {old!r}")
        if not isinstance(new, SharedVariable):
            raise TypeError(f"swap: the replacement for {old} must be a shared variable, got "
                            f"{type(new).__name__} {new!r}")
        if not any(old is s for s in used):
            raise ValueError(f"swap: shared variable {old} is not used by {fn._label()} "
                             f"(it uses: {', '.join(map(str, used)) or 'none'})")
        if new.type != old.type:
            raise TypeError(f"swap: {new} has type {new.type} but {old} has type {old.type}; "
                            "the replacement must have the same type")


def copy_function(fn: Any, share_memory: bool = False, swap: dict | None = None,
                  delete_updates: bool = False, name: str | None = None,
                  profile: Any = None) -> Any:
    """A copy of `fn` with its own graph and frames (see `Function.copy`).

    * Without `swap`, the copy reads and updates the same shared variables as `fn`; `swap`
      ({old shared variable: new one of the same type}) makes the copy use the new ones.
    * `delete_updates=True`: the copy computes the outputs and updates nothing.
    * `share_memory=True`: the copy's first frame reuses `fn`'s intermediate cells (not its
      input and output cells), saving memory; the two then never run in those cells at the
      same time (the copy's frame is guarded by the original's guard too; a contended call
      takes a spare frame).
    * `name` defaults to `fn`'s name + " copy"; `profile` as for `function()`.
    """
    swap = dict(swap or {})
    _check_swap(fn, swap)
    maker = fn.maker
    fg = maker.fgraph
    n_out = len(maker.outputs)
    n_explicit = len(maker.inputs)
    outputs = fg.outputs[:n_out] if delete_updates else fg.outputs
    memo: dict = {}
    shared_vars = []
    for k, sv in enumerate(maker.shared_vars):
        new = next((v for old, v in swap.items() if old is sv), None)
        if new is not None:
            memo[fg.inputs[n_explicit + k]] = new.clone()  # a clone shares the container
        shared_vars.append(new if new is not None else sv)
    ins, outs, memo = clone_graph(fg.inputs, outputs, memo=memo, copy_inputs=True)
    mapping = {} if delete_updates else dict(fg.update_mapping)
    new_fg = FunctionGraph(ins, outs, clone=False, update_mapping=mapping)
    updates = [] if delete_updates else [
        (shared_vars[next(k for k, s in enumerate(maker.shared_vars) if s is sv)], j)
        for sv, j in maker.updates]
    share, guard = None, ()
    if share_memory:
        ends = set(fg.inputs) | set(fg.outputs)
        share = {memo[v]: cell for v, cell in fn._frame.storage_map.items()
                 if v not in ends and v in memo}
        guard = fn._frame.guard
    new_maker = type(maker)(new_fg, maker.mode, list(maker.inputs), list(maker.outputs),
                              0.0, 0.0, {}, shared_vars, updates, maker.single,
                              maker.allow_input_downcast)
    if not swap and not delete_updates:      # the same graph: a failed guard recompiles it
        new_maker.source = getattr(maker, "source", None)
    if name is None and fn.name:
        name = fn.name + " copy"
    copy = type(fn)(new_maker, name, share, guard)
    copy.trust_input = fn.trust_input
    attach_profile(copy, profile)
    return copy
