"""asyncio: ``await lock.acquire_async()`` and ``async with lock`` for every kind
(docs/design.md §14). The task is the owner: tasks of one loop contend like threads, and
with threads and other processes; the tasks of one loop queue in call order behind one
place of the lock's queue (their cohort), so FIFO kinds serve a loop's tasks in call order
and each task is overtaken by at most one hold of each other waiter per task ahead of it;
release by another task is NotOwnerError, a second acquire by the holder DeadlockError; a
SIGKILLed holder process is owner_died for the next task. No thread waits for a task (one
waiter thread per loop under SHMLOCKS_AIO=thread), the loop is never blocked while tasks
wait; cancelled waits leave no hold and no place in the queue. Each test runs on the
default loop and on uvloop when it is installed; CI runs the file under
SHMLOCKS_AIO=thread too."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
from support import FIFO_KINDS, Holder, run_python, until

import shmlocks
from shmlocks import _aio, _core

LOOPS = ("asyncio", "uvloop")


@pytest.fixture(params=LOOPS)
def loop_factory(request):
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(factory, coro):
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def settle(timeout=10.0):
    """Every cohort of this thread is idle or holds for a task: none waits with no task
    left (a cohort gives its place up as its last task leaves, at once)."""

    def idle():
        d = _aio._mine_driver()
        return d is None or all(c.nwait > 0 or c.state != _aio.WAITING for c in d.cohorts.values())

    until(idle, timeout, "every cohort with no task left gave its place up")


def shmlocks_threads():
    """Threads of shmlocks' in this process (the waiter threads of AIO_MODE "thread")."""
    return [t for t in threading.enumerate() if t.name.startswith("shmlocks")]


def assert_free(lock):
    """Nobody holds or waits for the lock: a waiter stranded in a FIFO queue would make
    this acquire wait for ever."""
    assert lock._describe()["waiters"] == 0
    assert lock.acquire(timeout=5), "the lock stayed held or a waiter was stranded"
    lock.release()


# --------------------------------------------------------------------------- one loop


async def _contend(lock, tasks, rounds):
    state = {"n": 0, "inside": 0, "overlap": 0}

    async def worker():
        for _ in range(rounds):
            async with lock:
                state["inside"] += 1
                if state["inside"] != 1:
                    state["overlap"] += 1
                n = state["n"]
                await asyncio.sleep(0)  # other tasks run inside the section
                state["n"] = n + 1
                state["inside"] -= 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return state


def test_tasks_of_one_loop_contend(kind, new_lock, loop_factory):
    lock = new_lock(kind)
    state = run(loop_factory, _contend(lock, 8, 60))
    assert state == {"n": 480, "inside": 0, "overlap": 0}
    assert lock.stats()["acquisitions"] == 480
    settle()
    assert_free(lock)


def test_owner_rules(kind, new_lock, loop_factory):
    """The task is the owner: DeadlockError for its second acquire, False for a
    non-blocking one, NotOwnerError for another task's release (the holder keeps the
    lock), and the loop's own thread does not hold it either."""
    lock = new_lock(kind)

    async def main():
        assert await lock.acquire_async() is True
        with pytest.raises(shmlocks.DeadlockError):
            await lock.acquire_async()
        assert await lock.acquire_async(blocking=False) is False
        assert lock._is_owned()

        async def other():
            assert not lock._is_owned()
            with pytest.raises(shmlocks.NotOwnerError):
                lock.release()
            with pytest.raises(shmlocks.NotOwnerError):
                lock.mark_consistent()
            assert await lock.acquire_async(blocking=False) is False
            t0 = time.monotonic()
            assert await lock.acquire_async(timeout=0.1) is False
            assert time.monotonic() - t0 >= 0.09

        await asyncio.create_task(other())
        assert lock.locked()
        assert lock.owner == (os.getpid(), threading.get_native_id()), "the loop's thread"
        assert lock.acquire(blocking=False) is False  # the loop's thread is not the owner
        with pytest.raises(shmlocks.DeadlockError, match="task of this thread"):
            lock.acquire(timeout=5)  # (it would block the loop its holder needs)
        assert lock.locked() and lock._is_owned()
        lock.release()
        assert not lock.locked()
        with pytest.raises(shmlocks.NotOwnerError):
            lock.release()
        with pytest.raises(ValueError):
            lock.acquire_async(blocking=False, timeout=1)
        with pytest.raises(ValueError):
            lock.acquire_async(timeout=-2)

    run(loop_factory, main())
    settle()
    assert lock.stats()["timeouts"] == 1


# --------------------------------------------------------------------------- processes


def _proc_tasks(lock, counter, inside, overlap, tasks, rounds):
    async def worker():
        for _ in range(rounds):
            async with lock:
                inside.value += 1
                if inside.value != 1:
                    overlap.value += 1
                n = counter.value
                await asyncio.sleep(0)
                counter.value = n + 1
                inside.value -= 1

    async def main():
        await asyncio.gather(*(worker() for _ in range(tasks)))

    asyncio.run(main())


def test_processes_of_tasks_contend(kind, new_lock, procs):
    lock = new_lock(kind)
    ctx = mp.get_context("fork")
    counter, inside, overlap = (ctx.Value("i", 0, lock=False) for _ in range(3))
    ps = [
        procs.start(_proc_tasks, lock, counter, inside, overlap, 4, 40, ctx=ctx) for _ in range(3)
    ]
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert (counter.value, overlap.value) == (480, 0)
    assert lock.stats()["acquisitions"] == 480
    assert_free(lock)


# --------------------------------------------------------------------------- cancellation


async def _cancel_rounds(lock, rounds, seed):
    rnd = random.Random(seed)
    state = {"n": 0, "entered": 0, "inside": 0, "overlap": 0, "cancelled": 0}

    async def section():
        async with lock:
            state["entered"] += 1
            state["inside"] += 1
            try:
                if state["inside"] != 1:
                    state["overlap"] += 1
                n = state["n"]
                await asyncio.sleep(rnd.choice((0, 0, 0.0005)))
                state["n"] = n + 1
            finally:  # (cancelled inside the section too)
                state["inside"] -= 1

    async def by_timeout(t):
        try:
            async with asyncio.timeout(t):
                await section()
        except TimeoutError:
            state["cancelled"] += 1

    async def by_wait_for(t):
        try:
            await asyncio.wait_for(section(), t)
        except TimeoutError:
            state["cancelled"] += 1

    for _ in range(rounds):
        tasks = []
        for _ in range(rnd.randint(2, 6)):
            how = rnd.randrange(3)
            t = rnd.choice((0, 0.0002, 0.001, 0.003))
            if how == 0:
                tasks.append(asyncio.create_task(section()))
            elif how == 1:
                tasks.append(asyncio.create_task(by_timeout(t)))
            else:
                tasks.append(asyncio.create_task(by_wait_for(t)))
        await asyncio.sleep(rnd.choice((0, 0.0005, 0.002)))
        for t in tasks:
            if rnd.random() < 0.3:
                t.cancel()
        for r in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(r, asyncio.CancelledError):
                state["cancelled"] += 1
            elif r is not None:
                raise r
    return state


def test_random_cancellations_leak_nothing(kind, new_lock, loop_factory):
    """200 rounds of tasks cancelled at random (task.cancel(), asyncio.timeout(),
    asyncio.wait_for()) while they wait or hold: every section that began ended, counted
    exactly once, nothing overlapped, and afterwards nobody holds the lock nor waits for it
    (a place left in a FIFO queue, or a grant that came with the cancellation and was not
    passed on, would keep the final acquire out)."""
    lock = new_lock(kind, max_participants=128)
    before, passed0 = lock.stats()["acquisitions"], _aio.passed_on
    state = run(loop_factory, _cancel_rounds(lock, 200, seed=os.getpid()))
    assert state["overlap"] == 0 and state["inside"] == 0
    assert state["n"] <= state["entered"]  # a section cancelled mid-sleep counts no n
    assert state["cancelled"] > 0
    settle()
    # every hold began either in a section or as a grant passed on at its cancellation
    passed = _aio.passed_on - passed0
    assert lock.stats()["acquisitions"] - before == state["entered"] + passed
    assert not lock.locked()
    assert_free(lock)


def test_cancel_while_waiting_behind_another_process(kind, new_lock, procs, loop_factory):
    """A task cancelled while it waits behind a holder in another process leaves the queue:
    the next waiter (a task) is served at the release, not stuck behind a ghost; the
    statistics count the cancelled wait as a timeout (as a thread's given-up wait)."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)

    async def main():
        first = asyncio.create_task(lock.acquire_async())
        await _until_waiters(lock, 1)

        async def hold_once():
            if await lock.acquire_async(timeout=20):
                lock.release()  # (the task that acquired releases)
                return True
            return False

        second = asyncio.create_task(hold_once())
        await _until_waiters(lock, 2)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await _until_waiters(lock, 1)
        assert lock.stats()["timeouts"] == 1  # (a cancelled wait counts as a timeout)
        await asyncio.to_thread(holder.release)
        assert await second is True

    run(loop_factory, main())
    settle()
    assert lock.stats()["timeouts"] == 1 and lock.stats()["contended"] >= 1
    assert_free(lock)


def test_a_non_blocking_acquire_cancelled_as_it_succeeds_leaks_nothing(
    kind, new_lock, loop_factory
):
    """``acquire_async(blocking=False)`` whose task is cancelled while the attempt
    succeeds (the loop busy meanwhile): either the task got the lock (and the task that
    awaited it releases it) or the grant is passed on; the lock is never left held by
    nobody."""
    lock = new_lock(kind)

    async def main():
        async with lock:  # (a task after this one may find everything ready)
            pass
        t = asyncio.create_task(lock.acquire_async(blocking=False))
        await asyncio.sleep(0)  # t calls
        time.sleep(0.05)  # the loop is busy while the attempt succeeds
        t.cancel()
        try:
            got = await t
        except asyncio.CancelledError:
            got = None
        if got:
            lock.release()  # t ended holding it: its awaiter releases
        assert not lock.locked(), "a non-blocking grant met by a cancellation was leaked"

    run(loop_factory, main())
    settle()
    assert_free(lock)


async def _until_waiters(lock, n, timeout=10.0):
    end = time.monotonic() + timeout
    while lock._describe()["waiters"] != n:
        assert time.monotonic() < end, f"waiters never reached {n}"
        await asyncio.sleep(0.002)


async def _until_in_place(lock, timeout=10.0):
    """A FIFO lock's waiters that stepped aside (more waiters than CPUs, docs/design.md
    §7.0) are all back in their places: none aside, no VIP turn pending."""
    end = time.monotonic() + timeout
    while True:
        raw = lock._raw()["aside"]
        if raw is None or (not raw["aside"] and raw["vip"] == 0):
            return
        assert time.monotonic() < end, f"waiters still aside: {raw}"
        await asyncio.sleep(0.002)


# --------------------------------------------------------------------------- the loop


async def _lag_windows(n=8, length=0.5):
    """Windows of `length` s of a 1 ms periodic tick: each window's sorted lags, until one
    whose every tick came within 5 ms (at most n)."""
    loop = asyncio.get_running_loop()
    windows = []
    for _ in range(n):
        lags = []
        t_next = loop.time() + 0.001
        end = loop.time() + length
        while loop.time() < end:
            await asyncio.sleep(max(0.0, t_next - loop.time()))
            lags.append(loop.time() - t_next)
            t_next += 0.001
        windows.append(sorted(lags))
        if lags[-1] < 0.005:
            break
    return min(windows, key=lambda w: w[-1])


def _switches(tids):
    """Voluntary context switches so far (sleeps ended) of these threads of this process."""
    total = 0
    for tid in tids:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


def test_loop_is_not_blocked_by_100_waiting_tasks(kind, new_lock, procs):
    """While 100 tasks wait for a lock another process holds, a 1 ms periodic callback
    keeps running on time (every tick within 5 ms over a 0.5 s window), and their wait
    sleeps (no polling: not one re-entry of the cohort's wait in the window, and no thread
    of shmlocks' but the loop's waiter thread under SHMLOCKS_AIO=thread, which does not
    wake either); then every task gets the lock once.

    A machine under load (other jobs on 2 CPUs) delays a tick by tens of ms now and then
    with no lock involved, so the best of 8 windows is taken, and it is held to 3x the
    same loop's best window without waiters (the worse of before and after) when that one
    could not keep 5 ms either. Not one wake-up is the part that no load can fake."""
    lock = new_lock(kind, max_participants=8)  # (the 100 tasks take one slot)
    holder = Holder(procs, lock)

    async def main():
        got = 0

        async def waiter():
            nonlocal got
            async with lock:
                got += 1

        base = await _lag_windows()
        tasks = [asyncio.create_task(waiter()) for _ in range(100)]
        await _until_waiters(lock, 100, timeout=60)
        threads = shmlocks_threads()
        tids = [t.native_id for t in threads]
        await asyncio.sleep(0.1)
        sw0, p0 = _switches(tids), _aio.polls
        lags = await _lag_windows(n=1, length=0.5)
        woke, polled = _switches(tids) - sw0, _aio.polls - p0
        if lags[-1] >= 0.005:
            lags = min(lags, await _lag_windows(), key=lambda w: w[-1])
        assert got == 0
        await asyncio.to_thread(holder.release)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        # the load may have changed meanwhile: the baseline again, the worse of the two
        base = max(base, await _lag_windows(), key=lambda w: w[-1])
        return got, base, lags, woke, polled, len(threads)

    got, base, lags, woke, polled, nthreads = run(asyncio.new_event_loop, main())
    assert got == 100
    assert len(lags) > 300
    bound = max(0.005, 3 * base[-1])
    assert lags[-1] < bound, (
        f"loop lag with 100 waiting tasks: max {lags[-1] * 1e3:.1f} ms, "
        f"without: {base[-1] * 1e3:.1f} ms"
    )
    assert nthreads == (0 if _core.AIO_MODE == "io_uring" else 1)
    assert polled == 0, f"the cohort's wait was re-entered {polled} times in 0.5 s"
    assert woke == 0, f"the waiter thread woke {woke} times in 0.5 s"
    settle()
    assert lock.stats()["acquisitions"] == 101


MODES = ("io_uring", "thread")
_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
_stdlib_bytes: list[float] = []


def _many(kind, n, mode):
    """bench/asyncio_many.py's figures for n tasks of one fresh process waiting on one lock
    (kind, or "asyncio.Lock") under AIO_MODE `mode`."""
    sys.path.insert(0, _BENCH)
    try:
        import asyncio_many
    finally:
        sys.path.remove(_BENCH)
    return asyncio_many.run_fresh(kind, n, {"SHMLOCKS_AIO": mode})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_ten_thousand_tasks_wait_on_one_lock(kind, mode):
    """10,000 tasks of one process wait on one lock another process holds (issue 37's
    bar): no thread of shmlocks' with io_uring, one (the loop's waiter thread) under
    SHMLOCKS_AIO=thread; the loop's 1 ms timer late by at most 5 ms at the 99th
    percentile while they wait (the best of up to 8 windows of 0.5 s, as the 100-task
    test takes, held to 3x the same process's best before the tasks, or after they were
    served, when its load keeps that above 5 ms too: a neighbour's load that comes in the
    middle is seen by the windows after); the memory per waiting task (RSS,
    the segment's pages included) at most twice an asyncio.Lock waiter's, measured the
    same way; and once the holder releases, every task served, in call order."""
    if mode == "io_uring" and _core.AIO_MODE != "io_uring":
        pytest.skip("no io_uring FUTEX_WAITV here")
    n = 10_000
    if not _stdlib_bytes:
        _stdlib_bytes.append(_many("asyncio.Lock", n, mode)["bytes_per_task"])
    r = _many(kind, n, mode)
    assert r["aio_mode"] == mode
    assert r["served"] == n and r["call_order"], r
    assert r["threads"] == r["threads_before"] == (0 if mode == "io_uring" else 1), r
    bound = max(5.0, 3 * max(r["base_lag_best_p99_ms"], r["after_lag_best_p99_ms"]))
    assert r["lag_best_p99_ms"] <= bound, r
    assert r["bytes_per_task"] <= 2 * _stdlib_bytes[0], (r, _stdlib_bytes)


def _tasks_main(lock, hold_first, n, ready):
    """A child whose loop has n tasks on the lock (the first holding it if hold_first),
    until it is killed."""

    async def main():
        async def one(i):
            async with lock:
                await asyncio.sleep(3600)

        first = None
        if hold_first:
            first = asyncio.create_task(one(0))
            while not lock.locked() and not first.done():
                await asyncio.sleep(0.001)
        ts = [asyncio.create_task(one(i)) for i in range(1, n)]
        await asyncio.sleep(0.05)
        ready.set()
        await asyncio.gather(*ts, *([first] if first else []))

    asyncio.run(main())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("holds", [False, True], ids=["waiting", "holding"])
def test_a_killed_process_of_tasks_strands_nobody(kind, holds, new_lock, procs):
    """A process whose tasks wait for the lock (their cohort queued in it), or hold it with
    more tasks waiting behind, is SIGKILLed: a thread queued behind its cohort gets the
    lock (its place is recovered like a dead thread's), with owner_died exactly when a
    task of the dead process held it; nothing is left waiting."""
    lock = new_lock(kind)
    n = 50
    if not holds:
        lock.acquire()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    child = procs.start(_tasks_main, lock, holds, n, ready, ctx=ctx)
    assert ready.wait(30), "the child's tasks did not start"
    until(lambda: lock._describe()["waiters"] >= n - 1, 30, "the child's tasks wait")
    if holds:
        assert lock.locked() and lock.owner[0] == child.pid
    got = []

    def queued():
        ok = lock.acquire(timeout=30)
        got.append((ok, lock.owner_died))
        if ok:
            if lock.owner_died:
                lock.mark_consistent()
            lock.release()

    t = threading.Thread(target=queued)
    t.start()
    until(lambda: lock._describe()["waiters"] >= n, 30, "the thread waits behind the cohort")
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    if not holds:
        time.sleep(0.05)
        lock.release()
    t.join(40)
    assert got == [(True, holds)], got
    assert lock._describe()["waiters"] == 0
    assert_free(lock)


@pytest.mark.timeout(150)
def test_kill_torture_with_asyncio_workers(kind):
    """The kill torture with every other worker an event loop of 4 tasks (acquire_async,
    waits given up by timeouts and cancellations; `torture --asyncio`), loaded: SIGKILLs of
    holding and waiting cohorts leave no violation, wedge or leaked slot, and deaths are
    recovered (in the AIO mode this run has: CI runs the file under both)."""
    import re

    proc = subprocess.run(
        [sys.executable, "-m", "shmlocks", "torture", "--kind", kind, "--seconds", "3"]
        + ["--workers", "4", "--asyncio", "--load"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(kind)), None)
    assert line is not None and " ok " in line, out
    kills = int(re.search(r"kills (\d+)", line).group(1))
    recoveries = int(re.search(r"recoveries (\d+)", line).group(1))
    assert kills >= 10 and 0 < recoveries <= kills, line
    for word in ("violations", "wedges", "leaked slots"):
        assert re.search(rf"{word} 0\b", line), line


# --------------------------------------------------------------------------- FIFO


def _fifo_thread(lock, idx, order, pos):
    with lock:
        order[pos.value] = idx
        pos.value += 1


def _fifo_proc(lock, idx, order, pos):
    _fifo_thread(lock, idx, order, pos)


@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_fifo_across_tasks_threads_processes(kind, new_lock, procs, loop_factory):
    """Tasks, threads and processes arriving one after another while the lock is held: the
    threads and processes are served in arrival order, and the tasks of the loop in call
    order behind their cohort's place: the first task's place is its call's; each later
    task's is taken when the one before it releases (docs/design.md §14), so it is
    overtaken by one hold of each waiter that came after the task before it. Here (tasks
    0, 3, 6; threads 1, 4, 7; processes 2, 5, 8): 0, 1, 2, 4, 5, 7, 8, 3, 6. A thread or
    process that arrived while another spun (more waiters than CPUs) stepped aside and
    takes its place back (§7.0): the lock is released once all are in their places."""
    lock = new_lock(kind)
    ctx = mp.get_context("fork")
    n = 9
    order = ctx.Array("i", [-1] * n, lock=False)
    pos = ctx.Value("i", 0, lock=False)

    async def main():
        lock.acquire()  # the loop's own thread holds it (a thread hold, not a task's)
        tasks, threads, children = [], [], []

        async def task(idx):
            async with lock:
                order[pos.value] = idx
                pos.value += 1

        for idx in range(n):
            which = idx % 3
            if which == 0:
                tasks.append(asyncio.create_task(task(idx)))
            elif which == 1:
                t = threading.Thread(target=_fifo_thread, args=(lock, idx, order, pos))
                t.start()
                threads.append(t)
            else:
                children.append(procs.start(_fifo_proc, lock, idx, order, pos, ctx=ctx))
            await _until_waiters(lock, idx + 1, timeout=20)
        await _until_in_place(lock, timeout=20)
        lock.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        for t in threads:
            await asyncio.to_thread(t.join, 30)
        for p in children:
            await asyncio.to_thread(p.join, 30)
            assert p.exitcode == 0

    run(loop_factory, main())
    assert list(order) == [0, 1, 2, 4, 5, 7, 8, 3, 6]
    settle()
    assert_free(lock)


async def _call_order(lock, n, gap, rnd):
    """n tasks call acquire_async() one after another while the loop's thread holds the
    lock, with no wait for one to be in line before the next calls: (call order, service
    order)."""
    called, served = [], []

    async def task(i):
        called.append(i)
        async with lock:
            served.append(i)

    lock.acquire()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(task(i)))
        g = rnd.choice(("none", "next iteration", "1 ms")) if gap == "mixed" else gap
        if g == "next iteration":
            await asyncio.sleep(0)  # task i calls before task i + 1 is made
        elif g == "1 ms":
            await asyncio.sleep(0.001)
    await _until_waiters(lock, n, timeout=20)
    lock.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return called, served


@pytest.mark.parametrize("kind", FIFO_KINDS)
@pytest.mark.parametrize("gap", ["next iteration", "none", "mixed"])
def test_fifo_tasks_are_served_in_call_order(kind, gap, new_lock, loop_factory):
    """Tasks that call acquire_async() a loop iteration apart (``create_task`` in a loop),
    or in one iteration, or mixed with 1 ms gaps, are served in the order they called:
    a task's place in line is taken in call order, however long anything before the
    place (a first use of the lock by the task) takes. Three rounds on one lock (a later
    round's tasks may find things ready from an earlier one, others not)."""
    lock = new_lock(kind)
    rnd = random.Random(os.getpid())
    for _ in range(3):
        called, served = run(loop_factory, _call_order(lock, 12, gap, rnd))
        assert called == list(range(12))
        assert served == called, f"tasks called in order 0..11, served {served}"
    settle()
    assert_free(lock)


# --------------------------------------------------------------------------- owner death


def test_killed_holder_process_is_owner_died_for_the_next_task(kind, new_lock, procs, loop_factory):
    lock = new_lock(kind)
    holder = Holder(procs, lock)

    async def main():
        waiting = asyncio.create_task(lock.acquire_async(timeout=30))
        await _until_waiters(lock, 1)
        holder.kill()
        assert await waiting is True
        assert lock.owner_died
        lock.mark_consistent()  # the holding task repairs
        assert not lock.owner_died
        lock.release()

        async def next_task():
            async with lock:
                return lock.owner_died

        assert await asyncio.create_task(next_task()) is False

    run(loop_factory, main())
    settle()
    assert lock.stats()["owner_deaths"] == 1
    assert_free(lock)


def test_handing_owner_died_on_from_async_with(kind, new_lock, procs, loop_factory):
    """An exception leaving ``async with`` before mark_consistent() hands owner_died on to
    the next holder (as ``with`` does), rather than making the lock unrecoverable."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    holder.kill()

    async def main():
        with pytest.raises(RuntimeError):
            async with lock:
                assert lock.owner_died
                raise RuntimeError("repair failed")
        async with lock:
            assert lock.owner_died
            lock.mark_consistent()
        async with lock:
            assert not lock.owner_died

    run(loop_factory, main())
    settle()


def test_a_grant_passed_on_at_cancellation_hands_owner_died_on(kind, new_lock, procs, loop_factory):
    """A task cancelled just as it is granted the lock of a holder process that died (the
    loop busy while the grant comes, then task.cancel(), as asyncio.timeout() or
    wait_for() do when their deadline falls then) never saw owner_died: the grant passed
    on hands it on, as a ``with`` block left by an exception does (docs/design.md §6.4).
    The next holder gets the lock with owner_died (not LockNotRecoverableError for
    everyone), repairs, and the one after it gets a plain hold. (The busy spell ends
    when the lock is held for this process, or after 2 s: a design in which nothing acts
    for a task while its loop is blocked cancels a wait instead, with the same outcome.)"""
    lock = new_lock(kind)
    holder = Holder(procs, lock)

    async def main():
        waiting = asyncio.create_task(lock.acquire_async(timeout=30))
        await _until_waiters(lock, 1)
        holder.kill()
        # the loop is busy (blocked) while the lock is granted for the task, unseen
        end = time.monotonic() + 2
        while (lock.owner or (0,))[0] != os.getpid() and time.monotonic() < end:
            time.sleep(0.001)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

        async def next_holder():
            assert await lock.acquire_async(timeout=10) is True
            assert lock.owner_died, "the next holder was not told of the owner death"
            lock.mark_consistent()
            lock.release()

        await asyncio.create_task(next_holder())

    run(loop_factory, main())

    def after():
        assert lock.acquire(timeout=10)
        try:
            return lock.owner_died
        finally:
            lock.release()

    assert after() is False
    settle()
    assert_free(lock)


# --------------------------------------------------------------------------- diagnostics


def test_task_holds_and_waits_are_seen(kind, new_lock, loop_factory):
    """inspect's view (the lock's description, mapped and read from the file alike): the
    holder is the loop's thread, named with the holding task; the tasks waiting behind
    count as waiters; the statistics count the tasks' holds and waits."""
    from shmlocks import _segment

    lock = new_lock(kind)

    async def main():
        me = asyncio.current_task()
        me.set_name("the-holder")
        async with lock:
            d = lock._describe()
            assert d["locked"] and d["holder"]["pid"] == os.getpid()
            assert d["holder"]["tid"] == lock.owner[1] == threading.get_native_id()
            assert d["holder"]["task"] == "the-holder"

            async def waiter():
                async with lock:
                    pass

            ws = [asyncio.create_task(waiter(), name=f"w{i}") for i in range(3)]
            await _until_waiters(lock, 3)
            seg = _segment.describe(_segment.read(lock.region.name))
            (sd,) = seg["locks"]
            assert sd["waiters"] == 3 and sd["holder"]["task"] == "the-holder"
            assert sd["holder"] == lock._describe()["holder"]
            r = subprocess.run(
                [sys.executable, "-m", "shmlocks", "inspect", lock.region.name],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert r.returncode == 0, r.stderr
            holder = f"pid {os.getpid()} tid {threading.get_native_id()} (task 'the-holder')"
            assert holder in r.stdout, r.stdout
        await asyncio.wait_for(asyncio.gather(*ws), 10)
        assert lock._describe()["waiters"] == 0

    run(loop_factory, main())
    st = lock.stats()
    assert st["acquisitions"] == 4 and st["contended"] == 3


def test_deadlock_between_tasks_is_detected(kind, new_lock):
    """Two tasks of one loop each holding one lock and awaiting the other's: the cycle is
    refused when the task that closes it calls (DeadlockError at once, not after the
    deadlock timeout), and the other task gets its lock."""
    a, b = new_lock(kind), new_lock(kind)
    old = shmlocks.get_deadlock_timeout()
    shmlocks.set_deadlock_timeout(30)
    order = []

    async def member(name, first, second, ready, go, delay):
        async with first:
            ready.set()
            await go.wait()
            await asyncio.sleep(delay)
            t0 = time.monotonic()
            try:
                got = await second.acquire_async(timeout=15)
            except shmlocks.DeadlockError as e:
                order.append(name)
                assert "cycle" in str(e)
                return ("deadlock", time.monotonic() - t0)
            second.release()
            return ("got" if got else "timeout", 0.0)

    async def main():
        r1, r2, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        t1 = asyncio.create_task(member("t1", a, b, r1, go, 0.0))
        t2 = asyncio.create_task(member("t2", b, a, r2, go, 0.05))
        await r1.wait()
        await r2.wait()
        go.set()
        return await asyncio.wait_for(asyncio.gather(t1, t2), 30)

    try:
        r1, r2 = run(asyncio.new_event_loop, main())
    finally:
        shmlocks.set_deadlock_timeout(old)
    assert r1[0] == "got" and r2[0] == "deadlock" and r2[1] < 1.0, (r1, r2)
    assert order == ["t2"]  # the task that closed the cycle
    settle()


# --------------------------------------------------------------------------- capacity


def test_any_number_of_waiting_tasks_use_one_slot(kind, new_lock, loop_factory):
    """More tasks waiting at once than the lock's max_participants: they all get the lock
    (one participant slot stands for a loop's tasks: their cohort), counted exactly."""
    lock = new_lock(kind, max_participants=2)
    n = 40

    async def main():
        held = 0

        async def one():
            nonlocal held
            async with lock:
                held += 1

        lock.acquire()  # the loop's own thread holds it: every task waits
        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await _until_waiters(lock, n)
        assert len(lock.region._describe()["participants"]) == 2
        lock.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return held

    assert run(loop_factory, main()) == n
    assert lock.stats()["acquisitions"] == 1 + n
    settle()
    assert_free(lock)


def test_a_cohort_past_the_cap_gets_a_capacity_error_that_names_loops(new_lock):
    """Every slot of a capped region taken by threads: a task's first acquire_async() on
    it gets CapacityError saying that an event loop whose tasks use a lock takes a slot
    (and what to do)."""
    lock = new_lock("futex", max_participants=2)
    go, hold = threading.Event(), threading.Event()

    def use():
        with lock:
            pass
        go.set()
        hold.wait(20)

    ts = [threading.Thread(target=use) for _ in range(2)]
    for t in ts:
        t.start()
        assert go.wait(10)
        go.clear()

    async def main():
        with pytest.raises(shmlocks.CapacityError) as e:
            await lock.acquire_async()
        return str(e.value)

    try:
        msg = run(asyncio.new_event_loop, main())
    finally:
        hold.set()
        for t in ts:
            t.join(10)
    assert "asyncio event loop" in msg and "max_participants=2" in msg, msg


# --------------------------------------------------------------------------- Ctrl-C

_CTRL_C = r"""
import asyncio, signal, sys, shmlocks
# a SIGINT ignored by whoever started the suite is inherited: Ctrl-C must raise here
signal.signal(signal.SIGINT, signal.default_int_handler)
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
async def main():
    print("waiting", flush=True)
    await lock.acquire_async()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", flush=True)
    lock.close()
    sys.exit(3)
"""


def test_ctrl_c_of_a_waiting_asyncio_program(kind, new_lock, procs):
    """SIGINT to an asyncio program whose task waits for a lock (held here): it ends at
    once with KeyboardInterrupt, its place in the queue left."""
    lock = new_lock(kind)
    lock.acquire()
    try:
        p = procs.popen(
            [sys.executable, "-c", _CTRL_C, kind, lock.name],
            stdout=__import__("subprocess").PIPE,
            text=True,
        )
        assert p.stdout.readline() == "waiting\n"
        until(lambda: lock._describe()["waiters"] == 1, 20, "the child waits")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 3
        assert time.monotonic() - t0 < 5
        assert "interrupted" in p.stdout.read()
        assert lock._describe()["waiters"] == 0
    finally:
        lock.release()
    assert_free(lock)


def test_import_does_not_load_asyncio_support():
    r = run_python("import sys, shmlocks; print('shmlocks._aio' in sys.modules)")
    assert r.stdout.strip() == "False", r.stderr


def test_no_thread_waits_for_a_task(new_lock):
    """While 64 tasks wait (the proxies of before: 72 threads), shmlocks runs no thread
    with io_uring, one waiter thread under SHMLOCKS_AIO=thread; afterwards, at most that
    one is left."""
    lock = new_lock("mcs")
    before = shmlocks_threads()

    async def main():
        async def one():
            async with lock:
                await asyncio.sleep(0.001)

        lock.acquire()
        ts = [asyncio.create_task(one()) for _ in range(64)]
        await _until_waiters(lock, 64)
        during = shmlocks_threads()
        lock.release()
        await asyncio.wait_for(asyncio.gather(*ts), 30)
        return during

    during = run(asyncio.new_event_loop, main())
    assert len(during) == (0 if _core.AIO_MODE == "io_uring" else 1), during
    assert len(shmlocks_threads()) <= len(before) + _aio._IDLE_MAX
    assert_free(lock)


def test_a_hold_whose_task_ended_is_released_by_its_awaiter(kind, new_lock, loop_factory):
    """``asyncio.wait_for(lock.acquire_async(), t)`` (which wraps the call in a task of its
    own before Python 3.12) and ``create_task(lock.acquire_async())``: the task that awaited
    the ended one releases the hold; a live holder task still refuses others."""
    lock = new_lock(kind)

    async def main():
        assert await asyncio.wait_for(lock.acquire_async(), 10) is True
        assert lock.locked()
        lock.release()
        t = asyncio.create_task(lock.acquire_async())
        assert await t is True
        async with asyncio.timeout(10):
            await lock.__aexit__(None, None, None)  # async with's exit inherits it too
        assert not lock.locked()

    run(loop_factory, main())
    settle()
    assert_free(lock)


def test_the_asyncio_server_example_survives_a_killed_holder():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = run_python(
        open(os.path.join(root, "examples", "asyncio_workers.py")).read(), "mcs", timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "repairs after a death: 1" in r.stdout and r.stdout.rstrip().endswith("OK")


@pytest.mark.timeout(60)
def test_a_holding_task_walks_the_chain_never_the_whole_graph(new_lock, monkeypatch):
    """With the default deadlock timeout (0) a task that holds a lock and waits for
    another walks the chain from itself at once (docs/design.md §9: C, the segments on
    the chain only), then every 0.5 s while it waits; its loop never reads the whole
    wait-for graph (every segment of the machine), as it did 1 s into such a wait before
    tasks were on the walk. A task that holds nothing never walks (it is in no cycle)."""
    from shmlocks import waitgraph

    assert shmlocks.get_deadlock_timeout() == 0.0

    def scan(*args, **kwargs):
        raise AssertionError("a waiting task read the whole wait-for graph")

    monkeypatch.setattr(waitgraph, "snapshot", scan)
    a, b = new_lock("futex"), new_lock("futex")
    held, stop = threading.Event(), threading.Event()

    def holder() -> None:
        with b:
            held.set()
            stop.wait(20)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)

    async def main():
        w0 = _aio.walks
        assert await b.acquire_async(timeout=0.3) is False  # holds nothing: no walk
        assert _aio.walks == w0
        async with a:
            await asyncio.sleep(0)
            got = await b.acquire_async(timeout=1.3)
        return got, _aio.walks - w0

    try:
        got, walks = run(asyncio.new_event_loop, main())
    finally:
        stop.set()
        t.join(20)
    assert got is False
    assert 2 <= walks <= 4, walks  # at once, at 0.5 s and 1.0 s (a late timer may skip one)


# --------------------------------------------------------------------------- the fast path
# A task's uncontended acquire and release run in the core (lockbase.pxi _CohortCore),
# through the cohort the lock's tasks used last: these check that what it caches (the
# cohort, the task's id and name) never outlives what it stands for.


def _thread_of_tasks(lock, state, tasks, rounds, errors):
    try:
        asyncio.run(_contend_into(lock, state, tasks, rounds))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


async def _contend_into(lock, state, tasks, rounds):
    async def worker():
        for _ in range(rounds):
            async with lock:
                with state["guard"]:
                    state["inside"] += 1
                    if state["inside"] != 1:
                        state["overlap"] += 1
                await asyncio.sleep(0)
                with state["guard"]:
                    state["n"] += 1
                    state["inside"] -= 1
            await lock.acquire_async()
            with state["guard"]:
                state["n"] += 1
            lock.release()

    await asyncio.gather(*(worker() for _ in range(tasks)))


@pytest.mark.timeout(120)
def test_one_lock_object_shared_by_the_loops_of_two_threads(kind, new_lock):
    """One lock object, awaited by the tasks of two threads' loops at once (each thread's
    cohort in turn the one the lock's tasks used last): exclusion, exact counts, and a
    task of one loop cannot release the other loop's hold."""
    lock = new_lock(kind)
    state = {"n": 0, "inside": 0, "overlap": 0, "guard": threading.Lock()}
    errors: list[BaseException] = []
    ts = [
        threading.Thread(target=_thread_of_tasks, args=(lock, state, 4, 50, errors))
        for _ in range(2)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(100)
    assert not errors, errors
    assert (state["n"], state["overlap"]) == (2 * 4 * 50 * 2, 0)
    assert lock.stats()["acquisitions"] == 2 * 4 * 50 * 2

    held = threading.Event()
    done = threading.Event()

    async def holder():
        async with lock:
            held.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait, 30)

    async def other():
        with pytest.raises(shmlocks.NotOwnerError):
            lock.release()
        assert await lock.acquire_async(blocking=False) is False

    t = threading.Thread(target=asyncio.run, args=(holder(),))
    t.start()
    try:
        assert held.wait(30)
        asyncio.run(other())
    finally:
        done.set()
        t.join(30)
    assert_free(lock)


def test_a_task_renamed_between_holds_is_shown_by_its_new_name(kind, new_lock, loop_factory):
    """The record names the holding task by its name at the hold (inspect), even when the
    same task holds again after set_name(), and names another task after it."""
    lock = new_lock(kind)

    async def main():
        me = asyncio.current_task()
        me.set_name("first-name")
        async with lock:
            assert lock._describe()["holder"]["task"] == "first-name"
        me.set_name("second-name")
        await lock.acquire_async()
        assert lock._describe()["holder"]["task"] == "second-name"
        lock.release()

        async def other():
            async with lock:
                return lock._describe()["holder"]["task"]

        assert await asyncio.create_task(other(), name="other-task") == "other-task"

    run(loop_factory, main())
    assert_free(lock)


def _child_tasks(lock, out):
    async def main():
        state = await _contend(lock, 4, 25)
        async with lock:
            state["holder"] = lock._describe()["holder"]["pid"]
        return state

    out.put(asyncio.run(main()))


def test_a_forked_child_takes_the_lock_through_cohorts_of_its_own(kind, new_lock, procs):
    """A child forked after its parent's tasks took the lock (the parent's cohort cached
    on the lock object) takes it through cohorts of its own, with exact counts; the parent
    goes on through its own."""
    lock = new_lock(kind)

    async def parent():
        async with lock:
            pass
        return await _contend(lock, 2, 10)

    assert asyncio.run(parent()) == {"n": 20, "inside": 0, "overlap": 0}
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = procs.start(_child_tasks, lock, out, ctx=ctx)
    state = out.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert state == {"n": 100, "inside": 0, "overlap": 0, "holder": p.pid}
    assert asyncio.run(parent()) == {"n": 20, "inside": 0, "overlap": 0}
    assert lock.stats()["acquisitions"] == 1 + 20 + 101 + 1 + 20
    assert_free(lock)


def test_loops_one_after_another_in_one_thread(kind, new_lock, loop_factory):
    """A thread's second event loop (asyncio.run again) takes and releases the lock
    through its thread's cohort, rebound to the new loop; a hold left by a task of the
    closed loop is released by a task of the new one."""
    lock = new_lock(kind)

    async def hold_and_leave():
        await lock.acquire_async()

    async def contend():
        return await _contend(lock, 3, 10)

    for _ in range(3):
        assert run(loop_factory, contend()) == {"n": 30, "inside": 0, "overlap": 0}
    run(loop_factory, hold_and_leave())
    assert lock.locked()

    async def release_it():
        lock.release()
        return await contend()

    assert run(loop_factory, release_it()) == {"n": 30, "inside": 0, "overlap": 0}
    settle()
    assert_free(lock)
