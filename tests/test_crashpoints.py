"""Crash points: a process dies at every named protocol step of every recoverable kind while
other processes hold and wait, and the lock recovers exactly (docs/design.md §6 and §8).

For each (kind, point) in ``shmlocks._crashpoints()`` -- restricted to the kinds that are
recovered: "robust" and "pi" by the kernel, and the user-space kinds once their recovery
points appear under "recover.locked" -- a child interpreter started with
``SHMLOCKS_CRASHPOINT=<point>`` runs a loop that reaches every point, among three survivor
processes that hold (sometimes long) and wait, until it SIGKILLs itself there:

* "lock.*" and "<kind>.*" points lie inside acquire, release and abort: the child mixes
  blocking acquires, short timeouts that expire while it is queued (so it parks, times out
  and abandons), try-locks and releases;
* recovery points ("recover.*", "<kind>.recover.*") are only passed by a recoverer: the test
  starts a victim that takes the lock and is SIGKILLed in its critical section, while the
  child (one thread queued on the lock, its main thread polling the victim's liveness
  token) recovers it -- and dies doing so.

Each case runs twice: with the child's participant slot below the survivors' (so a scan in
slot order meets the dead one first) and above them.

Asserted for every case: the child dies by SIGKILL at its point within ~5 s ("point not
reached" otherwise); every survivor acquires within 2 s of the death; ``owner_died`` is set
for exactly the holds that follow a death in a critical section (user-space kinds: never for
a death inside acquire/release; always after a victim, even when its first recoverer dies;
robust/pi: the kernel's view, True iff the child died owning the pthread mutex); mutual
exclusion held (no two critical sections overlapped, and a counter incremented
non-atomically under the lock equals the critical sections completed), also while the
survivors go on for a while after the death; and afterwards every dead participant's slot
is free again: after ``Region._recover_dead()`` no participant is listed, and
``max_participants`` threads can register at once and use the lock (inheriting whatever
slots and queue nodes the dead left).
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import mmap
import multiprocessing as mp
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from support import join_all, kill, uniq, wait_stopped

import shmlocks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# --------------------------------------------------------------------------- the cases

CRASHPOINTS: dict[str, tuple[str, ...]] = shmlocks._crashpoints()
KERNEL_RECOVERED = tuple(k for k, c in shmlocks.KINDS.items() if c.recovery == "kernel")
USERSPACE_RECOVERED = tuple(k for k, c in shmlocks.KINDS.items() if c.recovery == "user")
CASES = [(k, p) for k in shmlocks.KINDS for p in sorted(CRASHPOINTS) if k in CRASHPOINTS[p]]

#: robust/pi: the points at which the dying process owns the pthread mutex (kernel view)
ROBUST_OWNING = {
    "lock.acquire.done",
    "lock.acquire.got",
    "lock.acquire.holder",
    "lock.release.releasing",
    "lock.release.unholder",
}
ROBUST_NOT_OWNING = {"lock.acquire.taking", "lock.wait.waiting", "lock.release.unlocked"}


def is_recovery_point(point: str) -> bool:
    """A point only a recoverer passes (it recovers a participant that died holding)."""
    return point.startswith("recover.") or ".recover." in point


def expected_owner_died(kind: str, point: str) -> bool:
    """Whether the next hold after the child's death at ``point`` must see owner_died."""
    if is_recovery_point(point):
        return True  # the recoverer was recovering a victim that died in its critical section
    if point == "lock.acquire.done":
        return True  # acquire had returned: it died in its critical section
    if kind in KERNEL_RECOVERED:
        if point in ROBUST_OWNING:
            return True
        if point in ROBUST_NOT_OWNING:
            return False
        pytest.fail(
            f"no expectation for {kind} crash point {point!r}: add it to ROBUST_OWNING or "
            "ROBUST_NOT_OWNING in this file (does the dying process own the pthread mutex?)"
        )
    return False  # user space: every other point lies inside acquire/release/abort


# --------------------------------------------------------------------------- shared state
# One file-backed mapping of int64 words that every process of a case maps: the test, the
# survivors and victims (forked), and the crash child (a fresh interpreter).

WORDS = 1024
COUNTER = 0  # incremented non-atomically under the lock
VIOL = 1  # critical sections that found another one in progress
INSIDE = 2  # id of the participant in its critical section, or 0
STOP = 3  # survivors stop
GO = 4  # the child may start
VICTIM_PID = 5  # recovery cases: pid of the current victim
CHILD_SEQ = 6  # seq of the child's last critical section + 1 (0: none yet)
CHILD_AT = 7  # recovery cases: 1 while the child's queued thread is in acquire..release
DIED_N = 8  # holds that saw owner_died
DONE = 16  # + id: critical sections completed
LAST_ACQ = 32  # + id: CLOCK_MONOTONIC ns of the last acquisition
STALLS = 48  # + id: bounded "blocking" acquires that timed out
DIED_LOG = 64  # 3 words per entry: (id, seq, ns)
DIED_MAX = 300

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
CHILD_BUDGET = 5.0  # seconds the child tries to reach its point


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


def enter(lock, a: memoryview, who: int) -> int:
    """The first half of a critical section (the lock is held): repair after an owner
    death, check exclusion, do the non-atomic increment and count it. Returns the seq."""
    t = time.monotonic_ns()
    died = lock.owner_died
    if died:
        a[INSIDE] = 0  # the repair: the dead holder's section is over
        lock.mark_consistent()
    if a[INSIDE] != 0:
        a[VIOL] += 1
    a[INSIDE] = who
    seq = a[COUNTER]
    a[LAST_ACQ + who] = t
    if died:
        n = a[DIED_N]
        if n < DIED_MAX:
            a[DIED_LOG + 3 * n] = who
            a[DIED_LOG + 3 * n + 1] = seq
            a[DIED_LOG + 3 * n + 2] = t
        a[DIED_N] = n + 1
    os.sched_yield()  # widen the read-modify-write window
    a[COUNTER] = seq + 1
    a[DONE + who] += 1
    return seq


def leave(lock, a: memoryview, hold: float = 0.0) -> None:
    if hold:
        time.sleep(hold)
    a[INSIDE] = 0
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
                leave(lock, a, rng.uniform(0.01, 0.03) if long_hold else rng.uniform(0, 0.0004))
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
    end = time.monotonic() + CHILD_BUDGET
    rng = random.Random()
    if mode == "recover":
        _child_recoverer(lock, a, end, rng)
    else:
        while time.monotonic() < end:
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
                leave(lock, a, rng.choice((0.0, 0.0, 0.0002, 0.003, 0.006)))
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
                leave(lock, a)
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
    "import sys; sys.path.insert(0, sys.argv[1]); import test_crashpoints as t; "
    "t._child_main(sys.argv[2:])"
)


# --------------------------------------------------------------------------- the harness


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
                    HERE,
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
        while not all(self.a[DONE + who] > 0 for who in SURVIVORS):
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
                f"dead within {CHILD_BUDGET + 1:.0f} s; lock: {diag}\n{self.child_stderr()}"
            )
        rc = self.child.returncode
        if rc == 3:
            pytest.fail(
                f"point not reached: the {self.kind} child armed with {self.point!r} ran its "
                f"{CHILD_BUDGET:.0f} s loop without passing it"
            )
        assert rc == -signal.SIGKILL, (
            f"the child armed with {self.point!r} exited with {rc}, not by SIGKILL at the "
            f"point:\n{self.child_stderr()}"
        )
        return t_death

    # -- a recovery point: the child recovers victims until it dies doing so

    def run_victims(self) -> int | None:
        ctx_deadline = time.monotonic() + CHILD_BUDGET
        while time.monotonic() < ctx_deadline:
            r, w = mp.get_context("fork").Pipe(duplex=False)
            p = self.procs.start(_victim, self.lock, self.path, w)
            w.close()
            assert r.poll(5), "victim did not take the lock within 5 s"
            seq = r.recv()
            assert seq is not None, "victim could not take the lock within 10 s"
            self.victims.append((p, seq))
            time.sleep(0.03)  # the child's thread and the survivors queue behind it
            self.a[VICTIM_PID] = p.pid  # the child starts watching the victim's token
            time.sleep(0.002)
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
            assert p.exitcode == -signal.SIGKILL
            t_death = self.child_died_within(0.5)
            if t_death is not None:
                return t_death
            # someone else recovered this victim first: its next hold must follow soon
            self.wait_for(lambda s=seq: s + 1 in self.died_seqs(), 2.0, "victim's death")
        return self.child_died_within(1.0)

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
        stuck = join_all(self.survivors, 15)
        for p in stuck:
            kill(p)
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
        a = self.a
        done = {NAMES.get(w, f"thread {w}"): a[DONE + w] for w in range(1, 16) if a[DONE + w]}
        assert a[VIOL] == 0, f"{a[VIOL]} critical sections overlapped another one"
        assert a[COUNTER] == sum(done.values()), (
            f"counter {a[COUNTER]} != critical sections completed {done}"
        )

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
                    leave(self.lock, self.a)
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


# --------------------------------------------------------------------------- the tests


@pytest.mark.timeout(40)
@pytest.mark.parametrize("order", ["child-first", "child-last"])
@pytest.mark.parametrize(("kind", "point"), CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_death_at_crash_point(procs, new_lock, tmp_path, kind, point, order):
    """``order``: the dying child's participant slot is below the survivors' (child-first:
    a scan in slot order meets the dead one first) or above them (child-last)."""
    lock = new_lock(kind, max_participants=MAX_PARTICIPANTS)
    case = Case(procs, lock, kind, point, tmp_path)
    try:
        run_case(case, kind, point, order)
    finally:
        case.close()


def run_case(case: Case, kind: str, point: str, order: str) -> None:
    recovery = is_recovery_point(point)
    if order == "child-first":
        case.reserve_low_slot()
    case.start_child("recover" if recovery else "normal")
    case.start_survivors()
    case.wait_running()
    if order == "child-first":
        case.free_low_slot()
    t_go = time.monotonic_ns()
    case.a[GO] = 1
    t_death = case.run_victims() if recovery else case.child_died_within(CHILD_BUDGET + 1)
    t_death = case.check_death(t_death)
    lag = case.survivors_acquire_after(t_death)
    print(
        f"{kind} {point} ({order}): died {(t_death - t_go) / 1e9:.2f} s after the start; every "
        f"survivor acquired within {lag / 1e6:.1f} ms of the death"
    )
    time.sleep(SOAK)

    case.stop()
    case.check_exclusion()

    # owner_died: set for exactly the holds that follow a death in a critical section
    died = case.died_entries()
    assert case.a[DIED_N] == len(died)
    seqs = [seq for _, seq, _ in died]
    if recovery:
        victims = [seq for _, seq in case.victims]
        expected = Counter(v + 1 for v in victims)
        extra = Counter(seqs) - expected
        assert not expected - Counter(seqs) and sum(extra.values()) <= 1, (
            f"owner_died holds at seqs {seqs}; victims died holding at {victims} (each next "
            f"hold, and only those, must see owner_died)"
        )
        # The recoverer's process dies at its point with its queued thread anywhere,
        # holding the lock included: then one more hold must see owner_died.
        assert not extra or case.a[CHILD_AT] == 1, (
            f"owner_died holds at seqs {seqs}; victims died holding at {victims}, and the "
            f"child's thread was not between acquire and release when the child died"
        )
    elif expected_owner_died(kind, point):
        child_seq = case.a[CHILD_SEQ]  # seq of the child's last section + 1
        assert len(seqs) == 1, (
            f"the child died owning the {kind} mutex at {point!r}: exactly one later hold "
            f"must see owner_died, saw {died}"
        )
        if point.startswith("lock.release."):
            assert seqs[0] == child_seq, (
                f"the hold right after the child's last section (seq {child_seq}) must see "
                f"owner_died; saw it at {seqs[0]}"
            )
        else:
            assert seqs[0] >= child_seq
    else:
        assert not died, (
            f"the child died inside acquire/release at {point!r} (never in its critical "
            f"section), yet owner_died was seen by {died}"
        )

    case.check_slots_free()
    case.check_exclusion()
    assert case.a[DIED_N] == len(died), f"owner_died after the recovery: {case.died_entries()}"


# --------------------------------------------------------------------------- the table


def _source_points() -> dict[str, list[str]]:
    """crashpoint("name") calls in the core's sources: name -> files."""
    found: dict[str, list[str]] = {}
    files = glob.glob(os.path.join(ROOT, "shmlocks", "_ext", "*.pxi"))
    files += glob.glob(os.path.join(ROOT, "shmlocks", "*.pyx"))
    for path in files:
        with open(path) as f:
            text = f.read()
        for name in re.findall(
            r'\bcrashpoint(?:_at)?\(\s*(?:armed\s*,\s*)?"([a-z_]+(?:\.[a-z_]+)+)"\s*\)', text
        ):
            found.setdefault(name, []).append(os.path.basename(path))
    return found


@pytest.mark.timeout(20)
def test_crashpoint_table_matches_the_sources():
    src = _source_points()
    if not src:
        pytest.skip("the core's sources are not in this tree")
    assert set(src) == set(CRASHPOINTS), (
        f"in the sources, not in _crashpoints(): {sorted(set(src) - set(CRASHPOINTS))}; "
        f"in _crashpoints(), not in the sources: {sorted(set(CRASHPOINTS) - set(src))}"
    )
    for name, kinds in CRASHPOINTS.items():
        assert kinds and set(kinds) <= set(shmlocks.KINDS), (name, kinds)
        prefix = name.split(".", 1)[0]
        if prefix in shmlocks.KINDS:
            assert kinds == (prefix,), f"{name!r} is {prefix}-specific, but lists {kinds}"


@pytest.mark.timeout(20)
def test_every_kind_has_its_points():
    assert set(KERNEL_RECOVERED) | set(USERSPACE_RECOVERED) == set(shmlocks.KINDS)
    for kind in shmlocks.KINDS:
        assert any(kind in kinds for p, kinds in CRASHPOINTS.items() if p.startswith("lock."))
    for kind in USERSPACE_RECOVERED:
        assert kind in CRASHPOINTS.get("recover.done", ()), kind


@pytest.mark.timeout(30)
def test_unknown_crashpoint_name_fails_the_import():
    """A name with a library prefix that is no point of this build is a typo: the import
    fails. (Other names are user points: shmlocks.crashpoint(); tests/test_testing.py.)"""
    env = dict(os.environ, SHMLOCKS_CRASHPOINT="clh.no.such.point")
    proc = subprocess.run(
        [sys.executable, "-c", "import shmlocks"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=25,
    )
    assert proc.returncode != 0
    assert "ValueError" in proc.stderr and "clh.no.such.point" in proc.stderr, proc.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "env",
    [
        {"SHMLOCKS_CRASHPOINT": "lock.release.releasing:0"},
        {"SHMLOCKS_CRASHPOINT": "lock.release.releasing:x"},
        {"SHMLOCKS_CRASHPOINT": "lock.release.releasing", "SHMLOCKS_CRASHPOINT_ACTION": "pause"},
    ],
)
def test_bad_crashpoint_spec_fails_the_import(env):
    proc = subprocess.run(
        [sys.executable, "-c", "import shmlocks"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=25,
    )
    assert proc.returncode != 0 and "ValueError" in proc.stderr, proc.stderr


@pytest.mark.timeout(30)
def test_nth_pass_and_stop_action(new_lock):
    """NAME:N fires at the N-th pass only; ACTION=stop stops the process there (once) and
    it goes on when continued."""
    lock = new_lock("futex")
    code = (
        "import shmlocks, sys\n"
        "l = shmlocks.FutexMutex.open(sys.argv[1])\n"
        "for i in range(5):\n"
        "    l.acquire(); l.release()\n"
        "    print(i, flush=True)\n"
    )
    env = {
        **os.environ,
        "SHMLOCKS_CRASHPOINT": "lock.release.releasing:3",
        "SHMLOCKS_CRASHPOINT_ACTION": "stop",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", code, lock.name], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert [proc.stdout.readline().strip() for _ in range(2)] == ["0", "1"]
        wait_stopped(proc.pid, timeout=10)
        assert lock.locked(), "stopped inside its third release, the lock still held"
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=10)
        assert out.split() == ["2", "3", "4"] and proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(30)
def test_an_armed_point_fires_there_and_nowhere_else(new_lock):
    """A process armed with a release point passes every acquire point alive and dies in
    its release; the lock is recovered for the next holder, without owner_died."""
    lock = new_lock("futex")
    code = (
        "import os, sys, shmlocks\n"
        "lock = shmlocks.FutexMutex.open(sys.argv[1])\n"
        "assert lock.acquire(True, 5)\n"
        "print('acquired', flush=True)\n"
        "lock.release()\n"
        "print('released', flush=True)\n"
    )
    env = dict(os.environ, SHMLOCKS_CRASHPOINT="lock.release.releasing")
    proc = subprocess.run(
        [sys.executable, "-c", code, lock.name],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=25,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    assert proc.stdout.split() == ["acquired"], proc.stdout
    assert lock.acquire(True, 2.0), "the futex lock was not recovered after its releaser died"
    assert lock.owner_died is False
    lock.release()


# ------------------------------------------------------------- deaths in a row in the queue

#: points on the way into the queue: the dying joiner is between taking its place and
#: waiting (for MCS and CLH, between the tail CAS and publishing its pred, or just after)
_QUEUE_STEPS = (".acquire.took", ".acquire.joined", ".acquire.pred", "lock.wait.waiting")
#: (kind, [(point, mode)] * 3): each joiner dies at its point; mode "block" is one
#: acquire(), "timed" a loop of acquire(timeout=0.03), so that it also parks, times out
#: and abandons its place, and reclaims the places of those ahead that did; mode "queued"
#: (point "-") blocks in acquire() and is SIGKILLed there by the test
ROW_PLANS = [(k, [(p, "block")] * 3) for k, p in CASES if p.endswith(_QUEUE_STEPS)]
ROW_PLANS += [(k, [(p, "block")] * 3) for k, p in CASES if p == "futex.wait.announced"]
ROW_PLANS += [
    # found by random plans: a joiner dying while it reclaimed an abandoned node left
    # the thread that inherited that node's slot waiting out its timeout
    (
        "clh",
        [
            ("clh.acquire.joined", "block"),
            ("clh.acquire.pred", "timed"),
            ("clh.wait.reclaiming", "timed"),
        ],
    ),
    (
        "clh",
        [
            ("-", "queued"),
            ("clh.acquire.pred", "timed"),
            ("clh.wait.reclaiming", "block"),
        ],
    ),
    (
        "mcs",
        [
            ("mcs.acquire.joined", "block"),
            ("mcs.acquire.pred", "timed"),
            ("lock.wait.waiting", "timed"),
        ],
    ),
    (
        "ticket",
        [
            ("ticket.acquire.took", "block"),
            ("ticket.abandon.marked", "timed"),
            ("lock.wait.waiting", "timed"),
        ],
    ),
]


def _plan_id(kind: str, plan: list) -> str:
    if len({p for p in plan}) == 1:
        return f"{kind}-{plan[0][0]}"
    return f"{kind}-" + "+".join(f"{p}/{m}" for p, m in plan)


_JOINER = r"""
import os
import sys
import time
import shmlocks
region = shmlocks.Region.open(sys.argv[1])
lock, other = region.open_lock("lock"), region.open_lock("other")
other.acquire(); other.release()    # take a participant slot before the point is armed
if sys.argv[2] != "-":
    os.environ["SHMLOCKS_CRASHPOINT"] = sys.argv[2]
    shmlocks._core._arm_crashpoint_from_env()
print("ready", flush=True)
sys.stdin.readline()
if sys.argv[3] in ("block", "queued"):
    lock.acquire()                  # dies on the way in
else:
    end = time.monotonic() + 3
    while time.monotonic() < end:
        lock.acquire(timeout=0.03)  # parks, times out, abandons; dies somewhere in there
print("not reached", flush=True)
"""


def _queued_waiter(lock, conn) -> None:
    try:
        t0 = time.monotonic()
        ok = lock.acquire(timeout=10)
        conn.send((ok, time.monotonic() - t0, ok and lock.owner_died))
        if ok:
            lock.release()
    except BaseException as e:  # noqa: BLE001 -- reported to the test
        conn.send((repr(e), None, None))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "plan"), ROW_PLANS, ids=[_plan_id(k, p) for k, p in ROW_PLANS])
def test_joiners_dying_in_a_row_do_not_wedge_the_queue(procs, kind, plan):
    """Three joiners, one after the other, die on the way into the queue while the lock is
    held, and none is recovered before the next joins (their slots were taken beforehand,
    so no registration recovers them). For MCS and CLH the later ones replaced the tail
    word that recorded the earlier one's predecessor before publishing it (found by a CI
    torture run: CLH then reported a corrupt lock, MCS a corrupt release, and a thread
    inheriting a dead slot waited out its timeout). A live waiter queued behind them must
    get the lock soon after the holder releases, without owner_died, and the lock must
    stay usable."""
    region = shmlocks.Region.create(uniq(f"row-{kind}"), max_locks=2, max_participants=6)
    try:
        lock = region.create_lock("lock", kind)
        region.create_lock("other", "futex")
        joiners = []
        for point, mode in plan:
            p = procs.popen(
                [sys.executable, "-c", _JOINER, region.name, point, mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            joiners.append(p)
            assert p.stdout.readline().strip() == "ready"
        assert lock.acquire(timeout=5)
        try:
            for p, (point, mode) in zip(joiners, plan, strict=True):  # one queued, dead at a time
                p.stdin.write("go\n")
                p.stdin.flush()
                if mode == "queued":
                    time.sleep(0.3)  # parked in the queue by now
                    assert p.poll() is None, "the queued joiner did not wait"
                    p.kill()  # SIGKILL, by its PID
                assert p.wait(10) == -signal.SIGKILL, f"{point} not reached"
            here, there = mp.get_context("fork").Pipe()
            w = procs.start(_queued_waiter, lock, there)
            time.sleep(0.2)  # queued behind the dead
        finally:
            lock.release()
        assert here.poll(15), "the live waiter neither acquired nor timed out"
        ok, took, owner_died = here.recv()
        assert ok is True, f"the live waiter did not get the lock: {ok}"
        assert took < 5, f"the live waiter waited {took:.1f} s"
        assert owner_died is False
        assert not join_all([w], 10)
        assert lock.acquire(timeout=5), "the lock is wedged after the deaths"
        assert not lock.owner_died
        lock.release()
        assert not lock.locked()
    finally:
        region.unlink()
        region.close()
