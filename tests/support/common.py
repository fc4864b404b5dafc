"""The test suite's helpers (tests/conftest.py holds only the fixtures): unique segment
names and /dev/shm clean-up, a tracker that starts child processes and kills only those (by
PID), a child that holds a lock on request, and small probes (is a process blocked in the
kernel? what did a call raise?).

Functions that run in child processes are module-level so that they pickle by reference
under the spawn and forkserver start methods (pytest puts tests/ on sys.path and
multiprocessing hands sys.path on, so children import ``support.common``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import uuid

import shmlocks

__all__ = [
    "USERSPACE_KINDS",
    "assert_child_excludes",
    "thread_holding",
    "FIFO_KINDS",
    "Holder",
    "KINDS",
    "NAME_PREFIX",
    "Procs",
    "ROBUST_KINDS",
    "RWSide",
    "SHM_DIR",
    "START_METHODS",
    "aside_count",
    "assert_timed_out",
    "close_quietly",
    "is_locked",
    "join_all",
    "join_or_kill",
    "journaled_section",
    "journals_settled",
    "cancelling",
    "kill",
    "me",
    "outcome",
    "run_lockdep",
    "run_python",
    "shm_entries",
    "shm_exists",
    "shm_path",
    "shm_remove",
    "stripe_bytes",
    "timed",
    "uniq",
    "until",
    "wait_aside",
    "wait_blocked",
    "wait_seated",
    "wait_stopped",
]

# --------------------------------------------------------------------------- constants

#: every lock kind, in the order shmlocks.KINDS lists them
KINDS = tuple(shmlocks.KINDS)
#: the kinds whose contract is FIFO order (the registry's ``fifo``)
FIFO_KINDS = tuple(k for k, c in shmlocks.KINDS.items() if c.fifo)
#: the kinds whose owner death the kernel recovers (robust futexes: the registry's ``recovery``)
ROBUST_KINDS = tuple(k for k, c in shmlocks.KINDS.items() if c.recovery == "kernel")
#: the kinds whose owner death this library recovers in user space (the registry's ``recovery``)
USERSPACE_KINDS = tuple(k for k, c in shmlocks.KINDS.items() if c.recovery == "user")
START_METHODS = ("fork", "spawn", "forkserver")

SHM_DIR = "/dev/shm"
NAME_PREFIX = "shmlt-"


# --------------------------------------------------------------------------- names

#: names handed out by uniq() during the current test (reset by the leak fixture)
names_this_test: set[str] = set()


def uniq(prefix: str) -> str:
    """A segment name no other test, worker or run will use."""
    name = f"{NAME_PREFIX}{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    names_this_test.add(name)
    return name


def shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name.lstrip("/"))


def shm_exists(name: str) -> bool:
    return os.path.exists(shm_path(name))


def shm_remove(name: str) -> None:
    """Remove a segment's name if it is still there (test clean-up only)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(shm_path(name))


def shm_entries() -> set[str]:
    return set(os.listdir(SHM_DIR))


def close_quietly(obj) -> None:
    """Close a lock or region if it is still open; unlink its name as a safety net."""
    if obj is None:
        return
    try:
        name = obj.name
    except Exception:
        name = None
    with contextlib.suppress(Exception):
        obj.close()
    if name:
        shm_remove(name)


# --------------------------------------------------------------------------- processes


def _trampoline(conn, func, args, kwargs):
    """Child side of Procs.call: run func and send back its result or its traceback."""
    try:
        result = func(*args, **kwargs)
    except BaseException as exc:  # everything, KeyboardInterrupt too, goes back to the parent
        conn.send(("err", "".join(traceback.format_exception(exc))))
    else:
        conn.send(("ok", result))
    conn.close()


class Procs:
    """Starts child processes and, at teardown, SIGKILLs the ones still alive, by PID."""

    def __init__(self):
        self._procs = []
        self._popens = []

    def start(self, target, *args, method="fork", ctx=None, **kwargs):
        ctx = ctx or mp.get_context(method)
        p = ctx.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        p.start()
        self._procs.append(p)
        return p

    def call(self, func, *args, method="fork", timeout=30.0, **kwargs):
        """Run ``func(*args, **kwargs)`` in a child and return its result.

        A child exception becomes an AssertionError carrying the child's traceback; a child
        that dies from a signal or does not answer within ``timeout`` fails the test.
        """
        ctx = mp.get_context(method)
        r, w = ctx.Pipe(duplex=False)
        p = self.start(_trampoline, w, func, args, kwargs, ctx=ctx)
        w.close()
        try:
            if not r.poll(timeout):
                kill(p)
                raise AssertionError(
                    f"child {func.__name__} ({method}) gave no answer in {timeout}s; "
                    f"exitcode={p.exitcode}"
                )
            try:
                status, value = r.recv()
            except EOFError:
                p.join(5)
                raise AssertionError(
                    f"child {func.__name__} ({method}) died without answering: "
                    f"exitcode={p.exitcode}"
                ) from None
        finally:
            r.close()
        p.join(10)
        if p.is_alive():
            kill(p)
            raise AssertionError(f"child {func.__name__} ({method}) did not exit")
        if status == "err":
            raise AssertionError(f"child {func.__name__} ({method}) raised:\n{value}")
        assert p.exitcode == 0, f"child {func.__name__} exit code {p.exitcode}"
        return value

    def popen(self, argv, **kwargs):
        p = subprocess.Popen(argv, **kwargs)
        self._popens.append(p)
        return p

    #: how long children still running at teardown get to end on their own (one deadline
    #: for all): one that ends is often the last user of a segment and leaves its name as
    #: it goes, which a SIGKILL would leave behind
    GRACE_S = 2.0

    def cleanup(self):
        for p in join_all([p for p in self._procs if p.is_alive()], self.GRACE_S):
            kill(p)
        for p in self._popens:
            if p.poll() is None:
                p.kill()  # Popen.kill signals its own PID only
                p.wait(10)


def kill(p, sig=signal.SIGKILL, timeout=10.0) -> None:
    """Kill one process we started, by its PID, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, sig)
    p.join(timeout)


def stripe_bytes(name: str, size: int, s: int) -> bytes:
    """Stripe s of the compact LockTable `name` of `size` stripes, as its file holds it
    (the stripes end the file; shm_layout.h SHM_STRIPE_LINES lines each)."""
    lay = shmlocks._core.LAYOUT
    stride = lay["stripe_lines"] * lay["line"]
    with open(os.path.join(SHM_DIR, name), "rb") as f:
        end = os.fstat(f.fileno()).st_size
        return os.pread(f.fileno(), stride, end - (size - s) * stride)


def journaled_section(t, ks, arr, held) -> None:
    """The section of the tables' random-kill tests, inside ``held`` (hold_all of the
    stripes ks of table t): stripe k guards arr[4k] (a value), arr[4k+1] (its journal is
    open), arr[4k+2] (the old value) and arr[4k+3] (its holder's pid), as an application
    keeps its repair state. A pid left by a holder the lock did not report dead is a
    second holder (arr[4k+3] = -1, SystemExit 3); an open journal is rolled back; the
    stripes held.died names are those that say owner_died; then the journaled update."""
    me = os.getpid()
    for k in ks:
        if arr[k * 4 + 3] not in (0, me) and not t[k].owner_died:
            arr[k * 4 + 3] = -1  # a holder left its mark and the lock said nothing
            raise SystemExit(3)
        if arr[k * 4 + 1]:  # a dead holder's open journal: roll back
            arr[k * 4], arr[k * 4 + 1] = arr[k * 4 + 2], 0
        arr[k * 4 + 3] = me
    died = sorted(i for i, k in enumerate(ks) if t[k].owner_died)
    assert sorted(held.died) == died, (held.died, died)
    held.mark_consistent()
    for k in ks:
        arr[k * 4 + 2], arr[k * 4 + 1] = arr[k * 4], 1
        arr[k * 4] += 1
        arr[k * 4 + 1] = 0
    for k in ks:
        arr[k * 4 + 3] = 0


def journals_settled(held, n: int, arr) -> int:
    """After a random-kill test, inside ``held`` (every stripe of the table, n of them):
    no stripe was ever marked held by two (journaled_section's -1), every open journal
    is rolled back, the holds are consistent again; returns the sum of the values."""
    for k in range(n):
        assert arr[k * 4 + 3] != -1, "a stripe was held by two processes"
        if arr[k * 4 + 1]:
            arr[k * 4], arr[k * 4 + 1] = arr[k * 4 + 2], 0
    held.mark_consistent()
    return sum(arr[k * 4] for k in range(n))


async def cancelling(worker, tasks: int, extras: int, seed: int) -> int:
    """Run ``tasks`` tasks of ``worker(rng, 40)`` while, ``extras`` times, a task of
    ``worker(rng, 5)`` is started and cancelled a few ms later (the async tests' random
    cancellations); returns the sum of what the long tasks return."""
    import asyncio

    rng = random.Random(seed)
    long = [asyncio.create_task(worker(random.Random(i), 40)) for i in range(tasks)]
    for _ in range(extras):
        await asyncio.sleep(rng.random() * 0.01)
        extra = asyncio.create_task(worker(random.Random(rng.random()), 5))
        await asyncio.sleep(rng.random() * 0.005)
        extra.cancel()
        try:
            await extra
        except asyncio.CancelledError:
            pass
    return sum(await asyncio.gather(*long))


def kill_at_random(ps, restart, seconds: float, seed: int) -> int:
    """For `seconds`, SIGKILL one of the workers `ps` (processes we started) every 5-30 ms
    and put `restart(w, kills)` in its place (each must still be alive: one that ended on
    its own fails the test); then kill them all. Returns the number of kills."""
    rng, kills = random.Random(seed), 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(0.005, 0.03))
        w = rng.randrange(len(ps))
        assert ps[w].is_alive(), f"worker {w} ended on its own: {ps[w].exitcode}"
        kill(ps[w])
        kills += 1
        ps[w] = restart(w, kills)
    for p in ps:
        kill(p)
    return kills + len(ps)


def join_all(processes, timeout: float) -> list:
    """Join every process within one shared deadline; return those still alive."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    return [p for p in processes if p.is_alive()]


def join_or_kill(processes, timeout: float) -> list:
    """join_all, then SIGKILL (by PID) those still alive; return them (the caller asserts
    there are none)."""
    stuck = join_all(processes, timeout)
    for p in stuck:
        kill(p)
    return stuck


def run_python(code: str, *args: str, timeout: float = 60.0, env=None, **kwargs):
    """Run a fresh interpreter on ``code`` (dedented) with ``sys.argv[1:] = args`` and
    ``env`` over this process's environment (a None value removes the variable); the
    caller checks returncode, stdout and stderr (a CompletedProcess)."""
    full = dict(os.environ, PYTHONFAULTHANDLER="1")
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        **kwargs,
    )


def run_lockdep(code: str, graph: str, *args: str, mode: str | None = "1", **env):
    """run_python with lock-order validation (SHMLOCKS_LOCKDEP=mode; None: off) and its
    graph file; ``env`` adds variables."""
    env = {"SHMLOCKS_LOCKDEP": mode, "SHMLOCKS_LOCKDEP_GRAPH": graph, **env}
    return run_python(code, *args, timeout=60.0, env=env)


def aside_count(lock) -> int:
    """How many waiters are aside on FIFO lock ``lock`` (docs/design.md §7.0)."""
    return len(lock._raw()["aside"]["aside"])


def wait_seated(lock, who: str = "waiter 0", timeout: float = 10.0) -> None:
    """Until the spinner seat of FIFO lock ``lock`` is taken (one seat: the tests' own
    _aside_init(1)); AssertionError naming ``who`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while lock._raw()["aside"]["seats"] == [0] and time.monotonic() < end:
        time.sleep(0.001)
    assert lock._raw()["aside"]["seats"] != [0], f"{who} took no seat"


def wait_aside(lock, n: int, who: str | None = None, timeout: float = 10.0) -> None:
    """Until ``n`` waiters are aside on FIFO lock ``lock``; AssertionError naming ``who``
    (default: waiter n) unless exactly ``n`` are, after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while aside_count(lock) < n and time.monotonic() < end:
        time.sleep(0.001)
    assert aside_count(lock) == n, f"{who or f'waiter {n}'} did not step aside"


def until(pred, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll pred() every 5 ms until it is true; AssertionError naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def join_thread(t: threading.Thread, timeout: float = 60.0) -> None:
    """Join `t`, then wait until its OS thread is gone. join() returns when the Python
    part ends, before the thread's exit runs its thread-specific destructors, which give
    back the thread's registrations (so a region another thread closed meanwhile is
    unmapped, and its name removed, only then)."""
    t.join(timeout)
    assert not t.is_alive(), f"thread {t.name} did not end within {timeout} s"
    task = f"/proc/self/task/{t.native_id}"
    until(lambda: not os.path.exists(task), timeout, f"thread {t.native_id} gone")


def wait_stopped(pid: int, timeout: float = 20.0) -> None:
    """Wait until process ``pid`` is stopped (state T: SIGSTOP, e.g. at a crash point armed
    with SHMLOCKS_CRASHPOINT_ACTION=stop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state == "T":
            return
        if state in ("Z", "X", "gone"):
            raise AssertionError(f"process {pid} exited instead of stopping")
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never stopped within {timeout}s")


def wait_blocked(pid: int, timeout: float = 5.0) -> bool:
    """Wait until process ``pid`` sleeps in the kernel on a lock (a futex wait, or the
    rt_mutex of FUTEX_LOCK_PI): its lock wait has parked.

    Returns False if /proc/<pid>/wchan is not informative on this kernel, after a plain
    0.2 s grace sleep (the fallback the tests rely on then).
    """
    path = f"/proc/{pid}/wchan"
    deadline = time.monotonic() + timeout
    informative = False
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                wchan = f.read().strip()
        except OSError:
            break
        if wchan not in ("", "0"):
            informative = True
        if "futex" in wchan or "rt_mutex" in wchan:
            time.sleep(0.02)
            return True
        time.sleep(0.002)
    if not informative:
        time.sleep(0.2)
        return False
    raise AssertionError(f"process {pid} did not block in a lock wait within {timeout}s")


# --------------------------------------------------------------------------- small probes


def outcome(func, *args, **kwargs):
    """``("ok", result)`` or the name of the exception ``func`` raised (for child reports)."""
    try:
        return ("ok", func(*args, **kwargs))
    except Exception as exc:
        return type(exc).__name__


def me() -> tuple[int, int]:
    return (os.getpid(), threading.get_native_id())


def is_locked(lock) -> bool:
    """``lock.locked()``, or its equivalent for multiprocessing.Lock (3.11 lacks it)."""
    if hasattr(lock, "locked"):
        return lock.locked()
    if lock.acquire(False):
        lock.release()
        return False
    return True


def timed(func, *args, **kwargs):
    t0 = time.monotonic()
    result = func(*args, **kwargs)
    return result, time.monotonic() - t0


def assert_timed_out(lock, timeout: float, *, blocking=True, early: float = 1e-3) -> float:
    """``lock.acquire(blocking, timeout)`` must return False after >= timeout (``early``
    seconds sooner at most), well before timeout + 1 s. Returns the time it took."""
    result, elapsed = timed(lock.acquire, blocking, timeout)
    assert result is False, f"acquire(timeout={timeout}) returned {result!r} on a held lock"
    assert elapsed >= timeout - early, f"acquire(timeout={timeout}) gave up early: {elapsed:.4f}s"
    assert elapsed < timeout + 1.0, f"acquire(timeout={timeout}) overran: {elapsed:.3f}s"
    return elapsed


# --------------------------------------------------------------------------- a holder child


def _holder_main(lock, conn, release_ev, hold_max):
    ok = lock.acquire(True, 10)
    conn.send((os.getpid(), threading.get_native_id(), ok))
    if not ok:
        return
    release_ev.wait(hold_max)
    released_at = time.monotonic()
    lock.release()
    conn.send(released_at)


class Holder:
    """A child process holding ``lock`` until ``release()`` (or being killed)."""

    def __init__(self, procs: Procs, lock, method="fork", hold_max=30.0):
        ctx = mp.get_context(method)
        self._release_ev = ctx.Event()
        self._r, w = ctx.Pipe(duplex=False)
        self.proc = procs.start(_holder_main, lock, w, self._release_ev, hold_max, ctx=ctx)
        w.close()
        if not self._r.poll(30):
            kill(self.proc)
            raise AssertionError("holder child did not report within 30 s")
        self.pid, self.tid, ok = self._r.recv()
        assert ok, "holder child could not acquire the (free) lock within 10 s"
        self.released_at = None

    @property
    def owner(self) -> tuple[int, int]:
        return (self.pid, self.tid)

    def release(self, timeout=10.0) -> float:
        """Tell the child to release; returns the monotonic time it released at."""
        self._release_ev.set()
        assert self._r.poll(timeout), "holder child did not release"
        self.released_at = self._r.recv()
        self.proc.join(timeout)
        assert self.proc.exitcode == 0, f"holder exit code {self.proc.exitcode}"
        return self.released_at

    def kill(self) -> None:
        kill(self.proc)
        assert self.proc.exitcode == -signal.SIGKILL


@contextlib.contextmanager
def thread_holding(lock, timeout: float = 20.0):
    """Another thread of this process holds ``lock`` for the ``with`` block (it releases
    when the block ends); yields that thread's ``(pid, tid)``."""
    held, done = threading.Event(), threading.Event()

    def hold():
        lock.acquire()
        held.set()
        done.wait(timeout)
        lock.release()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10), "the holder thread never got the lock"
        yield (os.getpid(), t.native_id)
    finally:
        done.set()
        t.join(10)


def assert_child_excludes(procs: Procs, lock, method: str = "fork") -> None:
    """A child process holding ``lock`` keeps this process out (a bounded acquire fails and
    the owner is the child); once it releases, the lock is ours."""
    holder = Holder(procs, lock, method=method)
    try:
        assert lock.acquire(timeout=0.1) is False
        assert lock.owner == holder.owner
    finally:
        holder.release()
    assert lock.acquire(timeout=1) is True
    lock.release()


class RWSide:
    """One side of an RWLock (read or write) with a lock's acquire/release/locked, so a
    test written for locks takes RWLock holds and waits too."""

    def __init__(self, rw, write):
        self.rw, self.write = rw, write

    def acquire(self, blocking=True, timeout=-1):
        side = self.rw.acquire_write if self.write else self.rw.acquire_read
        return side(blocking, timeout)

    def release(self):
        (self.rw.release_write if self.write else self.rw.release_read)()

    def locked(self):
        return self.rw.locked()

    @property
    def owner_died(self):
        return self.rw.owner_died

    def mark_consistent(self):
        self.rw.mark_consistent()
