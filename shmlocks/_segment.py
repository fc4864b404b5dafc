"""A validated, private copy of one shmlocks segment, read with pread: what the read-only
commands (``ls``, ``inspect``, ``stat``, ``top``) and the wait-for graph
(shmlocks/waitgraph.py) read, never a mapping of the segment (docs/design.md §9).

The file is opened the safe way (shmlocks/_shmread.py: no symlink, no FIFO, a trusted
owner), its header validated exactly as ``Region.open`` validates a mapping
(``_core._validate_header``: magic, version, ABI, geometry, offsets, size against the
file's), then only the parts needed are copied with pread: the directory and the
participants provisioned (the header's ``part_hwm``, validated against the cap: a region's
file is sized for its cap and sparse, docs/design.md §2), the first three lines (control,
word A, word B) of each lock's body, and of a toolbox object its records of those
participants. A file that shrinks meanwhile gives a short read (``Shrunk``), never SIGBUS;
every index read from it (a holder's slot, a lock index, a queue node) is bounds-checked
before use, against the participants provisioned. The kinds' "is it held" tests mirror
their ``_is_locked`` in shmlocks/_ext/kinds/*.pxi.

In two steps, so that a reader of many segments reads only what it needs of each:
``read_head`` (the header, the directory and the participants: a ``Head``, all ``ls``
shows; ``check_head`` raises what the rest would, reading only a lock table's header) and
then the bodies (``read_fd``: the ``Segment``). ``read`` does both. A participant's record
is decoded only when asked for; its state (free, alive, dead) is read from three of its
words (``_states``), so a segment of many free slots costs little.
"""

from __future__ import annotations

import itertools
import operator
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from shmlocks import _core, _shmread
from shmlocks._shmread import SHM_DIR, pread_exact
from shmlocks.errors import CorruptRegionError

# shm_layout.h, through the compiled core (its _Static_asserts pin the offsets; the struct
# formats below spell only the field types, and tests/test_layout.py checks their sizes)
_L = _core.LAYOUT
LINE = _L["line"]
HEADER_SIZE = _L["header_size"]
_HEADER = struct.Struct("<QIIQIIQQQQIIIIQIIQQ")  # magic .. ext_lines (bytes 0..111)
PART_SIZE = _L["participant_size"]
# a participant: its token's futex word (line 0), then line 1: pid .. tstart, then what an
# asyncio cohort says of its task (poke, agent, tasks, task_id, label), then lines 2-3: the
# wait link (link_seq, link_lock, link_since, link_name)
_PART = struct.Struct("<I124xIIIIQQIIQQQIII4xQ40sIIQ201s39x")
_DIRENT = struct.Struct("<II8x56s")
# a ctl line: kind, flags, holder, magic, 5 counters, last_pid, owner_deaths (bytes 0..63),
# then timeouts and a compact stripe's word B (bytes 112..127: dead pid, tid, PID namespace)
_CTL = struct.Struct("<IIII5QII")
_CTL_TIMEOUTS = 112
_U32, _U32X4 = struct.Struct("<I"), struct.Struct("<IIII")
_U64 = struct.Struct("<Q")
STATE_READY = _L["state_ready"]
DIRENT_READY = _L["dirent_ready"]
BODY_MAGIC = _L["body_magic"]
OP_WAITING = _L["op_waiting"]
OP_TAKING = _L["op_taking"]
OP_QUARANTINED = _L["op_quarantined"]
HOLDER_SLOT_BITS = _L["holder_slot_bits"]
FUTEX_OWNER_DIED = _L["futex_owner_died"]
FUTEX_TID_MASK = _L["futex_tid_mask"]
_TOKEN_TAKEN = FUTEX_OWNER_DIED | FUTEX_TID_MASK
NAME_MAX = _L["name_max"]
KIND_NAMES = {cls.kind_code: name for name, cls in _core.KINDS.items()}
# the synchronization toolbox's objects: in the directory beside the locks, never held
OBJECT_NAMES = {cls.kind_code: name for name, cls in _core.OBJECTS.items()}
_TBWORD = struct.Struct("<IIIIIIQII")  # shm_toolbox.h shm_tbword: seq .. cycle
_TBREC_UNITS = 0  # shm_tbrec.units: a semaphore's units its participant took with `with`
_TBREC_WAITING = 28  # shm_tbrec.waiting
_TB_BOUNDED = 1
_RWREC = struct.Struct("<IIIIQQQQQ")  # shm_rwlock.h shm_rwrec: ind .. read_wait_max_ns
_RW_PRESENT = _L["rw_present"]
_RW_SLOT_BITS = _L["rw_slot_bits"]
_RW_PHASE = _L["rw_phase_mask"]
_RW_COUNT = _L["rw_count_mask"]
_RW_BLOCKED = _L["rw_blocked"]
_RW_TAG_SHIFT = _L["rw_tag_shift"]
_RW_TAG = _L["rw_tag_mask"]
_RW_W_DRAINING = _L["rw_w_draining"]
_TB_BARRIER_STATES = ("filling", "draining", "resetting", "broken")
_CLH = _core.CLHLock.kind_code
KIND_TABLE = _L["kind_table"]
TABLE_MAX = _L["table_max"]
STRIPE_LINES = _L["stripe_lines"]
STRIPE_WA_OFF = _L["stripe_wa_off"]
STRIPE_WB_OFF = _L["stripe_wb_off"]
STRIPE_TICKET_WB_OFF = _L["stripe_ticket_wb_off"]  # a ticket stripe's serving (ticketc.pxi)
STRIPE_CLH_HEAD_OFF = _L["stripe_clh_head_off"]  # a clh stripe's head, its node (clhc.pxi)
STRIPE_CLH_NODE_OFF = _L["stripe_clh_node_off"]
_CH_SNODE = 0x40000000  # clhc.pxd: node id CH_SNODE | lock number, a stripe's own node
_KIND_TICKET = _core.KINDS["ticket"].kind_code
_TABLE = struct.Struct("<IIIIQQ")  # shm_table: sub, size, first, compact, off, stride
_BODY_READ = _L["body_lines_read"] * LINE  # ctl, word A, word B


class NotReady(CorruptRegionError):
    """A segment whose creator has not finished building it (or died doing so)."""


class Participant(NamedTuple):
    slot: int
    word: int  # its token's futex word
    pid: int
    tid: int
    op_lock: int
    op_step: int
    op_value: int
    generation: int
    pending: int
    detects: int
    pidns: int
    wait_since: int
    tstart: int
    poke: int = 0
    agent: int = 0  # 1: an asyncio cohort of its thread's event loop (docs/design.md §14)
    tasks: int = 0  # the tasks waiting behind the cohort
    task_id: int = 0  # the task the cohort acts for now
    label: bytes = b""  # that task's name
    link_seq: int = 0
    link_lock: int = 0  # the wait link: the lock index + 1 its task waits for, 0 none ...
    link_since: int = 0
    link_name: bytes = b""  # ... in this segment

    @property
    def task(self) -> str | None:
        """An asyncio cohort's task name (None: a thread)."""
        if self.agent != 1:
            return None
        return self.label.split(b"\0", 1)[0].decode("utf-8", "replace")

    def link(self) -> tuple[str, int, int] | None:
        """(segment, lock index, since) of the wait its task makes, or None (no link, or one
        being written: link_seq odd)."""
        if self.agent != 1 or self.link_lock == 0 or self.link_seq & 1:
            return None
        name = self.link_name.split(b"\0", 1)[0].decode("utf-8", "replace")
        return (name, self.link_lock - 1, self.link_since) if name else None

    def agent_tasks(self, lock1: int, hslot: int | None) -> int:
        """The waiters of lock (index + 1) lock1 this cohort stands for (participants.pxd
        agent_tasks)."""
        waiting = self.op_lock == lock1 and self.op_step in (OP_TAKING, OP_WAITING)
        if not waiting and hslot != self.slot:
            return 0
        if self.op_lock == lock1 and self.op_step == OP_WAITING and self.tasks == 0:
            return 1
        return self.tasks

    @property
    def state(self) -> int:
        """0 free, 1 alive, 2 dead (participants.pxi participant_state)."""
        if self.word & FUTEX_OWNER_DIED or self.op_step == OP_QUARANTINED:
            return 2
        if self.word & FUTEX_TID_MASK == 0:
            return 2 if self.pending else 0
        return 1

    @property
    def hid(self) -> int:
        """The holder id of this slot's occupant (participants.pxd holder_id)."""
        return ((self.slot + 1) | (self.generation << HOLDER_SLOT_BITS)) & 0xFFFFFFFF


class RWRec(NamedTuple):
    """One participant's line of an RWLock (shm_rwlock.h shm_rwrec)."""

    ind: int  # reader indicator: read holds (_RW_COUNT), _RW_BLOCKED and a phase tag
    wparked: int
    wstate: int  # RW_W_*: none, draining, holding, releasing
    waiting: int
    reads: int
    read_waits: int
    timeouts: int  # its timed reads that gave up
    read_wait_ns: int  # the wait of its read_waits, summed
    read_wait_max_ns: int


class Lock(NamedTuple):
    idx: int  # its index in the directory
    name: str
    kind_code: int  # from the directory
    ctl_kind: int
    flags: int
    holder: int
    magic: int
    counters: tuple[int, ...]  # acquisitions handoffs contended wait_total wait_max
    rare: tuple[int, int]  # owner_deaths, timeouts
    word_a: int  # u64
    word_b: int  # u64
    clh_node_state: int | None  # the state of the node CLH's tail names, if in range
    tbword: tuple[int, ...] | None = None  # a toolbox object's word A (shm_tbword)
    tb_waiting: tuple[int, ...] = ()  # a toolbox object's records: the slots that wait
    rw_recs: tuple[RWRec, ...] = ()  # an RWLock's participant lines, one per slot
    tb_units: tuple[int, ...] = ()  # a semaphore's records: each slot's `with` units
    dead_pidns: int = 0  # robust, pi: word B's u32[2], the dead holder's namespace

    def dead_holder(self) -> tuple[int, int, int] | None:
        """robust, pi: (pid, tid, pidns) of the holder that died holding and whose slot was
        recovered, while nobody has taken the lock since, or None (robust.pxi
        ``_dead_holder``, docs/design.md §7.4 [R1]). Word B: pid, tid, then the namespace."""
        w = self.word_a & 0xFFFFFFFF
        pid, tid = self.word_b & 0xFFFFFFFF, self.word_b >> 32
        if self.kind_code not in (5, 6) or not w & FUTEX_OWNER_DIED or w & FUTEX_TID_MASK:
            return None
        return (pid, tid, self.dead_pidns) if pid else None

    @property
    def kind(self) -> str | None:
        if self.kind_code == KIND_TABLE:
            return "table"
        return KIND_NAMES.get(self.kind_code) or OBJECT_NAMES.get(self.kind_code)

    @property
    def valid(self) -> bool:
        """A known kind, and the body initialised as that kind."""
        return (
            self.kind is not None and self.magic == BODY_MAGIC and self.ctl_kind == self.kind_code
        )


class Table(NamedTuple):
    """A segment's lock table (docs/design.md §15)."""

    idx: int  # its directory entry
    sub: int  # the stripes' kind code
    size: int
    first: int  # the number of stripe 0
    stripes: list[Lock]  # each a lock of its own, named by its number

    @property
    def kind(self) -> str:
        return KIND_NAMES.get(self.sub, "?")


# offsets in a participant's record of what its state needs (_PART: word, op_step, pending)
_P_WORD, _P_STEP, _P_PENDING = 0, 140, 160
_LITTLE = sys.byteorder == "little"


def _fields(parts: bytes | memoryview, n: int) -> tuple[list[int], list[int], list[int]]:
    """(words, op_steps, pendings) of the ``n`` participant records in ``parts``: three
    words of each, read through strided views, no record decoded."""
    if _LITTLE:
        w = PART_SIZE // 4
        mv = memoryview(parts).cast("I")
        return (
            mv[_P_WORD // 4 :: w].tolist(),
            mv[_P_STEP // 4 :: w].tolist(),
            mv[_P_PENDING // 4 :: w].tolist(),
        )
    recs = [_PART.unpack_from(parts, x * PART_SIZE) for x in range(n)]  # pragma: no cover
    return [r[0] for r in recs], [r[4] for r in recs], [r[7] for r in recs]  # pragma: no cover


#: {n: the Struct of state_words for n records}, n <= _STATE_STRUCT_MAX (a header names
#: up to its cap of slots: Structs for every count it could give are not kept)
_STATE_WORDS: dict[int, struct.Struct] = {}
_STATE_STRUCT_MAX = 128


def state_words(buf: bytes, off: int, n: int) -> tuple[int, ...] | bytes:
    """The words of the ``n`` participant records at ``off`` in ``buf`` that say whether a
    slot may be in use and in what state (``_fields``: each token word, op_step and
    pending): where they read the same, so do ``busy_slots`` and ``_states``. One unpack
    (a tuple) for up to ``_STATE_STRUCT_MAX`` records, else three strided copies (bytes);
    all zero where no slot can be in use."""
    if n <= _STATE_STRUCT_MAX:
        s = _STATE_WORDS.get(n)
        if s is None:
            rec = (
                f"I{_P_STEP - _P_WORD - 4}x"
                f"I{_P_PENDING - _P_STEP - 4}x"
                f"I{PART_SIZE - _P_PENDING - 4}x"
            )
            s = _STATE_WORDS[n] = struct.Struct("<" + rec * n)
        return s.unpack_from(buf, off)
    w = PART_SIZE // 4
    mv = memoryview(buf)[off : off + n * PART_SIZE].cast("I")
    return (
        mv[_P_WORD // 4 :: w].tobytes()
        + mv[_P_STEP // 4 :: w].tobytes()
        + mv[_P_PENDING // 4 :: w].tobytes()
    )


def busy_slots(parts: bytes | memoryview, n: int) -> list[int]:
    """The slots that may be in use (a word, a pending recovery or a quarantined step),
    ascending: every slot whose state is not 0 is among them (most slots are free)."""
    words, steps, pending = _fields(parts, n)
    busy = list(itertools.compress(range(n), map(operator.or_, words, pending)))
    if OP_QUARANTINED in steps:
        busy = sorted(set(busy).union(x for x in range(n) if steps[x] == OP_QUARANTINED))
    return busy


def _states(parts: bytes | memoryview, n: int) -> list[int]:
    """Each provisioned slot's state (``Participant.state``: 0 free, 1 alive, 2 dead) from
    the participants' bytes, without decoding every record (``_fields``)."""
    words, steps, pending = _fields(parts, n)
    out = [0] * n
    # only the slots with a word, a pending recovery or a quarantined step can be in use
    busy = set(itertools.compress(range(n), map(operator.or_, words, pending)))
    if OP_QUARANTINED in steps:
        busy.update(x for x in range(n) if steps[x] == OP_QUARANTINED)
    for x in busy:
        word = words[x]
        if word & FUTEX_OWNER_DIED or steps[x] == OP_QUARANTINED:
            out[x] = 2
        elif word & FUTEX_TID_MASK == 0:
            out[x] = 2 if pending[x] else 0
        else:
            out[x] = 1
    return out


@dataclass
class Head:
    """What a segment's header, directory and participants say, validated (``read_head``):
    all that ``ls`` shows, and what tells a scan whether the rest is worth reading."""

    name: str
    size: int
    max_locks: int  # L
    max_participants: int  # P, the cap
    creator_pid: int
    creator_pidns: int
    locks_off: int
    stride: int
    ext_lines: int
    dir_off: int
    directory: bytes  # the directory's lines, as the file holds them
    entries: list[tuple[int, int, bytes]]  # the READY directory entries: (index, kind, name)
    parts: bytes  # the participants provisioned (header.part_hwm), as the file holds them
    resident: int = 0  # bytes tmpfs gave the file (st_blocks): the file is sparse
    _state_cache: list[int] | None = None
    _rec_cache: dict[int, Participant] | None = None

    @property
    def provisioned(self) -> int:
        """Participant slots provisioned when it was read (header.part_hwm)."""
        return len(self.parts) // PART_SIZE

    def states(self) -> list[int]:
        """Each provisioned slot's state: 0 free, 1 alive, 2 dead (``Participant.state``)."""
        if self._state_cache is None:
            self._state_cache = _states(self.parts, self.provisioned)
        return self._state_cache

    def participant(self, slot: int) -> Participant:
        if self._rec_cache is None:
            self._rec_cache = {}
        p = self._rec_cache.get(slot)
        if p is None:
            p = self._rec_cache[slot] = Participant(
                slot, *_PART.unpack_from(self.parts, slot * PART_SIZE)
            )
        return p

    def in_use(self) -> list[Participant]:
        """The slots not free (alive, dead, or their recovery pending): state != 0."""
        return [self.participant(x) for x, s in enumerate(self.states()) if s]

    @property
    def records(self) -> list[tuple[Any, ...]]:
        """Every participant slot provisioned, as _PART unpacks it."""
        return [tuple(self.participant(x)[1:]) for x in range(self.provisioned)]


@dataclass
class Segment(Head):
    locks: list[Lock] = field(default_factory=list)  # the READY entries, in index order
    table: Table | None = None  # its lock table, if it is one (LockTable)

    def all_locks(self) -> list[Lock]:
        """Every lock that can be held or waited for: the directory's entries (but a
        table's), and the table's stripes."""
        out = [lk for lk in self.locks if lk.kind_code != KIND_TABLE]
        if self.table is not None:
            out += self.table.stripes
        return out

    def holder_slot(self, lock: Lock) -> int | None:
        """The slot its holder record names, if it is in range (a slot provisioned) and not
        stale (left by an earlier occupant of the slot): participants.pxd holder_slot."""
        h = lock.holder
        s1 = h & ((1 << HOLDER_SLOT_BITS) - 1)
        if h == 0 or not 1 <= s1 <= self.provisioned:
            return None
        if self.participant(s1 - 1).hid != h:
            return None
        return s1 - 1


def read(name: str, directory: str = SHM_DIR) -> Segment:
    """Read segment ``name`` of ``directory`` into a validated private copy.

    Raises ``FileNotFoundError``, ``_shmread.Refused`` (a symlink, not a regular file, an
    untrusted owner), ``_shmread.Shrunk`` (shorter than its header says),
    ``CorruptRegionError`` (not a region, another layout version or ABI, inconsistent
    geometry) or ``NotReady``."""
    fd, st = _shmread.open_file(os.path.join(directory, name))
    try:
        return read_fd(fd, st, name)
    finally:
        os.close(fd)


def read_fd(
    fd: int,
    st: os.stat_result,
    name: str,
    head: Head | bytes | None = None,
    bodies: list[bytes] | None = None,
) -> Segment:
    """``read`` of a file already opened the safe way (``_shmread.walk``): ``fd``, its
    fstat ``st``; ``head``: its ``read_head`` (or its first bytes) if read already;
    ``bodies``: the first three lines of each READY entry's body (``read_bodies``), if
    read already."""
    try:
        h = head if isinstance(head, Head) else read_head(fd, st, name, head)
        return _read_bodies(fd, h, bodies)
    except _shmread.Shrunk:
        raise _shmread.Shrunk(f"segment {name!r} shrank while it was read") from None


def read_head(fd: int, st: os.stat_result, name: str, first: bytes | None = None) -> Head:
    """The header (validated as ``Region.open`` validates a mapping), the directory and the
    participants provisioned of the file open as ``fd`` (fstat ``st``): two preads, one
    if ``first`` (its first bytes, read already) holds the header, none if it holds them
    all. Raises as ``read``."""
    size = st.st_size
    if size < HEADER_SIZE:
        raise CorruptRegionError(f"segment {name!r} is too small ({size} bytes) to be a region")
    try:
        if first is not None and len(first) >= HEADER_SIZE:
            head = first[:HEADER_SIZE]
        else:
            head = pread_exact(fd, 0, HEADER_SIZE)
        (
            magic,
            _v,
            _line,
            _total,
            L,
            P,
            dir_off,
            part_off,
            locks_off,
            stride,
            state,
            cpid,
            _n,
            _m,
            cns,
            _flags,
            H,
            _okey,
            ext_lines,
        ) = _HEADER.unpack_from(head, 0)
        if magic == _core.MAGIC and state != STATE_READY:
            if cpid and _core._pid_alive(cpid):
                raise NotReady(f"segment {name!r} is still being created (by pid {cpid})")
            raise NotReady(
                f"segment {name!r} was never finished: its creator (pid {cpid}) died while "
                "building it, or it is not a shmlocks region"
            )
        _core._validate_header(head, size, name)  # everything below is in bounds of `size`
        # (and 1 <= H <= P: the participants provisioned, the only ones ever read)
        end = part_off + H * PART_SIZE
        if first is not None and len(first) >= end:  # read already (a walk's read-ahead)
            table = first[dir_off:end]
        else:
            table = pread_exact(fd, dir_off, end - dir_off)
    except _shmread.Shrunk:
        raise _shmread.Shrunk(f"segment {name!r} shrank while it was read") from None
    start = part_off - dir_off
    if _LITTLE:  # the directory's state words, every line's first; decode the READY ones
        dstates = memoryview(table).cast("I")[: L * (LINE // 4) : LINE // 4].tolist()
        ready = [i for i, s in enumerate(dstates) if s == DIRENT_READY]
    else:  # pragma: no cover
        ready = [i for i in range(L) if _DIRENT.unpack_from(table, i * LINE)[0] == DIRENT_READY]
    entries = []
    for i in ready:
        _s, d_kind, raw = _DIRENT.unpack_from(table, i * LINE)
        entries.append((i, d_kind, raw))
    return Head(
        name,
        size,
        L,
        P,
        cpid,
        cns,
        locks_off,
        stride,
        ext_lines,
        dir_off,
        table[:start],
        entries,
        table[start : start + H * PART_SIZE],
        st.st_blocks * 512,
    )


def check_head(fd: int, h: Head, kinds: bool = True) -> None:
    """Raise what reading the rest of the segment (``read_fd``) and, with ``kinds``,
    describing it (``describe``: a kind it does not know) would raise of what they
    validate, reading only what that needs: the directory's kinds, and a lock table's
    header (its entry's body). So a command that shows only the head (``ls``), or that
    reads the rest only of the segments where someone waits (``deadlocks``), reports a
    segment as unreadable exactly when the full read does (but for a file that shrinks
    meanwhile)."""
    try:
        seen_table = False
        for i, d_kind, _raw in h.entries:
            if d_kind != KIND_TABLE:
                continue
            if seen_table:
                raise CorruptRegionError(f"segment {h.name!r} has two lock tables")
            seen_table = True
            body = pread_exact(fd, h.locks_off + i * h.stride, _BODY_READ)
            _table_header(h, body)
        if not seen_table and h.ext_lines:
            raise CorruptRegionError(f"segment {h.name!r}: an extension area and no table")
    except _shmread.Shrunk:
        raise _shmread.Shrunk(f"segment {h.name!r} shrank while it was read") from None
    if not kinds:
        return
    for i, d_kind, _raw in h.entries:
        if d_kind != KIND_TABLE and d_kind not in KIND_NAMES and d_kind not in OBJECT_NAMES:
            raise CorruptRegionError(f"region {h.name!r}: lock {i} has unknown kind {d_kind}")


def _lock(
    fd: int,
    h: Head,
    idx: int,
    lname: str,
    d_kind: int,
    sb: bytes,
    base: int,
    wa_off: int,
    wb_off: int,
    clh_node: Callable[[int], int | None] | None = None,
    **extra: Any,
) -> Lock:
    """One lock (a directory entry's body, or a stripe of a table) from its lines ``sb``
    (ctl at 0, word A at ``wa_off``, word B at ``wb_off``), its body at ``base`` in the
    file: the one
    decoder of both. A CLH lock's tail node is read if its id is in range (clh.pxi
    _clh_ok: 1..H or P+1; a compact clh stripe's: ``clh_node``, from its table's pool)."""
    kind, flags, holder, bmagic, *rest = _CTL.unpack_from(sb, 0)
    (word_a,) = _U64.unpack_from(sb, wa_off)
    (word_b,) = _U64.unpack_from(sb, wb_off)  # (robust, pi: the dead holder's pid, tid)
    (dead_pidns,) = _U32.unpack_from(sb, wb_off + 8)
    node_state = None
    if d_kind == _CLH:
        t = word_a & 0xFFFFFFFF
        if clh_node is not None:
            node_state = clh_node(t)
        elif 1 <= t <= h.provisioned or t == h.max_participants + 1:
            (node_state,) = _U32.unpack(pread_exact(fd, base + (3 + t - 1) * LINE, 4))
    return Lock(
        idx,
        lname,
        d_kind,
        kind,
        flags,
        holder,
        bmagic,
        tuple(rest[:5]),
        (rest[6], _U32.unpack_from(sb, _CTL_TIMEOUTS)[0]),
        word_a,
        word_b,
        node_state,
        dead_pidns=dead_pidns,
        **extra,
    )


def read_bodies(fd: int, h: Head) -> list[bytes]:
    """The first three lines (ctl, word A, word B) of each READY entry's body."""
    return [pread_exact(fd, h.locks_off + i * h.stride, _BODY_READ) for i, _k, _r in h.entries]


def _read_bodies(fd: int, h: Head, bodies: list[bytes] | None = None) -> Segment:
    """The segment: ``h`` and the bodies of its READY entries (the first three lines, or
    ``bodies`` if read already; of a toolbox object its records of the participants
    provisioned; of a table its stripes)."""
    H, P = h.provisioned, h.max_participants
    locks = []
    tbl: Table | None = None
    for k, (i, d_kind, raw) in enumerate(h.entries):
        body_off = h.locks_off + i * h.stride
        body = bodies[k] if bodies is not None else pread_exact(fd, body_off, _BODY_READ)
        if d_kind == KIND_TABLE:
            if tbl is not None:
                raise CorruptRegionError(f"segment {h.name!r} has two lock tables")
            tbl = _read_table(fd, h, i, body)
        extra: dict[str, Any] = {}
        if d_kind in OBJECT_NAMES:
            extra["tbword"] = _TBWORD.unpack_from(body, LINE)
            recs = pread_exact(fd, body_off + (3 + P + 1) * LINE, H * LINE)
            if OBJECT_NAMES[d_kind] == "rwlock":
                rw_recs = tuple(RWRec(*_RWREC.unpack_from(recs, x * LINE)) for x in range(H))
                extra["rw_recs"] = rw_recs
                extra["tb_waiting"] = tuple(x for x in range(H) if rw_recs[x].waiting)
            else:
                extra["tb_waiting"] = tuple(
                    x for x in range(H) if _U32.unpack_from(recs, x * LINE + _TBREC_WAITING)[0]
                )
                if OBJECT_NAMES[d_kind] == "semaphore":
                    extra["tb_units"] = tuple(
                        _U32.unpack_from(recs, x * LINE + _TBREC_UNITS)[0] for x in range(H)
                    )
        lname = raw[: NAME_MAX - 1].split(b"\0", 1)[0].decode("utf-8", "replace")
        locks.append(_lock(fd, h, i, lname, d_kind, body, body_off, LINE, 2 * LINE, **extra))
    if tbl is None and h.ext_lines:
        raise CorruptRegionError(f"segment {h.name!r}: an extension area and no table")
    return Segment(**vars(h), locks=locks, table=tbl)


def _table_header(h: Head, body: bytes) -> tuple[int, int, int, int, int, int]:
    """A lock table's header (word A of its entry's body), validated as participants.pxi
    ``table_load`` validates it: (sub, size, first, compact, off, stride)."""
    sub, n, first, compact, off, sstride = _TABLE.unpack_from(body, LINE)
    kind, _flags, _holder, bmagic = _U32X4.unpack_from(body, 0)
    L, stride = h.max_locks, h.stride
    need = STRIPE_LINES * LINE  # every kind's stripe is one line (two: aarch64)
    if (
        kind != KIND_TABLE
        or bmagic != BODY_MAGIC
        or sub not in KIND_NAMES
        or compact != 1
        or not 1 <= n <= TABLE_MAX
        or first != L
        or sstride != need
        or off != h.locks_off + L * stride
        or off + n * sstride != h.size
    ):
        raise CorruptRegionError(f"segment {h.name!r}: its lock table's header does not match")
    return sub, n, first, compact, off, sstride


def _read_table(fd: int, h: Head, idx: int, body: bytes) -> Table:
    """A lock table's header (``_table_header``) and its stripes: each a ``Lock`` (idx: its
    number), from one read of their lines."""
    sub, n, first, _compact, off, sstride = _table_header(h, body)
    data = pread_exact(fd, off, n * sstride)
    clh_node = None
    if sub == _CLH:
        # a clh stripe's tail names a node of its table's pool (clhc.pxi): a participant's
        # (the table entry's node lines) or a stripe's (in the lines read)
        nodes_off = h.locks_off + idx * h.stride + 3 * LINE

        def clh_node(t: int) -> int | None:
            if t >> 30 == 1:
                s = (t & ~_CH_SNODE) - first
                if 0 <= s < n:
                    return _U32.unpack_from(data, s * sstride + STRIPE_CLH_NODE_OFF)[0]
                return None
            if 1 <= t <= h.provisioned:
                return _U32.unpack(pread_exact(fd, nodes_off + (t - 1) * LINE, 4))[0]
            return None

    wb_off = {_KIND_TICKET: STRIPE_TICKET_WB_OFF, _CLH: STRIPE_CLH_HEAD_OFF}.get(sub, STRIPE_WB_OFF)
    stripes = [
        _lock(
            fd,
            h,
            first + s,
            f"{h.name}[{s}]",
            sub,
            data[s * sstride : (s + 1) * sstride],
            off + s * sstride,
            STRIPE_WA_OFF,
            wb_off,
            clh_node,
        )
        for s in range(n)
    ]
    return Table(idx, sub, n, first, stripes)


def lock_at(seg: Segment, lock1: int) -> Lock | None:
    """The lock that number ``lock1 - 1`` names (op_lock, a wait link): a READY directory
    entry's, or a stripe of the segment's table; None if none (participants.pxd
    ``lock_at``, the one decoder, mirrored)."""
    n = lock1 - 1
    if n < 0:
        return None
    if n < seg.max_locks:
        for lk in seg.locks:
            if lk.idx == n:
                return lk
        return None
    t = seg.table
    if t is not None and 0 <= n - t.first < t.size:
        return t.stripes[n - t.first]
    return None


# ------------------------------------------------------------------------- describe


_pidns_cache: tuple[int, int] = (0, 0)  # (pid, namespace inode)


def _my_pidns() -> int:
    global _pidns_cache
    pid = os.getpid()
    if _pidns_cache[0] != pid:
        try:
            ino = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            ino = 0
        _pidns_cache = (pid, ino)
    return _pidns_cache[1]


def other_pidns(ns: int) -> bool:
    """Is namespace id ``ns`` (a record's) known and not ours? (participants.pxd)"""
    mine = _my_pidns()
    return ns != 0 and mine != 0 and ns != mine


def is_locked(seg: Segment, lock: Lock) -> bool:
    """The kind's ``_is_locked`` over the copy (ticket.pxi, mcs.pxi, clh.pxi, futex.pxi,
    robust.pxi)."""
    kind = lock.kind_code
    if kind == 1:  # ticket: next != serving
        return lock.word_a != lock.word_b
    if kind == 2:  # mcs: a tail
        return lock.word_a != 0
    if kind == _CLH:  # the tail's node is not FREE (an id out of range: held)
        return lock.clh_node_state is None or lock.clh_node_state != 0
    if kind in (4, 5, 6):  # futex word, or the glibc mutex's futex word
        return lock.word_a & 0xFFFFFFFF != 0
    return lock.holder != 0


def _participant(seg: Segment, slot: int | None) -> dict[str, Any] | None:
    if slot is None:
        return None
    p = seg.participant(slot)
    d: dict[str, Any] = {
        "slot": slot,
        "pid": p.pid,
        "tid": p.tid,
        "alive": p.state == 1,
        "other_namespace": other_pidns(p.pidns),
    }
    if p.agent == 1:  # an asyncio cohort: the task it acts for (Region._participant)
        d["task"] = p.task
        d["task_id"] = p.task_id
    return d


def _weigh(seg: Segment, lk: Lock, in_use: list[Participant]) -> tuple[bool, int | None, bool]:
    """(locked, holder slot, stale_step): the lock as the next acquire finds it, the words
    weighed against the holder record and the published steps, as lockbase.pxi
    ``_Lock._describe`` weighs them (docs/design.md §6.4 [V]): a lock whose words are set
    only by a thread that died inside acquire or release is free, with a stale step."""
    locked = is_locked(seg, lk)
    h = seg.holder_slot(lk)
    kernel = _core.KINDS[KIND_NAMES[lk.kind_code]].recovery == "kernel"
    stale = False
    if locked:
        live, dead1 = False, None
        for p in in_use:
            if p.op_lock != lk.idx + 1 or p.op_step == 0:
                continue
            st = p.state
            if st == 1:
                live = True
            elif st == 2 and dead1 is None:
                dead1 = p.slot
        if h is not None and seg.participant(h).state == 2:
            hp = seg.participant(h)
            # a dead holder: owner_died unless (user kinds) it died inside a step
            stale = not kernel and hp.op_lock == lk.idx + 1 and hp.op_step != 0
        elif h is None and dead1 is not None:
            if kernel:
                # the futex word: its owner's TID, or OWNER_DIED once the kernel saw it die
                w = lk.word_a & 0xFFFFFFFF
                if w & FUTEX_OWNER_DIED or (w & FUTEX_TID_MASK) == seg.participant(dead1).tid:
                    h = dead1
            elif not live:
                stale = True  # only a dead thread's step: free
    if stale:
        locked, h = False, None
    return locked, h, stale


def object_state(seg: Segment, lk: Lock) -> str:
    """A toolbox object's state as its ``_state()`` gives it (event.pxi, semaphore.pxi,
    barrier.pxi, condition.pxi)."""
    w = lk.tbword or (0,) * 9
    seq, _parked, value, limit, count, _waiting, _tmo, flags, _cycle = w
    kind = OBJECT_NAMES.get(lk.kind_code)
    if kind == "rwlock":
        readers = sum(lk.rw_recs[x].ind & _RW_COUNT for x in rw_readers(lk))
        if seq & _RW_PRESENT:
            return "writing" if lk.holder else f"writer draining, readers={readers}"
        return f"readers={readers}" if readers else "free"
    if kind == "event":
        return "set" if seq & 1 else "unset"
    if kind == "semaphore":
        return f"value={value}/{limit}" if flags & _TB_BOUNDED else f"value={value}"
    if kind == "barrier":
        st = _TB_BARRIER_STATES[value] if value < 4 else f"state {value}"
        return f"{st}, waiters={count if value == 0 else 0}/{limit}"
    return f"waiters={object_waiters(seg, lk)}"


def object_waiters(seg: Segment, lk: Lock) -> int:
    """Live participants whose record says they sleep in a wait on the object."""
    return sum(1 for x in lk.tb_waiting if seg.participant(x).state == 1)


def sem_holders(seg: Segment, lk: Lock) -> list[tuple[int, int]]:
    """(slot, units) of each participant (alive, or dead and not yet recovered) holding
    units of semaphore ``lk`` taken with ``with`` (semaphore.pxi ``_describe``)."""
    return [(x, u) for x, u in enumerate(lk.tb_units) if u and seg.participant(x).state != 0]


def rw_readers(lk: Lock) -> list[int]:
    """The slots that hold reads of RWLock ``lk`` (an indicator with holds, not waiting)."""
    return [x for x, r in enumerate(lk.rw_recs) if r.ind & _RW_COUNT and not r.ind & _RW_BLOCKED]


def rw_writer(lk: Lock) -> tuple[int | None, bool]:
    """(the slot word A names as the writer present, or None; whether it still drains the
    readers of its arrival) of RWLock ``lk``: rwlock.pxi's writer phase, bounds-checked."""
    w = lk.tbword[0] if lk.tbword else 0
    ws = w & ((1 << _RW_SLOT_BITS) - 1)
    if not w & _RW_PRESENT or not 1 <= ws <= len(lk.rw_recs):
        return None, False
    return ws - 1, lk.rw_recs[ws - 1].wstate == _RW_W_DRAINING


def rw_waits_for(lk: Lock, x: int) -> tuple[str, list[int]]:
    """Whom participant ``x``, published as waiting for RWLock ``lk``, waits for, read from
    the lock's words as rwlock.pxi waits: ``("read", [w])`` for a reader, w the writer of
    the phase its indicator is tagged with; ``("write", [w])`` for a writer that waits for
    the writer present to leave; ``("write", [r, ...])`` for a writer that announced and
    drains every reader present at its arrival (it needs each of them gone: an AND-wait).
    An empty list: it is about to get in (its writer has left)."""
    if not 0 <= x < len(lk.rw_recs):
        return "write", []
    ind = lk.rw_recs[x].ind
    wslot, draining = rw_writer(lk)
    w = lk.tbword[0] if lk.tbword else 0
    phase = (w >> _RW_SLOT_BITS) & _RW_PHASE
    other = [wslot] if wslot is not None and wslot != x else []
    if ind & _RW_BLOCKED:
        return "read", other if (ind >> _RW_TAG_SHIFT) & _RW_TAG == phase & _RW_TAG else []
    if ind & _RW_COUNT:
        return "read", []  # it got in: its wait record is about to be cleared
    if wslot == x and draining:
        tag = phase & _RW_TAG
        return "write", [s for s, r in enumerate(lk.rw_recs) if s != x and _rw_counts(r.ind, tag)]
    return "write", other


def _rw_counts(ind: int, tag: int) -> bool:
    """Does the writer of phase tag ``tag`` wait for indicator ``ind`` (rwlock.pxi)?"""
    if not ind & _RW_COUNT:
        return False
    return not (ind & _RW_BLOCKED and (ind >> _RW_TAG_SHIFT) & _RW_TAG == tag)


def _rw_describe(seg: Segment, lk: Lock) -> dict[str, Any]:
    """An RWLock as ``RWLock._describe()`` gives it (rwlock.pxi): the writer is the
    holder, the readers the participants whose indicator holds reads."""
    h = seg.holder_slot(lk)
    holder = _participant(seg, h) if h is not None else None
    readers = []
    for x in rw_readers(lk):
        d = _participant(seg, x)
        assert d is not None
        d["holds"] = lk.rw_recs[x].ind & _RW_COUNT
        readers.append(d)
    return {
        "name": lk.name,
        "kind": lk.kind,
        "locked": holder is not None or bool(readers),
        "holder": holder,
        "readers": readers,
        "waiters": object_waiters(seg, lk),
        "owner_died": bool(lk.flags & 1),
        "not_recoverable": bool(lk.flags & 2),
        "stale_step": False,
        "state": object_state(seg, lk),
    }


def describe(seg: Segment) -> dict[str, Any]:
    """What ``Region._describe()`` gives for a mapped region, from the copy: the
    participants in use, and each lock's kind, holder, waiters and flags."""
    in_use = seg.in_use()
    parts = [_participant(seg, p.slot) for p in in_use]
    locks = []
    for lk in seg.locks:
        if lk.kind is None:
            raise CorruptRegionError(
                f"region {seg.name!r}: lock {lk.idx} has unknown kind {lk.kind_code}"
            )
        if lk.kind == "rwlock":
            locks.append(_rw_describe(seg, lk))
            continue
        if lk.kind_code in OBJECT_NAMES:
            obj: dict[str, Any] = {
                "name": lk.name,
                "kind": lk.kind,
                "locked": False,
                "holder": None,
                "waiters": object_waiters(seg, lk),
                "owner_died": False,
                "not_recoverable": False,
                "stale_step": False,
                "state": object_state(seg, lk),
            }
            if lk.kind == "semaphore":
                obj["holders"] = [
                    dict(_participant(seg, x) or {}, units=u) for x, u in sem_holders(seg, lk)
                ]
            locks.append(obj)
            continue
        if lk.kind == "table":
            if seg.table is not None and seg.table.idx == lk.idx:
                locks.append(table_describe(seg, seg.table, in_use))
            continue
        locks.append(lock_describe(seg, lk, in_use))
    return {
        "name": seg.name,
        "size": seg.size,
        "resident": seg.resident,
        "version": _core.LAYOUT_VERSION,
        "max_locks": seg.max_locks,
        "max_participants": seg.max_participants,
        "participants_provisioned": seg.provisioned,
        "creator_pid": seg.creator_pid,
        "creator_other_namespace": other_pidns(seg.creator_pidns),
        "participants": parts,
        "locks": locks,
    }


def lock_describe(seg: Segment, lk: Lock, in_use: list[Participant]) -> dict[str, Any]:
    """One lock (an entry, or a table's stripe) as its ``_describe()`` gives it."""
    hs = seg.holder_slot(lk)
    waiters = sum(
        (p.agent_tasks(lk.idx + 1, hs) if p.agent == 1 else 1)
        for p in in_use
        if p.state == 1 and (p.agent == 1 or (p.op_lock == lk.idx + 1 and p.op_step == OP_WAITING))
    )
    locked, holder, stale = _weigh(seg, lk, in_use)
    hd = _participant(seg, holder) if locked else None
    dead = lk.dead_holder() if locked and hd is None else None
    if dead is not None:  # its slot was reused: the record (no slot of its own now)
        hd = {
            "slot": None,
            "pid": dead[0],
            "tid": dead[1],
            "alive": False,
            "other_namespace": other_pidns(dead[2]),
        }
    return {
        "name": lk.name,
        "kind": lk.kind,
        "locked": locked,
        "holder": hd,
        "waiters": waiters,
        "owner_died": bool(lk.flags & 1),
        "not_recoverable": bool(lk.flags & 2),
        "stale_step": stale,
    }


def hottest(stripes: list[Lock], n: int) -> list[tuple[int, int]]:
    """The ``n`` busiest stripes as (index, acquisitions), busiest first (never taken: left
    out), as ``LockTable.stats()`` gives them."""
    first = stripes[0].idx if stripes else 0
    acq = sorted(
        ((lk.counters[0], lk.idx - first) for lk in stripes if lk.counters[0]),
        key=lambda x: (-x[0], x[1]),
    )
    return [(s, a) for a, s in acq[:n]]


def table_describe(
    seg: Segment, t: Table, in_use: list[Participant], n_hot: int = 5
) -> dict[str, Any]:
    """A lock table as ``LockTable._describe()`` gives it: one entry, with its stripes that
    are held, waited for or flagged (each as a lock, with its index: ``stripes``), the
    hottest as (index, acquisitions) (``hottest``) and those stripes each with its
    acquisitions, holder and waiters (``hottest_stripes``)."""
    stripes = []
    for s, lk in enumerate(t.stripes):
        d = lock_describe(seg, lk, in_use)
        if (
            d["locked"]
            or d["waiters"]
            or d["owner_died"]
            or d["not_recoverable"]
            or d["stale_step"]
        ):
            d["index"] = s
            stripes.append(d)
    hot = hottest(t.stripes, n_hot)
    hot_stripes = []
    for s, acq in hot:
        d = lock_describe(seg, t.stripes[s], in_use)
        hot_stripes.append(dict(d, index=s, acquisitions=acq))
    return {
        "name": "table",
        "kind": "table",
        "stripe_kind": t.kind,
        "size": t.size,
        "locked": any(d["locked"] for d in stripes),
        "holder": None,
        "waiters": sum(d["waiters"] for d in stripes),
        "owner_died": any(d["owner_died"] for d in stripes),
        "not_recoverable": any(d["not_recoverable"] for d in stripes),
        "stale_step": any(d["stale_step"] for d in stripes),
        "held": sum(1 for d in stripes if d["locked"]),
        "stripes": stripes,
        "hottest": hot,
        "hottest_stripes": hot_stripes,
    }


def table_stats(t: Table, n_hot: int = 10) -> dict[str, Any]:
    """A table's stripes' counters summed, as ``LockTable.stats()`` gives them."""
    tot: dict[str, Any] = {
        "acquisitions": 0,
        "contended": 0,
        "wait_total_s": 0.0,
        "wait_max_s": 0.0,
        "timeouts": 0,
        "owner_deaths": 0,
        "handoffs": 0,
    }
    for lk in t.stripes:
        st = lock_stats(lk)
        for k in tot:
            tot[k] = max(tot[k], st[k]) if k == "wait_max_s" else tot[k] + st[k]
    tot["hottest"] = hottest(t.stripes, n_hot)
    tot["size"] = t.size
    return tot


def lock_stats(lk: Lock) -> dict[str, Any]:
    """One lock's counters, as ``_Lock.stats()`` gives them (stats.pxi stats_read)."""
    acq, handoffs, contended, wait_total, wait_max = lk.counters
    owner_deaths, timeouts = lk.rare
    return {
        "acquisitions": acq,
        "contended": contended,
        "wait_total_s": wait_total / 1e9,
        "wait_max_s": wait_max / 1e9,
        "timeouts": timeouts,
        "owner_deaths": owner_deaths,
        "handoffs": handoffs,
    }


def stats(seg: Segment) -> dict[str, dict[str, Any]]:
    """{lock name: its counters}, as ``Region.stats()`` gives them (a table's entry: its
    stripes summed, table_stats)."""
    out = {}
    for lk in seg.locks:
        if lk.kind == "table":
            if seg.table is not None and seg.table.idx == lk.idx:
                out[lk.name] = table_stats(seg.table)
            continue
        out[lk.name] = lock_stats(lk)
    return out
