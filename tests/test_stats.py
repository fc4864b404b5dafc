"""Lock statistics (docs/design.md §10): exact counts after known workloads across
processes, for every kind; counters survive a SIGKILLed holder; reset; scribbled counters
are shown as the numbers they are."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import time

import pytest
from support import KINDS, Holder, join_all, kill, shm_path

#: the keys stats() promises (docs/design.md §10), written out here on purpose rather than
#: imported from shmlocks.stats.STAT_KEYS: a key dropped or renamed there must fail here
KEYS = {
    "acquisitions",
    "contended",
    "wait_total_s",
    "wait_max_s",
    "timeouts",
    "owner_deaths",
    "handoffs",
}
ZERO = dict.fromkeys(KEYS, 0)


def _wait_for_waiter(lock, timeout=20.0) -> None:
    """Until a participant published that it waits for `lock` (it is in the slow path)."""
    deadline = time.monotonic() + timeout
    while lock._describe()["waiters"] < 1:
        assert time.monotonic() < deadline, "the child never started waiting"
        time.sleep(0.002)


def _count(lock, barrier, iters):
    barrier.wait(30)
    for _ in range(iters):
        lock.acquire()
        lock.release()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", KINDS)
def test_four_processes_exact_counts(kind, new_lock, procs):
    """4 processes x 10,000 acquisitions: acquisitions is exactly 40,000, the rest within
    what the run allows (each process's first hold follows another's: >= 3 hand-offs)."""
    lock = new_lock(kind, max_participants=8)
    barrier = mp.get_context("fork").Barrier(4)
    workers = [procs.start(_count, lock, barrier, 10_000) for _ in range(4)]
    assert not join_all(workers, 200), "workers did not finish"
    assert [p.exitcode for p in workers] == [0] * 4
    s = lock.stats()
    assert set(s) >= KEYS
    assert s["acquisitions"] == 40_000
    assert 0 <= s["contended"] <= 40_000
    assert 3 <= s["handoffs"] <= 40_000
    assert (s["timeouts"], s["owner_deaths"]) == (0, 0)
    assert 0.0 <= s["wait_max_s"] <= s["wait_total_s"]
    assert (s["wait_total_s"] > 0) == (s["contended"] > 0)


def _acquire_once(lock, timeout):
    ok = lock.acquire(timeout=timeout)
    if ok:
        lock.release()
    os._exit(0 if ok else 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_forced_contention_is_counted_with_its_wait(kind, new_lock, procs):
    lock = new_lock(kind)
    lock.acquire()
    child = procs.start(_acquire_once, lock, 20.0)
    _wait_for_waiter(lock)
    time.sleep(0.05)
    lock.release()
    child.join(20)
    assert child.exitcode == 0
    s = lock.stats()
    assert (s["acquisitions"], s["contended"], s["timeouts"]) == (2, 1, 0)
    assert s["handoffs"] == 1, "the child took the lock from our process"
    assert 0.04 <= s["wait_max_s"] == s["wait_total_s"] < 20.0
    with lock:
        pass
    s = lock.stats()
    assert (s["acquisitions"], s["contended"], s["handoffs"]) == (3, 1, 2)


def _time_out(lock, n, m):
    for _ in range(n):
        assert lock.acquire(timeout=0.01) is False
    assert lock.acquire(timeout=0) is False
    for _ in range(m):
        assert lock.acquire(blocking=False) is False
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_timeouts_equal_the_timed_out_calls(kind, new_lock, procs):
    """Each timed acquire that returned False counts once (timeout=0 included); a
    non-blocking attempt on a held lock is not a timeout."""
    lock = new_lock(kind)
    with lock:
        assert procs.call(_time_out, lock, 5, 4) is True
    s = lock.stats()
    assert s["timeouts"] == 6
    assert (s["acquisitions"], s["contended"], s["handoffs"]) == (1, 0, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_owner_death_counted_once_and_counters_survive(kind, new_lock, procs):
    lock = new_lock(kind)
    for _ in range(10):
        with lock:
            pass
    holder = Holder(procs, lock)
    holder.kill()
    assert lock.acquire(timeout=10)
    try:
        assert lock.owner_died
        lock.mark_consistent()
    finally:
        lock.release()
    with lock:
        pass
    s = lock.stats()
    assert s["owner_deaths"] == 1
    assert s["acquisitions"] == 13, "10 + the killed holder's + 2 after it"
    assert s["handoffs"] == 2, "to the holder, and back from it"


@pytest.mark.timeout(60)
def test_reset_and_region_stats(new_region, procs):
    region = new_region(max_locks=len(KINDS))
    locks = [region.create_lock(f"s-{k}", k) for k in KINDS]
    for i, lock in enumerate(locks):
        for _ in range(i + 1):
            with lock:
                pass
    stats = region.stats()
    assert list(stats) == [f"s-{k}" for k in KINDS]
    assert [s["acquisitions"] for s in stats.values()] == list(range(1, len(KINDS) + 1))
    locks[0].reset_stats()
    assert locks[0].stats() == ZERO
    assert locks[1].stats()["acquisitions"] == 2
    region.reset_stats()
    assert all(s == ZERO for s in region.stats().values())
    with locks[2]:
        pass
    assert locks[2].stats()["acquisitions"] == 1
    assert locks[2].stats()["handoffs"] == 0, "last holder's pid is kept across a reset"


@pytest.mark.timeout(30)
def test_stats_of_a_closed_lock_raise(new_lock):
    lock = new_lock("ticket")
    lock.close()
    with pytest.raises(ValueError):
        lock.stats()
    with pytest.raises(ValueError):
        lock.reset_stats()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_scribbled_counters_are_numbers(kind, new_lock):
    """Counters overwritten by a stray writer are shown as the numbers they hold; the lock
    keeps working and counting from them (they are never used as indices)."""
    lock = new_lock(kind)
    with open(shm_path(lock.name), "r+b") as f:
        head = f.read(128)
        locks_off = struct.unpack_from("<Q", head, 48)[0]
        f.seek(locks_off + 16)
        f.write(struct.pack("<QQQQQ", 2**64 - 1, 7, 2**63, 5, 10**18))
    s = lock.stats()
    assert s["acquisitions"] == 2**64 - 1 and s["handoffs"] == 7
    assert s["contended"] == 2**63 and s["wait_max_s"] == 1e9
    with lock:
        pass
    assert lock.stats()["acquisitions"] == 0, "wraps like the 64-bit number it is"


def _hold_forever(lock, ev):
    lock.acquire()
    ev.set()
    time.sleep(60)


@pytest.mark.timeout(60)
def test_stats_readable_while_held_and_after_holder_death(new_lock, procs):
    lock = new_lock("mcs")
    ev = mp.get_context("fork").Event()
    p = procs.start(_hold_forever, lock, ev)
    assert ev.wait(20)
    assert lock.stats()["acquisitions"] == 1
    kill(p)
    assert lock.stats()["acquisitions"] == 1
    assert lock.acquire(timeout=10)
    lock.mark_consistent()
    lock.release()
    s = lock.stats()
    assert (s["acquisitions"], s["owner_deaths"]) == (2, 1)


def _count_forever(lock, counter, died_seen, stop):
    while not stop.value:  # a raw word: a killed worker can hold no lock of it
        if not lock.acquire(timeout=20):
            os._exit(3)
        try:
            if lock.owner_died:
                died_seen.value += 1  # under the lock: plain read-modify-writes
                lock.mark_consistent()
            counter.value += 1
        finally:
            lock.release()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_counts_stay_within_bounds_under_random_sigkills(kind, new_lock, procs):
    """Workers counting under the lock are SIGKILLed at random points, holders included:
    every finished section was counted as a hold, and only a killed process can have
    begun a hold and not finished its section, so counter <= acquisitions <= counter +
    kills; a hold begins with owner_died only after a death, so owner_deaths <= kills."""
    import random

    lock = new_lock(kind, max_participants=16)
    ctx = mp.get_context("fork")
    counter, died_seen, stop = (ctx.RawValue("q", 0) for _ in range(3))
    workers = [procs.start(_count_forever, lock, counter, died_seen, stop) for _ in range(3)]
    rnd = random.Random(12)
    kills = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        time.sleep(rnd.uniform(0.005, 0.05))
        i = rnd.randrange(len(workers))
        kill(workers[i])
        kills += 1
        workers[i] = procs.start(_count_forever, lock, counter, died_seen, stop)
    stop.value = 1
    assert not join_all(workers, 60), "workers did not finish"
    assert [p.exitcode for p in workers] == [0] * len(workers)
    # a holder killed last leaves the lock to recover: one more hold settles it
    assert lock.acquire(timeout=20)
    if lock.owner_died:
        lock.mark_consistent()
    lock.release()
    s = lock.stats()
    n = counter.value + 1  # the sections, and our hold
    assert n <= s["acquisitions"] <= n + kills, (s, n, kills)
    assert s["owner_deaths"] <= kills
    assert s["owner_deaths"] >= died_seen.value
    assert s["handoffs"] <= s["acquisitions"] and s["contended"] <= s["acquisitions"]
    assert s["timeouts"] == 0


class _Miscounts:
    """A sound lock whose counters miss a tenth of its holds."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def stats(self):
        s = dict(self.inner.stats())
        s["acquisitions"] -= s["acquisitions"] // 10 + 1
        return s


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broken", [False, True], ids=["sound", "miscounting"])
def test_kill_torture_checks_the_lock_counters(monkeypatch, broken):
    """The kill torture holds the lock's counters to its own books: they agree for a
    sound lock under kills, and a lock that miscounts is reported as violating."""
    from shmlocks import torture as t

    if broken:
        init = t._Run.__init__

        def wrapped(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.lock = _Miscounts(self.lock)

        monkeypatch.setattr(t._Run, "__init__", wrapped)
    res = t.torture_kind("mcs", 1.0, 3, seed=3)
    assert res.lock_stats is not None and res.kills > 0
    if broken:
        assert not res.ok and any("lock counted" in n for n in res.notes), res.line()
    else:
        assert res.ok, (res.line(), res.notes)
        assert res.lock_stats["owner_deaths"] >= res.recoveries
