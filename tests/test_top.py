"""``shmlocks top``: one snapshot into a pipe or as JSON, "no shmlocks segments", and the
live view driven in a real pseudo-terminal (keys in, screen out, terminal modes restored)."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest
from support import RWSide, kill
from support.privshm import requires_private_shm, run_private
from test_cli import cli, lock_line

from shmlocks import _shmread
from shmlocks import cli as shmlocks_cli

pytestmark = pytest.mark.timeout(60)


def _hammer(lock, stop, started):
    started.set()
    deadline = time.monotonic() + 40
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(200):
            lock.acquire()
            lock.release()
        time.sleep(0.001)


class Hammer:
    """A child process acquiring and releasing ``lock`` until stopped (40 s at most)."""

    def __init__(self, procs, lock):
        ctx = mp.get_context("fork")
        self.stop, started = ctx.Event(), ctx.Event()
        self.proc = procs.start(_hammer, lock, self.stop, started)
        assert started.wait(20)

    def end(self):
        self.stop.set()
        self.proc.join(20)
        assert self.proc.exitcode == 0


def test_top_without_a_terminal_prints_one_snapshot(new_lock, procs):
    lock = new_lock("futex")
    h = Hammer(procs, lock)
    try:
        proc = cli("top", lock.name, "--interval", "0.3")
        js = cli("top", lock.name, "--interval", "0.3", "--json")
    finally:
        h.end()
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout, "no terminal control sequences into a pipe"
    row = lock_line(proc.stdout, lock.name).split()
    assert row[1:3] == ["lock", "futex"] and float(row[3]) > 0, row
    assert js.returncode == 0, js.stderr
    (rec,) = json.loads(js.stdout)["locks"]
    assert rec["segment"] == lock.name and rec["acquires_s"] > 0


def test_top_with_no_segments_says_so(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(_shmread, "SHM_DIR", str(tmp_path))  # an empty /dev/shm
    assert shmlocks_cli.main(["top", "--interval", "0.05"]) == 0
    assert capsys.readouterr().out.strip() == "no shmlocks segments"


def test_top_missing_segment_fails_in_one_line():
    proc = cli("top", "shmlt-no-such-segment-top")
    assert proc.returncode == 1 and proc.stderr.startswith("shmlocks: error:")


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _take_tty():
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty becomes our controlling terminal
    # Ctrl-C as a person's shell delivers it: a SIGINT that whoever started the suite
    # ignored (a background job's) is inherited through exec, and Python keeps it ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("key", [b"q", b"\x03", b"TERM"], ids=["q", "ctrl-c", "sigterm"])
def test_top_in_a_pty_shows_rates_and_restores_the_terminal(key, new_lock, procs):
    lock = new_lock("ticket")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    before = termios.tcgetattr(slave)
    h = Hammer(procs, lock)
    p = None
    try:
        p = procs.popen(
            [sys.executable, "-m", "shmlocks", "top", lock.name],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_tty,
        )
        screen = b""
        rate = 0.0
        deadline = time.monotonic() + 30
        while rate <= 0 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                screen += os.read(master, 65536)
            frame = ANSI.sub("", screen.decode("utf-8", "replace").rsplit("\x1b[2J", 1)[-1])
            rows = [ln.split() for ln in frame.splitlines() if ln.startswith(lock.name)]
            if rows and len(rows[-1]) > 3 and rows[-1][3] != "-":
                rate = float(rows[-1][3])
        assert rate > 0, f"no non-zero rate on the screen:\n{screen[-2000:]!r}"
        during = termios.tcgetattr(slave)
        assert not during[3] & termios.ICANON, "top reads keys one at a time"
        if key == b"TERM":
            os.kill(p.pid, signal.SIGTERM)
        else:
            os.write(master, key)
        assert p.wait(10) == 0
        with_tail = screen
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            with_tail += chunk
        assert with_tail.endswith(b"\x1b[?25h\x1b[?1049l") or b"\x1b[?1049l" in with_tail
        assert termios.tcgetattr(slave) == before, "terminal modes restored"
    finally:
        h.end()
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        os.close(master)
        os.close(slave)


def test_top_unit_rates_and_ordering():
    from shmlocks.top import rates

    def rec(acq, cont, wait, waiters=0):
        return {
            "segment": "s",
            "name": str(acq),
            "kind": "mcs",
            "locked": False,
            "holder": None,
            "waiters": waiters,
            "acquisitions": acq,
            "contended": cont,
            "wait_total_s": wait,
            "wait_max_s": wait,
            "timeouts": 0,
            "owner_deaths": 0,
            "handoffs": acq // 2,
        }

    prev = {("s", "a"): rec(100, 10, 1.0), ("s", "b"): rec(1000, 0, 0.0)}
    cur = {("s", "a"): rec(300, 60, 3.0), ("s", "b"): rec(5, 0, 0.0)}  # b was reset
    rows = rates(cur, prev, 2.0)
    assert [r["acquires_s"] for r in rows] == [100.0, 2.5]
    assert rows[0]["contended_pct"] == 25.0 and rows[0]["wait_mean_s"] == 2.0 / 50
    assert rows[1]["contended_pct"] == 0.0 and rows[1]["wait_mean_s"] is None
    assert all(r["acquires_s"] is None for r in rates(cur, None, 1.0))


def test_top_json_rates_an_rwlock_reads(new_region, procs):
    """top --json: an RWLock's row has its reads' rates beside the writes' (a process
    reading in a loop: reads/s, none of it writes), and its readers' counters; a lock's
    row has no read keys."""
    region = new_region(max_locks=2)
    rw = region.create_rwlock("table")
    region.create_lock("jobs", "futex")
    ctx = mp.get_context("fork")
    stop, started = ctx.Event(), ctx.Event()
    p = procs.start(_hammer, RWSide(rw, False), stop, started)  # reads
    assert started.wait(20)
    try:
        js = cli("top", region.name, "--interval", "0.3", "--json")
    finally:
        stop.set()
        p.join(20)
    assert js.returncode == 0, js.stderr
    rows = json.loads(js.stdout)["locks"]
    assert [r["name"] for r in rows] == ["table", "jobs"], "busiest first: reads count"
    t, j = rows
    assert t["reads_s"] > 0 and t["acquires_s"] == 0, t
    assert t["read_timeouts_s"] == 0 and t["read_contended_pct"] == 0, t
    assert t["read_wait_mean_s"] is None and t["reads"]["acquisitions"] > 0, t
    assert not {"reads", "reads_s", "read_contended_pct"} & set(j), j


def test_top_unit_rwlock_read_rates_and_ordering():
    from shmlocks.top import rates

    def rec(name, acq, reads, rcont, rwait, rtout):
        return {
            "segment": "s",
            "name": name,
            "kind": "rwlock",
            "locked": False,
            "holder": None,
            "waiters": 0,
            "acquisitions": acq,
            "contended": 0,
            "wait_total_s": 0.0,
            "wait_max_s": 0.0,
            "timeouts": 0,
            "owner_deaths": 0,
            "handoffs": 0,
            "reads": {
                "acquisitions": reads,
                "contended": rcont,
                "wait_total_s": rwait,
                "wait_max_s": rwait,
                "timeouts": rtout,
                "holders": 0,
                "readers": [],
                "waiters": 0,
            },
        }

    prev = {("s", "a"): rec("a", 100, 0, 0, 0.0, 0), ("s", "b"): rec("b", 0, 100, 10, 1.0, 1)}
    cur = {("s", "a"): rec("a", 160, 0, 0, 0.0, 0), ("s", "b"): rec("b", 10, 300, 60, 3.0, 5)}
    rows = rates(cur, prev, 2.0)
    assert [r["name"] for r in rows] == ["b", "a"], "writes + reads per second"
    b = rows[0]
    assert (b["acquires_s"], b["reads_s"], b["read_timeouts_s"]) == (5.0, 100.0, 2.0)
    assert b["read_contended_pct"] == 25.0 and b["read_wait_mean_s"] == 2.0 / 50
    assert rows[1]["reads_s"] == 0 and rows[1]["read_wait_mean_s"] is None
    first = rates(cur, None, 1.0)
    assert all(r["reads_s"] is None and r["read_wait_mean_s"] is None for r in first)


def _hold_reads(rw, n, ready):
    for _ in range(n):
        rw.acquire_read()
    ready.set()
    time.sleep(40)


def test_top_in_a_pty_shows_an_rwlock_readers(new_region, procs):
    """The live view: an RWLock that readers in other processes hold shows its write row
    (no writer: ``-``) and right after it its read row, the readers as its holder."""
    region = new_region(max_locks=1)
    rw = region.create_rwlock("table")
    ctx = mp.get_context("fork")
    readers = []
    for n in (2, 1):
        ready = ctx.Event()
        readers.append(procs.start(_hold_reads, rw, n, ready))
        assert ready.wait(20)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    p = None
    try:
        p = procs.popen(
            [sys.executable, "-m", "shmlocks", "top", region.name, "--interval", "0.2"],
            # the pty's size, not a COLUMNS a runner exported (the HOLDER column is far right)
            env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_tty,
        )
        screen = b""
        rows: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready_fds, _, _ = select.select([master], [], [], 0.5)
            if ready_fds:
                screen += os.read(master, 65536)
            frame = ANSI.sub("", screen.decode("utf-8", "replace").rsplit("\x1b[2J", 1)[-1])
            rows = [ln for ln in frame.splitlines() if ln.startswith(region.name)]
            if len(rows) == 2 and "readers" in rows[1]:
                break
        assert len(rows) == 2, f"no rwlock rows on the screen:\n{screen[-2000:]!r}"
        write, read = (re.split(r"\s{2,}", r.strip()) for r in rows)
        assert write[1:3] == ["table", "rwlock (write)"] and write[-2:] == ["-", "0"], rows
        assert read[1:3] == ["table", "rwlock (read)"], rows
        assert read[-2:] == ["2 readers (2 pids)", "0"], rows
        os.write(master, b"q")
        assert p.wait(10) == 0
    finally:
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        os.close(master)
        os.close(slave)
        for r in readers:
            kill(r)


LIVE_CHURN = r"""
import fcntl, json, os, re, select, signal, struct, subprocess, sys, termios, time
import shmlocks

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
a = shmlocks.FutexMutex(name="top-a", persist=True)
b = shmlocks.FutexMutex(name="top-b", persist=True)
a.acquire()  # held by this process: HOLDER "pid N alive"
master, slave = os.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
p = subprocess.Popen([sys.executable, "-m", "shmlocks", "top", "--interval", "0.2"],
                     stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env)
screen = b""

def frame_until(ok, seconds=30):
    global screen
    deadline = time.monotonic() + seconds
    rows = {}
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            screen += os.read(master, 65536)
        frames = screen.decode("utf-8", "replace").split("\x1b[2J")
        if len(frames) < 3:
            continue
        rows = {ln.split()[0]: re.split(r"\s{2,}", ln.strip())
                for ln in ANSI.sub("", frames[-2]).splitlines() if ln.startswith("top-")}
        if ok(rows):
            return rows, True
    return rows, False

out = {}
try:
    out["before"], out["before_ok"] = frame_until(
        lambda r: "top-a" in r and "alive" in r["top-a"][-2] and "top-b" in r)
    # top-a replaced under its name by a free lock; top-b removed; top-c added
    os.unlink("/dev/shm/top-a")
    shmlocks.FutexMutex(name="top-a", persist=True).close()
    os.unlink("/dev/shm/top-b")
    shmlocks.FutexMutex(name="top-c", persist=True).close()
    out["after"], out["after_ok"] = frame_until(
        lambda r: "top-a" in r and r["top-a"][-2] == "-" and "top-b" not in r and "top-c" in r)
    # a change in place (the directory untouched): top-c taken by this process
    c = shmlocks.FutexMutex.open("top-c")
    c.acquire()
    out["held"], out["held_ok"] = frame_until(
        lambda r: "top-c" in r and "alive" in r["top-c"][-2])
    c.release()
    os.write(master, b"q")
    out["rc"] = p.wait(10)
finally:
    if p.poll() is None:
        p.kill()
        p.wait(10)
a.release()
print(json.dumps(out))
"""


@requires_private_shm
@pytest.mark.timeout(150)
def test_top_live_view_follows_segments_replaced_removed_and_added():
    """The live view (no NAME: every segment of /dev/shm, a private tmpfs here) in a real
    pseudo-terminal, with the listing it keeps while /dev/shm is unchanged: a segment
    replaced under its name by another shows the new one (free, not its old holder), a
    removed one disappears, a new one appears, and a change in place is seen."""
    r = run_private(LIVE_CHURN, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before_ok"], out
    assert out["after_ok"], out
    assert out["held_ok"], out
    assert out["rc"] == 0, out
