"""The compact clh stripe of a lock table (issue 39; docs/design.md §15, "A compact CLH
stripe"): one 128-byte line a stripe, CLH with abandonable nodes that travel in a pool of
one node per participant of the table plus one per stripe (in the stripe's line). A
grantee adopts its predecessor's node at the grant and names its own queued node in the
stripe's head word, which the release frees; so a holder of any number of stripes has a
node to wait with. What it keeps of the clh kind: FIFO hand-off, waiters stepping aside
with their places kept queued (§7.0), timeouts (a waiter that is last steps out; else
its node is ABANDONED until its successor hands it back), owner death at every protocol
step (each crash point), exact mutual exclusion, multi-stripe holds. What one node per
participant changes: a participant whose node is abandoned on one stripe has no node,
and cannot queue on any stripe until its successor hands it back; if that successor is
aside, the abandon recalls it, so that wait never depends on another stripe's holder.

The line (x86_64; byte offsets into the stripe): 0-63 the holder's half (as every
compact stripe); 64 the tail (last | prev << 32); 72 the head (the holder's queued node
| its round << 32, 0 before the first grant); 80-107 the stripe's own node (state,
lock1, pred, parked, left_gen, round, guess, u32 each); 112 timeouts; 116-127 the aside
words (VIP turn, its time, one spinner seat). Node ids: 1..P the participants' (the
table entry's node lines, the same 28 bytes at the start of each), OWN | lock number
the one that starts in a stripe's line.
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
    aside_count,
    cancelling,
    join_or_kill,
    journaled_section,
    journals_settled,
    kill,
    kill_at_random,
    stripe_bytes,
    until,
    wait_aside,
    wait_blocked,
    wait_seated,
)

# the kind-agnostic children and the crash-point helpers of the mcs stripe's tests
from test_table_mcs import (
    _HOLD,
    _WAIT,
    _WAIT_GO,
    UNSET,
    _ab,
    _aside_waiter,
    _child,
    _churn,
    _count,
    _dead,
    _fifo_waiter,
    _killed_holds_with_timeouts,
    _Taker,
    _waiter,
)

import shmlocks

FREE, BUSY, ABANDONED, RECLAIMING, RECLAIMED = range(5)  # a node's states (clh.pxi)
C_ASIDE = 0x40000000  # | round: its owner waits aside, its place queued (§7.0)
OWN = 0x40000000  # the id of a stripe's own node: OWN | the stripe's lock number
UNKNOWN = 0xFFFFFFFF  # a pred (or a tail's prev) not known

LAY = shmlocks._core.LAYOUT
TAIL_OFF = LAY["stripe_wa_off"]  # word A: the tail
HEAD_OFF = TAIL_OFF + 8  # word B: the head
NODE_OFF = TAIL_OFF + 16  # the stripe's own node, 28 bytes
TIMEOUTS_OFF = 112  # shm_lockctl.timeouts
ASIDE_OFF = 116 if LAY["stripe_lines"] == 1 else TAIL_OFF + 48  # VIP, its time, 1 seat

#: the compact clh stripe's crash points (kinds ("table",): no lock of KINDS passes them)
CLHC_POINTS = {
    "clhc.acquire.joined",  # tail taken, pred not published
    "clhc.acquire.pred",  # pred published, before checking it
    "clhc.grant.head",  # granted: the head names our node, pred's node not yet adopted
    "clhc.wait.reclaiming",  # reclaiming an abandoned predecessor
    "clhc.abort.stepped_out",  # last, tail given back, own node not yet reclaimed
    "clhc.abandon.left",  # own node ABANDONED, successor not yet recalled
    "clhc.release.named",  # the release named the head's passage, node not yet freed
    "clhc.release.freed",  # node freed, record not cleared
    "clhc.recover.flagged",  # the recoverer gave the verdict, before releasing
    "clhc.aside.left",
    "clhc.aside.passed",
    "clhc.aside.back",
    "clhc.aside.adopt",
}


# ------------------------------------------------------------------------------ reading


def _line(t, s: int) -> bytes:
    return stripe_bytes(t.name, t.size, s)


def tail(t, s: int) -> tuple[int, int]:
    """Stripe s's tail: (last, prev)."""
    return struct.unpack_from("<II", _line(t, s), TAIL_OFF)


def head(t, s: int) -> tuple[int, int]:
    """Stripe s's head: (the holder's queued node, its round)."""
    return struct.unpack_from("<II", _line(t, s), HEAD_OFF)


def own_node(t, s: int) -> tuple[int, ...]:
    """The node in stripe s's line: (state, lock1, pred, parked, left_gen, round, guess)."""
    return struct.unpack_from("<7I", _line(t, s), NODE_OFF)


def lock_number(t, s: int) -> int:
    return t.region.max_locks + s  # a table's stripe s is lock first + s, first = max_locks


def own_id(t, s: int) -> int:
    return OWN | lock_number(t, s)


def _pnodes(t) -> dict[int, tuple[int, ...]]:
    """The participants' nodes (ids 1..hwm): id -> (state, lock1, pred, parked, left_gen,
    round, guess), from the stripe's _raw: its pool (id first), or the nodes a lock's
    _raw reads through a queue node's view (state, lock1, pred, parked, left_gen | round
    << 32, guess, ...)."""
    raw = t[0]._raw()
    pool = next((raw[k] for k in raw if k.startswith("pool")), None)
    if pool is not None:
        return {n[0]: tuple(n[1:8]) for n in pool if not n[0] & OWN}
    nodes = raw[next(k for k in raw if k.startswith("nodes"))]
    return {
        i + 1: (n[0], n[1], n[2], n[3], n[4] & 0xFFFFFFFF, n[4] >> 32, n[5])
        for i, n in enumerate(nodes)
    }


def node_state(t, nid: int) -> int:
    """The state of node nid: a participant's, or a stripe's own (in its line)."""
    if nid & OWN:
        return own_node(t, (nid & ~OWN) - t.region.max_locks)[0]
    nodes = _pnodes(t)
    assert nid in nodes, (hex(nid), sorted(nodes))
    return nodes[nid][0]


def assert_clean(t) -> None:
    """Nothing held, nobody queued: every stripe's tail ends at a FREE node, and every
    node of the pool (the participants' and the stripes') is FREE or RECLAIMED (its
    owner's, idle)."""
    t.region._recover_dead()
    for s in range(t.size):
        last, prev = tail(t, s)
        assert node_state(t, last) == FREE, f"stripe {s} not free:\n{_state(t)}"
        assert not t[s].locked(), s
    states = [n[0] for n in _pnodes(t).values()] + [own_node(t, s)[0] for s in range(t.size)]
    assert set(states) <= {FREE, RECLAIMED}, f"a node still in use:\n{_state(t)}"


def _state(t) -> str:
    """The table's words, for a failure's message: each stripe's flags, holder, tail and
    head, the pool, the participants' table lines and their published steps."""
    out = []
    for s in range(t.size):
        r = t[s]._raw()
        last, prev = tail(t, s)
        out.append(
            f"stripe {s}: flags {r['flags']:#x} holder {r['holder']:#x} tail "
            f"({last:#x}, {prev:#x}) head {head(t, s)} aside {r['aside']}"
        )
    r = t[0]._raw()
    for k, v in r.items():
        if k.startswith(("pool", "lines", "nodes", "precs", "participants")):
            out.append(f"{k}: {v}")
    return "\n".join(out)


def _settled(t, arr, kills: int) -> int:
    """After a random-kill test: every stripe of t taken (30 s at most: else the table's
    words in the failure), journals_settled under them; the sum of the values."""
    held = shmlocks.hold_all(*t, timeout=30)
    try:
        held.__enter__()
    except TimeoutError:
        raise AssertionError(f"a stripe wedged ({kills} kills):\n{_state(t)}") from None
    try:
        return journals_settled(held, t.size, arr)
    finally:
        held.__exit__(None, None, None)


def _queued(t, s: int, before, what: str) -> None:
    """Until someone joined stripe s's queue since its tail was `before`."""
    until(lambda: tail(t, s) != before, what=what)


def _key_of(t, i: int) -> int:
    """A key that maps to stripe i."""
    return next(k for k in range(100_000) if t.index_of(k) == i)


# ------------------------------------------------------------------------------- layout


def test_the_clh_stripes_crash_points_are_the_designs():
    """The compact clh stripe passes points of its own, `clhc.*`, kinds ("table",) as
    the ticket and mcs stripes' (tests/test_double_death.py's table matrix runs them for
    clh tables in place of the body's `clh.*`)."""
    pts = shmlocks._crashpoints()
    assert {p for p in pts if p.startswith("clhc.")} == CLHC_POINTS
    assert all(pts[p] == ("table",) for p in CLHC_POINTS)


@pytest.mark.timeout(60)
def test_a_clh_table_is_one_line_a_stripe():
    """A 4,096-stripe clh table: its stripes are CLHStripe (a CLHLock), one 128-byte line
    each in the extension area, and resident memory is a line a stripe plus the region's
    own lines, not a lock body a stripe (16,897 bytes each before issue 39). A stripe
    never taken: its tail is its own node (FREE), its prev unknown; its head 0."""
    with shmlocks.LockTable(4096, "clh", name=uniq("clht-big")) as t:
        with open(os.path.join(SHM_DIR, t.name), "rb") as f:
            hdr = f.read(LAY["header_size"])
            (ext,) = struct.unpack_from("<Q", hdr, LAY["ext_lines_off"])
        assert type(t[0]).__name__ == "CLHStripe" and type(t[0]) is shmlocks._core.CLHStripe
        assert isinstance(t[0], shmlocks._core.CLHLock) and t.kind == "clh"
        assert ext == 4096 * LAY["stripe_lines"], "one 128-byte line per stripe (x86_64)"
        for i in (0, 1, 4095):
            assert tail(t, i) == (own_id(t, i), UNKNOWN), (i, tail(t, i))
            assert head(t, i) == (0, 0)
            assert own_node(t, i)[0] == FREE
        for i in (0, 4095):
            with t[i]:
                assert t[i].locked()
            assert not t[i].locked()
        with open(os.path.join(SHM_DIR, t.name), "rb") as f:
            st = os.fstat(f.fileno())
        assert st.st_blocks * 512 < 4096 * 128 * LAY["stripe_lines"] + 64 * 1024, st.st_blocks
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the one-line stripe's offsets")
def test_a_held_clh_stripe_keeps_its_words_where_the_design_says(procs):
    """Holding stripe 5: the holder's statistics in bytes 0..63; the tail at +64 is
    (our queued node, BUSY; the stripe's own node, which we adopted at the grant: FREE);
    the head at +72 names our node and its round; our node says lock1 = stripe 5's
    number + 1. A waiter behind: the tail (its node, ours), its node's pred ours. It
    times out last and steps out: the tail ends at our node again; timeouts at +112 is
    1; after the release our node is FREE; the other stripes' lines never change."""
    assert (TAIL_OFF, HEAD_OFF, NODE_OFF, ASIDE_OFF) == (64, 72, 80, 116)
    name = uniq("clht-bytes")
    with shmlocks.LockTable(8, "clh", name=name, max_participants=8) as t:
        before = {s: _line(t, s) for s in range(8)}
        with t[5]:
            line = _line(t, 5)
            holder, _magic, acq = struct.unpack_from("<IIQ", line, 8)
            assert holder != 0 and acq == 1
            last, prev = struct.unpack_from("<II", line, 64)
            hnode, hround = struct.unpack_from("<II", line, 72)
            assert 1 <= last <= 8 and prev == own_id(t, 5), (hex(last), hex(prev))
            assert hnode == last and hround >= 1, (hnode, hround)
            assert node_state(t, last) == BUSY
            mine = _pnodes(t)[last]
            assert mine[1] == lock_number(t, 5) + 1, mine  # lock1: the stripe's passage
            assert mine[5] == hround, mine  # (its round, the head's)
            assert own_node(t, 5)[0] == FREE  # adopted by us: the node we wait with next
            q = mp.get_context("fork").Queue()
            p = procs.start(_waiter, name, 5, 0.5, q)
            until(lambda: tail(t, 5)[0] != last, what="the waiter queued")
            w_last, w_prev = tail(t, 5)
            assert w_prev == last and 1 <= w_last <= 8 and w_last != last, (w_last, w_prev)
            until(lambda: _pnodes(t)[w_last][2] == last, what="the waiter's pred published")
            assert node_state(t, w_last) == BUSY
            assert q.get(timeout=10)[1] is False
            p.join(10)
            assert tail(t, 5)[0] == last, "the waiter that timed out last stepped out"
        assert node_state(t, last) == FREE  # the release freed the head's node
        assert tail(t, 5)[0] == last
        assert struct.unpack_from("<I", _line(t, 5), TIMEOUTS_OFF) == (1,)
        for i in (0, 1, 2, 3, 4, 6, 7):
            assert _line(t, i) == before[i], i
        assert_clean(t)


@pytest.mark.timeout(60)
def test_nodes_travel_from_stripe_to_stripe():
    """One thread, a fresh table: the grant of stripe 0 makes it adopt stripe 0's own
    node, which it then queues on stripe 1 (the tail of 1: (0's node, 1's node)), and so
    on; a hold of several stripes names a distinct BUSY node in each head, and each is
    FREE after the releases."""
    with shmlocks.LockTable(8, "clh", name=uniq("clht-travel"), max_participants=8) as t:
        with t[0]:
            mine = head(t, 0)[0]
            assert tail(t, 0) == (mine, own_id(t, 0)) and not mine & OWN
        assert node_state(t, mine) == FREE
        with t[1]:
            assert tail(t, 1) == (own_id(t, 0), own_id(t, 1))
            assert head(t, 1)[0] == own_id(t, 0)
            n0 = own_node(t, 0)
            assert n0[0] == BUSY and n0[1] == lock_number(t, 1) + 1, n0  # lock1: stripe 1
            assert n0[2] == 0, n0  # it heads the queue: no pred (stripe 1's own adopted)
        assert own_node(t, 0)[0] == FREE
        with t[0]:  # now with stripe 1's own node, behind our first one (FREE)
            assert tail(t, 0) == (own_id(t, 1), mine)
        with t[2], t[3], t[4]:
            heads = [head(t, s)[0] for s in (2, 3, 4)]
            assert len(set(heads)) == 3, heads
            assert all(node_state(t, n) == BUSY for n in heads), heads
            assert all(tail(t, s)[0] == n for s, n in zip((2, 3, 4), heads, strict=True))
        assert all(node_state(t, n) == FREE for n in heads)
        assert_clean(t)


# ------------------------------------------------------------------------- exclusion, FIFO


@pytest.mark.timeout(120)
def test_exact_counts_under_contention(procs):
    """Four processes, 2,500 sections each on random stripes of three: every
    read-modify-write protected, every hold counted, nothing left queued."""
    import multiprocessing.shared_memory as sm

    shm = sm.SharedMemory(create=True, size=8 * 3, name=uniq("clht-cnt"))
    try:
        with shmlocks.LockTable(3, "clh", name=uniq("clht-ex")) as t:
            ps = [procs.start(_count, t.name, shm.name, 2500, s) for s in range(4)]
            for p in ps:
                p.join(100)
                assert p.exitcode == 0
            counts = shm.buf.cast("Q")
            assert sum(counts) == 4 * 2500, list(counts)
            del counts
            assert t.stats()["acquisitions"] == 4 * 2500
            assert_clean(t)
    finally:
        shm.close()
        shm.unlink()


def _hold_count(name: str, arr, n: int, seed: int) -> None:
    """n holds of 1-3 random stripes of 6 (hold(), index order), a read-modify-write of
    each stripe's counter under it, some with deadlines that expire."""
    t = shmlocks.LockTable.open(name)
    keys = [_key_of(t, i) for i in range(6)]
    rng = random.Random(seed)
    for _ in range(n):
        ks = sorted({rng.randrange(6) for _ in range(rng.randint(1, 3))})
        try:
            with t.hold(*(keys[k] for k in ks), timeout=rng.choice([0.002, None, None])):
                vals = [arr[k] for k in ks]
                if rng.random() < 0.05:
                    time.sleep(0)
                for k, v in zip(ks, vals, strict=True):
                    arr[k] = v + 1
                arr[6 + seed % 4] += len(ks)
        except TimeoutError:
            arr[10] += 1


@pytest.mark.timeout(120)
def test_exact_counts_of_multi_stripe_holds(procs):
    """Four processes hold 1-3 of 6 stripes at a time (a holder waits for the next stripe
    while it holds others: its queued nodes named by their heads, a node adopted at each
    grant to wait with), some holds with deadlines that expire (nodes stepped out or
    abandoned on one stripe while their owners hold others): each stripe's count is
    exactly the holds of it."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(6, "clh", name=uniq("clht-holds"), max_participants=8) as t:
        arr = ctx.RawArray("q", 11)
        ps = [procs.start(_hold_count, t.name, arr, 600, s, ctx=ctx) for s in range(4)]
        for p in ps:
            p.join(100)
            assert p.exitcode == 0
        assert sum(arr[:6]) == sum(arr[6:10]), list(arr)
        assert_clean(t)


@pytest.mark.timeout(60)
def test_fifo_on_one_stripe(procs):
    """Waiters queued one after the other on a held stripe are served in that order."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-fifo")) as t:
        order = ctx.RawArray("q", 8)
        ps = []
        with t[2]:
            for i in range(5):
                before = tail(t, 2)
                ps.append(procs.start(_fifo_waiter, t.name, 2, order, i, ctx=ctx))
                _queued(t, 2, before, f"waiter {i} queued")
        for p in ps:
            p.join(20)
            assert p.exitcode == 0
        assert list(order[1:6]) == [0, 1, 2, 3, 4]
        assert_clean(t)


# ------------------------------------------------------------------ stepping aside (§7.0)


@pytest.mark.timeout(90)
def test_clh_stripe_waiters_step_aside_and_are_served_in_arrival_order(procs):
    """Waiter 0 spins in its place on stripe 5 (the one seat: the word 8 bytes into the
    aside words, byte 124); waiters 1-3 arrive behind it one at a time, find no seat and
    step aside (their nodes ASIDE, their places kept queued); each comes back to its
    place, and the stripe goes 0, 1, 2, 3. No other stripe's line changes."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(8, "clh", name=uniq("clht-aside"), max_participants=8) as t:
        before = {s: _line(t, s) for s in range(8)}
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
                    seat = struct.unpack_from("<I", _line(t, 5), ASIDE_OFF + 8)[0]
                    raw = lk._raw()["aside"]
                    assert len(raw["seats"]) == 1, raw  # one seat in a clh stripe's line
                    assert seat == raw["seats"][0] != 0
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
                assert _line(t, i) == before[i], i
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
def test_a_dead_line_ahead_of_a_clh_stripe_waiter_aside_wakes_and_is_recovered(procs):
    """tests/test_aside.py's death of the line ahead of a waiter aside, on stripe 5 of a
    clh table: the holder, the seated spinner and the waiter aside ahead (its node ASIDE
    in its place) SIGKILLed at once; the waiter aside behind wakes, comes back, recovers
    them and gets the stripe with owner_died; the dead ones' seat, VIP turn and marks are
    cleared."""
    from test_aside import _kill_the_line_ahead_of_a_waiter_aside

    tables = []

    def stripe(kind, **kwargs):
        tables.append(shmlocks.LockTable(8, kind, name=uniq("clht-aside-kill"), **kwargs))
        return tables[-1][5]

    try:
        lk, waited, died = _kill_the_line_ahead_of_a_waiter_aside(procs, stripe, "clh")
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
def test_a_try_or_a_second_acquire_leaves_nothing_queued():
    """A try of a held stripe fails and steps out of its queue (the tail ends at the
    holder's node again); a thread holding stripes 1 and 2 that acquires 1 again gets
    DeadlockError, and the place its acquire took is left: after the releases every
    stripe is free and every node idle."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-try"), max_participants=8) as t:
        with t[1], t[2]:
            held = tail(t, 1)
            res = []
            th = threading.Thread(target=lambda: res.append(t[1].acquire(blocking=False)))
            th.start()
            th.join(10)
            assert res == [False]
            assert tail(t, 1)[0] == held[0]
            with pytest.raises(shmlocks.DeadlockError):
                t[1].acquire()
            assert tail(t, 1)[0] == held[0] and t[1].locked()
        assert t[1].acquire(blocking=False)
        t[1].release()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_a_waiter_that_timed_out_last_steps_out_and_takes_other_stripes():
    """A thread times out behind a holder of stripe 0 with nobody behind it: it steps
    out (the tail ends at the holder's node again; timeouts 1) and its node is its own
    at once: it takes stripe 1, free, without waiting; waits for stripe 2, held, in FIFO
    place and gets it at the release; and takes stripe 0 once it is free."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-out"), max_participants=8) as t:
        res = {}
        step = threading.Event()

        def other():
            res["t0"] = t[0].acquire(timeout=0.2)
            t0 = time.monotonic()
            res["t1"] = t[1].acquire(timeout=5)
            res["t1_s"] = time.monotonic() - t0
            t[1].release()
            step.set()
            res["t2"] = t[2].acquire(timeout=10)
            t[2].release()
            res["t0b"] = t[0].acquire(timeout=10)
            t[0].release()

        with t[0]:
            with t[2]:
                mine = tail(t, 0)[0]
                th = threading.Thread(target=other)
                th.start()
                assert step.wait(10)
                assert tail(t, 0)[0] == mine, "the waiter that timed out last stepped out"
                assert t[0].stats()["timeouts"] == 1
                time.sleep(0.1)
                assert th.is_alive()  # waits for stripe 2
            until(lambda: "t2" in res, what="stripe 2 granted")
        th.join(10)
        assert res == {"t0": False, "t1": True, "t1_s": res["t1_s"], "t2": True, "t0b": True}
        assert res["t1_s"] < 2.0, res
        assert_clean(t)


def _stop(p) -> None:
    os.kill(p.pid, signal.SIGSTOP)


def _cont(p) -> None:
    os.kill(p.pid, signal.SIGCONT)


@pytest.mark.timeout(60)
def test_a_waiter_that_timed_out_rejoins_its_place(procs):
    """A waiter A that times out with a waiter C queued behind it leaves its node
    ABANDONED in its place; C (stopped: it cannot reclaim it) stays behind it; A's next
    wait for the stripe, by the same thread, takes that place back (ABANDONED -> BUSY,
    the tail unchanged): A is served before C."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-rejoin"), max_participants=8) as t:
        order = ctx.RawArray("q", 4)
        left, go = threading.Event(), threading.Event()
        res = {}

        def a():
            res["first"] = t[0].acquire(timeout=1.5)
            left.set()
            go.wait(20)
            res["again"] = t[0].acquire(timeout=20)
            order[order[0] + 1] = 0
            order[0] += 1
            t[0].release()

        c = None
        with t[0]:
            before = tail(t, 0)
            ta = threading.Thread(target=a)
            ta.start()
            _queued(t, 0, before, "A queued")
            a_node = tail(t, 0)[0]
            before = tail(t, 0)
            c = procs.start(_fifo_waiter, t.name, 0, order, 1, ctx=ctx)
            _queued(t, 0, before, "C queued")
            _stop(c)
            assert not left.is_set(), "A timed out before C was stopped (a loaded machine?)"
            try:
                assert left.wait(10) and res["first"] is False
                queued = tail(t, 0)
                assert queued[1] == a_node, (queued, a_node)  # (C's node, A's node)
                assert node_state(t, a_node) == ABANDONED
                go.set()
                until(lambda: node_state(t, a_node) == BUSY, what="A back in its place")
                assert tail(t, 0) == queued
            finally:
                _cont(c)
            time.sleep(0.05)
        ta.join(20)
        c.join(20)
        assert c.exitcode == 0 and res["again"] is True
        assert list(order[1:3]) == [0, 1], "A was not served in its old place, before C"
        assert_clean(t)


@pytest.mark.timeout(60)
def test_a_waiter_that_timed_out_takes_a_free_stripe_once_its_node_is_handed_back(procs):
    """A (a thread) times out on stripe 0 with C queued behind it: its node is ABANDONED
    and it has none to queue with until C hands it back. With C stopped, A cannot take
    stripe 1 even though it is free (its acquire times out, the stripe untouched); once
    C runs it reclaims A's node and A takes stripe 1 at once, C still queued on 0."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-handback"), max_participants=8) as t:
        order = ctx.RawArray("q", 4)
        ab = _Taker(t, 0, timeout=1.5)
        ab.prepare()
        free1 = tail(t, 1)
        with t[0]:
            before = tail(t, 0)
            ab.start()
            _queued(t, 0, before, "A queued")
            a_node = tail(t, 0)[0]
            before = tail(t, 0)
            c = procs.start(_fifo_waiter, t.name, 0, order, 1, ctx=ctx)
            _queued(t, 0, before, "C queued")
            _stop(c)
            try:
                assert ab.result() == (False, None)
                assert node_state(t, a_node) == ABANDONED
                ab.again(1, timeout=0.5)
                assert ab.result()[0] is False, "A queued with a node it does not have"
                assert tail(t, 1) == free1 and not t[1].locked()  # never queued on 1
            finally:
                _cont(c)
            t0 = time.monotonic()
            ab.again(1, timeout=10)
            assert ab.result()[0] is True
            took = time.monotonic() - t0
            assert node_state(t, a_node) in (RECLAIMED, FREE, BUSY)  # handed back, reused
            assert c.is_alive() and order[0] == 0  # C still waits for stripe 0
        ab.finish()
        c.join(20)
        assert c.exitcode == 0 and order[0] == 1
        assert took < 5.0, took
        assert_clean(t)


A_TIMEOUT = 2.5  # A's wait for stripe i, spinning on its one seat
S_ASIDE_S = 12.0  # S's time aside before its own VIP turn: longer than A's wait for j
J_TIMEOUT = 8.0


def _recall_h(name, i, k, ready, go, out) -> None:
    """H: holds stripe i; told to go, waits for k (held by A), then releases both."""
    shmlocks.set_deadlock_timeout(None)  # (H, A: a cycle until A's deadline: no victim)
    t = shmlocks.LockTable.open(name)
    t[i].acquire()
    ready.set()
    go.wait(30)
    got = t[k].acquire(timeout=60)
    out.put(("H", got, got and t[k].owner_died))
    if got:
        if t[k].owner_died:
            t[k].mark_consistent()
        t[k].release()
    t[i].release()


def _recall_a(name, i, j, k, ready, out, point) -> None:
    """A: holds stripe k, waits for i behind H spinning on the one seat (so that S behind
    steps aside) until its deadline; then takes stripe j (free). Armed at `point`, if
    any."""
    from shmlocks import _core

    if point:
        _core._arm_crashpoint(point)
    _core._wait_policy(spin_ns=int(30e9))
    _core._aside_init(1)
    shmlocks.set_deadlock_timeout(None)
    t = shmlocks.LockTable.open(name)
    t[k].acquire()
    ready.set()
    got_i = t[i].acquire(timeout=A_TIMEOUT)
    t0 = time.monotonic()
    got_j = t[j].acquire(timeout=J_TIMEOUT)
    took = time.monotonic() - t0
    out.put(("A", got_i, got_j, took))
    if got_j:
        t[j].release()
    t[k].release()


def _recall_s(name, i, ready, out) -> None:
    """S: waits for stripe i with one seat (A's), stepping aside for S_ASIDE_S."""
    from shmlocks import _core

    _core._aside_init(1, int(S_ASIDE_S * 1e9))
    shmlocks.set_deadlock_timeout(None)
    t = shmlocks.LockTable.open(name)
    with t[3]:  # registered before it waits
        pass
    ready.set()
    t0 = time.monotonic()
    got = t[i].acquire(timeout=60)
    out.put(("S", got, got and t[i].owner_died, time.monotonic() - t0))
    if got:
        t[i].release()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("a_dies", [False, True], ids=["A-lives", "A-killed-abandoning"])
def test_an_abandon_recalls_the_waiter_aside_behind_it(procs, a_dies):
    """The cross-stripe case (docs/design.md §15): A holds k and waits for i behind H,
    with S aside behind A; H, holding i, wants k. A's wait for i times out: its node is
    ABANDONED under S's node aside, and only S can hand it back. A then wants stripe j,
    free. Were S to come back only at its own VIP turn (S_ASIDE_S away), A would wait
    for it while H waits for A and S for H: A's acquire of j would time out. The abandon
    recalls S, which comes back and hands the node back: A gets j well before its
    J_TIMEOUT deadline, releases j and k, H gets k and releases i, S gets i.
    A-killed-abandoning: A dies at clhc.abandon.left (its node ABANDONED, S not yet
    recalled), holding k: H gets k with owner_died (recovering A), releases i, and S,
    called back by that recovery, gets i, well before its VIP turn."""
    ctx = mp.get_context("fork")
    i, j, k = 1, 2, 0
    with shmlocks.LockTable(4, "clh", name=uniq("clht-recall"), max_participants=8) as t:
        out = ctx.Queue()
        ready_h, go, ready_a, ready_s = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
        h = procs.start(_recall_h, t.name, i, k, ready_h, go, out, ctx=ctx)
        assert ready_h.wait(20)
        point = "clhc.abandon.left" if a_dies else None
        a = procs.start(_recall_a, t.name, i, j, k, ready_a, out, point, ctx=ctx)
        assert ready_a.wait(20)
        wait_seated(t[i], "A")
        s = procs.start(_recall_s, t.name, i, ready_s, out, ctx=ctx)
        assert ready_s.wait(20)
        wait_aside(t[i], 1, "S")
        go.set()  # H now waits for k, held by A
        res = {}
        for _ in range(2 if a_dies else 3):
            r = out.get(timeout=60)
            res[r[0]] = r[1:]
        stuck = join_or_kill([h, a, s], 30)
        assert not stuck, res
        if a_dies:
            assert "A" not in res and a.exitcode == -signal.SIGKILL, (res, a.exitcode)
            assert res["H"] == (True, True), f"A's stripe k not owner_died for H: {res}"
        else:
            assert res["A"][:2] == (False, True), f"A did not get the free stripe j: {res}"
            assert res["A"][2] < J_TIMEOUT, res
            assert res["H"] == (True, False) and a.exitcode == 0, res
        assert res["S"][:2] == (True, False), res
        # S was called back (by A's abandon, or by the recovery that finished it), not
        # left aside until its VIP turn (A gave its seat back as its wait ended: S, back,
        # takes it and does not step aside again)
        assert res["S"][2] < S_ASIDE_S - 2, f"S came back at its VIP turn: {res}"
        assert h.exitcode == 0 and s.exitcode == 0
        if not a_dies:  # (one killed in its abandon may die before it counts)
            assert t[i].stats()["timeouts"] == 1
        assert t[j].stats()["timeouts"] == 0
        assert_clean(t)


# ---------------------------------------------------------------------- death, each step

#: a waiter that gives up after 1.5 s (its timeout comes while the test holds the stripe)
_WAIT_T = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
s = int(sys.argv[2])
if t[s].acquire(timeout=1.5):
    t[s].release()
print("done", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize("point", ["clhc.acquire.joined", "clhc.acquire.pred"])
def test_killed_joining(point, held):
    """A waiter killed as it joins the queue (its pred not published, or published and not
    looked at): on a held stripe, a waiter behind it recovers it (abandoned for it) and
    gets the stripe at the release; on a free one its node is the stripe's last (it was
    granted, never returned from acquire). Nobody sees owner_died."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-join"), max_participants=8) as t:
        th = _Taker(t, 1)
        th.prepare()  # registered before the death: not the dead one's slot
        if held:
            with t[1]:
                c = _child(t.name, _WAIT, 1, point)
                _dead(c)
                before = tail(t, 1)
                th.start()
                _queued(t, 1, before, "the thread queued")
            assert th.result() == (True, False)
        else:
            c = _child(t.name, _WAIT, 1, point)
            _dead(c)
            th.start()
            assert th.result() == (True, False)
        th.finish()
        with t[1]:
            assert not t[1].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scene", ["free", "queued", "queued-behind"])
def test_killed_in_its_grant(scene):
    """A waiter granted the stripe and killed as the head names its node, before it
    adopts its pred's node ("free": granted by the fast path; "queued": behind the test,
    granted at its release; "queued-behind": with a waiter behind it too): it never
    returned from acquire, so the next holder gets the stripe without owner_died, and
    every node comes back (the pred's node, free, to the dead one's slot)."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-grant"), max_participants=8) as t:
        th = None
        if scene == "free":
            c = _child(t.name, _WAIT, 2, "clhc.grant.head")
        else:
            with t[2]:
                before = tail(t, 2)
                c = _child(t.name, _WAIT, 2, "clhc.grant.head")
                _queued(t, 2, before, "the child queued")
                if scene == "queued-behind":
                    th = _Taker(t, 2)
                    th.prepare()
                    before = tail(t, 2)
                    th.start()
                    _queued(t, 2, before, "the thread queued")
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
def test_killed_reclaiming_an_abandoned_node():
    """A (a thread) times out on stripe 1 with C queued behind it; C, reclaiming A's
    abandoned node, is killed: a waiter behind C recovers it (finishes the hand-back,
    abandons C's place) and gets the stripe at the release, without owner_died; A's node
    is A's again: A queues and is served."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-recl"), max_participants=8) as t:
        ab = _Taker(t, 1, timeout=1.5)
        ab.prepare()
        th = _Taker(t, 1)
        th.prepare()
        with t[1]:
            before = tail(t, 1)
            ab.start()
            _queued(t, 1, before, "A queued")
            before = tail(t, 1)
            c = _child(t.name, _WAIT, 1, "clhc.wait.reclaiming")
            _queued(t, 1, before, "C queued")
            assert ab.result() == (False, None)  # abandoned, C behind it
            _dead(c)
            before = tail(t, 1)
            th.start()
            _queued(t, 1, before, "the thread queued")
            time.sleep(0.05)
        assert th.result() == (True, False)
        th.finish()
        ab.again(1)
        assert ab.result() == (True, False)
        ab.finish()
        with t[1]:
            assert not t[1].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_stepping_out():
    """A waiter that times out last, killed once it gave the tail back: the tail ends at
    the holder's node; its node is recovered (its own again); the next holder gets the
    stripe without owner_died."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-out-k"), max_participants=8) as t:
        th = _Taker(t, 3)
        th.prepare()
        with t[3]:
            mine = tail(t, 3)[0]
            before = tail(t, 3)
            c = _child(t.name, _WAIT_T, 3, "clhc.abort.stepped_out")
            _queued(t, 3, before, "the child queued")
            _dead(c)
            assert tail(t, 3)[0] == mine
            before = tail(t, 3)
            th.start()
            _queued(t, 3, before, "the thread queued")
        assert th.result() == (True, False)
        th.finish()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_abandoning_with_a_waiter_behind():
    """A waiter that times out with a waiter behind it, killed once its node is ABANDONED
    (the successor not yet told): the successor reclaims it (or recovers the dead one)
    and gets the stripe at the release, without owner_died."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-abandon"), max_participants=8) as t:
        th = _Taker(t, 3)
        th.prepare()
        with t[3]:
            before = tail(t, 3)
            c = _child(t.name, _WAIT_T, 3, "clhc.abandon.left")
            _queued(t, 3, before, "the child queued")
            before = tail(t, 3)
            th.start()
            _queued(t, 3, before, "the thread queued")
            _dead(c)
            time.sleep(0.05)
        assert th.result() == (True, False)
        th.finish()
        with t[3]:
            assert not t[3].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("behind", [False, True])
@pytest.mark.parametrize("point", ["clhc.release.named", "clhc.release.freed"])
def test_killed_releasing(point, behind):
    """A holder killed in its release (its passage named in its line; its node freed, the
    record not cleared): the release is finished for it, the next holder (a waiter queued
    behind it, or a later acquire) gets the stripe without owner_died: a death inside
    release() is not a death in the section."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-rel"), max_participants=8) as t:
        c = _child(t.name, _HOLD, 1, point)
        assert c.stdout.readline().strip() == "held"
        th = None
        if behind:
            th = _Taker(t, 1)
            th.prepare()
            before = tail(t, 1)
            th.start()
            _queued(t, 1, before, "the thread queued")
        c.stdin.write("go\n")
        c.stdin.flush()
        _dead(c)
        if th is not None:
            assert th.result() == (True, False)
            th.finish()
        assert t[1].acquire(timeout=10)
        try:
            assert not t[1].owner_died
        finally:
            t[1].release()
        assert_clean(t)


_TAKE_FREE = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
got = t[int(sys.argv[2])].acquire(timeout=3)
print(got, flush=True)
if got:
    t[int(sys.argv[2])].release()
"""

_TRAVEL = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
sys.stdin.readline()
with t[1]:
    pass
print("took 1", flush=True)
sys.stdin.readline()
if t[0].acquire(timeout=0.3):
    t[0].release()
print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_killed_stepping_out_behind_a_holder_whose_old_pred_is_its_node():
    """A stale link in the queue: the holder H of stripe 0 adopted its pred's node N (the
    stripe's own) at its grant, and N travelled on (H queued it on stripe 1, C adopted it
    there); H's queued node named N as its pred until the grant cleared it (and the
    tail's prev names N while H's node is last). C then waits on stripe 0
    with N, behind a waiter W behind H, times out last and is killed once it gave the
    tail back (clhc.abort.stepped_out). N is out of the queue: C's recovery must give it
    back to C's slot (RECLAIMED), not take H's stale link for a successor of N and
    abandon N for C (then nobody ever hands it back, and whoever gets C's slot can queue
    on no stripe of the table)."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-stale"), max_participants=8) as t:
        n0 = own_id(t, 0)
        c = _child(t.name, _TRAVEL, 0, "clhc.abort.stepped_out")
        w = None
        with t[0]:
            h = head(t, 0)[0]
            with t[1]:  # H queues N (adopted at stripe 0's grant) on stripe 1
                assert head(t, 1)[0] == n0
            c.stdin.write("go\n")
            c.stdin.flush()
            assert c.stdout.readline().strip() == "took 1"  # C adopted N
            assert tail(t, 1)[1] == n0 and own_node(t, 0)[2] != n0
            assert _pnodes(t)[h][2] == 0  # H's node names no pred (it named N once)
            before = tail(t, 0)
            w = _Taker(t, 0)
            w.start()
            _queued(t, 0, before, "W queued")
            before = tail(t, 0)
            c.stdin.write("go\n")
            c.stdin.flush()
            _queued(t, 0, before, "C queued with N")
            assert tail(t, 0)[0] == n0
            _dead(c)
            assert tail(t, 0)[0] != n0  # C stepped out
            t.region._recover_dead()
            st, state = own_node(t, 0)[0], _state(t)
        assert w.result() == (True, False)
        w.finish()
        # whoever takes C's slot has a node to queue with: a free stripe is its at once
        r = subprocess.run(
            [sys.executable, "-c", _TAKE_FREE, t.name, "2"],
            env={k: v for k, v in os.environ.items() if k != "SHMLOCKS_CRASHPOINT"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert st == RECLAIMED, f"N left {st} out of every queue:\n{state}"
        assert r.returncode == 0 and r.stdout.strip() == "True", r
        assert_clean(t)


_HOLD_KEYS = """
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
keys = [int(k) for k in sys.argv[2].split(",")]
with t.hold(*keys):
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _holding(t, stripes, point: str | None):
    """A fresh interpreter holding `stripes` of t together (hold()), armed at `point`:
    it says "held", and releases them when told (a line on its stdin)."""
    keys = ",".join(str(_key_of(t, i)) for i in stripes)
    env = dict(os.environ)
    env.pop("SHMLOCKS_CRASHPOINT", None)
    if point:
        env["SHMLOCKS_CRASHPOINT"] = point
    c = subprocess.Popen(
        [sys.executable, "-c", _HOLD_KEYS, t.name, keys],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert c.stdout.readline().strip() == "held"
    return c


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["clhc.release.named", "clhc.release.freed"])
def test_killed_releasing_one_of_two_stripes_held(point):
    """A holder of stripes 1 and 2 (hold()) killed in the first of its two releases:
    both stripes come free for the next holders (one was still held: owner_died there at
    most), nothing left queued."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-rel2"), max_participants=8) as t:
        c = _holding(t, (1, 2), point)
        assert t[1].locked() and t[2].locked()
        c.stdin.write("go\n")
        c.stdin.flush()
        _dead(c)
        died = []
        for s in (1, 2):
            assert t[s].acquire(timeout=10), s
            died.append(t[s].owner_died)
            if t[s].owner_died:
                t[s].mark_consistent()
            t[s].release()
        assert died.count(True) <= 1, died
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_recovering_a_dead_holder():
    """A holder killed in its section, and its recoverer killed after the verdict: the
    next holder gets owner_died, and the one after it does not."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-rec"), max_participants=8) as t:
        holder = _child(t.name, _HOLD, 0, None)
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(10)
        c = _child(t.name, _WAIT, 0, "clhc.recover.flagged")
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
def test_recoverer_killed_with_a_waiter_behind_it():
    """A holder SIGKILLed in its section; the first waiter behind it (a process that
    registered first) recovers it and is killed after the verdict, before it releases
    for the dead: the waiter behind that one redoes both recoveries and gets owner_died."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-dd"), max_participants=8) as t:
        holder = _child(t.name, _HOLD, 1, None)
        assert holder.stdout.readline().strip() == "held"
        th = _Taker(t, 1)
        th.prepare()
        c = _child(t.name, _WAIT_GO, 1, "clhc.recover.flagged")
        assert c.stdout.readline().strip() == "registered"
        before = tail(t, 1)
        c.stdin.write("go\n")
        c.stdin.flush()
        _queued(t, 1, before, "the recoverer-to-be queued")
        before = tail(t, 1)
        th.start()
        _queued(t, 1, before, "the thread queued")
        holder.kill()
        holder.wait(10)
        _dead(c)
        assert th.result() == (True, True)
        th.finish()
        with t[1]:
            assert not t[1].owner_died
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_holding_with_waiters_behind():
    """A holder SIGKILLed in its section with a queue behind it: the first waiter gets
    owner_died, the next does not."""
    with shmlocks.LockTable(4, "clh", name=uniq("clht-hk"), max_participants=8) as t:
        holder = _child(t.name, _HOLD, 2, None)
        assert holder.stdout.readline().strip() == "held"
        ths = []
        for _ in range(2):
            before = tail(t, 2)
            ths.append(_Taker(t, 2))
            ths[-1].start()
            _queued(t, 2, before, "a thread queued")
        holder.kill()
        holder.wait(10)
        assert [th.result() for th in ths] == [(True, True), (True, False)]
        for th in ths:
            th.finish()
        assert_clean(t)


@pytest.mark.timeout(60)
def test_killed_holding_three_stripes():
    """A holder of stripes 0, 2 and 5 (its three queued nodes named by their heads, a
    fourth adopted to wait with) SIGKILLed: each of the three comes with owner_died to
    its next holder, the others without; every node comes back."""
    with shmlocks.LockTable(8, "clh", name=uniq("clht-three"), max_participants=8) as t:
        c = _holding(t, (0, 2, 5), None)
        try:
            heads = [head(t, s)[0] for s in (0, 2, 5)]
            assert len(set(heads)) == 3 and all(node_state(t, n) == BUSY for n in heads)
        finally:
            c.kill()
            c.wait(10)
        died = {}
        for s in range(8):
            assert t[s].acquire(timeout=10), s
            died[s] = t[s].owner_died
            if died[s]:
                t[s].mark_consistent()
            t[s].release()
        assert [s for s in range(8) if died[s]] == [0, 2, 5], died
        assert_clean(t)


# -------------------------------------------------------------- multi-stripe holds, kills


def _unordered(name: str, arr, n: int, w: int) -> None:
    """n rounds: 2 or 3 of 5 stripes taken one by one in a random order (no global order:
    cycles happen and are broken by the deadlines, or by deadlock detection), each by a
    timed acquire or a try, with one spinner seat and 20 ms aside (waiters step aside,
    nodes are abandoned under them and handed back); all taken: each stripe's counter
    bumped (arr[k]) and the holds counted (arr[5 + w])."""
    from shmlocks import _core

    _core._aside_init(1, int(0.02e9))
    t = shmlocks.LockTable.open(name)
    rng = random.Random(w)
    for _ in range(n):
        ks = rng.sample(range(5), rng.randint(2, 3))
        held = []
        try:
            for k in ks:
                if rng.random() < 0.2:
                    got = t[k].acquire(blocking=False)
                else:
                    got = t[k].acquire(timeout=rng.choice([0.001, 0.005, 0.02, 0.1]))
                if not got:
                    break
                held.append(k)
            else:
                for k in held:
                    v = arr[k]
                    if rng.random() < 0.1:
                        time.sleep(rng.choice([0, 0.0005, 0.002]))
                    arr[k] = v + 1
                arr[5 + w] += len(held)
        except shmlocks.DeadlockError:
            pass
        finally:
            for k in reversed(held):
                t[k].release()


@pytest.mark.timeout(120)
def test_unordered_timed_acquires_with_waiters_aside_count_exactly(procs):
    """Four processes take 2-3 of 5 stripes in random orders with deadlines and tries,
    one seat a stripe (waiters step aside, with nodes abandoned under them: the recall):
    every section counted exactly, nothing wedged (the processes end), nothing left
    queued."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(5, "clh", name=uniq("clht-unord"), max_participants=8) as t:
        arr = ctx.RawArray("q", 9)
        ps = [procs.start(_unordered, t.name, arr, 1000, w, ctx=ctx) for w in range(4)]
        stuck = join_or_kill(ps, 100)
        assert not stuck, "a process wedged"
        assert [p.exitcode for p in ps] == [0] * 4
        assert sum(arr[:5]) == sum(arr[5:9]) > 0, list(arr)
        assert t.stats()["timeouts"] > 0
        assert_clean(t)


def _threads_counting(name: str, arr, threads: int, n: int, seed: int, all_in) -> None:
    """`threads` threads (a participant each, all registered at once: `all_in`, a barrier
    of every process's threads) take random stripes of 4, n times each, bumping the
    stripe's counter under it."""
    t = shmlocks.LockTable.open(name)

    def run(k):
        rng = random.Random(seed * 1000 + k)
        with t[k % 4]:  # registered: a participant of the table until it ends
            arr[k % 4] += 1
        all_in.wait(60)
        for _ in range(n - 1):
            s = rng.randrange(4)
            with t[s]:
                arr[s] += 1

    ths = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(100)


@pytest.mark.timeout(120)
def test_a_clh_table_grows_its_node_pool_with_its_participants(procs):
    """48 participants (two processes of 24 threads) on a table whose region provisions
    32 at first: the region grows, each new participant has a node of its own in the
    pool, and the counts are exact; every node of the grown pool is idle at the end."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-grow")) as t:
        arr, all_in = ctx.RawArray("q", 4), ctx.Barrier(48)
        ps = [
            procs.start(_threads_counting, t.name, arr, 24, 100, s, all_in, ctx=ctx)
            for s in range(2)
        ]
        stuck = join_or_kill(ps, 100)
        assert not stuck and [p.exitcode for p in ps] == [0, 0]
        assert sum(arr) == 2 * 24 * 100, list(arr)
        assert t.region._provisioned >= 64
        assert len(_pnodes(t)) >= 48
        assert_clean(t)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_holds_with_timeouts_survive_random_sigkills(procs):
    """As tests/test_sharding.py's random-SIGKILL test, on 6 clh stripes with deadlines
    that expire: nodes stepped out and abandoned, reclaimed by successors while their
    owners hold other stripes, nodes travelling between stripes, all under kills at any
    step. No stripe is held by two, nothing wedges, every dead holder's stripe comes with
    owner_died (journaled_section)."""
    seconds = float(os.environ.get("SHMLOCKS_STRESS_S", "3"))
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(6, "clh", name=uniq("clht-kill")) as t:
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
            13,
        )
        total = _settled(t, arr, kills)
        done = sum(counts[:4])
        assert done > 0 and done <= total <= done + 3 * kills, (done, total, kills)
        assert sum(counts[4:]) > 0, "no deadline expired: nothing was abandoned"
        assert_clean(t)


class _Taken:
    """hold_all's Held, for stripes taken one by one (journaled_section's `held`)."""

    def __init__(self, t, ks):
        self.t, self.ks = t, ks

    @property
    def died(self):
        return [i for i, k in enumerate(self.ks) if self.t[k].owner_died]

    def mark_consistent(self):
        for k in self.ks:
            if self.t[k].owner_died:
                self.t[k].mark_consistent()


def _unordered_killed(name, arr, counts, w, seed):
    """_unordered's rounds (random orders, deadlines, tries, one seat, 20 ms aside) with
    journaled_section's repairable values, until killed."""
    from shmlocks import _core

    _core._aside_init(1, int(0.02e9))
    t = shmlocks.LockTable.open(name)
    rng = random.Random(seed)
    while True:
        ks = rng.sample(range(6), rng.randint(1, 3))
        held = []
        try:
            for k in ks:
                if rng.random() < 0.2:
                    got = t[k].acquire(blocking=False)
                else:
                    got = t[k].acquire(timeout=rng.choice([0.001, 0.005, 0.02, 0.1]))
                if not got:
                    counts[w + 4] += 1
                    break
                held.append(k)
            else:
                journaled_section(t, ks, arr, _Taken(t, ks))
                counts[w] += len(ks)
        except shmlocks.DeadlockError:
            counts[w + 4] += 1
        finally:
            for k in reversed(held):
                if t[k].owner_died:  # (a round given up: repair what it holds)
                    if arr[k * 4 + 1]:
                        arr[k * 4], arr[k * 4 + 1] = arr[k * 4 + 2], 0
                    arr[k * 4 + 3] = 0
                    t[k].mark_consistent()
                t[k].release()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unordered_timed_acquires_survive_random_sigkills(procs):
    """_unordered's workload on 6 clh stripes under random SIGKILLs: processes killed
    holding, waiting, aside, abandoning, reclaiming, at any step. No stripe is held by
    two, nothing wedges, every dead holder's stripe comes with owner_died
    (journaled_section), nothing is left queued."""
    seconds = float(os.environ.get("SHMLOCKS_STRESS_S", "3"))
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(6, "clh", name=uniq("clht-ukill"), max_participants=16) as t:
        arr, counts = ctx.RawArray("q", 6 * 4), ctx.RawArray("q", 8)
        ps = [procs.start(_unordered_killed, t.name, arr, counts, w, w, ctx=ctx) for w in range(4)]
        kills = kill_at_random(
            ps,
            lambda w, n: procs.start(_unordered_killed, t.name, arr, counts, w, 100 + n, ctx=ctx),
            seconds,
            17,
        )
        total = _settled(t, arr, kills)
        done = sum(counts[:4])
        assert done > 0 and done <= total <= done + 3 * kills, (done, total, kills)
        assert sum(counts[4:]) > 0, "no acquire failed: nothing was abandoned"
        assert_clean(t)


def _armed_unordered(name, arr, counts, w, seed, spec) -> None:
    """_unordered_killed, in a process that SIGKILLs itself at crash point `spec`
    (NAME:N, its N-th pass)."""
    from shmlocks import _core

    _core._arm_crashpoint(spec)
    _unordered_killed(name, arr, counts, w, seed)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", sorted(CLHC_POINTS))
def test_deaths_at_each_point_under_contention(procs, point):
    """_unordered's workload on 6 stripes by three processes, beside a fourth armed at
    `point` (its N-th pass, N random): each time it dies there another takes its place,
    for 1.5 s. Deaths at one protocol step, again and again, among live participants
    that wait, time out, step aside, reclaim and recover: no stripe held by two, every
    dead holder's stripe with owner_died (journaled_section), nothing wedged or left."""
    ctx = mp.get_context("fork")
    rng = random.Random(point)
    with shmlocks.LockTable(6, "clh", name=uniq("clht-pdeath"), max_participants=32) as t:
        arr, counts = ctx.RawArray("q", 6 * 4), ctx.RawArray("q", 8)
        ps = [procs.start(_unordered_killed, t.name, arr, counts, w, w, ctx=ctx) for w in range(3)]

        def armed(n):
            spec = f"{point}:{rng.randint(1, 30)}"
            return procs.start(_armed_unordered, t.name, arr, counts, 3, 1000 + n, spec, ctx=ctx)

        a, deaths = armed(0), 0
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            if not a.is_alive():
                a.join()
                assert a.exitcode == -signal.SIGKILL, f"the armed one ended: {a.exitcode}"
                deaths += 1
                a = armed(deaths)
            assert all(p.is_alive() for p in ps), [p.exitcode for p in ps]
            time.sleep(0.005)
        for p in [*ps, a]:
            kill(p)
        kills = deaths + 4
        total = _settled(t, arr, kills)
        done = sum(counts[:4])
        assert done > 0 and done <= total <= done + 3 * kills, (done, total, kills)
        assert_clean(t)


class _Interrupt(Exception):
    pass


def _interrupted(name, ready, out) -> None:
    """Waits for stripe 0 until SIGUSR1's handler raises out of the wait; then takes
    stripe 1 (free) and reports how long that took."""

    def on_usr1(signum, frame):
        raise _Interrupt

    signal.signal(signal.SIGUSR1, on_usr1)
    t = shmlocks.LockTable.open(name)
    with t[3]:  # registered before it waits
        pass
    ready.set()
    try:
        t[0].acquire(timeout=30)
        out.put(("got",))
        t[0].release()
    except _Interrupt:
        t0 = time.monotonic()
        got = t[1].acquire(timeout=10)
        out.put(("interrupted", got, time.monotonic() - t0))
        if got:
            t[1].release()


@pytest.mark.timeout(60)
def test_a_wait_a_signal_interrupts_leaves_its_place_as_a_timeout(procs):
    """A waiter whose wait a signal handler interrupts (an exception out of acquire)
    leaves its place as at a timeout, with a waiter behind it: its node ABANDONED and
    handed back by that waiter; it then takes a free stripe, and the waiter behind is
    served at the release."""
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-sig"), max_participants=8) as t:
        out, ready = ctx.Queue(), ctx.Event()
        order = ctx.RawArray("q", 4)
        with t[0]:
            before = tail(t, 0)
            a = procs.start(_interrupted, t.name, ready, out, ctx=ctx)
            assert ready.wait(20)
            _queued(t, 0, before, "the waiter queued")
            before = tail(t, 0)
            c = procs.start(_fifo_waiter, t.name, 0, order, 1, ctx=ctx)
            _queued(t, 0, before, "the waiter behind queued")
            wait_blocked(a.pid, timeout=10)
            os.kill(a.pid, signal.SIGUSR1)
            res = out.get(timeout=20)
            assert res[:2] == ("interrupted", True), res
            assert res[2] < 5.0, res
            assert order[0] == 0
        stuck = join_or_kill([a, c], 20)
        assert not stuck and a.exitcode == 0 and c.exitcode == 0
        assert order[0] == 1
        assert_clean(t)


def _left_behind(t, left, out) -> None:
    """A thread that times out on stripe 0 (a waiter behind it: its node ABANDONED), then
    ends: its slot is free, its node not yet handed back."""
    out["first"] = t[0].acquire(timeout=1.0)
    left.set()


@pytest.mark.timeout(60)
def test_a_thread_on_the_slot_of_one_that_left_its_node_does_not_take_its_place(procs):
    """Thread A times out on stripe 0 with C queued behind it (C stopped: it cannot hand
    A's node back) and ends. Thread B, registered next, gets A's slot and its node, still
    ABANDONED: only the thread that left rejoins its place (left_gen). So B queues nowhere
    (a free stripe's acquire times out), and does not take A's place on stripe 0 either:
    released meanwhile, stripe 0 would be B's from that place; B's acquire times out
    instead. Once C runs it hands the node back and takes stripe 0, then B does."""
    import queue

    from support.common import join_thread

    ctx = mp.get_context("fork")
    with shmlocks.LockTable(4, "clh", name=uniq("clht-slot"), max_participants=8) as t:
        order = ctx.RawArray("q", 4)
        left, res = threading.Event(), {}
        jobs, results = queue.Queue(), queue.Queue()

        def b_run():
            while (job := jobs.get()) is not None:
                got = t[job[0]].acquire(timeout=job[1])
                if got:
                    t[job[0]].release()
                results.put(got)

        tb = threading.Thread(target=b_run, daemon=True)
        t[0].acquire()
        held = True
        c = None
        try:
            before = tail(t, 0)
            ta = threading.Thread(target=_left_behind, args=(t, left, res))
            ta.start()
            _queued(t, 0, before, "A queued")
            a_node = tail(t, 0)[0]
            before = tail(t, 0)
            c = procs.start(_fifo_waiter, t.name, 0, order, 1, ctx=ctx)
            _queued(t, 0, before, "C queued")
            _stop(c)
            assert not left.is_set(), "A timed out before C was stopped (a loaded machine?)"
            join_thread(ta, 20)
            assert res["first"] is False and node_state(t, a_node) == ABANDONED
            tb.start()
            jobs.put((1, 0.5))  # B registers: A's slot
            assert results.get(timeout=10) is False, "B queued with a node it lacks"
            raw = t[0]._raw()
            key = next((k for k in raw if k.startswith("lines")), None)
            if key is not None:  # B's slot is A's, its node A's abandoned one
                mines = [ln[0] for ln in raw[key]]
                assert mines.count(a_node) == 1, (hex(a_node), mines)
            jobs.put((0, 1.5))
            time.sleep(0.3)
            t[0].release()  # (A's place, were B in it, would be granted now)
            held = False
            assert results.get(timeout=10) is False, "B took A's place on stripe 0"
            assert node_state(t, a_node) == ABANDONED
            assert tail(t, 0)[1] == a_node  # (C's node, A's): nobody joined
        finally:
            if c is not None:
                _cont(c)
            if held:
                t[0].release()
        c.join(20)
        assert c.exitcode == 0 and order[0] == 1
        jobs.put((0, 10))
        assert results.get(timeout=20) is True
        jobs.put(None)
        tb.join(10)
        assert_clean(t)


# ------------------------------------------------------------------ the wait-for graph


@pytest.mark.timeout(60)
def test_the_wait_for_graph_sees_a_cycle_over_clh_stripes(procs):
    """Two processes, each holding one clh stripe and waiting for the other's: the table's
    description names each stripe's holder and waiter, and the wait-for graph (from the
    segment's bytes) finds the cycle, naming the stripes."""
    from shmlocks import waitgraph

    ctx = mp.get_context("fork")
    with shmlocks.LockTable(8, "clh", name=uniq("clht-wfg")) as t:
        r1, r2, go = ctx.Event(), ctx.Event(), ctx.Event()
        p1 = procs.start(_ab, t.name, 1, 5, r1, go, ctx=ctx)
        p2 = procs.start(_ab, t.name, 5, 1, r2, go, ctx=ctx)
        assert r1.wait(20) and r2.wait(20)
        alone = tail(t, 1), tail(t, 5)
        go.set()
        until(lambda: tail(t, 1) != alone[0] and tail(t, 5) != alone[1], what="both queued")
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
        assert all(m.held.kind == m.awaited.kind == "clh" for m in cycles[0])
        kill(p1)
        kill(p2)
        with shmlocks.hold_all(t[1], t[5], timeout=10) as held:
            held.mark_consistent()
        assert_clean(t)


# ----------------------------------------------------------------------------- asyncio


@pytest.mark.timeout(60)
def test_async_holds_of_clh_stripes_under_cancellation(procs):
    """An event loop's tasks take clh stripes against another process, with deadlines and
    cancellations: nothing is left held or queued, and every stripe is free at the end."""
    import asyncio

    with shmlocks.LockTable(4, "clh", name=uniq("clht-aio")) as t:
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


def _async_killed(name, arr, counts, w, seed) -> None:
    """An event loop of three tasks, each holding 1-3 of 6 clh stripes at a time
    (hold_all_async: the loop's cohort, one participant waiting for one stripe at a time)
    with deadlines that cancel its waits, in journaled_section, until killed."""
    import asyncio

    t = shmlocks.LockTable.open(name)

    async def task(rng):
        while True:
            ks = sorted({rng.randrange(6) for _ in range(rng.randint(1, 3))})
            try:
                async with asyncio.timeout(rng.choice([0.001, 0.005, 0.02, None])):
                    async with shmlocks.hold_all_async(*(t[k] for k in ks)) as held:
                        journaled_section(t, ks, arr, held)
                        counts[w] += len(ks)
            except TimeoutError:
                counts[w + 4] += 1
            await asyncio.sleep(0)

    async def main():
        rng = random.Random(seed)
        await asyncio.gather(*(task(random.Random(rng.random())) for _ in range(3)))

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_async_holds_of_clh_stripes_survive_random_sigkills(procs):
    """Event loops holding clh stripes (resumable waits, cancelled at their deadlines)
    under random SIGKILLs: no stripe held by two, every dead holder's stripe comes with
    owner_died, nothing wedges or is left queued."""
    seconds = float(os.environ.get("SHMLOCKS_STRESS_S", "3"))
    ctx = mp.get_context("fork")
    with shmlocks.LockTable(6, "clh", name=uniq("clht-akill"), max_participants=64) as t:
        arr, counts = ctx.RawArray("q", 6 * 4), ctx.RawArray("q", 8)
        ps = [procs.start(_async_killed, t.name, arr, counts, w, w, ctx=ctx) for w in range(4)]
        kills = kill_at_random(
            ps,
            lambda w, n: procs.start(_async_killed, t.name, arr, counts, w, 100 + n, ctx=ctx),
            seconds,
            19,
        )
        total = _settled(t, arr, kills)
        done = sum(counts[:4])
        assert done > 0 and done <= total <= done + 3 * kills, (done, total, kills)
        assert sum(counts[4:]) > 0, "no deadline expired"
        assert_clean(t)
