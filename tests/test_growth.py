"""Participants that grow (docs/design.md §2): a lock or region made with the defaults
serves up to 4096 threads at once, provisioning participant slots as they come (the
first 32 at creation, then twice as many each time every one is taken), so a thread
pool, a server's worker threads or many processes of threads share one lock without
CapacityError, and the segment's memory grows with the participants that used it.
``max_participants=N`` is still a cap.

Each test here failed before layout 8 (CapacityError past 64 threads), except the cap's.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import re
import threading
import time

import pytest
from support import KINDS, join_all, uniq, until

import shmlocks
from shmlocks import _segment, stats, waitgraph

THREADS = 1000


@contextlib.contextmanager
def small_stacks():
    """Thread stacks of 256 KiB while a test starts a thousand threads (virtual memory
    only, but kind to a small machine)."""
    old = threading.stack_size(256 * 1024)
    try:
        yield
    finally:
        threading.stack_size(old)


def _resident(lock) -> int:
    return os.stat(os.path.join("/dev/shm", lock.name)).st_blocks * 512


def _mapping_rss(name: str) -> int:
    """This process's resident bytes of its mapping of segment ``name`` (/proc smaps),
    found by inode (a creator maps the file before it has its name)."""
    ino = os.stat(os.path.join("/dev/shm", name)).st_ino
    rss, inside, found = 0, False, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's first line
                inside = len(fields) > 4 and fields[4] == str(ino)
                found |= inside
            elif inside and line.startswith("Rss:"):
                rss += int(fields[1]) * 1024
    assert found, f"no mapping of {name}"
    return rss


class Members:
    """N threads that each take `lock` once (an exact count under the lock) and then stay
    alive holding their participant slot, as a pool's worker threads do, until stop()."""

    def __init__(self, lock, n: int, at_once: bool = False) -> None:
        self.lock, self.count, self.errors = lock, 0, []
        self._stop, self._done = threading.Event(), threading.Semaphore(0)
        self._go = threading.Barrier(n + 1) if at_once else None
        self.threads = [threading.Thread(target=self._work) for _ in range(n)]
        with small_stacks():
            for t in self.threads:
                t.start()
                if not at_once:
                    assert self._done.acquire(timeout=60), "a member did not take the lock"
        if at_once:
            self._go.wait(60)
            for _ in self.threads:
                assert self._done.acquire(timeout=120), "a member did not take the lock"

    def _work(self) -> None:
        if self._go is not None:
            self._go.wait(60)
        try:
            with self.lock:
                self.count += 1  # under the lock: exact only if it excludes
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        self._done.release()
        self._stop.wait(120)

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_thousand_live_threads_each_take_a_default_lock_once(new_lock):
    """A pool of 1,000 threads, each taking the lock once and staying alive (it keeps its
    slot), one after another: no CapacityError, an exact count (before: 936 of them got
    CapacityError, 36 of 100 in /work/shared's live_threads.py)."""
    lock = new_lock("futex")
    m = Members(lock, THREADS)
    try:
        assert m.errors == [] and m.count == THREADS
        alive = [p for p in lock.region._describe()["participants"] if p["alive"]]
        assert len(alive) == THREADS
        assert lock.region._provisioned == 1024  # 32, then doubled five times
        assert lock.region.max_participants == 4096
    finally:
        m.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_a_thousand_threads_block_on_one_default_lock(new_lock, kind):
    """1,000 threads of one process blocked on one lock at once, every kind: each gets it
    once the holder lets go, exact count, no error (before: 936 CapacityErrors)."""
    lock = new_lock(kind)
    count, errors = 0, []
    go = threading.Barrier(THREADS + 1)

    def work() -> None:
        nonlocal count
        go.wait(60)
        try:
            with lock:
                count += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    assert lock.acquire(timeout=5)
    with small_stacks():
        ts = [threading.Thread(target=work) for _ in range(THREADS)]
        for t in ts:
            t.start()
    try:
        go.wait(60)
        until(lambda: lock._describe()["waiters"] + len(errors) >= THREADS, 120, "all waiting")
    finally:
        lock.release()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a waiter was stranded"
    assert errors == [] and count == THREADS
    assert lock._describe()["waiters"] == 0 and not lock.locked()


def _process_of_threads(
    name: str, kind: str, threads: int, rounds: int, a, ready, go, done, leave
) -> None:
    """One process of `threads` threads, each taking lock `name` `rounds` times, counting
    under it in the shared words `a` (a[0]: the count, a[1]: overlaps, a[2]: errors), then
    staying alive (its slot kept) until `leave` is set."""
    lock = shmlocks.KINDS[kind].open(name)

    def work() -> None:
        try:
            for _ in range(rounds):
                with lock:
                    if a[3]:
                        a[1] += 1
                    a[3] = 1
                    a[0] += 1
                    a[3] = 0
        except Exception:  # noqa: BLE001 - counted
            a[2] += 1
        done.release()
        leave.wait(240)

    with small_stacks():
        ts = [threading.Thread(target=work) for _ in range(threads)]
    ready.release()
    go.wait(60)
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    lock.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("processes", "threads"),
    [(16, 32), pytest.param(64, 32, id="64x32-full", marks=pytest.mark.slow)],
)
def test_processes_of_threads_share_one_default_lock(procs, new_lock, processes, threads):
    """`processes` processes of `threads` threads each on one lock made with the defaults
    (4 gunicorn workers of 32 threads, or 64 of them), every thread alive at once: every
    acquire succeeds, the count is exact, no two holders overlapped (before:
    CapacityError past the 64th thread)."""
    lock = new_lock("ticket")
    rounds = 3
    ctx = mp.get_context("fork")
    a = ctx.RawArray("q", 4)
    ready, done, go = ctx.Semaphore(0), ctx.Semaphore(0), ctx.Barrier(processes + 1)
    leave = ctx.Event()
    ps = [
        procs.start(
            _process_of_threads, lock.name, "ticket", threads, rounds, a, ready, go, done, leave
        )
        for _ in range(processes)
    ]
    try:
        for _ in ps:
            assert ready.acquire(timeout=120), "a process did not start"
        go.wait(60)
        for _ in range(processes * threads):
            assert done.acquire(timeout=240), f"threads did not finish: count {a[0]}"
        assert (a[0], a[1], a[2]) == (processes * threads * rounds, 0, 0)
        alive = [p for p in lock.region._describe()["participants"] if p["alive"]]
        assert len(alive) == processes * threads
        assert lock.region._provisioned >= processes * threads
    finally:
        leave.set()
    assert not join_all(ps, 120), "processes did not finish"
    assert [p.exitcode for p in ps] == [0] * processes


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_memory_grows_with_the_participants_used(new_lock):
    """A default lock is as small as layout 7's 64-participant lock (36 KiB, nine pages);
    64 threads make it grow once (its participants' lines, no more); 1,000 make it grow to
    1,024 participants' worth, far from the 3 MiB its cap would take: tmpfs's pages
    (st_blocks) and this process's resident pages of the mapping both."""
    lock = new_lock("clh")
    fresh = _resident(lock)
    assert fresh == 36 * 1024, fresh
    assert _mapping_rss(lock.name) <= fresh
    m = Members(lock, 64)
    try:
        assert m.count == 64 and lock.region._provisioned == 64
        # 32 more participants: 512 bytes each, a node and a prec line (256 bytes) in the body
        assert fresh < _resident(lock) <= fresh + 32 * 768 + 3 * 4096, _resident(lock)
        assert _mapping_rss(lock.name) <= _resident(lock)
    finally:
        m.stop()
    m = Members(lock, THREADS)
    try:
        assert m.count == THREADS and lock.region._provisioned == 1024
        grown = _resident(lock)
        assert 1024 * 768 <= grown <= 1024 * 768 + 64 * 1024, grown
        assert _mapping_rss(lock.name) <= grown
        assert grown < os.stat(os.path.join("/dev/shm", lock.name)).st_size / 3
    finally:
        m.stop()


def _grow_racer(name: str, threads: int, go, q, leave) -> None:
    """Register `threads` threads at once (a growth race with the other processes'), each
    taking the lock once; send back the slots they took."""
    lock = shmlocks.TicketLock.open(name)
    slots, errors = [], []
    start = threading.Barrier(threads)
    stop = threading.Event()

    def work() -> None:
        start.wait(60)
        try:
            with lock:
                slots.append((lock._raw()["holder"] & 0x1FFF) - 1)
        except Exception as e:  # noqa: BLE001 - sent back
            errors.append(repr(e))
        stop.wait(60)

    go.wait(60)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    until(lambda: len(slots) + len(errors) == threads, 120, "every thread took the lock")
    q.put((slots, errors))
    leave.wait(120)  # the test has looked: let go
    stop.set()
    for t in ts:
        t.join(60)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_processes_growing_at_once(procs, new_lock):
    """Eight processes register 40 threads each at the same instant, so several of them
    find the provisioned slots all taken and grow the region at once: one growth wins
    each round (one part_hwm, doubled from 32 to 512), and every slot is claimed by one
    thread only."""
    lock = new_lock("ticket")
    n, threads = 8, 40
    ctx = mp.get_context("fork")
    go, leave = ctx.Barrier(n), ctx.Event()
    qs = [ctx.Queue() for _ in range(n)]
    ps = [procs.start(_grow_racer, lock.name, threads, go, q, leave) for q in qs]
    try:
        got = [q.get(timeout=180) for q in qs]
        slots = [s for ss, _ in got for s in ss]
        assert [e for _, es in got for e in es] == []
        assert len(slots) == n * threads and len(set(slots)) == n * threads
        assert lock.region._provisioned == 512 and max(slots) < 512
        seg = _segment.read(lock.name)
        assert seg.provisioned == 512
        alive = [p for p in _segment.describe(seg)["participants"] if p["alive"]]
        assert sorted(p["slot"] for p in alive) == sorted(slots)
    finally:
        leave.set()
    assert not join_all(ps, 60)


@pytest.mark.timeout(60)
def test_a_cap_is_still_a_cap():
    """max_participants=8: the ninth thread at once gets CapacityError naming the cap and
    what to do; None is the most a region can have (4096), and 0 or 4097 is ValueError."""
    with shmlocks.Region.create(uniq("cap"), max_locks=1, max_participants=8) as region:
        lock = region.create_lock("a", "mcs")
        m = Members(lock, 8)
        try:
            with pytest.raises(shmlocks.CapacityError, match="max_participants=8") as e:
                lock.acquire()
            assert "max_participants" in str(e.value) and region.name in str(e.value)
            assert region._provisioned == 8 == region.max_participants
        finally:
            m.stop()
    for bad in (0, 4097):
        with pytest.raises(ValueError):
            shmlocks.FutexMutex(uniq("cap"), max_participants=bad)
    lock = shmlocks.FutexMutex(uniq("cap"), max_participants=None)
    try:
        assert lock.region.max_participants == 4096 and lock.region._provisioned == 32
    finally:
        lock.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readers_on_a_grown_region():
    """inspect, stat and the wait-for graph read a grown region: a holder and waiters in
    slots past the first 64 are shown, and a deadlock between two of them is a cycle (70
    threads: grown to 128)."""
    from shmlocks import get_deadlock_timeout, set_deadlock_timeout

    region = shmlocks.Region.create(uniq("grown-read"), max_locks=2)
    old = get_deadlock_timeout()
    set_deadlock_timeout(None)  # the look would end the cycle below before it is read
    a, b = region.create_lock("a", "futex"), region.create_lock("b", "ticket")
    m = Members(a, 70)
    held = [threading.Event(), threading.Event()]
    slots = [0, 0]

    def cross(first, second, i) -> None:
        with first:
            slots[i] = (first._raw()["holder"] & 0x1FFF) - 1
            held[i].set()
            held[1 - i].wait(10)
            if second.acquire(timeout=3):
                second.release()

    try:
        ts = [
            threading.Thread(target=cross, args=(a, b, 0)),
            threading.Thread(target=cross, args=(b, a, 1)),
        ]
        for t in ts:
            t.start()
        for e in held:
            assert e.wait(10)
        until(lambda: a._describe()["waiters"] == 1 and b._describe()["waiters"] == 1, 5)
        assert min(slots) >= 64, slots
        seg = _segment.read(region.name)
        d = _segment.describe(seg)
        mapped = region._describe()
        assert d["participants_provisioned"] == 128 == mapped["participants_provisioned"]
        for lk, md in zip(d["locks"], mapped["locks"], strict=True):
            assert lk["holder"]["slot"] == md["holder"]["slot"] >= 64
            assert lk["waiters"] == md["waiters"] == 1
        st = stats.segment_stats(region.name)
        assert [lk["waiters"] for lk in st["locks"]] == [1, 1]
        cycles = waitgraph.snapshot([region.name]).cycles()
        assert len(cycles) == 1 and len(cycles[0]) == 2
        for t in ts:
            t.join(10)
    finally:
        set_deadlock_timeout(old)
        m.stop()
        region.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("rounds", [2])
def test_ticket_many_waiters_time_out_at_random(new_lock, rounds):
    """More than 64 threads queue on one ticket lock (so tickets share slot lines, and the
    abandon markers of two abandoned tickets of one slot overflow into their owners'
    records: ticket.pxi), half of them with short timeouts that expire at random while
    they wait, before and during the hand-offs: every thread that stays gets the lock,
    once, in the order it queued (FIFO among those that stay), every one that times out
    returns False, the count is exact, and no waiter is left."""
    lock = new_lock("ticket")
    n = 160
    for rnd in range(rounds):
        rng = random.Random(rnd)
        order, results = [], [None] * n
        count = 0

        def waiter(i: int, timeout: float, order=order, results=results) -> None:
            nonlocal count
            got = lock.acquire(timeout=timeout)
            if got:
                order.append(i)
                count += 1
                time.sleep(0.005)
                lock.release()
            results[i] = got

        assert lock.acquire(timeout=5)
        short = set(rng.sample(range(n), n // 2))
        t0 = time.monotonic()
        with small_stacks():
            ts = []
            for i in range(n):
                tmo = rng.uniform(6.0, 8.0) if i in short else 90.0
                ts.append(threading.Thread(target=waiter, args=(i, tmo)))
                ts[-1].start()
                # queued (its ticket taken) before the next one: the arrival order is i
                until(lambda i=i: lock._describe()["waiters"] >= i + 1, 10, f"waiter {i}")
        assert time.monotonic() - t0 < 5.5, "queueing took too long for the timeouts"
        assert all(r is None for r in results)
        time.sleep(max(0.0, t0 + rng.uniform(6.5, 7.0) - time.monotonic()))
        lock.release()  # some short timeouts expired while it was held, more will now
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts), "a waiter was stranded"
        stayed = [i for i in range(n) if i not in short]
        assert all(results[i] is True for i in stayed)
        assert all(r in (True, False) for r in results)
        assert any(r is False for r in results) and any(results[i] for i in short)
        assert order == sorted(order), "not FIFO among those that got the lock"
        assert count == len(order) == sum(1 for r in results if r)
        assert lock._describe()["waiters"] == 0 and not lock.locked()
        assert lock.acquire(timeout=5)
        lock.release()
