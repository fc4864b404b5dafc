"""The queue kinds' hand-off rule when the waiters outnumber the CPUs (docs/design.md §7.0):
a queued waiter that finds every spinner seat taken steps aside (its place left as at a
timeout) and sleeps; the oldest waiter aside takes the VIP turn and rejoins, in its old
place while that place is still queued. What a user depends on: the waiters aside are
served in arrival order when they are all asleep, every waiter aside is served within the
documented bound while others hammer the lock, and nothing is left behind."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
from support import aside_count, join_all, join_or_kill, kill, wait_aside, wait_blocked, wait_seated

import shmlocks
from shmlocks import _core

UNSET = -9
#: the kinds that step aside: the queue kinds (docs/design.md §7.0)
ASIDE_KINDS = ("ticket", "mcs", "clh")
#: a waiter aside stays aside this long in the tests that watch it (ms scale in production)
ASIDE_S = 0.2


def _waiter(lock, idx, order, pos, ready, spin_s, aside_s=ASIDE_S, seats=1, steps=None):
    """`seats` seats; spins spin_s (holding a seat that long), stays aside aside_s; records
    its place in the order it is served (and in steps[idx] the steps aside it made)."""
    if spin_s:
        _core._wait_policy(spin_ns=int(spin_s * 1e9))  # hold a spinner seat that long
    _core._aside_init(seats, int(aside_s * 1e9))
    before = _core._aside_stats()[0]
    ready.send(1)
    if lock.acquire(timeout=30):
        order[pos.value] = idx
        pos.value += 1
        lock.release()
    if steps is not None:
        steps[idx] = _core._aside_stats()[0] - before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_waiters_aside_are_served_in_arrival_order(procs, new_lock, kind):
    """Waiter 0 spins in its place (a seat held); waiters 1-3 arrive behind it, one at a
    time, find no seat and step aside (seen in the lock's words); they rejoin oldest first,
    each in its old place, and once all are asleep the lock goes 0, 1, 2, 3."""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    order = ctx.Array("i", [UNSET] * 4, lock=False)
    pos = ctx.Value("i", 0, lock=False)
    assert lock.acquire()
    children = []
    seen_aside = 0
    try:
        for i in range(4):
            r, w = ctx.Pipe(duplex=False)
            p = procs.start(_waiter, lock, i, order, pos, w, 3.0 if i == 0 else 0, ctx=ctx)
            assert r.poll(20)
            r.recv()
            children.append(p)
            if i == 0:
                wait_seated(lock)
            else:
                end = time.monotonic() + 5
                while aside_count(lock) < 1 and time.monotonic() < end:
                    time.sleep(0.001)
                seen_aside = max(seen_aside, aside_count(lock))
                time.sleep(0.05)  # the next arrives while this one is still aside
        assert seen_aside >= 1, "no waiter stepped aside behind the seated one"
        for p in children:
            wait_blocked(p.pid, timeout=20)
        end = time.monotonic() + 20
        while aside_count(lock) and time.monotonic() < end:  # all back in their places
            time.sleep(0.01)
        assert order[0] == UNSET
    finally:
        lock.release()
    stuck = join_or_kill(children, 30)
    assert not stuck, "a waiter was never served"
    assert list(order) == [0, 1, 2, 3]
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["seats"] == [0] * len(raw["seats"]) and raw["aside"] == []


def _voluntary_switches(pid: int) -> int:
    """How many times process pid's main thread has slept in the kernel."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/<pid>/status")


@pytest.mark.skipif(
    _core.WAIT_MODE != "futex_waitv",
    reason="the sliced fallback (no futex_waitv, or SHMLOCKS_WAIT=sliced) wakes every 5 ms",
)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_waiters_aside_sleep_until_their_turn(procs, new_lock, kind):
    """Waiters aside do not poll: each sleeps on its own word until it is the oldest
    waiter aside (the one ahead of it took the VIP turn or left) or a death it watches
    wakes it. Waiter 0 spins in its place (the one seat); waiter 1 steps aside and, being
    the oldest, sleeps 4 s before it may take the VIP turn; waiters 2 and 3 step aside
    behind it. Over half a second they do not wake (before: each woke every 1 ms to
    look, some 500 times), and then all are served in arrival order."""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    order = ctx.Array("i", [UNSET] * 4, lock=False)
    pos = ctx.Value("i", 0, lock=False)
    assert lock.acquire()
    children = []
    try:
        for i in range(4):
            r, w = ctx.Pipe(duplex=False)
            spin, aside = (3.0, 0.001) if i == 0 else (0, 4.0 if i == 1 else 0.001)
            children.append(procs.start(_waiter, lock, i, order, pos, w, spin, aside, ctx=ctx))
            assert r.poll(20)
            r.recv()
            if i == 0:
                wait_seated(lock)
            else:
                wait_aside(lock, i)
        time.sleep(0.05)  # (2 and 3 settle in their sleeps)
        v0 = [_voluntary_switches(p.pid) for p in children[2:]]
        time.sleep(0.5)
        woke = [_voluntary_switches(p.pid) - v for p, v in zip(children[2:], v0, strict=True)]
        still = aside_count(lock)
        end = time.monotonic() + 20
        while aside_count(lock) and time.monotonic() < end:  # all back in their places
            time.sleep(0.005)
        for p in children:
            wait_blocked(p.pid, timeout=20)
    finally:
        lock.release()
    stuck = join_or_kill(children, 30)
    assert not stuck, "a waiter was never served"
    assert still == 3, "a waiter left the aside line early: nothing was shown"
    assert max(woke) <= 10, f"wake-ups of waiters 2 and 3 in 0.5 s aside: {woke}"
    assert list(order) == [0, 1, 2, 3]
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["aside"] == []


def _hammer(lock, stop, n):
    _core._aside_init(1)
    k = 0
    while not stop.value:
        with lock:
            k += 1
    n.value = k


def _run_delay() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def _probe(lock, stop, waits, nwaits, asides):
    _core._aside_init(1)
    before = _core._aside_stats()[0]
    i = 0
    while i < len(waits) and not stop.value:
        t0, d0 = time.monotonic(), _run_delay()
        if not lock.acquire(timeout=10):
            waits[i] = -1.0
            break
        # the lock's part of the wait: not the time the probe, woken, waited for a CPU
        waits[i] = max(0.0, time.monotonic() - t0 - (_run_delay() - d0))
        lock.release()
        i += 1
        time.sleep(0.002)
    nwaits.value = i
    asides.value = _core._aside_stats()[0] - before


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_a_waiter_aside_is_served_within_the_bound(procs, new_lock, kind):
    """Three processes hammer the lock (one seat: the others step aside), a fourth keeps
    arriving: it steps aside, and each of its acquisitions is served within the bound
    (k + 1) x (2 ASIDE_NS + its wait in line), k <= 3 waiters aside before it, with room
    for a shared machine's scheduling (and not counting the time the probe itself was
    runnable but given no CPU: a loaded CI box gave it 0.9 s once); every hammerer keeps
    going (no starvation)."""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    stop = ctx.Value("i", 0, lock=False)
    counts = [ctx.Value("q", 0, lock=False) for _ in range(3)]
    waits = ctx.Array("d", [0.0] * 200, lock=False)
    nwaits = ctx.Value("i", 0, lock=False)
    asides = ctx.Value("q", 0, lock=False)
    hs = [procs.start(_hammer, lock, stop, counts[i], ctx=ctx) for i in range(3)]
    time.sleep(0.2)
    pr = procs.start(_probe, lock, stop, waits, nwaits, asides, ctx=ctx)
    pr.join(60)
    stop.value = 1
    stuck = join_all(hs, 30)
    for p in stuck + ([pr] if pr.is_alive() else []):
        kill(p)
    assert not stuck and pr.exitcode == 0
    n = nwaits.value
    got = list(waits[:n])
    assert n == len(waits) and min(got) >= 0, f"the probe was not served: {n} acquisitions"
    assert asides.value >= 1, "the probe never stepped aside: the test proved nothing"
    assert all(c.value > 0 for c in counts), [c.value for c in counts]
    # (k + 1) x (2 x 1 ms + a few holds) is ~10 ms; a loaded 2-CPU CI box adds its
    # scheduling delay to each of the k + 1 wake-ups
    assert max(got) < 0.5, f"waits (s): max {max(got):.4f}, sorted tail {sorted(got)[-5:]}"
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["aside"] == []


def test_seats_are_the_cpus_less_one():
    import os

    seats, aside_ns = _core._aside_init()
    assert seats == max(1, min(12, len(os.sched_getaffinity(0)) - 1))
    assert aside_ns == 1_000_000
    assert shmlocks.TicketLock.fifo and shmlocks.MCSLock.fifo


def test_every_queue_kind_steps_aside(new_lock):
    """ticket, mcs and clh have the aside words (docs/design.md §7.0); the barging kinds,
    which need none, do not."""
    for kind in ASIDE_KINDS:
        raw = new_lock(kind)._raw()["aside"]
        assert raw is not None and raw["vip"] == 0 and raw["aside"] == [], (kind, raw)
    assert new_lock("futex")._raw()["aside"] is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_a_running_waiter_behind_a_waiter_aside_does_not_take_its_place(procs, new_lock, kind):
    """The place of a waiter aside stays queued while the lock is held (docs/design.md
    §7.0, promise 1): a waiter that queues behind it and spins (a second seat of its own)
    does not take it. Waiter 0 spins in its place on the one seat; waiter 1 arrives, finds
    no seat and steps aside (1 s); waiter 2 arrives behind it and spins on a second seat
    (it never steps aside). Waiter 1 rejoins in its old place, ahead of waiter 2, and once
    all are in their places the lock goes 0, 1, 2. (A CLH waiter behind a place aside
    that spliced it out at once, as it does an abandoned one, would serve 0, 2, 1.)"""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    order = ctx.Array("i", [UNSET] * 3, lock=False)
    pos = ctx.Value("i", 0, lock=False)
    steps = ctx.Array("i", [UNSET] * 3, lock=False)
    plan = [(3.0, ASIDE_S, 1), (0, 1.0, 1), (3.0, ASIDE_S, 2)]  # (spin s, aside s, seats)
    assert lock.acquire()
    children = []
    try:
        for i, (spin, aside, seats) in enumerate(plan):
            r, w = ctx.Pipe(duplex=False)
            children.append(
                procs.start(_waiter, lock, i, order, pos, w, spin, aside, seats, steps, ctx=ctx)
            )
            assert r.poll(20)
            r.recv()
            if i == 0:
                wait_seated(lock)
            elif i == 1:
                wait_aside(lock, 1)
            else:
                time.sleep(0.2)  # queued behind waiter 1's place, spinning
                assert aside_count(lock) == 1, "waiter 1 came back too soon: nothing shown"
        end = time.monotonic() + 20
        while aside_count(lock) and time.monotonic() < end:  # all back in their places
            time.sleep(0.005)
        for p in children:
            wait_blocked(p.pid, timeout=20)
        assert order[0] == UNSET
    finally:
        lock.release()
    stuck = join_or_kill(children, 30)
    assert not stuck, "a waiter was never served"
    assert steps[1] >= 1 and steps[2] == 0, f"steps aside: {list(steps)}"
    assert list(order) == [0, 1, 2]
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["aside"] == [], raw


# ------------------------------------------------- deaths and cycles seen from aside (§7.0)


def _hold_forever(lock, ready):
    assert lock.acquire(timeout=30)
    ready.send(1)
    time.sleep(120)  # (killed)


def _seated_spinner(lock, ready):
    _core._wait_policy(spin_ns=int(10e9))  # holds the one seat while it spins (killed)
    _core._aside_init(1)
    ready.send(1)
    lock.acquire(timeout=60)


def _long_aside(lock, ready):
    _core._aside_init(1, int(60e9))  # the oldest waiter aside, and it stays aside (killed)
    ready.send(1)
    lock.acquire(timeout=60)


def _aside_behind(lock, ready, got_at, died):
    _core._aside_init(1, int(ASIDE_S * 1e9))
    shmlocks.set_deadlock_timeout(None)  # no deadlock look every 0.5 s: no timer at all
    ready.send(1)
    if lock.acquire(timeout=30):
        got_at.value = time.monotonic()
        died.value = 1 if lock.owner_died else 0
        if lock.owner_died:
            lock.mark_consistent()
        lock.release()


def _started(procs, ctx, target, lock, *rest):
    r, w = ctx.Pipe(duplex=False)
    p = procs.start(target, lock, w, *rest, ctx=ctx)
    assert r.poll(20), f"{target.__name__} did not start"
    r.recv()
    return p


def _kill_the_line_ahead_of_a_waiter_aside(procs, new_lock, kind):
    """H holds the lock, S spins in its place on the one seat, A steps aside (the oldest;
    its ASIDE_NS a minute) and B steps aside behind A, watching A's liveness token, with
    deadlock detection off (no look every 0.5 s). H, S and A are SIGKILLed at once.
    Returns (the lock, B's wait from the kills to the lock, whether B got owner_died)."""
    lock = new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    got_at = ctx.Value("d", 0.0, lock=False)
    died = ctx.Value("i", UNSET, lock=False)
    h = _started(procs, ctx, _hold_forever, lock)
    s = _started(procs, ctx, _seated_spinner, lock)
    wait_seated(lock, "the spinner")
    a = _started(procs, ctx, _long_aside, lock)
    wait_aside(lock, 1, "A")
    b = _started(procs, ctx, _aside_behind, lock, got_at, died)
    wait_aside(lock, 2, "B (behind A)")
    wait_blocked(b.pid, timeout=20)  # B asleep aside, watching A
    time.sleep(0.05)
    t_kill = time.monotonic()
    for p in (h, s, a):
        os.kill(p.pid, signal.SIGKILL)
    for p in (h, s, a):
        p.join(10)
    b.join(40)
    if b.is_alive():
        kill(b)
    assert b.exitcode == 0, b.exitcode
    assert got_at.value > 0, "the waiter aside never got the lock (its 30 s deadline)"
    return lock, got_at.value - t_kill, died.value == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_a_waiter_aside_sees_the_death_it_watches_at_once(procs, new_lock, kind):
    """A waiter aside that is not the oldest sleeps with no timer of its own, watching the
    liveness token of the waiter aside just ahead of it (docs/design.md §7.0): that one's
    death must wake it at once. With the holder, the seated spinner and the waiter aside
    ahead of it SIGKILLed together, the waiter aside wakes, rejoins, recovers the dead
    holder and gets the lock with owner_died within 2 s. Its sleep had no other end: its
    deadlock detection is off (no look each 0.5 s), its deadline is 30 s away, it is not
    the oldest (no ASIDE_NS timer), and nobody else is alive to wake it."""
    lock, waited, died = _kill_the_line_ahead_of_a_waiter_aside(procs, new_lock, kind)
    assert died, "the dead holder's lock was not owner_died for the waiter aside"
    # a wake-up and three recoveries; a loaded 2-CPU box adds its scheduling delays
    assert waited < 2.0, f"the waiter aside got the lock {waited:.3f} s after the deaths"
    raw = lock._raw()["aside"]
    assert raw["vip"] == 0 and raw["seats"] == [0] * len(raw["seats"]), raw


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_a_dead_waiter_aside_is_recovered_by_the_one_behind_it(procs, new_lock, kind):
    """docs/design.md §7.0: each waiter aside but the oldest watches the token of the one
    ahead of it, "the death wakes it, and it recovers the dead". After the run above, the
    dead waiter aside A is recovered: its aside mark cleared, its record no longer
    waiting for the lock."""
    lock, _waited, _died = _kill_the_line_ahead_of_a_waiter_aside(procs, new_lock, kind)
    raw = lock._raw()
    parts = raw["participants (pid, op_lock, op_step, op_value, generation)"]
    assert raw["aside"]["aside"] == [], (raw["aside"], parts[:4])


#: test_chain_walk.py's bound for a cycle refused at once on a loaded 2-CPU machine
REFUSED_S = 0.6


def _cycle_member(first, second, ready, go, out, i, aside_s, detect):
    """Hold `first`; told to go, wait for `second`; report (i, outcome, waited, the
    waiters aside on `first` then, the steps aside this wait made)."""
    _core._aside_init(1, int(aside_s * 1e9))
    if not detect:
        shmlocks.set_deadlock_timeout(None)
    assert first.acquire(timeout=30)
    ready.send(1)
    assert go.poll(30)
    steps = _core._aside_stats()[0]
    t0 = time.monotonic()
    try:
        got = second.acquire(timeout=20)
    except shmlocks.DeadlockError:
        took = time.monotonic() - t0
        out.put((i, "deadlock", took, aside_count(first), _core._aside_stats()[0] - steps))
        time.sleep(0.2)  # the other is still blocked: keep `first` a little
        first.release()
        return
    took = time.monotonic() - t0
    out.put((i, "got" if got else "timeout", took, -1, _core._aside_stats()[0] - steps))
    if got:
        second.release()
    first.release()


def _spin_for(lock, ready):
    _core._wait_policy(spin_ns=int(10e9))  # holds the one seat while the cycle closes
    _core._aside_init(1)
    ready.send(1)
    if lock.acquire(timeout=60):
        lock.release()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("who", ["first", "last"])
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_a_cycle_through_a_waiter_aside_is_refused_at_once(procs, new_lock, kind, who):
    """A waiter aside still says WAITING for its lock (docs/design.md §7.0), so the chain
    walk (§9) sees it: AB/BA where one member is aside when the cycle closes is refused at
    once, exactly one victim (the last to begin waiting), the other gets its lock.
    Member 0 holds a and waits for b, member 1 holds b and then waits for a; a spinner on
    the one seat of the lock the aside member waits for makes it step aside (its ASIDE_NS
    3 s: it stays aside while the cycle closes).
    - who="first": member 0 is aside and detects nothing (deadlock detection off: no look
      every 0.5 s that would find the cycle from its side and poke member 1); member 1,
      closing the cycle, must see member 0's wait through its record.
    - who="last": member 1, the victim, is aside: its walk runs from its sleep aside."""
    a, b = new_lock(kind, max_participants=8), new_lock(kind, max_participants=8)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    gos, members = [], []
    for i, (first, second) in enumerate(((a, b), (b, a))):
        aside = (who == "first") == (i == 0)
        r, w = ctx.Pipe(duplex=False)
        gr, gw = ctx.Pipe(duplex=False)
        gos.append(gw)
        args = (first, second, w, gr, out, i, 3.0 if aside else ASIDE_S, not (aside and i == 0))
        members.append(procs.start(_cycle_member, *args, ctx=ctx))
        assert r.poll(20), f"member {i} did not start"
        r.recv()
    aside_on = b if who == "first" else a  # the lock the aside member waits for
    _started(procs, ctx, _spin_for, aside_on)
    wait_seated(aside_on, "the spinner")
    gos[0].send(1)
    if who == "first":
        wait_aside(b, 1, "member 0")
        wait_blocked(members[0].pid, timeout=20)
    else:
        wait_blocked(members[0].pid, timeout=20)
        time.sleep(0.1)
    gos[1].send(1)
    res = {}
    for _ in range(2):
        i, what, took, n_aside, steps = out.get(timeout=60)
        res[i] = (what, took, n_aside, steps)
    stuck = join_or_kill(members, 30)
    assert not stuck, "a member never finished"
    assert res[1][0] == "deadlock" and res[0][0] == "got", res  # exactly one victim
    if who == "first":  # member 0 still aside on b (member 1's) when member 1 was refused
        assert res[1][2] == 1 and res[0][3] >= 1, f"member 0 was not aside: {res}"
    else:  # member 1 stepped aside on a before it was refused
        assert res[1][3] >= 1, f"member 1 never stepped aside: {res}"
    assert res[1][1] < REFUSED_S, res
    for lk in (a, b):
        raw = lk._raw()["aside"]
        assert raw["vip"] == 0 and raw["aside"] == [], raw
