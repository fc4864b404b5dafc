"""A timed acquire keeps its deadline while it recovers someone else.

A waiter that finds a participant dead recovers it on its own time. Two waits inside a
recovery used to ignore the caller's deadline: the lock's repair mutex, held by another
recoverer (up to 2 s, after which the dead participant's slot was lost for good), and the
wait for live participants between two protocol steps to finish them (up to 5 s, after
which recovery decided anyway). Both now end at the caller's deadline; the recovery it
began is left pending, whole, for the next waiter, who finishes it.

Each test builds the wait with crash points: SHMLOCKS_CRASHPOINT_ACTION=stop stalls a
process (SIGSTOP) at a named point, as a preempted or stopped process would be.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest
from support import USERSPACE_KINDS, uniq, wait_blocked, wait_stopped

import shmlocks

TIMEOUT = 0.3
#: how late a timed acquire may return here: the contract is 20 ms; the bound is wider so
#: that a busy 2-CPU test machine does not fail it (the old behaviour took 2 s or 5 s)
SLACK = 0.25

#: (kind, the point where a joiner has taken its place but not yet published it)
JOINED = [
    ("ticket", "ticket.acquire.took"),
    ("mcs", "mcs.acquire.joined"),
    ("clh", "clh.acquire.joined"),
]


def _hold(lock, ready) -> None:
    lock.acquire()
    ready.set()
    time.sleep(120)


def _wait_forever(lock) -> None:
    lock.acquire()
    time.sleep(120)


def _spawn(lock, point: str, action: str, first: bool = False) -> subprocess.Popen:
    """A fresh interpreter that opens `lock` and acquires it (crash point armed). With
    `first`, it takes the lock once and waits for a line on stdin before (a participant
    registered early; arm the point's second pass then)."""
    code = (
        "import shmlocks, sys\n"
        "l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
        "if sys.argv[3] == '1':\n"
        "    assert l.acquire(timeout=30)\n"
        "    l.release()\n"
        "    print('registered', flush=True)\n"
        "    sys.stdin.readline()\n"
        "assert l.acquire(timeout=30)\n"
        "if l.owner_died:\n"
        "    l.mark_consistent()\n"
        "l.release()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "SHMLOCKS_CRASHPOINT": point, "SHMLOCKS_CRASHPOINT_ACTION": action}
    return subprocess.Popen(
        [sys.executable, "-c", code, lock.kind, lock.name, "1" if first else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _timed_acquire(lock) -> tuple[bool, float]:
    """In a fresh process (a fresh participant): acquire(timeout=TIMEOUT), its result and
    how long it took."""
    code = (
        "import shmlocks, sys, time\n"
        "l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
        "t0 = time.monotonic()\n"
        "got = l.acquire(timeout=float(sys.argv[3]))\n"
        "print(got, time.monotonic() - t0)\n"
        "if got:\n"
        "    l.release()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, lock.kind, lock.name, str(TIMEOUT)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    got, took = out.stdout.split()
    return got == "True", float(took)


def _assert_times_out_by_its_deadline(lock) -> None:
    got, took = _timed_acquire(lock)
    print(f"\n{lock.kind}: timed acquire returned {got} after {took * 1e3:.1f} ms")
    assert not got
    assert took < TIMEOUT + SLACK, f"{took:.3f} s for a {TIMEOUT} s timeout"


def _stop_quietly(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
        p.communicate()


def _finish(lock, stalled: subprocess.Popen) -> None:
    """Continue the stalled process; it and then we get the lock, and no slot is lost."""
    os.kill(stalled.pid, signal.SIGCONT)
    out, err = stalled.communicate(timeout=40)
    assert stalled.returncode == 0 and out.split()[-1:] == ["ok"], (stalled.returncode, out, err)
    assert lock.acquire(timeout=10), "the lock stayed wedged after the cut recovery"
    if lock.owner_died:
        lock.mark_consistent()
    lock.release()
    lock.region._recover_dead()
    parts = lock.region._describe()["participants"]
    assert [p["pid"] for p in parts] == [os.getpid()], f"slots left behind: {parts}"


@contextlib.contextmanager
def _recoverer_stalled_in_the_repair_mutex(procs, kind: str, prefix: str):
    """H holds, D waits; both die. R begins H's recovery and stalls (SIGSTOP) holding the
    lock's repair mutex, D's recovery still to do. Yields (the lock, R); R is killed and
    the lock closed after."""
    lock = shmlocks.KINDS[kind].create(uniq(f"{prefix}-{kind}"), max_participants=6)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    r = None
    try:
        h = procs.start(_hold, lock, ready)
        assert ready.wait(20)
        d = procs.start(_wait_forever, lock)
        wait_blocked(d.pid)
        os.kill(d.pid, signal.SIGKILL)
        d.join(10)
        os.kill(h.pid, signal.SIGKILL)
        h.join(10)
        r = _spawn(lock, "recover.locked", "stop")
        wait_stopped(r.pid)
        yield lock, r
    finally:
        _stop_quietly(r)
        lock.close()


@contextlib.contextmanager
def _joiner_stalled_behind_a_dead_one(kind: str, point: str, prefix: str):
    """D dies at `point` (its place taken, not yet published); L, registered before and
    queued behind it, stalls (SIGSTOP) at the same step. Yields (the lock, L); L is killed
    and the lock closed after."""
    lock = shmlocks.KINDS[kind].create(uniq(f"{prefix}-{kind}"), max_participants=6)
    stalled = None
    try:
        stalled = _spawn(lock, f"{point}:2", "stop", first=True)
        assert stalled.stdout.readline().strip() == "registered"
        dead = _spawn(lock, point, "kill")
        dead.communicate(timeout=30)
        assert dead.returncode == -signal.SIGKILL
        stalled.stdin.write("go\n")
        stalled.stdin.flush()
        wait_stopped(stalled.pid)
        yield lock, stalled
    finally:
        _stop_quietly(stalled)
        lock.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", USERSPACE_KINDS)
def test_deadline_holds_while_another_recoverer_has_the_repair_mutex(procs, kind):
    """H holds, D waits; both die. R begins H's recovery and stalls holding the lock's
    repair mutex. A timed acquirer that must recover D waits for that mutex only until its
    own deadline, and leaves D pending (not lost)."""
    with _recoverer_stalled_in_the_repair_mutex(procs, kind, "dl-repair") as (lock, r):
        _assert_times_out_by_its_deadline(lock)
        _finish(lock, r)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("kind", "point"), JOINED, ids=[k for k, _ in JOINED])
def test_deadline_holds_while_live_joiners_settle(kind, point):
    """D dies between taking its place and publishing it; L, behind it, stalls at the same
    step. Recovering D means waiting for L to finish that step: a timed acquirer waits
    only until its deadline, and L (continued) and we get the lock after. (L registers
    before D dies, or its registration would recover D itself.)"""
    with _joiner_stalled_behind_a_dead_one(kind, point, "dl-settle") as (lock, stalled):
        _assert_times_out_by_its_deadline(lock)
        _finish(lock, stalled)


# --------------------------------------------------------------------------- Ctrl-C
# (issue 28, item 10): a wait inside a recovery checks signals too, so Ctrl-C ends a
# blocked acquire within the SPEC's 100 ms even while it recovers someone; the recovery
# is left pending for the next waiter, as at a deadline.

#: how late the KeyboardInterrupt may come here (SPEC: 100 ms; wider for a loaded machine;
#: before, it waited out the 2 s or 5 s of the recovery's own bound)
CTRL_C_SLACK = 0.5

BLOCKED = (
    "import shmlocks, signal, sys, time\n"
    # a SIGINT ignored by whoever started the suite is inherited: Ctrl-C must raise here
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
    "print('waiting', flush=True)\n"
    "try:\n"
    "    l.acquire()\n"
    "    print('acquired', flush=True)\n"
    "except KeyboardInterrupt:\n"
    "    print('KeyboardInterrupt', flush=True)\n"
)


def _ctrl_c_latency(lock) -> float:
    """A fresh process blocks in acquire() (no timeout) and recovers whoever is dead; we
    press Ctrl-C (SIGINT) once it is inside that recovery: how long until it raised."""
    y = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, lock.kind, lock.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert y.stdout.readline().strip() == "waiting"
        time.sleep(0.6)  # inside the recovery's wait by now
        t0 = time.monotonic()
        y.send_signal(signal.SIGINT)
        line = y.stdout.readline().strip()
        took = time.monotonic() - t0
        assert line == "KeyboardInterrupt", (line, y.stderr.read())
        assert y.wait(10) == 0
    finally:
        _stop_quietly(y)
    print(f"\n{lock.kind}: KeyboardInterrupt {took * 1e3:.1f} ms after SIGINT")
    return took


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("kind", "point"), JOINED, ids=[k for k, _ in JOINED])
def test_ctrl_c_while_recovery_settles(kind, point):
    """As test_deadline_holds_while_live_joiners_settle, with acquire() (no deadline) and
    Ctrl-C: the settle wait for the stalled joiner ends at the signal, not after 5 s."""
    with _joiner_stalled_behind_a_dead_one(kind, point, "cc-settle") as (lock, stalled):
        assert _ctrl_c_latency(lock) < CTRL_C_SLACK
        _finish(lock, stalled)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", USERSPACE_KINDS)
def test_ctrl_c_while_another_recoverer_has_the_repair_mutex(procs, kind):
    """As test_deadline_holds_while_another_recoverer_has_the_repair_mutex, with acquire()
    and Ctrl-C: the wait for the repair mutex ends at the signal, not after 2 s."""
    with _recoverer_stalled_in_the_repair_mutex(procs, kind, "cc-repair") as (lock, r):
        assert _ctrl_c_latency(lock) < CTRL_C_SLACK
        _finish(lock, r)


def _take(lock) -> None:
    lock.acquire()


NONBLOCKING = (
    "import shmlocks, sys, time\n"
    "l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])\n"
    "t0 = time.monotonic()\n"
    "print(l.acquire(False), time.monotonic() - t0)\n"
)


@pytest.mark.timeout(90)
def test_nonblocking_acquire_never_waits_for_an_mcs_successor():
    """A dead MCS holder whose queue never shows its successor (a tail word that names a
    node not in the queue: a scribbled segment): recovering it waits for the successor to
    appear (_mcs_find_succ). That wait took 5 s whatever the caller's deadline; a
    non-blocking acquire, whose registration recovers the holder, now returns at once,
    and Ctrl-C ends a blocked one."""
    from shmlocks.testing import kill_while_holding

    lock = shmlocks.MCSLock.create(uniq("dl-succ"), max_participants=8)
    try:
        assert lock.acquire(timeout=5)  # our slot first, so the holder's is the next
        lock.release()
        kill_while_holding(lock, _take, lock, start_method="fork")
        with open(f"/dev/shm/{lock.name}", "r+b") as f:
            hdr = f.read(64)
            locks_off = int.from_bytes(hdr[48:56], "little")
            f.seek(locks_off + shmlocks.CACHE_LINE)  # word A: the tail
            f.write((6 | 5 << 32).to_bytes(8, "little"))  # node 6, pred 5: both idle
        out = subprocess.run(
            [sys.executable, "-c", NONBLOCKING, "mcs", lock.name],
            capture_output=True,
            text=True,
            timeout=30,
        )
        got, took = out.stdout.split()
        print(f"\nacquire(False) -> {got} after {float(took) * 1e3:.1f} ms")
        assert got == "False"
        assert float(took) < 0.2, f"a non-blocking acquire took {float(took):.2f} s"
        assert _ctrl_c_latency(lock) < CTRL_C_SLACK
    finally:
        lock.close()
