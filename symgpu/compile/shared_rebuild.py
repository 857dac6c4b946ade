"""Theano's ``theano.compile.pfunc`` module: `pfunc` (``function`` under its older name and
argument list) and `rebuild_collect_shared` (a graph's copy with its replacements made and the
shared variables it reads collected), which code written for Theano imports from there.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.compile.clone import clone
from symgpu.compile.function import Function, function
from symgpu.compile.io import In
from symgpu.graph.basic import Variable, graph_inputs
from symgpu.graph.sharedvalue import SharedVariable

__all__ = ["pfunc", "rebuild_collect_shared"]


def pfunc(params: Sequence[Any], outputs: Any = None, mode: Any = None, updates: Any = None,
          givens: Any = None, no_default_updates: Any = False, accept_inplace: bool = False,
          name: str | None = None, rebuild_strict: bool = True,
          allow_input_downcast: bool | None = None, profile: Any = None,
          on_unused_input: str | None = None, output_keys: Any = None) -> Function:
    """Theano's ``pfunc``: `function` with Theano's older argument order (`params` are the
    inputs). `rebuild_strict=False` lets `givens` replace a variable by one of another type
    (its consumers are re-made for it); `output_keys` is Theano's internal spelling of a dict
    of outputs and is not needed: pass the dict as `outputs`."""
    if output_keys is not None:
        raise TypeError("pfunc: output_keys is how Theano's function() passes a dict of "
                        "outputs on; pass the dict itself as outputs")
    if givens and not rebuild_strict:
        pairs = list(givens.items()) if isinstance(givens, dict) else list(givens)
        single = outputs is not None and not isinstance(outputs, (list, tuple, dict))
        outs = [outputs] if single else outputs
        outs = clone(outs, replace=pairs, strict=False) if outs is not None else None
        outputs, givens = (outs[0] if single else outs), None
    return function(params, outputs, updates=updates or (), givens=givens or (), mode=mode,
                    profile=profile, name=name,
                    on_unused_input=on_unused_input or "raise",
                    allow_input_downcast=allow_input_downcast,
                    no_default_updates=no_default_updates, accept_inplace=accept_inplace)


def rebuild_collect_shared(outputs: Any, inputs: Sequence[Variable] | None = None,
                           replace: Any = None, updates: Any = None, rebuild_strict: bool = True,
                           copy_inputs_over: bool = True, no_default_updates: Any = False):
    """Theano's helper of ``pfunc``: copies of `outputs` (a variable, list or tuple) with
    `replace` made, and the shared variables they read.

    Returns ``(input_variables, cloned_outputs, [clone_d, update_d, update_expr,
    shared_inputs])``: the copies of `inputs` (the inputs themselves with `copy_inputs_over`),
    the copied outputs, the old -> new map, the shared variable -> its update (from `updates`
    and, unless `no_default_updates`, each shared variable's ``default_update``), the
    (shared variable, update) pairs and the shared variables read, in order of first use.
    """
    inputs = [i.variable if isinstance(i, In) else i for i in (inputs or [])]
    single = isinstance(outputs, Variable)
    outs = [] if outputs is None else [outputs] if single else list(outputs)
    pairs = (list(replace.items()) if isinstance(replace, dict) else list(replace or []))
    ups = (list(updates.items()) if isinstance(updates, dict) else list(updates or []))
    if not copy_inputs_over:   # the inputs are copied, the copies stand in for them
        pairs += [(i, i.clone()) for i in inputs if i not in dict(pairs)]
    n = len(outs)
    cloned = clone(outs + [u for _, u in ups], replace=pairs or None, strict=rebuild_strict)
    clone_d = dict(zip(outs + [u for _, u in ups], cloned))
    clone_d.update({old: new for old, new in pairs})
    cloned_outs = cloned[:n]
    shared_inputs: list[SharedVariable] = []
    update_d: dict = {}
    update_expr: list = []
    for (var, _), new in zip(ups, cloned[n:]):
        update_d[var] = new
        update_expr.append((var, new))
    roots = list(cloned)
    while roots:
        for v in graph_inputs(roots):
            if isinstance(v, SharedVariable) and v not in shared_inputs:
                shared_inputs.append(v)
        roots = []
        if no_default_updates is not True:
            skip = no_default_updates or []
            for v in shared_inputs:
                default = getattr(v, "default_update", None)
                if default is not None and v not in update_d and v not in skip:
                    update_d[v] = default
                    update_expr.append((v, default))
                    roots.append(default)
    input_variables = [clone_d.get(i, i) for i in inputs]
    out = (cloned_outs[0] if single else None if outputs is None
           else tuple(cloned_outs) if isinstance(outputs, tuple) else cloned_outs)
    return input_variables, out, [clone_d, update_d, update_expr, shared_inputs]
