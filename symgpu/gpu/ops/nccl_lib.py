"""The NCCL binding: loading libnccl (the system's, or NVIDIA's ``nvidia-nccl-cu13`` wheel's
``nvidia/nccl/lib/libnccl.so.2``), the entry points with their C signatures declared (no NCCL
header needed), result names, and the argument building of each collective.

Why apart from collectives.py: tests replace the library by a fake that records calls, so the
argument mapping (dtype and reduce-op enums, counts, the unique id passed by value) is tested
without a GPU.  Loading happens on first use, never on import.
Non-blocking setup: ``ncclCommInitRankConfig`` with an ``ncclConfig_t`` whose ``blocking`` is 0
returns at once (ncclInProgress) and the caller polls ``ncclCommGetAsyncError`` under its own
deadline (collectives.py).  The struct is declared in its 2.17 layout (``NcclConfig``: size,
magic 0xcafebeef, version 21700, blocking, cgaClusterSize, minCTAs, maxCTAs, netName,
splitShare): NCCL (2.17 .. 2.31 at least) copies ``min(size, its own sizeof)`` bytes over its
NCCL_CONFIG_INITIALIZER and resets the fields newer than ``version`` to their defaults, so this
prefix with version 21700 is exact for every later library.
Enums (nccl.h): ncclDataType_t int8=0 uint8=1 int32=2 uint32=3 int64=4 uint64=5 float16=6
float32=7 float64=8 bfloat16=9; ncclRedOp_t sum=0 prod=1 max=2 min=3 avg=4 (NCCL >= 2.10).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from typing import Any

__all__ = ["NcclError", "Nccl", "nccl", "NcclUniqueId", "NCCL_DTYPES", "NCCL_OPS",
           "NCCL_RESULTS", "library_candidates", "IN_PROGRESS", "NcclConfig", "CONFIG_MAGIC",
           "CONFIG_VERSION", "CONFIG_UNDEF_INT"]

NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "bool": 1}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
NCCL_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
                3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
                6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout"}
IN_PROGRESS = 7
CONFIG_MAGIC = 0xCAFEBEEF
CONFIG_VERSION = 21700            # NCCL_VERSION(2, 17, 0): the layout NcclConfig declares
CONFIG_UNDEF_INT = -2 ** 31       # NCCL_CONFIG_UNDEF_INT (INT_MIN): "NCCL's default"


class NcclUniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes, passed by value to ncclCommInitRank."""
    _fields_ = [("internal", ctypes.c_char * 128)]


class NcclConfig(ctypes.Structure):
    """ncclConfig_t in its NCCL 2.17 layout (the prefix of every later version's), filled as
    NCCL_CONFIG_INITIALIZER does, with ``blocking`` set by the caller."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint),
                ("version", ctypes.c_uint), ("blocking", ctypes.c_int),
                ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p),
                ("splitShare", ctypes.c_int)]

    @classmethod
    def initializer(cls, blocking: int = CONFIG_UNDEF_INT) -> "NcclConfig":
        u = CONFIG_UNDEF_INT
        return cls(ctypes.sizeof(cls), CONFIG_MAGIC, CONFIG_VERSION, blocking, u, u, u, None,
                   u)


_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
#: name -> (argtypes, restype); those of _OPTIONAL may be missing (older libraries)
_SIGNATURES: dict[str, tuple[list, Any]] = {
    "ncclGetVersion": ([ctypes.POINTER(_I)], _I),
    "ncclGetUniqueId": ([ctypes.POINTER(NcclUniqueId)], _I),
    "ncclCommInitRank": ([ctypes.POINTER(_P), _I, NcclUniqueId, _I], _I),
    "ncclCommInitRankConfig": ([ctypes.POINTER(_P), _I, NcclUniqueId, _I,
                                ctypes.POINTER(NcclConfig)], _I),
    "ncclAllReduce": ([_P, _P, _S, _I, _I, _P, _P], _I),
    "ncclBroadcast": ([_P, _P, _S, _I, _I, _P, _P], _I),
    "ncclAllGather": ([_P, _P, _S, _I, _P, _P], _I),
    "ncclReduceScatter": ([_P, _P, _S, _I, _I, _P, _P], _I),
    "ncclCommGetAsyncError": ([_P, ctypes.POINTER(_I)], _I),
    "ncclCommAbort": ([_P], _I),
    "ncclCommDestroy": ([_P], _I),
    "ncclCommFinalize": ([_P], _I),
    "ncclGetErrorString": ([_I], ctypes.c_char_p),
    "ncclGetLastError": ([_P], ctypes.c_char_p),
}

_OPTIONAL = {"ncclCommInitRankConfig", "ncclCommFinalize"}


class NcclError(RuntimeError):
    """An NCCL call failed (or the library could not be loaded)."""


def library_candidates() -> list[str]:
    """Where libnccl.so.2 may be: the loader's path, then the pip wheel's directory."""
    names = ["libnccl.so.2"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(root, "nccl", "lib", "libnccl.so.2")
        if os.path.exists(lib):
            names.append(lib)
    return names


def _load() -> Any:
    errors = []
    for name in library_candidates():
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise NcclError("NCCL could not be loaded (" + "; ".join(errors) + "); install it "
                    "system-wide or `pip install nvidia-nccl-cu13` (the `cuda` extra)")


class Nccl:
    """The loaded library (``lib``: a CDLL or a test's fake with the same entry points) and
    the calls collectives.py makes, each argument converted for its C type and each result
    checked."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = _load() if lib is None else lib
        self.missing: set[str] = set()
        for name, (args, res) in _SIGNATURES.items():
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                if name not in _OPTIONAL:
                    raise
                self.missing.add(name)
                continue
            fn.argtypes, fn.restype = args, res

    @property
    def has_nonblocking_init(self) -> bool:
        """Whether the library has ncclCommInitRankConfig (NCCL >= 2.14)."""
        return "ncclCommInitRankConfig" not in self.missing

    def error_text(self, status: int, comm: Any = None) -> str:
        name = NCCL_RESULTS.get(status, str(status))
        text = self.lib.ncclGetErrorString(status)
        last = self.lib.ncclGetLastError(comm)
        out = name + (f" ({text.decode()})" if text else "")
        return out + (f": {last.decode()}" if last else "")

    def check(self, status: int, what: str, comm: Any = None) -> int:
        """Raise for a failed call; return the status (0, or IN_PROGRESS: a non-blocking
        communicator's call still under way, for the caller to wait on)."""
        if status and status != IN_PROGRESS:
            raise NcclError(f"{what} failed: {self.error_text(status, comm)}")
        return int(status)

    def version(self) -> int:
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self) -> bytes:
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), 128)

    def comm_init_rank(self, nranks: int, uid: bytes, rank: int,
                       blocking: bool = True) -> tuple[ctypes.c_void_p, int]:
        """(communicator, status).  ``blocking=False`` with a library that has
        ncclCommInitRankConfig: a non-blocking communicator whose setup may still be under
        way (status IN_PROGRESS: poll ``async_error``); else the blocking ncclCommInitRank."""
        if len(uid) != 128:
            raise ValueError(f"an NCCL unique id has 128 bytes, got {len(uid)}")
        comm = ctypes.c_void_p()
        ident = NcclUniqueId.from_buffer_copy(uid)
        what = f"rank {rank} of {nranks}"
        if blocking or not self.has_nonblocking_init:
            status = self.lib.ncclCommInitRank(ctypes.byref(comm), int(nranks), ident,
                                               int(rank))
            return comm, self.check(status, f"ncclCommInitRank ({what})")
        self._config = NcclConfig.initializer(blocking=0)   # kept alive during the setup
        status = self.lib.ncclCommInitRankConfig(ctypes.byref(comm), int(nranks), ident,
                                                 int(rank), ctypes.byref(self._config))
        return comm, self.check(status, f"ncclCommInitRankConfig ({what})", comm)

    @staticmethod
    def _dtype(dtype: str) -> int:
        if str(dtype) not in NCCL_DTYPES:
            raise TypeError(f"NCCL has no data type for {dtype}; supported: "
                            f"{sorted(NCCL_DTYPES)}")
        return NCCL_DTYPES[str(dtype)]

    @staticmethod
    def _op(op: str) -> int:
        if op not in NCCL_OPS:
            raise ValueError(f"NCCL has no reduce op {op!r}; supported: {sorted(NCCL_OPS)}")
        return NCCL_OPS[op]

    def all_reduce(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any,
                   stream: int) -> int:
        st = self.lib.ncclAllReduce(_P(send), _P(recv), _S(count), self._dtype(dtype),
                                    self._op(op), comm, _P(stream))
        return self.check(st, "ncclAllReduce", comm)

    def broadcast(self, send: int, recv: int, count: int, dtype: str, root: int, comm: Any,
                  stream: int) -> int:
        """In place when ``send == recv`` (NCCL allows it)."""
        st = self.lib.ncclBroadcast(_P(send), _P(recv), _S(count), self._dtype(dtype),
                                    int(root), comm, _P(stream))
        return self.check(st, "ncclBroadcast", comm)

    def all_gather(self, send: int, recv: int, count: int, dtype: str, comm: Any,
                   stream: int) -> int:
        """``count``: elements each rank sends."""
        st = self.lib.ncclAllGather(_P(send), _P(recv), _S(count), self._dtype(dtype), comm,
                                    _P(stream))
        return self.check(st, "ncclAllGather", comm)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any,
                       stream: int) -> int:
        """``count``: elements each rank receives."""
        st = self.lib.ncclReduceScatter(_P(send), _P(recv), _S(count), self._dtype(dtype),
                                        self._op(op), comm, _P(stream))
        return self.check(st, "ncclReduceScatter", comm)

    def async_error(self, comm: Any) -> int:
        """ncclCommGetAsyncError's result (0: none, 7: still in progress)."""
        res = ctypes.c_int()
        self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(res)),
                   "ncclCommGetAsyncError", comm)
        return res.value

    def abort(self, comm: Any) -> None:
        self.lib.ncclCommAbort(comm)

    @property
    def has_finalize(self) -> bool:
        """Whether the library has ncclCommFinalize (NCCL >= 2.14)."""
        return "ncclCommFinalize" not in self.missing

    def finalize(self, comm: Any) -> int:
        """Start flushing the communicator's outstanding work (a non-blocking communicator
        answers IN_PROGRESS: poll ``async_error`` until it is done, then ``destroy``)."""
        return self.check(self.lib.ncclCommFinalize(comm), "ncclCommFinalize", comm)

    def destroy(self, comm: Any) -> None:
        self.check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")   # IN_PROGRESS: freed
                                                                         # in the background


_nccl: Any = None
_lock = threading.Lock()


def nccl() -> Any:
    """The process's NCCL binding, loaded on first use (tests replace ``_nccl``)."""
    global _nccl
    if _nccl is None:
        with _lock:
            if _nccl is None:
                _nccl = Nccl()
    return _nccl
