"""A parked waiter sleeps until the lock or a life it depends on changes (docs/design.md §5).

It watches one participant: the one it waits behind (the holder, or its predecessor in a
queue). These tests change that participant under it while it sleeps, in the ways that
could leave it watching the wrong one and sleeping through a death: the waiter ahead of
it leaves by timeout, the lock passes to a waiter that then dies, and the participant it
depends on dies together with the waiter the kernel woke for that death. Each death must
reach a live waiter: the next acquire comes back with ``owner_died`` within seconds, never
at the survivors' 20 s timeout.
"""

from __future__ import annotations

import os
import time

import pytest
from support.common import run_python, wait_blocked

import shmlocks

pytestmark = pytest.mark.timeout(90)

BOUND = 5.0  # s from a death to the next acquisition: generous (a loaded 2-CPU machine)


def _child(kind, name, conn, timeout, hold):
    """Open the lock, acquire it (``timeout``), report, then hold it (``hold``) or release
    it; stay alive either way (a waiter that timed out lives on: only death is death).
    The deadlock look is off: its wake-ups (after 1 s, then twice a second) would re-arm a
    waiter that watches the wrong participant, and hide the bug."""
    shmlocks.set_deadlock_timeout(None)
    lk = shmlocks.KINDS[kind].open(name)
    conn.send(("ready", os.getpid()))
    ok = lk.acquire(timeout=timeout)
    died = bool(ok and lk.owner_died)
    conn.send(("acq", os.getpid(), ok, died, time.monotonic()))
    if ok and died:
        lk.mark_consistent()
    if ok and hold is not True:
        time.sleep(hold)
        lk.release()
    time.sleep(3600)


def _start(procs, kind, name, timeout=20.0, hold=True):
    import multiprocessing as mp

    r, w = mp.get_context("fork").Pipe(duplex=False)
    p = procs.start(_child, kind, name, w, timeout, hold)
    w.close()
    assert r.poll(20), "child never opened the lock"
    assert r.recv()[0] == "ready"
    return p, r


def _next_acquirer(pipes, timeout=BOUND):
    """The (pid, owner_died, when) of the first child that reports an acquisition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in pipes:
            if r.poll(0.01):
                tag, pid, ok, died, when = r.recv()
                assert tag == "acq" and ok, "a waiter's 20 s acquire timed out"
                return pid, died, when
    raise AssertionError(f"no waiter acquired within {timeout}s of the death: a lost wake-up")


def _holder(procs, kind, name):
    p, r = _start(procs, kind, name)
    _, pid, ok, _, _ = r.recv()
    assert ok and pid == p.pid
    return p


@pytest.mark.parametrize("kind", ["ticket", "mcs", "clh", "futex"])
def test_a_waiter_whose_predecessor_timed_out_sees_the_holder_die(kind, new_lock, procs):
    """B waits behind A, A behind the holder. A gives up (timeout) and lives on: B now
    depends on the holder, whose death must wake B although B slept watching A."""
    lk = new_lock(kind)
    holder = _holder(procs, kind, lk.name)
    a, ra = _start(procs, kind, lk.name, timeout=1.0)
    wait_blocked(a.pid)
    b, rb = _start(procs, kind, lk.name, timeout=20.0)
    wait_blocked(b.pid)
    assert ra.poll(10), "A never timed out"
    _, _, ok, _, _ = ra.recv()
    assert not ok  # A left the queue and is alive
    time.sleep(0.3)  # B sleeps on, watching whoever it watches now
    t0 = time.monotonic()
    os.kill(holder.pid, 9)
    pid, died, when = _next_acquirer([rb])
    assert (pid, died) == (b.pid, True)
    assert when - t0 < BOUND


@pytest.mark.parametrize("kind", shmlocks.KINDS)
def test_each_new_holder_death_wakes_a_sleeping_waiter(kind, new_lock, procs):
    """Three waiters sleep behind a holder that releases the lock (a hand-off, no death),
    then every new holder dies in turn: each death reaches a waiter that slept through the
    earlier hand-offs (a barging kind's waiters all watched the first holder)."""
    lk = new_lock(kind)
    p0, r0 = _start(procs, kind, lk.name, hold=2.0)
    assert r0.recv()[2]
    waiters = []
    for _ in range(3):
        p, r = _start(procs, kind, lk.name)
        wait_blocked(p.pid)
        waiters.append((p, r))
    pipes = {r: p for p, r in waiters}
    victim, died, _ = _next_acquirer(list(pipes), timeout=20)  # the release
    assert not died
    (r,) = [r for r, p in pipes.items() if p.pid == victim]
    del pipes[r]
    time.sleep(0.2)  # the others sleep on, behind the new holder
    for _ in range(2):
        t0 = time.monotonic()
        os.kill(victim, 9)
        pid, died, when = _next_acquirer(list(pipes))
        assert died, "the lock came back without owner_died after its holder's death"
        assert when - t0 < BOUND
        (r,) = [r for r, p in pipes.items() if p.pid == pid]
        del pipes[r]
        victim = pid
    os.kill(victim, 9)


@pytest.mark.parametrize("kind", shmlocks.KINDS)
def test_the_holder_and_the_first_waiter_dying_together(kind, new_lock, procs):
    """The holder dies and, at once, the waiter that its death woke (or the first in line):
    the wake-up must not die with it. One of the two other waiters gets the lock."""
    lk = new_lock(kind)
    holder = _holder(procs, kind, lk.name)
    waiters = []
    for _ in range(3):
        p, r = _start(procs, kind, lk.name)
        wait_blocked(p.pid)
        waiters.append((p, r))
    time.sleep(0.2)
    t0 = time.monotonic()
    os.kill(holder.pid, 9)
    os.kill(waiters[0][0].pid, 9)
    pid, died, when = _next_acquirer([r for _, r in waiters[1:]], timeout=BOUND)
    assert pid in (waiters[1][0].pid, waiters[2][0].pid)
    assert died
    assert when - t0 < BOUND


def test_the_wait_mode_is_chosen_once_and_the_fallback_can_be_forced():
    """futex_waitv on this kernel (Linux 5.16+); SHMLOCKS_WAIT=sliced forces the fallback
    that a kernel without it gets (CI runs the recovery tests under it too)."""
    code = "import shmlocks._core as c; print(c.WAIT_MODE)"
    out = run_python("import os; os.environ.pop('SHMLOCKS_WAIT', None); " + code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("futex_waitv" if _has_waitv() else "sliced")
    out = run_python("import os; os.environ['SHMLOCKS_WAIT'] = 'sliced'; " + code)
    assert out.stdout.strip() == "sliced", out.stderr


def _has_waitv() -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(449, None, 0, 0, None, 1)  # futex_waitv(NULL, 0, ...): EINVAL if present
    return r == -1 and ctypes.get_errno() == 22
