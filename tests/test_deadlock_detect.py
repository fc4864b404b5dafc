"""DeadlockError out of a blocked acquire: of every wait-for cycle exactly one member (the
last to begin waiting) gives up within the deadlock timeout (+0.5 s), keeps its locks, and
the others get theirs once it releases. Every kind; cycles of 2 and 3; threads of one
process and processes; one region and several. No cycle, no error."""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import threading
import time

import pytest
from support import KINDS

import shmlocks

SLACK_S = 2.0  # scheduling slack on a loaded 2-CPU box, on top of timeout + 0.5 s


def _member(i, first, second, ready, go, out, delay, dl_timeout):
    """Hold `first`, then (after `delay`) wait for `second`; report how it ended."""
    shmlocks.set_deadlock_timeout(dl_timeout)
    first.acquire()
    ready.set()
    go.wait(30)
    time.sleep(delay)
    t0 = time.monotonic()
    try:
        got = second.acquire(timeout=15)
    except shmlocks.DeadlockError as e:
        out.put((i, "deadlock", time.monotonic() - t0, str(e), first.locked()))
        time.sleep(0.3)  # the others are still blocked: we keep `first` a little
        first.release()
        return
    out.put((i, "got" if got else "timeout", time.monotonic() - t0, "", True))
    if got:
        second.release()
    first.release()


def _run_cycle(locks, *, threads, delays=None, dl_timeout=1.0, close=True):
    """Member i holds locks[i] and waits for locks[i+1] (the last for locks[0] if close).
    Returns {i: (outcome, seconds waited, message, still held its first lock)}."""
    n = len(locks)
    delays = delays or [0.0] * n
    if threads:
        ev, out, mk = threading.Event, queue.Queue(), threading.Thread
    else:
        ctx = mp.get_context("fork")
        ev, out, mk = ctx.Event, ctx.Queue(), ctx.Process
    go = ev()
    readies = [ev() for _ in range(n)]
    workers = []
    saved = shmlocks.get_deadlock_timeout()
    for i in range(n):
        second = locks[(i + 1) % n] if (close or i + 1 < n) else _Never()
        w = mk(
            target=_member,
            args=(i, locks[i], second, readies[i], go, out, delays[i], dl_timeout),
            daemon=True,
        )
        w.start()
        workers.append(w)
    try:
        for r in readies:
            assert r.wait(20), "a member never took its first lock"
        go.set()
        res = {}
        for _ in range(n):
            i, what, took, msg, held = out.get(timeout=40)
            res[i] = (what, took, msg, held)
        for w in workers:
            w.join(20)
            assert not w.is_alive()
        return res
    finally:
        shmlocks.set_deadlock_timeout(saved)  # threads set it for this process
        for w in workers:
            if isinstance(w, mp.process.BaseProcess) and w.is_alive():
                w.kill()
                w.join(10)


class _Never:
    """A 'second lock' that is never contended: the last member of an open chain."""

    def acquire(self, timeout=-1):
        time.sleep(1.8)
        return True

    def release(self):
        pass


def _one_victim(res, dl_timeout=1.0):
    victims = [i for i, r in res.items() if r[0] == "deadlock"]
    assert len(victims) == 1, res
    v = victims[0]
    assert res[v][1] < dl_timeout + 0.5 + SLACK_S, res[v]
    assert res[v][3], "the victim keeps the locks it holds"
    assert all(r[0] == "got" for i, r in res.items() if i != v), res
    return v


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_ab_ba_between_processes_one_victim(kind, new_lock):
    a, b = new_lock(kind), new_lock(kind)
    res = _run_cycle([a, b], threads=False, delays=[0.0, 0.3])
    v = _one_victim(res)
    assert v == 1, "the last to begin waiting gives up"
    msg = res[v][2]
    assert "cycle of 2 threads" in msg and a.name in msg and b.name in msg


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_ab_ba_between_threads_of_one_process(kind, new_region):
    region = new_region(max_locks=2)
    a, b = region.create_lock("a", kind), region.create_lock("b", kind)
    res = _run_cycle([a, b], threads=True, delays=[0.3, 0.0])
    assert _one_victim(res) == 0
    assert f"{region.name}/a" in res[0][2] and f"{region.name}/b" in res[0][2]


@pytest.mark.timeout(120)
def test_three_cycle_across_regions_and_kinds(new_lock, new_region):
    region = new_region(max_locks=2)
    locks = [region.create_lock("x", "mcs"), new_lock("robust"), region.create_lock("y", "pi")]
    res = _run_cycle(locks, threads=False, delays=[0.0, 0.4, 0.2])
    assert _one_victim(res) == 1
    assert "cycle of 3 threads" in res[1][2]


@pytest.mark.timeout(120)
def test_three_cycle_of_threads_mixed_kinds(new_lock):
    locks = [new_lock("ticket"), new_lock("clh"), new_lock("futex")]
    res = _run_cycle(locks, threads=True, delays=[0.3, 0.0, 0.15], dl_timeout=0.5)
    assert _one_victim(res, 0.5) == 0


@pytest.mark.timeout(120)
def test_a_long_wait_behind_a_live_holder_is_not_a_deadlock(new_lock):
    """Member 1 holds b for 1.8 s waiting for nothing; member 0 waits for b, looked for a
    cycle at 0.2 s and every 0.5 s after, and must simply get it."""
    a, b = new_lock("futex"), new_lock("mcs")
    res = _run_cycle([a, b], threads=False, close=False, dl_timeout=0.2)
    assert [r[0] for r in res.values()] == ["got", "got"], res


@pytest.mark.timeout(120)
def test_detection_off_in_every_member_means_no_error(new_lock):
    a, b = new_lock("ticket"), new_lock("ticket")
    res = _run_cycle_timed([a, b], timeout=1.5)
    # the first to time out releases its lock, so the other may get it before its own
    # timeout: what must not happen is a DeadlockError
    assert "deadlock" not in res and "timeout" in res, res


def _timed_member(first, second, ready, go, out, timeout):
    shmlocks.set_deadlock_timeout(None)
    first.acquire()
    ready.set()
    go.wait(30)
    try:
        out.put("got" if second.acquire(timeout=timeout) else "timeout")
    except shmlocks.DeadlockError:
        out.put("deadlock")
    first.release()


def _run_cycle_timed(locks, timeout):
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in locks]
    ps = [
        ctx.Process(
            target=_timed_member,
            args=(locks[i], locks[(i + 1) % 2], readies[i], go, out, timeout),
            daemon=True,
        )
        for i in range(2)
    ]
    for p in ps:
        p.start()
    try:
        for r in readies:
            assert r.wait(20)
        go.set()
        return [out.get(timeout=30) for _ in ps]
    finally:
        for p in ps:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)


@pytest.mark.timeout(120)
def test_only_members_that_look_can_be_the_victim(new_lock):
    """Member 1 begins to wait last but looks for nothing: member 0 (which looks) is the
    one that gives up."""
    a, b = new_lock("clh"), new_lock("futex")
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    r0, r1 = ctx.Event(), ctx.Event()
    p0 = ctx.Process(target=_member, args=(0, a, b, r0, go, out, 0.0, 0.5), daemon=True)
    p1 = ctx.Process(target=_member, args=(1, b, a, r1, go, out, 0.3, None), daemon=True)
    for p in (p0, p1):
        p.start()
    try:
        assert r0.wait(20) and r1.wait(20)
        go.set()
        res = {}
        for _ in range(2):
            i, what, took, msg, held = out.get(timeout=40)
            res[i] = (what, took, msg, held)
        assert _one_victim(res, 0.5) == 0
    finally:
        for p in (p0, p1):
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)


@pytest.mark.timeout(30)
def test_set_deadlock_timeout_checks_its_argument():
    old = shmlocks.get_deadlock_timeout()
    assert old == 1.0
    try:
        for bad in (-0.1, -1, math.nan):
            with pytest.raises(ValueError):
                shmlocks.set_deadlock_timeout(bad)
        for bad in ("1", b"1", [1], object()):
            with pytest.raises(TypeError):
                shmlocks.set_deadlock_timeout(bad)
        assert shmlocks.get_deadlock_timeout() == old
        shmlocks.set_deadlock_timeout(None)
        assert shmlocks.get_deadlock_timeout() is None
        shmlocks.set_deadlock_timeout(2)
        assert shmlocks.get_deadlock_timeout() == 2.0
    finally:
        shmlocks.set_deadlock_timeout(old)
