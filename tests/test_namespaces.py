"""Locks shared between PID namespaces (containers that share /dev/shm).

Processes started with `unshare --pid --fork --mount-proc` see other pids than ours (each
is pid 1 in its own namespace here). Liveness works across them (a token's OWNER_DIED is
set by the kernel whatever the namespace), so exclusion and owner-death recovery hold for
every kind but pi, whose kernel futex names its owner by thread id: pi refuses with
NamespaceError instead of hanging. What the CLI and `owner` show for a participant of
another namespace must never be taken for a process of ours.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from support import uniq

import shmlocks
from shmlocks._harness import Exclusion, ExclusionReport, words

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NON_PI = [k for k in shmlocks.KINDS if k != "pi"]

#: a command run in a new PID namespace (where it is pid 1), with its own /proc
NEW_PID_NS = ["unshare", "--pid", "--fork", "--mount-proc"]


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        [*NEW_PID_NS, sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.returncode == 0 and r.stdout.strip() == "1"


if not _unshare_works():
    pytest.skip("needs root and unshare --pid (new PID namespaces)", allow_module_level=True)


WORKER = r"""
import mmap, os, sys, time
import shmlocks
kind, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
lock = shmlocks.KINDS[kind].open(name)
if mode == "hold":
    lock.acquire()
    print("holding", os.getpid(), flush=True)
    time.sleep(60)
elif mode == "count":
    from shmlocks._harness import Exclusion
    n, counter, who = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    with open(counter, "r+b") as f:
        ex = Exclusion(memoryview(mmap.mmap(f.fileno(), 0)).cast("q"), participants=3)
        for _ in range(n):
            assert lock.acquire(timeout=20)
            if lock.owner_died:
                ex.repair()
                lock.mark_consistent()
            ex.section(who)
            lock.release()
    print("counted", flush=True)
elif mode == "wait":
    t0 = time.monotonic()
    got = lock.acquire(timeout=float(sys.argv[4]))
    print(got, lock.owner_died if got else None, round(time.monotonic() - t0, 3), flush=True)
    if got:
        lock.mark_consistent()
        lock.release()
lock.close()
"""


def _in_ns(*args: str) -> subprocess.Popen:
    """The worker in a new PID namespace (where it is pid 1)."""
    return subprocess.Popen(
        [*NEW_PID_NS, sys.executable, "-c", WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _here(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _inner_pid(proc: subprocess.Popen) -> int:
    """Our pid of the process that `unshare --fork` started (its pid 1)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                kids = f.read().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise AssertionError("unshare started no child")


def _finish(procs) -> list[str]:
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            _kill(p)
            raise AssertionError("a worker hung") from None
        assert p.returncode == 0, (p.returncode, out, err)
        outs.append(out.strip())
    return outs


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.kill(_inner_pid(p), signal.SIGKILL)
        except (AssertionError, ProcessLookupError):
            pass
        p.kill()
        p.communicate()


@pytest.fixture
def counter():
    """The exclusion checker's words (shmlocks/_harness.py) in a file every worker maps."""
    path = f"/dev/shm/{uniq('nsctr')}"
    with open(path, "wb") as f:
        f.write(b"\0" * 8 * words(3))
    yield path
    os.unlink(path)


def _books(path: str) -> ExclusionReport:
    with open(path, "rb") as f:
        return Exclusion(memoryview(f.read()).cast("q"), participants=3).report()


@pytest.mark.parametrize("kind", NON_PI)
def test_exclusion_across_pid_namespaces(new_lock, counter, kind):
    """Two workers in namespaces of their own and one in ours (all three are pid 1 or
    ours): exact counts."""
    lock = new_lock(kind)
    n = "2000"
    procs = [_in_ns(kind, lock.name, "count", n, counter, str(who)) for who in (1, 2)]
    procs.append(_here(kind, lock.name, "count", n, counter, "3"))
    try:
        assert _finish(procs) == ["counted"] * 3
    finally:
        for p in procs:
            _kill(p)
    books = _books(counter)
    assert books.ok and books.total == 3 * int(n), books


@pytest.mark.parametrize("kind", NON_PI)
def test_owner_death_across_pid_namespaces(new_lock, kind):
    """A holder in one namespace is SIGKILLed; a waiter in another gets the lock and sees
    owner_died."""
    lock = new_lock(kind)
    holder = _in_ns(kind, lock.name, "hold")
    waiter = None
    try:
        assert holder.stdout.readline().split()[:2] == ["holding", "1"]
        waiter = _in_ns(kind, lock.name, "wait", "15")
        time.sleep(0.3)
        os.kill(_inner_pid(holder), signal.SIGKILL)
        got, died, _ = _finish([waiter])[0].split()
        assert (got, died) == ("True", "True")
    finally:
        _kill(holder)
        if waiter is not None:
            _kill(waiter)
    assert lock.acquire(timeout=5)
    assert not lock.owner_died
    lock.release()


def test_owner_ls_and_inspect_say_other_namespace(new_lock):
    """A holder in another namespace is pid 1 there: `owner` must not name our pid 1 (a
    live process of ours), and inspect says whose namespace the pid belongs to."""
    lock = new_lock("mcs")
    holder = _in_ns("mcs", lock.name, "hold")
    try:
        assert holder.stdout.readline().startswith("holding")
        assert lock.locked()
        assert lock.owner is None
        d = lock.region._describe()
        (h,) = [lk["holder"] for lk in d["locks"]]
        assert h["other_namespace"] and h["alive"]
        assert [p["other_namespace"] for p in d["participants"]] == [True]
        out = subprocess.run(
            [sys.executable, "-m", "shmlocks", "inspect", lock.name],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "(other namespace) alive" in out and "alive, other namespace" in out, out
        # and from inside another namespace, our region's creator is theirs to not resolve
        code = (
            "import subprocess, sys\n"
            "print(subprocess.run([sys.executable, '-m', 'shmlocks', 'ls'],"
            " capture_output=True, text=True).stdout)\n"
        )
        ls = subprocess.run(
            [*NEW_PID_NS, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
        ).stdout
        line = next(ln for ln in ls.splitlines() if ln.startswith(lock.name))
        assert "(other namespace)" in line, ls
    finally:
        _kill(holder)


def test_pi_refuses_another_namespace_at_once(new_lock):
    lock = new_lock("pi")
    p = _in_ns("pi", lock.name, "wait", "5")
    t0 = time.monotonic()
    out, err = p.communicate(timeout=30)
    assert p.returncode != 0
    assert "NamespaceError" in err and "PID namespace" in err, err
    assert time.monotonic() - t0 < 10
    # in our own namespace it works as ever
    assert lock.acquire(timeout=5)
    lock.release()
