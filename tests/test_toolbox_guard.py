"""A toolbox object's guard held by a thread that does not let it go (docs/design.md §12).

Every change of a toolbox object's shared state is made under its guard, a robust pthread
mutex in the segment. A holder stopped mid-change (Ctrl-Z, a debugger) keeps it: a timed
wait must still end at its timeout with threading's result, and Ctrl-C of a main thread
blocked there must raise KeyboardInterrupt, having changed nothing. A guard word scribbled
to name a live thread that is no participant of the region (which will never let it go)
ends every call that waits for it, timed or not, with CorruptRegionError naming the
guard: never a wait for ever.

The guard is held deterministically: the child writes into the guard's futex word (the
body's line 2, shm_layout.h) a TID; nothing but our own write can release it (a robust
mutex's holder is only ever checked at its death). A stopped holder is a thread of the
child registered in the region (it holds a participant's token) that does nothing; a
stray one the TID of a live ``sleep`` process this test starts. Each case runs in a child
interpreter, so a hang is a subprocess timeout, not a stuck test run.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
from support.common import shm_path, shm_remove, uniq

LATE = 0.3  # a timed call ends within timeout + LATE; KeyboardInterrupt within LATE

CHILD = r"""
import os, signal, struct, sys, threading, time
import shmlocks

signal.signal(signal.SIGINT, signal.default_int_handler)
what, mode, holder, name, path = sys.argv[1:6]
if what == "semaphore":
    obj = shmlocks.Semaphore(0, name=name)
    call = lambda t: obj.acquire(timeout=t)
elif what == "event":
    obj = shmlocks.Event(name=name)
    call = lambda t: obj.wait(t)
elif what == "barrier":
    obj = shmlocks.Barrier(2, name=name)
    call = lambda t: obj.wait(timeout=t)
else:
    obj = shmlocks.Condition(shmlocks.RLock(), name=name)
    call = lambda t: obj.wait(t)


def participant():
    # a thread of this process that is a participant of the object's region (it holds a
    # token there) and then does nothing, as a holder stopped mid-change: its TID
    got = []

    def run():
        if what == "semaphore":
            obj.acquire(False)
        elif what == "event":
            obj.wait(0)
        elif what == "barrier":
            obj._enroll()
        else:
            with obj:
                obj.wait(0)
        got.append(threading.get_native_id())
        threading.Event().wait()

    threading.Thread(target=run, daemon=True).start()
    while not got:
        time.sleep(0.005)
    return got[0]


holder = participant() if holder == "participant" else int(holder)
if what == "condition":
    obj.acquire()

fd = os.open(path, os.O_RDWR)
(_m, _v, _ln, _t, _L, _P, _d, _p, locks_off, _s) = struct.unpack_from(
    "<QIIQIIQQQQ", os.pread(fd, 64, 0))
GUARD = locks_off + 2 * 128          # body 0, word B: the guard (shm_toolbox.h)
inside = mode.startswith("inside-")
if inside:
    # the call is inside the wait (counted in the barrier, a condition ticket taken) when
    # the guard is taken from it: it must leave without it
    def take_guard_once_inside():
        while obj._describe()["waiters"] != 1:
            time.sleep(0.005)
        os.pwrite(fd, struct.pack("<I", holder), GUARD)
        print("waiting", flush=True)

    threading.Thread(target=take_guard_once_inside, daemon=True).start()
    mode = mode[len("inside-"):]
else:
    os.pwrite(fd, struct.pack("<I", holder), GUARD)

t0 = time.monotonic()
try:
    if mode == "timeout":
        res = repr(call(0.5))
    else:
        if not inside:
            print("waiting", flush=True)
        res = repr(call(None))
except BaseException as e:
    res = type(e).__name__
took = time.monotonic() - t0
print(res, flush=True)
print(f"{took:.3f}", flush=True)

os.pwrite(fd, struct.pack("<I", 0), GUARD)   # let go of the guard: the object works again
os.close(fd)
if inside and what == "barrier":
    obj.reset()      # (the leaving it could not finish is finished by this guard holder)
elif inside:
    obj.notify()
if what == "semaphore":
    obj.release()
    print(obj.acquire(timeout=2), obj.value, flush=True)
elif what == "event":
    obj.set()
    print(obj.wait(2), flush=True)
elif what == "barrier":
    # nothing half done: nobody counted as waiting, not broken, and it still works
    print(obj.n_waiting, obj.broken, flush=True)
    th = threading.Thread(target=obj.wait, args=(5,))
    th.start()
    idx = obj.wait(5)
    th.join()
    print(idx in (0, 1), flush=True)
else:
    # the lock is held again (or still), no ticket left behind: a notify reaches nobody
    recs = list(obj._raw().values())[-1]     # (units, inside, member, ticket, ...)
    print(obj._is_owned(), max(r[3] for r in recs), flush=True)
    obj.notify()
    print(obj.wait(0.05), flush=True)
    obj.release()
obj.close()
print("done", flush=True)
"""

#: each primitive's timed result, as threading gives it
TIMED = {
    "semaphore": "False",
    "event": "False",
    "barrier": "BrokenBarrierError",
    "condition": "False",
}

#: what the child prints once the guard is back, per primitive
AFTER = {
    "semaphore": ["True 0"],
    "event": ["True"],
    "barrier": ["0 False", "True"],
    "condition": ["True 0", "False"],
}


class _Holder:
    """A live process whose TID (its PID: one thread) names the guard's holder."""

    def __enter__(self):
        self.p = subprocess.Popen(["sleep", "60"])
        return self.p.pid

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait(10)


class _Child:
    """A child interpreter running CHILD, whose stdout is read line by line with a
    timeout (raw reads: nothing hides in a buffer from select)."""

    def __init__(self, what: str, mode: str, holder: int | str, name: str):
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, what, mode, str(holder), name, shm_path(name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        self.buf = b""

    def readline(self, timeout: float) -> str | None:
        """The next line, or None if none comes within ``timeout`` (or the output ends)."""
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                return None
            data = os.read(self.p.stdout.fileno(), 4096)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode().strip()

    def rest(self, timeout: float) -> list[str]:
        """Every line up to the child's exit (0 expected) within ``timeout``."""
        lines = []
        end = time.monotonic() + timeout
        while (line := self.readline(max(0.0, end - time.monotonic()))) is not None:
            lines.append(line)
        if self.p.poll() is None and time.monotonic() >= end:
            self.kill()
            pytest.fail(f"the call hung on the held guard (child killed): {lines}")
        rc = self.p.wait(10)
        err = self.p.stderr.read().decode()
        assert rc == 0, (lines, err[-800:])
        return lines

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", sorted(TIMED))
def test_timed_wait_ends_at_its_timeout_on_a_held_guard(what):
    """sem.acquire(timeout=0.5), ev.wait(0.5), bar.wait(timeout=0.5), cond.wait(0.5) end
    within 0.5 s + LATE with threading's timeout result, and leave nothing half done."""
    name = uniq(f"tbg-{what}")
    try:
        c = _Child(what, "timeout", "participant", name)
        try:
            lines = c.rest(20)
        finally:
            c.kill()
    finally:
        shm_remove(name)
    out = "\n".join(lines)
    res, took = lines[0], float(lines[1])
    print(f"\n{what}: {res} after {took * 1e3:.0f} ms")
    assert res == TIMED[what], out
    assert 0.45 <= took <= 0.5 + LATE, out
    assert " ".join(lines[2:]) == " ".join([*AFTER[what], "done"]), out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", sorted(TIMED))
def test_ctrl_c_of_a_wait_on_a_held_guard(what):
    """A main thread blocked on the held guard (no timeout) gets KeyboardInterrupt within
    LATE of SIGINT, and the object is whole afterwards."""
    name = uniq(f"tbg-cc-{what}")
    try:
        c = _Child(what, "sigint", "participant", name)
        try:
            assert c.readline(20) == "waiting"
            time.sleep(0.42)  # in the guard's wait by now (off its 50 ms slices)
            t0 = time.monotonic()
            c.p.send_signal(signal.SIGINT)
            line = c.readline(5)
            took = time.monotonic() - t0
            assert line == "KeyboardInterrupt", f"no KeyboardInterrupt within 5 s: {line!r}"
            lines = c.rest(20)
        finally:
            c.kill()
    finally:
        shm_remove(name)
    print(f"\n{what}: KeyboardInterrupt {took * 1e3:.0f} ms after SIGINT")
    assert took <= LATE, took
    assert " ".join(lines[1:]) == " ".join([*AFTER[what], "done"]), lines


#: the calls that wait inside the object (a barrier's count, a condition's ticket)
INSIDE = ["barrier", "condition"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", INSIDE)
def test_timed_wait_inside_ends_at_its_timeout_when_the_guard_is_taken(what):
    """The guard is taken while the call already waits inside (counted in the barrier, a
    ticket taken): bar.wait(timeout=0.5) and cond.wait(0.5) still end within 0.5 s +
    LATE with threading's timeout result (they leave without the guard), and once it is
    back the object is whole: the next holder of the guard finishes their leaving."""
    name = uniq(f"tbg-in-{what}")
    try:
        c = _Child(what, "inside-timeout", "participant", name)
        try:
            lines = c.rest(20)
        finally:
            c.kill()
    finally:
        shm_remove(name)
    out = "\n".join(lines)
    assert lines[0] == "waiting", out
    res, took = lines[1], float(lines[2])
    print(f"\n{what}: {res} after {took * 1e3:.0f} ms")
    assert res == TIMED[what], out
    assert 0.45 <= took <= 0.5 + LATE, out
    assert " ".join(lines[3:]) == " ".join([*AFTER[what], "done"]), out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", INSIDE)
def test_ctrl_c_of_a_wait_inside_when_the_guard_is_taken(what):
    """A main thread waiting inside (no timeout) when the guard is taken gets
    KeyboardInterrupt within LATE of SIGINT, and the object is whole afterwards."""
    name = uniq(f"tbg-inc-{what}")
    try:
        c = _Child(what, "inside-sigint", "participant", name)
        try:
            assert c.readline(20) == "waiting"
            time.sleep(0.3)
            t0 = time.monotonic()
            c.p.send_signal(signal.SIGINT)
            line = c.readline(5)
            took = time.monotonic() - t0
            assert line == "KeyboardInterrupt", f"no KeyboardInterrupt within 5 s: {line!r}"
            lines = c.rest(20)
        finally:
            c.kill()
    finally:
        shm_remove(name)
    print(f"\n{what}: KeyboardInterrupt {took * 1e3:.0f} ms after SIGINT")
    assert took <= LATE, took
    assert " ".join(lines[1:]) == " ".join([*AFTER[what], "done"]), lines


#: a thread of the child registered in the barrier's region that does nothing: the
#: guard's holder (a stopped one), by its TID
PARTICIPANT = r"""
import threading, time


def participant(bar):
    got = []

    def run():
        bar._enroll()
        got.append(threading.get_native_id())
        threading.Event().wait()

    threading.Thread(target=run, daemon=True).start()
    while not got:
        time.sleep(0.005)
    return got[0]
"""

EXIT_CHILD = (
    PARTICIPANT
    + r"""
import os, struct, sys
import shmlocks

name, path = sys.argv[1:3]
bar = shmlocks.Barrier(2, name=name)
holder = participant(bar)
fd = os.open(path, os.O_RDWR)
locks_off = struct.unpack_from("<QIIQIIQQQQ", os.pread(fd, 64, 0))[8]
os.pwrite(fd, struct.pack("<I", holder), locks_off + 2 * 128)
print("exiting", flush=True)
"""
)


@pytest.mark.timeout(60)
def test_exit_with_a_barrier_whose_guard_is_held_does_not_hang():
    """At its end a process withdraws from the barriers it has (Barrier._forget_mine,
    under the guard): with the guard held by another, it gives up after 2 s and exits."""
    name = uniq("tbg-exit")
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", EXIT_CHILD, name, shm_path(name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        t0 = time.monotonic()
        try:
            out, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            pytest.fail("the process hung at its exit on the held guard (killed)")
        took = time.monotonic() - t0
    finally:
        shm_remove(name)
    assert p.returncode == 0, err.decode()[-800:]
    assert out.decode().split() == ["exiting"]
    assert took < 10, took


OPEN_CHILD = (
    PARTICIPANT
    + r"""
import os, struct, sys, time
import shmlocks

name, path = sys.argv[1:3]
bar = shmlocks.Barrier(2, name=name)
holder = participant(bar)
fd = os.open(path, os.O_RDWR)
locks_off = struct.unpack_from("<QIIQIIQQQQ", os.pread(fd, 64, 0))[8]
os.pwrite(fd, struct.pack("<I", holder), locks_off + 2 * 128)
t0 = time.monotonic()
other = shmlocks.Barrier.open(name)   # enrols this process: under the guard
print(f"{time.monotonic() - t0:.3f}", flush=True)
os.pwrite(fd, struct.pack("<I", 0), locks_off + 2 * 128)
other.close()
bar.close()
"""
)


@pytest.mark.timeout(60)
def test_open_of_a_barrier_whose_guard_is_held_does_not_hang():
    """Opening a barrier enrols the process as a party, under the guard: held by another
    (a stopped holder, a scribbled word), the open gives up enrolling after 2 s."""
    name = uniq("tbg-open")
    try:
        p = subprocess.Popen(
            [sys.executable, "-c", OPEN_CHILD, name, shm_path(name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            pytest.fail("Barrier.open hung on the held guard (killed)")
    finally:
        shm_remove(name)
    assert p.returncode == 0, err.decode()[-800:]
    assert 1.9 <= float(out.decode().split()[0]) < 5, out


STRAY_CHILD = r"""
import os, struct, sys, threading, time
import shmlocks

what, holder, name, path = sys.argv[1:5]
kind = what.split(".")[0]
if kind == "semaphore":
    obj = shmlocks.Semaphore(0, name=name)
elif kind == "barrier":
    obj = shmlocks.Barrier(2, name=name)
else:
    obj = shmlocks.Condition(shmlocks.RLock(), name=name)


def cv(f):
    with obj:
        return f()


calls = {
    "semaphore.release": lambda: obj.release(),
    "semaphore.acquire": lambda: obj.acquire(),
    "semaphore.acquire(timeout=30)": lambda: obj.acquire(timeout=30),
    "semaphore.with": lambda: obj.__enter__(),
    "barrier.reset": lambda: obj.reset(),
    "barrier.abort": lambda: obj.abort(),
    "barrier.wait": lambda: obj.wait(),
    "condition.notify": lambda: cv(obj.notify),
    "condition.notify_all": lambda: cv(obj.notify_all),
    "condition.wait": lambda: cv(obj.wait),
    "condition.wait(30)": lambda: cv(lambda: obj.wait(30)),
}
fd = os.open(path, os.O_RDWR)
locks_off = struct.unpack_from("<QIIQIIQQQQ", os.pread(fd, 64, 0))[8]
GUARD = locks_off + 2 * 128          # body 0, word B: the guard (shm_toolbox.h)
os.pwrite(fd, struct.pack("<I", int(holder)), GUARD)
t0 = time.monotonic()
try:
    res = repr(calls[what]())
except BaseException as e:
    res = f"{type(e).__name__}: {e}"
print(f"{time.monotonic() - t0:.3f}", flush=True)
print(res, flush=True)

os.pwrite(fd, struct.pack("<I", 0), GUARD)   # the word let go: the object works again
os.close(fd)
if kind == "semaphore":
    obj.release()
    print(obj.acquire(timeout=2), obj.value, flush=True)
elif kind == "barrier":
    print(obj.n_waiting, obj.broken, flush=True)
    th = threading.Thread(target=obj.wait, args=(5,))
    th.start()
    print(obj.wait(5) in (0, 1), flush=True)
    th.join()
else:
    with obj:
        obj.notify()
        print(obj.wait(0.05), flush=True)
obj.close()
print("done", flush=True)
"""

#: what the child prints once the guard word is let go, per primitive
STRAY_AFTER = {"semaphore": "True 0", "barrier": "0 False True", "condition": "False"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "what",
    [
        "semaphore.release",
        "semaphore.acquire",
        "semaphore.acquire(timeout=30)",
        "semaphore.with",
        "barrier.reset",
        "barrier.abort",
        "barrier.wait",
        "condition.notify",
        "condition.notify_all",
        "condition.wait",
        "condition.wait(30)",
    ],
)
def test_a_guard_held_by_no_participant_ends_the_call(what):
    """The guard's word names a live thread that is no participant of the region (a
    scribble, a copy of a segment made while a guard was held): it will never let go.
    Every call that waits for it, without a timeout or with a long one, ends within a
    second with CorruptRegionError naming the object's guard and that thread, having
    changed nothing (they used to block for ever); the object works once the word is let
    go."""
    name = uniq("tbg-stray")
    try:
        with _Holder() as tid:
            p = subprocess.Popen(
                [sys.executable, "-c", STRAY_CHILD, what, str(tid), name, shm_path(name)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
                pytest.fail(f"{what} blocked on a guard held by no participant (killed)")
    finally:
        shm_remove(name)
    assert p.returncode == 0, err.decode()[-800:]
    lines = out.decode().strip().split("\n")
    took, res = float(lines[0]), lines[1]
    print(f"\n{what}: {res} after {took * 1e3:.0f} ms")
    assert res.startswith("CorruptRegionError: "), res
    assert "guard" in res and f"thread {tid}" in res and "no participant" in res, res
    assert took < 1.0, took
    assert " ".join(lines[2:]) == STRAY_AFTER[what.split(".")[0]] + " done", lines
