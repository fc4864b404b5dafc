"""The priority-inheritance proof, under SCHED_FIFO on one CPU.

low (prio 10) holds the lock with 0.3 s of CPU work left; medium (prio 20) hogs the CPU
for 3 s; high (prio 30) then wants the lock. With PIMutex the kernel boosts low to high's
priority, so high waits about 0.3 s. With RobustMutex nothing boosts low, so high waits
for the hog to finish first. Run with ``pytest -s`` to see both waits.

Safety: every busy loop below has a hard wall-clock bound, the parent stays on another
CPU (so it can always kill the children), and the two variants never run at the same time
(an flock in /tmp serialises them across xdist workers).
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import time

import pytest
from support import kill

TEST_CPU = 1
PARENT_CPU = 0
LOW, MEDIUM, HIGH = 10, 20, 30
WORK_S = 0.3  # low's CPU work left while holding
HOG_S = 3.0  # medium's burn
HARD_S = 12.0  # no loop runs longer than this, whatever happens

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2 or TEST_CPU not in os.sched_getaffinity(0),
        reason="needs CPUs 0 and 1",
    ),
]


def _go_realtime(prio):
    """Policy first (while still on the parent's CPU), then move to the test CPU: a
    SCHED_OTHER process could not even get onto a CPU that a FIFO task is spinning on."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
    os.sched_setaffinity(0, {TEST_CPU})


def _low(lock, conn, hog_running):
    try:
        _go_realtime(LOW)
    except PermissionError:
        conn.send("EPERM")
        return
    hard = time.monotonic() + HARD_S
    if not lock.acquire(timeout=HARD_S):
        conn.send("no-lock")
        return
    conn.send("held")
    # Wait (busily: we must stay runnable) until the hog is on our CPU, which preempts us;
    # we only see the flag once we run again, boosted (PI) or after the hog (no PI).
    while not hog_running.value and time.monotonic() < hard:
        pass
    c0 = time.thread_time()
    while time.thread_time() - c0 < WORK_S and time.monotonic() < hard:
        pass
    lock.release()


def _medium(conn, hog_running):
    _go_realtime(MEDIUM)
    end = time.monotonic() + HOG_S
    hog_running.value = 1
    conn.send("hogging")
    while time.monotonic() < end:
        pass


def _high(lock, conn, wait):
    _go_realtime(HIGH)
    t0 = time.monotonic()
    got = lock.acquire(timeout=HARD_S)
    wait.value = time.monotonic() - t0
    if got:
        lock.release()
    conn.send("got" if got else "timeout")


def _expect(conn, what, timeout=10.0):
    assert conn.poll(timeout), f"no {what!r} from child within {timeout}s"
    msg = conn.recv()
    if msg == "EPERM":
        pytest.skip("sched_setscheduler(SCHED_FIFO) is not permitted here")
    assert msg == what, f"child said {msg!r}, expected {what!r}"


@contextlib.contextmanager
def _exclusive_cpu_test():
    with open("/tmp/shmlocks-tests-pi-boost.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure_high_wait(procs, lock) -> float:
    ctx = mp.get_context("fork")
    hog_running = ctx.Value("i", 0, lock=False)
    wait = ctx.Value("d", -1.0, lock=False)
    old_affinity = os.sched_getaffinity(0)
    children = []
    with _exclusive_cpu_test():
        os.sched_setaffinity(0, {PARENT_CPU})  # children start here, then move themselves
        try:
            r, w = ctx.Pipe(duplex=False)
            low = procs.start(_low, lock, w, hog_running, ctx=ctx)
            children.append(low)
            _expect(r, "held")
            r2, w2 = ctx.Pipe(duplex=False)
            medium = procs.start(_medium, w2, hog_running, ctx=ctx)
            children.append(medium)
            _expect(r2, "hogging")
            r3, w3 = ctx.Pipe(duplex=False)
            high = procs.start(_high, lock, w3, wait, ctx=ctx)
            children.append(high)
            _expect(r3, "got", timeout=HARD_S + 5)
            high.join(5)
            kill(medium)  # its job is done: don't let it burn on
            low.join(HARD_S)
            assert low.exitcode == 0 and high.exitcode == 0
        finally:
            for p in children:
                if p.is_alive():
                    kill(p)
            os.sched_setaffinity(0, old_affinity)
    return wait.value


def test_pi_mutex_boosts_the_holder(procs, new_lock):
    waited = measure_high_wait(procs, new_lock("pi"))
    print(f"\nPIMutex: high-priority waiter waited {waited:.3f}s (low's work: {WORK_S}s)")
    assert 0 < waited < 1.5, f"no priority inheritance: high waited {waited:.3f}s"


def test_robust_mutex_does_not_boost(procs, new_lock):
    """The control: same scenario without PI, so the hog delays high (priority inversion).
    It shows the PI test measures the boost and not something else."""
    waited = measure_high_wait(procs, new_lock("robust"))
    print(f"\nRobustMutex: high-priority waiter waited {waited:.3f}s (hog: {HOG_S}s)")
    assert waited > 2.0, f"high waited only {waited:.3f}s: the hog did not delay the holder"
