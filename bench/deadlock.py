"""Deadlocks seen and refused (issue 13): what they cost.

    python bench/deadlock.py [ROUNDS]

1. lockdep: ns per acquire()+release() of B while holding A (a chain lockdep has already
   validated: the steady state), with SHMLOCKS_LOCKDEP unset and =1, each in a fresh
   process, best of 7 loops of 100k pairs, minimum over ROUNDS (default 3).
2. detection latency: two threads deadlock AB/BA on futex locks; from the moment the cycle
   closes (the second thread's acquire begins) to DeadlockError out of the victim, with
   deadlock timeouts 0 and 1.0 s; median and max over ROUNDS.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CHILD = r"""
import json, time, shmlocks
a, b = shmlocks.FutexMutex(), shmlocks.FutexMutex()
a.acquire()
acq, rel = b.acquire, b.release
best = 1e9
for _ in range(7):
    t0 = time.perf_counter()
    for _ in range(100000):
        acq(); rel()
    best = min(best, time.perf_counter() - t0)
a.release()
print(json.dumps(best / 100000 * 1e9))
a.close(); b.close()
"""


def lockdep_pair_ns(on: bool, graph: str) -> float:
    env = dict(os.environ, SHMLOCKS_LOCKDEP_GRAPH=graph)
    env.pop("SHMLOCKS_LOCKDEP", None)
    if on:
        env["SHMLOCKS_LOCKDEP"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def detection_latency_s(timeout: float) -> float:
    import shmlocks

    shmlocks.set_deadlock_timeout(timeout)
    a, b = shmlocks.FutexMutex(), shmlocks.FutexMutex()
    held = threading.Barrier(2)
    closed = [0.0]
    raised = [0.0]

    def member(first, second, last):
        with first:
            held.wait()
            if last:
                time.sleep(0.05)  # the other waits already: this acquire closes the cycle
                closed[0] = time.monotonic()
            try:
                if second.acquire(timeout=timeout + 10):
                    second.release()
            except shmlocks.DeadlockError:
                raised[0] = time.monotonic()

    ts = [
        threading.Thread(target=member, args=(a, b, False)),
        threading.Thread(target=member, args=(b, a, True)),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    a.close()
    b.close()
    shmlocks.set_deadlock_timeout(1.0)
    return raised[0] - closed[0]


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as d:
        graph = os.path.join(d, "lockdep-graph")
        off = min(lockdep_pair_ns(False, graph) for _ in range(rounds))
        on = min(lockdep_pair_ns(True, graph) for _ in range(rounds))
    print(f"lockdep off: {off:7.1f} ns per pair (B taken and released while holding A)")
    print(f"lockdep on:  {on:7.1f} ns per pair ({on - off:+.1f} ns: a validated chain)")
    res = {}
    for timeout in (0.0, 1.0):
        lat = [detection_latency_s(timeout) for _ in range(rounds)]
        res[timeout] = lat
        print(
            f"detection, deadlock timeout {timeout:.1f} s: cycle closed -> DeadlockError "
            f"median {statistics.median(lat) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms "
            f"({rounds} rounds)"
        )
    print(json.dumps({"lockdep_off_ns": off, "lockdep_on_ns": on, "latency_s": res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
