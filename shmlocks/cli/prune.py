"""``shmlocks prune [NAME...]``: remove the segments nobody can be using."""

from __future__ import annotations

import argparse
import fcntl
import os
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
    required_regions,
)


def _prune_verdict(name: str) -> tuple[str | None, dict[str, Any]]:
    """Why segment ``name`` must be kept (None: it is stale, nobody can be using it), and
    what was seen of it."""
    try:
        d = describe(name)
    except FileNotFoundError:
        return "gone", {}
    except (shmlocks.ShmLockError, OSError, ValueError) as e:
        return f"unreadable ({error_text(e)})", {}
    seen: dict[str, Any] = {"size": d["size"], "creator_pid": d["creator_pid"]}
    state, alive = creator(d)
    seen["creator_state"] = state
    live = sum(1 for p in d.get("participants", []) if p["alive"])
    seen["live_participants"] = live
    if live:
        return f"{live} live participant{'s' if live != 1 else ''}", seen
    if alive is None:
        return "its creator is in another PID namespace", seen
    if alive:
        return f"its creator (pid {d['creator_pid']}) is alive", seen
    return None, seen


def _prune_one(name: str, dry_run: bool) -> dict[str, Any]:
    path = SHM_DIR / name
    rec: dict[str, Any] = {"name": name}
    try:
        # our own descriptor, taken first: a process that has the segment open holds a
        # shared flock on it (Region.open), so a non-blocking exclusive one fails; held
        # across the unlink, it keeps an opener from attaching between our look and it
        # (opened the one safe way: no symlink, no FIFO, a regular file of a trusted user)
        fd, st = _shmread.open_file(str(path))
    except FileNotFoundError:
        return dict(rec, action="kept", reason="gone")
    except _shmread.Refused as e:
        return dict(rec, action="kept", reason=e.why)
    except OSError as e:
        return dict(rec, action="kept", reason=f"unreadable ({error_text(e)})")
    try:
        reason, seen = _prune_verdict(name)
        rec.update(seen)
        if reason is not None:
            return dict(rec, action="kept", reason=reason)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return dict(rec, action="kept", reason="open in a process")
        if os.stat(path, follow_symlinks=False).st_ino != st.st_ino:
            return dict(rec, action="kept", reason="replaced while looked at")
        if dry_run:
            return dict(rec, action="would remove", reason="creator gone, nobody alive")
        os.unlink(path)
        return dict(rec, action="removed", reason="creator gone, nobody alive")
    except FileNotFoundError:
        return dict(rec, action="kept", reason="gone")
    except PermissionError:
        return dict(rec, action="kept", reason="permission denied")
    finally:
        os.close(fd)  # (drops the flock)


def cmd_prune(args: argparse.Namespace) -> int:
    names = required_regions(args.names) if args.names else shmlocks.list_regions()
    records = [_prune_one(n, args.dry_run) for n in names]
    emit(records, args.json, _render_prune)
    return EXIT_OK


def _render_prune(records: list[dict[str, Any]]) -> str:
    if not records:
        return f"no shmlocks segments in {SHM_DIR}"
    rows = [
        [
            r["name"],
            human_size(r["size"]) if "size" in r else "?",
            f"{r['creator_pid']} ({r['creator_state']})" if "creator_pid" in r else "?",
            r.get("live_participants", "?"),
            r["action"],
            r["reason"],
        ]
        for r in records
    ]
    return table(["NAME", "SIZE", "CREATOR", "ALIVE", "ACTION", "WHY"], rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Remove the name of every shmlocks segment (or of the NAMEs given) "
        "that nobody can be using: its creator has exited, no participant is alive, and "
        "no process has it open. Anything else is kept, with the reason."
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="segments to consider (default: all)")
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be removed, remove nothing"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_prune)
