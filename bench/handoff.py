"""Hand-off latency: two workers pass a turn through the lock (a hand-off: README.md,
"Hand-off"; shmlocks/demo.py measures it with this same protocol).

Each worker loops {acquire; if the turn is mine: [critical section], flip the turn;
release}. The turn word is only touched under the lock, so every turn change is a
lock-to-lock transfer from one worker to the other. Worker 0 stamps the clock each time
it flips the turn (CLOCK_MONOTONIC via perf_counter_ns): between two of its flips worker 1
has flipped once, so consecutive stamps are one round trip (two hand-offs).

The critical section, when asked for, is a busy-wait of ``cs_ns`` inside the lock by the
worker whose turn it is (the useful work; a worker that finds it is not its turn releases
at once). So a round trip is two critical sections plus two hand-offs: the figures are
raw round trips, nothing subtracted.

Each worker also counts its own flips: they may differ by at most one, a cheap second
check that the lock excluded. threading.Lock runs two threads of one process (labelled).

For the shmlocks kinds the lock's own counters (lock.stats(), zeroed before the run) give
hand-offs/s and the % of acquisitions that waited. Every flip but the first follows a hold
by the other worker, so ``stats_match`` checks hand-offs >= flips - 1 and acquisitions >=
flips (a worker that finds it is not its turn makes holds, and hand-offs, that flip
nothing: ``turns_per_s`` is the harness's count, flips per second).
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
    busy_wait_ns,
    cpu_share,
    cpu_wait_share,
    get_usage,
    lock_counters,
    percentile,
    put_usage,
    run_workers,
    usage,
)

TURN, STOP, NSTAMPS, FLIPS0, FLIPS1 = 0, 1, 2, 3, 4
SLOTS = 5


def _loop(
    adapter: Adapter,
    w: memoryview,
    me: int,
    cap: int,
    cs_ns: int,
    barrier: Any,
    timeout: float,
    base: int,
) -> None:
    h = adapter.attach()
    acquire, release = h.acquire, h.release
    clock = time.perf_counter_ns
    turn, stop = TURN * LINE, STOP * LINE
    other = 1 - me
    flips = 0
    k = 0
    start = usage()
    try:
        barrier.wait(timeout)
        start = usage()
        while not w[stop]:
            acquire()
            if w[turn] == me:
                if cs_ns:
                    busy_wait_ns(cs_ns, clock)
                w[turn] = other
                flips += 1
                if me == 0:
                    w[base + k] = clock()
                    k += 1
                    if k == cap:
                        w[stop] = 1
            release()
    finally:
        mine = (FLIPS0 + me) * LINE
        w[mine] = flips
        put_usage(w, mine + 1, start)
        if me == 0:
            w[NSTAMPS * LINE] = k
        h.detach()


def measure(
    adapter: Adapter, duration: float, cs_ns: int = 0, cap: int = 200_000, timeout: float = 10.0
) -> dict:
    """One run: up to ``duration`` seconds or ``cap`` round trips. Latencies in ns. A run
    that completes no round trip (the turn never came back: starvation, or no CPU) has
    ``round_trips == 0`` and no latency figures; its round trip exceeded ``seconds``."""
    shared = Shared(SLOTS, extra=cap)
    w = shared.w
    base = shared.extra_base
    what = f"{adapter.name} hand-off cs={cs_ns}ns"
    adapter.reset_stats()
    try:
        elapsed = run_workers(
            adapter.cross_process,
            _loop,
            [(adapter, w, me, cap, cs_ns, BARRIER, timeout, base) for me in (0, 1)],
            _drive,
            (w, duration, timeout),
            w,
            STOP * LINE,
            timeout,
            what,
        )
        k = w[NSTAMPS * LINE]
        stamps = w[base : base + k].tolist()
        flips = (w[FLIPS0 * LINE], w[FLIPS1 * LINE])
        use = [get_usage(w, (FLIPS0 + me) * LINE + 1) for me in (0, 1)]
    finally:
        del w
        shared.close()
    rts = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    st = adapter.stats()
    nflips = flips[0] + flips[1]
    out: dict[str, Any] = {
        **lock_counters(st, elapsed),
        "turns_per_s": nflips / elapsed if elapsed > 0 else None,
        "stats_match": None
        if st is None
        else st["handoffs"] >= nflips - 1 and st["acquisitions"] >= nflips,
        "workers": "processes" if adapter.cross_process else "threads",
        "cs_ns": cs_ns,
        "round_trips": len(rts),
        "flips": list(flips),
        "exclusion_ok": abs(flips[0] - flips[1]) <= 1,
        "usage": use,
        "cpu_share": cpu_share(use),
        "cpu_wait_share": cpu_wait_share(use),
        "had_two_cpus": had_two_cpus(use, len(rts)),
        "seconds": elapsed,
    }
    if rts:
        out.update(
            {
                "min_ns": rts[0],
                "median_ns": percentile(rts, 50),
                "p90_ns": percentile(rts, 90),
                "p99_ns": percentile(rts, 99),
                "max_ns": rts[-1],
                "mean_ns": sum(rts) / len(rts),
            }
        )
    return out


def had_two_cpus(use: list[dict[str, int]], round_trips: int) -> bool:
    """False if the two workers took turns on one CPU: each was switched out involuntarily
    (preempted, or by its own sched_yield) at least once every two round trips, so the
    round trips themselves needed context switches or time slices, not only hand-offs.
    The scheduler placed the workers (nothing is pinned) and a busy machine does this to
    them; a run with no round trip is not counted either. Context switches separate the
    two regimes better than run-queue wait does: on a busy machine a worker may wait for a
    CPU for a third of a run and still make most of its round trips with two CPUs
    (those are the fast ones), which the per-run median then reports."""
    if round_trips <= 0:
        return False
    return min(u["involuntary_switches"] for u in use) * 2 < round_trips


def _drive(barrier: Any, w: memoryview, duration: float, timeout: float) -> float:
    """Start the workers together; stop them after ``duration`` (or when worker 0 has
    filled its stamps). Returns the seconds they ran."""
    try:
        barrier.wait(timeout)
    except threading.BrokenBarrierError:
        raise BenchError("workers did not reach the start barrier in time") from None
    t0 = time.monotonic()
    end = t0 + duration
    while not w[STOP * LINE] and time.monotonic() < end:
        time.sleep(0.02)
    w[STOP * LINE] = 1
    return time.monotonic() - t0
