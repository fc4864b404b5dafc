"""``shmlocks prune [NAME ...] [--dry-run] [--json]``: remove the segments nobody can be
using (creator gone, no live participant, not open in any process) and keep every other
one, saying why.

Most tests name their segments: a bare ``prune`` would act on everyone's /dev/shm. The
bare form runs in a private tmpfs on /dev/shm (``unshare -m``, root only)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest
from support import Holder, shm_exists, shm_path, shm_remove, uniq
from support.privshm import requires_private_shm, run_private

import shmlocks

pytestmark = pytest.mark.timeout(60)


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shmlocks", *args],
        capture_output=True,
        text=True,
        timeout=30,
        **kwargs,
    )


def _orphan(prefix: str = "stale") -> str:
    """A segment (a region with one lock, used once) whose creator has exited, as a crashed
    or persist=True program leaves it."""
    name = uniq(prefix)
    code = (
        "import shmlocks, sys\n"
        "r = shmlocks.Region.create(sys.argv[1], max_locks=2, persist=True)\n"
        "with r.create_lock('jobs', 'mcs'):\n"
        "    pass\n"
    )
    r = subprocess.run([sys.executable, "-c", code, name], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return name


@pytest.fixture
def orphan():
    made: list[str] = []

    def make(prefix: str = "stale") -> str:
        made.append(_orphan(prefix))
        return made[-1]

    yield make
    for name in made:
        shm_remove(name)


def _prune_json(*args: str) -> dict[str, dict]:
    p = cli("prune", *args, "--json")
    assert p.returncode == 0, p.stderr
    return {r["name"]: r for r in json.loads(p.stdout)}


def test_a_stale_segment_is_removed_and_dry_run_only_says_so(orphan):
    name = orphan()
    (rec,) = _prune_json(name, "--dry-run").values()
    assert rec["action"] == "would remove" and shm_exists(name), rec
    assert rec["creator_state"] == "gone" and rec["live_participants"] == 0
    text = cli("prune", name)
    assert text.returncode == 0, text.stderr
    row = next(ln for ln in text.stdout.splitlines() if ln.startswith(name))
    assert "removed" in row.split(), text.stdout
    assert not shm_exists(name)


def test_ls_points_at_prune_when_a_segment_is_stale(orphan):
    name = orphan()
    p = cli("ls")
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith(name))
    assert row.endswith("(gone)") and "0 alive" in row, row
    note = p.stdout.splitlines()[-1]
    assert note.startswith("note: ") and "`shmlocks prune`" in note, p.stdout


def test_a_segment_whose_creator_lives_is_kept(new_lock):
    lock = new_lock("futex")
    (rec,) = _prune_json(lock.name).values()
    assert rec["action"] == "kept" and "creator" in rec["reason"] and "alive" in rec["reason"]
    assert shm_exists(lock.name)
    with lock:  # and it still works
        pass


def test_a_segment_with_a_live_participant_is_kept(orphan, procs):
    name = orphan()
    lock = shmlocks.Region.open(name).open_lock("jobs")
    holder = Holder(procs, lock)
    try:
        (rec,) = _prune_json(name).values()
        assert rec["action"] == "kept" and rec["reason"] == "1 live participant", rec
        assert shm_exists(name)
    finally:
        holder.release()
        lock.close()


def test_a_segment_a_process_has_open_is_kept(orphan):
    """A process that has the segment open holds a shared flock on it: prune's
    non-blocking exclusive flock on its own descriptor fails, and it keeps the segment."""
    name = orphan()
    fd = os.open(shm_path(name), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        (rec,) = _prune_json(name).values()
        assert rec["action"] == "kept" and rec["reason"] == "open in a process", rec
        assert shm_exists(name)
    finally:
        os.close(fd)
    (rec,) = _prune_json(name).values()
    assert rec["action"] == "removed" and not shm_exists(name)


def test_prune_refuses_a_name_that_is_not_a_shmlocks_segment():
    name = uniq("notours")
    with open(shm_path(name), "wb") as f:
        f.write(b"x" * 100)
    try:
        p = cli("prune", name)
        assert p.returncode == 1 and "not a shmlocks segment" in p.stderr, p.stderr
        assert shm_exists(name)
    finally:
        shm_remove(name)


@requires_private_shm
def test_bare_prune_in_a_private_dev_shm():
    """All of /dev/shm (a private one): only the stale segment goes; a live creator's, a
    held one and a file that is not ours stay."""
    r = run_private(
        f"""
        import json, os, subprocess, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_prune import _orphan, cli
        import shmlocks
        stale = _orphan()
        mine = shmlocks.TicketLock.create(name="mine")
        with open("/dev/shm/not-ours", "wb") as f:
            f.write(b"hello")
        p = cli("prune", "--json")
        assert p.returncode == 0, p.stderr
        got = {{r["name"]: r["action"] for r in json.loads(p.stdout)}}
        print(json.dumps(got)); print(json.dumps(sorted(os.listdir("/dev/shm"))))
        mine.close()
        """
    )
    assert r.returncode == 0, r.stderr
    actions, left = (json.loads(line) for line in r.stdout.splitlines())
    stale = next(n for n in actions if n != "mine")
    assert actions == {stale: "removed", "mine": "kept"}, actions
    assert left == ["mine", "not-ours"], left
