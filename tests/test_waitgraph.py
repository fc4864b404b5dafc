"""The machine-wide wait-for graph (shmlocks.waitgraph): real processes deadlocked across
standalone locks and regions are seen as one cycle; a long wait behind a live holder, a
dead member, a scribbled segment or wait record are not."""

from __future__ import annotations

import os
import struct
import time

import pytest
from support import KINDS, SHM_DIR, kill, uniq

import shmlocks
from shmlocks import waitgraph

PART_LINE1 = 128  # shm_participant: identity and wait record on its second line


def _member(first, second, ready, go, hold_s):
    """Take `first`, say so, then (once told) wait for `second`, bounded."""
    set_timeout = getattr(shmlocks, "set_deadlock_timeout", None)
    if set_timeout is not None:
        set_timeout(None)  # these tests look at the graph; nobody gives up
    first.acquire()
    ready.set()
    go.wait(30)
    if second is not None and second.acquire(timeout=hold_s):
        second.release()
    else:
        time.sleep(hold_s if second is None else 0)
    first.release()


def _start_chain(procs, locks, *, close=True, hold_s=20.0):
    """One process per lock: process i holds locks[i] and waits for locks[i+1] (the
    last for locks[0] when close, else for nothing). Returns the processes, once all
    hold their first lock and were told to go on."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go = ctx.Event()
    ps, evs = [], []
    n = len(locks)
    for i in range(n):
        nxt = locks[(i + 1) % n] if (close or i + 1 < n) else None
        ev = ctx.Event()
        ps.append(procs.start(_member, locks[i], nxt, ev, go, hold_s))
        evs.append(ev)
    for ev in evs:
        assert ev.wait(20), "a member never took its first lock"
    go.set()
    return ps


def _wait_for_cycle(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        g = waitgraph.snapshot()
        for c in g.cycles():
            if {m.thread.pid for m in c} == set(pids):
                return g, c
        if time.monotonic() > deadline:
            raise AssertionError(f"no cycle of {pids}; notes {g.notes[:5]}")
        time.sleep(0.05)


def _waiting(pid, timeout=15.0):
    """The graph once process `pid` publishes a wait."""
    deadline = time.monotonic() + timeout
    while True:
        g = waitgraph.snapshot()
        t = next((t for t in g.threads.values() if t.pid == pid and t.waits), None)
        if t is not None:
            return g, t
        assert time.monotonic() < deadline, f"pid {pid} never published a wait"
        time.sleep(0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_ab_ba_between_two_standalone_locks_is_one_cycle(kind, procs, new_lock):
    a, b = new_lock(kind), new_lock(kind)
    p1, p2 = _start_chain(procs, [a, b])
    g, cycle = _wait_for_cycle([p1.pid, p2.pid])
    assert len(cycle) == 2
    by_pid = {m.thread.pid: m for m in cycle}
    assert (by_pid[p1.pid].held.label, by_pid[p1.pid].awaited.label) == (a.name, b.name)
    assert (by_pid[p2.pid].held.label, by_pid[p2.pid].awaited.label) == (b.name, a.name)
    assert all(m.held.kind == m.awaited.kind == kind for m in cycle)
    assert all(0 < m.thread.waited_s() < 60 for m in cycle)
    text = waitgraph.describe_cycle(cycle)
    assert f"pid {p1.pid} tid {p1.pid} holds {a.name}" in text


@pytest.mark.timeout(60)
def test_three_cycle_across_a_region_and_a_standalone_lock(procs, new_lock, new_region):
    region = new_region(max_locks=4)
    x = region.create_lock("x", "mcs")
    y = region.create_lock("y", "ticket")
    z = new_lock("futex")
    ps = _start_chain(procs, [x, y, z])
    _g, cycle = _wait_for_cycle([p.pid for p in ps])
    labels = {m.thread.pid: (m.held.label, m.awaited.label) for m in cycle}
    assert labels == {
        ps[0].pid: (f"{region.name}/x", f"{region.name}/y"),
        ps[1].pid: (f"{region.name}/y", z.name),
        ps[2].pid: (z.name, f"{region.name}/x"),
    }


@pytest.mark.timeout(60)
def test_a_long_wait_behind_a_live_holder_is_no_cycle(procs, new_lock):
    a, b = new_lock("futex"), new_lock("ticket")
    holder, waiter = _start_chain(procs, [a, b], close=False)
    # holder holds a, waits for b (held by waiter); waiter holds b and waits for nothing
    g, t = _waiting(holder.pid)
    time.sleep(0.3)
    g = waitgraph.snapshot()
    assert not [c for c in g.cycles() if holder.pid in {m.thread.pid for m in c}]
    t = next(t for t in g.threads.values() if t.pid == holder.pid)
    w = next(t for t in g.threads.values() if t.pid == waiter.pid)
    assert t.waits is not None and t.waits.label == b.name and t.waited_s() >= 0.3
    assert [h.label for h in t.holds] == [a.name]
    assert w.waits is None and [h.label for h in w.holds] == [b.name]


@pytest.mark.timeout(60)
def test_a_dead_member_is_never_part_of_a_cycle(procs, new_lock):
    a, b = new_lock("mcs"), new_lock("robust")
    p1, p2 = _start_chain(procs, [a, b])
    _wait_for_cycle([p1.pid, p2.pid])
    kill(p1)
    g = waitgraph.snapshot()
    assert not [c for c in g.cycles() if {p1.pid, p2.pid} & {m.thread.pid for m in c}]
    assert all(t.pid != p1.pid for t in g.threads.values())


@pytest.mark.timeout(60)
def test_scribbled_segments_are_skipped_with_a_note(procs, new_lock):
    a, b = new_lock("futex"), new_lock("futex")
    p1, p2 = _start_chain(procs, [a, b])
    bad = uniq("scribbled")
    region = shmlocks.Region.create(bad, persist=True)
    region.close()
    junk = uniq("junk")
    try:
        with open(os.path.join(SHM_DIR, bad), "r+b") as f:  # max_participants: huge
            f.seek(28)
            f.write(struct.pack("<I", 0xFFFFFFF0))
        with open(os.path.join(SHM_DIR, junk), "wb") as f:  # the magic, then nothing
            f.write(b"SHMLOCK1" + b"\xff" * 300)
        g, _cycle = _wait_for_cycle([p1.pid, p2.pid])
        notes = [n for n in g.notes if bad in n or junk in n]
        assert len(notes) == 2 and all(n.startswith("skipped ") for n in notes), g.notes
        assert all("\n" not in n for n in notes)
    finally:
        os.unlink(os.path.join(SHM_DIR, bad))
        os.unlink(os.path.join(SHM_DIR, junk))


@pytest.mark.timeout(60)
def test_corrupt_wait_records_are_ignored(new_region):
    """A wait record naming a lock out of range, or a lock the thread holds itself, and a
    holder field naming a slot out of range: ignored, never followed, never a cycle."""
    region = new_region(max_locks=2, max_participants=2)
    lk = region.create_lock("a", "futex")
    lk.acquire()
    path = os.path.join(SHM_DIR, region.name)
    with open(path, "rb") as f:
        hdr = struct.unpack_from("<QIIQIIQQQQ", f.read(88))
    part_off, locks_off = hdr[7], hdr[8]
    slot = (lk._raw()["holder"] & 0x1FFF) - 1
    rec = part_off + slot * 256 + PART_LINE1 + 8  # op_lock, op_step
    try:
        with open(path, "r+b") as f:
            for op_lock in (999, 3, 1):  # out of range, a free entry, itself
                f.seek(rec)
                f.write(struct.pack("<II", op_lock, 2))
                f.flush()
                g = waitgraph.snapshot([region.name])
                assert g.notes == [] and g.edges == {} and g.cycles() == []
            f.seek(locks_off + 8)  # ctl.holder: slot 8191 of 2
            f.write(struct.pack("<I", 0x1FFF))
            f.flush()
            g = waitgraph.snapshot([region.name])
            assert g.edges == {} and all(not t.holds for t in g.threads.values())
    finally:
        with open(path, "r+b") as f:
            f.seek(rec)
            f.write(struct.pack("<II", 0, 0))
            f.seek(locks_off + 8)
            f.write(struct.pack("<I", _hid(lk, slot)))
    lk.release()


def _hid(lk, slot):
    gen = lk._raw()["participants (pid, op_lock, op_step, op_value, generation)"][slot][4]
    return ((slot + 1) | (gen << 13)) & 0xFFFFFFFF


# ------------------------------------------------------------------------ command line


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "shmlocks", *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.timeout(90)
def test_cli_deadlocks_prints_the_cycle_and_exits_3(procs, new_lock, new_region):
    import json

    region = new_region(max_locks=2)
    a = region.create_lock("a", "clh")
    b = new_lock("pi")
    p1, p2 = _start_chain(procs, [a, b])
    _wait_for_cycle([p1.pid, p2.pid])
    r = _cli("deadlocks", "--json")
    assert r.returncode == 3, r.stderr
    rep = json.loads(r.stdout)
    mine = [c for c in rep["cycles"] if {m["pid"] for m in c} == {p1.pid, p2.pid}]
    assert len(mine) == 1
    got = {(m["pid"], m["tid"], m["holds"], m["waits_for"]) for m in mine[0]}
    assert got == {
        (p1.pid, p1.pid, f"{region.name}/a", b.name),
        (p2.pid, p2.pid, b.name, f"{region.name}/a"),
    }
    assert all(m["waited_s"] > 0 for m in mine[0])
    r = _cli("deadlocks")
    assert r.returncode == 3
    row = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == [str(p1.pid)])
    assert f"{region.name}/a (clh)" in row and f"{b.name} (pi)" in row and " s" in row
    # inspect: per participant, what it holds and what it waits for, here or elsewhere
    r = _cli("inspect", region.name, "--json")
    parts = {p["pid"]: p for p in json.loads(r.stdout)["participants"]}
    assert (parts[p1.pid]["holds"], parts[p1.pid]["waits_for"]) == (["a"], b.name)
    assert (parts[p2.pid]["holds"], parts[p2.pid]["waits_for"]) == ([b.name], "a")
    assert parts[p2.pid]["waiting_s"] > 0
    # once a member is gone, no cycle: exit 0
    kill(p1)
    kill(p2)
    r = _cli("deadlocks", "--json")
    assert not [c for c in json.loads(r.stdout)["cycles"] if p1.pid in {m["pid"] for m in c}]


@pytest.mark.timeout(90)
def test_cli_no_cycle_exits_0_and_notes_a_scribbled_segment(procs, new_lock):
    import json

    a, b = new_lock("ticket"), new_lock("futex")
    holder, _waiter = _start_chain(procs, [a, b], close=False)
    _waiting(holder.pid)
    junk = uniq("junk")
    with open(os.path.join(SHM_DIR, junk), "wb") as f:
        f.write(b"SHMLOCK1" + b"\0" * 4000)
    try:
        r = _cli("deadlocks", "--json")
        rep = json.loads(r.stdout)
        assert not [c for c in rep["cycles"] if holder.pid in {m["pid"] for m in c}]
        assert rep["waiting_threads"] >= 1
        assert [n for n in rep["skipped"] if junk in n]
        r = _cli("deadlocks")
        assert [ln for ln in r.stderr.splitlines() if junk in ln and ln.startswith("note: ")]
        if r.returncode == 0:  # other tests' cycles may exist side by side (xdist)
            assert r.stdout.startswith("no deadlock")
    finally:
        os.unlink(os.path.join(SHM_DIR, junk))
    r = _cli("inspect", a.name)
    row = next(ln for ln in r.stdout.splitlines() if ln.split()[1:2] == [str(holder.pid)])
    assert row.split()[3:6] == ["alive", "lock", b.name], r.stdout
