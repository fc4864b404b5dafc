"""The machine-wide commands cost what they show (issue 38, item 5): ``ls`` reads each
segment's head only (one open, its header, directory and participants; no lock body),
``deadlocks`` reads the lock bodies only of the segments where someone waits, ``top``
decodes again only the segments that changed since its last sample; and each shows what
the full read shows, hostile segments included (the same lines, the same errors, the
same notes).

The segments here are copies of real ones (and hostile variants of them) in a directory
of the test's own that stands for /dev/shm: nobody else's segments are counted, and
nobody else sees the hostile files.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from typing import Any

import pytest
from support import SHM_DIR
from test_waitgraph import _start_chain

import shmlocks
from shmlocks import _segment, _shmread, waitgraph
from shmlocks import cli as shmlocks_cli
from shmlocks.cli import _common
from shmlocks.cli import ls as cli_ls
from shmlocks.deadlocks import cycles_report

pytestmark = pytest.mark.timeout(90)

_LOCKS_OFF = 48  # shm_header: locks_off (u64), after magic .. stride
_STATE, _H, _EXT = 64, 92, 104  # shm_header: state (u32), part_hwm (u32), ext_lines (u64)
_DIR_OFF, _LINE = 32, _segment.LINE


class Reads:
    """Every open and pread of a file in ``root``: {file name: opens}, [(file, offset)]."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
        self.opens: dict[str, int] = {}
        self.preads: list[tuple[str, int]] = []
        real_open, real_pread = os.open, os.pread

        def counted_open(path, *a, **k):
            fd = real_open(path, *a, **k)
            p = os.fspath(path)
            if os.path.dirname(p) == root:
                self.opens[os.path.basename(p)] = self.opens.get(os.path.basename(p), 0) + 1
            return fd

        def counted_pread(fd, n, offset):
            try:
                p = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                p = ""
            if os.path.dirname(p) == root:
                self.preads.append((os.path.basename(p), offset))
            return real_pread(fd, n, offset)

        monkeypatch.setattr(os, "open", counted_open)
        monkeypatch.setattr(os, "pread", counted_pread)

    def bodies_read(self, root: str) -> set[str]:
        """The files of which a byte at or past the lock bodies (locks_off) was read."""
        out = set()
        for name, off in self.preads:
            with open(os.path.join(root, name), "rb") as f:
                head = f.read(64)
            if len(head) == 64 and off >= struct.unpack_from("<Q", head, _LOCKS_OFF)[0]:
                out.add(name)
        return out


def _copy(src: str, root, name: str) -> str:
    shutil.copyfile(os.path.join(SHM_DIR, src), os.path.join(root, name))
    return name


def _full_ls_record(name: str, root: str) -> dict[str, Any]:
    """The line ``ls`` showed before it read heads only: from the full read and
    ``describe`` (the reference)."""
    rec: dict[str, Any] = {"name": name}
    try:
        d = _segment.describe(_segment.read(name, root))
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        rec["error"] = _common.error_text(e)
        return rec
    parts = d["participants"]
    state, alive = _common.creator(d)
    rec.update(
        size=d["size"],
        resident=d["resident"],
        locks=len(d["locks"]),
        max_locks=d["max_locks"],
        alive=sum(1 for p in parts if p["alive"]),
        dead=sum(1 for p in parts if not p["alive"]),
        max_participants=d["max_participants"],
        provisioned=d["participants_provisioned"],
        creator_pid=d["creator_pid"],
        creator_state=state,
        creator_alive=alive,
    )
    return rec


def _ls(monkeypatch, capsys, root: str) -> list[dict[str, Any]]:
    monkeypatch.setattr(cli_ls, "SHM_DIR", root)
    assert shmlocks_cli.main(["ls", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _segments(new_region, tmp_path, plain: bool = False) -> tuple[str, list[str]]:
    """A region of every kind (or, ``plain``, of the plain kinds only), a lock of each
    named by its kind (the futex lock at index 0, held by this thread), with a semaphore
    and an RWLock unless ``plain``, copied ten times into ``tmp_path``; and a lock table's
    segment copied once."""
    kinds = ("futex", "ticket", "mcs", "robust", "pi") if plain else shmlocks.KINDS
    region = new_region(max_locks=len(kinds) + (0 if plain else 2), max_participants=8)
    for kind in kinds:
        region.create_lock(kind, kind)
    if not plain:
        region.create_semaphore("sem", 2)
        region.create_rwlock("rw")
    held = region.open_lock("futex")
    held.acquire()
    root = str(tmp_path)
    names = [_copy(region.name, root, f"seg-{i}") for i in range(10)]
    held.release()
    table = shmlocks.LockTable(16, "mcs")
    try:
        names.append(_copy(table.name, root, "table"))
    finally:
        table.close()
    return root, names


def test_ls_reads_each_segment_once_and_no_lock_body(new_region, tmp_path, monkeypatch, capsys):
    """``ls`` opened every segment twice (the listing, then the full read) and read every
    lock body of each, to print counts: now one open, and only the head (a lock table's
    header, one line of its entry, is read to validate it). What it prints is the line
    the full read gave."""
    root, names = _segments(new_region, tmp_path)
    want = [_full_ls_record(n, root) for n in sorted(names)]
    reads = Reads(monkeypatch, root)
    got = _ls(monkeypatch, capsys, root)
    assert got == want
    assert reads.opens == {n: 1 for n in names}
    assert reads.bodies_read(root) <= {"table"}


def _hostile(root: str, base: str, table: str) -> list[str]:
    """Hostile variants of segment ``base`` (and of the lock table ``table``) in ``root``:
    each a file any local user could write (but for its owner, trusted here)."""
    with open(os.path.join(root, base), "rb") as f:
        data = bytearray(f.read())
    with open(os.path.join(root, table), "rb") as f:
        tdata = bytearray(f.read())
    dir_off = struct.unpack_from("<Q", data, _DIR_OFF)[0]
    part_off = struct.unpack_from("<Q", data, 40)[0]
    locks_off = struct.unpack_from("<Q", data, _LOCKS_OFF)[0]
    out = []

    def put(name: str, b: bytes | bytearray) -> None:
        with open(os.path.join(root, name), "wb") as f:
            f.write(b)
        out.append(name)

    def edit(name: str, src: bytearray, fmt: str, off: int, value: int) -> None:
        b = bytearray(src)
        struct.pack_into(fmt, b, off, value)
        put(name, b)

    put("h-garbage", _shmread.MAGIC + os.urandom(4088))
    put("h-short", data[:4096])
    put("h-header-only", data[: _segment.HEADER_SIZE])
    edit("h-version", data, "<I", 8, 999)
    edit("h-hwm", data, "<I", _H, 10_000)  # more participants provisioned than the cap
    edit("h-not-ready", data, "<I", _STATE, 0)
    edit("h-ext", data, "<Q", _EXT, 3)  # an extension area, and no table
    edit("h-kind", data, "<I", dir_off + 4, 77)  # an entry of a kind nobody knows
    b = bytearray(data)  # two entries that say they are lock tables
    for i in range(2):
        struct.pack_into("<I", b, dir_off + i * _LINE + 4, _segment.KIND_TABLE)
    put("h-two-tables", b)
    t_entry = struct.unpack_from("<Q", tdata, _LOCKS_OFF)[0]
    edit("h-table-size", tdata, "<I", t_entry + _LINE + 4, 10**6)  # its stripes: too many
    edit("h-holder", data, "<I", locks_off + 8, 0xFFFF)  # a holder slot out of range
    b = bytearray(data)  # a participant that waits for a lock out of range, alive
    struct.pack_into("<I", b, part_off, os.getpid())
    struct.pack_into("<II", b, part_off + 136, 10_000, _segment.OP_WAITING)
    put("h-op-lock", b)
    os.mkfifo(os.path.join(root, "h-fifo"))
    os.symlink(os.path.join(root, base), os.path.join(root, "h-link"))
    os.mkdir(os.path.join(root, "h-dir"))
    return out


def test_ls_and_deadlocks_show_hostile_segments_as_the_full_read_does(
    new_region, tmp_path, monkeypatch, capsys
):
    """The head-only ``ls`` and the waits-only ``deadlocks`` over hostile files (garbage
    after the magic, cut short, another layout version, a participant count past the
    cap, not ready, an extension area without a table, an unknown kind, two tables, a
    table header that does not add up, indices out of range, a FIFO, a symlink, a
    directory): every line and error as the full read gives it, every note as the full
    scan gives it, bounded in time, nothing raised."""
    root, names = _segments(new_region, tmp_path)
    hostile = _hostile(root, names[0], "table")
    files = sorted(names + hostile)
    want = [_full_ls_record(n, root) for n in files]
    t0 = time.monotonic()
    got = _ls(monkeypatch, capsys, root)
    assert time.monotonic() - t0 < 10
    assert got == want
    errors = {r["name"]: r["error"] for r in got if "error" in r}
    assert set(errors) >= {"h-garbage", "h-short", "h-version", "h-hwm", "h-kind"}, errors
    assert set(errors) >= {"h-two-tables", "h-table-size", "h-ext", "h-not-ready"}, errors
    monkeypatch.setattr(waitgraph, "SHM_DIR", root)
    full = waitgraph.snapshot()
    cheap = waitgraph.snapshot(waits_only=True)
    assert cheap.notes == full.notes and len(full.notes) >= 8, full.notes
    assert cycles_report(cheap) == cycles_report(full)
    # inspect's look: a participant that waits for a lock out of range waits for nothing
    g = waitgraph.snapshot(threads_of="h-op-lock")
    assert g.notes == full.notes
    assert all(t.waits is None for t in g.threads.values())
    # and from the copy inspect describes (its file not opened again)
    g2 = waitgraph.snapshot(threads_of=_segment.read("h-op-lock", root))
    assert g2.notes == g.notes and g2.threads.keys() == g.threads.keys()
    assert all(t.waits is None for t in g2.threads.values())


@pytest.mark.timeout(120)
def test_deadlocks_reads_lock_bodies_only_where_someone_waits(
    procs, new_lock, tmp_path, monkeypatch
):
    """``deadlocks`` read every lock body of every segment of the machine to find the few
    that wait: now the head first, and the bodies only of the segments where a live
    participant waits. It finds the same cycle, with the same members, victim and
    waiting threads, as the full scan."""
    a, b = new_lock("futex"), new_lock("futex")
    idle = new_lock("mcs")
    ps = _start_chain(procs, [a, b])
    try:
        root = str(tmp_path)
        deadline = time.monotonic() + 20
        while True:  # both publish their wait, then copy the segments as they are
            g = waitgraph.snapshot([a.name, b.name])
            if len(g.cycles()) == 1:
                break
            assert time.monotonic() < deadline, "the cycle never closed"
            time.sleep(0.05)
        _copy(a.name, root, "a")
        _copy(b.name, root, "b")
        for i in range(20):
            _copy(idle.name, root, f"idle-{i}")
    finally:
        for p in ps:
            p.kill()
            p.join(10)
    monkeypatch.setattr(waitgraph, "SHM_DIR", root)
    full = cycles_report(waitgraph.snapshot())
    reads = Reads(monkeypatch, root)
    cheap = cycles_report(waitgraph.snapshot(waits_only=True))
    assert reads.bodies_read(root) == {"a", "b"}
    assert set(reads.opens.values()) == {1}
    for rep in (full, cheap):  # the time waited differs by the time between the looks
        for c in rep["cycles"]:
            for m in c:
                m.pop("waited_s")
    assert cheap == full and len(cheap["cycles"]) == 1 and cheap["waiting_threads"] == 2


def test_top_decodes_again_only_what_changed(new_region, new_lock):
    """``top`` read and decoded every lock of every segment at every refresh: now a
    segment whose header, directory, lock bodies and participants in use read as before
    keeps its rows, and only a changed one is decoded again; the rows are the full
    read's."""
    from shmlocks import top

    locks = [new_lock(k) for k in ("futex", "ticket", "mcs", "robust", "pi")]
    region = new_region(max_locks=4, max_participants=8)
    region.create_lock("c", "clh")  # not a plain kind: decoded at every sample
    names = [lk.name for lk in locks] + [region.name]
    decoded: list[str] = []
    real = top.locks_stats

    def counted(seg):
        decoded.append(seg.name)
        return real(seg)

    top.locks_stats = counted
    try:
        s = top.Sampler(names)
        first, notes = s()
        assert not notes and sorted(decoded) == sorted(names)
        decoded.clear()
        again, _ = s()
        assert again == first and decoded == [region.name]
        decoded.clear()
        locks[1].acquire()
        held, _ = s()
        assert decoded == [locks[1].name, region.name]
        assert held == top.Sampler(names)()[0]  # what a fresh, full read gives
        row = held[(locks[1].name, "lock")]
        assert row["locked"] and row["holder"]["pid"] == os.getpid()
        locks[1].release()
        decoded.clear()
        freed, _ = s()
        assert decoded == [locks[1].name, region.name]
        assert freed[(locks[1].name, "lock")]["acquisitions"] == row["acquisitions"]
        assert not freed[(locks[1].name, "lock")]["locked"]
    finally:
        top.locks_stats = real


def test_inspect_reads_its_segment_once(new_region, tmp_path, monkeypatch, capsys):
    """``inspect NAME`` opened its segment three times (the magic check, the read it
    describes, the look's read of its threads) and the walk a fourth: now once, the look
    made from the copy it describes. What it prints is what it printed: the description
    annotated by a look that reads the segment itself."""
    from shmlocks.deadlocks import annotate

    region = new_region(max_locks=len(shmlocks.KINDS) + 2, max_participants=8)
    for kind in shmlocks.KINDS:
        region.create_lock(kind, kind)
    region.create_semaphore("sem", 2)
    held = region.open_lock("futex")
    held.acquire()
    table = shmlocks.LockTable(16, "mcs")
    stripe = table[3]
    stripe.acquire()
    try:
        for name in (region.name, table.name):
            want = annotate(_segment.describe(_segment.read(name)))
            reads = Reads(monkeypatch, SHM_DIR)
            assert shmlocks_cli.main(["inspect", name, "--json"]) == 0
            got = json.loads(capsys.readouterr().out)
            monkeypatch.undo()
            assert reads.opens[name] == 1, reads.opens[name]
            assert {k: got[k] for k in want} == json.loads(json.dumps(want))
            assert any(p["holds"] for p in got["participants"]), got["participants"]
    finally:
        stripe.release()
        held.release()
        table.close()
    _refuses_before_reading("inspect", tmp_path, monkeypatch, capsys)


@pytest.mark.timeout(60)
def test_stat_reads_its_segment_once(new_region, tmp_path, monkeypatch, capsys):
    """``stat NAME`` opened its segment twice (the magic check, then the read); now once,
    with the same output and the same errors before the read."""
    from shmlocks.stats import segment_stats

    region = new_region(max_locks=3, max_participants=8)
    region.create_lock("futex", "futex")
    held = region.open_lock("futex")
    held.acquire()
    table = shmlocks.LockTable(16, "robust")
    try:
        with table[5]:
            for name in (region.name, table.name):
                want = segment_stats(name)
                reads = Reads(monkeypatch, SHM_DIR)
                assert shmlocks_cli.main(["stat", name, "--json"]) == 0
                got = json.loads(capsys.readouterr().out)
                monkeypatch.undo()
                assert reads.opens[name] == 1, reads.opens[name]
                assert got == json.loads(json.dumps(want))
    finally:
        held.release()
        table.close()
    _refuses_before_reading("stat", tmp_path, monkeypatch, capsys)


def _refuses_before_reading(cmd: str, tmp_path, monkeypatch, capsys) -> None:
    """``cmd NAME``'s errors before any read, as they were: not a segment, missing, a
    FIFO (in a private directory)."""
    root = str(tmp_path)
    monkeypatch.setattr(_common, "SHM_DIR", type(_common.SHM_DIR)(root))
    with open(os.path.join(root, "plain"), "wb") as f:
        f.write(b"not a segment at all")
    os.mkfifo(os.path.join(root, "fifo"))
    for name, says in (
        ("plain", "is not a shmlocks segment"),
        ("missing", "no shared-memory segment named"),
        ("fifo", "refused, not a regular file (a FIFO)"),
    ):
        assert shmlocks_cli.main([cmd, name]) == 1
        assert says in capsys.readouterr().err


def _full_top(root: str) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """What a sample of ``top`` shows of the segments in ``root``, from the full read of
    each (the reference): every lock's record, and a note per segment it cannot read."""
    from shmlocks.stats import locks_stats

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    notes = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            if f.read(len(_shmread.MAGIC)) != _shmread.MAGIC:
                continue
        try:
            locks = locks_stats(_segment.read(name, root))
        except (shmlocks.ShmLockError, OSError, ValueError) as e:
            notes.append(f"{name}: {str(e).splitlines()[0]}")
            continue
        for lk in locks:
            rows[(name, lk["name"])] = dict(lk, segment=name)
    return rows, notes


def _bump(path: str, body: int = 0, by: int = 1) -> None:
    """Add ``by`` to the acquisitions of the lock at index ``body`` of the segment file
    ``path``, in place (the file, its inode and size stay; the directory is untouched)."""
    with open(path, "r+b") as f:
        head = f.read(64)
        locks_off, stride = struct.unpack_from("<QQ", head, _LOCKS_OFF)
        off = locks_off + body * stride + 16  # the ctl line: kind .. magic, acquisitions
        f.seek(off)
        (acq,) = struct.unpack("<Q", f.read(8))
        f.seek(off)
        f.write(struct.pack("<Q", acq + by))


def _settle(root: str, mtime_ns: int | None = None) -> int:
    """Set the directory's mtime to ``mtime_ns`` (default: 2 s ago), as if nothing had
    been added, removed or renamed in it since; returns it."""
    if mtime_ns is None:
        mtime_ns = time.time_ns() - 2_000_000_000
    os.utime(root, ns=(mtime_ns, mtime_ns))
    return mtime_ns


def test_top_refresh_lists_nothing_and_reads_an_unchanged_segment_in_two_preads(
    new_region, tmp_path, monkeypatch
):
    """A refresh of ``top`` listed /dev/shm and read each segment with three preads (the
    header, the directory and participants, each lock body) to find it unchanged: now,
    while the directory is unchanged, it lists nothing and reads an unchanged plain
    segment with two (its header, directory and participants; its lock bodies), and
    shows what the full read shows."""
    from shmlocks import top

    root, names = _segments(new_region, tmp_path, plain=True)
    monkeypatch.setattr(_shmread, "SHM_DIR", root)
    _settle(root)
    s = top.Sampler(None)
    first = s()
    assert first == _full_top(root) and len(first[0]) == 10 * 5 + 1
    listed = []
    real_scandir = os.scandir

    def counted_scandir(path="."):
        listed.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counted_scandir)
    reads = Reads(monkeypatch, root)
    assert s() == first
    assert listed == []
    assert reads.opens == {n: 1 for n in names}
    plain = [n for n in names if n != "table"]  # a lock table is decoded at every sample
    for n in plain:  # its head (header, directory, participants), then its lock bodies
        with open(os.path.join(root, n), "rb") as f:
            (locks_off,) = struct.unpack_from("<Q", f.read(64), _LOCKS_OFF)
        offs = [off for name, off in reads.preads if name == n]
        assert len(offs) == 2 and offs[0] == 0 and offs[1] >= locks_off, (n, offs)
    # a change in place (same file, the directory untouched) is seen
    _bump(os.path.join(root, "seg-3"), by=7)
    got = s()
    assert got == _full_top(root) and got != first
    assert got[0][("seg-3", "futex")]["acquisitions"] == (
        first[0][("seg-3", "futex")]["acquisitions"] + 7
    )
    assert listed == []


def test_top_cached_listing_never_shows_a_replaced_or_removed_segment(
    new_region, tmp_path, monkeypatch
):
    """The listing ``top`` keeps while the directory's mtime says nothing changed, put to
    the test: segments replaced under their name (by another segment, a FIFO, a symlink),
    removed, or cut short in place, with the directory's mtime set back each time (as if
    it said nothing changed). Each sample is what the full read shows: never the old
    segment's rows, nothing of a removed one, no hang. A new segment appears once the
    directory's mtime says so."""
    from shmlocks import top

    root, names = _segments(new_region, tmp_path, plain=True)
    monkeypatch.setattr(_shmread, "SHM_DIR", root)
    mtime = _settle(root)
    s = top.Sampler(None)
    assert s() == _full_top(root)
    # seg-4 replaced by another segment (seg-3's bytes, its counters bumped), renamed over
    other = os.path.join(root, ".tmp")
    shutil.copyfile(os.path.join(root, "seg-3"), other)
    _bump(other, by=1000)
    os.replace(other, os.path.join(root, "seg-4"))
    _settle(root, mtime)
    got = s()
    assert got == _full_top(root)
    assert got[0][("seg-4", "futex")]["acquisitions"] >= 1000
    # removed; replaced by a FIFO; by a symlink; cut short in place
    os.unlink(os.path.join(root, "seg-5"))
    os.unlink(os.path.join(root, "seg-6"))
    os.mkfifo(os.path.join(root, "seg-6"))
    os.unlink(os.path.join(root, "seg-7"))
    os.symlink(os.path.join(root, "seg-0"), os.path.join(root, "seg-7"))
    os.truncate(os.path.join(root, "seg-8"), 4096)
    _settle(root, mtime)
    t0 = time.monotonic()
    rows, notes = s()
    assert time.monotonic() - t0 < 10
    assert (rows, notes) == _full_top(root)
    assert not {k for k in rows if k[0] in ("seg-5", "seg-6", "seg-7", "seg-8")}
    assert [n.split(":")[0] for n in notes] == ["seg-8"], notes
    # a segment added: the directory's mtime moves, and it is listed
    shutil.copyfile(os.path.join(root, "seg-0"), os.path.join(root, "seg-new"))
    rows, notes = s()
    assert (rows, notes) == _full_top(root) and ("seg-new", "futex") in rows


def test_top_shows_hostile_segments_as_the_full_read_does(new_region, tmp_path, monkeypatch):
    """``top``'s samples over the hostile files (the first, which decodes, and the next,
    which keeps what read the same): every row and note as the full read gives it."""
    from shmlocks import top

    root, names = _segments(new_region, tmp_path)
    _hostile(root, names[0], "table")
    monkeypatch.setattr(_shmread, "SHM_DIR", root)
    _settle(root)
    want = _full_top(root)
    assert len(want[1]) >= 9, want[1]
    s = top.Sampler(None)
    t0 = time.monotonic()
    assert s() == want
    assert s() == want
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("n", [1, 32, 128, 129, 300])
def test_state_words_change_exactly_with_the_slot_states(n):
    """``top``'s check of the participants (``_segment.state_words``, one unpack up to 128
    slots, strided copies past that): it changes when a slot's token word, op_step or
    pending changes, and not when another field of a record does."""
    ps = _segment.PART_SIZE
    base = bytearray(os.urandom(64 + n * ps))
    words = _segment.state_words(bytes(base), 64, n)
    assert len(words) in (3 * n, 12 * n)
    for x in {0, n // 2, n - 1}:
        for field, counts in ((0, True), (140, True), (160, True), (4, False), (200, False)):
            b = bytearray(base)
            b[64 + x * ps + field] ^= 0xFF
            changed = _segment.state_words(bytes(b), 64, n) != words
            assert changed == counts, (x, field)
            fields = _segment._fields(memoryview(b)[64:], n)
            assert (fields != _segment._fields(memoryview(base)[64:], n)) == counts
