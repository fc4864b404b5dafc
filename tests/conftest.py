"""Shared fixtures and helpers for the shmlocks test suite.

Everything a test needs in more than one file lives here: unique segment names, the
/dev/shm leak check, a tracker that starts child processes and kills only those (by PID),
the generic mutual-exclusion checker (used by the conformance suite and the stress tests),
a child that holds a lock on request, and small probes (is a process blocked in the
kernel? what did a call raise?).

Functions that run in child processes are module-level so that they pickle by reference
under the spawn and forkserver start methods (the child imports this module as
``conftest``: pytest puts tests/ on sys.path and multiprocessing hands sys.path on).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid

import pytest

import shmlocks

# --------------------------------------------------------------------------- constants

#: every lock kind, in the order shmlocks.KINDS lists them
KINDS = tuple(shmlocks.KINDS)
#: the kinds whose contract is FIFO order
FIFO_KINDS = ("ticket", "mcs", "clh")
#: the kinds backed by kernel robust futexes (owner death recovery in this issue)
ROBUST_KINDS = ("robust", "pi")
START_METHODS = ("fork", "spawn", "forkserver")

SHM_DIR = "/dev/shm"
NAME_PREFIX = "shmlt-"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes several seconds on purpose")


# --------------------------------------------------------------------------- names

#: names handed out by uniq() during the current test (reset by the leak fixture)
_names_this_test: set[str] = set()


def uniq(prefix: str) -> str:
    """A segment name no other test, worker or run will use."""
    name = f"{NAME_PREFIX}{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _names_this_test.add(name)
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


@pytest.fixture(autouse=True)
def _no_shm_leak():
    """Fail a test that leaves one of *its own* segments in /dev/shm.

    xdist runs tests of other workers at the same time, so only names this test made are
    considered: those uniq() handed out during it, or shmlt- names carrying this worker's
    PID that appeared during it (each worker runs one test at a time).
    """
    _names_this_test.clear()
    before = shm_entries()
    yield
    gc.collect()  # creator objects dropped by the test are finalised (and unlink) here
    token = f"-{os.getpid()}-"
    after = shm_entries()
    leaked = sorted(
        n
        for n in after
        if n.startswith(NAME_PREFIX) and (n in _names_this_test or (n not in before and token in n))
    )
    for n in leaked:
        shm_remove(n)
    assert not leaked, f"segments left in {SHM_DIR} by this test: {leaked}"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


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


@pytest.fixture
def new_lock():
    """Factory: ``new_lock(kind, **create_kwargs)`` makes a lock with a unique name and
    closes it (unlinking the name) at teardown."""
    made = []

    def make(kind_name: str, **kwargs):
        cls = shmlocks.KINDS[kind_name]
        kwargs.setdefault("name", uniq(kind_name))
        lock = cls.create(**kwargs)
        made.append(lock)
        return lock

    yield make
    for lock in reversed(made):
        close_quietly(lock)


@pytest.fixture
def new_region():
    """Factory: ``new_region(**create_kwargs)``, closed at teardown."""
    made = []

    def make(**kwargs):
        kwargs.setdefault("name", uniq("region"))
        region = shmlocks.Region.create(**kwargs)
        made.append(region)
        return region

    yield make
    for region in reversed(made):
        close_quietly(region)


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

    def cleanup(self):
        for p in self._procs:
            if p.is_alive():
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


@pytest.fixture
def procs():
    tracker = Procs()
    try:
        yield tracker
    finally:
        tracker.cleanup()


def join_all(processes, timeout: float) -> list:
    """Join every process within one shared deadline; return those still alive."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    return [p for p in processes if p.is_alive()]


def run_python(code: str, *args: str, timeout: float = 60.0, **kwargs):
    """Run a fresh interpreter on ``code`` with ``sys.argv[1:] = args``; the caller checks
    returncode, stdout and stderr (a CompletedProcess)."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )


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


def assert_timed_out(lock, timeout: float, *, blocking=True) -> float:
    """``lock.acquire(blocking, timeout)`` must return False after >= timeout, well before
    timeout + 1 s. Returns the time it took."""
    result, elapsed = timed(lock.acquire, blocking, timeout)
    assert result is False, f"acquire(timeout={timeout}) returned {result!r} on a held lock"
    assert elapsed >= timeout - 1e-3, f"acquire(timeout={timeout}) gave up early: {elapsed:.4f}s"
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


# --------------------------------------------------------------------------- the checker


def _hammer(lock, counter, inside, violations, barrier, iters):
    """Child side of the mutual-exclusion checker.

    The critical section reads the shared counter, dawdles (a busy loop, and every 16th
    round a sched_yield so that another process gets the CPU mid-section), then writes it
    back: without real exclusion, increments are lost. ``inside`` is checked inside the
    critical section, as CK's validators do.
    """
    barrier.wait(60)
    for i in range(iters):
        lock.acquire()
        try:
            if inside.value:
                violations.value += 1
            inside.value = 1
            v = counter.value
            if i % 16 == 0:
                os.sched_yield()
            else:
                for _ in range(10):
                    pass
            counter.value = v + 1
            inside.value = 0
        finally:
            lock.release()


class ExclusionReport:
    def __init__(self, total, expected, violations, seconds):
        self.total, self.expected = total, expected
        self.violations, self.seconds = violations, seconds

    @property
    def ok(self) -> bool:
        return self.total == self.expected and self.violations == 0

    def __repr__(self):
        return (
            f"ExclusionReport(total={self.total}, expected={self.expected}, "
            f"violations={self.violations}, seconds={self.seconds:.2f})"
        )


def _hammer_threads(lock, counter, inside, violations, barrier, iters, nthreads):
    threads = [
        threading.Thread(target=_hammer, args=(lock, counter, inside, violations, barrier, iters))
        for _ in range(nthreads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def check_mutual_exclusion(
    procs: Procs, lock, method: str, nprocs=3, iters=2000, timeout=90.0, nthreads=1
):
    """N processes x M read-dawdle-write increments under ``lock``; report what happened.

    With ``nthreads`` > 1 each process runs that many threads, each its own participant.
    A hang (a worker not finished within ``timeout``) or a worker that dies fails at once.
    """
    ctx = mp.get_context(method)
    counter = ctx.Value("q", 0, lock=False)
    inside = ctx.Value("q", 0, lock=False)
    violations = ctx.Value("q", 0, lock=False)
    barrier = ctx.Barrier(nprocs * nthreads)
    t0 = time.monotonic()
    workers = [
        procs.start(
            _hammer_threads, lock, counter, inside, violations, barrier, iters, nthreads, ctx=ctx
        )
        for _ in range(nprocs)
    ]
    stuck = join_all(workers, timeout)
    for p in stuck:
        kill(p)
    assert not stuck, f"{len(stuck)} of {nprocs} workers still running after {timeout}s"
    codes = [p.exitcode for p in workers]
    assert codes == [0] * nprocs, f"worker exit codes {codes}"
    expected = nprocs * nthreads * iters
    return ExclusionReport(counter.value, expected, violations.value, time.monotonic() - t0)


class NoLock:
    """A deliberately broken lock: acquire always succeeds, nothing is excluded."""

    def acquire(self, blocking=True, timeout=-1):
        return True

    def release(self):
        pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class LeakyLock(NoLock):
    """A deliberately broken lock built over a real shmlocks lock: acquire takes the real
    lock and lets go of it at once, so every caller "holds" it at the same time."""

    def __init__(self, inner):
        self.inner = inner

    def acquire(self, blocking=True, timeout=-1):
        got = self.inner.acquire(blocking, timeout)
        if got:
            self.inner.release()
        return got


def busy_for(seconds: float) -> None:
    """Burn CPU for ``seconds`` of wall time (always bounded)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# --------------------------------------------------------------------------- abort stress


def _stress_process(lock, counter, successes, stalls, barrier, base, nthreads, rounds, seed):
    """Child side of abort_stress: ``nthreads`` threads, each ``rounds`` acquire attempts
    with a random mix of try-locks, tiny timeouts and long ("blocking") timeouts."""

    def worker(t):
        rng = random.Random(seed * 1000 + t)
        barrier.wait(60)
        mine = 0
        for _ in range(rounds):
            r = rng.random()
            if r < 0.15:
                got = lock.acquire(False)
            elif r < 0.25:
                got = lock.acquire(True, 0)
            elif r < 0.6:
                got = lock.acquire(True, rng.uniform(0.00001, 0.002))
            else:
                got = lock.acquire(True, 5.0)  # "blocking", but bounded
                if not got:
                    stalls[base + t] += 1
            if got:
                v = counter.value
                if rng.random() < 0.1:
                    os.sched_yield()
                counter.value = v + 1
                mine += 1
                lock.release()
        successes[base + t] = mine

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


class StressReport:
    def __init__(self, counter, successes, stalls):
        self.counter, self.successes, self.stalls = counter, successes, stalls

    @property
    def ok(self) -> bool:
        return (
            -1 not in self.successes
            and sum(self.successes) > 0
            and self.counter == sum(self.successes)
            and sum(self.stalls) == 0
        )

    def __repr__(self):
        return (
            f"StressReport(counter={self.counter}, sum(successes)={sum(self.successes)}, "
            f"successes={self.successes}, stalled 5 s blocking acquires={self.stalls})"
        )


def abort_stress(
    procs: Procs, lock, nprocs=3, nthreads=2, rounds=1500, method="fork", timeout=75.0
) -> StressReport:
    """Many short acquire rounds, most of them giving up early (timeouts), from threads of
    several processes. A worker hang fails at once; the report says whether the counter
    stayed exact (no lost or phantom critical sections) and whether any long wait stalled
    (a stranded queue or a lost wake-up)."""
    ctx = mp.get_context(method)
    n = nprocs * nthreads
    counter = ctx.Value("q", 0, lock=False)
    successes = ctx.Array("q", [-1] * n, lock=False)
    stalls = ctx.Array("q", [0] * n, lock=False)
    barrier = ctx.Barrier(n)
    workers = [
        procs.start(
            _stress_process,
            lock,
            counter,
            successes,
            stalls,
            barrier,
            i * nthreads,
            nthreads,
            rounds,
            i,
            ctx=ctx,
        )
        for i in range(nprocs)
    ]
    stuck = join_all(workers, timeout)
    for p in stuck:
        kill(p)
    assert not stuck, f"stress workers hung: {len(stuck)} of {nprocs} still running"
    assert [p.exitcode for p in workers] == [0] * nprocs
    return StressReport(counter.value, list(successes), list(stalls))
