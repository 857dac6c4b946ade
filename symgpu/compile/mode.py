"""Modes: which rewrite passes run and how the graph is linked."""
from __future__ import annotations

import time

from symgpu.config import config
from symgpu.graph.fg import FunctionGraph

__all__ = ["Mode", "get_mode", "MODE_TAGS"]

#: the rewrite tags each mode includes
MODE_TAGS = {
    "FAST_RUN": ("fast_run",),
    "FAST_COMPILE": ("fast_compile",),
    "DebugMode": ("fast_run",),
}


class Mode:
    """A rewrite selection (tags included/excluded) and a linker."""

    def __init__(self, name: str = "FAST_RUN", including: tuple[str, ...] = (),
                 excluding: tuple[str, ...] = ()):
        if name not in MODE_TAGS:
            raise ValueError(f"unknown mode {name!r}; use one of {', '.join(MODE_TAGS)}")
        self.name = name
        self.including = tuple(including)
        self.excluding = tuple(excluding)

    def including_tags(self, *tags: str) -> "Mode":
        return Mode(self.name, self.including + tags, self.excluding)

    def excluding_tags(self, *tags: str) -> "Mode":
        return Mode(self.name, self.including, self.excluding + tags)

    def passes(self):
        """The (name, rewrite) pairs this mode runs, in order."""
        from symgpu.graph.rewriting.db import optdb
        include = MODE_TAGS[self.name] + self.including + tuple(config.tags("optimizer_including"))
        exclude = self.excluding + tuple(config.tags("optimizer_excluding"))
        return optdb.query(include, exclude)

    def rewrite(self, fgraph: FunctionGraph) -> dict[str, float]:
        """Run the passes on `fgraph` in place; returns seconds spent per pass."""
        times = {}
        for name, rewrite in self.passes():
            t0 = time.perf_counter()
            rewrite(fgraph)
            times[name] = time.perf_counter() - t0
        return times

    def __repr__(self) -> str:
        return f"Mode({self.name!r})"


def get_mode(mode) -> Mode:
    """A Mode from None (the `mode` flag), a name, or a Mode."""
    if mode is None:
        return Mode(config.mode)
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        return Mode(mode)
    raise TypeError(f"mode must be a name ({', '.join(MODE_TAGS)}) or a Mode, got {mode!r}")
