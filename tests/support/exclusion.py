"""The exclusion checker as the tests use it (the checker itself is shmlocks/_harness.py, which
the torture and the demo use too): N processes x M acquisitions of a shared counter, and
the deliberately broken locks that tests/test_harness.py shows it catches.

Functions that run in child processes are module-level (they pickle by reference).
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time

from shmlocks._harness import Exclusion, ExclusionReport, words
from support.common import Procs, join_or_kill

__all__ = [
    "ExclusionReport",
    "LeakyLock",
    "NoLock",
    "SometimesTwoLock",
    "StressReport",
    "abort_stress",
    "busy_for",
    "check_mutual_exclusion",
    "recovering_sections",
]


def _hammer_threads(lock, ex: Exclusion, barrier, iters: int, first: int, nthreads: int) -> None:
    """Child side of check_mutual_exclusion: ``nthreads`` threads, participants ``first``,
    ``first + 1``, ...; every 16th section yields the CPU between the load and the store."""

    def run(who: int) -> None:
        barrier.wait(60)
        ex.loop(lock.acquire, lock.release, who, iterations=iters, widen_every=16)

    threads = [threading.Thread(target=run, args=(first + t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def check_mutual_exclusion(
    procs: Procs, lock, method: str, nprocs=3, iters=2000, timeout=90.0, nthreads=1
) -> ExclusionReport:
    """N processes x M non-atomic increments under ``lock`` (shmlocks/_harness.py); the
    report says whether every increment counted and no two sections overlapped.

    With ``nthreads`` > 1 each process runs that many threads, each its own participant.
    A hang (a worker not finished within ``timeout``) or a worker that dies fails at once.
    """
    ctx = mp.get_context(method)
    n = nprocs * nthreads
    ex = Exclusion(ctx.RawArray("q", words(n)), participants=n)
    barrier = ctx.Barrier(n)
    t0 = time.monotonic()
    workers = [
        procs.start(_hammer_threads, lock, ex, barrier, iters, 1 + i * nthreads, nthreads, ctx=ctx)
        for i in range(nprocs)
    ]
    stuck = join_or_kill(workers, timeout)
    assert not stuck, f"{len(stuck)} of {nprocs} workers still running after {timeout}s"
    codes = [p.exitcode for p in workers]
    assert codes == [0] * nprocs, f"worker exit codes {codes}"
    return ex.report(expected=n * iters, seconds=time.monotonic() - t0)


def recovering_sections(lock, ex: Exclusion, who: int, n: int, timeout: float = 30.0) -> int:
    """``n`` sections of the checker, each after a bounded acquire (TimeoutError if the lock
    does not come within ``timeout``), repairing after ``owner_died``; returns how many
    holds saw owner_died."""
    died = 0
    for _ in range(n):
        if not lock.acquire(timeout=timeout):
            raise TimeoutError(f"no lock within {timeout} s")
        try:
            if lock.owner_died:
                died += 1
                ex.repair()
                lock.mark_consistent()
            ex.section(who)
        finally:
            lock.release()
    return died


# --------------------------------------------------------------------------- broken locks


class NoLock:
    """A deliberately broken lock: acquire always succeeds, nothing is excluded."""

    def acquire(self, blocking=True, timeout=-1):
        return True

    def release(self):
        pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class LeakyLock(NoLock):
    """A deliberately broken lock built over a real shmlocks lock: acquire takes the real
    lock and lets go of it at once, so every caller "holds" it at the same time."""

    def __init__(self, inner):
        self.inner = inner

    def acquire(self, blocking=True, timeout=-1):
        got = self.inner.acquire(blocking, timeout)
        if got:
            self.inner.release()
        return got


class SometimesTwoLock(NoLock):
    """A deliberately broken lock that almost works: a real lock, except that about one
    acquisition in ``every`` does not wait for it, so now and then two are inside."""

    def __init__(self, inner, every: int = 50):
        self.inner, self.every = inner, every
        self._real: dict[int, bool] = {}  # thread -> holds the real lock (picklable)

    def acquire(self, blocking=True, timeout=-1):
        me = threading.get_ident()
        if random.randrange(self.every) == 0:
            self._real[me] = False
            return True
        self._real[me] = bool(self.inner.acquire(blocking, timeout))
        return self._real[me]

    def release(self):
        if self._real.pop(threading.get_ident(), False):
            self.inner.release()


def busy_for(seconds: float) -> None:
    """Burn CPU for ``seconds`` of wall time (always bounded)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# --------------------------------------------------------------------------- abort stress


def _stress_process(lock, ex: Exclusion, stalls, barrier, base, nthreads, rounds, seed):
    """Child side of abort_stress: ``nthreads`` threads (participants ``base + 1`` ...), each
    ``rounds`` acquire attempts with a random mix of try-locks, tiny timeouts and long
    ("blocking") timeouts; every acquisition runs the checker's section."""

    def worker(t):
        rng = random.Random(seed * 1000 + t)
        barrier.wait(60)
        for _ in range(rounds):
            r = rng.random()
            if r < 0.15:
                got = lock.acquire(False)
            elif r < 0.25:
                got = lock.acquire(True, 0)
            elif r < 0.6:
                got = lock.acquire(True, rng.uniform(0.00001, 0.002))
            else:
                got = lock.acquire(True, 5.0)  # "blocking", but bounded
                if not got:
                    stalls[base + t] += 1
            if got:
                try:
                    ex.section(base + t + 1, widen=rng.random() < 0.1)
                finally:
                    lock.release()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


class StressReport:
    def __init__(self, exclusion: ExclusionReport, successes, stalls):
        self.exclusion, self.successes, self.stalls = exclusion, successes, stalls

    @property
    def ok(self) -> bool:
        return self.exclusion.ok and sum(self.successes) > 0 and sum(self.stalls) == 0

    def __repr__(self):
        return (
            f"StressReport({self.exclusion}, successes={self.successes}, "
            f"stalled 5 s blocking acquires={self.stalls})"
        )


def abort_stress(
    procs: Procs, lock, nprocs=3, nthreads=2, rounds=1500, method="fork", timeout=75.0
) -> StressReport:
    """Many short acquire rounds, most of them giving up early (timeouts), from threads of
    several processes. A worker hang fails at once; the report says whether exclusion held
    (no lost or phantom critical sections, no overlap) and whether any long wait stalled
    (a stranded queue or a lost wake-up)."""
    ctx = mp.get_context(method)
    n = nprocs * nthreads
    ex = Exclusion(ctx.RawArray("q", words(n)), participants=n)
    stalls = ctx.Array("q", [0] * n, lock=False)
    barrier = ctx.Barrier(n)
    workers = [
        procs.start(
            _stress_process, lock, ex, stalls, barrier, i * nthreads, nthreads, rounds, i, ctx=ctx
        )
        for i in range(nprocs)
    ]
    stuck = join_or_kill(workers, timeout)
    assert not stuck, f"stress workers hung: {len(stuck)} of {nprocs} still running"
    assert [p.exitcode for p in workers] == [0] * nprocs
    return StressReport(ex.report(), ex.done()[1:], list(stalls))
