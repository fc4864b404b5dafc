"""Re-entry from signal handlers (issue 28, item 4).

A thread waiting in acquire() runs Python signal handlers (Ctrl-C must work). Its one
participant in the region has published the step it is in (WAITING); a handler that took
or released a lock of the same region published its own step over it: the next holder saw
a wrong owner_died, a real deadlock cycle vanished from the wait-for graph, and a handler
taking the lock its thread was queued on corrupted the queue (CorruptRegionError).

The contract (README, "Differences from threading.Lock"): inside a handler that
interrupts a wait, any acquire, release or with block of a lock of the same region is
refused with ReentryError, and the interrupted wait goes on untouched. Locks of other
regions work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from support import FIFO_KINDS, uniq, wait_blocked

import shmlocks

#: a waiter whose SIGUSR1 handler runs `mode` against the region and reports what it did
CHILD = r"""
import signal, sys, time
import shmlocks

kind, name, other, mode = sys.argv[1:5]
reg = shmlocks.Region.open(name)
L, N, H = reg.open_lock("L"), reg.open_lock("N"), reg.open_lock("H")
Lb = shmlocks.Region.open(name).open_lock("L")       # another object of L
O = shmlocks.KINDS[kind].open(other)                 # a lock of another region
Lb.acquire(False)                                    # registers it (L is held: False)

def on_usr1(sig, frame):
    try:
        if mode == "same":
            with L:
                pass
        elif mode == "view":
            with Lb:
                pass
        elif mode == "sibling":
            with N:
                pass
        elif mode == "release":
            H.release()
        elif mode == "other":
            with O:
                pass
        print("handler ok", flush=True)
    except shmlocks.ReentryError:
        print("handler ReentryError", flush=True)
    except BaseException as e:
        print("handler", type(e).__name__, e, flush=True)

signal.signal(signal.SIGUSR1, on_usr1)
assert H.acquire(timeout=5)
print("waiting", flush=True)
got = L.acquire(timeout=20)
print("acquired", got, L.owner_died, flush=True)
L.release()
H.release()
"""


def _python(code: str, *args: str, stdin: bool = False) -> subprocess.Popen:
    """``python -c code args``, its output read as text (and its input written, with
    ``stdin``)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _signal_its_wait(p: subprocess.Popen) -> None:
    """Once ``p`` says it is waiting and sleeps in the kernel on the lock: SIGUSR1, whose
    handler then runs inside the wait."""
    assert p.stdout.readline().strip() == "waiting"
    wait_blocked(p.pid)
    os.kill(p.pid, signal.SIGUSR1)


def _kill_quietly(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        p.kill()
        p.wait()


def _region(kind: str):
    reg = shmlocks.Region.create(uniq(f"re-{kind}"), max_locks=3, max_participants=8)
    for n in "LNH":
        reg.create_lock(n, kind)
    return reg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["same", "view", "sibling", "release", "other"])
def test_handler_lock_call_during_a_wait(kind, mode):
    reg = _region(kind)
    other = shmlocks.KINDS[kind].create(uniq(f"re-o-{kind}"))
    L = reg.open_lock("L")
    p = None
    try:
        assert L.acquire()
        p = _python(CHILD, kind, reg.name, other.name, mode)
        _signal_its_wait(p)
        line = p.stdout.readline().strip()
        expected = "handler ok" if mode == "other" else "handler ReentryError"
        assert line == expected, (line, p.stderr.read() if not line else "")
        L.release()
        assert p.stdout.readline().strip() == "acquired True False"
        assert p.wait(20) == 0, p.stderr.read()
        for n in "LNH":
            d = reg.open_lock(n)._describe()
            assert not d["locked"] and d["waiters"] == 0, (n, d)
        assert L.acquire(timeout=5)  # the queue the wait left is sound
        L.release()
    finally:
        _kill_quietly(p)
        other.close()
        reg.close()


#: W queues for L; its handler tries N (refused, caught); W is stopped, L handed to it
#: (FIFO), W killed before acquire() returns: it never entered its critical section.
WAITER = r"""
import signal, sys
import shmlocks

reg = shmlocks.Region.open(sys.argv[1])
L, N = reg.open_lock("L"), reg.open_lock("N")

def on_usr1(sig, frame):
    try:
        with N:
            print("handler took N", flush=True)
    except shmlocks.ReentryError:
        print("handler refused", flush=True)

signal.signal(signal.SIGUSR1, on_usr1)
print("waiting", flush=True)
L.acquire()
print("acquired", flush=True)
"""

NEXT = r"""
import sys, shmlocks
L = shmlocks.Region.open(sys.argv[1]).open_lock("L")
print(L.acquire(timeout=10), L.owner_died)
if L.owner_died:
    L.mark_consistent()
L.release()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", FIFO_KINDS)
def test_handler_does_not_fake_an_owner_death(kind):
    """The wait's published step survives the handler: a waiter killed after L was handed
    to it, before acquire() returned, gives the next holder no owner_died."""
    reg = _region(kind)
    L = reg.open_lock("L")
    w = None
    try:
        assert L.acquire()
        w = _python(WAITER, reg.name)
        _signal_its_wait(w)
        assert w.stdout.readline().strip() == "handler refused"
        wait_blocked(w.pid)
        os.kill(w.pid, signal.SIGSTOP)
        L.release()  # FIFO: handed to the stopped waiter
        time.sleep(0.1)
        os.kill(w.pid, signal.SIGKILL)
        w.wait(10)
        out = subprocess.run(
            [sys.executable, "-c", NEXT, reg.name], capture_output=True, text=True, timeout=30
        )
        assert out.stdout.strip() == "True False", out.stdout + out.stderr
    finally:
        _kill_quietly(w)
        reg.close()


#: a member of a 2-cycle: holds `first`, then waits for `second`; with "handler", its
#: SIGUSR1 handler tries the third lock N of the region (refused, caught)
MEMBER = r"""
import signal, sys, time
import shmlocks

name, first, second, handler = sys.argv[1:5]
shmlocks.set_deadlock_timeout(0.2)
reg = shmlocks.Region.open(name)
a, b, n = reg.open_lock(first), reg.open_lock(second), reg.open_lock("N")
if handler == "1":
    def on_usr1(sig, frame):
        try:
            with n:
                pass
        except shmlocks.ReentryError:
            pass
    signal.signal(signal.SIGUSR1, on_usr1)
a.acquire()
print("holding", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    got = b.acquire(timeout=8)
    print("got" if got else "timeout", f"{time.monotonic() - t0:.2f}", flush=True)
    if got:
        b.release()
except shmlocks.DeadlockError:
    print("DeadlockError", f"{time.monotonic() - t0:.2f}", flush=True)
a.release()
"""


@pytest.mark.timeout(60)
def test_handler_does_not_hide_a_deadlock(kind):
    """A real 2-cycle whose first member's handler runs during its wait is still seen and
    broken: one member gets DeadlockError, the other the lock."""
    reg = shmlocks.Region.create(uniq(f"re-dl-{kind}"), max_locks=3, max_participants=8)
    for n in ("A", "B", "N"):
        reg.create_lock(n, kind)
    ms = []
    try:
        for first, second, h in (("A", "B", "1"), ("B", "A", "0")):
            m = _python(MEMBER, reg.name, first, second, h, stdin=True)
            ms.append(m)
            assert m.stdout.readline().strip() == "holding"
        for m in ms:
            m.stdin.write("go\n")
            m.stdin.flush()
            wait_blocked(m.pid)
        os.kill(ms[0].pid, signal.SIGUSR1)  # early in the wait, before any look
        res = sorted(m.stdout.readline().split()[0] for m in ms)
        assert res == ["DeadlockError", "got"], (res, [m.stderr.read() for m in ms])
        for m in ms:
            assert m.wait(20) == 0
    finally:
        for m in ms:
            _kill_quietly(m)
        reg.close()
