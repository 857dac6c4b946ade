"""Key-value stores for the rendezvous and the host collectives: set, get (waiting for the key
up to a timeout), add (a counter) and delete.

Why a store: NCCL's unique id (128 bytes), the graphs' collective schedules and, without a GPU,
the host collectives' data must travel between processes that only share the launcher's
rendezvous address.  Three implementations of one interface:

- ``MemoryStore``: one process (the fake worlds of threads the tests use);
- ``TCPStore``: a small TCP server run by rank 0 on MASTER_ADDR:MASTER_PORT, and its clients
  (a length-prefixed binary protocol, nothing is unpickled);
- ``TorchStore``: torch.distributed's TCPStore client, for torchrun: its agent already serves
  a store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE), so a server of ours there would collide.
"""
from __future__ import annotations

import abc
import socket
import socketserver
import struct
import threading
import time
from datetime import timedelta
from typing import Any

__all__ = ["Store", "MemoryStore", "TCPStore", "TorchStore", "StoreTimeout"]


class StoreTimeout(TimeoutError):
    """A key did not appear within the timeout (a peer died, hangs or runs another program)."""


class Store(abc.ABC):
    """The interface: ``set(key, bytes)``, ``get(key, timeout) -> bytes``,
    ``add(key, n) -> int``, ``delete(key)``."""

    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (waking the getters)."""

    @abc.abstractmethod
    def get(self, key: str, timeout: float) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` s for it (StoreTimeout after)."""

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` (0 when new); its new value."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Forget ``key`` (nothing when absent)."""

    def close(self) -> None:
        """Release connections (and stop a server this process runs)."""


class MemoryStore(Store):
    """A store in this process: a dict and a condition (thread-safe)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self._cond:
            self._data[key] = bytes(value)
            self._cond.notify_all()

    def get(self, key: str, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeout(f"key {key!r} not set within {timeout:g} s")
                self._cond.wait(left)
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def delete(self, key: str) -> None:
        with self._cond:
            self._data.pop(key, None)


# ----------------------------------------------------------------------------- TCP
# request: op (1 byte) | key length (u32) | key | value length (u64) | value
# reply:   status (1 byte: 0 ok, 1 timeout) | value length (u64) | value
_SET, _GET, _ADD, _DEL = b"S", b"G", b"A", b"D"
_HEAD = struct.Struct("!cI")
_LEN = struct.Struct("!Q")


def _recv(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the store's peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        store: MemoryStore = self.server.memory   # type: ignore[attr-defined]
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                op, klen = _HEAD.unpack(_recv(sock, _HEAD.size))
                key = _recv(sock, klen).decode()
                (vlen,) = _LEN.unpack(_recv(sock, _LEN.size))
                value = _recv(sock, vlen)
                status, out = b"\0", b""
                if op == _SET:
                    store.set(key, value)
                elif op == _GET:
                    try:
                        out = store.get(key, float(value.decode()))
                    except StoreTimeout:
                        status = b"\1"
                elif op == _ADD:
                    out = str(store.add(key, int(value.decode()))).encode()
                elif op == _DEL:
                    store.delete(key)
                sock.sendall(status + _LEN.pack(len(out)) + out)
        except (ConnectionError, OSError):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class TCPStore(Store):
    """A client of rank 0's store at ``host:port``; ``serve=True`` (rank 0) also starts the
    server there, in a daemon thread.  Each thread gets its own connection."""

    def __init__(self, host: str, port: int, serve: bool = False,
                 connect_timeout: float = 60.0) -> None:
        self.host, self.port = host, int(port)
        self._server: _Server | None = None
        if serve:
            self._server = _Server(("", self.port), _Handler)
            self._server.memory = MemoryStore()   # type: ignore[attr-defined]
            self.port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, name="symgpu-store",
                             daemon=True).start()
        self._connect_timeout = connect_timeout
        self._tls = threading.local()

    def _sock(self) -> socket.socket:
        sock = getattr(self._tls, "sock", None)
        if sock is None:
            deadline = time.monotonic() + self._connect_timeout
            while True:
                try:
                    sock = socket.create_connection((self.host, self.port), timeout=5)
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise StoreTimeout(f"cannot reach the rendezvous store at {self.host}:"
                                           f"{self.port} ({exc}); is rank 0 running?") from exc
                    time.sleep(0.1)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._tls.sock = sock
        return sock

    def _call(self, op: bytes, key: str, value: bytes, timeout: float | None = None) -> bytes:
        sock = self._sock()
        k = key.encode()
        sock.settimeout(None if timeout is None else timeout + 30.0)
        try:
            sock.sendall(_HEAD.pack(op, len(k)) + k + _LEN.pack(len(value)) + value)
            status = _recv(sock, 1)
            (n,) = _LEN.unpack(_recv(sock, _LEN.size))
            out = _recv(sock, n)
        except (OSError, ConnectionError) as exc:
            self._tls.sock = None
            raise StoreTimeout(f"the rendezvous store at {self.host}:{self.port} failed "
                               f"({type(exc).__name__}: {exc}): did rank 0 exit?") from exc
        if status != b"\0":
            raise StoreTimeout(f"key {key!r} not set within {timeout:g} s")
        return out

    def set(self, key: str, value: bytes) -> None:
        self._call(_SET, key, bytes(value))

    def get(self, key: str, timeout: float) -> bytes:
        return self._call(_GET, key, repr(float(timeout)).encode(), timeout)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(_ADD, key, str(int(amount)).encode()))

    def delete(self, key: str) -> None:
        self._call(_DEL, key, b"")

    def close(self) -> None:
        sock = getattr(self._tls, "sock", None)
        if sock is not None:
            sock.close()
            self._tls.sock = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class TorchStore(Store):
    """torch.distributed.TCPStore as a client of torchrun's agent store (keys prefixed
    ``symgpu/``, so they never meet torch's own)."""

    def __init__(self, host: str, port: int, world_size: int, timeout: float) -> None:
        # deferred: torch is optional; only a torchrun world without MPI uses it
        from torch.distributed import TCPStore as _TorchTCPStore
        self._store: Any = _TorchTCPStore(host, int(port), world_size, False,
                                          timedelta(seconds=timeout))

    def set(self, key: str, value: bytes) -> None:
        self._store.set("symgpu/" + key, bytes(value))

    def get(self, key: str, timeout: float) -> bytes:
        self._store.set_timeout(timedelta(seconds=timeout))
        try:
            return bytes(self._store.get("symgpu/" + key))
        except RuntimeError as exc:   # torch raises DistStoreError (a RuntimeError) on timeout
            raise StoreTimeout(f"key {key!r} not set within {timeout:g} s ({exc})") from exc

    def add(self, key: str, amount: int) -> int:
        return int(self._store.add("symgpu/" + key, int(amount)))

    def delete(self, key: str) -> None:
        self._store.delete_key("symgpu/" + key)
