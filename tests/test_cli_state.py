"""``inspect``, ``stat`` and ``top`` show a lock as the next acquire would find it.

A thread SIGKILLed inside acquire or release leaves the lock words set with no holder
record; the next acquire completes the dead thread's step and gets the lock at once,
without owner_died (user-recovered kinds), so the commands must say "free", not "held"
with holder "-". A thread killed in its critical section is a dead holder: the next
acquire sees owner_died, and the commands say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import USERSPACE_KINDS

import shmlocks

pytestmark = pytest.mark.timeout(90)

_DIE = (
    "import shmlocks, sys\n"
    "lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
    "lock.acquire()\n"
    "lock.release()\n"
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shmlocks", *args], capture_output=True, text=True, timeout=30
    )


def _cli_json(*args: str):
    p = _cli(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _die_at(kind: str, name: str, crashpoint: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _DIE, kind, name],
        env=dict(os.environ, SHMLOCKS_CRASHPOINT=crashpoint),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == -9, r.stderr


def _views(name: str) -> list[dict]:
    """The lock's record in inspect, stat and top (all --json)."""
    (ins,) = _cli_json("inspect", name)["locks"]
    (st,) = _cli_json("stat", name)["locks"]
    (tp,) = _cli_json("top", name, "--interval", "0.05")["locks"]
    return [ins, st, tp]


def _assert_held_by_a_dead_thread(lock) -> None:
    """inspect, stat and top show the lock held by a thread that is not alive, and the next
    acquire gets it with owner_died."""
    for view in _views(lock.name):
        assert view["locked"] is True, view
        assert view["holder"] is not None and view["holder"]["alive"] is False, view
    assert lock.acquire(timeout=2)
    assert lock.owner_died
    lock.mark_consistent()
    lock.release()


@pytest.mark.parametrize("kind", USERSPACE_KINDS)
@pytest.mark.parametrize("crashpoint", ["lock.acquire.got", "lock.release.unholder"])
def test_a_lock_left_by_a_thread_dead_inside_a_step_shows_free(new_lock, kind, crashpoint):
    lock = new_lock(kind)
    _die_at(kind, lock.name, crashpoint)
    assert lock.locked(), "the words still say held: the case under test"
    for view in _views(lock.name):
        assert view["locked"] is False, view
        assert view["holder"] is None, view
    text = _cli("inspect", lock.name).stdout
    row = next(ln.split() for ln in text.splitlines() if ln.split()[1:2] == [kind])
    assert row[2] == "free" and "stale-step" in row[-1], text
    assert "held" not in text.split("participants:")[0], text
    # and that is what an acquire finds: the lock at once, no owner_died
    assert lock.acquire(timeout=2)
    assert not lock.owner_died
    lock.release()


@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_a_holder_dead_in_its_critical_section_shows_held_by_a_dead_thread(new_lock, kind):
    lock = new_lock(kind)
    _die_at(kind, lock.name, "lock.acquire.done")
    _assert_held_by_a_dead_thread(lock)


@pytest.mark.parametrize("kind", ["robust", "pi"])
def test_a_kernel_kind_dead_before_its_holder_record_shows_the_dead_holder(new_lock, kind):
    """robust/pi: the kernel reports the death (owner_died) even when the holder record
    was never written; the commands name the dead thread rather than "held" and "-"."""
    lock = new_lock(kind)
    _die_at(kind, lock.name, "lock.acquire.got")
    _assert_held_by_a_dead_thread(lock)
