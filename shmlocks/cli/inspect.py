"""``shmlocks inspect NAME``: each lock of a segment, its holder and waiters."""

from __future__ import annotations

import argparse
from typing import Any

from shmlocks import _segment
from shmlocks._table import emit, human_size, table
from shmlocks.cli._common import (
    EXIT_OK,
    creator,
    flags,
    read_region,
    segment_name,
    who,
)
from shmlocks.deadlocks import annotate
from shmlocks.stats import hottest_text, stripes_text, table_kind

#: the stripes of a table listed one by one (held, waited for or flagged); then a count
STRIPES_SHOWN = 10


def cmd_inspect(args: argparse.Namespace) -> int:
    seg = read_region(segment_name(args.name))  # once: described, and looked from
    d = annotate(_segment.describe(seg), seg)
    state, alive = creator(d)
    emit(dict(d, creator_alive=alive, creator_state=state), args.json, _render_inspect)
    return EXIT_OK


def _holder(lk: dict[str, Any]) -> str:
    """The HOLDER cell: the holder, an RWLock's readers (each with its holds), or a
    semaphore's `with` holders (each with its units)."""
    if "stripes" in lk:  # a lock table: its stripes held
        return stripes_text(lk["stripes"])
    holders = lk.get("holders")
    if holders:
        return "with: " + ", ".join(f"{who(h)} x{h['units']}" for h in holders)
    if not lk["locked"]:
        return "-"
    readers = lk.get("readers")
    if readers and not lk.get("holder"):
        return "readers: " + ", ".join(f"{who(r)} x{r['holds']}" for r in readers)
    return who(lk.get("holder"))


def _state(lk: dict[str, Any]) -> str:
    if "stripes" in lk:  # a lock table
        return f"{lk['held']} of {lk['size']} held" if lk["held"] else "free"
    return "held" if lk["locked"] else "free"


def _stripes(lk: dict[str, Any]) -> list[str]:
    """A lock table's stripes that are held, waited for or flagged (the first
    STRIPES_SHOWN), and its hottest stripes."""
    out = []
    ss = lk["stripes"]
    if ss:
        rows = [
            [
                f"[{s['index']}]",
                "held" if s["locked"] else "free",
                who(s.get("holder")) if s["locked"] else "-",
                s["waiters"],
                flags(s),
            ]
            for s in ss[:STRIPES_SHOWN]
        ]
        out.append(f"  {lk['name']}: stripes held, waited for or flagged")
        out += [
            "  " + line
            for line in table(
                ["STRIPE", "STATE", "HOLDER", "WAITERS", "FLAGS"], rows, "  "
            ).splitlines()
        ]
        if len(ss) > STRIPES_SHOWN:
            out.append(f"    ... and {len(ss) - STRIPES_SHOWN} more (--json lists them all)")
    out.append(f"  {lk['name']}: hottest stripes {hottest_text(lk, 5)}")
    return out


def _render_inspect(d: dict[str, Any]) -> str:
    out = [
        f"segment {d['name']}: {human_size(d.get('resident', d['size']))} (a sparse file of "
        f"{d['size']} bytes), layout version {d['version']}, created by pid "
        f"{d['creator_pid']} ({d['creator_state']})"
    ]
    locks = d.get("locks", [])
    out.append(f"locks: {len(locks)} of {d['max_locks']}")
    if locks:
        rows = [
            [
                lk["name"],
                table_kind(lk) if "stripes" in lk else lk["kind"],
                lk.get("state") or _state(lk),
                _holder(lk),
                lk["waiters"],
                flags(lk),
            ]
            for lk in locks
        ]
        out.append(table(["NAME", "KIND", "STATE", "HOLDER", "WAITERS", "FLAGS"], rows, "  "))
        for lk in locks:
            if "stripes" in lk:
                out += _stripes(lk)
    parts = d.get("participants", [])
    alive = sum(1 for p in parts if p["alive"])
    out.append(
        f"participants: {len(parts)} of "
        f"{d.get('participants_provisioned', d['max_participants'])} slots in use "
        f"({alive} alive, {len(parts) - alive} dead; at most {d['max_participants']})"
    )
    if parts:
        rows = [
            [
                p["slot"],
                p["pid"],
                p["tid"] if p.get("task") is None else f"{p['tid']} (task {p['task']!r})",
                ("alive" if p["alive"] else "DEAD")
                + (", other namespace" if p.get("other_namespace") else ""),
                ",".join(p["holds"]) or "-",
                p["waits_for"] or "-",
                "-" if p["waiting_s"] is None else f"{p['waiting_s']:.3f} s",
            ]
            for p in parts
        ]
        out.append(
            table(["SLOT", "PID", "TID", "STATE", "HOLDS", "WAITS FOR", "WAITING"], rows, "  ")
        )
    dead_holders = [
        lk["name"]
        for lk in locks
        if lk["locked"] and lk.get("holder") and not lk["holder"]["alive"]
    ]
    if dead_holders:
        out.append(
            "note: held by a dead thread: "
            + ", ".join(dead_holders)
            + " (the next acquire recovers it and sees owner_died=True)"
        )
    stale = [lk["name"] for lk in locks if lk.get("stale_step")]
    if stale:
        out.append(
            "note: free, with a dead thread's unfinished acquire or release step: "
            + ", ".join(stale)
            + " (the next acquire completes it and gets the lock, owner_died=False)"
        )
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)
