"""Helpers every measurement shares: statistics, shared memory for the workers, and child
processes that are always bounded in time and always killed (by PID) in a ``finally``."""

from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing
import os
import resource
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

FORK = multiprocessing.get_context("fork")
LINE = 16  # int64 words per slot: 128 bytes, so no two workers' words share a cache line


@dataclass(frozen=True)
class Mode:
    """How long and how often to measure (run.py defines smoke, quick and full)."""

    name: str
    procs: tuple[int, ...]  # contended worker counts
    contended_s: float  # seconds per contended run
    handoff_s: float  # seconds (at most) per hand-off run
    cs_ns: tuple[int, ...]  # critical-section lengths for the hand-off
    repeats: int  # contended runs per (lock, P)
    handoff_repeats: int  # hand-off runs per (lock, critical section)
    death_repeats: int  # deaths per lock that recovers
    settle_s: float  # time the waiter is left blocked before the kill
    wedge_s: float  # bounded acquire past the kill for locks that may wedge
    pyperf_timeout_s: float
    idle_s: float = 1.0  # idle cost: seconds per wake-up count and per counting run
    idle_runs: int = 1  # idle cost: counting runs with a waiter (and as many without)


class BenchError(Exception):
    """A measurement could not be taken (a worker failed, hung, or broke exclusion)."""


# -- statistics ---------------------------------------------------------------------------


def spread(xs: Sequence[float]) -> dict[str, float]:
    """median, min and max of a list of repeats."""
    if not xs:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def lock_counters(st: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """What a run reports from the lock's own counters (``lock.stats()``; None for a lock
    that keeps none): the counters, the % of acquisitions that waited, hand-offs/s."""
    if st is None:
        return {"lock_stats": None, "contended_pct": None, "handoffs_per_s": None}
    acq = st["acquisitions"]
    return {
        "lock_stats": st,
        "contended_pct": 100.0 * st["contended"] / acq if acq else None,
        "handoffs_per_s": st["handoffs"] / seconds if seconds > 0 else None,
    }


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 < p <= 100) of an already sorted list."""
    if not sorted_xs:
        return math.nan
    k = max(1, math.ceil(p / 100.0 * len(sorted_xs)))
    return sorted_xs[k - 1]


def jain(counts: Sequence[float]) -> float:
    """Jain's fairness index: 1 when every worker got the same share, 1/n when one got all."""
    s = sum(counts)
    sq = sum(c * c for c in counts)
    return (s * s) / (len(counts) * sq) if sq else math.nan


def max_min_share(counts: Sequence[float]) -> float:
    lo = min(counts)
    return max(counts) / lo if lo else math.inf


# -- shared memory --------------------------------------------------------------------------


class Shared:
    """Anonymous MAP_SHARED memory that forked children inherit: ``slots`` int64 words, each
    on its own 128-byte line (``w[slot * LINE]``), then ``extra`` packed int64 words
    (``w[extra_base + i]``)."""

    def __init__(self, slots: int, extra: int = 0) -> None:
        self.extra_base = slots * LINE
        size = max(8 * (self.extra_base + extra), mmap.PAGESIZE)
        self._mm = mmap.mmap(-1, size)
        self.w = memoryview(self._mm).cast("q")

    def close(self) -> None:
        self.w.release()
        self._mm.close()


# -- child processes ------------------------------------------------------------------------


def child_setup() -> None:
    """First thing in every worker: the parent owns Ctrl-C and kills its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def children(procs: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """Start the processes; whatever happens, kill the ones still alive (by PID) on exit."""
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            if p.pid is not None:
                p.join(5)


def join_all(procs: Sequence[Any], deadline: float, what: str) -> None:
    """Join by a monotonic deadline; BenchError if one is still running or failed."""
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [p.pid for p in procs if p.exitcode is None]
    if stuck:
        raise BenchError(f"{what}: worker(s) {stuck} still running at the deadline")
    bad = [(p.pid, p.exitcode) for p in procs if p.exitcode != 0]
    if bad:
        raise BenchError(f"{what}: worker(s) failed (pid, exit code): {bad}")


def _in_child(loop: Any, *args: Any) -> None:
    child_setup()
    loop(*args)


BARRIER = object()  # in run_workers' argument tuples: the barrier, filled in there


def run_workers(
    cross_process: bool,
    loop: Any,
    argsets: Sequence[tuple],
    drive: Any,
    drive_args: tuple,
    w: memoryview,
    stop_at: int,
    timeout: float,
    what: str,
) -> Any:
    """Run one worker ``loop(*args)`` per tuple of ``argsets`` (BARRIER in it becomes
    the start barrier): forked processes, or (for an in-process anchor) threads of this
    one, while ``drive(barrier, *drive_args)`` times them; then join them (the threads
    after raising ``w[stop_at]``). Returns drive's result; a worker still running at
    ``timeout``, or failed, is a BenchError."""
    barrier: Any = (FORK if cross_process else threading).Barrier(len(argsets) + 1)
    argsets = [tuple(barrier if a is BARRIER else a for a in args) for args in argsets]
    if cross_process:
        procs = [
            FORK.Process(target=_in_child, args=(loop, *args), daemon=True) for args in argsets
        ]
        with children(procs):
            out = drive(barrier, *drive_args)
            join_all(procs, time.monotonic() + timeout, what)
        return out
    threads = [threading.Thread(target=loop, args=args, daemon=True) for args in argsets]
    for t in threads:
        t.start()
    try:
        out = drive(barrier, *drive_args)
    finally:
        w[stop_at] = 1
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise BenchError(f"{what}: thread(s) still running")
    return out


USAGE_WORDS = 5


def _runqueue_wait_ns() -> int:
    """Time this thread spent runnable but not running (waiting in a run queue), from
    /proc/thread-self/schedstat; -1 where the kernel does not keep it."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def usage() -> tuple[int, int, int, int, int]:
    """(voluntary switches, involuntary switches, CPU ns, run-queue wait ns, wall ns) of the
    calling thread so far. A worker reports the differences over its run: the run-queue
    wait is exactly the time the machine kept it off a CPU while it could have run
    (preempted, descheduled by its own sched_yield, or starved by other programs);
    sleeping in the kernel (a parked waiter) does not count."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return (
        r.ru_nvcsw,
        r.ru_nivcsw,
        time.thread_time_ns(),
        _runqueue_wait_ns(),
        time.monotonic_ns(),
    )


def put_usage(w: memoryview, at: int, start: tuple[int, ...]) -> None:
    """Store the differences since ``start`` in w[at:at + USAGE_WORDS]."""
    now = usage()
    for i in range(USAGE_WORDS):
        w[at + i] = now[i] - start[i]
    if start[3] < 0 or now[3] < 0:
        w[at + 3] = -1


def get_usage(w: memoryview, at: int) -> dict[str, int]:
    return {
        "voluntary_switches": w[at],
        "involuntary_switches": w[at + 1],
        "cpu_ns": w[at + 2],
        "runqueue_wait_ns": w[at + 3],
        "wall_ns": w[at + 4],
    }


def cpu_share(us: list[dict[str, int]]) -> float:
    """The smallest fraction of a CPU any worker got over its run."""
    shares = [u["cpu_ns"] / u["wall_ns"] for u in us if u["wall_ns"] > 0]
    return min(shares) if shares else math.nan


def cpu_wait_share(us: list[dict[str, int]]) -> float:
    """The largest share of its run any worker spent waiting for a CPU (NaN if unknown)."""
    shares = [
        u["runqueue_wait_ns"] / u["wall_ns"]
        for u in us
        if u["wall_ns"] > 0 and u["runqueue_wait_ns"] >= 0
    ]
    return max(shares) if len(shares) == len(us) and shares else math.nan


def cpu_snapshot() -> tuple[float, float, float]:
    """(CPU-seconds busy on the whole machine, CPU-seconds used by this process and its
    reaped descendants, monotonic seconds). Two snapshots tell how much CPU other programs
    took during a run: the noise a reader should know about."""
    busy = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # without guest time
    except (OSError, ValueError, IndexError):
        busy = math.nan
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return busy, ours, time.monotonic()


def busy_wait_ns(ns: int, clock: Any = time.perf_counter_ns) -> None:
    """Spin (inside the lock) for about ns nanoseconds: the critical section's work."""
    end = clock() + ns
    while clock() < end:
        pass


def own_autogroup(nice: int, log=None) -> str:
    """Go on in a new session, so in a new scheduler autogroup (Linux makes one per session)
    set to ``nice``; workers forked after are in it. Where autogroup is on, the workers of a
    run share their session's one CPU share, so on a busy machine P=4 may get less than one
    CPU; -19 (root) lets them have the CPUs for a short run. The session this was started in
    (its shell, and whatever else shares its autogroup) is left as it was: a process that
    leads its process group cannot make a session, so a child does, and this one waits for
    it and exits with its status. Returns the autogroup's line; OSError if this kernel has
    no autogroup."""
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except PermissionError:
            pid = os.fork()
            if pid:
                sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            os.setsid()
    with open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))
    with open("/proc/self/autogroup") as f:
        line = f.read().strip()
    if log is not None:
        log(f"autogroup: {line}")
    return line


AUTOGROUP_HELP = (
    "run in a scheduler autogroup of its own at nice N (Linux autogroup; a negative N needs "
    "root): where autogroup is on, the workers share their session's one CPU share, so on a "
    "busy machine P=4 may get less than one CPU; -19 lets them have the CPUs (for a short "
    "run: it takes them from everyone else)"
)
