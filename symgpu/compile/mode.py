"""Modes: which rewrite passes run, and how the rewritten graph is linked.

* FAST_RUN — every pass tagged `fast_run` (see symgpu/graph/rewriting/db.py for the list and
  positions): merge, canonicalize, stabilize, specialize, BLAS, fusion, in-place...
* FAST_COMPILE — only what is tagged `fast_compile`: merge and constant folding (plus the GPU
  backend's placement passes), for the quickest compile.
* DebugMode — FAST_RUN's rewrites, then every call also runs the unrewritten graph and
  compares outputs, and checks that no op writes into memory it did not declare destroyed
  (symgpu/compile/debugmode.py).

The `mixed_precision` flag (off, bfloat16, float16) adds the tag of its policy's pass
(`mixed_bfloat16` / `mixed_float16`, symgpu/tensor/rewriting/mixed_precision.py) to every
mode; `mode.including('mixed_bfloat16')` asks for it in one function.
The `optimizer_including` / `optimizer_excluding` flags add or remove tags (pass names, rewrite
names or group tags) for every mode. `mode.including(*tags)` / `mode.excluding(*tags)` (Theano's
spelling; also `including_tags` / `excluding_tags`) return a copy with more tags;
`mode.requiring(*tags)` a copy that runs only the rewrites carrying all of them; a few Theano
rewrite names are read as ours (`TAG_ALIASES`, e.g. `local_elemwise_fusion` is `fusion`).
`MonitorMode` and `NanGuardMode` (symgpu/compile/monitormode.py) call functions around each node.
"""
from __future__ import annotations

import time
from typing import Callable

import symgpu.tensor.rewriting  # noqa: F401  (the tensor rewrites register into optdb)
from symgpu.config import config
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.db import optdb
from symgpu.link.vm import link
from symgpu.tensor.c_elemwise import allow_c_kernels
from symgpu.tensor.rewriting.mixed_precision import check_one_policy, policy_tag

__all__ = ["Mode", "get_mode", "get_default_mode", "MODE_TAGS", "FAST_RUN", "FAST_COMPILE",
           "TAG_ALIASES"]

#: the rewrite tags each mode includes
MODE_TAGS = {
    "FAST_RUN": ("fast_run",),
    "FAST_COMPILE": ("fast_compile",),
    "DebugMode": ("fast_run",),
}


#: Theano's linker names, accepted by Mode(linker=...); symgpu has one linker, the VM
THEANO_LINKERS = ("vm", "cvm", "vm_nogc", "cvm_nogc", "py", "c", "c|py", "c|py_nogc")
#: Theano's optimizer names for Mode(optimizer=...) -> the mode name (None: keep it)
THEANO_OPTIMIZERS = {"default": None, "fast_run": "FAST_RUN", "fast_compile": "FAST_COMPILE"}


class Mode:
    """A rewrite selection (tags included/excluded) and a linker."""

    def __init__(self, name: str = "FAST_RUN", including: tuple[str, ...] = (),
                 excluding: tuple[str, ...] = (), *, linker: str | None = None,
                 optimizer: str | None = None):
        # Theano's Mode(linker='vm', optimizer='fast_run'): every linker name runs on the VM
        if linker is not None and linker not in THEANO_LINKERS:
            raise ValueError(f"Mode: unknown linker {linker!r}; use one of "
                             f"{', '.join(THEANO_LINKERS)} (all run on symgpu's VM)")
        if optimizer is not None:
            if optimizer not in THEANO_OPTIMIZERS:
                raise ValueError(f"Mode: unknown optimizer {optimizer!r}; use one of "
                                 f"{', '.join(THEANO_OPTIMIZERS)}")
            name = THEANO_OPTIMIZERS[optimizer] or name
        self.linker = linker or "vm"
        #: Theano's name of the rewrite set ("fast_run", "fast_compile", or the one given)
        self.optimizer = optimizer or name.lower()
        if name not in MODE_TAGS:
            raise ValueError(f"unknown mode {name!r}; use one of {', '.join(MODE_TAGS)}")
        self.name = name
        self.including = tuple(including)
        self.excluding = tuple(excluding)
        #: tags every selected rewrite must carry (Theano's Mode.requiring)
        self.requiring_tags: tuple[str, ...] = ()

    def _clone(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "Mode":
        return get_mode(self.name)._with(including, excluding)

    def _with(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "Mode":
        self.including, self.excluding = tuple(including), tuple(excluding)
        return self

    def _copy(self, including: tuple[str, ...], excluding: tuple[str, ...],
              requiring: tuple[str, ...]) -> "Mode":
        new = self._clone(including, excluding)
        new.requiring_tags = tuple(requiring)
        return new

    def including_tags(self, *tags: str) -> "Mode":
        """A copy of this mode that also runs the rewrites with these tags."""
        return self._copy(self.including + tags, self.excluding, self.requiring_tags)

    def excluding_tags(self, *tags: str) -> "Mode":
        """A copy of this mode that skips the rewrites with these tags."""
        return self._copy(self.including, self.excluding + tags, self.requiring_tags)

    def requiring(self, *tags: str) -> "Mode":
        """Theano's Mode.requiring: a copy of this mode that runs only the rewrites carrying
        every one of these tags (as well as an included one), at every level: a group of
        rewrites (canonicalize, ...) must carry them too, and so must its members."""
        return self._copy(self.including, self.excluding, self.requiring_tags + tags)

    # Theano/PyTensor spellings
    including_ = including_tags
    excluding_ = excluding_tags

    # `mode.including` / `mode.excluding` read as the tag tuples and, called, are Theano's
    # `mode.excluding('fusion', 'inplace')` (a copy of the mode with more tags)
    @property
    def including(self) -> "_CallableTags":
        return _CallableTags(self._including, self.including_tags)

    @including.setter
    def including(self, tags: tuple[str, ...]) -> None:
        self._including = tuple(tags)

    @property
    def excluding(self) -> "_CallableTags":
        return _CallableTags(self._excluding, self.excluding_tags)

    @excluding.setter
    def excluding(self, tags: tuple[str, ...]) -> None:
        self._excluding = tuple(tags)

    def tags(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(include, exclude) tags, flags included (the `mixed_precision` flag adds its
        policy's tag, `mixed_bfloat16` or `mixed_float16`)."""
        include = MODE_TAGS[self.name] + self.including + tuple(config.tags("optimizer_including"))
        policy = policy_tag(config.mixed_precision)
        if policy and policy not in include:
            include += (policy,)
        exclude = self.excluding + tuple(config.tags("optimizer_excluding"))
        include = _aliased(include)
        check_one_policy(include)
        return include, _aliased(exclude)

    def passes(self):
        """The (name, rewrite) pairs this mode runs, in order."""
        include, exclude = self.tags()
        return optdb.query(include, exclude, _aliased(self.requiring_tags))

    def rewrite(self, fgraph: FunctionGraph) -> dict[str, float]:
        """Run the passes on `fgraph` in place; returns seconds spent per pass."""
        times = {}
        # nodes the rewrites build get test values only if compute_test_value_opt says so
        with config.change_flags(compute_test_value=config.compute_test_value_opt):
            self._run_passes(fgraph, times)
        return times

    def _run_passes(self, fgraph: FunctionGraph, times: dict[str, float]) -> None:
        for name, rewrite in self.passes():
            t0 = time.perf_counter()
            rewrite(fgraph)
            times[name] = time.perf_counter() - t0

    def link(self, fgraph: FunctionGraph, storage_map: dict):
        """The VM running `fgraph` over `storage_map` (DebugMode returns a checking one)."""
        with allow_c_kernels(self.name != FAST_COMPILE):  # no C compiles for FAST_COMPILE
            return link(fgraph, storage_map)

    def __repr__(self) -> str:
        return f"Mode({self.name!r})"

    def __setstate__(self, state: dict) -> None:
        state.setdefault("requiring_tags", ())  # a Mode pickled before Mode.requiring existed
        self.__dict__.update(state)


FAST_RUN = "FAST_RUN"
FAST_COMPILE = "FAST_COMPILE"

#: mode name -> factory, for modes of their own class that `get_mode` makes by name
#: (compile.debugmode registers "DebugMode" when it loads; compile.function imports it)
NAMED_MODES: dict[str, Callable[[], Mode]] = {}


def get_mode(mode) -> Mode:
    """A Mode from None (the `mode` flag), a name, or a Mode."""
    if mode is None:
        mode = config.mode
    if isinstance(mode, Mode):
        return mode
    if isinstance(mode, str):
        factory = NAMED_MODES.get(mode)
        return factory() if factory is not None else Mode(mode)
    raise TypeError(f"mode must be a name ({', '.join(MODE_TAGS)}) or a Mode, got {mode!r}")


def get_default_mode() -> Mode:
    """Theano's name for the mode the `mode` flag selects (``get_mode(None)``)."""
    return get_mode(None)


#: Theano rewrite names that tutorials exclude, and the tag of ours that does the same work
TAG_ALIASES = {
    "local_elemwise_fusion": "fusion",
    "elemwise_fusion": "fusion",
    "fusion_optimizer": "fusion",
}


def _aliased(tags: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(TAG_ALIASES.get(t, t) for t in tags)


class _CallableTags(tuple):
    """A mode's included or excluded tags: a tuple that, called with more tags, returns a copy
    of the mode with them added (Theano's ``mode.excluding('fusion')``)."""

    def __new__(cls, tags: tuple[str, ...], add) -> "_CallableTags":
        obj = super().__new__(cls, tags)
        obj._add = add
        return obj

    def __call__(self, *tags: str) -> "Mode":
        return self._add(*tags)
