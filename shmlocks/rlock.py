"""RLock: a reentrant lock across processes, on any kind (docs/design.md §12).

An RLock is a lock of any kind (``shmlocks.KINDS``) plus a recursion count. Only the
owning thread reads or writes the count, so it lives in this process, never in shared
memory: the shared state is the lock's alone, and so is recovery. A holder that dies at
any depth dies holding the lock once: the next owner gets ``owner_died`` (and a count of
1), exactly as for the lock itself.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from shmlocks import _core
from shmlocks.errors import NotOwnerError

if TYPE_CHECKING:
    # threading.Condition(rlock) works (the methods below are what it asks of its lock),
    # and typeshed accepts only the (final) stdlib locks there: to type checkers alone,
    # this is a threading.RLock (shmlocks/_core.pyi does the same for the locks).
    _RLockBase = threading.RLock
else:
    _RLockBase = object


class RLock(_RLockBase):  # type: ignore[misc]
    """RLock(kind="futex") -> a shared-memory ``threading.RLock`` on a lock of ``kind``.

    ``acquire(blocking=True, timeout=-1)``, ``release()``, ``with``, as threading's; the
    thread that holds it may acquire it again, and must release it as many times. If its
    holder dies (SIGKILL, crash), at whatever depth, the next owner's hold has
    ``owner_died`` True: repair, then ``mark_consistent()``, as for a lock.
    ``create(kind="futex", name=None, *, max_participants=None, mode=0o600,
    persist=False)``, ``open(name)``, ``close()``, ``unlink()`` and pickling are the
    lock's."""

    __slots__ = ("_lock", "_count", "_owner", "__weakref__")

    def __init__(
        self,
        kind: Any = "futex",
        name: str | None = None,
        *,
        max_participants: int | None = None,
        mode: int = 0o600,
        persist: bool = False,
        _lock: _core.Lock | None = None,
    ) -> None:
        if _lock is None:
            cls = _core.KINDS.get(kind) if isinstance(kind, str) else kind
            if not (isinstance(cls, type) and issubclass(cls, _core.Lock)):
                raise ValueError(f"unknown lock kind {kind!r}: expected one of {list(_core.KINDS)}")
            _lock = cls.create(name, max_participants=max_participants, mode=mode, persist=persist)
        self._lock = _lock
        self._count = 0
        self._owner: tuple[int, int] | None = None  # (pid, thread ident) of the holder

    @classmethod
    def create(
        cls,
        kind: Any = "futex",
        name: str | None = None,
        *,
        max_participants: int | None = None,
        mode: int = 0o600,
        persist: bool = False,
    ) -> RLock:
        """A new RLock on a new lock of ``kind`` (a segment of its own)."""
        return cls(kind, name, max_participants=max_participants, mode=mode, persist=persist)

    @classmethod
    def open_or_create(
        cls,
        name: str,
        kind: Any = "futex",
        *,
        max_participants: int | None = None,
        mode: int = 0o600,
        persist: bool = False,
    ) -> RLock:
        """Open the lock of segment ``name`` as an RLock, or create it (a lock of
        ``kind``, with these arguments) if there is none: atomic (``Kind.open_or_create``),
        so that of any number of processes racing on one name, all end up with the same
        lock. LockKindError if the existing one is of another kind (or not a lock); the
        arguments do not apply to a lock that exists already."""
        lock_cls = _core.KINDS.get(kind) if isinstance(kind, str) else kind
        if not (isinstance(lock_cls, type) and issubclass(lock_cls, _core.Lock)):
            raise ValueError(f"unknown lock kind {kind!r}: expected one of {list(_core.KINDS)}")
        lock = lock_cls.open_or_create(
            name, max_participants=max_participants, mode=mode, persist=persist
        )
        return cls(_lock=lock)

    @classmethod
    def open(cls, name: str) -> RLock:
        """Attach to the lock of segment ``name`` (of any kind) as an RLock."""
        return cls(_lock=_core.Lock.open(name))

    @classmethod
    def _wrap(cls, lock: _core.Lock) -> RLock:
        return cls(_lock=lock)

    # -- ownership: the count means something only to its owner ---------------------------

    def _mine(self) -> bool:
        return self._owner == (os.getpid(), threading.get_ident()) and self._count > 0

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        """Acquire, or add one level if this thread holds it already (returns True at once).
        The arguments are ``threading.RLock.acquire``'s (and the lock's)."""
        if self._mine():
            self._count += 1
            return True
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = (os.getpid(), threading.get_ident())
        self._count = 1
        return True

    __enter__ = acquire

    def release(self) -> None:
        """Remove one level; the last one releases the lock. RuntimeError (NotOwnerError)
        if this thread does not hold it."""
        if not self._mine():
            raise NotOwnerError("cannot release un-acquired lock")
        self._count -= 1
        if self._count == 0:
            self._owner = None
            self._lock.release()

    def __exit__(self, t: Any, v: Any, tb: Any) -> None:
        if not self._mine():
            raise NotOwnerError("cannot release un-acquired lock")
        self._count -= 1
        if self._count == 0:
            self._owner = None
            self._lock.__exit__(t, v, tb)  # an exception after owner_died hands it on

    # -- what threading.Condition asks of its lock ----------------------------------------

    def _is_owned(self) -> bool:
        return self._mine()

    def _release_save(self) -> tuple[int, tuple[int, int] | None]:
        if not self._mine():
            raise NotOwnerError("cannot release un-acquired lock")
        state = (self._count, self._owner)
        self._count = 0
        self._owner = None
        self._lock.release()
        return state

    def _acquire_restore(self, state: tuple[int, tuple[int, int] | None]) -> None:
        self._lock.acquire()
        self._count, self._owner = state

    def _recursion_count(self) -> int:
        return self._count if self._mine() else 0

    # -- the lock's --------------------------------------------------------------------------

    def locked(self) -> bool:
        """True if some thread holds it (a snapshot)."""
        return bool(self._lock.locked())

    @property
    def lock(self) -> _core.Lock:
        """The underlying lock."""
        return self._lock

    @property
    def kind(self) -> str:
        return str(self._lock.kind)

    @property
    def name(self) -> str:
        return str(self._lock.name)

    @property
    def owner(self) -> tuple[int, int] | None:
        return self._lock.owner

    @property
    def owner_died(self) -> bool:
        """True while this hold follows the death of a holder (at any depth)."""
        return bool(self._lock.owner_died)

    def mark_consistent(self) -> None:
        """Declare the protected data repaired after an owner death (holder only)."""
        self._lock.mark_consistent()

    def close(self) -> None:
        self._lock.close()

    def unlink(self) -> None:
        self._lock.unlink()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RLock._wrap, (self._lock,))

    def __repr__(self) -> str:
        try:
            st = "locked" if self._lock.locked() else "unlocked"
        except ValueError:
            st = "closed"
        return (
            f"<{st} shmlocks.RLock object kind={self._lock.kind!r} name={self._lock.name!r} "
            f"owner={self._owner!r} count={self._count} at {id(self):#x}>"
        )
