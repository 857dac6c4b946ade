"""Kernel generation: ``.cu`` templates beside this file, filled from the scalar table.

``template(name)`` reads a template; ``elemwise``, ``reduce`` render modules; ``scalar``
renders scalar ops (and fused Composites) as typed C; ``launch`` loads cubins and launches.
Nothing here imports PyCUDA at module level: rendering and compiling need no GPU.
"""
from __future__ import annotations

import functools
import os
from string import Template

__all__ = ["template", "common_source"]

_HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()


def template(name: str) -> Template:
    """The ``string.Template`` of ``<name>`` (``${field}`` placeholders; CUDA never uses $)."""
    return Template(_read(name))


def common_source() -> str:
    """``common.cuh``: helpers pasted at the top of every module."""
    return _read("common.cuh")
