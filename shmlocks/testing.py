"""Helpers for testing your own recovery from SIGKILL.

``kill_while_holding(lock, target, *args, at=None)`` runs ``target(*args)`` in a child
process and SIGKILLs it while it holds ``lock``: at your crash point ``at``
(``shmlocks.crashpoint("transfer.debited")`` in your code), or, without ``at``, as soon as
an ``acquire`` of it has returned. Then your test takes the lock, checks ``owner_died`` and
runs your repair::

    pid = kill_while_holding(lock, transfer, accounts, 10, at="transfer.debited")
    with lock:
        assert lock.owner_died
        repair(accounts)
        lock.mark_consistent()
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from typing import Any

import shmlocks
from shmlocks import _core

__all__ = ["kill_while_holding"]

#: the library's point right after an acquire returned (the caller holds the lock)
_HOLDING = "lock.acquire.done"


def _child(
    spec: str, lock: shmlocks.Lock | None, target: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    # lock: the hold of which lock.acquire.done waits for (None: a user point, `at`)
    _core._arm_crashpoint(spec, "kill", lock)
    target(*args)


def kill_while_holding(
    lock: shmlocks.Lock,
    target: Callable[..., Any],
    *args: Any,
    at: str | None = None,
    timeout: float = 10,
    start_method: str | None = None,
) -> int:
    """Run ``target(*args)`` in a child process and SIGKILL it while it holds ``lock``, at
    crash point ``at`` (a name you passed to shmlocks.crashpoint()) or, if ``at`` is None,
    as soon as it holds the lock. Reaps the child and returns its pid.

    The child is a multiprocessing process (``start_method``, default the context's); the
    lock and the arguments reach it by pickling. Raises TimeoutError if the child did not
    reach that point within ``timeout`` seconds (it is killed), and RuntimeError if it
    exited on its own first."""
    if at is not None:
        shmlocks.crashpoint(at)  # refuses a library point's name, does nothing here
    base = getattr(lock, "lock", lock)  # an RLock: the lock under it
    if not isinstance(base, _core.Lock):
        raise TypeError(f"kill_while_holding takes a shmlocks lock, not {type(lock).__name__}")
    ctx = multiprocessing.get_context(start_method)
    spec, only = (at, None) if at is not None else (_HOLDING, base)
    proc = ctx.Process(target=_child, args=(spec, only, target, args), daemon=True)  # type: ignore[attr-defined]
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join(10)
        raise TimeoutError(
            f"the child (pid {proc.pid}) did not reach "
            f"{repr(at) if at else 'a hold of the lock'} within {timeout} s"
        )
    if proc.exitcode != -signal.SIGKILL:
        raise RuntimeError(
            f"the child (pid {proc.pid}) exited on its own (exit code {proc.exitcode}) "
            f"before reaching {repr(at) if at else 'a hold of the lock'}"
        )
    return int(proc.pid)
