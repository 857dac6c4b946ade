"""The private on-disk cache both compilers share (nvcc's cubins, the C compiler's shared
libraries), under ``config.compiledir``.

Why private: a cache entry is code we load into this process, so a directory another user
could write into would let them plant it. Entries are written through a temp file and
``os.replace`` next to a sha256 sidecar that is checked before use; a ``filelock.FileLock``
per entry makes concurrent processes build an entry once (``build_once``).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from typing import Callable, Sequence

from symgpu.config import config

__all__ = ["check_private_dir", "private_dir", "cache_subdir", "read_entry", "atomic_write",
           "build_once", "run_compiler"]

_lock = threading.RLock()
_checked_dirs: set[str] = set()


def check_private_dir(path: str) -> None:
    """Refuse a directory that others could write into: they could plant code we load."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"symgpu compiledir {path!r} is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(
            f"symgpu compiledir {path!r} is owned by uid {st.st_uid}, not by you "
            f"(uid {os.getuid()}): refusing to load kernels another user could have written. "
            f"Set the compiledir flag to a directory of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"symgpu compiledir {path!r} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):#o}): refusing to load kernels others could replace. "
            f"Run `chmod 700 {path}` or set the compiledir flag to a private directory.")


def private_dir(path: str) -> str:
    """Create ``path`` mode 0700 if missing, then check it is private (once per process)."""
    if path in _checked_dirs:
        return path
    os.makedirs(path, mode=0o700, exist_ok=True)
    check_private_dir(path)
    with _lock:
        _checked_dirs.add(path)
    return path


def cache_subdir(name: str) -> str:
    """``<compiledir>/<name>``, created and checked (0700, owned by us) on first use."""
    root = config.compiledir
    if not root:
        raise PermissionError("the compiledir flag is empty: set it to a private directory")
    private_dir(root)
    return private_dir(os.path.join(root, name))


def read_entry(path: str, sum_path: str) -> tuple[bytes | None, str]:
    """(bytes, '') when valid, else (None, why): 'absent', 'unreadable', 'checksum mismatch'."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        with open(sum_path, "r", encoding="ascii") as f:
            expected = f.read().strip()
    except FileNotFoundError:
        return None, "absent"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({exc})"
    if not data or hashlib.sha256(data).hexdigest() != expected:
        return None, "checksum mismatch"
    return data, ""


def atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # any failure, interrupts too: remove the partial file, re-raise
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def build_once(path: str, build: Callable[[], bytes]) -> tuple[bytes, bool, str]:
    """The entry at ``path`` (checked against ``path + '.sha256'``), built by ``build()``
    under the entry's file lock when absent or damaged. Returns (bytes, hit, why missed)."""
    sum_path = path + ".sha256"
    data, why = read_entry(path, sum_path)
    if data is not None:
        return data, True, ""
    from filelock import FileLock
    with FileLock(path + ".lock"):
        data, why = read_entry(path, sum_path)  # another process may have finished it
        if data is not None:
            return data, True, ""
        data = build()
        atomic_write(path, data)
        atomic_write(sum_path, hashlib.sha256(data).hexdigest().encode() + b"\n")
    return data, False, why


def run_compiler(root: str, name: str, source: str, suffixes: tuple[str, str],
                 command: Callable[[str, str], Sequence[str]],
                 failure: Callable[[int, str, str, Sequence[str]], Exception]) -> bytes:
    """Write `source` to a private temp dir under `root`, run ``command(source_path,
    output_path)`` and return the output's bytes. On failure the source is kept in
    ``root/failed`` and ``failure(exit code, compiler messages, kept path, command)`` is
    raised."""
    work = tempfile.mkdtemp(prefix="build-", dir=root)
    src = os.path.join(work, name + suffixes[0])
    out = os.path.join(work, name + suffixes[1])
    with open(src, "w", encoding="utf-8") as f:
        f.write(source)
    cmd = list(command(src, out))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            with open(out, "rb") as f:
                return f.read()
        kept = os.path.join(private_dir(os.path.join(root, "failed")), name + suffixes[0])
        os.replace(src, kept)
        raise failure(proc.returncode, (proc.stderr or proc.stdout).strip(), kept, cmd)
    finally:
        shutil.rmtree(work, ignore_errors=True)
