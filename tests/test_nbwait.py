"""Resumable waits (docs/design.md §5 "Resumable waits"): a waiter that must not block its
thread (an event loop's) runs each kind's wait up to the point where it would sleep, and
gets R_WOULDBLOCK with the sleep's watch set instead, its place kept; it is re-entered after
a wake-up, and gives up by re-entering with deadline 0. Driven here step by step through
the private ``_core._NbWait`` (begin: take the place; poll: re-enter; withdraw), with the
lock held or awaited by other processes, and asleep on the watch set through io_uring
(``_core._Ring``: FUTEX_WAITV, ASYNC_CANCEL) where the kernel has it.

What a user of the asyncio API will depend on, at this layer: a FIFO kind's place is kept
across re-entries (served before a waiter that came later); giving up leaves the lock
usable and passes on a grant that came meanwhile (owner_died included); a dead holder is
seen through the watch set and recovered on re-entry with owner_died; a dead resumable
waiter is recovered as a sleeping one is; a release or a death completes an io_uring wait
on the watch set, and ASYNC_CANCEL cancels it."""

from __future__ import annotations

import ctypes
import errno
import multiprocessing as mp
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from support import FIFO_KINDS, KINDS, Holder, kill, until, wait_blocked, wait_stopped
from support.common import join_thread

import shmlocks
from shmlocks import _core

pytestmark = pytest.mark.timeout(120)

URING = _core.AIO_MODE == "io_uring"
needs_uring = pytest.mark.skipif(not URING, reason="no io_uring FUTEX_WAITV here")


def me():
    return (os.getpid(), threading.get_native_id())


# --------------------------------------------------------------------------- children


def _waiter_main(lock, conn, go, hold_s):
    """A blocking waiter in another process: reports its pid, then whether (and when) it
    got the lock; holds it until `go` (or hold_s), then releases."""
    conn.send(os.getpid())
    ok = lock.acquire(timeout=30)
    conn.send((ok, time.monotonic()))
    if ok:
        go.wait(hold_s)
        lock.release()


class Waiter:
    def __init__(self, procs, lock, hold_s=30.0):
        ctx = mp.get_context("fork")
        self.go = ctx.Event()
        self.r, w = ctx.Pipe(duplex=False)
        self.proc = procs.start(_waiter_main, lock, w, self.go, hold_s, ctx=ctx)
        w.close()
        assert self.r.poll(20), "waiter child did not start"
        self.pid = self.r.recv()

    def got(self, timeout):
        """(ok, when) once it acquired or timed out, None if still waiting."""
        if not self.r.poll(timeout):
            return None
        return self.r.recv()

    def finish(self):
        self.go.set()
        self.proc.join(20)
        assert self.proc.exitcode == 0, self.proc.exitcode


def _nb_child_main(name, kind, conn, stop):
    """A resumable waiter in another process: takes its place, polls once (would block),
    reports, then waits to be killed."""
    lk = shmlocks.KINDS[kind].open(name)
    nb = _core._NbWait(lk)
    conn.send(nb.begin())
    conn.send(nb.poll())
    stop.wait(60)


def waiters(lock):
    return lock._describe()["waiters"]


def poll_until_held(nb, timeout=10.0):
    """Poll, sleeping on the watch set (io_uring) or its deadline, until held."""
    deadline = time.monotonic() + timeout
    ring = _core._Ring() if URING else None
    ud = 0
    try:
        while True:
            r = nb.poll()
            if r is not False:
                return r
            assert time.monotonic() < deadline, f"not held within {timeout} s"
            if ring is None:
                time.sleep(0.002)
                continue
            ud += 1
            ring.waitv(nb.watch, ud)
            left = deadline - time.monotonic()
            u = nb.until
            got = ring.completions(min(left, u) if u is not None else left)
            if not got:
                ring.cancel(ud)
                ring.completions(1)
    finally:
        if ring is not None:
            ring.close()


# --------------------------------------------------------------------------- tests


def test_aio_mode_is_chosen_once_and_can_be_forced():
    assert _core.AIO_MODE in ("io_uring", "thread")
    try:
        _core._Ring().close()
        works = True
    except OSError:
        works = False
    if not works:
        assert _core.AIO_MODE == "thread"
    r = subprocess.run(
        [sys.executable, "-c", "import shmlocks._core as c; print(c.AIO_MODE)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SHMLOCKS_AIO="thread"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "thread"


@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_resumable_waiter_keeps_its_fifo_place(procs, new_lock, kind):
    """Queued behind a holder in another process, then a blocking waiter of a third
    process behind it: at the release the lock is the resumable waiter's (one re-entry
    finds it held), not the later waiter's, which is served only when it lets go."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    assert nb.begin() is False
    for _ in range(3):  # re-entries keep the place
        assert nb.poll() is False
        assert nb.watch and nb.resume_rc == 3  # R_PENDING: queued
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    holder.release()
    assert later.got(0.3) is None, "a waiter that came later got the lock first"
    assert nb.poll() is True
    assert lock.owner == me()
    assert not lock.owner_died
    time.sleep(0.1)
    assert later.got(0) is None
    lock.release()
    ok, _ = later.got(20)
    assert ok
    later.finish()
    assert lock.acquire(timeout=5)
    lock.release()


@pytest.mark.parametrize("kind", KINDS)
def test_withdraw_before_the_release_leaves_the_lock_usable(procs, new_lock, kind):
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    assert nb.begin() is False
    assert nb.poll() is False
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    assert nb.withdraw() is False
    assert not nb.active
    assert waiters(lock) == 1
    holder.release()
    ok, _ = later.got(20)
    assert ok, "the waiter behind a withdrawn one never got the lock"
    later.finish()
    assert lock.acquire(timeout=5)
    lock.release()
    assert not lock.locked() and waiters(lock) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_withdraw_after_a_grant_passes_it_on(procs, new_lock, kind):
    """The lock released to a resumable waiter that then gives up without looking: the
    grant goes on to the next waiter (a FIFO kind's grant was the withdrawn waiter's)."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    assert nb.begin() is False
    assert nb.poll() is False
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    holder.release()
    if lock.fifo:
        assert later.got(0.3) is None
    passed = nb.withdraw()
    if lock.fifo:
        assert passed is True, "the FIFO grant was not the withdrawn waiter's"
    ok, _ = later.got(20)
    assert ok, "the grant was not passed on"
    assert not lock.owner_died
    later.finish()
    assert lock.acquire(timeout=5)
    lock.release()
    assert not lock.locked() and waiters(lock) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_dead_holder_seen_through_the_watch_set(procs, new_lock, kind):
    """The holder's death changes a word of the watch set (its liveness token, or robust's
    mutex word) and the re-entry recovers it: held, with owner_died."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    assert nb.begin() is False
    assert nb.poll() is False
    assert nb.token >= 0, "the sleep would not watch the holder's life"
    assert nb.changed() == []
    holder.kill()
    assert nb.token in nb.changed()
    assert poll_until_held(nb) is True
    assert lock.owner == me()
    assert lock.owner_died
    lock.mark_consistent()
    lock.release()
    assert lock.acquire(timeout=5)
    assert not lock.owner_died
    lock.release()


@pytest.mark.parametrize("kind", KINDS)
def test_dead_resumable_waiter_is_recovered(procs, new_lock, kind):
    """A process killed while its resumable wait holds a place (between two re-entries) is
    recovered as a sleeping waiter is: the next waiter gets the lock at the release."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    child = procs.start(_nb_child_main, lock.name, kind, w, stop, ctx=ctx)
    w.close()
    assert r.poll(20) and r.recv() is False
    assert r.poll(20) and r.recv() is False
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    kill(child)
    holder.release()
    ok, _ = later.got(20)
    assert ok, "the waiter behind a dead resumable waiter never got the lock"
    later.finish()
    assert lock.acquire(timeout=5)
    assert not lock.owner_died
    lock.release()
    lock.region._recover_dead()
    if kind == "pi":
        st = _core._pi_async_state(lock)
        assert st["asyncw"] == 0 and st["awaiting"] == [], st


@needs_uring
@pytest.mark.parametrize("kind", KINDS)
def test_uring_wait_on_the_watch_set_completes_at_the_release(procs, new_lock, kind):
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    ring = _core._Ring()
    try:
        assert nb.begin() is False
        assert nb.poll() is False
        ring.waitv(nb.watch, 1)
        assert ring.completions(0.2) == [], "the wait completed with the lock still held"
        holder.release()
        got = ring.completions(10)
        assert got and got[0][0] == 1 and got[0][1] >= 0, got
        assert poll_until_held(nb) is True
        lock.release()
    finally:
        nb.withdraw()
        ring.close()


@needs_uring
@pytest.mark.parametrize("kind", KINDS)
def test_uring_wait_on_the_watch_set_completes_at_the_holders_death(procs, new_lock, kind):
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    ring = _core._Ring()
    try:
        assert nb.begin() is False
        assert nb.poll() is False
        ring.waitv(nb.watch, 5)
        assert ring.completions(0.2) == []
        t0 = time.monotonic()
        holder.kill()
        got = ring.completions(10)
        assert got == [(5, nb.token)], got
        assert time.monotonic() - t0 < 5
        assert poll_until_held(nb) is True
        assert lock.owner_died
        lock.mark_consistent()
        lock.release()
    finally:
        nb.withdraw()
        ring.close()


@needs_uring
def test_uring_wait_cancelled(procs, new_lock):
    lock = new_lock("mcs")
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    ring = _core._Ring()
    try:
        assert nb.begin() is False
        assert nb.poll() is False
        ring.waitv(nb.watch, 9)
        assert ring.inflight == 1
        ring.cancel(9)
        got = dict(ring.completions(5))
        if len(got) < 2:
            got.update(ring.completions(5))
        assert got[9] == -errno.ECANCELED, got
        assert got[9 | 1 << 63] == 1, got
        assert ring.inflight == 0
        assert nb.withdraw() is False
        holder.release()
        assert lock.acquire(timeout=5)
        lock.release()
    finally:
        ring.close()


@needs_uring
def test_uring_eventfd_signals_a_completion(procs, new_lock):
    lock = new_lock("futex")
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    ring = _core._Ring()
    try:
        efd = ring.fileno()
        assert nb.begin() is False
        assert nb.poll() is False
        ring.waitv(nb.watch, 3)
        assert select.select([efd], [], [], 0.2)[0] == []
        holder.release()
        assert select.select([efd], [], [], 10)[0] == [efd]
        assert ring.completions(0)[0][0] == 3
        assert poll_until_held(nb) is True
        lock.release()
    finally:
        nb.withdraw()
        ring.close()


@needs_uring
def test_uring_word_changed_before_arming_completes_at_once():
    buf = ctypes.c_uint32(5)
    ring = _core._Ring()
    try:
        ring.waitv([(ctypes.addressof(buf), 4)], 1)
        assert ring.completions(5) == [(1, -errno.EAGAIN)]
    finally:
        ring.close()


def test_pi_async_waiters_flag_follows_them(procs, new_lock):
    """pi's resumable waiters sleep on word B's aseq, which a release bumps while
    its asyncw word is set: set while one waits, cleared after the last; ctl.flags stays
    clear (a holder's acquire keeps its inline path)."""
    lock = new_lock("pi")
    holder = Holder(procs, lock)
    a = _core._NbWait(lock)
    assert a.begin() is False and a.poll() is False
    assert _core._pi_async_state(lock)["asyncw"] == 1
    assert lock._raw()["flags"] == 0
    b_box = {}

    def second():
        nbw = _core._NbWait(lock)
        b_box["begin"] = nbw.begin()
        b_box["poll"] = nbw.poll()
        b_box["withdraw"] = nbw.withdraw()

    t = threading.Thread(target=second)
    t.start()
    t.join(20)
    assert b_box == {"begin": False, "poll": False, "withdraw": False}
    st = _core._pi_async_state(lock)
    assert st["asyncw"] == 1 and len(st["awaiting"]) == 1, "one async waiter left, asyncw went"
    aseq = st["aseq"]
    holder.release()
    assert _core._pi_async_state(lock)["aseq"] != aseq, "the release did not bump aseq"
    assert poll_until_held(a) is True
    assert _core._pi_async_state(lock) == {"asyncw": 0, "aseq": aseq + 1, "awaiting": []}
    lock.release()
    assert _core._pi_async_state(lock)["aseq"] == aseq + 1, "no waiter: no bump"


@pytest.mark.parametrize("kind", ["ticket", "mcs"])
def test_resumable_wait_on_an_inherited_place(procs, new_region, kind):
    """A slot whose previous thread abandoned its place (a timed-out wait) and ended: the
    new thread on the slot first waits for that place to be passed (the kind's pre-queue
    phase, re-entered with R_BUSY), then queues and gets the lock."""
    region = new_region(max_participants=4)
    lock = region.create_lock("l", kind)
    holder = Holder(procs, lock)

    def time_out():
        assert lock.acquire(timeout=0.05) is False

    t = threading.Thread(target=time_out)
    t.start()
    join_thread(t)  # its end gives its slot back, the abandoned place still queued
    box = {}
    released = threading.Event()

    def resumable():
        nb = _core._NbWait(lock)
        box["begin"] = nb.begin()
        box["polls"] = [nb.poll(), nb.poll()]
        box["rc"] = nb.resume_rc
        box["slot_busy"] = waiters(lock)
        released.wait(20)
        box["held"] = poll_until_held(nb)
        box["owner_died"] = lock.owner_died
        lock.release()

    t = threading.Thread(target=resumable)
    t.start()
    until(lambda: "slot_busy" in box, 20, "the resumable waiter polled")
    assert box["begin"] is False and box["polls"] == [False, False]
    assert box["rc"] == 4, "not the inherited place's phase (R_BUSY): the slot was not reused"
    holder.release()
    released.set()
    join_thread(t)
    assert box["held"] is True and box["owner_died"] is False
    assert lock.acquire(timeout=5)
    lock.release()
    assert waiters(lock) == 0


def test_nbwait_is_driven_by_its_thread(new_lock):
    lock = new_lock("futex")
    nb = _core._NbWait(lock)
    box = {}

    def other():
        try:
            nb.poll()
        except RuntimeError as e:
            box["err"] = str(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert "thread that made it" in box["err"]
    assert nb.begin() is True  # free: held at once
    lock.release()


def test_blocking_acquire_unchanged_beside_resumable_waiters(procs, new_lock, kind):
    """Blocking and resumable waiters of one lock: every one is served, counts exact."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    nb = _core._NbWait(lock)
    assert nb.begin() is False and nb.poll() is False
    later = Waiter(procs, lock, hold_s=0.01)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    wait_blocked(later.pid)
    holder.release()
    assert poll_until_held(nb) is True
    lock.release()
    ok, _ = later.got(20)
    assert ok
    later.finish()
    st = lock.stats()
    assert st["acquisitions"] == 3, st
    assert not lock.locked()


def test_kill_while_the_resumable_wait_sleeps_in_the_kernel(procs, new_lock):
    """SIGKILL of a process whose io_uring wait is armed on the watch set: nothing is left
    (the kernel drops the wait), the lock goes to the next waiter."""
    if not URING:
        pytest.skip("no io_uring FUTEX_WAITV here")
    lock = new_lock("ticket")
    holder = Holder(procs, lock)
    code = (
        "import sys, shmlocks, shmlocks._core as c\n"
        "lk = shmlocks.TicketLock.open(sys.argv[1])\n"
        "nb = c._NbWait(lk); assert nb.begin() is False; assert nb.poll() is False\n"
        "r = c._Ring(); r.waitv(nb.watch, 1)\n"
        "print('armed', flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    import subprocess
    import sys

    p = procs.popen([sys.executable, "-c", code, lock.name], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "armed"
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 2, 20, "the later waiter queued")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    holder.release()
    ok, _ = later.got(20)
    assert ok
    later.finish()


_PI_ASYNC_CHILD = """
import sys, shmlocks, shmlocks._core as c
lk = shmlocks.PIMutex.open(sys.argv[1])
nb = c._NbWait(lk)
assert nb.begin() is False
assert nb.poll() is False
print("waiting", flush=True)
nb.withdraw()
print("left", flush=True)
"""


@pytest.mark.parametrize("point", ["pi.async.marked", "pi.async.unmarked"])
def test_pi_async_waiter_killed_at_each_step(procs, new_lock, point):
    """A pi resumable waiter SIGKILLed between its announcement's two stores, or between
    its leaving's: once recovered, no mark and no asyncw are left, and the lock
    serves blocking and resumable waiters as before."""
    lock = new_lock("pi")
    holder = Holder(procs, lock)
    env = dict(os.environ, SHMLOCKS_CRASHPOINT=point)
    p = procs.popen(
        [sys.executable, "-c", _PI_ASYNC_CHILD, lock.name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, (p.returncode, out, err)
    assert ("waiting" in out) == (point == "pi.async.unmarked"), out
    later = Waiter(procs, lock)
    until(lambda: waiters(lock) == 1, 20, "the blocking waiter queued")
    lock.region._recover_dead()
    st = _core._pi_async_state(lock)
    assert st["asyncw"] == 0 and st["awaiting"] == [], st
    nb = _core._NbWait(lock)
    assert nb.begin() is False and nb.poll() is False
    assert _core._pi_async_state(lock)["asyncw"] == 1
    holder.release()
    ok, _ = later.got(20)
    assert ok
    later.finish()
    assert poll_until_held(nb) is True
    assert not lock.owner_died
    lock.release()
    assert _core._pi_async_state(lock)["asyncw"] == 0


_TAKER = """
import sys, shmlocks
lk = shmlocks.TicketLock.open(sys.argv[1])
print("go", flush=True)
ok = lk.acquire(timeout=30)
print(ok, flush=True)
if ok:
    lk.release()
"""


def test_recovery_inside_a_resumable_wait_is_cut_short(procs, new_lock):
    """A dependency's recovery that must wait (a dead ticket taker, recovered only once the
    live takers beside it published theirs: one of them is stopped mid-step) is cut at the
    resumable wait's short recovery deadline and left pending: a re-entry returns in
    milliseconds (a blocking waiter would wait up to 5 s there), and once the stalled
    taker goes on, every waiter is served in order."""
    lock = new_lock("ticket")
    holder = Holder(procs, lock)  # ticket 0
    assert lock.acquire(blocking=False) is False  # our slot, before the dead take theirs
    env = dict(os.environ, SHMLOCKS_CRASHPOINT="ticket.acquire.took")
    stop = dict(env, SHMLOCKS_CRASHPOINT_ACTION="stop")
    stalled = procs.popen(
        [sys.executable, "-c", _TAKER, lock.name], env=stop, stdout=subprocess.PIPE, text=True
    )
    assert stalled.stdout.readline().strip() == "go"
    wait_stopped(stalled.pid)  # took ticket 1, stopped before publishing it
    dead = procs.popen([sys.executable, "-c", _TAKER, lock.name], env=env, text=True)
    assert dead.wait(30) == -signal.SIGKILL  # took ticket 2, never published it
    nb = _core._NbWait(lock)
    assert nb.begin() is False  # ticket 3
    t0 = time.monotonic()
    assert nb.poll() is False
    took = time.monotonic() - t0
    assert took < 1.0, f"a re-entry held the loop thread {took:.3f} s"
    assert nb.until is not None and nb.until <= 0.01  # one slice, then look again
    t0 = time.monotonic()
    assert nb.poll() is False
    assert time.monotonic() - t0 < 1.0
    os.kill(stalled.pid, signal.SIGCONT)
    holder.release()
    assert stalled.stdout.readline().strip() == "True"
    assert stalled.wait(30) == 0
    assert poll_until_held(nb) is True
    assert not lock.owner_died
    lock.release()
    assert lock.acquire(timeout=5)
    lock.release()


_WOKEN_THEN_GONE = """
import asyncio, sys, shmlocks
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])

async def main():
    t = asyncio.create_task(lock.acquire_async(timeout=30))
    for _ in range(5):
        await asyncio.sleep(0.01)          # its place taken, its sleep armed
    print("armed", flush=True)
    sys.stdin.readline()                   # (the loop stops here: nothing of it runs)
    t.cancel()                             # cancelled before the release's wake-up comes
    print("cancelled", flush=True)
    sys.stdin.readline()                   # released meanwhile: the wake-up came, unseen
    try:
        await t                            # the cancellation runs first: it withdraws
    except asyncio.CancelledError:
        pass
    print("left", flush=True)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["io_uring", "thread"])
@pytest.mark.parametrize(("kind", "n_async"), [("robust", 1), ("futex", 2)])
def test_woken_async_waiter_that_leaves_wakes_a_sleeper(procs, new_lock, kind, n_async, mode):
    """An unlock of a barging kind wakes a fixed number of sleepers (robust 1, futex 2);
    async waiters that slept ahead of a thread take those wake-ups, then are cancelled
    before their loop sees them, while the freed lock was taken by trylock (which announces
    nothing): the thread asleep behind them must still be woken, and take the lock at the
    next release, not at its timeout."""
    if mode == "io_uring" and not URING:
        pytest.skip("no io_uring FUTEX_WAITV here")
    lock = new_lock(kind)
    old = shmlocks.get_deadlock_timeout()
    shmlocks.set_deadlock_timeout(None)  # (no deadlock looks: they would wake the thread)
    try:
        _woken_then_gone(procs, lock, kind, n_async, mode)
    finally:
        shmlocks.set_deadlock_timeout(old)


def _woken_then_gone(procs, lock, kind, n_async, mode):
    env = dict(os.environ)
    env.pop("SHMLOCKS_AIO", None)
    if mode == "thread":
        env["SHMLOCKS_AIO"] = "thread"
    assert lock.acquire(timeout=5)
    ws = []
    for _ in range(n_async):
        p = procs.popen(
            [sys.executable, "-c", _WOKEN_THEN_GONE, kind, lock.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert p.stdout.readline().strip() == "armed"
        if mode == "thread":  # (its waiter thread asleep in the kernel before the next)
            until(lambda p=p: _helper_sleeps(p.pid), 10, "the waiter thread sleeps")
        ws.append(p)
    got = []

    def sleeper():
        t0 = time.monotonic()
        ok = lock.acquire(timeout=8)
        got.append((ok, time.monotonic() - t0))
        if ok:
            lock.release()

    t = threading.Thread(target=sleeper)
    t.start()
    path = f"/proc/self/task/{_native_id(t)}/wchan"
    until(lambda: "futex" in open(path).read(), 10, "the thread sleeps behind the tasks")
    time.sleep(0.05)
    for p in ws:
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "cancelled"
    lock.release()  # wakes the async waiters ahead of the thread (their loops are stopped)
    assert lock.acquire(blocking=False)  # a trylock: the sleepers' announcement is gone
    time.sleep(0.1)
    for p in ws:
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "left"
        assert p.wait(10) == 0
    time.sleep(0.1)
    t0 = time.monotonic()
    lock.release()
    t.join(15)
    assert got and got[0][0], got
    assert time.monotonic() - t0 < 1.0, f"the sleeping thread was not woken: {got}"
    assert not lock.locked()


def _helper_sleeps(pid: int) -> bool:
    """Does a thread of process pid other than its main one sleep on a futex?"""
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) != pid:
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if "futex" in f.read():
                        return True
            except OSError:
                pass
    return False


def _native_id(t, timeout=10.0):
    deadline = time.monotonic() + timeout
    while t.native_id is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return t.native_id
