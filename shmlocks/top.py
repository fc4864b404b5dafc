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
import sys
import termios
import time
import tty
from typing import Any, TextIO

import shmlocks
from shmlocks._table import table
from shmlocks.stats import (
    duration,
    holder_text,
    hottest_text,
    readers_text,
    segment_stats,
    table_kind,
)

NO_SEGMENTS = "no shmlocks segments"


def sample(names: list[str] | None) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """{(segment, lock): record} for the named segments (all when None), and notes on the
    ones that could not be read."""
    notes: list[str] = []
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for seg in names if names is not None else shmlocks.list_regions():
        try:
            d = segment_stats(seg)
        except FileNotFoundError:
            if names is not None:
                notes.append(f"{seg}: gone")
            continue
        except (shmlocks.ShmLockError, OSError, ValueError) as e:
            notes.append(f"{seg}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            continue
        for lk in d["locks"]:
            out[(seg, lk["name"])] = dict(lk, segment=seg)
    return out, notes


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


def rates(
    cur: dict[tuple[str, str], dict[str, Any]],
    prev: dict[tuple[str, str], dict[str, Any]] | None,
    dt: float,
) -> list[dict[str, Any]]:
    """One row per lock with the rates over the last ``dt`` seconds (None: no earlier
    sample yet), busiest first. An RWLock's row has its reads' rates too (``reads_s``,
    ``read_contended_pct``, ``read_wait_mean_s``, ``read_timeouts_s``)."""
    rows = []
    for key, r in cur.items():
        p = prev.get(key) if prev is not None else None
        since = None if prev is None or dt <= 0 else dt
        row = dict(r)
        keys = ("acquires_s", "timeouts_s", "contended_pct", "wait_mean_s")
        row.update(zip(keys, _side_rates(r, p, since), strict=True))
        row["handoffs_s"] = None if since is None else _delta(r, p, "handoffs") / since
        if "reads" in r:
            o = p["reads"] if p is not None and "reads" in p else None
            keys = ("reads_s", "read_timeouts_s", "read_contended_pct", "read_wait_mean_s")
            row.update(zip(keys, _side_rates(r["reads"], o, since), strict=True))
        rows.append(row)
    rows.sort(key=_busy)
    return rows


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


def render(rows: list[dict[str, Any]], notes: list[str], interval: float) -> list[str]:
    """The screen's lines (a header line, then the table, then notes)."""
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
    body = [line for r in rows for line in _lines(r)]
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
        for r in rows
        if "stripes" in r
    ]
    return [head, "", *table(headers, body).splitlines()] + hot + [f"note: {n}" for n in notes]


def snapshot_once(names: list[str] | None, interval: float, as_json: bool, out: TextIO) -> int:
    first, _ = sample(names)
    t0 = time.monotonic()
    time.sleep(interval)
    cur, notes = sample(names)
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
        while True:
            cur, notes = sample(names)
            now = time.monotonic()
            rows = rates(cur, prev, now - t_prev)
            prev, t_prev = cur, now
            size = shutil.get_terminal_size()
            lines = [ln[: size.columns] for ln in render(rows, notes, interval)]
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
