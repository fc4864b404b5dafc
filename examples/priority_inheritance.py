"""Priority inversion on one CPU, and how PIMutex's priority inheritance removes it.

Three SCHED_FIFO processes share one CPU:

    low    (priority 10) holds the lock and needs WORK seconds of CPU to finish with it;
    medium (priority 20) does not want the lock, it just computes for MEDIUM seconds;
    high   (priority 30) wants the lock a moment after medium has started.

With a lock that has no priority inheritance (RobustMutex), high blocks, medium runs
(it outranks low), and low cannot finish until medium is done: high waits about
MEDIUM + WORK, for work that has nothing to do with it. With PIMutex, high's
FUTEX_LOCK_PI lends its priority to low, which preempts medium, finishes, and hands
the lock over: high waits about WORK.

Needs SCHED_FIFO (root, or CAP_SYS_NICE, or an RLIMIT_RTPRIO of at least 30): without
it, the script says so and exits 0. Every loop here is bounded in time.

    sudo python examples/priority_inheritance.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any, TypeAlias

import shmlocks

LOW, MEDIUM, HIGH = 10, 20, 30
WORK = 0.05  # CPU seconds low spends in its critical section
MEDIUM_SPIN = 0.4  # seconds medium computes
HIGH_DELAY = 0.02  # high wants the lock this long after the start (medium is running)
HARD_LIMIT = 5.0  # no loop of this script runs longer than this

Mutex: TypeAlias = "shmlocks.RobustMutex | shmlocks.PIMutex"


def fifo_permitted() -> bool:
    """Try SCHED_FIFO on this process, and go back to SCHED_OTHER."""
    if not hasattr(os, "SCHED_FIFO"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(HIGH))
    except OSError:
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def become(priority: int, cpu: int) -> None:
    # Real-time first, then move: on the shared CPU we must already outrank the others.
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    os.sched_setaffinity(0, {cpu})


def wait_for_start(shared: Any) -> float:
    """Sleep until the parent has published a start time (shared[0]), then until it."""
    give_up = time.monotonic() + HARD_LIMIT
    while shared[0] == 0.0 and time.monotonic() < give_up:
        time.sleep(0.001)
    start = float(shared[0]) or time.monotonic()
    time.sleep(max(0.0, start - time.monotonic()))
    return start


def low(lock: Mutex, shared: Any, ready: Any) -> None:
    become(LOW, int(shared[1]))
    with lock:
        ready[0] = 1
        wait_for_start(shared)
        cpu_start, give_up = time.thread_time(), time.monotonic() + HARD_LIMIT
        while time.thread_time() - cpu_start < WORK and time.monotonic() < give_up:
            pass  # the critical section: WORK seconds of CPU


def medium(shared: Any, ready: Any) -> None:
    become(MEDIUM, int(shared[1]))
    ready[1] = 1
    start = wait_for_start(shared)
    while time.monotonic() < start + MEDIUM_SPIN:
        pass  # unrelated computation that outranks low


def high(lock: Mutex, shared: Any, ready: Any) -> None:
    become(HIGH, int(shared[1]))
    ready[2] = 1
    start = wait_for_start(shared)
    time.sleep(max(0.0, start + HIGH_DELAY - time.monotonic()))
    t0 = time.monotonic()
    if lock.acquire(timeout=HARD_LIMIT):
        shared[2] = time.monotonic() - t0
        lock.release()
    else:
        shared[2] = -1.0


def run(cls: type[Mutex], cpu: int) -> float:
    """One round of the scenario with a fresh lock of class cls: high's wait in seconds."""
    lock = cls.create()
    procs: list[multiprocessing.Process] = []
    try:
        shared = multiprocessing.RawArray("d", [0.0, float(cpu), -1.0])  # start, cpu, wait
        ready = multiprocessing.RawArray("i", 3)
        procs.append(multiprocessing.Process(target=low, args=(lock, shared, ready)))
        procs.append(multiprocessing.Process(target=medium, args=(shared, ready)))
        procs.append(multiprocessing.Process(target=high, args=(lock, shared, ready)))
        for p in procs:
            p.start()
        give_up = time.monotonic() + 10
        while not all(ready) and time.monotonic() < give_up:
            time.sleep(0.005)
        if not all(ready):
            raise RuntimeError("the workers did not get ready in 10 s")
        shared[0] = time.monotonic() + 0.05  # everyone starts at this instant
        for p in procs:
            p.join(HARD_LIMIT + 5)
        return float(shared[2])
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        lock.close()


def main() -> int:
    if not fifo_permitted():
        print(
            "priority_inheritance: SCHED_FIFO is not permitted here (it needs root, CAP_SYS_NICE "
            "or RLIMIT_RTPRIO >= 30); nothing to show. Try: sudo python examples/priority_inheritance.py"
        )
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[-1]
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[:-1]))  # keep this coordinator off the contended CPU
    print(
        f"one CPU ({cpu}), SCHED_FIFO: low={LOW} holds the lock and needs {WORK * 1e3:.0f} ms of CPU; "
        f"medium={MEDIUM} computes for {MEDIUM_SPIN * 1e3:.0f} ms; "
        f"high={HIGH} wants the lock {HIGH_DELAY * 1e3:.0f} ms in"
    )
    failures = 0
    for cls, label in (
        (shmlocks.RobustMutex, "no priority inheritance"),
        (shmlocks.PIMutex, "priority inheritance"),
    ):
        wait = run(cls, cpu)
        if wait < 0:
            print(f"  {cls.__name__:<12} high never got the lock within {HARD_LIMIT:.0f} s")
            failures += 1
            continue
        if wait > MEDIUM_SPIN - HIGH_DELAY:
            why = "inverted: medium ran first, low could not finish"
        else:
            why = "low was boosted to high's priority and finished first"
        print(f"  {cls.__name__:<12} ({label:<23}): high waited {wait * 1e3:6.1f} ms  -- {why}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
