"""Saving models with large parameters: Theano's zip format (`dump` / `load`).

The archive holds a member ``pkl`` (the pickle of the object) and one ``.npy`` member per
NumPy array it contains, so parameters are stored in NumPy's own format (readable with
``numpy.load`` on the extracted member) instead of inside the pickle stream. An array that
is the value of a named shared variable is stored under that name (``W.npy``, ``W_2.npy``
when two share a name). GPU shared variables pickle as host arrays (see
``symgpu.gpu.placement.type.GpuArraySharedVariable.__reduce__``), so they are stored the same way
and load on machines with or without a GPU.

`StripPickler` drops the creation traces (`tag.trace`) of variables and nodes, which
name files of the machine that built the graph and only serve error messages.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from typing import Any, BinaryIO, Callable

import numpy as np

from symgpu.compile.sharedvalue import Container
from symgpu.graph.basic import Scratchpad, VariableTag

__all__ = ["dump", "load", "StripPickler", "CompatUnpickler", "PersistentNdarrayID",
           "PersistentSharedVariableID", "PersistentNdarrayLoad"]

#: the tag classes StripPickler strips (a Variable's tag is a VariableTag)
_TAGS = (Scratchpad, VariableTag)

#: member names that cannot hold arrays
_RESERVED = {"pkl"}


class CompatUnpickler(pickle.Unpickler):
    """Theano's: an unpickler that also reads pickles written by Python 2 (their byte strings
    decoded as latin-1, which keeps NumPy arrays' bytes intact)."""

    def __init__(self, file: BinaryIO, **kwargs: Any) -> None:
        kwargs.setdefault("encoding", "latin1")
        super().__init__(file, **kwargs)


class StripPickler(pickle.Pickler):
    """A Pickler that removes `tag.trace` from variables and Apply nodes as it saves them
    (Theano's StripPickler); `protocol` defaults to the highest."""

    def __init__(self, file: BinaryIO, protocol: int | None = None,
                 extra_tag_to_remove: list[str] | None = None):
        super().__init__(file, pickle.HIGHEST_PROTOCOL if protocol is None else protocol)
        self.tag_to_remove = ["trace", "test_value"] + list(extra_tag_to_remove or [])

    def reducer_override(self, obj: Any) -> Any:
        # the objects being saved are left alone: a tag is saved as a copy without them
        if type(obj) in _TAGS and any(k in obj.__dict__ for k in self.tag_to_remove):
            kept = {k: v for k, v in obj.__dict__.items() if k not in self.tag_to_remove}
            if type(obj) is VariableTag:  # a variable's tag keeps its type (test-value checks)
                return (_variable_tag, (obj._type, kept))
            return (_scratchpad, (kept,))
        if type(obj) is Container:
            # the value as it will be pickled (a GPU value as a host array), named after
            # the shared variable when the persistent ids store arrays by name
            rebuild, (ctype, value, name) = obj.__reduce__()
            namer = getattr(getattr(self, "persistent_id", None), "name_array", None)
            if namer is not None and name:
                namer(value, name)
            return (rebuild, (ctype, value, name))
        return NotImplemented


def _variable_tag(vtype: Any, state: dict) -> VariableTag:
    tag = VariableTag(vtype)
    tag.__dict__.update(state)
    return tag


def _scratchpad(state: dict) -> Scratchpad:
    pad = Scratchpad()
    pad.__dict__.update(state)
    return pad


class PersistentNdarrayID:
    """`persistent_id` that writes each NumPy array (not of dtype object) to the zip as an
    ``.npy`` member and pickles only its name; an array met twice is written once."""

    def __init__(self, zip_file: zipfile.ZipFile):
        self.zip_file = zip_file
        self.count = 0
        self.seen: dict[int, str] = {}
        self._keep: list[Any] = []  # ids stay valid while the dump runs

    def _resolve_name(self, obj: np.ndarray) -> str:
        self.count += 1
        return str(self.count - 1)

    def __call__(self, obj: Any) -> str | None:
        if type(obj) is np.ndarray and obj.dtype.kind != "O":
            key = id(obj)
            if key not in self.seen:
                name = self._resolve_name(obj)
                with self.zip_file.open(f"{name}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, obj, allow_pickle=False)
                self.seen[key] = f"ndarray.{name}"
                self._keep.append(obj)
            return self.seen[key]
        return None


class PersistentSharedVariableID(PersistentNdarrayID):
    """Like PersistentNdarrayID, naming the value of a named shared variable after it."""

    def __init__(self, zip_file: zipfile.ZipFile, allow_unnamed: bool = True,
                 allow_duplicates: bool = True):
        super().__init__(zip_file)
        self.allow_unnamed = allow_unnamed
        self.allow_duplicates = allow_duplicates
        self.names: dict[int, str] = {}
        self.used: dict[str, int] = {}

    def _resolve_name(self, obj: np.ndarray) -> str:
        name = self.names.get(id(obj))
        if name is None:
            if not self.allow_unnamed:
                raise ValueError(f"an array of shape {obj.shape} is not the value of a named "
                                 "shared variable (allow_unnamed=False)")
            return super()._resolve_name(obj)
        return name

    def name_array(self, value: Any, name: str) -> None:
        """Store `value` (a shared variable's value about to be pickled) as ``name.npy``."""
        if type(value) is not np.ndarray or id(value) in self.names:
            return
        if name in _RESERVED:
            raise ValueError(f"a shared variable cannot be named {name!r} in a zip pickle "
                             "(the name is reserved)")
        n = self.used.get(name, 0) + 1
        if n > 1 and not self.allow_duplicates:
            raise ValueError(f"two shared variables are named {name!r} (allow_duplicates=False)")
        self.used[name] = n
        self.names[id(value)] = name if n == 1 else f"{name}_{n}"
        self._keep.append(value)


class PersistentNdarrayLoad:
    """`persistent_load` reading the ``.npy`` members written by PersistentNdarrayID."""

    def __init__(self, zip_file: zipfile.ZipFile):
        self.zip_file = zip_file
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, persid: str) -> np.ndarray:
        kind, _, name = persid.partition(".")
        if kind != "ndarray":
            raise pickle.UnpicklingError(f"unknown persistent id {persid!r} in the zip pickle")
        if name not in self.cache:
            with self.zip_file.open(f"{name}.npy") as fh:
                self.cache[name] = np.lib.format.read_array(fh, allow_pickle=False)
        return self.cache[name]


def dump(obj: Any, file_handler: BinaryIO, protocol: int | None = None,
         persistent_id: Callable[[zipfile.ZipFile], Any] = PersistentSharedVariableID) -> None:
    """Pickle `obj` into a zip archive written to `file_handler` (an open binary file):
    the pickle as member ``pkl``, each NumPy array as an ``.npy`` member."""
    with zipfile.ZipFile(file_handler, "w", compression=zipfile.ZIP_DEFLATED,
                         allowZip64=True) as zf:
        buf = io.BytesIO()  # arrays are written to the zip while the pickle is made
        pickler = StripPickler(buf, protocol=protocol)
        pickler.persistent_id = persistent_id(zf)
        pickler.dump(obj)
        zf.writestr("pkl", buf.getvalue())


def load(f: BinaryIO, persistent_load: Callable[[zipfile.ZipFile], Any] = PersistentNdarrayLoad
         ) -> Any:
    """Load an object saved by `dump` from an open binary file."""
    with zipfile.ZipFile(f, "r") as zf:
        with zf.open("pkl") as fh:
            unpickler = pickle.Unpickler(fh)
            unpickler.persistent_load = persistent_load(zf)
            return unpickler.load()
