"""The machine-wide wait-for graph (docs/design.md §9): who waits for what, across every
shmlocks segment in /dev/shm and every process.

Invariant: a thread is a node named (pidns, pid, tid, start time, 0), the same in every
segment it uses, and an asyncio task acting through its loop's cohorts (docs/design.md
§14) one named (pidns, pid, tid, start time, task id) of its loop's thread; a node's
out-edges go to every node it needs gone before it can go on: the holder of the lock it
publishes it waits for (a thread's wait record, a cohort's for the task it waits for, or
the wait link a cohort that holds for a task carries: the lock, in any segment, that task
waits for), or for an RWLock the writer a reader waits behind, or every reader a writer
drains (an AND-wait: each of them must leave). Only live participants and validated
records make edges, so any cycle is a real deadlock; of each strongly connected set of
waiters exactly one gives up (``Graph.victim``).

Pure Python over private copies read with pread (shmlocks/_segment.py), never a mapping, so
a segment that shrinks under the reader is a note, not SIGBUS; a segment is validated as
``Region.open`` validates it (a foreign, scribbled, other-version or untrusted one is
skipped with a one-line note), every index read from it is bounds-checked before use, and
nothing is ever written.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

from shmlocks import _segment, _shmread
from shmlocks._core import SHM_DIR

#: a node's identity across segments: (pidns, pid, tid, thread start time, task id), the
#: task id 0 for a thread, an asyncio task's (through its loop's cohorts) otherwise
ThreadKey = tuple[int, int, int, int, int]


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
        its region's name; a stripe of a lock table is ``table[i]``, its own name."""
        if self.name == "lock":
            return self.segment
        if self.name.startswith(self.segment + "["):
            return self.name
        return f"{self.segment}/{self.name}"


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
    #: an RWLock's side: "read" or "write" for the one it waits for (None: a lock), and
    #: per RWLock it holds (or keeps readers out of, as the writer that announced itself
    #: and drains the readers before it: "write, draining"); per semaphore whose units
    #: it holds with `with`, how many ("1 unit")
    waits_as: str | None = None
    modes: dict[LockRef, str] = field(default_factory=dict)
    task: str | None = None  # an asyncio task's name (its loop's thread is pid, tid)

    def waited_s(self, now_ns: int | None = None) -> float:
        if self.waits is None:
            return 0.0
        now = time.monotonic_ns() if now_ns is None else now_ns
        return max(0, now - self.since_ns) / 1e9

    @property
    def who(self) -> str:
        return f"pid {self.pid} tid {self.tid}" + (
            f" (task {self.task!r})" if self.task is not None else ""
        )

    def as_dict(self, now_ns: int | None = None) -> dict[str, object]:
        return {
            "pid": self.pid,
            "tid": self.tid,
            "task": self.task,
            "holds": [h.label for h in self.holds],
            "waits_for": self.waits.label if self.waits else None,
            "waits_as": self.waits_as,
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
    #: thread -> the threads it waits for (every one of them must leave first)
    edges: dict[ThreadKey, list[ThreadKey]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: per segment and slot: the thread in it and whether it is alive (inspect)
    slots: dict[tuple[str, int], tuple[ThreadKey, bool]] = field(default_factory=dict)
    taken_ns: int = 0
    #: every valid lock read, and its holder's node: where a wait link leads
    refs: dict[tuple[str, int], LockRef] = field(default_factory=dict)
    holder_of: dict[tuple[str, int], ThreadKey] = field(default_factory=dict)
    #: the wait links read: (the node that waits, (segment, lock index, since), detects)
    links: list[tuple[ThreadKey, tuple[str, int, int], bool]] = field(default_factory=list)

    def cycle_from(self, start: ThreadKey) -> list[Member] | None:
        """The shortest cycle through `start` (breadth first, so the same graph always
        gives the same one), as members beginning with it, or None."""
        prev: dict[ThreadKey, ThreadKey | None] = {start: None}
        queue = deque([start])
        while queue:
            cur = queue.popleft()
            for nxt in self.edges.get(cur, ()):
                if nxt == start:
                    path = [cur]
                    while path[-1] != start:
                        p = prev[path[-1]]
                        assert p is not None
                        path.append(p)
                    return self._members(path[::-1])
                if nxt not in prev:
                    prev[nxt] = cur
                    queue.append(nxt)
        return None

    def _reach(self, start: ThreadKey, adj: dict[ThreadKey, list[ThreadKey]]) -> set[ThreadKey]:
        seen: set[ThreadKey] = set()
        todo = list(adj.get(start, ()))
        while todo:
            k = todo.pop()
            if k not in seen:
                seen.add(k)
                todo.extend(adj.get(k, ()))
        return seen

    def component(self, start: ThreadKey) -> set[ThreadKey]:
        """The threads that `start` waits for, directly or not, and that wait for it (its
        strongly connected set, itself included); empty if it is on no cycle."""
        fwd = self._reach(start, self.edges)
        if start not in fwd:
            return set()
        rev: dict[ThreadKey, list[ThreadKey]] = {}
        for a, bs in self.edges.items():
            for b in bs:
                rev.setdefault(b, []).append(a)
        return fwd & self._reach(start, rev)

    def victim(self, start: ThreadKey) -> ThreadKey | None:
        """The one thread that must give up for the cycles through `start`: of its
        strongly connected set, the one that began to wait last among those whose
        process looks for deadlocks (ties: the larger key). With one out-edge per
        thread that set is the cycle itself; with AND-waits (RWLock writers) cycles may
        share threads, and one rule over the whole set makes every looker agree, so
        exactly one gives up and the set is looked at again. None if nobody looks."""
        cands = [self.threads[k] for k in self.component(start) if self.threads[k].detects]
        if not cands:
            return None
        return max(cands, key=lambda t: (t.since_ns, t.key)).key

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


def _ref(ref: LockRef, mode: str | None) -> str:
    return f"{ref.label} ({ref.kind}, {mode})" if mode else f"{ref.label} ({ref.kind})"


def describe_cycle(cycle: list[Member], now_ns: int | None = None) -> str:
    """One line per member: pid, tid, held lock, awaited lock (an RWLock's with its side:
    read, write, or write, draining), how long."""
    lines = []
    for m in cycle:
        t = m.thread
        lines.append(
            f"{t.who} holds {_ref(m.held, t.modes.get(m.held))}, waits for "
            f"{_ref(m.awaited, t.waits_as)} since {t.waited_s(now_ns):.3f} s"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------- scanning


def _scan_segment(g: Graph, seg: _segment.Segment) -> None:
    name = seg.name
    # participants: identity, liveness, wait record
    keys: list[ThreadKey | None] = [None] * seg.provisioned
    waiting: list[tuple[int, int]] = []  # (slot, lock index)
    for p in seg.in_use():
        st = p.state
        if st == 0:
            continue
        key = (p.pidns, p.pid, p.tid, p.tstart, p.task_id if p.agent == 1 else 0)
        g.slots[(name, p.slot)] = (key, st == 1)
        if st != 1:
            continue  # a dead thread is recovered, never part of a cycle
        keys[p.slot] = key
        t = g.threads.get(key)
        if t is None:
            t = g.threads[key] = ThreadInfo(key, p.pid, p.tid)
            if key[4]:
                t.task = p.task
        t.slots.append((name, p.slot))
        link = p.link()
        if link is not None and key[4]:
            g.links.append((key, link, bool(p.detects)))
        if p.op_step == _segment.OP_WAITING and _segment.lock_at(seg, p.op_lock) is not None:
            if t.waits is None or p.wait_since > t.since_ns:
                waiting.append((p.slot, p.op_lock - 1))
                t.since_ns = p.wait_since
                t.detects = bool(p.detects)
    # locks: name, kind, holder (an RWLock: its readers and its writer; a semaphore: its
    # `with` holders)
    refs: dict[int, LockRef] = {}
    holders: dict[int, int] = {}
    rwlocks: dict[int, _segment.Lock] = {}

    def held(slot: int, ref: LockRef, mode: str | None) -> None:
        hk = keys[slot]
        if hk is not None:
            t = g.threads[hk]
            if mode is None or not mode.endswith("draining"):
                t.holds.append(ref)
            if mode is not None:
                t.modes[ref] = mode

    for lk in seg.all_locks():  # the directory's locks and a table's stripes, by number
        if not lk.valid:
            continue
        ref = refs[lk.idx] = LockRef(name, lk.idx, lk.name, lk.kind or "?")
        g.refs[(name, lk.idx)] = ref
        if lk.kind == "rwlock":
            rwlocks[lk.idx] = lk
            for x in _segment.rw_readers(lk):
                held(x, ref, "read")
            ws, draining = _segment.rw_writer(lk)
            if ws is not None:
                held(ws, ref, "write, draining" if draining else "write")
            continue
        if lk.kind == "semaphore":
            for x, u in _segment.sem_holders(seg, lk):  # units taken with `with`
                held(x, ref, f"{u} unit" if u == 1 else f"{u} units")
            continue
        h = seg.holder_slot(lk)
        if h is None:
            continue  # free, out of range, or left by an earlier occupant of the slot
        holders[lk.idx] = h
        held(h, ref, None)
        hk = keys[h]
        if hk is not None:
            g.holder_of[(name, lk.idx)] = hk
    for slot, li in waiting:
        wkey = keys[slot]
        wref = refs.get(li)
        if wkey is None or wref is None:
            continue  # waits for an entry that is not a valid lock: ignored
        t = g.threads[wkey]
        t.waits = wref
        rw = rwlocks.get(li)
        if rw is not None:
            t.waits_as, slots = _segment.rw_waits_for(rw, slot)
        else:
            t.waits_as = None
            h = holders.get(li)
            slots = [h] if h is not None else []
        out: list[ThreadKey] = []
        for s in slots:
            hk = keys[s] if 0 <= s < len(keys) else None
            if hk is not None and hk != wkey and hk not in out:
                out.append(hk)  # live, not a record naming itself
        if out:
            g.edges[wkey] = out
        else:
            g.edges.pop(wkey, None)  # free, or only dead threads to wait for


def _follow_links(g: Graph) -> None:
    """The waits of asyncio tasks that only their holds' wait links tell (a task queued
    behind another task of its loop): the lock named, in whatever segment was read."""
    for key, (seg, idx, since), detects in g.links:
        t = g.threads.get(key)
        ref = g.refs.get((seg, idx))
        if t is None or ref is None or t.waits is not None:
            continue  # (its cohort's own wait record said it already)
        t.waits, t.waits_as, t.since_ns, t.detects = ref, None, since, detects
        hk = g.holder_of.get((seg, idx))
        if hk is not None and hk != key:
            g.edges[key] = [hk]


def _key(p: _segment.Participant) -> ThreadKey:
    return (p.pidns, p.pid, p.tid, p.tstart, p.task_id if p.agent == 1 else 0)


def _waits(h: _segment.Head) -> bool:
    """Does a live participant of the segment publish a wait (a wait record, or a cohort's
    wait link)? Only such a segment has out-edges (a wait record names a lock of its own
    segment, whose holder is a participant of it)."""
    return any(
        p.state == 1 and (p.op_step == _segment.OP_WAITING or (p.agent == 1 and p.link_lock != 0))
        for p in h.in_use()
    )


def snapshot(
    names: list[str] | None = None,
    *,
    waits_only: bool = False,
    threads_of: str | _segment.Segment | None = None,
) -> Graph:
    """Read every shmlocks segment (or those named) into one wait-for graph: each from a
    private copy read with pread (shmlocks/_segment.py), never a mapping, through one open
    of its file.

    Of each segment the header, directory and participants are read first; the rest (the
    lock bodies) only if it is needed: ``waits_only`` (``shmlocks deadlocks``: every
    cycle, and the threads waiting) only of the segments where a live participant
    waits; ``threads_of`` (``shmlocks inspect``: what the threads of one segment hold and
    wait for, across segments) only of that segment and the segments where one of its
    live threads has a slot; by default, of every segment. ``threads_of`` may be that
    segment read already (a ``_segment.Segment``: ``inspect`` describes it and looks
    from the same copy, so its file is opened once, not again by the walk). A segment
    named by a wait link of a segment read is read too. A segment left at its head is
    still validated as the full read validates it (``_segment.check_head``): it is
    skipped with a note exactly when it would be. The segments are added to the graph in
    name order, as before."""
    g = Graph(taken_ns=time.monotonic_ns())
    segs: dict[str, _segment.Segment] = {}
    skipped: dict[str, str] = {}
    left: set[str] = set()  # read and validated, but only to its head
    keys: set[ThreadKey] | None = None
    own: _segment.Segment | None = None
    if isinstance(threads_of, _segment.Segment):  # read already: its threads, itself
        own = threads_of
        threads_of = own.name
        segs[own.name] = own
        keys = {_key(p) for p in own.in_use() if p.state == 1}
    elif threads_of is not None:
        try:
            keys = {_key(p) for p in _segment.read(threads_of, SHM_DIR).in_use() if p.state == 1}
        except (OSError, ValueError):
            keys = set()  # (its own read below says why, in a note)

    def wanted(h: _segment.Head) -> bool:
        if waits_only:
            return _waits(h)
        if keys is not None:
            return h.name == threads_of or any(p.state == 1 and _key(p) in keys for p in h.in_use())
        return True

    def visit(
        name: str, fd: int, st: os.stat_result, first: bytes | None, full: bool = False
    ) -> None:
        left.discard(name)
        try:
            h = _segment.read_head(fd, st, name, first)
            if full or wanted(h):
                segs[name] = _segment.read_fd(fd, st, name, h)
            else:
                _segment.check_head(fd, h, kinds=False)
                left.add(name)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:  # CorruptRegionError is a ValueError
            skipped[name] = e.why if isinstance(e, _shmread.Refused) else str(e).splitlines()[0]

    def visit_name(name: str, full: bool = False) -> None:
        try:
            fd, st = _shmread.open_file(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            return  # removed since the listing
        except OSError as e:
            skipped[name] = e.why if isinstance(e, _shmread.Refused) else str(e).splitlines()[0]
            return
        try:
            visit(name, fd, st, None, full)
        finally:
            os.close(fd)

    if names is None:
        skip = () if own is None else (own.name,)
        g.notes.extend(_shmread.walk(visit, SHM_DIR, _segment.HEADER_SIZE, skip=skip))
    else:
        for name in names:
            if own is None or name != own.name:
                visit_name(name)
    # the segments the wait links of those read name, if not read yet
    linked = {
        link[0]
        for seg in segs.values()
        for p in seg.in_use()
        if p.state == 1 and (link := p.link()) is not None
    }
    for name in sorted(linked & left):
        visit_name(name, full=True)
    read = segs.keys() | skipped.keys()
    for name in sorted(read) if names is None else [n for n in dict.fromkeys(names) if n in read]:
        if name in skipped:
            g.notes.append(f"skipped {name}: {skipped[name]}")
        else:
            _scan_segment(g, segs[name])
    _follow_links(g)
    return g
