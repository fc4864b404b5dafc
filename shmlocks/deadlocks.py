"""``shmlocks deadlocks [--json]``: every cycle of the machine-wide wait-for graph
(shmlocks/waitgraph.py), and what ``shmlocks inspect`` adds per participant: the locks it
holds and the lock it waits for (in this segment or another) and for how long.

Exit status 3 when there is a cycle, 0 when there is none. Segments that cannot be read
(foreign, scribbled, another layout version, no permission) are skipped, each with one
line on stderr (in ``--json``, the list ``skipped``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shmlocks import waitgraph
from shmlocks._table import emit, table

EXIT_NONE = 0
EXIT_CYCLE = 3


def cycles_report(g: waitgraph.Graph) -> dict[str, Any]:
    """The graph's cycles as plain data (what ``--json`` prints)."""
    now = g.taken_ns
    cycles = []
    for c in g.cycles():
        v = waitgraph.victim(c)
        cycles.append(
            [
                {
                    "pid": m.thread.pid,
                    "tid": m.thread.tid,
                    "holds": m.held.label,
                    "holds_kind": m.held.kind,
                    "waits_for": m.awaited.label,
                    "waits_for_kind": m.awaited.kind,
                    "waited_s": round(m.thread.waited_s(now), 3),
                    "detects": m.thread.detects,
                    "victim": m.thread.key == v,
                }
                for m in c
            ]
        )
    waiting = sum(1 for t in g.threads.values() if t.waits is not None)
    return {"cycles": cycles, "waiting_threads": waiting, "skipped": list(g.notes)}


def _render(rep: dict[str, Any]) -> str:
    if not rep["cycles"]:
        return f"no deadlock ({rep['waiting_threads']} threads waiting for a lock)"
    out = []
    for i, c in enumerate(rep["cycles"], 1):
        out.append(f"deadlock {i}: a cycle of {len(c)} threads")
        rows = [
            [
                m["pid"],
                m["tid"],
                f"{m['holds']} ({m['holds_kind']})",
                f"{m['waits_for']} ({m['waits_for_kind']})",
                f"{m['waited_s']:.3f} s",
            ]
            for m in c
        ]
        out.append(table(["PID", "TID", "HOLDS", "WAITS FOR", "WAITING"], rows, "  "))
    return "\n".join(out)


def cmd_deadlocks(args: argparse.Namespace) -> int:
    rep = cycles_report(waitgraph.snapshot())
    emit(rep, args.json, _render)
    if not args.json:
        for note in rep["skipped"]:
            print(f"note: {note}", file=sys.stderr)
    return EXIT_CYCLE if rep["cycles"] else EXIT_NONE


def register(sub: Any) -> None:
    """Add the ``deadlocks`` command to the CLI's subparsers."""
    p = sub.add_parser(
        "deadlocks",
        help="every wait-for cycle across all segments; exit 3 if there is one",
        description="Scan every shmlocks segment in /dev/shm (read-only) and print each "
        "cycle of the wait-for graph: for each thread in it, pid, tid, the lock it holds, "
        "the lock it waits for and for how long. Exit status 3 with a cycle, 0 without.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_deadlocks)


def annotate(d: dict[str, Any]) -> dict[str, Any]:
    """Add to ``Region._describe()``'s participants what each holds and waits for, over
    every segment (``holds``, ``waits_for``, ``waiting_s``; None: not waiting)."""
    name = d["name"]
    g = waitgraph.snapshot()
    here: dict[int, list[str]] = {}
    for lk in d.get("locks", []):
        h = lk.get("holder")
        if lk.get("locked") and h:
            here.setdefault(h["slot"], []).append(lk["name"])

    def short(ref: waitgraph.LockRef) -> str:
        return ref.name if ref.segment == name else ref.label

    parts = []
    for p in d.get("participants", []):
        holds = list(here.get(p["slot"], []))
        waits, waiting = None, None
        key_alive = g.slots.get((name, p["slot"]))
        t = g.threads.get(key_alive[0]) if key_alive and key_alive[1] else None
        if t is not None:
            holds += [r.label for r in t.holds if r.segment != name]
            if t.waits is not None:
                waits, waiting = short(t.waits), round(t.waited_s(g.taken_ns), 3)
        parts.append(dict(p, holds=holds, waits_for=waits, waiting_s=waiting))
    return dict(d, participants=parts)
