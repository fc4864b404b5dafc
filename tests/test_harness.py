"""The harness can fail: the exclusion checker (shmlocks/_harness.py, run through
tests/support) catches deliberately broken locks, its overlap detector catches an overlap on
its own, and its repair after an owner death keeps the count exact."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest
from support import (
    LeakyLock,
    NoLock,
    SometimesTwoLock,
    abort_stress,
    check_mutual_exclusion,
    close_quietly,
    uniq,
)

import shmlocks
from shmlocks._harness import Exclusion, words

pytestmark = pytest.mark.timeout(100)


@pytest.fixture
def ticket():
    lock = shmlocks.TicketLock.create(name=uniq("harness"))
    yield lock
    close_quietly(lock)


@pytest.fixture
def barging():
    """The real lock inside the broken ones. A futex mutex, not a ticket lock: a running
    caller barges in, so a skipped acquisition meets a running section. Over the FIFO
    ticket lock, on a loaded 2-CPU machine, the hand-offs go to preempted waiters, and a
    run of the checker over ``sometimes-two`` could see no overlap at all (a CI run did)."""
    lock = shmlocks.FutexMutex.create(name=uniq("harness-f"))
    yield lock
    close_quietly(lock)


def _broken(which: str, inner):
    return {
        "noop": NoLock,
        "leaky": LeakyLock,
        "sometimes-two": SometimesTwoLock,
    }[which](*(() if which == "noop" else (inner,)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("broken", ["noop", "leaky", "sometimes-two"])
def test_checker_fails_a_broken_lock(procs, barging, broken, method):
    lock = _broken(broken, barging)
    report = check_mutual_exclusion(procs, lock, method, nprocs=3, iters=3000)
    assert not report.ok, f"the checker missed a broken lock ({broken}): {report}"


def test_checker_passes_a_real_lock(procs, ticket):
    report = check_mutual_exclusion(procs, ticket, "fork", nprocs=3, iters=2000)
    assert report.ok, report
    assert report.total == report.expected == 6000
    assert report.handoffs > 1, "three processes took turns, yet no hand-off was counted"


@pytest.mark.parametrize("broken", ["noop", "sometimes-two"])
def test_abort_stress_fails_a_broken_lock(procs, barging, broken):
    report = abort_stress(procs, _broken(broken, barging), nprocs=3, nthreads=2, rounds=3000)
    assert not report.ok, f"the abort stress missed a broken lock ({broken}): {report}"


def test_overlap_is_a_violation_even_when_the_count_is_right():
    """Two sections interleaved so that no increment is lost: only the marker sees it."""
    ex = Exclusion(mp.RawArray("q", words(2)), participants=2)
    ex.enter(1)
    ex.count(1)
    ex.enter(2)  # inside while 1 is still inside
    ex.count(2)
    ex.leave(2)
    ex.leave(1)
    report = ex.report()
    assert report.total == report.expected == 2
    assert report.violations > 0 and not report.ok


def test_repair_credits_the_dead_holders_increment():
    """A holder killed between its increment and its count: the next holder sees
    owner_died, repairs, and the count is exact (and repairing again changes nothing)."""
    ex = Exclusion(mp.RawArray("q", words(2)), participants=2)
    ex.section(2)
    ex.enter(1)  # ... and dies here, before count()
    ex.repair()
    ex.repair()
    ex.section(2)
    report = ex.report()
    assert report.ok, report
    assert (report.total, report.inflight, ex.done()[1]) == (3, 1, 1)


def _die_in_section(lock, ex: Exclusion) -> None:
    lock.acquire()
    ex.enter(1)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_a_real_death_in_the_section_is_repaired(procs, new_lock, kind):
    lock = new_lock(kind)
    ctx = mp.get_context("fork")
    ex = Exclusion(ctx.RawArray("q", words(2)), participants=2)
    p = procs.start(_die_in_section, lock, ex)
    p.join(20)
    assert p.exitcode == -signal.SIGKILL
    assert lock.acquire(True, 10)
    assert lock.owner_died
    ex.repair()
    lock.mark_consistent()
    ex.section(2)
    lock.release()
    report = ex.report()
    assert report.ok, report
    assert (report.total, report.inflight) == (2, 1)
