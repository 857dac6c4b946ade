"""Theano's `theano.clone`: a copy of a graph with some variables replaced.

Above the graph and tensor layers (a replacement that is not a variable becomes a constant of
the replaced variable's type); `function` substitutes its givens with `clone_replace`
(compile/function.py), which shares everything it does not replace.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Variable, io_toposort
from symgpu.graph.sharedvalue import SharedVariable
from symgpu.tensor.type import as_tensor_variable

__all__ = ["clone"]


def _pairs(replace: Any) -> list[tuple[Any, Any]]:
    if replace is None:
        return []
    if isinstance(replace, dict):
        return list(replace.items())
    try:
        pairs = [tuple(p) for p in replace]
    except TypeError:
        raise TypeError("clone: replace must be a dict or a list of (variable, new) pairs, "
                        f"got {replace!r}") from None
    if any(len(p) != 2 for p in pairs):
        raise TypeError(f"clone: replace must hold (variable, new) pairs, got {replace!r}")
    return pairs


def _rebuild(outputs: list[Variable], memo: dict, share_inputs: bool, strict: bool) -> list[Variable]:
    """Copies of `outputs` over `memo` (old -> new, filled in): the nodes between are cloned;
    free inputs are kept (`share_inputs`) or cloned, shared variables always kept."""
    def free(v: Variable) -> Variable:
        if v not in memo:
            keep = share_inputs or isinstance(v, SharedVariable)
            memo[v] = v if keep else v.clone()
        return memo[v]

    for node in io_toposort([v for v in memo if isinstance(v, Variable)], outputs):
        new_node = node.clone_with_new_inputs(
            [memo[i] if i in memo else free(i) for i in node.inputs], strict=strict)
        for old, new in zip(node.outputs, new_node.outputs):
            memo[old] = new
    return [memo[v] if v in memo else free(v) for v in outputs]


def clone(output: Any, replace: Any = None, strict: bool = True, share_inputs: bool = True,
          copy_inputs: Any = None) -> Any:
    """A copy of the graph of `output` (a variable, or a list or tuple of them) with each key
    of `replace` (a dict or (variable, new) pairs) replaced by its new value.

    `strict`: a replacement must have the replaced variable's type (or one it converts to,
    such as a broadcast pattern made explicit), else TypeError; with False any variable its
    consumers accept goes in (their nodes are re-made). `share_inputs`: the copy reads the
    same free inputs (True) or copies of them (False); shared variables are always shared.
    `copy_inputs` is Theano's deprecated spelling of ``not share_inputs``."""
    if copy_inputs is not None:
        share_inputs = not copy_inputs
    single = isinstance(output, Variable)
    outs = [output] if single else list(output)
    for o in outs:
        if not isinstance(o, Variable):
            raise TypeError(f"clone: outputs must be symbolic variables, got {o!r}")
    memo: dict = {}
    news = []
    for old, new in _pairs(replace):
        if not isinstance(old, Variable):
            raise TypeError(f"clone: replace's keys must be symbolic variables, got {old!r}")
        if not isinstance(new, Variable):
            new = as_tensor_variable(new, dtype=getattr(old.type, "dtype", None))
        if strict and new.type != old.type:
            converted = old.type.convert_variable(new)
            if converted is None:
                raise TypeError(f"clone: {old} has type {old.type} but its replacement {new} "
                                f"has type {new.type} (strict=False allows it where the "
                                "graph accepts it)")
            new = converted
        news.append((old, new))
    # the replacements' own graphs are copied like the outputs' (Theano's rule), then stand in
    rebuilt = _rebuild([n for _, n in news], {}, share_inputs, strict) if news else []
    for (old, _), new in zip(news, rebuilt):
        if old in memo:
            raise ValueError(f"clone: {old} is replaced twice")
        memo[old] = new
    res = _rebuild(outs, memo, share_inputs, strict)
    return res[0] if single else type(output)(res) if isinstance(output, tuple) else res
