"""Contended throughput: P workers loop {acquire; counter += 1; release} for a fixed time.

The loop is the exclusion checker's lightest (shmlocks/_harness.py ``count_until``): the
counter in shared memory is incremented by a plain read-modify-write (a load, an add and a
store on a memoryview, with nothing atomic about it), so ``counter == sum(per-worker
counts)`` holds only if the lock excluded.
Reports ops/s, Jain's fairness index over the per-worker counts and the max/min share;
for the shmlocks kinds, from the lock's own counters (lock.stats(), zeroed before the run),
the % of acquisitions that waited and the hand-offs per second, and ``stats_match``: the
counters' acquisitions equal the harness's count of sections.

Workers are forked processes, except for threading.Lock, which is not cross-process: it
runs P threads of one process (and so measures the GIL as much as the lock), and every
result for it carries ``"workers": "threads"``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from adapters import Adapter
from common import (
    BARRIER,
    LINE,
    BenchError,
    Shared,
    cpu_share,
    cpu_wait_share,
    get_usage,
    jain,
    lock_counters,
    max_min_share,
    put_usage,
    run_workers,
    usage,
)

from shmlocks._harness import Exclusion, words

STOP = 1  # a slot; worker i's slot is 2 + i: [count, usage (4 words)]; then the checker


def _loop(
    adapter: Adapter, w: memoryview, ex: Exclusion, idx: int, barrier: Any, timeout: float
) -> None:
    h = adapter.attach()
    n = 0
    mine = (2 + idx) * LINE
    start = usage()
    try:
        barrier.wait(timeout)
        start = usage()
        n = ex.count_until(h.acquire, h.release, idx + 1, STOP * LINE)
    finally:
        w[mine] = n
        put_usage(w, mine + 1, start)
        h.detach()


def measure(adapter: Adapter, nworkers: int, duration: float, timeout: float = 10.0) -> dict:
    """One run of ``duration`` seconds with ``nworkers`` workers; raises BenchError."""
    shared = Shared(2 + nworkers, extra=words(nworkers))
    w = shared.w
    ex = Exclusion(w, shared.extra_base, participants=nworkers)
    adapter.reset_stats()
    try:
        t0, t1 = run_workers(
            adapter.cross_process,
            _loop,
            [(adapter, w, ex, i, BARRIER, timeout) for i in range(nworkers)],
            _drive,
            (w, duration, timeout),
            w,
            STOP * LINE,
            timeout,
            f"{adapter.name} x{nworkers}",
        )
        counts = [w[(2 + i) * LINE] for i in range(nworkers)]
        use = [get_usage(w, (2 + i) * LINE + 1) for i in range(nworkers)]
        books = ex.report()
    finally:
        del w, ex
        shared.close()
    total = sum(counts)
    elapsed = t1 - t0
    st = adapter.stats()
    return {
        **lock_counters(st, elapsed),
        "stats_match": None if st is None else st["acquisitions"] == total,
        "workers": "processes" if adapter.cross_process else "threads",
        "n": nworkers,
        "seconds": elapsed,
        "ops": total,
        "ops_per_s": total / elapsed if elapsed > 0 else 0.0,
        "counts": counts,
        "counter": books.total,
        "exclusion_ok": books.ok and books.expected == total,
        "jain": jain(counts),
        "max_min": max_min_share(counts),
        "usage": use,
        "cpu_share": cpu_share(use),
        "cpu_wait_share": cpu_wait_share(use),
    }


def _drive(barrier: Any, w: memoryview, duration: float, timeout: float) -> tuple[float, float]:
    """Release the workers together, let them run ``duration``, then raise the stop flag."""
    try:
        barrier.wait(timeout)
    except threading.BrokenBarrierError:
        raise BenchError("workers did not reach the start barrier in time") from None
    t0 = time.perf_counter()
    time.sleep(duration)
    w[STOP * LINE] = 1
    t1 = time.perf_counter()
    return t0, t1
