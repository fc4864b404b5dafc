"""The public API (README.md "Usage" and its differences from threading.Lock): names,
signatures, return values and exception types."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import threading
import time

import pytest
from support import Holder, me, outcome, shm_exists, thread_holding, timed, uniq

import shmlocks

EXPECTED_KINDS = {
    "ticket": "TicketLock",
    "mcs": "MCSLock",
    "clh": "CLHLock",
    "futex": "FutexMutex",
    "robust": "RobustMutex",
    "pi": "PIMutex",
}

pytestmark = pytest.mark.timeout(30)


# --------------------------------------------------------------------------- module surface


def test_kinds_order_and_classes():
    assert list(shmlocks.KINDS) == list(EXPECTED_KINDS)
    for kind_name, cls_name in EXPECTED_KINDS.items():
        cls = getattr(shmlocks, cls_name)
        assert shmlocks.KINDS[kind_name] is cls
        assert isinstance(cls, type)


def test_public_lock_base_type():
    """Every kind's class, and every lock a region makes, is a shmlocks.Lock: the one type
    annotations name (create_lock's result, testing.kill_while_holding's argument)."""
    assert "Lock" in shmlocks.__all__
    for cls in shmlocks.KINDS.values():
        assert issubclass(cls, shmlocks.Lock)
    with shmlocks.Region.create(uniq("api-lock"), max_locks=len(shmlocks.KINDS)) as region:
        for kind in shmlocks.KINDS:
            assert isinstance(region.create_lock(kind, kind), shmlocks.Lock)


def test_private_names_stay_out_of_all():
    assert [n for n in shmlocks.__all__ if n.startswith("_")] == []
    assert callable(shmlocks._crashpoints)  # importable for the tests and README


def test_cache_line():
    line = shmlocks.CACHE_LINE
    assert type(line) is int
    assert line >= 64
    assert line & (line - 1) == 0, f"CACHE_LINE={line} is not a power of two"


@pytest.mark.parametrize(
    ("exc", "base"),
    [
        ("NotOwnerError", RuntimeError),
        ("DeadlockError", RuntimeError),
        ("LockNotRecoverableError", None),
        ("LockKindError", TypeError),
        ("CorruptRegionError", ValueError),
        ("CapacityError", None),
        ("NamespaceError", None),
        ("ReentryError", RuntimeError),
        ("LockOrderError", RuntimeError),  # a DeadlockError
        ("LockOrderWarning", RuntimeWarning),
    ],
)
def test_exception_hierarchy(exc, base):
    cls = getattr(shmlocks, exc)
    assert issubclass(cls, shmlocks.ShmLockError)
    assert issubclass(shmlocks.ShmLockError, Exception)
    if base is not None:
        assert issubclass(cls, base)
    # the SPEC's table gives exactly one "also a" per row
    others = {
        c
        for c in (RuntimeError, TypeError, ValueError, Warning)
        if base is None or not issubclass(base, c)
    }
    for other in others:
        assert not issubclass(cls, other), f"{exc} should not be a {other.__name__}"


def test_lock_kind_and_class(new_lock, kind):
    lock = new_lock(kind)
    assert lock.kind == kind
    assert type(lock) is shmlocks.KINDS[kind]
    assert isinstance(lock.name, str) and lock.name


# --------------------------------------------------------------------------- acquire arguments


def test_acquire_argument_validation(new_lock, kind):
    lock = new_lock(kind)
    with pytest.raises(ValueError):
        lock.acquire(False, 1)
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=0.5)
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=0)
    for bad in (-2, -0.5, -1.5, -math.inf):
        with pytest.raises(ValueError):
            lock.acquire(timeout=bad)
    with pytest.raises(ValueError):
        lock.acquire(timeout=math.nan)
    for bad in ("1", b"1", [1], object()):
        with pytest.raises(TypeError):
            lock.acquire(timeout=bad)
    assert lock.locked() is False, "a rejected acquire left the lock held"
    assert lock.owner is None
    # the threading.Lock defaults stay accepted
    assert lock.acquire(False, -1) is True
    lock.release()
    assert lock.acquire(True, -1) is True
    lock.release()
    assert lock.acquire(timeout=-1) is True
    lock.release()
    assert lock.acquire(blocking=True, timeout=None) is True
    lock.release()
    assert lock.acquire(timeout=2) is True
    lock.release()
    assert lock.acquire(timeout=0) is True
    lock.release()


def test_timeout_beyond_timeout_max_overflows(new_lock, kind):
    """As threading.Lock: a timeout beyond threading.TIMEOUT_MAX (inf included) raises
    OverflowError at once, and leaves the lock untouched; TIMEOUT_MAX itself is accepted."""
    lock = new_lock(kind)
    ref = threading.Lock()
    for bad in (threading.TIMEOUT_MAX * 2, math.inf, 1e100, 1e300):
        with pytest.raises(OverflowError):
            ref.acquire(timeout=bad)
        with pytest.raises(OverflowError):
            lock.acquire(timeout=bad)
        with pytest.raises(OverflowError):
            lock.acquire(True, bad)
    assert lock.locked() is False
    assert lock.acquire(timeout=threading.TIMEOUT_MAX) is True
    lock.release()
    assert lock.locked() is False


@pytest.mark.parametrize("timeout", [None, -1])
def test_timeout_none_and_minus_one_wait_forever(procs, new_lock, kind, timeout):
    """With the lock held elsewhere for longer than any default, the wait does not give up."""
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    done = threading.Event()
    result = []

    def waiter():
        got = lock.acquire(timeout=timeout)
        result.append(got)
        done.set()
        if got:
            lock.release()

    t = threading.Thread(target=waiter)
    t.start()
    try:
        assert not done.wait(1.2), f"acquire(timeout={timeout!r}) returned {result!r} early"
    finally:
        released_at = holder.release()
    assert done.wait(5), "the waiter did not get the lock after the release"
    assert result == [True]
    assert time.monotonic() - released_at < 5
    t.join(5)
    assert lock.locked() is False


# --------------------------------------------------------------------------- owners


def test_owner_and_locked(new_lock, kind):
    lock = new_lock(kind)
    assert lock.owner is None
    assert lock.locked() is False
    assert lock.owner_died is False
    assert lock.acquire() is True
    try:
        assert lock.owner == me()
        assert lock.owner == (os.getpid(), threading.get_native_id())
        assert isinstance(lock.owner[0], int) and isinstance(lock.owner[1], int)
        assert lock.locked() is True
        assert lock.owner_died is False
    finally:
        lock.release()
    assert lock.owner is None
    assert lock.locked() is False


def test_owner_seen_from_other_thread_and_process(procs, new_lock, kind):
    lock = new_lock(kind)
    holder = Holder(procs, lock)
    try:
        assert lock.owner == holder.owner
        assert holder.pid != os.getpid()
        assert lock.locked() is True
        seen = []
        t = threading.Thread(target=lambda: seen.append((lock.owner, lock.locked())))
        t.start()
        t.join(5)
        assert seen == [(holder.owner, True)]
    finally:
        holder.release()
    assert lock.owner is None


# --------------------------------------------------------------------------- misuse


def test_reacquire_by_holder_raises_deadlock(new_lock, kind):
    lock = new_lock(kind)
    assert lock.acquire()
    try:
        with pytest.raises(shmlocks.DeadlockError):
            lock.acquire()
        with pytest.raises(shmlocks.DeadlockError):
            lock.acquire(timeout=0.1)
        with pytest.raises(shmlocks.DeadlockError):
            lock.acquire(True, None)
        with pytest.raises(RuntimeError):  # DeadlockError is a RuntimeError
            lock.acquire(timeout=5)
        # a try-acquire by the holder returns False, as threading.Lock's does
        assert lock.acquire(False) is False
        assert lock.acquire(blocking=False) is False
        with pytest.raises(shmlocks.DeadlockError):
            with lock:
                pass
        # still held, by us, exactly once
        assert lock.owner == me()
        assert lock.locked() is True
    finally:
        lock.release()
    assert lock.locked() is False
    with pytest.raises(shmlocks.NotOwnerError):
        lock.release()


def test_deadlock_error_is_prompt(new_lock, kind):
    lock = new_lock(kind)
    with lock:
        t0 = time.monotonic()
        with pytest.raises(shmlocks.DeadlockError):
            lock.acquire(timeout=3)
        assert time.monotonic() - t0 < 1.0, "DeadlockError should not wait for the timeout"


def test_release_unheld_raises_not_owner(new_lock, kind):
    lock = new_lock(kind)
    with pytest.raises(shmlocks.NotOwnerError):
        lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.acquire(False) is True
    lock.release()
    with pytest.raises(shmlocks.NotOwnerError):
        lock.release()


def test_release_by_other_thread_raises_not_owner(new_lock, kind):
    """Each thread is its own participant: a second thread neither holds nor can release."""
    lock = new_lock(kind)
    with thread_holding(lock) as other:
        with pytest.raises(shmlocks.NotOwnerError):
            lock.release()
        # not reentrant across threads either: this thread waits (and times out)
        got, elapsed = timed(lock.acquire, True, 0.2)
        assert got is False
        assert elapsed >= 0.2 - 1e-3
        assert lock.acquire(False) is False
        assert lock.owner == other
        assert lock.owner != me()
    assert lock.locked() is False
    assert lock.acquire(timeout=1) is True
    lock.release()


def _try_release(lock):
    return outcome(lock.release)


def test_release_by_other_process_raises_not_owner(procs, new_lock, kind):
    lock = new_lock(kind)
    with lock:
        assert procs.call(_try_release, lock) == "NotOwnerError"
        assert lock.owner == me()
    holder = Holder(procs, lock)
    try:
        with pytest.raises(shmlocks.NotOwnerError):
            lock.release()
        assert lock.owner == holder.owner
    finally:
        holder.release()


# --------------------------------------------------------------------------- construction


def test_constructor_is_create(kind):
    cls = shmlocks.KINDS[kind]
    lock = cls()
    try:
        assert isinstance(lock, cls)
        assert isinstance(lock.name, str) and lock.name
        assert shm_exists(lock.name)
        assert lock.acquire(timeout=1)
        lock.release()
    finally:
        lock.close()
    assert not shm_exists(lock.name)

    name = uniq(f"ctor-{kind}")
    lock = cls(name=name, max_participants=8)
    try:
        assert lock.name == name
        assert shm_exists(name)
        other = cls.open(name)
        try:
            with other:
                assert lock.locked() is True
        finally:
            other.close()
    finally:
        lock.close()
    assert not shm_exists(name)


def test_generated_names_are_unique(kind):
    cls = shmlocks.KINDS[kind]
    locks = [cls.create() for _ in range(4)]
    regions = [shmlocks.Region.create() for _ in range(2)]
    try:
        names = [o.name for o in locks + regions]
        assert len(set(names)) == len(names)
        for n in names:
            assert isinstance(n, str) and n and "/" not in n
            assert shm_exists(n)
        reopened = cls.open(locks[0].name)
        assert reopened.name == locks[0].name
        reopened.close()
    finally:
        for o in locks + regions:
            o.close()
    for n in names:
        assert not shm_exists(n)


def test_create_existing_name_raises(new_lock, kind):
    lock = new_lock(kind)
    cls = shmlocks.KINDS[kind]
    with pytest.raises(FileExistsError):
        cls.create(name=lock.name)
    with pytest.raises(FileExistsError):
        shmlocks.Region.create(name=lock.name)
    assert shm_exists(lock.name)
    assert lock.acquire(timeout=1)  # the failed creates did not disturb it
    lock.release()


def test_open_missing_raises(kind):
    name = uniq("missing")
    with pytest.raises(FileNotFoundError):
        shmlocks.KINDS[kind].open(name)
    with pytest.raises(FileNotFoundError):
        shmlocks.Region.open(name)
    assert not shm_exists(name)


def test_open_as_wrong_kind_raises_lock_kind_error(new_lock, kind):
    lock = new_lock(kind)
    for other_kind, other_cls in shmlocks.KINDS.items():
        if other_kind == kind:
            continue
        with pytest.raises(shmlocks.LockKindError):
            other_cls.open(lock.name)
        with pytest.raises(TypeError):
            other_cls.open(lock.name)
    same = shmlocks.KINDS[kind].open(lock.name)
    assert same.kind == kind
    same.close()


# --------------------------------------------------------------------------- regions


def test_region_create_open_and_locks(new_region):
    region = new_region(max_locks=8, max_participants=8)
    assert isinstance(region, shmlocks.Region)
    assert shm_exists(region.name)
    assert region.lock_names() == []
    made = {}
    for i, (kind_name, cls) in enumerate(shmlocks.KINDS.items()):
        spec = kind_name if i % 2 == 0 else cls  # a KINDS key or a class
        lock = region.create_lock(f"lock-{kind_name}", spec)
        assert type(lock) is cls
        assert lock.kind == kind_name
        made[f"lock-{kind_name}"] = kind_name
    assert sorted(region.lock_names()) == sorted(made)
    assert all(isinstance(n, str) for n in region.lock_names())

    other = shmlocks.Region.open(region.name)
    try:
        assert other.name == region.name
        assert sorted(other.lock_names()) == sorted(made)
        for lock_name, kind_name in made.items():
            lk = other.open_lock(lock_name)
            assert type(lk) is shmlocks.KINDS[kind_name]
            assert lk.kind == kind_name
            # the two objects are the same lock
            mine = region.open_lock(lock_name)
            with lk:
                assert mine.locked() is True
                assert mine.owner == me()
            assert mine.locked() is False
    finally:
        other.close()
    assert shm_exists(region.name), "closing a non-creator view unlinked the name"


def test_region_errors(new_region):
    region = new_region(max_locks=2)
    region.create_lock("a", "ticket")
    with pytest.raises(FileExistsError):
        region.create_lock("a", "mcs")
    with pytest.raises(FileExistsError):
        region.create_lock("a", "ticket")
    region.create_lock("b", "futex")
    with pytest.raises(shmlocks.CapacityError):
        region.create_lock("c", "robust")
    assert sorted(region.lock_names()) == ["a", "b"]
    with pytest.raises((FileNotFoundError, KeyError)):
        region.open_lock("nope")
    with pytest.raises(FileExistsError):
        shmlocks.Region.create(name=region.name)


def test_single_lock_open_of_wrong_kind_in_region(new_region):
    """A standalone lock class opening a region that holds another kind: LockKindError."""
    lock = shmlocks.MCSLock.create(name=uniq("kind"))
    try:
        with pytest.raises(shmlocks.LockKindError):
            shmlocks.TicketLock.open(lock.name)
        region = shmlocks.Region.open(lock.name)
        try:
            assert len(region.lock_names()) == 1
            assert type(region.open_lock(region.lock_names()[0])) is shmlocks.MCSLock
        finally:
            region.close()
    finally:
        lock.close()


def test_region_context_manager_unlinks():
    name = uniq("ctx")
    with shmlocks.Region.create(name=name) as region:
        assert region.name == name
        assert shm_exists(name)
        region.create_lock("x", "pi")
    assert not shm_exists(name)
    with pytest.raises(ValueError):
        region.lock_names()


# --------------------------------------------------------------------------- close


def _closed_calls(lock):
    return {
        "acquire": lambda: lock.acquire(),
        "acquire_nb": lambda: lock.acquire(False),
        "acquire_timeout": lambda: lock.acquire(timeout=0.1),
        "release": lock.release,
        "locked": lock.locked,
        "owner": lambda: lock.owner,
        "owner_died": lambda: lock.owner_died,
        "mark_consistent": lock.mark_consistent,
        "with": lambda: lock.__enter__(),
    }


def test_close_then_any_call_raises_value_error(kind):
    lock = shmlocks.KINDS[kind].create(name=uniq(f"close-{kind}"))
    name = lock.name
    lock.close()
    assert not shm_exists(name)
    for what, call in _closed_calls(lock).items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what} on a closed lock did not raise")


def _made(what: str, name: str):
    """A fresh object of each sort that has a name, and how to make another by its name."""
    makers = {
        "lock": lambda n: shmlocks.TicketLock.create(n),
        "region": lambda n: shmlocks.Region.create(name=n),
        "table": lambda n: shmlocks.LockTable(4, "futex", name=n),
        "event": lambda n: shmlocks.Event.create(n),
        "rlock": lambda n: shmlocks.RLock.create(name=n),
    }
    return makers[what](name)


@pytest.mark.parametrize("what", ["lock", "region", "table", "event", "rlock"])
def test_unlink_after_close_raises_and_spares_a_new_segment_of_the_name(what):
    """After close(), unlink() raises ValueError, as any call: it once removed whatever
    segment had the name by then (another program's, made since), which a name never
    stands for twice."""
    name = uniq(f"unlink-closed-{what}")
    old = _made(what, name)
    old.close()
    assert not shm_exists(name)
    new = _made(what, name)
    try:
        with pytest.raises(ValueError):
            old.unlink()
        assert shm_exists(name), "the closed object's unlink removed the new segment's name"
    finally:
        new.close()
    assert not shm_exists(name)
    with pytest.raises(ValueError):  # and with no segment of that name: ValueError still
        old.unlink()


def test_a_closed_lock_tables_methods_raise_value_error():
    t = shmlocks.LockTable(8, "robust", name=uniq("closed-table"))
    t.close()
    for what, call in {
        "index_of": lambda: t.index_of("k"),
        "lock_for": lambda: t.lock_for("k"),
        "getitem": lambda: t[0],
        "iter": lambda: list(t),
        "hold": lambda: t.hold("k"),
        "stats": t.stats,
        "unlink": t.unlink,
    }.items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what} on a closed table did not raise")


def test_a_table_size_that_is_no_int_is_a_value_error_and_a_type_error():
    for bad in (1.5, "4", None, True):
        with pytest.raises(ValueError):
            shmlocks.LockTable(bad, "futex")
        with pytest.raises(TypeError):
            shmlocks.LockTable(bad, "futex")
    for bad in (0, -3):
        with pytest.raises(ValueError):
            shmlocks.LockTable(bad, "futex")


def test_rlock_of_an_unknown_kind_is_a_value_error():
    with pytest.raises(ValueError, match="unknown lock kind 'bogus'"):
        shmlocks.RLock(kind="bogus")


def test_region_close_then_any_call_raises_value_error():
    region = shmlocks.Region.create(name=uniq("close-region"))
    region.create_lock("x", "ticket")
    name = region.name
    region.close()
    assert not shm_exists(name)
    for call in (
        region.lock_names,
        lambda: region.create_lock("y", "mcs"),
        lambda: region.open_lock("x"),
    ):
        with pytest.raises(ValueError):
            call()


def test_locks_of_a_closed_region_raise_value_error(kind):
    region = shmlocks.Region.create(name=uniq(f"closed-region-{kind}"))
    lock = region.create_lock("a", kind)
    region.close()
    for what, call in _closed_calls(lock).items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what} on a lock of a closed region did not raise")


def test_close_of_opened_view_keeps_name_and_creator_working(new_lock, kind):
    lock = new_lock(kind)
    view = shmlocks.KINDS[kind].open(lock.name)
    view.close()
    assert shm_exists(lock.name)
    with pytest.raises(ValueError):
        view.acquire()
    assert lock.acquire(timeout=1) is True
    lock.release()


def _race_create(name, idx, n, barrier, results):
    region = shmlocks.Region.open(name)
    kinds = list(shmlocks.KINDS)
    barrier.wait(20)
    for i in range(n):
        region.create_lock(f"p{idx}-{i}", kinds[i % len(kinds)])
    try:
        region.create_lock("shared", kinds[idx % len(kinds)])
        results[idx] = 1
    except FileExistsError:
        results[idx] = 0
    region.close()


def test_concurrent_create_lock_from_many_processes(procs, new_region):
    nprocs, n = 4, 6
    region = new_region(max_locks=nprocs * n + 1)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(nprocs)
    results = ctx.Array("i", [-1] * nprocs, lock=False)
    workers = [
        procs.start(_race_create, region.name, i, n, barrier, results, ctx=ctx)
        for i in range(nprocs)
    ]
    for p in workers:
        p.join(20)
    assert [p.exitcode for p in workers] == [0] * nprocs
    assert sorted(results) == [0] * (nprocs - 1) + [1], "exactly one create of 'shared' wins"
    expected = {f"p{i}-{j}" for i in range(nprocs) for j in range(n)} | {"shared"}
    assert sorted(region.lock_names()) == sorted(expected)
    kinds = list(shmlocks.KINDS)
    for i in range(nprocs):
        for j in range(n):
            assert region.open_lock(f"p{i}-{j}").kind == kinds[j % len(kinds)]
    with pytest.raises(shmlocks.CapacityError):
        region.create_lock("one-too-many", "ticket")


def test_unicode_lock_names(new_region):
    region = new_region()
    names = ["ключ", "锁", "naïve-ß", "emoji-\N{LOCK}"]
    for i, n in enumerate(names):
        region.create_lock(n, list(shmlocks.KINDS)[i])
    assert sorted(region.lock_names()) == sorted(names)
    for n in names:
        lk = region.open_lock(n)
        with lk:
            assert lk.locked() is True
        assert lk.locked() is False


def test_closed_lock_does_not_pickle(kind):
    lock = shmlocks.KINDS[kind].create(name=uniq(f"pickle-{kind}"))
    lock.close()
    with pytest.raises(ValueError):
        pickle.dumps(lock)
