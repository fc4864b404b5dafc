"""One uniform factory per lock name: the six shmlocks kinds and the anchors beside them.

Every measurement treats every lock alike through two small objects:

``Adapter`` (made in the parent by ``make(name, tag)``)
    ``name``, ``family`` ("shmlocks" or "anchor"), ``cross_process`` (False only for
    threading.Lock, which is measured with threads), ``attach()`` and ``close()``.
    A forked child inherits the adapter and calls ``attach()`` to get its own handle.

``Handle`` (one per process, from ``attach()``)
    ``acquire()`` / ``release()``: the fastest natural spelling a user would write
    (bound C methods, or ``functools.partial(fcntl.flock, fd, ...)``);
    ``cm``: the object used in ``with cm:``;
    ``acquire_timeout(seconds) -> bool``: a bounded acquire, for the owner-death figure;
    ``owner_died()`` / ``repair()``: the recovery verbs (False / no-op for the anchors);
    ``detach()``: drop per-process resources (the flock file descriptor).

Every name this module creates (shmlocks segments, posix_ipc semaphores, flock files)
starts with ``tag``, so that ``leftovers(tag)`` can prove the run left nothing behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import itertools
import multiprocessing
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import posix_ipc

import shmlocks

REFERENCE = "multiprocessing.Lock"
ANCHORS = ("threading.Lock", "multiprocessing.Lock", "posix_ipc.Semaphore", "fcntl.flock")
KINDS = tuple(shmlocks.KINDS)
NAMES = KINDS + ANCHORS
BROKEN = "no-op (broken on purpose)"

_FORK = multiprocessing.get_context("fork")
_serial = itertools.count()


def new_tag() -> str:
    """A prefix unique to this run: every name the bench creates starts with it."""
    return f"shmlocks-bench-{os.getpid()}-{os.urandom(3).hex()}-"


def _unique(tag: str, what: str) -> str:
    return f"{tag}{what}-{os.getpid()}-{next(_serial)}"


class Handle:
    """One process's view of a lock: the same verbs for every lock name."""

    __slots__ = ("acquire", "release", "cm", "_timed", "_died", "_repair", "_detach")

    def __init__(
        self,
        acquire: Callable[[], Any],
        release: Callable[[], Any],
        cm: Any,
        timed: Callable[[float], bool],
        died: Callable[[], bool] | None = None,
        repair: Callable[[], None] | None = None,
        detach: Callable[[], None] | None = None,
    ) -> None:
        self.acquire = acquire
        self.release = release
        self.cm = cm
        self._timed = timed
        self._died = died
        self._repair = repair
        self._detach = detach

    def acquire_timeout(self, seconds: float) -> bool:
        return self._timed(seconds)

    def owner_died(self) -> bool:
        return self._died() if self._died is not None else False

    def repair(self) -> None:
        if self._repair is not None:
            self._repair()

    def detach(self) -> None:
        if self._detach is not None:
            self._detach()


class Adapter:
    name: str = ""
    family: str = "anchor"
    cross_process: bool = True

    def attach(self) -> Handle:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def reset_stats(self) -> None:
        """Zero the lock's own counters (shmlocks kinds; the anchors keep none)."""

    def stats(self) -> dict[str, Any] | None:
        """The lock's own counters (lock.stats()), or None for a lock that keeps none."""
        return None

    def __repr__(self) -> str:
        return f"<bench adapter {self.name}>"


class ShmlocksAdapter(Adapter):
    family = "shmlocks"

    def __init__(self, kind: str, tag: str) -> None:
        self.name = kind
        self.lock = shmlocks.KINDS[kind].create(name=_unique(tag, kind))

    def attach(self) -> Handle:
        lk = self.lock  # a forked child keeps using the object it inherited (SPEC)
        return Handle(
            lk.acquire,
            lk.release,
            lk,
            lambda t: lk.acquire(timeout=t),
            died=lambda: lk.owner_died,
            repair=lk.mark_consistent,
        )

    def close(self) -> None:
        self.lock.close()

    def reset_stats(self) -> None:
        self.lock.reset_stats()

    def stats(self) -> dict[str, Any] | None:
        return dict(self.lock.stats())


class ThreadingAdapter(Adapter):
    name = "threading.Lock"
    cross_process = False

    def __init__(self, tag: str) -> None:
        self.lock = threading.Lock()

    def attach(self) -> Handle:
        lk = self.lock
        return Handle(lk.acquire, lk.release, lk, lambda t: lk.acquire(timeout=t))


class MultiprocessingAdapter(Adapter):
    name = "multiprocessing.Lock"

    def __init__(self, tag: str) -> None:
        self.lock = _FORK.Lock()  # a POSIX semaphore, unlinked at creation by CPython

    def attach(self) -> Handle:
        lk = self.lock
        # lk.acquire / lk.release are the C methods of the SemLock (bound in _make_methods);
        # `with lk:` goes through SemLock.__enter__/__exit__, which are Python-level.
        return Handle(lk.acquire, lk.release, lk, lambda t: lk.acquire(timeout=t))


class PosixIpcAdapter(Adapter):
    name = "posix_ipc.Semaphore"

    def __init__(self, tag: str) -> None:
        self.sem = posix_ipc.Semaphore("/" + _unique(tag, "sem"), posix_ipc.O_CREX, initial_value=1)
        self._pid = os.getpid()

    def attach(self) -> Handle:
        sem = self.sem

        def timed(t: float) -> bool:
            try:
                sem.acquire(t)  # raises BusyError on timeout instead of returning False
            except posix_ipc.BusyError:
                return False
            return True

        return Handle(sem.acquire, sem.release, sem, timed)

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        try:
            self.sem.unlink()
        except posix_ipc.ExistentialError:
            pass
        self.sem.close()


class _AlarmTimeout(Exception):
    pass


def _raise_alarm(signum: int, frame: Any) -> None:
    raise _AlarmTimeout


class _Flock:
    """``with`` support for flock: what a user writes around a file descriptor."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> _Flock:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class FlockAdapter(Adapter):
    name = "fcntl.flock"

    def __init__(self, tag: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix=_unique(tag, "flock") + "-")
        os.close(fd)
        self._pid = os.getpid()

    def attach(self) -> Handle:
        # flock locks belong to an open file description: a forked child that used the
        # inherited descriptor would share the parent's lock, so every process opens its own.
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)

        def timed(t: float) -> bool:
            # flock has no timeout: bound the blocking call with an interval timer
            old = signal.signal(signal.SIGALRM, _raise_alarm)
            signal.setitimer(signal.ITIMER_REAL, t)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return True
            except _AlarmTimeout:
                return False
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

        return Handle(
            functools.partial(fcntl.flock, fd, fcntl.LOCK_EX),
            functools.partial(fcntl.flock, fd, fcntl.LOCK_UN),
            _Flock(fd),
            timed,
            detach=lambda: os.close(fd),
        )

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class BrokenAdapter(Adapter):
    """A lock that does not lock (acquire and release do nothing): the harness's self-check
    runs it to show that the exclusion checks can fail. Never part of NAMES."""

    name = BROKEN

    def __init__(self, tag: str) -> None:
        pass

    def attach(self) -> Handle:
        def nothing() -> None:
            return None

        return Handle(nothing, nothing, contextlib.nullcontext(), lambda t: True)


_ANCHOR_CLASSES: dict[str, type[Adapter]] = {
    "threading.Lock": ThreadingAdapter,
    "multiprocessing.Lock": MultiprocessingAdapter,
    "posix_ipc.Semaphore": PosixIpcAdapter,
    "fcntl.flock": FlockAdapter,
    BROKEN: BrokenAdapter,
}


def make(name: str, tag: str) -> Adapter:
    """A fresh lock called ``name`` (a kind, an anchor, or BROKEN), created in this process."""
    if name in shmlocks.KINDS:
        return ShmlocksAdapter(name, tag)
    try:
        cls = _ANCHOR_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown lock {name!r}; choose from {', '.join(NAMES)}") from None
    return cls(tag)  # type: ignore[call-arg]


def leftovers(tag: str) -> list[str]:
    """Paths this run created that still exist (segments, semaphores, flock files)."""
    pats = [
        os.path.join("/dev/shm", tag + "*"),
        os.path.join("/dev/shm", "sem." + tag + "*"),
        os.path.join(tempfile.gettempdir(), tag + "*"),
    ]
    return sorted(p for pat in pats for p in glob.glob(pat))
