"""Two processes take locks A and B in opposite orders (AB/BA): a deadlock, seen and refused.

1. With detection off, both block. `shmlocks deadlocks` (run here as a subprocess, as you
   would from another shell) names the cycle: who holds what, waits for what, for how long.
2. With detection on (the default: shmlocks.get_deadlock_timeout() is 0), the process
   that began to wait last gets DeadlockError out of its acquire at once, keeps what it
   holds, and the other one gets its lock once the victim releases.
3. With SHMLOCKS_LOCKDEP=1, a process that takes A then B and exits records that order;
   a later process taking B then A gets LockOrderError before it ever blocks, though no
   deadlock happened (the graph goes to a temporary file here, not the machine's).

    python examples/deadlock.py
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import shmlocks


def worker(
    first: shmlocks.FutexMutex,
    second: shmlocks.FutexMutex,
    ready: Any,
    go: Any,
    detect: float | None,
    delay: float,
) -> None:
    shmlocks.set_deadlock_timeout(detect)
    with first:
        ready.set()
        go.wait(10)
        time.sleep(delay)
        try:
            if second.acquire(timeout=3):
                print(f"  pid {os.getpid()}: got both locks")
                second.release()
            else:
                print(f"  pid {os.getpid()}: timed out")
        except shmlocks.DeadlockError as e:
            print(f"  pid {os.getpid()}: DeadlockError:")
            print("    " + str(e).replace("\n", "\n    "))


def ab_ba(a: Any, b: Any, detect: float | None, show: bool) -> None:
    ready1, ready2, go = (multiprocessing.Event() for _ in range(3))
    p1 = multiprocessing.Process(target=worker, args=(a, b, ready1, go, detect, 0.0))
    p2 = multiprocessing.Process(target=worker, args=(b, a, ready2, go, detect, 0.2))
    p1.start()
    p2.start()
    ready1.wait(10)
    ready2.wait(10)
    go.set()
    if show:
        time.sleep(0.8)
        print("$ shmlocks deadlocks")
        r = subprocess.run(
            [sys.executable, "-m", "shmlocks", "deadlocks"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        print(r.stdout.rstrip())
        print(f"(exit status {r.returncode})")
    p1.join(20)
    p2.join(20)


LOCKDEP_CHILD = """
import shmlocks, sys
a, b = shmlocks.FutexMutex.open(sys.argv[1]), shmlocks.FutexMutex.open(sys.argv[2])
def first_a_then_b():
    with a, b:
        pass
def first_b_then_a():
    with b:
        try:
            a.acquire()
        except shmlocks.LockOrderError as e:
            print("  LockOrderError: " + str(e).replace(chr(10), chr(10) + "  "))
first_a_then_b() if sys.argv[3] == "ab" else first_b_then_a()
"""


def lockdep(a: Any, b: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SHMLOCKS_LOCKDEP="1", SHMLOCKS_LOCKDEP_GRAPH=f"{d}/graph")
        for order in ("ab", "ba"):
            subprocess.run(
                [sys.executable, "-c", LOCKDEP_CHILD, a.name, b.name, order],
                env=env,
                timeout=30,
                check=True,
            )


def main() -> int:
    a, b = shmlocks.FutexMutex(), shmlocks.FutexMutex()
    try:
        print(f"A = {a.name}, B = {b.name}")
        print("1. detection off: both block until their 3 s timeouts")
        ab_ba(a, b, None, show=True)
        print("2. detection on (the default, 0 s): exactly one gives up, at once")
        ab_ba(a, b, 0.0, show=False)
        print("3. lockdep: process 1 takes A then B and exits; process 2 takes B then A")
        lockdep(a, b)
    finally:
        a.close()
        b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
