"""One conformance suite for every lock kind, with multiprocessing.Lock as the reference.

A failure on the ``mp`` reference means the test is wrong, not the library. Only the
behaviour both share is used here: ``acquire(blocking, timeout)``, ``release()``, ``with``.
The mutual-exclusion checker is tests/support's; tests/test_harness.py shows it fails
deliberately broken locks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
from support import (
    KINDS,
    START_METHODS,
    Holder,
    abort_stress,
    assert_timed_out,
    check_mutual_exclusion,
    is_locked,
    timed,
    uniq,
    wait_blocked,
)

LOCK_IDS = (*KINDS, "mp")


@pytest.fixture
def make_any_lock(shmlock):
    """``make_any_lock(lock_id, method)``: a shmlocks lock of that kind (the plugin's
    ``shmlock`` fixture, which closes it at teardown), or ctx.Lock()."""

    def make(lock_id, method="fork"):
        if lock_id == "mp":
            return mp.get_context(method).Lock()
        return shmlock(lock_id, name=uniq(f"conf-{lock_id}"))

    return make


# --------------------------------------------------------------------------- exclusion


@pytest.mark.timeout(100)
@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_mutual_exclusion_exact_counter(procs, make_any_lock, lock_id, method):
    lock = make_any_lock(lock_id, method)
    report = check_mutual_exclusion(procs, lock, method, nprocs=3, iters=2000)
    assert report.ok, report


@pytest.mark.timeout(100)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_mutual_exclusion_threads_and_processes(procs, make_any_lock, lock_id):
    """Each thread of each process is its own participant: 2 processes x 3 threads."""
    lock = make_any_lock(lock_id)
    report = check_mutual_exclusion(procs, lock, "fork", nprocs=2, iters=700, nthreads=3)
    assert report.ok, report


@pytest.mark.timeout(100)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_timeouts_leave_the_lock_usable(procs, make_any_lock, lock_id):
    """Waiters that give up (try-locks, tiny timeouts) strand nothing: the counter stays
    exact and the waits that should succeed do, without a 5 s stall."""
    lock = make_any_lock(lock_id)
    report = abort_stress(procs, lock, nprocs=3, nthreads=2, rounds=1500)
    assert report.ok, report
    assert lock.acquire(True, 2) is True
    lock.release()


# --------------------------------------------------------------------------- single holder


@pytest.mark.timeout(20)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_acquire_release_and_with(make_any_lock, lock_id):
    lock = make_any_lock(lock_id)
    assert is_locked(lock) is False
    assert lock.acquire() is True
    assert is_locked(lock) is True
    lock.release()
    assert is_locked(lock) is False

    assert lock.acquire(False) is True
    lock.release()
    assert lock.acquire(True, 1.0) is True
    lock.release()
    assert lock.acquire(timeout=None) is True
    lock.release()

    with lock:
        assert is_locked(lock) is True
    assert is_locked(lock) is False

    with pytest.raises(ZeroDivisionError), lock:
        1 / 0  # noqa: B018
    assert is_locked(lock) is False, "an exception in the with block left the lock held"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_held_by_another_process(procs, make_any_lock, lock_id):
    lock = make_any_lock(lock_id)
    holder = Holder(procs, lock)
    try:
        assert is_locked(lock) is True
        got, elapsed = timed(lock.acquire, False)
        assert got is False
        assert elapsed < 0.5, f"a non-blocking acquire took {elapsed:.3f}s"
        got, elapsed = timed(lock.acquire, True, 0)
        assert got is False
        assert elapsed < 0.5, f"acquire(timeout=0) took {elapsed:.3f}s"
        # multiprocessing.Lock (the control) times its wait on CLOCK_REALTIME
        # (sem_timedwait, its deadline from gettimeofday), which the clock's adjustment can
        # end a millisecond or two early by CLOCK_MONOTONIC; ours are held to 1 ms
        early = 0.005 if lock_id == "mp" else 1e-3
        assert_timed_out(lock, 0.05, early=early)
        assert_timed_out(lock, 0.3, early=early)
    finally:
        holder.release()
    got, elapsed = timed(lock.acquire, True, 5)
    assert got is True
    lock.release()


def _hold_then_release(lock, conn, hold_s):
    lock.acquire()
    conn.send(time.monotonic())
    time.sleep(hold_s)
    released = time.monotonic()
    lock.release()
    conn.send(released)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_blocking_acquire_waits_for_the_release(procs, make_any_lock, lock_id):
    """A blocked acquire returns once the other process releases, and not long after."""
    lock = make_any_lock(lock_id)
    r, w = mp.Pipe(duplex=False)
    p = procs.start(_hold_then_release, lock, w, 0.4)
    assert r.poll(20), "child did not take the lock"
    held_at = r.recv()
    got = lock.acquire(timeout=None)
    acquired_at = time.monotonic()
    assert got is True
    try:
        assert r.poll(5)
        released_at = r.recv()
        assert released_at - held_at >= 0.4 - 1e-3
        assert acquired_at >= released_at, "acquired while the other process still held it"
        lag = acquired_at - released_at
        assert lag < 0.5, f"the waiter took {lag:.3f}s to notice the release"
    finally:
        lock.release()
    p.join(10)
    assert p.exitcode == 0


def _interruptible_waiter(lock, conn):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.send("waiting")
    try:
        lock.acquire(True, 20)
    except KeyboardInterrupt:
        conn.send(("interrupted", time.monotonic()))
        return
    conn.send(("acquired", time.monotonic()))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_ctrl_c_interrupts_a_blocked_acquire(procs, make_any_lock, lock_id):
    lock = make_any_lock(lock_id)
    assert lock.acquire()
    try:
        r, w = mp.Pipe(duplex=False)
        p = procs.start(_interruptible_waiter, lock, w)
        assert r.poll(20) and r.recv() == "waiting"
        wait_blocked(p.pid)
        sent = time.monotonic()
        os.kill(p.pid, signal.SIGINT)
        assert r.poll(5), "SIGINT did not end the blocked acquire"
        what, when = r.recv()
        assert what == "interrupted"
        assert when - sent < 0.25, f"KeyboardInterrupt took {when - sent:.3f}s (SPEC: 100 ms)"
        p.join(5)
        assert p.exitcode == 0
    finally:
        lock.release()
    # the interrupted waiter left nothing behind
    holder = Holder(procs, lock)
    holder.release()
    assert lock.acquire(True, 2) is True
    lock.release()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_blocked_acquire_releases_the_gil(procs, make_any_lock, lock_id):
    lock = make_any_lock(lock_id)
    holder = Holder(procs, lock)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = ticks[0]
        assert lock.acquire(True, 0.5) is False
        during = ticks[0] - before
    finally:
        stop.set()
        t.join(5)
        holder.release()
    # a thread that can run freely counts millions in 0.5 s; one starved by a waiter that
    # holds the GIL gets a handful of switch intervals at most
    assert during > 20000, f"the other thread ran only {during} loops during a 0.5 s wait"
