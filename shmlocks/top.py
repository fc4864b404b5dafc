"""``shmlocks top [NAME ...]``: a live view of the busiest locks on the machine.

Every ``--interval`` seconds (default 1) it reads the counters of every lock of every
shmlocks segment in /dev/shm (or of the segments named) and shows, busiest first, the rates
from the deltas: acquires/s, hand-offs/s, % of the acquires that waited, their mean wait,
timeouts/s; then the max wait (since the counters began), the holder and the waiters. An
RWLock has two lines, its writes then its reads (the readers as its holders); its
busyness is its writes and reads per second.

On a terminal it redraws in place (raw termios + ANSI: the alternate screen, cbreak mode so
one key is read at once, the cursor hidden) until ``q`` or Ctrl-C (or SIGTERM, SIGHUP),
then restores the terminal as it found it. With stdout not a terminal, or with ``--json``, it prints one
snapshot (rates over one interval) and exits. Segments that cannot be read are skipped
with a note.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import struct
import sys
import termios
import time
import tty
from typing import Any, NamedTuple, TextIO

import shmlocks
from shmlocks import _core, _segment, _shmread
from shmlocks._table import table
from shmlocks.stats import (
    duration,
    holder_text,
    hottest_text,
    locks_stats,
    readers_text,
    table_kind,
)

NO_SEGMENTS = "no shmlocks segments"


#: the kinds whose rows are a function of their segment's header, directory and
#: participants provisioned and of their body's first three lines (ctl, words A and B):
#: a segment of only these is decoded again only when those bytes changed (``Sampler``)
_PLAIN = frozenset(_core.KINDS[k].kind_code for k in ("ticket", "mcs", "futex", "robust", "pi"))
_SLOT_MASK = (1 << _segment.HOLDER_SLOT_BITS) - 1
_HOLDER = struct.Struct("<I")  # the ctl line's holder record (after kind and flags)
#: a listing of the directory is used again while the directory's (device, inode, mtime)
#: are what they were when it was listed, and that mtime was at least this old then: a
#: change within the file system's timestamp granularity of the one before might leave
#: the mtime as it was (coarse clocks: a tick, at most 10 ms)
_DIR_SETTLED_NS = 100_000_000
#: and the directory is listed again this often whatever its times say
_RELIST_S = 10.0
#: the lock bodies of a segment are read at once if they lie within this many bytes
_BODIES_AT_ONCE = 65536


class _Seen(NamedTuple):
    """What a plain segment's rows were computed from, to tell at the next sample that
    nothing they show changed without decoding it again: the file (device, inode, size),
    and the bytes of it the rows depend on, as read: the header and the directory, the
    words that say which participant slots may be in use (``_segment.state_words``), the
    records of those slots and of the slots a holder record names, the first three lines
    of each lock's body. Its first ``span`` bytes (header, directory, participants) are
    read at once."""

    dev: int
    ino: int
    size: int
    span: int
    part_off: int
    provisioned: int
    words: tuple[int, ...] | bytes
    ranges: tuple[tuple[int, bytes], ...]  # (offset, the bytes there), header first
    rows: list[dict[str, Any]]


def _same(fd: int, first: bytes, c: _Seen) -> bool:
    """Does the segment read as it did when ``c`` was made? ``first``: its first bytes,
    read already (its ranges within them are compared there, the others read by pread:
    a short read differs)."""
    n = len(first)
    if n < c.span:
        return False
    for off, old in c.ranges:
        if off + len(old) <= n:
            if not first.startswith(old, off):
                return False
        elif os.pread(fd, len(old), off) != old:
            return False
    return _segment.state_words(first, c.part_off, c.provisioned) == c.words


def _seen(
    st: os.stat_result,
    first: bytes,
    h: _segment.Head,
    bodies: list[bytes],
    ranges: list[tuple[int, bytes]],
    rows: list[dict[str, Any]],
) -> _Seen:
    """The ``_Seen`` of a plain segment decoded from ``h`` and ``bodies`` (read as
    ``ranges``)."""
    n, ps = h.provisioned, _segment.PART_SIZE
    part_off = h.dir_off + len(h.directory)
    words = _segment.state_words(h.parts, 0, n)
    slots = set(_segment.busy_slots(h.parts, n)) if any(words) else set()
    for b in bodies:  # the slots the holder records name (their generation is compared)
        s1 = _HOLDER.unpack_from(b, 8)[0] & _SLOT_MASK
        if 1 <= s1 <= n:
            slots.add(s1 - 1)
    return _Seen(
        st.st_dev,
        st.st_ino,
        st.st_size,
        part_off + n * ps,
        part_off,
        n,
        words,
        (
            (0, first[: _segment.HEADER_SIZE]),
            (h.dir_off, h.directory),
            *((part_off + x * ps, h.parts[x * ps : (x + 1) * ps]) for x in sorted(slots)),
            *ranges,
        ),
        rows,
    )


def _tagged(name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each lock's record with its segment's name (``segment``)."""
    return [dict(lk, segment=name) for lk in rows]


class Sampler:
    """Samples the locks of the named segments (all when None), each refresh through one
    open of each file (shmlocks/_shmread.py ``walk``). A segment of plain locks that is
    the same file (device, inode, size) and whose header, directory, participants and
    lock bodies read as they did at the last sample keeps its rows; only what changed is
    decoded again (``shmlocks top`` at 10,000 segments). The check of a segment is on
    its bytes, never on a file's times; only the listing of the directory (which names
    exist) is used again while the directory's mtime says nothing was added, removed or
    renamed (``_DIR_SETTLED_NS``), and made anew every ``_RELIST_S`` at the latest."""

    def __init__(self, names: list[str] | None) -> None:
        self.names = names
        self.seen: dict[str, _Seen] = {}
        self._heads: dict[str, int] = {}  # {name: how much to read of it at once}
        self._dir: tuple[str, int, int, int] | None = None  # (path, dev, ino, mtime_ns)
        self._listing: list[str] = []
        self._listed_at = 0.0

    def _names(self, directory: str) -> list[str]:
        """The regular files of ``directory`` (``_shmread.listing``): the last listing if
        the directory has not changed since, else a new one."""
        try:
            st = os.stat(directory)
        except OSError:
            self._dir = None
            return _shmread.listing(directory)
        key = (directory, st.st_dev, st.st_ino, st.st_mtime_ns)
        now = time.monotonic()
        if key == self._dir and now - self._listed_at < _RELIST_S:
            return self._listing
        settled = time.time_ns() - st.st_mtime_ns >= _DIR_SETTLED_NS
        self._listing = _shmread.listing(directory)  # after the stat: a change since shows
        self._dir = key if settled else None
        self._listed_at = now
        return self._listing

    def __call__(self) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
        """{(segment, lock): record}, and notes on the segments that could not be read."""
        got: dict[str, list[dict[str, Any]] | str] = {}
        seen: dict[str, _Seen] = {}

        def visit(name: str, fd: int, st: os.stat_result, first: bytes) -> None:
            try:
                got[name] = self._rows(name, fd, st, first, seen)
            except FileNotFoundError:
                if self.names is not None:
                    got[name] = f"{name}: gone"
            except (shmlocks.ShmLockError, OSError, ValueError) as e:
                got[name] = f"{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"

        if self.names is None:
            directory = _shmread.SHM_DIR
            names = self._names(directory)
            _shmread.walk(visit, directory, _segment.HEADER_SIZE, names=names, heads=self._heads)
        else:
            for name in self.names:
                try:
                    fd, st = _shmread.open_file(os.path.join(_shmread.SHM_DIR, name))
                except FileNotFoundError:
                    got[name] = f"{name}: gone"
                    continue
                except OSError as e:
                    got[name] = f"{name}: {str(e).splitlines()[0] if str(e) else 'OSError'}"
                    continue
                try:
                    visit(
                        name, fd, st, os.pread(fd, self._heads.get(name, _segment.HEADER_SIZE), 0)
                    )
                finally:
                    os.close(fd)
        self.seen = seen
        self._heads = {name: c.span for name, c in seen.items()}
        notes: list[str] = []
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for name, rows in got.items():  # the walk's order is the names'
            if isinstance(rows, str):
                notes.append(rows)
                continue
            for lk in rows:
                out[(name, lk["name"])] = lk
        return out, notes

    def _rows(
        self, name: str, fd: int, st: os.stat_result, first: bytes, seen: dict[str, _Seen]
    ) -> list[dict[str, Any]]:
        c = self.seen.get(name)
        if (
            c is not None
            and c.ino == st.st_ino
            and c.dev == st.st_dev
            and c.size == st.st_size
            and _same(fd, first, c)
        ):
            seen[name] = c
            return c.rows
        if len(first) < _segment.HEADER_SIZE:
            try:
                first = _shmread.pread_exact(fd, 0, _segment.HEADER_SIZE)
            except _shmread.Shrunk:
                raise _shmread.Shrunk(f"segment {name!r} shrank while it was read") from None
        h = _segment.read_head(fd, st, name, first)
        if not all(k in _PLAIN for _i, k, _r in h.entries):
            return _tagged(name, locks_stats(_segment.read_fd(fd, st, name, h)))
        offs = [h.locks_off + i * h.stride for i, _k, _r in h.entries]
        n = _segment._BODY_READ
        try:
            if len(offs) > 1 and offs[-1] + n - offs[0] <= _BODIES_AT_ONCE:
                # the bodies of a region of small ones: one read of them all, compared
                # as one range at the next sample
                blob = _shmread.pread_exact(fd, offs[0], offs[-1] + n - offs[0])
                bodies = [blob[o - offs[0] : o - offs[0] + n] for o in offs]
                ranges = [(offs[0], blob)]
            else:
                bodies = _segment.read_bodies(fd, h)
                ranges = list(zip(offs, bodies, strict=True))
        except _shmread.Shrunk:
            raise _shmread.Shrunk(f"segment {name!r} shrank while it was read") from None
        rows = _tagged(name, locks_stats(_segment.read_fd(fd, st, name, h, bodies)))
        seen[name] = _seen(st, first, h, bodies, ranges, rows)
        return rows


def sample(names: list[str] | None) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """{(segment, lock): record} for the named segments (all when None), and notes on the
    ones that could not be read (one sample: ``Sampler``)."""
    return Sampler(names)()


def _delta(cur: dict[str, Any], prev: dict[str, Any] | None, key: str) -> float:
    if prev is None:
        return 0
    c, p = cur[key], prev[key]
    return c - p if c >= p else c  # a reset: what was counted since


def _side_rates(c: dict[str, Any], o: dict[str, Any] | None, dt: float | None) -> list:
    """(holds/s, timeouts/s, % contended, mean wait) of one side's counters ``c`` since
    ``o`` (a lock's, or an RWLock's ``reads``); all None without an earlier sample."""
    if dt is None:
        return [None] * 4
    acq = _delta(c, o, "acquisitions")
    cont = _delta(c, o, "contended")
    return [
        acq / dt,
        _delta(c, o, "timeouts") / dt,
        100.0 * cont / acq if acq else None,
        _delta(c, o, "wait_total_s") / cont if cont else None,
    ]


def _busy(w: dict[str, Any]) -> tuple[Any, ...]:
    """The sort key, busiest first: holds per second (an RWLock's writes and reads), the
    waiters (both sides), the holds counted, then the segment."""
    rd = w.get("reads")
    per_s = (w["acquires_s"] or 0) + (w.get("reads_s") or 0)
    waiters = w["waiters"] + (rd["waiters"] if rd else 0)
    acq = w["acquisitions"] + (rd["acquisitions"] if rd else 0)
    return (-per_s, -waiters, -acq, w["segment"])


def _row(r: dict[str, Any], p: dict[str, Any] | None, since: float | None) -> dict[str, Any]:
    """A lock's row: its record ``r`` and its rates since ``p`` (``rates``)."""
    row = dict(r)
    keys = ("acquires_s", "timeouts_s", "contended_pct", "wait_mean_s")
    row.update(zip(keys, _side_rates(r, p, since), strict=True))
    row["handoffs_s"] = None if since is None else _delta(r, p, "handoffs") / since
    if "reads" in r:
        o = p["reads"] if p is not None and "reads" in p else None
        keys = ("reads_s", "read_timeouts_s", "read_contended_pct", "read_wait_mean_s")
        row.update(zip(keys, _side_rates(r["reads"], o, since), strict=True))
    return row


def rates(
    cur: dict[tuple[str, str], dict[str, Any]],
    prev: dict[tuple[str, str], dict[str, Any]] | None,
    dt: float,
    kept: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]]]
    | None = None,
) -> list[dict[str, Any]]:
    """One row per lock with the rates over the last ``dt`` seconds (None: no earlier
    sample yet), busiest first. An RWLock's row has its reads' rates too (``reads_s``,
    ``read_contended_pct``, ``read_wait_mean_s``, ``read_timeouts_s``).

    ``kept`` (the live view's, across refreshes): a lock whose record in ``cur`` is the
    very one of ``prev`` (its segment read the same: ``Sampler`` kept its rows) counted
    nothing since, so its rates do not depend on ``dt``: its row and sort key are made
    once and kept there while that lasts, not made again at every refresh."""
    since = None if prev is None or dt <= 0 else dt
    rows: list[dict[str, Any]] = []
    order: list[tuple[Any, ...]] = []
    fresh: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]]] = {}
    for key, r in cur.items():
        p = prev.get(key) if prev is not None else None
        if kept is not None and p is r and since is not None:
            k = kept.get(key)
            if k is None or k[0] is not r:
                row = _row(r, p, since)
                k = (r, row, _busy(row))
            fresh[key] = k
            rows.append(k[1])
            order.append(k[2])
            continue
        row = _row(r, p, since)
        rows.append(row)
        order.append(_busy(row))
    if kept is not None:
        kept.clear()
        kept.update(fresh)
    return [rows[i] for i in sorted(range(len(rows)), key=order.__getitem__)]


def _rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _lines(r: dict[str, Any]) -> list[list[Any]]:
    """A lock's table row; an RWLock's two: its writes, then its reads (the readers as its
    holders, the readers waiting as its waiters)."""
    rd = r.get("reads")
    lines = [
        [
            r["segment"],
            r["name"],
            f"{r['kind']} (write)"
            if rd is not None
            else table_kind(r)
            if "stripes" in r
            else r["kind"],
            _rate(r["acquires_s"]),
            _rate(r["handoffs_s"]),
            _pct(r["contended_pct"]),
            duration(r["wait_mean_s"]),
            duration(r["wait_max_s"] if r["contended"] else None),
            _rate(r["timeouts_s"]),
            holder_text(r),
            r["waiters"],
        ]
    ]
    if rd is not None:
        lines.append(
            [
                r["segment"],
                r["name"],
                f"{r['kind']} (read)",
                _rate(r["reads_s"]),
                "-",
                _pct(r["read_contended_pct"]),
                duration(r["read_wait_mean_s"]),
                duration(rd["wait_max_s"] if rd["contended"] else None),
                _rate(r["read_timeouts_s"]),
                readers_text(rd),
                rd["waiters"],
            ]
        )
    return lines


def render(
    rows: list[dict[str, Any]], notes: list[str], interval: float, limit: int | None = None
) -> list[str]:
    """The screen's lines (a header line, then the table, then notes); with ``limit``, the
    table of the first ``limit`` rows only (the live view: what fits on the screen, so that
    a refresh formats dozens of rows, not 10,000; the header still counts them all)."""
    nseg = len({r["segment"] for r in rows})
    head = (
        f"shmlocks top  {time.strftime('%H:%M:%S')}  {_n(len(rows), 'lock')} in "
        f"{_n(nseg, 'segment')}"
        f"  (every {interval:g} s; q or Ctrl-C quits)"
    )
    if not rows:
        return [head, "", NO_SEGMENTS if not notes else "no readable shmlocks segments"] + [
            f"note: {n}" for n in notes
        ]
    shown = rows[:limit]
    body = [line for r in shown for line in _lines(r)]
    headers = [
        "SEGMENT",
        "LOCK",
        "KIND",
        "ACQ/S",
        "HANDOFF/S",
        "%CONT",
        "WAIT MEAN",
        "WAIT MAX",
        "TIMEOUT/S",
        "HOLDER",
        "WAITERS",
    ]
    hot = [  # a lock table is one row: its hottest stripes, their holders and waiters
        f"{r['segment']}/{r['name']}: hottest stripes {hottest_text(r, 5)}"
        for r in shown
        if "stripes" in r
    ]
    return [head, "", *table(headers, body).splitlines()] + hot + [f"note: {n}" for n in notes]


def snapshot_once(names: list[str] | None, interval: float, as_json: bool, out: TextIO) -> int:
    sampler = Sampler(names)
    first, _ = sampler()
    t0 = time.monotonic()
    time.sleep(interval)
    cur, notes = sampler()
    rows = rates(cur, first, time.monotonic() - t0)
    if as_json:
        out.write(json.dumps({"locks": rows, "notes": notes}, indent=2) + "\n")
    elif not rows and not notes:
        out.write(NO_SEGMENTS + "\n")
    else:
        out.write("\n".join(render(rows, notes, interval)[2:]) + "\n")
    return 0


class _Quit(Exception):
    """SIGTERM or SIGHUP: leave as by q, through the finally that restores the terminal."""


def _quit(signum: int, frame: object) -> None:
    raise _Quit


def live(names: list[str] | None, interval: float, out: TextIO) -> int:
    """Redraw every ``interval`` until q, Ctrl-C, SIGTERM or SIGHUP; the terminal is
    restored whatever happens (an exception included)."""
    tty_fd: int | None = sys.stdin.fileno() if sys.stdin.isatty() else None
    fd = tty_fd
    saved = termios.tcgetattr(tty_fd) if tty_fd is not None else None
    old_handlers = {s: signal.signal(s, _quit) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if fd is not None:
            tty.setcbreak(fd)  # keys one at a time, no echo; Ctrl-C still raises SIGINT
        out.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, the cursor hidden
        prev: dict[tuple[str, str], dict[str, Any]] | None = None
        t_prev = time.monotonic()
        sampler = Sampler(names)
        kept: dict[tuple[str, str], Any] = {}
        while True:
            cur, notes = sampler()
            now = time.monotonic()
            rows = rates(cur, prev, now - t_prev, kept)
            prev, t_prev = cur, now
            size = shutil.get_terminal_size()
            lines = [ln[: size.columns] for ln in render(rows, notes, interval, size.lines)]
            out.write("\x1b[H\x1b[2J" + "\n".join(lines[: max(1, size.lines - 1)]))
            out.flush()
            deadline = now + interval
            while (left := deadline - time.monotonic()) > 0:
                if fd is None:
                    time.sleep(left)
                    break
                ready, _, _ = select.select([fd], [], [], left)
                if ready:
                    keys = os.read(fd, 64)
                    if not keys:
                        fd = None  # end of input: only Ctrl-C quits now
                    elif b"q" in keys or b"Q" in keys:
                        return 0
    except (KeyboardInterrupt, _Quit):
        return 0
    finally:
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        with contextlib.suppress(OSError, ValueError):
            out.write("\x1b[?25h\x1b[?1049l")
            out.flush()
        if tty_fd is not None and saved is not None:
            termios.tcsetattr(tty_fd, termios.TCSADRAIN, saved)
