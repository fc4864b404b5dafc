"""Waits and signals: a handler that raises ends the wait with its exception, and a thread
never waits for a lock it holds through another object of the same lock.

- Issue 28 item 14: a raising handler that ran while a queue kind's inner wait ended
  (CLH behind a predecessor that was abandoned meanwhile, MCS for a releaser passing
  through its node) was left pending while the wait went on; when that wait timed out,
  acquire() returned False with the exception set: SystemError. Built here
  deterministically with SIGSTOP: the waiter is stopped, the state it waits for changes,
  the signal is sent, the waiter continued.
- Issue 28 item 9: holding a lock through one object and acquiring it through another
  (open() again, a pickle round trip: each registers its own participant slot) waited
  until the timeout, or forever.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from support import KINDS, uniq, wait_blocked, wait_stopped

import shmlocks

#: a participant in its own process, driven line by line on stdin: "acq T" acquires with
#: timeout T (SIGUSR1 raises Interrupt out of it while it waits), "rel" releases, "exit"
#: leaves. It answers each command with one line.
AGENT = r"""
import signal, sys, time
import shmlocks

class Interrupt(Exception):
    pass

armed = [False]

def on_usr1(sig, frame):
    if armed[0]:
        armed[0] = False
        raise Interrupt()

signal.signal(signal.SIGUSR1, on_usr1)
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "acq":
        t0 = time.monotonic()
        armed[0] = True
        try:
            out = f"returned {lock.acquire(timeout=float(cmd[1]))}"
        except BaseException as e:
            out = f"raised {type(e).__name__}"
        armed[0] = False
        print(out, f"{time.monotonic() - t0:.3f}", flush=True)
    elif cmd[0] == "rel":
        lock.release()
        print("released", flush=True)
    else:
        break
"""


class Agent:
    def __init__(self, procs, lock, env=None):
        self.p = procs.popen(
            [sys.executable, "-c", AGENT, lock.kind, lock.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.read() == "ready"

    @property
    def pid(self) -> int:
        return self.p.pid

    def send(self, cmd: str) -> None:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def read(self) -> str:
        line = self.p.stdout.readline().strip()
        if not line:
            self.p.wait(10)
            raise AssertionError(
                f"agent {self.pid} died: rc={self.p.returncode} "
                f"stderr={self.p.stderr.read()[-2000:]}"
            )
        return line

    def result(self) -> tuple[str, float]:
        *what, took = self.read().split()
        return " ".join(what), float(took)

    def exit(self) -> None:
        if self.p.poll() is None:
            self.send("exit")
            self.p.wait(10)


def _interrupt_stopped(agent: Agent) -> tuple[str, float]:
    """The stopped agent gets SIGUSR1, then SIGCONT: what its acquire did, and how long
    after the continue it answered."""
    os.kill(agent.pid, signal.SIGUSR1)
    t0 = time.monotonic()
    os.kill(agent.pid, signal.SIGCONT)
    what, _ = agent.result()
    return what, time.monotonic() - t0


@pytest.mark.timeout(60)
def test_clh_handler_raising_as_the_predecessor_is_abandoned(procs):
    """B waits behind A, A behind us. B is stopped; A times out (abandons its node, which B
    sees as READY-then-go-on); B gets a raising signal and is continued: the exception
    comes out of B's acquire at once, not a SystemError at the end of its timeout."""
    lock = shmlocks.CLHLock.create(uniq("sig-clh"), max_participants=8)
    agents = []
    try:
        assert lock.acquire()
        a = Agent(procs, lock)
        b = Agent(procs, lock)
        agents += [a, b]
        a.send("acq 1.0")
        wait_blocked(a.pid)
        b.send("acq 8")
        wait_blocked(b.pid)
        os.kill(b.pid, signal.SIGSTOP)
        wait_stopped(b.pid)
        assert a.result()[0] == "returned False"
        what, took = _interrupt_stopped(b)
        assert what == "raised Interrupt", what
        assert took < 2.0, f"the handler's exception came {took:.2f} s after the continue"
        lock.release()
        assert lock.acquire(timeout=5), "the queue was left broken"
        lock.release()
        b.send("acq 5")
        assert b.result()[0] == "returned True"
        b.send("rel")
        assert b.read() == "released"
    finally:
        for ag in agents:
            os.kill(ag.pid, signal.SIGCONT)
            ag.exit()
        lock.close()


@pytest.mark.timeout(60)
def test_mcs_handler_raising_as_a_pass_through_its_node_ends(procs):
    """B abandoned its node; a releaser H stops while passing the lock through it (to C).
    B acquires again, so it waits for the pass to end; B is stopped, H continued (the pass
    ends: READY, then B would enqueue behind C), B signalled and continued: the exception
    comes out at once, not a SystemError at the end of its timeout."""
    lock = shmlocks.MCSLock.create(uniq("sig-mcs"), max_participants=8)
    agents = []
    try:
        h = Agent(
            procs,
            lock,
            {"SHMLOCKS_CRASHPOINT": "mcs.release.passing", "SHMLOCKS_CRASHPOINT_ACTION": "stop"},
        )
        b = Agent(procs, lock)
        c = Agent(procs, lock)
        agents += [h, b, c]
        h.send("acq 10")
        assert h.result()[0] == "returned True"
        b.send("acq 1.5")
        wait_blocked(b.pid)
        c.send("acq 30")
        wait_blocked(c.pid)
        assert b.result()[0] == "returned False"  # B's node: ABANDONED, C behind it
        h.send("rel")
        wait_stopped(h.pid)  # H: passing through B's node
        b.send("acq 8")
        wait_blocked(b.pid)  # B: waits for the pass to end
        os.kill(b.pid, signal.SIGSTOP)
        wait_stopped(b.pid)
        os.kill(h.pid, signal.SIGCONT)
        assert h.read() == "released"
        assert c.result()[0] == "returned True"
        what, took = _interrupt_stopped(b)
        assert what == "raised Interrupt", what
        assert took < 2.0, f"the handler's exception came {took:.2f} s after the continue"
        c.send("rel")
        assert c.read() == "released"
        assert lock.acquire(timeout=5), "the queue was left broken"
        lock.release()
    finally:
        for ag in agents:
            os.kill(ag.pid, signal.SIGCONT)
            ag.exit()
        lock.close()


STORM = r"""
import os, random, signal, sys, time
import shmlocks

class Interrupt(Exception):
    pass

lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
rnd = random.Random(os.getpid())
inside = [False]

def on_signal(sig, frame):
    if inside[0] and rnd.random() < 0.3:
        inside[0] = False
        raise Interrupt()

signal.signal(signal.SIGUSR1, on_signal)
signal.signal(signal.SIGALRM, on_signal)
signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
n = errors = 0
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    got = False
    try:
        inside[0] = True
        got = lock.acquire(timeout=rnd.choice([-1, 0.001, 0.005, 0.02]))
        inside[0] = False
    except Interrupt:
        inside[0] = False
        got = lock._is_owned()
    except BaseException as e:
        inside[0] = False
        errors += 1
        print("ERROR", type(e).__name__, e, file=sys.stderr, flush=True)
        got = lock._is_owned()
    if got:
        n += 1
        try:
            lock.release()
        except Interrupt:
            lock.release()
signal.setitimer(signal.ITIMER_REAL, 0)
print(n, errors)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", KINDS)
def test_raising_signal_storm(kind):
    """Three processes take one lock under a storm of raising signals (a 500 Hz timer
    each): no acquire ever fails with anything but the handler's exception, and the lock
    is free and usable after."""
    lock = shmlocks.KINDS[kind].create(uniq(f"storm-{kind}"), max_participants=8)
    try:
        ps = [
            subprocess.Popen(
                [sys.executable, "-c", STORM, kind, lock.name, "3"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        for p in ps:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err[-3000:]
            n, errors = map(int, out.split())
            assert errors == 0, err[-3000:]
        assert lock.acquire(timeout=5)
        lock.release()
    finally:
        lock.close()


# --------------------------------------------------------------------------- item 9


def _other_view(lock, how):
    return type(lock).open(lock.name) if how == "open" else pickle.loads(pickle.dumps(lock))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["open", "pickle"])
def test_self_deadlock_through_another_view(kind, how, new_lock):
    """Held through one object, a blocking or timed acquire through another object of the
    same lock raises DeadlockError at once; a non-blocking one returns False; the lock is
    left as it was (held by us, no waiter), and usable after."""
    a = new_lock(kind)
    b = _other_view(a, how)
    try:
        assert a.acquire()
        t0 = time.monotonic()
        with pytest.raises(shmlocks.DeadlockError, match="another object"):
            b.acquire(timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert b.acquire(False) is False
        assert a._describe()["waiters"] == 0
        a.release()
        assert b.acquire(timeout=5)  # the withdrawn wait left nothing behind
        b.release()
        assert a.acquire(timeout=5)
        a.release()
    finally:
        b.close()


SELF_FOREVER = r"""
import sys, shmlocks
a = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
b = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
a.acquire()
try:
    b.acquire()
except shmlocks.DeadlockError:
    print("DeadlockError")
a.release()
"""


@pytest.mark.timeout(60)
def test_self_deadlock_through_another_view_forever(kind, new_lock):
    """acquire() without a timeout, through the second object, with deadlock detection
    on (the default): DeadlockError, never a hang."""
    a = new_lock(kind)
    out = subprocess.run(
        [sys.executable, "-c", SELF_FOREVER, kind, a.name],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.stdout.strip() == "DeadlockError", out.stdout + out.stderr


# ------------------------------------------------------- the deadlock walk and signals

#: the main thread waits (timeout 1 s) behind a holder thread, deadlock timeout 0: its
#: walks (at its first sleep, then every 0.5 s) run no Python code; every import the main
#: thread makes during the acquire is recorded, and a SIGUSR1 whose handler raises
#: Interrupt arrives at 0.3 s in mode "handler".
LOOK = r"""
import signal, sys, threading, time
import shmlocks

class Interrupt(Exception):
    pass

mode = sys.argv[2]
main_imports = []

class Recorder:
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread() is threading.main_thread():
            main_imports.append(name)
        return None

lock = shmlocks.KINDS[sys.argv[1]].create()
held, stop = threading.Event(), threading.Event()

def holder():
    with lock:
        held.set()
        if mode == "handler":
            time.sleep(0.3)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        stop.wait(10)

shmlocks.set_deadlock_timeout(0)
signal.signal(signal.SIGUSR1, lambda sig, frame: (_ for _ in ()).throw(Interrupt()))
t = threading.Thread(target=holder)
t.start()
held.wait()
assert "shmlocks.waitgraph" not in sys.modules
sys.meta_path.insert(0, Recorder())
t0 = time.monotonic()
try:
    out = f"returned {lock.acquire(timeout=1.0)}"
except BaseException as e:
    out = f"raised {type(e).__name__}"
took = time.monotonic() - t0
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Recorder)]
stop.set()
t.join()
print(out, f"{took:.2f}", "graph" if "shmlocks.waitgraph" in sys.modules else "-",
      ",".join(main_imports) or "-")
"""


def _look(kind: str, mode: str) -> tuple[str, float, str, str]:
    p = subprocess.run(
        [sys.executable, "-c", LOOK, kind, mode], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr[-3000:]
    *what, took, graph, imports = p.stdout.split()
    return " ".join(what), float(took), graph, imports


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", KINDS)
def test_a_handler_raising_during_a_walking_wait_ends_it(kind):
    """With deadlock detection at its default (a walk at the first sleep, then every
    0.5 s), a signal handler's exception still comes out of the main thread's acquire()
    at once: the walks are C and run no Python code, so nothing of theirs swallows it."""
    what, took, _, _ = _look(kind, "handler")
    assert what == "raised Interrupt" and took < 0.9, (what, took)


@pytest.mark.timeout(90)
def test_the_main_thread_never_imports_inside_a_wait():
    """A wait's deadlock walks are C (shmlocks/_ext/sys/shm_walk.h): nothing is imported
    inside a wait, by the main thread or any other (the import system is not safe against
    a handler's raise inside it: CPython 3.11 leaks its global import lock when a raise
    lands just after `_imp.acquire_lock()`), and the machine-wide graph (waitgraph.py,
    `shmlocks deadlocks`) is never loaded by a waiter. Before issue 38, the first look of
    a process imported it (on a thread of its own, for the main thread)."""
    what, _, graph, imports = _look("ticket", "imports")
    assert what == "returned False", what
    assert graph == "-", "a wait imported the machine-wide wait-for graph"
    assert imports == "-", f"the main thread imported {imports} inside its wait"
