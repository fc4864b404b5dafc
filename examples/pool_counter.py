"""Workers of a multiprocessing.Pool share one shmlocks lock and update shared data.

The lock reaches the workers through the Pool initializer: it pickles by name, and each
worker opens the same shared-memory segment. The shared data is a plain ctypes array in
shared memory (no lock of its own); the shmlocks lock alone keeps the updates exact.

    python examples/pool_counter.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

import shmlocks

WORKERS = 4
TASKS = 16
INCREMENTS_PER_TASK = 5_000

# Set in each worker by _init (module globals are the usual way to hand a Pool's workers
# something that must not be pickled with every task).
_lock: shmlocks.MCSLock | None = None
_data: Any = None  # [count, sum of pids]: two fields updated together under the lock


def _init(lock: shmlocks.MCSLock, data: Any) -> None:
    global _lock, _data
    _lock, _data = lock, data


def _task(n: int) -> int:
    assert _lock is not None
    pid = os.getpid()
    for _ in range(n):
        with _lock:
            _data[0] += 1  # read-modify-write: exact only because the lock excludes
            _data[1] += pid
    return pid


def main() -> int:
    lock = shmlocks.MCSLock.create()  # FIFO: every worker gets its turn in order
    try:
        data = multiprocessing.RawArray("q", 2)
        with multiprocessing.Pool(WORKERS, initializer=_init, initargs=(lock, data)) as pool:
            pids = pool.map(_task, [INCREMENTS_PER_TASK] * TASKS)
        expected = TASKS * INCREMENTS_PER_TASK
        expected_pid_sum = sum(pids) * INCREMENTS_PER_TASK
        print(f"lock {lock.name} ({lock.kind}), {WORKERS} pool workers, {TASKS} tasks")
        print(f"count = {data[0]:,} (expected {expected:,})")
        ok = data[0] == expected and data[1] == expected_pid_sum
        print("exact: no update was lost" if ok else "WRONG: updates were lost")
        return 0 if ok else 1
    finally:
        lock.close()  # the last close() removes the segment's name


if __name__ == "__main__":
    sys.exit(main())
