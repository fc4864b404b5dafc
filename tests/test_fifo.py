"""FIFO order of the queue locks (ticket, mcs, clh), also after waiters leave the queue
early (timeout, Ctrl-C), and a node-recycling stress that catches queue-node ownership
bugs (the classic CLH one: a releaser must adopt its predecessor's node)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
from support import (
    FIFO_KINDS,
    abort_stress,
    aside_count,
    join_or_kill,
    wait_aside,
    wait_blocked,
    wait_seated,
)

UNSET = -9


class Queue:
    """Waiter children started one at a time, each blocked before the next arrives.

    Each child records, under the lock, its index into ``order``; ``results[i]`` is 1 if
    child i got the lock, 0 if its acquire timed out, -1 if it was interrupted.
    """

    def __init__(self, procs, lock, n):
        self.ctx = mp.get_context("fork")
        self.procs, self.lock = procs, lock
        self.order = self.ctx.Array("i", [UNSET] * n, lock=False)
        self.pos = self.ctx.Value("i", 0, lock=False)
        self.results = self.ctx.Array("i", [UNSET] * n, lock=False)
        self.waited = self.ctx.Array("d", [0.0] * n, lock=False)
        self.children = {}

    def arrive(self, idx, timeout=30.0):
        r, w = self.ctx.Pipe(duplex=False)
        p = self.procs.start(
            _waiter,
            self.lock,
            idx,
            w,
            timeout,
            self.order,
            self.pos,
            self.results,
            self.waited,
            ctx=self.ctx,
        )
        w.close()
        assert r.poll(20), f"waiter {idx} did not start"
        r.recv()
        wait_blocked(p.pid)
        assert p.is_alive() and self.results[idx] == UNSET, f"waiter {idx} did not block"
        self.children[idx] = p
        return p

    def finish(self, timeout=20.0):
        stuck = join_or_kill(list(self.children.values()), timeout)
        assert not stuck, f"waiters never got the lock: {[p.pid for p in stuck]}"
        codes = {i: p.exitcode for i, p in self.children.items()}
        assert all(c == 0 for c in codes.values()), f"waiter exit codes {codes}"
        return list(self.order[: self.pos.value])


def _waiter(lock, idx, conn, timeout, order, pos, results, waited):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.send(idx)
    t0 = time.monotonic()
    try:
        got = lock.acquire(timeout=timeout)
    except KeyboardInterrupt:
        waited[idx] = time.monotonic() - t0
        results[idx] = -1
        return
    waited[idx] = time.monotonic() - t0
    if got:
        order[pos.value] = idx  # protected by the lock
        pos.value += 1
        results[idx] = 1
        lock.release()
    else:
        results[idx] = 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_fifo_order(procs, new_lock, kind):
    lock = new_lock(kind)
    n = 5
    q = Queue(procs, lock, n)
    assert lock.acquire()
    try:
        for i in range(n):
            q.arrive(i)
    finally:
        lock.release()
    assert q.finish() == list(range(n))
    assert list(q.results) == [1] * n


@pytest.mark.timeout(60)
@pytest.mark.parametrize("position", ["head", "middle", "tail"])
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_fifo_after_a_waiter_times_out(procs, new_lock, kind, position):
    """A queued waiter whose timeout elapses leaves; the rest keep their order, a later
    arrival queues behind them, and the one that left never gets the lock."""
    lock = new_lock(kind)
    n = 4
    quitter = {"head": 0, "middle": 1, "tail": n - 1}[position]
    patience = 1.0
    q = Queue(procs, lock, n + 1)
    assert lock.acquire()
    try:
        for i in range(n):
            q.arrive(i, timeout=patience if i == quitter else 30.0)
        assert q.results[quitter] == UNSET, "the test queued too slowly: the quitter already left"
        q.children[quitter].join(patience + 5)
        assert q.children[quitter].exitcode == 0
        assert q.results[quitter] == 0, "the quitter's acquire should have returned False"
        assert patience - 1e-3 <= q.waited[quitter] < patience + 1.0
        q.arrive(n)  # a new arrival after the quitter left
        time.sleep(0.05)
        assert all(q.results[i] == UNSET for i in range(n + 1) if i != quitter), (
            "a waiter got the lock while the parent still held it"
        )
    finally:
        lock.release()
    expected = [i for i in range(n + 1) if i != quitter]
    assert q.finish() == expected
    assert q.results[quitter] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("position", ["head", "middle"])
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_fifo_after_a_waiter_is_interrupted(procs, new_lock, kind, position):
    """Ctrl-C (SIGINT) raises KeyboardInterrupt out of a queued acquire promptly; the
    queue behind it keeps its order and the interrupted waiter never gets the lock."""
    lock = new_lock(kind)
    n = 4
    victim = {"head": 0, "middle": 1}[position]
    q = Queue(procs, lock, n + 1)
    assert lock.acquire()
    try:
        for i in range(n):
            q.arrive(i)
        t0 = time.monotonic()
        os.kill(q.children[victim].pid, signal.SIGINT)
        q.children[victim].join(5)
        took = time.monotonic() - t0
        assert q.children[victim].exitcode == 0
        assert q.results[victim] == -1, "the interrupted waiter did not see KeyboardInterrupt"
        assert took < 1.0, f"KeyboardInterrupt took {took:.3f}s to come out of acquire"
        q.arrive(n)
    finally:
        lock.release()
    expected = [i for i in range(n + 1) if i != victim]
    assert q.finish() == expected
    assert q.results[victim] == -1


# ------------------------------------------- past the CPUs: waiters aside (design §7.0)


def _aside_waiter(lock, idx, conn, timeout, order, pos, results, waited, spin_s, aside_s):
    """_waiter with one spinner seat, spinning spin_s in its place (holding the seat) and
    staying aside aside_s before it may rejoin."""
    from shmlocks import _core

    if spin_s:
        _core._wait_policy(spin_ns=int(spin_s * 1e9))
    _core._aside_init(1, int(aside_s * 1e9))
    _waiter(lock, idx, conn, timeout, order, pos, results, waited)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_fifo_when_waiters_step_aside_and_one_times_out_aside(procs, new_lock, kind):
    """Past the CPUs (docs/design.md §7.0): waiter 0 spins in its place on the one seat,
    waiters 1-3 arrive behind it one at a time, find no seat and step aside, waiter 1 (the
    oldest aside, its turn to rejoin a minute away) times out while aside. It never gets
    the lock; the others take their places back, and once all are in them the lock goes in
    arrival order: 0, 2, 3, then 4, who arrived after waiter 1 left."""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    n = 5
    order = ctx.Array("i", [UNSET] * n, lock=False)
    pos = ctx.Value("i", 0, lock=False)
    results = ctx.Array("i", [UNSET] * n, lock=False)
    waited = ctx.Array("d", [0.0] * n, lock=False)
    patience = 1.5
    #          (timeout, spin s, aside s)
    plan = [(30.0, 5.0, 0.2), (patience, 0, 60.0), (30.0, 0, 0.2), (30.0, 0, 0.2)]
    children = []
    assert lock.acquire()
    try:
        for i, (timeout, spin, aside) in enumerate(plan):
            r, w = ctx.Pipe(duplex=False)
            args = (lock, i, w, timeout, order, pos, results, waited, spin, aside)
            children.append(procs.start(_aside_waiter, *args, ctx=ctx))
            assert r.poll(20), f"waiter {i} did not start"
            r.recv()
            if i == 0:
                wait_seated(lock)
            else:
                wait_aside(lock, i)
        children[1].join(patience + 10)
        assert children[1].exitcode == 0 and results[1] == 0, "waiter 1 did not time out"
        assert patience - 1e-3 <= waited[1] < patience + 1.0
        r, w = ctx.Pipe(duplex=False)
        args = (lock, 4, w, 30.0, order, pos, results, waited, 0, 0.2)
        children.append(procs.start(_aside_waiter, *args, ctx=ctx))
        assert r.poll(20)
        r.recv()
        end = time.monotonic() + 20
        while aside_count(lock) and time.monotonic() < end:  # all back in their places
            time.sleep(0.005)
        for i in (0, 2, 3, 4):
            wait_blocked(children[i].pid, timeout=20)
        assert all(results[i] == UNSET for i in (0, 2, 3, 4)), "served while still held"
    finally:
        lock.release()
    stuck = join_or_kill(children, 30)
    assert not stuck, "a waiter was never served"
    assert list(order[:4]) == [0, 2, 3, 4] and results[1] == 0, (list(order), list(results))
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["aside"] == [], raw


# --------------------------------------------------------------------------- recycling


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_node_recycling_stress(procs, new_lock, kind):
    """Threads of several processes do many short rounds with random short timeouts, in
    a region with few participant slots (so nodes and slots are recycled constantly): the
    counter stays exact, no "blocking" acquire stalls for 5 s, nobody hangs."""
    lock = new_lock(kind, max_participants=10)
    report = abort_stress(procs, lock, nprocs=3, nthreads=3, rounds=6000)
    assert report.ok, report
    assert lock.locked() is False
    assert lock.acquire(timeout=2) is True, "the lock is not usable after the stress"
    lock.release()
