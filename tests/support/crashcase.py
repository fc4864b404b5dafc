"""The crash-point ``Case``: a child interpreter armed with ``SHMLOCKS_CRASHPOINT`` dies at
one named protocol step while three survivor processes hold and wait; the case checks the
survivors go on, ``owner_died`` is seen exactly where it must be, exclusion held (the
checker of shmlocks/_harness.py) and every dead participant's slot is free again.
tests/test_crashpoints.py runs it for every (kind, point, order).

The shared state is one file-backed mapping of int64 words that every process of a case maps.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import multiprocessing as mp
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

import shmlocks
from shmlocks._harness import Exclusion
from support.common import join_or_kill

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


# --------------------------------------------------------------------------- shared state
# One file-backed mapping of int64 words that every process of a case maps: the test, the
# survivors and victims (forked), and the crash child (a fresh interpreter).

WORDS = 2048
STOP = 3  # survivors stop
GO = 4  # the child may start
VICTIM_PID = 5  # recovery cases: pid of the current victim
CHILD_SEQ = 6  # seq of the child's last critical section + 1 (0: none yet)
CHILD_AT = 7  # recovery cases: 1 while the child's queued thread is in acquire..release
DIED_N = 8  # holds that saw owner_died
LAST_ACQ = 32  # + id: CLOCK_MONOTONIC ns of the last acquisition
STALLS = 48  # + id: bounded "blocking" acquires that timed out
DIED_LOG = 64  # 3 words per entry: (id, seq, ns)
DIED_MAX = 300
CHECK = 1024  # the exclusion checker's words (shmlocks/_harness.py)

SURVIVORS = (1, 2, 3)
CHILD = 4  # the crash child (normal cases)
CHILD_WAITER = 5  # the crash child's queued thread (recovery cases)
VICTIM = 6
NAMES = {
    1: "survivor 1",
    2: "survivor 2",
    3: "survivor 3",
    4: "child",
    5: "child thread",
    6: "victim",
}

MAX_PARTICIPANTS = 8
FIRST_THREAD = 7  # ids of the threads that use every slot at the end: 7 .. 7 + 8 - 1
HAMMER_ROUNDS = 20
SOAK = 0.2  # seconds the survivors go on after the death (latent damage shows up)
CHILD_BUDGET = 5.0  # seconds of its own CPU time the child tries to reach its point
CHILD_WALL = 20.0  # ... and of wall time at most (a loaded machine may run it little)


def make_shared(path: str) -> memoryview:
    with open(path, "wb") as f:
        f.write(b"\0" * (8 * WORDS))
    return map_shared(path)


def map_shared(path: str) -> memoryview:
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 8 * WORDS)
    finally:
        os.close(fd)
    return memoryview(mm).cast("q")


def checker(a: memoryview) -> Exclusion:
    return Exclusion(a, CHECK, participants=16)


def enter(lock, a: memoryview, who: int) -> int:
    """The first half of a critical section (the lock is held): repair after an owner
    death, then the checker's section (overlap check, the non-atomic increment, widened by
    a yield, and its count). Returns the seq (the counter before the increment)."""
    t = time.monotonic_ns()
    ex = checker(a)
    died = lock.owner_died
    if died:
        ex.repair()  # the dead holder's section is over
        lock.mark_consistent()
    seq = ex.enter(who, widen=True)
    a[LAST_ACQ + who] = t
    if died:
        n = a[DIED_N]
        if n < DIED_MAX:
            a[DIED_LOG + 3 * n] = who
            a[DIED_LOG + 3 * n + 1] = seq
            a[DIED_LOG + 3 * n + 2] = t
        a[DIED_N] = n + 1
    ex.count(who)
    return seq


def leave(lock, a: memoryview, who: int, hold: float = 0.0) -> None:
    if hold:
        time.sleep(hold)
    checker(a).leave(who)
    lock.release()


# --------------------------------------------------------------------------- processes


def _survivor(lock, path: str, who: int, seed: int) -> None:
    """Holds and waits until told to stop: blocking acquires (bounded: a timeout is a
    stall), short timeouts, try-locks; now and then a long hold, so waiters park and time
    out. An exception is written to ``path + ".err<who>"`` for the test to show."""
    a = map_shared(path)
    rng = random.Random(seed)
    stack = open(f"{path}.stack{who}", "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    try:
        while not a[STOP]:
            r = rng.random()
            if r < 0.1:
                got = lock.acquire(False)
            elif r < 0.3:
                got = lock.acquire(True, rng.uniform(0.0005, 0.004))
            else:
                got = lock.acquire(True, 5.0)
                if not got:
                    a[STALLS + who] += 1
            if got:
                enter(lock, a, who)
                long_hold = rng.random() < 0.08
                leave(
                    lock, a, who, rng.uniform(0.01, 0.03) if long_hold else rng.uniform(0, 0.0004)
                )
            time.sleep(rng.uniform(0, 0.001))
    except BaseException as e:
        with open(f"{path}.err{who}", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        raise
    lock.close()


def _victim(lock, path: str, conn) -> None:
    """Takes the lock, enters its critical section, reports its seq, waits to be killed."""
    a = map_shared(path)
    if not lock.acquire(True, 10.0):
        conn.send(None)
        return
    conn.send(enter(lock, a, VICTIM))
    time.sleep(30)  # SIGKILLed long before this


def _child_main(argv: list[str]) -> None:
    """The crash child (a fresh interpreter with SHMLOCKS_CRASHPOINT set): loop until the
    point kills us; exit 3 if it was not reached within the budget."""
    kind, name, path, mode = argv
    lock = shmlocks.KINDS[kind].open(name)
    a = map_shared(path)
    deadline = time.monotonic() + 10
    while not a[GO]:
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.001)
    # The budget is CPU time: under load (CI beside other work, a busy 2-CPU box) a point
    # met in milliseconds when the child runs was "not reached" in 5 s of wall time the
    # child spent mostly waiting for a CPU. (A recoverer polls, so it is given the wall.)
    end = time.monotonic() + CHILD_WALL
    rng = random.Random()
    if mode == "recover":
        _child_recoverer(lock, a, end, rng)
    else:
        cpu_end = time.process_time() + CHILD_BUDGET
        while time.monotonic() < end and time.process_time() < cpu_end:
            r = rng.random()
            if r < 0.35:
                got = lock.acquire()
            elif r < 0.7:
                got = lock.acquire(True, rng.uniform(0.0002, 0.003))  # expires while queued
            elif r < 0.85:
                got = lock.acquire(False)
            else:
                got = lock.acquire(True, 0.05)
            if got:
                seq = enter(lock, a, CHILD)
                a[CHILD_SEQ] = seq + 1
                # now and then long enough for a queued survivor to time out behind us
                leave(lock, a, CHILD, rng.choice((0.0, 0.0, 0.0002, 0.003, 0.006)))
            time.sleep(rng.uniform(0, 0.0005))
    sys.exit(3)


def _child_recoverer(lock, a: memoryview, end: float, rng: random.Random) -> None:
    """One thread queued on the lock like the survivors; the main thread polls each
    victim's liveness token and recovers it the moment it dies (Region._recover_dead)."""

    def waiter() -> None:
        while time.monotonic() < end:
            a[CHILD_AT] = 1
            if lock.acquire(True, 5.0):
                enter(lock, a, CHILD_WAITER)
                leave(lock, a, CHILD_WAITER)
            a[CHILD_AT] = 0
            time.sleep(rng.uniform(0, 0.002))

    threading.Thread(target=waiter, daemon=True).start()
    region = lock.region
    seen = 0
    while time.monotonic() < end:
        pid = a[VICTIM_PID]
        if pid == 0 or pid == seen:
            time.sleep(0.0005)
            continue
        seen = pid
        # The victim is about to be SIGKILLed: poll its liveness token (a load per slot)
        # until the kernel marks it dead, so that we, not a waiter's 5 ms tick, recover it.
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None
        try:
            while time.monotonic() < end:
                if region._recover_dead():
                    break
                if fd is None or select.select([fd], [], [], 0)[0]:
                    region._recover_dead()
                    break
        finally:
            if fd is not None:
                os.close(fd)


CHILD_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); import support.crashcase as t; "
    "t._child_main(sys.argv[2:])"
)


# --------------------------------------------------------------------------- the case


class Case:
    def __init__(self, procs, lock, kind: str, point: str, tmp_path):
        self.procs, self.lock, self.kind, self.point = procs, lock, kind, point
        self.path = str(tmp_path / "shared")
        self.a = make_shared(self.path)
        self.errlog = str(tmp_path / "child.err")
        self.survivors = []
        self.victims = []  # (process, seq)
        self.child = None
        self.child_fd = None

    # -- starting

    def reserve_low_slot(self) -> None:
        """Occupy the lowest participant slot (a thread of this process), so that the
        survivors register above it and, once it is given back, the child takes it."""
        ready, self._free_slot = threading.Event(), threading.Event()

        def hold_slot() -> None:
            assert self.lock.acquire(True, 5.0)
            self.lock.release()
            ready.set()
            self._free_slot.wait(30)

        self._slot_thread = threading.Thread(target=hold_slot, daemon=True)
        self._slot_thread.start()
        assert ready.wait(10), "could not register the placeholder participant"
        tid = self._slot_thread.native_id
        slots = [p["slot"] for p in self.describe()["participants"] if p["tid"] == tid]
        assert slots == [0], f"placeholder participant not in slot 0: {slots}"

    def free_low_slot(self) -> None:
        self._free_slot.set()
        self._slot_thread.join(10)
        assert not self._slot_thread.is_alive()

    def start_survivors(self) -> None:
        for who in SURVIVORS:
            seed = random.randrange(1 << 30)
            self.survivors.append(self.procs.start(_survivor, self.lock, self.path, who, seed))

    def start_child(self, mode: str) -> None:
        env = dict(os.environ, SHMLOCKS_CRASHPOINT=self.point)
        with open(self.errlog, "wb") as err:
            self.child = self.procs.popen(
                [
                    sys.executable,
                    "-c",
                    CHILD_CODE,
                    TESTS,
                    self.kind,
                    self.lock.name,
                    self.path,
                    mode,
                ],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
            )
        self.child_fd = os.pidfd_open(self.child.pid)

    def wait_running(self, timeout=10.0) -> None:
        """Until every survivor has been through the lock (they hold and wait now)."""
        deadline = time.monotonic() + timeout
        while not all(checker(self.a).done()[who] > 0 for who in SURVIVORS):
            assert time.monotonic() < deadline, "survivors made no progress before the crash"
            time.sleep(0.005)

    # -- the child's death

    def child_died_within(self, timeout: float) -> int | None:
        """CLOCK_MONOTONIC ns at which the child was seen to exit, or None."""
        ready, _, _ = select.select([self.child_fd], [], [], timeout)
        if not ready:
            return None
        t = time.monotonic_ns()
        self.child.wait(10)
        return t

    def close(self) -> None:
        self.a[STOP] = 1
        if self.child_fd is not None:
            os.close(self.child_fd)
            self.child_fd = None

    def child_stderr(self) -> str:
        with open(self.errlog, errors="replace") as f:
            return f.read()[-3000:]

    def check_death(self, t_death: int | None) -> int:
        if t_death is None:
            diag = self.describe()
            self.child.kill()
            self.child.wait(10)
            pytest.fail(
                f"point not reached: the {self.kind} child armed with {self.point!r} was not "
                f"dead within {CHILD_WALL + 1:.0f} s; lock: {diag}\n{self.child_stderr()}"
            )
        rc = self.child.returncode
        if rc == 3:
            pytest.fail(
                f"point not reached: the {self.kind} child armed with {self.point!r} ran its "
                f"loop ({CHILD_BUDGET:.0f} s of CPU, {CHILD_WALL:.0f} s at most) without passing it"
            )
        assert rc == -signal.SIGKILL, (
            f"the child armed with {self.point!r} exited with {rc}, not by SIGKILL at the "
            f"point:\n{self.child_stderr()}"
        )
        return t_death

    # -- a recovery point: the child recovers victims until it dies doing so

    def run_victims(self) -> int | None:
        """Victims die holding until the child dies recovering one. The survivors, queued
        behind each victim, race the child for its recovery (their waits wake at the
        death itself), and on a loaded machine they can win every time: so every other
        victim dies while the survivors are stopped (SIGSTOP, by PID), and the child, the
        only one left to look, recovers it; they go on (SIGCONT) once it has died or
        recovered it, and must then recover the child."""
        ctx_deadline = time.monotonic() + CHILD_WALL - 2  # (the child's own end)
        attempt = 0
        while time.monotonic() < ctx_deadline:
            attempt += 1
            r, w = mp.get_context("fork").Pipe(duplex=False)
            p = self.procs.start(_victim, self.lock, self.path, w)
            w.close()
            assert r.poll(5), "victim did not take the lock within 5 s"
            seq = r.recv()
            assert seq is not None, "victim could not take the lock within 10 s"
            self.victims.append((p, seq))
            time.sleep(0.03)  # the child's thread and the survivors queue behind it
            stopped = attempt % 2 == 0
            if stopped:
                self._signal_survivors(signal.SIGSTOP)
            try:
                self.a[VICTIM_PID] = p.pid  # the child starts watching the victim's token
                time.sleep(0.002)
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
                assert p.exitcode == -signal.SIGKILL
                t_death = self.child_died_within(0.5)
            finally:
                if stopped:
                    self._signal_survivors(signal.SIGCONT)
            if t_death is not None:
                return t_death
            # someone else recovered this victim first: its next hold must follow soon
            self.wait_for(lambda s=seq: s + 1 in self.died_seqs(), 2.0, "victim's death")
        return self.child_died_within(1.0)

    def _signal_survivors(self, sig: int) -> None:
        for s in self.survivors:
            if s.pid is not None and s.exitcode is None:
                os.kill(s.pid, sig)

    # -- checks

    def wait_for(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                pytest.fail(f"no recovery within {timeout} s after the {what}: {self.describe()}")
            time.sleep(0.002)

    def died_entries(self) -> list[tuple[int, int, int]]:
        n = min(self.a[DIED_N], DIED_MAX)
        return [tuple(self.a[DIED_LOG + 3 * i : DIED_LOG + 3 * i + 3]) for i in range(n)]

    def died_seqs(self) -> set[int]:
        return {seq for _, seq, _ in self.died_entries()}

    def describe(self) -> object:
        try:
            return self.lock.region._describe()
        except Exception as e:  # noqa: BLE001 - diagnostics only
            return repr(e)

    def survivors_acquire_after(self, t_death: int, within: float = 2.0) -> float:
        deadline = t_death + int(within * 1e9)
        while True:
            late = [w for w in SURVIVORS if self.a[LAST_ACQ + w] <= t_death]
            if not late:
                return max(self.a[LAST_ACQ + w] for w in SURVIVORS) - t_death
            if time.monotonic_ns() > deadline:
                since = {
                    NAMES[w]: f"{(self.a[LAST_ACQ + w] - t_death) / 1e6:+.1f} ms" for w in SURVIVORS
                }
                pytest.fail(
                    f"survivors {late} did not get the lock within {within} s after the "
                    f"child died at {self.point!r}; last acquisitions relative to the death: "
                    f"{since}; lock: {self.describe()}\n{self.survivor_stacks(late)}"
                )
            time.sleep(0.002)

    def survivor_stacks(self, whos) -> str:
        """Where the given survivors are now (faulthandler dumps, on SIGUSR1)."""
        for w in whos:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.survivors[w - 1].pid, signal.SIGUSR1)
        time.sleep(0.3)
        out = []
        for w in whos:
            with contextlib.suppress(FileNotFoundError), open(f"{self.path}.stack{w}") as f:
                out.append(f"{NAMES[w]} (pid {self.survivors[w - 1].pid}):\n{f.read()}")
        return "\n".join(out)

    def stop(self) -> None:
        self.a[STOP] = 1
        stuck = join_or_kill(self.survivors, 15)
        assert not stuck, f"survivors did not finish: {self.describe()}"
        codes = [p.exitcode for p in self.survivors]
        errors = {}
        for who in SURVIVORS:
            with contextlib.suppress(FileNotFoundError), open(f"{self.path}.err{who}") as f:
                errors[NAMES[who]] = f.read()
        assert codes == [0, 0, 0] and not errors, f"survivor exit codes {codes}: {errors}"
        stalls = {w: self.a[STALLS + w] for w in SURVIVORS if self.a[STALLS + w]}
        assert not stalls, f"bounded 5 s acquires timed out (a stranded lock): {stalls}"

    def check_exclusion(self) -> None:
        ex = checker(self.a)
        report = ex.report()
        done = {NAMES.get(w, f"thread {w}"): n for w, n in enumerate(ex.done()) if n}
        assert report.violations == 0, (
            f"{report.violations} critical sections overlapped another one"
        )
        assert report.ok, f"counter {report.total} != critical sections completed {done}"

    def check_slots_free(self) -> None:
        region = self.lock.region
        region._recover_dead()
        parts = region._describe()["participants"]
        dead = [p for p in parts if not p["alive"]]
        assert not dead, f"dead participants not recovered: {dead}"
        assert not parts, f"participant slots still in use after every process left: {parts}"
        # all max_participants slots can be claimed at once, and the lock works for them
        # (slots and queue nodes inherited from the dead included)
        n = region.max_participants
        barrier = threading.Barrier(n + 1)
        errors: list[str] = []

        def use(who: int) -> None:
            try:
                for _ in range(HAMMER_ROUNDS):
                    if not self.lock.acquire(True, 5.0):
                        errors.append("acquire timed out")
                        break
                    enter(self.lock, self.a, who)
                    leave(self.lock, self.a, who)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(10)

        threads = [threading.Thread(target=use, args=(FIRST_THREAD + i,)) for i in range(n)]
        for t in threads:
            t.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(10)
        for t in threads:
            t.join(10)
        assert not errors, f"registering {n} participants after the recovery: {errors}"
