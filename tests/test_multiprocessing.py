"""Locks and regions travel to other processes: Process args under every start method,
Pool initializers, queues; forked children keep using what they inherited and never
believe they hold what their parent holds."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import pytest
from support import KINDS, START_METHODS, Holder, assert_child_excludes, me, outcome, thread_holding

from shmlocks._harness import Exclusion, words

pytestmark = pytest.mark.timeout(60)


def _use_lock(lock, kind):
    got = lock.acquire(timeout=5)
    owner = lock.owner
    locked = lock.locked()
    lock.release()
    return {
        "type": type(lock).__name__,
        "kind": lock.kind,
        "name": lock.name,
        "got": got,
        "owner_is_me": owner == me(),
        "locked": locked,
        "free_after": not lock.locked(),
    }


def expected_use(lock):
    return {
        "type": type(lock).__name__,
        "kind": lock.kind,
        "name": lock.name,
        "got": True,
        "owner_is_me": True,
        "locked": True,
        "free_after": True,
    }


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("kind", KINDS)
def test_lock_as_process_arg(procs, new_lock, kind, method):
    lock = new_lock(kind)
    assert procs.call(_use_lock, lock, kind, method=method) == expected_use(lock)
    assert_child_excludes(procs, lock, method)  # and it was the same lock


def _use_region(region):
    out = {}
    for name in sorted(region.lock_names()):
        lk = region.open_lock(name)
        out[name] = (lk.kind, lk.acquire(timeout=5), lk.owner == me())
        lk.release()
    return region.name, out


@pytest.mark.parametrize("method", START_METHODS)
def test_region_as_process_arg(procs, new_region, method):
    region = new_region(max_locks=8)
    for kind_name in KINDS:
        region.create_lock(f"L-{kind_name}", kind_name)
    name, seen = procs.call(_use_region, region, method=method)
    assert name == region.name
    assert seen == {f"L-{k}": (k, True, True) for k in KINDS}


_pool_lock = None
_pool_checker = None


def _pool_init(lock, ex):
    global _pool_lock, _pool_checker
    _pool_lock, _pool_checker = lock, ex


def _pool_task(i):
    with _pool_lock:
        owner = _pool_lock.owner
        _pool_checker.section(1 + i % 2, widen=True)
    return os.getpid(), owner == me(), i


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("kind", ["ticket", "clh", "robust"])
def test_pool_initializer(new_lock, kind, method):
    lock = new_lock(kind)
    ctx = mp.get_context(method)
    ex = Exclusion(ctx.RawArray("q", words(2)), participants=2)
    ntasks = 40
    with ctx.Pool(2, initializer=_pool_init, initargs=(lock, ex)) as pool:
        results = pool.map(_pool_task, range(ntasks), chunksize=1)
        pool.close()
        pool.join()
    books = ex.report()
    assert books.ok and books.total == ntasks, books
    assert sorted(i for _, _, i in results) == list(range(ntasks))
    assert all(ok for _, ok, _ in results), "owner inside a pool task was not the task's thread"
    assert os.getpid() not in {pid for pid, _, _ in results}
    assert lock.locked() is False


def _from_queue(q):
    lock = q.get(timeout=20)
    return _use_lock(lock, lock.kind)


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("kind", ["mcs", "futex", "pi"])
def test_lock_through_queue(procs, new_lock, kind, method):
    lock = new_lock(kind)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    q.put(lock)
    try:
        assert procs.call(_from_queue, q, method=method) == expected_use(lock)
    finally:
        q.close()
        q.join_thread()


def test_pickle_round_trip_in_process(new_lock, new_region, kind):
    lock = new_lock(kind)
    clone = pickle.loads(pickle.dumps(lock))
    try:
        assert type(clone) is type(lock)
        assert clone.name == lock.name
        with lock:
            assert clone.locked() is True
            assert clone.owner == me()
    finally:
        clone.close()
    region = new_region()
    region.create_lock("x", kind)
    rclone = pickle.loads(pickle.dumps(region))
    try:
        assert rclone.name == region.name
        assert rclone.lock_names() == ["x"]
    finally:
        rclone.close()
    assert lock.acquire(timeout=1)  # closing the clones left the originals working
    lock.release()


_inherited = None


def _use_inherited():
    return _use_lock(_inherited, _inherited.kind)


def test_forked_child_uses_inherited_object(procs, new_lock, kind):
    global _inherited
    lock = new_lock(kind)
    _inherited = lock
    try:
        assert procs.call(_use_inherited, method="fork") == expected_use(lock)
        # the parent's view and the child's inherited view are one lock
        holder = Holder(procs, lock, method="fork")  # fork: the child inherits, no pickling
        try:
            assert lock.acquire(False) is False
            assert lock.owner == holder.owner
        finally:
            holder.release()
    finally:
        _inherited = None
    with lock:
        assert lock.owner == me()


def _child_view_of_parents_hold(lock, parent_owner):
    return {
        "locked": lock.locked(),
        "owner_is_parent": lock.owner == tuple(parent_owner),
        "owner_is_me": lock.owner == me(),
        "release": outcome(lock.release),
        "try": outcome(lock.acquire, False),
        "timed": outcome(lock.acquire, True, 0.2),
        "still_parent": lock.owner == tuple(parent_owner),
    }


@pytest.mark.parametrize("method", START_METHODS)
@pytest.mark.parametrize("kind", KINDS)
def test_child_never_holds_what_parent_holds(procs, new_lock, kind, method):
    lock = new_lock(kind)
    assert lock.acquire()
    try:
        seen = procs.call(_child_view_of_parents_hold, lock, me(), method=method)
        assert seen == {
            "locked": True,
            "owner_is_parent": True,
            "owner_is_me": False,
            "release": "NotOwnerError",
            "try": ("ok", False),
            "timed": ("ok", False),
            "still_parent": True,
        }
        assert lock.owner == me()
    finally:
        lock.release()
    assert procs.call(_use_lock, lock, kind, method=method)["got"] is True


def test_forked_child_of_a_thread_holder(procs, new_lock, kind):
    """Fork while another thread of the parent holds: the child holds nothing either."""
    lock = new_lock(kind)
    with thread_holding(lock) as other:
        seen = procs.call(_child_view_of_parents_hold, lock, other, method="fork")
        assert seen["locked"] is True and seen["owner_is_parent"] is True
        assert seen["release"] == "NotOwnerError"
        assert seen["try"] == ("ok", False)
        assert seen["timed"] == ("ok", False)
    assert lock.locked() is False
