"""TokenLock: a re-entrant lock whose uncontended take and give are a list pop and append.

Two locks are taken on every call of a compiled function: the lock of the shared values it
updates (`Container.lock`, which also guards the function's frame: compile/frames.py) and, on
the GPU, its context's call lock (`GpuContext.call_lock`, gpu/exec/graphs.py). Generated code
takes them with one list ``pop`` of the token and gives them back with one ``append``: a few
tens of nanoseconds, against about a tenth of a microsecond for an uncontended
``threading.RLock`` acquire and release, which is much of a small call's own overhead.

Everything else goes through :meth:`TokenLock.acquire` / :meth:`TokenLock.release` (or
``with lock:``), an RLock's contract: a thread waits (without spinning) while another holds
the lock, and a thread that holds it already (a callback inside a call reading a value with
``get_value``, or calling another function that takes the lock) goes on. The fast path
records no owner, so a thread that finds the token gone looks up its own stack for a frame
holding the lock (the name ``HELD_NAME`` among its locals): only on that slow path.
"""
from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

__all__ = ["TokenLock", "HELD_NAME"]

#: the local variable a hot path binds to the locks it took by their token (a tuple); a
#: thread that finds a lock's token gone looks for it up its own stack
HELD_NAME = "_symgpu_held"

#: creation order of locks: the global order in which a call takes several (no deadlock)
_ORDER = itertools.count()

_get_ident = threading.get_ident


class TokenLock:
    """A re-entrant lock whose uncontended take / give are a list pop / append.

    ``take()`` (raises IndexError while the lock is held) and ``give(None)`` are for hot
    paths, which must also bind ``HELD_NAME`` (a tuple holding this lock) while they hold it
    and call ``wake()`` after ``give`` when ``waiting`` is not empty. ``acquire`` / ``release``
    are for everything else. ``order`` is the global order in which a call takes several
    locks."""

    __slots__ = ("order", "take", "give", "waiting", "_token", "_mutex", "_owner", "_depth",
                 "_borrowed")

    def __init__(self) -> None:
        self._token = [None]        # one item while the lock is free
        self.order = next(_ORDER)
        self.take = self._token.pop
        self.give = self._token.append
        #: one locked threading.Lock per thread waiting for the token (a give releases one)
        self.waiting: list[threading.Lock] = []
        self._mutex = threading.Lock()   # guards `waiting`
        self._owner: int | None = None   # the thread holding it through acquire()
        self._depth = 0
        self._borrowed = False           # acquired inside a generated call that holds it

    def acquire(self, blocking: bool = True) -> bool:
        """Hold the lock: at once if it is free or this thread holds it already (then a
        matching release leaves it held), else after the thread holding it gives it back
        (``blocking=False``: return False instead of waiting)."""
        me = _get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        try:
            self.take()
            borrowed = False
        except IndexError:
            borrowed = _held_up_the_stack(self)
            if not borrowed:
                if not blocking:
                    return False
                self._wait()
        self._owner, self._depth, self._borrowed = me, 1, borrowed
        return True

    def __enter__(self) -> "TokenLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Undo one acquire; the last one gives the token back (unless it was borrowed from a
        generated call further up this thread's stack, which gives it back itself)."""
        if self._owner != _get_ident():
            raise RuntimeError("TokenLock.release: this thread does not hold the lock")
        self._depth -= 1
        if self._depth:
            return
        self._owner = None
        if not self._borrowed:
            self.give(None)
            if self.waiting:
                self.wake()

    def wake(self) -> None:
        """Wake one waiting thread (after a give): it takes the token or waits again."""
        with self._mutex:
            if self.waiting:
                self.waiting.pop(0).release()

    def _wait(self) -> None:
        """Block until this thread takes the token. A waiter registers before it tries the
        token once more, so a give that comes between the two either leaves the token for
        that try or finds the waiter to wake: no wake-up is lost."""
        while True:
            waiter = threading.Lock()
            waiter.acquire()
            with self._mutex:
                self.waiting.append(waiter)
            try:
                self.take()
            except IndexError:
                waiter.acquire()   # released by a wake(); then try again
                continue
            with self._mutex:      # took it without waiting: no longer a waiter
                if waiter in self.waiting:
                    self.waiting.remove(waiter)
            return

    def locked(self) -> bool:
        """Whether some thread holds the lock (a snapshot, for tests and diagnostics)."""
        return not self._token

    def __repr__(self) -> str:
        return f"<TokenLock #{self.order} {'held' if self.locked() else 'free'}>"


def _held_up_the_stack(lock: TokenLock) -> bool:
    """Whether a frame further up this thread's stack holds ``lock`` (bound it under
    HELD_NAME after taking its token): then this thread is inside that call, in a callback."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        if HELD_NAME in frame.f_code.co_varnames:
            held = frame.f_locals.get(HELD_NAME)
            if held is not None and any(h is lock for h in held):
                return True
        frame = frame.f_back
    return False
