"""The shared-memory layout is an ABI: the bytes a region puts in /dev/shm must match what
shm_layout.h documents, read here with struct, independently of the compiled code."""

import os
import struct

import pytest
from support import SHM_DIR, uniq

import shmlocks

HEADER = struct.Struct("<QIIQIIQQQQIIII")  # shm_header's fields up to glibc_mutex_size
LINE = 128
PART = 4 * LINE  # a participant: token, identity and state, the wait link (two lines)
HWM_OFF = 92  # header.part_hwm, after flags (u32 at 88)


def geometry(locks, participants):
    """Offsets for `participants` the cap: the file is that long (sparse)."""
    dir_off = 2 * LINE
    part_off = dir_off + locks * LINE
    locks_off = part_off + participants * PART
    stride = (3 + (participants + 1) + participants) * LINE
    return dir_off, part_off, locks_off, stride, locks_off + locks * stride


@pytest.mark.timeout(30)
@pytest.mark.parametrize("locks,participants", [(1, 1), (3, 5), (64, 64)])
def test_header_and_geometry_on_disk(locks, participants):
    with shmlocks.Region.create(
        uniq("layout"), max_locks=locks, max_participants=participants
    ) as region:
        names = [f"l{i}" for i in range(min(locks, len(shmlocks.KINDS)))]
        for n, kind in zip(names, shmlocks.KINDS, strict=False):
            region.create_lock(n, kind)
        path = os.path.join(SHM_DIR, region.name)
        with open(path, "rb") as f:
            data = f.read()
    (
        magic,
        version,
        line,
        total,
        max_locks,
        max_parts,
        dir_off,
        part_off,
        locks_off,
        stride,
        state,
        creator,
        nlocks,
        _mutex_size,
    ) = HEADER.unpack_from(data)
    assert data[:8] == b"SHMLOCK1" and magic == 0x314B434F4C4D4853
    assert version == shmlocks.LAYOUT_VERSION
    assert line == shmlocks.CACHE_LINE == LINE
    assert (max_locks, max_parts) == (locks, participants)
    assert (dir_off, part_off, locks_off, stride, total) == geometry(locks, participants)
    assert len(data) == total
    assert state == 1 and creator == os.getpid() and nlocks == len(names)
    (hwm,) = struct.unpack_from("<I", data, HWM_OFF)
    assert hwm == min(participants, 32), "the first participants provisioned"
    codes = {"ticket": 1, "mcs": 2, "clh": 3, "futex": 4, "robust": 5, "pi": 6}
    for i, (n, kind) in enumerate(zip(names, shmlocks.KINDS, strict=False)):
        entry = data[dir_off + i * LINE : dir_off + (i + 1) * LINE]
        st, code = struct.unpack_from("<II", entry)
        assert (st, code) == (2, codes[kind])
        assert entry[16 : 16 + len(n) + 1] == n.encode() + b"\0"
        body = data[locks_off + i * stride : locks_off + (i + 1) * stride]
        ctl_kind, _flags, holder, body_magic = struct.unpack_from("<IIII", body)
        assert (ctl_kind, holder, body_magic) == (codes[kind], 0, 0x4B4F4C42)


@pytest.mark.timeout(30)
def test_every_part_starts_on_a_line():
    dir_off, part_off, locks_off, stride, total = geometry(7, 9)
    for off in (dir_off, part_off, locks_off, stride, total):
        assert off % LINE == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_raw_snapshot_shows_the_holder(kind):
    """Lock._raw() (what the torture prints on a wedge or a corrupt state) reads the body
    it claims to: P+1 nodes, P records, the holder word naming our slot + 1 and our
    generation while we hold the lock and cleared at release, and our PID in our
    participant record."""
    lock = shmlocks.KINDS[kind](uniq("raw"), max_participants=3)
    try:
        with lock:
            raw = lock._raw()
        after = lock._raw()
    finally:
        lock.close()
    nodes = raw["nodes (state, next, pred, parked, value, round, guess)"]
    precs = raw["precs (mine, pred, ticket, abandoned, abandoned_gen, round, omark)"]
    parts = raw["participants (pid, op_lock, op_step, op_value, generation)"]
    assert (len(nodes), len(precs), len(parts)) == (4, 3, 3)
    slot = (raw["holder"] & 0x1FFF) - 1
    assert 0 <= slot < 3 and parts[slot][0] == os.getpid()
    assert raw["holder"] >> 13 == parts[slot][4] & 0x7FFFF, "the holder names our generation"
    assert after["holder"] == 0


@pytest.mark.timeout(30)
def test_participant_wait_record_on_disk():
    """A participant's line 1 (of four): pid, tid, ... pidns at +40, the wait record
    (wait_since at +48) and its thread's start time at +56, /proc's field 22 (what names a
    thread across segments in shmlocks.waitgraph)."""
    with shmlocks.Region.create(uniq("layout"), max_locks=1, max_participants=2) as region:
        lock = region.create_lock("a", "futex")
        with lock:
            slot = (lock._raw()["holder"] & 0x1FFF) - 1
        with open(os.path.join(SHM_DIR, region.name), "rb") as f:
            data = f.read()
    part_off = geometry(1, 2)[1]
    line1 = part_off + slot * PART + LINE
    pid, tid = struct.unpack_from("<II", data, line1)
    wait_since, tstart = struct.unpack_from("<QQ", data, line1 + 48)
    with open(f"/proc/self/task/{tid}/stat", "rb") as f:
        field22 = int(f.read().rpartition(b")")[2].split()[19])
    assert (pid, tstart, wait_since) == (os.getpid(), field22, 0)


def _time_out(lock):
    return lock.acquire(timeout=0.001)


@pytest.mark.timeout(30)
def test_statistics_sit_where_shm_layout_h_says(procs):
    """The ctl line's counters on disk: the holder-written ones in its lower half
    (acquisitions +16, handoffs +24, contended +32, wait_total_ns +40, wait_max_ns +48,
    last_pid +56, owner_deaths +60, a u32), timeouts +112 (a u32) after the repair mutex."""
    lock = shmlocks.KINDS["mcs"](uniq("layout-stats"))
    try:
        for _ in range(3):
            with lock:
                pass
        with lock:
            assert procs.call(_time_out, lock) is False
        with open(os.path.join(SHM_DIR, lock.name), "rb") as f:
            data = f.read()
        locks_off = HEADER.unpack_from(data)[8]
        ctl = data[locks_off : locks_off + LINE]
        acq, hand, cont, wtot, wmax = struct.unpack_from("<5Q", ctl, 16)
        last_pid, deaths = struct.unpack_from("<II", ctl, 56)
        (timeouts,) = struct.unpack_from("<I", ctl, 112)
        s = lock.stats()
        assert (acq, hand, cont, deaths, timeouts) == (4, 0, 0, 0, 1)
        assert (acq, hand, cont, deaths, timeouts) == (
            s["acquisitions"],
            s["handoffs"],
            s["contended"],
            s["owner_deaths"],
            s["timeouts"],
        )
        assert (wtot, wmax) == (0, 0) and last_pid == os.getpid()
    finally:
        lock.close()


@pytest.mark.timeout(30)
def test_rwlock_read_statistics_sit_where_shm_rwlock_h_says():
    """An RWLock participant's line (shm_rwrec, a prec line): reads +16, read_waits +24,
    timeouts +32, read_wait_ns +40, read_wait_max_ns +48, written by the participant."""
    import threading
    import time

    P = 3
    rw = shmlocks.RWLock(uniq("layout-rw"), max_participants=P)
    try:
        for _ in range(2):
            with rw.read_lock():
                pass
        with rw.write_lock():
            t = threading.Thread(target=lambda: rw.acquire_read(timeout=0.001))
            t.start()
            t.join(20)  # a read timeout
            t = threading.Thread(target=lambda: (rw.acquire_read(), rw.release_read()))
            t.start()
            deadline = time.monotonic() + 10
            while rw._describe()["waiters"] < 1 and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.05)
        t.join(20)
        s = rw.stats()
        with open(os.path.join(SHM_DIR, rw.name), "rb") as f:
            data = f.read()
    finally:
        rw.close()
    locks_off = HEADER.unpack_from(data)[8]
    recs = locks_off + (3 + P + 1) * LINE
    lines = [struct.unpack_from("<5Q", data, recs + x * LINE + 16) for x in range(P)]
    reads, waits, touts, wns, wmax = (list(col) for col in zip(*lines, strict=True))
    assert (sum(reads), sum(waits), sum(touts)) == (3, 1, 1), lines
    assert (s["reads"], s["read_waits"], s["read_timeouts"]) == (3, 1, 1)
    assert sum(wns) == max(wmax) == round(s["read_wait_total_s"] * 1e9), lines
    assert wmax[waits.index(1)] >= 50_000_000 and s["read_wait_max_s"] >= 0.05


def test_python_readers_take_the_layout_from_the_core():
    """The pread readers (shmlocks/_segment.py, the pytest plugin) take sizes, offsets and
    codes from the compiled core's LAYOUT (C's sizeof/offsetof), and their struct formats
    cover exactly what shm_layout.h declares; the one spelling of /dev/shm is the core's."""
    from shmlocks import _core, _segment, _shmread

    lay = _core.LAYOUT
    assert _segment._HEADER.size == lay["header_fields"] == 112
    assert (lay["creator_pid_off"], lay["creator_pidns_off"]) == (68, 80)
    assert lay["part_hwm_off"] == HWM_OFF
    assert _segment._PART.size == lay["participant_size"] == _segment.PART_SIZE == PART
    # the cohort's fields and the wait link, where _PART's format reads them: the format
    # up to tstart, then what precedes each field
    head = _segment._PART.format.split("QQQ")[0] + "QQQ"
    before = {
        "agent_off": "I",
        "task_id_off": "III4x",
        "label_off": "III4xQ",
        "link_seq_off": "III4xQ40s",
        "link_name_off": "III4xQ40sIIQ",
    }
    for key, rest in before.items():
        assert struct.calcsize(head + rest) == lay[key], key
    assert (lay["max_participants"], lay["hwm_first"], lay["ticket_slots"]) == (4096, 32, 64)
    assert _segment.HEADER_SIZE == lay["header_size"] == 2 * LINE
    assert _segment._DIRENT.size <= LINE and lay["name_max"] == 56
    assert _shmread.MAGIC == b"SHMLOCK1" == _core.MAGIC.to_bytes(8, "little")
    assert _core.SHM_DIR == _shmread.SHM_DIR == SHM_DIR.rstrip("/")
    codes = {"ticket": 1, "mcs": 2, "clh": 3, "futex": 4, "robust": 5, "pi": 6}
    assert _segment.KIND_NAMES == {c: k for k, c in codes.items()}
    # shm_toolbox.h, shm_rwlock.h
    assert _segment._RWREC.size == lay["rwrec_fields"] == 56
    objects = {"event": 7, "semaphore": 8, "barrier": 9, "condition": 10, "rwlock": 11}
    assert _segment.OBJECT_NAMES == {c: k for k, c in objects.items()}


def test_the_shm_reader_loads_by_path_without_shmlocks():
    """.ci/run lists /dev/shm through shmlocks/_shmread.py before shmlocks is built: the
    file must load by path with the standard library alone (-I -S: no site-packages, so
    no installed shmlocks to lean on)."""
    import subprocess
    import sys

    import shmlocks

    path = os.path.join(os.path.dirname(shmlocks.__file__), "_shmread.py")
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('_shmread', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert 'shmlocks' not in sys.modules\n"
        "print(m.MAGIC, m.SHM_DIR)\n"
    )
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, path],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["b'SHMLOCK1'", "/dev/shm"]


@pytest.mark.timeout(30)
def test_reserved_participant_fields_on_disk_and_zeroed_at_claim():
    """Layout 8 reserves, for later issues, the rest of a participant's line 1 (poke +64,
    agent +68, tasks +72, task_id +80, label +88, 40 bytes) and lines 2-3 (the wait link:
    link_seq +0, link_lock +4, link_since +8, link_name +16, 201 bytes): each claim of the
    slot zeroes them, so nothing a previous occupant (or a scribble) left is read as its."""
    import threading

    with shmlocks.Region.create(uniq("layout-res"), max_locks=1, max_participants=2) as region:
        lock = region.create_lock("a", "futex")
        path = os.path.join(SHM_DIR, region.name)
        part_off = geometry(1, 2)[1]
        with open(path, "r+b") as f:  # scribble both slots' reserved bytes
            for slot in range(2):
                f.seek(part_off + slot * PART + LINE + 64)
                f.write(b"\xa5" * 64)
                f.seek(part_off + slot * PART + 2 * LINE)
                f.write(b"\x5a" * 2 * LINE)
        t = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
        t.start()
        t.join(10)
        with lock:
            with open(path, "rb") as f:
                data = f.read()
        slots = [
            s for s in range(2) if struct.unpack_from("<I", data, part_off + s * PART + LINE)[0]
        ]
        assert slots, "no slot claimed"
        for slot in slots:
            base = part_off + slot * PART
            assert data[base + LINE + 64 : base + 2 * LINE] == bytes(64), slot
            assert data[base + 2 * LINE : base + 4 * LINE] == bytes(2 * LINE), slot


@pytest.mark.timeout(60)
def test_a_default_lock_is_sparse_and_provisions_its_first_32():
    """max_participants=None: the file is sized for the cap (4096), sparse; the header says
    32 provisioned; tmpfs holds what layout 7's 64-participant lock held (36 KiB: nine
    pages), a ticket lock one page more for its 64 slot lines, not the 3 MiB of the cap."""
    for kind in shmlocks.KINDS:
        lock = shmlocks.KINDS[kind](uniq("layout-sparse"))
        try:
            st = os.stat(os.path.join(SHM_DIR, lock.name))
            with open(os.path.join(SHM_DIR, lock.name), "rb") as f:
                head = f.read(2 * LINE)
            assert lock.region.max_participants == 4096
            assert st.st_size == geometry(1, 4096)[4]
            assert struct.unpack_from("<I", head, HWM_OFF)[0] == 32 == lock.region._provisioned
            pages = 10 if kind == "ticket" else 9
            assert st.st_blocks * 512 == pages * 4096, (kind, st.st_blocks * 512)
        finally:
            lock.close()
