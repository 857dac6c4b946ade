"""Re-export: TokenLock lives in symgpu/graph/token_lock.py (below the shared variables that
use it); ``symgpu.link.token_lock`` is its documented path."""
from symgpu.graph.token_lock import HELD_NAME, TokenLock

__all__ = ["TokenLock", "HELD_NAME"]
