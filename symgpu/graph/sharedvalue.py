"""Shared variables: symbolic variables with a value that lives across function calls."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.token_lock import TokenLock
from symgpu.graph.basic import Variable

__all__ = ["SharedVariable", "shared", "register_shared_constructor", "shared_constructor",
           "Container",
           "update_locks"]


#: serialises update_locks (compile time only)
_BINDING = threading.Lock()


class Container:
    """The one-element cell that holds a shared value; compiled functions read it at the
    start of each call. `lock` serialises the calls that update it (and set_value /
    get_value) so that no update is lost. Values that functions update together share one
    lock (`update_locks`); a call takes its locks in their `order` (no deadlock)."""

    __slots__ = ("storage", "type", "name", "lock", "bound")

    def __init__(self, type, value: Any, name: str | None):
        self.type = type
        self.storage = [value]
        self.name = name
        #: re-entrant (a callback inside a call may read the value); taken by a call's
        #: generated code with one list pop (graph/token_lock.py)
        self.lock = TokenLock()
        #: a compiled function takes `lock` for its updates: it never changes again
        self.bound = False

    @property
    def value(self) -> Any:
        return self.storage[0]

    @property
    def order(self) -> int:
        """The global order of this value's lock (the order in which a call takes locks)."""
        return self.lock.order

    def locked(self) -> "_Held":
        """`with container.locked():` holds its update lock (set_value, get_value): the
        lock of a value no function updates yet may be swapped for a shared one meanwhile,
        so the one taken is checked to be the one it has."""
        return _Held(self)

    def __reduce__(self):
        # the lock and the order are made anew on load; a type may pickle its values in
        # another form (`value_to_pickle`: a GPU array as a host array) and choose, on load,
        # the type and value the container takes there (`value_from_pickle`)
        with self.locked():
            value = self.storage[0]
        to_pickle = getattr(self.type, "value_to_pickle", None)
        if to_pickle is not None:
            value = to_pickle(value)
        return (_rebuild_container, (self.type, value, self.name))


class _Held:
    """Container.locked(): takes the container's current lock (retrying if it was swapped
    while this thread waited for the old one)."""

    __slots__ = ("container", "lock")

    def __init__(self, container: Container):
        self.container = container

    def __enter__(self) -> None:
        container = self.container
        while True:
            lock = container.lock
            lock.acquire()
            if lock is container.lock:
                self.lock = lock
                return
            lock.release()

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


def update_locks(containers: Sequence[Container]) -> list[Any]:
    """The locks a call that updates `containers` takes, in the global order (no deadlock
    between functions whose sets overlap). Values no compiled function updates yet take the
    lock of the lowest-ordered one updated with them, so a function that updates many values
    (a training step: every parameter) takes one lock, not one per value (each costs a call
    tens of nanoseconds, and is one more to wait for). Once bound here a value's lock never
    changes (a call's generated code holds it); a value swapped meanwhile is waited for under
    its old lock."""
    with _BINDING:
        bound = [c for c in containers if c.bound]
        fresh = [c for c in containers if not c.bound]
        if fresh:
            target = min(bound or fresh, key=lambda c: c.order)
            for c in fresh:
                if c.lock is not target.lock:
                    with c.locked():  # no get_value / set_value of c is in flight
                        c.lock = target.lock
        for c in containers:
            c.bound = True
        locks = {c.order: c.lock for c in containers}
    return [locks[k] for k in sorted(locks)]


def _rebuild_container(type, value: Any, name: str | None) -> Container:
    from_pickle = getattr(type, "value_from_pickle", None)
    if from_pickle is not None:
        type, value = from_pickle(value)
    return Container(type, value, name)


class SharedVariable(Variable):
    """A variable whose value is stored with it and shared by every function that uses it."""

    #: how the value is shown to the user and taken back, or None (as it is): an object with
    #: ``present(host_value)`` (what get_value returns) and ``accept(value)`` (what set_value
    #: hands the type). A random stream's state is shown as a RandomState-like object
    #: (tensor/random/state.py) while functions see its plain uint32 words.
    value_view: Any = None

    def __init__(self, type, value: Any, name: str | None = None, strict: bool = False,
                 allow_downcast: bool | None = None, container: Container | None = None):
        super().__init__(type, None, None, name)
        if container is None:
            container = Container(type, type.filter(value, strict=strict, allow_downcast=allow_downcast), name)
        self.container = container

    def get_value(self, borrow: bool = False, return_internal_type: bool = False) -> Any:
        """The current value; a copy unless `borrow=True` (then it may be the internal buffer)."""
        with self.container.locked():  # not while a call is between reading and updating it
            value = self.container.storage[0]
            if not borrow:
                value = self._copy_out(value)
        return value if self.value_view is None else self.value_view.present(value)

    def set_value(self, value: Any, borrow: bool = False) -> None:
        """Replace the value (checked against the type; copied unless `borrow=True`).

        A value of another ndim or an unsafe dtype is refused and nothing changes."""
        if self.value_view is not None:
            value = self.value_view.accept(value)
        new = self.type.filter(value, strict=False, allow_downcast=None)
        if new is value and not borrow:
            new = self._copy_in(new)
        with self.container.locked():  # after (not inside) any call updating it
            self.container.storage[0] = new

    def _copy_out(self, value: Any) -> Any:
        return value.copy()

    def _copy_in(self, value: Any) -> Any:
        return value.copy()

    def clone(self) -> "SharedVariable":
        cp = super().clone()
        cp.container = self.container
        return cp

    @property
    def value(self) -> Any:
        return self.get_value()

    def __str__(self) -> str:
        return self.name if self.name is not None else f"<{self.type}>"

    __repr__ = __str__


#: constructors tried in order (most recently registered first); each returns a
#: SharedVariable or raises TypeError to let the next one try
_CONSTRUCTORS: list[Callable[..., SharedVariable]] = []


def register_shared_constructor(fn: Callable[..., SharedVariable], fallback: bool = False
                                ) -> Callable[..., SharedVariable]:
    """Register a constructor for `shared()`; later registrations are tried first.
    `fallback=True`: tried after every other one (a host constructor for values a device
    constructor may take first, whichever of the two modules loads last)."""
    if fallback:
        _CONSTRUCTORS.append(fn)
    else:
        _CONSTRUCTORS.insert(0, fn)
    return fn


def shared_constructor(ctor: Callable[..., SharedVariable], remove: bool = False
                       ) -> Callable[..., SharedVariable]:
    """Theano's name: register `ctor` for `shared()` (tried before earlier ones), or with
    ``remove=True`` take it out of the list again."""
    if remove:
        if ctor in _CONSTRUCTORS:
            _CONSTRUCTORS.remove(ctor)
        return ctor
    return register_shared_constructor(ctor)


def shared(value: Any, name: str | None = None, borrow: bool = False, strict: bool = False,
           allow_downcast: bool | None = None, target: str | None = "default", **kwargs: Any) -> SharedVariable:
    """A shared variable holding `value` (copied unless `borrow=True`).

    With `device=cuda`, float32 arrays live on the GPU; scalar integers stay on the host.
    `target='cpu'` or a context name forces the place.
    """
    if isinstance(value, Variable):
        raise TypeError(f"shared() takes a value, not a symbolic variable ({value})")
    errors = []
    for ctor in _CONSTRUCTORS:
        try:
            return ctor(value, name=name, borrow=borrow, strict=strict,
                        allow_downcast=allow_downcast, target=target, **kwargs)
        except TypeError as exc:
            errors.append(f"{getattr(ctor, '__name__', ctor)}: {exc}")
    raise TypeError(f"no shared-variable type accepts {type(value).__name__} value "
                    f"{np.asarray(value).dtype if hasattr(value, '__len__') else value!r}: "
                    + "; ".join(errors))
