"""``shmlocks ls``: the shmlocks segments on this machine."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import shmlocks
from shmlocks import _shmread
from shmlocks._table import emit, human_size, table
from shmlocks.cli._common import (
    EXIT_OK,
    SHM_DIR,
    creator,
    describe,
    error_text,
)


def cmd_ls(args: argparse.Namespace) -> int:
    found, notes = _shmread.scan(str(SHM_DIR))
    names = sorted(found)
    records: list[dict[str, Any]] = []
    for name in names:
        rec: dict[str, Any] = {"name": name}
        try:
            d = describe(name)
        except FileNotFoundError:
            continue  # removed since the listing
        except (shmlocks.ShmLockError, OSError, ValueError) as e:
            rec["error"] = error_text(e)
        else:
            parts = d.get("participants", [])
            rec.update(
                size=d["size"],
                resident=d.get("resident", d["size"]),
                locks=len(d.get("locks", [])),
                max_locks=d.get("max_locks"),
                alive=sum(1 for p in parts if p["alive"]),
                dead=sum(1 for p in parts if not p["alive"]),
                max_participants=d.get("max_participants"),
                provisioned=d.get("participants_provisioned"),
                creator_pid=d["creator_pid"],
                creator_state=creator(d)[0],
                creator_alive=creator(d)[1],
            )
        records.append(rec)
    emit(records, args.json, _render_ls)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return EXIT_OK


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
