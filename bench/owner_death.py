"""Owner death: the time from a holder's SIGKILL to a blocked waiter's acquisition.

A holder process acquires the lock and sleeps; a waiter process blocks in a bounded
acquire; after ``settle`` seconds (so the waiter is parked, past its spin and yield
phases) the parent reads CLOCK_MONOTONIC and SIGKILLs the holder. The waiter reads the
same clock the moment its acquire returns. The figure is the difference.

Outcomes:
  recovered           the waiter got the lock: robust and pi (the kernel marks the robust
                      futex OWNER_DIED and wakes a waiter), fcntl.flock (the kernel drops
                      the lock when the holder's last descriptor closes)
  wedges              an anchor that cannot recover (multiprocessing.Lock,
                      posix_ipc.Semaphore): the bounded acquire timed out
  n/a                 threading.Lock: a holder cannot die without its whole process

A lock that ought to recover but times out is a failure (BenchError). Nothing waits
without a deadline: the waiter's acquire is bounded, the parent bounds every wait on the
children, and kills both children by PID in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import adapters
from adapters import Adapter
from common import FORK, LINE, BenchError, Shared, child_setup, children

MUST_RECOVER = (*adapters.KINDS, "fcntl.flock")  # every shmlocks kind recovers

HOLDING, WAITING, RESULT, T_ACQ, DIED = 0, 1, 2, 3, 4
R_PENDING, R_ACQUIRED, R_TIMED_OUT, R_ERROR = 0, 1, 2, 3


def _holder(adapter: Adapter, w: memoryview) -> None:
    child_setup()
    h = adapter.attach()
    h.acquire()
    w[HOLDING * LINE] = 1
    time.sleep(60)  # the parent kills us long before this


def _waiter(adapter: Adapter, w: memoryview, limit: float) -> None:
    child_setup()
    w[RESULT * LINE] = R_ERROR  # until proven otherwise
    h = adapter.attach()
    w[WAITING * LINE] = 1
    ok = h.acquire_timeout(limit)
    w[T_ACQ * LINE] = time.monotonic_ns()
    if ok:
        died = h.owner_died()
        w[DIED * LINE] = int(died)
        if died:
            h.repair()
        h.release()
    w[RESULT * LINE] = R_ACQUIRED if ok else R_TIMED_OUT


def _wait_for(w: memoryview, slot: int, proc: Any, what: str, timeout: float = 10.0) -> None:
    """Until the child sets its flag; BenchError if it exits first or the time is up."""
    deadline = time.monotonic() + timeout
    while not w[slot * LINE]:
        if proc.exitcode is not None:
            raise BenchError(f"owner death: the child exited ({proc.exitcode}) before {what}")
        if time.monotonic() > deadline:
            raise BenchError(f"owner death: {what} not seen in {timeout:.0f} s")
        time.sleep(0.001)


def measure(
    adapter: Adapter, settle: float, wedge_after: float, recover_within: float = 2.0
) -> dict:
    """One death. ``wedge_after``: how long past the kill a lock that may wedge is given;
    ``recover_within``: the bound for a lock that must recover."""
    if not adapter.cross_process:
        return {"outcome": "n/a", "note": "in-process lock: its holder dies with the process"}
    must = adapter.name in MUST_RECOVER
    limit = settle + (recover_within if must else wedge_after)
    shared = Shared(5)
    w = shared.w
    try:
        holder = FORK.Process(target=_holder, args=(adapter, w), daemon=True)
        waiter = FORK.Process(target=_waiter, args=(adapter, w, limit), daemon=True)
        with children([holder]):
            _wait_for(w, HOLDING, holder, "the holder's acquisition")
            with children([waiter]):
                _wait_for(w, WAITING, waiter, "the waiter's start")
                time.sleep(settle)
                if w[RESULT * LINE] != R_ERROR or waiter.exitcode is not None:
                    raise BenchError(f"{adapter.name}: the waiter got past a held lock")
                t_kill = time.monotonic_ns()
                os.kill(holder.pid, signal.SIGKILL)
                holder.join(5)
                waiter.join(limit + 5)
                if waiter.exitcode is None:
                    raise BenchError(
                        f"{adapter.name}: the waiter's bounded acquire did not "
                        f"return within {limit + 5:.1f} s"
                    )
            result = w[RESULT * LINE]
            t_acq = w[T_ACQ * LINE]
            died = bool(w[DIED * LINE])
    finally:
        del w
        shared.close()
    if result == R_ACQUIRED:
        return {"outcome": "recovered", "recovery_ms": (t_acq - t_kill) / 1e6, "owner_died": died}
    if result == R_TIMED_OUT:
        after = (t_acq - t_kill) / 1e9
        if must:
            raise BenchError(
                f"{adapter.name}: waiter not granted the lock {after:.2f} s after "
                "the holder's SIGKILL"
            )
        return {"outcome": "wedges", "timed_out_after_s": after}
    raise BenchError(f"{adapter.name}: the waiter failed (exit code {waiter.exitcode})")
