"""The compact mcs stripe of a lock table (shmlocks/_ext/kinds/mcsc.pxi, docs/design.md
§15): one 128-byte line a stripe (its waiters' aside words past its words), K42 MCS with
one wait node per participant for the table. What it keeps of the mcs kind: FIFO
hand-off, stepping aside past the CPUs, timeouts (a waiter abandons its node and the next
release passes it), owner death at every protocol step (each crash point), exact mutual
exclusion, multi-stripe holds; and what one node per table changes: a participant whose
node is still queued (abandoned) on one stripe takes another stripe that is free at once,
and one that is held by polling it until it is free or its node passed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import random
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest
from support import SHM_DIR, uniq
from support.common import (
    cancelling,
    journaled_section,
    journals_settled,
    kill,
    kill_at_random,
    stripe_bytes,
    until,
)

import shmlocks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MC_HELD = 0x80000000  # mcsc.pxi: a holder mark, MC_HELD | (participant + 1)
IDLE, WAIT, GRANT, ABANDONED, PASSING = range(5)  # a node's states (mcs.pxi)


def tail(lock) -> tuple[int, int]:
    """A stripe's tail word: (last, prev)."""
    w = lock._raw()["wa"]
    return w & 0xFFFFFFFF, w >> 32


def node_states(lock) -> list[int]:
    return [n[0] for n in lock._raw()["nodes (state, next, pred, parked, value, round, guess)"]]


def assert_clean(t) -> None:
    """Nothing held, nobody queued, every node of the table idle."""
    t.region._recover_dead()
    for i in range(t.size):
        assert tail(t[i]) == (0, 0), (i, tail(t[i]))
    assert set(node_states(t[0])) <= {IDLE}, node_states(t[0])


def _stripe_at(t, s: int) -> bytes:
    return stripe_bytes(t.name, t.size, s)


# ------------------------------------------------------------------------------- layout


@pytest.mark.timeout(60)
def test_an_mcs_table_is_one_line_a_stripe():
    with shmlocks.LockTable(4096, "mcs", name=uniq("mcst-big")) as t:
        lay = shmlocks._core.LAYOUT
        with open(os.path.join(SHM_DIR, t.name), "rb") as f:
            head = f.read(lay["header_size"])
            st = os.fstat(f.fileno())
        (ext,) = struct.unpack_from("<Q", head, lay["ext_lines_off"])
        assert lay["stripe_aside_off"] == lay["stripe_wa_off"] + 24 and lay["stripe_seats"] == 4
        assert ext == 4096 * lay["stripe_lines"], "one 128-byte line per stripe (x86_64)"
        for i in (0, 4095):
            with t[i]:
                assert t[i].locked()
        # resident: the region's own lines and a line a stripe, not a body a stripe
        assert st.st_blocks * 512 < 4096 * 128 * lay["stripe_lines"] + 64 * 1024, st.st_blocks


_HOLD = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
s = int(sys.argv[2])
t[s].acquire()
print("held", flush=True)
sys.stdin.readline()
t[s].release()
print("released", flush=True)
"""


def _waiter(name: str, s: int, timeout: float, out) -> None:
    t = shmlocks.LockTable.open(name)
    got = t[s].acquire(timeout=timeout)
    out.put((os.getpid(), got))
    if got:
        t[s].release()


@pytest.mark.timeout(60)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the one-line stripe's offsets")
def test_a_held_mcs_stripe_keeps_its_words_where_mcsc_pxi_says(procs):
    """The holder's statistics in bytes 0..63, the tail at +64 (the holder mark with
    nobody waiting; the last waiter's node and its pred, the mark, with one), the first
    waiter hint at +72, timeouts at +112; the neighbours' lines untouched."""
    name = uniq("mcst-bytes")
    with shmlocks.LockTable(8, "mcs", name=name) as t:
        blank = _stripe_at(t, 0)
        with t[5]:
            line = _stripe_at(t, 5)
            holder, _magic, acq = struct.unpack_from("<IIQ", line, 8)
            last, prev = struct.unpack_from("<II", line, 64)
            assert holder != 0 and acq == 1
            assert last & MC_HELD and last & 0x7FFFFFFF == (holder & 0x1FFF) and prev == 0
            q = mp.get_context("fork").Queue()
            p = procs.start(_waiter, name, 5, 0.5, q)
            until(lambda: not tail(t[5])[0] & MC_HELD, what="the waiter queued")
            w_last, w_prev = struct.unpack_from("<II", _stripe_at(t, 5), 64)
            assert w_prev == last and not w_last & MC_HELD  # (its node, its pred: us)
            (first,) = struct.unpack_from("<I", _stripe_at(t, 5), 72)
            assert first == w_last  # the hint
            assert q.get(timeout=10)[1] is False
            p.join(10)
        assert struct.unpack_from("<I", _stripe_at(t, 5), 112) == (1,)  # the timeout
        assert struct.unpack_from("<Q", _stripe_at(t, 5), 64) == (0,)  # free: passed it
        for i in (0, 1, 2, 3, 4, 6, 7):
            assert _stripe_at(t, i) == blank, i
        assert_clean(t)


# ------------------------------------------------------------------------- exclusion, FIFO


def _count(name: str, counts_name: str, n: int, seed: int) -> None:
    import multiprocessing.shared_memory as sm

    t = shmlocks.LockTable.open(name)
    shm = sm.SharedMemory(counts_name)
    counts = shm.buf.cast("Q")
    rng = random.Random(seed)
    for _ in range(n):
        s = rng.randrange(3)
        with t[s]:
            v = counts[s]  # read-modify-write: only the stripe protects it
            if rng.random() < 0.05:
                time.sleep(0)
            counts[s] = v + 1
    del counts
    shm.close()


@pytest.mark.timeout(120)
def test_exact_counts_under_contention(procs):
    import multiprocessing.shared_memory as sm

    shm = sm.SharedMemory(create=True, size=8 * 3, name=uniq("mcst-cnt"))
    try:
        with shmlocks.LockTable(3, "mcs", name=uniq("mcst-ex")) as t:
            ps = [procs.start(_count, t.name, shm.name, 3000, s) for s in range(4)]
            for p in ps:
                p.join(100)
                assert p.exitcode == 0
            counts = shm.buf.cast("Q")
            assert sum(counts) == 4 * 3000, list(counts)
            del counts
            assert t.stats()["acquisitions"] == 4 * 3000
            assert_clean(t)
    finally:
        shm.close()
        shm.unlink()


def _fifo_waiter(name: str, s: int, order, i: int) -> None:
    t = shmlocks.LockTable.open(name)
    with t[s]:
        order[order[0] + 1] = i
        order[0] += 1


@pytest.mark.timeout(60)
def test_fifo_on_one_stripe(procs):
    """Waiters queued one after the other on a held stripe are served in that order."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-fifo")) as t:
        order = ctx.RawArray("q", 8)
        ps = []
        with t[2]:
            for i in range(5):
                before = tail(t[2])
                ps.append(procs.start(_fifo_waiter, t.name, 2, order, i, ctx=ctx))
                until(lambda b=before: tail(t[2]) != b, what=f"waiter {i} queued")
        for p in ps:
            p.join(20)
            assert p.exitcode == 0
        assert list(order[1:6]) == [0, 1, 2, 3, 4]
        assert_clean(t)


# ------------------------------------------------------------------ stepping aside (§7.0)

UNSET = -9
ASIDE_S = 0.2  # a waiter aside stays aside this long here (ms scale in production)
AS_SEATS_OFF = 8  # the first spinner seat: the aside words' u32 2 (participants.pxd)


def _aside_waiter(name, s, idx, order, pos, ready, spin_s):
    """Waits for stripe s with one spinner seat, spinning spin_s (holding the seat that
    long) and staying aside ASIDE_S; records its place in the order the stripe serves."""
    from shmlocks import _core

    t = shmlocks.LockTable.open(name)
    if spin_s:
        _core._wait_policy(spin_ns=int(spin_s * 1e9))
    _core._aside_init(1, int(ASIDE_S * 1e9))
    ready.send(1)
    if t[s].acquire(timeout=30):
        order[pos.value] = idx
        pos.value += 1
        t[s].release()


@pytest.mark.timeout(90)
def test_mcs_stripe_waiters_step_aside_and_are_served_in_arrival_order(procs):
    """Waiter 0 spins in its place on stripe 5 (the one seat); waiters 1-3 arrive behind
    it one at a time, find no seat and step aside (their nodes left abandoned on stripe
    5); each rejoins its old place, and the stripe goes 0, 1, 2, 3. The seat is the word
    8 bytes into the stripe's aside words; no other stripe's bytes change."""
    from support.common import aside_count, join_or_kill, wait_blocked, wait_seated

    ctx = mp.get_context("fork")
    lay = shmlocks._core.LAYOUT
    with shmlocks.LockTable(8, "mcs", name=uniq("mcst-aside"), max_participants=8) as t:
        blank = _stripe_at(t, 0)
        lk = t[5]
        order = ctx.Array("i", [UNSET] * 4, lock=False)
        pos = ctx.Value("i", 0, lock=False)
        children = []
        seen_aside = 0
        assert lk.acquire()
        try:
            for i in range(4):
                r, w = ctx.Pipe(duplex=False)
                p = procs.start(
                    _aside_waiter, t.name, 5, i, order, pos, w, 3.0 if i == 0 else 0, ctx=ctx
                )
                assert r.poll(20)
                r.recv()
                children.append(p)
                if i == 0:
                    wait_seated(lk)
                    seat = struct.unpack_from(
                        "<I", _stripe_at(t, 5), lay["stripe_aside_off"] + AS_SEATS_OFF
                    )[0]
                    assert seat == lk._raw()["aside"]["seats"][0] != 0
                else:
                    end = time.monotonic() + 5
                    while aside_count(lk) < 1 and time.monotonic() < end:
                        time.sleep(0.001)
                    seen_aside = max(seen_aside, aside_count(lk))
                    time.sleep(0.05)  # the next arrives while this one is still aside
            assert seen_aside >= 1, "no waiter stepped aside behind the seated one"
            for p in children:
                wait_blocked(p.pid, timeout=20)
            end = time.monotonic() + 20
            while aside_count(lk) and time.monotonic() < end:  # all back in their places
                time.sleep(0.01)
            assert order[0] == UNSET
            for i in (0, 1, 2, 3, 4, 6, 7):
                assert _stripe_at(t, i) == blank, i
        finally:
            lk.release()
        stuck = join_or_kill(children, 30)
        assert not stuck, "a waiter was never served"
        assert list(order) == [0, 1, 2, 3]
        raw = lk._raw()["aside"]
        assert raw["vip"] == 0 and raw["seats"] == [0] * len(raw["seats"]), raw
        assert raw["aside"] == [], raw
        assert_clean(t)


@pytest.mark.timeout(90)
def test_a_dead_line_ahead_of_an_mcs_stripe_waiter_aside_wakes_and_is_recovered(procs):
    """tests/test_aside.py's death of the line ahead of a waiter aside, on stripe 5 of an
    mcs table: the holder, the seated spinner and the waiter aside ahead (its node left
    abandoned on the stripe) SIGKILLed at once; the waiter aside behind wakes, rejoins,
    recovers them and gets the stripe with owner_died; the dead one's seat, VIP turn and
    mark are cleared (in the stripe's aside words, the table's prec lines)."""
    from test_aside import _kill_the_line_ahead_of_a_waiter_aside

    tables = []

    def stripe(kind, **kwargs):
        tables.append(shmlocks.LockTable(8, kind, name=uniq("mcst-aside-kill"), **kwargs))
        return tables[-1][5]

    try:
        lk, waited, died = _kill_the_line_ahead_of_a_waiter_aside(procs, stripe, "mcs")
        assert died, "the dead holder's stripe was not owner_died for the waiter aside"
        assert waited < 2.0, f"the waiter aside got the stripe {waited:.3f} s after the deaths"
        raw = lk._raw()["aside"]
        assert raw["vip"] == 0 and raw["seats"] == [0] * len(raw["seats"]), raw
        assert raw["aside"] == [], raw
        assert_clean(tables[0])
    finally:
        for t in tables:
            t.unlink()
            t.close()


# -------------------------------------------------------------- timeouts and abandonment


@pytest.mark.timeout(60)
def test_a_waiter_that_timed_out_takes_other_stripes_and_is_passed():
    """A thread times out behind a holder of stripe 0 (its node stays queued, abandoned):
    it then takes stripe 1, which is free, at once; waits for stripe 2, held, and gets it
    when it is released (its node is still queued on 0: it polls 2); and once stripe 0's
    release has passed its node, it queues on 0 again in FIFO order."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-ab")) as t:
        res = {}
        step = threading.Event()

        def other():
            res["t0"] = t[0].acquire(timeout=0.2)  # times out: abandoned on stripe 0
            t0 = time.monotonic()
            res["t1"] = t[1].acquire(timeout=5)
            res["t1_s"] = time.monotonic() - t0
            t[1].release()
            step.set()
            res["t2"] = t[2].acquire(timeout=10)  # held by main: polled
            t[2].release()

        with t[0]:
            with t[2]:
                th = threading.Thread(target=other)
                th.start()
                assert step.wait(10)
                time.sleep(0.1)
                assert th.is_alive()  # waits for stripe 2
                assert ABANDONED in node_states(t[0])
            th.join(10)
            assert res == {"t0": False, "t1": True, "t1_s": res["t1_s"], "t2": True}
            assert res["t1_s"] < 1.0
            assert t[0].stats()["timeouts"] == 1
        assert tail(t[0]) == (0, 0)  # the release passed the abandoned node
        assert set(node_states(t[0])) == {IDLE}
        assert_clean(t)


@pytest.mark.timeout(60)
def test_a_waiter_that_timed_out_rejoins_its_place():
    """A waiter leaving at its deadline keeps its node queued; its next wait on the same
    stripe by the same thread takes that place back: still ahead of a later waiter."""
    with shmlocks.LockTable(2, "mcs", name=uniq("mcst-rejoin")) as t:
        got = []
        first_left = threading.Event()

        def a():
            assert not t[0].acquire(timeout=0.2)
            first_left.set()
            assert t[0].acquire(timeout=10)
            got.append("a")
            t[0].release()

        def b():
            assert t[0].acquire(timeout=10)
            got.append("b")
            t[0].release()

        with t[0]:
            ta = threading.Thread(target=a)
            ta.start()
            assert first_left.wait(10)
            before = tail(t[0])
            tb = threading.Thread(target=b)
            tb.start()
            until(lambda: tail(t[0]) != before, what="b queued")
            time.sleep(0.05)
        ta.join(10)
        tb.join(10)
        assert got == ["a", "b"]
        assert_clean(t)


# ---------------------------------------------------------------------- death, each step

_WAIT = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
s = int(sys.argv[2])
t[s].acquire()
t[s].release()
print("done", flush=True)
"""


_WAIT_GO = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
s = int(sys.argv[2])
with t[t.size - 1]:
    pass
print("registered", flush=True)
sys.stdin.readline()
t[s].acquire()
t[s].release()
print("done", flush=True)
"""


def _child(name: str, code: str, s: int, point: str | None, **kw):
    env = dict(os.environ)
    env.pop("SHMLOCKS_CRASHPOINT", None)
    if point:
        env["SHMLOCKS_CRASHPOINT"] = point
    return subprocess.Popen(
        [sys.executable, "-c", code, name, str(s)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **kw,
    )


def _dead(p) -> None:
    assert p.wait(20) == -signal.SIGKILL, "the child did not die at its crash point"


class _Taker(threading.Thread):
    """A thread (a participant of its own, registered before it starts to wait: a thread
    registered after a death may inherit the dead one's slot and its node, which waits
    for its pass) that waits for stripe s, then for more jobs (`again`)."""

    def __init__(self, t, s, timeout=15.0):
        super().__init__(daemon=True)
        self.t, self.jobs = t, [(s, timeout)]
        self.got = self.died = None
        self.go, self.ready, self.done = threading.Event(), threading.Event(), threading.Event()
        self.next = threading.Event()
        self.more = None

    def prepare(self):
        """Start the thread and let it register, not yet wait."""
        super().start()
        assert self.ready.wait(10)

    def start(self):
        if not self.ready.is_set():
            self.prepare()
        self.go.set()

    def again(self, s, timeout=15.0):
        """Wait for stripe s again (after the first job)."""
        self.done.clear()
        self.more = (s, timeout)
        self.next.set()

    def run(self):
        with self.t[self.t.size - 1]:  # registers this thread (the last stripe: unused)
            pass
        self.ready.set()
        self.go.wait()
        job = self.jobs[0]
        while job is not None:
            lk = self.t[job[0]]
            self.got = lk.acquire(timeout=job[1])
            if self.got:
                self.died = lk.owner_died
                if self.died:
                    lk.mark_consistent()
                lk.release()
            self.done.set()
            if not self.next.wait(30):
                return
            self.next.clear()
            job, self.more = self.more, None

    def finish(self):
        self.next.set()
        self.join(20)

    def result(self, timeout=20.0):
        assert self.done.wait(timeout)
        return self.got, self.died


def _queued_behind(t, s, before, what) -> None:
    until(lambda: tail(t[s]) != before and not tail(t[s])[0] & MC_HELD, what=what)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["mcsc.acquire.joined", "mcsc.acquire.pred"])
def test_killed_joining_is_passed(point):
    """A waiter killed as it joins the queue: a waiter behind it recovers it (abandoned),
    and the holder's release passes its node; nobody sees owner_died."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-join")) as t:
        th = _Taker(t, 1)
        th.prepare()  # registered before the death: not the dead one's slot
        with t[1]:
            c = _child(t.name, _WAIT, 1, point)
            _dead(c)
            before = tail(t[1])
            th.start()
            _queued_behind(t, 1, before, "the thread queued")
        assert th.result() == (True, False)
        th.finish()
        with t[1]:
            assert not t[1].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "point, behind",
    [("mcsc.grant.moved", False), ("mcsc.grant.moved", True), ("mcsc.redirect.pred", True)],
)
def test_killed_in_its_grant_step(point, behind):
    """A waiter granted the stripe and killed in its K42 step (its successor link moved
    or half moved into the stripe, its node not yet free): it never returned from acquire,
    so the next holder gets the stripe without owner_died, and nothing wedges."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-k42")) as t:
        th = None
        with t[2]:
            before = tail(t[2])
            c = _child(t.name, _WAIT, 2, point)
            _queued_behind(t, 2, before, "the child queued")
            if behind:
                before = tail(t[2])
                th = _Taker(t, 2)
                th.start()
                _queued_behind(t, 2, before, "the thread queued")
        _dead(c)
        if th is not None:
            assert th.result() == (True, False)
            th.finish()
        assert t[2].acquire(timeout=10)
        try:
            assert not t[2].owner_died
        finally:
            t[2].release()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_after_emptying_on_release():
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-rel")) as t:
        c = _child(t.name, _WAIT, 3, "mcsc.release.emptied")
        _dead(c)
        assert t[3].acquire(timeout=10)
        try:
            assert not t[3].owner_died
        finally:
            t[3].release()
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "point", ["mcsc.pass.emptied", "mcsc.release.passing", "mcsc.redirect.pred"]
)
def test_killed_passing_an_abandoned_node(point):
    """The holder releases through a node abandoned by a waiter that timed out, and is
    killed mid-pass: the node is freed by its recovery (its owner queues again), and the
    waiter behind it (if any) gets the stripe, without owner_died (the holder had left its
    section)."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-pass")) as t:
        c = _child(t.name, _HOLD, 1, point)
        assert c.stdout.readline().strip() == "held"
        ab = _Taker(t, 1, timeout=0.3)
        ab.start()
        assert ab.result() == (False, None)  # its node: abandoned on stripe 1
        th = None
        if point != "mcsc.pass.emptied":
            before = tail(t[1])
            th = _Taker(t, 1)
            th.start()
            _queued_behind(t, 1, before, "the thread queued")
        c.stdin.write("go\n")
        c.stdin.flush()
        _dead(c)
        if th is not None:
            assert th.result() == (True, False)
            th.finish()
        # the abandoned node's thread waits again (its node freed by the recovery), queued
        with t[1]:
            assert not t[1].owner_died
            before = tail(t[1])
            ab.again(1)
            _queued_behind(t, 1, before, "the thread queued again")
        assert ab.result() == (True, False)
        ab.finish()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_recovering_a_dead_holder():
    """A holder killed in its section, and its recoverer killed after the verdict: the
    next holder gets owner_died."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-rec")) as t:
        holder = _child(t.name, _HOLD, 0, None)
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(10)
        c = _child(t.name, _WAIT, 0, "mcsc.recover.flagged")
        _dead(c)
        assert t[0].acquire(timeout=10)
        try:
            assert t[0].owner_died
            t[0].mark_consistent()
        finally:
            t[0].release()
        with t[0]:
            assert not t[0].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "point, queued",
    [
        ("mcsc.pass.emptied", False),  # recovered at its registration: the node was last
        ("mcsc.release.passing", True),  # queued behind the node: the pass redirects it
        ("mcsc.redirect.pred", True),
    ],
)
def test_recoverer_killed_passing_for_a_dead_holder(point, queued):
    """Two deaths in a row: a holder SIGKILLed in its section with an abandoned node
    behind it, then its recoverer killed while it passes through that node on the dead
    holder's behalf: the next waiter redoes both recoveries and gets owner_died; the
    abandoned node's thread queues again."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-dd")) as t:
        holder = _child(t.name, _HOLD, 1, None)
        assert holder.stdout.readline().strip() == "held"
        ab = _Taker(t, 1, timeout=0.3)
        ab.start()
        assert ab.result() == (False, None)  # abandoned behind the holder
        if queued:
            c = _child(t.name, _WAIT_GO, 1, point)
            assert c.stdout.readline().strip() == "registered"
            before = tail(t[1])
            c.stdin.write("go\n")
            c.stdin.flush()
            _queued_behind(t, 1, before, "the recoverer-to-be queued")
            holder.kill()
            holder.wait(10)
        else:
            holder.kill()
            holder.wait(10)
            c = _child(t.name, _WAIT, 1, point)
        _dead(c)
        assert t[1].acquire(timeout=10)
        try:
            assert t[1].owner_died
            t[1].mark_consistent()
            before = tail(t[1])
            ab.again(1)
            _queued_behind(t, 1, before, "the abandoned node's thread queued again")
        finally:
            t[1].release()
        assert ab.result() == (True, False)
        ab.finish()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_holding_with_waiters_behind():
    """A holder SIGKILLed in its section with a queue behind it: the first waiter (which
    watches the holder itself, its mark) gets owner_died, the next does not."""
    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-hk")) as t:
        holder = _child(t.name, _HOLD, 2, None)
        assert holder.stdout.readline().strip() == "held"
        ths = []
        for _ in range(2):
            before = tail(t[2])
            ths.append(_Taker(t, 2))
            ths[-1].start()
            _queued_behind(t, 2, before, "a thread queued")
        holder.kill()
        holder.wait(10)
        assert [th.result() for th in ths] == [(True, True), (True, False)]
        for th in ths:
            th.finish()
        assert_clean(t)


# -------------------------------------------------------------- multi-stripe holds, kills


def _killed_holds_with_timeouts(name, arr, counts, w, seed):
    """Random holds of 1-3 of 6 stripes, with short deadlines (so that nodes are left
    abandoned on one stripe while their owners go on to others), each stripe guarding a
    value with a journal (open flag, old value) and its holder's pid."""
    t = shmlocks.LockTable.open(name)
    rng = random.Random(seed)
    while True:
        ks = sorted({rng.randrange(6) for _ in range(rng.randint(1, 3))})
        try:
            held = shmlocks.hold_all(
                *(t[k] for k in ks), timeout=rng.choice([0.001, 0.005, 0.02, None])
            )
            held.__enter__()
        except TimeoutError:
            counts[w + 4] += 1
            continue
        try:
            journaled_section(t, ks, arr, held)
        except BaseException as e:
            held.__exit__(type(e), e, e.__traceback__)  # (owner_died handed on)
            raise
        held.__exit__(None, None, None)
        counts[w] += len(ks)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_holds_with_timeouts_survive_random_sigkills(procs):
    """As tests/test_sharding.py's random-SIGKILL test, on 6 mcs stripes with deadlines
    that expire: abandoned nodes, stripes taken while one's node is queued elsewhere,
    passes through abandoned nodes, all under kills at any step. No stripe is held by two,
    nothing wedges, every dead holder's stripe comes with owner_died."""
    seconds = float(os.environ.get("SHMLOCKS_STRESS_S", "3"))
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(6, "mcs", name=uniq("mcst-kill")) as t:
        arr, counts = ctx.RawArray("q", 6 * 4), ctx.RawArray("q", 8)
        ps = [
            procs.start(_killed_holds_with_timeouts, t.name, arr, counts, w, w, ctx=ctx)
            for w in range(4)
        ]
        kills = kill_at_random(
            ps,
            lambda w, n: procs.start(
                _killed_holds_with_timeouts, t.name, arr, counts, w, 100 + n, ctx=ctx
            ),
            seconds,
            11,
        )
        with shmlocks.hold_all(*(t[k] for k in range(6)), timeout=30) as held:
            total = journals_settled(held, 6, arr)
        done = sum(counts[:4])
        assert done > 0 and done <= total <= done + 3 * kills, (done, total, kills)
        assert sum(counts[4:]) > 0, "no deadline expired: nothing was abandoned"
        assert_clean(t)


# ------------------------------------------------------------------ the wait-for graph


def _ab(name: str, mine: int, other: int, ready, go) -> None:
    shmlocks.set_deadlock_timeout(None)  # this test looks at the graph: nobody gives up
    t = shmlocks.LockTable.open(name)
    with t[mine]:
        ready.set()
        go.wait(20)
        if t[other].acquire(timeout=30):  # (the other was killed: with owner_died)
            if t[other].owner_died:
                t[other].mark_consistent()
            t[other].release()


@pytest.mark.timeout(60)
def test_the_wait_for_graph_sees_a_cycle_over_mcs_stripes(procs):
    """Two processes, each holding one mcs stripe and waiting for the other's: the table's
    description names each stripe's holder and waiter, and the wait-for graph (shmlocks
    waitgraph, from the segment's bytes) finds the cycle, naming the stripes."""
    from shmlocks import waitgraph

    ctx = mp.get_context("fork")
    with shmlocks.LockTable(8, "mcs", name=uniq("mcst-wfg")) as t:
        r1, r2, go = ctx.Event(), ctx.Event(), ctx.Event()
        p1 = procs.start(_ab, t.name, 1, 5, r1, go, ctx=ctx)
        p2 = procs.start(_ab, t.name, 5, 1, r2, go, ctx=ctx)
        assert r1.wait(20) and r2.wait(20)
        go.set()
        until(
            lambda: not tail(t[1])[0] & MC_HELD and not tail(t[5])[0] & MC_HELD, what="both queued"
        )
        d = {s["index"]: s for s in t._describe()["stripes"]}
        assert d[1]["holder"]["pid"] == p1.pid and d[5]["holder"]["pid"] == p2.pid
        assert d[1]["waiters"] == 1 and d[5]["waiters"] == 1
        deadline = time.monotonic() + 15
        while True:
            g = waitgraph.snapshot([t.name])
            cycles = [c for c in g.cycles() if {m.thread.pid for m in c} == {p1.pid, p2.pid}]
            if cycles:
                break
            assert time.monotonic() < deadline, g.notes[:5]
            time.sleep(0.05)
        by_pid = {m.thread.pid: m for m in cycles[0]}
        assert by_pid[p1.pid].held.label == f"{t.name}[1]"
        assert by_pid[p1.pid].awaited.label == f"{t.name}[5]"
        assert all(m.held.kind == m.awaited.kind == "mcs" for m in cycles[0])
        kill(p1)
        kill(p2)
        with shmlocks.hold_all(t[1], t[5], timeout=10) as held:
            held.mark_consistent()  # (p2, if it outlived p1, took and repaired p1's stripe)
        assert_clean(t)


# ----------------------------------------------------------------------------- asyncio


def _churn(name: str, seconds: float) -> None:
    t = shmlocks.LockTable.open(name)
    rng = random.Random(3)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with t[rng.randrange(4)]:
            time.sleep(rng.choice([0, 0.0005, 0.002]))


@pytest.mark.timeout(60)
def test_async_holds_of_mcs_stripes_under_cancellation(procs):
    """An event loop's tasks take mcs stripes (its cohort: one participant, waiting for one
    stripe at a time) against another process, with deadlines and cancellations: nothing
    is left held or queued, and every stripe is free at the end."""
    import asyncio

    with shmlocks.LockTable(4, "mcs", name=uniq("mcst-aio")) as t:
        p = procs.start(_churn, t.name, 3.0)

        async def worker(rng, n):
            done = 0
            for _ in range(n):
                ks = sorted({rng.randrange(4) for _ in range(2)})
                try:
                    async with asyncio.timeout(rng.choice([0.0005, 0.002, 0.01, 1])):
                        async with shmlocks.hold_all_async(*(t[k] for k in ks)):
                            await asyncio.sleep(rng.choice([0, 0.001]))
                            done += 1
                except TimeoutError:
                    pass
            return done

        assert asyncio.run(cancelling(worker, tasks=5, extras=15, seed=5)) > 0
        p.join(20)
        assert p.exitcode == 0
        assert not any(t[i].locked() for i in range(4)), "a cancelled hold left a stripe held"
        with shmlocks.hold_all(*(t[k] for k in range(4)), timeout=5):
            pass
        assert_clean(t)
