"""Typed, validated configuration flags.

Sources, in rising precedence:

1. each flag's default;
2. the rc file: ``$SYMGPURC`` if set, else ``~/.symgpurc``.  INI; ``[global]`` holds plain
   flags, ``[gpuarray]``, ``[nvcc]`` ... hold dotted ones (``[gpuarray] preallocate = 0.8``);
3. the environment variable ``SYMGPU_FLAGS``: ``name=value`` pairs separated by commas, dotted
   names written out (``gpuarray.preallocate=0.8``).  A piece that does not start with
   ``name=`` continues the previous value, so ``nvcc.flags=-Xcompiler -O3,-fPIC`` keeps its comma;
4. ``config.change_flags(...)`` (context manager and decorator) and attribute assignment
   (``config.floatX = 'float32'``, for the rest of the process).

Every flag of Theano's configuration reference is accepted too, with Theano's type, allowed
values and default (the table is symgpu/config_theano.py): Theano's flags that symgpu has keep
symgpu's behaviour, a few read and write a symgpu flag (``optimizer`` is ``mode``'s rewrite
set), and those symgpu cannot honour warn once per flag and process (``IgnoredFlagWarning``)
when set to another value than their default.

Every value is checked by the flag's param; a bad name or value raises :class:`ConfigError`
naming the flag, the value, its source and what is allowed.  Errors in the rc file or in
``SYMGPU_FLAGS`` surface when this module is imported.  Only the standard library is used so
that flags can be read before anything heavy is imported.
"""
from __future__ import annotations

import configparser
import difflib
import functools
import os
import re
import sys
import sysconfig
import types
import warnings
from typing import Any, Callable, Mapping

from symgpu.config_params import (BoolParam, ConfigError, ContextsParam, DeviceParam, EnumParam, FloatParam,
                                  InitDeviceParam, IntParam, ListParam, Param, PathParam,
                                  RemovedParam, StrParam, TheanoEnumParam, parse_contexts)
from symgpu.config_theano import LEGACY_FLAGS, THEANO_FLAGS

__all__ = [
    "Config", "ConfigError", "Param", "EnumParam", "BoolParam", "FloatParam", "StrParam",
    "PathParam", "DeviceParam", "ContextsParam", "IntParam", "parse_contexts", "config",
    "change_flags", "IgnoredFlagWarning",
]

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_ENV_ITEM = re.compile(r"\s*([A-Za-z_][\w.]*)\s*=(.*)", re.S)


class IgnoredFlagWarning(UserWarning):
    """A Theano flag that symgpu accepts but cannot honour was set; the text says why."""


# --------------------------------------------------------------------------- sources
def _normalize(name: str) -> str:
    """``gpuarray__preallocate`` -> ``gpuarray.preallocate`` (keyword-argument spelling)."""
    return name.strip().replace("__", ".")


def _parse_flags_string(text: str, source: str = "SYMGPU_FLAGS") -> list[tuple[str, str, str]]:
    """Split ``a=1,b.c=x->y;z`` into (name, raw value, source) triples, in order."""
    items: list[list[str]] = []
    for piece in text.split(","):
        m = _ENV_ITEM.match(piece)
        if m:
            items.append([_normalize(m.group(1)), m.group(2)])
        elif items:  # no 'name=' prefix: the value itself held a comma
            items[-1][1] += "," + piece
        elif piece.strip():
            raise ConfigError(f"malformed entry {piece.strip()!r} in {source}: expected "
                              f"name=value pairs separated by commas", None, piece, source,
                              "name=value pairs")
    return [(name, value.strip(), source) for name, value in items]


def _read_rc(path: str) -> list[tuple[str, str, str]]:
    """Read the INI rc file at ``path`` (missing file: nothing) into (name, raw, source)."""
    source = f"rc file {path}"
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none")
    parser.optionxform = str  # type: ignore[assignment]  # keep case: floatX
    try:
        if not parser.read(path, encoding="utf-8"):
            return []
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse {source}: {exc}", source=source) from None
    out = []
    for section in parser.sections():
        prefix = "" if section == "global" else section + "."
        for key, value in parser.items(section, raw=True):
            out.append((_normalize(prefix + key), value.strip(), source))
    return out


def _default_compiledir(environ: Mapping[str, str]) -> str:
    """``$XDG_CACHE_HOME/symgpu/<platform>-<python>`` so interpreters never share binaries."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    return os.path.join(base, "symgpu", tag)


# --------------------------------------------------------------------------- config
class _Flag:
    """One flag's record.  ``warns(value)`` says whether setting ``value`` warns (once per
    flag and process) with ``reason``; ``adapt(value, current)`` turns an accepted spelling
    into the stored value (Theano's ``mode=Mode`` keeps the current rewrite set)."""

    __slots__ = ("name", "doc", "param", "default", "value", "source", "reason", "warns",
                 "adapt")

    def __init__(self, name: str, doc: str, param: Param, default: Any) -> None:
        self.name, self.doc, self.param = name, doc, param
        self.default = self.value = default
        self.source = "default"
        self.reason: str | None = None
        self.warns: Callable[[Any], bool] = _never
        self.adapt: Callable[[Any, Any], Any] | None = None


class _DerivedFlag(_Flag):
    """A flag without a value of its own: it reads and writes ``target`` (another flag's
    record) through ``read(target value)`` and ``write(value, target value)``."""

    __slots__ = ("target", "read", "write")

    def __init__(self, name: str, doc: str, param: Param, default: Any, target: _Flag,
                 read: Callable[[Any], Any], write: Callable[[Any, Any], Any]) -> None:
        self.name, self.doc, self.param, self.default = name, doc, param, default
        self.target, self.read, self.write = target, read, write
        self.reason, self.warns, self.adapt = None, _never, None

    @property  # type: ignore[override]
    def value(self) -> Any:
        return self.read(self.target.value)

    @property  # type: ignore[override]
    def source(self) -> str:
        return self.target.source


def _never(value: Any) -> bool:
    return False


#: names of the flags that have warned in this process (IgnoredFlagWarning: once per flag)
_WARNED: set[str] = set()


class _Section:
    """Attribute view of the flags under one dotted prefix, e.g. ``config.gpuarray``."""

    def __init__(self, cfg: Config, prefix: str) -> None:
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._cfg._lookup(self._prefix + name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._cfg._assign(self._prefix + name, value, "assignment")

    def __dir__(self) -> list[str]:
        n = len(self._prefix)
        return sorted({k[n:].split(".")[0] for k in self._cfg._flags if k.startswith(self._prefix)})

    def __repr__(self) -> str:
        return f"<config section {self._prefix[:-1]!r}>"


class _ChangeFlags:
    """Returned by ``Config.change_flags``: a re-entrant context manager and a decorator."""

    def __init__(self, cfg: Config, values: dict[str, Any]) -> None:
        self._cfg, self._values, self._saved = cfg, values, []

    def __enter__(self) -> Config:
        flags = self._cfg._flags
        self._saved.append({n: (flags[n].value, flags[n].source) for n in self._values})
        for name, value in self._values.items():
            flags[name].value, flags[name].source = value, "change_flags"
        if _DEVICE_FLAGS.intersection(self._values):
            self._cfg.device_requested()
        return self._cfg

    def __exit__(self, *exc: Any) -> None:
        for name, (value, source) in self._saved.pop().items():
            self._cfg._flags[name].value, self._cfg._flags[name].source = value, source

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapper


class Config:
    """All flags.  Read ``config.floatX``, ``config.gpuarray.preallocate``; see module doc.

    ``environ`` defaults to ``os.environ``; ``rc_path`` defaults to ``$SYMGPURC`` or
    ``~/.symgpurc`` (``''`` reads no rc file).  With ``strict`` a name in the rc file or
    ``SYMGPU_FLAGS`` that no built-in flag has raises at once; without it, call
    ``check_unknown()`` once every flag is added."""

    def __init__(self, environ: Mapping[str, str] | None = None, rc_path: str | None = None,
                 strict: bool = True) -> None:
        env = os.environ if environ is None else environ
        self._flags: dict[str, _Flag] = {}
        self._sections: dict[str, _Section] = {}
        if rc_path is None:
            rc_path = env.get("SYMGPURC") or os.path.join(os.path.expanduser("~"), ".symgpurc")
        self._rc_path = rc_path
        # raw values kept so that a flag added later still gets them; lowest precedence first
        self._raw = _read_rc(rc_path) if rc_path else []
        self._raw += _parse_flags_string(env.get("SYMGPU_FLAGS", ""))
        _register_builtin_flags(self, env)
        if strict:
            self.check_unknown()

    # -- registration
    def add(self, name: str, doc: str, param: Param, default: Any) -> None:
        """Register flag ``name`` (dotted for a section) where the feature lives.

        ``doc`` is one line; ``default`` is checked by ``param``.  A value for ``name`` already
        read from the rc file or SYMGPU_FLAGS is applied (and validated) now."""
        name = _normalize(name)
        if not _NAME.fullmatch(name):
            raise ConfigError(f"bad flag name {name!r}", name)
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts))]
        if (name in self._flags or name + "." in self._sections or hasattr(Config, parts[0])
                or any(p in self._flags for p in prefixes)):
            raise ConfigError(f"flag {name!r} is already registered or clashes with another name",
                              name)
        flag = _Flag(name, doc, param, param.parse(default, name, "default"))
        self._register(flag, prefixes)

    def _register(self, flag: _Flag, prefixes: list[str]) -> None:
        """Apply the raw values read for ``flag`` (in order), then make it known."""
        for raw_name, raw, source in self._raw:
            if raw_name == flag.name:
                self._store(flag, flag.param.parse(raw, flag.name, source), source)
        self._flags[flag.name] = flag
        for p in prefixes:
            self._sections.setdefault(p + ".", _Section(self, p + "."))

    def _add_theano(self, row: tuple, environ: Mapping[str, str]) -> None:
        """Register one Theano flag of symgpu/config_theano.py's table (not a ``same`` row)."""
        name, spec, default, kind, text, quiet = row
        if isinstance(default, str) and default.startswith("<compiledir>"):
            base = _default_compiledir(environ)
            default = os.path.normpath(base + default[len("<compiledir>"):])
        param = _theano_param(spec)
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts))]
        doc = _theano_doc(kind, text, default, quiet)
        default = param.parse(default, name, "default")
        if name in _DERIVED:
            target_name, read, write = _DERIVED[name]
            flag: _Flag = _DerivedFlag(name, doc, param, default, self._flags[target_name],
                                       read, write)
        else:
            flag = _Flag(name, doc, param, default)
        if kind in ("ignored", "mapped") and quiet != "*":
            silent = frozenset((default, *quiet))
            how = "has no effect" if kind == "ignored" else "is approximated"
            flag.reason, flag.warns = f"{how} in symgpu: {text}", lambda value: value not in silent
        self._register(flag, prefixes)
        for p in prefixes:
            self._sections.setdefault(p + ".", _Section(self, p + "."))

    def _store(self, flag: _Flag, value: Any, source: str) -> None:
        """Set an already parsed ``value``: warn if the flag cannot honour it, adapt it, and
        write it (a derived flag writes its target)."""
        _warn_once(flag, value)
        if flag.adapt is not None:
            value = flag.adapt(value, flag.value)
        if isinstance(flag, _DerivedFlag):
            flag.target.value = flag.write(value, flag.target.value)
            flag.target.source = source
        else:
            flag.value, flag.source = value, source

    def _parsed_change(self, flag: _Flag, value: Any) -> tuple[str, Any]:
        """(flag name, stored value) that ``change_flags`` sets for ``flag = value``."""
        value = flag.param.parse(value, flag.name, "change_flags")
        _warn_once(flag, value)
        if flag.adapt is not None:
            value = flag.adapt(value, flag.value)
        if isinstance(flag, _DerivedFlag):
            return flag.target.name, flag.write(value, flag.target.value)
        return flag.name, value

    def check_unknown(self) -> None:
        """Raise ConfigError for a name in the rc file or SYMGPU_FLAGS that is no flag."""
        for name, raw, source in self._raw:
            if name not in self._flags:
                raise self._unknown(name, raw, source)

    # -- reading and writing
    def _unknown(self, name: str, value: Any, source: str) -> ConfigError:
        known = list(self._flags)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        return ConfigError(f"unknown flag {name!r} (value {value!r}, from {source}); known "
                           f"flags: {', '.join(known)}{hint}", name, value, source, ", ".join(known))

    def _lookup(self, name: str) -> Any:
        if name in self._flags:
            return self._flags[name].value
        if name + "." in self._sections:
            return self._sections[name + "."]
        raise AttributeError(f"symgpu config has no flag {name!r}")

    def _assign(self, name: str, value: Any, source: str) -> None:
        flag = self._flags.get(_normalize(name))
        if flag is None:
            raise self._unknown(name, value, source)
        self._store(flag, flag.param.parse(value, flag.name, source), source)
        if flag.name in _DEVICE_FLAGS:
            self.device_requested()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._lookup(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._assign(name, value, "assignment")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {k.split(".")[0] for k in self._flags})

    def live(self, name: str) -> Any:
        """Flag ``name``'s live record, whose ``.value`` follows every change (assignment,
        ``change_flags``): for hot paths, one attribute read instead of the lookups that
        ``config.nvcc.flags`` makes through its section (microseconds on a slow CPU)."""
        flag = self._flags.get(_normalize(name))
        if flag is None:
            raise self._unknown(name, None, "live()")
        return flag

    def change_flags(self, values: Mapping[str, Any] | None = None, /,
                     **kwargs: Any) -> _ChangeFlags:
        """Set flags inside a ``with`` block or a decorated function, restoring them on exit
        (also on exceptions).  Names and values are checked now, not on entry.

        ``change_flags(floatX='float32')``, ``change_flags(gpuarray__preallocate=0.5)`` or
        ``change_flags({'gpuarray.preallocate': 0.5})``."""
        parsed: dict[str, Any] = {}
        for name, value in {**(values or {}), **kwargs}.items():
            flag = self._flags.get(_normalize(name))
            if flag is None:
                raise self._unknown(name, value, "change_flags")
            target, stored = self._parsed_change(flag, value)
            parsed[target] = stored
        return _ChangeFlags(self, parsed)

    # -- helpers for features
    def on_device_request(self, loader: Callable[[], None]) -> None:
        """Run `loader` once, as soon as the flags ask for a GPU (``device=cuda...`` or
        ``contexts=...``: now, on an assignment or in ``change_flags``). The symgpu package
        registers the loader of its GPU backend, so a CPU-only run never imports it."""
        _DEVICE_LOADERS.append(loader)
        self.device_requested()

    def device_requested(self) -> None:
        """Load the device backends if the flags ask for a GPU (see on_device_request)."""
        if not _DEVICE_LOADERS:
            return
        device, contexts = self._flags["device"].value, self._flags["contexts"].value
        if device != "cpu" or contexts:
            loaders = list(_DEVICE_LOADERS)
            _DEVICE_LOADERS.clear()
            for load in loaders:
                load()

    def tags(self, name: str) -> list[str]:
        """Split a ``:``-separated tag flag such as ``optimizer_including`` into its tags."""
        return [t.strip() for t in str(self._lookup(name)).split(":") if t.strip()]

    def context_map(self) -> dict[str, str]:
        """The ``contexts`` flag as ``{name: 'cudaN'}``."""
        return parse_contexts(self._lookup("contexts"))

    def source(self, name: str) -> str:
        """Where the current value of ``name`` came from (default, rc file ..., SYMGPU_FLAGS ...)."""
        if _normalize(name) not in self._flags:
            raise self._unknown(name, None, "source()")
        return self._flags[_normalize(name)].source

    def describe(self) -> list[tuple[str, str, str, Any, Any]]:
        """(name, doc, allowed, default, current) per flag, in registration order; for docs."""
        return [(f.name, f.doc, f.param.allowed, f.default, f.value) for f in self._flags.values()]

    def dump(self) -> str:
        """One ``name = value`` line per flag, with the source of every non-default value."""
        width = max((len(n) for n in self._flags), default=0)
        return "\n".join(f"{f.name:<{width}} = {f.value!r}"
                         + ("" if f.source == "default" else f"  ({f.source})")
                         for f in self._flags.values())

    __str__ = dump

    def __repr__(self) -> str:
        return f"<symgpu Config, {len(self._flags)} flags; print it to see them>"


_ACTIONS = ("ignore", "warn", "raise", "pdb")
_BUILTIN_FLAGS: list[tuple[str, Callable[[], Param], Any, str]] = [  # name, param, default, doc
    ("device", DeviceParam, "cpu", "where functions run by default"),
    ("force_device", BoolParam, False,
     "if the GPU cannot be used: raise instead of warning and falling back to the CPU"),
    ("floatX", lambda: EnumParam("float64", "float32", "float16", "bfloat16"), "float64",
     "dtype of untyped constructors and of shared() for Python floats"),
    ("warn_float64", lambda: EnumParam(*_ACTIONS), "ignore",
     "what to do when a float64 variable is created"),
    ("mode", lambda: EnumParam("FAST_RUN", "FAST_COMPILE", "DebugMode", "Mode", "DEBUG_MODE",
                               "NanGuardMode"), "FAST_RUN",
     "default compilation mode: rewrite set and checking (Theano's names: Mode keeps the "
     "rewrite set the optimizer flag chose, DEBUG_MODE is DebugMode, NanGuardMode is read as "
     "FAST_RUN with a warning)"),
    ("optimizer_including", StrParam, "",
     "':'-separated rewrite tags to switch on (config.tags splits them)"),
    ("optimizer_excluding", StrParam, "",
     "':'-separated rewrite tags to switch off (config.tags splits them)"),
    ("profile", BoolParam, False, "collect time profiles of compiled functions, print at exit"),
    ("profile_memory", BoolParam, False, "also collect memory profiles, print them at exit"),
    ("allow_gc", BoolParam, True,
     "free intermediate results between calls (False keeps them: faster, more memory)"),
    ("assert_no_cpu_op", lambda: EnumParam(*_ACTIONS), "ignore",
     "what to do when a compiled GPU function keeps an op on the CPU"),
    ("contexts", ContextsParam, "", "named GPU contexts for several GPUs, e.g. "
     "dev0->cuda0;dev1->cuda1 (config.context_map() parses it)"),
    ("gpuarray.preallocate", FloatParam, 0.0, "GPU memory the pool takes at start: "
     "fraction (<=1) or MiB (>1); negative disables pooling"),
    ("gpuarray.cuda_graphs", BoolParam, True, "capture whole GPU functions into CUDA graphs"),
    ("gpuarray.sync_checks", BoolParam, False,
     "check indices and labels right after each GPU launch (a stream sync each, errors raised "
     "at the node) instead of at the next synchronisation"),
    ("gpuarray.allow_tf32", BoolParam, False,
     "let cuBLAS run float32 matrix products on TF32 tensor cores: several times faster, "
     "inputs rounded to 10 mantissa bits (PyTorch's allow_tf32; JAX's default precision)"),
    ("gpuarray.cublaslt", BoolParam, True,
     "run GPU matrix products (dot of matrices, gemm) with the algorithm that timed fastest "
     "on the first call of each shape and layout (as XLA autotunes): cuBLASLt's candidates, "
     "their split-K variants and classic cuBLAS (on an H200 the MLP step of 784-1024-1024-10 "
     "took 3.3 us less in float32, 6.7 us less in TF32; the timing adds tens of ms to a "
     "first call); off, or where libcublasLt is missing: classic cuBLAS's own choice"),
    ("gpuarray.gemm_epilogue", lambda: EnumParam("half", "all", "off"), "half",
     "fold a bias and a ReLU into the matrix product that feeds them (relu(dot(x, W) + b) as "
     "one cuBLASLt call with its BIAS / RELU_BIAS epilogue): half for float16/bfloat16 "
     "products, all for every dtype, off for none"),
    ("distributed.timeout", FloatParam, 600.0,
     "seconds a collective waits for its peers before failing with DistributedTimeoutError "
     "(symgpu.distributed: a dead or hung rank; NCCL's waits are watched as long)"),
    ("distributed.check_shapes", BoolParam, True,
     "on the first call of each compiled function, exchange the element counts of its NCCL "
     "collectives (one small host all-gather each) and raise CollectiveMismatchError naming "
     "the rank and the collective where they differ (NCCL itself silently misbehaves on "
     "mismatched counts); off: no exchange"),
    ("distributed.comm_stream", BoolParam, True,
     "queue GPU collectives on a communication stream of the context's own, forked off the "
     "compute stream after their inputs and joined back before their first consumer, so an "
     "all-reduce overlaps the computation queued in between (the rest of the backward pass), "
     "as DDP's NCCL stream does; read when a function is compiled; off: on the compute "
     "stream, in order"),
    ("nvcc.flags", StrParam, "", "extra nvcc flags, e.g. --use_fast_math"),
    ("compiledir", PathParam, None, "where compiled kernels are cached across processes"),
    ("cxx", StrParam, "cc", "the C compiler of the CPU's fused elementwise kernels; empty: "
     "none, NumPy does all CPU work (also when the compiler or Python's headers are missing)"),
    ("compile_log", BoolParam, False,
     "say for each kernel whether the compile cache hit or missed"),
    ("exception_verbosity", lambda: EnumParam("low", "high"), "low",
     "how much a runtime error prints"),
    ("print_active_device", BoolParam, True, "print the device in use when the GPU starts"),
    ("compute_test_value", lambda: EnumParam("off", *_ACTIONS), "off",
     "compute test values (tag.test_value) as the graph is built, so a bad shape fails at the "
     "user's line; what to do when an input has none (off: feature inactive)"),
    ("compute_test_value_opt", lambda: EnumParam("off", *_ACTIONS), "off",
     "compute_test_value's setting while rewrites run (nodes made by the optimizer)"),
    ("print_test_value", BoolParam, False,
     "repr() of a variable also shows its test value"),
    ("optimizer_verbose", BoolParam, False,
     "print each replacement a rewrite makes: rewriting: rewrite <name> replaces <old> ..."),
    ("mixed_precision", lambda: EnumParam("off", "bfloat16", "float16"), "off",
     "compile float32 graphs with their matrix products and convolutions in this half dtype "
     "(casts placed and fused by a rewrite), reductions, losses and updates in float32 "
     "(docs/mixed_precision.md)"),
]


def _register_builtin_flags(cfg: Config, environ: Mapping[str, str]) -> None:
    """All flags of the core, then Theano's; the check for unknown names runs after these."""
    for name, param, default, doc in _BUILTIN_FLAGS:
        if name == "compiledir":
            default = _default_compiledir(environ)
        if name != "mode":
            cfg.add(name, doc, param(), default)
            continue
        mode = _Flag(name, doc, param(), default)  # hooks set before the raw values apply
        mode.adapt = _adapt_mode
        mode.reason = ("is approximated in symgpu: NanGuardMode by name runs FAST_RUN; pass "
                       "mode=NanGuardMode(...) (symgpu.compile.monitormode) to function")
        mode.warns = lambda value: _THEANO_MODES.get(value, (value, False))[1]
        cfg._register(mode, [])
    for row in THEANO_FLAGS + LEGACY_FLAGS:
        if row[3] != "same":
            cfg._add_theano(row, environ)


# --------------------------------------------------------------------------- Theano's flags
def _warn_once(flag: _Flag, value: Any) -> None:
    """IgnoredFlagWarning, once per flag and process, if ``flag`` cannot honour ``value``."""
    if flag.reason and flag.name not in _WARNED and flag.warns(value):
        _WARNED.add(flag.name)
        level, frame = 2, sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == __file__:
            level, frame = level + 1, frame.f_back
        warnings.warn(f"flag {flag.name}={value!r} {flag.reason}", IgnoredFlagWarning,
                      stacklevel=level)


#: symgpu's rewrite sets, the modes the optimizer flag chooses between
_REWRITE_SETS = ("FAST_RUN", "FAST_COMPILE")
#: Theano's other mode names -> (symgpu's, whether it warns); None: the current rewrite set
#: (Theano's Mode, which follows the optimizer flag)
_THEANO_MODES = {"Mode": (None, False), "DEBUG_MODE": ("DebugMode", False),
                 "NanGuardMode": ("FAST_RUN", True)}


def _adapt_mode(value: str, current: str) -> str:
    """Theano's mode names as symgpu's: Mode keeps the rewrite set the optimizer flag chose."""
    if value not in _THEANO_MODES:
        return value
    name = _THEANO_MODES[value][0]
    if name is None:
        return current if current in _REWRITE_SETS else _REWRITE_SETS[0]
    return name


_FAST_COMPILE_OPTIMIZERS = frozenset({"fast_compile", "o1", "merge", "None"})
_FAST_MATH = ("--use_fast_math", "-use_fast_math")


def _write_optimizer(value: str, mode: str) -> str:
    if mode not in _REWRITE_SETS:  # as in Theano, DebugMode keeps its own rewrites
        return mode
    return "FAST_COMPILE" if value in _FAST_COMPILE_OPTIMIZERS else "FAST_RUN"


def _write_fastmath(value: bool, flags: str) -> str:
    words = [w for w in flags.split() if w not in _FAST_MATH]
    return " ".join(words + [_FAST_MATH[0]] if value else words)


#: Theano flag -> (symgpu flag it reads and writes, read(its value), write(value, its value))
_DERIVED: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any, Any], Any]]] = {
    "optimizer": ("mode", lambda mode: "fast_compile" if mode == "FAST_COMPILE" else "fast_run",
                  _write_optimizer),
    "nvcc.fastmath": ("nvcc.flags", lambda flags: any(w in _FAST_MATH for w in flags.split()),
                      _write_fastmath),
}

_INT_SPECS: dict[str, tuple[Callable[[int], bool] | None, str, int]] = {
    "int": (None, "", 0), "int>0": (lambda i: i > 0, "> 0", 1),
    "int>=0": (lambda i: i >= 0, ">= 0", 0)}
_PREALLOCATED_KINDS = ("initial", "previous", "c_contiguous", "f_contiguous", "strided",
                       "wrong_size", "ALL")


def _theano_param(spec: Any) -> Param:
    """The param for a spec of symgpu/config_theano.py's table."""
    if isinstance(spec, tuple):
        return TheanoEnumParam(*spec)
    if spec in _INT_SPECS:
        return IntParam(*_INT_SPECS[spec])
    if spec == "memory":
        param = FloatParam()
        param.allowed = "0, 0.5, 1024 ... (0: off; up to 1: a fraction of the GPU's memory; MiB)"
        return param
    if spec.startswith("removed:"):
        return RemovedParam(spec[len("removed:"):])
    simple: dict[str, Callable[[], Param]] = {
        "bool": BoolParam, "str": StrParam, "path": PathParam,
        "initdev": InitDeviceParam, "prealloc": lambda: ListParam(*_PREALLOCATED_KINDS)}
    return simple[spec]()


def _theano_doc(kind: str, text: str, default: Any, quiet: Any) -> str:
    """The one-line doc of a Theano flag (docs/flags.md), from its row."""
    if kind == "ignored":
        also = f" or {', '.join(map(str, quiet))}" if quiet else ""
        shown = "''" if default == "" else default
        return (f"Theano's flag, accepted without effect (a value other than {shown}{also} "
                f"warns once): {text}")
    if kind == "removed":
        return f"Theano's flag, {text}"
    return f"Theano's flag: {text}"


#: the flags that ask for a GPU, and the loaders waiting for one (Config.on_device_request)
_DEVICE_FLAGS = frozenset({"device", "contexts"})
_DEVICE_LOADERS: list[Callable[[], None]] = []

config = Config()
change_flags = config.change_flags


def __getattr__(name: str) -> Any:
    """Module attributes read flags too, in case ``symgpu.config`` names this module."""
    try:
        return config._lookup(name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


class _ConfigModule(types.ModuleType):
    """Make ``symgpu.config.floatX = ...`` set the flag even when ``symgpu.config`` is this
    module rather than the object (otherwise it would silently create a module global)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in config._flags:
            config._assign(name, value, "assignment")
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule
