"""``shmlocks ls``: the shmlocks segments on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import shmlocks
from shmlocks import _segment, _shmread
from shmlocks._table import emit, human_size, table
from shmlocks.cli._common import (
    EXIT_OK,
    SHM_DIR,
    creator,
    error_text,
)


def cmd_ls(args: argparse.Namespace) -> int:
    recs: dict[str, dict[str, Any]] = {}

    def visit(name: str, fd: int, st: os.stat_result, first: bytes) -> None:
        recs[name] = _record(name, fd, st, first)

    notes = _shmread.walk(visit, str(SHM_DIR), _segment.HEADER_SIZE)
    emit([recs[name] for name in sorted(recs)], args.json, _render_ls)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return EXIT_OK


def _record(name: str, fd: int, st: os.stat_result, first: bytes) -> dict[str, Any]:
    """One segment's line, from its head only (header, directory, participants: one open,
    two preads; ``_segment.check_head`` reads a lock table's header if there is one), so
    that ``ls`` costs what it shows, not a full read: the same line, and the same error
    when the segment cannot be read (as ``describe`` would raise it)."""
    rec: dict[str, Any] = {"name": name}
    try:
        h = _segment.read_head(fd, st, name, first)
        _segment.check_head(fd, h)
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        rec["error"] = error_text(e)
        return rec
    states = h.states()
    state, alive = creator(
        {
            "creator_pid": h.creator_pid,
            "creator_other_namespace": _segment.other_pidns(h.creator_pidns),
        }
    )
    rec.update(
        size=h.size,
        resident=h.resident,
        locks=len(h.entries),
        max_locks=h.max_locks,
        alive=states.count(1),
        dead=states.count(2),
        max_participants=h.max_participants,
        provisioned=h.provisioned,
        creator_pid=h.creator_pid,
        creator_state=state,
        creator_alive=alive,
    )
    return rec


def _render_ls(records: list[dict[str, Any]]) -> str:
    if not records:
        return f"no shmlocks segments in {SHM_DIR}"
    rows: list[list[object]] = []
    for r in records:
        if "error" in r:
            rows.append([r["name"], "?", "?", "?", "?", f"unreadable: {r['error']}"])
            continue
        rows.append(
            [
                r["name"],
                human_size(r["resident"]),
                f"{r['locks']}/{r['max_locks']}",
                f"{r['alive']} alive, {r['dead']} dead",
                f"{r['provisioned']}/{r['max_participants']}",
                f"{r['creator_pid']} ({r['creator_state']})",
            ]
        )
    out = table(["NAME", "SIZE", "LOCKS", "PARTICIPANTS", "SLOTS", "CREATOR"], rows)
    stale = sum(1 for r in records if r.get("creator_alive") is False and r.get("alive") == 0)
    if stale:
        out += (
            f"\nnote: {stale} segment{'s' if stale != 1 else ''} with the creator gone and no "
            "live participant: `shmlocks prune` removes what nobody has open (--dry-run: "
            "which)"
        )
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)
