"""The machine-wide wait-for graph (docs/design.md §9): who waits for what, across every
shmlocks segment in /dev/shm and every process.

Invariant: a thread is a node named (pidns, pid, tid, start time), the same in every
segment it uses; its one out-edge goes to the holder of the lock it publishes it waits for.
Only live threads and validated records make edges, so a cycle is a real deadlock.

Pure Python over private copies read with pread (shmlocks/_segment.py), never a mapping, so
a segment that shrinks under the reader is a note, not SIGBUS; a segment is validated as
``Region.open`` validates it (a foreign, scribbled, other-version or untrusted one is
skipped with a one-line note), every index read from it is bounds-checked before use, and
nothing is ever written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shmlocks import _segment, _shmread
from shmlocks._core import SHM_DIR

#: a thread's identity across segments: (pidns, pid, tid, thread start time)
ThreadKey = tuple[int, int, int, int]


@dataclass(frozen=True)
class LockRef:
    """One lock of one segment."""

    segment: str
    index: int
    name: str  # the lock's name in its region
    kind: str

    @property
    def label(self) -> str:
        """``region/lock``; a standalone lock (a region of one lock named "lock") is just
        its region's name."""
        return self.segment if self.name == "lock" else f"{self.segment}/{self.name}"


@dataclass
class ThreadInfo:
    """What one live thread holds and waits for, merged over every segment it uses."""

    key: ThreadKey
    pid: int
    tid: int
    slots: list[tuple[str, int]] = field(default_factory=list)  # (segment, slot)
    holds: list[LockRef] = field(default_factory=list)
    waits: LockRef | None = None
    since_ns: int = 0  # CLOCK_MONOTONIC when the wait began
    detects: bool = False  # its process looks for deadlocks (a victim candidate)

    def waited_s(self, now_ns: int | None = None) -> float:
        if self.waits is None:
            return 0.0
        now = time.monotonic_ns() if now_ns is None else now_ns
        return max(0, now - self.since_ns) / 1e9

    def as_dict(self, now_ns: int | None = None) -> dict[str, object]:
        return {
            "pid": self.pid,
            "tid": self.tid,
            "holds": [h.label for h in self.holds],
            "waits_for": self.waits.label if self.waits else None,
            "waited_s": round(self.waited_s(now_ns), 3),
        }


@dataclass
class Member:
    """One thread of a cycle: it holds `held` (awaited by the previous member) and waits
    for `awaited` (held by the next)."""

    thread: ThreadInfo
    held: LockRef
    awaited: LockRef


@dataclass
class Graph:
    threads: dict[ThreadKey, ThreadInfo] = field(default_factory=dict)
    #: the holder of each awaited lock: thread -> next thread
    edges: dict[ThreadKey, ThreadKey] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: per segment and slot: the thread in it and whether it is alive (inspect)
    slots: dict[tuple[str, int], tuple[ThreadKey, bool]] = field(default_factory=dict)
    taken_ns: int = 0

    def cycle_from(self, start: ThreadKey) -> list[Member] | None:
        """The cycle that `start` is part of, as members beginning with it, or None."""
        seen = {start}
        path = [start]
        cur = start
        while True:
            nxt = self.edges.get(cur)
            if nxt is None:
                return None
            if nxt == start:
                return self._members(path)
            if nxt in seen:
                return None  # a cycle further on, that start only waits behind
            seen.add(nxt)
            path.append(nxt)
            cur = nxt

    def _members(self, keys: list[ThreadKey]) -> list[Member]:
        out = []
        for i, k in enumerate(keys):
            t = self.threads[k]
            prev = self.threads[keys[i - 1]]
            assert t.waits is not None and prev.waits is not None
            out.append(Member(t, prev.waits, t.waits))
        return out

    def cycles(self) -> list[list[Member]]:
        """Every cycle of the graph, each once (starting at its smallest thread key)."""
        found: list[list[Member]] = []
        done: set[ThreadKey] = set()
        for k in sorted(self.edges):
            if k in done:
                continue
            c = self.cycle_from(k)
            if c is not None:
                keys = [m.thread.key for m in c]
                done.update(keys)
                i = keys.index(min(keys))
                found.append(c[i:] + c[:i])
        return found


def victim(cycle: list[Member]) -> ThreadKey | None:
    """The member that must give up: the one that began to wait last among those whose
    process looks for deadlocks (ties: the larger key). None if none of them looks."""
    cands = [m.thread for m in cycle if m.thread.detects]
    if not cands:
        return None
    return max(cands, key=lambda t: (t.since_ns, t.key)).key


def describe_cycle(cycle: list[Member], now_ns: int | None = None) -> str:
    """One line per member: pid, tid, held lock, awaited lock, how long."""
    lines = []
    for m in cycle:
        t = m.thread
        lines.append(
            f"pid {t.pid} tid {t.tid} holds {m.held.label} ({m.held.kind}), waits for "
            f"{m.awaited.label} ({m.awaited.kind}) since {t.waited_s(now_ns):.3f} s"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------- scanning


def _scan_segment(g: Graph, seg: _segment.Segment) -> None:
    name = seg.name
    # participants: identity, liveness, wait record
    keys: list[ThreadKey | None] = [None] * seg.max_participants
    waiting: list[tuple[int, int]] = []  # (slot, lock index)
    for p in seg.in_use():
        st = p.state
        if st == 0:
            continue
        key = (p.pidns, p.pid, p.tid, p.tstart)
        g.slots[(name, p.slot)] = (key, st == 1)
        if st != 1:
            continue  # a dead thread is recovered, never part of a cycle
        keys[p.slot] = key
        t = g.threads.get(key)
        if t is None:
            t = g.threads[key] = ThreadInfo(key, p.pid, p.tid)
        t.slots.append((name, p.slot))
        if p.op_step == _segment.OP_WAITING and 1 <= p.op_lock <= seg.max_locks:
            if t.waits is None or p.wait_since > t.since_ns:
                waiting.append((p.slot, p.op_lock - 1))
                t.since_ns = p.wait_since
                t.detects = bool(p.detects)
    # locks: name, kind, holder
    refs: dict[int, LockRef] = {}
    holders: dict[int, int] = {}
    for lk in seg.locks:
        if not lk.valid:
            continue
        ref = refs[lk.idx] = LockRef(name, lk.idx, lk.name, lk.kind or "?")
        h = seg.holder_slot(lk)
        if h is None:
            continue  # free, out of range, or left by an earlier occupant of the slot
        holders[lk.idx] = h
        hk = keys[h]
        if hk is not None:
            g.threads[hk].holds.append(ref)
    for slot, li in waiting:
        wkey = keys[slot]
        wref = refs.get(li)
        if wkey is None or wref is None:
            continue  # waits for an entry that is not a valid lock: ignored
        t = g.threads[wkey]
        t.waits = wref
        h = holders.get(li)
        hk = keys[h] if h is not None else None
        if hk is None or hk == wkey:
            g.edges.pop(wkey, None)  # free, dead holder, or a record naming itself
        else:
            g.edges[wkey] = hk


def snapshot(names: list[str] | None = None) -> Graph:
    """Read every shmlocks segment (or those named) into one wait-for graph: each from a
    private copy read with pread (shmlocks/_segment.py), never a mapping."""
    g = Graph(taken_ns=time.monotonic_ns())
    if names is None:
        found, notes = _shmread.scan(SHM_DIR)
        names = sorted(found)
        g.notes.extend(notes)
    for name in names:
        try:
            seg = _segment.read(name, SHM_DIR)
        except FileNotFoundError:
            continue  # removed since the listing
        except (OSError, ValueError) as e:  # CorruptRegionError is a ValueError
            text = e.why if isinstance(e, _shmread.Refused) else str(e).splitlines()[0]
            g.notes.append(f"skipped {name}: {text}")
            continue
        _scan_segment(g, seg)
    return g
