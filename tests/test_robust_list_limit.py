"""A thread's robust list stays within what the kernel walks at its death.

Each region a thread uses keeps one liveness token locked on the thread's glibc robust
list; the kernel walks at most 2,048 entries of it (ROBUST_LIST_LIMIT), newest first, so
past that the oldest tokens are never marked OWNER_DIED and a SIGKILLed holder looked alive
forever. A thread now takes part in at most 1,024 regions at once (CapacityError past
that), and tokens of regions closed in its process are given back.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from support.common import join_thread, uniq

import shmlocks

LIMIT = 1024  # participants.pxd REGIONS_PER_THREAD


@pytest.fixture
def many_locks():
    made: list = []

    def make(n: int, kind: str = "futex"):
        base = uniq("rl")
        cls = shmlocks.KINDS[kind]
        for i in range(n):
            made.append(cls.create(f"{base}-{i}", max_participants=2))
        return made[-n:]

    yield make
    for lk in made:
        try:
            lk.close()
        except Exception:
            pass


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["futex", "mcs"])
def test_holder_of_the_oldest_region_is_recovered_after_2100_regions(many_locks, kind):
    """a6_robust_list_limit.py: a thread that touched 2,100 regions, SIGKILLed holding the
    first one. Before: acquire(timeout=3) -> False, the dead holder shown alive. Now the
    1,025th registration is refused, and the death is seen."""
    locks = many_locks(2100, kind)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            n = 0
            refused = b"-"
            for lk in locks:  # register in every region, oldest first
                try:
                    lk.acquire()
                except shmlocks.CapacityError:
                    refused = b"C"
                    break
                lk.release()
                n += 1
            locks[0].acquire()  # the token deepest in the robust list
            os.write(w, refused + str(n).encode())
            time.sleep(1000)
        finally:
            os._exit(1)
    os.close(w)
    msg = os.read(r, 64).decode()
    os.close(r)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert locks[0].acquire(timeout=10), "the SIGKILLed holder of lock 0 is never recovered"
    assert locks[0].owner_died
    locks[0].mark_consistent()
    locks[0].release()
    assert msg == f"C{LIMIT}", msg


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_closing_regions_gives_their_tokens_back(many_locks):
    """A thread's count is of regions still open: closing (by the thread itself, or by
    another thread of the process) gives the tokens back, so a long-lived worker that uses
    short-lived regions never reaches the limit."""
    first = many_locks(LIMIT)
    errors: list[BaseException] = []
    go = threading.Event()
    done = threading.Event()

    def worker():
        try:
            for lk in first:
                with lk:
                    pass
            done.set()
            go.wait(60)
            for lk in second:  # the first batch was closed by the main thread
                with lk:
                    pass
            with third[0]:  # and this one closed by this thread itself
                pass
            third[0].close()
            with third[1]:
                pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    second = many_locks(LIMIT - 1)
    third = many_locks(2)
    t = threading.Thread(target=worker)
    t.start()
    assert done.wait(120)
    with pytest.raises(shmlocks.CapacityError):  # this thread: the limit holds here too
        for lk in first + [third[1]]:
            with lk:
                pass
    for lk in first:
        lk.close()
    go.set()
    join_thread(t, 120)  # (its regions' names go when its exit gives them back)
    assert not errors, errors
