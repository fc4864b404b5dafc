"""Testing your own recovery: shmlocks.crashpoint() and shmlocks.testing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from threading import Lock as threading_lock

import pytest

import shmlocks
from shmlocks.testing import kill_while_holding

pytestmark = pytest.mark.timeout(60)


def test_crashpoint_unarmed_does_nothing_and_refuses_library_names():
    for _ in range(3):
        assert shmlocks.crashpoint("app.step") is None
    for bad in ("lock.acquire.got", "clh.anything", "recover.locked"):
        with pytest.raises(ValueError):
            shmlocks.crashpoint(bad)
    with pytest.raises(TypeError):
        shmlocks.crashpoint(3)
    for never in ("", "a:b", "step:3"):  # SHMLOCKS_CRASHPOINT could not name them
        with pytest.raises(ValueError):
            shmlocks.crashpoint(never)


@pytest.mark.parametrize(("spec", "dies_after"), [("app.step", 0), ("app.step:3", 2)])
def test_crashpoint_armed_kills_at_the_nth_pass(spec, dies_after):
    code = (
        "import shmlocks\n"
        "for i in range(5):\n"
        "    shmlocks.crashpoint('app.other')\n"
        "    shmlocks.crashpoint('app.step')\n"
        "    print(i, flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SHMLOCKS_CRASHPOINT": spec},
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.split() == [str(i) for i in range(dies_after)]


def _debit_then_credit(lock, accounts, amount):
    with lock:
        accounts[0] -= amount
        shmlocks.crashpoint("transfer.debited")
        accounts[1] += amount


def _hold_briefly(lock):
    with lock:
        pass


def _no_lock():
    pass


@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_kill_while_holding_at_a_user_point(new_lock, kind):
    import multiprocessing as mp

    lock = new_lock(kind)
    accounts = mp.get_context("fork").RawArray("q", [100, 0])
    pid = kill_while_holding(lock, _debit_then_credit, lock, accounts, 10, at="transfer.debited")
    assert pid > 0
    assert list(accounts) == [90, 0], "killed between the debit and the credit"
    assert lock.acquire(timeout=5)
    try:
        assert lock.owner_died
        accounts[1] = 100 - accounts[0]  # the repair
        lock.mark_consistent()
    finally:
        lock.release()
    assert sum(accounts) == 100


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_kill_while_holding_as_soon_as_it_holds(new_lock, method):
    lock = new_lock("mcs")
    kill_while_holding(lock, _hold_briefly, lock, start_method=method, timeout=30)
    assert lock.acquire(timeout=5)
    assert lock.owner_died
    lock.mark_consistent()
    lock.release()


def _take_another_first(other, lock):
    with other:
        pass
    with lock:
        time.sleep(30)


def test_kill_while_holding_waits_for_a_hold_of_its_lock(new_lock):
    """Without `at`, the child dies holding `lock`: not at its hold of another lock
    first (it did: it died holding `other`, and `lock` was never taken)."""
    lock, other = new_lock("futex"), new_lock("mcs")
    kill_while_holding(lock, _take_another_first, other, lock)
    assert not other.locked(), "the child died holding the other lock"
    assert lock.acquire(timeout=5)
    try:
        assert lock.owner_died
        lock.mark_consistent()
    finally:
        lock.release()


def test_kill_while_holding_errors(new_lock):
    lock = new_lock("futex")
    with pytest.raises(RuntimeError):
        kill_while_holding(lock, _no_lock)  # never takes the lock: exits on its own
    with pytest.raises(ValueError):
        kill_while_holding(lock, _no_lock, at="lock.acquire.got")
    with pytest.raises(TypeError):
        kill_while_holding(threading_lock(), _no_lock)
    lock.acquire()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            kill_while_holding(lock, _hold_briefly, lock, timeout=0.5)  # it blocks behind us
        assert time.monotonic() - t0 < 10
    finally:
        lock.release()
