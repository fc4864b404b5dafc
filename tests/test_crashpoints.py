"""Crash points: a process dies at every named protocol step of every kind while other
processes hold and wait, and the lock recovers exactly (docs/design.md §6 and §8).

For each (kind, point) in ``shmlocks._crashpoints()``, a ``Case`` (tests/support/crashcase.py)
starts a child interpreter with ``SHMLOCKS_CRASHPOINT=<point>`` that runs a loop reaching
every point, among three survivor processes that hold (sometimes long) and wait, until it
SIGKILLs itself there:

* "lock.*" and "<kind>.*" points lie inside acquire, release and abort: the child mixes
  blocking acquires, short timeouts that expire while it is queued (so it parks, times out
  and abandons), try-locks and releases;
* recovery points ("recover.*", "<kind>.recover.*") are only passed by a recoverer: the test
  starts a victim that takes the lock and is SIGKILLed in its critical section, while the
  child (one thread queued on the lock, its main thread polling the victim's liveness
  token) recovers it -- and dies doing so.

Two families need a region grown past its first participants (docs/design.md §2) and
have tests of their own, at the end of this file: the growth points ("region.grow.*",
passed by a registration that provisions more participant slots) and the ticket kind's
overflow points ("ticket.overflow.*", passed only with more than 64 tickets outstanding).

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

import glob
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from support import ROBUST_KINDS, USERSPACE_KINDS, join_all, uniq, wait_stopped
from support.crashcase import (
    CHILD_AT,
    CHILD_SEQ,
    CHILD_WALL,
    DIED_N,
    FIRST_THREAD,
    GO,
    MAX_PARTICIPANTS,
    SOAK,
    Case,
    checker,
    enter,
    map_shared,
)

import shmlocks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# --------------------------------------------------------------------------- the cases

CRASHPOINTS: dict[str, tuple[str, ...]] = shmlocks._crashpoints()
#: points only a resumable wait passes ("<kind>.async.*"): this matrix's participants block;
#: tests/test_nbwait.py kills a resumable waiter at each
ASYNC_ONLY = {p for p in CRASHPOINTS if ".async." in p}
#: points only a region grown past its first participants passes: tests of their own (below)
GROWN_POINTS = sorted(p for p in CRASHPOINTS if p.startswith("ticket.overflow."))
GROW_POINTS = sorted(p for p, kinds in CRASHPOINTS.items() if kinds == ("region",))
CASES = [
    (k, p)
    for k in shmlocks.KINDS
    for p in sorted(CRASHPOINTS)
    if k in CRASHPOINTS[p] and p not in ASYNC_ONLY and p not in GROWN_POINTS
]

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
    if kind in ROBUST_KINDS:
        if point in ROBUST_OWNING:
            return True
        if point in ROBUST_NOT_OWNING:
            return False
        pytest.fail(
            f"no expectation for {kind} crash point {point!r}: add it to ROBUST_OWNING or "
            "ROBUST_NOT_OWNING in this file (does the dying process own the pthread mutex?)"
        )
    return False  # user space: every other point lies inside acquire/release/abort


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
    t_death = case.run_victims() if recovery else case.child_died_within(CHILD_WALL + 1)
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
    files = glob.glob(os.path.join(ROOT, "shmlocks", "_ext", "**", "*.pxi"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "shmlocks", "*.pyx"))
    for path in files:
        with open(path) as f:
            text = f.read()
        for name in re.findall(
            r'\bcrashpoint(?:_at|_lock_at)?\(\s*(?:armed\s*,\s*)?"([a-z_]+(?:\.[a-z_]+)+)"\s*[,)]',
            text,
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
        # a kind of KINDS, or an object of the toolbox with a protocol of steps (rwlock),
        # or the region's own (growth: "region"), or a multi-acquire's ("hold", tests/test_sharding.py)
        # or a table's compact ticket or mcs stripe's ("table", tests/test_table_ticket.py,
        # tests/test_table_mcs.py)
        assert kinds and set(kinds) <= set(shmlocks.KINDS) | set(shmlocks.OBJECTS) | {
            "region",
            "hold",
            "table",
        }, (
            name,
            kinds,
        )
        prefix = name.split(".", 1)[0]
        if prefix in shmlocks.KINDS:
            assert kinds == (prefix,), f"{name!r} is {prefix}-specific, but lists {kinds}"


@pytest.mark.timeout(20)
def test_every_kind_has_its_points():
    assert set(ROBUST_KINDS) | set(USERSPACE_KINDS) == set(shmlocks.KINDS)
    for kind in shmlocks.KINDS:
        assert any(kind in kinds for p, kinds in CRASHPOINTS.items() if p.startswith("lock."))
    for kind in USERSPACE_KINDS:
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


# ------------------------------------------------------------- growth (docs/design.md §2)

_GROWER = r"""
import sys, threading, shmlocks
lock = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
stop = threading.Event()
def member(done):
    with lock:                       # registers: the first past the slots provisioned grows
        pass
    done.set()
    stop.wait(60)                    # keeps its slot, as a pool's thread does
print("ready", flush=True)
sys.stdin.readline()
for i in range(400):                 # one at a time: none holds the lock at the growth
    done = threading.Event()
    threading.Thread(target=member, args=(done,), daemon=True).start()
    if not done.wait(20):
        break
print("not reached", flush=True)
"""


def _many_members(lock, path: str, n: int, who: int) -> int:
    """n threads of this (forked) process each take `lock` once (a checker section as
    `who`) and stay alive together; returns the count of those that did."""
    import threading as th

    a = map_shared(path)
    count, errors = [], []
    stop = th.Event()

    def work(done) -> None:
        try:
            with lock:
                enter(lock, a, who)
                count.append(1)
                checker(a).leave(who)
        except Exception as e:  # noqa: BLE001 - sent back
            errors.append(repr(e))
        done.set()
        stop.wait(60)

    ts = []
    for _ in range(n):
        done = th.Event()
        ts.append(th.Thread(target=work, args=(done,), daemon=True))
        ts[-1].start()
        assert done.wait(30), "a member did not take the lock"
    assert not errors, errors
    stop.set()
    for t in ts:
        t.join(30)
    return len(count)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", GROW_POINTS)
@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_death_of_a_grower(procs, new_lock, tmp_path, kind, point):
    """A registration that provisions more participant slots (the 33rd thread of a lock
    made with the defaults) is SIGKILLed at each step of the growth, while three survivor
    processes hold and wait, and the dead grower's 29 other threads (each of which took the
    lock once) die with it. The survivors go on within 2 s (none needs the growth); the
    growth is then redone by the next registration that needs it (from scratch: nothing
    the dead one did was published but the last step's count), the dead grower's slots
    are recovered and claimed again, 150 threads of another process take the lock and
    count exactly, no hold sees owner_died (nobody died holding) and no slot is left dead."""
    lock = new_lock(kind)
    case = Case(procs, lock, kind, point, tmp_path)
    try:
        case.start_survivors()
        case.wait_running()
        child = procs.popen(
            [sys.executable, "-c", _GROWER, kind, lock.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, SHMLOCKS_CRASHPOINT=point),
        )
        assert child.stdout.readline().strip() == "ready"
        case.a[GO] = 1
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(60) == -signal.SIGKILL, f"{point} not reached: {child.stdout.read()}"
        t_death = time.monotonic_ns()
        provisioned = lock.region._provisioned
        assert provisioned == (64 if point == "region.grow.published" else 32)
        lag = case.survivors_acquire_after(t_death)
        print(f"{kind} {point}: every survivor acquired within {lag / 1e6:.1f} ms")
        n = procs.call(_many_members, lock, case.path, 150, FIRST_THREAD, timeout=90)
        assert n == 150
        assert lock.region._provisioned >= 256  # grown again, past the dead one's step
        time.sleep(SOAK)
        case.stop()
        case.check_exclusion()
        assert case.died_entries() == [], "owner_died after a death that held nothing"
        lock.region._recover_dead()
        parts = lock.region._describe()["participants"]
        assert not [p for p in parts if not p["alive"]], "a dead grower's slot is left"
    finally:
        case.close()


# -------------------------------------- ticket: more than 64 outstanding (ticket.pxi)

_OVERFLOWER = r"""
import sys, time, shmlocks
lock = shmlocks.TicketLock.open(sys.argv[1])
mode, deadline = sys.argv[2], float(sys.argv[3])
if mode == "release":
    assert lock.acquire(timeout=10)  # ticket s: the crowd queues behind it
print("ready", flush=True)
sys.stdin.readline()
if mode == "wait":                   # its ticket shares a slot with an abandoned one:
    lock.acquire(timeout=max(0.01, deadline - time.monotonic()))   # overflows as it leaves
else:
    lock.release()                   # passes an abandoned ticket kept in a record
print("not reached", flush=True)
"""


def _crowd(name: str, deadlines: list, base: int, a) -> None:
    """Threads queued on ticket lock `name` in the order of `deadlines` (each queued before
    the next starts; `base` waiters queued before them), each waiting until its deadline
    (CLOCK_MONOTONIC s; None: 60 s). a[i]: 1 if thread i got the lock, 2 if it timed out;
    a[N + k]: the k-th holder's index + 1."""
    import threading as th

    lock = shmlocks.TicketLock.open(name)
    n = len(deadlines)
    held = [0]

    def wait(i: int, deadline) -> None:
        got = lock.acquire(timeout=60 if deadline is None else deadline - time.monotonic())
        if got:
            a[n + held[0]] = i + 1
            held[0] += 1
            time.sleep(0.001)
            lock.release()
        a[i] = 1 if got else 2

    ts = []
    for i, d in enumerate(deadlines):
        ts.append(th.Thread(target=wait, args=(i, d)))
        ts[-1].start()
        end = time.monotonic() + 10
        while lock._describe()["waiters"] < base + i + 1 and time.monotonic() < end:
            time.sleep(0.001)
    for t in ts:
        t.join(90)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", GROWN_POINTS)
def test_death_at_an_overflow_point(procs, new_lock, point):
    """More than 64 tickets outstanding (a grown region): tickets t and t + 64 share a slot
    line, and when both are abandoned, the second marker goes to its owner's record
    (ticket.pxi). A waiter dies leaving that way (after counting the overflow, or after
    marking its record), or a releaser dies passing such a ticket (its claim made, serving
    not moved). The 63 live waiters queued in between all get the lock, once each, in the
    order they queued; the abandoned tickets are skipped; no hold sees owner_died (the dead
    one was waiting, or releasing); and the lock is free and usable after, every
    participant recovered."""
    lock = new_lock("ticket")
    ctx = mp.get_context("fork")
    t0 = time.monotonic()
    if point == "ticket.overflow.claimed":
        # the child holds ticket s; A = s+1 leaves after C = s+65 (same slot): A's marker
        # goes to A's record, and the child's release passes it
        mode, child_deadline = "release", 0.0
        deadlines = [t0 + 6.0] + [None] * 63 + [t0 + 5.0]
        base = 0
    else:
        # the test holds ticket s; A = s+1 leaves first (its marker in the slot), then the
        # child (s+65, same slot) leaves: its marker overflows to its record
        mode, child_deadline = "wait", t0 + 6.0
        deadlines = [t0 + 5.0] + [None] * 63
        base = 0
        assert lock.acquire(timeout=5)
    child = procs.popen(
        [sys.executable, "-c", _OVERFLOWER, lock.name, mode, str(child_deadline)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SHMLOCKS_CRASHPOINT=point),
    )
    assert child.stdout.readline().strip() == "ready"
    n = len(deadlines)
    a = ctx.RawArray("q", 2 * n + 2)
    crowd = procs.start(_crowd, lock.name, deadlines, base, a)
    until_queued = time.monotonic() + 10
    while lock._describe()["waiters"] < n and time.monotonic() < until_queued:
        time.sleep(0.005)
    assert lock._describe()["waiters"] == n, "the crowd did not queue"
    if mode == "wait":
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.5)
        assert lock._describe()["waiters"] == n + 1, "the child did not queue"
    assert time.monotonic() < t0 + 4.5, "too slow to set up before the first timeout"
    if mode == "release":
        while a[n - 1] != 2 or a[0] != 2:  # C, then A, left: A's marker is in its record
            assert time.monotonic() < t0 + 20, "the abandoning waiters did not leave"
            time.sleep(0.01)
        child.stdin.write("go\n")
        child.stdin.flush()
    assert child.wait(30) == -signal.SIGKILL, f"{point} not reached: {child.stdout.read()}"
    if mode == "wait":
        lock.release()
    assert not join_all([crowd], 60), "the crowd did not finish"
    live = list(range(1, 64))
    assert [a[i] for i in live] == [1] * 63, "a live waiter did not get the lock"
    assert a[0] == 2 and (mode == "wait" or a[n - 1] == 2)
    holders = [a[n + k] - 1 for k in range(n) if a[n + k]]
    assert holders == live, f"not served in queue order: {holders}"
    assert lock.acquire(timeout=5), "the lock is wedged after the death"
    assert not lock.owner_died
    lock.release()
    lock.region._recover_dead()
    assert not [p for p in lock.region._describe()["participants"] if not p["alive"]]
    assert not lock.locked() and lock._describe()["waiters"] == 0
