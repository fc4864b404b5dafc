"""``shmlocks stat``: the counters of a segment's locks as a table and as JSON; bad input."""

from __future__ import annotations

import json
import os
import struct

import pytest
from support import Holder, shm_path, uniq
from test_cli import cli, lock_line

pytestmark = pytest.mark.timeout(60)


def _time_out_once(lock):
    return lock.acquire(timeout=0.01)


def test_stat_json_and_table_show_exact_counts(new_region, procs):
    region = new_region(max_locks=4)
    jobs = region.create_lock("jobs", "mcs")
    region.create_lock("idle", "futex")
    for _ in range(5):
        with jobs:
            pass
    with jobs:
        assert procs.call(_time_out_once, jobs) is False
    proc = cli("stat", region.name, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["name"] == region.name
    by = {lk["name"]: lk for lk in d["locks"]}
    assert list(by) == ["jobs", "idle"]
    assert (by["jobs"]["acquisitions"], by["jobs"]["timeouts"]) == (6, 1)
    assert (by["jobs"]["contended"], by["jobs"]["handoffs"], by["jobs"]["kind"]) == (0, 0, "mcs")
    assert by["idle"]["acquisitions"] == 0 and by["idle"]["holder"] is None
    proc = cli("stat", "/" + region.name)
    assert proc.returncode == 0, proc.stderr
    assert f"segment {region.name}: 2 locks" in proc.stdout
    row = lock_line(proc.stdout, "jobs").split()
    assert row[:4] == ["jobs", "mcs", "6", "0"], row


def test_stat_shows_a_dead_holder(new_lock, procs):
    lock = new_lock("ticket")
    holder = Holder(procs, lock)
    holder.kill()
    proc = cli("stat", lock.name)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("\n", 1)[1]  # below the "segment ...: 1 lock" line
    assert f"pid {holder.pid} DEAD" in lock_line(table, "lock")


@pytest.mark.parametrize("name", ["shmlt-no-such-segment-stat", "a/b", ""])
def test_stat_bad_names_fail_in_one_line(name):
    proc = cli("stat", name)
    assert proc.returncode == 1
    assert proc.stderr.startswith("shmlocks: error:") and len(proc.stderr.splitlines()) == 1


def test_stat_refuses_a_foreign_segment():
    name = uniq("foreign")
    with open(shm_path(name), "wb") as f:
        f.write(b"not a region at all" * 100)
    try:
        proc = cli("stat", name)
    finally:
        os.unlink(shm_path(name))
    assert proc.returncode == 1 and "not a shmlocks segment" in proc.stderr


def test_stat_shows_scribbled_counters_as_numbers(new_lock):
    lock = new_lock("clh")
    with open(shm_path(lock.name), "r+b") as f:
        locks_off = struct.unpack_from("<Q", f.read(128), 48)[0]
        f.seek(locks_off + 16)
        f.write(struct.pack("<QQQ", 2**64 - 1, 2**63 + 5, 3))
    proc = cli("stat", lock.name, "--json")
    assert proc.returncode == 0, proc.stderr
    (lk,) = json.loads(proc.stdout)["locks"]
    assert (lk["acquisitions"], lk["handoffs"], lk["contended"]) == (2**64 - 1, 2**63 + 5, 3)
    proc = cli("stat", lock.name)
    assert proc.returncode == 0 and str(2**64 - 1) in proc.stdout, proc.stderr
