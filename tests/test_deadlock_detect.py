"""DeadlockError out of a blocked acquire: of every wait-for cycle exactly one member (the
last to begin waiting) gives up within the deadlock timeout (+0.5 s), keeps its locks, and
the others get theirs once it releases. Every kind; cycles of 2 and 3; threads of one
process and processes; one region and several. No cycle, no error."""

from __future__ import annotations

import math
import multiprocessing as mp

import pytest
from support import KINDS, RWSide
from support.cycles import one_victim, run_cycle

import shmlocks

SLACK_S = 2.0  # scheduling slack on a loaded 2-CPU box, on top of timeout + 0.5 s


def _run_cycle(locks, *, dl_timeout=1.0, **kw):
    """support.cycles.run_cycle, every member's deadlock timeout 1 s unless given."""
    return run_cycle(locks, dl_timeout=dl_timeout, **kw)


def _one_victim(res, dl_timeout=1.0):
    """The one victim, refused within its deadlock timeout + 0.5 s (+ slack)."""
    return one_victim(res, within=dl_timeout + 0.5 + SLACK_S)


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
    res = run_cycle([a, b], delays=[0.0, 0.3], dl_timeout=[0.5, None])
    assert _one_victim(res, 0.5) == 0


def _rw_region(new_region):
    region = new_region(max_locks=3)
    rw = region.create_rwlock("rw")
    return region, rw, RWSide(rw, False), RWSide(rw, True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("last", [0, 1])
def test_rwlock_writer_draining_a_reader_that_waits_for_it(new_region, last):
    """Member 0 reads rw, then waits for lock m; member 1 holds m and asks to write rw:
    it announces and waits for member 0's read (an AND-wait over the readers present).
    A cycle: whichever began to wait last gives up. A writer that gives up withdraws
    (the read goes on); a reader that gives up keeps its read, which the writer then
    gets past once it is released."""
    region, rw, read, write = _rw_region(new_region)
    m = region.create_lock("m", "futex")
    delays = [0.3, 0.0] if last == 0 else [0.0, 0.3]
    res = _run_cycle([read, m], threads=False, delays=delays, dl_timeout=0.5, seconds=[m, write])
    assert _one_victim(res, 0.5) == last
    msg = res[last][2]
    assert "cycle of 2 threads" in msg and f"{region.name}/rw (rwlock, read)" in msg
    want = "futex lock 'm'" if last == 0 else "the write of RWLock 'rw'"
    assert f"waits for {want} in a cycle" in msg
    assert not rw.locked() and rw.readers == 0


@pytest.mark.timeout(120)
def test_rwlock_readers_of_each_others_writers(new_region):
    """Two RWLocks, each written by one member that then asks to read the other's: each
    reader waits for the one writer of the phase it met. Threads of one process."""
    region = new_region(max_locks=2)
    a, b = region.create_rwlock("a"), region.create_rwlock("b")
    res = _run_cycle(
        [RWSide(a, True), RWSide(b, True)],
        threads=True,
        delays=[0.0, 0.3],
        dl_timeout=0.5,
        seconds=[RWSide(b, False), RWSide(a, False)],
    )
    assert _one_victim(res, 0.5) == 1
    assert f"{region.name}/a (rwlock, write)" in res[1][2]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("side", ["write", "read"])
def test_rwlock_writer_holding_waits_for_one_who_waits_for_the_rwlock(new_region, side):
    """Member 0 writes rw and waits for lock m; member 1 holds m and asks to `side` rw: a
    writer waits for the writer present to leave, a reader for the writer of its phase."""
    region, rw, read, write = _rw_region(new_region)
    m = region.create_lock("m", "mcs")
    res = _run_cycle(
        [write, m],
        threads=False,
        delays=[0.0, 0.3],
        dl_timeout=0.5,
        seconds=[m, write if side == "write" else read],
    )
    assert _one_victim(res, 0.5) == 1
    want = "the write of" if side == "write" else "a read of"
    assert f"waits for {want} RWLock 'rw' in a cycle" in res[1][2]
    assert f"waits for {region.name}/rw (rwlock, {side})" in res[1][2]


@pytest.mark.timeout(120)
def test_rwlock_drained_readers_outside_the_cycle_are_no_deadlock(new_region):
    """Member 0 holds m and asks to write rw, which members 1 and 2 read. Member 1 then
    waits for m (a cycle with member 0), member 2 for nothing (it reads for 1.8 s). Only
    0 and 1 form the cycle; once member 1 gives up, member 0 still waits for member 2's
    read and gets the write after it. And with member 1 out of it entirely, a writer
    that waits 1.8 s for a busy reader is no deadlock at all."""
    region, rw, read, write = _rw_region(new_region)
    m = region.create_lock("m", "ticket")
    res = _run_cycle(
        [m, read, read],
        threads=False,
        delays=[0.0, 0.3, 0.0],
        dl_timeout=0.5,
        seconds=[write, m, None],
    )
    assert _one_victim(res, 0.5) == 1
    res = _run_cycle([m, read], threads=False, dl_timeout=0.2, seconds=[write, None])
    assert [r[0] for r in res.values()] == ["got", "got"], res


@pytest.mark.timeout(30)
def test_set_deadlock_timeout_checks_its_argument():
    old = shmlocks.get_deadlock_timeout()
    assert old == 0.0
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
