"""threading.Condition(lock) works with every kind, as it does with threading.Lock.

Condition probes ownership with ``_is_owned()`` (or, without it, a non-blocking acquire that
must return False for the holder), releases the lock around each wait and re-acquires it
after. These tests drive every Condition method across threads of one process while a
child process keeps using the same lock, and check exact counts.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
from support import KINDS

from shmlocks._harness import Exclusion, words

pytestmark = pytest.mark.timeout(60)


def test_is_owned_and_try_acquire_by_holder(new_lock, kind):
    lock = new_lock(kind)
    assert lock._is_owned() is False
    with lock:
        assert lock._is_owned() is True
        assert lock.acquire(False) is False  # threading.Lock's answer for its holder
        seen = []
        t = threading.Thread(target=lambda: seen.append(lock._is_owned()))
        t.start()
        t.join()
        assert seen == [False], "another thread must not be told it owns the lock"
    assert lock._is_owned() is False


def test_wait_without_the_lock_raises(new_lock, kind):
    cond = threading.Condition(new_lock(kind))
    with pytest.raises(RuntimeError):
        cond.wait(0.01)
    with pytest.raises(RuntimeError):
        cond.notify()


def test_wait_timeout_returns_false_and_reacquires(new_lock, kind):
    lock = new_lock(kind)
    cond = threading.Condition(lock)
    with cond:
        t0 = time.monotonic()
        assert cond.wait(0.05) is False
        assert time.monotonic() - t0 >= 0.04
        assert lock._is_owned(), "wait() must return with the lock held"
        assert cond.wait_for(lambda: False, timeout=0.02) is False
        assert lock._is_owned()
    assert not lock.locked()


def _hammer(lock, ex, n):
    ex.loop(lock.acquire, lock.release, 1, n)


@pytest.mark.parametrize("kind", KINDS)
def test_producer_consumer_beside_another_process(new_lock, kind):
    """Two consumer threads wait on a Condition over the lock; a producer thread notifies
    one item at a time, then notify_all() at the end. Meanwhile a forked process takes the
    same lock 20,000 times. Every item is consumed exactly once, and the exclusion checker
    (its sections run by the child and, under the condition, by the consumers) is exact."""
    lock = new_lock(kind)
    cond = threading.Condition(lock)
    ex = Exclusion(mp.get_context("fork").RawArray("q", words(3)), participants=3)
    child = mp.get_context("fork").Process(target=_hammer, args=(lock, ex, 20_000))
    child.start()
    items: list[int] = []
    consumed: list[int] = []
    done = [False]
    n_items = 300

    def consumer(who):
        with cond:
            while True:
                cond.wait_for(lambda: items or done[0], timeout=5)
                if items:
                    ex.section(who)
                    consumed.append(items.pop(0))
                elif done[0]:
                    return

    consumers = [threading.Thread(target=consumer, args=(2 + i,)) for i in range(2)]
    for t in consumers:
        t.start()
    for i in range(n_items):
        with cond:
            items.append(i)
            cond.notify()
    with cond:
        done[0] = True
        cond.notify_all()
    for t in consumers:
        t.join(30)
        assert not t.is_alive(), "a consumer never woke up"
    child.join(30)
    assert child.exitcode == 0
    assert sorted(consumed) == list(range(n_items))
    books = ex.report()
    assert books.ok and books.total == 20_000 + n_items, books
    assert not lock.locked()
