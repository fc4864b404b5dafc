"""A toolbox waiter that watches many participants still sleeps (docs/design.md §12): a
barrier waiter beside ten other parties, a semaphore waiter behind nine `with` holders,
each in other processes, make no wake-ups over 2 s while nothing changes. A waiter
watching more than seven used to sleep in 5 ms slices (about 400 wake-ups in 2 s). Past
what one futex_waitv watches (127 tokens: a semaphore waiter behind 130 `with` holders)
it sleeps on several io_uring FUTEX_WAITV at once (AIO_MODE "io_uring"); slices (about 200
wake-ups a second) are the fallback without io_uring.

Wake-ups are counted as tests/test_wait_cost.py counts a lock waiter's (bench/idle_cost.py
vcs: the waiter thread's voluntary context switches)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from support.common import uniq, until

import shmlocks
from shmlocks import _core

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

from idle_cost import sleep_until, vcs  # noqa: E402

pytestmark = pytest.mark.timeout(90)

#: other processes the waiter depends on: more than a 8-word futex_waitv took beside the
#: word it sleeps on
N_OTHERS = 9
#: settle, then the measured stretch; wake-ups allowed in it (as test_wait_cost's IDLE_MAX)
SETTLE_S = 0.3
WINDOW_S = 2.0
IDLE_MAX = 2


def _hold_unit(sem, ready, go):
    with sem:
        ready.release()
        go.wait(60)


def _hold_units_in_threads(sem, n, ready, go):
    """n threads of this (child) process each hold a unit with `with`."""

    def hold():
        with sem:
            ready.release()
            go.wait(60)

    threads = [threading.Thread(target=hold) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _have_barrier(bar, ready, go):
    ready.release()  # it has the barrier: a party, not yet arrived
    go.wait(60)


def _switches_while(wait, started_when) -> tuple[int, dict]:
    """Run ``wait`` in a new thread; once ``started_when()`` holds, count the thread's
    voluntary context switches over WINDOW_S (after SETTLE_S)."""
    box: dict = {}

    def run():
        box["tid"] = threading.get_native_id()
        try:
            box["result"] = wait()
        except BaseException as e:
            box["err"] = e

    t = threading.Thread(target=run)
    t.start()
    until(lambda: "tid" in box and started_when(), 30, "the waiter blocked")
    t0 = time.monotonic()
    sleep_until(t0 + SETTLE_S)
    first = vcs(box["tid"])
    sleep_until(t0 + SETTLE_S + WINDOW_S)
    woke = vcs(box["tid"]) - first
    box["still_waiting"] = "result" not in box and "err" not in box
    box["thread"] = t
    return woke, box


def test_semaphore_waiter_behind_many_holders_sleeps(procs):
    sem = shmlocks.Semaphore(N_OTHERS, uniq("sem"))
    ready = shmlocks.Semaphore(0, uniq("rd"))
    go = shmlocks.Event(uniq("go"))
    try:
        for _ in range(N_OTHERS):
            procs.start(_hold_unit, sem, ready, go)
        for _ in range(N_OTHERS):
            assert ready.acquire(timeout=30)
        assert sem.value == 0
        woke, box = _switches_while(
            lambda: sem.acquire(timeout=30), lambda: sem._describe()["waiters"] == 1
        )
        go.set()
        box["thread"].join(30)
        assert box.get("result") is True, box
        sem.release()
        assert box["still_waiting"]
        assert woke <= IDLE_MAX, (
            f"a semaphore waiter behind {N_OTHERS} holders woke {woke} times in {WINDOW_S} s"
        )
    finally:
        go.set()
        for o in (sem, ready, go):
            o.close()


def test_barrier_waiter_beside_many_parties_sleeps(procs):
    bar = shmlocks.Barrier(N_OTHERS + 2, name=uniq("bar"))
    ready = shmlocks.Semaphore(0, uniq("rd"))
    go = shmlocks.Event(uniq("go"))
    try:
        for _ in range(N_OTHERS):
            procs.start(_have_barrier, bar, ready, go)
        for _ in range(N_OTHERS):
            assert ready.acquire(timeout=30)
        woke, box = _switches_while(lambda: bar.wait(30), lambda: bar.n_waiting == 1)
        bar.abort()
        box["thread"].join(30)
        assert isinstance(box.get("err"), threading.BrokenBarrierError), box
        assert box["still_waiting"]
        assert woke <= IDLE_MAX, (
            f"a barrier waiter beside {N_OTHERS + 1} parties woke {woke} times in {WINDOW_S} s"
        )
    finally:
        go.set()
        bar.close()
        ready.close()
        go.close()


#: more holders than one futex_waitv watches beside the word slept on (127 tokens)
N_MANY = 130


@pytest.mark.skipif(_core.AIO_MODE != "io_uring", reason="slices are the fallback without io_uring")
def test_semaphore_waiter_behind_more_holders_than_one_waitv_sleeps(procs):
    """130 `with` holders (threads of another process): the waiter sleeps on two io_uring
    FUTEX_WAITV at once, makes no wake-ups while nothing changes, and sees the holders'
    death at once (the unit a dead holder held comes back)."""
    sem = shmlocks.Semaphore(N_MANY, uniq("sem"), max_participants=N_MANY + 8)
    ready = shmlocks.Semaphore(0, uniq("rd"), max_participants=N_MANY + 8)
    go = shmlocks.Event(uniq("go"), max_participants=N_MANY + 8)
    try:
        child = procs.start(_hold_units_in_threads, sem, N_MANY, ready, go)
        for _ in range(N_MANY):
            assert ready.acquire(timeout=30)
        assert sem.value == 0
        woke, box = _switches_while(
            lambda: sem.acquire(timeout=30), lambda: sem._describe()["waiters"] == 1
        )
        assert box["still_waiting"]
        t0 = time.monotonic()
        os.kill(child.pid, 9)
        box["thread"].join(30)
        took = time.monotonic() - t0
        child.join(20)  # (its views gone, our close removes the names)
        assert box.get("result") is True, box
        assert took < 2.0, f"the holders' death reached the waiter after {took:.3f} s"
        sem.release()
        assert woke <= IDLE_MAX, (
            f"a semaphore waiter behind {N_MANY} holders woke {woke} times in {WINDOW_S} s"
        )
    finally:
        go.set()
        for o in (sem, ready, go):
            o.close()
