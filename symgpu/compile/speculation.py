"""Rewrites that assume something of a call's values, and what a function does when a call
breaks the assumption: it compiles its graph again without that rewrite and runs the call
there, from then on.

Why: some rewrites are exact only for inputs of a certain kind, which is nearly always what
users pass. scan_to_dnn_rnn, for instance, runs a masked loop as one cuDNN layer when each
row's mask is a prefix (ones, then zeros), the padded minibatches of every RNN program. A
branch chosen per call (``ifelse``) keeps both versions compiled, at the price of running the
step in several pieces around the branch, every call. A guard that fails once costs one
compile instead, and the step stays one piece: the branch's price is paid per call, the
guard's per function.

A guard op raises :class:`SpeculationFailed` naming its rewrite (the tag it is registered
under). The call then raised before any shared variable was updated (updates are written
after the graph has run), so :meth:`Function.__call__` recompiles from the graph the function
was given (``FunctionMaker.source``) with the rewrite excluded and repeats the call. A
rewrite may only guard where the graph can be compiled again: ``may_guard(fgraph)``.
"""
from __future__ import annotations

from typing import Any

from symgpu.compile.host_fallback import compile_source
from symgpu.graph.fg import FunctionGraph

__all__ = ["SpeculationFailed", "may_guard", "allow_guards", "without_rewrite"]


class SpeculationFailed(Exception):
    """A guard found a value its rewrite cannot take; `rewrite` is the rewrite's tag."""

    def __init__(self, message: str, rewrite: str = "") -> None:
        super().__init__(message)
        self.rewrite = rewrite


def allow_guards(fgraph: FunctionGraph) -> None:
    """Mark `fgraph` (a function's, whose source is kept) as one rewrites may guard."""
    fgraph.may_guard = True


def may_guard(fgraph: FunctionGraph) -> bool:
    """Whether a rewrite of `fgraph` may assume and guard (the function can recompile)."""
    return bool(getattr(fgraph, "may_guard", False))


def without_rewrite(maker: Any, rewrite: str) -> Any:
    """A FunctionMaker compiled again from `maker.source` with `rewrite` excluded (no guard
    of it can fail there), for the same inputs, outputs and updates."""
    return compile_source(maker, *maker.source, maker.mode.excluding_tags(rewrite))
