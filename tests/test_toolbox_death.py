"""The toolbox's survival: every death case of README "The synchronization toolbox", with
real processes and real SIGKILLs, exact counts, bounded in time (docs/design.md §12)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest
from support.common import (
    join_thread,
    kill,
    run_python,
    shm_exists,
    shm_remove,
    uniq,
    until,
)

import shmlocks

pytestmark = pytest.mark.timeout(90)


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------ semaphore


def _hold_with(sem, ready):
    with sem:
        ready.set()
        time.sleep(60)


def _hold_bare(sem, ready):
    sem.acquire()
    ready.set()
    time.sleep(60)


def _hold_with_then_die(sem):
    with sem:
        _die()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_with_units_of_killed_holders_come_back(procs, method):
    """Three holders take a unit each with `with` and are SIGKILLed inside the block: all
    three units come back, exactly (value 3 again, 'recovered' 3)."""
    sem = shmlocks.BoundedSemaphore(3, uniq("sem"))
    ready = shmlocks.Event(uniq("ev"))
    try:
        ps = []
        for _ in range(3):
            ready.clear()
            ps.append(procs.start(_hold_with, sem, ready, method=method))
            assert ready.wait(30)
        assert sem.value == 0
        assert not sem.acquire(False) or pytest.fail("a unit while all three are held")
        for p in ps:
            kill(p)
        # a call that would fail for want of a unit recovers the dead holders first
        got = [sem.acquire(timeout=5) for _ in range(3)]
        assert got == [True, True, True]
        assert sem.acquire(False) is False  # exactly three, no more
        assert sem.stats()["recovered"] == 3
        sem.release(3)
        assert sem.value == 3
    finally:
        sem.close()
        ready.close()


def test_waiter_wakes_at_once_when_with_holder_dies(procs):
    """A waiter blocked on 0 units sleeps on the holder's liveness token: the holder's
    SIGKILL hands it the unit within well under a second (no polling interval)."""
    sem = shmlocks.Semaphore(1, uniq("sem"))
    ready = shmlocks.Event(uniq("ev"))
    try:
        p = procs.start(_hold_with, sem, ready)
        assert ready.wait(20)
        result = {}

        def waiter():
            t0 = time.monotonic()
            result["got"] = sem.acquire(timeout=30)
            result["t"] = time.monotonic()
            result["waited"] = result["t"] - t0

        t = threading.Thread(target=waiter)
        t.start()
        until(lambda: sem._describe()["waiters"] == 1, what="the waiter to sleep")
        t_kill = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        t.join(30)
        p.join(10)
        assert result["got"] is True
        assert result["t"] - t_kill < 1.0, result
        assert sem.stats() == {"value": 0, "held_with": 0, "recovered": 1}
    finally:
        sem.close()
        ready.close()


def test_bare_acquire_stays_ownerless(procs):
    """A unit taken by bare acquire() is not the taker's: a process that dies holding it
    does not give it back (threading's meaning), and another process may release it."""
    sem = shmlocks.Semaphore(1, uniq("sem"))
    ready = shmlocks.Event(uniq("ev"))
    try:
        p = procs.start(_hold_bare, sem, ready)
        assert ready.wait(20)
        kill(p)
        assert sem.acquire(timeout=0.3) is False  # not given back
        assert sem.stats()["recovered"] == 0
        sem.release()  # by another process than the taker: allowed
        assert sem.acquire(timeout=1)
    finally:
        sem.close()
        ready.close()


def test_sigkill_inside_with_in_region(procs, new_region):
    """The same in a Region, where a lock's recovery and the semaphore's are one: the
    holder dies inside `with sem:` while holding an mcs lock of the region too."""
    r = new_region(max_locks=4)
    sem = r.create_semaphore("slots", 2, bounded=True)
    lock = r.create_lock("m", "mcs")

    def child(sem, lock):
        with lock, sem:
            _die()

    p = procs.start(child, sem, lock)
    p.join(20)
    assert p.exitcode == -signal.SIGKILL
    assert lock.acquire(timeout=5)  # recovers the participant: the lock and the unit
    assert lock.owner_died
    lock.mark_consistent()
    lock.release()
    assert sem.value == 2
    assert sem.acquire(False) and sem.acquire(False) and not sem.acquire(False)


FORK_IN_WITH = textwrap.dedent(
    """
    import os, sys, shmlocks
    sem = shmlocks.BoundedSemaphore(2, name=sys.argv[1])
    pid = -1
    try:
        with sem:  # the parent's unit
            pid = os.fork()
            if pid == 0:
                with sem:  # the child's own unit, inside the block it inherited
                    pass
            else:
                _, st = os.waitpid(pid, 0)
                inside = sem.value  # the child has left both blocks and ended
        left = "ok"
    except BaseException as e:
        if pid == 0:
            os._exit(3)
        left = type(e).__name__
    if pid == 0:
        os._exit(0)  # (a plain fork child: it leaves the blocks, then ends)
    value = sem.value
    sem.close()
    print(os.waitstatus_to_exitcode(st), inside, left, value)
    """
)


def test_fork_child_leaving_its_parents_with_block_releases_nothing():
    """A plain os.fork() child inside `with sem:` that leaves the block: the unit is its
    parent's (its record holds it, and the parent gives it back at its own exit), so the
    child's exit releases nothing, while the child's own `with` inside it comes and goes
    as usual. It used to release a unit from nothing: a third holder of a BoundedSemaphore
    of 2 while the parent was still inside, and the parent's exit then ValueError."""
    name = uniq("sem")
    try:
        proc = run_python(FORK_IN_WITH, name, timeout=60)
        assert proc.returncode == 0, proc.stderr
        # child ended 0; 1 unit free while the parent is inside; its exit fine; 2 after
        assert proc.stdout.split() == ["0", "1", "ok", "2"], proc.stdout
        assert not shm_exists(name)
    finally:
        shm_remove(name)


def test_with_block_left_on_another_thread_makes_no_unit():
    """A `with sem:` block entered on one thread and left on another (a generator resumed
    elsewhere): the unit is the entering thread's, so the leaving thread, which holds
    none, releases nothing; it comes back once, when its taker ends. It used to be
    released by the exit and again by the taker's end: two units of a Semaphore(1)."""
    sem = shmlocks.Semaphore(1, uniq("sem"))
    try:
        assert sem.acquire(False)  # this thread registered first (its slot)
        sem.release()

        def block():
            with sem:
                yield

        g = block()
        t = threading.Thread(target=next, args=(g,))
        t.start()
        join_thread(t)  # it entered, and ended inside the block
        with pytest.raises(StopIteration):
            next(g)  # left on this thread
        assert sem.value == 0
        assert sem.acquire(False)  # the ended taker's unit, recovered
        assert not sem.acquire(False)  # once: one unit, as made
        assert sem.stats()["recovered"] == 1
        sem.release()
        assert sem.value == 1
    finally:
        sem.unlink()  # (a thread that ended holding a unit keeps the mapping: §3)
        sem.close()


# ------------------------------------------------------------------------- barrier


def _barrier_party(bar, rounds, out):
    try:
        for _ in range(rounds):
            bar.wait()
        out.put("passed")
    except threading.BrokenBarrierError:
        out.put("broken")


def _barrier_wait_then_die(bar, rounds):
    for _ in range(rounds):
        bar.wait()
    _die()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_party_dies_while_others_wait(procs, method):
    """Three parties; one dies inside wait() (it waits, then is SIGKILLed): the two
    others, waiting too, get BrokenBarrierError at once."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(4, name=uniq("bar"))
    out = mp.get_context(method).Queue()
    try:
        live = [procs.start(_barrier_party, bar, 1, out, method=method) for _ in range(2)]
        victim = procs.start(_barrier_party, bar, 1, out, method=method)
        until(lambda: bar.n_waiting == 3, 30, "three parties waiting")
        t0 = time.monotonic()
        kill(victim)
        results = [out.get(timeout=10) for _ in live]
        assert time.monotonic() - t0 < 2.0
        assert results == ["broken", "broken"]
        assert bar.broken
    finally:
        bar.close()


def test_party_dies_before_arriving_once_others_wait(procs):
    """A party that has passed the barrier once is one of its parties: killed before it
    arrives again, while the others wait for it, it breaks the barrier for them at once."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(3, name=uniq("bar"))
    out = mp.get_context("fork").Queue()
    try:
        victim_go = shmlocks.Event(uniq("ev"))

        def victim(bar, go):
            bar.wait()  # round 1: now a party
            go.wait(30)
            time.sleep(60)  # never arrives at round 2

        v = procs.start(victim, bar, victim_go)
        live = [procs.start(_barrier_party, bar, 2, out) for _ in range(2)]
        until(lambda: bar.n_waiting == 2 and bar._raw()["cycle"] == 1, 30, "round 2 waits")
        t0 = time.monotonic()
        kill(v)
        results = [out.get(timeout=10) for _ in live]
        assert time.monotonic() - t0 < 2.0
        assert results == ["broken", "broken"]
        bar.reset()  # usable again: a replacement party completes a round
        victim_go.close()
    finally:
        bar.close()


_VICTIM = [False]  # True in the one child whose action hangs (set after its fork)


def _barrier_action():
    if _VICTIM[0]:
        _ACTION_IN[0].set()
        time.sleep(60)  # killed in here


_ACTION_IN: list = [None]


@pytest.mark.parametrize("timeout", [20, None])
def test_fresh_party_killed_in_the_action_breaks_it_at_once(procs, timeout):
    """A party no one knew of before (a fork child not given the barrier in its
    arguments, so not enrolled) arrives last in its first round, runs the action and is
    SIGKILLed in it: the two waiters get BrokenBarrierError at once, not at their own
    timeout (nor never, with timeout None)."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(3, _barrier_action, name=uniq("bar"))
    _ACTION_IN[0] = shmlocks.Event(uniq("ev"))
    out = mp.get_context("fork").Queue()

    def victim():  # reaches `bar` through a closure: a party from its first wait only
        _VICTIM[0] = True
        bar.wait(timeout)

    try:
        live = [procs.start(_barrier_party_t, bar, timeout, out) for _ in range(2)]
        until(lambda: bar.n_waiting == 2, 30, "two parties waiting")
        v = procs.start(victim)
        assert _ACTION_IN[0].wait(30)
        time.sleep(0.2)  # the waiters asleep again, the victim in its action
        t0 = time.monotonic()
        kill(v)
        results = [out.get(timeout=10) for _ in live]
        assert time.monotonic() - t0 < 2.0
        assert results == ["broken", "broken"]
        assert bar.broken
    finally:
        _ACTION_IN[0].close()
        bar.close()


def _barrier_party_t(bar, timeout, out):
    try:
        bar.wait(timeout)
        out.put("passed")
    except threading.BrokenBarrierError:
        out.put("broken")


def _barrier_never_arrives(bar, ready):
    ready.set()
    time.sleep(60)  # its setup: killed before its first wait()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_first_round_party_dies_before_arriving(procs, method):
    """A process given the barrier is one of its parties before it ever waits: killed in
    its setup, while the other two wait in the very first round, it breaks the barrier
    for them at once (the creator, alive and not waiting, breaks nothing)."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(3, name=uniq("bar"))
    ready = shmlocks.Event(uniq("ev"))
    out = mp.get_context(method).Queue()
    try:
        victim = procs.start(_barrier_never_arrives, bar, ready, method=method)
        assert ready.wait(30)
        live = [procs.start(_barrier_party, bar, 1, out, method=method) for _ in range(2)]
        until(lambda: bar.n_waiting == 2, 30, "two parties waiting")
        time.sleep(0.2)
        assert not bar.broken
        t0 = time.monotonic()
        kill(victim)
        results = [out.get(timeout=10) for _ in live]
        assert time.monotonic() - t0 < 2.0
        assert results == ["broken", "broken"]
        assert bar.broken
        ready.close()
    finally:
        bar.close()


def test_party_that_dies_while_nobody_waits_breaks_the_next_wait(procs):
    """A party killed between rounds, while nobody waits: the next wait() is
    BrokenBarrierError at once rather than a hang; reset() and a replacement go on."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(2, name=uniq("bar"))
    out = mp.get_context("fork").Queue()
    try:
        victim = procs.start(_barrier_wait_then_die, bar, 1)
        assert bar.wait(20) in (0, 1)  # round 1 with the victim: now it is a party
        victim.join(20)
        assert victim.exitcode == -signal.SIGKILL
        t0 = time.monotonic()
        with pytest.raises(threading.BrokenBarrierError):
            bar.wait(20)
        assert time.monotonic() - t0 < 2.0
        bar.reset()
        procs.start(_barrier_party, bar, 1, out)
        bar.wait(20)
        assert out.get(timeout=20) == "passed"
        assert not bar.broken
    finally:
        bar.close()


def _barrier_wait_then_exit(bar, rounds):
    for _ in range(rounds):
        bar.wait(20)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_party_that_ends_normally_breaks_nothing(procs, method):
    """A party whose process ends normally after its rounds leaves the barrier: a new
    process takes its place and the rounds go on, never broken."""
    import multiprocessing as mp

    bar = shmlocks.Barrier(2, name=uniq("bar"))
    out = mp.get_context(method).Queue()
    try:
        first = procs.start(_barrier_wait_then_exit, bar, 2, method=method)
        bar.wait(20)
        bar.wait(20)
        first.join(20)
        assert first.exitcode == 0
        second = procs.start(_barrier_party, bar, 3, out, method=method)
        for _ in range(3):
            bar.wait(20)
        assert out.get(timeout=20) == "passed"
        second.join(20)
        assert not bar.broken
    finally:
        bar.close()


FORK_PARTY = textwrap.dedent(
    """
    import os, signal, sys, threading, time, shmlocks
    end, name = sys.argv[1:3]
    bar = shmlocks.Barrier(2, name=name)

    def child(how):  # a plain os.fork child: the barrier is inherited, not given
        pid = os.fork()
        if pid == 0:
            try:
                bar.wait(10)
                code = 0
            except BaseException:
                code = 3
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "close":
                bar.close()
            if how == "sys.exit":
                sys.exit(code)
            os._exit(code)
        return pid

    a = child(end)
    bar.wait(10)  # round 1: the parent and child A, which then ends as `end` says
    _, st = os.waitpid(a, 0)
    b = child("close")
    t0 = time.monotonic()
    try:
        bar.wait(10)  # round 2: the parent and child B
        r = "passed"
    except threading.BrokenBarrierError:
        r = "broken"
    took = time.monotonic() - t0
    os.waitpid(b, 0)
    bar.close()
    print(os.waitstatus_to_exitcode(st), r, f"{took:.3f}")
    """
)


@pytest.mark.parametrize(
    "end, code, result",
    [
        ("close", 0, "passed"),  # close() before os._exit(): it left
        ("sys.exit", 0, "passed"),  # an end that runs the exit handlers: it left
        ("_exit", 0, "broken"),  # os._exit() without close(): its end is a death
        ("kill", -signal.SIGKILL, "broken"),  # a SIGKILL between rounds: a death
    ],
)
def test_fork_child_party_leaves_by_close_or_exit_handlers(end, code, result):
    """The rule of docs/design.md §12 (README "The synchronization toolbox"): a plain
    os.fork child that waited on a barrier is one of its parties from its first wait; it
    leaves alive only by close() or an end that runs the exit handlers (sys.exit, a
    return). os._exit() runs nothing, and nothing tells it from a SIGKILL: its end breaks
    the next round at once, as a killed party's does (which no party may hang on)."""
    name = uniq("bar")
    try:
        proc = run_python(FORK_PARTY, end, name, timeout=60)
        assert proc.returncode == 0, proc.stderr
        got_code, got, took = proc.stdout.split()
        assert (int(got_code), got) == (code, result), proc.stdout
        assert float(took) < 2.0  # broken at once, never at the wait's timeout
        assert not shm_exists(name)
    finally:
        shm_remove(name)


# ----------------------------------------------------------------------- condition


def _cond_waiter(cond, out, tag, timeout):
    with cond:
        got = cond.wait(timeout)
    out.put((tag, got))


def _waiting(cond, n):
    return cond._describe()["waiters"] == n


def test_notified_waiter_killed_passes_the_notification_on(procs):
    """notify(1) picks the oldest waiter; it is SIGKILLed before it has the lock back.
    The notification goes to the next oldest live waiter: exactly one returns True."""
    import multiprocessing as mp

    lock = shmlocks.FutexMutex.create(uniq("cvlock"))
    cond = shmlocks.Condition(lock, uniq("cv"))
    out = mp.get_context("fork").Queue()
    try:
        a = procs.start(_cond_waiter, cond, out, "a", 30)
        until(lambda: _waiting(cond, 1), what="a waits")
        procs.start(_cond_waiter, cond, out, "b", 30)
        until(lambda: _waiting(cond, 2), what="b waits")
        procs.start(_cond_waiter, cond, out, "c", 30)
        until(lambda: _waiting(cond, 3), what="c waits")
        with cond:
            cond.notify(1)  # -> a (oldest); a cannot take the lock back while we hold it
            kill(a)
        assert out.get(timeout=5) == ("b", True)
        time.sleep(0.3)
        assert out.empty()  # exactly one: c still waits
        with cond:
            cond.notify_all()
        assert out.get(timeout=5) == ("c", True)
    finally:
        cond.close()
        lock.close()


def test_dead_waiter_never_counts_for_notify(procs):
    """A waiter killed while it waits (not notified) is never picked: notify(2) reaches two
    live waiters."""
    import multiprocessing as mp

    lock = shmlocks.RLock("mcs", uniq("cvlock"))
    cond = shmlocks.Condition(lock, uniq("cv"))
    out = mp.get_context("fork").Queue()
    try:
        dead = procs.start(_cond_waiter, cond, out, "dead", 30)
        until(lambda: _waiting(cond, 1), what="dead waits")
        for i in range(3):
            procs.start(_cond_waiter, cond, out, f"w{i}", 30)
        until(lambda: _waiting(cond, 4), what="all wait")
        kill(dead)
        with cond:
            cond.notify(2)
        got = sorted([out.get(timeout=5), out.get(timeout=5)])
        assert all(g[1] is True for g in got)
        time.sleep(0.3)
        assert out.empty()
        with cond:
            cond.notify_all()
        assert out.get(timeout=5)[1] is True
    finally:
        cond.close()
        lock.close()


# -------------------------------------------------------------------------- rlock


def _rlock_deep_then_die(rl, depth):
    for _ in range(depth):
        rl.acquire()
    _die()


@pytest.mark.parametrize("kind", shmlocks.KINDS)
def test_rlock_owner_dies_at_depth(procs, kind):
    """An RLock's owner SIGKILLed at depth 3: the next owner gets it at once with
    owner_died and a count of 1; released without mark_consistent() it is not
    recoverable, as a lock."""
    rl = shmlocks.RLock(kind, uniq("rl"))
    try:
        p = procs.start(_rlock_deep_then_die, rl, 3)
        p.join(20)
        assert p.exitcode == -signal.SIGKILL
        assert rl.acquire(timeout=5)
        assert rl.owner_died and rl._recursion_count() == 1
        assert rl.acquire()  # reentrant after recovery too
        rl.release()
        rl.mark_consistent()
        assert not rl.owner_died
        rl.release()
        assert not rl.locked()
    finally:
        rl.close()


# -------------------------------------------------------------------------- event


def test_event_waiters_survive_a_killed_waiter(procs):
    """An Event has no owner: a waiter killed while it waits changes nothing, set() still
    wakes every other waiter."""
    import multiprocessing as mp

    ev = shmlocks.Event(uniq("ev"))
    out = mp.get_context("fork").Queue()

    def w(ev, out):
        out.put(ev.wait(30))

    try:
        ps = [procs.start(w, ev, out) for _ in range(3)]
        until(lambda: ev._raw()["parked"] == 3, what="three sleep")
        kill(ps[0])
        ev.set()
        assert [out.get(timeout=5), out.get(timeout=5)] == [True, True]
    finally:
        ev.close()


@pytest.mark.slow
def test_torture_a_few_seconds():
    """bench/toolbox_torture.py, briefly: random SIGKILLs of semaphore holders, condition
    consumers and barrier parties; never more semaphore holders than units, exact unit
    counts, every job taken, every kill breaking the barrier for the survivors in time."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import toolbox_torture

    assert toolbox_torture.main(["--seconds", "3"]) == 0
