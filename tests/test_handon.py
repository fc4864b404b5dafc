"""A with block left by an exception during repair hands owner_died on; a lock made
unrecoverable can be brought back (issue 28, item 13).

Before: an exception raised inside ``with lock:`` while ``owner_died`` was set released
without mark_consistent(), which made the lock unusable forever, in every process, with
no way back short of a new segment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from support import uniq

import shmlocks
from shmlocks.testing import kill_while_holding


class RepairFailed(Exception):
    pass


def _take(lock) -> None:
    lock.acquire()


def _died_holder(kind: str):
    lock = shmlocks.KINDS[kind].create(uniq(f"handon-{kind}"), max_participants=8)
    kill_while_holding(lock, _take, lock, start_method="fork")
    return lock


NEXT_HOLDER = r"""
import sys, shmlocks
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
try:
    got = lock.acquire(timeout=10)
except shmlocks.LockNotRecoverableError:
    print("not-recoverable")
else:
    print(got, lock.owner_died)
    if sys.argv[3] == "repair":
        lock.mark_consistent()
    lock.release()
"""


def _next_holder(lock, repair: bool) -> str:
    """Another process acquires: what it saw (and repairs, or releases inconsistent)."""
    out = subprocess.run(
        [sys.executable, "-c", NEXT_HOLDER, lock.kind, lock.name, "repair" if repair else "-"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.timeout(60)
def test_with_block_raising_during_repair_hands_owner_died_on(kind):
    lock = _died_holder(kind)
    try:
        with pytest.raises(RepairFailed):
            with lock:
                assert lock.owner_died
                raise RepairFailed("the repair failed half way")
        assert not lock.locked()
        assert _next_holder(lock, repair=True) == "True True"  # usable, still owner_died
        assert _next_holder(lock, repair=False) == "True False"  # repaired: a clean hold
        assert lock.stats()["owner_deaths"] == 2
    finally:
        lock.close()


@pytest.mark.timeout(60)
def test_bare_release_still_makes_it_unrecoverable_and_clear_brings_it_back(kind):
    lock = _died_holder(kind)
    try:
        assert lock.clear_not_recoverable() is False  # usable: nothing to do
        assert lock.acquire(timeout=5) and lock.owner_died
        lock.release()  # without mark_consistent(): the documented meaning
        assert _next_holder(lock, repair=True) == "not-recoverable"
        with pytest.raises(shmlocks.LockNotRecoverableError) as e:
            lock.acquire(timeout=1)
        assert "until clear_not_recoverable() is called" in str(e.value)  # the way back
        assert "permanently" not in str(e.value)
        # any process may bring it back: here another object of the lock
        other = type(lock).open(lock.name)
        try:
            assert other.clear_not_recoverable() is True
            assert other.clear_not_recoverable() is False  # once
        finally:
            other.close()
        assert _next_holder(lock, repair=True) == "True True"  # owner_died: repair first
        assert _next_holder(lock, repair=False) == "True False"
        assert not lock._describe()["not_recoverable"]
    finally:
        lock.close()


DIE_HANDING_ON = r"""
import sys, shmlocks
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
try:
    with lock:
        assert lock.owner_died
        raise RuntimeError("repair failed")
except RuntimeError:
    pass
print("released")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "point", ["lock.release.releasing", "lock.release.unholder", "lock.release.unlocked"]
)
def test_death_while_handing_owner_died_on(kind, point):
    """A holder killed inside the release that hands owner_died on: the next holder gets
    the lock with owner_died (what that release meant to leave), never a lock made
    unrecoverable by a release that did not happen."""
    lock = _died_holder(kind)
    try:
        out = subprocess.run(
            [sys.executable, "-c", DIE_HANDING_ON, kind, lock.name],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "SHMLOCKS_CRASHPOINT": point},
        )
        assert out.returncode == -signal.SIGKILL, (out.returncode, out.stdout, out.stderr)
        assert _next_holder(lock, repair=True) == "True True"
        assert _next_holder(lock, repair=False) == "True False"
    finally:
        lock.close()


@pytest.mark.timeout(30)
def test_with_block_raising_without_owner_died_releases_normally(kind, new_lock):
    lock = new_lock(kind)
    with pytest.raises(RepairFailed):
        with lock:
            raise RepairFailed()
    assert lock.acquire(timeout=5) and not lock.owner_died
    lock.release()
