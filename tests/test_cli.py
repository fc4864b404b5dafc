"""The ``python -m shmlocks`` command line: ls, inspect, unlink, demo, and its errors."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

import posix_ipc
import pytest
from support import Holder, shm_exists, shm_remove, uniq, wait_blocked

import shmlocks
from shmlocks.testing import kill_while_holding

pytestmark = pytest.mark.timeout(60)


def cli(*args, timeout=30.0):
    """Run ``python -m shmlocks ARGS``. It runs in a session of its own, so that on a
    timeout the command and every worker it started (the demo's) are killed together."""
    p = subprocess.Popen(
        [sys.executable, "-m", "shmlocks", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the group we created: p and its children only
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def lock_line(output: str, lock_name: str) -> str:
    lines = [
        ln for ln in output.splitlines() if re.search(rf"(^|\s){re.escape(lock_name)}(\s|$)", ln)
    ]
    assert lines, f"lock {lock_name!r} not in the output:\n{output}"
    return lines[0]


def test_ls_lists_a_region(new_region):
    region = new_region()
    region.create_lock("x", "ticket")
    proc = cli("ls")
    assert proc.returncode == 0, proc.stderr
    assert region.name in proc.stdout.split(), proc.stdout


def _wait_on(lock, conn):
    conn.send(os.getpid())
    got = lock.acquire(timeout=20)
    if got:
        lock.release()


def _take(lock):
    lock.acquire()
    time.sleep(30)  # SIGKILLed as soon as it holds the lock (shmlocks.testing)


def test_inspect_shows_kinds_holders_and_waiters(procs, new_region):
    region = new_region(max_locks=8)
    for kind_name in shmlocks.KINDS:
        region.create_lock(f"lk-{kind_name}", kind_name)
    held = region.open_lock("lk-ticket")
    dead = region.open_lock("lk-robust")

    holder = Holder(procs, held)  # alive holder
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    waiter = procs.start(_wait_on, held, w, ctx=ctx)
    assert r.poll(20)
    r.recv()
    wait_blocked(waiter.pid)

    dead_pid = dead_tid = kill_while_holding(dead, _take, dead, start_method="fork", timeout=20)
    try:
        proc = cli("inspect", region.name)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        for kind_name in shmlocks.KINDS:
            line = lock_line(out, f"lk-{kind_name}")
            assert re.search(rf"\b{kind_name}\b", line), line
        assert re.search("waiter", out, re.IGNORECASE), out

        line = lock_line(out, "lk-ticket")
        assert str(holder.pid) in line and str(holder.tid) in line, line
        assert re.search(r"\balive\b", line, re.IGNORECASE), line
        rest = line.replace(str(holder.pid), "").replace(str(holder.tid), "")
        assert re.search(r"\b1\b", rest), f"one waiter not shown: {line}"

        line = lock_line(out, "lk-robust")
        assert str(dead_pid) in line and str(dead_tid) in line, line
        assert re.search(r"\bdead\b", line, re.IGNORECASE), line

        line = lock_line(out, "lk-mcs")
        assert not re.search(r"\b(alive|dead)\b", line, re.IGNORECASE), f"free lock: {line}"
    finally:
        holder.release()
        waiter.join(10)
    assert waiter.exitcode == 0


def test_unlink_removes_a_region(new_region):
    region = new_region()
    region.create_lock("x", "mcs")
    proc = cli("unlink", region.name)
    assert proc.returncode == 0, proc.stderr
    assert not shm_exists(region.name)
    lk = region.open_lock("x")  # our mapping keeps working
    assert lk.acquire(timeout=1)
    lk.release()


def test_unlink_json(new_region):
    region = new_region()
    proc = cli("unlink", "--json", "/" + region.name)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"unlinked": region.name}
    assert not shm_exists(region.name)


def assert_one_line_error(proc):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{proc.stderr}"


@pytest.mark.parametrize("command", ["inspect", "unlink"])
def test_missing_name_is_a_one_line_error(command):
    name = uniq("cli-missing")
    assert_one_line_error(cli(command, name))


@pytest.mark.parametrize("bad", ["a/b", "", "x" * 400, "..", "a\x01/b"], ids=repr)
@pytest.mark.parametrize("command", ["inspect", "unlink"])
def test_invalid_name_is_a_one_line_error(command, bad):
    assert_one_line_error(cli(command, bad))


@pytest.mark.parametrize("command", ["inspect", "unlink"])
def test_foreign_segment_is_a_one_line_error(command):
    name = uniq("cli-foreign")
    shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, size=4096)
    shm.close_fd()
    try:
        assert_one_line_error(cli(command, name))
        assert shm_exists(name), f"{command} touched a segment that is not a shmlocks region"
    finally:
        shm_remove(name)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_runs():
    try:
        proc = cli("demo", timeout=150)
    except subprocess.TimeoutExpired:
        pytest.fail("demo did not finish within 150 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip(), "demo printed nothing"
    # the owner-death section kills a holder of every kind and shows each one recovered
    section = proc.stdout.split("2. Owner death")[1].split("3. Hand-off")[0]
    for kind in shmlocks.KINDS:
        row = next((ln.split() for ln in section.splitlines() if ln.split()[:1] == [kind]), None)
        assert row is not None, f"no {kind} row in the owner-death section:\n{section}"
        assert "True" in row and "clean" in row and "UNEXPECTED" not in row, row
    assert "multiprocessing.Lock" in section and "wedged for good" in section


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_json():
    """--json: the tables go to stderr, one JSON object with every result to stdout."""
    try:
        proc = cli(
            "demo",
            "--json",
            "--workers",
            "2",
            "--iterations",
            "2000",
            "--handoff",
            "0.05",
            timeout=150,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("demo --json did not finish within 150 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    locks = [*shmlocks.KINDS, "multiprocessing.Lock"]
    assert [r["lock"] for r in doc["counting"]] == locks
    for r in doc["counting"]:
        assert r["exact"] and r["total"] == r["expected"] == 4000 and r["overlaps"] == 0, r
    assert [r["kind"] for r in doc["owner_death"]] == list(shmlocks.KINDS)
    for r in doc["owner_death"]:
        assert r["owner_died"] and r["next_hold_clean"] and r["seen"] == [1, 0], r
    assert doc["multiprocessing_lock_after_death"]["acquired"] is False
    assert [r["lock"] for r in doc["handoff"]] == locks
    assert "1. Counting" in proc.stderr and "3. Hand-off" in proc.stderr
