"""``shmlocks stat``: the counters of a segment's locks as a table and as JSON; bad input."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import struct
import threading
import time

import pytest
from support import Holder, kill, shm_path, uniq, until
from test_cli import cli, lock_line
from test_stats import KEYS

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


# ------------------------------------------------------------------ RWLock: two rows


def _rw_hold(rw, side, n, ready, go):
    """In a child: take ``n`` reads (or the write), say so, hold until ``go``, release."""
    for _ in range(n):
        assert rw.acquire_write(timeout=30) if side == "write" else rw.acquire_read(timeout=30)
    ready.set()
    assert go.wait(30)
    for _ in range(n):
        rw.release_write() if side == "write" else rw.release_read()


def _rw_try(rw, side):
    return rw.acquire_write(timeout=0.01) if side == "write" else rw.acquire_read(timeout=0.01)


class _Child:
    def __init__(self, procs, rw, side, n=1, wait=True):
        ctx = mp.get_context("fork")
        self.ready, self.go = ctx.Event(), ctx.Event()
        self.proc = procs.start(_rw_hold, rw, side, n, self.ready, self.go)
        if wait:
            assert self.ready.wait(20)

    def end(self):
        self.go.set()
        self.proc.join(20)
        assert self.proc.exitcode == 0


def _stat(name):
    proc = cli("stat", name, "--json")
    assert proc.returncode == 0, proc.stderr
    by = {lk["name"]: lk for lk in json.loads(proc.stdout)["locks"]}
    proc = cli("stat", name)
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for ln in proc.stdout.splitlines()[1:]:
        m = re.match(r"\s*(\S+)\s+(rwlock \((?:write|read)\)|\S+)\s+(.*)$", ln)
        if m and m.group(1) != "LOCK":
            rows[(m.group(1), m.group(2))] = m.group(3)
    return by, rows


def _holder_and_waiters(rest: str) -> tuple[str, int]:
    """The HOLDER and WAITERS columns at the end of a row's text after its KIND."""
    cols = re.split(r"\s{2,}", rest.strip())
    return cols[-2], int(cols[-1])


def test_stat_shows_an_rwlock_reads_and_writes(new_region, procs):
    """An RWLock in stat --json and the table: the write side as a lock's (the writer as
    holder, the writers waiting), and its reads (``reads``: exact counts, the wait of the
    reads that waited, timeouts, the readers as a set of holders in other processes, a
    dead one called out, the readers waiting); no RWLock row says "held", and a lock's
    JSON keeps exactly its keys."""
    region = new_region(max_locks=4, max_participants=16)
    rw = region.create_rwlock("table")
    jobs = region.create_lock("jobs", "mcs")
    with jobs:
        pass
    lock_keys = {"name", "kind", "locked", "holder", "waiters", *KEYS}
    # reads that waited (two threads of ours behind our write), a read and a write timeout
    rw.acquire_write()
    assert procs.call(_rw_try, rw, "read") is False
    ts = [threading.Thread(target=lambda: (rw.acquire_read(), rw.release_read())) for _ in "ab"]
    for t in ts:
        t.start()
    until(lambda: rw._describe()["waiters"] == 2, what="the readers to wait")
    time.sleep(0.1)
    rw.release_write()
    for t in ts:
        t.join(20)
    # readers in two other processes (one nesting two reads); a writer times out on them
    r1 = _Child(procs, rw, "read", 2)
    r2 = _Child(procs, rw, "read", 1)
    assert procs.call(_rw_try, rw, "write") is False
    by, rows = _stat(region.name)
    assert set(by["jobs"]) == lock_keys and by["jobs"]["acquisitions"] == 1
    t = by["table"]
    assert set(t) == lock_keys | {"reads"} and t["kind"] == "rwlock"
    assert (t["acquisitions"], t["contended"], t["timeouts"]) == (1, 0, 1), t
    assert (t["holder"], t["waiters"]) == (None, 0), t
    rd = t["reads"]
    assert (rd["acquisitions"], rd["contended"], rd["timeouts"]) == (5, 2, 1), rd
    assert 0.2 <= rd["wait_total_s"] < 20 and 0.1 <= rd["wait_max_s"] <= rd["wait_total_s"]
    assert (rd["holders"], rd["waiters"]) == (2, 0), rd
    readers = {r["pid"]: r for r in rd["readers"]}
    assert set(readers) == {r1.proc.pid, r2.proc.pid}, rd
    assert [readers[p.proc.pid]["holds"] for p in (r1, r2)] == [2, 1]
    assert all(r["alive"] and r["tid"] == r["pid"] for r in rd["readers"]), rd
    assert set(rd["readers"][0]) >= {"slot", "pid", "tid", "alive", "holds"}
    assert _holder_and_waiters(rows[("table", "rwlock (write)")]) == ("-", 0)
    assert _holder_and_waiters(rows[("table", "rwlock (read)")]) == ("2 readers (2 pids)", 0)
    assert rows[("table", "rwlock (read)")].split()[:3] == ["5", "2", "(40.0%)"], rows
    assert rows[("table", "rwlock (write)")].split()[:3] == ["1", "0", "(0.0%)"], rows
    # a reader killed holding (nobody waits to recover it yet): called out
    kill(r2.proc)
    by, rows = _stat(region.name)
    alive = {r["pid"]: r["alive"] for r in by["table"]["reads"]["readers"]}
    assert alive == {r1.proc.pid: True, r2.proc.pid: False}, by["table"]
    read_row = rows[("table", "rwlock (read)")]
    assert _holder_and_waiters(read_row) == ("2 readers (2 pids), 1 DEAD", 0), read_row
    # a writer waits (for r1; r2's share it takes back), then a reader waits behind it
    w = _Child(procs, rw, "write", wait=False)
    until(lambda: rw._describe()["waiters"] == 1, what="the writer to wait")
    r3 = _Child(procs, rw, "read", wait=False)
    until(lambda: rw._describe()["waiters"] == 2, what="the reader to wait")
    by, rows = _stat(region.name)
    t = by["table"]
    assert (t["holder"], t["waiters"], t["reads"]["waiters"]) == (None, 1, 1), t
    assert [r["pid"] for r in t["reads"]["readers"]] == [r1.proc.pid], t
    assert _holder_and_waiters(rows[("table", "rwlock (write)")]) == ("-", 1)
    read_row = rows[("table", "rwlock (read)")]
    assert _holder_and_waiters(read_row) == (f"pid {r1.proc.pid} alive", 1), read_row
    # the last reader leaves: the writer holds, the reader still waits
    r1.end()
    assert w.ready.wait(20)
    by, rows = _stat(region.name)
    t = by["table"]
    assert t["holder"]["pid"] == w.proc.pid and t["holder"]["alive"], t
    assert (t["waiters"], t["reads"]["holders"], t["reads"]["waiters"]) == (0, 0, 1), t
    write_row = rows[("table", "rwlock (write)")]
    assert _holder_and_waiters(write_row) == (f"pid {w.proc.pid} alive", 0), write_row
    assert _holder_and_waiters(rows[("table", "rwlock (read)")]) == ("-", 1)
    assert "held" not in "".join(rows.values()), rows
    w.end()
    assert r3.ready.wait(20)
    r3.end()
    by, _ = _stat(region.name)
    t = by["table"]
    assert (t["acquisitions"], t["contended"], t["timeouts"]) == (2, 1, 1), t
    rd = t["reads"]
    assert (rd["acquisitions"], rd["contended"], rd["timeouts"]) == (6, 3, 1), rd
    assert (rd["holders"], rd["waiters"], t["locked"]) == (0, 0, False), t
