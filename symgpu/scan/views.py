"""map, reduce, foldl, foldr: scan with a fixed shape of loop (Theano's signatures)."""
from __future__ import annotations

from typing import Any, Callable

from symgpu.scan.basic import ScanUpdates, scan, scan_impl

__all__ = ["map", "reduce", "foldl", "foldr"]


def map(fn: Callable[..., Any], sequences: Any, non_sequences: Any = None,
        truncate_gradient: int = -1, go_backwards: bool = False, mode: Any = None,
        name: str | None = None) -> tuple[Any, ScanUpdates]:
    """`fn` applied to every entry of `sequences` (no state carried between steps)."""
    return scan(fn, sequences=sequences, outputs_info=None, non_sequences=non_sequences,
                truncate_gradient=truncate_gradient, go_backwards=go_backwards, mode=mode,
                name=name or "map")


def reduce(fn: Callable[..., Any], sequences: Any, outputs_info: Any, non_sequences: Any = None,
           go_backwards: bool = False, mode: Any = None, name: str | None = None
           ) -> tuple[Any, ScanUpdates]:
    """Fold `fn` over `sequences` starting from `outputs_info`; returns only the final value of
    each output (the loop keeps just the taps it reads, not the history)."""
    outs, updates, _ = scan_impl(fn, sequences, outputs_info, non_sequences, None, -1,
                                 go_backwards, mode, name or "reduce", False, keep_last=True)
    if len(outs) == 1:
        return outs[0], updates
    return outs, updates


def foldl(fn: Callable[..., Any], sequences: Any, outputs_info: Any, non_sequences: Any = None,
          mode: Any = None, name: str | None = None) -> tuple[Any, ScanUpdates]:
    """reduce from the first entry to the last."""
    return reduce(fn, sequences, outputs_info, non_sequences, go_backwards=False, mode=mode,
                  name=name or "foldl")


def foldr(fn: Callable[..., Any], sequences: Any, outputs_info: Any, non_sequences: Any = None,
          mode: Any = None, name: str | None = None) -> tuple[Any, ScanUpdates]:
    """reduce from the last entry to the first."""
    return reduce(fn, sequences, outputs_info, non_sequences, go_backwards=True, mode=mode,
                  name=name or "foldr")
