"""Python's cyclic garbage collector paused while a CUDA stream is captured.

Why: a collection that runs inside a capture (any allocation may start one) runs other
libraries' finalizers on the capturing thread, and a driver call they make that a capture
forbids (XLA unloading a freed executable's module: ``cuModuleUnload`` fails with
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) invalidates the capture ("operation failed due to a
previous error during capture"): with JAX in the process, symgpu's loops ran step by step
(issue 32).  Captures on several threads share one count: the collector runs again when the
last one ends, if it ran before the first.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["pause_gc", "resume_gc", "gc_paused"]

_lock = threading.Lock()
_state = {"holds": 0, "was_enabled": False}


def pause_gc() -> None:
    """Pause the cyclic garbage collector (each call paired with one :func:`resume_gc`)."""
    with _lock:
        if _state["holds"] == 0:
            _state["was_enabled"] = gc.isenabled()
            gc.disable()
        _state["holds"] += 1


def resume_gc() -> None:
    """End one :func:`pause_gc`; the last one re-enables the collector if it was enabled."""
    with _lock:
        if _state["holds"] <= 0:
            raise RuntimeError("resume_gc without a pause_gc")
        _state["holds"] -= 1
        if _state["holds"] == 0 and _state["was_enabled"]:
            gc.enable()


@contextmanager
def gc_paused() -> Iterator[None]:
    """``with gc_paused():`` the collector paused for the block."""
    pause_gc()
    try:
        yield
    finally:
        resume_gc()
