"""The database of rewrite passes (filled by the rewriting modules that register into it)."""
from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["optdb", "PassDB"]


class PassDB:
    """Named passes with tags and positions; `query` picks the passes a mode runs."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, str, Callable, frozenset]] = []

    def register(self, name: str, rewrite: Callable, position: float, *tags: str) -> None:
        self.passes.append((position, name, rewrite, frozenset(tags) | {name}))
        self.passes.sort(key=lambda p: p[0])

    def query(self, include: Iterable[str], exclude: Iterable[str] = ()) -> list[tuple[str, Callable]]:
        include, exclude = set(include), set(exclude)
        return [(name, fn) for _, name, fn, tags in self.passes
                if tags & include and not tags & exclude]


optdb = PassDB()
