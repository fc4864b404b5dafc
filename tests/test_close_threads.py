"""close() is safe against every other thread of the process.

- A thread making its first call on a lock (registration: it reads /proc with the GIL
  released) while another thread closes the region used to touch the unmapped segment
  (SIGSEGV). The mapping now stays until no thread is inside such a call; a call that
  begins after close() raises ValueError.
- A thread waiting through a view that another thread closes still gets the lock: it can
  release it through the closed object (a hold begun before close() is let go through
  it), so the lock is never left held by a thread that cannot release it.
"""

from __future__ import annotations

import textwrap
import threading
import time

import pytest
from support import run_python, uniq

import shmlocks

pytestmark = pytest.mark.timeout(120)

CLOSE_RACE = textwrap.dedent(
    """
    import faulthandler, random, sys, threading, time
    faulthandler.enable()
    import shmlocks
    kind, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    base = shmlocks.KINDS[kind].create(name)
    outcomes = {"acquired": 0, "closed": 0, "busy": 0}
    for i in range(rounds):
        r = shmlocks.Region.open(name)
        lk = r.open_lock("lock")
        def user():
            try:
                if lk.acquire(False):
                    outcomes["acquired"] += 1
                    lk.release()
                else:
                    outcomes["busy"] += 1
            except ValueError:
                outcomes["closed"] += 1
        t = threading.Thread(target=user)
        t.start()
        time.sleep(random.uniform(0, 0.0002))
        r.close()
        t.join()
    with base:                      # the lock is free and usable after all that
        pass
    base.close()
    print(sum(outcomes.values()), outcomes)
    """
)


@pytest.mark.parametrize("kind", ["mcs", "futex"])
def test_close_while_another_thread_registers(kind):
    for attempt in range(3):
        name = uniq(f"closerace-{kind}")
        proc = run_python(CLOSE_RACE, kind, name, "600", timeout=100)
        assert proc.returncode == 0, (
            f"attempt {attempt}: exit {proc.returncode} (-11 is SIGSEGV)\n{proc.stderr[-1500:]}"
        )
        assert proc.stdout.split()[0] == "600", proc.stdout


@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_close_while_another_thread_waits(new_lock, kind):
    lock = new_lock(kind, max_participants=8)
    view = shmlocks.KINDS[kind].open(lock.name)
    held, let_go = threading.Event(), threading.Event()
    seen = []

    def holder():
        with lock:
            held.set()
            let_go.wait(10)

    def waiter():
        try:
            got = view.acquire(timeout=10)
            seen.append(("acquire", got))
            if got:
                view.release()
                seen.append("released")
        except Exception as e:  # noqa: BLE001 - recorded for the assertion below
            seen.append(f"{type(e).__name__}: {e}")

    th = threading.Thread(target=holder)
    th.start()
    assert held.wait(10)
    tw = threading.Thread(target=waiter)
    tw.start()
    time.sleep(0.3)  # the waiter is queued
    view.close()
    let_go.set()
    th.join(10)
    tw.join(10)
    assert seen == [("acquire", True), "released"], seen
    assert not lock.locked(), "the lock was left held by a thread that cannot release it"
    assert lock.acquire(timeout=2)
    lock.release()
    with pytest.raises(ValueError, match="closed"):
        view.acquire(timeout=0.1)
    with pytest.raises(ValueError, match="closed"):
        view.release()
    with pytest.raises(ValueError, match="closed"):
        view.locked()


@pytest.mark.parametrize("kind", ["ticket", "robust"])
def test_release_through_a_closed_view_needs_a_hold(new_lock, kind):
    """Only the thread that holds the lock may release it through a closed object; anyone
    else gets ValueError, as for every other call on it."""
    lock = new_lock(kind)
    view = shmlocks.KINDS[kind].open(lock.name)
    held, let_go = threading.Event(), threading.Event()
    out = []

    def holder():
        with view:  # the with block ends after the view was closed
            held.set()
            let_go.wait(10)
        out.append("released")

    th = threading.Thread(target=holder)
    th.start()
    assert held.wait(10)
    view.close()
    with pytest.raises(ValueError, match="closed"):
        view.release()  # this thread holds nothing
    assert lock.locked()
    let_go.set()
    th.join(10)
    assert out == ["released"]
    assert not lock.locked()
