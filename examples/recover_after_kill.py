"""A holder of a RobustMutex is SIGKILLed mid-update; the next holder repairs the data.

The shared data keeps an invariant, a + b == 0, that an update breaks for a moment
(a += 1, then b -= 1). A worker takes the lock, does half the update and is killed. With
multiprocessing.Lock that lock would stay held forever. With RobustMutex the kernel
notices the death, the next acquire succeeds with lock.owner_died == True, and that
holder repairs the invariant and calls mark_consistent() before releasing.

    python examples/recover_after_kill.py
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from typing import Any

import shmlocks


def transfer(lock: shmlocks.RobustMutex, data: Any, times: int) -> None:
    """A well-behaved worker: moves 1 from b to a, `times` times, keeping a + b == 0."""
    for _ in range(times):
        with lock:
            data[0] += 1
            data[1] -= 1


def doomed(lock: shmlocks.RobustMutex, data: Any, held: Any) -> None:
    """Takes the lock, breaks the invariant halfway, and waits to be killed."""
    lock.acquire()
    data[0] += 1  # the matching data[1] -= 1 never happens
    held.set()
    time.sleep(30)  # bounded: the parent kills us within milliseconds


def main() -> int:
    lock = shmlocks.RobustMutex.create()
    try:
        data = multiprocessing.RawArray("q", 2)  # a, b
        held = multiprocessing.Event()
        victim = multiprocessing.Process(target=doomed, args=(lock, data, held))
        victim.start()
        if not held.wait(10):
            victim.kill()
            print("the worker never took the lock")
            return 1
        os.kill(victim.pid or 0, signal.SIGKILL)
        victim.join(10)
        print(f"worker {victim.pid} killed while holding the lock: a={data[0]}, b={data[1]}")

        if not lock.acquire(timeout=5):
            print("the lock was not recovered within 5 s")
            return 1
        try:
            if lock.owner_died:
                print("acquired with owner_died=True: the data may be inconsistent")
                data[1] = -data[0]  # repair: restore a + b == 0
                lock.mark_consistent()  # without this, release() makes the lock unusable
                print(f"repaired: a={data[0]}, b={data[1]}; marked consistent")
        finally:
            lock.release()

        # Life goes on: more workers use the same lock as if nothing had happened.
        workers = [
            multiprocessing.Process(target=transfer, args=(lock, data, 10_000)) for _ in range(3)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        with lock:
            a, b = data[0], data[1]
            died = lock.owner_died
        print(f"after 3 more workers: a={a}, b={b}, a+b={a + b}, owner_died={died}")
        return 0 if a + b == 0 and a == 30_001 and not died else 1
    finally:
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
