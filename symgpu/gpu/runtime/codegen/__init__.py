"""Kernel generation: ``.cu`` templates beside this file, filled from the scalar table.

``template(name)`` reads a template, ``sections(name)`` one split at ``//@ <name>`` lines
(an op's shared device code, then the entry points it instantiates per dtype);
``elemwise``, ``reduce`` render modules; ``scalar``
renders scalar ops (and fused Composites) as typed C; ``launch`` loads cubins and launches.
Nothing here imports PyCUDA at module level: rendering and compiling need no GPU.
"""
from __future__ import annotations

import functools
import os
from string import Template

__all__ = ["template", "sections", "text", "common_source"]

_HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()


def text(name: str) -> str:
    """The text of ``<name>`` as it is (device code with no placeholders)."""
    return _read(name)


def template(name: str) -> Template:
    """The ``string.Template`` of ``<name>`` (``${field}`` placeholders; CUDA never uses $)."""
    return Template(_read(name))


@functools.lru_cache(maxsize=None)
def sections(name: str) -> dict[str, Template]:
    """``<name>`` split at lines ``//@ <section>``: section name -> ``string.Template`` of the
    lines up to the next marker ("" for the text before the first one).  One file per op
    module: its device code, then each ``extern "C"`` entry point it instantiates."""
    out: dict[str, Template] = {}
    key, lines = "", []
    for line in _read(name).splitlines(keepends=True):
        if line.startswith("//@ "):
            out[key] = Template("".join(lines))
            key, lines = line[4:].strip(), []
        else:
            lines.append(line)
    out[key] = Template("".join(lines))
    return out


def common_source() -> str:
    """``common.cuh``: helpers pasted at the top of every module."""
    return _read("common.cuh")
