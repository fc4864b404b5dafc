"""The synchronization toolbox behaves as threading's primitives do (the behaviours
CPython's Lib/test/lock_tests.py checks, in this project's own tests), across threads and
across processes (fork and spawn), and has the lifecycle of locks (README "The
synchronization toolbox"; docs/design.md §12)."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import pytest
from support.common import shm_exists, uniq, until

import shmlocks
from shmlocks import _segment

pytestmark = pytest.mark.timeout(60)


def _threads(n, target, *args):
    ts = [threading.Thread(target=target, args=args) for _ in range(n)]
    for t in ts:
        t.start()
    return ts


def _join(ts, timeout=20):
    for t in ts:
        t.join(timeout)
        assert not t.is_alive()


@pytest.fixture
def made():
    """Objects this test makes, closed at teardown (their names unlinked)."""
    objs = []
    yield objs
    for o in reversed(objs):
        try:
            o.close()
        except Exception:
            pass


# --------------------------------------------------------------------------- RLock


@pytest.mark.parametrize("kind", shmlocks.KINDS)
def test_rlock_reenters_and_counts(kind, made):
    rl = shmlocks.RLock(kind, uniq("rl"))
    made.append(rl)
    assert rl._recursion_count() == 0 and not rl._is_owned()
    for depth in (1, 2, 3):
        assert rl.acquire()
        assert rl._recursion_count() == depth
    with rl:
        assert rl._recursion_count() == 4
    for depth in (2, 1, 0):
        rl.release()
        assert rl._recursion_count() == depth
    assert not rl.locked()
    with pytest.raises(RuntimeError):
        rl.release()
    with pytest.raises(RuntimeError):
        rl._release_save()


def test_rlock_other_thread_cannot_release_nor_enter(made):
    rl = shmlocks.RLock("ticket", uniq("rl"))
    made.append(rl)
    rl.acquire()
    seen = {}

    def other():
        seen["owned"] = rl._is_owned()
        seen["count"] = rl._recursion_count()
        seen["try"] = rl.acquire(False)
        try:
            rl.release()
        except RuntimeError:
            seen["release"] = "RuntimeError"
        seen["timed"] = rl.acquire(timeout=0.05)

    _join(_threads(1, other))
    assert seen == {
        "owned": False,
        "count": 0,
        "try": False,
        "release": "RuntimeError",
        "timed": False,
    }
    rl.release()
    with pytest.raises(ValueError):
        rl.acquire(False, 1)
    assert "unlocked" in repr(rl) and "locked" in repr(rl)


def _rlock_child(rl):
    got = rl.acquire(timeout=0.05)
    return got


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_rlock_excludes_another_process(procs, method, made):
    rl = shmlocks.RLock("mcs", uniq("rl"))
    made.append(rl)
    with rl, rl:
        assert procs.call(_rlock_child, rl, method=method) is False
    assert procs.call(_rlock_child, rl, method=method) is True  # (it exits holding it)


# --------------------------------------------------------------------------- Event


def test_event_set_clear_wait(made):
    ev = shmlocks.Event(uniq("ev"))
    made.append(ev)
    assert not ev.is_set()
    ev.set()
    ev.set()
    assert ev.is_set() and ev.wait() and ev.wait(0)
    ev.clear()
    ev.clear()
    assert not ev.is_set()
    t0 = time.monotonic()
    assert ev.wait(0.2) is False
    assert 0.15 < time.monotonic() - t0 < 2
    assert ev.wait(0) is False and ev.wait(-1) is False
    assert "unset" in repr(ev)


def test_event_wakes_every_waiter_even_if_cleared_at_once(made):
    ev = shmlocks.Event(uniq("ev"))
    made.append(ev)
    res = []
    ts = _threads(5, lambda: res.append(ev.wait(20)))
    until(lambda: ev._raw()["parked"] == 5, what="five waiters asleep")
    ev.set()
    ev.clear()  # before they ran: each still returns True (threading's gh-57711)
    _join(ts)
    assert res == [True] * 5


def _ev_child(ev, go):
    go.set()
    return ev.wait(20)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_event_across_processes(procs, method, made):
    ev = shmlocks.Event(uniq("ev"))
    go = shmlocks.Event(uniq("go"))
    made += [ev, go]
    result = []
    t = threading.Thread(target=lambda: result.append(procs.call(_ev_child, ev, go, method=method)))
    t.start()
    assert go.wait(30)
    time.sleep(0.1)
    ev.set()
    t.join(30)
    assert result == [True]


# ------------------------------------------------------------------------ Semaphore


@pytest.mark.parametrize("cls", [shmlocks.Semaphore, shmlocks.BoundedSemaphore])
def test_semaphore_counts(cls, made):
    with pytest.raises(ValueError):
        cls(-1, uniq("sem"))
    s = cls(2, uniq("sem"))
    made.append(s)
    assert s.acquire() and s.acquire(False)
    assert s.acquire(False) is False
    t0 = time.monotonic()
    assert s.acquire(timeout=0.2) is False
    assert 0.15 < time.monotonic() - t0 < 2
    with pytest.raises(ValueError):
        s.acquire(False, timeout=1)
    s.release()
    assert s.acquire(timeout=0.01)
    s.release(2)
    with s:
        assert s.acquire(False)
        s.release()
        with s:
            assert s.acquire(False) is False
    with pytest.raises(TypeError), s:
        raise TypeError
    assert s.value == 2
    with pytest.raises(ValueError):
        s.release(0)


def test_semaphore_unbounded_and_bounded_release(made):
    s = shmlocks.Semaphore(1, uniq("sem"))
    b = shmlocks.BoundedSemaphore(1, uniq("bsem"))
    made += [s, b]
    s.release()
    assert s.value == 2
    assert "value=2" in repr(s)
    with pytest.raises(ValueError):
        b.release()
    b.acquire()
    assert "value=0/1" in repr(b)
    b.release()
    with pytest.raises(ValueError):
        b.release()
    d = shmlocks.Semaphore(name=uniq("sem"))
    made.append(d)
    assert d.value == 1  # the default


def test_semaphore_release_past_the_largest_value_is_overflowerror(made):
    """A value is a 32-bit word: release() that would take it past 2**31-1 is the user's
    error, OverflowError saying so, and releases nothing (it used to be a
    CorruptRegionError blaming the guard); the semaphore goes on working."""
    top = 2**31 - 1
    s = shmlocks.Semaphore(top, uniq("sem"))
    made.append(s)
    with pytest.raises(OverflowError, match=r"semaphore value would exceed 2\*\*31-1"):
        s.release()
    assert s.value == top
    assert s.acquire(False)
    with pytest.raises(OverflowError, match=r"would exceed 2\*\*31-1"):
        s.release(2)
    assert s.value == top - 1
    with s:
        assert s.value == top - 2
    s.release()
    assert s.value == top and s.stats()["held_with"] == 0


def test_semaphore_contended_release_n_wakes_n(made):
    s = shmlocks.Semaphore(0, uniq("sem"))
    made.append(s)
    got = []
    lock = threading.Lock()

    def take():
        if s.acquire(timeout=20):
            with lock:
                got.append(1)

    ts = _threads(8, take)
    until(lambda: s._describe()["waiters"] == 8, what="eight waiters")
    s.release(3)
    until(lambda: len(got) == 3, what="three taken")
    time.sleep(0.1)
    assert len(got) == 3 and s.value == 0
    s.release(5)
    _join(ts)
    assert len(got) == 8 and s.value == 0


def _sem_worker(sem, counter_name, n):
    counter = shmlocks.Semaphore.open(counter_name)
    for _ in range(n):
        with sem:
            assert not counter.acquire(False)  # the one unit of sem: nobody else inside
            counter.release()
            counter.acquire()
    counter.close()
    return n


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_semaphore_excludes_across_processes(procs, method, made):
    sem = shmlocks.BoundedSemaphore(1, uniq("sem"))
    inside = shmlocks.Semaphore(0, uniq("in"))
    made += [sem, inside]
    ctx_threads = [
        threading.Thread(
            target=procs.call, args=(_sem_worker, sem, inside.name, 200), kwargs={"method": method}
        )
        for _ in range(3)
    ]
    for t in ctx_threads:
        t.start()
    _join(ctx_threads, 60)
    assert sem.value == 1 and inside.value == 0


# -------------------------------------------------------------------------- Barrier


def test_barrier_lockstep_indices_and_action(made):
    actions = []
    bar = shmlocks.Barrier(5, lambda: actions.append(1), name=uniq("bar"))
    made.append(bar)
    idx = []
    lock = threading.Lock()

    def f():
        for _ in range(10):
            i = bar.wait()
            with lock:
                idx.append(i)

    _join(_threads(5, f))
    assert len(actions) == 10
    assert sorted(idx) == sorted(list(range(5)) * 10)
    assert bar.n_waiting == 0 and not bar.broken and bar.parties == 5
    single = shmlocks.Barrier(1, name=uniq("bar1"))
    made.append(single)
    assert single.wait() == 0 and single.wait() == 0


def test_barrier_abort_reset_timeout(made):
    bar = shmlocks.Barrier(3, name=uniq("bar"))
    made.append(bar)
    res = []

    def f():
        try:
            bar.wait()
            res.append("passed")
        except threading.BrokenBarrierError:
            res.append("broken")

    ts = _threads(2, f)
    until(lambda: bar.n_waiting == 2, what="two wait")
    assert "waiters=2/3" in repr(bar)
    bar.abort()
    _join(ts)
    assert res == ["broken", "broken"] and bar.broken
    with pytest.raises(threading.BrokenBarrierError):
        bar.wait()
    bar.reset()
    assert not bar.broken
    res.clear()
    ts = _threads(2, f)
    until(lambda: bar.n_waiting == 2, what="two wait again")
    bar.reset()  # resets while they wait: they are broken out, the barrier is not
    _join(ts)
    assert res == ["broken", "broken"] and not bar.broken
    t0 = time.monotonic()
    with pytest.raises(threading.BrokenBarrierError):
        bar.wait(0.1)  # a timeout breaks it
    assert time.monotonic() - t0 < 2 and bar.broken
    bar.reset()
    timed = shmlocks.Barrier(2, timeout=0.1, name=uniq("bart"))
    made.append(timed)
    with pytest.raises(threading.BrokenBarrierError):
        timed.wait()  # the default timeout


def test_barrier_action_raising_breaks_it(made):
    def boom():
        raise RuntimeError("action")

    bar = shmlocks.Barrier(2, boom, name=uniq("bar"))
    made.append(bar)
    res = []

    def f():
        try:
            bar.wait()
            res.append("passed")
        except threading.BrokenBarrierError:
            res.append("broken")
        except RuntimeError:
            res.append("raised")

    _join(_threads(2, f))
    assert sorted(res) == ["broken", "raised"]


def _bar_child(bar, rounds):
    return [bar.wait() for _ in range(rounds)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_barrier_across_processes(procs, method, made):
    bar = shmlocks.Barrier(4, name=uniq("bar"))
    made.append(bar)
    out = []
    ts = [
        threading.Thread(target=lambda: out.append(procs.call(_bar_child, bar, 5, method=method)))
        for _ in range(3)
    ]
    for t in ts:
        t.start()
    mine = [bar.wait(30) for _ in range(5)]
    _join(ts, 60)
    per_round = list(zip(mine, *out, strict=True))
    assert all(sorted(r) == [0, 1, 2, 3] for r in per_round)


# ------------------------------------------------------------------------ Condition


def test_condition_default_rlock_and_plain_lock(made):
    cond = shmlocks.Condition(name=uniq("cv"))
    made.append(cond)
    assert isinstance(cond.lock, shmlocks.RLock)
    cond.acquire()
    cond.acquire()
    cond.release()
    cond.release()
    with pytest.raises(RuntimeError):
        cond.wait()
    with pytest.raises(RuntimeError):
        cond.notify()
    lock = shmlocks.FutexMutex.create(uniq("cvlock"))
    made.append(lock)
    c2 = shmlocks.Condition(lock, uniq("cv2"))
    made.append(c2)
    with c2:
        assert not lock.acquire(False)
        t0 = time.monotonic()
        assert c2.wait(0.1) is False
        assert 0.05 < time.monotonic() - t0 < 2
    assert lock.acquire(False)
    lock.release()
    t = threading.Lock()  # threading's lock works in one process
    c3 = shmlocks.Condition(t, uniq("cv3"))
    made.append(c3)
    with c3:
        assert c3.wait(0.01) is False
    c3o = shmlocks.Condition.open(c3.name)
    made.append(c3o)
    with pytest.raises(ValueError):
        _ = c3o.lock  # threading's lock cannot be opened by name
    with pytest.raises(TypeError):
        pickle.dumps(c3)


def test_condition_notify_counts(made):
    cond = shmlocks.Condition(shmlocks.RLock("ticket", uniq("cvl")), uniq("cv"))
    made += [cond, cond.lock]
    woke = []
    lock = threading.Lock()

    def f():
        with cond:
            r = cond.wait(20)
        with lock:
            woke.append(r)

    ts = _threads(5, f)
    until(lambda: cond._describe()["waiters"] == 5, what="five wait")
    with cond:
        cond.notify(2)
    until(lambda: len(woke) == 2, what="two woke")
    time.sleep(0.1)
    assert woke == [True, True]
    with cond:
        cond.notify_all()
    _join(ts)
    assert woke == [True] * 5


def _cv_waiter_sigint(cond, out, tag):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cond.acquire()
    try:
        got = cond.wait(20)
    except KeyboardInterrupt:  # the lock not taken back (as threading's)
        out.put((tag, "KeyboardInterrupt"))
        return
    cond.release()
    out.put((tag, got))


@pytest.mark.parametrize("lock", ["futex", "rlock-mcs", "robust"])
def test_condition_ctrl_c_while_taking_the_lock_back_passes_the_notify_on(procs, lock, made):
    """[N3]: notify(1) picks the older waiter, which wakes and blocks taking the lock
    back (the notifier holds it); Ctrl-C there ends its wait with KeyboardInterrupt, and
    the notification goes to the other waiter rather than being swallowed."""
    import multiprocessing as mp

    if lock.startswith("rlock-"):
        lk = shmlocks.RLock(lock[6:], uniq("cvl"))
    else:
        lk = shmlocks.KINDS[lock](uniq("cvl"))
    cond = shmlocks.Condition(lk, uniq("cv"))
    made += [cond, lk]
    out = mp.get_context("fork").Queue()
    a = procs.start(_cv_waiter_sigint, cond, out, "a")
    until(lambda: cond._describe()["waiters"] == 1, what="a waits")
    procs.start(_cv_waiter_sigint, cond, out, "b")
    until(lambda: cond._describe()["waiters"] == 2, what="b waits")
    with cond:
        cond.notify(1)  # -> a, the older
        until(lambda: cond._describe()["waiters"] == 1, what="a woke")
        time.sleep(0.2)  # a is blocked taking the lock back
        os.kill(a.pid, signal.SIGINT)
        assert out.get(timeout=5) == ("a", "KeyboardInterrupt")
    assert out.get(timeout=5) == ("b", True)


def test_condition_wait_for(made):
    cond = shmlocks.Condition(name=uniq("cv"))
    made.append(cond)
    state = {"n": 0}
    out = []

    def f():
        with cond:
            out.append(cond.wait_for(lambda: state["n"] == 4, 20))

    ts = _threads(1, f)
    for _ in range(4):
        time.sleep(0.01)
        with cond:
            state["n"] += 1
            cond.notify()
    _join(ts)
    assert out == [True]
    with cond:
        t0 = time.monotonic()
        assert cond.wait_for(lambda: False, 0.1) is False
        assert time.monotonic() - t0 >= 0.09


def _consumer(cond, ring_name, n):
    ring = shmlocks.Semaphore.open(ring_name)  # the "queue": its value is the job count
    got = 0
    with cond:
        while got < n:
            if not cond.wait_for(lambda: ring.value > 0, 20):
                break
            ring.acquire()
            got += 1
    ring.close()
    return got


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_condition_across_processes(procs, method, made):
    cond = shmlocks.Condition(name=uniq("cv"))
    jobs = shmlocks.Semaphore(0, uniq("jobs"))
    made += [cond, jobs]
    res = []
    ts = [
        threading.Thread(
            target=lambda: res.append(procs.call(_consumer, cond, jobs.name, 10, method=method))
        )
        for _ in range(2)
    ]
    for t in ts:
        t.start()
    for _ in range(20):
        with cond:
            jobs.release()
            cond.notify()
        time.sleep(0.002)
    _join(ts, 60)
    assert res == [10, 10] and jobs.value == 0


# ------------------------------------------------------------------------ lifecycle


@pytest.mark.parametrize(
    "make",
    [
        lambda n: shmlocks.Event(n),
        lambda n: shmlocks.Semaphore(3, n),
        lambda n: shmlocks.BoundedSemaphore(3, n),
        lambda n: shmlocks.Barrier(2, name=n),
        lambda n: shmlocks.Condition(name=n),
    ],
    ids=["event", "semaphore", "bounded", "barrier", "condition"],
)
def test_lifecycle(make):
    name = uniq("life")
    o = make(name)
    try:
        assert o.name == name and shm_exists(name)
        with pytest.raises(FileExistsError):
            make(name)
        same = type(o).open(name)
        assert type(same) is type(o)
        again = pickle.loads(pickle.dumps(o))
        assert type(again) is type(o) and again.name == name
        with pytest.raises(shmlocks.LockKindError):
            shmlocks.Lock.open(name)
        with pytest.raises(shmlocks.LockKindError):
            (shmlocks.Event if not isinstance(o, shmlocks.Event) else shmlocks.Barrier).open(name)
        same.close()
        again.close()
    finally:
        o.close()
    assert not shm_exists(name)
    with pytest.raises(ValueError):
        o._describe()
    with pytest.raises(FileNotFoundError):
        type(o).open(name)


# ------------------------------------------------------------------ open_or_create

N_RACERS = 6

#: how a racer gets each object standalone, by Class.open_or_create (README
#: "The synchronization toolbox"), and in a region, by create_x else open_x there
OOC = {
    "event": lambda n: shmlocks.Event.open_or_create(n),
    "semaphore": lambda n: shmlocks.Semaphore.open_or_create(n, 10),
    "bounded": lambda n: shmlocks.BoundedSemaphore.open_or_create(n, 10),
    "barrier": lambda n: shmlocks.Barrier.open_or_create(n, N_RACERS, timeout=20),
    "condition": lambda n: shmlocks.Condition.open_or_create(n),
    "rwlock": lambda n: shmlocks.RWLock.open_or_create(n),
    "rlock": lambda n: shmlocks.RLock.open_or_create(n, "mcs"),
}
IN_REGION = {
    "event": (lambda r: r.create_event("o"), lambda r: r.open_event("o")),
    "semaphore": (lambda r: r.create_semaphore("o", 10), lambda r: r.open_semaphore("o")),
    "bounded": (
        lambda r: r.create_semaphore("o", 10, bounded=True),
        lambda r: r.open_semaphore("o"),
    ),
    "barrier": (
        lambda r: r.create_barrier("o", N_RACERS, timeout=20),
        lambda r: r.open_barrier("o"),
    ),
    # its lock first (a Condition made with lock=None makes two entries, not at once)
    "condition": (
        lambda r: r.create_condition("o", _get_in(r, "rlock")),
        lambda r: r.open_condition("o"),
    ),
    "rwlock": (lambda r: r.create_rwlock("o"), lambda r: r.open_rwlock("o")),
    "rlock": (lambda r: r.create_rlock("o.lock", "mcs"), lambda r: r.open_rlock("o.lock")),
}


def _get_in(region, what):
    make, open_ = IN_REGION[what]
    try:
        return make(region)
    except FileExistsError:
        return open_(region)


def _mapped_inode(name):
    """The inode of segment `name` if this process maps that file (/proc/self/maps), or
    None."""
    ino = os.stat(f"/dev/shm/{name}").st_ino
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and int(parts[4]) == ino:
                return ino
    return None


def _ooc_racer(what, name, in_region, go, done, out):
    try:
        go.wait(30)
        if in_region:
            reg = shmlocks.Region.open_or_create(name, max_locks=4)
            o = _get_in(reg, what)
        else:
            o = OOC[what](name)
        proof = None
        if what in ("semaphore", "bounded"):
            o.acquire()  # (bare: the parent counts them)
        elif what == "barrier":
            proof = o.wait(20)  # all N_RACERS pass one round: one barrier
        elif what == "rwlock":
            o.acquire_read()
        out.put(("ok", _mapped_inode(name), proof))
        done.wait(30)
    except BaseException as e:
        out.put(("err", f"{type(e).__name__}: {e}", None))


@pytest.mark.parametrize("in_region", [False, True], ids=["standalone", "region"])
@pytest.mark.parametrize("what", list(OOC))
def test_open_or_create_racers_end_with_one_object(procs, what, in_region):
    """Processes racing to open-or-create one name all end with the same object: one
    segment (one inode mapped by all), and what each did to it seen by all. Standalone:
    Class.open_or_create; in a region: Region.open_or_create, then create_x else open_x."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    name = uniq(f"ooc-{what}")
    racers = [
        procs.start(_ooc_racer, what, name, in_region, go, done, out) for _ in range(N_RACERS)
    ]
    go.set()
    try:
        got = [out.get(timeout=30) for _ in racers]
        assert all(g[0] == "ok" for g in got), got
        assert len({g[1] for g in got}) == 1 and got[0][1] is not None, got
        if what == "barrier":
            assert sorted(g[2] for g in got) == list(range(N_RACERS))
        if what in ("semaphore", "bounded", "rwlock"):
            reg = shmlocks.Region.open(name) if in_region else None
            o = reg.open_object("o") if reg else OOC[what](name)
            try:
                if what == "rwlock":
                    assert o.readers == N_RACERS
                else:
                    assert o.value == 10 - N_RACERS
            finally:
                o.close()
                if reg:
                    reg.close()
    finally:
        done.set()
        for p in racers:
            p.join(20)
    assert all(p.exitcode == 0 for p in racers)
    assert not shm_exists(name)


def test_open_or_create_of_an_existing_object(made):
    """What open_or_create does with an object that exists: another class is
    LockKindError; what makes the object what it is must match (a BoundedSemaphore's
    bound, a Barrier's parties, a Condition's lock, an RLock's kind), else ValueError (or
    LockKindError for the kind); what it holds now (a Semaphore's value), its default
    timeout and the segment's arguments are the existing one's."""
    name = uniq("ooc")
    sem = shmlocks.Semaphore.open_or_create(name, 3)
    made.append(sem)
    sem.acquire()
    again = shmlocks.Semaphore.open_or_create(name, 7, max_participants=8)
    made.append(again)
    assert type(again) is shmlocks.Semaphore and again.value == 2
    for cls in (
        shmlocks.BoundedSemaphore,
        shmlocks.Event,
        shmlocks.Barrier,
        shmlocks.Condition,
        shmlocks.RWLock,
    ):
        args = (2,) if cls is shmlocks.Barrier else ()
        with pytest.raises(shmlocks.LockKindError, match="holds a Semaphore"):
            cls.open_or_create(name, *args)
    with pytest.raises(shmlocks.LockKindError):
        shmlocks.RLock.open_or_create(name)

    bname = uniq("ooc-b")
    b = shmlocks.BoundedSemaphore.open_or_create(bname, 3)
    made.append(b)
    made.append(shmlocks.BoundedSemaphore.open_or_create(bname, 3))
    with pytest.raises(ValueError, match="bound of 3, not 4"):
        shmlocks.BoundedSemaphore.open_or_create(bname, 4)
    with pytest.raises(shmlocks.LockKindError, match="holds a BoundedSemaphore"):
        shmlocks.Semaphore.open_or_create(bname, 3)

    act = []
    bar = shmlocks.Barrier.open_or_create(uniq("ooc-bar"), 2, timeout=5)
    made.append(bar)
    bar2 = shmlocks.Barrier.open_or_create(bar.name, 2, lambda: act.append(1), timeout=1)
    made.append(bar2)
    assert bar2.parties == 2 and bar2.action is not None and bar.action is None
    with pytest.raises(ValueError, match="exists for 2 parties, not 3"):
        shmlocks.Barrier.open_or_create(bar.name, 3)
    t = threading.Thread(target=bar.wait)
    t.start()
    until(lambda: bar.n_waiting == 1, what="the thread waits")
    bar2.wait()
    t.join(10)
    assert act == [1]  # this object's action ran, as the last arrival's

    lk = shmlocks.FutexMutex(uniq("ooc-l"))
    made.append(lk)
    cv = shmlocks.Condition.open_or_create(uniq("ooc-cv"), lk)
    made.append(cv)
    same = shmlocks.Condition.open_or_create(cv.name, lk)
    made.append(same)
    assert same.lock is lk
    opened = shmlocks.Condition.open_or_create(cv.name)  # None: the lock it names
    made.append(opened)
    assert opened.lock.name == lk.name and opened.lock.kind == "futex"
    other = shmlocks.FutexMutex(uniq("ooc-l2"))
    made.append(other)
    for wrong in (other, shmlocks.RLock._wrap(lk), threading.Lock()):
        with pytest.raises(ValueError, match="exists on another lock"):
            shmlocks.Condition.open_or_create(cv.name, wrong)

    rl = shmlocks.RLock.open_or_create(uniq("ooc-rl"), "ticket")
    made.append(rl)
    made.append(shmlocks.RLock.open_or_create(rl.name, "ticket"))
    with pytest.raises(shmlocks.LockKindError):
        shmlocks.RLock.open_or_create(rl.name, "futex")
    with pytest.raises(ValueError):
        shmlocks.RLock.open_or_create(uniq("ooc-rl"), "nonesuch")

    with pytest.raises(ValueError):  # the arguments are checked before anything
        shmlocks.Semaphore.open_or_create(uniq("ooc"), -1)
    with pytest.raises(ValueError):
        shmlocks.Barrier.open_or_create(uniq("ooc"), 0)
    with pytest.raises(ValueError):
        shmlocks.Event.open_or_create("a/b")


def test_region_holds_the_toolbox(new_region, made):
    r = new_region(max_locks=8)
    r.create_lock("m", "clh")
    s = r.create_semaphore("s", 2, bounded=True)
    r.create_event("e")
    r.create_barrier("b", 3, timeout=5)
    cv = r.create_condition("cv")
    rl = r.create_rlock("rl", "ticket")
    assert isinstance(r.open_semaphore("s"), shmlocks.BoundedSemaphore)
    assert isinstance(r.open_event("e"), shmlocks.Event)
    assert r.open_barrier("b").parties == 3
    assert isinstance(r.open_condition("cv").lock, shmlocks.RLock)
    assert isinstance(r.open_rlock("rl"), shmlocks.RLock) and rl.kind == "ticket"
    with pytest.raises(shmlocks.LockKindError):
        r.open_lock("s")
    with pytest.raises(shmlocks.LockKindError):
        r.open_object("m")
    with pytest.raises(shmlocks.LockKindError):
        r.open_event("s")
    with pytest.raises(FileExistsError):
        r.create_event("s")
    s.acquire()
    with cv:
        pass
    assert pickle.loads(pickle.dumps(s)).value == 1
    # the CLI's reader (a pread copy) and the mapped region describe them alike
    mapped = r._describe()["locks"]
    copied = _segment.describe(_segment.read(r.name))["locks"]
    assert mapped == copied
    kinds = {lk["name"]: (lk["kind"], lk.get("state")) for lk in copied}
    assert kinds["s"] == ("semaphore", "value=1/2")
    assert kinds["e"] == ("event", "unset")
    assert kinds["b"] == ("barrier", "filling, waiters=0/3")
    assert kinds["cv"] == ("condition", "waiters=0")
    assert kinds["cv.lock"] == ("futex", None)
    r.stats()  # every entry answers


def test_cli_inspect_ls_stat_show_them(new_region):
    from support.common import run_python

    r = new_region(max_locks=4)
    r.create_semaphore("slots", 4)
    r.create_barrier("start", 2)
    code = (
        "import sys, shmlocks.cli as c\n"
        "for cmd in (['inspect', sys.argv[1]], ['stat', sys.argv[1]], ['ls'],"
        " ['deadlocks']):\n"
        "    print('==', cmd[0], flush=True)\n"
        "    print(cmd[0], c.main(cmd))\n"
    )
    out = run_python(code, r.name)
    assert out.returncode == 0, out.stderr
    assert "semaphore  value=4" in out.stdout and "barrier" in out.stdout
    assert "inspect 0" in out.stdout and "stat 0" in out.stdout and "ls 0" in out.stdout
    # `deadlocks` looks at every segment: other tests running now may have real cycles
    # (exit 3); none of them goes through this region
    dl = out.stdout.split("== deadlocks", 1)[1]
    assert "deadlocks 0" in dl or ("deadlocks 3" in dl and r.name not in dl), dl


_UNIT_HOLDER = (
    "import shmlocks, sys, time\n"
    "r = shmlocks.Region.open(sys.argv[1])\n"
    "sem = r.open_semaphore('sem')\n"
    "other = shmlocks.BoundedSemaphore.open(sys.argv[2])\n"
    "sem.__enter__(); other.__enter__()\n"
    "print('in', flush=True)\n"
    "time.sleep(60)\n"
)


def _inspect(name):
    import json
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "shmlocks", "inspect", name, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    text = subprocess.run(
        [sys.executable, "-m", "shmlocks", "inspect", name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert text.returncode == 0, text.stderr
    d = json.loads(p.stdout)
    return {lk["name"]: lk for lk in d["locks"]}, d["participants"], text.stdout


def test_inspect_shows_event_waiters_and_the_units_held_with_with(new_region, made):
    """inspect (and its --json) counts a thread blocked in Event.wait() as a waiter, and
    lists the units a participant holds with ``with sem:`` under its HOLDS (this segment's
    and another's), alive and, after its SIGKILL, dead until they are recovered; the
    semaphore's HOLDER names them. The CLI's copy describes them as the mapping does."""
    import os
    import signal
    import subprocess
    import sys

    r = new_region(max_locks=4)
    sem = r.create_semaphore("sem", 2)
    ev = r.create_event("ev")
    other = shmlocks.BoundedSemaphore(3, uniq("bsem"))
    made.append(other)
    waiter = threading.Thread(target=ev.wait, args=(30,), daemon=True)
    waiter.start()
    child = subprocess.Popen(
        [sys.executable, "-c", _UNIT_HOLDER, r.name, other.name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "in"
        until(lambda: ev._describe()["waiters"] == 1, what="the Event's waiter")
        locks, parts, text = _inspect(r.name)
        assert locks["ev"]["waiters"] == 1, locks["ev"]
        (h,) = locks["sem"]["holders"]
        assert (h["pid"], h["units"], h["alive"]) == (child.pid, 1, True), h
        (cp,) = [p for p in parts if p["pid"] == child.pid]
        assert "sem (1 unit)" in cp["holds"], cp
        assert f"{other.name} (1 unit)" in cp["holds"], cp  # another segment's, through it
        row = [
            ln for ln in text.splitlines() if ln.split()[:2] == [str(cp["slot"]), str(child.pid)]
        ]
        assert len(row) == 1 and "sem (1 unit)" in row[0], text
        assert f"with: pid {child.pid}" in text and "alive x1" in text, text
        copied = _segment.describe(_segment.read(r.name))["locks"]
        assert r._describe()["locks"] == copied

        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        locks, parts, _ = _inspect(r.name)
        (h,) = locks["sem"]["holders"]
        assert (h["pid"], h["units"], h["alive"]) == (child.pid, 1, False), h
        (cp,) = [p for p in parts if p["pid"] == child.pid]
        assert not cp["alive"] and cp["holds"] == ["sem (1 unit)"], cp
        assert r._describe()["locks"] == _segment.describe(_segment.read(r.name))["locks"]
        # its unit comes back to the next call that would fail for want of it
        assert sem.acquire(False) and sem.acquire(False)
        locks, _, _ = _inspect(r.name)
        assert locks["sem"]["holders"] == [] and locks["sem"]["state"] == "value=0"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        ev.set()
        waiter.join(10)


def test_no_leak_after_normal_exit():
    from support.common import run_python

    names = [uniq("exit") for _ in range(4)]
    code = (
        "import sys, shmlocks\n"
        "a, b, c, d = sys.argv[1:]\n"
        "e = shmlocks.Event(a); s = shmlocks.Semaphore(2, b)\n"
        "bar = shmlocks.Barrier(1, name=c); cv = shmlocks.Condition(name=d)\n"
        "with s, cv: e.set(); bar.wait()\n"
    )
    out = run_python(code, *names)
    assert out.returncode == 0, out.stderr
    assert not any(shm_exists(n) for n in names)


def _wait_forever_in(obj):
    if isinstance(obj, shmlocks.Event):
        obj.wait()
    elif isinstance(obj, shmlocks.Semaphore):
        obj.acquire()
    elif isinstance(obj, shmlocks.Barrier):
        obj.wait()
    else:
        with obj:
            obj.wait()


@pytest.mark.skipif(
    shmlocks._core.WAIT_MODE != "futex_waitv",
    reason="the sliced fallback (no futex_waitv, or SHMLOCKS_WAIT=sliced) wakes every 5 ms",
)
@pytest.mark.parametrize("what", ["event", "semaphore", "barrier", "condition"])
def test_blocked_waiter_sleeps_without_polling(procs, what, made):
    """A blocked waiter makes no wake-ups: its thread's voluntary context switches do not
    move over half a second (no periodic wake-up)."""
    obj = {
        "event": lambda: shmlocks.Event(uniq("ev")),
        "semaphore": lambda: shmlocks.Semaphore(0, uniq("sem")),
        "barrier": lambda: shmlocks.Barrier(2, name=uniq("bar")),
        "condition": lambda: shmlocks.Condition(name=uniq("cv")),
    }[what]()
    made.append(obj)
    p = procs.start(_wait_forever_in, obj, method="fork")
    until(
        lambda: obj._describe()["waiters"] == 1 or (what == "event" and obj._raw()["parked"]),
        what="the waiter to sleep",
    )
    time.sleep(0.05)

    def vcs():
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])
        raise AssertionError("no voluntary_ctxt_switches")

    try:
        before = vcs()
        time.sleep(0.5)
        assert vcs() - before <= 1
    finally:
        p.kill()
        p.join(10)


def test_names_a_timeout_like_threading(made):
    ev = shmlocks.Event(uniq("ev"))
    made.append(ev)
    with pytest.raises(OverflowError):
        ev.wait(1e100)
    with pytest.raises(ValueError):
        ev.wait(float("nan"))
    with pytest.raises(TypeError):
        ev.wait("1")


def test_toolbox_exports():
    for n in ("Event", "Semaphore", "BoundedSemaphore", "Barrier", "Condition", "RLock"):
        assert n in shmlocks.__all__ and hasattr(shmlocks, n)
    assert set(shmlocks.OBJECTS) == {"event", "semaphore", "barrier", "condition", "rwlock"}
    assert not set(shmlocks.OBJECTS) & set(shmlocks.KINDS)
    assert not issubclass(shmlocks.Semaphore, shmlocks.Lock)


def test_the_readme_example_runs_and_is_quoted_verbatim():
    import os
    import re
    import sys

    from support.common import run_python

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "examples", "toolbox_workers.py")
    with open(path) as f:
        example = f.read()
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    (quoted,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "def worker(" in b]
    assert quoted in example
    out = run_python(
        f"import runpy, sys; sys.argv = [{path!r}]; runpy.run_path({path!r}, run_name='__main__')",
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "39 of 40 jobs done" in out.stdout and "2 of 2 GPU slots free" in out.stdout
    assert sys.executable


def test_barrier_first_rounds_in_a_row(made):
    """Many fresh barriers, four threads each: in a first round every arrival is a new
    party, which lets go of the guard to wake the others; the round released meanwhile
    (a race that returned an error to the arrival) passes it normally."""
    for _ in range(100):
        bar = shmlocks.Barrier(4, name=uniq("bar"))
        idx = []
        ts = _threads(4, lambda idx=idx, bar=bar: idx.append(bar.wait(20)))
        _join(ts)
        assert sorted(idx) == [0, 1, 2, 3]
        bar.close()


def test_stat_counts_the_toolbox_calls(new_region):
    """`stat` (and `top`, from the same counters) shows each object's calls: the ones that
    got what they waited for, the ones that slept and how long, the timeouts."""
    from shmlocks.stats import segment_stats

    r = new_region(max_locks=8)
    sem = r.create_semaphore("sem", 1)
    ev = r.create_event("ev")
    bar = r.create_barrier("bar", 2)
    cond = r.create_condition("cond")

    assert sem.acquire()  # got at once
    t = threading.Thread(target=lambda: (time.sleep(0.2), sem.release()))
    t.start()
    assert sem.acquire(timeout=10)  # slept about 0.2 s
    t.join()
    assert not sem.acquire(timeout=0.05)  # a timeout

    t = threading.Thread(target=lambda: (time.sleep(0.1), ev.set()))
    t.start()
    assert ev.wait(10)
    t.join()

    t = threading.Thread(target=lambda: (time.sleep(0.1), bar.wait(10)))
    t.start()
    bar.wait(10)
    t.join()

    with cond:
        assert not cond.wait(0.05)

    by = {lk["name"]: lk for lk in segment_stats(r.name)["locks"]}
    s = by["sem"]
    assert (s["acquisitions"], s["contended"], s["timeouts"]) == (2, 2, 1), s
    assert 0.15 <= s["wait_max_s"] <= s["wait_total_s"] < 10, s
    e = by["ev"]
    assert (e["acquisitions"], e["contended"], e["timeouts"]) == (1, 1, 0), e
    b = by["bar"]
    assert b["acquisitions"] == 2 and b["contended"] >= 1 and b["wait_total_s"] > 0.05, b
    c = by["cond"]
    assert (c["acquisitions"], c["contended"], c["timeouts"]) == (0, 1, 1), c
