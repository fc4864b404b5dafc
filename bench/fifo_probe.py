"""How fast does each kind pass a contended lock around? A 20-line probe.

    python bench/fifo_probe.py PROCESSES [pin]

PROCESSES workers loop acquire/release for 0.7 s; prints kops/s and Jain's index per lock
(multiprocessing.Lock last). `pin` puts every worker on CPU 0 (the one-CPU case).
"""

import multiprocessing as mp
import os
import sys
import time

import shmlocks


def worker(lock, n, stop, pin):
    if pin:
        os.sched_setaffinity(0, {0})
    k = 0
    while not stop.value:
        lock.acquire()
        lock.release()
        k += 1
    n.value = k


def main() -> int:
    ctx = mp.get_context("fork")
    procs, pin = int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "pin"
    for kind in [*shmlocks.KINDS, "multiprocessing.Lock"]:
        lock = ctx.Lock() if kind == "multiprocessing.Lock" else shmlocks.KINDS[kind]()
        stop = ctx.Value("i", 0, lock=False)
        counts = [ctx.Value("q", 0, lock=False) for _ in range(procs)]
        ps = [ctx.Process(target=worker, args=(lock, c, stop, pin)) for c in counts]
        for p in ps:
            p.start()
        time.sleep(0.7)
        stop.value = 1
        for p in ps:
            p.join(5)
        c = [x.value for x in counts]
        jain = sum(c) ** 2 / (procs * sum(x * x for x in c)) if sum(c) else 0.0
        print(f"{kind:22s} {sum(c) / 0.7 / 1e3:9.0f} kops/s  Jain {jain:.3f}")
        if hasattr(lock, "close"):
            lock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
