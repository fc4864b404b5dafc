"""Kill torture (``python -m shmlocks torture``): workers increment a shared counter under a
lock while a killer SIGKILLs random workers -- holders and waiters -- and restarts them.

Each worker is a forked process; all of them share, besides the lock, one anonymous shared
mapping of int64 words (the bookkeeping below). The controller (this process) is the
killer: every 5-50 ms it SIGKILLs a worker (half the time the current holder, sometimes two
at once), reaps it and starts a new one in its place.

Bookkeeping that makes the verdict exact: the exclusion checker of shmlocks/_harness.py. In
each critical section the holder first repairs after ``owner_died`` (a section a dead worker
left pending is settled from the words themselves, idempotently) and checks
``counter == sum(done)`` (else a violation, counted once); then the checker's section: a
marker across the whole section (one found set by a holder that did not see owner_died is
an overlap or an unreported death: a violation), a non-atomic increment, the worker's count,
sometimes a long hold. So after any number of kills any difference is a mutual-exclusion
violation.

Also measured: for every kill, the time from just before the SIGKILL to the next
acquisition by anyone (the worst is reported); a wedge is no acquisition by anyone for more
than 2 s while workers are alive. At the end, slots are checked: a participant slot still
"alive" after every worker has exited, or a dead one that ``Region._recover_dead()`` cannot
recover, is a leak. Any violation, wedge, leak or worker error makes the run fail.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import shmlocks
from shmlocks._harness import COUNTER, MARK_W, Exclusion, words

TRACE_ENTRIES = 1 << 20  # the debug trace's ring (SHMLOCKS_DEBUG builds)
TRACE_DUMP = 200_000  # events written out at the first violation, error or wedge
WEDGE_NS = 2_000_000_000  # no acquisition by anyone for this long: a wedge
MAX_WORKERS = 64
KILL_INTERVAL = (0.005, 0.050)  # seconds between kills

# shared words ----------------------------------------------------------------------------
STOP = 4  # workers stop
VIOLATIONS = 5  # sections that found the count off (overlaps: the checker's own word)
RECOVERIES = 6  # holds that saw owner_died
LAST_ACQ = 8  # CLOCK_MONOTONIC ns of the last acquisition by anyone
KILLS_ISSUED = 9  # written by the killer only
KILLS_SEEN = 10  # kills whose next acquisition has been timed
WORST_NS = 11  # worst kill -> next acquisition
SUM_NS = 12  # sum of kill -> next acquisition
ADJUST = 13  # counter - sum(done) accepted after a violation (so each counts once)
HOLDER = 14  # worker index + 1 of the current holder (a snapshot for the killer)
ACQUIRED = 15  # acquisitions
READS = 16  # --kind rwlock: read holds
READ_VIOLATIONS = 17  # --kind rwlock: reads that saw a writer inside
READ_SHARE = 0.7  # --kind rwlock: the share of a worker's tries that read
CHECK = 64  # the exclusion checker's words (shmlocks/_harness.py): counter, marker, done[w + 1]
STALLS = CHECK + words(MAX_WORKERS)  # + w: bounded "blocking" acquires that timed out
ERRORS = STALLS + MAX_WORKERS  # + w: unexpected exceptions (the worker then exits)
RING = ERRORS + MAX_WORKERS  # kill times, a ring of RING_N
RING_N = 4096
WORDS = RING + RING_N


# --------------------------------------------------------------------------------------------
# the worker (a forked child)


def _die_with_parent() -> None:
    """SIGKILL this process if the controller goes away (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _checker(a: memoryview, nw: int) -> Exclusion:
    """The exclusion checker over the shared words; worker w is its participant w + 1."""
    return Exclusion(a, CHECK, participants=nw)


def _section(lock: shmlocks.Lock, a: memoryview, w: int, nw: int, rng: random.Random) -> None:
    """One critical section (the lock is held); releases the lock."""
    t = time.monotonic_ns()
    a[HOLDER] = w + 1
    ex = _checker(a, nw)
    if lock.owner_died:
        ex.repair()
        a[RECOVERIES] += 1
        lock.mark_consistent()
    # time the kills that happened before this acquisition and are not timed yet
    issued, seen = a[KILLS_ISSUED], a[KILLS_SEEN]
    if seen < issued:
        worst, total = a[WORST_NS], a[SUM_NS]
        while seen < issued and issued - seen <= RING_N:
            k = a[RING + seen % RING_N]
            if k >= t:
                break
            worst = max(worst, t - k)
            total += t - k
            seen += 1
        if issued - seen > RING_N:
            seen = issued - RING_N  # overrun (only after a wedge): forget the oldest
        a[WORST_NS], a[SUM_NS], a[KILLS_SEEN] = worst, total, seen
    a[LAST_ACQ] = t
    a[ACQUIRED] += 1
    books = ex.report()
    diff = books.total - books.expected
    if diff != a[ADJUST]:
        a[VIOLATIONS] += 1
        a[ADJUST] = diff
    # the marker set here spans the section, so an unreported death is caught
    ex.enter(w + 1, widen=rng.random() < 0.3)
    if rng.random() < 0.05:
        time.sleep(0.0002)  # now and then a kill lands between the increment and the count
    ex.count(w + 1)
    if rng.random() < 0.25:
        time.sleep(rng.uniform(0.0001, 0.002))  # a long hold: a target for the killer
    ex.leave(w + 1)
    a[HOLDER] = 0
    lock.release()


class RWWrite:
    """The torture's lock interface on an RWLock's write side (``--kind rwlock``): the
    writers' sections are the checker's, exactly as a lock's; workers also read (_reading)."""

    kind_name = "rwlock"

    def __init__(self, rw: shmlocks.RWLock) -> None:
        self.rw = rw

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.rw.acquire_write(blocking, timeout)

    def release(self) -> None:
        self.rw.release_write()

    @property
    def owner_died(self) -> bool:
        return self.rw.owner_died

    def mark_consistent(self) -> None:
        self.rw.mark_consistent()

    @property
    def region(self) -> shmlocks.Region:
        return self.rw.region

    def stats(self) -> dict[str, Any]:
        return self.rw.stats()

    def _raw(self) -> dict[str, Any]:
        return self.rw._raw()

    def unlink(self) -> None:
        self.rw.unlink()

    def close(self) -> None:
        self.rw.close()


def _reading(rw: shmlocks.RWLock, a: memoryview, w: int, rng: random.Random) -> bool:
    """One read try of ``--kind rwlock``: no writer may be inside while this reader holds.
    Inside, the checker's counter must not move, and its marker may be set only by a
    writer that died in its section (owner_died: readers are admitted before the next
    writer repairs). A violation is counted once per section. Returns whether it read."""
    r = rng.random()
    if r < 0.1:
        got = rw.acquire_read(False)
    elif r < 0.35:
        got = rw.acquire_read(True, rng.uniform(0.0001, 0.003))
    else:
        got = rw.acquire_read(True, 5.0)
        if not got:
            a[STALLS + w] += 1
    if not got:
        return False
    a[LAST_ACQ] = time.monotonic_ns()
    a[READS] += 1
    c0 = a[CHECK + COUNTER]
    bad = bool(a[CHECK + MARK_W]) and not rw.owner_died
    if rng.random() < 0.3:
        time.sleep(rng.uniform(0.0001, 0.002))  # a long read: a target for the killer
    if a[CHECK + COUNTER] != c0 or (a[CHECK + MARK_W] and not rw.owner_died):
        bad = True
    if bad:
        a[VIOLATIONS] += 1
        a[READ_VIOLATIONS] += 1
    rw.release_read()
    return True


def _worker(lock: shmlocks.Lock, a: memoryview, w: int, nw: int, seed: int, parent: int) -> None:
    rng = random.Random(seed)
    rw = lock.rw if isinstance(lock, RWWrite) else None
    while not a[STOP] and os.getppid() == parent:
        r = rng.random()
        try:
            got = False
            if rw is not None and rng.random() < READ_SHARE:
                _reading(rw, a, w, rng)
            elif r < 0.1:
                got = lock.acquire(False)
            elif r < 0.35:
                got = lock.acquire(True, rng.uniform(0.0001, 0.003))  # often abandoned
            else:
                got = lock.acquire(True, 5.0)  # "blocking", but bounded
                if not got:
                    a[STALLS + w] += 1
            if got:
                _section(lock, a, w, nw, rng)
        except Exception as e:  # noqa: BLE001 - counted and shown; the worker stops
            a[ERRORS + w] += 1
            print(
                f"torture worker {w} (pid {os.getpid()}): {type(e).__name__}: {e}", file=sys.stderr
            )
            return
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.001))
    lock.close()


ASYNC_TASKS = 4  # --asyncio: tasks of each asyncio worker's loop


def _worker_async(
    lock: shmlocks.Lock, a: memoryview, w: int, nw: int, seed: int, parent: int
) -> None:
    """--asyncio: a worker whose event loop runs ASYNC_TASKS tasks, each doing what
    _worker does with acquire_async (its cohort, docs/design.md §14), a share of the
    waits given up by a timeout or a cancellation (asyncio.wait_for)."""
    import asyncio

    rng = random.Random(seed)

    async def waited(t: float) -> bool:
        try:
            return await asyncio.wait_for(lock.acquire_async(), t)
        except TimeoutError:
            return False

    async def task() -> None:
        while not a[STOP] and os.getppid() == parent:
            r = rng.random()
            if r < 0.1:
                got = await lock.acquire_async(False)
            elif r < 0.25:
                got = await lock.acquire_async(True, rng.uniform(0.0001, 0.003))
            elif r < 0.4:
                got = await waited(rng.uniform(0.0001, 0.003))  # cancelled, often
            else:
                got = await lock.acquire_async(True, 5.0)  # "blocking", but bounded
                if not got:
                    a[STALLS + w] += 1
            if got:
                _section(lock, a, w, nw, rng)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.001))

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(ASYNC_TASKS)))

    try:
        asyncio.run(main())
    except Exception as e:  # noqa: BLE001 - counted and shown; the worker stops
        a[ERRORS + w] += 1
        print(f"torture worker {w} (pid {os.getpid()}): {type(e).__name__}: {e}", file=sys.stderr)
        return
    lock.close()


#: under load, worker w runs at LOAD_NICE[w % 4] (SCHED_BATCH for the odd ones), beside a
#: CPU hog pinned to each CPU: a preempted waiter or holder is then the rule, not the exception
LOAD_NICE = (0, 2, 4, 6)


def _loaded(w: int) -> None:
    """Make this worker a weak competitor for the CPU (torture's --load)."""
    with contextlib.suppress(OSError):
        os.nice(LOAD_NICE[w % len(LOAD_NICE)])
    if w % 2:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _hog(cpu: int) -> None:
    """A busy loop pinned to one CPU, until its parent goes."""
    _die_with_parent()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {cpu})
    parent = os.getppid()
    n = 0
    while True:
        n += 1
        if n % 1_000_000 == 0 and os.getppid() != parent:
            return


def start_hogs() -> list[int]:
    """Fork one CPU hog per CPU this process may run on; their PIDs (stop_hogs() ends them)."""
    pids = []
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _hog(cpu)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def _kill_and_reap(pid: int) -> None:
    """SIGKILL a child of ours by PID and reap it (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def stop_hogs(pids: list[int]) -> None:
    for pid in pids:
        _kill_and_reap(pid)


def _start_worker(
    lock: shmlocks.Lock,
    a: memoryview,
    w: int,
    nw: int,
    seed: int,
    load: bool = False,
    aio: bool = False,
) -> int:
    """Fork one worker; its PID. Ctrl-C is the controller's: SIGINT is blocked across the
    fork (a Ctrl-C then is delivered to the parent once it unblocks, never lost), and
    the child ignores it before unblocking."""
    parent = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return pid
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        _die_with_parent()
        if load:
            _loaded(w)
        if os.getppid() == parent:
            if aio:
                _worker_async(lock, a, w, nw, seed, parent)
            else:
                _worker(lock, a, w, nw, seed, parent)
        code = 0
    except BaseException:  # noqa: BLE001 - a forked child never returns into the caller
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


# --------------------------------------------------------------------------------------------
# the controller


@dataclass
class Result:
    kind: str
    seconds: float = 0.0
    workers: int = 0
    kills: int = 0
    holder_kills: int = 0  # kills aimed at the worker last seen holding (approximate)
    recoveries: int = 0
    inflight: int = 0
    sections: int = 0
    acquisitions: int = 0
    worst_ms: float = 0.0
    mean_ms: float = 0.0
    untimed_kills: int = 0
    violations: int = 0
    wedges: int = 0
    stalls: int = 0
    errors: int = 0
    leaked_alive: int = 0
    leaked_dead: int = 0
    lock_stats: dict[str, Any] | None = None  # the lock's own counters at the end
    reads: int = 0  # --kind rwlock: read holds
    read_violations: int = 0  # --kind rwlock: reads that saw a writer inside
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.violations
            or self.wedges
            or self.stalls
            or self.errors
            or self.leaked_alive
            or self.leaked_dead
            or self.untimed_kills
        )

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        leaks = self.leaked_alive + self.leaked_dead
        text = (
            f"{self.kind:<7} {verdict:<4}  kills {self.kills} ({self.holder_kills} aimed at the holder), "
            f"recoveries {self.recoveries}, in-flight {self.inflight}, "
            f"worst death->acquire {self.worst_ms:.1f} ms (mean {self.mean_ms:.2f}), "
            f"sections {self.sections:,} in {self.seconds:.1f} s, "
            f"violations {self.violations}, wedges {self.wedges}, leaked slots {leaks}"
        )
        extra = []
        if self.reads:
            extra.append(f"reads {self.reads:,}")
        if self.stalls:
            extra.append(f"stalled acquires {self.stalls}")
        if self.errors:
            extra.append(f"worker errors {self.errors}")
        if self.untimed_kills:
            extra.append(f"kills never followed by an acquisition {self.untimed_kills}")
        return text + (f", {', '.join(extra)}" if extra else "")

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["ok"] = self.ok
        return d


class _Run:
    """One kind's torture: the lock, the shared words and the workers' PIDs."""

    def __init__(
        self, kind: str, workers: int, seed: int, load: bool = False, aio: bool = False
    ) -> None:
        self.kind = kind
        self.load = load
        self.aio = aio and kind != "rwlock"  # (an RWLock has no acquire_async)
        self.nw = workers
        self.rng = random.Random(seed)
        self.mm = mmap.mmap(-1, 8 * WORDS)  # anonymous and shared: inherited by fork
        self.a = memoryview(self.mm).cast("q")
        self.lock: Any
        if kind == "rwlock":  # mixed readers and writers, the writers' sections checked
            self.lock = RWWrite(shmlocks.RWLock.create(max_participants=2 * workers + 4))
        else:
            self.lock = shmlocks.KINDS[kind].create(max_participants=2 * workers + 4)
        self.pids: dict[int, int] = {}  # worker slot -> pid
        self.res = Result(kind, workers=workers)
        self.raw_noted = False
        # a SHMLOCKS_DEBUG build records every traced protocol step of every worker
        self.traced = shmlocks._core._trace_open(TRACE_ENTRIES)
        self.trace_dumped = False

    # -- processes (every one by its PID)

    def spawn(self, w: int) -> None:
        self.pids[w] = _start_worker(
            self.lock,
            self.a,
            w,
            self.nw,
            self.rng.randrange(1 << 30),
            self.load,
            self.aio and w % 2 == 1,  # --asyncio: every other worker is an event loop
        )

    def kill(self, w: int) -> None:
        _kill_and_reap(self.pids.pop(w))

    def reap_all(self, timeout: float) -> list[int]:
        """Wait for every worker to exit by itself; SIGKILL those that do not. Returns the
        slots of the workers that had to be killed or did not exit with status 0."""
        deadline = time.monotonic() + timeout
        bad = []
        for w, pid in list(self.pids.items()):
            status = None
            while status is None:
                try:
                    done, st = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    status = 0
                    break
                if done:
                    status = st
                elif time.monotonic() > deadline:
                    _kill_and_reap(pid)
                    status = -1
                else:
                    time.sleep(0.002)
            if status != 0:
                bad.append(w)
            del self.pids[w]
        return bad

    def cleanup(self) -> None:
        for w in list(self.pids):
            self.kill(w)
        # The run's own name goes now: a worker forked as Ctrl-C came in (its pid never
        # recorded, so not killed above) still has the segment open until it dies with us,
        # and the last user out is the one that would unlink it.
        with contextlib.suppress(Exception):
            self.lock.unlink()
        with contextlib.suppress(Exception):
            self.lock.close()

    # -- the run

    def wedged(self) -> bool:
        return time.monotonic_ns() - self.a[LAST_ACQ] > WEDGE_NS

    def note_wedge(self, when: str) -> None:
        self.res.wedges += 1
        gap = (time.monotonic_ns() - self.a[LAST_ACQ]) / 1e9
        try:
            state: Any = self.lock.region._describe()
        except Exception as e:  # noqa: BLE001 - diagnostics only
            state = repr(e)
        self.res.notes.append(f"wedge {when}: no acquisition for {gap:.1f} s; {state}")
        self.note_raw()
        self.dump_trace()

    def broken(self) -> bool:
        a = self.a
        overlaps = _checker(a, self.nw).report().violations
        return bool(a[VIOLATIONS] or overlaps or any(a[ERRORS : ERRORS + self.nw]))

    def dump_trace(self) -> None:
        """Once per run, at the first sign of trouble: the debug trace's last events, to a
        file named in the notes (SHMLOCKS_DEBUG builds only)."""
        if not self.traced or self.trace_dumped:
            return
        self.trace_dumped = True
        path = f"/tmp/shmlocks-trace-{self.kind}-{os.getpid()}-{time.monotonic_ns()}.txt"
        with open(path, "w") as f:
            for seq, pid, tid, what, x, y, z in shmlocks._core._trace_dump(TRACE_DUMP):
                f.write(f"{seq} {pid} {tid} {what} {x:#x} {y:#x} {z:#x}\n")
        self.res.notes.append(f"debug trace of the last {TRACE_DUMP} steps: {path}")

    def note_raw(self) -> None:
        """The lock's raw shared words, once per run: what the next fix needs to know."""
        if self.raw_noted:
            return
        self.raw_noted = True
        try:
            raw: Any = self.lock._raw()
        except Exception as e:  # noqa: BLE001 - diagnostics only
            raw = repr(e)
        self.res.notes.append(f"raw lock state: {raw}")

    def run(self, seconds: float) -> Result:
        a, res = self.a, self.res
        t0 = time.monotonic()
        a[LAST_ACQ] = time.monotonic_ns()
        for w in range(self.nw):
            self.spawn(w)
        end = t0 + seconds
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(*KILL_INTERVAL))
            if self.broken():
                self.dump_trace()
            if self.wedged():
                self.note_wedge("during the kills")
                break
            holder = a[HOLDER] - 1
            victims = []
            if 0 <= holder < self.nw and self.rng.random() < 0.5:
                victims.append(holder)  # the holder, as last seen
            else:
                victims.append(self.rng.randrange(self.nw))
            if self.nw > 1 and self.rng.random() < 0.1:  # sometimes two at once
                victims.append(self.rng.choice([w for w in range(self.nw) if w != victims[0]]))
            for w in victims:
                if w == holder:
                    res.holder_kills += 1
                n = a[KILLS_ISSUED]
                a[RING + n % RING_N] = time.monotonic_ns()  # just before the SIGKILL
                a[KILLS_ISSUED] = n + 1
                self.kill(w)
                res.kills += 1
            for w in victims:
                self.spawn(w)
        # every kill must be followed by an acquisition
        deadline = time.monotonic_ns() + WEDGE_NS
        while a[KILLS_SEEN] < a[KILLS_ISSUED] and not res.wedges:
            if time.monotonic_ns() > deadline:
                self.note_wedge("after the last kill")
                break
            time.sleep(0.002)
        res.seconds = time.monotonic() - t0
        a[STOP] = 1
        bad = self.reap_all(10.0)
        if bad:
            res.notes.append(f"workers in slots {bad} did not exit cleanly")
        self.check_slots()
        self.final_check()
        if not self.res.ok:
            self.dump_trace()
        return res

    def check_slots(self) -> None:
        """After every worker exited: no slot alive; every dead one recoverable."""
        region = self.lock.region
        parts = region._describe()["participants"]
        alive = [p for p in parts if p["alive"]]
        if alive:
            self.res.leaked_alive = len(alive)
            self.res.notes.append(f"slots alive after every worker exited: {alive}")
        region._recover_dead()
        parts = region._describe()["participants"]
        dead = [p for p in parts if not p["alive"]]
        if dead:
            self.res.leaked_dead = len(dead)
            self.res.notes.append(f"dead slots that _recover_dead() cannot recover: {dead}")

    def final_check(self) -> None:
        """Take the lock once more (resolving a last death) and check the books."""
        a, res = self.a, self.res
        try:
            got = self.lock.acquire(True, 2.0)
        except shmlocks.ShmLockError as e:
            res.errors += 1
            res.notes.append(f"final acquire: {type(e).__name__}: {e}")
            self.note_raw()
            got = False
        else:
            if not got:
                self.note_wedge("at the final acquire")
        ex = _checker(a, self.nw)
        if got:
            if self.lock.owner_died:
                ex.repair()
                res.recoveries += 1
                self.lock.mark_consistent()
            elif a[CHECK + MARK_W]:
                res.violations += 1  # a death in a section went unreported
                ex.repair()
            self.lock.release()
        books = ex.report()
        res.sections = books.expected
        diff = books.total - books.expected
        if diff != a[ADJUST]:
            res.violations += 1
        res.violations += a[VIOLATIONS] + books.violations
        if a[ADJUST] or diff:
            res.notes.append(f"counter {books.total} != completed sections {res.sections}")
        res.recoveries += a[RECOVERIES]
        res.inflight = books.inflight
        res.acquisitions = a[ACQUIRED]
        res.reads, res.read_violations = a[READS], a[READ_VIOLATIONS]
        if res.read_violations:
            res.notes.append(f"{res.read_violations} reads saw a writer inside")
        res.stalls = sum(a[STALLS : STALLS + self.nw])
        res.errors += sum(a[ERRORS : ERRORS + self.nw])
        seen = a[KILLS_SEEN]
        res.untimed_kills = 0 if res.wedges else a[KILLS_ISSUED] - seen
        res.worst_ms = a[WORST_NS] / 1e6
        res.mean_ms = a[SUM_NS] / seen / 1e6 if seen else 0.0
        if res.recoveries > res.kills:
            res.violations += 1
            res.notes.append(f"{res.recoveries} holds saw owner_died after only {res.kills} deaths")
        self.check_counters(got)

    def check_counters(self, got: bool) -> None:
        """The lock's own counters (lock.stats()) against the books: every hold the
        workers counted (and the final one) was counted by the lock, and only a killed
        worker can have begun a hold it did not count; a hold begins with owner_died only
        after a death, and every one the workers saw was counted."""
        res = self.res
        stats = getattr(self.lock, "stats", None)
        if stats is None:
            return  # a stand-in lock (the tests' broken ones) keeps no counters
        st = res.lock_stats = dict(stats())
        held = res.acquisitions + (1 if got else 0)
        if not held <= st["acquisitions"] <= held + res.kills:
            res.violations += 1
            res.notes.append(
                f"lock counted {st['acquisitions']} acquisitions; the workers {held} "
                f"with {res.kills} kills"
            )
        if not res.recoveries <= st["owner_deaths"] <= res.kills:
            res.violations += 1
            res.notes.append(
                f"lock counted {st['owner_deaths']} owner deaths; the workers saw "
                f"{res.recoveries} with {res.kills} kills"
            )


def torture_kind(
    kind: str,
    seconds: float,
    workers: int,
    seed: int | None = None,
    load: bool = False,
    aio: bool = False,
) -> Result:
    """Run one kind's torture. ``load``: the
    workers run at mixed nice levels and policies beside a CPU hog per CPU (the caller
    starts the hogs: start_hogs()). ``aio``: every other worker is an event loop whose
    tasks use acquire_async (_worker_async)."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be between 1 and {MAX_WORKERS}")
    run = _Run(kind, workers, random.randrange(1 << 30) if seed is None else seed, load, aio)
    try:
        return run.run(seconds)
    finally:
        run.cleanup()


def main(
    kinds: Sequence[str],
    seconds: float,
    workers: int,
    seed: int | None = None,
    out=None,
    load: bool = False,
    aio: bool = False,
) -> list[Result]:
    """Torture each kind in turn, printing one line per kind; returns the results.
    ``load``: a CPU hog pinned to each CPU for the whole run, and workers at nice levels
    LOAD_NICE (SCHED_BATCH for every other one), so preemption lands inside protocol steps."""
    out = out or sys.stdout
    ncpu = len(os.sched_getaffinity(0))
    print(
        f"shmlocks torture: {workers} workers per kind, {seconds:g} s each, a SIGKILL every "
        f"{KILL_INTERVAL[0] * 1e3:.0f}-{KILL_INTERVAL[1] * 1e3:.0f} ms "
        f"({ncpu} CPUs"
        + (
            f", loaded: {ncpu} CPU hogs, workers at nice {'/'.join(map(str, LOAD_NICE))})"
            if load
            else ")"
        ),
        file=out,
        flush=True,
    )
    hogs = start_hogs() if load else []
    try:
        results = []
        for kind in kinds:
            res = torture_kind(kind, seconds, workers, seed, load, aio)
            results.append(res)
            print(res.line(), file=out, flush=True)
            for note in res.notes:
                print(f"    {note}", file=out, flush=True)
    finally:
        stop_hogs(hogs)
    return results
