"""Owner death for the kernel-robust kinds ("robust", "pi"): EOWNERDEAD becomes
``owner_died``, ``mark_consistent()`` repairs, releasing unrepaired makes the lock
unrecoverable for every process."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
from support import ROBUST_KINDS, kill, me, outcome, until, wait_blocked

import shmlocks
from shmlocks.testing import kill_while_holding

pytestmark = [pytest.mark.timeout(40), pytest.mark.parametrize("kind", ROBUST_KINDS)]


def _hold_until_killed(lock, conn):
    assert lock.acquire(timeout=10)
    conn.send(os.getpid())
    time.sleep(30)  # the parent SIGKILLs us long before this
    os._exit(3)


def _take(lock):
    assert lock.acquire(timeout=10)
    time.sleep(30)  # SIGKILLed as soon as it holds the lock


def kill_holder(procs, lock):
    """A child takes the lock and is SIGKILLed while holding it (shmlocks.testing)."""
    return kill_while_holding(lock, _take, lock, start_method="fork", timeout=20)


def _acquire_report(lock, timeout=2.0):
    got = lock.acquire(timeout=timeout)
    died = lock.owner_died if got else None
    if got:
        lock.release()
    return got, died


def _try_acquire(lock, seconds):
    return outcome(lock.acquire, timeout=seconds)


def _open_and_try(name, kind):
    lock = shmlocks.KINDS[kind].open(name)
    try:
        return outcome(lock.acquire, timeout=1.0)
    finally:
        lock.close()


def recovered_acquire(lock):
    t0 = time.monotonic()
    got = lock.acquire(timeout=5)
    assert got is True, "acquire after the holder's death did not succeed within 5 s"
    assert time.monotonic() - t0 < 5
    assert lock.owner_died is True
    assert lock.owner == me()
    assert lock.locked() is True


def test_owner_death_then_mark_consistent(procs, new_lock, kind):
    lock = new_lock(kind)
    assert lock.owner_died is False
    kill_holder(procs, lock)
    recovered_acquire(lock)
    lock.mark_consistent()
    lock.release()
    assert lock.locked() is False
    assert lock.owner is None
    # back to normal, here and in another process
    assert lock.acquire(timeout=1) is True
    assert lock.owner_died is False
    lock.release()
    assert procs.call(_acquire_report, lock) == (True, False)
    assert procs.call(_open_and_try, lock.name, kind, method="spawn") == ("ok", True)


def test_release_without_mark_consistent_is_unrecoverable(procs, new_lock, kind):
    lock = new_lock(kind)
    kill_holder(procs, lock)
    recovered_acquire(lock)
    lock.release()  # without mark_consistent()
    for args in ((), (True, 0.2), (False,), (True, None)):
        with pytest.raises(shmlocks.LockNotRecoverableError):
            lock.acquire(*args)
    with pytest.raises(shmlocks.LockNotRecoverableError):
        with lock:
            pass
    # in every process: an inherited object, and one opened by name in a fresh interpreter
    assert procs.call(_try_acquire, lock, 1.0) == "LockNotRecoverableError"
    assert procs.call(_open_and_try, lock.name, kind, method="spawn") == "LockNotRecoverableError"
    # and another view in this process
    view = shmlocks.KINDS[kind].open(lock.name)
    try:
        with pytest.raises(shmlocks.LockNotRecoverableError):
            view.acquire(timeout=0.2)
    finally:
        view.close()


def _blocked_waiter(lock, conn, stamp):
    conn.send(os.getpid())
    got = lock.acquire(timeout=10)
    stamp[0] = time.monotonic()
    stamp[1] = 1.0 if got else 0.0
    stamp[2] = 1.0 if (got and lock.owner_died) else 0.0
    if got:
        lock.mark_consistent()
        lock.release()


def test_blocked_waiter_recovers_when_holder_dies(procs, new_lock, kind):
    lock = new_lock(kind)
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    holder = procs.start(_hold_until_killed, lock, w, ctx=ctx)
    assert r.poll(20)
    r.recv()
    stamp = ctx.Array("d", [0.0, 0.0, 0.0], lock=False)
    r2, w2 = ctx.Pipe(duplex=False)
    waiter = procs.start(_blocked_waiter, lock, w2, stamp, ctx=ctx)
    assert r2.poll(20)
    r2.recv()
    wait_blocked(waiter.pid)
    assert waiter.is_alive() and stamp[1] == 0.0
    killed_at = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    waiter.join(10)
    assert waiter.exitcode == 0
    assert stamp[1] == 1.0, "the blocked waiter never got the lock"
    assert stamp[2] == 1.0, "the blocked waiter was not told owner_died"
    lag = stamp[0] - killed_at
    assert lag < 1.0, f"the blocked waiter took {lag:.3f}s to recover the lock"
    assert procs.call(_acquire_report, lock) == (True, False)


def test_thread_exit_while_holding_is_owner_death(new_lock, kind):
    lock = new_lock(kind)
    t = threading.Thread(target=lambda: lock.acquire())
    t.start()
    t.join(10)
    assert not t.is_alive()
    recovered_acquire(lock)
    lock.mark_consistent()
    lock.release()
    assert lock.acquire(timeout=1) is True
    assert lock.owner_died is False
    lock.release()


def test_dead_waiter_does_not_block_the_lock(procs, new_lock, kind):
    """A waiter SIGKILLed while queued leaves nothing behind: later acquires are normal."""
    lock = new_lock(kind)
    assert lock.acquire()
    ctx = mp.get_context("fork")
    stamp = ctx.Array("d", [0.0, 0.0, 0.0], lock=False)
    r, w = ctx.Pipe(duplex=False)
    waiter = procs.start(_blocked_waiter, lock, w, stamp, ctx=ctx)
    try:
        assert r.poll(20)
        r.recv()
        wait_blocked(waiter.pid)
        kill(waiter)
        assert waiter.exitcode == -signal.SIGKILL
    finally:
        lock.release()
    assert procs.call(_acquire_report, lock) == (True, False)
    assert lock.acquire(timeout=1) is True
    assert lock.owner_died is False
    lock.release()


# -- a dead holder whose participant slot was reused (docs/design.md §7.4 [R1]) ----------


def _die_holding(lock, at=None):
    """A forked child takes the lock and is SIGKILLed holding it: by a real SIGKILL right
    after acquire() returns, or at library crash point ``at``. Returns its pid (= its
    thread id: the child's main thread)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if at is not None:
                shmlocks._core._arm_crashpoint(at)
            lock.acquire(timeout=10)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    return pid


def _region_of_two(new_region, kind):
    """A region of two participant slots, one this thread's: a child takes the other."""
    region = new_region(max_locks=2, max_participants=2)
    lock = region.create_lock("held", kind)
    other = region.create_lock("other", "futex")
    assert other.acquire(timeout=5)  # this thread's slot
    other.release()
    return region, lock, other


def _reuse_the_slot(other):
    """A new thread registers in the region (on another lock of it): with the other slot
    this thread's, only by recovering the dead child's slot and taking it over."""
    errors, tids = [], []

    def run():
        tids.append(threading.get_native_id())
        try:
            assert other.acquire(timeout=10)
            other.release()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(20)
    assert not t.is_alive() and not errors, errors
    # join() returns before the kernel has ended the thread (and marked its slot's token):
    # a registration before that would find no free slot
    until(lambda: not os.path.exists(f"/proc/self/task/{tids[0]}"), 10, "the thread's exit")


def _assert_dead_holder(region, lock, pid):
    from shmlocks import stats
    from shmlocks.cli._common import describe

    assert lock.locked() is True
    assert lock.owner == (pid, pid)
    seen = [
        lock._describe()["holder"],  # this process's view (Lock, inspect in-process)
        describe(region.name)["locks"][0]["holder"],  # `shmlocks inspect` (the copy)
        stats.segment_stats(region.name)["locks"][0]["holder"],  # `shmlocks stat`, `top`
    ]
    for h in seen:
        assert h is not None and (h["pid"], h["tid"], h["alive"]) == (pid, pid, False), seen


def test_a_dead_holder_is_reported_after_its_slot_is_reused(new_region, kind):
    """SPEC: the holder (pid, tid, alive or dead). The kernel keeps no owner in the mutex
    word once it marks the death, and the slot that named the holder is recovered and
    reused: the holder is still reported, as dead, until the next acquire recovers the
    lock (as for the user-space kinds, which release a dead holder's lock at once)."""
    region, lock, other = _region_of_two(new_region, kind)
    pid = _die_holding(lock)
    _assert_dead_holder(region, lock, pid)  # (its slot still names it)
    _reuse_the_slot(other)
    _assert_dead_holder(region, lock, pid)
    assert lock.acquire(timeout=5) is True
    assert lock.owner_died is True and lock.owner == me()
    lock.mark_consistent()
    lock.release()
    assert lock.owner is None and lock._describe()["holder"] is None


def test_a_holder_killed_before_its_holder_record_after_an_earlier_death(new_region, kind):
    """A holder killed between the kernel's grant and its holder record (crash point
    lock.acquire.got) is reported from its published step, and after its slot is reused
    from the record its recoverer kept; never as the holder of an earlier, repaired
    death."""
    region, lock, other = _region_of_two(new_region, kind)
    first = _die_holding(lock)
    _reuse_the_slot(other)
    assert lock.acquire(timeout=5) is True and lock.owner_died is True
    lock.mark_consistent()
    lock.release()
    second = _die_holding(lock, at="lock.acquire.got")
    assert second != first
    assert lock.locked() is True
    assert lock._describe()["holder"]["pid"] == second
    _reuse_the_slot(other)
    _assert_dead_holder(region, lock, second)
    assert lock.acquire(timeout=5) is True and lock.owner_died is True
    lock.mark_consistent()
    lock.release()
