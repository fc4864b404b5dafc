"""close() of a toolbox object (or its Region) while other threads of the process use it
(docs/design.md §2 "Closing under other threads", §12).

- A thread blocked in Event.wait() while another closes the Event or its Region wakes at
  its timeout (or at a set() from another process) and returns, never touching an
  unmapped segment: the waiting thread is a participant, whose token keeps the mapping.
- A call waiting for a held guard without a deadline (Condition.notify(),
  Barrier.reset(), Barrier.abort()) while another thread closes the object goes on
  waiting on a mapped segment, and completes once the guard is let go.
- A Condition opened by name and closed answers every later call with ValueError, never
  by reading its unmapped body (its lock's name is read from there).

Each case runs in a child interpreter: a SIGSEGV is its exit status, not a dead test run.
"""

from __future__ import annotations

import pytest
from support.common import run_python, shm_remove, uniq

pytestmark = pytest.mark.timeout(120)

EVENT_CLOSE = r"""
import faulthandler, os, sys, threading, time
faulthandler.enable()
import shmlocks

how, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
results = []
for i in range(rounds):
    n = f"{name}-{i}"
    if how == "region":
        reg = shmlocks.Region.create(n, max_locks=2)
        ev = reg.create_event("e")
        closer = reg
    else:
        ev = closer = shmlocks.Event(n)
    other = shmlocks.Event.open(n) if how == "standalone" else None
    out = []
    t = threading.Thread(target=lambda: out.append(ev.wait(0.3)))
    t.start()
    while not ev._raw()["parked"]:           # asleep in the wait
        time.sleep(0.002)
    closer.close()
    if other is not None and i % 2:
        other.set()                   # another view wakes the waiter after the close
    t.join(10)
    assert not t.is_alive(), "the waiter hung"
    results.append(out[0])
    if other is not None:
        other.close()
print(" ".join(map(str, results)))
print("ok")
"""


@pytest.mark.parametrize("how", ["standalone", "region"])
def test_event_wait_while_another_thread_closes_it(how):
    """Event.wait(0.3) in a thread, close() of the Event (or its Region) in another: the
    waiter returns (False at its timeout, True if set through another view), the process
    lives (it used to die of SIGSEGV reading the unmapped word)."""
    name = uniq(f"tbc-ev-{how}")
    rounds = 4
    try:
        p = run_python(EVENT_CLOSE, how, name, str(rounds))
    finally:
        for i in range(rounds):
            shm_remove(f"{name}-{i}")
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    lines = p.stdout.split("\n")
    assert lines[1] == "ok", p.stdout
    got = lines[0].split()
    if how == "standalone":
        assert got == ["False", "True"] * (rounds // 2), got
    else:
        assert got == ["False"] * rounds, got


GUARD_CLOSE = r"""
import faulthandler, os, struct, sys, threading, time
faulthandler.enable()
import shmlocks

what, how, name, path = sys.argv[1:5]
if what == "notify":
    lock = shmlocks.FutexMutex()
    if how == "region":
        reg = shmlocks.Region.create(name, max_locks=2)
        obj = reg.create_condition("o", lock)
    else:
        obj = shmlocks.Condition(lock, name)
        reg = None
else:
    if how == "region":
        reg = shmlocks.Region.create(name, max_locks=2)
        obj = reg.create_barrier("o", 2)
    else:
        obj = shmlocks.Barrier(2, name=name)
        reg = None
index = 0 if reg is None else reg.lock_names().index("o")

# the guard's holder (a stopped one): a process that is a participant of the region and
# does nothing (of another process, so that no thread of this one keeps the mapping)
r, w = os.pipe()
parent = os.getpid()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)                          # (our output is the parent's verdict)
    os.dup2(null, 2)
    if what == "notify":
        with obj:
            obj.wait(0)
    else:
        obj._enroll()
    os.write(w, b"x")
    while os.getppid() == parent:             # until killed, or the parent is gone
        time.sleep(0.05)
    os._exit(0)
assert os.read(r, 1) == b"x"

fd = os.open(path, os.O_RDWR)
hdr = struct.unpack_from("<QIIQIIQQQQ", os.pread(fd, 64, 0))
GUARD = hdr[8] + index * hdr[9] + 2 * 128     # locks_off + i * stride, word B
os.pwrite(fd, struct.pack("<I", pid), GUARD)

out = []
def call():
    try:
        if what == "notify":
            with obj:
                obj.notify()
        else:
            getattr(obj, what)()
        out.append("returned")
    except BaseException as e:
        out.append(type(e).__name__)
t = threading.Thread(target=call)
t.start()
time.sleep(0.3)                               # waiting for the guard by now
(reg or obj).close()
time.sleep(0.2)                               # slices of its wait on the closed object
os.pwrite(fd, struct.pack("<I", 0), GUARD)    # the holder lets go
t.join(10)
os.kill(pid, 9)
os.waitpid(pid, 0)
assert not t.is_alive(), "the call hung"
print(out[0])
if what == "notify":
    lock.close()
print("ok")
"""


@pytest.mark.parametrize("how", ["standalone", "region"])
@pytest.mark.parametrize("what", ["notify", "reset", "abort"])
def test_guard_wait_while_another_thread_closes_the_object(what, how):
    """Condition.notify(), Barrier.reset(), Barrier.abort() wait for a guard held by a
    stopped participant (of another process); another thread closes the object (or its
    Region) meanwhile; the holder lets go: the call completes, the process lives (it used
    to retry the guard on the unmapped segment: SIGSEGV)."""
    name = uniq(f"tbc-{what}-{how}")
    try:
        p = run_python(GUARD_CLOSE, what, how, name, f"/dev/shm/{name}")
    finally:
        shm_remove(name)
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    assert p.stdout.split() == ["returned", "ok"], p.stdout


CONDITION_CLOSED = r"""
import faulthandler, sys
faulthandler.enable()
import shmlocks

name = sys.argv[1]
lock = shmlocks.FutexMutex()
c = shmlocks.Condition(lock, name)
calls = {
    "acquire(False)": lambda o: o.acquire(False),
    "acquire()": lambda o: o.acquire(),
    "with": lambda o: o.__enter__(),
    "release()": lambda o: o.release(),
    "wait(0)": lambda o: o.wait(0),
    "notify()": lambda o: o.notify(),
    "notify_all()": lambda o: o.notify_all(),
    "lock": lambda o: o.lock,
}
for label, f in calls.items():
    c2 = shmlocks.Condition.open(name)
    c2.close()
    try:
        f(c2)
        print(label, "returned")
    except ValueError:
        print(label, "ValueError")
# the creator's own object, closed with its lock given: the same
c.close()
try:
    c.acquire(False)
    print("creator returned")
except ValueError:
    print("creator ValueError")
assert lock.acquire(False)                    # nobody took the user's lock
lock.release()
lock.close()
print("ok")
"""


def test_calls_on_a_closed_condition_raise_valueerror():
    """A Condition opened by name (its lock opened on first use) and closed: acquire,
    with, release, wait, notify and lock raise ValueError (acquire(False) used to read the
    lock's name from the unmapped body: SIGSEGV)."""
    name = uniq("tbc-cv")
    try:
        p = run_python(CONDITION_CLOSED, name)
    finally:
        shm_remove(name)
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    lines = p.stdout.strip().split("\n")
    assert lines[-1] == "ok", p.stdout
    assert all(line.endswith(" ValueError") for line in lines[:-1]), p.stdout
