"""The kinds of flag values (symgpu/config.py's flags are made of these): each Param
parses a value from a string or a Python object and says what it allows. Standard library
only, as config.py; symgpu.config re-exports every name."""
from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

__all__ = ["ConfigError", "Param", "EnumParam", "BoolParam", "FloatParam", "IntParam", "StrParam", "PathParam",
           "DeviceParam", "ContextsParam", "TheanoEnumParam", "RemovedParam", "ListParam",
           "InitDeviceParam", "parse_contexts"]

_DEVICE = re.compile(r"cpu|cuda\d*")
_GPU_DEVICE = re.compile(r"cuda\d*")


class ConfigError(ValueError):
    """A bad flag name or value.  ``flag``, ``value``, ``source`` and ``allowed`` say which."""

    def __init__(self, message: str, flag: str | None = None, value: Any = None,
                 source: str | None = None, allowed: str | None = None) -> None:
        super().__init__(message)
        self.flag, self.value, self.source, self.allowed = flag, value, source, allowed


class Param:
    """Turns a raw value (a string from the rc file / environment, or a Python object) into
    the flag's typed value.  Subclasses set ``allowed`` and implement ``convert``."""

    allowed = "any value"

    def convert(self, value: Any) -> Any:
        """Return the typed value; raise ValueError or TypeError (with a reason) if invalid."""
        return value

    def parse(self, value: Any, flag: str, source: str) -> Any:
        """``convert`` with errors turned into a ConfigError that names flag and source."""
        try:
            return self.convert(value)
        except (ValueError, TypeError) as exc:
            reason = f": {exc}" if str(exc) else ""
            raise ConfigError(f"invalid value {value!r} for flag {flag!r} (from {source}){reason}; "
                              f"allowed: {self.allowed}", flag, value, source, self.allowed) from None


class EnumParam(Param):
    """One of a fixed set of strings, matched exactly."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.allowed = ", ".join(choices)

    def convert(self, value: Any) -> str:
        if isinstance(value, str) and value.strip() in self.choices:
            return value.strip()
        raise ValueError("")


class BoolParam(Param):
    """A boolean; strings true/false, 1/0, yes/no, on/off are accepted in any case."""

    allowed = "True, False (also true/false, 1/0, yes/no, on/off)"
    _TRUE = {"true", "1", "yes", "on"}
    _FALSE = {"false", "0", "no", "off"}

    def convert(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            low = value.strip().lower()
            if low in self._TRUE or low in self._FALSE:
                return low in self._TRUE
        raise ValueError("")


class FloatParam(Param):
    """A finite float, optionally checked by ``validator(x) -> bool`` described by ``doc``."""

    def __init__(self, validator: Callable[[float], bool] | None = None,
                 doc: str = "") -> None:
        self.validator = validator
        self.allowed = f"a finite number{', ' + doc if doc else ''}"

    def convert(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError("not a number")
        x = float(value.strip() if isinstance(value, str) else value)
        if not math.isfinite(x):
            raise ValueError("not finite")
        if self.validator is not None and not self.validator(x):
            raise ValueError("")
        return x


class IntParam(Param):
    """An integer (or a string of one), optionally checked by ``validator(i) -> bool``."""

    def __init__(self, validator: Callable[[int], bool] | None = None, doc: str = "",
                 example: int = 0) -> None:
        self.validator = validator
        self.allowed = f"{example}, ... (an integer{' ' + doc if doc else ''})"

    def convert(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TypeError("not an integer")
        i = int(value.strip()) if isinstance(value, str) else value
        if self.validator is not None and not self.validator(i):
            raise ValueError("")
        return i


class StrParam(Param):
    """Any string."""

    allowed = "any string"

    def convert(self, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value.strip()


class PathParam(StrParam):
    """A filesystem path; ``~`` is expanded.  The path need not exist yet."""

    allowed = "a path (~ is expanded)"

    def convert(self, value: Any) -> str:
        text = super().convert(value)
        return os.path.expanduser(text) if text else text


class DeviceParam(Param):
    """``cpu``, ``cuda`` (the default GPU) or ``cudaN`` (GPU number N)."""

    allowed = "cpu, cuda, cudaN"

    def convert(self, value: Any) -> str:
        if isinstance(value, str) and _DEVICE.fullmatch(value.strip()):
            return value.strip()
        raise ValueError("")


class ContextsParam(StrParam):
    """``name->cudaN;name->cudaN``; kept as the string, read as a dict by ``parse_contexts``."""

    allowed = "'' or name->cudaN pairs separated by ';' (e.g. dev0->cuda0;dev1->cuda1)"

    def convert(self, value: Any) -> str:
        text = super().convert(value)
        parse_contexts(text)
        return text


class TheanoEnumParam(EnumParam):
    """One of Theano's string choices; Python's True, False and None are read as the strings
    'True', 'False' and 'None' (``config.dnn.enabled = False``)."""

    def convert(self, value: Any) -> str:
        if value is None or isinstance(value, bool):
            value = str(value)
        return super().convert(value)


class RemovedParam(Param):
    """A flag Theano removed: only '' is accepted; another value names the replacement."""

    def __init__(self, replacement: str) -> None:
        self.replacement = replacement
        self.allowed = f"'' only (removed: use {replacement})"

    def convert(self, value: Any) -> str:
        if value is None or (isinstance(value, str) and not value.strip()):
            return ""
        raise ValueError(f"this flag was removed (in Theano too); use {self.replacement}")


class ListParam(StrParam):
    """``:``-separated words, each one of ``choices`` (empty: none)."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.allowed = f"'', or some of {', '.join(choices)} separated by ':'"

    def convert(self, value: Any) -> str:
        text = super().convert(value)
        bad = [w for w in text.split(":") if w and w not in self.choices]
        if bad:
            raise ValueError(f"unknown {', '.join(map(repr, bad))}")
        return text


class InitDeviceParam(Param):
    """Theano's init_gpu_device: '' or a GPU device name (cuda, cudaN, openclN:M)."""

    allowed = "'', cuda, cudaN, openclN:M"

    def convert(self, value: Any) -> str:
        if isinstance(value, str) and re.fullmatch(r"|cuda\d*|opencl\d*(:\d+)?", value.strip()):
            return value.strip()
        raise ValueError("")


def parse_contexts(spec: str) -> dict[str, str]:
    """Parse ``dev0->cuda0;dev1->cuda1`` into ``{'dev0': 'cuda0', 'dev1': 'cuda1'}``.

    Raises ValueError on a malformed entry, a name that looks like a device or a repeated name.
    Several names may share one GPU (useful to test multi-context code on one device)."""
    result: dict[str, str] = {}
    for entry in spec.split(";"):
        if not entry.strip():
            continue
        name, sep, dev = (s.strip() for s in entry.partition("->"))
        if not sep or not re.fullmatch(r"\w+", name) or not _GPU_DEVICE.fullmatch(dev):
            raise ValueError(f"bad entry {entry.strip()!r}, expected name->cudaN")
        if _DEVICE.fullmatch(name):
            raise ValueError(f"context name {name!r} is a device name")
        if name in result:
            raise ValueError(f"context name {name!r} appears twice")
        result[name] = dev
    return result


