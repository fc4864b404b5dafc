"""The machine-wide wait-for graph (docs/design.md §9): who waits for what, across every
shmlocks segment in /dev/shm and every process.

Invariant: a thread is a node named (pidns, pid, tid, start time), the same in every
segment it uses; its one out-edge goes to the holder of the lock it publishes it waits for.
Only live threads and validated records make edges, so a cycle is a real deadlock.

Pure Python over read-only mappings: a segment is validated as ``Region.open`` validates it
(a foreign, scribbled or other-version segment is skipped with a one-line note), every
index read from it is bounds-checked before use, and nothing is ever written.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass, field

from shmlocks import _core, list_regions

SHM_DIR = "/dev/shm"

# shm_layout.h (its _Static_asserts pin these offsets)
_LINE = 128
_HEADER = struct.Struct("<QIIQIIQQQQIIII")  # up to glibc_mutex_size
_PART = struct.Struct("<IIIIQQIIQQQ")  # participant line 1: pid .. tstart
_PART_SIZE = 2 * _LINE
_DIRENT = struct.Struct("<II8x56s")
_CTL = struct.Struct("<IIII")  # kind, flags, holder, magic
_STATE_READY = 1
_DIRENT_READY = 2
_BODY_MAGIC = 0x4B4F4C42
_OP_WAITING = 2
_OP_QUARANTINED = 0xDEAD
_HOLDER_SLOT_BITS = 13
_FUTEX_OWNER_DIED = 0x40000000
_FUTEX_TID_MASK = 0x3FFFFFFF
_KIND_NAMES = {1: "ticket", 2: "mcs", 3: "clh", 4: "futex", 5: "robust", 6: "pi"}

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


def _part_state(word: int, op_step: int, pending: int) -> int:
    """0 free, 1 alive, 2 dead (participants.pxi participant_state)."""
    if word & _FUTEX_OWNER_DIED or op_step == _OP_QUARANTINED:
        return 2
    if word & _FUTEX_TID_MASK == 0:
        return 2 if pending else 0
    return 1


def _scan_segment(g: Graph, name: str, mm: mmap.mmap) -> None:
    (_m, _v, _line, _t, L, P, dir_off, part_off, locks_off, stride, state, *_rest) = (
        _HEADER.unpack_from(mm, 0)
    )
    if state != _STATE_READY:
        g.notes.append(f"skipped {name}: still being created")
        return
    # participants: identity, liveness, wait record
    keys: list[ThreadKey | None] = [None] * P
    gens = [0] * P
    waiting: list[tuple[int, int]] = []  # (slot, lock index)
    for i in range(P):
        off = part_off + i * _PART_SIZE
        (word,) = struct.unpack_from("<I", mm, off)
        (pid, tid, op_lock, op_step, _opv, gen, pending, detects, pidns, since, tstart) = (
            _PART.unpack_from(mm, off + _LINE)
        )
        gens[i] = gen
        st = _part_state(word, op_step, pending)
        if st == 0:
            continue
        key = (pidns, pid, tid, tstart)
        g.slots[(name, i)] = (key, st == 1)
        if st != 1:
            continue  # a dead thread is recovered, never part of a cycle
        keys[i] = key
        t = g.threads.get(key)
        if t is None:
            t = g.threads[key] = ThreadInfo(key, pid, tid)
        t.slots.append((name, i))
        if op_step == _OP_WAITING and 1 <= op_lock <= L:
            if t.waits is None or since > t.since_ns:
                waiting.append((i, op_lock - 1))
                t.since_ns = since
                t.detects = bool(detects)
    # locks: name, kind, holder
    refs: dict[int, LockRef] = {}
    holders: dict[int, int] = {}
    for i in range(L):
        d_state, d_kind, raw = _DIRENT.unpack_from(mm, dir_off + i * _LINE)
        if d_state != _DIRENT_READY or d_kind not in _KIND_NAMES:
            continue
        kind, _flags, holder, magic = _CTL.unpack_from(mm, locks_off + i * stride)
        if magic != _BODY_MAGIC or kind != d_kind:
            continue
        lname = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        ref = refs[i] = LockRef(name, i, lname, _KIND_NAMES[kind])
        s1 = holder & ((1 << _HOLDER_SLOT_BITS) - 1)
        if holder == 0 or not 1 <= s1 <= P:
            continue
        if ((s1 | (gens[s1 - 1] << _HOLDER_SLOT_BITS)) & 0xFFFFFFFF) != holder:
            continue  # left by an earlier occupant of the slot
        holders[i] = s1 - 1
        hk = keys[s1 - 1]
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
    """Read every shmlocks segment (or those named) into one wait-for graph."""
    g = Graph(taken_ns=time.monotonic_ns())
    for name in list_regions() if names is None else names:
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # removed since the listing
        except OSError as e:
            g.notes.append(f"skipped {name}: {e.strerror or e}")
            continue
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER.size:
                g.notes.append(f"skipped {name}: too small ({size} bytes) to be a region")
                continue
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError) as e:
            g.notes.append(f"skipped {name}: {e}")
            continue
        finally:
            os.close(fd)
        try:
            _core._validate_segment(mm, name)
            _scan_segment(g, name, mm)
        except (ValueError, struct.error) as e:  # CorruptRegionError is a ValueError
            g.notes.append(f"skipped {name}: {str(e).splitlines()[0]}")
        finally:
            mm.close()
    return g
